//! What the platform gives the module, read from the API server itself: its
//! version (`/version`), the feature gates the module needs as its
//! `kubernetes_feature_enabled` metric reports them (`/metrics`), and
//! whether it serves `resource.k8s.io/v1`. Never assumed: a gate the
//! metric does not report is unknown, and an unreadable `/metrics` says why.

use std::collections::BTreeMap;

use kube::Client;
use switchyard_core::names::REQUIRED_FEATURE_GATES;

/// The platform as last read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Platform {
    /// e.g. `v1.36.3`; empty when `/version` did not answer.
    pub kubernetes_version: String,
    /// The required gates the metric reports, by name.
    pub feature_gates: BTreeMap<String, bool>,
    pub dra_api_served: bool,
    /// Why the gates could not be read; empty when they were.
    pub feature_gates_error: String,
}

impl Platform {
    /// `self` read again as `fresh`: what the fresh read could not learn
    /// (the version, the gates, after a failed request — an API server
    /// restarting, a flaky load balancer) stays as it was known, so a failed
    /// read never turns a ready platform into a not-ready one.
    pub fn updated_with(&self, fresh: Platform) -> Platform {
        let mut next = fresh;
        if next.kubernetes_version.is_empty() {
            next.kubernetes_version = self.kubernetes_version.clone();
        }
        if !next.feature_gates_error.is_empty() && !self.feature_gates.is_empty() {
            next.feature_gates = self.feature_gates.clone();
            next.feature_gates_error = String::new();
        }
        next
    }

    /// Reads the platform from the API server `client` talks to.
    pub async fn read(client: &Client) -> Platform {
        let kubernetes_version = match client.apiserver_version().await {
            Ok(info) => info.git_version,
            Err(err) => {
                tracing::warn!(error = %err, "reading the API server's version");
                String::new()
            }
        };
        let (feature_gates, feature_gates_error) = match metrics(client).await {
            Ok(text) => (feature_gates(&text), String::new()),
            Err(err) => {
                tracing::warn!(error = %err, "reading the API server's feature gates from /metrics");
                (
                    BTreeMap::new(),
                    format!("GET /metrics of the API server: {err}"),
                )
            }
        };
        Platform {
            kubernetes_version,
            feature_gates,
            dra_api_served: dra_api_served(client).await,
            feature_gates_error,
        }
    }
}

async fn metrics(client: &Client) -> Result<String, kube::Error> {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .map_err(kube::Error::HttpError)?;
    client.request_text(request).await
}

/// The required gates in an API server's Prometheus text:
/// `kubernetes_feature_enabled{name="DRAConsumableCapacity",stage="BETA"} 1`.
pub fn feature_gates(metrics: &str) -> BTreeMap<String, bool> {
    metrics
        .lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("kubernetes_feature_enabled{")?;
            let (labels, value) = rest.split_once('}')?;
            let name = labels
                .split(',')
                .find_map(|label| label.trim().strip_prefix("name=\""))?
                .trim_end_matches('"');
            let on = value.trim().parse::<f64>().ok()? == 1.0;
            REQUIRED_FEATURE_GATES
                .contains(&name)
                .then(|| (name.to_string(), on))
        })
        .collect()
}

/// Whether the API server serves `resource.k8s.io/v1` (DRA). Only the API
/// server's answer counts: a group it does not serve is a 404; a request
/// that failed (a reset connection, a timeout, the API server restarting)
/// is asked again, from 100 ms doubling to 5 s — taking it for "not served"
/// made inventory report the feature gates off until its next restart.
pub async fn dra_api_served(client: &Client) -> bool {
    use backon::{ExponentialBuilder, Retryable};
    let not_served = |e: &kube::Error| matches!(e, kube::Error::Api(status) if status.code == 404);
    let asked = (|| client.list_api_group_resources("resource.k8s.io/v1"))
        .retry(
            ExponentialBuilder::default()
                .with_min_delay(std::time::Duration::from_millis(100))
                .with_max_delay(std::time::Duration::from_secs(5))
                .without_max_times(),
        )
        .when(|e| !not_served(e))
        .notify(|err, retry_in| {
            tracing::warn!(error = %err, ?retry_in, "asking whether the API server serves resource.k8s.io/v1");
        })
        .await;
    asked.is_ok_and(|list| list.resources.iter().any(|r| r.name == "resourceslices"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_read_keeps_what_was_known() {
        let known = Platform {
            kubernetes_version: "v1.36.3".into(),
            feature_gates: BTreeMap::from([("DRAConsumableCapacity".to_string(), true)]),
            dra_api_served: true,
            feature_gates_error: String::new(),
        };
        let failed = Platform {
            kubernetes_version: String::new(),
            feature_gates: BTreeMap::new(),
            dra_api_served: true,
            feature_gates_error: "GET /metrics of the API server: connection reset".into(),
        };
        assert_eq!(known.updated_with(failed.clone()), known);
        // A real change is taken.
        let off = Platform {
            feature_gates: BTreeMap::from([("DRAConsumableCapacity".to_string(), false)]),
            ..known.clone()
        };
        assert_eq!(known.updated_with(off.clone()), off);
        // Nothing known yet: the failure is what there is.
        assert_eq!(Platform::default().updated_with(failed.clone()), failed);
    }

    #[test]
    fn the_required_gates_are_read_from_the_metric_and_no_others() {
        let text = r#"# HELP kubernetes_feature_enabled [BETA] This metric records the data about the stage and enablement of a k8s feature.
# TYPE kubernetes_feature_enabled gauge
kubernetes_feature_enabled{name="DynamicResourceAllocation",stage=""} 1
kubernetes_feature_enabled{name="DRAConsumableCapacity",stage="BETA"} 0
kubernetes_feature_enabled{name="DRAExtendedResource",stage="BETA"} 1
kubernetes_feature_enabled{name="InPlacePodVerticalScaling",stage="BETA"} 1
apiserver_request_total{code="200"} 3
"#;
        let gates = feature_gates(text);
        assert_eq!(
            gates,
            BTreeMap::from([
                ("DRAConsumableCapacity".to_string(), false),
                ("DRAExtendedResource".to_string(), true),
                ("DynamicResourceAllocation".to_string(), true),
            ])
        );
    }
}

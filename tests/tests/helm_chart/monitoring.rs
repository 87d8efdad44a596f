//! The chart's PodMonitor (`podMonitor.enabled`): off by default, and when on
//! it selects every pod that serves `/metrics` — each service's and the node
//! agent's, all of which name their metrics port `metrics` — and nothing
//! else of the chart.

use serde_json::Value;

use crate::support::{NATS_URL, kind, render};

/// Whether `selector`'s matchLabels all hold on `labels`.
fn selects(selector: &Value, labels: &Value) -> bool {
    selector["matchLabels"]
        .as_object()
        .expect("matchLabels")
        .iter()
        .all(|(k, v)| &labels[k] == v)
}

#[test]
fn the_pod_monitor_scrapes_every_pod_with_metrics() {
    assert!(
        render(&[NATS_URL])
            .iter()
            .all(|doc| kind(doc) != "PodMonitor"),
        "off by default: the PodMonitor CRD is the Prometheus Operator's"
    );
    let docs = render(&[
        NATS_URL,
        "podMonitor.enabled=true",
        "podMonitor.labels.release=kube-prometheus-stack",
        "nodeAgent.enabled=true",
        "nats.bundled.enabled=false",
    ]);
    let monitors: Vec<&Value> = docs.iter().filter(|d| kind(d) == "PodMonitor").collect();
    let [monitor] = monitors[..] else {
        panic!("one PodMonitor: {monitors:?}")
    };
    assert_eq!(
        monitor["metadata"]["labels"]["release"],
        "kube-prometheus-stack"
    );
    let endpoints = monitor["spec"]["podMetricsEndpoints"]
        .as_array()
        .expect("podMetricsEndpoints");
    assert_eq!(endpoints.len(), 1);
    assert_eq!(endpoints[0]["port"], "metrics");
    assert_eq!(endpoints[0]["path"], "/metrics");
    let selector = &monitor["spec"]["selector"];

    let mut selected = Vec::new();
    for doc in &docs {
        if !matches!(
            kind(doc),
            "Deployment" | "DaemonSet" | "StatefulSet" | "Job"
        ) {
            continue;
        }
        let template = &doc["spec"]["template"];
        let name = doc["metadata"]["name"].as_str().unwrap().to_string();
        let serves_metrics = template["spec"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|c| c["ports"].as_array().cloned().unwrap_or_default())
            .any(|p| p["name"] == "metrics");
        let is_selected = selects(selector, &template["metadata"]["labels"]);
        if serves_metrics {
            assert!(is_selected, "{name} serves /metrics but is not scraped");
            selected.push(name);
        }
    }
    selected.sort();
    assert_eq!(
        selected.len(),
        6,
        "the five services and the node agent: {selected:?}"
    );
}

/// The `env` of every container of the chart's Deployments and DaemonSets,
/// by container name: (name, value) pairs.
pub(crate) fn container_env(docs: &[Value]) -> Vec<(String, Vec<(String, String)>)> {
    docs.iter()
        .filter(|doc| matches!(kind(doc), "Deployment" | "DaemonSet"))
        .flat_map(|doc| {
            doc["spec"]["template"]["spec"]["containers"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|container| {
            let env = container["env"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|e| {
                    (
                        e["name"].as_str().unwrap_or_default().to_string(),
                        e["value"].as_str().unwrap_or_default().to_string(),
                    )
                })
                .collect();
            (
                container["name"].as_str().unwrap_or_default().to_string(),
                env,
            )
        })
        .collect()
}

#[test]
fn traces_go_to_the_collector_named_in_values_and_nowhere_by_default() {
    const AGENT: &str = "nodeAgent.enabled=true";
    let quiet = container_env(&render(&[NATS_URL, AGENT]));
    assert_eq!(
        quiet.len(),
        6,
        "five services and the node agent: {quiet:?}"
    );
    for (container, env) in &quiet {
        assert!(
            env.iter().all(|(name, _)| !name.starts_with("OTEL_")),
            "{container} exports traces by default: {env:?}"
        );
    }
    let endpoint = "http://otel-collector.monitoring:4317";
    let set = format!("tracing.otlpEndpoint={endpoint}");
    let traced = container_env(&render(&[NATS_URL, AGENT, &set]));
    assert_eq!(traced.len(), 6);
    for (container, env) in &traced {
        assert!(
            env.contains(&("OTEL_EXPORTER_OTLP_ENDPOINT".into(), endpoint.into())),
            "{container}: {env:?}"
        );
    }
    // A share of the traces: every process samples alike, by the parent.
    let sampled = container_env(&render(&[NATS_URL, AGENT, "tracing.sampleRatio=0.1"]));
    assert_eq!(sampled.len(), 6);
    for (container, env) in &sampled {
        assert!(
            env.contains(&(
                "OTEL_TRACES_SAMPLER".into(),
                "parentbased_traceidratio".into()
            )) && env.contains(&("OTEL_TRACES_SAMPLER_ARG".into(), "0.1".into())),
            "{container}: {env:?}"
        );
    }
    let above = crate::support::template(&[NATS_URL, "tracing.sampleRatio=1.5"]);
    assert!(!above.ok, "a share above 1 rendered");
    assert!(above.stderr.contains("sampleRatio"), "{}", above.stderr);
    let refused = crate::support::template(&[NATS_URL, "tracing.otlpEndpoint=collector:4317"]);
    assert!(!refused.ok, "an endpoint without http:// rendered");
    assert!(
        refused.stderr.contains("otlpEndpoint"),
        "{}",
        refused.stderr
    );
}

/// The alerter ages moves and claims for the module status's alerts as the
/// chart's rules do: from `prometheusRule.thresholds`, defaults included.
#[test]
fn the_module_status_ages_come_from_the_alert_thresholds() {
    let alerter_env = |sets: &[&str]| {
        let mut all = vec![NATS_URL];
        all.extend_from_slice(sets);
        container_env(&render(&all))
            .into_iter()
            .find(|(container, _)| container == "alerter")
            .map(|(_, env)| env)
            .expect("the alerter's container")
    };
    let pairs = |env: &[(String, String)]| -> Vec<(String, String)> {
        env.iter()
            .filter(|(name, _)| name.ends_with("_AFTER") || name == "SWITCHYARD_ALERTS_FOR")
            .cloned()
            .collect()
    };
    // The rules' for: by default (values.yaml), as the alerter's flag takes them.
    const DEFAULT_DELAYS: &str = "D8GpuNodeServedByNoStack=15m,D8GpuNodeDraNotReady=15m,D8GpuNodeDualAdvertisement=5m,D8GpuDevicePluginOnDraNode=5m,D8GpuUnhealthy=5m";
    let set = |name: &str, value: &str| (name.to_string(), value.to_string());
    assert_eq!(
        pairs(&alerter_env(&[])),
        [
            set("SWITCHYARD_MOVE_STALLED_AFTER", "1h"),
            set("SWITCHYARD_CLAIM_PENDING_AFTER", "15m"),
            set("SWITCHYARD_CLAIM_UNUSED_AFTER", "30m"),
            set("SWITCHYARD_ALERTS_FOR", DEFAULT_DELAYS),
        ]
    );
    assert_eq!(
        pairs(&alerter_env(&[
            "prometheusRule.thresholds.applicationMoveAge=2h",
            "prometheusRule.thresholds.resourceClaimPendingAge=5m",
            "prometheusRule.thresholds.resourceClaimUnusedAge=1d",
            "prometheusRule.thresholds.nodeDraNotReadyFor=30m",
            "prometheusRule.thresholds.gpuUnhealthyFor=1m",
        ])),
        [
            set("SWITCHYARD_MOVE_STALLED_AFTER", "2h"),
            set("SWITCHYARD_CLAIM_PENDING_AFTER", "5m"),
            set("SWITCHYARD_CLAIM_UNUSED_AFTER", "1d"),
            set(
                "SWITCHYARD_ALERTS_FOR",
                "D8GpuNodeServedByNoStack=15m,D8GpuNodeDraNotReady=30m,D8GpuNodeDualAdvertisement=5m,D8GpuDevicePluginOnDraNode=5m,D8GpuUnhealthy=1m"
            ),
        ]
    );
    // No other service gets them.
    for (container, env) in container_env(&render(&[NATS_URL])) {
        if container != "alerter" {
            assert_eq!(pairs(&env), [], "{container}");
        }
    }
}

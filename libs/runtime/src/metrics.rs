//! The services' Prometheus metrics, served on `/metrics` (`--metrics-listen`)
//! in the OpenMetrics text format (prometheus-client).
//!
//! One registry per process: a service's process has one service, the demo
//! and `switchyard serve all` have several, so every series carries the
//! `service` label. What is counted:
//!
//! - `switchyard_log_records_passed_over_total{service, reason}`: records the
//!   service met in the log and passed over — no envelope of the log
//!   (`malformed`), a signature that does not vouch for its author
//!   (`unauthenticated`), a type or schema this build does not know
//!   (`unknown_type`, `unsupported_schema`), a payload that does not decode
//!   (`undecodable`). Counted when met, while rebuilding from the log too.
//!   The chart's alert `D8GpuMigrationLogRecordPassedOver` fires on an increase.
//! - `switchyard_log_records_folded_total{service}`: records folded into the
//!   service's state (rebuild and follow).
//! - `switchyard_log_records_appended_total{service}`: records the service
//!   appended (its decisions, or inventory's facts).
//! - `switchyard_log_sequence{service}`: the sequence of the last record the
//!   service read from the log (inventory: the last it appended).
//! - `switchyard_log_head_sequence{service}`: the log's last sequence, as
//!   the service last asked (every 5 s), and `switchyard_log_lag_records{service}`:
//!   how far behind it the service has read (the chart's
//!   `D8GpuMigrationLogLagging` fires on a lag that does not shrink);
//! - `switchyard_leader{service}`: 1 while the replica leads its service,
//!   0 while it stands by (services that run elected only);
//! - `switchyard_effects_issued_total{service, effect, attempt}`: effects
//!   handed to the service's writers (`Cordon`, `SetPlacement`, ...), the
//!   `first` time or `again` (after a failure, or still wanted after the
//!   pause);
//! - `switchyard_effects_failed_total{service, effect, reason}`: writes that
//!   failed, by the API server's answer in a word (`conflict`, `throttled`,
//!   `not_found`, `forbidden`, `invalid`, `server_error`, `unreachable`, ...);
//! - `switchyard_command_seconds{service}`: a histogram of the time from an
//!   operator's command to its reply;
//! - `switchyard_alert_firing{alert, <the alert's labels>}`: 1 for each alert
//!   the alerter has raised and not cleared (its series goes when it
//!   clears); the chart's rule of the same name fires on it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{LazyLock, Mutex};

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use switchyard_eventlog::UnknownReason;
use switchyard_proto::v1::{DomainEvent, domain_event::Kind};

/// Why a record was passed over, as the `reason` label says it.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum PassedOver {
    malformed,
    unauthenticated,
    unknown_type,
    unsupported_schema,
    undecodable,
}

impl From<&UnknownReason> for PassedOver {
    fn from(reason: &UnknownReason) -> Self {
        match reason {
            UnknownReason::Malformed(_) => PassedOver::malformed,
            UnknownReason::Unauthenticated(_) => PassedOver::unauthenticated,
            UnknownReason::UnknownType => PassedOver::unknown_type,
            UnknownReason::UnsupportedSchema { .. } => PassedOver::unsupported_schema,
            UnknownReason::Undecodable(_) => PassedOver::undecodable,
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ServiceLabel {
    service: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EffectLabels {
    service: &'static str,
    effect: &'static str,
    /// `first`, or `again` (issued again: after a failure, or still wanted
    /// after the pause).
    attempt: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FailedLabels {
    service: &'static str,
    effect: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PassedOverLabels {
    service: &'static str,
    reason: PassedOver,
}

/// The process's metrics.
pub struct Metrics {
    registry: Mutex<Registry>,
    passed_over: Family<PassedOverLabels, Counter>,
    folded: Family<ServiceLabel, Counter>,
    appended: Family<ServiceLabel, Counter>,
    sequence: Family<ServiceLabel, Gauge>,
    head: Family<ServiceLabel, Gauge>,
    lag: Family<ServiceLabel, Gauge>,
    alerts: Family<Vec<(String, String)>, Gauge>,
    effects: Family<EffectLabels, Counter>,
    failed: Family<FailedLabels, Counter>,
    commands: Family<ServiceLabel, Histogram>,
    leader: Family<ServiceLabel, Gauge>,
}

/// One service's series, as [`Metrics::service`] looked them up: each update
/// is an atomic operation, not a search of the series' family (five a record
/// followed took about a twentieth of the cheapest hot path).
#[derive(Clone)]
pub struct ServiceMetrics {
    service: &'static str,
    metrics: &'static Metrics,
    folded: Counter,
    appended: Counter,
    sequence: Gauge,
    head: Gauge,
    lag: Gauge,
    /// (effect, first) -> `switchyard_effects_issued_total`'s series.
    effects: BTreeMap<(&'static str, bool), Counter>,
}

impl ServiceMetrics {
    /// The service folded a record.
    pub fn folded(&self) {
        self.folded.inc();
    }

    /// The service appended `n` records.
    pub fn appended(&self, n: usize) {
        self.appended.inc_by(n as u64);
    }

    /// The service has read the log up to `sequence`.
    pub fn read_up_to(&self, sequence: u64) {
        let read = i64::try_from(sequence).unwrap_or(i64::MAX);
        self.sequence.set(read);
        self.lag.set((self.head.get() - read).max(0));
    }

    /// The log ends at `head`, as the service asked it.
    pub fn log_head(&self, head: u64) {
        let head = i64::try_from(head).unwrap_or(i64::MAX);
        self.head.set(head);
        self.lag.set((head - self.sequence.get()).max(0));
    }

    /// The service issued `effect` (`first` time or not); `failed` says
    /// why its write failed, if it did.
    pub fn effect(&mut self, effect: &'static str, first: bool, failed: Option<&'static str>) {
        let (service, metrics) = (self.service, self.metrics);
        self.effects
            .entry((effect, first))
            .or_insert_with(|| {
                let attempt = if first { "first" } else { "again" };
                metrics
                    .effects
                    .get_or_create(&EffectLabels {
                        service,
                        effect,
                        attempt,
                    })
                    .clone()
            })
            .inc();
        if let Some(reason) = failed {
            metrics
                .failed
                .get_or_create(&FailedLabels {
                    service,
                    effect,
                    reason,
                })
                .inc();
        }
    }
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// The process's metrics.
pub fn metrics() -> &'static Metrics {
    &METRICS
}

impl Metrics {
    fn new() -> Metrics {
        let mut registry = Registry::with_prefix("switchyard");
        let passed_over = Family::<PassedOverLabels, Counter>::default();
        registry.register(
            "log_records_passed_over",
            "Records of the log the service passed over, by why (no envelope, a signature that does not vouch for its author, a type or schema this build does not know)",
            passed_over.clone(),
        );
        let folded = Family::<ServiceLabel, Counter>::default();
        registry.register(
            "log_records_folded",
            "Records of the log folded into the service's state",
            folded.clone(),
        );
        let appended = Family::<ServiceLabel, Counter>::default();
        registry.register(
            "log_records_appended",
            "Records the service appended to the log",
            appended.clone(),
        );
        let sequence = Family::<ServiceLabel, Gauge>::default();
        registry.register(
            "log_sequence",
            "Sequence of the last record the service read from the log (inventory: the last it appended)",
            sequence.clone(),
        );
        let head = Family::<ServiceLabel, Gauge>::default();
        registry.register(
            "log_head_sequence",
            "The log's last sequence, as the service last asked",
            head.clone(),
        );
        let lag = Family::<ServiceLabel, Gauge>::default();
        registry.register(
            "log_lag_records",
            "Records appended to the log that the service has not read yet (head minus read)",
            lag.clone(),
        );
        let alerts = Family::<Vec<(String, String)>, Gauge>::default();
        registry.register(
            "alert_firing",
            "Alerts the alerter has raised and not cleared, by alert and the alert's labels",
            alerts.clone(),
        );
        let effects = Family::<EffectLabels, Counter>::default();
        registry.register(
            "effects_issued",
            "Effects the service handed its writers, by effect and attempt (first, or again)",
            effects.clone(),
        );
        let failed = Family::<FailedLabels, Counter>::default();
        registry.register(
            "effects_failed",
            "Effects whose write failed (each is issued again later), by effect and why (the API server's answer in a word)",
            failed.clone(),
        );
        // 1 ms to about 8 s.
        let commands = Family::<ServiceLabel, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.001, 2.0, 14))
        });
        registry.register(
            "command_seconds",
            "Seconds from an operator's command to its reply (decisions appended)",
            commands.clone(),
        );
        let leader = Family::<ServiceLabel, Gauge>::default();
        registry.register(
            "leader",
            "1 while this replica leads its service, 0 while it stands by (services that run elected)",
            leader.clone(),
        );
        Metrics {
            leader,
            registry: Mutex::new(registry),
            passed_over,
            folded,
            appended,
            sequence,
            head,
            lag,
            alerts,
            effects,
            failed,
            commands,
        }
    }

    /// An alert the alerter raised or cleared (other records change nothing).
    pub fn alert(&self, event: &DomainEvent) {
        let series = |name: &str, labels: &std::collections::BTreeMap<String, String>| {
            let mut series = vec![("alert".to_string(), name.to_string())];
            series.extend(labels.iter().map(|(k, v)| (k.clone(), v.clone())));
            series
        };
        match &event.kind {
            Some(Kind::AlertRaised(a)) => {
                self.alerts
                    .get_or_create(&series(&a.alert_name, &a.labels))
                    .set(1);
            }
            Some(Kind::AlertCleared(a)) => {
                self.alerts.remove(&series(&a.alert_name, &a.labels));
            }
            _ => {}
        }
    }

    /// `service` passed over a record for `reason`.
    pub fn passed_over(&self, service: &'static str, reason: &UnknownReason) {
        self.passed_over
            .get_or_create(&PassedOverLabels {
                service,
                reason: reason.into(),
            })
            .inc();
    }

    /// Whether this replica leads `service` now.
    pub fn leading(&self, service: &'static str, leads: bool) {
        self.leader
            .get_or_create(&ServiceLabel { service })
            .set(i64::from(leads));
    }

    /// `service` answered a command in `seconds`.
    pub fn command(&self, service: &'static str, seconds: f64) {
        self.commands
            .get_or_create(&ServiceLabel { service })
            .observe(seconds);
    }

    /// The series of `service`, looked up once: the host updates them for
    /// every record it follows.
    pub fn service(&'static self, service: &'static str) -> ServiceMetrics {
        let label = ServiceLabel { service };
        ServiceMetrics {
            service,
            metrics: self,
            folded: self.folded.get_or_create(&label).clone(),
            appended: self.appended.get_or_create(&label).clone(),
            sequence: self.sequence.get_or_create(&label).clone(),
            head: self.head.get_or_create(&label).clone(),
            lag: self.lag.get_or_create(&label).clone(),
            effects: BTreeMap::new(),
        }
    }

    /// Adds another part's series (the node agent's) to the registry.
    pub fn register_with(&self, register: impl FnOnce(&mut Registry)) {
        register(&mut self.registry.lock().unwrap_or_else(|e| e.into_inner()));
    }

    /// Every series, in the OpenMetrics text format.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        let registry = self.registry.lock().unwrap_or_else(|e| e.into_inner());
        // Writing into a String does not fail.
        let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
        text
    }
}

/// The content type of [`Metrics::encode`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Serves `/metrics` on `listen` until the server fails.
pub async fn serve(listen: SocketAddr) -> std::io::Result<()> {
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(|| async {
            (
                [(http::header::CONTENT_TYPE, CONTENT_TYPE)],
                metrics().encode(),
            )
        }),
    );
    let listener = tokio::net::TcpListener::bind(listen).await?;
    axum::serve(listener, app).await
}

/// Starts [`serve`] in the background when `listen` is given; a failure is logged.
pub fn spawn(listen: Option<SocketAddr>) {
    if let Some(listen) = listen {
        tokio::spawn(async move {
            if let Err(err) = serve(listen).await {
                tracing::error!(%err, %listen, "the metrics server stopped");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_passed_over_are_counted_by_service_and_reason() {
        // A registry of this test's own, for the life of the process.
        let metrics: &'static Metrics = Box::leak(Box::new(Metrics::new()));
        let mut alerter = metrics.service("alerter");
        metrics.passed_over("alerter", &UnknownReason::Malformed("short".into()));
        metrics.passed_over("alerter", &UnknownReason::Malformed("shorter".into()));
        metrics.passed_over("alerter", &UnknownReason::UnknownType);
        alerter.log_head(50);
        alerter.read_up_to(42);
        alerter.folded();
        alerter.appended(3);
        let held = |group: &str| {
            std::collections::BTreeMap::from([("node_group".to_string(), group.to_string())])
        };
        for (raised, group) in [(true, "gpu-legacy"), (true, "gpu-old"), (false, "gpu-old")] {
            let kind = if raised {
                Kind::AlertRaised(switchyard_proto::v1::AlertRaised {
                    alert_name: "D8GpuNodeGroupHeldOnDra".into(),
                    labels: held(group),
                    summary: String::new(),
                })
            } else {
                Kind::AlertCleared(switchyard_proto::v1::AlertCleared {
                    alert_name: "D8GpuNodeGroupHeldOnDra".into(),
                    labels: held(group),
                })
            };
            metrics.alert(&switchyard_proto::v1::event(kind));
        }
        alerter.effect("NodeEvent", true, None);
        alerter.effect("NodeEvent", false, Some("conflict"));
        alerter.effect("NodeEvent", false, None);
        metrics.command("alerter", 0.003);
        let text = metrics.encode();
        for line in [
            r#"switchyard_effects_issued_total{service="alerter",effect="NodeEvent",attempt="first"} 1"#,
            r#"switchyard_effects_issued_total{service="alerter",effect="NodeEvent",attempt="again"} 2"#,
            r#"switchyard_effects_failed_total{service="alerter",effect="NodeEvent",reason="conflict"} 1"#,
            r#"switchyard_command_seconds_count{service="alerter"} 1"#,
            r#"switchyard_command_seconds_bucket{le="0.004",service="alerter"} 1"#,
            r#"switchyard_log_records_passed_over_total{service="alerter",reason="malformed"} 2"#,
            r#"switchyard_log_records_passed_over_total{service="alerter",reason="unknown_type"} 1"#,
            r#"switchyard_log_sequence{service="alerter"} 42"#,
            r#"switchyard_log_head_sequence{service="alerter"} 50"#,
            r#"switchyard_log_lag_records{service="alerter"} 8"#,
            r#"switchyard_log_records_folded_total{service="alerter"} 1"#,
            r#"switchyard_log_records_appended_total{service="alerter"} 3"#,
            r#"switchyard_alert_firing{alert="D8GpuNodeGroupHeldOnDra",node_group="gpu-legacy"} 1"#,
            "# TYPE switchyard_log_records_passed_over counter",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
        assert!(
            !text.contains("gpu-old"),
            "a cleared alert has no series:\n{text}"
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}

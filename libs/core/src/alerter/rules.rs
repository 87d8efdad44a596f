//! Every alert of the module, decided here once: its name, severity and
//! summary, the PrometheusRule the chart installs for it (group, PromQL,
//! `for:`), and — for those the log tells — the function that decides when
//! it holds.
//!
//! The alerter's module status carries as conditions the alerts of
//! [`Source::Log`], each decided by the function its entry names (the
//! [`Alerter`](super::Alerter) itself raises `D8GpuNodeGroupHeldOnDra`).
//! The chart's PrometheusRule is checked against [`RULES`] by
//! `tests/tests/helm_chart/alerts.rs`: the same alerts, groups, severities,
//! summaries, expressions and `for:`, with the thresholds of
//! `prometheusRule.thresholds` ([`THRESHOLDS`]) in place.

use switchyard_proto::v1::{GpuPhase, Stack, StackReason};

use crate::names::ALERT_HELD_ON_DRA;
use crate::stack_assigner::Handover;

/// How urgent an alert is: its `severity` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    Warning,
    /// Two allocators may hand out the same card.
    Critical,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Warning => "warning",
            Severity::Critical => "critical",
        }
    }
}

/// Who can tell that an alert holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The log: the alerter decides it from the state it folds, with this
    /// module's functions, and the module status carries it; the chart's
    /// rule reads the series the alerter serves from the same state.
    Log,
    /// Prometheus alone, from series each service counts about itself (the
    /// log's lag, the records it passed over): no record says it.
    Prometheus,
}

/// A setting of the chart's `prometheusRule.thresholds`: how long before
/// an alert fires, or how old or how many its objects must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Threshold {
    /// Its key under `prometheusRule.thresholds`.
    pub key: &'static str,
    /// Its default in the chart's values, and the alerter's flag's.
    pub default: &'static str,
}

pub const NODE_SERVED_BY_NO_STACK_FOR: Threshold = Threshold {
    key: "nodeServedByNoStackFor",
    default: "15m",
};
pub const NODE_DRA_NOT_READY_FOR: Threshold = Threshold {
    key: "nodeDraNotReadyFor",
    default: "15m",
};
pub const DUAL_ADVERTISEMENT_FOR: Threshold = Threshold {
    key: "dualAdvertisementFor",
    default: "5m",
};
pub const DEVICE_PLUGIN_ON_DRA_NODE_FOR: Threshold = Threshold {
    key: "devicePluginOnDraNodeFor",
    default: "5m",
};
pub const HANDOVER_STEP_AGE: Threshold = Threshold {
    key: "handoverStepAge",
    default: "1h",
};
pub const APPLICATION_MOVE_AGE: Threshold = Threshold {
    key: "applicationMoveAge",
    default: "1h",
};
pub const RESOURCE_CLAIM_PENDING_AGE: Threshold = Threshold {
    key: "resourceClaimPendingAge",
    default: "15m",
};
pub const RESOURCE_CLAIM_UNUSED_AGE: Threshold = Threshold {
    key: "resourceClaimUnusedAge",
    default: "30m",
};
pub const GPU_UNHEALTHY_FOR: Threshold = Threshold {
    key: "gpuUnhealthyFor",
    default: "5m",
};
pub const LOG_NOT_ADVANCING_WINDOW: Threshold = Threshold {
    key: "logNotAdvancingWindow",
    default: "10m",
};
pub const LOG_LAG_RECORDS: Threshold = Threshold {
    key: "logLagRecords",
    default: "1000",
};
pub const LOG_LAGGING_FOR: Threshold = Threshold {
    key: "logLaggingFor",
    default: "5m",
};

/// Every threshold, as the chart's values list them.
pub const THRESHOLDS: [Threshold; 12] = [
    NODE_SERVED_BY_NO_STACK_FOR,
    NODE_DRA_NOT_READY_FOR,
    DUAL_ADVERTISEMENT_FOR,
    DEVICE_PLUGIN_ON_DRA_NODE_FOR,
    HANDOVER_STEP_AGE,
    APPLICATION_MOVE_AGE,
    RESOURCE_CLAIM_PENDING_AGE,
    RESOURCE_CLAIM_UNUSED_AGE,
    GPU_UNHEALTHY_FOR,
    LOG_NOT_ADVANCING_WINDOW,
    LOG_LAG_RECORDS,
    LOG_LAGGING_FOR,
];

/// One alert.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AlertRule {
    /// `alertname`, and the module status's condition type.
    pub name: &'static str,
    pub severity: Severity,
    pub source: Source,
    /// The group of the chart's PrometheusRule it is in.
    pub group: &'static str,
    /// The rule's `summary` annotation (a Prometheus template over the
    /// alert's labels).
    pub summary: &'static str,
    /// The rule's PromQL; `${key}` stands for the value of threshold `key`,
    /// `${key:seconds}` for it in seconds (see [`AlertRule::expr_with`]).
    pub expr: &'static str,
    /// The rule's `for:`, and how long the module status waits before it
    /// fires: none fires at once.
    pub for_: Option<Threshold>,
}

/// `D8GpuNodeGroupHeldOnDra`, the reference's: per group with spec.gpu held
/// on DRA after the module upgrade, raised and cleared by the
/// [`Alerter`](super::Alerter).
pub const NODE_GROUP_HELD_ON_DRA: AlertRule = AlertRule {
    name: ALERT_HELD_ON_DRA,
    severity: Severity::Warning,
    source: Source::Log,
    group: "switchyard.migration",
    summary: "Node group {{ $labels.node_group }} has spec.gpu and is held on DRA after the module upgrade",
    expr: r#"max by (node_group) (switchyard_alert_firing{alert="D8GpuNodeGroupHeldOnDra"}) == 1"#,
    for_: None,
};

/// The reference's "No stack manages the node": see [`node_served_by_no_stack`].
pub const NODE_SERVED_BY_NO_STACK: AlertRule = AlertRule {
    name: "D8GpuNodeServedByNoStack",
    severity: Severity::Warning,
    source: Source::Log,
    group: "switchyard.nodes",
    summary: "No GPU stack serves node {{ $labels.node }}: its cards sit idle",
    expr: r#"max by (node, node_group, stack_reason) (switchyard_gpu_node{stack="none", handover_step="none", stack_reason!~"control_plane|gpu_disabled_label|no_gpu_present"}) == 1"#,
    for_: Some(NODE_SERVED_BY_NO_STACK_FOR),
};

/// The reference's "DRA is not deployed on the group's nodes", per
/// readiness condition missing: see [`node_dra_not_ready`].
pub const NODE_DRA_NOT_READY: AlertRule = AlertRule {
    name: "D8GpuNodeDraNotReady",
    severity: Severity::Warning,
    source: Source::Log,
    group: "switchyard.nodes",
    summary: "DRA is not ready on node {{ $labels.node }}: {{ $labels.condition }}",
    expr: r#"
        max by (node, node_group, condition) (switchyard_gpu_node_dra_missing) == 1
        unless on (node)
        max by (node) (switchyard_gpu_node{handover_step!="none"})"#,
    for_: Some(NODE_DRA_NOT_READY_FOR),
};

/// The NVIDIA guide's failed exclusivity gate: see [`node_dual_advertisement`].
pub const NODE_DUAL_ADVERTISEMENT: AlertRule = AlertRule {
    name: "D8GpuNodeDualAdvertisement",
    severity: Severity::Critical,
    source: Source::Log,
    group: "switchyard.nodes",
    summary: "Node {{ $labels.node }} advertises its GPUs through both the device plugin and DRA",
    expr: r#"
        (max by (node, node_group, stack) (switchyard_gpu_node_device_plugin_gpus) > 0)
        and on (node)
        (max by (node) (switchyard_gpu_node_slice_devices) > 0)"#,
    for_: Some(DUAL_ADVERTISEMENT_FOR),
};

/// The NVIDIA guide's "Device Plugin Reappears on a DRA Node": see
/// [`device_plugin_on_dra_node`] (the rule sees the advertised GPUs; the
/// module status also the stack-assigner's record of the failed gate).
pub const DEVICE_PLUGIN_ON_DRA_NODE: AlertRule = AlertRule {
    name: "D8GpuDevicePluginOnDraNode",
    severity: Severity::Critical,
    source: Source::Log,
    group: "switchyard.nodes",
    summary: "The device plugin advertises GPUs on DRA node {{ $labels.node }}",
    expr: r#"max by (node, node_group) (switchyard_gpu_node_device_plugin_gpus{stack="dra"}) > 0"#,
    for_: Some(DEVICE_PLUGIN_ON_DRA_NODE_FOR),
};

/// A handover recorded stalled: see [`handover_stalled`] (the rule also
/// fires on a step older than [`HANDOVER_STEP_AGE`], when the stack-assigner
/// is not there to record it).
pub const HANDOVER_STALLED: AlertRule = AlertRule {
    name: "D8GpuHandoverStalled",
    severity: Severity::Warning,
    source: Source::Log,
    group: "switchyard.migration",
    summary: "The handover of node {{ $labels.node }} to {{ $labels.target_group }} is stuck at step {{ $labels.step }}",
    expr: r#"
        (
          time() - max by (handover, node, source_group, target_group, step, rollback) (switchyard_handover_step_started_timestamp_seconds{stalled="true"})
        )
        or
        (
          time() - max by (handover, node, source_group, target_group, step, rollback) (switchyard_handover_step_started_timestamp_seconds) > ${handoverStepAge:seconds}
        )"#,
    for_: None,
};

/// An application move not verified [`APPLICATION_MOVE_AGE`] after it
/// started: see [`older_than`].
pub const APPLICATION_MOVE_STALLED: AlertRule = AlertRule {
    name: "D8GpuApplicationMoveStalled",
    severity: Severity::Warning,
    source: Source::Log,
    group: "switchyard.migration",
    summary: "The move of {{ $labels.namespace }}/{{ $labels.workload }} to {{ $labels.target_group }} has not finished",
    expr: "time() - max by (move, namespace, workload, source_group, target_group, gpu_class, rollback) (switchyard_move_started_timestamp_seconds) > ${applicationMoveAge:seconds}",
    for_: None,
};

/// The NVIDIA guide's "claims that remain pending": unallocated longer than
/// [`RESOURCE_CLAIM_PENDING_AGE`] (see [`older_than`]).
pub const RESOURCE_CLAIM_PENDING: AlertRule = AlertRule {
    name: "D8GpuResourceClaimPending",
    severity: Severity::Warning,
    source: Source::Log,
    group: "switchyard.claims",
    summary: "ResourceClaim {{ $labels.namespace }}/{{ $labels.claim }} has no device allocated",
    expr: "time() - max by (namespace, claim) (switchyard_resource_claim_pending_since_timestamp_seconds) > ${resourceClaimPendingAge:seconds}",
    for_: None,
};

/// The NVIDIA guide's claims "reserved unexpectedly": allocated and
/// reserved for no pending or running pod longer than
/// [`RESOURCE_CLAIM_UNUSED_AGE`] (see [`older_than`]).
pub const RESOURCE_CLAIM_UNUSED: AlertRule = AlertRule {
    name: "D8GpuResourceClaimUnused",
    severity: Severity::Warning,
    source: Source::Log,
    group: "switchyard.claims",
    summary: "ResourceClaim {{ $labels.namespace }}/{{ $labels.claim }} holds devices on {{ $labels.node }} that no pod uses",
    expr: "time() - max by (namespace, claim, node) (switchyard_resource_claim_unused_since_timestamp_seconds) > ${resourceClaimUnusedAge:seconds}",
    for_: None,
};

/// A PhysicalGPU Failed: see [`gpu_unhealthy`] (the rule also fires on a
/// card the node agent reports unhealthy, which no record says).
pub const GPU_UNHEALTHY: AlertRule = AlertRule {
    name: "D8GpuUnhealthy",
    severity: Severity::Warning,
    source: Source::Log,
    group: "switchyard.nodes",
    summary: "GPU {{ $labels.uuid }}{{ with $labels.node }} on node {{ . }}{{ end }} is unhealthy",
    expr: r#"
        max by (node, gpu, uuid) (
          switchyard_physical_gpu{phase="failed"} == 1
          or
          (switchyard_physical_gpu and on (uuid) (switchyard_node_agent_gpu_healthy == 0))
        )
        or on (uuid)
        max by (namespace, pod, uuid, index) (switchyard_node_agent_gpu_healthy == 0)"#,
    for_: Some(GPU_UNHEALTHY_FOR),
};

/// A service passed over records of the log in the last 15 minutes (no
/// envelope, a signature that does not vouch for its author, a type it does
/// not know).
pub const MIGRATION_LOG_RECORD_PASSED_OVER: AlertRule = AlertRule {
    name: "D8GpuMigrationLogRecordPassedOver",
    severity: Severity::Warning,
    source: Source::Prometheus,
    group: "switchyard.log",
    summary: "{{ $labels.service }} passed over records of the migration log ({{ $labels.reason }})",
    expr: "sum by (namespace, pod, service, reason) (increase(switchyard_log_records_passed_over_total[15m])) > 0",
    for_: None,
};

/// A service behind the log that read nothing over
/// [`LOG_NOT_ADVANCING_WINDOW`], or more than [`LOG_LAG_RECORDS`] behind.
pub const MIGRATION_LOG_LAGGING: AlertRule = AlertRule {
    name: "D8GpuMigrationLogLagging",
    severity: Severity::Warning,
    source: Source::Prometheus,
    group: "switchyard.log",
    summary: "{{ $labels.service }} is {{ $value }} record(s) behind the migration log",
    expr: r#"
        (
          max by (namespace, pod, service) (switchyard_log_lag_records) > ${logLagRecords}
        )
        or
        (
          max by (namespace, pod, service) (switchyard_log_lag_records) > 0
          and on (namespace, pod, service)
          max by (namespace, pod, service) (changes(switchyard_log_sequence[${logNotAdvancingWindow}])) == 0
        )"#,
    for_: Some(LOG_LAGGING_FOR),
};

/// Every alert: those the log tells first, in the order the module status
/// lists them, then Prometheus's own.
pub const RULES: [AlertRule; 12] = [
    NODE_GROUP_HELD_ON_DRA,
    NODE_SERVED_BY_NO_STACK,
    NODE_DRA_NOT_READY,
    NODE_DUAL_ADVERTISEMENT,
    DEVICE_PLUGIN_ON_DRA_NODE,
    HANDOVER_STALLED,
    APPLICATION_MOVE_STALLED,
    RESOURCE_CLAIM_PENDING,
    RESOURCE_CLAIM_UNUSED,
    GPU_UNHEALTHY,
    MIGRATION_LOG_RECORD_PASSED_OVER,
    MIGRATION_LOG_LAGGING,
];

/// The alerts the log tells, in order: the module status's.
pub fn from_log() -> impl Iterator<Item = &'static AlertRule> {
    RULES.iter().filter(|rule| rule.source == Source::Log)
}

/// The alert named `name`.
pub fn rule(name: &str) -> Option<&'static AlertRule> {
    RULES.iter().find(|rule| rule.name == name)
}

/// A threshold's value that is not what the rule takes.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ThresholdError {
    #[error("{alert}: expr: threshold {key:?} is not one of prometheusRule.thresholds")]
    Unknown { alert: &'static str, key: String },
    #[error(
        "{alert}: expr: threshold {key}: {value:?} is not one number and one unit (s, m, h, d)"
    )]
    NotADuration {
        alert: &'static str,
        key: &'static str,
        value: String,
    },
    #[error("{alert}: expr: an unclosed `${{`")]
    Unclosed { alert: &'static str },
}

impl AlertRule {
    /// The rule's PromQL with each threshold's value as `value` gives it
    /// (as in the chart's values: `1h`, `1000`).
    pub fn expr_with(
        &self,
        value: impl Fn(&Threshold) -> String,
    ) -> Result<String, ThresholdError> {
        let mut out = String::new();
        let mut rest = self.expr;
        while let Some(start) = rest.find("${") {
            out.push_str(&rest[..start]);
            let after = &rest[start + 2..];
            let end = after
                .find('}')
                .ok_or(ThresholdError::Unclosed { alert: self.name })?;
            let (key, in_seconds) = match after[..end].split_once(':') {
                Some((key, "seconds")) => (key, true),
                _ => (&after[..end], false),
            };
            let threshold = THRESHOLDS.iter().find(|t| t.key == key).ok_or_else(|| {
                ThresholdError::Unknown {
                    alert: self.name,
                    key: after[..end].to_string(),
                }
            })?;
            let text = value(threshold);
            if in_seconds {
                let seconds = seconds(&text).ok_or(ThresholdError::NotADuration {
                    alert: self.name,
                    key: threshold.key,
                    value: text.clone(),
                })?;
                out.push_str(&seconds.to_string());
            } else {
                out.push_str(&text);
            }
            rest = &after[end + 1..];
        }
        out.push_str(rest);
        Ok(out.trim().to_string())
    }

    /// The rule's PromQL with the thresholds' defaults.
    pub fn default_expr(&self) -> Result<String, ThresholdError> {
        self.expr_with(|t| t.default.to_string())
    }

    /// The thresholds its expression names.
    pub fn thresholds_in_expr(&self) -> Vec<&'static str> {
        THRESHOLDS
            .iter()
            .filter(|t| {
                self.expr.contains(&format!("${{{}}}", t.key))
                    || self.expr.contains(&format!("${{{}:seconds}}", t.key))
            })
            .map(|t| t.key)
            .collect()
    }
}

/// A threshold's duration (one number and one unit: s, m, h or d, as the
/// chart's schema takes them) in seconds.
pub fn seconds(duration: &str) -> Option<u64> {
    let unit = match duration.chars().last()? {
        's' => 1,
        'm' => 60,
        'h' => 3600,
        'd' => 86400,
        _ => return None,
    };
    let number = &duration[..duration.len() - 1];
    if number.is_empty() || !number.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    number.parse::<u64>().ok()?.checked_mul(unit)
}

/// One GPU node as the node alerts decide on it: what the stack-assigner
/// decided, its handover, and what it advertises.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuNodeFacts {
    /// The stack the stack-assigner put it on (`None`: not decided).
    pub stack: Option<Stack>,
    /// Why.
    pub reason: StackReason,
    /// A handover of the node is in progress (it waits for the node itself).
    pub in_handover: bool,
    /// On DRA, readiness conditions it still misses.
    pub readiness_missing: bool,
    /// Device-plugin GPU resources allocatable on it.
    pub device_plugin_gpus: u32,
    /// Devices in the ResourceSlices published for it.
    pub slice_devices: usize,
    /// The stack-assigner recorded its exclusivity gate failed (the
    /// nvidia-operator backend: the device plugin's pod or label back).
    pub exclusivity_lost: bool,
}

/// Reasons that keep a GPU node off every stack on purpose: no alert.
pub const KEPT_OFF_ON_PURPOSE: [StackReason; 3] = [
    StackReason::ControlPlane,
    StackReason::GpuDisabledLabel,
    StackReason::NoGpuPresent,
];

/// [`NODE_SERVED_BY_NO_STACK`]: neither stack serves the node, outside a
/// handover (which passes through no stack while the node changes group),
/// and nothing keeps it off on purpose.
pub fn node_served_by_no_stack(node: &GpuNodeFacts) -> bool {
    !matches!(node.stack, Some(Stack::DevicePlugin | Stack::Dra))
        && !node.in_handover
        && !KEPT_OFF_ON_PURPOSE.contains(&node.reason)
}

/// [`NODE_DRA_NOT_READY`]: a node put on DRA misses a readiness condition,
/// outside a handover of it (which waits for them and stalls past its
/// deadline).
pub fn node_dra_not_ready(node: &GpuNodeFacts) -> bool {
    node.readiness_missing && !node.in_handover
}

/// [`NODE_DUAL_ADVERTISEMENT`]: device-plugin GPUs allocatable and
/// ResourceSlice devices published on the same node.
pub fn node_dual_advertisement(node: &GpuNodeFacts) -> bool {
    node.device_plugin_gpus > 0 && node.slice_devices > 0
}

/// How the device plugin was seen on a DRA node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DevicePluginOnDra {
    /// It advertises GPU resources there.
    Advertising { gpus: u32 },
    /// The stack-assigner recorded the failed exclusivity gate (before any
    /// GPU is advertised).
    ExclusivityLost,
}

/// [`DEVICE_PLUGIN_ON_DRA_NODE`]: the device plugin advertises GPUs on a
/// node on DRA, or the stack-assigner recorded the gate failed.
pub fn device_plugin_on_dra_node(node: &GpuNodeFacts) -> Option<DevicePluginOnDra> {
    if node.stack == Some(Stack::Dra) && node.device_plugin_gpus > 0 {
        Some(DevicePluginOnDra::Advertising {
            gpus: node.device_plugin_gpus,
        })
    } else if node.exclusivity_lost {
        Some(DevicePluginOnDra::ExclusivityLost)
    } else {
        None
    }
}

/// [`HANDOVER_STALLED`]: the stack-assigner recorded the handover stalled
/// (past its own deadline for the step).
pub fn handover_stalled(handover: &Handover) -> bool {
    handover.stalled
}

/// [`APPLICATION_MOVE_STALLED`], [`RESOURCE_CLAIM_PENDING`],
/// [`RESOURCE_CLAIM_UNUSED`]: what holds since `since` is older than `limit`
/// at `now` (nanoseconds).
pub fn older_than(since: i64, now: i64, limit: i64) -> bool {
    now.saturating_sub(since) > limit
}

/// [`GPU_UNHEALTHY`]: the PhysicalGPU is in the Failed phase.
pub fn gpu_unhealthy(phase: GpuPhase) -> bool {
    phase == GpuPhase::Failed
}

/// An alert whose condition holds since `since` fires at `now` once it held
/// for its `for_` (nanoseconds), as Prometheus fires a rule after its `for:`.
pub fn held_long_enough(since: i64, now: i64, for_: i64) -> bool {
    now.saturating_sub(since) >= for_
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn every_alert_is_named_once_and_the_reference_s_as_it_spells_it() {
        let names: BTreeSet<&str> = RULES.iter().map(|r| r.name).collect();
        assert_eq!(names.len(), RULES.len());
        assert_eq!(NODE_GROUP_HELD_ON_DRA.name, "D8GpuNodeGroupHeldOnDra");
        assert!(RULES.iter().all(|r| r.name.starts_with("D8Gpu")));
        // The log's first: the module status lists them in this order.
        let sources: Vec<Source> = RULES.iter().map(|r| r.source).collect();
        let first_prometheus = sources
            .iter()
            .position(|s| *s == Source::Prometheus)
            .unwrap();
        assert!(
            sources[first_prometheus..]
                .iter()
                .all(|s| *s == Source::Prometheus)
        );
    }

    #[test]
    fn every_threshold_is_used_and_every_expression_names_known_ones() {
        let mut used = BTreeSet::new();
        for rule in RULES {
            let expr = rule.default_expr().unwrap_or_else(|e| panic!("{e}"));
            assert!(!expr.contains("${"), "{}: {expr}", rule.name);
            used.extend(rule.thresholds_in_expr());
            used.extend(rule.for_.map(|t| t.key));
        }
        let all: BTreeSet<&str> = THRESHOLDS.iter().map(|t| t.key).collect();
        assert_eq!(used, all);
        assert_eq!(all.len(), THRESHOLDS.len());
    }

    #[test]
    fn an_age_goes_in_as_seconds_and_a_count_as_it_is() {
        let expr = HANDOVER_STALLED
            .expr_with(|t| {
                if t.key == "handoverStepAge" {
                    "2h".into()
                } else {
                    t.default.into()
                }
            })
            .unwrap();
        assert!(expr.ends_with("> 7200\n        )"), "{expr}");
        let expr = MIGRATION_LOG_LAGGING.default_expr().unwrap();
        assert!(expr.contains("> 1000") && expr.contains("[10m]"), "{expr}");
        assert_eq!(
            APPLICATION_MOVE_STALLED.expr_with(|_| "soon".into()),
            Err(ThresholdError::NotADuration {
                alert: "D8GpuApplicationMoveStalled",
                key: "applicationMoveAge",
                value: "soon".into()
            })
        );
        assert_eq!(seconds("1d"), Some(86400));
        assert_eq!(seconds("90s"), Some(90));
        assert_eq!(seconds("1h30m"), None);
        assert_eq!(seconds("m"), None);
    }

    fn node(stack: Option<Stack>, reason: StackReason) -> GpuNodeFacts {
        GpuNodeFacts {
            stack,
            reason,
            ..GpuNodeFacts::default()
        }
    }

    #[test]
    fn a_node_on_no_stack_fires_unless_in_a_handover_or_kept_off_on_purpose() {
        assert!(node_served_by_no_stack(&node(
            None,
            StackReason::NoSpecGpuDraDisabled
        )));
        assert!(node_served_by_no_stack(&node(
            Some(Stack::Unspecified),
            StackReason::FeatureGatesNotReady
        )));
        assert!(!node_served_by_no_stack(&node(
            Some(Stack::Dra),
            StackReason::DraEnabled
        )));
        for reason in KEPT_OFF_ON_PURPOSE {
            assert!(!node_served_by_no_stack(&node(None, reason)), "{reason:?}");
        }
        let moving = GpuNodeFacts {
            in_handover: true,
            ..node(None, StackReason::NoSpecGpuDraDisabled)
        };
        assert!(!node_served_by_no_stack(&moving));
    }

    #[test]
    fn the_device_plugin_on_a_dra_node_is_seen_advertising_or_recorded() {
        let dra = GpuNodeFacts {
            device_plugin_gpus: 4,
            ..node(Some(Stack::Dra), StackReason::DraEnabled)
        };
        assert_eq!(
            device_plugin_on_dra_node(&dra),
            Some(DevicePluginOnDra::Advertising { gpus: 4 })
        );
        let plugin = GpuNodeFacts {
            device_plugin_gpus: 4,
            ..node(Some(Stack::DevicePlugin), StackReason::GroupHasSpecGpu)
        };
        assert_eq!(device_plugin_on_dra_node(&plugin), None);
        let lost = GpuNodeFacts {
            exclusivity_lost: true,
            ..node(Some(Stack::Dra), StackReason::PoolStack)
        };
        assert_eq!(
            device_plugin_on_dra_node(&lost),
            Some(DevicePluginOnDra::ExclusivityLost)
        );
        assert!(node_dual_advertisement(&GpuNodeFacts {
            slice_devices: 8,
            ..plugin
        }));
        assert!(!node_dual_advertisement(&dra));
    }

    #[test]
    fn an_age_fires_past_its_limit_and_a_for_once_reached() {
        assert!(!older_than(0, 10, 10));
        assert!(older_than(0, 11, 10));
        assert!(held_long_enough(0, 10, 10));
        assert!(!held_long_enough(1, 10, 10));
        assert!(held_long_enough(5, 5, 0));
    }
}

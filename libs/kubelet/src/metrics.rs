//! The node agent's metrics (prometheus-client), registered into the
//! process's registry by [`register`] and served with the services' on
//! `/metrics`:
//!
//! - `switchyard_node_agent_stack{stack}`: 1 for the stack the agent serves
//!   now (`dra` or `device-plugin`), no series while it serves none;
//! - `switchyard_node_agent_prepared_claims`: claims prepared for kubelet and
//!   not unprepared yet (the checkpoint's);
//! - `switchyard_node_agent_claim_seconds{operation}`: how long preparing or
//!   unpreparing one claim took (`prepare`, `unprepare`), a histogram;
//! - `switchyard_node_agent_claim_errors_total{operation}`: claims whose
//!   preparation or unpreparation kubelet was answered with an error;
//! - `switchyard_node_agent_gpu_healthy{uuid, index}`: per GPU of the node, 1
//!   healthy, 0 not (what the device plugin lists and the DRA devices'
//!   taint follow).

use std::sync::LazyLock;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::stack::Stack;

/// What kubelet asked of a claim.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Operation {
    prepare,
    unprepare,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabel {
    operation: Operation,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GpuLabels {
    uuid: String,
    index: u32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StackLabel {
    stack: &'static str,
}

struct AgentMetrics {
    stack: Family<StackLabel, Gauge>,
    prepared: Gauge,
    seconds: Family<OperationLabel, Histogram>,
    errors: Family<OperationLabel, Counter>,
    healthy: Family<GpuLabels, Gauge>,
}

static METRICS: LazyLock<AgentMetrics> = LazyLock::new(|| AgentMetrics {
    stack: Family::default(),
    prepared: Gauge::default(),
    // 1 ms to about 4 s.
    seconds: Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.001, 2.0, 13))),
    errors: Family::default(),
    healthy: Family::default(),
});

/// Registers the node agent's series in `registry` (prefixed `switchyard`).
pub fn register(registry: &mut Registry) {
    let m = &*METRICS;
    let agent = registry.sub_registry_with_prefix("node_agent");
    agent.register(
        "stack",
        "The stack the node agent serves now (1), by stack",
        m.stack.clone(),
    );
    agent.register(
        "prepared_claims",
        "Claims prepared for kubelet and not unprepared yet",
        m.prepared.clone(),
    );
    agent.register(
        "claim_seconds",
        "Seconds to prepare or unprepare one claim, by operation",
        m.seconds.clone(),
    );
    agent.register(
        "claim_errors",
        "Claims whose preparation or unpreparation failed, by operation",
        m.errors.clone(),
    );
    agent.register(
        "gpu_healthy",
        "Per GPU of the node: 1 healthy, 0 unhealthy",
        m.healthy.clone(),
    );
}

/// The node's GPUs and their health, now.
pub fn gpus(gpus: &[switchyard_gpu::Gpu]) {
    METRICS.healthy.clear();
    for gpu in gpus {
        METRICS
            .healthy
            .get_or_create(&GpuLabels {
                uuid: gpu.uuid.clone(),
                index: gpu.index,
            })
            .set(i64::from(gpu.healthy));
    }
}

/// The agent serves `stack` now (`None`: none).
pub fn serving(stack: Option<Stack>) {
    METRICS.stack.clear();
    if let Some(stack) = stack {
        METRICS
            .stack
            .get_or_create(&StackLabel {
                stack: stack.label(),
            })
            .set(1);
    }
}

/// One claim's `operation` took `seconds`, and failed if `failed`.
pub fn claim(operation: Operation, seconds: f64, failed: bool) {
    let label = OperationLabel { operation };
    METRICS.seconds.get_or_create(&label).observe(seconds);
    if failed {
        METRICS.errors.get_or_create(&label).inc();
    }
}

/// `n` claims are prepared now.
pub fn prepared(n: usize) {
    METRICS.prepared.set(i64::try_from(n).unwrap_or(i64::MAX));
}

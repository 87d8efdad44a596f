//! The stack rules (reference: "How the stacks are split across nodes"): which
//! stack serves a node, given the cluster facts. The stack-assigner decides
//! with them; a handover predicts a node's stack in its target group with them.

use switchyard_proto::v1::{Stack, StackReason};

use crate::backend::{Backend, NvidiaOperator, nvidia};
use crate::cluster::{Cluster, Node};

/// The rules, for one node, on the cluster's backend. `held`: the node's
/// group is held on DRA (the `deckhouse` backend's upgrade hold).
pub fn rule(node: &Node, cluster: &Cluster, held: bool) -> (Stack, StackReason) {
    match &cluster.backend {
        Backend::Deckhouse => deckhouse(node, cluster, held),
        Backend::NvidiaOperator(backend) => nvidia_operator(node, cluster, backend),
    }
}

/// The `nvidia-operator` backend: the node's pool decides; a node the GPU
/// Operator deploys nothing on gets nothing, and a DRA pool waits for the
/// feature gates rather than falling back to the device plugin. The
/// ModuleConfig and the upgrade hold are Deckhouse's and play no part.
fn nvidia_operator(
    node: &Node,
    cluster: &Cluster,
    backend: &NvidiaOperator,
) -> (Stack, StackReason) {
    if node.is_control_plane() {
        return (Stack::None, StackReason::ControlPlane);
    }
    if node.labels.get(nvidia::GPU_PRESENT).map(String::as_str) != Some("true") {
        return (Stack::None, StackReason::NoGpuPresent);
    }
    let pool = node.labels.get(&backend.pool_label);
    match pool.and_then(|p| backend.pools.get(p)) {
        Some(Stack::Dra) if !cluster.module.feature_gates_ready => {
            (Stack::None, StackReason::FeatureGatesNotReady)
        }
        Some(&stack @ (Stack::Dra | Stack::DevicePlugin | Stack::None)) => {
            (stack, StackReason::PoolStack)
        }
        Some(Stack::Unspecified) | None => (Stack::DevicePlugin, StackReason::OperatorDefault),
    }
}

/// The `deckhouse` backend: the reference's rules.
fn deckhouse(node: &Node, cluster: &Cluster, held: bool) -> (Stack, StackReason) {
    let spec_gpu = node.group().is_some_and(|g| cluster.has_spec_gpu(g));
    if spec_gpu && !held {
        return (Stack::DevicePlugin, StackReason::GroupHasSpecGpu);
    }
    let module = &cluster.module;
    if !module.dra_enabled {
        return (Stack::None, StackReason::NoSpecGpuDraDisabled);
    }
    if node.is_control_plane() {
        return (Stack::None, StackReason::ControlPlane);
    }
    if node.gpu_disabled() {
        return (Stack::None, StackReason::GpuDisabledLabel);
    }
    if !module.feature_gates_ready {
        return (Stack::None, StackReason::FeatureGatesNotReady);
    }
    if held {
        (Stack::Dra, StackReason::HeldOnDra)
    } else {
        (Stack::Dra, StackReason::DraEnabled)
    }
}

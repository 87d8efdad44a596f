//! The stack rules (reference: "How the stacks are split across nodes"): which
//! stack serves a node, given the cluster facts. The stack-assigner decides
//! with them; a handover predicts a node's stack in its target group with them.

use switchyard_proto::v1::{Stack, StackReason};

use crate::cluster::{Cluster, Node};

/// The rules, for one node. `held`: the node's group is held on DRA.
pub fn rule(node: &Node, cluster: &Cluster, held: bool) -> (Stack, StackReason) {
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

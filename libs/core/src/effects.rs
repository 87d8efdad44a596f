//! Effects: what the cores want done in the cluster, as typed values. The
//! Kubernetes adapter and the simulator execute the same effects; every effect
//! is idempotent, so issuing it again after a restart is harmless. Its outcome
//! comes back as fact events.

use std::collections::BTreeMap;

use switchyard_proto::v1::{Taint, WorkloadPlacement, WorkloadRef};

#[derive(Clone, Debug, PartialEq)]
pub enum Effect {
    /// Set `spec.unschedulable`.
    Cordon {
        node: String,
    },
    Uncordon {
        node: String,
    },
    /// Evict every pod but DaemonSet pods, through the Eviction API.
    Drain {
        node: String,
    },
    /// Label the node `node.deckhouse.io/group=<group>` and remove
    /// `node-role.kubernetes.io/<from_group>`.
    MoveToGroup {
        node: String,
        group: String,
        from_group: String,
    },
    /// Put back exactly these labels and taints (a rollback), except the
    /// preparation labels (`names::PREPARATION_LABELS`), which node preparation
    /// sets for the node's new stack.
    RestoreNode {
        node: String,
        labels: BTreeMap<String, String>,
        taints: Vec<Taint>,
    },
    /// Set `node.deckhouse.io/gpu-stack` (or remove it for no stack); node
    /// preparation reconfigures the node for that stack.
    SetStackLabel {
        node: String,
        stack: Option<String>,
    },
    /// Remove these labels from the node.
    RemoveNodeLabels {
        node: String,
        labels: Vec<String>,
    },
    /// Write the changed part of a workload's pod template.
    SetPlacement {
        workload: WorkloadRef,
        placement: WorkloadPlacement,
    },
    /// `kubectl rollout restart`: set the restartedAt annotation.
    RestartWorkload {
        workload: WorkloadRef,
        restarted_at: String,
    },
    /// Remove the spec.gpu section of a NodeGroup (completion).
    RemoveSpecGpu {
        group: String,
    },
    /// Apply a GPUClass's DeviceClasses and write them to its status
    /// (deviceClassNames, variants, and the condition Ready: False with the
    /// reason when the current spec was refused).
    PublishDeviceClasses {
        gpu_class: String,
        variants: Vec<switchyard_proto::v1::CompiledVariant>,
        refused: Option<String>,
        /// Only these namespaces may use the class (empty: all): an admission
        /// policy refuses claims, claim templates and pods elsewhere.
        namespaces: Vec<String>,
    },
    /// A deleted GPU class no claim uses any more: delete its DeviceClasses
    /// and its namespace restriction.
    RetireDeviceClasses {
        gpu_class: String,
        device_classes: Vec<String>,
    },
    /// Set a ResourceQuota's spec.hard.
    SetQuota {
        namespace: String,
        name: String,
        hard: BTreeMap<String, String>,
    },
}

impl Effect {
    /// The object the effect writes, e.g. `node/gpu-1`: effects on one object
    /// are carried out in order, effects on different objects may run at once.
    pub fn object(&self) -> String {
        match self {
            Effect::Cordon { node }
            | Effect::Uncordon { node }
            | Effect::Drain { node }
            | Effect::MoveToGroup { node, .. }
            | Effect::RestoreNode { node, .. }
            | Effect::SetStackLabel { node, .. }
            | Effect::RemoveNodeLabels { node, .. } => format!("node/{node}"),
            Effect::SetPlacement { workload, .. } | Effect::RestartWorkload { workload, .. } => {
                format!("{}/{}/{}", workload.kind, workload.namespace, workload.name)
            }
            Effect::RemoveSpecGpu { group } => format!("nodegroup/{group}"),
            Effect::PublishDeviceClasses { gpu_class, .. }
            | Effect::RetireDeviceClasses { gpu_class, .. } => format!("gpuclass/{gpu_class}"),
            Effect::SetQuota {
                namespace, name, ..
            } => format!("resourcequota/{namespace}/{name}"),
        }
    }
}

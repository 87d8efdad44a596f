//! Effects: what the cores want done in the cluster, as typed values. The
//! Kubernetes adapter and the simulator execute the same effects; every effect
//! is idempotent, so issuing it again after a restart is harmless. Its outcome
//! comes back as fact events. An [`EffectExecutor`] carries them out.

use std::collections::BTreeMap;
use std::future::Future;

use switchyard_proto::v1::{
    EvictionBlocked, NodeGroupWritten, Taint, TraceContext, WorkloadPlacement, WorkloadRef,
};

use crate::service_name::ServiceName;

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
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
    /// nvidia-operator backend: write these node labels in one merge patch
    /// (`None` removes one), guarded on the labels read just before — the
    /// GPU Operator and its driver manager own these keys too. With
    /// `unless_paused`, nothing is written while a deploy label reads
    /// `…paused-for-driver-upgrade` (the driver manager restores it).
    SetOperandLabels {
        node: String,
        labels: BTreeMap<String, Option<String>>,
        unless_paused: bool,
    },
    /// nvidia-operator backend: add (`present`) or remove the taint with
    /// this key and effect (the pilot taint).
    SetNodeTaint {
        node: String,
        taint: Taint,
        present: bool,
    },
    /// Record a Kubernetes Event on the Node (type Warning), e.g. why its
    /// stack switch is held; the same event is recorded once.
    NodeEvent {
        node: String,
        reason: String,
        message: String,
    },
    /// Remove these labels from the node, while it is still in `group` (the
    /// group the decision saw it in, `""` for none): a node that has moved
    /// since — a rollback's restore into a device-plugin group — keeps them.
    RemoveNodeLabels {
        node: String,
        labels: Vec<String>,
        group: String,
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
    /// The effect's kind, e.g. `Cordon` (a metric's label).
    pub fn kind(&self) -> &'static str {
        match self {
            Effect::Cordon { .. } => "Cordon",
            Effect::Uncordon { .. } => "Uncordon",
            Effect::Drain { .. } => "Drain",
            Effect::MoveToGroup { .. } => "MoveToGroup",
            Effect::RestoreNode { .. } => "RestoreNode",
            Effect::SetStackLabel { .. } => "SetStackLabel",
            Effect::SetOperandLabels { .. } => "SetOperandLabels",
            Effect::SetNodeTaint { .. } => "SetNodeTaint",
            Effect::NodeEvent { .. } => "NodeEvent",
            Effect::RemoveNodeLabels { .. } => "RemoveNodeLabels",
            Effect::SetPlacement { .. } => "SetPlacement",
            Effect::RestartWorkload { .. } => "RestartWorkload",
            Effect::RemoveSpecGpu { .. } => "RemoveSpecGpu",
            Effect::PublishDeviceClasses { .. } => "PublishDeviceClasses",
            Effect::RetireDeviceClasses { .. } => "RetireDeviceClasses",
            Effect::SetQuota { .. } => "SetQuota",
        }
    }

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
            | Effect::SetOperandLabels { node, .. }
            | Effect::SetNodeTaint { node, .. }
            | Effect::NodeEvent { node, .. }
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

impl Effect {
    /// The log subject (aggregate) of the object the effect writes, where
    /// the log has one: `node.<name>`, `workload.<namespace>.<name>` — the
    /// records of the process that wants the effect are under it.
    pub fn aggregate(&self) -> Option<String> {
        match self {
            Effect::Cordon { node }
            | Effect::Uncordon { node }
            | Effect::Drain { node }
            | Effect::MoveToGroup { node, .. }
            | Effect::RestoreNode { node, .. }
            | Effect::SetStackLabel { node, .. }
            | Effect::SetOperandLabels { node, .. }
            | Effect::SetNodeTaint { node, .. }
            | Effect::NodeEvent { node, .. }
            | Effect::RemoveNodeLabels { node, .. } => {
                Some(format!("node.{}", crate::subjects::token(node)))
            }
            Effect::SetPlacement { workload, .. } | Effect::RestartWorkload { workload, .. } => {
                Some(format!(
                    "workload.{}.{}",
                    crate::subjects::token(&workload.namespace),
                    crate::subjects::token(&workload.name)
                ))
            }
            _ => None,
        }
    }
}

/// What executing an effect led to, beyond "done".
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    /// Pods of a drained node the Eviction API refused to evict.
    pub blocked: Vec<EvictionBlocked>,
    /// Pods an eviction was accepted for.
    pub evicted: Vec<String>,
    /// A group move this write made (not one found made already), with the
    /// preparation labels it took away.
    pub group_written: Option<NodeGroupWritten>,
}

/// Carries effects out: a service's writers in a cluster, the simulator in
/// the demo and the tests. The runtime hands it the effects its core wants
/// now; what they change comes back as facts.
pub trait EffectExecutor: Send + 'static {
    type Error: std::error::Error + Send + Sync + 'static;
    /// Executes `effects` — those on one object ([`Effect::object`]) one after
    /// the other, in order — and returns each one's result, in `effects`' order.
    fn execute(
        &mut self,
        effects: Vec<Effect>,
    ) -> impl Future<Output = Vec<Result<Outcome, Self::Error>>> + Send;

    /// [`Self::execute`], each effect with the span (of a trace) it is
    /// written in — or, for a trace not recorded, no span and the trace's
    /// context: an executor that writes to other systems does each in its
    /// span or carrying that context, so what it writes carries the trace
    /// on; by default the spans are only dropped when done.
    fn execute_in_spans(
        &mut self,
        effects: Vec<(Effect, tracing::Span, Option<TraceContext>)>,
    ) -> impl Future<Output = Vec<Result<Outcome, Self::Error>>> + Send {
        let effects = effects.into_iter().map(|(effect, _, _)| effect).collect();
        self.execute(effects)
    }

    /// Why an effect failed, in a word, for the `reason` label of
    /// `switchyard_effects_failed_total`.
    fn metric_label(_error: &Self::Error) -> &'static str {
        "failed"
    }
}

/// The executor of a service whose core wants no effects (the alerter's
/// decisions are its only output): asked to execute one, it refuses.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoEffects;

/// An effect given to [`NoEffects`].
#[derive(Debug)]
pub struct NotExecuted(pub Box<Effect>);

impl std::fmt::Display for NotExecuted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "this service executes no effects, but was given {:?}",
            self.0
        )
    }
}

impl std::error::Error for NotExecuted {}

impl EffectExecutor for NoEffects {
    type Error = NotExecuted;
    fn execute(
        &mut self,
        effects: Vec<Effect>,
    ) -> impl Future<Output = Vec<Result<Outcome, NotExecuted>>> + Send {
        std::future::ready(
            effects
                .into_iter()
                .map(|e| Err(NotExecuted(Box::new(e))))
                .collect(),
        )
    }
}

impl Effect {
    /// The service whose core wants this effect, and whose writers (field
    /// manager, permissions) carry it out.
    pub fn owner(&self) -> ServiceName {
        match self {
            Effect::Cordon { .. }
            | Effect::Uncordon { .. }
            | Effect::Drain { .. }
            | Effect::MoveToGroup { .. }
            | Effect::RestoreNode { .. }
            | Effect::NodeEvent { .. }
            | Effect::SetStackLabel { .. }
            | Effect::SetOperandLabels { .. }
            | Effect::SetNodeTaint { .. } => ServiceName::StackAssigner,
            Effect::SetPlacement { .. }
            | Effect::RestartWorkload { .. }
            | Effect::RemoveSpecGpu { .. }
            | Effect::SetQuota { .. }
            | Effect::RemoveNodeLabels { .. } => ServiceName::ClaimAllocator,
            Effect::PublishDeviceClasses { .. } | Effect::RetireDeviceClasses { .. } => {
                ServiceName::ClassCompiler
            }
        }
    }
}

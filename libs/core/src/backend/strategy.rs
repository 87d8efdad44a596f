//! The stack backend as a strategy: every decision the cores take
//! differently per backend is a method here, and each backend's module
//! ([`super::deckhouse`], [`super::nvidia_operator`]) answers it. The cores
//! call `cluster.backend.strategy()` ([`super::dispatch`]); no core matches
//! on [`super::Backend`].
//!
//! A new backend is a settings variant of [`super::Backend`] (what the log
//! records), a module implementing [`Strategy`], its arm in
//! [`super::dispatch`], and its edge.

use switchyard_proto::v1::{
    EvidenceItem, NodeReadinessObserved, Stack, StackReason, Taint, WorkloadPlacement,
};

use crate::cluster::{Cluster, Node};
use crate::effects::Effect;

/// What a `complete --from GROUP` names, as the backend reads the group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CompletionSource {
    /// A node group (deckhouse): the migration's source group.
    Group,
    /// A pool the device plugin serves: the migration's legacy pool.
    DevicePluginPool,
    /// A pool DRA serves: an abandoned migration, every node rolled back.
    DraPool,
    /// Neither: refused with this reason.
    Refused(String),
}

/// The decisions a stack backend takes for the cores.
pub trait Strategy {
    /// The stack rules: which stack serves `node`. `held`: its group is held
    /// on DRA by the upgrade hold (where the backend has one).
    fn stack_rule(&self, node: &Node, cluster: &Cluster, held: bool) -> (Stack, StackReason);

    /// Whether the module's upgrade hold (groups with `spec.gpu` held on DRA
    /// after an upgrade) applies.
    fn holds_upgrades(&self) -> bool;

    /// What `name` (as `node` shows it, if observed) needs written next to be
    /// served by `stack`.
    fn stack_effects(
        &self,
        name: &str,
        stack: Stack,
        node: Option<&Node>,
        cluster: &Cluster,
    ) -> Vec<Effect>;

    /// Whether the exclusivity gate runs: a node decided one stack is
    /// checked for the other stack's components.
    fn gates_exclusivity(&self) -> bool;

    /// The exclusivity gate's evidence that `name`, decided `stack`, runs
    /// both stacks' components; `None` when it does not.
    fn exclusivity_lost(
        &self,
        name: &str,
        stack: Option<Stack>,
        node: &Node,
        cluster: &Cluster,
    ) -> Option<String>;

    /// Whether `group` is a group or pool a node can be handed over to.
    fn group_known(&self, cluster: &Cluster, group: &str) -> bool;

    /// Why a handover to a `group` that is not known is refused.
    fn unknown_group(&self, group: &str) -> String;

    /// Whether a handover moves a node by its group label alone.
    fn moves_by_group_label(&self) -> bool;

    /// A handover's move, when the backend moves a node by its group label
    /// alone (the operand labels follow with the stack's effects); `None`:
    /// the node is moved to the group with its role label and taints.
    fn move_by_group_label(&self, node: &str, target_group: &str) -> Option<Effect>;

    /// A handover's readiness gates for a node whose target stack is
    /// `stack`: what was seen (without the handover's id and node), or what
    /// is still missing. `cards_before`: the node's cards before the
    /// handover; `setup_label_fresh`: its node-preparation label was written
    /// since the group changed.
    fn handover_ready(
        &self,
        name: &str,
        stack: Stack,
        facts: &Node,
        cluster: &Cluster,
        cards_before: u32,
        setup_label_fresh: bool,
    ) -> Result<NodeReadinessObserved, Vec<String>>;

    /// What a node decided DRA still misses before DRA serves it, as
    /// (condition, what is seen); empty when DRA serves it.
    fn dra_missing(
        &self,
        name: &str,
        node: &Node,
        cluster: &Cluster,
        cards: u32,
    ) -> Vec<(&'static str, String)>;

    /// Whether a node of `group` is ready for workloads (not counting
    /// cordons).
    fn workload_ready(&self, name: &str, facts: &Node, cluster: &Cluster) -> bool;

    /// Whether `group` is one DRA serves, so a move may go there.
    fn is_dra_group(&self, cluster: &Cluster, group: &str) -> bool;

    /// The groups [`Strategy::is_dra_group`] accepts, in words.
    fn dra_groups_described(&self) -> &'static str;

    /// The taint DRA nodes carry, which moved workloads tolerate.
    fn pilot_taint(&self) -> Option<Taint>;

    /// Whether DRA serves `node` as its labels say.
    fn serves_dra(&self, node: &Node) -> bool;

    /// Whether a workload placed as `placement` (`None`: no known workload
    /// owns the pod) may reach a DRA node, its pods running on none yet.
    fn placement_reaches_dra(&self, placement: Option<&WorkloadPlacement>) -> bool;

    /// The device plugin's pods on `node`, by name.
    fn device_plugin_pods(&self, node: &str, cluster: &Cluster) -> Vec<String>;

    /// Whether a node's slices are compared with GPU Feature Discovery's
    /// labels (the operator's nodes) rather than with PhysicalGPUs.
    fn slices_compared_with_gfd(&self) -> bool;

    /// A node's exit evidence on this backend, on the facts now.
    fn node_evidence(&self, cluster: &Cluster, node: &str, facts: &Node) -> Vec<EvidenceItem>;

    /// How `complete --from group` reads `group`.
    fn completion_source(&self, group: &str) -> CompletionSource;

    /// Whether NodeGroups and the node agent's PhysicalGPUs exist on this
    /// backend's clusters (a snapshot lists them only then).
    fn uses_node_groups(&self) -> bool;

    /// Whether the backend's own labels say `node` has GPUs (a DRA node of
    /// the operator has no `nvidia.com/gpu` capacity and no PhysicalGPU).
    fn labelled_gpu_node(&self, node: &Node) -> bool;
}

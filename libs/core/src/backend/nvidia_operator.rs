//! The `nvidia-operator` backend's strategy: NVIDIA's GPU Operator and DRA
//! driver serve the GPUs, and Switchyard writes the node labels they watch,
//! in the guide's order ([`super::operands`]). Pools are named by a node
//! label and configured with their stack; the exclusivity gate checks that
//! no node runs the device plugin and the DRA kubelet plugin at once; DRA
//! nodes carry the pilot taint where configured; the exit evidence compares
//! the driver's slices with GPU Feature Discovery's labels.

use switchyard_proto::v1::{
    EvidenceItem, NodeReadinessObserved, Stack, StackReason, Taint, WorkloadPlacement,
};

use super::strategy::{CompletionSource, Strategy};
use super::{NvidiaOperator, nvidia, operands};
use crate::claim_allocator::node_gates::{
    NO_DUAL_ADVERTISEMENT, PLUGIN_HEALTHY, SLICES_MATCH_GFD, dual_advertisement, item,
};
use crate::cluster::{Cluster, Node};
use crate::effects::Effect;
use crate::placement;

/// The `nvidia-operator` backend's strategy over its settings.
pub struct NvidiaOperatorStrategy<'a>(pub &'a NvidiaOperator);

impl Strategy for NvidiaOperatorStrategy<'_> {
    /// The node's pool decides; a node the GPU Operator deploys nothing on
    /// gets nothing, and a DRA pool waits for the feature gates rather than
    /// falling back to the device plugin. The ModuleConfig and the upgrade
    /// hold are Deckhouse's and play no part.
    fn stack_rule(&self, node: &Node, cluster: &Cluster, _held: bool) -> (Stack, StackReason) {
        if node.is_control_plane() {
            return (Stack::None, StackReason::ControlPlane);
        }
        if node.labels.get(nvidia::GPU_PRESENT).map(String::as_str) != Some("true") {
            return (Stack::None, StackReason::NoGpuPresent);
        }
        let pool = node.labels.get(&self.0.pool_label);
        match pool.and_then(|p| self.0.pools.get(p)) {
            Some(Stack::Dra) if !cluster.module.feature_gates_ready => {
                (Stack::None, StackReason::FeatureGatesNotReady)
            }
            Some(&stack @ (Stack::Dra | Stack::DevicePlugin | Stack::None)) => {
                (stack, StackReason::PoolStack)
            }
            Some(Stack::Unspecified) | None => (Stack::DevicePlugin, StackReason::OperatorDefault),
        }
    }

    fn holds_upgrades(&self) -> bool {
        false
    }

    /// The operand labels and the pilot taint, in the guide's order; nothing
    /// for a node not observed.
    fn stack_effects(
        &self,
        name: &str,
        stack: Stack,
        node: Option<&Node>,
        cluster: &Cluster,
    ) -> Vec<Effect> {
        node.map(|node| operands::effects(name, stack, node, cluster, self.0))
            .unwrap_or_default()
    }

    fn gates_exclusivity(&self) -> bool {
        true
    }

    fn exclusivity_lost(
        &self,
        name: &str,
        stack: Option<Stack>,
        node: &Node,
        cluster: &Cluster,
    ) -> Option<String> {
        operands::exclusivity_lost(name, stack, node, cluster, self.0)
    }

    /// A configured pool.
    fn group_known(&self, _cluster: &Cluster, group: &str) -> bool {
        self.0.pools.contains_key(group)
    }

    fn unknown_group(&self, group: &str) -> String {
        format!(
            "pool {group} is not configured (pools: {})",
            self.0.pools.keys().cloned().collect::<Vec<_>>().join(", ")
        )
    }

    /// The pool label is the move; the operand labels follow it, in the
    /// guide's order, once the node's stack is decided again.
    fn moves_by_group_label(&self) -> bool {
        true
    }

    /// Forward and back alike, the pool label only: the operand labels and
    /// the pilot taint are the stack's ([`operands::effects`]), written in
    /// the guide's order; a before-image written at once would start the
    /// device plugin beside the DRA plugin. Back to a node that had no
    /// pool: none.
    fn move_by_group_label(&self, node: &str, target_group: &str) -> Option<Effect> {
        Some(Effect::SetOperandLabels {
            node: node.to_string(),
            labels: [(
                self.0.pool_label.clone(),
                Some(target_group.to_string()).filter(|g| !g.is_empty()),
            )]
            .into(),
            unless_paused: false,
        })
    }

    /// The guide's gates ([`operands::handover_ready`]).
    fn handover_ready(
        &self,
        name: &str,
        stack: Stack,
        facts: &Node,
        cluster: &Cluster,
        cards_before: u32,
        _setup_label_fresh: bool,
    ) -> Result<NodeReadinessObserved, Vec<String>> {
        operands::handover_ready(name, stack, facts, cluster, self.0, cards_before)
    }

    fn dra_missing(
        &self,
        name: &str,
        node: &Node,
        cluster: &Cluster,
        _cards: u32,
    ) -> Vec<(&'static str, String)> {
        operands::dra_missing(name, node, cluster, self.0)
    }

    /// The guide's gates of a node DRA serves.
    fn workload_ready(&self, name: &str, facts: &Node, cluster: &Cluster) -> bool {
        operands::handover_ready(
            name,
            Stack::Dra,
            facts,
            cluster,
            self.0,
            cluster.cards(name),
        )
        .is_ok()
    }

    /// A pool configured `dra`.
    fn is_dra_group(&self, _cluster: &Cluster, group: &str) -> bool {
        self.0.pools.get(group) == Some(&Stack::Dra)
    }

    fn dra_groups_described(&self) -> &'static str {
        "a pool configured dra"
    }

    fn pilot_taint(&self) -> Option<Taint> {
        self.0.pilot_taint.then(|| operands::pilot_taint(self.0))
    }

    /// The DRA kubelet plugin's label is on.
    fn serves_dra(&self, node: &Node) -> bool {
        node.labels.get(&self.0.plugin_label).map(String::as_str) == Some("true")
    }

    /// Not bound to a pool other than a DRA one, and tolerating the pilot
    /// taint where DRA nodes carry it. A pod no known workload owns is
    /// judged by where it runs alone.
    fn placement_reaches_dra(&self, placement: Option<&WorkloadPlacement>) -> bool {
        let Some(placement) = placement else {
            return false;
        };
        if placement
            .node_selector
            .get(&self.0.pool_label)
            .is_some_and(|pool| self.0.pools.get(pool) != Some(&Stack::Dra))
        {
            return false;
        }
        !self.0.pilot_taint
            || placement.tolerations.as_ref().is_some_and(|t| {
                let taint = operands::pilot_taint(self.0);
                t.items.iter().any(|t| placement::tolerates(t, &taint))
            })
    }

    fn device_plugin_pods(&self, node: &str, cluster: &Cluster) -> Vec<String> {
        operands::pods_selected(node, cluster, &self.0.device_plugin_pods, false)
    }

    fn slices_compared_with_gfd(&self) -> bool {
        true
    }

    /// The guide's gates on the facts now — no dual
    /// advertisement and no device-plugin pod on a DRA node, the DRA kubelet
    /// plugin's pod running, and the `gpu.nvidia.com` devices matching what GPU
    /// Feature Discovery labelled (count, product, memory), each UUID once.
    fn node_evidence(&self, cluster: &Cluster, node: &str, facts: &Node) -> Vec<EvidenceItem> {
        let backend = self.0;
        let dra = facts.labels.get(&backend.plugin_label).map(String::as_str) == Some("true");
        let device_plugin_pods =
            operands::pods_selected(node, cluster, &backend.device_plugin_pods, false);
        let dual = match dual_advertisement(cluster, node, facts, dra) {
            Ok(_) if dra && !device_plugin_pods.is_empty() => Err(format!(
                "the device plugin runs on this DRA node: {}",
                device_plugin_pods.join(", ")
            )),
            other => other,
        };
        let mut items = vec![item(NO_DUAL_ADVERTISEMENT, dual)];
        if !dra {
            return items;
        }
        let running = operands::pods_selected(node, cluster, &backend.kubelet_plugin_pods, true);
        let healthy = if running.is_empty() {
            Err(format!(
                "no DRA kubelet-plugin pod ({}) is running on the node",
                backend.kubelet_plugin_pods.text
            ))
        } else {
            Ok(format!(
                "the DRA kubelet plugin runs: {}",
                running.join(", ")
            ))
        };
        items.push(item(PLUGIN_HEALTHY, healthy));
        items.push(item(
            SLICES_MATCH_GFD,
            operands::slices_match_gfd(cluster, node, facts, 0),
        ));
        items
    }

    /// A device-plugin pool completes the migration; a DRA pool abandons it
    /// (every node rolled back); any other name is refused.
    fn completion_source(&self, group: &str) -> CompletionSource {
        match self.0.pools.get(group) {
            Some(Stack::DevicePlugin) => CompletionSource::DevicePluginPool,
            Some(Stack::Dra) => CompletionSource::DraPool,
            _ => CompletionSource::Refused(format!(
                "pool {group}: not a device-plugin or DRA pool of the nvidia-operator backend; expected one of {}",
                self.0
                    .pools
                    .iter()
                    .filter(|(_, s)| matches!(s, Stack::DevicePlugin | Stack::Dra))
                    .map(|(p, _)| p.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }

    /// The operator's clusters may have no NodeGroup kind, and no node agent
    /// makes PhysicalGPUs.
    fn uses_node_groups(&self) -> bool {
        false
    }

    /// GPU Feature Discovery's `nvidia.com/gpu.present=true`.
    fn labelled_gpu_node(&self, node: &Node) -> bool {
        node.labels
            .get(nvidia::GPU_PRESENT)
            .is_some_and(|v| v == "true")
    }
}

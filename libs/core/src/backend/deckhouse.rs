//! The `deckhouse` backend: Switchyard's node agent serves both stacks and
//! watches the node's `node.deckhouse.io/gpu-stack` label; groups are
//! NodeGroups, a group with `spec.gpu` is the device plugin's, and the
//! module's upgrade hold keeps such a group on DRA after an upgrade. Its
//! readiness gates are the reference's conditions and, on DRA, the node
//! seen serving it as the exit evidence checks (its cards published in
//! ResourceSlices, no device-plugin resource allocatable); its exit evidence
//! is the reference's default.

use switchyard_proto::v1::{
    EvidenceItem, GpuPhase, NodeReadinessObserved, Stack, StackReason, Taint, WorkloadPlacement,
};

use super::strategy::{CompletionSource, Strategy};
use crate::claim_allocator::node_gates::{
    NO_DUAL_ADVERTISEMENT, PLUGIN_HEALTHY, SLICES_MATCH, dual_advertisement, item, slices_match,
};
use crate::cluster::{Cluster, Node};
use crate::effects::Effect;
use crate::names::{
    GPU_SETUP_COMPLETE_LABEL, GPU_STACK_LABEL, NVIDIA_GPU, STACK_DEVICE_PLUGIN, STACK_DRA,
};

/// The `deckhouse` backend's strategy (it has no settings).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Deckhouse;

impl Strategy for Deckhouse {
    /// The reference's rules.
    fn stack_rule(&self, node: &Node, cluster: &Cluster, held: bool) -> (Stack, StackReason) {
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

    fn holds_upgrades(&self) -> bool {
        true
    }

    /// The stack label the node agent watches, written when it differs.
    fn stack_effects(
        &self,
        name: &str,
        stack: Stack,
        node: Option<&Node>,
        _cluster: &Cluster,
    ) -> Vec<Effect> {
        let want = match stack {
            Stack::DevicePlugin => Some(STACK_DEVICE_PLUGIN),
            Stack::Dra => Some(STACK_DRA),
            Stack::None | Stack::Unspecified => None,
        };
        let have = node
            .and_then(|n| n.labels.get(GPU_STACK_LABEL))
            .map(String::as_str);
        (have != want)
            .then(|| Effect::SetStackLabel {
                node: name.to_string(),
                stack: want.map(str::to_string),
            })
            .into_iter()
            .collect()
    }

    /// The node agent serves one stack at a time itself.
    fn gates_exclusivity(&self) -> bool {
        false
    }

    fn exclusivity_lost(
        &self,
        _name: &str,
        _stack: Option<Stack>,
        _node: &Node,
        _cluster: &Cluster,
    ) -> Option<String> {
        None
    }

    /// A NodeGroup observed.
    fn group_known(&self, cluster: &Cluster, group: &str) -> bool {
        cluster.groups.contains_key(group)
    }

    fn unknown_group(&self, group: &str) -> String {
        format!("node group {group} does not exist")
    }

    fn moves_by_group_label(&self) -> bool {
        false
    }

    fn move_by_group_label(&self, _node: &str, _target_group: &str) -> Option<Effect> {
        None
    }

    /// The reference's readiness condition; back on the device plugin, its
    /// resources allocatable again, one per card at least ("confirm that
    /// nvidia.com/gpu returns to node allocatable capacity").
    fn handover_ready(
        &self,
        name: &str,
        stack: Stack,
        facts: &Node,
        cluster: &Cluster,
        cards_before: u32,
        setup_label_fresh: bool,
    ) -> Result<NodeReadinessObserved, Vec<String>> {
        let mut readiness = cluster.readiness(name, cards_before);
        readiness.gpu_setup_complete = setup_label_fresh;
        let allocatable = facts.device_plugin_allocatable;
        let wanted = readiness.expected_physical_gpus.max(1);
        let device_plugin_stack = facts
            .labels
            .get(GPU_STACK_LABEL)
            .is_some_and(|v| v == STACK_DEVICE_PLUGIN);
        // The node agent acts on the label a moment after it is written:
        // DRA is ready once the node serves it, not once it is asked to.
        let serving_dra = match stack {
            Stack::Dra => dual_advertisement(cluster, name, facts, true).map(drop),
            _ => Ok(()),
        };
        let ready = match stack {
            Stack::DevicePlugin => {
                readiness.gpu_setup_complete && device_plugin_stack && allocatable >= wanted
            }
            _ => readiness.is_ready() && serving_dra.is_ok(),
        };
        if ready {
            return Ok(NodeReadinessObserved {
                gpu_setup_complete: readiness.gpu_setup_complete,
                gpu_stack_dra: readiness.gpu_stack_dra,
                ready_physical_gpus: readiness.ready_physical_gpus,
                expected_physical_gpus: readiness.expected_physical_gpus,
                node_agent_running: readiness.node_agent_running,
                vendor_adapter_running: readiness.vendor_adapter_running,
                device_plugin_allocatable: allocatable,
                ..NodeReadinessObserved::default()
            });
        }
        let mut missing = match stack {
            Stack::DevicePlugin => {
                let mut missing = Vec::new();
                if !device_plugin_stack {
                    missing.push(format!(
                        "label {GPU_STACK_LABEL}={STACK_DEVICE_PLUGIN} is not present"
                    ));
                }
                if allocatable < wanted {
                    missing.push(format!(
                        "{allocatable} of {wanted} {NVIDIA_GPU} (or MIG, time-slicing) resources are allocatable on the node"
                    ));
                }
                if !readiness.gpu_setup_complete {
                    missing.push(format!("label {GPU_SETUP_COMPLETE_LABEL} is not present"));
                }
                missing
            }
            _ => readiness
                .missing()
                .into_iter()
                .chain(serving_dra.err())
                .collect(),
        };
        if facts.labels.contains_key(GPU_SETUP_COMPLETE_LABEL) && !readiness.gpu_setup_complete {
            let label = format!("label {GPU_SETUP_COMPLETE_LABEL} is not present");
            for m in missing.iter_mut().filter(|m| **m == label) {
                *m = format!(
                    "label {GPU_SETUP_COMPLETE_LABEL} is left from before the group change (not written by node preparation since)"
                );
            }
        }
        Err(missing)
    }

    fn dra_missing(
        &self,
        name: &str,
        _node: &Node,
        cluster: &Cluster,
        cards: u32,
    ) -> Vec<(&'static str, String)> {
        cluster.readiness(name, cards).missing_conditions()
    }

    /// All four readiness conditions.
    fn workload_ready(&self, name: &str, _facts: &Node, cluster: &Cluster) -> bool {
        cluster.readiness(name, cluster.cards(name)).is_ready()
    }

    /// A group without `spec.gpu`: not the device plugin's.
    fn is_dra_group(&self, cluster: &Cluster, group: &str) -> bool {
        !cluster.has_spec_gpu(group)
    }

    fn dra_groups_described(&self) -> &'static str {
        "a group without spec.gpu"
    }

    fn pilot_taint(&self) -> Option<Taint> {
        None
    }

    /// The gpu-stack label says `dra`.
    fn serves_dra(&self, node: &Node) -> bool {
        node.labels.get(GPU_STACK_LABEL).map(String::as_str) == Some(STACK_DRA)
    }

    /// Groups are not pinned by a pool label nor DRA nodes tainted: any
    /// workload may reach one.
    fn placement_reaches_dra(&self, _placement: Option<&WorkloadPlacement>) -> bool {
        true
    }

    /// The node agent is the device plugin: no pod of its own.
    fn device_plugin_pods(&self, _node: &str, _cluster: &Cluster) -> Vec<String> {
        Vec::new()
    }

    fn slices_compared_with_gfd(&self) -> bool {
        false
    }

    /// The reference's evidence: no dual advertisement; on DRA, the plug-in
    /// healthy (its pods running, its PhysicalGPUs Ready) and the slices
    /// matching the PhysicalGPUs.
    fn node_evidence(&self, cluster: &Cluster, node: &str, facts: &Node) -> Vec<EvidenceItem> {
        let dra = facts
            .labels
            .get(GPU_STACK_LABEL)
            .is_some_and(|v| v == STACK_DRA);
        let mut items = vec![item(
            NO_DUAL_ADVERTISEMENT,
            dual_advertisement(cluster, node, facts, dra),
        )];
        if !dra {
            return items;
        }
        let gpus = cluster
            .gpus
            .get(node)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let readiness = cluster.readiness(node, cluster.cards(node));
        let not_ready: Vec<&str> = gpus
            .iter()
            .filter(|g| g.phase != GpuPhase::Ready)
            .map(|g| &*g.name)
            .collect();
        let healthy = if !readiness.node_agent_running {
            Err(format!(
                "no node agent pod ({}) is running on the node",
                readiness.node_agent_selector
            ))
        } else if !readiness.vendor_adapter_running {
            Err(format!(
                "no vendor adapter pod ({}) is running on the node",
                readiness.vendor_adapter_selector
            ))
        } else if gpus.is_empty() {
            Err("the node agent reports no PhysicalGPU for the node".into())
        } else if !not_ready.is_empty() {
            Err(format!("PhysicalGPUs not Ready: {}", not_ready.join(", ")))
        } else {
            Ok(format!(
                "node agent running, {} PhysicalGPUs Ready",
                gpus.len()
            ))
        };
        items.push(item(PLUGIN_HEALTHY, healthy));
        items.push(item(SLICES_MATCH, slices_match(cluster, node)));
        items
    }

    fn completion_source(&self, _group: &str) -> CompletionSource {
        CompletionSource::Group
    }

    fn uses_node_groups(&self) -> bool {
        true
    }

    fn labelled_gpu_node(&self, _node: &Node) -> bool {
        false
    }
}

//! Cluster facts as the cores see them, folded from fact events.

use std::collections::{BTreeMap, BTreeSet};

use switchyard_proto::v1::{DomainEvent, GpuSpec, NodeObserved, Taint, domain_event::Kind};

use crate::names::{CONTROL_PLANE_LABEL, GPU_ENABLED_LABEL, GROUP_LABEL};

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Node {
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    pub unschedulable: bool,
    pub gpu_count: u32,
}

impl Node {
    /// The node's group, from its `node.deckhouse.io/group` label.
    pub fn group(&self) -> Option<&str> {
        self.labels
            .get(GROUP_LABEL)
            .map(String::as_str)
            .filter(|g| !g.is_empty())
    }

    pub fn is_control_plane(&self) -> bool {
        self.labels.contains_key(CONTROL_PLANE_LABEL)
    }

    /// Labelled `gpu.deckhouse.io/enabled=false`.
    pub fn gpu_disabled(&self) -> bool {
        self.labels
            .get(GPU_ENABLED_LABEL)
            .is_some_and(|v| v == "false")
    }
}

impl From<&NodeObserved> for Node {
    fn from(fact: &NodeObserved) -> Self {
        Node {
            labels: fact.labels.clone(),
            taints: fact.taints.clone(),
            unschedulable: fact.unschedulable,
            gpu_count: fact.gpu_count,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Group {
    pub node_type: String,
    /// The group's spec.gpu section, if it has one.
    pub gpu: Option<GpuSpec>,
}

/// The gpu module's settings and the facts they depend on.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ModuleSettings {
    pub dra_enabled: bool,
    pub feature_gates_ready: bool,
    pub module_version: String,
    pub previous_module_version: String,
    /// How many settings observations were folded; 1 right after the first.
    pub observations: u64,
}

/// What the cores know about the cluster.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Cluster {
    pub nodes: BTreeMap<String, Node>,
    pub groups: BTreeMap<String, Group>,
    /// Group name -> nodes labelled with it (groups need not exist as objects).
    pub members: BTreeMap<String, BTreeSet<String>>,
    pub module: ModuleSettings,
}

impl Cluster {
    /// Folds a fact event; other events leave the facts alone.
    pub fn apply(&mut self, event: &DomainEvent) {
        let Some(kind) = &event.kind else { return };
        match kind {
            Kind::NodeObserved(fact) => {
                self.remove_member(&fact.node);
                let node = Node::from(fact);
                if let Some(group) = node.group() {
                    self.members
                        .entry(group.to_string())
                        .or_default()
                        .insert(fact.node.clone());
                }
                self.nodes.insert(fact.node.clone(), node);
            }
            Kind::NodeRemoved(fact) => {
                self.remove_member(&fact.node);
                self.nodes.remove(&fact.node);
            }
            Kind::NodeGroupObserved(fact) => {
                self.groups.insert(
                    fact.group.clone(),
                    Group {
                        node_type: fact.node_type.clone(),
                        gpu: fact.gpu.clone(),
                    },
                );
            }
            Kind::NodeGroupRemoved(fact) => {
                self.groups.remove(&fact.group);
            }
            Kind::ModuleSettingsObserved(fact) => {
                self.module = ModuleSettings {
                    dra_enabled: fact.dra_enabled,
                    feature_gates_ready: fact.feature_gates_ready,
                    module_version: fact.module_version.clone(),
                    previous_module_version: fact.previous_module_version.clone(),
                    observations: self.module.observations + 1,
                };
            }
            _ => {}
        }
    }

    fn remove_member(&mut self, node: &str) {
        let Some(group) = self.nodes.get(node).and_then(Node::group) else {
            return;
        };
        if let Some(members) = self.members.get_mut(group) {
            members.remove(node);
            if members.is_empty() {
                self.members.remove(group);
            }
        }
    }

    /// Whether the group exists and has spec.gpu.
    pub fn has_spec_gpu(&self, group: &str) -> bool {
        self.groups.get(group).is_some_and(|g| g.gpu.is_some())
    }
}

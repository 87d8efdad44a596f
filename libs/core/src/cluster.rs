//! Cluster facts as the cores see them, folded from fact events.

use std::collections::{BTreeMap, BTreeSet};

use switchyard_proto::v1::{
    DomainEvent, GpuPhase, GpuSpec, NodeObserved, NodeProvisioning, PhysicalGpuObserved,
    PodObserved, PodPhase, Taint, WorkloadObserved, WorkloadPlacement, WorkloadRef,
    domain_event::Kind,
};

use crate::names::{
    CONTROL_PLANE_LABEL, GPU_ENABLED_LABEL, GPU_SETUP_COMPLETE_LABEL, GPU_STACK_LABEL, GROUP_LABEL,
    NODE_AGENT_APP, STACK_DRA, VENDOR_ADAPTER_APP,
};

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Node {
    pub labels: BTreeMap<String, String>,
    pub taints: Vec<Taint>,
    pub unschedulable: bool,
    pub gpu_count: u32,
    pub provisioning: NodeProvisioning,
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
            provisioning: fact.provisioning(),
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

/// A pod, keyed by (namespace, name).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Pod {
    pub node: String,
    pub owner: Option<WorkloadRef>,
    pub phase: PodPhase,
    pub app: String,
    pub claims_allocated: u32,
    pub claims_needed: u32,
}

impl Pod {
    /// DaemonSet pods stay on a drained node.
    pub fn is_daemon(&self) -> bool {
        self.owner.as_ref().is_some_and(|o| o.kind == "DaemonSet")
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct PhysicalGpu {
    pub device: String,
    pub phase: GpuPhase,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Workload {
    pub replicas: u32,
    pub placement: WorkloadPlacement,
}

/// (namespace, kind, name) of a workload.
pub type WorkloadKey = (String, String, String);

pub fn workload_key(workload: &WorkloadRef) -> WorkloadKey {
    (
        workload.namespace.clone(),
        workload.kind.clone(),
        workload.name.clone(),
    )
}

/// (namespace, name) of a namespaced object.
pub type ObjectKey = (String, String);

/// The four readiness conditions of a node handed over to DRA.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Readiness {
    pub gpu_setup_complete: bool,
    pub gpu_stack_dra: bool,
    pub ready_physical_gpus: u32,
    pub expected_physical_gpus: u32,
    pub node_agent_running: bool,
    pub vendor_adapter_running: bool,
}

impl Readiness {
    pub fn is_ready(&self) -> bool {
        self.gpu_setup_complete
            && self.gpu_stack_dra
            && self.ready_physical_gpus >= self.expected_physical_gpus
            && self.node_agent_running
            && self.vendor_adapter_running
    }

    /// What is still missing, in the reference's words.
    pub fn missing(&self) -> Vec<String> {
        let mut missing = Vec::new();
        if !self.gpu_setup_complete {
            missing.push(format!("label {GPU_SETUP_COMPLETE_LABEL} is not present"));
        }
        if !self.gpu_stack_dra {
            missing.push(format!(
                "label {GPU_STACK_LABEL}={STACK_DRA} is not present"
            ));
        }
        if self.ready_physical_gpus < self.expected_physical_gpus {
            missing.push(format!(
                "{} of {} PhysicalGPU objects are Ready",
                self.ready_physical_gpus, self.expected_physical_gpus
            ));
        }
        if !self.node_agent_running {
            missing.push(format!("no running {NODE_AGENT_APP} pod on the node"));
        }
        if !self.vendor_adapter_running {
            missing.push(format!("no running {VENDOR_ADAPTER_APP} pod on the node"));
        }
        missing
    }
}

/// What the cores know about the cluster.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Cluster {
    pub nodes: BTreeMap<String, Node>,
    pub groups: BTreeMap<String, Group>,
    /// Group name -> nodes labelled with it (groups need not exist as objects).
    pub members: BTreeMap<String, BTreeSet<String>>,
    pub module: ModuleSettings,
    pub pods: BTreeMap<ObjectKey, Pod>,
    /// Node -> pods scheduled on it.
    pub pods_by_node: BTreeMap<String, BTreeSet<ObjectKey>>,
    /// Node -> (PhysicalGPU name -> card). GPUs never move between nodes.
    pub gpus: BTreeMap<String, BTreeMap<String, PhysicalGpu>>,
    pub workloads: BTreeMap<WorkloadKey, Workload>,
    /// GPUClass name -> its DeviceClass names.
    pub gpu_classes: BTreeMap<String, Vec<String>>,
    /// ResourceQuota spec.hard.
    pub quotas: BTreeMap<ObjectKey, BTreeMap<String, String>>,
}

impl Cluster {
    /// Folds a fact event; other events leave the facts alone.
    pub fn apply(&mut self, event: &DomainEvent) {
        match &event.kind {
            Some(Kind::NodeObserved(fact)) => self.observe_node(fact.clone()),
            Some(Kind::PodObserved(fact)) => self.observe_pod(fact.clone()),
            Some(Kind::PhysicalGpuObserved(fact)) => self.observe_gpu(fact.clone()),
            Some(Kind::WorkloadObserved(fact)) => self.observe_workload(fact.clone()),
            _ => self.apply_other(event),
        }
    }

    /// [`Cluster::apply`] for an event the caller owns: the bulky facts are
    /// moved into the state instead of copied (replays fold millions).
    pub fn apply_owned(&mut self, event: DomainEvent) {
        match event.kind {
            Some(Kind::NodeObserved(fact)) => self.observe_node(fact),
            Some(Kind::PodObserved(fact)) => self.observe_pod(fact),
            Some(Kind::PhysicalGpuObserved(fact)) => self.observe_gpu(fact),
            Some(Kind::WorkloadObserved(fact)) => self.observe_workload(fact),
            kind => self.apply_other(&DomainEvent { kind }),
        }
    }

    fn observe_node(&mut self, fact: NodeObserved) {
        self.remove_member(&fact.node);
        let node = Node {
            provisioning: fact.provisioning(),
            labels: fact.labels,
            taints: fact.taints,
            unschedulable: fact.unschedulable,
            gpu_count: fact.gpu_count,
        };
        if let Some(group) = node.group() {
            self.members
                .entry(group.to_string())
                .or_default()
                .insert(fact.node.clone());
        }
        self.nodes.insert(fact.node, node);
    }

    fn observe_pod(&mut self, fact: PodObserved) {
        let phase = fact.phase();
        let key = (fact.namespace, fact.name);
        self.unindex_pod(&key);
        if !fact.node.is_empty() {
            self.pods_by_node
                .entry(fact.node.clone())
                .or_default()
                .insert(key.clone());
        }
        let pod = Pod {
            node: fact.node,
            owner: fact.owner,
            phase,
            app: fact.app,
            claims_allocated: fact.claims_allocated,
            claims_needed: fact.claims_needed,
        };
        self.pods.insert(key, pod);
    }

    fn observe_gpu(&mut self, fact: PhysicalGpuObserved) {
        let gpu = PhysicalGpu {
            phase: fact.phase(),
            device: fact.device,
        };
        let on_node = self.gpus.entry(fact.node).or_default();
        match on_node.get_mut(&fact.name) {
            Some(known) => *known = gpu,
            None => {
                on_node.insert(fact.name, gpu);
            }
        }
    }

    fn observe_workload(&mut self, fact: WorkloadObserved) {
        if let Some(workload) = &fact.workload {
            let placement = fact.placement.unwrap_or_default();
            self.workloads.insert(
                workload_key(workload),
                Workload {
                    replicas: fact.replicas,
                    placement,
                },
            );
        }
    }

    fn apply_other(&mut self, event: &DomainEvent) {
        let Some(kind) = &event.kind else { return };
        match kind {
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

            Kind::PodRemoved(fact) => {
                let key = (fact.namespace.clone(), fact.name.clone());
                self.unindex_pod(&key);
                self.pods.remove(&key);
            }

            Kind::PhysicalGpuRemoved(fact) => {
                if let Some(on_node) = self.gpus.get_mut(&fact.node) {
                    on_node.remove(&fact.name);
                    if on_node.is_empty() {
                        self.gpus.remove(&fact.node);
                    }
                }
            }

            Kind::GpuClassObserved(fact) => {
                self.gpu_classes
                    .insert(fact.name.clone(), fact.device_class_names.clone());
            }
            Kind::ResourceQuotaObserved(fact) => {
                self.quotas.insert(
                    (fact.namespace.clone(), fact.name.clone()),
                    fact.hard.clone(),
                );
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

    fn unindex_pod(&mut self, key: &ObjectKey) {
        let Some(node) = self.pods.get(key).map(|p| p.node.clone()) else {
            return;
        };
        if let Some(pods) = self.pods_by_node.get_mut(&node) {
            pods.remove(key);
            if pods.is_empty() {
                self.pods_by_node.remove(&node);
            }
        }
    }

    /// Pods on `node`.
    pub fn pods_on<'a>(
        &'a self,
        node: &str,
    ) -> impl Iterator<Item = (&'a ObjectKey, &'a Pod)> + 'a {
        self.pods_by_node
            .get(node)
            .into_iter()
            .flatten()
            .map(|key| (key, &self.pods[key]))
    }

    /// The four readiness conditions of `node` (reference, step 3).
    pub fn readiness(&self, node: &str) -> Readiness {
        let Some(facts) = self.nodes.get(node) else {
            return Readiness::default();
        };
        let running = |app: &str| {
            self.pods_on(node)
                .any(|(_, p)| p.app == app && p.phase == PodPhase::Running)
        };
        Readiness {
            gpu_setup_complete: facts.labels.contains_key(GPU_SETUP_COMPLETE_LABEL),
            gpu_stack_dra: facts
                .labels
                .get(GPU_STACK_LABEL)
                .is_some_and(|v| v == STACK_DRA),
            ready_physical_gpus: self.gpus.get(node).map_or(0, |gpus| {
                gpus.values().filter(|g| g.phase == GpuPhase::Ready).count() as u32
            }),
            expected_physical_gpus: facts.gpu_count,
            node_agent_running: running(NODE_AGENT_APP),
            vendor_adapter_running: running(VENDOR_ADAPTER_APP),
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

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
    pub labels: Labels,
    pub taints: Vec<Taint>,
    pub unschedulable: bool,
    pub gpu_count: u32,
    pub provisioning: NodeProvisioning,
}

/// A node's labels: a sorted vector (nodes have a handful, and tens of
/// thousands of nodes are held; a map's node slack would dominate).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Labels(Vec<(String, String)>);

impl Labels {
    pub fn get(&self, key: &str) -> Option<&String> {
        self.find(key).ok().map(|i| &self.0[i].1)
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.find(key).is_ok()
    }

    pub fn insert(&mut self, key: String, value: String) {
        match self.find(&key) {
            Ok(i) => self.0[i].1 = value,
            Err(i) => self.0.insert(i, (key, value)),
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &String)> {
        self.0.iter().map(|(k, v)| (k, v))
    }

    pub fn to_map(&self) -> BTreeMap<String, String> {
        self.0.iter().cloned().collect()
    }

    fn find(&self, key: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(k, _)| k.as_str().cmp(key))
    }
}

impl From<BTreeMap<String, String>> for Labels {
    fn from(map: BTreeMap<String, String>) -> Self {
        // A map iterates in key order: already sorted.
        let mut labels: Vec<(String, String)> = map.into_iter().collect();
        labels.shrink_to_fit();
        Labels(labels)
    }
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

/// A pod, keyed by (namespace, name). Compact: clusters have many.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Pod {
    /// Empty while not scheduled.
    pub node: Box<str>,
    /// The controller that owns the pod, in the pod's namespace; empty if none.
    pub owner_kind: Box<str>,
    pub owner_name: Box<str>,
    pub phase: PodPhase,
    pub app: Box<str>,
    pub claims_allocated: u32,
    pub claims_needed: u32,
}

impl Pod {
    /// DaemonSet pods stay on a drained node.
    pub fn is_daemon(&self) -> bool {
        &*self.owner_kind == "DaemonSet"
    }

    /// The owning workload, given the pod's namespace.
    pub fn owner(&self, namespace: &str) -> Option<WorkloadRef> {
        (!self.owner_kind.is_empty()).then(|| WorkloadRef {
            namespace: namespace.to_string(),
            kind: self.owner_kind.to_string(),
            name: self.owner_name.to_string(),
        })
    }

    /// Whether the pod (in `namespace`) belongs to `workload`.
    pub fn owned_by(&self, namespace: &str, workload: &WorkloadKey) -> bool {
        namespace == workload.0
            && *self.owner_kind == *workload.1
            && *self.owner_name == *workload.2
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct PhysicalGpu {
    pub name: Box<str>,
    pub device: Box<str>,
    pub phase: GpuPhase,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Workload {
    pub replicas: u32,
    pub placement: Placement,
    /// What keeps the manifest (a Helm release, a GitOps controller, an
    /// operator); empty when nothing is known to.
    pub managed_by: Box<str>,
}

/// A workload's placement kept encoded: a few dozen bytes instead of nested
/// maps, since tens of thousands of workloads are held and few are read.
/// Map fields are ordered, so equal placements have equal bytes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    encoded: Box<[u8]>,
    requests_nvidia_gpu: bool,
}

impl Placement {
    pub fn new(placement: &WorkloadPlacement) -> Self {
        Placement {
            encoded: prost::Message::encode_to_vec(placement).into_boxed_slice(),
            requests_nvidia_gpu: crate::placement::requests_nvidia_gpu(placement),
        }
    }

    pub fn get(&self) -> WorkloadPlacement {
        prost::Message::decode(&self.encoded[..]).expect("encoded by Placement::new")
    }

    /// Whether it still asks for device-plugin GPUs.
    pub fn requests_nvidia_gpu(&self) -> bool {
        self.requests_nvidia_gpu
    }

    pub fn is(&self, placement: &WorkloadPlacement) -> bool {
        *self.encoded == *prost::Message::encode_to_vec(placement)
    }
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
    /// Node -> pods scheduled on it, sorted.
    pub pods_by_node: BTreeMap<String, Vec<ObjectKey>>,
    /// Node -> its PhysicalGPUs, by name. GPUs never move between nodes.
    pub gpus: BTreeMap<String, Vec<PhysicalGpu>>,
    pub workloads: BTreeMap<WorkloadKey, Workload>,
    /// GPUClass name -> its DeviceClass names.
    pub gpu_classes: BTreeMap<String, Vec<String>>,
    /// ResourceQuota spec.hard.
    pub quotas: BTreeMap<ObjectKey, BTreeMap<String, String>>,
    /// Pods the Eviction API refused to evict, with its answer and the
    /// PodDisruptionBudgets that cover them; forgotten when the pod goes.
    pub eviction_blocks: BTreeMap<ObjectKey, String>,
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
            labels: fact.labels.into(),
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
            let on_node = self.pods_by_node.entry(fact.node.clone()).or_default();
            if let Err(i) = on_node.binary_search(&key) {
                on_node.insert(i, key.clone());
            }
        }
        let (owner_kind, owner_name) = fact
            .owner
            .map_or_else(Default::default, |o| (o.kind.into(), o.name.into()));
        let pod = Pod {
            node: fact.node.into(),
            owner_kind,
            owner_name,
            phase,
            app: fact.app.into(),
            claims_allocated: fact.claims_allocated,
            claims_needed: fact.claims_needed,
        };
        self.pods.insert(key, pod);
    }

    fn observe_gpu(&mut self, fact: PhysicalGpuObserved) {
        let gpu = PhysicalGpu {
            phase: fact.phase(),
            device: fact.device.into(),
            name: fact.name.into(),
        };
        let on_node = self.gpus.entry(fact.node).or_default();
        match on_node.binary_search_by(|g| g.name.cmp(&gpu.name)) {
            Ok(i) => on_node[i] = gpu,
            Err(i) => on_node.insert(i, gpu),
        }
    }

    fn observe_workload(&mut self, fact: WorkloadObserved) {
        if let Some(workload) = &fact.workload {
            let placement = Placement::new(&fact.placement.unwrap_or_default());
            self.workloads.insert(
                workload_key(workload),
                Workload {
                    replicas: fact.replicas,
                    placement,
                    managed_by: fact.managed_by.into(),
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
                self.eviction_blocks.remove(&key);
            }

            Kind::PhysicalGpuRemoved(fact) => {
                if let Some(on_node) = self.gpus.get_mut(&fact.node) {
                    on_node.retain(|g| *g.name != *fact.name);
                    if on_node.is_empty() {
                        self.gpus.remove(&fact.node);
                    }
                }
            }

            Kind::EvictionBlocked(fact) => {
                let budgets = if fact.disruption_budgets.is_empty() {
                    String::new()
                } else {
                    format!(
                        " (PodDisruptionBudget {})",
                        fact.disruption_budgets.join(", ")
                    )
                };
                self.eviction_blocks.insert(
                    (fact.namespace.clone(), fact.pod.clone()),
                    format!("{}{budgets}", fact.reason),
                );
            }
            Kind::GpuClassObserved(fact) => {
                self.gpu_classes
                    .insert(fact.name.clone(), fact.device_class_names.clone());
            }
            Kind::GpuClassRemoved(fact) => {
                self.gpu_classes.remove(&fact.name);
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

    /// The pods of a workload (they live in its namespace).
    pub fn pods_of(&self, workload: &WorkloadKey) -> Vec<&Pod> {
        self.named_pods_of(workload)
            .into_iter()
            .map(|(_, pod)| pod)
            .collect()
    }

    /// The pods of `workload` with their names.
    pub fn named_pods_of(&self, workload: &WorkloadKey) -> Vec<(&str, &Pod)> {
        let start = (workload.0.clone(), String::new());
        self.pods
            .range(start..)
            .take_while(|((namespace, _), _)| *namespace == workload.0)
            .filter(|((namespace, _), pod)| pod.owned_by(namespace, workload))
            .map(|((_, name), pod)| (name.as_str(), pod))
            .collect()
    }

    fn unindex_pod(&mut self, key: &ObjectKey) {
        let Some(node) = self.pods.get(key).map(|p| p.node.to_string()) else {
            return;
        };
        if let Some(pods) = self.pods_by_node.get_mut(&node) {
            if let Ok(i) = pods.binary_search(key) {
                pods.remove(i);
            }
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
                .any(|(_, p)| &*p.app == app && p.phase == PodPhase::Running)
        };
        Readiness {
            gpu_setup_complete: facts.labels.contains_key(GPU_SETUP_COMPLETE_LABEL),
            gpu_stack_dra: facts
                .labels
                .get(GPU_STACK_LABEL)
                .is_some_and(|v| v == STACK_DRA),
            ready_physical_gpus: self.gpus.get(node).map_or(0, |gpus| {
                gpus.iter().filter(|g| g.phase == GpuPhase::Ready).count() as u32
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

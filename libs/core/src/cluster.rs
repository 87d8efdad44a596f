//! Cluster facts as the cores see them, folded from fact events.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::sync::Arc;

use switchyard_proto::v1::{
    DomainEvent, GpuPhase, GpuSpec, NodeObserved, NodeProvisioning, PhysicalGpuObserved,
    PodObserved, PodPhase, ReadinessSelectorsConfigured, SliceDevice, Taint, WorkloadObserved,
    WorkloadPlacement, WorkloadRef, domain_event::Kind,
};

use crate::joined;
use crate::names::{
    CONTROL_PLANE_LABEL, GPU_ENABLED_LABEL, GPU_SETUP_COMPLETE_LABEL, GPU_STACK_LABEL,
    NODE_AGENT_SELECTOR, STACK_DRA, VENDOR_ADAPTER_SELECTOR,
};
pub use crate::selector::PodSelector;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Node {
    pub labels: Labels,
    pub taints: Vec<Taint>,
    pub unschedulable: bool,
    pub gpu_count: u32,
    pub provisioning: NodeProvisioning,
    /// The device plugin's allocatable GPU resources, summed: nvidia.com/gpu,
    /// its time-slicing replicas and MIG partitions.
    pub device_plugin_allocatable: u32,
    /// The node's group, read from the backend's group label when the node
    /// (or the backend) was folded: [`Node::group`].
    group: Option<Box<str>>,
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
    /// The node's group: its `node.deckhouse.io/group` label, or on the
    /// `nvidia-operator` backend its pool label ([`Cluster::group_label`]).
    pub fn group(&self) -> Option<&str> {
        self.group.as_deref()
    }

    /// Puts the node in `group` as `label` names it, as a move would.
    pub fn move_to(&mut self, label: &str, group: &str) {
        self.labels.insert(label.into(), group.into());
        self.regroup(label);
    }

    /// Reads the node's group from `label`.
    fn regroup(&mut self, label: &str) {
        self.group = self
            .labels
            .get(label)
            .filter(|g| !g.is_empty())
            .map(|g| g.as_str().into());
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
    /// The platform as inventory last read it: the API server's version,
    /// the feature gates its metrics report, whether it serves
    /// resource.k8s.io/v1, and why the gates could not be read.
    pub kubernetes_version: String,
    pub feature_gates: BTreeMap<String, bool>,
    pub dra_api_served: bool,
    pub feature_gates_error: String,
}

impl ModuleSettings {
    /// Whether `gate` is on: as the API server's metric reports it, or on
    /// because it went GA by this version and is no longer reported;
    /// `None` when unknown.
    pub fn gate(&self, gate: &str) -> Option<bool> {
        use crate::names::{FEATURE_GATES_GA, kubernetes_minor};
        if let Some(on) = self.feature_gates.get(gate) {
            return Some(*on);
        }
        let version = kubernetes_minor(&self.kubernetes_version)?;
        let graduated = FEATURE_GATES_GA
            .iter()
            .any(|(g, ga)| *g == gate && version >= *ga);
        (graduated && self.feature_gates_error.is_empty()).then_some(true)
    }

    /// What keeps the prerequisites from holding, in the reference's words;
    /// empty when Kubernetes is 1.34 or newer, the six feature gates are on
    /// and resource.k8s.io/v1 is served.
    pub fn prerequisites_missing(&self) -> Vec<String> {
        use crate::names::{MIN_KUBERNETES, REQUIRED_FEATURE_GATES, kubernetes_minor};
        let mut missing = Vec::new();
        match kubernetes_minor(&self.kubernetes_version) {
            Some(v) if v >= MIN_KUBERNETES => {}
            _ => missing.push(format!(
                "Kubernetes version is {} (1.{} or newer is needed)",
                if self.kubernetes_version.is_empty() {
                    "unknown"
                } else {
                    &self.kubernetes_version
                },
                MIN_KUBERNETES.1
            )),
        }
        for gate in REQUIRED_FEATURE_GATES {
            match self.gate(gate) {
                Some(true) => {}
                Some(false) => missing.push(format!("feature gate {gate} is disabled")),
                None if !self.feature_gates_error.is_empty() => missing.push(format!(
                    "feature gate {gate} is unknown: {}",
                    self.feature_gates_error
                )),
                None => missing.push(format!(
                    "feature gate {gate} is not reported by the API server"
                )),
            }
        }
        if !self.dra_api_served {
            missing.push("the API server does not serve resource.k8s.io/v1".into());
        }
        missing
    }
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
    /// The labels of a DaemonSet's pod (the stacks' pods) or of a pod no
    /// controller owns; empty for others.
    pub labels: PodLabels,
    pub claims_allocated: u32,
    pub claims_needed: u32,
    /// Device-plugin GPU resources it asks for that the device plugin serves.
    pub device_plugin_gpus: u32,
    /// Device-plugin GPU resources it asks for that DRA serves through the
    /// extended-resource bridge.
    pub bridged_gpus: u32,
    /// The restart of its workload that made it (the template's
    /// `kubectl.kubernetes.io/restartedAt` it was created from); empty if none.
    pub restarted_at: RareStr,
}

/// A string most records leave empty: a pointer's width, and nothing
/// allocated while empty.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct RareStr(Option<Box<Box<str>>>);

impl std::ops::Deref for RareStr {
    type Target = str;

    fn deref(&self) -> &str {
        self.0.as_deref().map_or("", |s| s)
    }
}

impl From<String> for RareStr {
    fn from(s: String) -> Self {
        RareStr((!s.is_empty()).then(|| Box::new(s.into_boxed_str())))
    }
}

impl From<&str> for RareStr {
    fn from(s: &str) -> Self {
        RareStr((!s.is_empty()).then(|| Box::new(s.into())))
    }
}

impl std::fmt::Debug for RareStr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&**self, f)
    }
}

impl std::fmt::Display for RareStr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self)
    }
}

/// A pod's labels, which most pods the cores hold do not keep: a pointer's
/// width when there are none.
#[derive(Clone, Default, PartialEq)]
pub struct PodLabels(Option<Box<Box<[Label]>>>);

/// A label's key and value.
pub type Label = (Box<str>, Box<str>);

impl PodLabels {
    pub fn iter(&self) -> std::slice::Iter<'_, Label> {
        self.0.as_deref().map_or(&[][..], |l| &l[..]).iter()
    }

    pub fn iter_mut(&mut self) -> std::slice::IterMut<'_, Label> {
        self.0
            .as_deref_mut()
            .map_or(&mut [][..], |l| &mut l[..])
            .iter_mut()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_none()
    }
}

impl std::fmt::Debug for PodLabels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl FromIterator<Label> for PodLabels {
    fn from_iter<I: IntoIterator<Item = Label>>(labels: I) -> Self {
        let labels: Box<[_]> = labels.into_iter().collect();
        PodLabels((!labels.is_empty()).then(|| Box::new(labels)))
    }
}

impl crate::selector::Labelled for Pod {
    fn label(&self, key: &str) -> Option<&str> {
        Pod::label(self, key)
    }
}

impl Pod {
    /// DaemonSet pods stay on a drained node.
    pub fn is_daemon(&self) -> bool {
        &*self.owner_kind == "DaemonSet"
    }

    /// The value of one of the pod's labels (kept for a DaemonSet's pods,
    /// the stacks' pods, and pods no controller owns).
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| &**k == key)
            .map(|(_, v)| &**v)
    }

    /// The owning workload, given the pod's namespace.
    pub fn owner(&self, namespace: &str) -> Option<WorkloadRef> {
        (!self.owner_kind.is_empty()).then(|| WorkloadRef {
            namespace: namespace.to_string(),
            kind: self.owner_kind.to_string(),
            name: self.owner_name.to_string(),
        })
    }

    /// [`Self::owner`] as a key of `Cluster::workloads` (empty kind and name
    /// for a pod no controller owns).
    pub fn owner_key(&self, namespace: &str) -> WorkloadKey {
        (
            namespace.to_string(),
            self.owner_kind.to_string(),
            self.owner_name.to_string(),
        )
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
    pub phase: GpuPhase,
    pub uuid: Box<str>,
    /// Shared with the node's other cards of the same model.
    pub product: Arc<str>,
    pub memory_mib: u64,
}

/// A ResourceSlice: the devices one driver publishes for a node.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Slice {
    pub driver: String,
    /// Empty for a slice not bound to one node.
    pub node: String,
    pub devices: Vec<SliceDevice>,
}

/// A ResourceClaim as exit evidence reads it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Claim {
    /// The node it is allocated on; empty while not allocated.
    pub node: String,
    /// Allocated devices as `driver/pool/device`.
    pub devices: Vec<String>,
    /// Pods (in the claim's namespace) it is reserved for.
    pub reserved_for: Vec<String>,
    /// The pod it was generated for from a ResourceClaimTemplate.
    pub owner_pod: String,
    /// The DeviceClasses its requests name.
    pub device_classes: Vec<String>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Workload {
    pub replicas: u32,
    pub placement: Placement,
    /// What many workloads lack, apart: [`Workload::managed_by`],
    /// [`Workload::cron_job`], [`Workload::restarted_at`].
    details: Option<Box<WorkloadDetails>>,
}

#[derive(Clone, Debug, Default, PartialEq)]
struct WorkloadDetails {
    managed_by: Box<str>,
    cron_job: Option<Box<str>>,
    restarted_at: Box<str>,
}

impl Workload {
    /// `managed_by`, `cron_job` and `restarted_at` as [`Workload::managed_by`],
    /// [`Workload::cron_job`] and [`Workload::restarted_at`] give them.
    pub fn new(
        replicas: u32,
        placement: Placement,
        managed_by: &str,
        cron_job: Option<&str>,
        restarted_at: &str,
    ) -> Self {
        let details = (!managed_by.is_empty() || cron_job.is_some() || !restarted_at.is_empty())
            .then(|| {
                Box::new(WorkloadDetails {
                    managed_by: managed_by.into(),
                    cron_job: cron_job.map(Into::into),
                    restarted_at: restarted_at.into(),
                })
            });
        Workload {
            replicas,
            placement,
            details,
        }
    }

    /// What keeps the manifest (a Helm release, a GitOps controller, an
    /// operator); empty when nothing is known to.
    pub fn managed_by(&self) -> &str {
        self.details.as_ref().map_or("", |d| &d.managed_by)
    }

    /// The CronJob a Job was made by, in the Job's namespace.
    pub fn cron_job(&self) -> Option<&str> {
        self.details.as_ref().and_then(|d| d.cron_job.as_deref())
    }

    /// The pod template's `kubectl.kubernetes.io/restartedAt`; empty: none.
    pub fn restarted_at(&self) -> &str {
        self.details.as_ref().map_or("", |d| &d.restarted_at)
    }
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

    /// Whether the workload's placement is `placement`; tolerations count
    /// only where `placement` records them.
    pub fn is(&self, placement: &WorkloadPlacement) -> bool {
        if placement.tolerations.is_none() {
            let mut have = self.get();
            have.tolerations = None;
            return have == *placement;
        }
        *self.encoded == *prost::Message::encode_to_vec(placement)
    }
}

/// (namespace, kind, name) of a workload.
pub type WorkloadKey = (String, String, String);

/// An index of pods: one entry per pod, the names it is found by and the
/// pod's own [`joined`](crate::joined) (a node's: node, namespace, name; an owner's:
/// namespace, kind, owner, name), so the pods under a prefix are one range,
/// in the order of their tuples. One small allocation per pod: a map of
/// per-owner sets spent a B-tree node (eleven key slots) on each owner's one
/// or few pods, and a map of per-node vectors a copy of each pod's key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct PodIndex(BTreeSet<Box<str>>);

impl PodIndex {
    fn insert(&mut self, parts: &[&str]) {
        self.0.insert(joined::join(parts));
    }

    fn remove(&mut self, parts: &[&str]) {
        self.0.remove(&*joined::join(parts));
    }

    /// What follows `prefix` in the entries that start with it, in order:
    /// their further parts, still joined.
    fn under<'a>(&'a self, prefix: &[&str]) -> impl Iterator<Item = &'a str> + use<'a> {
        let start = joined::prefix(prefix);
        let skip = start.len();
        self.0
            .range::<str, _>((Bound::Included(start.as_str()), Bound::Unbounded))
            .take_while(move |entry| entry.starts_with(&start))
            .map(move |entry| &entry[skip..])
    }
}

pub fn workload_key(workload: &WorkloadRef) -> WorkloadKey {
    (
        workload.namespace.clone(),
        workload.kind.clone(),
        workload.name.clone(),
    )
}

/// (namespace, name) of a namespaced object.
pub type ObjectKey = (String, String);

/// Which pods are "the gpu-node-agent and vendor adapter Pods" of the
/// reference's readiness condition. By default those of Switchyard's own
/// chart: its node agent serves both stacks, so there is no vendor adapter.
#[derive(Clone, Debug, PartialEq)]
pub struct ReadinessSelectors {
    pub node_agent: PodSelector,
    pub vendor_adapter: PodSelector,
}

impl Default for ReadinessSelectors {
    fn default() -> Self {
        ReadinessSelectors {
            node_agent: PodSelector::parse(NODE_AGENT_SELECTOR)
                .expect("a built-in selector parses"),
            vendor_adapter: PodSelector::parse(VENDOR_ADAPTER_SELECTOR)
                .expect("a built-in selector parses"),
        }
    }
}

impl ReadinessSelectors {
    /// Parses the two flags, naming the one that is not a selector.
    pub fn parse(node_agent: &str, vendor_adapter: &str) -> Result<Self, String> {
        let node_agent =
            PodSelector::parse(node_agent).map_err(|e| format!("--node-agent-selector: {e}"))?;
        if node_agent.selector.is_none() {
            return Err("--node-agent-selector: must not be empty: readiness needs the node agent's pod (e.g. app.kubernetes.io/component=node-agent)".into());
        }
        let vendor_adapter = PodSelector::parse(vendor_adapter)
            .map_err(|e| format!("--vendor-adapter-selector: {e}"))?;
        Ok(ReadinessSelectors {
            node_agent,
            vendor_adapter,
        })
    }

    /// As recorded in the log.
    pub fn to_event(&self) -> ReadinessSelectorsConfigured {
        ReadinessSelectorsConfigured {
            node_agent: self.node_agent.text.clone(),
            node_agent_selector: self.node_agent.selector.clone(),
            vendor_adapter: self.vendor_adapter.text.clone(),
            vendor_adapter_selector: self.vendor_adapter.selector.clone(),
        }
    }

    pub fn from_event(e: &ReadinessSelectorsConfigured) -> Self {
        ReadinessSelectors {
            node_agent: PodSelector {
                text: e.node_agent.clone(),
                selector: e.node_agent_selector.clone(),
            },
            vendor_adapter: PodSelector {
                text: e.vendor_adapter.clone(),
                selector: e.vendor_adapter_selector.clone(),
            },
        }
    }
}

/// The four readiness conditions of a node handed over to DRA.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Readiness {
    /// `gpu-setup-complete` is present (whether it was written after the
    /// group change is the handover's to judge: `Handover::setup_label_fresh`).
    pub gpu_setup_complete: bool,
    pub gpu_stack_dra: bool,
    pub ready_physical_gpus: u32,
    /// The cards the node had before the handover (at least one Ready
    /// PhysicalGPU each); never fewer than the PhysicalGPUs it has now.
    pub expected_physical_gpus: u32,
    pub node_agent_running: bool,
    /// True as well when the deployment has no vendor adapter.
    pub vendor_adapter_running: bool,
    /// The selectors the pods were matched with, for the reasons.
    pub node_agent_selector: String,
    pub vendor_adapter_selector: String,
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
        self.missing_conditions()
            .into_iter()
            .map(|(_, seen)| seen)
            .collect()
    }

    /// [`Self::missing`], each with its condition's name (a metric's
    /// `condition` label): `gpu_setup_complete`, `gpu_stack_dra`,
    /// `physical_gpus_ready`, `node_agent_running`, `vendor_adapter_running`.
    pub fn missing_conditions(&self) -> Vec<(&'static str, String)> {
        let mut missing = Vec::new();
        if !self.gpu_setup_complete {
            missing.push((
                "gpu_setup_complete",
                format!("label {GPU_SETUP_COMPLETE_LABEL} is not present"),
            ));
        }
        if !self.gpu_stack_dra {
            missing.push((
                "gpu_stack_dra",
                format!("label {GPU_STACK_LABEL}={STACK_DRA} is not present"),
            ));
        }
        if self.ready_physical_gpus < self.expected_physical_gpus {
            missing.push((
                "physical_gpus_ready",
                format!(
                    "{} of {} PhysicalGPU objects are Ready",
                    self.ready_physical_gpus, self.expected_physical_gpus
                ),
            ));
        }
        if !self.node_agent_running {
            missing.push((
                "node_agent_running",
                format!(
                    "no running gpu-node-agent pod ({}) on the node",
                    self.node_agent_selector
                ),
            ));
        }
        if !self.vendor_adapter_running {
            missing.push((
                "vendor_adapter_running",
                format!(
                    "no running vendor adapter pod ({}) on the node",
                    self.vendor_adapter_selector
                ),
            ));
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
    /// Boxed: a B-tree keeps its nodes' slots about half empty, and a
    /// pointer's slot is cheaper to leave empty than a whole pod's.
    pub pods: BTreeMap<ObjectKey, Box<Pod>>,
    /// Node -> pods scheduled on it, sorted: [`Cluster::pods_on`].
    pods_by_node: PodIndex,
    /// The workload that owns them (namespace, kind, name) -> pods:
    /// [`Cluster::named_pods_of`]. Empty in a cluster
    /// [`Cluster::without_owner_index`].
    pods_by_owner: PodIndex,
    /// Set by [`Cluster::without_owner_index`]: no `pods_by_owner` is kept
    /// and [`Cluster::named_pods_of`] reads the namespace's pods instead.
    owners_unindexed: bool,
    /// Node -> its PhysicalGPUs, by name. GPUs never move between nodes.
    pub gpus: BTreeMap<String, Vec<PhysicalGpu>>,
    /// Boxed, as [`Cluster::pods`] are.
    pub workloads: BTreeMap<WorkloadKey, Box<Workload>>,
    /// GPUClass name -> its DeviceClass names.
    pub gpu_classes: BTreeMap<String, Vec<String>>,
    /// ResourceQuota spec.hard.
    pub quotas: BTreeMap<ObjectKey, BTreeMap<String, String>>,
    /// Pods the Eviction API refused to evict, with its answer and the
    /// PodDisruptionBudgets that cover them; forgotten when the pod goes.
    pub eviction_blocks: BTreeMap<ObjectKey, String>,
    /// The selectors of the readiness condition's pods, as last recorded.
    pub selectors: ReadinessSelectors,
    /// The backend that serves the GPUs, as last recorded.
    pub backend: crate::backend::Backend,
    /// Allocated ResourceClaims -> the node they are allocated on.
    pub claim_nodes: BTreeMap<ObjectKey, String>,
    /// Node -> the ResourceClaims allocated on it.
    pub claims_by_node: BTreeMap<String, BTreeSet<ObjectKey>>,
    /// Every ResourceClaim, allocated or not.
    pub claims: BTreeMap<ObjectKey, Claim>,
    /// ResourceSlices by name.
    pub slices: BTreeMap<String, Slice>,
}

impl Cluster {
    /// A cluster for a core that never asks for a workload's pods (the
    /// stack-assigner): it keeps no index of pods by owner, one entry per
    /// pod, and [`Cluster::named_pods_of`] reads the namespace's pods.
    pub fn without_owner_index() -> Self {
        Cluster {
            owners_unindexed: true,
            ..Cluster::default()
        }
    }

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
        let mut node = Node {
            provisioning: fact.provisioning(),
            labels: fact.labels.into(),
            taints: fact.taints,
            unschedulable: fact.unschedulable,
            gpu_count: fact.gpu_count,
            device_plugin_allocatable: fact
                .gpu_allocatable
                .values()
                .fold(0u32, |sum, n| sum.saturating_add(*n)),
            group: None,
        };
        node.regroup(self.backend.group_label());
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
            self.pods_by_node.insert(&[&fact.node, &key.0, &key.1]);
        }
        let (owner_kind, owner_name): (Box<str>, Box<str>) = fact
            .owner
            .map_or_else(Default::default, |o| (o.kind.into(), o.name.into()));
        // Only a DaemonSet's pods, and pods no controller owns, are matched
        // against the readiness selectors. A fact recorded before pods
        // carried labels has the `app` label alone: upcast to it.
        let labels: PodLabels = if !owner_kind.is_empty() && &*owner_kind != "DaemonSet" {
            PodLabels::default()
        } else if fact.labels.is_empty() && !fact.app.is_empty() {
            [("app".into(), fact.app.into())].into_iter().collect()
        } else {
            fact.labels
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect()
        };
        let pod = Pod {
            node: fact.node.into(),
            owner_kind,
            owner_name,
            phase,
            labels,
            claims_allocated: fact.claims_allocated,
            claims_needed: fact.claims_needed,
            device_plugin_gpus: fact.device_plugin_gpus,
            bridged_gpus: fact.bridged_gpus,
            restarted_at: fact.restarted_at.into(),
        };
        if !self.owners_unindexed {
            self.pods_by_owner
                .insert(&[&key.0, &pod.owner_kind, &pod.owner_name, &key.1]);
        }
        self.pods.insert(key, Box::new(pod));
    }

    fn observe_gpu(&mut self, fact: PhysicalGpuObserved) {
        let phase = fact.phase();
        let on_node = self.gpus.entry(fact.node).or_default();
        // A node's cards are mostly of one model: its name is held once.
        let product = on_node
            .iter()
            .find(|g| *g.product == *fact.product)
            .map_or_else(|| fact.product.into(), |g| g.product.clone());
        let gpu = PhysicalGpu {
            phase,
            name: fact.name.into(),
            uuid: fact.uuid.into(),
            product,
            memory_mib: fact.memory_mib,
        };
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
                Box::new(Workload::new(
                    fact.replicas,
                    placement,
                    &fact.managed_by,
                    fact.owner
                        .as_ref()
                        .filter(|o| o.kind == "CronJob")
                        .map(|o| o.name.as_str()),
                    &fact.restarted_at,
                )),
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
            Kind::ReadinessSelectorsConfigured(fact) => {
                self.selectors = ReadinessSelectors::from_event(fact);
            }
            Kind::BackendConfigured(fact) => {
                self.backend = crate::backend::Backend::from_event(fact);
                // Groups are read from the backend's label: read them again.
                let label = self.backend.group_label().to_string();
                self.members.clear();
                for (name, node) in &mut self.nodes {
                    node.regroup(&label);
                    if let Some(group) = node.group() {
                        self.members
                            .entry(group.to_string())
                            .or_default()
                            .insert(name.clone());
                    }
                }
            }
            Kind::ResourceClaimObserved(fact) => {
                let key = (fact.namespace.clone(), fact.name.clone());
                self.unindex_claim(&key);
                if !fact.node.is_empty() {
                    self.claims_by_node
                        .entry(fact.node.clone())
                        .or_default()
                        .insert(key.clone());
                    self.claim_nodes.insert(key.clone(), fact.node.clone());
                }
                self.claims.insert(
                    key,
                    Claim {
                        node: fact.node.clone(),
                        devices: fact
                            .allocated
                            .iter()
                            .map(|d| format!("{}/{}/{}", d.driver, d.pool, d.device))
                            .collect(),
                        reserved_for: fact.reserved_for.clone(),
                        owner_pod: fact.owner_pod.clone(),
                        device_classes: fact.device_classes.clone(),
                    },
                );
            }
            Kind::WorkloadRemoved(fact) => {
                if let Some(workload) = &fact.workload {
                    self.workloads.remove(&workload_key(workload));
                }
            }
            Kind::ResourceClaimRemoved(fact) => {
                let key = (fact.namespace.clone(), fact.name.clone());
                self.unindex_claim(&key);
                self.claims.remove(&key);
            }
            Kind::ResourceSliceObserved(fact) => {
                self.slices.insert(
                    fact.name.clone(),
                    Slice {
                        driver: fact.driver.clone(),
                        node: fact.node.clone(),
                        devices: fact.device_list.clone(),
                    },
                );
            }
            Kind::ResourceSliceRemoved(fact) => {
                self.slices.remove(&fact.name);
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
                    kubernetes_version: fact.kubernetes_version.clone(),
                    feature_gates: fact.feature_gates.clone(),
                    dra_api_served: fact.dra_api_served,
                    feature_gates_error: fact.feature_gates_error.clone(),
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
    /// Sorted by name; a CronJob's are the pods of the Jobs it made.
    pub fn named_pods_of(&self, workload: &WorkloadKey) -> Vec<(&str, &Pod)> {
        let mut owners = vec![workload];
        if workload.1 == "CronJob" {
            let jobs = (workload.0.clone(), "Job".to_string(), String::new());
            owners.extend(
                self.workloads
                    .range(jobs..)
                    .take_while(|((namespace, kind, _), _)| {
                        *namespace == workload.0 && kind == "Job"
                    })
                    .filter(|(_, job)| job.cron_job() == Some(workload.2.as_str()))
                    .map(|(key, _)| key),
            );
        }
        let mut pods: Vec<(&str, &Pod)> = if self.owners_unindexed {
            self.pods
                .range((workload.0.clone(), String::new())..)
                .take_while(|((namespace, _), _)| *namespace == workload.0)
                .filter(|((namespace, _), pod)| owners.iter().any(|o| pod.owned_by(namespace, o)))
                .map(|((_, name), pod)| (name.as_str(), &**pod))
                .collect()
        } else {
            owners
                .into_iter()
                .flat_map(|(namespace, kind, name)| {
                    self.pods_by_owner.under(&[namespace, kind, name])
                })
                .filter_map(|name| {
                    let name = joined::split(name).next()?.into_owned();
                    self.pods
                        .get_key_value(&(workload.0.clone(), name))
                        .map(|((_, name), pod)| (name.as_str(), &**pod))
                })
                .collect()
        };
        if workload.1 == "CronJob" {
            pods.sort_unstable_by_key(|(name, _)| *name);
        }
        pods
    }

    fn unindex_pod(&mut self, key: &ObjectKey) {
        let Some(pod) = self.pods.get(key) else {
            return;
        };
        self.pods_by_owner
            .remove(&[&key.0, &pod.owner_kind, &pod.owner_name, &key.1]);
        if !pod.node.is_empty() {
            self.pods_by_node.remove(&[&pod.node, &key.0, &key.1]);
        }
    }

    /// Pods on `node`.
    pub fn pods_on<'a>(
        &'a self,
        node: &str,
    ) -> impl Iterator<Item = (&'a ObjectKey, &'a Pod)> + 'a {
        self.pods_by_node.under(&[node]).map(|rest| {
            let mut parts = joined::split(rest);
            let mut part = || parts.next().unwrap_or_default().into_owned();
            let (key, pod) = self
                .pods
                .get_key_value(&(part(), part()))
                .expect("an indexed pod is held");
            (key, &**pod)
        })
    }

    fn unindex_claim(&mut self, key: &ObjectKey) {
        let Some(node) = self.claim_nodes.remove(key) else {
            return;
        };
        if let Some(claims) = self.claims_by_node.get_mut(&node) {
            claims.remove(key);
            if claims.is_empty() {
                self.claims_by_node.remove(&node);
            }
        }
    }

    /// The ResourceClaims allocated on `node`, as `namespace/name`.
    pub fn claims_on(&self, node: &str) -> Vec<String> {
        self.claims_by_node
            .get(node)
            .into_iter()
            .flatten()
            .map(|(ns, name)| format!("{ns}/{name}"))
            .collect()
    }

    /// The node's cards as the facts show them now: its PhysicalGPU objects,
    /// or the GPUs it reports if more.
    pub fn cards(&self, node: &str) -> u32 {
        let objects = self.gpus.get(node).map_or(0, Vec::len) as u32;
        let reported = self.nodes.get(node).map_or(0, |n| n.gpu_count);
        objects.max(reported)
    }

    /// The pods of `node` whose eviction was refused, with the answer and budgets.
    pub fn blocked_evictions(&self, node: &str) -> Vec<(String, String)> {
        self.pods_on(node)
            .filter_map(|(key, _)| {
                self.eviction_blocks
                    .get(key)
                    .map(|why| (format!("{}/{}", key.0, key.1), why.clone()))
            })
            .collect()
    }

    /// The four readiness conditions of `node` (reference, step 3), expecting
    /// `cards` Ready PhysicalGPUs — the cards it had before its handover
    /// (never fewer than it has PhysicalGPUs now: a card's capacity is no
    /// count on a DRA node, whose nvidia.com/gpu capacity is 0).
    pub fn readiness(&self, node: &str, cards: u32) -> Readiness {
        let Some(facts) = self.nodes.get(node) else {
            return Readiness::default();
        };
        let running = |selector: &PodSelector| {
            self.pods_on(node)
                .any(|(_, p)| p.phase == PodPhase::Running && selector.selects(p))
        };
        let selectors = &self.selectors;
        Readiness {
            gpu_setup_complete: facts.labels.contains_key(GPU_SETUP_COMPLETE_LABEL),
            gpu_stack_dra: facts
                .labels
                .get(GPU_STACK_LABEL)
                .is_some_and(|v| v == STACK_DRA),
            ready_physical_gpus: self.gpus.get(node).map_or(0, |gpus| {
                gpus.iter().filter(|g| g.phase == GpuPhase::Ready).count() as u32
            }),
            expected_physical_gpus: cards.max(self.gpus.get(node).map_or(0, Vec::len) as u32),
            node_agent_running: running(&selectors.node_agent),
            vendor_adapter_running: selectors.vendor_adapter.selector.is_none()
                || running(&selectors.vendor_adapter),
            node_agent_selector: selectors.node_agent.text.clone(),
            vendor_adapter_selector: selectors.vendor_adapter.text.clone(),
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

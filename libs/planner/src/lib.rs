//! The migration-wave register and the waves Switchyard proposes, as a pure
//! function of a snapshot of the cluster (`switchyard plan`).
//!
//! - [`register`]: every workload using device-plugin GPUs (`nvidia.com/gpu`,
//!   `nvidia.com/gpu.shared`, `nvidia.com/mig-*`) with what the NVIDIA guide
//!   says to record before a migration — owner and controller kind,
//!   replicas, GPUs per pod and in total, node selectors, affinity and
//!   tolerations, the GPU product and memory it runs on, MIG or sharing
//!   mode, the PodDisruptionBudgets that select it, and whether something
//!   else owns its manifest (Helm, Argo CD, Flux, an operator).
//! - [`waves`]: which nodes of the source group to hand over in which order
//!   (at most `max_unavailable` a wave, the source group left able to run
//!   what has not moved), and which workloads then fit on the target group,
//!   predicted with the scheduler-exact allocator on the cluster's
//!   DeviceClasses and the slices the handed-over nodes would publish
//!   (libs/gpu's publication of their PhysicalGPUs).
//!
//! No I/O, no clock, no hash-ordered output: the same snapshot gives the same
//! plan, byte for byte.

mod classes;
mod register;
mod waves;

#[cfg(test)]
mod tests;

use std::borrow::Cow;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{Affinity, Node, Pod, Toleration};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use litemap::LiteMap;
use serde::Serialize;
use switchyard_api::{GPUClass, NodeGroup, PhysicalGPU};
use switchyard_gpu::publish::Layout;

pub use register::{gpu_resources, is_gpu_resource};
pub use waves::Reading;

/// The plan's hash maps: a fixed seed (nothing of the plan depends on their
/// order, and the same input hashes alike in every run), and a hash much
/// cheaper than SipHash for the snapshot's many short keys.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::FixedState>;

/// What the plan is computed from: the objects as the API server lists them.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub nodes: Vec<Node>,
    pub node_groups: Vec<NodeGroup>,
    pub physical_gpus: Vec<PhysicalGPU>,
    pub gpu_classes: Vec<GPUClass>,
    pub device_classes: Vec<DeviceClass>,
    pub resource_slices: Vec<ResourceSlice>,
    pub resource_claims: Vec<ResourceClaim>,
    pub pods: Vec<Pod>,
    pub deployments: Vec<Deployment>,
    pub replica_sets: Vec<ReplicaSet>,
    pub stateful_sets: Vec<StatefulSet>,
    pub daemon_sets: Vec<DaemonSet>,
    pub jobs: Vec<Job>,
    pub cron_jobs: Vec<CronJob>,
    pub pod_disruption_budgets: Vec<PodDisruptionBudget>,
}

/// What to plan.
#[derive(Clone, Debug)]
pub struct PlanRequest {
    /// The source group (device plugin).
    pub from: String,
    /// The target group (DRA).
    pub to: String,
    /// The GPUClass the moved workloads request; `None`: the only one.
    pub class: Option<String>,
    /// Nodes handed over at once, at most (at least 1).
    pub max_unavailable: usize,
    /// How handed-over nodes publish their cards (the node agent's `--layout`).
    pub layout: Layout,
    /// Only move (and list) the workloads of this namespace; the others still
    /// need room in the source group.
    pub namespace: Option<String>,
    /// Which backend serves the GPUs: `deckhouse` (groups are NodeGroups, a
    /// handed-over node publishes its PhysicalGPUs) or `nvidia-operator`
    /// (groups are pools by label, a handed-over node publishes what a node
    /// of the same GPU Feature Discovery labels publishes already, gets the
    /// DRA operand labels and the pilot taint, which moved workloads tolerate).
    pub backend: switchyard_core::backend::Backend,
}

impl PlanRequest {
    /// The label that names a node's group.
    pub fn group_label(&self) -> &str {
        self.backend.group_label()
    }

    /// nvidia-operator: the backend's settings.
    pub fn nvidia(&self) -> Option<&switchyard_core::backend::NvidiaOperator> {
        self.backend.nvidia_operator()
    }
}

/// An input the plan cannot use, named by object and field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("{object}: {field}: {message}")]
    Invalid {
        object: String,
        field: String,
        message: String,
    },
    #[error("node group {0:?} does not exist (node groups: {1})")]
    UnknownGroup(String, String),
    #[error("pool {0:?} is not configured (pools: {1})")]
    UnknownPool(String, String),
    #[error("pool {0:?} is configured {1}; expected a pool the {2} serves")]
    PoolStack(String, String, &'static str),
    #[error("the source and target group are the same ({0})")]
    SameGroup(String),
    #[error("GPU class {0:?} does not exist (GPU classes: {1})")]
    UnknownClass(String, String),
    #[error("no GPUClass in the cluster: create one first (Step 2)")]
    NoClass,
    #[error("several GPU classes ({0}): choose one with --class")]
    SeveralClasses(String),
    #[error("the DRA inventory: {0}")]
    Inventory(#[from] switchyard_dra::alloc::InputError),
}

/// A workload, as the operator knows it (borrowed from the snapshot).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct WorkloadRef<'a> {
    pub namespace: &'a str,
    pub kind: &'a str,
    pub name: &'a str,
}

impl std::fmt::Display for WorkloadRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.namespace, self.kind, self.name)
    }
}

/// The plan: the register, then the waves. Its names are borrowed from the
/// snapshot it is computed from (copying them was most of what it cost).
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan<'a> {
    pub from: String,
    pub to: String,
    pub class: String,
    pub max_unavailable: usize,
    /// Every workload using device-plugin GPUs, sorted by namespace, kind, name.
    pub register: Vec<RegisterEntry<'a>>,
    pub waves: Vec<Wave<'a>>,
    /// Every node of the source group handed over and every workload of it moved.
    pub complete: bool,
    /// Nodes of the source group the plan could not hand over, and why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub blocked: Option<Blocked<'a>>,
    /// Workloads of the source group the plan did not move, and why.
    pub remaining: Vec<Pending<'a>>,
    /// DaemonSets on the source group: their pods go with their nodes; they
    /// are moved by rewriting their manifest, not planned into a wave.
    pub follow_nodes: Vec<WorkloadRef<'a>>,
}

/// One row of the migration-wave register.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RegisterEntry<'a> {
    pub namespace: &'a str,
    /// The controller kind: Deployment, StatefulSet, DaemonSet, Job, CronJob,
    /// ReplicaSet, Pod, or an operator's kind for pods it controls directly.
    pub kind: &'a str,
    pub name: &'a str,
    /// The controller above the workload (an operator's object), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owner: Option<OwnerRef<'a>>,
    pub replicas: u32,
    /// Device-plugin resources a pod requests.
    pub gpus_per_pod: LiteMap<&'a str, u64>,
    /// `gpus_per_pod` summed over the resources, times `replicas`.
    pub gpus_total: u64,
    pub mode: Mode,
    #[serde(skip_serializing_if = "LiteMap::is_empty")]
    pub node_selector: LiteMap<&'a str, &'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub affinity: Option<&'a Affinity>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    pub tolerations: &'a [Toleration],
    /// Nodes its pods run on, and their groups.
    pub nodes: Vec<&'a str>,
    pub groups: Vec<&'a str>,
    /// The cards of those nodes: product and memory.
    pub gpu_models: Vec<GpuModel<'a>>,
    pub pod_disruption_budgets: Vec<Budget<'a>>,
    /// What owns the manifest besides the cluster (Switchyard must not edit
    /// it in place: the change goes to the chart, the repository, the CR).
    pub managed_by: Vec<Manager<'a>>,
    pub editable_in_place: bool,
    /// Runs on (or is bound to) the source group: the plan moves it.
    pub in_plan: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct OwnerRef<'a> {
    pub kind: &'a str,
    pub name: &'a str,
}

/// How a workload uses its cards today.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Whole cards (`nvidia.com/gpu` on a group without sharing).
    Exclusive,
    /// MIG devices (`nvidia.com/mig-<profile>`, or a group in MIG mode).
    Mig,
    /// Time-sliced replicas of a card (a group with time-slicing).
    TimeSliced,
    /// `nvidia.com/gpu.shared` (the device plugin's renamed shared resource).
    Shared,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuModel<'a> {
    pub product: &'a str,
    #[serde(rename = "memoryMiB", skip_serializing_if = "Option::is_none")]
    pub memory_mib: Option<u64>,
    /// `PhysicalGPU` or `NFD` (the node's `nvidia.com/gpu.*` labels).
    pub source: &'static str,
}

/// A PodDisruptionBudget selecting a workload's pods.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Budget<'a> {
    pub name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_available: Option<Cow<'a, str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<Cow<'a, str>>,
    /// Pods it lets a drain evict at once (its status, or from its spec).
    pub disruptions_allowed: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Manager<'a> {
    /// `Helm`, `ArgoCD`, `Flux` or `Operator`.
    pub kind: &'static str,
    /// The release, application, Kustomization / HelmRelease, or owner object.
    pub name: Cow<'a, str>,
}

/// One wave: hand these nodes over, then move these workloads.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Wave<'a> {
    pub number: usize,
    pub handovers: Vec<Handover<'a>>,
    pub moves: Vec<Move<'a>>,
    /// Workloads evicted by this wave's drains that do not fit on the target
    /// group yet: they are rescheduled in the source group.
    pub pending: Vec<Pending<'a>>,
    /// The source group after the wave, per resource: what its nodes offer and
    /// what the workloads not moved need.
    pub source_after: LiteMap<&'a str, SourceCapacity>,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Handover<'a> {
    pub node: &'a str,
    /// The node's device-plugin resources.
    pub capacity: LiteMap<&'a str, u64>,
    /// Workloads (not moved yet) with pods on the node, which its drain evicts.
    pub evicts: Vec<WorkloadRef<'a>>,
    /// Budgets the drain has to respect (namespace/name).
    pub budgets: Vec<String>,
    /// Budgets whose allowance this node's drain alone exceeds: it waits for
    /// the evicted pods to run elsewhere.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub budget_waits: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Move<'a> {
    pub workload: WorkloadRef<'a>,
    /// The extended resources the rewritten manifest requests, per pod.
    pub requests: LiteMap<String, u64>,
    /// Where the allocator puts each pod, and the devices it allocates.
    pub pods: Vec<PodPlacement<'a>>,
}

#[derive(Clone, Debug, Serialize)]
pub struct PodPlacement<'a> {
    pub node: &'a str,
    pub devices: Vec<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Pending<'a> {
    pub workload: WorkloadRef<'a>,
    /// Why it would stay Pending on the target group (the allocator's reason).
    pub reason: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct Blocked<'a> {
    pub nodes: Vec<&'a str>,
    pub reason: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct SourceCapacity {
    pub available: u64,
    pub needed: u64,
}

/// The register and the waves for `request` over `snapshot`.
pub fn plan<'a>(snapshot: &'a Snapshot, request: &PlanRequest) -> Result<Plan<'a>, PlanError> {
    plan_reading(snapshot, request, Reading::ByClass)
}

/// [`plan`], the handed-over nodes' slices read as `reading` says.
pub fn plan_reading<'a>(
    snapshot: &'a Snapshot,
    request: &PlanRequest,
    reading: Reading,
) -> Result<Plan<'a>, PlanError> {
    if let Some(nvidia) = request.nvidia() {
        use switchyard_proto::v1::Stack;
        let pools = || nvidia.pools.keys().cloned().collect::<Vec<_>>().join(", ");
        for (pool, wanted, serves) in [
            (&request.from, Stack::DevicePlugin, "device plugin"),
            (&request.to, Stack::Dra, "DRA driver"),
        ] {
            match nvidia.pools.get(pool) {
                None => return Err(PlanError::UnknownPool(pool.clone(), pools())),
                Some(stack) if *stack != wanted => {
                    return Err(PlanError::PoolStack(
                        pool.clone(),
                        stack
                            .as_str_name()
                            .trim_start_matches("STACK_")
                            .to_lowercase(),
                        serves,
                    ));
                }
                Some(_) => {}
            }
        }
    } else {
        let groups: Vec<&str> = snapshot
            .node_groups
            .iter()
            .filter_map(|g| g.metadata.name.as_deref())
            .collect();
        for group in [&request.from, &request.to] {
            if !groups.contains(&group.as_str()) {
                let mut known = groups.clone();
                known.sort_unstable();
                return Err(PlanError::UnknownGroup(group.clone(), known.join(", ")));
            }
        }
    }
    if request.from == request.to {
        return Err(PlanError::SameGroup(request.from.clone()));
    }
    let class = choose_class(snapshot, request.class.as_deref())?;
    let built = register::build(snapshot, request)?;
    // The rows of the register are copied out of the snapshot while the
    // waves are planned: two threads, the same plan.
    std::thread::scope(|scope| {
        let register = scope.spawn(|| built.entries());
        let plan = waves::plan(snapshot, request, class, &built, reading);
        let register = register::join(register);
        plan.map(|plan| Plan { register, ..plan })
    })
}

fn choose_class<'a>(snapshot: &'a Snapshot, name: Option<&str>) -> Result<&'a GPUClass, PlanError> {
    let mut classes: Vec<&GPUClass> = snapshot.gpu_classes.iter().collect();
    classes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let names = || {
        classes
            .iter()
            .filter_map(|c| c.metadata.name.as_deref())
            .collect::<Vec<_>>()
            .join(", ")
    };
    match name {
        Some(name) => classes
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(name))
            .copied()
            .ok_or_else(|| PlanError::UnknownClass(name.to_string(), names())),
        None => match classes.as_slice() {
            [] => Err(PlanError::NoClass),
            [one] => Ok(one),
            _ => Err(PlanError::SeveralClasses(names())),
        },
    }
}

//! The migration-wave register: the workloads that depend on the device
//! plugin's extended resources, read from their controllers and their pods.

use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};
use std::sync::{Mutex, PoisonError};

use k8s_openapi::api::core::v1::{NodeSelector, Pod, PodSpec, PodTemplateSpec, Toleration};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use switchyard_api::{GpuSharing, NodeGroup, PhysicalGPU};
use switchyard_core::names::NVIDIA_GPU;

use super::{
    Budget, GpuModel, HashMap, Manager, Mode, OwnerRef, PlanError, PlanRequest, RegisterEntry,
    Snapshot, WorkloadRef,
};

/// The device plugin's time-sliced resource when it is renamed.
pub const NVIDIA_GPU_SHARED: &str = "nvidia.com/gpu.shared";
/// MIG devices under the device plugin's `mixed` strategy.
pub const NVIDIA_MIG_PREFIX: &str = "nvidia.com/mig-";
const PRODUCT_LABEL: &str = "nvidia.com/gpu.product";
const MEMORY_LABEL: &str = "nvidia.com/gpu.memory";
/// The register's workloads are read in this many pieces, by two threads.
const PIECES: usize = 16;
const WORKLOAD_KINDS: [&str; 6] = [
    "Deployment",
    "ReplicaSet",
    "StatefulSet",
    "DaemonSet",
    "Job",
    "CronJob",
];

/// Whether a resource name is a device-plugin GPU resource.
pub fn is_gpu_resource(name: &str) -> bool {
    name == NVIDIA_GPU || name == NVIDIA_GPU_SHARED || name.starts_with(NVIDIA_MIG_PREFIX)
}

/// The device-plugin GPUs a pod asks for, as the scheduler counts them: the
/// containers summed, the largest init container if that is more. `object`
/// and `path` name where the spec is, for errors.
pub fn gpu_resources(
    spec: &PodSpec,
    object: &str,
    path: &str,
) -> Result<BTreeMap<String, u64>, PlanError> {
    let requests = pod_requests(spec, || object.to_string(), path)?;
    Ok(requests
        .into_iter()
        .map(|(name, n)| (name.to_string(), n))
        .collect())
}

/// [`gpu_resources`] borrowed from `spec`, sorted by name; the object named
/// only for an error.
fn pod_requests<'s>(
    spec: &'s PodSpec,
    object: impl Fn() -> String,
    path: &str,
) -> Result<Vec<(&'s str, u64)>, PlanError> {
    let mut total: BTreeMap<&str, u64> = BTreeMap::new();
    let init = spec.init_containers.as_deref().unwrap_or_default();
    for (list, containers) in [
        ("containers", &spec.containers[..]),
        ("initContainers", init),
    ] {
        for (i, c) in containers.iter().enumerate() {
            // A resource in both counts as its limit.
            let mut wants: Vec<(&str, u64)> = Vec::new();
            let resources = c.resources.as_ref();
            for (kind, quantities) in [
                ("limits", resources.and_then(|r| r.limits.as_ref())),
                ("requests", resources.and_then(|r| r.requests.as_ref())),
            ] {
                for (name, q) in quantities.into_iter().flatten() {
                    if !is_gpu_resource(name) || wants.iter().any(|(w, _)| w == name) {
                        continue;
                    }
                    let invalid = |message: String| PlanError::Invalid {
                        object: object(),
                        field: format!("{path}.{list}[{i}].resources.{kind}[{name}]"),
                        message,
                    };
                    let parsed = switchyard_dra::Quantity::parse(&q.0)
                        .map_err(|e| invalid(format!("{:?} is not a quantity: {e}", q.0)))?;
                    let n = parsed
                        .as_i64()
                        .and_then(|n| u64::try_from(n).ok())
                        .ok_or_else(|| {
                            invalid(format!("{:?} is not a whole number of devices", q.0))
                        })?;
                    wants.push((name, n));
                }
            }
            // Containers summed, init containers the largest.
            for (name, n) in wants {
                let entry = total.entry(name).or_default();
                *entry = if list == "containers" {
                    *entry + n
                } else {
                    (*entry).max(n)
                };
            }
        }
    }
    Ok(total.into_iter().filter(|(_, n)| *n > 0).collect())
}

/// A workload of the register with what planning needs, borrowed from the
/// snapshot.
#[derive(Clone, Debug)]
pub(crate) struct Workload<'a> {
    pub id: WorkloadRef<'a>,
    /// Index into [`Built::templates`]: what a pod requests, and where it
    /// may run.
    pub template: usize,
    pub replicas: u32,
    /// The node of every live pod (one entry a pod), sorted.
    pub pod_nodes: Vec<&'a str>,
    /// Runs on (or is bound to) the source group.
    pub on_source: bool,
    /// On the source group and in the namespace asked for: the plan moves it.
    pub in_plan: bool,
    /// Indices into [`Built::budgets`].
    pub budgets: Vec<usize>,
}

/// What placement reads of a workload's pods, borrowed from its pod
/// template (or pod). Workloads whose pods are alike share one: the plan
/// reads it once for all of them.
#[derive(Debug, PartialEq)]
pub(crate) struct Template<'a> {
    /// Device-plugin resources a pod requests, sorted by name.
    pub requests: Vec<(&'a str, u64)>,
    pub mode: Mode,
    pub node_selector: Option<&'a BTreeMap<String, String>>,
    /// The node affinity required during scheduling.
    pub affinity: Option<&'a NodeSelector>,
    pub tolerations: &'a [Toleration],
}

/// The templates, each once.
#[derive(Default)]
struct Templates<'a> {
    list: Vec<Template<'a>>,
    /// By what of them hashes: those that differ only in affinity or
    /// tolerations (which do not hash) share an entry.
    by_key: HashMap<TemplateKey<'a>, Vec<usize>>,
}

type TemplateKey<'a> = (
    Vec<(&'a str, u64)>,
    Mode,
    Option<&'a BTreeMap<String, String>>,
);

impl<'a> Templates<'a> {
    /// The index of `template`, added if it is new.
    fn index(&mut self, template: Template<'a>) -> usize {
        let key = (
            template.requests.clone(),
            template.mode,
            template.node_selector,
        );
        let alike = self.by_key.entry(key).or_default();
        if let Some(&i) = alike.iter().find(|&&i| self.list[i] == template) {
            return i;
        }
        alike.push(self.list.len());
        self.list.push(template);
        self.list.len() - 1
    }
}

pub(crate) struct Built<'a> {
    pub workloads: Vec<Workload<'a>>,
    pub templates: Vec<Template<'a>>,
    /// Budgets by `namespace/name`, with their allowance.
    pub budgets: Vec<(String, u32)>,
    /// The register's rows, sorted, still borrowed: [`Built::entries`] makes
    /// them (while the waves are planned from the rest).
    rows: Vec<Row<'a>>,
    /// The PhysicalGPUs of each node.
    pub cards: Cards<'a>,
    /// Each node's group and cards.
    nodes: HashMap<&'a str, NodeInfo<'a>>,
}

/// PhysicalGPUs by node name.
pub(crate) type Cards<'a> = HashMap<&'a str, Vec<&'a PhysicalGPU>>;

/// A row of the register, borrowed: what [`Built::entries`] copies out of
/// the snapshot for it.
struct Row<'a> {
    /// Index into [`Built::workloads`].
    workload: usize,
    meta: Meta<'a>,
    spec: Option<&'a PodSpec>,
    groups: Vec<&'a str>,
    budgets: Vec<Budget<'a>>,
}

/// A workload read, before the register is sorted.
struct Read<'a> {
    key: Key<'a>,
    /// Its row, if it is in the namespace asked for ([`Row::workload`] still 0).
    row: Option<Row<'a>>,
    /// [`Workload::budgets`] still empty.
    workload: Workload<'a>,
    /// Budgets selecting it by `namespace/name`, with their allowance.
    budgets: Vec<(String, u32)>,
}

impl<'a> Built<'a> {
    /// The register: a row for every workload of the namespace asked for,
    /// sorted by namespace, kind, name.
    pub fn entries(&self) -> Vec<RegisterEntry<'a>> {
        self.rows.iter().map(|row| self.entry(row)).collect()
    }

    fn entry(&self, row: &Row<'a>) -> RegisterEntry<'a> {
        let w = &self.workloads[row.workload];
        let t = &self.templates[w.template];
        let spec = row.spec;
        // The nodes, each once (the pods are sorted).
        let nodes: Vec<&str> = w
            .pod_nodes
            .chunk_by(|a, b| a == b)
            .map(|same| same[0])
            .collect();
        let mut models: Vec<GpuModel<'a>> = nodes
            .iter()
            .filter_map(|n| self.nodes.get(n))
            .flat_map(|n| n.models.iter().copied())
            .collect();
        models.sort_unstable();
        models.dedup();
        let (labelled, owned) = row.meta.parts();
        let managed_by = managers(labelled, owned);
        let owner = controller(owned)
            .filter(|o| !WORKLOAD_KINDS.contains(&o.kind.as_str()))
            .map(|o| OwnerRef {
                kind: &o.kind,
                name: &o.name,
            });
        RegisterEntry {
            namespace: w.id.namespace,
            kind: w.id.kind,
            name: w.id.name,
            owner,
            replicas: w.replicas,
            gpus_per_pod: t.requests.iter().copied().collect(),
            gpus_total: t.requests.iter().map(|(_, n)| n).sum::<u64>() * u64::from(w.replicas),
            mode: t.mode,
            node_selector: spec
                .and_then(|s| s.node_selector.as_ref())
                .into_iter()
                .flatten()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect(),
            affinity: spec.and_then(|s| s.affinity.as_ref()),
            tolerations: spec
                .and_then(|s| s.tolerations.as_deref())
                .unwrap_or_default(),
            nodes,
            groups: row.groups.clone(),
            gpu_models: models,
            pod_disruption_budgets: row.budgets.clone(),
            editable_in_place: managed_by.is_empty(),
            managed_by,
            in_plan: w.in_plan,
        }
    }
}

/// A workload as found, borrowed from the snapshot (the objects are large:
/// copying them is most of what the register would cost).
struct Found<'a> {
    meta: Meta<'a>,
    labels: Option<&'a BTreeMap<String, String>>,
    spec: Option<&'a PodSpec>,
    replicas: Option<u32>,
    pods: Vec<&'a str>,
    pod_count: u32,
    /// The object read, for errors: its kind and the name it is read under.
    object: (&'a str, &'a str),
    path: &'static str,
}

/// What the register says of a node: its group and its cards' models
/// (sorted, each once).
struct NodeInfo<'a> {
    group: Option<&'a str>,
    models: Vec<GpuModel<'a>>,
}

/// A workload's key while the register is built: namespace, kind, name (the
/// order of [`WorkloadRef`]).
type Key<'a> = (&'a str, &'a str, &'a str);

/// The metadata that says who manages a workload.
#[derive(Clone, Copy)]
enum Meta<'a> {
    /// Its controller's, or the pod's that is its own workload.
    Of(&'a ObjectMeta),
    /// A pod's that an operator controls: of it, only the owners (the
    /// operator is their manager).
    OwnersOf(&'a ObjectMeta),
}

impl<'a> Meta<'a> {
    /// The metadata whose labels and annotations count (none for a pod an
    /// operator controls), and the metadata whose owners count.
    fn parts(self) -> (Option<&'a ObjectMeta>, &'a ObjectMeta) {
        match self {
            Meta::Of(meta) => (Some(meta), meta),
            Meta::OwnersOf(pod) => (None, pod),
        }
    }
}

fn controller(meta: &ObjectMeta) -> Option<&OwnerReference> {
    meta.owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
}

fn workload_ref((namespace, kind, name): Key<'_>) -> WorkloadRef<'_> {
    WorkloadRef {
        namespace,
        kind,
        name,
    }
}

fn ns_name(meta: &ObjectMeta) -> (&str, &str) {
    (
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default(),
    )
}

fn live(pod: &Pod) -> bool {
    !matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

pub(crate) fn build<'a>(
    snapshot: &'a Snapshot,
    request: &PlanRequest,
) -> Result<Built<'a>, PlanError> {
    // Two threads: the nodes and the budgets are indexed while the workloads
    // are found; then both read the workloads.
    std::thread::scope(|scope| {
        let group_label = request.group_label();
        let indexed = scope.spawn(|| (node_info(snapshot, group_label), budget_index(snapshot)));
        let found = found(snapshot);
        let ((cards, nodes), budgets) = join(indexed);
        let groups: HashMap<&str, &NodeGroup> = snapshot
            .node_groups
            .iter()
            .filter_map(|g| Some((g.metadata.name.as_deref()?, g)))
            .collect();
        let reader = Reader {
            request,
            nodes: &nodes,
            groups: &groups,
            budgets: &budgets,
        };
        // In pieces, each thread taking the next: a thread that has to
        // fault in fresh pages does not hold the other up.
        let size = found.len().div_ceil(PIECES).max(1);
        let mut found = found.into_iter();
        let pieces: Vec<Vec<_>> = std::iter::from_fn(|| {
            let piece: Vec<_> = found.by_ref().take(size).collect();
            (!piece.is_empty()).then_some(piece)
        })
        .collect();
        let queue = Mutex::new(pieces.into_iter().enumerate());
        let take = || {
            let mut read = Vec::new();
            loop {
                let next = queue.lock().unwrap_or_else(PoisonError::into_inner).next();
                let Some((p, piece)) = next else {
                    return read;
                };
                read.push((p, reader.read(piece)));
            }
        };
        let mut read = std::thread::scope(|scope| {
            let other = scope.spawn(take);
            let mut read = take();
            read.extend(join(other));
            read
        });
        read.sort_unstable_by_key(|(p, _)| *p);
        assemble(
            read.into_iter().map(|(_, part)| part).collect(),
            cards,
            nodes,
        )
    })
}

/// A scoped thread's result, its panic resumed here.
pub(crate) fn join<T>(handle: std::thread::ScopedJoinHandle<'_, T>) -> T {
    handle
        .join()
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// Every workload of the snapshot with its live pods: in the order found
/// (the snapshot's: its objects are read in the order they were made).
fn found<'a>(snapshot: &'a Snapshot) -> Vec<(Key<'a>, Found<'a>)> {
    // Indexed while pods are matched to their workloads.
    let controllers = snapshot.deployments.len()
        + snapshot.replica_sets.len()
        + snapshot.stateful_sets.len()
        + snapshot.daemon_sets.len()
        + snapshot.jobs.len()
        + snapshot.cron_jobs.len();
    let mut finder = Finder {
        found: Vec::with_capacity(controllers),
        index: HashMap::with_capacity_and_hasher(controllers, Default::default()),
    };
    finder.add_controllers(snapshot);
    finder.add_pods(snapshot);
    finder.found
}

/// The workloads found so far, in the order found, and where each key is.
struct Finder<'a> {
    found: Vec<(Key<'a>, Found<'a>)>,
    index: HashMap<Key<'a>, usize>,
}

impl<'a> Finder<'a> {
    /// Adds a controller's workload; a later object of the same key replaces the earlier.
    fn add(
        &mut self,
        kind: &'static str,
        meta: &'a ObjectMeta,
        template: Option<&'a PodTemplateSpec>,
        replicas: Option<u32>,
        path: &'static str,
    ) {
        let (ns, name) = ns_name(meta);
        let key = (ns, kind, name);
        let workload = Found {
            object: (kind, name),
            meta: Meta::Of(meta),
            labels: template
                .and_then(|t| t.metadata.as_ref())
                .and_then(|m| m.labels.as_ref()),
            spec: template.and_then(|t| t.spec.as_ref()),
            replicas,
            pods: Vec::new(),
            pod_count: 0,
            path,
        };
        match self.index.get(&key) {
            Some(&i) => self.found[i].1 = workload,
            None => {
                self.index.insert(key, self.found.len());
                self.found.push((key, workload));
            }
        }
    }

    /// Controllers phase: adds the snapshot's workload controllers, kind by kind.
    fn add_controllers(&mut self, snapshot: &'a Snapshot) {
        let replicas = |r: Option<i32>| Some(r.unwrap_or(1).max(0) as u32);
        for d in &snapshot.deployments {
            let spec = d.spec.as_ref();
            self.add(
                "Deployment",
                &d.metadata,
                spec.map(|s| &s.template),
                replicas(spec.and_then(|s| s.replicas)),
                "spec.template.spec",
            );
        }
        for rs in &snapshot.replica_sets {
            if controller(&rs.metadata).is_some_and(|o| o.kind == "Deployment") {
                continue;
            }
            let spec = rs.spec.as_ref();
            self.add(
                "ReplicaSet",
                &rs.metadata,
                spec.and_then(|s| s.template.as_ref()),
                replicas(spec.and_then(|s| s.replicas)),
                "spec.template.spec",
            );
        }
        for s in &snapshot.stateful_sets {
            let spec = s.spec.as_ref();
            self.add(
                "StatefulSet",
                &s.metadata,
                spec.map(|s| &s.template),
                replicas(spec.and_then(|s| s.replicas)),
                "spec.template.spec",
            );
        }
        for d in &snapshot.daemon_sets {
            let desired = d
                .status
                .as_ref()
                .map(|s| s.desired_number_scheduled.max(0) as u32);
            self.add(
                "DaemonSet",
                &d.metadata,
                d.spec.as_ref().map(|s| &s.template),
                desired.filter(|n| *n > 0),
                "spec.template.spec",
            );
        }
        for j in &snapshot.jobs {
            if controller(&j.metadata).is_some_and(|o| o.kind == "CronJob") {
                continue;
            }
            let done = j
                .status
                .iter()
                .flat_map(|s| s.conditions.iter().flatten())
                .any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True");
            let spec = j.spec.as_ref();
            self.add(
                "Job",
                &j.metadata,
                spec.map(|s| &s.template),
                if done {
                    Some(0)
                } else {
                    replicas(spec.and_then(|s| s.parallelism))
                },
                "spec.template.spec",
            );
        }
        for c in &snapshot.cron_jobs {
            let job = c.spec.job_template.spec.as_ref();
            self.add(
                "CronJob",
                &c.metadata,
                job.map(|j| &j.template),
                replicas(job.and_then(|j| j.parallelism)),
                "spec.jobTemplate.spec.template.spec",
            );
        }
    }

    /// Pods phase: adds each live pod to its workload's count and nodes.
    fn add_pods(&mut self, snapshot: &'a Snapshot) {
        // Pods to their workloads: a ReplicaSet's to its Deployment, a Job's to
        // its CronJob; a pod without controller is its own workload, and so are
        // the pods an operator controls directly (by the owner).
        let rs_owner: HashMap<(&str, &str), &str> = snapshot
            .replica_sets
            .iter()
            .filter_map(|rs| {
                let o = controller(&rs.metadata).filter(|o| o.kind == "Deployment")?;
                Some((ns_name(&rs.metadata), o.name.as_str()))
            })
            .collect();
        let job_owner: HashMap<(&str, &str), &str> = snapshot
            .jobs
            .iter()
            .filter_map(|j| {
                let o = controller(&j.metadata).filter(|o| o.kind == "CronJob")?;
                Some((ns_name(&j.metadata), o.name.as_str()))
            })
            .collect();
        for pod in &snapshot.pods {
            if !live(pod) {
                continue;
            }
            let (_, pod_name) = ns_name(&pod.metadata);
            let id = self.workload_of(pod, &rs_owner, &job_owner);
            let found = &mut self.found;
            let i = *self.index.entry(id).or_insert_with(|| {
                found.push((
                    id,
                    Found {
                        object: ("Pod", pod_name),
                        meta: if id.1 == "Pod" {
                            Meta::Of(&pod.metadata)
                        } else {
                            Meta::OwnersOf(&pod.metadata)
                        },
                        labels: pod.metadata.labels.as_ref(),
                        spec: pod.spec.as_ref(),
                        replicas: None,
                        pods: Vec::new(),
                        pod_count: 0,
                        path: "spec",
                    },
                ));
                found.len() - 1
            });
            let entry = &mut found[i].1;
            entry.pod_count += 1;
            if let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
                entry.pods.push(node);
            }
        }
    }

    /// The key of the workload a live pod belongs to.
    fn workload_of(
        &self,
        pod: &'a Pod,
        rs_owner: &HashMap<(&'a str, &'a str), &'a str>,
        job_owner: &HashMap<(&'a str, &'a str), &'a str>,
    ) -> Key<'a> {
        let (ns, pod_name) = ns_name(&pod.metadata);
        match controller(&pod.metadata) {
            None => (ns, "Pod", pod_name),
            Some(o) => match o.kind.as_str() {
                "ReplicaSet" => match rs_owner.get(&(ns, o.name.as_str())) {
                    Some(d) => (ns, "Deployment", d),
                    None => {
                        let hash = pod
                            .metadata
                            .labels
                            .as_ref()
                            .and_then(|l| l.get("pod-template-hash"));
                        let deployment = hash.and_then(|h| {
                            o.name
                                .strip_suffix(h.as_str())
                                .and_then(|d| d.strip_suffix('-'))
                        });
                        match deployment {
                            Some(d) if self.index.contains_key(&(ns, "Deployment", d)) => {
                                (ns, "Deployment", d)
                            }
                            _ => (ns, "ReplicaSet", o.name.as_str()),
                        }
                    }
                },
                "Job" => match job_owner.get(&(ns, o.name.as_str())) {
                    Some(c) => (ns, "CronJob", c),
                    None => (ns, "Job", o.name.as_str()),
                },
                kind => (ns, kind, o.name.as_str()),
            },
        }
    }
}

/// PodDisruptionBudgets by namespace, indexed by their first matchLabels
/// pair (and those without matchLabels).
type BudgetIndex<'a> = HashMap<
    &'a str,
    (
        HashMap<(&'a str, &'a str), Vec<&'a PodDisruptionBudget>>,
        Vec<&'a PodDisruptionBudget>,
    ),
>;

fn budget_index(snapshot: &Snapshot) -> BudgetIndex<'_> {
    let mut budgets_by_ns: BudgetIndex<'_> = HashMap::default();
    for b in &snapshot.pod_disruption_budgets {
        let (by_label, others) = budgets_by_ns
            .entry(b.metadata.namespace.as_deref().unwrap_or_default())
            .or_default();
        let first = b
            .spec
            .as_ref()
            .and_then(|s| s.selector.as_ref())
            .and_then(|s| s.match_labels.as_ref())
            .and_then(|l| l.iter().next());
        match first {
            Some((k, v)) => by_label
                .entry((k.as_str(), v.as_str()))
                .or_default()
                .push(b),
            None => others.push(b),
        }
    }

    budgets_by_ns
}

/// What reading a workload looks up.
struct Reader<'r, 'a> {
    request: &'r PlanRequest,
    nodes: &'r HashMap<&'a str, NodeInfo<'a>>,
    groups: &'r HashMap<&'a str, &'a NodeGroup>,
    budgets: &'r BudgetIndex<'a>,
}

/// Workloads read in one piece: sorted by key, with the templates they
/// index and the first invalid one by key.
struct Part<'a> {
    read: Vec<Option<Read<'a>>>,
    order: Vec<(Key<'a>, usize)>,
    templates: Templates<'a>,
    invalid: Option<(Key<'a>, PlanError)>,
}

impl<'a> Reader<'_, 'a> {
    fn read(&self, found: Vec<(Key<'a>, Found<'a>)>) -> Part<'a> {
        let mut templates = Templates::default();
        let mut read: Vec<Option<Read<'a>>> = Vec::with_capacity(found.len());
        let mut invalid: Option<(Key<'a>, PlanError)> = None;
        let empty_labels = BTreeMap::new();
        for (key, mut f) in found {
            let (kind, name) = f.object;
            let object = || format!("{kind} {}/{name}", key.0);
            let requests = f.spec.map(|spec| pod_requests(spec, object, f.path));
            let requests = match requests.transpose() {
                Ok(requests) => requests.unwrap_or_default(),
                // The first by key is the error, as if read in that order.
                Err(e) => {
                    if invalid.as_ref().is_none_or(|(first, _)| key < *first) {
                        invalid = Some((key, e));
                    }
                    continue;
                }
            };
            if requests.is_empty() {
                continue;
            }
            let id = workload_ref(key);
            let replicas = f.replicas.unwrap_or(f.pod_count);
            f.pods.sort_unstable();
            let template_labels = f.labels.unwrap_or(&empty_labels);

            let groups_of = self.groups_of(&f);
            let mode = self.mode(&groups_of, &requests);
            let (budgets, entry_budgets) = self.budgets_of(id.namespace, template_labels, replicas);

            let namespace_ok = self
                .request
                .namespace
                .as_deref()
                .is_none_or(|ns| ns == id.namespace);
            let on_source = groups_of.contains(&self.request.from.as_str());
            let in_plan = on_source && namespace_ok;
            let row = namespace_ok.then_some(Row {
                workload: 0,
                meta: f.meta,
                spec: f.spec,
                groups: groups_of,
                budgets: entry_budgets,
            });
            let template = templates.index(Template {
                requests,
                mode,
                node_selector: f.spec.and_then(|s| s.node_selector.as_ref()),
                affinity: f
                    .spec
                    .and_then(|s| s.affinity.as_ref())
                    .and_then(|a| a.node_affinity.as_ref())
                    .and_then(|a| {
                        a.required_during_scheduling_ignored_during_execution
                            .as_ref()
                    }),
                tolerations: f
                    .spec
                    .and_then(|s| s.tolerations.as_deref())
                    .unwrap_or_default(),
            });
            read.push(Some(Read {
                key,
                row,
                workload: Workload {
                    id,
                    template,
                    replicas,
                    pod_nodes: f.pods,
                    on_source,
                    in_plan,
                    budgets: Vec::new(),
                },
                budgets,
            }));
        }

        let mut order: Vec<(Key<'a>, usize)> = read
            .iter()
            .enumerate()
            .filter_map(|(i, r)| Some((r.as_ref()?.key, i)))
            .collect();
        order.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        Part {
            read,
            order,
            templates,
            invalid,
        }
    }

    /// Groups phase: the groups a workload is on, by its pods' nodes and its node selector.
    fn groups_of(&self, f: &Found<'a>) -> Vec<&'a str> {
        // A set, sorted and deduplicated once (most have one member).
        let mut groups_of: Vec<&str> = Vec::new();
        for node in f.pods.chunk_by(|a, b| a == b).map(|same| same[0]) {
            groups_of.extend(self.nodes.get(node).and_then(|n| n.group));
        }
        groups_of.extend(
            f.spec
                .and_then(|s| s.node_selector.as_ref())
                .and_then(|s| s.get(self.request.group_label()))
                .map(String::as_str),
        );
        groups_of.sort_unstable();
        groups_of.dedup();
        groups_of
    }

    /// Sharing phase: how a workload shares its cards, by its groups and its requests.
    fn mode(&self, groups_of: &[&str], requests: &[(&str, u64)]) -> Mode {
        let group_sharing = groups_of.iter().filter_map(|g| {
            self.groups
                .get(g)
                .and_then(|g| g.spec.gpu.as_ref())
                .map(|gpu| gpu.sharing)
        });
        let mut mode = Mode::Exclusive;
        for sharing in group_sharing {
            match sharing {
                GpuSharing::TimeSlicing => mode = mode.max(Mode::TimeSliced),
                GpuSharing::Mig => mode = mode.max(Mode::Mig),
                GpuSharing::Exclusive => {}
            }
        }
        if requests
            .iter()
            .any(|(r, _)| r.starts_with(NVIDIA_MIG_PREFIX))
        {
            mode = Mode::Mig;
        } else if requests.iter().any(|(r, _)| *r == NVIDIA_GPU_SHARED) {
            mode = Mode::Shared;
        }
        mode
    }

    /// Budgets phase: the budgets selecting a workload's pods, with their allowances.
    fn budgets_of(
        &self,
        namespace: &str,
        template_labels: &BTreeMap<String, String>,
        replicas: u32,
    ) -> (Vec<(String, u32)>, Vec<Budget<'a>>) {
        let mut budgets = Vec::new();
        let mut entry_budgets = Vec::new();
        // Candidates: budgets keyed by one of the template's labels, and
        // those without matchLabels; each is then matched in full.
        let mut candidates: Vec<&PodDisruptionBudget> = Vec::new();
        if let Some((by_label, others)) = self.budgets.get(namespace) {
            for (k, v) in template_labels {
                if let Some(list) = by_label.get(&(k.as_str(), v.as_str())) {
                    candidates.extend(list.iter().copied());
                }
            }
            candidates.extend(others.iter().copied());
        }
        candidates.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        candidates.dedup_by(|a, b| a.metadata.name == b.metadata.name);
        for b in candidates {
            let selects = b
                .spec
                .as_ref()
                .and_then(|s| s.selector.as_ref())
                .is_some_and(|s| label_selector_matches(s, template_labels));
            if !selects {
                continue;
            }
            let budget = budget(b, replicas);
            budgets.push((
                format!("{namespace}/{}", budget.name),
                budget.disruptions_allowed,
            ));
            entry_budgets.push(budget);
        }
        (budgets, entry_budgets)
    }
}

/// The pieces' workloads merged in key order (as one thread reading them all
/// in order would have them, templates numbered alike), budgets indexed in
/// that order.
fn assemble<'a>(
    pieces: Vec<Part<'a>>,
    cards: Cards<'a>,
    nodes: HashMap<&'a str, NodeInfo<'a>>,
) -> Result<Built<'a>, PlanError> {
    let mut templates = Templates::default();
    let mut invalid: Option<(Key<'a>, PlanError)> = None;
    let mut reads = Vec::with_capacity(pieces.len());
    let mut renumbered = Vec::with_capacity(pieces.len());
    let mut next = BinaryHeap::new();
    let mut count = 0;
    for (p, piece) in pieces.into_iter().enumerate() {
        if let Some((key, e)) = piece.invalid
            && invalid.as_ref().is_none_or(|(first, _)| key < *first)
        {
            invalid = Some((key, e));
        }
        let renumber: Vec<usize> = piece
            .templates
            .list
            .into_iter()
            .map(|t| templates.index(t))
            .collect();
        count += piece.order.len();
        let mut order = piece.order.into_iter();
        if let Some((key, i)) = order.next() {
            next.push(Reverse((key, p, i)));
        }
        reads.push((piece.read, order));
        renumbered.push(renumber);
    }
    if let Some((_, e)) = invalid {
        return Err(e);
    }
    let mut built = Built {
        workloads: Vec::with_capacity(count),
        templates: templates.list,
        budgets: Vec::new(),
        rows: Vec::with_capacity(count),
        cards,
        nodes,
    };
    let mut budget_index: BTreeMap<String, usize> = BTreeMap::new();
    // The next by key of any piece (the keys are distinct).
    while let Some(Reverse((_, p, i))) = next.pop() {
        let (read, order) = &mut reads[p];
        let Read {
            row,
            mut workload,
            budgets,
            ..
        } = read[i].take().expect("each read once");
        if let Some((key, i)) = order.next() {
            next.push(Reverse((key, p, i)));
        }
        workload.template = renumbered[p][workload.template];
        for (name, allowed) in budgets {
            let index = match budget_index.get(&name) {
                Some(&index) => index,
                None => {
                    budget_index.insert(name.clone(), built.budgets.len());
                    built.budgets.push((name, allowed));
                    built.budgets.len() - 1
                }
            };
            workload.budgets.push(index);
        }
        built.rows.extend(row.map(|row| Row {
            workload: built.workloads.len(),
            ..row
        }));
        built.workloads.push(workload);
    }
    Ok(built)
}

/// The PhysicalGPUs of each node, and each node's group and cards' models,
/// read once (a node runs many workloads).
fn node_info<'a>(
    snapshot: &'a Snapshot,
    group_label: &str,
) -> (Cards<'a>, HashMap<&'a str, NodeInfo<'a>>) {
    let mut gpus_by_node: Cards<'_> = HashMap::default();
    for g in &snapshot.physical_gpus {
        gpus_by_node
            .entry(g.spec.node.as_str())
            .or_default()
            .push(g);
    }
    let mut nodes: HashMap<&str, NodeInfo<'_>> =
        HashMap::with_capacity_and_hasher(snapshot.nodes.len(), Default::default());
    for n in &snapshot.nodes {
        let Some(name) = n.metadata.name.as_deref() else {
            continue;
        };
        let labels = n.metadata.labels.as_ref();
        let models: Vec<GpuModel<'_>> = match gpus_by_node.get(name) {
            Some(cards) => {
                // A node's cards are mostly of one model: made once each.
                let distinct: BTreeSet<(&str, Option<u64>)> = cards
                    .iter()
                    .map(|c| {
                        let memory = c.status.as_ref().and_then(|s| s.capabilities.as_ref());
                        (c.spec.product.as_str(), memory.map(|c| c.memory_mib))
                    })
                    .collect();
                distinct
                    .into_iter()
                    .map(|(product, memory_mib)| GpuModel {
                        product,
                        memory_mib,
                        source: "PhysicalGPU",
                    })
                    .collect()
            }
            None => labels
                .and_then(|l| l.get(PRODUCT_LABEL))
                .map(|product| GpuModel {
                    product,
                    memory_mib: labels
                        .and_then(|l| l.get(MEMORY_LABEL))
                        .and_then(|m| m.parse().ok()),
                    source: "NFD",
                })
                .into_iter()
                .collect(),
        };
        let group = labels.and_then(|l| l.get(group_label)).map(String::as_str);
        nodes.insert(name, NodeInfo { group, models });
    }
    (gpus_by_node, nodes)
}

/// Who else writes a workload's manifest.
/// Labels and annotations are read from `labelled`, the controller from
/// `owned`.
fn managers<'a>(labelled: Option<&'a ObjectMeta>, owned: &'a ObjectMeta) -> Vec<Manager<'a>> {
    static EMPTY: BTreeMap<String, String> = BTreeMap::new();
    let labels = labelled.and_then(|m| m.labels.as_ref()).unwrap_or(&EMPTY);
    let annotations = labelled
        .and_then(|m| m.annotations.as_ref())
        .unwrap_or(&EMPTY);
    let mut out = Vec::new();
    let release = annotations.get("meta.helm.sh/release-name");
    if release.is_some()
        || labels
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str)
            == Some("Helm")
    {
        let name = release
            .or_else(|| labels.get("app.kubernetes.io/instance"))
            .map_or("", String::as_str);
        out.push(Manager {
            kind: "Helm",
            name: Cow::Borrowed(name),
        });
    }
    if let Some(app) = labels.get("argocd.argoproj.io/instance") {
        out.push(Manager {
            kind: "ArgoCD",
            name: Cow::Borrowed(app),
        });
    } else if let Some(id) = annotations.get("argocd.argoproj.io/tracking-id") {
        out.push(Manager {
            kind: "ArgoCD",
            name: Cow::Borrowed(id.split(':').next().unwrap_or_default()),
        });
    }
    for (prefix, kind) in [
        ("kustomize.toolkit.fluxcd.io", "Kustomization"),
        ("helm.toolkit.fluxcd.io", "HelmRelease"),
    ] {
        let any = labels
            .keys()
            .any(|k| k.strip_prefix(prefix).is_some_and(|k| k.starts_with('/')));
        if any {
            let name = labels.get(&format!("{prefix}/name"));
            let namespace = labels.get(&format!("{prefix}/namespace"));
            let name = match (namespace, name) {
                (Some(ns), Some(n)) => format!("{kind} {ns}/{n}"),
                (None, Some(n)) => format!("{kind} {n}"),
                _ => kind.to_string(),
            };
            out.push(Manager {
                kind: "Flux",
                name: Cow::Owned(name),
            });
        }
    }
    if let Some(o) = controller(owned).filter(|o| !WORKLOAD_KINDS.contains(&o.kind.as_str())) {
        out.push(Manager {
            kind: "Operator",
            name: Cow::Owned(format!("{}/{}", o.kind, o.name)),
        });
    }
    out.sort_unstable();
    out.dedup();
    out
}

/// `metav1.LabelSelector` semantics: every matchLabels pair and every
/// expression must hold; an empty selector selects everything.
pub(crate) fn label_selector_matches(s: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let pairs = s
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    pairs
        && s.match_expressions.iter().flatten().all(|e| {
            let values = e.values.as_deref().unwrap_or_default();
            let value = labels.get(&e.key);
            match e.operator.as_str() {
                "In" => value.is_some_and(|v| values.contains(v)),
                "NotIn" => value.is_none_or(|v| !values.contains(v)),
                "Exists" => value.is_some(),
                "DoesNotExist" => value.is_none(),
                _ => false,
            }
        })
}

fn percent_of(value: &IntOrString, total: u32) -> Option<u32> {
    match value {
        IntOrString::Int(n) => Some((*n).max(0) as u32),
        IntOrString::String(s) => {
            let p: u64 = s.strip_suffix('%')?.parse().ok()?;
            Some((p * u64::from(total)).div_ceil(100) as u32)
        }
    }
}

fn text(value: &IntOrString) -> Cow<'_, str> {
    match value {
        IntOrString::Int(n) => Cow::Owned(n.to_string()),
        IntOrString::String(s) => Cow::Borrowed(s),
    }
}

fn budget(b: &PodDisruptionBudget, replicas: u32) -> Budget<'_> {
    let spec = b.spec.as_ref();
    let min = spec.and_then(|s| s.min_available.as_ref());
    let max = spec.and_then(|s| s.max_unavailable.as_ref());
    // The disruption controller's figure when it has computed one.
    let observed = b
        .status
        .as_ref()
        .filter(|s| s.observed_generation.is_some())
        .map(|s| s.disruptions_allowed.unwrap_or(0).max(0) as u32);
    let computed = match (max, min) {
        (Some(max), _) => percent_of(max, replicas).unwrap_or(0),
        (None, Some(min)) => replicas.saturating_sub(percent_of(min, replicas).unwrap_or(replicas)),
        (None, None) => 0,
    };
    Budget {
        name: b.metadata.name.as_deref().unwrap_or_default(),
        min_available: min.map(text),
        max_unavailable: max.map(text),
        disruptions_allowed: observed.unwrap_or(computed),
    }
}

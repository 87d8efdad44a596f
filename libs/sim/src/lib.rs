//! A deterministic in-memory cluster for `switchyard demo`, tests and load tests.
//!
//! It plays the platform around Switchyard: it executes the cores' [`Effect`]s
//! (cordon, drain with evictions that controllers answer with new pods, group
//! moves, stack labels, manifest rewrites, restarts, quotas) and reports what
//! changed as fact events. Node preparation after a stack change takes a while
//! (seeded jitter on a simulated clock): PhysicalGPUs go Pending, the other
//! stack's pods go away, then `node.deckhouse.io/gpu-setup-complete` appears and
//! the new stack's pods run. Pods are scheduled the way each stack allows:
//! `nvidia.com/gpu` by count on device-plugin nodes, a GPU class's extended
//! resource by count on prepared DRA nodes with one allocated claim per pod.
//! No wall clock, no global randomness, ordered maps: the same seed and the same
//! effects give the same facts.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;

use switchyard_core::cluster::{ObjectKey, WorkloadKey, workload_key};
use switchyard_core::effects::Effect;
use switchyard_core::names::{
    CLASS_RESOURCE_PREFIX, CONTROL_PLANE_LABEL, DEVICE_GPU_CONFIG_LABEL, GPU_DEVICE_LABEL,
    GPU_SETUP_COMPLETE_LABEL, GPU_STACK_LABEL, GROUP_LABEL, MODULE_NAMESPACE, NODE_AGENT_APP,
    NODE_ROLE_PREFIX, NVIDIA_GPU, PREPARATION_LABELS, STACK_DEVICE_PLUGIN, STACK_DRA,
    VENDOR_ADAPTER_APP,
};
use switchyard_proto::v1::{
    DomainEvent, GpuClassObserved, GpuPhase, GpuSharing, GpuSpec, LabelSelector,
    ModuleSettingsObserved, NodeGroupObserved, NodeObserved, NodeProvisioning, PhysicalGpuObserved,
    PodObserved, PodPhase, PodRemoved, ResourceList, ResourceQuotaObserved, Taint,
    WorkloadObserved, WorkloadPlacement, WorkloadRef, domain_event::Kind,
};

pub const SECOND: i64 = 1_000_000_000;

/// The device-plugin DaemonSet's `app` label.
pub const DEVICE_PLUGIN_APP: &str = "nvidia-device-plugin";
/// The card of every simulated GPU.
pub const GPU_DEVICE: &str = "a100-sxm4-40gb";
pub const GPU_PRODUCT: &str = "NVIDIA-A100-SXM4-40GB";
/// The cards of the legacy group, which DRA served before the upgrade.
pub const LEGACY_GPU_DEVICE: &str = "h100-sxm5-80gb";
pub const LEGACY_GPU_PRODUCT: &str = "NVIDIA-H100-SXM5-80GB";
/// The group with spec.gpu that DRA served before the upgrade (held on DRA).
pub const LEGACY_GROUP: &str = "gpu-legacy";

/// How the simulated cluster looks and behaves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimConfig {
    pub seed: u64,
    /// Nodes of the source group `gpu` (spec.gpu, device plugin).
    pub gpu_nodes: usize,
    pub gpus_per_node: u32,
    /// Deployments requesting `nvidia.com/gpu`, bound to the source group.
    pub workloads: usize,
    /// Node preparation after a stack change: this long, plus up to half again.
    pub prep_delay: i64,
    /// Simulated time at the start.
    pub start: i64,
    /// The cluster ran the previous module version with `dra.enabled: true`:
    /// the group `gpu-legacy` (spec.gpu, served by DRA back then) is held on
    /// DRA on the first run, and DRA is already on. Otherwise DRA is off until
    /// Step 1 turns it on.
    pub upgraded_with_dra: bool,
    /// Nodes of `gpu-legacy` (with `upgraded_with_dra`).
    pub legacy_nodes: usize,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            seed: 1,
            gpu_nodes: 4,
            gpus_per_node: 8,
            workloads: 6,
            prep_delay: 40 * SECOND,
            start: 1_764_000_000 * SECOND,
            upgraded_with_dra: true,
            legacy_nodes: 1,
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
struct SimNode {
    labels: BTreeMap<String, String>,
    taints: Vec<Taint>,
    unschedulable: bool,
    gpus: u32,
    /// The `gpu.deckhouse.io/device` value of its cards.
    device: String,
    /// Bumped on every stack change, so a stale preparation timer does nothing.
    generation: u64,
}

#[derive(Clone, Debug, PartialEq)]
struct SimPod {
    node: String,
    owner: WorkloadRef,
    phase: PodPhase,
    app: String,
    claims_needed: u32,
    claims_allocated: u32,
    /// GPUs the pod holds on its node.
    gpus: u32,
}

#[derive(Clone, Debug, PartialEq)]
struct SimWorkload {
    replicas: u32,
    placement: WorkloadPlacement,
    restarted_at: String,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    PrepareNode { node: String, generation: u64 },
}

/// The simulated cluster.
#[derive(Clone, Debug)]
pub struct Simulator {
    config: SimConfig,
    now: i64,
    rng: u64,
    nodes: BTreeMap<String, SimNode>,
    groups: BTreeMap<String, Option<GpuSpec>>,
    module: ModuleSettingsObserved,
    pods: BTreeMap<ObjectKey, SimPod>,
    workloads: BTreeMap<WorkloadKey, SimWorkload>,
    gpus: BTreeMap<String, (String, GpuPhase)>,
    quotas: BTreeMap<ObjectKey, BTreeMap<String, String>>,
    /// GPUClass -> the DeviceClasses in its status.
    classes: BTreeMap<String, Vec<String>>,
    /// GPUClass -> its spec, as reported.
    class_specs: BTreeMap<String, GpuClassObserved>,
    timers: BTreeMap<(i64, u64), Timer>,
    timer_seq: u64,
    pod_seq: u64,
    out: Vec<DomainEvent>,
}

/// A node effect as Switchyard's writers carry it out (see `switchyard-kube`'s edge).
fn write_node(n: &mut SimNode, effect: &Effect) {
    match effect {
        Effect::Cordon { .. } => n.unschedulable = true,
        Effect::Uncordon { .. } => n.unschedulable = false,
        Effect::MoveToGroup {
            group, from_group, ..
        } => {
            n.labels.insert(GROUP_LABEL.into(), group.clone());
            n.labels.remove(&format!("{NODE_ROLE_PREFIX}{from_group}"));
        }
        Effect::RestoreNode { labels, taints, .. } => {
            let kept: Vec<(String, String)> = PREPARATION_LABELS
                .iter()
                .filter_map(|k| n.labels.get(*k).map(|v| (k.to_string(), v.clone())))
                .collect();
            n.labels = labels
                .iter()
                .filter(|(k, _)| !PREPARATION_LABELS.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            n.labels.extend(kept);
            n.taints = taints.clone();
        }
        Effect::RemoveNodeLabels { labels, .. } => {
            for label in labels {
                n.labels.remove(label);
            }
        }
        Effect::SetStackLabel { stack, .. } => {
            match stack {
                Some(stack) => n.labels.insert(GPU_STACK_LABEL.into(), stack.clone()),
                None => n.labels.remove(GPU_STACK_LABEL),
            };
        }
        _ => {}
    }
}

fn ev(kind: Kind) -> DomainEvent {
    DomainEvent { kind: Some(kind) }
}

/// GPUs a placement asks for per pod, and the GPU class if through DRA.
fn gpu_request(placement: &WorkloadPlacement) -> (u32, Option<String>) {
    let mut count = 0;
    let mut class = None;
    for list in placement.container_limits.values() {
        for (name, quantity) in &list.quantities {
            let n: u32 = quantity.parse().unwrap_or(0);
            if name == NVIDIA_GPU {
                count += n;
            } else if let Some(c) = name.strip_prefix(CLASS_RESOURCE_PREFIX) {
                count += n;
                class = Some(c.to_string());
            }
        }
    }
    (count, class)
}

/// Whether a GPU class selects a card: the demo's classes are named after the
/// card model their selector matches (`a100` selects `a100-sxm4-40gb`).
fn class_selects(class: &str, device: &str) -> bool {
    device.starts_with(class)
}

impl Simulator {
    /// The cluster of the reference scenario before the migration: a control
    /// plane, the group `gpu` with spec.gpu on the device plugin, and workloads
    /// requesting `nvidia.com/gpu` bound to it. Returns the simulator; its
    /// initial facts are waiting in [`Simulator::take_facts`].
    pub fn new(config: SimConfig) -> Self {
        let mut sim = Simulator {
            now: config.start,
            rng: config.seed ^ 0x9E37_79B9_7F4A_7C15,
            config: config.clone(),
            nodes: BTreeMap::new(),
            groups: BTreeMap::new(),
            module: ModuleSettingsObserved {
                dra_enabled: config.upgraded_with_dra,
                feature_gates_ready: true,
                module_version: "2.0.0".into(),
                previous_module_version: "1.9.0".into(),
            },
            pods: BTreeMap::new(),
            workloads: BTreeMap::new(),
            gpus: BTreeMap::new(),
            quotas: BTreeMap::new(),
            classes: BTreeMap::new(),
            class_specs: BTreeMap::new(),
            timers: BTreeMap::new(),
            timer_seq: 0,
            pod_seq: 0,
            out: Vec::new(),
        };
        sim.set_group("master", None);
        let master = SimNode {
            labels: [
                (GROUP_LABEL.to_string(), "master".to_string()),
                (CONTROL_PLANE_LABEL.to_string(), String::new()),
                (format!("{NODE_ROLE_PREFIX}master"), String::new()),
            ]
            .into(),
            taints: vec![Taint {
                key: CONTROL_PLANE_LABEL.into(),
                value: String::new(),
                effect: "NoSchedule".into(),
            }],
            ..SimNode::default()
        };
        sim.nodes.insert("master-0".into(), master);
        sim.report_node("master-0");
        if config.upgraded_with_dra {
            // DRA served this group before the upgrade, spec.gpu notwithstanding.
            sim.set_group(
                LEGACY_GROUP,
                Some(GpuSpec {
                    sharing: GpuSharing::Exclusive as i32,
                    ..Default::default()
                }),
            );
            for i in 0..config.legacy_nodes {
                let name = format!("legacy-{i}");
                let node = SimNode {
                    labels: [
                        (GROUP_LABEL.to_string(), LEGACY_GROUP.to_string()),
                        (format!("{NODE_ROLE_PREFIX}{LEGACY_GROUP}"), String::new()),
                        (GPU_STACK_LABEL.to_string(), STACK_DRA.to_string()),
                        (GPU_SETUP_COMPLETE_LABEL.to_string(), String::new()),
                    ]
                    .into(),
                    gpus: 2,
                    device: LEGACY_GPU_DEVICE.into(),
                    ..SimNode::default()
                };
                sim.nodes.insert(name.clone(), node);
                sim.report_node(&name);
                for g in 0..2 {
                    sim.set_gpu(&format!("{name}-gpu-{g}"), &name, GpuPhase::Ready);
                }
                sim.start_daemon(&name, NODE_AGENT_APP);
                sim.start_daemon(&name, VENDOR_ADAPTER_APP);
            }
        }
        // The first run of this module version sees its settings now.
        sim.out
            .push(ev(Kind::ModuleSettingsObserved(sim.module.clone())));
        // The source group was created after the upgrade: it is not held.
        sim.set_group(
            "gpu",
            Some(GpuSpec {
                sharing: GpuSharing::Exclusive as i32,
                ..Default::default()
            }),
        );
        for i in 0..config.gpu_nodes {
            let name = format!("gpu-{i}");
            let node = SimNode {
                labels: [
                    (GROUP_LABEL.to_string(), "gpu".to_string()),
                    (format!("{NODE_ROLE_PREFIX}gpu"), String::new()),
                    (GPU_STACK_LABEL.to_string(), STACK_DEVICE_PLUGIN.to_string()),
                    (GPU_SETUP_COMPLETE_LABEL.to_string(), String::new()),
                    (DEVICE_GPU_CONFIG_LABEL.to_string(), "default".to_string()),
                    (
                        "nvidia.com/gpu.product".to_string(),
                        GPU_PRODUCT.to_string(),
                    ),
                    (
                        "nvidia.com/gpu.count".to_string(),
                        config.gpus_per_node.to_string(),
                    ),
                ]
                .into(),
                gpus: config.gpus_per_node,
                device: GPU_DEVICE.into(),
                ..SimNode::default()
            };
            sim.nodes.insert(name.clone(), node);
            sim.report_node(&name);
            for g in 0..config.gpus_per_node {
                sim.set_gpu(&format!("{name}-gpu-{g}"), &name, GpuPhase::Ready);
            }
            sim.start_daemon(&name, NODE_AGENT_APP);
            sim.start_daemon(&name, DEVICE_PLUGIN_APP);
        }
        // Workloads fill at most all but one node, so one node can always be drained.
        let capacity = config.gpus_per_node * config.gpu_nodes.saturating_sub(1) as u32;
        let mut demand = 0;
        for i in 0..config.workloads {
            let replicas = 1 + (sim.random() % 2) as u32;
            // A pod must fit on one node.
            let per_pod = (1 + (sim.random() % 2) as u32).min(config.gpus_per_node);
            if demand + replicas * per_pod > capacity {
                break;
            }
            demand += replicas * per_pod;
            let placement = WorkloadPlacement {
                container_limits: [(
                    "main".to_string(),
                    ResourceList {
                        quantities: [
                            (NVIDIA_GPU.to_string(), per_pod.to_string()),
                            ("cpu".to_string(), "4".to_string()),
                        ]
                        .into(),
                    },
                )]
                .into(),
                container_requests: BTreeMap::new(),
                node_selector: [(GROUP_LABEL.to_string(), "gpu".to_string())].into(),
            };
            let workload = WorkloadRef {
                namespace: "ml".into(),
                kind: "Deployment".into(),
                name: format!("train-{i}"),
            };
            sim.workloads.insert(
                workload_key(&workload),
                SimWorkload {
                    replicas,
                    placement,
                    restarted_at: String::new(),
                },
            );
            sim.report_workload(&workload);
            for _ in 0..replicas {
                sim.create_pod(&workload);
            }
        }
        sim.set_quota(
            "ml",
            "gpu-quota",
            [("requests.nvidia.com/gpu", "64"), ("pods", "100")],
        );
        sim.schedule();
        sim
    }

    pub fn config(&self) -> &SimConfig {
        &self.config
    }

    pub fn now(&self) -> i64 {
        self.now
    }

    /// The facts reported since the last call.
    pub fn take_facts(&mut self) -> Vec<DomainEvent> {
        std::mem::take(&mut self.out)
    }

    /// When the next scheduled happening is due.
    pub fn next_timer(&self) -> Option<i64> {
        self.timers.keys().next().map(|(at, _)| *at)
    }

    /// Moves the clock to `to`, firing what is due on the way.
    pub fn advance_to(&mut self, to: i64) {
        while let Some((&(at, seq), _)) = self.timers.iter().next() {
            if at > to {
                break;
            }
            let timer = self.timers.remove(&(at, seq)).expect("present");
            self.now = at;
            self.fire(timer);
        }
        self.now = self.now.max(to);
    }

    fn random(&mut self) -> u64 {
        // splitmix64: the simulator's only source of variety, seeded.
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    // ------------------------------------------------------------ operator actions

    /// `kubectl apply` of a NodeGroup.
    pub fn set_group(&mut self, name: &str, gpu: Option<GpuSpec>) {
        self.groups.insert(name.to_string(), gpu.clone());
        self.out.push(ev(Kind::NodeGroupObserved(NodeGroupObserved {
            group: name.into(),
            node_type: "Static".into(),
            gpu,
            ..Default::default()
        })));
    }

    /// The gpu ModuleConfig's `dra.enabled`.
    pub fn set_dra_enabled(&mut self, enabled: bool) {
        self.module.dra_enabled = enabled;
        self.out
            .push(ev(Kind::ModuleSettingsObserved(self.module.clone())));
    }

    /// `kubectl apply` of a GPUClass; its status is empty until the
    /// class-compiler publishes the DeviceClasses.
    pub fn create_gpu_class(&mut self, name: &str) {
        self.classes.insert(name.into(), Vec::new());
        // The demo's classes select the card model they are named after.
        let device = [GPU_DEVICE, LEGACY_GPU_DEVICE]
            .into_iter()
            .find(|d| class_selects(name, d))
            .unwrap_or(name);
        let class = GpuClassObserved {
            name: name.into(),
            selector: Some(LabelSelector {
                match_labels: [(GPU_DEVICE_LABEL.to_string(), device.to_string())].into(),
                match_expressions: Vec::new(),
            }),
            generation: 1,
            ..GpuClassObserved::default()
        };
        self.class_specs.insert(name.to_string(), class.clone());
        self.out.push(ev(Kind::GpuClassObserved(class)));
    }

    /// `kubectl apply` of a Deployment.
    pub fn add_workload(
        &mut self,
        workload: &WorkloadRef,
        replicas: u32,
        placement: WorkloadPlacement,
    ) {
        self.workloads.insert(
            workload_key(workload),
            SimWorkload {
                replicas,
                placement,
                restarted_at: String::new(),
            },
        );
        self.report_workload(workload);
        for _ in 0..replicas {
            self.create_pod(workload);
        }
        self.schedule();
    }

    fn set_quota<const N: usize>(&mut self, namespace: &str, name: &str, hard: [(&str, &str); N]) {
        let hard: BTreeMap<String, String> = hard
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self.quotas
            .insert((namespace.into(), name.into()), hard.clone());
        self.out
            .push(ev(Kind::ResourceQuotaObserved(ResourceQuotaObserved {
                namespace: namespace.into(),
                name: name.into(),
                hard,
            })));
    }

    // ------------------------------------------------------------ effects

    /// Carries out one effect. Effects are idempotent: repeating one changes
    /// nothing. The part Switchyard's writers do is [`Simulator::write`] — the
    /// Kubernetes edge does the same, which a parity test on a real API server
    /// checks; the platform's answer to it (node-manager's role label, node
    /// preparation after a stack change, controllers replacing evicted pods)
    /// follows here.
    pub fn execute(&mut self, effect: &Effect) {
        match effect {
            Effect::Cordon { node }
            | Effect::Uncordon { node }
            | Effect::MoveToGroup { node, .. }
            | Effect::RestoreNode { node, .. }
            | Effect::RemoveNodeLabels { node, .. }
            | Effect::SetStackLabel { node, .. } => {
                let Some(before) = self.nodes.get(node).cloned() else {
                    return;
                };
                self.write(effect);
                let restacked = self.react(effect, &before);
                if self.nodes[node] != before {
                    self.report_node(node);
                }
                if restacked {
                    self.prepare(node);
                }
            }
            Effect::Drain { node } => {
                for owner in self.evict(node) {
                    // The Deployment controller replaces the evicted pod.
                    self.create_pod(&owner);
                }
            }
            other => self.execute_other(other),
        }
        self.schedule();
    }

    /// What Switchyard's writers do, and nothing more: a node effect changes
    /// the node's labels, taints or `spec.unschedulable` only, with no report
    /// and no platform reaction; a drain removes the pods. Other effects are
    /// executed as by [`Self::execute`].
    pub fn write(&mut self, effect: &Effect) {
        match effect {
            Effect::Drain { node } => {
                self.evict(node);
            }
            Effect::Cordon { node }
            | Effect::Uncordon { node }
            | Effect::MoveToGroup { node, .. }
            | Effect::RestoreNode { node, .. }
            | Effect::RemoveNodeLabels { node, .. }
            | Effect::SetStackLabel { node, .. } => {
                if let Some(n) = self.nodes.get_mut(node) {
                    write_node(n, effect);
                }
            }
            other => self.execute_other(other),
        }
    }

    /// The platform's answer to a node write, in the same update: node-manager
    /// labels a moved node with its new group's role; a new stack label starts
    /// node preparation, which first takes gpu-setup-complete away. Returns
    /// whether preparation starts.
    fn react(&mut self, effect: &Effect, before: &SimNode) -> bool {
        let stack = |n: &SimNode| n.labels.get(GPU_STACK_LABEL).cloned();
        match effect {
            Effect::MoveToGroup { node, group, .. } => {
                if let Some(n) = self.nodes.get_mut(node) {
                    n.labels
                        .insert(format!("{NODE_ROLE_PREFIX}{group}"), String::new());
                }
                false
            }
            Effect::SetStackLabel { node, .. } => {
                let n = self.nodes.get_mut(node).expect("written");
                if stack(n) == stack(before) {
                    return false;
                }
                n.labels.remove(GPU_SETUP_COMPLETE_LABEL);
                true
            }
            _ => false,
        }
    }

    /// A node as inventory would report it.
    pub fn node_fact(&self, node: &str) -> Option<NodeObserved> {
        let n = self.nodes.get(node)?;
        Some(NodeObserved {
            node: node.into(),
            labels: n.labels.clone(),
            taints: n.taints.clone(),
            unschedulable: n.unschedulable,
            provisioning: NodeProvisioning::Manual as i32,
            gpu_count: n.gpus,
        })
    }

    /// Effects on workloads, quotas, groups and classes.
    fn execute_other(&mut self, effect: &Effect) {
        match effect {
            Effect::SetPlacement {
                workload,
                placement,
            } => {
                let key = workload_key(workload);
                if let Some(w) = self.workloads.get_mut(&key)
                    && w.placement != *placement
                {
                    w.placement = placement.clone();
                    self.report_workload(workload);
                }
            }
            Effect::RestartWorkload {
                workload,
                restarted_at,
            } => {
                let key = workload_key(workload);
                let Some(w) = self.workloads.get_mut(&key) else {
                    return;
                };
                if w.restarted_at == *restarted_at {
                    return;
                }
                w.restarted_at = restarted_at.clone();
                let replicas = w.replicas;
                let old: Vec<ObjectKey> = self
                    .pods
                    .iter()
                    .filter(|(_, p)| workload_key(&p.owner) == key)
                    .map(|(k, _)| k.clone())
                    .collect();
                for pod in old {
                    self.remove_pod(&pod);
                }
                for _ in 0..replicas {
                    self.create_pod(workload);
                }
            }
            Effect::SetQuota {
                namespace,
                name,
                hard,
            } => {
                let key = (namespace.clone(), name.clone());
                if self.quotas.get(&key) != Some(hard) {
                    self.quotas.insert(key, hard.clone());
                    self.out
                        .push(ev(Kind::ResourceQuotaObserved(ResourceQuotaObserved {
                            namespace: namespace.clone(),
                            name: name.clone(),
                            hard: hard.clone(),
                        })));
                }
            }
            Effect::PublishDeviceClasses {
                gpu_class,
                variants,
                ..
            } => {
                let names: Vec<String> = variants.iter().map(|v| v.device_class.clone()).collect();
                if self.classes.get(gpu_class) != Some(&names) {
                    self.classes.insert(gpu_class.clone(), names.clone());
                    let mut class = self.class_specs.get(gpu_class).cloned().unwrap_or_default();
                    class.name = gpu_class.clone();
                    class.device_class_names = names;
                    self.out.push(ev(Kind::GpuClassObserved(class)));
                }
            }
            Effect::RemoveSpecGpu { group }
                if self.groups.get(group).is_some_and(Option::is_some) =>
            {
                self.set_group(group, None);
            }
            _ => {}
        }
    }

    fn edit_node(&mut self, node: &str, edit: impl FnOnce(&mut SimNode)) {
        let Some(n) = self.nodes.get_mut(node) else {
            return;
        };
        let before = n.clone();
        edit(n);
        if *n != before {
            self.report_node(node);
        }
    }

    /// Evicts every pod of the node but DaemonSet pods; returns their owners.
    fn evict(&mut self, node: &str) -> Vec<WorkloadRef> {
        let evict: Vec<(ObjectKey, WorkloadRef)> = self
            .pods
            .iter()
            .filter(|(_, p)| p.node == node && p.owner.kind != "DaemonSet")
            .map(|(k, p)| (k.clone(), p.owner.clone()))
            .collect();
        evict
            .into_iter()
            .map(|(pod, owner)| {
                self.remove_pod(&pod);
                owner
            })
            .collect()
    }

    /// The stack label changed: node preparation starts over for the new stack.
    fn prepare(&mut self, node: &str) {
        let jitter = (self.random() % (self.config.prep_delay as u64 / 2).max(1)) as i64;
        let n = self.nodes.get_mut(node).expect("present");
        n.generation += 1;
        let generation = n.generation;
        // Reconfiguration: the GPUs are re-discovered, the stacks' pods restart.
        let gpus: Vec<String> = self
            .gpus
            .iter()
            .filter(|(_, (n, _))| n == node)
            .map(|(k, _)| k.clone())
            .collect();
        for gpu in gpus {
            self.set_gpu(&gpu, node, GpuPhase::Pending);
        }
        for app in [DEVICE_PLUGIN_APP, VENDOR_ADAPTER_APP] {
            self.remove_pod(&(MODULE_NAMESPACE.to_string(), format!("{app}-{node}")));
        }
        self.add_timer(
            self.now + self.config.prep_delay + jitter,
            Timer::PrepareNode {
                node: node.into(),
                generation,
            },
        );
    }

    fn add_timer(&mut self, at: i64, timer: Timer) {
        self.timer_seq += 1;
        self.timers.insert((at, self.timer_seq), timer);
    }

    fn fire(&mut self, timer: Timer) {
        match timer {
            Timer::PrepareNode { node, generation } => {
                let Some(n) = self.nodes.get(&node) else {
                    return;
                };
                if n.generation != generation {
                    return;
                }
                let stack = n.labels.get(GPU_STACK_LABEL).cloned();
                let gpus: Vec<String> = self
                    .gpus
                    .iter()
                    .filter(|(_, (n, _))| *n == node)
                    .map(|(k, _)| k.clone())
                    .collect();
                for gpu in gpus {
                    self.set_gpu(&gpu, &node, GpuPhase::Ready);
                }
                match stack.as_deref() {
                    Some(STACK_DRA) => self.start_daemon(&node, VENDOR_ADAPTER_APP),
                    Some(STACK_DEVICE_PLUGIN) => self.start_daemon(&node, DEVICE_PLUGIN_APP),
                    _ => {}
                }
                if stack.is_some() {
                    self.edit_node(&node, |n| {
                        n.labels
                            .insert(GPU_SETUP_COMPLETE_LABEL.into(), String::new());
                    });
                }
                self.schedule();
            }
        }
    }

    // ------------------------------------------------------------ pods and scheduling

    fn start_daemon(&mut self, node: &str, app: &str) {
        let key = (MODULE_NAMESPACE.to_string(), format!("{app}-{node}"));
        let pod = SimPod {
            node: node.into(),
            owner: WorkloadRef {
                namespace: MODULE_NAMESPACE.into(),
                kind: "DaemonSet".into(),
                name: app.into(),
            },
            phase: PodPhase::Running,
            app: app.into(),
            claims_needed: 0,
            claims_allocated: 0,
            gpus: 0,
        };
        if self.pods.get(&key) != Some(&pod) {
            self.pods.insert(key.clone(), pod);
            self.report_pod(&key);
        }
    }

    fn create_pod(&mut self, owner: &WorkloadRef) {
        self.pod_seq += 1;
        let key = (
            owner.namespace.clone(),
            format!("{}-{:05}", owner.name, self.pod_seq),
        );
        let pod = SimPod {
            node: String::new(),
            owner: owner.clone(),
            phase: PodPhase::Pending,
            app: owner.name.clone(),
            claims_needed: 0,
            claims_allocated: 0,
            gpus: 0,
        };
        self.pods.insert(key.clone(), pod);
        self.report_pod(&key);
    }

    fn remove_pod(&mut self, key: &ObjectKey) {
        if self.pods.remove(key).is_some() {
            self.out.push(ev(Kind::PodRemoved(PodRemoved {
                namespace: key.0.clone(),
                name: key.1.clone(),
            })));
        }
    }

    fn free_gpus(&self, node: &str) -> u32 {
        let used: u32 = self
            .pods
            .values()
            .filter(|p| p.node == node)
            .map(|p| p.gpus)
            .sum();
        self.nodes
            .get(node)
            .map_or(0, |n| n.gpus.saturating_sub(used))
    }

    fn daemon_running(&self, node: &str, app: &str) -> bool {
        self.pods
            .get(&(MODULE_NAMESPACE.to_string(), format!("{app}-{node}")))
            .is_some_and(|p| p.phase == PodPhase::Running)
    }

    /// Binds Pending pods where their stack allows, first fit in name order.
    fn schedule(&mut self) {
        let pending: Vec<ObjectKey> = self
            .pods
            .iter()
            .filter(|(_, p)| p.phase == PodPhase::Pending)
            .map(|(k, _)| k.clone())
            .collect();
        for key in pending {
            let owner = self.pods[&key].owner.clone();
            let Some(workload) = self.workloads.get(&workload_key(&owner)) else {
                continue;
            };
            let (need, class) = gpu_request(&workload.placement);
            let selector = workload.placement.node_selector.clone();
            let fits = |sim: &Simulator, name: &str, node: &SimNode| {
                if node.unschedulable
                    || !selector.iter().all(|(k, v)| node.labels.get(k) == Some(v))
                {
                    return false;
                }
                if node.taints.iter().any(|t| t.effect == "NoSchedule")
                    && node.labels.contains_key(CONTROL_PLANE_LABEL)
                {
                    return false;
                }
                if need == 0 {
                    return true;
                }
                let prepared = node.labels.contains_key(GPU_SETUP_COMPLETE_LABEL);
                let stack = node.labels.get(GPU_STACK_LABEL).map(String::as_str);
                let served = match &class {
                    Some(class) => {
                        stack == Some(STACK_DRA)
                            && sim.daemon_running(name, VENDOR_ADAPTER_APP)
                            && class_selects(class, &node.device)
                    }
                    None => {
                        stack == Some(STACK_DEVICE_PLUGIN)
                            && sim.daemon_running(name, DEVICE_PLUGIN_APP)
                    }
                };
                prepared && served && sim.free_gpus(name) >= need
            };
            let target = self
                .nodes
                .iter()
                .find(|(name, node)| fits(self, name, node))
                .map(|(n, _)| n.clone());
            if let Some(node) = target {
                let pod = self.pods.get_mut(&key).expect("present");
                pod.node = node;
                pod.phase = PodPhase::Running;
                pod.gpus = need;
                pod.claims_needed = u32::from(class.is_some());
                pod.claims_allocated = u32::from(class.is_some());
                self.report_pod(&key);
            }
        }
    }

    // ------------------------------------------------------------ reports

    fn report_node(&mut self, name: &str) {
        let fact = self.node_fact(name).expect("a known node");
        self.out.push(ev(Kind::NodeObserved(fact)));
    }

    fn report_pod(&mut self, key: &ObjectKey) {
        let p = &self.pods[key];
        self.out.push(ev(Kind::PodObserved(PodObserved {
            namespace: key.0.clone(),
            name: key.1.clone(),
            node: p.node.clone(),
            owner: Some(p.owner.clone()),
            phase: p.phase as i32,
            app: p.app.clone(),
            claims_allocated: p.claims_allocated,
            claims_needed: p.claims_needed,
        })));
    }

    fn report_workload(&mut self, workload: &WorkloadRef) {
        let w = &self.workloads[&workload_key(workload)];
        self.out.push(ev(Kind::WorkloadObserved(WorkloadObserved {
            workload: Some(workload.clone()),
            replicas: w.replicas,
            placement: Some(w.placement.clone()),
        })));
    }

    fn set_gpu(&mut self, name: &str, node: &str, phase: GpuPhase) {
        if self.gpus.get(name) == Some(&(node.to_string(), phase)) {
            return;
        }
        self.gpus.insert(name.into(), (node.into(), phase));
        let index = name
            .rsplit('-')
            .next()
            .and_then(|i| i.parse().ok())
            .unwrap_or(0);
        let (device, product) = match self.nodes.get(node).map(|n| n.device.as_str()) {
            Some(LEGACY_GPU_DEVICE) => (LEGACY_GPU_DEVICE, LEGACY_GPU_PRODUCT),
            _ => (GPU_DEVICE, GPU_PRODUCT),
        };
        self.out
            .push(ev(Kind::PhysicalGpuObserved(PhysicalGpuObserved {
                name: name.into(),
                node: node.into(),
                index,
                uuid: format!("GPU-{:08x}", fnv1a(name)),
                product: product.into(),
                device: device.into(),
                memory_mib: 40_960,
                phase: phase as i32,
            })));
    }

    // ------------------------------------------------------------ queries

    /// Whether facts are waiting to be taken.
    pub fn has_facts(&self) -> bool {
        !self.out.is_empty()
    }

    /// Nodes running both the device plugin and the DRA adapter — which must never happen.
    pub fn nodes_with_both_stacks(&self) -> Vec<String> {
        self.nodes
            .keys()
            .filter(|node| {
                self.daemon_running(node, DEVICE_PLUGIN_APP)
                    && self.daemon_running(node, VENDOR_ADAPTER_APP)
            })
            .cloned()
            .collect()
    }

    /// Labels of a node as the cluster has them (for checks).
    pub fn node_labels(&self, node: &str) -> Option<&BTreeMap<String, String>> {
        self.nodes.get(node).map(|n| &n.labels)
    }

    pub fn node_taints(&self, node: &str) -> Option<&[Taint]> {
        self.nodes.get(node).map(|n| n.taints.as_slice())
    }

    pub fn workload_placement(&self, workload: &WorkloadRef) -> Option<&WorkloadPlacement> {
        self.workloads
            .get(&workload_key(workload))
            .map(|w| &w.placement)
    }

    pub fn workloads(&self) -> Vec<WorkloadRef> {
        self.workloads
            .keys()
            .map(|(namespace, kind, name)| WorkloadRef {
                namespace: namespace.clone(),
                kind: kind.clone(),
                name: name.clone(),
            })
            .collect()
    }

    /// GPUs each workload needs in total (replicas × per pod).
    pub fn workload_gpus(&self, workload: &WorkloadRef) -> u32 {
        self.workloads
            .get(&workload_key(workload))
            .map_or(0, |w| w.replicas * gpu_request(&w.placement).0)
    }

    /// (node, phase) of every pod of `workload`; the node is empty while Pending.
    pub fn workload_pods(&self, workload: &WorkloadRef) -> Vec<(String, PodPhase)> {
        let key = workload_key(workload);
        self.pods
            .values()
            .filter(|p| workload_key(&p.owner) == key)
            .map(|p| (p.node.clone(), p.phase))
            .collect()
    }

    /// The group of a node.
    pub fn group_of(&self, node: &str) -> Option<&str> {
        self.nodes
            .get(node)
            .and_then(|n| n.labels.get(GROUP_LABEL))
            .map(String::as_str)
    }

    /// Pods that wait for a node.
    pub fn pending_pods(&self) -> usize {
        self.pods
            .values()
            .filter(|p| p.phase == PodPhase::Pending)
            .count()
    }

    /// Nodes of `group`, in name order.
    pub fn nodes_in(&self, group: &str) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|(_, n)| n.labels.get(GROUP_LABEL).map(String::as_str) == Some(group))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Free GPUs on prepared nodes of `stack`.
    pub fn free_gpus_on(&self, stack: &str) -> u32 {
        self.nodes
            .iter()
            .filter(|(_, n)| {
                !n.unschedulable
                    && n.labels.get(GPU_STACK_LABEL).map(String::as_str) == Some(stack)
                    && n.labels.contains_key(GPU_SETUP_COMPLETE_LABEL)
            })
            .map(|(name, _)| self.free_gpus(name))
            .sum()
    }

    /// Whether the pods of `workload`, as they would request `class`, fit on
    /// the free GPUs of prepared DRA nodes of `group` (first fit, pod by pod).
    pub fn fits_on_class(&self, workload: &WorkloadRef, group: &str, class: &str) -> bool {
        let Some(w) = self.workloads.get(&workload_key(workload)) else {
            return false;
        };
        let per_pod = gpu_request(&w.placement).0;
        let mut free: Vec<u32> = self
            .nodes
            .iter()
            .filter(|(name, n)| {
                !n.unschedulable
                    && n.labels.get(GROUP_LABEL).map(String::as_str) == Some(group)
                    && n.labels.get(GPU_STACK_LABEL).map(String::as_str) == Some(STACK_DRA)
                    && n.labels.contains_key(GPU_SETUP_COMPLETE_LABEL)
                    && self.daemon_running(name, VENDOR_ADAPTER_APP)
                    && class_selects(class, &n.device)
            })
            .map(|(name, _)| self.free_gpus(name))
            .collect();
        (0..w.replicas).all(|_| match free.iter_mut().find(|f| **f >= per_pod) {
            Some(slot) => {
                *slot -= per_pod;
                true
            }
            None => false,
        })
    }

    pub fn quota(&self, namespace: &str, name: &str) -> Option<&BTreeMap<String, String>> {
        self.quotas.get(&(namespace.to_string(), name.to_string()))
    }

    /// The `gpu.deckhouse.io/device` label value of the simulated cards.
    pub fn device_label() -> (&'static str, &'static str) {
        (GPU_DEVICE_LABEL, GPU_DEVICE)
    }
}

/// A stable 32-bit value from a name (FNV-1a), for made-up GPU UUIDs.
fn fnv1a(name: &str) -> u32 {
    name.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

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
//!
//! [`Effect`]: switchyard_core::effects::Effect

#![forbid(unsafe_code)]

mod actions;
mod effects;
mod executor;
mod nvidia;
mod queries;
mod reports;
mod scheduling;

pub use nvidia::{DEVICE_PLUGIN_GRACE, DRA_NAMESPACE, OPERATOR_NAMESPACE, Operand};

use std::collections::BTreeMap;

use switchyard_core::backend::NvidiaOperator;
use switchyard_core::cluster::{ObjectKey, WorkloadKey, workload_key};
use switchyard_core::names::{
    CLASS_RESOURCE_PREFIX, CONTROL_PLANE_LABEL, DEVICE_GPU_CONFIG_LABEL, GPU_SETUP_COMPLETE_LABEL,
    GPU_STACK_LABEL, GROUP_LABEL, NODE_AGENT_APP, NODE_ROLE_PREFIX, NVIDIA_GPU,
    STACK_DEVICE_PLUGIN, STACK_DRA, VENDOR_ADAPTER_APP,
};
use switchyard_proto::v1::{
    DomainEvent, GpuClassObserved, GpuPhase, GpuSharing, GpuSpec, ModuleSettingsObserved, PodPhase,
    ResourceList, Taint, WorkloadPlacement, WorkloadRef, domain_event::Kind,
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

/// The model of the source group's cards.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Card {
    /// The `gpu.deckhouse.io/device` label of their PhysicalGPUs.
    pub device: String,
    /// `nvidia.com/gpu.product`, as GPU feature discovery labels the node.
    pub product: String,
    pub memory_mib: u64,
    /// The GPU class the reference scenario creates for them (Step 2).
    pub class: String,
}

impl Card {
    /// The demo's cards: A100 SXM4 40GB, class `a100`.
    pub fn a100() -> Card {
        Card {
            device: GPU_DEVICE.into(),
            product: GPU_PRODUCT.into(),
            memory_mib: 40_960,
            class: "a100".into(),
        }
    }

    /// H100 80GB HBM3, class `h100` (the node agent's `h100-8x` fixture).
    pub fn h100() -> Card {
        Card {
            device: "h100-80gb-hbm3".into(),
            product: "NVIDIA-H100-80GB-HBM3".into(),
            memory_mib: 81_559,
            class: "h100".into(),
        }
    }
}

/// How the simulated cluster looks and behaves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimConfig {
    pub seed: u64,
    /// Nodes of the source group `gpu` (spec.gpu, device plugin).
    pub gpu_nodes: usize,
    pub gpus_per_node: u32,
    /// The model of those nodes' cards.
    pub card: Card,
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
            card: Card::a100(),
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
    /// `nvidia.com/gpu` allocatable: the cards while the device plugin serves
    /// the node, 0 once preparation for another stack starts.
    allocatable: u32,
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
    /// The pod's labels (reported for DaemonSet pods).
    labels: BTreeMap<String, String>,
    /// The DeviceClass of its ResourceClaim `<pod>-gpu`, while allocated.
    claim: Option<String>,
    /// The restart of its workload it was made by (its template's
    /// `restartedAt` when it was created).
    restarted_at: String,
    /// nvidia-operator: its `nvidia.com/gpu` is served on a DRA node through
    /// the driver's class (KEP-5004's implicit claim), not by a device plugin.
    bridged: bool,
}

#[derive(Clone, Debug, PartialEq)]
struct SimWorkload {
    replicas: u32,
    placement: WorkloadPlacement,
    restarted_at: String,
    /// Its pods repel each other by hostname (a required pod anti-affinity):
    /// one per node.
    one_per_node: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    PrepareNode {
        node: String,
        generation: u64,
    },
    /// nvidia-operator: a DaemonSet's pod on the node starts now, if still wanted.
    StartOperand {
        node: String,
        operand: Operand,
    },
    /// nvidia-operator: kubelet drops a stopped device plugin's resources.
    DevicePluginGone {
        node: String,
    },
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
    /// The nvidia-operator backend's platform ([`Simulator::nvidia_operator`]);
    /// `None`: Deckhouse's.
    nvidia: Option<NvidiaOperator>,
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
        let mut sim = Simulator::empty(config.clone());
        sim.deckhouse(config);
        sim
    }

    /// No node, no group, no workload: the platform's settings only.
    fn empty(config: SimConfig) -> Self {
        Simulator {
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
                // A cluster that meets the prerequisites.
                kubernetes_version: "v1.36.3".into(),
                feature_gates: switchyard_core::names::REQUIRED_FEATURE_GATES
                    .iter()
                    .map(|gate| (gate.to_string(), true))
                    .collect(),
                dra_api_served: true,
                feature_gates_error: String::new(),
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
            nvidia: None,
        }
    }

    /// The reference scenario's Deckhouse cluster ([`Simulator::new`]).
    fn deckhouse(&mut self, config: SimConfig) {
        let sim = self;
        sim.set_group("master", None);
        sim.add_control_plane(&[
            (GROUP_LABEL, "master"),
            (&format!("{NODE_ROLE_PREFIX}master"), ""),
        ]);
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
                        (GPU_SETUP_COMPLETE_LABEL.to_string(), "true".to_string()),
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
                    (GPU_SETUP_COMPLETE_LABEL.to_string(), "true".to_string()),
                    (DEVICE_GPU_CONFIG_LABEL.to_string(), "default".to_string()),
                    (
                        "nvidia.com/gpu.product".to_string(),
                        config.card.product.clone(),
                    ),
                    (
                        "nvidia.com/gpu.count".to_string(),
                        config.gpus_per_node.to_string(),
                    ),
                ]
                .into(),
                gpus: config.gpus_per_node,
                device: config.card.device.clone(),
                allocatable: config.gpus_per_node,
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
        sim.add_legacy_workloads(capacity, (GROUP_LABEL, "gpu"), false);
        sim.set_quota(
            "ml",
            "gpu-quota",
            [("requests.nvidia.com/gpu", "64"), ("pods", "100")],
        );
        sim.schedule();
    }

    /// Deployments `ml/train-<i>` asking for `nvidia.com/gpu` (one or two
    /// replicas of one or two GPUs, seeded), bound by `selector`, up to
    /// `capacity` GPUs in all: the first that does not fit ends the list,
    /// or with `shrink` is made smaller to fit.
    fn add_legacy_workloads(&mut self, capacity: u32, selector: (&str, &str), shrink: bool) {
        let mut demand = 0;
        for i in 0..self.config.workloads {
            let mut replicas = 1 + (self.random() % 2) as u32;
            // A pod must fit on one node.
            let mut per_pod = (1 + (self.random() % 2) as u32).min(self.config.gpus_per_node);
            let left = capacity - demand;
            if shrink && left > 0 {
                per_pod = per_pod.min(left);
                replicas = replicas.min(left / per_pod);
            }
            if demand + replicas * per_pod > capacity || replicas == 0 {
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
                node_selector: [(selector.0.to_string(), selector.1.to_string())].into(),
                tolerations: Some(Default::default()),
            };
            let workload = WorkloadRef {
                namespace: "ml".into(),
                kind: "Deployment".into(),
                name: format!("train-{i}"),
            };
            self.workloads.insert(
                workload_key(&workload),
                SimWorkload {
                    replicas,
                    placement,
                    restarted_at: String::new(),
                    one_per_node: false,
                },
            );
            self.report_workload(&workload);
            for _ in 0..replicas {
                self.create_pod(&workload);
            }
        }
    }

    /// The control-plane node `master-0`, tainted as kubeadm taints it, with
    /// `labels` besides the control-plane role.
    fn add_control_plane(&mut self, labels: &[(&str, &str)]) {
        let mut all: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        all.insert(CONTROL_PLANE_LABEL.to_string(), String::new());
        let master = SimNode {
            labels: all,
            taints: vec![Taint {
                key: CONTROL_PLANE_LABEL.into(),
                value: String::new(),
                effect: "NoSchedule".into(),
            }],
            ..SimNode::default()
        };
        self.nodes.insert("master-0".into(), master);
        self.report_node("master-0");
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

    pub(crate) fn random(&mut self) -> u64 {
        // splitmix64: the simulator's only source of variety, seeded.
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

//! The platform of the `nvidia-operator` backend: NVIDIA's GPU Operator and
//! DRA driver as they answer the node labels Switchyard writes (the facts
//! F1–F17 of `docs/design/nvidia-operator-backend.md`):
//!
//! - the operator's labeller fills in a missing or empty deploy label with
//!   `true` on a node labelled `nvidia.com/gpu.present=true`, and keeps any
//!   other value (F4);
//! - the device-plugin DaemonSet runs a pod on a node while its deploy label
//!   reads `true` (F1); kubelet advertises the node's cards as
//!   `nvidia.com/gpu` while that pod runs, and keeps them a grace period
//!   after it stops (F17);
//! - the DRA kubelet plugin's DaemonSet runs a pod while the plugin label
//!   reads `true` (the guide's chart values, F9); the running plugin
//!   publishes the node's cards as one `gpu.nvidia.com` ResourceSlice (F11,
//!   F12), withdrawn when it stops.
//!
//! Pods start a while after their DaemonSet wants them (seeded jitter on the
//! simulated clock); they stop at once.

use std::collections::BTreeMap;

use switchyard_core::backend::{DeployLabel, NvidiaOperator, nvidia};
use switchyard_core::cluster::ObjectKey;
use switchyard_core::names::NVIDIA_GPU;
use switchyard_proto::v1::{
    DeviceClassObserved, PodPhase, ResourceSliceObserved, ResourceSliceRemoved, SliceDevice,
    WorkloadRef, domain_event::Kind,
};

use crate::{SECOND, SimConfig, SimNode, SimPod, Simulator, Timer, ev};

/// The GPU Operator's namespace and the DRA driver's, as the guide installs them.
pub const OPERATOR_NAMESPACE: &str = "gpu-operator";
pub const DRA_NAMESPACE: &str = "nvidia-dra-driver-gpu";
/// How long kubelet keeps a stopped device plugin's resources (F17: 5 min).
pub const DEVICE_PLUGIN_GRACE: i64 = 300 * SECOND;

/// An operand DaemonSet the simulated platform runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Operand {
    DevicePlugin,
    KubeletPlugin,
}

impl Operand {
    fn pod(self, node: &str) -> ObjectKey {
        match self {
            Operand::DevicePlugin => (
                OPERATOR_NAMESPACE.into(),
                format!("nvidia-device-plugin-daemonset-{node}"),
            ),
            Operand::KubeletPlugin => (
                DRA_NAMESPACE.into(),
                format!("dra-driver-nvidia-gpu-kubelet-plugin-{node}"),
            ),
        }
    }

    fn labels(self) -> (&'static str, &'static str) {
        match self {
            Operand::DevicePlugin => nvidia::DEVICE_PLUGIN_POD,
            Operand::KubeletPlugin => nvidia::KUBELET_PLUGIN_POD,
        }
    }
}

impl Simulator {
    /// A cluster the NVIDIA GPU Operator serves, before the migration: a
    /// control plane and `config.gpu_nodes` GPU nodes as GPU Feature
    /// Discovery labels them (`config.card`), in the pool `legacy`, the
    /// device plugin running on each; the DRA driver's class; `config.workloads`
    /// Deployments asking for `nvidia.com/gpu`, bound to the legacy pool (as
    /// many as fit on half the nodes). Its initial facts wait in
    /// [`Simulator::take_facts`].
    pub fn nvidia_operator(config: SimConfig, backend: NvidiaOperator) -> Simulator {
        let mut sim = Simulator::empty(config.clone());
        sim.nvidia = Some(backend.clone());
        sim.module.dra_enabled = false;
        sim.module.previous_module_version = String::new();
        sim.add_control_plane(&[]);
        sim.out
            .push(ev(Kind::ModuleSettingsObserved(sim.module.clone())));
        let family = config
            .card
            .product
            .split('-')
            .nth(1)
            .map_or("hopper", |model| {
                if model.starts_with('A') {
                    "ampere"
                } else {
                    "hopper"
                }
            });
        for i in 0..config.gpu_nodes {
            let name = format!("gpu-{i}");
            let node = SimNode {
                labels: [
                    (nvidia::GPU_PRESENT.to_string(), "true".to_string()),
                    (nvidia::GFD_PRODUCT.to_string(), config.card.product.clone()),
                    (
                        nvidia::GFD_COUNT.to_string(),
                        config.gpus_per_node.to_string(),
                    ),
                    (
                        nvidia::GFD_MEMORY_MIB.to_string(),
                        config.card.memory_mib.to_string(),
                    ),
                    ("nvidia.com/gpu.family".to_string(), family.to_string()),
                    (backend.pool_label.clone(), "legacy".to_string()),
                ]
                .into(),
                gpus: config.gpus_per_node,
                device: config.card.device.clone(),
                ..SimNode::default()
            };
            sim.nodes.insert(name.clone(), node);
            sim.reconcile_operands(&name);
            // The operator has run a while: its device plugin serves the node.
            sim.start_operand(&name, Operand::DevicePlugin);
            sim.report_node(&name);
        }
        // The DRA driver is installed (its kubelet plugin runs nowhere yet):
        // its full-GPU class maps nvidia.com/gpu on resource.k8s.io/v1 (F14).
        sim.out
            .push(ev(Kind::DeviceClassObserved(DeviceClassObserved {
                name: nvidia::DRIVER.into(),
                selectors: vec![format!(
                    "device.driver == '{0}' && device.attributes['{0}'].type == 'gpu'",
                    nvidia::DRIVER
                )],
                extended_resource_name: NVIDIA_GPU.into(),
            })));
        // Workloads bound to the legacy pool fill at most the nodes the pilot
        // pool leaves it (half, rounded down), so the pilot's nodes can always
        // be drained; a GPU short of full on each, so that pods of two fit
        // whatever the order and the bridge test finds a GPU on that pool
        // (with one GPU per node: one node's short).
        let legacy_nodes = (config.gpu_nodes / 2) as u32;
        let capacity = match config.gpus_per_node {
            1 => legacy_nodes.saturating_sub(1),
            g => (g - 1) * legacy_nodes,
        };
        let pool_label = backend.pool_label.clone();
        sim.add_legacy_workloads(capacity, (pool_label.as_str(), "legacy"), true);
        sim.set_quota(
            "ml",
            "gpu-quota",
            [("requests.nvidia.com/gpu", "64"), ("pods", "100")],
        );
        sim.schedule();
        sim
    }

    /// The nodes labelled with `pool`, by name.
    pub fn nodes_in_pool(&self, pool: &str) -> Vec<String> {
        let Some(label) = self.nvidia.as_ref().map(|b| b.pool_label.as_str()) else {
            return Vec::new();
        };
        self.nodes
            .iter()
            .filter(|(_, n)| n.labels.get(label).map(String::as_str) == Some(pool))
            .map(|(name, _)| name.clone())
            .collect()
    }

    /// An operator's `kubectl label node <node> <pool label>=<pool>`.
    pub fn set_pool(&mut self, node: &str, pool: &str) {
        let Some(label) = self.nvidia.as_ref().map(|b| b.pool_label.clone()) else {
            return;
        };
        self.edit_node(node, |n| {
            n.labels.insert(label, pool.to_string());
        });
    }

    /// Someone (another tool, a hand) writes a node label.
    pub fn set_node_label(&mut self, node: &str, key: &str, value: Option<&str>) {
        self.edit_node(node, |n| {
            match value {
                Some(v) => n.labels.insert(key.to_string(), v.to_string()),
                None => n.labels.remove(key),
            };
        });
        self.reconcile_operands(node);
    }

    /// The platform's answer to a node's labels: the labeller, then each
    /// DaemonSet starting (later) or stopping (now) its pod.
    pub(crate) fn reconcile_operands(&mut self, node: &str) {
        let Some(backend) = self.nvidia.clone() else {
            return;
        };
        let Some(n) = self.nodes.get_mut(node) else {
            return;
        };
        if n.labels.get(nvidia::GPU_PRESENT).map(String::as_str) != Some("true") {
            return;
        }
        let mut labelled = false;
        for key in [
            nvidia::DEPLOY_DEVICE_PLUGIN,
            nvidia::DEPLOY_OPERATOR_VALIDATOR,
        ] {
            if DeployLabel::read(n.labels.get(key).map(String::as_str)) == DeployLabel::Missing {
                n.labels.insert(key.to_string(), "true".to_string());
                labelled = true;
            }
        }
        let labels = n.labels.clone();
        if labelled {
            self.report_node(node);
        }
        let selected = |key: &str| labels.get(key).map(String::as_str) == Some("true");
        for (operand, wanted) in [
            (
                Operand::DevicePlugin,
                selected(nvidia::DEPLOY_DEVICE_PLUGIN),
            ),
            (Operand::KubeletPlugin, selected(&backend.plugin_label)),
        ] {
            let running = self.pods.contains_key(&operand.pod(node));
            if wanted && !running {
                let jitter = (self.random() % 10) as i64 * SECOND;
                self.add_timer(
                    self.now + 5 * SECOND + jitter,
                    Timer::StartOperand {
                        node: node.to_string(),
                        operand,
                    },
                );
            } else if !wanted && running {
                self.stop_operand(node, operand);
            }
        }
    }

    /// A DaemonSet's pod on `node` starts, if its label still asks for it.
    pub(crate) fn operand_due(&mut self, node: &str, operand: Operand) {
        let Some(backend) = self.nvidia.clone() else {
            return;
        };
        let Some(n) = self.nodes.get(node) else {
            return;
        };
        let key = match operand {
            Operand::DevicePlugin => nvidia::DEPLOY_DEVICE_PLUGIN,
            Operand::KubeletPlugin => backend.plugin_label.as_str(),
        };
        if n.labels.get(key).map(String::as_str) == Some("true")
            && !self.pods.contains_key(&operand.pod(node))
        {
            self.start_operand(node, operand);
        }
    }

    fn start_operand(&mut self, node: &str, operand: Operand) {
        let key = operand.pod(node);
        let (label, value) = operand.labels();
        let pod = SimPod {
            node: node.into(),
            owner: WorkloadRef {
                namespace: key.0.clone(),
                kind: "DaemonSet".into(),
                name: key.1.trim_end_matches(&format!("-{node}")).to_string(),
            },
            phase: PodPhase::Running,
            app: value.into(),
            claims_needed: 0,
            claims_allocated: 0,
            gpus: 0,
            labels: BTreeMap::from([(label.to_string(), value.to_string())]),
            claim: None,
            restarted_at: String::new(),
            bridged: false,
        };
        self.pods.insert(key.clone(), pod);
        self.report_pod(&key);
        match operand {
            // kubelet's device manager registers the plugin's resources.
            Operand::DevicePlugin => self.edit_node(node, |n| n.allocatable = n.gpus),
            Operand::KubeletPlugin => self.publish_nvidia_slice(node),
        }
    }

    fn stop_operand(&mut self, node: &str, operand: Operand) {
        self.remove_pod(&operand.pod(node));
        match operand {
            Operand::DevicePlugin => self.add_timer(
                self.now + DEVICE_PLUGIN_GRACE,
                Timer::DevicePluginGone {
                    node: node.to_string(),
                },
            ),
            Operand::KubeletPlugin => {
                self.out
                    .push(ev(Kind::ResourceSliceRemoved(ResourceSliceRemoved {
                        name: nvidia_slice_name(node),
                        node: node.into(),
                    })))
            }
        }
    }

    /// kubelet's grace for a stopped device plugin has passed: its
    /// resources leave allocatable, unless it runs again.
    pub(crate) fn device_plugin_gone(&mut self, node: &str) {
        if !self.pods.contains_key(&Operand::DevicePlugin.pod(node)) {
            self.edit_node(node, |n| n.allocatable = 0);
        }
    }

    /// The cards' `productName` as the NVIDIA driver publishes it: GPU
    /// Feature Discovery's product label with spaces.
    pub(crate) fn nvidia_product_name(&self) -> String {
        self.config.card.product.replace('-', " ")
    }

    /// The kubelet plugin publishes the node's cards, shaped as the NVIDIA
    /// driver's full-GPU devices (`gpu-<minor>`, type `gpu`, productName with
    /// spaces, memory).
    fn publish_nvidia_slice(&mut self, node: &str) {
        let Some(n) = self.nodes.get(node) else {
            return;
        };
        let product = self.nvidia_product_name();
        let device_list: Vec<SliceDevice> = (0..n.gpus)
            .map(|minor| SliceDevice {
                name: format!("gpu-{minor}"),
                r#type: "gpu".into(),
                uuid: format!("GPU-{node}-{minor}"),
                product: product.clone(),
                memory_mib: self.config.card.memory_mib,
            })
            .collect();
        self.out
            .push(ev(Kind::ResourceSliceObserved(ResourceSliceObserved {
                name: nvidia_slice_name(node),
                driver: nvidia::DRIVER.into(),
                node: node.into(),
                pool: node.into(),
                devices: device_list.len() as u32,
                device_list,
            })));
    }

    /// A device-plugin pod runs on `node` whatever its label says (a
    /// DaemonSet whose selector was changed by hand): a failed exclusivity
    /// gate, for tests.
    pub fn start_device_plugin_anyway(&mut self, node: &str) {
        self.start_operand(node, Operand::DevicePlugin);
    }

    /// The operands running on `node` now, for checks: (device-plugin pod,
    /// kubelet-plugin pod, `nvidia.com/gpu` allocatable).
    /// NVIDIA's two allocators on one node: the DRA kubelet plugin (and its
    /// slice) beside the device plugin's pod or its GPUs still allocatable.
    pub(crate) fn nvidia_both(&self, node: &str) -> bool {
        let (device_plugin, kubelet_plugin, allocatable) = self.operands_on(node);
        kubelet_plugin && (device_plugin || allocatable > 0)
    }

    pub fn operands_on(&self, node: &str) -> (bool, bool, u32) {
        (
            self.pods.contains_key(&Operand::DevicePlugin.pod(node)),
            self.pods.contains_key(&Operand::KubeletPlugin.pod(node)),
            self.nodes.get(node).map_or(0, |n| n.allocatable),
        )
    }
}

fn nvidia_slice_name(node: &str) -> String {
    format!("{node}-{}-0", nvidia::DRIVER)
}

//! Pods and scheduling: DaemonSet and workload pods, bound where their stack allows.

use std::collections::BTreeMap;

use switchyard_core::backend::nvidia;
use switchyard_core::class_compiler::GPU_DRIVER;
use switchyard_core::cluster::{ObjectKey, workload_key};
use switchyard_core::names::{
    CONTROL_PLANE_LABEL, GPU_SETUP_COMPLETE_LABEL, GPU_STACK_LABEL, MODULE_NAMESPACE,
    NODE_AGENT_APP, NODE_AGENT_POD_LABELS, STACK_DEVICE_PLUGIN, STACK_DRA, VENDOR_ADAPTER_APP,
};
use switchyard_core::placement::tolerates;
use switchyard_proto::v1::{
    AllocatedDevice, PodPhase, PodRemoved, ResourceClaimObserved, ResourceClaimRemoved,
    WorkloadRef, domain_event::Kind,
};

/// The ResourceClaim generated for a pod from its claim template.
fn claim_name(pod: &str) -> String {
    format!("{pod}-gpu")
}

use crate::{DEVICE_PLUGIN_APP, SimNode, SimPod, Simulator, class_selects, ev, gpu_request};

impl Simulator {
    pub(crate) fn start_daemon(&mut self, node: &str, app: &str) {
        let key = (MODULE_NAMESPACE.to_string(), format!("{app}-{node}"));
        // The node agent is Switchyard's, labelled as its chart labels it.
        let mut labels: BTreeMap<String, String> = [("app".to_string(), app.to_string())].into();
        if app == NODE_AGENT_APP {
            labels.extend(
                NODE_AGENT_POD_LABELS
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string())),
            );
        }
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
            labels,
            claim: None,
            restarted_at: String::new(),
            bridged: false,
        };
        if self.pods.get(&key) != Some(&pod) {
            self.pods.insert(key.clone(), pod);
            self.report_pod(&key);
            if app == VENDOR_ADAPTER_APP {
                self.publish_slice(node);
            }
        }
    }

    pub(crate) fn create_pod(&mut self, owner: &WorkloadRef) {
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
            labels: [("app".to_string(), owner.name.clone())].into(),
            claim: None,
            restarted_at: self
                .workloads
                .get(&workload_key(owner))
                .map(|w| w.restarted_at.clone())
                .unwrap_or_default(),
            bridged: false,
        };
        self.pods.insert(key.clone(), pod);
        self.report_pod(&key);
    }

    pub(crate) fn remove_pod(&mut self, key: &ObjectKey) {
        if let Some(pod) = self.pods.remove(key) {
            self.out.push(ev(Kind::PodRemoved(PodRemoved {
                namespace: key.0.clone(),
                name: key.1.clone(),
            })));
            if pod.owner.kind == "DaemonSet" && pod.app == VENDOR_ADAPTER_APP {
                self.withdraw_slice(&pod.node);
            }
            // The claim generated for the pod goes with it.
            if pod.claim.is_some() {
                self.out
                    .push(ev(Kind::ResourceClaimRemoved(ResourceClaimRemoved {
                        namespace: key.0.clone(),
                        name: claim_name(&key.1),
                    })));
            }
        }
    }

    pub(crate) fn free_gpus(&self, node: &str) -> u32 {
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

    pub(crate) fn daemon_running(&self, node: &str, app: &str) -> bool {
        self.pods
            .get(&(MODULE_NAMESPACE.to_string(), format!("{app}-{node}")))
            .is_some_and(|p| p.phase == PodPhase::Running)
    }

    /// Whether `node` serves GPU classes now: on Deckhouse a prepared DRA
    /// node with its vendor adapter running; on the nvidia-operator backend a
    /// node whose DRA kubelet plugin's label is on and whose plugin runs.
    pub(crate) fn serves_classes(&self, name: &str) -> bool {
        let Some(node) = self.nodes.get(name) else {
            return false;
        };
        match &self.nvidia {
            Some(b) => {
                node.labels.get(&b.plugin_label).map(String::as_str) == Some("true")
                    && self.operands_on(name).1
            }
            None => {
                node.labels.contains_key(GPU_SETUP_COMPLETE_LABEL)
                    && node.labels.get(GPU_STACK_LABEL).map(String::as_str) == Some(STACK_DRA)
                    && self.daemon_running(name, VENDOR_ADAPTER_APP)
            }
        }
    }

    /// Whether a device plugin serves `nvidia.com/gpu` on `node` now.
    fn serves_device_plugin(&self, name: &str) -> bool {
        let Some(node) = self.nodes.get(name) else {
            return false;
        };
        match &self.nvidia {
            Some(_) => self.operands_on(name).0 && node.allocatable > 0,
            None => {
                node.labels.contains_key(GPU_SETUP_COMPLETE_LABEL)
                    && node.labels.get(GPU_STACK_LABEL).map(String::as_str)
                        == Some(STACK_DEVICE_PLUGIN)
                    && self.daemon_running(name, DEVICE_PLUGIN_APP)
            }
        }
    }

    /// Binds Pending pods where their stack allows, first fit in name order.
    /// On the nvidia-operator backend a pod must tolerate the node's
    /// NoSchedule taints (the pilot taint), and a pod asking for
    /// `nvidia.com/gpu` lands on a DRA node through the driver's class, which
    /// maps that resource (KEP-5004), when it tolerates its way there.
    pub(crate) fn schedule(&mut self) {
        let pending: Vec<ObjectKey> = self
            .pods
            .iter()
            .filter(|(_, p)| p.phase == PodPhase::Pending)
            .map(|(k, _)| k.clone())
            .collect();
        let nvidia = self.nvidia.is_some();
        for key in pending {
            let owner = self.pods[&key].owner.clone();
            let Some(workload) = self.workloads.get(&workload_key(&owner)) else {
                continue;
            };
            let (need, class) = gpu_request(&workload.placement);
            let selector = workload.placement.node_selector.clone();
            let tolerations = workload
                .placement
                .tolerations
                .clone()
                .unwrap_or_default()
                .items;
            let one_per_node = workload.one_per_node;
            // Some(bridged) where the pod fits.
            let fits = |sim: &Simulator, name: &str, node: &SimNode| -> Option<bool> {
                if node.unschedulable
                    || !selector.iter().all(|(k, v)| node.labels.get(k) == Some(v))
                {
                    return None;
                }
                let repelled = if nvidia {
                    node.taints.iter().any(|t| {
                        t.effect == "NoSchedule" && !tolerations.iter().any(|tol| tolerates(tol, t))
                    })
                } else {
                    node.taints.iter().any(|t| t.effect == "NoSchedule")
                        && node.labels.contains_key(CONTROL_PLANE_LABEL)
                };
                if repelled {
                    return None;
                }
                if one_per_node
                    && sim
                        .pods
                        .values()
                        .any(|p| p.owner == owner && p.node == name)
                {
                    return None;
                }
                if need == 0 {
                    return Some(false);
                }
                if sim.free_gpus(name) < need {
                    return None;
                }
                match &class {
                    Some(class) => (sim.serves_classes(name) && class_selects(class, &node.device))
                        .then_some(false),
                    None if sim.serves_device_plugin(name) => Some(false),
                    None => (nvidia && sim.serves_classes(name)).then_some(true),
                }
            };
            let target = self
                .nodes
                .iter()
                .find_map(|(name, node)| fits(self, name, node).map(|b| (name.clone(), b)));
            if let Some((node, bridged)) = target {
                let driver = if nvidia { nvidia::DRIVER } else { GPU_DRIVER };
                let pod = self.pods.get_mut(&key).expect("present");
                pod.node = node;
                pod.phase = PodPhase::Running;
                pod.gpus = need;
                pod.bridged = bridged;
                let claimed = class.is_some() || bridged;
                pod.claims_needed = u32::from(claimed);
                pod.claims_allocated = u32::from(claimed);
                // The claim is allocated on the node the pod is bound to: the
                // class's DeviceClass, or the driver's own for the bridge.
                pod.claim = match &class {
                    Some(c) => Some(format!("{c}.gpu.deckhouse.io")),
                    None if bridged => Some(nvidia::DRIVER.to_string()),
                    None => None,
                };
                let claim = pod.claim.clone().map(|device_class| ResourceClaimObserved {
                    namespace: key.0.clone(),
                    name: claim_name(&key.1),
                    device_classes: vec![device_class],
                    node: pod.node.clone(),
                    allocated: vec![AllocatedDevice {
                        request: "gpu".into(),
                        driver: driver.into(),
                        pool: pod.node.clone(),
                        device: "gpu-0".into(),
                    }],
                    reserved_for: vec![key.1.clone()],
                    owner_pod: key.1.clone(),
                });
                if let Some(claim) = claim {
                    self.out.push(ev(Kind::ResourceClaimObserved(claim)));
                }
                self.report_pod(&key);
            }
        }
    }
}

//! Queries: read-only views of the simulated cluster, for checks, the demo and load tests.

use std::collections::BTreeMap;

use switchyard_core::cluster::workload_key;
use switchyard_core::names::{
    GPU_DEVICE_LABEL, GPU_SETUP_COMPLETE_LABEL, GPU_STACK_LABEL, GROUP_LABEL, VENDOR_ADAPTER_APP,
};
use switchyard_proto::v1::{PodPhase, Taint, WorkloadPlacement, WorkloadRef};

use crate::{DEVICE_PLUGIN_APP, GPU_DEVICE, Simulator, class_selects, gpu_request};

impl Simulator {
    /// Whether facts are waiting to be taken.
    pub fn has_facts(&self) -> bool {
        !self.out.is_empty()
    }

    /// Nodes running both the device plugin and the DRA adapter — which must never happen.
    pub fn nodes_with_both_stacks(&self) -> Vec<String> {
        self.nodes
            .keys()
            .filter(|node| {
                (self.daemon_running(node, DEVICE_PLUGIN_APP)
                    && self.daemon_running(node, VENDOR_ADAPTER_APP))
                    || self.nvidia_both(node)
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

    /// Whether a node is cordoned.
    pub fn node_unschedulable(&self, node: &str) -> Option<bool> {
        self.nodes.get(node).map(|n| n.unschedulable)
    }

    /// Whether a NodeGroup has `spec.gpu`; `None` if there is no such group.
    pub fn group_has_gpu(&self, group: &str) -> Option<bool> {
        self.groups.get(group).map(Option::is_some)
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
    /// the free GPUs of the DRA nodes of `group` (a pool on the
    /// nvidia-operator backend) that serve classes now (first fit, pod by pod).
    pub fn fits_on_class(&self, workload: &WorkloadRef, group: &str, class: &str) -> bool {
        let Some(w) = self.workloads.get(&workload_key(workload)) else {
            return false;
        };
        let per_pod = gpu_request(&w.placement).0;
        let group_label = self
            .nvidia
            .as_ref()
            .map_or(GROUP_LABEL, |b| b.pool_label.as_str());
        let mut free: Vec<u32> = self
            .nodes
            .iter()
            .filter(|(name, n)| {
                !n.unschedulable
                    && n.labels.get(group_label).map(String::as_str) == Some(group)
                    && self.serves_classes(name)
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

//! Reports: the fact events that changes to nodes, pods, workloads and GPUs produce.

use switchyard_core::cluster::{ObjectKey, workload_key};
use switchyard_proto::v1::{
    GpuPhase, PhysicalGpuObserved, PodObserved, WorkloadObserved, WorkloadRef, domain_event::Kind,
};

use crate::{GPU_DEVICE, GPU_PRODUCT, LEGACY_GPU_DEVICE, LEGACY_GPU_PRODUCT, Simulator, ev};

impl Simulator {
    pub(crate) fn report_node(&mut self, name: &str) {
        let fact = self.node_fact(name).expect("a known node");
        self.out.push(ev(Kind::NodeObserved(fact)));
    }

    pub(crate) fn report_pod(&mut self, key: &ObjectKey) {
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
            labels: if p.owner.kind == "DaemonSet" {
                p.labels.clone()
            } else {
                Default::default()
            },
        })));
    }

    pub(crate) fn report_workload(&mut self, workload: &WorkloadRef) {
        let w = &self.workloads[&workload_key(workload)];
        self.out.push(ev(Kind::WorkloadObserved(WorkloadObserved {
            workload: Some(workload.clone()),
            replicas: w.replicas,
            placement: Some(w.placement.clone()),
            managed_by: String::new(),
        })));
    }

    pub(crate) fn set_gpu(&mut self, name: &str, node: &str, phase: GpuPhase) {
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
}

/// A stable 32-bit value from a name (FNV-1a), for made-up GPU UUIDs.
fn fnv1a(name: &str) -> u32 {
    name.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

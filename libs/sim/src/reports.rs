//! Reports: the fact events that changes to nodes, pods, workloads and GPUs produce.

use switchyard_core::class_compiler::GPU_DRIVER;
use switchyard_core::cluster::{ObjectKey, workload_key};
use switchyard_core::names::NVIDIA_GPU;
use switchyard_proto::v1::{
    GpuPhase, PhysicalGpuObserved, PodObserved, ResourceSliceObserved, ResourceSliceRemoved,
    SliceDevice, WorkloadObserved, WorkloadRef, domain_event::Kind,
};

use crate::{LEGACY_GPU_DEVICE, LEGACY_GPU_PRODUCT, Simulator, ev};

impl Simulator {
    pub(crate) fn report_node(&mut self, name: &str) {
        let fact = self.node_fact(name).expect("a known node");
        self.out.push(ev(Kind::NodeObserved(fact)));
    }

    pub(crate) fn report_pod(&mut self, key: &ObjectKey) {
        let p = &self.pods[key];
        // What its template asks of the device plugin, as the API server shows
        // it; on a DRA node through the bridge, the scheduler's claim serves it.
        let asked = self.workloads.get(&workload_key(&p.owner)).map_or(0, |w| {
            w.placement
                .container_limits
                .values()
                .filter_map(|l| l.quantities.get(NVIDIA_GPU))
                .map(|q| q.parse::<u32>().unwrap_or(1))
                .sum()
        });
        self.out.push(ev(Kind::PodObserved(PodObserved {
            namespace: key.0.clone(),
            name: key.1.clone(),
            node: p.node.clone(),
            owner: Some(p.owner.clone()),
            phase: p.phase as i32,
            app: p.app.clone(),
            claims_allocated: p.claims_allocated,
            claims_needed: p.claims_needed,
            device_plugin_gpus: if p.bridged { 0 } else { asked },
            restarted_at: p.restarted_at.clone(),
            bridged_gpus: if p.bridged { asked } else { 0 },
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
            owner: None,
            restarted_at: w.restarted_at.clone(),
        })));
    }

    pub(crate) fn set_gpu(&mut self, name: &str, node: &str, phase: GpuPhase) {
        if self.gpus.get(name) == Some(&(node.to_string(), phase)) {
            return;
        }
        self.gpus.insert(name.into(), (node.into(), phase));
        let fact = self.gpu_fact(name, node, phase);
        self.out.push(ev(Kind::PhysicalGpuObserved(fact)));
    }

    fn gpu_fact(&self, name: &str, node: &str, phase: GpuPhase) -> PhysicalGpuObserved {
        let index = name
            .rsplit('-')
            .next()
            .and_then(|i| i.parse().ok())
            .unwrap_or(0);
        let card = &self.config.card;
        let (device, product, memory_mib) = match self.nodes.get(node).map(|n| n.device.as_str()) {
            Some(LEGACY_GPU_DEVICE) => (LEGACY_GPU_DEVICE, LEGACY_GPU_PRODUCT, 81_559),
            _ => (card.device.as_str(), card.product.as_str(), card.memory_mib),
        };
        PhysicalGpuObserved {
            name: name.into(),
            node: node.into(),
            index,
            uuid: format!("GPU-{:08x}", fnv1a(name)),
            product: product.into(),
            device: device.into(),
            memory_mib,
            phase: phase as i32,
        }
    }

    /// The DRA plug-in publishes the node's cards as one ResourceSlice.
    pub(crate) fn publish_slice(&mut self, node: &str) {
        let device_list: Vec<SliceDevice> = self
            .gpus
            .iter()
            .filter(|(_, (n, _))| n == node)
            .map(|(name, (n, phase))| {
                let gpu = self.gpu_fact(name, n, *phase);
                SliceDevice {
                    name: format!("gpu-{}", gpu.index),
                    r#type: "gpu".into(),
                    uuid: gpu.uuid,
                    product: gpu.product,
                    memory_mib: gpu.memory_mib,
                }
            })
            .collect();
        self.out
            .push(ev(Kind::ResourceSliceObserved(ResourceSliceObserved {
                name: slice_name(node),
                driver: GPU_DRIVER.into(),
                node: node.into(),
                pool: node.into(),
                devices: device_list.len() as u32,
                device_list,
            })));
    }

    /// The DRA plug-in stopped: its slice goes.
    pub(crate) fn withdraw_slice(&mut self, node: &str) {
        self.out
            .push(ev(Kind::ResourceSliceRemoved(ResourceSliceRemoved {
                name: slice_name(node),
                node: node.into(),
            })));
    }
}

fn slice_name(node: &str) -> String {
    format!("{node}-{GPU_DRIVER}-0")
}

/// A stable 32-bit value from a name (FNV-1a), for made-up GPU UUIDs.
fn fnv1a(name: &str) -> u32 {
    name.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

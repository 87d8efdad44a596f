//! Operator actions: what a person applies to the cluster (NodeGroups, the ModuleConfig, GPUClasses, Deployments, quotas).

use std::collections::BTreeMap;

use switchyard_core::cluster::workload_key;
use switchyard_core::names::GPU_DEVICE_LABEL;
use switchyard_proto::v1::{
    GpuClassObserved, GpuSpec, LabelSelector, NodeGroupObserved, ResourceQuotaObserved,
    WorkloadPlacement, WorkloadRef, WorkloadRemoved, domain_event::Kind,
};

use crate::{LEGACY_GPU_DEVICE, SimWorkload, Simulator, class_selects, ev};

impl Simulator {
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
        let device = [self.config.card.device.as_str(), LEGACY_GPU_DEVICE]
            .into_iter()
            .find(|d| class_selects(name, d))
            .unwrap_or(name);
        // On the nvidia-operator backend a class selects the NVIDIA driver's
        // attributes: the product name its slices publish.
        let (key, value) = match &self.nvidia {
            Some(_) => (
                "gpu.nvidia.com/productName".to_string(),
                self.nvidia_product_name(),
            ),
            None => (GPU_DEVICE_LABEL.to_string(), device.to_string()),
        };
        let class = GpuClassObserved {
            name: name.into(),
            selector: Some(LabelSelector {
                match_labels: [(key, value)].into(),
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
        self.apply_workload(workload, replicas, placement, false);
    }

    /// `kubectl apply` of a Deployment whose pods repel each other by
    /// hostname (a required pod anti-affinity): one pod per node.
    pub fn add_workload_one_per_node(
        &mut self,
        workload: &WorkloadRef,
        replicas: u32,
        placement: WorkloadPlacement,
    ) {
        self.apply_workload(workload, replicas, placement, true);
    }

    fn apply_workload(
        &mut self,
        workload: &WorkloadRef,
        replicas: u32,
        placement: WorkloadPlacement,
        one_per_node: bool,
    ) {
        self.workloads.insert(
            workload_key(workload),
            SimWorkload {
                replicas,
                placement,
                restarted_at: String::new(),
                one_per_node,
            },
        );
        self.report_workload(workload);
        for _ in 0..replicas {
            self.create_pod(workload);
        }
        self.schedule();
    }

    /// `kubectl delete` of a Deployment: its pods (and their claims) go.
    pub fn delete_workload(&mut self, workload: &WorkloadRef) {
        let key = workload_key(workload);
        if self.workloads.remove(&key).is_none() {
            return;
        }
        for pod in self.pods_of(&key) {
            self.remove_pod(&pod);
        }
        self.out.push(ev(Kind::WorkloadRemoved(WorkloadRemoved {
            workload: Some(workload.clone()),
        })));
        self.schedule();
    }

    pub(crate) fn set_quota<const N: usize>(
        &mut self,
        namespace: &str,
        name: &str,
        hard: [(&str, &str); N],
    ) {
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
}

//! Small builders for core tests (`mk_*`), in the style of the cores' inputs.

#![allow(dead_code)]

use std::collections::BTreeMap;

use switchyard_core::names::{CONTROL_PLANE_LABEL, GPU_ENABLED_LABEL, GROUP_LABEL};
use switchyard_proto::v1::{
    DomainEvent, GpuSharing, GpuSpec, ModuleSettingsObserved, NodeGroupObserved, NodeGroupRemoved,
    NodeObserved, NodeRemoved, domain_event::Kind,
};

pub fn ev(kind: Kind) -> DomainEvent {
    DomainEvent { kind: Some(kind) }
}

pub fn mk_node(name: &str, group: Option<&str>) -> DomainEvent {
    mk_node_labels(name, group, &[])
}

pub fn mk_node_labels(name: &str, group: Option<&str>, extra: &[(&str, &str)]) -> DomainEvent {
    let mut labels: BTreeMap<String, String> = extra
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    if let Some(group) = group {
        labels.insert(GROUP_LABEL.into(), group.into());
    }
    ev(Kind::NodeObserved(NodeObserved {
        node: name.into(),
        labels,
        gpu_count: 8,
        ..Default::default()
    }))
}

pub fn mk_control_plane(name: &str) -> DomainEvent {
    mk_node_labels(name, Some("master"), &[(CONTROL_PLANE_LABEL, "")])
}

pub fn mk_opted_out(name: &str, group: &str) -> DomainEvent {
    mk_node_labels(name, Some(group), &[(GPU_ENABLED_LABEL, "false")])
}

pub fn mk_node_removed(name: &str) -> DomainEvent {
    ev(Kind::NodeRemoved(NodeRemoved { node: name.into() }))
}

pub fn mk_group(name: &str, spec_gpu: bool) -> DomainEvent {
    ev(Kind::NodeGroupObserved(NodeGroupObserved {
        group: name.into(),
        node_type: "Static".into(),
        gpu: spec_gpu.then(|| GpuSpec {
            sharing: GpuSharing::Exclusive as i32,
            ..Default::default()
        }),
        ..Default::default()
    }))
}

pub fn mk_group_removed(name: &str) -> DomainEvent {
    ev(Kind::NodeGroupRemoved(NodeGroupRemoved {
        group: name.into(),
    }))
}

/// Module settings; `upgraded_from` is the version that ran before ("" = fresh install).
pub fn mk_settings(dra_enabled: bool, gates_ready: bool, upgraded_from: &str) -> DomainEvent {
    ev(Kind::ModuleSettingsObserved(ModuleSettingsObserved {
        dra_enabled,
        feature_gates_ready: gates_ready,
        module_version: "2.0.0".into(),
        previous_module_version: upgraded_from.into(),
        ..Default::default()
    }))
}

use switchyard_proto::v1::{
    GpuPhase, NodeProvisioning, PhysicalGpuObserved, PodObserved, PodPhase, PodRemoved, Taint,
    WorkloadRef,
};

/// A node with everything spelled out.
pub struct NodeSpec<'a> {
    pub name: &'a str,
    pub group: &'a str,
    pub labels: &'a [(&'a str, &'a str)],
    pub taints: Vec<Taint>,
    pub unschedulable: bool,
    pub gpus: u32,
    pub provisioning: NodeProvisioning,
    /// The device plugin's allocatable GPU resources (status.allocatable).
    pub allocatable: &'a [(&'a str, u32)],
}

impl<'a> NodeSpec<'a> {
    pub fn new(name: &'a str, group: &'a str) -> Self {
        NodeSpec {
            name,
            group,
            labels: &[],
            taints: Vec::new(),
            unschedulable: false,
            gpus: 2,
            provisioning: NodeProvisioning::Manual,
            allocatable: &[],
        }
    }

    pub fn fact(&self) -> DomainEvent {
        let mut labels: BTreeMap<String, String> = self
            .labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        labels.insert(GROUP_LABEL.into(), self.group.into());
        ev(Kind::NodeObserved(NodeObserved {
            node: self.name.into(),
            labels,
            taints: self.taints.clone(),
            unschedulable: self.unschedulable,
            provisioning: self.provisioning as i32,
            gpu_count: self.gpus,
            gpu_allocatable: self
                .allocatable
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect(),
        }))
    }
}

pub fn mk_pod(
    namespace: &str,
    name: &str,
    node: &str,
    owner: (&str, &str),
    app: &str,
    phase: PodPhase,
) -> DomainEvent {
    ev(Kind::PodObserved(PodObserved {
        namespace: namespace.into(),
        name: name.into(),
        node: node.into(),
        owner: Some(WorkloadRef {
            namespace: namespace.into(),
            kind: owner.0.into(),
            name: owner.1.into(),
        }),
        phase: phase as i32,
        app: app.into(),
        ..Default::default()
    }))
}

/// A running DaemonSet pod with these labels (the stacks' pods).
pub fn mk_daemon_pod(
    namespace: &str,
    name: &str,
    node: &str,
    labels: &[(&str, &str)],
) -> DomainEvent {
    let mut pod = mk_pod(
        namespace,
        name,
        node,
        ("DaemonSet", name),
        "",
        PodPhase::Running,
    );
    if let Some(Kind::PodObserved(p)) = &mut pod.kind {
        p.labels = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
    }
    pod
}

/// The node agent's pod as Switchyard's chart labels it.
pub fn mk_node_agent_pod(node: &str) -> DomainEvent {
    mk_daemon_pod(
        MODULE_NAMESPACE,
        &format!("switchyard-node-agent-{node}"),
        node,
        &NODE_AGENT_POD_LABELS,
    )
}

/// Deckhouse's selectors of its gpu-node-agent and vendor adapter pods.
pub fn mk_deckhouse_selectors() -> DomainEvent {
    let selectors = ReadinessSelectors::parse(
        &format!("app={NODE_AGENT_APP}"),
        &format!("app={VENDOR_ADAPTER_APP}"),
    )
    .expect("selectors");
    ev(Kind::ReadinessSelectorsConfigured(selectors.to_event()))
}

pub fn mk_claim(namespace: &str, name: &str, node: &str) -> DomainEvent {
    ev(Kind::ResourceClaimObserved(
        switchyard_proto::v1::ResourceClaimObserved {
            namespace: namespace.into(),
            name: name.into(),
            device_classes: vec!["a100.gpu.deckhouse.io".into()],
            node: node.into(),
            ..Default::default()
        },
    ))
}

pub fn mk_claim_removed(namespace: &str, name: &str) -> DomainEvent {
    ev(Kind::ResourceClaimRemoved(
        switchyard_proto::v1::ResourceClaimRemoved {
            namespace: namespace.into(),
            name: name.into(),
        },
    ))
}

pub fn mk_pod_removed(namespace: &str, name: &str) -> DomainEvent {
    ev(Kind::PodRemoved(PodRemoved {
        namespace: namespace.into(),
        name: name.into(),
    }))
}

pub fn mk_gpu(name: &str, node: &str, ready: bool) -> DomainEvent {
    ev(Kind::PhysicalGpuObserved(PhysicalGpuObserved {
        name: name.into(),
        node: node.into(),
        device: "a100-sxm4-40gb".into(),
        phase: if ready {
            GpuPhase::Ready
        } else {
            GpuPhase::Pending
        } as i32,
        ..Default::default()
    }))
}

use switchyard_core::cluster::ReadinessSelectors;
use switchyard_core::names::{
    GPU_SETUP_COMPLETE_LABEL, GPU_STACK_LABEL, MODULE_NAMESPACE, NODE_AGENT_APP,
    NODE_AGENT_POD_LABELS, VENDOR_ADAPTER_APP,
};
use switchyard_proto::v1::{GpuClassObserved, ResourceList, WorkloadObserved, WorkloadPlacement};

pub fn mk_class(name: &str) -> DomainEvent {
    ev(Kind::GpuClassObserved(GpuClassObserved {
        name: name.into(),
        device_class_names: vec![format!("{name}-whole")],
        ..GpuClassObserved::default()
    }))
}

/// Facts of a node of `group` that passed its DRA preparation: labels, Ready
/// PhysicalGPUs, the node agent running (as the chart labels it; the chart has
/// no vendor adapter) and serving: the cards published in its slice.
pub fn mk_ready_dra_node(name: &str, group: &str, gpus: u32) -> Vec<DomainEvent> {
    let labels = [(GPU_SETUP_COMPLETE_LABEL, ""), (GPU_STACK_LABEL, "dra")];
    let mut facts = vec![
        NodeSpec {
            labels: &labels,
            gpus,
            ..NodeSpec::new(name, group)
        }
        .fact(),
    ];
    for i in 0..gpus {
        facts.push(mk_gpu(&format!("{name}-gpu-{i}"), name, true));
    }
    facts.push(mk_node_agent_pod(name));
    facts.push(mk_slice_of(name, gpus));
    facts
}

pub fn mk_placement(limits: &[(&str, &str)], selector: &[(&str, &str)]) -> WorkloadPlacement {
    let list = ResourceList {
        quantities: limits
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    };
    WorkloadPlacement {
        container_limits: [("main".to_string(), list)].into(),
        container_requests: BTreeMap::new(),
        node_selector: selector
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        tolerations: None,
    }
}

pub fn mk_workload(
    namespace: &str,
    name: &str,
    replicas: u32,
    placement: WorkloadPlacement,
) -> DomainEvent {
    ev(Kind::WorkloadObserved(WorkloadObserved {
        workload: Some(WorkloadRef {
            namespace: namespace.into(),
            kind: "Deployment".into(),
            name: name.into(),
        }),
        replicas,
        placement: Some(placement),
        managed_by: String::new(),
        owner: None,
        restarted_at: String::new(),
    }))
}

pub fn mk_app_pod(
    namespace: &str,
    name: &str,
    workload: &str,
    node: &str,
    phase: PodPhase,
    claims: (u32, u32),
) -> DomainEvent {
    let mut pod = mk_pod(
        namespace,
        name,
        node,
        ("Deployment", workload),
        workload,
        phase,
    );
    if let Some(Kind::PodObserved(p)) = &mut pod.kind {
        p.claims_allocated = claims.0;
        p.claims_needed = claims.1;
    }
    pod
}

/// A workload's or pod's fact carrying the restart `restarted_at` (the
/// template's `kubectl.kubernetes.io/restartedAt`, which a pod made from it
/// carries too).
pub fn with_restart(mut fact: DomainEvent, restarted_at: &str) -> DomainEvent {
    match &mut fact.kind {
        Some(Kind::PodObserved(p)) => p.restarted_at = restarted_at.into(),
        Some(Kind::WorkloadObserved(w)) => w.restarted_at = restarted_at.into(),
        other => panic!("no restart to carry on {other:?}"),
    }
    fact
}

pub fn mk_quota(namespace: &str, name: &str, hard: &[(&str, &str)]) -> DomainEvent {
    ev(Kind::ResourceQuotaObserved(
        switchyard_proto::v1::ResourceQuotaObserved {
            namespace: namespace.into(),
            name: name.into(),
            hard: hard
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        },
    ))
}

/// A GPU node as GPU Feature Discovery labels it, with these labels too.
pub fn mk_gfd_node(name: &str, labels: &[(&str, &str)], allocatable: u32) -> DomainEvent {
    let all: BTreeMap<String, String> = [
        ("nvidia.com/gpu.present", "true"),
        ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),
        ("nvidia.com/gpu.count", "2"),
        ("nvidia.com/gpu.memory", "81559"),
    ]
    .iter()
    .chain(labels)
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    ev(Kind::NodeObserved(NodeObserved {
        node: name.into(),
        labels: all,
        gpu_allocatable: if allocatable > 0 {
            BTreeMap::from([("nvidia.com/gpu".to_string(), allocatable)])
        } else {
            BTreeMap::new()
        },
        ..Default::default()
    }))
}

/// The nvidia-operator backend with the guide's pools: `legacy` on the
/// device plugin, `dra-pilot` on DRA.
pub fn guide_backend() -> switchyard_core::backend::Backend {
    switchyard_core::backend::Backend::NvidiaOperator(Box::new(
        switchyard_core::backend::NvidiaOperator {
            pools: BTreeMap::from([
                (
                    "legacy".to_string(),
                    switchyard_proto::v1::Stack::DevicePlugin,
                ),
                ("dra-pilot".to_string(), switchyard_proto::v1::Stack::Dra),
            ]),
            ..switchyard_core::backend::NvidiaOperator::default()
        },
    ))
}

/// The `gpu.nvidia.com` slice of `node`: two H100s as the driver publishes them.
pub fn mk_h100_slice(node: &str) -> DomainEvent {
    ev(Kind::ResourceSliceObserved(
        switchyard_proto::v1::ResourceSliceObserved {
            name: format!("{node}-gpu.nvidia.com"),
            driver: "gpu.nvidia.com".into(),
            node: node.into(),
            pool: node.into(),
            devices: 2,
            device_list: (0..2)
                .map(|minor| switchyard_proto::v1::SliceDevice {
                    name: format!("gpu-{minor}"),
                    r#type: "gpu".into(),
                    uuid: format!("GPU-{node}-{minor}"),
                    product: "NVIDIA H100 80GB HBM3".into(),
                    memory_mib: 81559,
                })
                .collect(),
        },
    ))
}

/// Card `i` of `node` as its DRA slice publishes it.
pub fn mk_card(node: &str, i: u32) -> switchyard_proto::v1::SliceDevice {
    switchyard_proto::v1::SliceDevice {
        name: format!("gpu-{i}"),
        r#type: "gpu".into(),
        uuid: format!("GPU-{node}-{i}"),
        product: "NVIDIA A100-SXM4-40GB".into(),
        memory_mib: 40_960,
    }
}

/// The node agent's ResourceSlice of `node` with `devices`.
pub fn mk_slice(node: &str, devices: Vec<switchyard_proto::v1::SliceDevice>) -> DomainEvent {
    ev(Kind::ResourceSliceObserved(
        switchyard_proto::v1::ResourceSliceObserved {
            name: format!("{node}-gpu.deckhouse.io-0"),
            driver: "gpu.deckhouse.io".into(),
            node: node.into(),
            pool: node.into(),
            devices: devices.len() as u32,
            device_list: devices,
        },
    ))
}

/// The slice of `node` publishing its cards `0..cards`.
pub fn mk_slice_of(node: &str, cards: u32) -> DomainEvent {
    mk_slice(node, (0..cards).map(|i| mk_card(node, i)).collect())
}

//! Kubernetes objects as fact events: pure functions from an object to the
//! fact that describes it, the same facts the simulator reports. Only what the
//! cores read is carried, so an unrelated change (a status heartbeat, a managed
//! field) gives the same bytes and is not reported again.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{Container, Node, Pod, PodSpec, PodTemplateSpec, ResourceQuota};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use switchyard_api::{GPUClass, ModuleConfig, NodeGroup, PhysicalGPU};
use switchyard_core::names::{
    GPU_DEVICE_LABEL, NVIDIA_GPU, NVIDIA_GPU_SHARED, NVIDIA_MIG_PREFIX, RESTARTED_AT_ANNOTATION,
};
use switchyard_proto::v1::{
    AllocatedDevice, DeviceClassObserved, DeviceClassRemoved, DomainEvent, GpuClassObserved,
    GpuClassRemoved, GpuPhase, GpuSharing, GpuSpec, LabelSelector, LabelSelectorRequirement,
    ModuleSettingsObserved, NodeGroupObserved, NodeGroupRemoved, NodeObserved, NodeProvisioning,
    NodeRemoved, PhysicalGpuObserved, PhysicalGpuRemoved, PodObserved, PodPhase, PodRemoved,
    ResourceClaimObserved, ResourceClaimRemoved, ResourceList, ResourceQuotaObserved,
    ResourceSliceObserved, ResourceSliceRemoved, SliceDevice, Taint, WorkloadObserved,
    WorkloadPlacement, WorkloadRef, WorkloadRemoved, domain_event::Kind, event,
};

/// The ModuleConfig of the GPU module.
pub const MODULE_CONFIG_NAME: &str = "gpu";
/// Annotation on the ModuleConfig naming the module version that ran before
/// this one (written by the module's upgrade); absent on a fresh install.
pub const PREVIOUS_VERSION_ANNOTATION: &str = "gpu.deckhouse.io/previous-module-version";
/// Annotation the node agent writes on its node: how many GPUs it found.
pub const GPU_COUNT_ANNOTATION: &str = "gpu.deckhouse.io/physical-gpus";

/// Whether an extended resource is one the device plugin publishes for GPUs:
/// `nvidia.com/gpu`, its time-slicing `nvidia.com/gpu.shared`, MIG partitions
/// `nvidia.com/mig-<profile>`.
pub fn is_device_plugin_gpu_resource(name: &str) -> bool {
    name == NVIDIA_GPU || name == NVIDIA_GPU_SHARED || name.starts_with(NVIDIA_MIG_PREFIX)
}

/// The device-plugin GPU resources a pod asks for, over its containers (an
/// extended resource's request equals its limit when both are given; a count
/// that does not parse counts as one): (those the device plugin serves,
/// those DRA serves through the bridge — the scheduler's claim maps them,
/// `bridged` as (container, resource)).
fn device_plugin_gpus(spec: &PodSpec, bridged: &[(String, String)]) -> (u32, u32) {
    let mut sums = (0u32, 0u32);
    for c in &spec.containers {
        let Some(r) = c.resources.as_ref() else {
            continue;
        };
        let limits = r.limits.iter().flatten();
        let asked = limits.chain(
            r.requests
                .iter()
                .flatten()
                .filter(|(k, _)| !r.limits.as_ref().is_some_and(|l| l.contains_key(*k))),
        );
        for (name, q) in asked.filter(|(name, _)| is_device_plugin_gpu_resource(name)) {
            let n = q.0.parse::<u32>().unwrap_or(1);
            let sum = if bridged.iter().any(|(cn, rn)| *cn == c.name && rn == name) {
                &mut sums.1
            } else {
                &mut sums.0
            };
            *sum = sum.saturating_add(n);
        }
    }
    sums
}

/// A Node: labels, taints, `spec.unschedulable`, how it was provisioned,
/// how many GPUs it carries and the device plugin's allocatable GPU resources.
pub fn node(node: &Node) -> DomainEvent {
    let spec = node.spec.clone().unwrap_or_default();
    let taints = spec
        .taints
        .unwrap_or_default()
        .into_iter()
        .map(|t| Taint {
            key: t.key,
            value: t.value.unwrap_or_default(),
            effect: t.effect,
        })
        .collect();
    // Deckhouse's static provider names StaticInstance machines `static://…`;
    // any other provider ID is a cloud machine; none at all is a node added by hand.
    let provisioning = match spec.provider_id.as_deref() {
        None | Some("") => NodeProvisioning::Manual,
        Some(id) if id.starts_with("static://") => NodeProvisioning::StaticInstance,
        Some(_) => NodeProvisioning::Cloud,
    };
    let from_agent = node
        .annotations()
        .get(GPU_COUNT_ANNOTATION)
        .and_then(|v| v.parse::<u32>().ok());
    let from_plugin = node
        .status
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get(NVIDIA_GPU))
        .and_then(|q| q.0.parse::<u32>().ok());
    // Extended resources are whole numbers (the API server refuses others);
    // 0 is left out, as the device plugin having gone.
    let gpu_allocatable = node
        .status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .into_iter()
        .flatten()
        .filter(|(name, _)| is_device_plugin_gpu_resource(name))
        .filter_map(|(name, q)| Some((name.clone(), q.0.parse::<u32>().ok()?)))
        .filter(|(_, n)| *n > 0)
        .collect();
    event(Kind::NodeObserved(NodeObserved {
        node: node.name_any(),
        labels: node.labels().clone(),
        taints,
        unschedulable: spec.unschedulable.unwrap_or(false),
        provisioning: provisioning as i32,
        gpu_count: from_agent.or(from_plugin).unwrap_or(0),
        gpu_allocatable,
    }))
}

pub fn node_removed(node: &Node) -> DomainEvent {
    event(Kind::NodeRemoved(NodeRemoved {
        node: node.name_any(),
    }))
}

pub fn node_group(group: &NodeGroup) -> DomainEvent {
    let gpu = group.spec.gpu.as_ref().map(|gpu| GpuSpec {
        sharing: match gpu.sharing {
            switchyard_api::GpuSharing::Exclusive => GpuSharing::Exclusive,
            switchyard_api::GpuSharing::TimeSlicing => GpuSharing::TimeSlicing,
            switchyard_api::GpuSharing::Mig => GpuSharing::Mig,
        } as i32,
        partition_count: gpu.time_slicing.as_ref().map_or(0, |t| t.partition_count),
        mig_parted_config: gpu
            .mig
            .as_ref()
            .map_or(String::new(), |m| m.parted_config.clone()),
    });
    let node_type = serde_json::to_value(group.spec.node_type)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    event(Kind::NodeGroupObserved(NodeGroupObserved {
        group: group.name_any(),
        node_type,
        gpu,
        node_labels: BTreeMap::new(),
        node_taints: Vec::new(),
    }))
}

pub fn node_group_removed(group: &NodeGroup) -> DomainEvent {
    event(Kind::NodeGroupRemoved(NodeGroupRemoved {
        group: group.name_any(),
    }))
}

/// The GPU module's settings, or `None` for another module's ModuleConfig.
/// `module_version` is the running Switchyard's; `platform` what the API
/// server says of itself (version, feature gates, `resource.k8s.io/v1`).
pub fn module_settings(
    config: &ModuleConfig,
    module_version: &str,
    platform: &crate::platform::Platform,
) -> Option<DomainEvent> {
    if config.name_any() != MODULE_CONFIG_NAME {
        return None;
    }
    let dra_enabled = config
        .spec
        .settings
        .as_ref()
        .and_then(|s| s.dra.as_ref())
        .is_some_and(|d| d.enabled);
    let previous = config
        .annotations()
        .get(PREVIOUS_VERSION_ANNOTATION)
        .cloned()
        .unwrap_or_default();
    Some(settings(dra_enabled, previous, module_version, platform))
}

/// The platform's facts as module settings, for a cluster with no gpu
/// ModuleConfig (the nvidia-operator backend): DRA's API and feature gates
/// as the API server reports them, `dra.enabled` off (there is no module
/// setting), no previous version (no upgrade hold).
pub fn platform_settings(
    module_version: &str,
    platform: &crate::platform::Platform,
) -> DomainEvent {
    settings(false, String::new(), module_version, platform)
}

/// Module settings with the platform as read, and whether it meets the
/// prerequisites.
fn settings(
    dra_enabled: bool,
    previous_module_version: String,
    module_version: &str,
    platform: &crate::platform::Platform,
) -> DomainEvent {
    let prerequisites = switchyard_core::cluster::ModuleSettings {
        kubernetes_version: platform.kubernetes_version.clone(),
        feature_gates: platform.feature_gates.clone(),
        dra_api_served: platform.dra_api_served,
        feature_gates_error: platform.feature_gates_error.clone(),
        ..Default::default()
    };
    event(Kind::ModuleSettingsObserved(ModuleSettingsObserved {
        dra_enabled,
        feature_gates_ready: prerequisites.prerequisites_missing().is_empty(),
        module_version: module_version.to_string(),
        previous_module_version,
        kubernetes_version: platform.kubernetes_version.clone(),
        feature_gates: platform.feature_gates.clone(),
        dra_api_served: platform.dra_api_served,
        feature_gates_error: platform.feature_gates_error.clone(),
    }))
}

pub fn physical_gpu(gpu: &PhysicalGPU) -> DomainEvent {
    let status = gpu.status.clone().unwrap_or_default();
    let phase = match status.phase {
        None => GpuPhase::Unspecified,
        Some(switchyard_api::GpuPhase::Pending) => GpuPhase::Pending,
        Some(switchyard_api::GpuPhase::Ready) => GpuPhase::Ready,
        Some(switchyard_api::GpuPhase::Failed) => GpuPhase::Failed,
    };
    event(Kind::PhysicalGpuObserved(PhysicalGpuObserved {
        name: gpu.name_any(),
        node: gpu.spec.node.clone(),
        index: gpu.spec.index,
        uuid: gpu.spec.uuid.clone(),
        product: gpu.spec.product.clone(),
        device: gpu
            .labels()
            .get(GPU_DEVICE_LABEL)
            .cloned()
            .unwrap_or_default(),
        memory_mib: status.capabilities.map_or(0, |c| c.memory_mib),
        phase: phase as i32,
    }))
}

pub fn physical_gpu_removed(gpu: &PhysicalGPU) -> DomainEvent {
    event(Kind::PhysicalGpuRemoved(PhysicalGpuRemoved {
        name: gpu.name_any(),
        node: gpu.spec.node.clone(),
    }))
}

pub fn gpu_class(class: &GPUClass) -> DomainEvent {
    let spec = &class.spec;
    let selector = LabelSelector {
        match_labels: spec.selector.match_labels.clone().unwrap_or_default(),
        match_expressions: spec
            .selector
            .match_expressions
            .iter()
            .flatten()
            .map(|r| LabelSelectorRequirement {
                key: r.key.clone(),
                operator: r.operator.clone(),
                values: r.values.clone().unwrap_or_default(),
            })
            .collect(),
    };
    let status = class.status.clone().unwrap_or_default();
    event(Kind::GpuClassObserved(GpuClassObserved {
        name: class.name_any(),
        device_class_names: status.device_class_names.clone(),
        selector: Some(selector),
        whole: spec.partitions.as_ref().and_then(|p| p.whole),
        mig_profiles: spec
            .partitions
            .as_ref()
            .map(|p| p.mig_profiles.clone())
            .unwrap_or_default(),
        time_slicing_replicas: spec.sharing.as_ref().map_or(0, |s| s.time_slicing_replicas),
        generation: class.metadata.generation.unwrap_or(0),
        legacy_bridge: spec.legacy_bridge.unwrap_or(false),
        namespaces: spec.namespaces.clone(),
        refused_condition: status
            .conditions
            .iter()
            .find(|c| c.type_ == "Ready" && c.status == "False")
            .map(|c| c.message.clone())
            .unwrap_or_default(),
    }))
}

pub fn gpu_class_removed(class: &GPUClass) -> DomainEvent {
    event(Kind::GpuClassRemoved(GpuClassRemoved {
        name: class.name_any(),
    }))
}

/// The node an allocated claim's devices are on: `status.allocation.nodeSelector`
/// naming one node (by `metadata.name` field or the `kubernetes.io/hostname`
/// label), else the node of a pod it is reserved for (`pod_node` looks a pod
/// up by namespace and name). Empty while not allocated, or allocated on
/// devices that are not one node's.
pub fn claim_node(
    claim: &ResourceClaim,
    pod_node: impl Fn(&str, &str) -> Option<String>,
) -> String {
    let Some(status) = claim.status.as_ref() else {
        return String::new();
    };
    let Some(allocation) = status.allocation.as_ref() else {
        return String::new();
    };
    let single = |values: &Option<Vec<String>>| match values.as_deref() {
        Some([one]) => Some(one.clone()),
        _ => None,
    };
    let from_selector =
        allocation
            .node_selector
            .as_ref()
            .and_then(|s| match s.node_selector_terms.as_slice() {
                [term] => term
                    .match_fields
                    .iter()
                    .flatten()
                    .find(|r| r.key == "metadata.name" && r.operator == "In")
                    .and_then(|r| single(&r.values))
                    .or_else(|| {
                        term.match_expressions
                            .iter()
                            .flatten()
                            .find(|r| r.key == "kubernetes.io/hostname" && r.operator == "In")
                            .and_then(|r| single(&r.values))
                    }),
                _ => None,
            });
    let namespace = claim.namespace().unwrap_or_default();
    from_selector
        .or_else(|| {
            status
                .reserved_for
                .iter()
                .flatten()
                .filter(|r| r.resource == "pods" && r.api_group.as_deref().unwrap_or("").is_empty())
                .find_map(|r| pod_node(&namespace, &r.name))
        })
        .unwrap_or_default()
}

/// A ResourceClaim: the DeviceClasses its requests (and their alternatives)
/// name, and the node it is allocated on ([`claim_node`]).
pub fn resource_claim(claim: &ResourceClaim) -> DomainEvent {
    resource_claim_on(claim, |_, _| None)
}

/// [`resource_claim`] with a lookup of pods' nodes, for claims allocated
/// without a node selector.
pub fn resource_claim_on(
    claim: &ResourceClaim,
    pod_node: impl Fn(&str, &str) -> Option<String>,
) -> DomainEvent {
    let mut classes: Vec<String> = claim
        .spec
        .devices
        .as_ref()
        .and_then(|d| d.requests.as_ref())
        .into_iter()
        .flatten()
        .flat_map(|r| {
            r.exactly.iter().map(|e| e.device_class_name.clone()).chain(
                r.first_available
                    .iter()
                    .flatten()
                    .map(|s| s.device_class_name.clone()),
            )
        })
        .collect();
    classes.sort();
    classes.dedup();
    let status = claim.status.as_ref();
    let allocated = status
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .into_iter()
        .flat_map(|d| d.results.iter().flatten())
        .map(|r| AllocatedDevice {
            request: r.request.clone(),
            driver: r.driver.clone(),
            pool: r.pool.clone(),
            device: r.device.clone(),
        })
        .collect();
    let reserved_for = status
        .and_then(|s| s.reserved_for.as_ref())
        .into_iter()
        .flatten()
        .filter(|r| r.resource == "pods" && r.api_group.as_deref().unwrap_or_default().is_empty())
        .map(|r| r.name.clone())
        .collect();
    let owner_pod = claim
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true) && o.kind == "Pod" && o.api_version == "v1")
        .map(|o| o.name.clone())
        .unwrap_or_default();
    event(Kind::ResourceClaimObserved(ResourceClaimObserved {
        namespace: claim.namespace().unwrap_or_default(),
        name: claim.name_any(),
        device_classes: classes,
        node: claim_node(claim, pod_node),
        allocated,
        reserved_for,
        owner_pod,
    }))
}

pub fn resource_claim_removed(claim: &ResourceClaim) -> DomainEvent {
    event(Kind::ResourceClaimRemoved(ResourceClaimRemoved {
        namespace: claim.namespace().unwrap_or_default(),
        name: claim.name_any(),
    }))
}

/// The controller that owns a pod, as the workload the operator knows: a
/// ReplicaSet's pods belong to its Deployment (the ReplicaSet is named
/// `<deployment>-<pod-template-hash>`).
fn pod_owner(pod: &Pod) -> Option<WorkloadRef> {
    let owner = pod
        .owner_references()
        .iter()
        .find(|o| o.controller == Some(true))?;
    let (kind, name) = match owner.kind.as_str() {
        "ReplicaSet" => match pod.labels().get("pod-template-hash") {
            Some(hash) => match owner.name.strip_suffix(&format!("-{hash}")) {
                Some(deployment) => ("Deployment", deployment.to_string()),
                None => ("ReplicaSet", owner.name.clone()),
            },
            None => ("ReplicaSet", owner.name.clone()),
        },
        kind => (kind, owner.name.clone()),
    };
    Some(WorkloadRef {
        namespace: pod.namespace().unwrap_or_default(),
        kind: kind.to_string(),
        name,
    })
}

pub fn pod(pod: &Pod) -> DomainEvent {
    let spec = pod.spec.clone().unwrap_or_default();
    let phase = match pod.status.as_ref().and_then(|s| s.phase.as_deref()) {
        Some("Pending") => PodPhase::Pending,
        Some("Running") => PodPhase::Running,
        Some("Succeeded") => PodPhase::Succeeded,
        Some("Failed") => PodPhase::Failed,
        _ => PodPhase::Unspecified,
    };
    let node = spec.node_name.clone().unwrap_or_default();
    // The pod's own claims, and the one the scheduler makes for its extended
    // resources backed by a DeviceClass (`gpu.deckhouse.io/<class>: N`),
    // named in the pod's status once made.
    let extended_status = pod
        .status
        .as_ref()
        .and_then(|s| s.extended_resource_claim_status.as_ref())
        .filter(|s| !s.resource_claim_name.is_empty());
    let extended = extended_status.is_some();
    let bridged: Vec<(String, String)> = extended_status
        .iter()
        .flat_map(|s| &s.request_mappings)
        .map(|m| (m.container_name.clone(), m.resource_name.clone()))
        .collect();
    let (device_plugin_gpus, bridged_gpus) = device_plugin_gpus(&spec, &bridged);
    let claims_needed =
        spec.resource_claims.as_ref().map_or(0, Vec::len) as u32 + u32::from(extended);
    // The scheduler binds a pod only once all its claims are allocated and
    // reserved for it: a scheduled pod has them all.
    let claims_allocated = if node.is_empty() { 0 } else { claims_needed };
    let owner = pod_owner(pod);
    // The stacks' pods (a DaemonSet's, or pods no controller owns) carry
    // their labels, for the readiness selectors; other pods' labels no core
    // reads.
    let labels = match &owner {
        Some(o) if o.kind != "DaemonSet" => BTreeMap::new(),
        _ => pod.labels().clone(),
    };
    event(Kind::PodObserved(PodObserved {
        namespace: pod.namespace().unwrap_or_default(),
        name: pod.name_any(),
        node,
        owner,
        labels,
        phase: phase as i32,
        app: pod.labels().get("app").cloned().unwrap_or_default(),
        claims_allocated,
        claims_needed,
        device_plugin_gpus,
        bridged_gpus,
        restarted_at: pod
            .annotations()
            .get(RESTARTED_AT_ANNOTATION)
            .cloned()
            .unwrap_or_default(),
    }))
}

pub fn pod_removed(pod: &Pod) -> DomainEvent {
    event(Kind::PodRemoved(PodRemoved {
        namespace: pod.namespace().unwrap_or_default(),
        name: pod.name_any(),
    }))
}

fn quantities(list: Option<&BTreeMap<String, Quantity>>) -> ResourceList {
    ResourceList {
        quantities: list
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.0.clone()))
            .collect(),
    }
}

/// The parts of a pod template an application move changes.
pub fn placement(spec: Option<&PodSpec>) -> WorkloadPlacement {
    let containers: &[Container] = spec.map_or(&[], |s| &s.containers);
    let mut placement = WorkloadPlacement {
        node_selector: spec
            .and_then(|s| s.node_selector.clone())
            .unwrap_or_default(),
        tolerations: Some(switchyard_proto::v1::Tolerations {
            items: spec
                .and_then(|s| s.tolerations.as_ref())
                .into_iter()
                .flatten()
                .map(|t| switchyard_proto::v1::Toleration {
                    key: t.key.clone().unwrap_or_default(),
                    operator: t.operator.clone().unwrap_or_default(),
                    value: t.value.clone().unwrap_or_default(),
                    effect: t.effect.clone().unwrap_or_default(),
                    toleration_seconds: t.toleration_seconds,
                })
                .collect(),
        }),
        ..WorkloadPlacement::default()
    };
    // A container without limits (requests) has no entry: one form per template.
    for c in containers {
        let resources = c.resources.as_ref();
        let limits = quantities(resources.and_then(|r| r.limits.as_ref()));
        if !limits.quantities.is_empty() {
            placement.container_limits.insert(c.name.clone(), limits);
        }
        let requests = quantities(resources.and_then(|r| r.requests.as_ref()));
        if !requests.quantities.is_empty() {
            placement
                .container_requests
                .insert(c.name.clone(), requests);
        }
    }
    placement
}

pub fn deployment(d: &Deployment) -> DomainEvent {
    let spec = d.spec.as_ref();
    workload(
        &d.metadata,
        "Deployment",
        spec.and_then(|s| s.replicas).unwrap_or(1),
        spec.map(|s| &s.template),
    )
}

pub fn stateful_set(s: &StatefulSet) -> DomainEvent {
    let spec = s.spec.as_ref();
    workload(
        &s.metadata,
        "StatefulSet",
        spec.and_then(|s| s.replicas).unwrap_or(1),
        spec.map(|s| &s.template),
    )
}

/// A DaemonSet's pods are as many as the nodes its controller schedules it
/// to, counted for the spec it last saw: until it has seen the current one
/// the count is not known, and is 0 (a move is not verified on an old count).
pub fn daemon_set(d: &DaemonSet) -> DomainEvent {
    let status = d.status.as_ref();
    let current = status.and_then(|s| s.observed_generation) == d.metadata.generation;
    let desired = status
        .filter(|_| current)
        .map_or(0, |s| s.desired_number_scheduled);
    workload(
        &d.metadata,
        "DaemonSet",
        desired,
        d.spec.as_ref().map(|s| &s.template),
    )
}

/// A Job while it runs wants its parallelism; a finished one (Complete or
/// Failed) none. A CronJob's Job names the CronJob as its owner.
pub fn job(j: &Job) -> DomainEvent {
    let spec = j.spec.as_ref();
    let finished = j
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .any(|c| matches!(c.type_.as_str(), "Complete" | "Failed") && c.status == "True");
    let parallelism = spec.and_then(|s| s.parallelism).unwrap_or(1);
    let mut fact = workload(
        &j.metadata,
        "Job",
        if finished { 0 } else { parallelism },
        spec.map(|s| &s.template),
    );
    if let Some(Kind::WorkloadObserved(w)) = &mut fact.kind {
        w.owner = j
            .owner_references()
            .iter()
            .find(|o| o.controller == Some(true) && o.kind == "CronJob")
            .map(|o| {
                Box::new(WorkloadRef {
                    namespace: j.namespace().unwrap_or_default(),
                    kind: "CronJob".to_string(),
                    name: o.name.clone(),
                })
            });
    }
    fact
}

/// A CronJob's template is its Jobs' (`spec.jobTemplate.spec.template`).
pub fn cron_job(c: &CronJob) -> DomainEvent {
    workload(
        &c.metadata,
        "CronJob",
        0,
        c.spec.job_template.spec.as_ref().map(|s| &s.template),
    )
}

pub fn workload_removed(meta: &ObjectMeta, kind: &str) -> DomainEvent {
    event(Kind::WorkloadRemoved(WorkloadRemoved {
        workload: Some(WorkloadRef {
            namespace: meta.namespace.clone().unwrap_or_default(),
            kind: kind.to_string(),
            name: meta.name.clone().unwrap_or_default(),
        }),
    }))
}

fn workload(
    meta: &ObjectMeta,
    kind: &str,
    replicas: i32,
    template: Option<&PodTemplateSpec>,
) -> DomainEvent {
    let restarted_at = template
        .and_then(|t| t.metadata.as_ref())
        .and_then(|m| m.annotations.as_ref())
        .and_then(|a| a.get(RESTARTED_AT_ANNOTATION))
        .cloned()
        .unwrap_or_default();
    event(Kind::WorkloadObserved(WorkloadObserved {
        workload: Some(WorkloadRef {
            namespace: meta.namespace.clone().unwrap_or_default(),
            kind: kind.to_string(),
            name: meta.name.clone().unwrap_or_default(),
        }),
        replicas: replicas.max(0) as u32,
        placement: Some(placement(template.and_then(|t| t.spec.as_ref()))),
        managed_by: managed_by(meta),
        owner: None,
        restarted_at,
    }))
}

/// What keeps an object's manifest and would undo an edit made in place: the
/// controller that owns it (an operator), an Argo CD application, a Flux
/// Kustomization or HelmRelease, a Helm release — by the labels, annotations
/// and owner references these tools set; empty when none is found.
pub fn managed_by(meta: &ObjectMeta) -> String {
    let labels = meta.labels.as_ref();
    let annotations = meta.annotations.as_ref();
    let label = |key: &str| labels.and_then(|l| l.get(key)).filter(|v| !v.is_empty());
    let annotation = |key: &str| {
        annotations
            .and_then(|a| a.get(key))
            .filter(|v| !v.is_empty())
    };
    let namespaced = |ns: Option<&String>, name: &String| match ns {
        Some(ns) => format!("{ns}/{name}"),
        None => name.clone(),
    };
    if let Some(owner) = meta
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true))
    {
        return format!("operator {}/{}", owner.kind, owner.name);
    }
    if let Some(app) = label("argocd.argoproj.io/instance") {
        return format!("Argo CD application {app}");
    }
    if let Some(tracking) = annotation("argocd.argoproj.io/tracking-id") {
        let app = tracking.split(':').next().unwrap_or(tracking);
        return format!("Argo CD application {app}");
    }
    if let Some(name) = label("kustomize.toolkit.fluxcd.io/name") {
        let ns = label("kustomize.toolkit.fluxcd.io/namespace");
        return format!("Flux Kustomization {}", namespaced(ns, name));
    }
    if let Some(name) = label("helm.toolkit.fluxcd.io/name") {
        let ns = label("helm.toolkit.fluxcd.io/namespace");
        return format!("Flux HelmRelease {}", namespaced(ns, name));
    }
    if let Some(release) = annotation("meta.helm.sh/release-name") {
        let ns = annotation("meta.helm.sh/release-namespace");
        return format!("Helm release {}", namespaced(ns, release));
    }
    if label("app.kubernetes.io/managed-by").is_some_and(|v| v == "Helm") {
        return "Helm release (app.kubernetes.io/managed-by: Helm)".to_string();
    }
    String::new()
}

pub fn resource_quota(quota: &ResourceQuota) -> DomainEvent {
    event(Kind::ResourceQuotaObserved(ResourceQuotaObserved {
        namespace: quota.namespace().unwrap_or_default(),
        name: quota.name_any(),
        hard: quantities(quota.spec.as_ref().and_then(|s| s.hard.as_ref())).quantities,
    }))
}

pub fn resource_slice(slice: &ResourceSlice) -> DomainEvent {
    event(Kind::ResourceSliceObserved(ResourceSliceObserved {
        name: slice.name_any(),
        driver: slice.spec.driver.clone(),
        node: slice.spec.node_name.clone().unwrap_or_default(),
        pool: slice.spec.pool.name.clone(),
        devices: slice.spec.devices.as_ref().map_or(0, Vec::len) as u32,
        device_list: slice
            .spec
            .devices
            .iter()
            .flatten()
            .map(slice_device)
            .collect(),
    }))
}

/// A published device's identity: its `type`, `uuid` and `productName`
/// attributes and its `memory` capacity in MiB (0 when absent or not a
/// quantity).
fn slice_device(device: &k8s_openapi::api::resource::v1::Device) -> SliceDevice {
    let attribute = |name: &str| {
        device
            .attributes
            .as_ref()
            .and_then(|a| a.get(name))
            .and_then(|a| a.string.clone())
            .unwrap_or_default()
    };
    let memory_mib = device
        .capacity
        .as_ref()
        .and_then(|c| c.get("memory"))
        .and_then(|c| switchyard_dra::Quantity::parse(&c.value.0).ok())
        .map_or(0, |q| (q.value_rounded_up().max(0) as u64) >> 20);
    SliceDevice {
        name: device.name.clone(),
        r#type: attribute("type"),
        uuid: attribute("uuid"),
        product: attribute("productName"),
        memory_mib,
    }
}

pub fn resource_slice_removed(slice: &ResourceSlice) -> DomainEvent {
    event(Kind::ResourceSliceRemoved(ResourceSliceRemoved {
        name: slice.name_any(),
        node: slice.spec.node_name.clone().unwrap_or_default(),
    }))
}

pub fn device_class(class: &DeviceClass) -> DomainEvent {
    event(Kind::DeviceClassObserved(DeviceClassObserved {
        name: class.name_any(),
        selectors: class
            .spec
            .selectors
            .iter()
            .flatten()
            .filter_map(|s| s.cel.as_ref().map(|c| c.expression.clone()))
            .collect(),
        extended_resource_name: class
            .spec
            .extended_resource_name
            .clone()
            .unwrap_or_default(),
    }))
}

pub fn device_class_removed(class: &DeviceClass) -> DomainEvent {
    event(Kind::DeviceClassRemoved(DeviceClassRemoved {
        name: class.name_any(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeSpec, NodeStatus, Taint as KTaint};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn meta(name: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn a_node_carries_labels_taints_cordon_provisioning_and_gpus() {
        let mut n = Node {
            metadata: meta("gpu-1"),
            spec: Some(NodeSpec {
                unschedulable: Some(true),
                provider_id: Some("static://abc".into()),
                taints: Some(vec![KTaint {
                    key: "dedicated".into(),
                    value: Some("gpu".into()),
                    effect: "NoSchedule".into(),
                    ..KTaint::default()
                }]),
                ..NodeSpec::default()
            }),
            status: Some(NodeStatus {
                capacity: Some([(NVIDIA_GPU.to_string(), Quantity("8".into()))].into()),
                ..NodeStatus::default()
            }),
        };
        n.metadata.labels =
            Some([("node.deckhouse.io/group".to_string(), "gpu".to_string())].into());
        let Some(Kind::NodeObserved(f)) = node(&n).kind else {
            panic!("a NodeObserved")
        };
        assert_eq!(f.node, "gpu-1");
        assert_eq!(f.labels["node.deckhouse.io/group"], "gpu");
        assert!(f.unschedulable);
        assert_eq!(f.provisioning(), NodeProvisioning::StaticInstance);
        assert_eq!(f.gpu_count, 8);
        assert_eq!(f.taints[0].value, "gpu");
        // The node agent's count wins over the device plugin's capacity.
        n.metadata.annotations = Some([(GPU_COUNT_ANNOTATION.to_string(), "4".into())].into());
        n.spec.as_mut().unwrap().provider_id = None;
        let Some(Kind::NodeObserved(f)) = node(&n).kind else {
            panic!("a NodeObserved")
        };
        assert_eq!(f.gpu_count, 4);
        assert_eq!(f.provisioning(), NodeProvisioning::Manual);
    }

    #[test]
    fn a_node_carries_the_device_plugins_allocatable_gpu_resources() {
        let n = Node {
            metadata: meta("gpu-1"),
            spec: None,
            status: Some(NodeStatus {
                allocatable: Some(
                    [
                        (NVIDIA_GPU.to_string(), Quantity("0".into())),
                        ("nvidia.com/mig-1g.5gb".to_string(), Quantity("14".into())),
                        ("cpu".to_string(), Quantity("64".into())),
                        ("gpu.deckhouse.io/a100".to_string(), Quantity("8".into())),
                    ]
                    .into(),
                ),
                ..NodeStatus::default()
            }),
        };
        let Some(Kind::NodeObserved(f)) = node(&n).kind else {
            panic!("a NodeObserved")
        };
        assert_eq!(
            f.gpu_allocatable,
            [("nvidia.com/mig-1g.5gb".to_string(), 14)].into(),
            "nvidia.com/gpu at 0 is the device plugin gone; DRA's resources are not its"
        );
    }

    #[test]
    fn a_daemon_set_pod_and_an_unowned_pod_carry_their_labels_and_others_do_not() {
        let labels: BTreeMap<String, String> = [
            (
                "app.kubernetes.io/component".to_string(),
                "node-agent".to_string(),
            ),
            ("pod-template-hash".to_string(), "7d9f8".to_string()),
        ]
        .into();
        let mut p = Pod {
            metadata: meta("agent-abcde"),
            ..Pod::default()
        };
        p.metadata.labels = Some(labels.clone());
        p.metadata.owner_references = Some(vec![OwnerReference {
            kind: "DaemonSet".into(),
            name: "switchyard-node-agent".into(),
            controller: Some(true),
            ..OwnerReference::default()
        }]);
        let Some(Kind::PodObserved(f)) = pod(&p).kind else {
            panic!("a PodObserved")
        };
        assert_eq!(f.labels, labels);
        p.metadata.owner_references.as_mut().unwrap()[0].kind = "ReplicaSet".into();
        let Some(Kind::PodObserved(f)) = pod(&p).kind else {
            panic!("a PodObserved")
        };
        assert!(f.labels.is_empty());
        // A pod no controller owns is matched by its labels too.
        p.metadata.owner_references = None;
        let Some(Kind::PodObserved(f)) = pod(&p).kind else {
            panic!("a PodObserved")
        };
        assert_eq!(f.labels, labels);
    }

    #[test]
    fn an_allocated_claim_names_its_node() {
        let claim: ResourceClaim = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "train-0-gpu", "namespace": "ml"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "a100.gpu.deckhouse.io"}}]}},
            "status": {"allocation": {
                "devices": {"results": []},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": ["gpu-1"]}]}]},
            }},
        }))
        .unwrap();
        let Some(Kind::ResourceClaimObserved(f)) = resource_claim(&claim).kind else {
            panic!("a ResourceClaimObserved")
        };
        assert_eq!(f.node, "gpu-1");
        assert_eq!(f.device_classes, ["a100.gpu.deckhouse.io"]);
        // Without a node selector, the node of the pod it is reserved for.
        let mut reserved = claim.clone();
        let status = reserved.status.as_mut().unwrap();
        status.allocation.as_mut().unwrap().node_selector = None;
        status.reserved_for = Some(vec![
            serde_json::from_value(serde_json::json!(
                {"resource": "pods", "name": "train-0", "uid": "u1"}
            ))
            .unwrap(),
        ]);
        assert_eq!(claim_node(&reserved, |_, _| None), "");
        assert_eq!(
            claim_node(&reserved, |ns, pod| (ns == "ml" && pod == "train-0")
                .then(|| "gpu-2".into())),
            "gpu-2"
        );
        // Not allocated: no node.
        let mut pending = claim;
        pending.status = None;
        assert_eq!(claim_node(&pending, |_, _| Some("x".into())), "");
    }

    #[test]
    fn a_replica_set_pod_belongs_to_its_deployment() {
        let mut p = Pod {
            metadata: meta("train-7d9f8-abcde"),
            ..Pod::default()
        };
        p.metadata.namespace = Some("ml".into());
        p.metadata.labels = Some([("pod-template-hash".to_string(), "7d9f8".to_string())].into());
        p.metadata.owner_references = Some(vec![OwnerReference {
            kind: "ReplicaSet".into(),
            name: "train-7d9f8".into(),
            controller: Some(true),
            ..OwnerReference::default()
        }]);
        let Some(Kind::PodObserved(f)) = pod(&p).kind else {
            panic!("a PodObserved")
        };
        let owner = f.owner.clone().expect("owner");
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str()),
            ("Deployment", "train")
        );
        assert_eq!(f.phase(), PodPhase::Unspecified);
    }

    #[test]
    fn the_claim_the_scheduler_makes_for_an_extended_resource_is_counted() {
        use k8s_openapi::api::core::v1::{PodExtendedResourceClaimStatus, PodStatus};
        let mut p = Pod {
            metadata: meta("train-0"),
            ..Pod::default()
        };
        let counts = |p: &Pod| match pod(p).kind {
            Some(Kind::PodObserved(f)) => (f.claims_needed, f.claims_allocated),
            _ => panic!("a PodObserved"),
        };
        // Pending, not yet given its claim: nothing to count, nothing allocated.
        assert_eq!(counts(&p), (0, 0));
        p.status = Some(PodStatus {
            extended_resource_claim_status: Some(PodExtendedResourceClaimStatus {
                resource_claim_name: "train-0-extended-resources-abcde".into(),
                request_mappings: Vec::new(),
            }),
            ..PodStatus::default()
        });
        assert_eq!(counts(&p), (1, 0), "made, not yet bound");
        p.spec = Some(PodSpec {
            node_name: Some("gpu-0".into()),
            ..PodSpec::default()
        });
        assert_eq!(
            counts(&p),
            (1, 1),
            "bound: the scheduler allocated it first"
        );
    }

    #[test]
    fn only_the_gpu_module_config_is_a_fact() {
        let mut platform = crate::platform::Platform {
            kubernetes_version: "v1.36.3".into(),
            feature_gates: switchyard_core::names::REQUIRED_FEATURE_GATES
                .iter()
                .map(|g| (g.to_string(), true))
                .collect(),
            dra_api_served: true,
            feature_gates_error: String::new(),
        };
        let other = ModuleConfig::new("cni-cilium", Default::default());
        assert!(module_settings(&other, "2.0.0", &platform).is_none());
        let mut gpu = ModuleConfig::new(MODULE_CONFIG_NAME, Default::default());
        gpu.spec.settings = Some(switchyard_api::ModuleSettings {
            dra: Some(switchyard_api::DraSettings { enabled: true }),
        });
        gpu.metadata.annotations =
            Some([(PREVIOUS_VERSION_ANNOTATION.to_string(), "1.9.0".into())].into());
        let settings = |platform: &crate::platform::Platform| {
            let Some(Kind::ModuleSettingsObserved(f)) =
                module_settings(&gpu, "2.0.0", platform).and_then(|e| e.kind)
            else {
                panic!("settings")
            };
            f
        };
        let f = settings(&platform);
        assert!(f.dra_enabled && f.feature_gates_ready);
        assert_eq!(f.previous_module_version, "1.9.0");
        assert_eq!(f.kubernetes_version, "v1.36.3");
        // Any one prerequisite missing: not ready, and the fact says which.
        platform
            .feature_gates
            .insert("DRAConsumableCapacity".into(), false);
        let f = settings(&platform);
        assert!(!f.feature_gates_ready);
        assert_eq!(f.feature_gates.get("DRAConsumableCapacity"), Some(&false));
        platform
            .feature_gates
            .insert("DRAConsumableCapacity".into(), true);
        platform.kubernetes_version = "v1.33.5".into();
        assert!(!settings(&platform).feature_gates_ready);
        platform.kubernetes_version = "v1.34.2-eks-1".into();
        assert!(settings(&platform).feature_gates_ready);
        platform.feature_gates.remove("DRAExtendedResource");
        assert!(
            !settings(&platform).feature_gates_ready,
            "a gate not reported is not on"
        );
        // ...unless it went GA by this version and was removed.
        platform
            .feature_gates
            .insert("DRAExtendedResource".into(), true);
        platform.feature_gates.remove("DynamicResourceAllocation");
        assert!(settings(&platform).feature_gates_ready, "GA in 1.34");
    }

    #[test]
    fn what_keeps_a_manifest_is_named_by_the_tools_own_marks() {
        let with = |labels: &[(&str, &str)], annotations: &[(&str, &str)]| {
            let map = |kv: &[(&str, &str)]| {
                (!kv.is_empty()).then(|| {
                    kv.iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect()
                })
            };
            ObjectMeta {
                labels: map(labels),
                annotations: map(annotations),
                ..meta("train")
            }
        };
        assert_eq!(managed_by(&meta("train")), "");
        assert_eq!(
            managed_by(&with(
                &[("app.kubernetes.io/managed-by", "Helm")],
                &[
                    ("meta.helm.sh/release-name", "ml"),
                    ("meta.helm.sh/release-namespace", "team-a")
                ]
            )),
            "Helm release team-a/ml"
        );
        assert_eq!(
            managed_by(&with(&[("argocd.argoproj.io/instance", "ml-prod")], &[])),
            "Argo CD application ml-prod"
        );
        assert_eq!(
            managed_by(&with(
                &[],
                &[(
                    "argocd.argoproj.io/tracking-id",
                    "ml-prod:apps/Deployment:team-a/train"
                )]
            )),
            "Argo CD application ml-prod"
        );
        // Flux's Helm controller also leaves Helm's marks: Flux is what reverts.
        assert_eq!(
            managed_by(&with(
                &[
                    ("helm.toolkit.fluxcd.io/name", "ml"),
                    ("helm.toolkit.fluxcd.io/namespace", "flux-system"),
                    ("app.kubernetes.io/managed-by", "Helm")
                ],
                &[("meta.helm.sh/release-name", "ml")]
            )),
            "Flux HelmRelease flux-system/ml"
        );
        assert_eq!(
            managed_by(&with(
                &[
                    ("kustomize.toolkit.fluxcd.io/name", "apps"),
                    ("kustomize.toolkit.fluxcd.io/namespace", "flux-system")
                ],
                &[]
            )),
            "Flux Kustomization flux-system/apps"
        );
        let mut owned = meta("train");
        owned.owner_references = Some(vec![OwnerReference {
            api_version: "kubeflow.org/v1".into(),
            kind: "PyTorchJob".into(),
            name: "train".into(),
            uid: "u".into(),
            controller: Some(true),
            ..OwnerReference::default()
        }]);
        assert_eq!(managed_by(&owned), "operator PyTorchJob/train");
    }
}

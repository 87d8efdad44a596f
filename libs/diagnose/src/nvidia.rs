//! The NVIDIA guide's prerequisites on a cluster the GPU Operator serves
//! (a ClusterPolicy exists): the driver manager evicts DRA kubelet-plugin
//! pods before a driver upgrade only when `NODE_LABEL_FOR_GPU_POD_EVICTION`
//! names the DRA pool's label, and the DRA kubelet plugin must run on that
//! pool alone — the DRA chart selects no node label by default, so it would
//! run beside the device plugin on every GPU node.

use k8s_openapi::api::apps::v1::DaemonSet;
use serde_json::Value;
use switchyard_core::backend::nvidia;

use super::{Finding, Row, View, name_of, namespace_of, sh};

/// The label a ClusterPolicy's driver manager evicts GPU pods by
/// (`spec.driver.manager.env[NODE_LABEL_FOR_GPU_POD_EVICTION]`), if set.
fn eviction_label(policy: &Value) -> Option<&str> {
    policy["spec"]["driver"]["manager"]["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == nvidia::EVICTION_LABEL_ENV)?["value"]
        .as_str()
        .filter(|v| !v.is_empty())
}

fn policy_name(policy: &Value) -> &str {
    policy["metadata"]["name"].as_str().unwrap_or_default()
}

/// A ClusterPolicy whose driver manager does not know the DRA pool.
pub(crate) fn eviction_label_missing(view: &View) -> Vec<Finding> {
    view.s
        .cluster_policies
        .iter()
        .filter(|p| eviction_label(p).is_none())
        .map(|p| {
            Finding::new(
                Row::EvictionLabelMissing,
                vec![format!("ClusterPolicy/{}", policy_name(p))],
                format!(
                    "its spec.driver.manager.env has no {}: before a driver upgrade the driver manager does not evict the DRA kubelet plugin's pods, which hold the driver open",
                    nvidia::EVICTION_LABEL_ENV
                ),
                format!(
                    "helm upgrade gpu-operator nvidia/gpu-operator -n gpu-operator --reuse-values --set 'driver.manager.env[0].name={}' --set 'driver.manager.env[0].value={}'  # merge with any env already set",
                    nvidia::EVICTION_LABEL_ENV,
                    nvidia::DRA_KUBELET_PLUGIN
                ),
            )
        })
        .collect()
}

/// Whether a DaemonSet runs the NVIDIA DRA driver's kubelet plugin (its pods
/// labelled `<chart>-component: kubelet-plugin`).
fn is_kubelet_plugin(ds: &DaemonSet) -> bool {
    ds.spec
        .as_ref()
        .and_then(|s| s.template.metadata.as_ref())
        .and_then(|m| m.labels.as_ref())
        .is_some_and(|labels| {
            labels.iter().any(|(k, v)| {
                v == "kubelet-plugin"
                    && matches!(
                        k.as_str(),
                        "dra-driver-nvidia-gpu-component" | "nvidia-dra-driver-gpu-component"
                    )
            })
        })
}

/// The DRA kubelet plugin's DaemonSet not confined to the DRA pool's label
/// (the one the driver manager evicts by, or NVIDIA's default).
pub(crate) fn kubelet_plugin_unscoped(view: &View) -> Vec<Finding> {
    if view.s.cluster_policies.is_empty() {
        return Vec::new();
    }
    let pool = view
        .s
        .cluster_policies
        .iter()
        .find_map(eviction_label)
        .unwrap_or(nvidia::DRA_KUBELET_PLUGIN);
    view.s
        .daemon_sets
        .iter()
        .filter(|ds| is_kubelet_plugin(ds))
        .filter(|ds| {
            let selector = ds
                .spec
                .as_ref()
                .and_then(|s| s.template.spec.as_ref())
                .and_then(|p| p.node_selector.as_ref());
            selector.and_then(|s| s.get(pool)).map(String::as_str) != Some("true")
        })
        .map(|ds| {
            let (namespace, name) = (namespace_of(&ds.metadata), name_of(&ds.metadata));
            Finding::new(
                Row::KubeletPluginUnscoped,
                vec![format!("DaemonSet/{namespace}/{name}")],
                format!(
                    "its pods select no {pool}=\"true\" node: the DRA kubelet plugin runs on every GPU node, beside the GPU Operator's device plugin (the DRA chart's kubeletPlugin.nodeSelector is empty by default)"
                ),
                format!(
                    "helm upgrade {} nvidia/dra-driver-nvidia-gpu -n {} --reuse-values --set-json {}",
                    sh(name.trim_end_matches("-kubelet-plugin")),
                    sh(namespace),
                    sh(&format!("kubeletPlugin.nodeSelector={{\"{pool}\":\"true\"}}"))
                ),
            )
        })
        .collect()
}

fn device_class_resource(dc: &k8s_openapi::api::resource::v1::DeviceClass) -> Option<&str> {
    dc.spec
        .extended_resource_name
        .as_deref()
        .filter(|r| !r.is_empty())
}

/// The nodes that publish `gpu.nvidia.com` devices, and the claims the
/// driver's devices are allocated to (`namespace/name`).
fn dra_in_use<'a>(view: &View<'a>) -> (Vec<&'a str>, Vec<String>) {
    let mut nodes: Vec<&str> = view
        .s
        .slices
        .iter()
        .filter(|s| s.spec.driver == nvidia::DRIVER)
        .filter_map(|s| s.spec.node_name.as_deref())
        .collect();
    nodes.sort_unstable();
    nodes.dedup();
    let claims = view
        .s
        .claims
        .iter()
        .filter(|c| {
            c.status
                .as_ref()
                .and_then(|s| s.allocation.as_ref())
                .and_then(|a| a.devices.as_ref())
                .and_then(|d| d.results.as_ref())
                .is_some_and(|r| r.iter().any(|r| r.driver == nvidia::DRIVER))
        })
        .map(|c| format!("{}/{}", namespace_of(&c.metadata), name_of(&c.metadata)))
        .collect();
    (nodes, claims)
}

/// Information: the GPU Operator serves the GPUs here (a ClusterPolicy),
/// with what the backend drives — the operand DaemonSets and their node
/// selectors, the DRA driver's classes, the nodes DRA serves.
pub(crate) fn nvidia_backend_detected(view: &View) -> Vec<Finding> {
    let Some(policy) = view.s.cluster_policies.first() else {
        return Vec::new();
    };
    let daemon_sets: Vec<String> = view
        .s
        .daemon_sets
        .iter()
        .filter_map(|ds| {
            let selector = ds
                .spec
                .as_ref()?
                .template
                .spec
                .as_ref()?
                .node_selector
                .as_ref()?;
            let (key, value) = selector.iter().find(|(k, _)| {
                k.starts_with(nvidia::DEPLOY_PREFIX) || **k == nvidia::DRA_KUBELET_PLUGIN
            })?;
            Some(format!("{} ({key}={value})", name_of(&ds.metadata)))
        })
        .collect();
    let classes: Vec<&str> = view
        .s
        .device_classes
        .iter()
        .filter(|dc| name_of(&dc.metadata).ends_with("nvidia.com"))
        .map(|dc| name_of(&dc.metadata))
        .collect();
    let (dra_nodes, _) = dra_in_use(view);
    vec![Finding::new(
        Row::NvidiaBackendDetected,
        vec![format!("ClusterPolicy/{}", policy_name(policy))],
        format!(
            "the NVIDIA GPU Operator serves the GPUs: its operands {}; the DRA driver's classes {}; nodes publishing {} devices: {}",
            list(&daemon_sets),
            list(&classes),
            nvidia::DRIVER,
            list(&dra_nodes)
        ),
        "helm upgrade switchyard deploy/helm/switchyard -n switchyard-system --reuse-values --set backend=nvidia-operator  # if Switchyard runs another backend".into(),
    )]
}

fn list<T: AsRef<str>>(items: &[T]) -> String {
    if items.is_empty() {
        "none".into()
    } else {
        items
            .iter()
            .map(AsRef::as_ref)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The operator's DRA mode: GPUCluster cannot coexist with ClusterPolicy
/// (the node labeller fails with both) and has no in-place migration.
pub(crate) fn gpucluster_present(view: &View) -> Vec<Finding> {
    view.s
        .gpu_clusters
        .iter()
        .map(|g| {
            let name = g["metadata"]["name"].as_str().unwrap_or_default();
            let with_policy = if view.s.cluster_policies.is_empty() {
                "it replaces ClusterPolicy's per-node operands with no in-place migration"
            } else {
                "it cannot coexist with the ClusterPolicy here: the operator's node labeller fails while both exist"
            };
            Finding::new(
                Row::GpuClusterPresent,
                vec![format!("GPUCluster/{name}")],
                format!(
                    "the GPU Operator's DRA mode is configured: {with_policy}; Switchyard's nvidia-operator backend migrates a ClusterPolicy cluster pool by pool with the NVIDIA DRA driver instead"
                ),
                format!(
                    "kubectl delete gpucluster {}  # keep ClusterPolicy; install the DRA driver chart and let Switchyard move the pools",
                    sh(name)
                ),
            )
        })
        .collect()
}

/// Several DeviceClasses map `nvidia.com/gpu` (KEP-5004): unchanged
/// manifests are served by whichever the scheduler takes — the one created
/// last; of those created at the same moment, the first by name.
pub(crate) fn bridge_classes(view: &View) -> Vec<Finding> {
    let mut mapping: Vec<&k8s_openapi::api::resource::v1::DeviceClass> = view
        .s
        .device_classes
        .iter()
        .filter(|dc| device_class_resource(dc) == Some(switchyard_core::names::NVIDIA_GPU))
        .collect();
    if mapping.len() < 2 {
        return Vec::new();
    }
    mapping.sort_by(|a, b| name_of(&a.metadata).cmp(name_of(&b.metadata)));
    let created = |dc: &&k8s_openapi::api::resource::v1::DeviceClass| {
        dc.metadata.creation_timestamp.as_ref().map(|t| t.0)
    };
    let latest = mapping.iter().map(created).max().flatten();
    let picked = mapping
        .iter()
        .find(|dc| created(dc) == latest)
        .map_or("", |dc| name_of(&dc.metadata));
    let names: Vec<&str> = mapping.iter().map(|dc| name_of(&dc.metadata)).collect();
    vec![Finding::new(
        Row::BridgeClasses,
        names.iter().map(|n| format!("DeviceClass/{n}")).collect(),
        format!(
            "{} DeviceClasses map {} ({}): the scheduler serves unchanged manifests through {picked} (created last; by name when at the same moment), not necessarily the class the platform meant",
            names.len(),
            switchyard_core::names::NVIDIA_GPU,
            names.join(", ")
        ),
        format!(
            "kubectl get deviceclass {} -o custom-columns=NAME:.metadata.name,RESOURCE:.spec.extendedResourceName,CREATED:.metadata.creationTimestamp  # keep one bridge: remove legacyBridge from the GPUClass, or extendedResourceName from the other",
            names.join(" ")
        ),
    )]
}

/// gpu-operator#2550: the validator crashloops on a node whose device
/// plugin is off; the guide sets it off there too.
pub(crate) fn validator_off_needed(view: &View) -> Vec<Finding> {
    if view.s.cluster_policies.is_empty() {
        return Vec::new();
    }
    view.s
        .nodes
        .iter()
        .filter(|n| {
            let labels = n.metadata.labels.as_ref();
            let label = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
            label(nvidia::DEPLOY_DEVICE_PLUGIN) == Some("false")
                && switchyard_core::backend::DeployLabel::read(label(nvidia::DEPLOY_OPERATOR_VALIDATOR)).on()
        })
        .map(|n| {
            let name = name_of(&n.metadata);
            Finding::new(
                Row::ValidatorOffNeeded,
                vec![format!("Node/{name}")],
                format!(
                    "{}=false but {} is on: the operator's validator crashloops on nodes without the device plugin (gpu-operator#2550)",
                    nvidia::DEPLOY_DEVICE_PLUGIN,
                    nvidia::DEPLOY_OPERATOR_VALIDATOR
                ),
                format!(
                    "kubectl label node {} {}=false --overwrite  # Switchyard's nvidiaOperator.disableValidatorOnDra does this on DRA nodes",
                    sh(name),
                    nvidia::DEPLOY_OPERATOR_VALIDATOR
                ),
            )
        })
        .collect()
}

/// "Uninstall DRA only after the last DRA node is clear": the driver's
/// devices are still published or allocated while its kubelet plugin is
/// gone (or going).
pub(crate) fn dra_uninstall_unsafe(view: &View) -> Vec<Finding> {
    let plugins: Vec<&DaemonSet> = view
        .s
        .daemon_sets
        .iter()
        .filter(|ds| is_kubelet_plugin(ds))
        .collect();
    let running = plugins
        .iter()
        .any(|ds| ds.metadata.deletion_timestamp.is_none());
    if running {
        return Vec::new();
    }
    let (nodes, claims) = dra_in_use(view);
    if nodes.is_empty() && claims.is_empty() {
        return Vec::new();
    }
    let mut objects: Vec<String> = nodes.iter().map(|n| format!("Node/{n}")).collect();
    objects.extend(claims.iter().map(|c| format!("ResourceClaim/{c}")));
    vec![Finding::new(
        Row::DraUninstallUnsafe,
        objects,
        format!(
            "the DRA driver's kubelet plugin is {} while nodes still publish {} devices ({}) and claims hold them ({}): their pods lose their devices' unprepare and the nodes are left with stale slices",
            if plugins.is_empty() { "uninstalled" } else { "being deleted" },
            nvidia::DRIVER,
            list(&nodes),
            list(&claims)
        ),
        "helm upgrade --install nvidia-dra-driver-gpu nvidia/dra-driver-nvidia-gpu -n nvidia-dra-driver-gpu --reuse-values  # reinstall; roll every DRA node back (switchyard rollback node) before uninstalling again".into(),
    )]
}

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

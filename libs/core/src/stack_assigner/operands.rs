//! The `nvidia-operator` backend's writes for a node's decided stack, in the
//! order the NVIDIA guide runs them by hand, each step only once the cluster
//! shows the one before done — so no node ever has the device plugin and
//! the DRA kubelet plugin deployed at once:
//!
//! - to DRA: the pilot taint; the device plugin (and the validator) off and
//!   the ownership label `dra`; then, once no device-plugin pod is left on
//!   the node and no device-plugin GPU is allocatable, the DRA kubelet
//!   plugin's label;
//! - to the device plugin: the DRA kubelet plugin's label removed and the
//!   ownership label `legacy`; then, once no kubelet-plugin pod, no
//!   `gpu.nvidia.com` ResourceSlice and no allocated claim is left on the
//!   node, the device plugin (and the validator) on; then the pilot taint
//!   removed;
//! - to no stack: the plugin and ownership labels removed, the operator's
//!   own labels left as found.
//!
//! While the driver manager has paused a deploy label for a driver upgrade
//! (`…paused-for-driver-upgrade`), nothing is written: it restores the label
//! itself, and a write would fight it.

use std::collections::BTreeMap;

use switchyard_proto::v1::{PodPhase, Stack, Taint};

use crate::backend::{DeployLabel, NvidiaOperator, nvidia};
use crate::cluster::{Cluster, Node, PodSelector, Slice};
use crate::effects::Effect;

/// The pilot taint, `<domain>/mode=dra:NoSchedule`.
pub fn pilot_taint(backend: &NvidiaOperator) -> Taint {
    Taint {
        key: backend.mode_label(),
        value: nvidia::MODE_DRA.into(),
        effect: "NoSchedule".into(),
    }
}

/// What `name` (as `node` shows it) needs written next for `stack`, if
/// anything.
pub fn effects(
    name: &str,
    stack: Stack,
    node: &Node,
    cluster: &Cluster,
    backend: &NvidiaOperator,
) -> Vec<Effect> {
    let labels = |wanted: &[(&str, Option<&str>)]| patch(name, node, wanted);
    let mode = backend.mode_label();
    let plugin = backend.plugin_label.as_str();
    let tainted = node
        .taints
        .iter()
        .any(|t| t.key == mode && t.effect == "NoSchedule");
    let taint = |present: bool| Effect::SetNodeTaint {
        node: name.to_string(),
        taint: pilot_taint(backend),
        present,
    };
    let mut out = Vec::new();
    match stack {
        Stack::Dra => {
            if backend.pilot_taint && !tainted {
                out.push(taint(true));
            }
            let mut off = vec![
                (nvidia::DEPLOY_DEVICE_PLUGIN, Some("false")),
                (mode.as_str(), Some(nvidia::MODE_DRA)),
            ];
            if backend.disable_validator_on_dra {
                off.push((nvidia::DEPLOY_OPERATOR_VALIDATOR, Some("false")));
            }
            if let Some(write) = labels(&off) {
                out.extend(unless_paused(node, write));
            } else if device_plugin_gone(name, node, cluster, backend)
                && let Some(write) = labels(&[(plugin, Some("true"))])
            {
                out.push(write);
            }
        }
        Stack::DevicePlugin => {
            let dra_off = [(plugin, None), (mode.as_str(), Some(nvidia::MODE_LEGACY))];
            if let Some(write) = labels(&dra_off) {
                out.push(write);
            } else if dra_gone(name, cluster, backend) {
                let on = [
                    (nvidia::DEPLOY_DEVICE_PLUGIN, Some("true")),
                    (nvidia::DEPLOY_OPERATOR_VALIDATOR, Some("true")),
                ];
                match labels(&on) {
                    Some(write) => out.extend(unless_paused(node, write)),
                    None if tainted => out.push(taint(false)),
                    None => {}
                }
            }
        }
        Stack::None | Stack::Unspecified => {
            out.extend(labels(&[(plugin, None), (mode.as_str(), None)]));
        }
    }
    out
}

/// Why `name` waits before its next write for `stack`, in the guide's
/// words; `None` when it does not wait.
pub fn waiting_for(
    name: &str,
    stack: Stack,
    node: &Node,
    cluster: &Cluster,
    backend: &NvidiaOperator,
) -> Option<String> {
    if paused(node) {
        return Some(format!(
            "node {name}: the driver manager paused the GPU Operator's operands for a driver upgrade"
        ));
    }
    match stack {
        Stack::Dra if !device_plugin_gone(name, node, cluster, backend) => Some(format!(
            "node {name}: the device plugin is still deployed there ({} pod(s), {} GPU resource(s) allocatable)",
            pods_selected(name, cluster, &backend.device_plugin_pods, false).len(),
            node.device_plugin_allocatable
        )),
        Stack::DevicePlugin if !dra_gone(name, cluster, backend) => Some(format!(
            "node {name}: DRA still serves it ({} kubelet-plugin pod(s), {} gpu.nvidia.com slice(s), claims {:?})",
            pods_selected(name, cluster, &backend.kubelet_plugin_pods, false).len(),
            driver_slices(name, cluster).count(),
            cluster.claims_on(name)
        )),
        _ => None,
    }
}

/// The labels of `wanted` that `node` does not read as wanted, as one
/// write; `None` when all do. Deploy labels read as the operator reads them:
/// missing or empty is `true`, a paused value is the value it restores.
fn patch(name: &str, node: &Node, wanted: &[(&str, Option<&str>)]) -> Option<Effect> {
    let labels: BTreeMap<String, Option<String>> = wanted
        .iter()
        .filter(|(key, want)| {
            let found = node.labels.get(key).map(String::as_str);
            let reads = if key.starts_with(nvidia::DEPLOY_PREFIX) {
                DeployLabel::read(found).value()
            } else {
                found
            };
            reads != *want
        })
        .map(|(key, want)| (key.to_string(), want.map(str::to_string)))
        .collect();
    (!labels.is_empty()).then(|| Effect::SetOperandLabels {
        node: name.to_string(),
        labels,
        unless_paused: true,
    })
}

/// `write`, unless the driver manager has paused an operand on the node.
fn unless_paused(node: &Node, write: Effect) -> Option<Effect> {
    (!paused(node)).then_some(write)
}

fn paused(node: &Node) -> bool {
    node.labels
        .iter()
        .any(|(k, v)| k.starts_with(nvidia::DEPLOY_PREFIX) && DeployLabel::read(Some(v)).paused())
}

/// The pods on `name` that `selector` selects (`running`: only those
/// Running), as `namespace/name`.
pub fn pods_selected(
    name: &str,
    cluster: &Cluster,
    selector: &PodSelector,
    running: bool,
) -> Vec<String> {
    cluster
        .pods_on(name)
        .filter(|(_, pod)| selector.selects(pod) && (!running || pod.phase == PodPhase::Running))
        .map(|((namespace, pod), _)| format!("{namespace}/{pod}"))
        .collect()
}

/// The `gpu.nvidia.com` ResourceSlices published for `name`.
pub fn driver_slices<'a>(name: &'a str, cluster: &'a Cluster) -> impl Iterator<Item = &'a Slice> {
    cluster
        .slices
        .values()
        .filter(move |s| s.node == name && s.driver == nvidia::DRIVER)
}

/// The device plugin is gone from the node: none of its pods there, and no
/// device-plugin GPU resource allocatable.
fn device_plugin_gone(
    name: &str,
    node: &Node,
    cluster: &Cluster,
    backend: &NvidiaOperator,
) -> bool {
    node.device_plugin_allocatable == 0
        && pods_selected(name, cluster, &backend.device_plugin_pods, false).is_empty()
}

/// DRA is gone from the node: no kubelet-plugin pod, no `gpu.nvidia.com`
/// ResourceSlice, no claim allocated there.
fn dra_gone(name: &str, cluster: &Cluster, backend: &NvidiaOperator) -> bool {
    pods_selected(name, cluster, &backend.kubelet_plugin_pods, false).is_empty()
        && driver_slices(name, cluster).next().is_none()
        && cluster.claims_on(name).is_empty()
}

/// What shows the guide's failed exclusivity gate on `name`, a node DRA
/// serves (decided DRA, its kubelet plugin's label on): the device plugin's
/// pod there, its GPUs allocatable, or its deploy label reading `true` (not
/// a driver-upgrade pause); `None` while the gate holds.
pub fn exclusivity_lost(
    name: &str,
    stack: Option<Stack>,
    node: &Node,
    cluster: &Cluster,
    backend: &NvidiaOperator,
) -> Option<String> {
    let serving_dra = stack == Some(Stack::Dra)
        && node.labels.get(&backend.plugin_label).map(String::as_str) == Some("true");
    if !serving_dra {
        return None;
    }
    let label = DeployLabel::read(
        node.labels
            .get(nvidia::DEPLOY_DEVICE_PLUGIN)
            .map(String::as_str),
    );
    let pods = pods_selected(name, cluster, &backend.device_plugin_pods, false).len();
    let mut seen = Vec::new();
    if pods > 0 {
        seen.push(format!("{pods} device-plugin pod(s) on the node"));
    }
    if node.device_plugin_allocatable > 0 {
        seen.push(format!(
            "{} device-plugin GPU resource(s) allocatable",
            node.device_plugin_allocatable
        ));
    }
    if label.on() && !label.paused() {
        seen.push(format!("{}=true", nvidia::DEPLOY_DEVICE_PLUGIN));
    }
    (!seen.is_empty()).then(|| {
        format!(
            "Device Plugin reappears on DRA node {name}: {}",
            seen.join(", ")
        )
    })
}

/// What a node decided DRA still misses before DRA serves it on this
/// backend, as (condition, what is seen): the device plugin gone, the
/// kubelet plugin's label written, its pod running, its `gpu.nvidia.com`
/// devices published. Empty when DRA serves the node.
pub fn dra_missing(
    name: &str,
    node: &Node,
    cluster: &Cluster,
    backend: &NvidiaOperator,
) -> Vec<(&'static str, String)> {
    let mut missing = Vec::new();
    if !device_plugin_gone(name, node, cluster, backend) {
        missing.push((
            "device_plugin_gone",
            format!(
                "the device plugin is still deployed ({} pod(s), {} GPU resource(s) allocatable)",
                pods_selected(name, cluster, &backend.device_plugin_pods, false).len(),
                node.device_plugin_allocatable
            ),
        ));
    }
    if node.labels.get(&backend.plugin_label).map(String::as_str) != Some("true") {
        missing.push((
            "kubelet_plugin_label",
            format!("label {}=true is not present", backend.plugin_label),
        ));
    }
    if pods_selected(name, cluster, &backend.kubelet_plugin_pods, true).is_empty() {
        missing.push((
            "kubelet_plugin_running",
            format!(
                "no running DRA kubelet-plugin pod ({}) on the node",
                backend.kubelet_plugin_pods.text
            ),
        ));
    }
    if driver_slices(name, cluster).all(|s| s.devices.is_empty()) {
        missing.push((
            "devices_published",
            format!(
                "no {} ResourceSlice device is published for the node",
                nvidia::DRIVER
            ),
        ));
    }
    missing
}

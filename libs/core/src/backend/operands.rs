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

use switchyard_proto::v1::{NodeReadinessObserved, PodPhase, Stack, Taint};

use crate::backend::{DeployLabel, NvidiaOperator, nvidia};
use crate::cluster::{Cluster, Node, Slice};
use crate::effects::Effect;
use crate::selector::PodSelector;

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
                // The pilot taint goes last, once the device plugin serves
                // the node again ("wait until nvidia.com/gpu is allocatable
                // again ... remove the pilot taint").
                match labels(&on) {
                    Some(write) => out.extend(unless_paused(node, write)),
                    None if tainted && device_plugin_serves(name, node, cluster, backend) => {
                        out.push(taint(false))
                    }
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
        Stack::DevicePlugin if !dra_gone(name, cluster, backend) => {
            waiting_for_dra(name, cluster, backend)
        }
        _ => None,
    }
}

fn waiting_for_dra(name: &str, cluster: &Cluster, backend: &NvidiaOperator) -> Option<String> {
    Some(format!(
        "node {name}: DRA still serves it ({} kubelet-plugin pod(s), {} gpu.nvidia.com slice(s), claims {:?})",
        pods_selected(name, cluster, &backend.kubelet_plugin_pods, false).len(),
        driver_slices(name, cluster).count(),
        cluster.claims_on(name)
    ))
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
        .filter(|(_, pod)| selector.selects(*pod) && (!running || pod.phase == PodPhase::Running))
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

/// The device plugin serves the node: its pod Running there and its GPUs
/// allocatable.
fn device_plugin_serves(
    name: &str,
    node: &Node,
    cluster: &Cluster,
    backend: &NvidiaOperator,
) -> bool {
    node.device_plugin_allocatable > 0
        && !pods_selected(name, cluster, &backend.device_plugin_pods, true).is_empty()
}

/// The readiness gates of a handover of `name` to `stack` on this backend,
/// observed now (the NVIDIA guide's "Validation Checklist"): the writes for
/// the stack all read back as written, and then
/// - DRA: the device plugin gone (no pod, no GPU resource allocatable), the
///   kubelet plugin's pod Running, the `gpu.nvidia.com` devices matching GPU
///   Feature Discovery's labels and at least the `cards_before`;
/// - device plugin: DRA gone (no kubelet-plugin pod, no slice, no claim),
///   the device-plugin pod Running and its GPUs allocatable, one per card.
///
/// The gates as seen (without the handover's id and node), or what is still
/// missing, in the guide's words.
pub fn handover_ready(
    name: &str,
    stack: Stack,
    node: &Node,
    cluster: &Cluster,
    backend: &NvidiaOperator,
    cards_before: u32,
) -> Result<NodeReadinessObserved, Vec<String>> {
    let mut missing = Vec::new();
    if let Some(why) = waiting_for(name, stack, node, cluster, backend) {
        missing.push(why);
    }
    let pending: Vec<String> = effects(name, stack, node, cluster, backend)
        .iter()
        .map(|e| match e {
            Effect::SetOperandLabels { labels, .. } => labels
                .iter()
                .map(|(k, v)| match v {
                    Some(v) => format!("label {k}={v} is not written yet"),
                    None => format!("label {k} is not removed yet"),
                })
                .collect::<Vec<_>>()
                .join("; "),
            Effect::SetNodeTaint { taint, present, .. } => format!(
                "taint {}={}:{} is {}",
                taint.key,
                taint.value,
                taint.effect,
                if *present {
                    "not added yet"
                } else {
                    "still present"
                }
            ),
            other => format!("{} is due", other.kind()),
        })
        .collect();
    missing.extend(pending);
    let kubelet_plugin_running =
        !pods_selected(name, cluster, &backend.kubelet_plugin_pods, true).is_empty();
    let device_plugin_running =
        !pods_selected(name, cluster, &backend.device_plugin_pods, true).is_empty();
    let allocatable = node.device_plugin_allocatable;
    let published = driver_slices(name, cluster)
        .flat_map(|s| &s.devices)
        .filter(|d| d.r#type.is_empty() || d.r#type == "gpu")
        .count() as u32;
    let labelled: u32 = node
        .labels
        .get(nvidia::GFD_COUNT)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let expected = cards_before.max(labelled).max(1);
    match stack {
        Stack::Dra => {
            missing.extend(
                dra_missing(name, node, cluster, backend)
                    .into_iter()
                    .map(|(_, seen)| seen),
            );
            if let Err(wrong) = slices_match_gfd(cluster, name, node, cards_before) {
                missing.push(wrong);
            }
        }
        Stack::DevicePlugin => {
            if !dra_gone(name, cluster, backend) {
                missing.extend(waiting_for_dra(name, cluster, backend));
            }
            if !device_plugin_running {
                missing.push(format!(
                    "no running device-plugin pod ({}) on the node",
                    backend.device_plugin_pods.text
                ));
            }
            if allocatable < expected {
                missing.push(format!(
                    "{allocatable} of {expected} {} (or MIG, time-slicing) resources are allocatable on the node",
                    crate::names::NVIDIA_GPU
                ));
            }
        }
        Stack::None | Stack::Unspecified => {
            missing.push(format!("no stack would serve node {name}"))
        }
    }
    missing.dedup();
    if !missing.is_empty() {
        return Err(missing);
    }
    Ok(NodeReadinessObserved {
        gpu_stack_dra: stack == Stack::Dra,
        ready_physical_gpus: published,
        expected_physical_gpus: expected,
        device_plugin_allocatable: allocatable,
        kubelet_plugin_running,
        device_plugin_running,
        ..NodeReadinessObserved::default()
    })
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

/// The node's `gpu.nvidia.com` whole-GPU devices against GPU Feature
/// Discovery's labels: as many as `nvidia.com/gpu.count` (and `at_least`:
/// the cards the node had before its handover), each product (the
/// NVML name, spaces for GFD's dashes) a prefix of `nvidia.com/gpu.product`,
/// each memory `nvidia.com/gpu.memory` MiB (within 1 MiB; the driver leaves
/// it out when NVML reports none), each UUID once.
pub fn slices_match_gfd(
    cluster: &Cluster,
    node: &str,
    facts: &Node,
    at_least: u32,
) -> Result<String, String> {
    let label = |key: &str| facts.labels.get(key).map(String::as_str);
    let (Some(count), Some(product)) = (label(nvidia::GFD_COUNT), label(nvidia::GFD_PRODUCT))
    else {
        return Err(format!(
            "the node has no {} or {} label to compare the slices with (GPU Feature Discovery)",
            nvidia::GFD_COUNT,
            nvidia::GFD_PRODUCT
        ));
    };
    let labelled: u32 = count
        .parse()
        .map_err(|_| format!("{}={count:?} is not a count", nvidia::GFD_COUNT))?;
    let count = labelled.max(at_least) as usize;
    let memory: Option<u64> = label(nvidia::GFD_MEMORY_MIB).and_then(|m| m.parse().ok());
    let devices: Vec<&switchyard_proto::v1::SliceDevice> = driver_slices(node, cluster)
        .flat_map(|s| &s.devices)
        .filter(|d| d.r#type.is_empty() || d.r#type == "gpu")
        .collect();
    let mut wrong = Vec::new();
    if devices.len() != count {
        wrong.push(format!(
            "{} GPUs published by {}, {labelled} labelled {}{}",
            devices.len(),
            nvidia::DRIVER,
            nvidia::GFD_COUNT,
            if count > labelled as usize {
                format!(", {count} before the handover")
            } else {
                String::new()
            }
        ));
    }
    let mut uuids: BTreeMap<&str, usize> = BTreeMap::new();
    for d in &devices {
        *uuids.entry(d.uuid.as_str()).or_default() += 1;
        if !product.starts_with(&d.product.replace(' ', "-")) {
            wrong.push(format!(
                "{}: product {:?} in the slice, {product:?} labelled by GPU Feature Discovery",
                d.name, d.product
            ));
        }
        if let Some(memory) = memory
            && d.memory_mib != 0
            && d.memory_mib.abs_diff(memory) > 1
        {
            wrong.push(format!(
                "{}: memory {} MiB in the slice, {memory} MiB labelled {}",
                d.name,
                d.memory_mib,
                nvidia::GFD_MEMORY_MIB
            ));
        }
    }
    for (uuid, n) in uuids {
        if uuid.is_empty() {
            wrong.push(format!("{n} device(s) published without a UUID"));
        } else if n > 1 {
            wrong.push(format!("{uuid} is published {n} times"));
        }
    }
    if wrong.is_empty() {
        Ok(format!(
            "{count} GPUs published as GPU Feature Discovery labelled them ({product}{})",
            memory.map_or(String::new(), |m| format!(", {m} MiB"))
        ))
    } else {
        Err(wrong.join("; "))
    }
}

//! The rows about nodes and groups: which stack serves a node (the core's
//! stack rules, reference "How the stacks are split across nodes"), the
//! upgrade hold, and Step 1's warning about the target group's template.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use switchyard_api::NodeGroup;
use switchyard_core::cluster;
use switchyard_core::events::StackReason;
use switchyard_core::names;

use super::workloads::workloads;
use super::{Finding, Row, View, label, name_of, sh};

/// "No stack manages the node": a GPU node the stack rules give no stack
/// because its group has no spec.gpu while dra.enabled is off, or any GPU
/// node while the module is off (nothing is deployed). One finding per group.
pub(crate) fn no_stack(v: &View<'_>) -> Vec<Finding> {
    let mut by_group: BTreeMap<Option<&str>, Vec<String>> = BTreeMap::new();
    for node in &v.s.nodes {
        if !v.is_gpu_node(node) {
            continue;
        }
        let idle = !v.module_enabled
            || matches!(
                v.stack_of(node),
                Some((_, StackReason::NoSpecGpuDraDisabled))
            );
        if !idle {
            continue;
        }
        let group = v.group_of(node);
        by_group
            .entry(group)
            .or_default()
            .push(format!("Node/{}", name_of(&node.metadata)));
    }
    by_group
        .into_iter()
        .map(|(group, nodes)| {
            let mut objects = Vec::new();
            if let Some(g) = group {
                objects.push(format!("NodeGroup/{g}"));
            }
            objects.extend(nodes);
            objects.push(format!("ModuleConfig/{}", super::MODULE_CONFIG));
            let cause = if !v.module_enabled {
                match &v.s.module_config {
                    None => "the gpu ModuleConfig does not exist, so no stack is deployed: the cards of these nodes sit idle".to_string(),
                    Some(_) => "the gpu module is disabled (spec.enabled: false): the cards of these nodes sit idle".to_string(),
                }
            } else {
                format!(
                    "the node's group{} has no spec.gpu, and dra.enabled is off: the cards of these nodes sit idle",
                    group.map(|g| format!(" {g}")).unwrap_or_else(|| " (none: no node.deckhouse.io/group label)".into())
                )
            };
            let fix = if v.module_enabled {
                r#"kubectl patch moduleconfig gpu --type merge -p '{"spec":{"settings":{"dra":{"enabled":true}}}}'"#.to_string()
            } else {
                r#"kubectl patch moduleconfig gpu --type merge -p '{"spec":{"enabled":true,"version":1,"settings":{"dra":{"enabled":true}}}}'"#.to_string()
            };
            Finding::new(Row::NoStackManagesNode, objects, cause, fix)
        })
        .collect()
}

/// "DRA is not deployed on the group's nodes": with dra.enabled on, a GPU node
/// the stack rules keep off DRA — opted out by label, the feature gates not
/// ready — or give DRA (its group has no spec.gpu) while it has no
/// gpu-stack=dra label for another reason (the module status says it); and
/// DRA requests pinned to a group with spec.gpu.
pub(crate) fn dra_not_deployed(v: &View<'_>) -> Vec<Finding> {
    if !v.facts.module.dra_enabled || !v.module_enabled {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut gates: Vec<String> = Vec::new();
    let mut unexplained: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for node in &v.s.nodes {
        if !v.is_gpu_node(node) {
            continue;
        }
        let Some((_, reason)) = v.stack_of(node) else {
            continue;
        };
        let group = v.group_of(node);
        let name = name_of(&node.metadata);
        let objects = |extra: Vec<String>| {
            let mut o = Vec::new();
            if let Some(g) = group {
                o.push(format!("NodeGroup/{g}"));
            }
            o.push(format!("Node/{name}"));
            o.extend(extra);
            o
        };
        match reason {
            StackReason::GpuDisabledLabel => out.push(Finding::new(
                Row::DraNotDeployed,
                objects(Vec::new()),
                format!("the node is labeled {}=false", names::GPU_ENABLED_LABEL),
                format!(
                    "kubectl label node {} {}-",
                    sh(name),
                    names::GPU_ENABLED_LABEL
                ),
            )),
            StackReason::FeatureGatesNotReady => gates.push(format!("Node/{name}")),
            StackReason::DraEnabled
                if label(&node.metadata, names::GPU_STACK_LABEL) != Some(names::STACK_DRA) =>
            {
                unexplained
                    .entry(group.unwrap_or_default())
                    .or_default()
                    .push(format!("Node/{name}"))
            }
            _ => {}
        }
    }
    if !gates.is_empty() {
        out.push(Finding::new(
            Row::DraNotDeployed,
            gates,
            "the feature gates are not ready: the API server does not serve resource.k8s.io/v1 (DynamicResourceAllocation, DRAResourceClaimDeviceStatus, DRADeviceBindingConditions, DRAConsumableCapacity, DRAPartitionableDevices, DRAExtendedResource are needed); the reason is in the module status".into(),
            "d8 k get module gpu -o jsonpath='{.status.conditions}' | jq".into(),
        ));
    }
    for (group, nodes) in unexplained {
        let mut objects = Vec::new();
        if !group.is_empty() {
            objects.push(format!("NodeGroup/{group}"));
        }
        objects.extend(nodes);
        out.push(Finding::new(
            Row::DraNotDeployed,
            objects,
            format!(
                "the nodes have no {}={} label although their group has no spec.gpu and dra.enabled is on; the reason is in the module status",
                names::GPU_STACK_LABEL,
                names::STACK_DRA
            ),
            "d8 k get module gpu -o jsonpath='{.status.conditions}' | jq".into(),
        ));
    }
    // DRA requests bound to a group that the device plugin serves.
    let class_resources = v.class_resources();
    for w in workloads(v) {
        let Some(group) = w
            .spec
            .node_selector
            .as_ref()
            .and_then(|s| s.get(names::GROUP_LABEL))
        else {
            continue;
        };
        if !v.spec_gpu.contains(group.as_str()) || v.held.contains(group) {
            continue;
        }
        let wants_dra = w
            .spec
            .resource_claims
            .as_ref()
            .is_some_and(|c| !c.is_empty())
            || super::pod::extended_resources(w.spec)
                .iter()
                .any(|(_, r, _)| class_resources.contains(r));
        if !wants_dra {
            continue;
        }
        out.push(Finding::new(
            Row::DraNotDeployed,
            vec![w.object(), format!("NodeGroup/{group}")],
            format!("the workload requests DRA devices on group {group}, but the group has spec.gpu: its nodes are served by the Device Plugin stack"),
            w.json_patch(&[json!({"op": "remove", "path": format!("{}/nodeSelector/node.deckhouse.io~1group", w.spec_path)})]),
        ));
    }
    out
}

/// "D8GpuNodeGroupHeldOnDra is firing": a group with spec.gpu whose nodes DRA serves.
pub(crate) fn held_on_dra(v: &View<'_>) -> Vec<Finding> {
    let mut out = Vec::new();
    for group in &v.spec_gpu {
        let dra: Vec<String> = v
            .nodes_of(group)
            .filter(|n| label(&n.metadata, names::GPU_STACK_LABEL) == Some(names::STACK_DRA))
            .map(|n| format!("Node/{}", name_of(&n.metadata)))
            .collect();
        if dra.is_empty() {
            continue;
        }
        let mut objects = vec![format!("NodeGroup/{group}")];
        objects.extend(dra);
        out.push(Finding::new(
            Row::HeldOnDra,
            objects,
            format!("group {group} has spec.gpu and is held on DRA after the module upgrade (see \"If DRA was enabled before the module upgrade\"); removing spec.gpu releases it and it stays on DRA; to move it to the Device Plugin stack, drain its nodes, remove spec.gpu, wait for the alert to clear, and set spec.gpu again"),
            format!(r#"kubectl patch nodegroup {} --type json -p '[{{"op":"remove","path":"/spec/gpu"}}]'"#, sh(group)),
        ));
    }
    out
}

/// Step 1: "Copy the remaining parameters from the source group: taints,
/// labels, kubelet settings." Each source group (spec.gpu) against each
/// target group (no spec.gpu, empty or with GPU nodes).
pub(crate) fn target_group_differs(v: &View<'_>) -> Vec<Finding> {
    let groups = &v.s.node_groups;
    let targets: Vec<&NodeGroup> = groups
        .iter()
        .filter(|g| g.spec.gpu.is_none())
        .filter(|g| {
            let mut nodes = v.nodes_of(name_of(&g.metadata)).peekable();
            nodes.peek().is_none()
                || v.nodes_of(name_of(&g.metadata)).any(|n| {
                    v.is_gpu_node(n) && !v.fact(n).is_some_and(cluster::Node::is_control_plane)
                })
        })
        .collect();
    let mut out = Vec::new();
    for source in groups.iter().filter(|g| g.spec.gpu.is_some()) {
        for target in &targets {
            let differences = template_differences(source, target);
            if differences.is_empty() {
                continue;
            }
            let (s, t) = (name_of(&source.metadata), name_of(&target.metadata));
            out.push(Finding::new(
                Row::TargetGroupDiffers,
                vec![format!("NodeGroup/{s}"), format!("NodeGroup/{t}")],
                format!(
                    "target group {t} was not given source group {s}'s parameters: {}; the application simply behaves differently on the new nodes",
                    differences.join("; ")
                ),
                format!(
                    "kubectl patch nodegroup {} --type merge -p {}",
                    sh(t),
                    sh(&copy_patch(source, target).to_string())
                ),
            ));
        }
    }
    out
}

/// Each difference between the groups' labels, taints and kubelet settings.
pub fn template_differences(source: &NodeGroup, target: &NodeGroup) -> Vec<String> {
    let (s, t) = (name_of(&source.metadata), name_of(&target.metadata));
    let st = source.spec.node_template.clone().unwrap_or_default();
    let tt = target.spec.node_template.clone().unwrap_or_default();
    let mut out = Vec::new();
    let keys: std::collections::BTreeSet<&String> =
        st.labels.keys().chain(tt.labels.keys()).collect();
    for key in keys {
        match (st.labels.get(key), tt.labels.get(key)) {
            (Some(a), Some(b)) if a == b => {}
            (a, b) => out.push(format!(
                "label {key}: {s} has {}, {t} has {}",
                shown(a.map(String::as_str)),
                shown(b.map(String::as_str))
            )),
        }
    }
    let taint = |x: &switchyard_api::NodeTemplateTaint| {
        format!(
            "{}={}:{}",
            x.key,
            x.value.as_deref().unwrap_or_default(),
            x.effect
        )
    };
    for x in &st.taints {
        if !tt.taints.contains(x) {
            out.push(format!("taint {}: on {s}, not on {t}", taint(x)));
        }
    }
    for x in &tt.taints {
        if !st.taints.contains(x) {
            out.push(format!("taint {}: on {t}, not on {s}", taint(x)));
        }
    }
    let (sk, tk) = (
        source.spec.kubelet.clone().unwrap_or_default(),
        target.spec.kubelet.clone().unwrap_or_default(),
    );
    let keys: std::collections::BTreeSet<&String> = sk.keys().chain(tk.keys()).collect();
    for key in keys {
        match (sk.get(key), tk.get(key)) {
            (Some(a), Some(b)) if a == b => {}
            (a, b) => out.push(format!(
                "kubelet {key}: {s} has {}, {t} has {}",
                a.map_or("none".into(), Value::to_string),
                b.map_or("none".into(), Value::to_string)
            )),
        }
    }
    out
}

fn shown(value: Option<&str>) -> String {
    value.map_or("none".into(), |v| format!("{v:?}"))
}

/// A merge patch giving the target the source's labels, taints and kubelet
/// settings (what only the target has removed).
fn copy_patch(source: &NodeGroup, target: &NodeGroup) -> Value {
    let st = source.spec.node_template.clone().unwrap_or_default();
    let tt = target.spec.node_template.clone().unwrap_or_default();
    let mut labels = serde_json::Map::new();
    for (k, val) in &st.labels {
        labels.insert(k.clone(), json!(val));
    }
    for k in tt.labels.keys().filter(|k| !st.labels.contains_key(*k)) {
        labels.insert(k.clone(), Value::Null);
    }
    let mut kubelet = serde_json::Map::new();
    let (sk, tk) = (
        source.spec.kubelet.clone().unwrap_or_default(),
        target.spec.kubelet.clone().unwrap_or_default(),
    );
    for (k, val) in &sk {
        if tk.get(k) != Some(val) {
            kubelet.insert(k.clone(), val.clone());
        }
    }
    for k in tk.keys().filter(|k| !sk.contains_key(*k)) {
        kubelet.insert(k.clone(), Value::Null);
    }
    let mut spec = serde_json::Map::new();
    spec.insert(
        "nodeTemplate".into(),
        json!({"labels": labels, "taints": st.taints}),
    );
    if !kubelet.is_empty() {
        spec.insert("kubelet".into(), Value::Object(kubelet));
    }
    json!({ "spec": spec })
}

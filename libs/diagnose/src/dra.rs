//! The rows about DRA inventory and allocation: pods Pending for devices (the
//! allocator says which), claims whose selectors match no device, DRA nodes
//! without ResourceSlices, and a device plugin advertising a DRA node's cards.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use switchyard_core::events::Stack;
use switchyard_core::names;
use switchyard_dra::alloc::{AllocatedState, Allocator, is_allocated, report};
use switchyard_dra::cel::Compiler;

use super::pod::{explain_pod, pod_claims};
use super::{Finding, Row, View, advertised_gpus, label, name_of, namespace_of, sh};

/// "The Pod is Pending": a pod waiting for DRA devices that no node of the
/// cluster can give it — the allocator's reasons per node.
pub(crate) fn pod_pending(v: &View<'_>) -> Vec<Finding> {
    let mut out = Vec::new();
    for pod in &v.s.pods {
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        let bound = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_ref())
            .is_some();
        if bound || !matches!(phase, None | Some("Pending")) {
            continue;
        }
        let (claims, problems) = pod_claims(v.s, pod);
        let unknown_class = problems
            .iter()
            .any(|p| p.contains("no DeviceClass publishes it"));
        if (claims.iter().all(|c| is_allocated(&c.claim)) && problems.is_empty()) || unknown_class {
            continue; // not waiting for devices, or the class name is wrong (its own row)
        }
        let ns = namespace_of(&pod.metadata);
        let name = name_of(&pod.metadata);
        let mut objects = vec![format!("Pod/{ns}/{name}")];
        let classes: BTreeSet<String> = claims
            .iter()
            .flat_map(|c| c.claim.spec.devices.iter())
            .flat_map(|d| d.requests.iter().flatten())
            .flat_map(|r| {
                r.exactly.iter().map(|e| e.device_class_name.clone()).chain(
                    r.first_available
                        .iter()
                        .flatten()
                        .map(|s| s.device_class_name.clone()),
                )
            })
            .collect();
        objects.extend(classes.iter().map(|c| format!("DeviceClass/{c}")));
        let explain = format!("switchyard explain pod {}", sh(&format!("{ns}/{name}")));
        if !problems.is_empty() {
            out.push(Finding::new(
                Row::PodPending,
                objects,
                problems.join("; "),
                explain,
            ));
            continue;
        }
        let explanation = match explain_pod(v.s, pod) {
            Ok(e) => e,
            Err(e) => {
                out.push(Finding::new(
                    Row::PodPending,
                    objects,
                    format!("the allocator cannot read the cluster's DRA objects: {e}"),
                    explain,
                ));
                continue;
            }
        };
        if !explanation.fits.is_empty() {
            continue; // some node takes it: the scheduler has not got to it yet
        }
        let device_fit: Vec<&str> = explanation
            .nodes
            .iter()
            .filter(|n| n.devices.as_ref().is_none_or(|d| d.allocated()))
            .filter(|n| n.devices.is_some())
            .map(|n| n.node.as_str())
            .collect();
        if device_fit.is_empty() {
            // Per node with devices: the distinct reasons its devices were passed over.
            let mut per_node = Vec::new();
            for n in &explanation.nodes {
                let Some(d) = &n.devices else { continue };
                let mut reasons: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
                for r in &d.requests {
                    for c in &r.candidates {
                        if let Some(reason) = &c.reason {
                            reasons.entry(reason).or_default().push(&c.device);
                        }
                    }
                }
                if reasons.is_empty() && d.error.is_none() {
                    continue;
                }
                let mut text: Vec<String> = reasons
                    .into_iter()
                    .map(|(reason, devices)| format!("{} ({reason})", devices.join(", ")))
                    .collect();
                if let Some(e) = &d.error {
                    text.push(e.clone());
                }
                per_node.push(format!("{}: {}", n.node, text.join(", ")));
            }
            let cause = if per_node.is_empty() {
                "there are no free devices of the requested kind in the target group: no node publishes devices of this kind yet (hand over the node before moving the application)".to_string()
            } else {
                format!(
                    "there are no free devices of the requested kind in the target group — {}",
                    per_node.join("; ")
                )
            };
            out.push(Finding::new(
                Row::PodPending,
                objects,
                cause,
                next_handover(v).unwrap_or(explain),
            ));
        } else {
            let blocked: Vec<String> = explanation
                .nodes
                .iter()
                .filter(|n| device_fit.contains(&n.node.as_str()))
                .map(|n| format!("{}: {}", n.node, n.reasons.join(", ")))
                .collect();
            out.push(Finding::new(
                Row::PodPending,
                objects,
                format!(
                    "devices of the requested kind are free, but the pod does not fit the nodes that have them — {}",
                    blocked.join("; ")
                ),
                explain,
            ));
        }
    }
    out
}

/// "Hand over the next node": a device-plugin node to the group whose nodes
/// publish devices.
fn next_handover(v: &View<'_>) -> Option<String> {
    let target =
        v.s.nodes
            .iter()
            .filter(|n| !v.slices_on(name_of(&n.metadata)).is_empty())
            .find_map(|n| v.group_of(n).filter(|g| !v.spec_gpu.contains(*g)))?;
    // A node the device plugin still serves: the stack rules give it the
    // device plugin, and it is not on DRA.
    let node = v.s.nodes.iter().find(|n| {
        matches!(v.stack_of(n), Some((Stack::DevicePlugin, _)))
            && label(&n.metadata, names::GPU_STACK_LABEL) != Some(names::STACK_DRA)
            && v.slices_on(name_of(&n.metadata)).is_empty()
            && v.is_gpu_node(n)
    })?;
    Some(format!(
        "switchyard handover --node {} --to {} --nats-url \"$SWITCHYARD_NATS_URL\"",
        sh(name_of(&node.metadata)),
        sh(target)
    ))
}

/// What one request (or subrequest) of a claim met across the nodes.
#[derive(Default)]
struct Seen {
    class: String,
    /// Candidate devices.
    devices: usize,
    /// Devices the selectors let through.
    passing: usize,
    /// Why the others were passed over.
    selector_reasons: BTreeSet<String>,
}

/// NVIDIA guide, "ResourceClaim Remains Pending": a claim whose class or
/// request selectors match no published device (or whose class does not exist).
pub(crate) fn claim_selector_matches_no_device(v: &View<'_>) -> Vec<Finding> {
    let pending: Vec<_> = v.s.claims.iter().filter(|c| !is_allocated(c)).collect();
    if pending.is_empty() {
        return Vec::new();
    }
    // Without the existing allocations: whether a device matches the
    // selectors, not whether it is free (the allocator checks "in use" first).
    let Ok(allocator) = Allocator::new(
        AllocatedState::default(),
        &v.s.device_classes,
        &v.s.slices,
        Arc::new(Compiler::default()),
    ) else {
        return Vec::new(); // unreadable inventory: the Pending pods' row says why
    };
    let mut nodes: Vec<Node> = v.s.nodes.clone();
    for slice in &v.s.slices {
        if let Some(n) = slice.spec.node_name.as_deref()
            && !nodes.iter().any(|x| name_of(&x.metadata) == n)
        {
            nodes.push(Node {
                metadata: ObjectMeta {
                    name: Some(n.to_string()),
                    ..Default::default()
                },
                ..Default::default()
            });
        }
    }
    let mut out = Vec::new();
    for claim in pending {
        let ns = namespace_of(&claim.metadata);
        let name = name_of(&claim.metadata);
        let mut missing_class = None;
        let mut seen: BTreeMap<String, Seen> = BTreeMap::new();
        for node in &nodes {
            let r = report(&allocator, node, &[claim]);
            if let Some(e) = r
                .error
                .as_deref()
                .filter(|e| e.contains("could not retrieve device class"))
            {
                missing_class = Some(e.to_string());
            }
            for req in &r.requests {
                let entry = seen.entry(req.request.clone()).or_insert_with(|| Seen {
                    class: req.class.clone(),
                    ..Seen::default()
                });
                for c in &req.candidates {
                    entry.devices += 1;
                    match c.reason.as_deref() {
                        Some(reason) if reason.starts_with("selector ") => {
                            entry.selector_reasons.insert(reason.to_string());
                        }
                        _ => entry.passing += 1,
                    }
                }
            }
        }
        let object = format!("ResourceClaim/{ns}/{name}");
        if let Some(e) = missing_class {
            out.push(Finding::new(
                Row::ClaimSelectorMatchesNoDevice,
                vec![object],
                format!("the requested DeviceClass does not exist: {e}"),
                "kubectl get deviceclass".into(),
            ));
            continue;
        }
        // A claim with a subrequest that can match is not stuck on selectors:
        // only requests (all their alternatives) that match nothing.
        let mut by_request: BTreeMap<&str, Vec<&Seen>> = BTreeMap::new();
        for (request, seen) in &seen {
            let top = request.split('/').next().unwrap_or(request);
            by_request.entry(top).or_default().push(seen);
        }
        for (request, alternatives) in by_request {
            let total = alternatives.iter().map(|e| e.devices).max().unwrap_or(0);
            let passing: usize = alternatives.iter().map(|e| e.passing).sum();
            if total == 0 || passing > 0 {
                continue;
            }
            let mut objects = vec![object.clone()];
            let mut reasons = Vec::new();
            for e in &alternatives {
                objects.push(format!("DeviceClass/{}", e.class));
                reasons.extend(e.selector_reasons.iter().cloned());
            }
            objects.dedup();
            out.push(Finding::new(
                Row::ClaimSelectorMatchesNoDevice,
                objects,
                format!(
                    "request {request}: a selector is syntactically valid but matches none of the {total} published devices — {}; copy product names and memory values from the cluster's ResourceSlices",
                    reasons.join("; ")
                ),
                "kubectl get resourceslice -o yaml".into(),
            ));
        }
    }
    out
}

/// NVIDIA guide, "DeviceClasses Exist but No ResourceSlices Appear": DRA nodes
/// (gpu-stack=dra, and DRA's by the stack rules) that publish no slice while
/// DeviceClasses exist.
pub(crate) fn no_resource_slices(v: &View<'_>) -> Vec<Finding> {
    if v.s.device_classes.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for node in &v.s.nodes {
        let name = name_of(&node.metadata);
        if label(&node.metadata, names::GPU_STACK_LABEL) != Some(names::STACK_DRA)
            || !matches!(v.stack_of(node), Some((Stack::Dra, _)))
            || !v.slices_on(name).is_empty()
        {
            continue;
        }
        let mut objects = vec![format!("Node/{name}")];
        objects.extend(
            v.s.device_classes
                .iter()
                .map(|c| format!("DeviceClass/{}", name_of(&c.metadata))),
        );
        out.push(Finding::new(
            Row::NoResourceSlices,
            objects,
            format!(
                "node {name} is served by DRA but publishes no ResourceSlice: the DRA kubelet plug-in ({}) is not running on it, a required node label is missing, the driver root or CDI path is wrong, or the driver cannot publish inventory",
                names::VENDOR_ADAPTER_APP
            ),
            format!(
                "kubectl -n {} get pods -o wide --field-selector spec.nodeName={}",
                names::MODULE_NAMESPACE,
                sh(name)
            ),
        ));
    }
    out
}

/// NVIDIA guide, "Device Plugin Reappears on a DRA Node": a node that both
/// advertises `nvidia.com/gpu` and publishes ResourceSlices — the same cards
/// offered by two allocators.
pub(crate) fn device_plugin_on_dra_node(v: &View<'_>) -> Vec<Finding> {
    let mut out = Vec::new();
    for node in &v.s.nodes {
        let name = name_of(&node.metadata);
        let slices = v.slices_on(name);
        let gpus = advertised_gpus(node);
        if gpus == 0 || slices.is_empty() {
            continue;
        }
        let mut objects = vec![format!("Node/{name}")];
        objects.extend(
            slices
                .iter()
                .map(|s| format!("ResourceSlice/{}", name_of(&s.metadata))),
        );
        out.push(Finding::new(
            Row::DevicePluginOnDraNode,
            objects,
            format!(
                "node {name} advertises {gpus} {} through a device plugin and publishes ResourceSlices: the exclusivity gate failed, the same cards have two allocators; stop scheduling new DRA workloads on it until the allocation owner is unambiguous",
                names::NVIDIA_GPU
            ),
            format!(
                "kubectl cordon {name} && kubectl get node {name} -L {},nvidia.com/gpu.deploy.device-plugin",
                names::GPU_STACK_LABEL,
                name = sh(name)
            ),
        ));
    }
    out
}

//! Why a pod does not fit, per node and device: the node's own filters
//! (cordon, node selector, required affinity, taints against the pod's
//! tolerations, device-plugin resources) and, for its devices, the DRA
//! allocator's report ([`switchyard_dra::alloc::report`], the engine of
//! `dra explain`) over the pod's claims — the ResourceClaims it names, or the
//! claim the scheduler would make for an extended resource a DeviceClass
//! publishes (`gpu.deckhouse.io/a100: 1`).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod, PodSpec, Taint, Toleration};
use k8s_openapi::api::resource::v1::{
    DeviceClaim, DeviceClass, DeviceRequest, ExactDeviceRequest, ResourceClaim, ResourceClaimSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;
use switchyard_dra::Quantity;
use switchyard_dra::alloc::{
    AllocatedState, Allocator, InputError, NodeReport, apply_defaults, is_allocated, report,
    selector_matches,
};
use switchyard_dra::cel::Compiler;

use super::{Snapshot, name_of, namespace_of};

/// The implicit extended resource of every DeviceClass (Kubernetes' DRAExtendedResource).
pub const IMPLICIT_PREFIX: &str = "deviceclass.resource.kubernetes.io/";

/// Why a pod does or does not fit each node.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PodExplanation {
    /// `namespace/name`.
    pub pod: String,
    pub phase: String,
    /// The node it is bound to, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bound_to: Option<String>,
    /// The claims the pod's devices come from, each with where it comes from.
    pub claims: Vec<String>,
    /// What keeps the pod off every node, whatever the node (a claim that
    /// does not exist, an extended resource nothing publishes).
    pub problems: Vec<String>,
    /// Nodes the pod fits.
    pub fits: Vec<String>,
    pub nodes: Vec<NodeFit>,
}

/// One node: its own filters, then its devices.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NodeFit {
    pub node: String,
    pub fits: bool,
    /// The node's own filters that fail, in the scheduler's order.
    pub reasons: Vec<String>,
    /// The allocator's report for the pod's pending claims on this node.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub devices: Option<NodeReport>,
}

/// A claim of the pod, as the scheduler would see it.
#[derive(Clone, Debug)]
pub struct PodClaim {
    pub claim: ResourceClaim,
    /// Where it comes from, for people.
    pub origin: String,
    /// For the extended-resource claim: the resources it serves, so that a
    /// node that advertises one itself (a device plugin) serves it instead.
    pub extended: Vec<(String, String)>,
}

/// The pod's claims: those it names (by claim or template) and the one for
/// its extended resources; plus the problems that keep any of them from existing.
pub fn pod_claims(s: &Snapshot, pod: &Pod) -> (Vec<PodClaim>, Vec<String>) {
    let ns = namespace_of(&pod.metadata);
    let pod_name = name_of(&pod.metadata);
    let mut out = Vec::new();
    let mut problems = Vec::new();
    let Some(spec) = pod.spec.as_ref() else {
        return (out, problems);
    };
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.clone())
        .unwrap_or_default();
    for entry in spec.resource_claims.iter().flatten() {
        let named = entry.resource_claim_name.clone().or_else(|| {
            statuses
                .iter()
                .find(|st| st.name == entry.name)
                .and_then(|st| st.resource_claim_name.clone())
        });
        if let Some(claim_name) = named {
            match s
                .claims
                .iter()
                .find(|c| namespace_of(&c.metadata) == ns && name_of(&c.metadata) == claim_name)
            {
                Some(c) => out.push(PodClaim {
                    claim: c.clone(),
                    origin: format!("ResourceClaim {ns}/{claim_name}"),
                    extended: Vec::new(),
                }),
                None => problems.push(format!(
                    "spec.resourceClaims[{}]: ResourceClaim {ns}/{claim_name} does not exist",
                    entry.name
                )),
            }
            continue;
        }
        let Some(template) = entry.resource_claim_template_name.as_deref() else {
            continue;
        };
        match s
            .claim_templates
            .iter()
            .find(|t| namespace_of(&t.metadata) == ns && name_of(&t.metadata) == template)
        {
            Some(t) => {
                let mut claim = ResourceClaim {
                    metadata: ObjectMeta {
                        name: Some(format!("{pod_name}-{}", entry.name)),
                        namespace: Some(ns.to_string()),
                        ..Default::default()
                    },
                    spec: t.spec.spec.clone(),
                    status: None,
                };
                apply_defaults(&mut claim);
                out.push(PodClaim {
                    claim,
                    origin: format!(
                        "to be made from ResourceClaimTemplate {ns}/{template} (not created yet)"
                    ),
                    extended: Vec::new(),
                });
            }
            None => problems.push(format!(
                "spec.resourceClaims[{}]: ResourceClaimTemplate {ns}/{template} does not exist",
                entry.name
            )),
        }
    }
    match extended_claim(&s.device_classes, pod, spec) {
        Ok(Some(claim)) => out.push(claim),
        Ok(None) => {}
        Err(unknown) => problems.extend(unknown),
    }
    (out, problems)
}

/// The DeviceClass publishing `resource` as its extended resource
/// (`spec.extendedResourceName` or the implicit `deviceclass.resource.kubernetes.io/<class>`).
pub fn class_for_resource<'a>(
    classes: &'a [DeviceClass],
    resource: &str,
) -> Option<&'a DeviceClass> {
    classes
        .iter()
        .find(|c| c.spec.extended_resource_name.as_deref() == Some(resource))
        .or_else(|| {
            let name = resource.strip_prefix(IMPLICIT_PREFIX)?;
            classes.iter().find(|c| name_of(&c.metadata) == name)
        })
}

/// Extended resources of containers, by container index: (resource, count).
pub fn extended_resources(spec: &PodSpec) -> Vec<(usize, String, String)> {
    let mut out = Vec::new();
    for (i, c) in spec.containers.iter().enumerate() {
        let mut names: BTreeMap<String, String> = BTreeMap::new();
        let resources = c.resources.as_ref();
        for map in [
            resources.and_then(|r| r.limits.as_ref()),
            resources.and_then(|r| r.requests.as_ref()),
        ]
        .into_iter()
        .flatten()
        {
            for (name, q) in map {
                if is_extended(name) {
                    names.entry(name.clone()).or_insert_with(|| q.0.clone());
                }
            }
        }
        out.extend(names.into_iter().map(|(n, q)| (i, n, q)));
    }
    out
}

/// Not a native resource (`cpu`, `memory`, `hugepages-*`, ...) nor a kubernetes.io one.
fn is_extended(name: &str) -> bool {
    name.contains('/') && !name.starts_with("kubernetes.io/") && !name.starts_with("requests.")
}

/// The claim the scheduler makes for the pod's extended resources that a
/// DeviceClass publishes; `Err` names those under `gpu.deckhouse.io/` no
/// class publishes (they can never be satisfied).
fn extended_claim(
    classes: &[DeviceClass],
    pod: &Pod,
    spec: &PodSpec,
) -> Result<Option<PodClaim>, Vec<String>> {
    let mut requests = Vec::new();
    let mut served = Vec::new();
    let mut unknown = Vec::new();
    let mut per_container: BTreeMap<usize, usize> = BTreeMap::new();
    for (c, resource, count) in extended_resources(spec) {
        let Some(class) = class_for_resource(classes, &resource) else {
            if resource.starts_with(switchyard_core::names::CLASS_RESOURCE_PREFIX) {
                unknown.push(format!(
                    "containers[{c}] requests {resource}: no DeviceClass publishes it"
                ));
            }
            continue;
        };
        let r = per_container.entry(c).or_default();
        let request = format!("container-{c}-request-{r}");
        *r += 1;
        let count = Quantity::parse(&count)
            .ok()
            .and_then(|q| q.as_i64())
            .unwrap_or(1);
        served.push((request.clone(), resource.clone()));
        requests.push(DeviceRequest {
            name: request,
            exactly: Some(ExactDeviceRequest {
                device_class_name: name_of(&class.metadata).to_string(),
                allocation_mode: Some("ExactCount".into()),
                count: Some(count),
                ..Default::default()
            }),
            ..Default::default()
        });
    }
    if !unknown.is_empty() {
        return Err(unknown);
    }
    if requests.is_empty() {
        return Ok(None);
    }
    let ns = namespace_of(&pod.metadata);
    let name = name_of(&pod.metadata);
    let resources: Vec<&str> = served.iter().map(|(_, r)| r.as_str()).collect();
    Ok(Some(PodClaim {
        claim: ResourceClaim {
            metadata: ObjectMeta {
                name: Some(format!("{name}-extended-resources")),
                namespace: Some(ns.to_string()),
                ..Default::default()
            },
            spec: ResourceClaimSpec {
                devices: Some(DeviceClaim {
                    requests: Some(requests),
                    ..Default::default()
                }),
            },
            status: None,
        },
        origin: format!(
            "the scheduler's claim for {} (DRAExtendedResource)",
            resources.join(", ")
        ),
        extended: served,
    }))
}

/// Why `pod` does or does not fit each node of the snapshot.
pub fn explain_pod(s: &Snapshot, pod: &Pod) -> Result<PodExplanation, InputError> {
    let (claims, problems) = pod_claims(s, pod);
    let allocator = Allocator::new(
        AllocatedState::from_claims(s.claims.iter().filter(|c| is_allocated(c)))?,
        &s.device_classes,
        &s.slices,
        Arc::new(Compiler::default()),
    )?;
    let spec = pod.spec.clone().unwrap_or_default();
    let mut nodes = Vec::new();
    for node in &s.nodes {
        nodes.push(node_fit(
            s, &allocator, pod, &spec, &claims, node, &problems,
        ));
    }
    let fits = nodes
        .iter()
        .filter(|n| n.fits)
        .map(|n| n.node.clone())
        .collect();
    Ok(PodExplanation {
        pod: format!("{}/{}", namespace_of(&pod.metadata), name_of(&pod.metadata)),
        phase: pod
            .status
            .as_ref()
            .and_then(|st| st.phase.clone())
            .unwrap_or_default(),
        bound_to: spec.node_name.clone(),
        claims: claims
            .iter()
            .map(|c| {
                let state = if is_allocated(&c.claim) {
                    "allocated"
                } else {
                    "pending"
                };
                format!("{} ({state}): {}", name_of(&c.claim.metadata), c.origin)
            })
            .collect(),
        problems,
        fits,
        nodes,
    })
}

fn node_fit(
    s: &Snapshot,
    allocator: &Allocator,
    pod: &Pod,
    spec: &PodSpec,
    claims: &[PodClaim],
    node: &Node,
    problems: &[String],
) -> NodeFit {
    let name = name_of(&node.metadata).to_string();
    let mut reasons = node_reasons(s, pod, spec, node);
    // The node advertises an extended resource itself (a device plugin):
    // the scheduler serves it from the node, not through the claim.
    let allocatable = node
        .status
        .as_ref()
        .and_then(|st| st.allocatable.clone())
        .unwrap_or_default();
    let mut pending: Vec<ResourceClaim> = Vec::new();
    for c in claims.iter().filter(|c| !is_allocated(&c.claim)) {
        let mut claim = c.claim.clone();
        if !c.extended.is_empty() {
            let on_node: Vec<&str> = c
                .extended
                .iter()
                .filter(|(_, r)| allocatable.contains_key(r))
                .map(|(req, _)| req.as_str())
                .collect();
            if let Some(requests) = claim
                .spec
                .devices
                .as_mut()
                .and_then(|d| d.requests.as_mut())
            {
                requests.retain(|r| !on_node.contains(&r.name.as_str()));
                if requests.is_empty() {
                    continue;
                }
            }
        }
        pending.push(claim);
    }
    // Allocated claims must be usable here: their node selector.
    for c in claims.iter().filter(|c| is_allocated(&c.claim)) {
        let selector = c
            .claim
            .status
            .as_ref()
            .and_then(|st| st.allocation.as_ref())
            .and_then(|a| a.node_selector.as_ref());
        if let Some(selector) = selector
            && !selector_matches(node, selector).unwrap_or(false)
        {
            reasons.push(format!(
                "claim {} is allocated to devices not reachable from this node",
                name_of(&c.claim.metadata)
            ));
        }
    }
    let devices = (!pending.is_empty()).then(|| {
        let refs: Vec<&ResourceClaim> = pending.iter().collect();
        report(allocator, node, &refs)
    });
    let fits = problems.is_empty()
        && reasons.is_empty()
        && devices.as_ref().is_none_or(NodeReport::allocated);
    NodeFit {
        node: name,
        fits,
        reasons,
        devices,
    }
}

/// The node's own filters that fail for the pod.
pub fn node_reasons(s: &Snapshot, pod: &Pod, spec: &PodSpec, node: &Node) -> Vec<String> {
    let mut reasons = Vec::new();
    let tolerations = spec.tolerations.as_deref().unwrap_or_default();
    let node_spec = node.spec.clone().unwrap_or_default();
    if node_spec.unschedulable == Some(true) {
        let cordon = Taint {
            key: "node.kubernetes.io/unschedulable".into(),
            effect: "NoSchedule".into(),
            ..Default::default()
        };
        if !tolerated(&cordon, tolerations) {
            reasons.push("node is cordoned (spec.unschedulable)".into());
        }
    }
    let labels = node.metadata.labels.clone().unwrap_or_default();
    for (key, want) in spec.node_selector.iter().flatten() {
        match labels.get(key) {
            Some(have) if have == want => {}
            Some(have) => reasons.push(format!(
                "node selector {key}={want} does not match: the node has {key}={have}"
            )),
            None => reasons.push(format!(
                "node selector {key}={want} does not match: the node has no label {key}"
            )),
        }
    }
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    if let Some(selector) = required {
        match selector_matches(node, selector) {
            Ok(true) => {}
            Ok(false) => {
                reasons.push("required node affinity does not match the node's labels".into())
            }
            Err(e) => reasons.push(format!("required node affinity is invalid: {e}")),
        }
    }
    for taint in node_spec.taints.iter().flatten() {
        if matches!(taint.effect.as_str(), "NoSchedule" | "NoExecute")
            && !tolerated(taint, tolerations)
        {
            reasons.push(format!(
                "taint not tolerated: {}={}:{}",
                taint.key,
                taint.value.as_deref().unwrap_or_default(),
                taint.effect
            ));
        }
    }
    // Extended resources the node advertises itself (device plugins) or
    // that no DeviceClass publishes: counted against allocatable.
    let allocatable = node
        .status
        .as_ref()
        .and_then(|st| st.allocatable.clone())
        .unwrap_or_default();
    for (c, resource, count) in extended_resources(spec) {
        let on_node = allocatable.get(&resource);
        if on_node.is_none() && class_for_resource(&s.device_classes, &resource).is_some() {
            continue; // served by DRA on this node
        }
        let want = Quantity::parse(&count).unwrap_or_else(|_| Quantity::zero());
        let have = on_node
            .and_then(|q| Quantity::parse(&q.0).ok())
            .unwrap_or_else(Quantity::zero);
        let used = used_on_node(s, pod, name_of(&node.metadata), &resource);
        let left = have.sub(&used);
        if left < want {
            reasons.push(format!(
                "insufficient {resource}: containers[{c}] wants {count}, the node has {} allocatable, {} in use",
                have.canonical(),
                used.canonical()
            ));
        }
    }
    reasons
}

/// What other pods bound to `node` request of `resource`.
fn used_on_node(s: &Snapshot, pod: &Pod, node: &str, resource: &str) -> Quantity {
    let mut used = Quantity::zero();
    for other in &s.pods {
        if other.metadata.uid.is_some() && other.metadata.uid == pod.metadata.uid {
            continue;
        }
        let Some(spec) = other.spec.as_ref() else {
            continue;
        };
        let done = other
            .status
            .as_ref()
            .and_then(|st| st.phase.as_deref())
            .is_some_and(|p| p == "Succeeded" || p == "Failed");
        if spec.node_name.as_deref() != Some(node) || done {
            continue;
        }
        for (_, r, q) in extended_resources(spec) {
            if r == resource
                && let Ok(q) = Quantity::parse(&q)
            {
                used = used.add(&q);
            }
        }
    }
    used
}

/// Whether a toleration tolerates the taint, as Kubernetes' `ToleratesTaint`.
pub fn tolerated(taint: &Taint, tolerations: &[Toleration]) -> bool {
    tolerations.iter().any(|t| {
        let effect = t.effect.as_deref().unwrap_or_default();
        if !effect.is_empty() && effect != taint.effect {
            return false;
        }
        let key = t.key.as_deref().unwrap_or_default();
        let operator = t.operator.as_deref().unwrap_or("Equal");
        if key.is_empty() {
            return operator == "Exists";
        }
        if key != taint.key {
            return false;
        }
        match operator {
            "Exists" => true,
            _ => {
                t.value.as_deref().unwrap_or_default() == taint.value.as_deref().unwrap_or_default()
            }
        }
    })
}

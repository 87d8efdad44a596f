//! The rows about manifests: what Deployments, StatefulSets and pods without
//! such an owner ask for (Step 4, "Move an application").

use k8s_openapi::api::core::v1::{Container, PodSpec};
use serde_json::{Value, json};
use switchyard_core::names;

use super::pod::{IMPLICIT_PREFIX, extended_resources};
use super::{Finding, Row, View, name_of, namespace_of, sh};

/// A manifest with a pod spec.
pub(crate) struct WorkloadRef<'a> {
    /// `Deployment`, `StatefulSet` or `Pod`.
    pub kind: &'static str,
    pub namespace: &'a str,
    pub name: &'a str,
    pub spec: &'a PodSpec,
    /// JSON pointer of the pod spec in the object.
    pub spec_path: &'static str,
}

impl WorkloadRef<'_> {
    pub fn object(&self) -> String {
        format!("{}/{}/{}", self.kind, self.namespace, self.name)
    }

    /// A command applying JSON-patch `ops` (paths relative to the object).
    /// A pod's spec cannot be patched this way: it is recreated.
    pub fn json_patch(&self, ops: &[Value]) -> String {
        let ops = Value::Array(ops.to_vec()).to_string();
        match self.kind {
            "Pod" => format!(
                "kubectl -n {ns} get pod {name} -o json | kubectl patch --local -f - --type json -p {ops} -o json | kubectl replace --force -f -",
                ns = sh(self.namespace),
                name = sh(self.name),
                ops = sh(&ops)
            ),
            kind => format!(
                "kubectl -n {} patch {} {} --type json -p {}",
                sh(self.namespace),
                kind.to_lowercase(),
                sh(self.name),
                sh(&ops)
            ),
        }
    }
}

/// Every manifest: Deployments' and StatefulSets' templates, and pods not
/// made from one (a pod of a ReplicaSet or StatefulSet is its owner's).
pub(crate) fn workloads<'a>(v: &View<'a>) -> Vec<WorkloadRef<'a>> {
    let mut out = Vec::new();
    for d in &v.s.deployments {
        if let Some(spec) = d.spec.as_ref().and_then(|s| s.template.spec.as_ref()) {
            out.push(WorkloadRef {
                kind: "Deployment",
                namespace: namespace_of(&d.metadata),
                name: name_of(&d.metadata),
                spec,
                spec_path: "/spec/template/spec",
            });
        }
    }
    for d in &v.s.stateful_sets {
        if let Some(spec) = d.spec.as_ref().and_then(|s| s.template.spec.as_ref()) {
            out.push(WorkloadRef {
                kind: "StatefulSet",
                namespace: namespace_of(&d.metadata),
                name: name_of(&d.metadata),
                spec,
                spec_path: "/spec/template/spec",
            });
        }
    }
    for p in &v.s.pods {
        let owned = p.metadata.owner_references.iter().flatten().any(|o| {
            o.controller == Some(true) && matches!(o.kind.as_str(), "ReplicaSet" | "StatefulSet")
        });
        if owned {
            continue;
        }
        if let Some(spec) = p.spec.as_ref() {
            out.push(WorkloadRef {
                kind: "Pod",
                namespace: namespace_of(&p.metadata),
                name: name_of(&p.metadata),
                spec,
                spec_path: "/spec",
            });
        }
    }
    out
}

/// A JSON pointer token.
fn token(s: &str) -> String {
    s.replace('~', "~0").replace('/', "~1")
}

/// The class resource to suggest: the one whole-card class if there is only
/// one, else a placeholder.
fn suggested_class(v: &View<'_>) -> String {
    let whole: Vec<String> =
        v.s.gpu_classes
            .iter()
            .map(|c| format!("{}{}", names::CLASS_RESOURCE_PREFIX, name_of(&c.metadata)))
            .filter(|r| v.class_resources().contains(r))
            .collect();
    match whole.as_slice() {
        [one] => one.clone(),
        _ => match v.class_resources().iter().collect::<Vec<_>>().as_slice() {
            [one] => (*one).clone(),
            _ => format!("{}<class>", names::CLASS_RESOURCE_PREFIX),
        },
    }
}

/// The known class resources, for a message.
fn known(v: &View<'_>) -> String {
    let known = v.class_resources();
    if known.is_empty() {
        "none is published yet".into()
    } else {
        known.into_iter().collect::<Vec<_>>().join(", ")
    }
}

/// Ops renaming resource `from` to `to` in container `c`'s limits and requests.
fn rename_ops(
    w: &WorkloadRef<'_>,
    c: usize,
    container: &Container,
    from: &str,
    to: &str,
) -> Vec<Value> {
    let mut ops = Vec::new();
    let resources = container.resources.as_ref();
    for (field, map) in [
        ("limits", resources.and_then(|r| r.limits.as_ref())),
        ("requests", resources.and_then(|r| r.requests.as_ref())),
    ] {
        if let Some(q) = map.and_then(|m| m.get(from)) {
            let base = format!("{}/containers/{c}/resources/{field}", w.spec_path);
            ops.push(json!({"op": "remove", "path": format!("{base}/{}", token(from))}));
            ops.push(json!({"op": "add", "path": format!("{base}/{}", token(to)), "value": q.0}));
        }
    }
    ops
}

/// "The Pod stays on the old nodes": while a DRA class exists, a manifest
/// still requests `nvidia.com/gpu` (and no class bridges it) or keeps the
/// binding to a source group (`node.deckhouse.io/group: <group with spec.gpu>`).
pub(crate) fn stays_on_old_nodes(v: &View<'_>) -> Vec<Finding> {
    if v.class_resources().is_empty() {
        return Vec::new();
    }
    let bridged =
        v.s.device_classes
            .iter()
            .any(|c| c.spec.extended_resource_name.as_deref() == Some(names::NVIDIA_GPU));
    let class = suggested_class(v);
    let mut out = Vec::new();
    for w in workloads(v) {
        let mut causes = Vec::new();
        let mut ops = Vec::new();
        if !bridged {
            for (c, container) in w.spec.containers.iter().enumerate() {
                let wants = extended_resources(w.spec)
                    .into_iter()
                    .any(|(i, r, _)| i == c && r == names::NVIDIA_GPU);
                if wants {
                    causes.push(format!(
                        "container {} still has the {} request",
                        container.name,
                        names::NVIDIA_GPU
                    ));
                    ops.extend(rename_ops(&w, c, container, names::NVIDIA_GPU, &class));
                }
            }
        }
        let group = w
            .spec
            .node_selector
            .as_ref()
            .and_then(|s| s.get(names::GROUP_LABEL))
            .filter(|g| v.spec_gpu.contains(g.as_str()));
        let mut objects = vec![w.object()];
        if let Some(group) = group {
            causes.push(format!(
                "the manifest keeps the binding to the source group ({}: {group})",
                names::GROUP_LABEL
            ));
            ops.push(json!({"op": "remove", "path": format!("{}/nodeSelector/{}", w.spec_path, token(names::GROUP_LABEL))}));
            objects.push(format!("NodeGroup/{group}"));
        }
        if causes.is_empty() {
            continue;
        }
        out.push(Finding::new(
            Row::PodStaysOnOldNodes,
            objects,
            format!(
                "{} (DRA classes: {}); the node is chosen by the requested class",
                causes.join("; "),
                known(v)
            ),
            w.json_patch(&ops),
        ));
    }
    out
}

/// "No ResourceClaim was created": a manifest requests `gpu.deckhouse.io/<x>`
/// that no DeviceClass publishes — the class name is wrong.
pub(crate) fn no_resource_claim(v: &View<'_>) -> Vec<Finding> {
    let published: std::collections::BTreeSet<String> =
        v.s.device_classes
            .iter()
            .filter_map(|c| c.spec.extended_resource_name.clone())
            .collect();
    let mut out = Vec::new();
    for w in workloads(v) {
        for (c, resource, _) in extended_resources(w.spec) {
            if !resource.starts_with(names::CLASS_RESOURCE_PREFIX) || published.contains(&resource)
            {
                continue;
            }
            let container = &w.spec.containers[c];
            let to = closest(&resource, &v.class_resources()).unwrap_or_else(|| suggested_class(v));
            let classes: Vec<String> =
                v.s.gpu_classes
                    .iter()
                    .map(|g| format!("GPUClass/{}", name_of(&g.metadata)))
                    .collect();
            out.push(Finding::new(
                Row::NoResourceClaim,
                vec![w.object()],
                format!(
                    "the class name is wrong: container {} requests {resource}, which no DeviceClass publishes; known class resources: {} (GPU classes: {}; check with kubectl get gpuclass)",
                    container.name,
                    known(v),
                    if classes.is_empty() { "none".into() } else { classes.join(", ") }
                ),
                w.json_patch(&rename_ops(&w, c, container, &resource, &to)),
            ));
        }
    }
    out
}

/// The known resource sharing the longest prefix with `wrong`.
fn closest(wrong: &str, known: &std::collections::BTreeSet<String>) -> Option<String> {
    known
        .iter()
        .max_by_key(|k| {
            k.chars()
                .zip(wrong.chars())
                .take_while(|(a, b)| a == b)
                .count()
        })
        .cloned()
}

/// Whether a container gets GPUs through a resource: a device plugin's, a
/// class's, a DeviceClass's, or a claim.
fn requests_gpu(spec: &PodSpec, c: usize) -> bool {
    let container = &spec.containers[c];
    container
        .resources
        .as_ref()
        .and_then(|r| r.claims.as_ref())
        .is_some_and(|claims| !claims.is_empty())
        || extended_resources(spec).into_iter().any(|(i, r, _)| {
            i == c
                && (r == names::NVIDIA_GPU
                    || r.starts_with("nvidia.com/mig-")
                    || r.starts_with(names::CLASS_RESOURCE_PREFIX)
                    || r.starts_with(IMPLICIT_PREFIX))
        })
}

/// "The Pod runs but the application sees no card": a container given GPUs
/// by `NVIDIA_VISIBLE_DEVICES` instead of a resource request.
pub(crate) fn no_card_visible(v: &View<'_>) -> Vec<Finding> {
    let class = suggested_class(v);
    let mut out = Vec::new();
    for w in workloads(v) {
        for (c, container) in w.spec.containers.iter().enumerate() {
            let Some((e, env)) = container
                .env
                .iter()
                .flatten()
                .enumerate()
                .find(|(_, e)| e.name == "NVIDIA_VISIBLE_DEVICES")
            else {
                continue;
            };
            let value = env.value.as_deref().unwrap_or_default();
            if matches!(value, "void" | "none") || requests_gpu(w.spec, c) {
                continue;
            }
            let base = format!("{}/containers/{c}", w.spec_path);
            let mut ops = vec![json!({"op": "remove", "path": format!("{base}/env/{e}")})];
            let resources = container.resources.as_ref();
            if resources.and_then(|r| r.limits.as_ref()).is_some() {
                ops.push(json!({"op": "add", "path": format!("{base}/resources/limits/{}", token(&class)), "value": "1"}));
            } else if resources.is_some() {
                ops.push(json!({"op": "add", "path": format!("{base}/resources/limits"), "value": {class.clone(): "1"}}));
            } else {
                ops.push(json!({"op": "add", "path": format!("{base}/resources"), "value": {"limits": {class.clone(): "1"}}}));
            }
            out.push(Finding::new(
                Row::NoCardVisible,
                vec![w.object()],
                format!(
                    "GPU access came from NVIDIA_VISIBLE_DEVICES={value} in container {} instead of a resource request: under DRA the ordinary runtime does not read it, devices come in through CDI for a request",
                    container.name
                ),
                w.json_patch(&ops),
            ));
        }
    }
    out
}

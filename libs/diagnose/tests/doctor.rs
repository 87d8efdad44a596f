//! The doctor's rows as pure functions: each built from a small snapshot
//! with mk_* helpers, the finding and its objects and fix asserted; a healthy
//! cluster gives none.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use serde_json::{Value, json};
use switchyard_api::{GPUClass, ModuleConfig, NodeGroup};
use switchyard_diagnose::{Finding, Row, Snapshot, diagnose, explain_pod};

fn from<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).expect("a valid object")
}

fn mk_node(name: &str, group: &str, stack: Option<&str>) -> Node {
    let mut labels = json!({"node.deckhouse.io/group": group});
    if let Some(stack) = stack {
        labels["node.deckhouse.io/gpu-stack"] = json!(stack);
    }
    from(
        json!({"metadata": {"name": name, "labels": labels}, "spec": {}, "status": {"allocatable": {"cpu": "32"}}}),
    )
}

fn with_label(mut node: Node, key: &str, value: &str) -> Node {
    node.metadata
        .labels
        .get_or_insert_default()
        .insert(key.into(), value.into());
    node
}

fn with_gpus(mut node: Node, n: &str) -> Node {
    let status = node.status.get_or_insert_default();
    status.allocatable.get_or_insert_default().insert(
        "nvidia.com/gpu".into(),
        k8s_openapi::apimachinery::pkg::api::resource::Quantity(n.into()),
    );
    node
}

fn with_taint(mut node: Node, key: &str, value: &str) -> Node {
    node.spec
        .get_or_insert_default()
        .taints
        .get_or_insert_default()
        .push(from(
            json!({"key": key, "value": value, "effect": "NoSchedule"}),
        ));
    node
}

fn mk_group(name: &str, spec_gpu: bool, template: Value) -> NodeGroup {
    let mut spec = json!({"nodeType": "Static", "nodeTemplate": template});
    if spec_gpu {
        spec["gpu"] = json!({"sharing": "Exclusive"});
    }
    from(
        json!({"apiVersion": "deckhouse.io/v1", "kind": "NodeGroup", "metadata": {"name": name}, "spec": spec}),
    )
}

fn mk_module(dra: bool) -> ModuleConfig {
    from(
        json!({"apiVersion": "deckhouse.io/v1alpha1", "kind": "ModuleConfig", "metadata": {"name": "gpu"},
        "spec": {"enabled": true, "version": 1, "settings": {"dra": {"enabled": dra}}}}),
    )
}

fn mk_gpu_class(name: &str) -> GPUClass {
    from(
        json!({"apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "GPUClass", "metadata": {"name": name},
        "spec": {"selector": {"matchLabels": {"gpu.deckhouse.io/device": "a100-sxm4-40gb"}}}}),
    )
}

const A100: &str = r#"device.driver == "gpu.deckhouse.io" && device.attributes["gpu.deckhouse.io"].device == "a100-sxm4-40gb""#;

fn mk_device_class(name: &str, resource: &str, expression: &str) -> DeviceClass {
    from(
        json!({"metadata": {"name": name}, "spec": {"extendedResourceName": resource,
        "selectors": [{"cel": {"expression": expression}}]}}),
    )
}

fn mk_slice(node: &str, models: &[&str]) -> ResourceSlice {
    let devices: Vec<Value> = models
        .iter()
        .enumerate()
        .map(|(i, m)| json!({"name": format!("gpu-{i}"), "attributes": {"type": {"string": "gpu"}, "device": {"string": m}}}))
        .collect();
    from(
        json!({"metadata": {"name": format!("{node}-gpus")}, "spec": {"driver": "gpu.deckhouse.io", "nodeName": node,
        "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "devices": devices}}),
    )
}

fn mk_pod(ns: &str, name: &str, container: Value, extra: Value) -> Pod {
    let mut spec = json!({"containers": [container]});
    for (k, v) in extra.as_object().cloned().unwrap_or_default() {
        spec[k] = v;
    }
    from(
        json!({"metadata": {"name": name, "namespace": ns, "uid": format!("uid-{name}")}, "spec": spec, "status": {"phase": "Pending"}}),
    )
}

fn gpu_container(resource: &str) -> Value {
    json!({"name": "app", "image": "cuda", "resources": {"limits": {resource: "1"}}})
}

fn mk_deployment(ns: &str, name: &str, container: Value, extra: Value) -> Deployment {
    let mut spec = json!({"containers": [container]});
    for (k, v) in extra.as_object().cloned().unwrap_or_default() {
        spec[k] = v;
    }
    from(
        json!({"metadata": {"name": name, "namespace": ns}, "spec": {"selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name}}, "spec": spec}}}),
    )
}

fn mk_claim(ns: &str, name: &str, class: &str, selector: Option<&str>) -> ResourceClaim {
    let mut exactly = json!({"deviceClassName": class, "allocationMode": "ExactCount", "count": 1});
    if let Some(s) = selector {
        exactly["selectors"] = json!([{"cel": {"expression": s}}]);
    }
    from(
        json!({"metadata": {"name": name, "namespace": ns}, "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}),
    )
}

/// A migrated cluster: gpu (spec.gpu, empty of nodes) and gpu-dra with the
/// same template, one DRA node publishing an A100, class a100, a workload on it.
fn healthy() -> Snapshot {
    let template = json!({"labels": {"team": "ml"}, "taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]});
    let mut running = mk_pod(
        "ml",
        "train-0",
        gpu_container("gpu.deckhouse.io/a100"),
        json!({"nodeName": "gpu-1"}),
    );
    running.status.as_mut().unwrap().phase = Some("Running".into());
    Snapshot {
        nodes: vec![mk_node("gpu-1", "gpu-dra", Some("dra"))],
        node_groups: vec![
            mk_group("gpu", true, template.clone()),
            mk_group("gpu-dra", false, template),
        ],
        module_config: Some(mk_module(true)),
        dra_api_served: true,
        gpu_classes: vec![mk_gpu_class("a100")],
        device_classes: vec![mk_device_class(
            "a100.gpu.deckhouse.io",
            "gpu.deckhouse.io/a100",
            A100,
        )],
        slices: vec![mk_slice("gpu-1", &["a100-sxm4-40gb"])],
        pods: vec![running],
        deployments: vec![mk_deployment(
            "ml",
            "train",
            gpu_container("gpu.deckhouse.io/a100"),
            json!({}),
        )],
        ..Default::default()
    }
}

fn only(findings: &[Finding], row: Row) -> Vec<&Finding> {
    findings.iter().filter(|f| f.row == row).collect()
}

#[test]
fn a_healthy_cluster_has_no_findings() {
    assert_eq!(diagnose(&healthy()), Vec::new());
}

#[test]
fn no_stack_manages_a_gpu_node_of_a_group_without_spec_gpu_while_dra_is_off() {
    let mut s = healthy();
    s.module_config = Some(mk_module(false));
    s.nodes.push(with_label(
        mk_node("gpu-7", "workers", None),
        "nvidia.com/gpu.present",
        "true",
    ));
    s.nodes.push(mk_node("cpu-1", "workers", None)); // not a GPU node
    let f = diagnose(&s);
    let rows = only(&f, Row::NoStackManagesNode);
    assert_eq!(rows.len(), 2, "{f:#?}"); // workers (gpu-7) and gpu-dra (gpu-1)
    let workers = rows
        .iter()
        .find(|f| f.objects.contains(&"Node/gpu-7".into()))
        .unwrap();
    assert_eq!(
        workers.objects,
        ["NodeGroup/workers", "Node/gpu-7", "ModuleConfig/gpu"]
    );
    assert!(
        workers
            .cause
            .contains("has no spec.gpu, and dra.enabled is off")
    );
    assert!(
        workers.fix.contains(r#"{"dra":{"enabled":true}}"#),
        "{}",
        workers.fix
    );
}

#[test]
fn dra_is_not_deployed_for_the_opt_out_label_the_gates_and_a_spec_gpu_group() {
    let mut s = healthy();
    s.nodes.push(with_label(
        mk_node("gpu-2", "gpu-dra", None),
        "gpu.deckhouse.io/enabled",
        "false",
    ));
    s.physical_gpus.push(from(json!({"apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "PhysicalGPU", "metadata": {"name": "gpu-2-0"},
        "spec": {"node": "gpu-2", "index": 0, "uuid": "GPU-1", "product": "NVIDIA A100"}})));
    s.nodes.push(with_gpus(
        mk_node("gpu-9", "gpu", Some("device-plugin")),
        "8",
    ));
    s.deployments.push(mk_deployment(
        "ml",
        "pinned",
        gpu_container("gpu.deckhouse.io/a100"),
        json!({"nodeSelector": {"node.deckhouse.io/group": "gpu"}}),
    ));
    let f = diagnose(&s);
    let rows = only(&f, Row::DraNotDeployed);
    assert_eq!(rows.len(), 2, "{f:#?}");
    assert!(
        rows.iter()
            .any(|r| r.objects == ["NodeGroup/gpu-dra", "Node/gpu-2"]
                && r.fix == "kubectl label node gpu-2 gpu.deckhouse.io/enabled-")
    );
    let pinned = rows
        .iter()
        .find(|r| r.objects[0] == "Deployment/ml/pinned")
        .unwrap();
    assert!(pinned.cause.contains("has spec.gpu"));
    assert!(
        pinned
            .fix
            .contains("/spec/template/spec/nodeSelector/node.deckhouse.io~1group"),
        "{}",
        pinned.fix
    );

    s.dra_api_served = false;
    let f = diagnose(&s);
    let gates = only(&f, Row::DraNotDeployed)
        .into_iter()
        .find(|r| r.cause.contains("feature gates are not ready"))
        .expect("the gates row");
    assert_eq!(gates.objects, ["Node/gpu-1"]);
    assert!(gates.fix.contains("get module gpu"));
}

#[test]
fn held_on_dra_is_a_spec_gpu_group_whose_nodes_dra_serves() {
    let mut s = healthy();
    s.nodes.push(mk_node("gpu-legacy-0", "gpu", Some("dra")));
    s.slices.push(mk_slice("gpu-legacy-0", &["a100-sxm4-40gb"]));
    let f = diagnose(&s);
    let rows = only(&f, Row::HeldOnDra);
    assert_eq!(rows.len(), 1, "{f:#?}");
    assert_eq!(rows[0].objects, ["NodeGroup/gpu", "Node/gpu-legacy-0"]);
    assert_eq!(
        rows[0].fix,
        r#"kubectl patch nodegroup gpu --type json -p '[{"op":"remove","path":"/spec/gpu"}]'"#
    );
}

/// The stack rows ask the core's stack rules, on the facts inventory's
/// builders make of the objects: a control-plane node gets no DRA, so no row
/// says DRA is missing there; an opted-out node of a group held on DRA gets
/// no stack; and with dra.enabled off no stack serves a group without
/// spec.gpu, whatever its nodes are (the rules decide that first).
#[test]
fn the_stack_rows_follow_the_cores_stack_rules() {
    let mut s = healthy();
    let gpu_present = |node| with_label(node, "nvidia.com/gpu.present", "true");
    s.nodes.push(gpu_present(with_label(
        mk_node("master-0", "master", None),
        "node-role.kubernetes.io/control-plane",
        "",
    )));
    assert_eq!(diagnose(&s), Vec::new());
    s.dra_api_served = false;
    let f = diagnose(&s);
    let [gates] = only(&f, Row::DraNotDeployed)[..] else {
        panic!("{f:#?}")
    };
    assert_eq!(gates.objects, ["Node/gpu-1"]);
    s.dra_api_served = true;

    // Group gpu is held on DRA (a node of it is on DRA): its opted-out node
    // gets no stack.
    s.nodes.push(mk_node("gpu-legacy-0", "gpu", Some("dra")));
    s.slices.push(mk_slice("gpu-legacy-0", &["a100-sxm4-40gb"]));
    s.nodes.push(with_label(
        gpu_present(mk_node("gpu-legacy-1", "gpu", None)),
        "gpu.deckhouse.io/enabled",
        "false",
    ));
    let f = diagnose(&s);
    let [opted_out] = only(&f, Row::DraNotDeployed)[..] else {
        panic!("{f:#?}")
    };
    assert_eq!(opted_out.objects, ["NodeGroup/gpu", "Node/gpu-legacy-1"]);
    assert_eq!(only(&f, Row::HeldOnDra).len(), 1, "{f:#?}");

    s.module_config = Some(mk_module(false));
    let f = diagnose(&s);
    let master = only(&f, Row::NoStackManagesNode)
        .into_iter()
        .find(|r| r.objects[0] == "NodeGroup/master")
        .cloned();
    assert_eq!(
        master.map(|r| r.objects),
        Some(vec![
            "NodeGroup/master".to_string(),
            "Node/master-0".into(),
            "ModuleConfig/gpu".into()
        ]),
        "{f:#?}"
    );
}

#[test]
fn the_pod_stays_on_the_old_nodes_for_its_request_or_its_binding() {
    let mut s = healthy();
    s.deployments.push(mk_deployment(
        "ml",
        "legacy",
        gpu_container("nvidia.com/gpu"),
        json!({"nodeSelector": {"node.deckhouse.io/group": "gpu"}}),
    ));
    let f = diagnose(&s);
    let rows = only(&f, Row::PodStaysOnOldNodes);
    assert_eq!(rows.len(), 1, "{f:#?}");
    assert_eq!(rows[0].objects, ["Deployment/ml/legacy", "NodeGroup/gpu"]);
    assert!(
        rows[0]
            .cause
            .contains("still has the nvidia.com/gpu request")
    );
    assert!(rows[0].cause.contains("binding to the source group"));
    assert!(
        rows[0]
            .fix
            .starts_with("kubectl -n ml patch deployment legacy --type json -p"),
        "{}",
        rows[0].fix
    );
    assert!(rows[0].fix.contains(r#""path":"/spec/template/spec/containers/0/resources/limits/gpu.deckhouse.io~1a100","value":"1""#), "{}", rows[0].fix);
    // Without a DRA class there is nowhere to move to yet.
    s.device_classes.clear();
    assert!(only(&diagnose(&s), Row::PodStaysOnOldNodes).is_empty());
}

#[test]
fn the_pod_is_pending_when_no_device_of_its_kind_is_free() {
    let mut s = healthy();
    // The one A100 is taken by a claim.
    let mut taken = mk_claim("ml", "taken", "a100.gpu.deckhouse.io", None);
    taken.status = Some(from(json!({"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": "gpu.deckhouse.io", "pool": "gpu-1", "device": "gpu-0"}]}}})));
    s.claims.push(taken);
    s.pods.push(mk_pod(
        "ml",
        "waiting",
        gpu_container("gpu.deckhouse.io/a100"),
        json!({}),
    ));
    s.nodes.push(with_gpus(
        mk_node("gpu-0", "gpu", Some("device-plugin")),
        "1",
    ));
    let f = diagnose(&s);
    let rows = only(&f, Row::PodPending);
    assert_eq!(rows.len(), 1, "{f:#?}");
    assert_eq!(
        rows[0].objects,
        ["Pod/ml/waiting", "DeviceClass/a100.gpu.deckhouse.io"]
    );
    assert!(
        rows[0]
            .cause
            .contains("no free devices of the requested kind"),
        "{}",
        rows[0].cause
    );
    assert!(
        rows[0]
            .cause
            .contains("gpu-1: gpu.deckhouse.io/gpu-1/gpu-0 (in use: allocated to another claim)"),
        "{}",
        rows[0].cause
    );
    assert!(
        rows[0]
            .fix
            .starts_with("switchyard handover --node gpu-0 --to gpu-dra"),
        "{}",
        rows[0].fix
    );
    // Group gpu held on DRA by one of its nodes: the node still labelled
    // device-plugin is the device plugin's, and still the one to hand over.
    s.nodes.push(mk_node("gpu-legacy-0", "gpu", Some("dra")));
    let f = diagnose(&s);
    assert_eq!(only(&f, Row::HeldOnDra).len(), 1, "{f:#?}");
    let rows = only(&f, Row::PodPending);
    assert!(
        rows[0]
            .fix
            .starts_with("switchyard handover --node gpu-0 --to gpu-dra"),
        "{f:#?}"
    );
    s.nodes.pop();

    let e = explain_pod(&s, &s.pods[1]).unwrap();
    assert!(e.fits.is_empty());
    assert_eq!(
        e.claims,
        [
            "waiting-extended-resources (pending): the scheduler's claim for gpu.deckhouse.io/a100 (DRAExtendedResource)"
        ]
    );
}

#[test]
fn explain_pod_names_the_taint_the_selector_and_the_node_selector() {
    let mut s = healthy();
    s.nodes[0] = with_taint(s.nodes[0].clone(), "dedicated", "gpu");
    s.nodes.push(mk_node("gpu-2", "gpu-dra", Some("dra")));
    s.slices.push(mk_slice("gpu-2", &["h100-sxm5-80gb"]));
    let pod = mk_pod(
        "ml",
        "p",
        gpu_container("gpu.deckhouse.io/a100"),
        json!({"nodeSelector": {"team": "ml"}}),
    );
    let e = explain_pod(&s, &pod).unwrap();
    let gpu1 = e.nodes.iter().find(|n| n.node == "gpu-1").unwrap();
    assert!(!gpu1.fits);
    assert!(
        gpu1.reasons
            .contains(&"taint not tolerated: dedicated=gpu:NoSchedule".to_string()),
        "{:?}",
        gpu1.reasons
    );
    assert!(
        gpu1.reasons
            .iter()
            .any(|r| r.contains("node selector team=ml does not match"))
    );
    assert!(
        gpu1.devices.as_ref().unwrap().allocated(),
        "its card itself is free"
    );
    let gpu2 = e.nodes.iter().find(|n| n.node == "gpu-2").unwrap();
    let reason = gpu2.devices.as_ref().unwrap().requests[0].candidates[0]
        .reason
        .clone()
        .unwrap();
    assert!(
        reason.starts_with("selector false: class a100.gpu.deckhouse.io selector #0"),
        "{reason}"
    );
    // Tolerating the taint and dropping the selector: gpu-1 fits.
    let pod = mk_pod(
        "ml",
        "p",
        gpu_container("gpu.deckhouse.io/a100"),
        json!({"tolerations": [{"key": "dedicated", "operator": "Exists"}]}),
    );
    assert_eq!(explain_pod(&s, &pod).unwrap().fits, ["gpu-1"]);
}

#[test]
fn no_resource_claim_for_a_class_name_no_device_class_publishes() {
    let mut s = healthy();
    s.deployments.push(mk_deployment(
        "ml",
        "typo",
        gpu_container("gpu.deckhouse.io/a10"),
        json!({}),
    ));
    let f = diagnose(&s);
    let rows = only(&f, Row::NoResourceClaim);
    assert_eq!(rows.len(), 1, "{f:#?}");
    assert_eq!(rows[0].objects, ["Deployment/ml/typo"]);
    assert!(rows[0].cause.contains("gpu.deckhouse.io/a10, which no DeviceClass publishes; known class resources: gpu.deckhouse.io/a100"), "{}", rows[0].cause);
    assert!(rows[0].cause.contains("kubectl get gpuclass"));
    assert!(
        rows[0].fix.contains("gpu.deckhouse.io~1a100"),
        "{}",
        rows[0].fix
    );
}

#[test]
fn no_card_visible_when_nvidia_visible_devices_replaces_a_request() {
    let mut s = healthy();
    let container = json!({"name": "app", "image": "cuda", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]});
    let mut pod = mk_pod("ml", "sneaky", container, json!({"nodeName": "gpu-1"}));
    pod.status.as_mut().unwrap().phase = Some("Running".into());
    s.pods.push(pod);
    let f = diagnose(&s);
    let rows = only(&f, Row::NoCardVisible);
    assert_eq!(rows.len(), 1, "{f:#?}");
    assert_eq!(rows[0].objects, ["Pod/ml/sneaky"]);
    assert!(rows[0].cause.contains("NVIDIA_VISIBLE_DEVICES=all"));
    assert!(
        rows[0]
            .fix
            .contains(r#"{"op":"remove","path":"/spec/containers/0/env/0"}"#),
        "{}",
        rows[0].fix
    );
}

#[test]
fn nvidia_guide_rows_slices_selectors_dual_advertisement() {
    let mut s = healthy();
    s.nodes.push(mk_node("gpu-3", "gpu-dra", Some("dra"))); // DRA, no slices
    s.nodes[0] = with_gpus(s.nodes[0].clone(), "1"); // gpu-1 also advertises nvidia.com/gpu
    s.claims.push(mk_claim(
        "ml",
        "h100",
        "a100.gpu.deckhouse.io",
        Some(r#"device.attributes["gpu.deckhouse.io"].device == "a100-pcie""#),
    ));
    let f = diagnose(&s);
    let slices = only(&f, Row::NoResourceSlices);
    assert_eq!(slices.len(), 1, "{f:#?}");
    assert_eq!(
        slices[0].objects,
        ["Node/gpu-3", "DeviceClass/a100.gpu.deckhouse.io"]
    );
    let selector = only(&f, Row::ClaimSelectorMatchesNoDevice);
    assert_eq!(selector.len(), 1, "{f:#?}");
    assert_eq!(
        selector[0].objects,
        ["ResourceClaim/ml/h100", "DeviceClass/a100.gpu.deckhouse.io"]
    );
    assert!(selector[0].cause.contains("request gpu: a selector is syntactically valid but matches none of the 1 published devices"), "{}", selector[0].cause);
    let dual = only(&f, Row::DevicePluginOnDraNode);
    assert_eq!(dual.len(), 1, "{f:#?}");
    assert_eq!(dual[0].objects, ["Node/gpu-1", "ResourceSlice/gpu-1-gpus"]);
    assert!(dual[0].fix.starts_with("kubectl cordon gpu-1"));
}

#[test]
fn the_target_group_is_compared_with_the_source_group() {
    let mut s = healthy();
    s.node_groups[1] = mk_group(
        "gpu-dra",
        false,
        json!({"labels": {"team": "research", "extra": "x"}}),
    );
    s.node_groups[0].spec.kubelet = Some([("maxPods".to_string(), json!(64))].into());
    let f = diagnose(&s);
    let rows = only(&f, Row::TargetGroupDiffers);
    assert_eq!(rows.len(), 1, "{f:#?}");
    assert_eq!(rows[0].objects, ["NodeGroup/gpu", "NodeGroup/gpu-dra"]);
    for part in [
        r#"label extra: gpu has none, gpu-dra has "x""#,
        r#"label team: gpu has "ml", gpu-dra has "research""#,
        "taint dedicated=gpu:NoSchedule: on gpu, not on gpu-dra",
        "kubelet maxPods: gpu has 64, gpu-dra has none",
    ] {
        assert!(rows[0].cause.contains(part), "{part} in {}", rows[0].cause);
    }
    assert!(
        rows[0]
            .fix
            .starts_with("kubectl patch nodegroup gpu-dra --type merge -p")
    );
    assert!(
        rows[0].fix.contains(r#""extra":null"#) && rows[0].fix.contains(r#""maxPods":64"#),
        "{}",
        rows[0].fix
    );
}

fn mk_cluster_role(
    name: &str,
    labels: Value,
    rules: Value,
    aggregation: Option<Value>,
) -> k8s_openapi::api::rbac::v1::ClusterRole {
    let mut role = json!({"metadata": {"name": name, "labels": labels}, "rules": rules});
    if let Some(a) = aggregation {
        role["aggregationRule"] = a;
    }
    from(role)
}

fn mk_cluster_role_binding(
    name: &str,
    role: &str,
    subjects: Value,
) -> k8s_openapi::api::rbac::v1::ClusterRoleBinding {
    from(json!({"metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": subjects}))
}

#[test]
fn tenants_are_everyone_but_system_components_switchyard_and_the_driver() {
    let mut s = healthy();
    s.cluster_roles = vec![
        // Aggregates by expression; writes reach it through the aggregation.
        mk_cluster_role(
            "tenant",
            json!({}),
            json!([]),
            Some(
                json!({"clusterRoleSelectors": [{"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu"]}]}]}),
            ),
        ),
        mk_cluster_role(
            "slices",
            json!({"tier": "gpu"}),
            json!([{"apiGroups": ["resource.k8s.io"], "resources": ["*"], "verbs": ["patch", "get"]}]),
            None,
        ),
        mk_cluster_role(
            "reader",
            json!({}),
            json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["get", "list", "watch"]}]),
            None,
        ),
    ];
    s.service_accounts = vec![from(
        json!({"metadata": {"name": "switchyard-node-agent", "namespace": "switchyard-system",
        "labels": {"app.kubernetes.io/part-of": "switchyard", "app.kubernetes.io/component": "node-agent", "app.kubernetes.io/instance": "sy"}}}),
    )];
    s.cluster_role_bindings = vec![
        mk_cluster_role_binding(
            "everyone",
            "tenant",
            json!([
                {"kind": "Group", "name": "system:authenticated"},
                {"kind": "Group", "name": "system:serviceaccounts:kube-system"},
                {"kind": "User", "name": "system:serviceaccount:ml:trainer"},
                {"kind": "ServiceAccount", "name": "switchyard-node-agent", "namespace": "switchyard-system"},
                {"kind": "ServiceAccount", "name": "plugin", "namespace": "nvidia-dra-driver-gpu"}
            ]),
        ),
        // Reading is no finding.
        mk_cluster_role_binding(
            "readers",
            "reader",
            json!([{"kind": "Group", "name": "ml-team"}]),
        ),
    ];
    let findings = diagnose(&s);
    let tenants = only(&findings, Row::TenantWritesDraInventory);
    assert_eq!(tenants.len(), 1, "{findings:#?}");
    assert_eq!(
        tenants[0].objects,
        [
            "ClusterRoleBinding/everyone",
            "ClusterRole/tenant",
            "Group/system:authenticated",
            "User/system:serviceaccount:ml:trainer"
        ]
    );
    assert!(
        tenants[0]
            .cause
            .contains("patch on deviceclasses; patch on resourceslices"),
        "{}",
        tenants[0].cause
    );
    assert_eq!(
        tenants[0].fix,
        r#"kubectl patch clusterrolebinding everyone --type json -p '[{"op":"remove","path":"/subjects/2"},{"op":"remove","path":"/subjects/0"}]'"#
    );
    // The node agent may write slices through the same binding, and no policy confines it.
    let agent = only(&findings, Row::NodeAgentSlicesUnconfined);
    assert_eq!(agent.len(), 1, "{findings:#?}");
    assert_eq!(
        agent[0].objects,
        [
            "ServiceAccount/switchyard-system/switchyard-node-agent",
            "ClusterRoleBinding/everyone",
            "ValidatingAdmissionPolicy/switchyard-node-agent-own-node"
        ]
    );
    assert!(
        agent[0].fix.starts_with("helm upgrade sy "),
        "{}",
        agent[0].fix
    );
}

/// The GPU Operator's ClusterPolicy with this driver-manager env.
fn mk_cluster_policy(env: Value) -> Value {
    json!({
        "apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
        "metadata": {"name": "cluster-policy"},
        "spec": {"driver": {"manager": {"env": env}}},
    })
}

/// The DRA driver's kubelet-plugin DaemonSet selecting `node_selector`.
fn mk_kubelet_plugin(node_selector: Value) -> k8s_openapi::api::apps::v1::DaemonSet {
    from(json!({
        "metadata": {"name": "dra-driver-nvidia-gpu-kubelet-plugin", "namespace": "nvidia-dra-driver-gpu"},
        "spec": {
            "selector": {"matchLabels": {"dra-driver-nvidia-gpu-component": "kubelet-plugin"}},
            "template": {
                "metadata": {"labels": {"dra-driver-nvidia-gpu-component": "kubelet-plugin"}},
                "spec": {"nodeSelector": node_selector, "containers": [{"name": "plugins", "image": "x"}]},
            },
        },
    }))
}

#[test]
fn the_gpu_operators_driver_manager_must_evict_the_dra_pool_by_its_label() {
    // Without the operator there is nothing to check.
    let mut s = healthy();
    s.daemon_sets.push(mk_kubelet_plugin(json!({})));
    assert!(only(&diagnose(&s), Row::EvictionLabelMissing).is_empty());
    assert!(only(&diagnose(&s), Row::KubeletPluginUnscoped).is_empty());

    s.cluster_policies
        .push(mk_cluster_policy(json!([{"name": "OTHER", "value": "1"}])));
    let f = diagnose(&s);
    let [missing] = only(&f, Row::EvictionLabelMissing)[..] else {
        panic!("{f:#?}")
    };
    assert_eq!(missing.objects, ["ClusterPolicy/cluster-policy"]);
    assert!(
        missing.cause.contains("no NODE_LABEL_FOR_GPU_POD_EVICTION"),
        "{}",
        missing.cause
    );
    assert!(
        missing
            .fix
            .contains("--set 'driver.manager.env[0].value=nvidia.com/dra-kubelet-plugin'"),
        "{}",
        missing.fix
    );
    // The DRA chart's default: no node selector, so on every GPU node.
    let [unscoped] = only(&f, Row::KubeletPluginUnscoped)[..] else {
        panic!("{f:#?}")
    };
    assert_eq!(
        unscoped.objects,
        ["DaemonSet/nvidia-dra-driver-gpu/dra-driver-nvidia-gpu-kubelet-plugin"]
    );
    assert!(
        unscoped
            .fix
            .contains(r#"'kubeletPlugin.nodeSelector={"nvidia.com/dra-kubelet-plugin":"true"}'"#),
        "{}",
        unscoped.fix
    );

    // As the guide sets them: nothing to fix, only what was detected.
    s.cluster_policies = vec![mk_cluster_policy(json!([
        {"name": "NODE_LABEL_FOR_GPU_POD_EVICTION", "value": "nvidia.com/dra-kubelet-plugin"}
    ]))];
    s.daemon_sets = vec![mk_kubelet_plugin(
        json!({"nvidia.com/dra-kubelet-plugin": "true"}),
    )];
    let rows: Vec<Row> = diagnose(&s).iter().map(|f| f.row).collect();
    assert_eq!(rows, [Row::NvidiaBackendDetected]);
    // A pool label of the platform's own: the plugin must select that one.
    s.cluster_policies = vec![mk_cluster_policy(json!([
        {"name": "NODE_LABEL_FOR_GPU_POD_EVICTION", "value": "example.com/dra"}
    ]))];
    let f = diagnose(&s);
    let [unscoped] = only(&f, Row::KubeletPluginUnscoped)[..] else {
        panic!("{f:#?}")
    };
    assert!(
        unscoped.cause.contains("example.com/dra=\"true\""),
        "{}",
        unscoped.cause
    );
}

/// A `gpu.nvidia.com` slice of `node`, as the NVIDIA DRA driver publishes it.
fn mk_nvidia_slice(node: &str) -> ResourceSlice {
    from(json!({
        "metadata": {"name": format!("{node}-gpu.nvidia.com")},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": "gpu-0", "attributes": {"type": {"string": "gpu"}}}]},
    }))
}

#[test]
fn the_gpu_operator_is_detected_with_its_operands_classes_and_dra_nodes() {
    let mut s = healthy();
    s.cluster_policies = vec![mk_cluster_policy(json!([
        {"name": "NODE_LABEL_FOR_GPU_POD_EVICTION", "value": "nvidia.com/dra-kubelet-plugin"}
    ]))];
    s.daemon_sets = vec![mk_kubelet_plugin(
        json!({"nvidia.com/dra-kubelet-plugin": "true"}),
    )];
    s.device_classes.push(mk_device_class(
        "gpu.nvidia.com",
        "nvidia.com/gpu",
        "device.driver == 'gpu.nvidia.com'",
    ));
    s.slices.push(mk_nvidia_slice("gpu-2"));
    let f = diagnose(&s);
    let [detected] = only(&f, Row::NvidiaBackendDetected)[..] else {
        panic!("{f:#?}")
    };
    assert_eq!(detected.severity, switchyard_diagnose::Severity::Info);
    assert_eq!(
        detected.cause,
        "the NVIDIA GPU Operator serves the GPUs: its operands dra-driver-nvidia-gpu-kubelet-plugin (nvidia.com/dra-kubelet-plugin=true); the DRA driver's classes gpu.nvidia.com; nodes publishing gpu.nvidia.com devices: gpu-2"
    );
}

#[test]
fn the_operators_dra_mode_is_reported_beside_a_cluster_policy() {
    let mut s = healthy();
    s.cluster_policies = vec![mk_cluster_policy(json!([
        {"name": "NODE_LABEL_FOR_GPU_POD_EVICTION", "value": "nvidia.com/dra-kubelet-plugin"}
    ]))];
    s.gpu_clusters = vec![json!({
        "apiVersion": "nvidia.com/v1alpha1", "kind": "GPUCluster",
        "metadata": {"name": "gpu-cluster"}, "spec": {"draDriver": {}},
    })];
    let f = diagnose(&s);
    let [found] = only(&f, Row::GpuClusterPresent)[..] else {
        panic!("{f:#?}")
    };
    assert_eq!(found.objects, ["GPUCluster/gpu-cluster"]);
    assert!(
        found
            .cause
            .contains("cannot coexist with the ClusterPolicy"),
        "{}",
        found.cause
    );
    assert_eq!(
        found.fix,
        "kubectl delete gpucluster gpu-cluster  # keep ClusterPolicy; install the DRA driver chart and let Switchyard move the pools"
    );
}

#[test]
fn two_classes_mapping_nvidia_com_gpu_name_the_one_the_scheduler_takes() {
    let mut s = healthy();
    let at = |name: &str, resource: &str, created: &str| {
        let mut dc = mk_device_class(name, resource, "true");
        dc.metadata.creation_timestamp = Some(from(json!(created)));
        dc
    };
    s.device_classes = vec![
        at("gpu.nvidia.com", "nvidia.com/gpu", "2026-11-02T00:00:00Z"),
        at(
            "a100-legacy.gpu.deckhouse.io",
            "nvidia.com/gpu",
            "2026-11-01T00:00:00Z",
        ),
        at(
            "a100.gpu.deckhouse.io",
            "gpu.deckhouse.io/a100",
            "2026-11-03T00:00:00Z",
        ),
    ];
    let f = diagnose(&s);
    let [found] = only(&f, Row::BridgeClasses)[..] else {
        panic!("{f:#?}")
    };
    assert_eq!(
        found.objects,
        [
            "DeviceClass/a100-legacy.gpu.deckhouse.io",
            "DeviceClass/gpu.nvidia.com"
        ]
    );
    assert!(
        found.cause.starts_with("2 DeviceClasses map nvidia.com/gpu (a100-legacy.gpu.deckhouse.io, gpu.nvidia.com): the scheduler serves unchanged manifests through gpu.nvidia.com"),
        "{}",
        found.cause
    );
    // Created at the same moment: the first by name.
    for dc in &mut s.device_classes {
        dc.metadata.creation_timestamp = Some(from(json!("2026-11-01T00:00:00Z")));
    }
    let f = diagnose(&s);
    assert!(
        only(&f, Row::BridgeClasses)[0]
            .cause
            .contains("through a100-legacy.gpu.deckhouse.io (created last")
    );
    // One bridge: nothing to say.
    s.device_classes.remove(0);
    assert!(only(&diagnose(&s), Row::BridgeClasses).is_empty());
}

#[test]
fn the_validator_must_go_where_the_device_plugin_went() {
    let mut s = healthy();
    s.cluster_policies = vec![mk_cluster_policy(json!([
        {"name": "NODE_LABEL_FOR_GPU_POD_EVICTION", "value": "nvidia.com/dra-kubelet-plugin"}
    ]))];
    // The device plugin off, the validator left as the operator set it.
    s.nodes = vec![with_label(
        mk_node("gpu-1", "gpu-dra", Some("dra")),
        "nvidia.com/gpu.deploy.device-plugin",
        "false",
    )];
    let f = diagnose(&s);
    let [found] = only(&f, Row::ValidatorOffNeeded)[..] else {
        panic!("{f:#?}")
    };
    assert_eq!(found.objects, ["Node/gpu-1"]);
    assert!(found.cause.contains("gpu-operator#2550"), "{}", found.cause);
    s.nodes = vec![with_label(
        s.nodes[0].clone(),
        "nvidia.com/gpu.deploy.operator-validator",
        "false",
    )];
    assert!(only(&diagnose(&s), Row::ValidatorOffNeeded).is_empty());
}

#[test]
fn uninstalling_dra_before_the_last_dra_node_is_clear_is_reported() {
    let mut s = healthy();
    s.slices.push(mk_nvidia_slice("gpu-2"));
    let mut claim = mk_claim("ml", "train-gpu", "gpu.nvidia.com", None);
    claim.status = Some(from(json!({"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "gpu-2", "device": "gpu-0"}
    ]}}})));
    s.claims.push(claim);
    // The plugin still runs: clearing the nodes is under way.
    s.daemon_sets = vec![mk_kubelet_plugin(
        json!({"nvidia.com/dra-kubelet-plugin": "true"}),
    )];
    assert!(only(&diagnose(&s), Row::DraUninstallUnsafe).is_empty());
    // Uninstalled while a node publishes and a claim holds its device.
    s.daemon_sets.clear();
    let f = diagnose(&s);
    let [found] = only(&f, Row::DraUninstallUnsafe)[..] else {
        panic!("{f:#?}")
    };
    assert_eq!(found.objects, ["Node/gpu-2", "ResourceClaim/ml/train-gpu"]);
    assert!(found.cause.starts_with("the DRA driver's kubelet plugin is uninstalled while nodes still publish gpu.nvidia.com devices (gpu-2) and claims hold them (ml/train-gpu)"), "{}", found.cause);
}

#[test]
fn every_row_is_named_alike_in_json_and_in_the_table() {
    for row in Row::ALL {
        assert_eq!(
            serde_json::to_value(row).expect("a row as JSON"),
            Value::String(row.id().into()),
            "{row:?}"
        );
    }
}

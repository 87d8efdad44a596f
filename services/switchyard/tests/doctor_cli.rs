//! `switchyard doctor` and `switchyard explain pod`, the real binary against a
//! real control plane (etcd + kube-apiserver, resource.k8s.io/v1 on): clusters
//! built to show each "Common mistakes" row (and the NVIDIA guide's and Step
//! 1's), the findings with their objects and fixes; a healthy cluster with
//! none; and a Pending pod explained per node and device.

use std::process::Command;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Client, Resource};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use switchyard_api::{GPUClass, ModuleConfig, NodeGroup, PhysicalGPU, crds};
use switchyard_testkit::kube::{ControlPlane, create_namespace, fake_node, install_crds};

/// Runs the `switchyard` binary against the plane.
fn switchyard(plane: &ControlPlane, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(args)
        .arg("--kubeconfig")
        .arg(plane.kubeconfig())
        .env_remove("SWITCHYARD_OUTPUT")
        .output()
        .expect("run switchyard");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// The findings of `doctor -o json`, and its exit code.
fn doctor(plane: &ControlPlane) -> (i32, Vec<Value>) {
    let (code, out, err) = switchyard(plane, &["doctor", "-o", "json"]);
    assert!(code == 0 || code == 1, "exit {code}\n{out}\n{err}");
    let report: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    (
        code,
        report["findings"].as_array().cloned().unwrap_or_default(),
    )
}

fn rows<'a>(findings: &'a [Value], row: &str) -> Vec<&'a Value> {
    findings.iter().filter(|f| f["row"] == row).collect()
}

fn objects(f: &Value) -> Vec<String> {
    f["objects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_str().unwrap().to_string())
        .collect()
}

async fn start() -> (ControlPlane, Client) {
    let plane = ControlPlane::start().await;
    let client = plane.client();
    install_crds(&client, crds().into_iter().map(|(_, c)| c).collect()).await;
    create_namespace(&client, "ml").await;
    (plane, client)
}

/// Creates an object from JSON, in its namespace if it has one.
async fn create<K>(client: &Client, value: Value) -> K
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
{
    let object: K = serde_json::from_value(value.clone())
        .unwrap_or_else(|e| panic!("{}: {e}: {value}", K::kind(&())));
    let resource = ApiResource::erase::<K>(&());
    let api: Api<DynamicObject> = match object.meta().namespace.as_deref() {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    let dynamic: DynamicObject =
        serde_json::from_value(serde_json::to_value(&object).unwrap()).unwrap();
    let created = api
        .create(&PostParams::default(), &dynamic)
        .await
        .unwrap_or_else(|e| panic!("create {} {value}: {e}", K::kind(&())));
    serde_json::from_value(serde_json::to_value(created).unwrap()).unwrap()
}

async fn node(
    client: &Client,
    name: &str,
    labels: &[(&str, &str)],
    gpus: Option<&str>,
    taint: Option<(&str, &str)>,
) {
    let taints = taint
        .map(|(k, v)| {
            vec![k8s_openapi::api::core::v1::Taint {
                key: k.into(),
                value: Some(v.into()),
                effect: "NoSchedule".into(),
                ..Default::default()
            }]
        })
        .unwrap_or_default();
    let mut n = fake_node(name, labels, taints);
    if let Some(gpus) = gpus {
        let status = n.status.as_mut().unwrap();
        for map in [&mut status.allocatable, &mut status.capacity] {
            map.get_or_insert_default().insert(
                "nvidia.com/gpu".into(),
                k8s_openapi::apimachinery::pkg::api::resource::Quantity(gpus.into()),
            );
        }
    }
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &n)
        .await
        .unwrap_or_else(|e| panic!("create node {name}: {e}"));
}

async fn group(
    client: &Client,
    name: &str,
    spec_gpu: bool,
    template: Value,
    kubelet: Option<Value>,
) {
    let mut spec = json!({"nodeType": "Static", "nodeTemplate": template});
    if spec_gpu {
        spec["gpu"] = json!({"sharing": "Exclusive"});
    }
    if let Some(k) = kubelet {
        spec["kubelet"] = k;
    }
    create::<NodeGroup>(client, json!({"apiVersion": "deckhouse.io/v1", "kind": "NodeGroup", "metadata": {"name": name}, "spec": spec})).await;
}

async fn module(client: &Client, dra: bool) {
    let config = json!({"apiVersion": "deckhouse.io/v1alpha1", "kind": "ModuleConfig", "metadata": {"name": "gpu"},
        "spec": {"enabled": true, "version": 1, "settings": {"dra": {"enabled": dra}}}});
    Api::<ModuleConfig>::all(client.clone())
        .patch(
            "gpu",
            &PatchParams::apply("test").force(),
            &Patch::Apply(&config),
        )
        .await
        .expect("apply the ModuleConfig");
}

const A100: &str = r#"device.driver == "gpu.deckhouse.io" && device.attributes["gpu.deckhouse.io"].type == "gpu" && device.attributes["gpu.deckhouse.io"].device == "a100-sxm4-40gb""#;

/// Class a100 as the class compiler publishes it: the GPUClass with its
/// status, and its DeviceClass.
async fn class_a100(client: &Client) {
    create::<GPUClass>(client, json!({"apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "GPUClass", "metadata": {"name": "a100"},
        "spec": {"selector": {"matchLabels": {"gpu.deckhouse.io/device": "a100-sxm4-40gb"}}}})).await;
    Api::<GPUClass>::all(client.clone())
        .patch_status("a100", &PatchParams::default(), &Patch::Merge(json!({"status": {
            "deviceClassNames": ["a100.gpu.deckhouse.io"],
            "variants": [{"name": "whole", "deviceClass": "a100.gpu.deckhouse.io", "extendedResourceName": "gpu.deckhouse.io/a100"}]}})))
        .await
        .expect("GPUClass status");
    create::<DeviceClass>(client, json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "a100.gpu.deckhouse.io"},
        "spec": {"extendedResourceName": "gpu.deckhouse.io/a100", "selectors": [{"cel": {"expression": A100}}]}})).await;
}

/// A node's slice of whole A100s.
async fn slice(client: &Client, node: &str, cards: usize) {
    let devices: Vec<Value> = (0..cards)
        .map(|i| json!({"name": format!("gpu-{i}"), "attributes": {"type": {"string": "gpu"}, "device": {"string": "a100-sxm4-40gb"}}}))
        .collect();
    create::<ResourceSlice>(client, json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": format!("{node}-gpus")},
        "spec": {"driver": "gpu.deckhouse.io", "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "devices": devices}})).await;
}

fn container(resource: Option<&str>) -> Value {
    match resource {
        Some(r) => json!({"name": "app", "image": "cuda", "resources": {"limits": {r: "1"}}}),
        None => json!({"name": "app", "image": "cuda"}),
    }
}

async fn deployment(client: &Client, name: &str, container: Value, extra: Value) {
    let mut spec = json!({"containers": [container]});
    for (k, v) in extra.as_object().cloned().unwrap_or_default() {
        spec[k] = v;
    }
    create::<Deployment>(client, json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": "ml"},
        "spec": {"selector": {"matchLabels": {"app": name}}, "template": {"metadata": {"labels": {"app": name}}, "spec": spec}}})).await;
}

async fn pod(client: &Client, name: &str, container: Value, extra: Value) {
    let mut spec = json!({"containers": [container]});
    for (k, v) in extra.as_object().cloned().unwrap_or_default() {
        spec[k] = v;
    }
    create::<Pod>(client, json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ml"}, "spec": spec})).await;
}

/// The `add` and `remove` operations of a JSON patch (RFC 6902), as the API
/// server applies them.
fn json_patch(object: &mut Value, ops: &[Value]) {
    for op in ops {
        let path = op["path"].as_str().unwrap();
        let (parent, last) = path.rsplit_once('/').unwrap();
        let key = last.replace("~1", "/").replace("~0", "~");
        let parent = object
            .pointer_mut(parent)
            .unwrap_or_else(|| panic!("{path}: no parent"));
        match (op["op"].as_str().unwrap(), parent) {
            ("remove", Value::Object(map)) => {
                map.remove(&key)
                    .unwrap_or_else(|| panic!("{path}: nothing to remove"));
            }
            ("remove", Value::Array(items)) => {
                items.remove(key.parse::<usize>().unwrap());
            }
            ("add", Value::Object(map)) => {
                map.insert(key, op["value"].clone());
            }
            (other, _) => panic!("{other} {path}"),
        }
    }
}

const TEMPLATE: &str = r#"{"labels": {"team": "ml"}, "taints": [{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}]}"#;

/// A migrated cluster: the source group kept empty for the trial period, the
/// target group with the same template, one DRA node with its slice, class
/// a100 and a workload requesting it.
async fn healthy(client: &Client) {
    let template: Value = serde_json::from_str(TEMPLATE).unwrap();
    module(client, true).await;
    group(
        client,
        "gpu",
        true,
        template.clone(),
        Some(json!({"maxPods": 64})),
    )
    .await;
    group(
        client,
        "gpu-dra",
        false,
        template,
        Some(json!({"maxPods": 64})),
    )
    .await;
    node(
        client,
        "gpu-1",
        &[
            ("node.deckhouse.io/group", "gpu-dra"),
            ("node.deckhouse.io/gpu-stack", "dra"),
        ],
        None,
        Some(("dedicated", "gpu")),
    )
    .await;
    node(
        client,
        "cpu-1",
        &[("node.deckhouse.io/group", "workers")],
        None,
        None,
    )
    .await;
    slice(client, "gpu-1", 2).await;
    class_a100(client).await;
    deployment(
        client,
        "train",
        container(Some("gpu.deckhouse.io/a100")),
        json!({"tolerations": [{"key": "dedicated", "operator": "Exists"}]}),
    )
    .await;
    create::<StatefulSet>(client, json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "db", "namespace": "ml"},
        "spec": {"serviceName": "db", "selector": {"matchLabels": {"app": "db"}}, "template": {"metadata": {"labels": {"app": "db"}}, "spec": {"containers": [container(None)]}}}})).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_healthy_cluster_has_no_findings_and_exit_0() {
    let (plane, client) = start().await;
    healthy(&client).await;
    let (code, findings) = doctor(&plane);
    assert_eq!((code, findings.len()), (0, 0), "{findings:#?}");
    let (code, out, err) = switchyard(&plane, &["doctor"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert_eq!(out.trim(), "no common mistakes found");
    let (code, out, _) = switchyard(&plane, &["doctor", "-o", "yaml"]);
    assert_eq!((code, out.trim()), (0, "findings: []"));
}

#[tokio::test(flavor = "multi_thread")]
async fn no_stack_manages_a_gpu_node_while_dra_is_off() {
    let (plane, client) = start().await;
    module(&client, false).await;
    group(&client, "workers", false, json!({}), None).await;
    node(
        &client,
        "gpu-7",
        &[
            ("node.deckhouse.io/group", "workers"),
            ("nvidia.com/gpu.present", "true"),
        ],
        None,
        None,
    )
    .await;
    create::<PhysicalGPU>(&client, json!({"apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "PhysicalGPU", "metadata": {"name": "gpu-8-0"},
        "spec": {"node": "gpu-8", "index": 0, "uuid": "GPU-4b8e0c9a", "product": "NVIDIA A100-SXM4-40GB"}})).await;
    node(
        &client,
        "gpu-8",
        &[("node.deckhouse.io/group", "workers")],
        None,
        None,
    )
    .await;
    node(
        &client,
        "cpu-1",
        &[("node.deckhouse.io/group", "workers")],
        None,
        None,
    )
    .await;
    let (code, findings) = doctor(&plane);
    assert_eq!(code, 1);
    let f = rows(&findings, "no-stack-manages-node");
    assert_eq!(f.len(), 1, "{findings:#?}");
    assert_eq!(
        objects(f[0]),
        [
            "NodeGroup/workers",
            "Node/gpu-7",
            "Node/gpu-8",
            "ModuleConfig/gpu"
        ]
    );
    assert_eq!(f[0]["observation"], "No stack manages the node");
    assert!(
        f[0]["cause"]
            .as_str()
            .unwrap()
            .contains("has no spec.gpu, and dra.enabled is off")
    );
    assert_eq!(
        f[0]["fix"],
        r#"kubectl patch moduleconfig gpu --type merge -p '{"spec":{"settings":{"dra":{"enabled":true}}}}'"#
    );
    let (code, out, _) = switchyard(&plane, &["doctor"]);
    assert_eq!(code, 1);
    assert!(out.contains("[no-stack-manages-node] No stack manages the node\n  objects: NodeGroup/workers, Node/gpu-7, Node/gpu-8, ModuleConfig/gpu\n"), "{out}");
    assert!(out.trim_end().ends_with("1 finding"), "{out}");
}

#[tokio::test(flavor = "multi_thread")]
async fn every_other_row_on_one_broken_cluster() {
    let (plane, client) = start().await;
    healthy(&client).await;
    // DRA is not deployed: the opt-out label on a GPU node of the target group.
    node(
        &client,
        "gpu-2",
        &[
            ("node.deckhouse.io/group", "gpu-dra"),
            ("gpu.deckhouse.io/enabled", "false"),
            ("nvidia.com/gpu.present", "true"),
        ],
        None,
        None,
    )
    .await;
    // Held on DRA: a node of the spec.gpu group served by DRA, publishing its slice.
    node(
        &client,
        "gpu-legacy-0",
        &[
            ("node.deckhouse.io/group", "gpu"),
            ("node.deckhouse.io/gpu-stack", "dra"),
        ],
        None,
        None,
    )
    .await;
    slice(&client, "gpu-legacy-0", 1).await;
    // A device-plugin node of the source group (the next to hand over).
    node(
        &client,
        "gpu-old-0",
        &[
            ("node.deckhouse.io/group", "gpu"),
            ("node.deckhouse.io/gpu-stack", "device-plugin"),
        ],
        Some("8"),
        None,
    )
    .await;
    // The Pod stays on the old nodes: nvidia.com/gpu and the source group's selector.
    deployment(
        &client,
        "legacy",
        container(Some("nvidia.com/gpu")),
        json!({"nodeSelector": {"node.deckhouse.io/group": "gpu"}}),
    )
    .await;
    // No ResourceClaim was created: a class name no DeviceClass publishes.
    deployment(
        &client,
        "typo",
        container(Some("gpu.deckhouse.io/a10")),
        json!({}),
    )
    .await;
    // The Pod runs but sees no card: NVIDIA_VISIBLE_DEVICES instead of a request.
    pod(&client, "sneaky", json!({"name": "app", "image": "cuda", "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}), json!({"nodeName": "gpu-1"})).await;
    // The Pod is Pending: three A100 wanted, the target group has three cards, two of them taken.
    for (i, (node, dev)) in [("gpu-1", "gpu-0"), ("gpu-legacy-0", "gpu-0")]
        .iter()
        .enumerate()
    {
        let name = format!("taken-{i}");
        create::<ResourceClaim>(&client, json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": "ml"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "a100.gpu.deckhouse.io"}}]}}})).await;
        Api::<ResourceClaim>::namespaced(client.clone(), "ml")
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(json!({"status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": "gpu.deckhouse.io", "pool": node, "device": dev}]}}}})))
            .await
            .expect("allocate the claim");
    }
    pod(&client, "waiting", json!({"name": "app", "image": "cuda", "resources": {"limits": {"gpu.deckhouse.io/a100": "2"}}}),
        json!({"tolerations": [{"key": "dedicated", "operator": "Exists"}]})).await;
    // NVIDIA guide: a claim whose selector matches no device; a DRA node without
    // slices; a DRA node that also advertises nvidia.com/gpu.
    create::<ResourceClaim>(&client, json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "h100", "namespace": "ml"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "a100.gpu.deckhouse.io",
            "selectors": [{"cel": {"expression": "device.attributes[\"gpu.deckhouse.io\"].device == \"a100-pcie-40gb\""}}]}}]}}})).await;
    node(
        &client,
        "gpu-3",
        &[
            ("node.deckhouse.io/group", "gpu-dra"),
            ("node.deckhouse.io/gpu-stack", "dra"),
        ],
        None,
        None,
    )
    .await;
    node(
        &client,
        "gpu-4",
        &[
            ("node.deckhouse.io/group", "gpu-dra"),
            ("node.deckhouse.io/gpu-stack", "dra"),
        ],
        Some("1"),
        None,
    )
    .await;
    slice(&client, "gpu-4", 0).await;
    // Step 1: a second target group that was not given the source's template.
    group(
        &client,
        "gpu-dra-2",
        false,
        json!({"labels": {"team": "research"}}),
        None,
    )
    .await;

    let (code, findings) = doctor(&plane);
    assert_eq!(code, 1);
    let one = |row: &str| {
        let f = rows(&findings, row);
        assert_eq!(f.len(), 1, "{row}: {findings:#?}");
        f[0].clone()
    };
    let f = one("dra-not-deployed");
    assert_eq!(objects(&f), ["NodeGroup/gpu-dra", "Node/gpu-2"]);
    assert_eq!(
        f["fix"],
        "kubectl label node gpu-2 gpu.deckhouse.io/enabled-"
    );

    let f = one("held-on-dra");
    assert_eq!(f["observation"], "D8GpuNodeGroupHeldOnDra is firing");
    assert_eq!(objects(&f), ["NodeGroup/gpu", "Node/gpu-legacy-0"]);
    assert_eq!(
        f["fix"],
        r#"kubectl patch nodegroup gpu --type json -p '[{"op":"remove","path":"/spec/gpu"}]'"#
    );

    let f = one("pod-stays-on-old-nodes");
    assert_eq!(objects(&f), ["Deployment/ml/legacy", "NodeGroup/gpu"]);
    assert_eq!(
        f["fix"],
        r#"kubectl -n ml patch deployment legacy --type json -p '[{"op":"remove","path":"/spec/template/spec/containers/0/resources/limits/nvidia.com~1gpu"},{"op":"add","path":"/spec/template/spec/containers/0/resources/limits/gpu.deckhouse.io~1a100","value":"1"},{"op":"remove","path":"/spec/template/spec/nodeSelector/node.deckhouse.io~1group"}]'"#
    );
    let legacy_fix = f["fix"].as_str().unwrap().to_string();

    let f = one("pod-pending");
    assert_eq!(
        objects(&f),
        ["Pod/ml/waiting", "DeviceClass/a100.gpu.deckhouse.io"]
    );
    let cause = f["cause"].as_str().unwrap();
    assert!(
        cause.starts_with("there are no free devices of the requested kind in the target group"),
        "{cause}"
    );
    assert!(
        cause.contains("gpu.deckhouse.io/gpu-1/gpu-0 (in use: allocated to another claim)"),
        "{cause}"
    );
    assert_eq!(
        f["fix"],
        r#"switchyard handover --node gpu-old-0 --to gpu-dra --nats-url "$SWITCHYARD_NATS_URL""#
    );

    let f = one("no-resource-claim");
    assert_eq!(objects(&f), ["Deployment/ml/typo"]);
    let cause = f["cause"].as_str().unwrap();
    assert!(cause.contains("requests gpu.deckhouse.io/a10, which no DeviceClass publishes; known class resources: gpu.deckhouse.io/a100 (GPU classes: GPUClass/a100; check with kubectl get gpuclass)"), "{cause}");

    let typo_fix = f["fix"].as_str().unwrap().to_string();
    assert!(
        typo_fix.starts_with("kubectl -n ml patch deployment typo --type json -p '"),
        "{typo_fix}"
    );

    let f = one("no-card-visible");
    assert_eq!(objects(&f), ["Pod/ml/sneaky"]);
    assert!(
        f["fix"]
            .as_str()
            .unwrap()
            .contains(r#"{"op":"remove","path":"/spec/containers/0/env/0"}"#)
    );

    let f = one("claim-selector-matches-no-device");
    assert_eq!(
        objects(&f),
        ["ResourceClaim/ml/h100", "DeviceClass/a100.gpu.deckhouse.io"]
    );
    assert!(
        f["cause"]
            .as_str()
            .unwrap()
            .contains("matches none of the 3 published devices"),
        "{f}"
    );
    assert_eq!(f["fix"], "kubectl get resourceslice -o yaml");

    let f = one("no-resource-slices");
    assert_eq!(
        objects(&f),
        ["Node/gpu-3", "DeviceClass/a100.gpu.deckhouse.io"]
    );
    assert_eq!(
        f["fix"],
        "kubectl -n d8-nvidia-gpu get pods -o wide --field-selector spec.nodeName=gpu-3"
    );

    let f = one("device-plugin-on-dra-node");
    assert_eq!(objects(&f), ["Node/gpu-4", "ResourceSlice/gpu-4-gpus"]);

    let f = one("target-group-differs");
    assert_eq!(objects(&f), ["NodeGroup/gpu", "NodeGroup/gpu-dra-2"]);
    let cause = f["cause"].as_str().unwrap();
    for part in [
        r#"label team: gpu has "ml", gpu-dra-2 has "research""#,
        "taint dedicated=gpu:NoSchedule: on gpu, not on gpu-dra-2",
        "kubelet maxPods: gpu has 64, gpu-dra-2 has none",
    ] {
        assert!(cause.contains(part), "{part} in {cause}");
    }
    // The fix, applied, clears the row.
    let fix = f["fix"].as_str().unwrap();
    let patch = fix
        .strip_prefix("kubectl patch nodegroup gpu-dra-2 --type merge -p '")
        .and_then(|p| p.strip_suffix('\''))
        .unwrap_or_else(|| panic!("{fix}"));
    let patch: Value = serde_json::from_str(patch).unwrap();
    Api::<NodeGroup>::all(client.clone())
        .patch("gpu-dra-2", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("apply the fix");
    // So do the deployments' JSON patches.
    for (name, fix) in [("legacy", &legacy_fix), ("typo", &typo_fix)] {
        let ops = fix
            .split_once(" --type json -p '")
            .and_then(|(_, p)| p.strip_suffix('\''))
            .unwrap_or_else(|| panic!("{fix}"));
        let ops: Vec<Value> = serde_json::from_str(ops).unwrap();
        let api = Api::<Deployment>::namespaced(client.clone(), "ml");
        let mut object = serde_json::to_value(api.get(name).await.unwrap()).unwrap();
        json_patch(&mut object, &ops);
        let object: Deployment = serde_json::from_value(object).unwrap();
        api.replace(name, &PostParams::default(), &object)
            .await
            .unwrap_or_else(|e| panic!("apply {fix}: {e}"));
    }
    let (_, findings) = doctor(&plane);
    for row in [
        "target-group-differs",
        "pod-stays-on-old-nodes",
        "no-resource-claim",
    ] {
        assert!(rows(&findings, row).is_empty(), "{row}: {findings:#?}");
    }
    assert_eq!(findings.len(), 7, "{findings:#?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn explain_pod_names_the_reason_per_node_and_device() {
    let (plane, client) = start().await;
    module(&client, true).await;
    // gpu-1: the MIG example's card, both 3g.20gb slices taken — the whole
    // card's counters are exhausted, the slices are in use.
    node(
        &client,
        "gpu-1",
        &[("node.deckhouse.io/gpu-stack", "dra")],
        None,
        None,
    )
    .await;
    let example = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/examples/dra-a100-mig.yaml"
    ))
    .unwrap();
    for doc in serde_yaml_ng::Deserializer::from_str(&example) {
        let value: Value = serde::Deserialize::deserialize(doc).unwrap();
        match value["kind"].as_str() {
            Some("ResourceSlice") => _ = create::<ResourceSlice>(&client, value).await,
            Some("DeviceClass") => _ = create::<DeviceClass>(&client, value).await,
            _ => {}
        }
    }
    for (name, device) in [
        ("notebook", "gpu-0-mig-3g-20gb-0"),
        ("notebook-2", "gpu-0-mig-3g-20gb-1"),
    ] {
        create::<ResourceClaim>(&client, json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": "ml"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "a100-mig-3g.20gb.gpu.deckhouse.io"}}]}}})).await;
        Api::<ResourceClaim>::namespaced(client.clone(), "ml")
            .patch_status(name, &PatchParams::default(), &Patch::Merge(json!({"status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": "gpu.deckhouse.io", "pool": "gpu-1", "device": device}]}}}})))
            .await
            .expect("allocate");
    }
    // gpu-2: a free card, but a taint the pod does not tolerate.
    node(
        &client,
        "gpu-2",
        &[("node.deckhouse.io/gpu-stack", "dra")],
        None,
        Some(("dedicated", "research")),
    )
    .await;
    slice(&client, "gpu-2", 1).await;
    pod(
        &client,
        "train",
        container(Some("gpu.deckhouse.io/a100")),
        json!({}),
    )
    .await;

    let (code, out, err) = switchyard(&plane, &["explain", "pod", "ml/train"]);
    assert_eq!(code, 1, "{out}\n{err}");
    for line in [
        "pod ml/train (Pending)",
        "  train-extended-resources (pending): the scheduler's claim for gpu.deckhouse.io/a100 (DRAExtendedResource)",
        "node gpu-1: does not fit",
        "  node gpu-1: unschedulable",
        "  claim ml/train-extended-resources request container-0-request-0 (class a100.gpu.deckhouse.io, wants 1):",
        "    gpu.deckhouse.io/gpu-1/gpu-0: counters exhausted: gpu-0-counters/memory has 0 left, the device needs 40Gi",
        "    gpu.deckhouse.io/gpu-1/gpu-0-mig-3g-20gb-0: in use: allocated to another claim",
        "node gpu-2: does not fit",
        "  taint not tolerated: dedicated=research:NoSchedule",
        "  node gpu-2: allocated",
        "    gpu.deckhouse.io/gpu-2/gpu-0: fits on its own",
        "fits: no node",
    ] {
        assert!(out.lines().any(|l| l == line), "{line:?} in\n{out}");
    }
    // The selector: with the slices free, the MIG devices are passed over by the class's selector.
    let (code, out, _) = switchyard(
        &plane,
        &["explain", "pod", "train", "-n", "ml", "-o", "json"],
    );
    assert_eq!(code, 1);
    let e: Value = serde_json::from_str(&out).unwrap();
    let gpu1 = e["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["node"] == "gpu-1")
        .unwrap();
    assert_eq!(gpu1["fits"], false);
    assert_eq!(gpu1["devices"]["result"], "unschedulable");
    Api::<ResourceClaim>::namespaced(client.clone(), "ml")
        .delete("notebook-2", &Default::default())
        .await
        .expect("free a slice");
    let (_, out, _) = switchyard(&plane, &["explain", "pod", "ml/train"]);
    assert!(out.contains("    gpu.deckhouse.io/gpu-1/gpu-0-mig-3g-20gb-1: selector false: class a100.gpu.deckhouse.io selector #0 ("), "{out}");

    // Tolerating the taint, the pod fits gpu-2: exit 0.
    pod(&client, "tolerant", container(Some("gpu.deckhouse.io/a100")), json!({"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "research", "effect": "NoSchedule"}]})).await;
    let (code, out, _) = switchyard(&plane, &["explain", "pod", "ml/tolerant"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("fits: gpu-2"), "{out}");
    // An unknown pod is an error naming it.
    let (code, _, err) = switchyard(&plane, &["explain", "pod", "ml/nope"]);
    assert_eq!(code, 2);
    assert!(err.contains("pod ml/nope not found"), "{err}");
}

/// The chart's identities and admission policies, as `helm template` renders
/// them for release `switchyard` in `switchyard-system`.
fn chart_access() -> Vec<Value> {
    let helm = switchyard_testkit::helm_binary().unwrap_or_else(|e| panic!("{e}"));
    let out = Command::new(helm)
        .args(["template", "switchyard"])
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../deploy/helm/switchyard"
        ))
        .args([
            "--namespace",
            "switchyard-system",
            "--set",
            "nats.url=nats://nats.example:4222",
        ])
        .output()
        .expect("run helm");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_yaml_ng::Deserializer::from_str(&String::from_utf8_lossy(&out.stdout))
        .map(|doc| <Value as serde::Deserialize>::deserialize(doc).unwrap())
        .filter(|doc| {
            matches!(
                doc["kind"].as_str(),
                Some(
                    "ServiceAccount"
                        | "ClusterRole"
                        | "ClusterRoleBinding"
                        | "Role"
                        | "RoleBinding"
                        | "ValidatingAdmissionPolicy"
                        | "ValidatingAdmissionPolicyBinding"
                )
            )
        })
        .collect()
}

/// Server-side apply of a rendered object of one of `chart_access`'s kinds.
async fn apply_doc(client: &Client, doc: &Value) {
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    };
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    let kind = doc["kind"].as_str().unwrap();
    let resource = match kind {
        "ServiceAccount" => ApiResource::erase::<ServiceAccount>(&()),
        "ClusterRole" => ApiResource::erase::<ClusterRole>(&()),
        "ClusterRoleBinding" => ApiResource::erase::<ClusterRoleBinding>(&()),
        "Role" => ApiResource::erase::<Role>(&()),
        "RoleBinding" => ApiResource::erase::<RoleBinding>(&()),
        "ValidatingAdmissionPolicy" => ApiResource::erase::<ValidatingAdmissionPolicy>(&()),
        "ValidatingAdmissionPolicyBinding" => {
            ApiResource::erase::<ValidatingAdmissionPolicyBinding>(&())
        }
        other => panic!("{other}"),
    };
    let api: Api<DynamicObject> = match doc["metadata"]["namespace"].as_str() {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &resource),
        None => Api::all_with(client.clone(), &resource),
    };
    let name = doc["metadata"]["name"].as_str().unwrap();
    api.patch(
        name,
        &PatchParams::apply("doctor-test").force(),
        &Patch::Apply(doc),
    )
    .await
    .unwrap_or_else(|e| panic!("apply {kind} {name}: {e}"));
}

/// The chart's ServiceAccounts, roles, bindings and admission policies, installed.
async fn install_chart_access(client: &Client) -> Vec<Value> {
    create_namespace(client, "switchyard-system").await;
    let docs = chart_access();
    for doc in &docs {
        apply_doc(client, doc).await;
    }
    docs
}

fn admin_claim(ns: &str, name: &str) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name, "namespace": ns},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "a100.gpu.deckhouse.io"}},
            {"name": "all", "exactly": {"deviceClassName": "a100.gpu.deckhouse.io", "allocationMode": "All", "adminAccess": true}}]}}})
}

fn admin_template(ns: &str, name: &str) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name, "namespace": ns},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "monitor", "exactly": {"deviceClassName": "a100.gpu.deckhouse.io", "adminAccess": true}}]}}}})
}

async fn label_namespace(client: &Client, ns: &str, labels: Value) {
    Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .patch(
            ns,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": labels}})),
        )
        .await
        .unwrap_or_else(|e| panic!("label namespace {ns}: {e}"));
}

#[tokio::test(flavor = "multi_thread")]
async fn admin_access_is_listed_in_admin_namespaces_and_a_finding_outside_them() {
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
    let (plane, client) = start().await;
    healthy(&client).await;
    create_namespace(&client, "ops").await;
    label_namespace(
        &client,
        "ops",
        json!({"resource.kubernetes.io/admin-access": "true"}),
    )
    .await;
    // Who may create claims in the admin namespace: carol, through a Role.
    create::<Role>(&client, json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "claims", "namespace": "ops"},
        "rules": [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get", "create"]}]})).await;
    create::<RoleBinding>(&client, json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "claims", "namespace": "ops"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "claims"},
        "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": "carol"}]})).await;
    create::<ResourceClaim>(&client, admin_claim("ops", "monitor")).await;
    create::<ResourceClaimTemplate>(&client, admin_template("ops", "monitor")).await;

    // The labelled namespace is information: exit 0.
    let (code, findings) = doctor(&plane);
    assert_eq!((code, findings.len()), (0, 1), "{findings:#?}");
    let f = &findings[0];
    assert_eq!(
        (f["row"].as_str(), f["severity"].as_str()),
        (Some("admin-access-namespace"), Some("info"))
    );
    assert_eq!(
        objects(f),
        [
            "Namespace/ops",
            "ResourceClaim/ops/monitor",
            "ResourceClaimTemplate/ops/monitor"
        ]
    );
    let cause = f["cause"].as_str().unwrap();
    for part in [
        "whoever may create ResourceClaims or ResourceClaimTemplates in it can get admin access to every device",
        "may create claims there: User/carol (RoleBinding/ops/claims)",
        "ResourceClaim/ops/monitor (request all)",
    ] {
        assert!(cause.contains(part), "{part} in {cause}");
    }
    assert_eq!(
        f["fix"],
        "kubectl label namespace ops resource.kubernetes.io/admin-access-"
    );
    let (code, out, _) = switchyard(&plane, &["doctor"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.starts_with(
            "[admin-access-namespace] (info) A namespace grants DRA admin access to every device\n"
        ),
        "{out}"
    );
    assert!(
        out.trim_end().ends_with("1 finding (1 informational)"),
        "{out}"
    );

    // Kubernetes itself refuses adminAccess outside a labelled namespace...
    let refused = Api::<ResourceClaim>::namespaced(client.clone(), "ml")
        .create(
            &PostParams::default(),
            &serde_json::from_value(admin_claim("ml", "sneaky")).unwrap(),
        )
        .await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(s)) if s.message.contains("admin-access")),
        "{refused:?}"
    );
    // ...but not what is already there when the label goes (here replaced by
    // the alpha label, which 1.33 no longer honours).
    label_namespace(
        &client,
        "ops",
        json!({"resource.kubernetes.io/admin-access": null, "resource.k8s.io/admin-access": "true"}),
    )
    .await;
    let (code, findings) = doctor(&plane);
    assert_eq!((code, findings.len()), (1, 1), "{findings:#?}");
    let f = &findings[0];
    assert_eq!(
        (f["row"].as_str(), f["severity"].as_str()),
        (
            Some("admin-access-outside-admin-namespace"),
            Some("warning")
        )
    );
    assert_eq!(
        f["observation"],
        "A claim asks for DRA admin access outside an admin namespace"
    );
    assert_eq!(
        objects(f),
        [
            "Namespace/ops",
            "ResourceClaim/ops/monitor",
            "ResourceClaimTemplate/ops/monitor"
        ]
    );
    let cause = f["cause"].as_str().unwrap();
    for part in [
        "ResourceClaim/ops/monitor (request all), ResourceClaimTemplate/ops/monitor (request monitor) ask for adminAccess",
        "namespace ops is not labelled resource.kubernetes.io/admin-access=true",
        "it carries resource.k8s.io/admin-access, the alpha label",
    ] {
        assert!(cause.contains(part), "{part} in {cause}");
    }
    // The fix, typed as given, clears the row.
    let fix = f["fix"].as_str().unwrap();
    assert_eq!(
        fix,
        "kubectl -n ops delete resourceclaim/monitor resourceclaimtemplate/monitor"
    );
    Api::<ResourceClaim>::namespaced(client.clone(), "ops")
        .delete("monitor", &Default::default())
        .await
        .expect("delete the claim");
    Api::<ResourceClaimTemplate>::namespaced(client.clone(), "ops")
        .delete("monitor", &Default::default())
        .await
        .expect("delete the template");
    let (code, findings) = doctor(&plane);
    assert_eq!((code, findings.len()), (0, 0), "{findings:#?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn tenants_who_may_write_device_classes_or_resource_slices() {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, RoleBinding};
    let (plane, client) = start().await;
    healthy(&client).await;
    // Switchyard's own identities write DeviceClasses (class compiler) and
    // ResourceSlices (node agent): not tenants.
    install_chart_access(&client).await;
    let (code, findings) = doctor(&plane);
    assert_eq!((code, findings.len()), (0, 0), "{findings:#?}");

    let rbac = "rbac.authorization.k8s.io";
    create::<ClusterRole>(&client, json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "dra-editor"},
        "rules": [{"apiGroups": ["resource.k8s.io"], "resources": ["deviceclasses"], "verbs": ["get", "list", "create", "update", "delete"]}]})).await;
    // alice next to a system group: only alice is a finding.
    create::<ClusterRoleBinding>(&client, json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "dra-editor"},
        "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": "dra-editor"},
        "subjects": [{"kind": "User", "apiGroup": rbac, "name": "alice"}, {"kind": "Group", "apiGroup": rbac, "name": "system:masters"}]})).await;
    // An aggregated role, its rules not yet stored by the aggregation controller.
    create::<ClusterRole>(&client, json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "gpu-tenant"},
        "aggregationRule": {"clusterRoleSelectors": [{"matchLabels": {"example.com/aggregate-to-gpu-tenant": "true"}}]}})).await;
    create::<ClusterRole>(&client, json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "slice-writer", "labels": {"example.com/aggregate-to-gpu-tenant": "true"}},
        "rules": [{"apiGroups": ["*"], "resources": ["resourceslices"], "verbs": ["*"]}]})).await;
    create::<ClusterRoleBinding>(&client, json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "gpu-tenants"},
        "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": "gpu-tenant"},
        "subjects": [{"kind": "Group", "apiGroup": rbac, "name": "ml-team"}, {"kind": "ServiceAccount", "name": "default", "namespace": "ml"}]})).await;
    // System components and the GPU driver: not tenants.
    create::<ClusterRoleBinding>(&client, json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "dra-system"},
        "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": "dra-editor"},
        "subjects": [{"kind": "ServiceAccount", "name": "resourceclaim-controller", "namespace": "kube-system"},
                     {"kind": "User", "apiGroup": rbac, "name": "system:kube-scheduler"},
                     {"kind": "ServiceAccount", "name": "nvidia-dra-adapter", "namespace": "d8-nvidia-gpu"}]})).await;
    // A RoleBinding cannot grant cluster-scoped DeviceClasses: not a finding.
    create::<RoleBinding>(&client, json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "dra-editor", "namespace": "ml"},
        "roleRef": {"apiGroup": rbac, "kind": "ClusterRole", "name": "dra-editor"},
        "subjects": [{"kind": "User", "apiGroup": rbac, "name": "bob"}]})).await;

    let (code, findings) = doctor(&plane);
    assert_eq!(code, 1);
    let f = rows(&findings, "tenant-writes-dra-inventory");
    assert_eq!(f.len(), 2, "{findings:#?}");
    assert_eq!(findings.len(), 2, "{findings:#?}");
    assert_eq!(
        objects(f[0]),
        [
            "ClusterRoleBinding/dra-editor",
            "ClusterRole/dra-editor",
            "User/alice"
        ]
    );
    let cause = f[0]["cause"].as_str().unwrap();
    assert!(
        cause.contains("gives ClusterRole/dra-editor's create, delete, update on deviceclasses (resource.k8s.io) to User/alice"),
        "{cause}"
    );
    let alice_fix = f[0]["fix"].as_str().unwrap().to_string();
    assert_eq!(
        alice_fix,
        r#"kubectl patch clusterrolebinding dra-editor --type json -p '[{"op":"remove","path":"/subjects/0"}]'"#
    );
    assert_eq!(
        objects(f[1]),
        [
            "ClusterRoleBinding/gpu-tenants",
            "ClusterRole/gpu-tenant",
            "Group/ml-team",
            "ServiceAccount/ml/default"
        ]
    );
    assert!(
        f[1]["cause"]
            .as_str()
            .unwrap()
            .contains("'s * on resourceslices"),
        "{}",
        f[1]["cause"]
    );
    assert_eq!(f[1]["fix"], "kubectl delete clusterrolebinding gpu-tenants");

    // The API server agrees: alice may create a DeviceClass, bob may not.
    let class: DeviceClass =
        serde_json::from_value(json!({"metadata": {"name": "tenant.example.com"}, "spec": {}}))
            .unwrap();
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let alice = Api::<DeviceClass>::all(plane.impersonating("alice", &["system:authenticated"]));
    switchyard_testkit::eventually(
        "alice's ClusterRoleBinding to reach the authorizer",
        std::time::Duration::from_secs(20),
        || async { alice.create(&dry_run, &class).await.is_ok() },
    )
    .await
    .unwrap();
    let bob = Api::<DeviceClass>::all(plane.impersonating("bob", &["system:authenticated"]));
    let refused = bob.create(&dry_run, &class).await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(s)) if s.code == 403),
        "{refused:?}"
    );

    // The fixes clear the row.
    let ops = alice_fix
        .split_once(" --type json -p '")
        .and_then(|(_, p)| p.strip_suffix('\''))
        .unwrap();
    let ops: Value = serde_json::from_str(ops).unwrap();
    Api::<ClusterRoleBinding>::all(client.clone())
        .patch(
            "dra-editor",
            &PatchParams::default(),
            &Patch::<Value>::Json(serde_json::from_value(ops).unwrap()),
        )
        .await
        .expect("remove alice");
    Api::<ClusterRoleBinding>::all(client.clone())
        .delete("gpu-tenants", &Default::default())
        .await
        .expect("delete the binding");
    let (code, findings) = doctor(&plane);
    assert_eq!((code, findings.len()), (0, 0), "{findings:#?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_node_agent_may_write_every_nodes_slices_without_its_policy() {
    use k8s_openapi::api::admissionregistration::v1::{
        ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
    };
    let (plane, client) = start().await;
    healthy(&client).await;
    let docs = install_chart_access(&client).await;
    let (code, findings) = doctor(&plane);
    assert_eq!((code, findings.len()), (0, 0), "{findings:#?}");
    const POLICY: &str = "switchyard-node-agent-own-node";

    // The policy without its binding is not enforced.
    let bindings = Api::<ValidatingAdmissionPolicyBinding>::all(client.clone());
    bindings
        .delete(POLICY, &Default::default())
        .await
        .expect("delete the binding");
    let (code, findings) = doctor(&plane);
    assert_eq!((code, findings.len()), (1, 1), "{findings:#?}");
    let f = &findings[0];
    assert_eq!(f["row"], "node-agent-slices-unconfined");
    assert_eq!(
        f["observation"],
        "The node agent may write every node's ResourceSlices"
    );
    assert_eq!(
        objects(f),
        [
            "ServiceAccount/switchyard-system/switchyard-node-agent",
            "ClusterRoleBinding/switchyard-node-agent",
            &format!("ValidatingAdmissionPolicy/{POLICY}")
        ]
    );
    assert!(
        f["cause"]
            .as_str()
            .unwrap()
            .contains("no ValidatingAdmissionPolicyBinding binds it with validationActions Deny"),
        "{f}"
    );
    assert_eq!(
        f["fix"],
        "helm upgrade switchyard deploy/helm/switchyard -n switchyard-system --reuse-values --set nodeAgent.admissionPolicy.enabled=true"
    );

    // Without the policy either.
    Api::<ValidatingAdmissionPolicy>::all(client.clone())
        .delete(POLICY, &Default::default())
        .await
        .expect("delete the policy");
    let (_, findings) = doctor(&plane);
    let f = rows(&findings, "node-agent-slices-unconfined");
    assert_eq!((f.len(), findings.len()), (1, 1), "{findings:#?}");
    assert!(
        f[0]["cause"].as_str().unwrap().contains(&format!(
            "no ValidatingAdmissionPolicy matches its ResourceSlice writes (the chart's is {POLICY})"
        )),
        "{}",
        f[0]
    );

    // The chart's policy and binding back: no finding.
    for doc in docs.iter().filter(|d| d["metadata"]["name"] == POLICY) {
        apply_doc(&client, doc).await;
    }
    let (code, findings) = doctor(&plane);
    assert_eq!((code, findings.len()), (0, 0), "{findings:#?}");
}

/// The GPU Operator's cluster-scoped CRD of `kind` (`nvidia.com/<version>`),
/// its schema open.
fn operator_crd(
    kind: &str,
    plural: &str,
    version: &str,
) -> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    serde_json::from_value(json!({
        "metadata": {"name": format!("{plural}.nvidia.com")},
        "spec": {
            "group": "nvidia.com",
            "scope": "Cluster",
            "names": {"plural": plural, "singular": kind.to_lowercase(), "kind": kind, "listKind": format!("{kind}List")},
            "versions": [{
                "name": version, "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
            }],
        },
    }))
    .expect("crd")
}

#[tokio::test(flavor = "multi_thread")]
async fn on_a_gpu_operator_cluster_the_dra_drivers_prerequisites_are_checked() {
    let (plane, client) = start().await;
    healthy(&client).await;
    install_crds(
        &client,
        vec![
            operator_crd("ClusterPolicy", "clusterpolicies", "v1"),
            operator_crd("GPUCluster", "gpuclusters", "v1alpha1"),
        ],
    )
    .await;
    let policies: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk("nvidia.com", "v1", "ClusterPolicy"),
            "clusterpolicies",
        ),
    );
    let policy: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "nvidia.com/v1", "kind": "ClusterPolicy",
        "metadata": {"name": "cluster-policy"},
        "spec": {"driver": {"manager": {"env": [{"name": "ENABLE_AUTO_DRAIN", "value": "false"}]}}},
    }))
    .unwrap();
    policies
        .create(&PostParams::default(), &policy)
        .await
        .expect("create the ClusterPolicy");
    create_namespace(&client, "nvidia-dra-driver-gpu").await;
    // The DRA chart's default: no node selector.
    let plugin: k8s_openapi::api::apps::v1::DaemonSet = create(
        &client,
        json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": "dra-driver-nvidia-gpu-kubelet-plugin", "namespace": "nvidia-dra-driver-gpu"},
            "spec": {
                "selector": {"matchLabels": {"dra-driver-nvidia-gpu-component": "kubelet-plugin"}},
                "template": {
                    "metadata": {"labels": {"dra-driver-nvidia-gpu-component": "kubelet-plugin"}},
                    "spec": {"containers": [{"name": "plugins", "image": "nvcr.io/nvidia/k8s-dra-driver-gpu:v0.4.1"}]},
                },
            },
        }),
    )
    .await;
    let (code, findings) = doctor(&plane);
    assert_eq!(code, 1, "{findings:#?}");
    let missing = rows(&findings, "eviction-label-missing");
    assert_eq!(missing.len(), 1, "{findings:#?}");
    assert_eq!(objects(missing[0]), ["ClusterPolicy/cluster-policy"]);
    let unscoped = rows(&findings, "kubelet-plugin-unscoped");
    assert_eq!(unscoped.len(), 1, "{findings:#?}");
    assert_eq!(
        objects(unscoped[0]),
        ["DaemonSet/nvidia-dra-driver-gpu/dra-driver-nvidia-gpu-kubelet-plugin"]
    );

    // Set as the guide asks: nothing left to say.
    policies
        .patch(
            "cluster-policy",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"driver": {"manager": {"env": [
                {"name": "ENABLE_AUTO_DRAIN", "value": "false"},
                {"name": "NODE_LABEL_FOR_GPU_POD_EVICTION", "value": "nvidia.com/dra-kubelet-plugin"},
            ]}}}})),
        )
        .await
        .expect("patch the ClusterPolicy");
    Api::<k8s_openapi::api::apps::v1::DaemonSet>::namespaced(client.clone(), "nvidia-dra-driver-gpu")
        .patch(
            &plugin.metadata.name.unwrap(),
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"template": {"spec": {"nodeSelector": {"nvidia.com/dra-kubelet-plugin": "true"}}}}})),
        )
        .await
        .expect("patch the DaemonSet");
    // Nothing left to warn of; the backend reported as found, with the
    // kubelet plugin's selector.
    let (code, findings) = doctor(&plane);
    assert_eq!((code, findings.len()), (0, 1), "{findings:#?}");
    let detected = rows(&findings, "nvidia-backend-detected");
    assert_eq!(detected.len(), 1, "{findings:#?}");
    assert_eq!(objects(detected[0]), ["ClusterPolicy/cluster-policy"]);
    assert!(
        detected[0]["cause"].as_str().is_some_and(|c| c
            .contains("dra-driver-nvidia-gpu-kubelet-plugin (nvidia.com/dra-kubelet-plugin=true)")),
        "{findings:#?}"
    );

    // The operator's own DRA mode configured beside the ClusterPolicy.
    let gpu_clusters: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(
            &kube::api::GroupVersionKind::gvk("nvidia.com", "v1alpha1", "GPUCluster"),
            "gpuclusters",
        ),
    );
    let gpu_cluster: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "nvidia.com/v1alpha1", "kind": "GPUCluster",
        "metadata": {"name": "gpu-cluster"},
        "spec": {},
    }))
    .unwrap();
    gpu_clusters
        .create(&PostParams::default(), &gpu_cluster)
        .await
        .expect("create the GPUCluster");
    let (code, findings) = doctor(&plane);
    assert_eq!(code, 1, "{findings:#?}");
    let present = rows(&findings, "gpucluster-present");
    assert_eq!(present.len(), 1, "{findings:#?}");
    assert_eq!(objects(present[0]), ["GPUCluster/gpu-cluster"]);
}

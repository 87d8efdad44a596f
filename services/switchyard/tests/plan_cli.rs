//! `switchyard plan` against a real control plane (etcd + kube-apiserver):
//! NodeGroups, kubelet-less nodes with PhysicalGPUs, a GPUClass and its
//! DeviceClass, a target node publishing one card, Deployments, a
//! StatefulSet and a Job requesting `nvidia.com/gpu` with their pods bound
//! to nodes, a PodDisruptionBudget and a Helm-managed Deployment. The
//! register and the waves are asserted on the JSON the binary prints.

use std::process::Command;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use switchyard_api::{GPUClass, NodeGroup, PhysicalGPU, crds};
use switchyard_gpu::publish::{self, Layout};
use switchyard_gpu::{Gpu, Machine};
use switchyard_testkit::kube::{ControlPlane, create_namespace, fake_node, install_crds};

const GROUP: &str = "node.deckhouse.io/group";

fn machine(node: &str, cards: u32) -> Machine {
    Machine {
        driver_version: "550.54.15".into(),
        cuda_driver_version: "12.4".into(),
        gpus: (0..cards)
            .map(|i| Gpu {
                index: i,
                uuid: format!(
                    "GPU-{:08x}-0000-0000-0000-{i:012}",
                    node.bytes().map(u32::from).sum::<u32>()
                ),
                product_name: "NVIDIA A100-SXM4-40GB".into(),
                brand: "Tesla".into(),
                architecture: "Ampere".into(),
                compute_capability: "8.0".into(),
                memory_mib: 40960,
                pci_bus_id: format!("00000000:{:02X}:00.0", 7 + i),
                mig_capable: true,
                mig_enabled: false,
                mig_devices: Vec::new(),
                healthy: true,
            })
            .collect(),
    }
}

async fn create<K>(api: Api<K>, value: Value) -> K
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let object: K = serde_json::from_value(value).expect("a valid object");
    api.create(&PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("create {:?}: {e}", object.meta().name))
}

fn container(gpus: u32) -> Value {
    json!([{"name": "main", "image": "cuda:12",
        "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}}])
}

/// A pod bound to `node`, controlled by `owner` (kind, name, uid).
async fn pod(
    client: &kube::Client,
    name: &str,
    labels: Value,
    owner: (&str, &str, &str),
    node: &str,
    gpus: u32,
) {
    let (kind, owner_name, uid) = owner;
    let api_version = if kind == "Job" { "batch/v1" } else { "apps/v1" };
    create::<Pod>(Api::namespaced(client.clone(), "ml"), json!({
        "metadata": {"name": name, "labels": labels, "ownerReferences": [{"apiVersion": api_version,
            "kind": kind, "name": owner_name, "uid": uid, "controller": true}]},
        "spec": {"nodeName": node, "restartPolicy": if kind == "Job" { "Never" } else { "Always" },
                 "containers": container(gpus)}
    }))
    .await;
}

/// A Deployment with its ReplicaSet and pods on `nodes`.
async fn deployment(
    client: &kube::Client,
    name: &str,
    gpus: u32,
    nodes: &[&str],
    meta: Value,
    selector: Value,
) {
    let mut metadata = meta;
    metadata["name"] = json!(name);
    let d: Deployment = create(
        Api::namespaced(client.clone(), "ml"),
        json!({
            "metadata": metadata,
            "spec": {"replicas": nodes.len(), "selector": {"matchLabels": {"app": name}},
                "template": {"metadata": {"labels": {"app": name}},
                    "spec": {"nodeSelector": selector, "containers": container(gpus)}}}
        }),
    )
    .await;
    let uid = d.metadata.uid.clone().unwrap();
    let rs_name = format!("{name}-7c9d8");
    let rs: ReplicaSet = create(Api::namespaced(client.clone(), "ml"), json!({
        "metadata": {"name": rs_name, "ownerReferences": [{"apiVersion": "apps/v1",
            "kind": "Deployment", "name": name, "uid": uid, "controller": true}]},
        "spec": {"replicas": nodes.len(), "selector": {"matchLabels": {"app": name, "pod-template-hash": "7c9d8"}},
            "template": {"metadata": {"labels": {"app": name, "pod-template-hash": "7c9d8"}},
                "spec": {"containers": container(gpus)}}}
    }))
    .await;
    let rs_uid = rs.metadata.uid.clone().unwrap();
    for (i, node) in nodes.iter().enumerate() {
        let labels = json!({"app": name, "pod-template-hash": "7c9d8"});
        pod(
            client,
            &format!("{rs_name}-{i}"),
            labels,
            ("ReplicaSet", &rs_name, &rs_uid),
            node,
            gpus,
        )
        .await;
    }
}

async fn cluster(plane: &ControlPlane) {
    let client = plane.client();
    install_crds(&client, crds().into_iter().map(|(_, c)| c).collect()).await;
    create_namespace(&client, "ml").await;
    create::<NodeGroup>(Api::all(client.clone()), json!({"apiVersion": "deckhouse.io/v1", "kind": "NodeGroup",
        "metadata": {"name": "gpu"}, "spec": {"nodeType": "Static", "gpu": {"sharing": "Exclusive"}}})).await;
    create::<NodeGroup>(
        Api::all(client.clone()),
        json!({"apiVersion": "deckhouse.io/v1", "kind": "NodeGroup",
        "metadata": {"name": "gpu-dra"}, "spec": {"nodeType": "Static"}}),
    )
    .await;

    let nodes: Api<Node> = Api::all(client.clone());
    let gpus: Api<PhysicalGPU> = Api::all(client.clone());
    for (name, group, cards) in [
        ("gpu-1", "gpu", 2),
        ("gpu-2", "gpu", 2),
        ("gpu-3", "gpu", 2),
        ("gpu-4", "gpu", 2),
        ("dra-1", "gpu-dra", 1),
    ] {
        nodes
            .create(
                &PostParams::default(),
                &fake_node(name, &[(GROUP, group)], vec![]),
            )
            .await
            .unwrap();
        if group == "gpu" {
            let gpu = json!({"status": {"allocatable": {"nvidia.com/gpu": cards.to_string()},
                "capacity": {"nvidia.com/gpu": cards.to_string()}}});
            nodes
                .patch_status(name, &PatchParams::default(), &Patch::Merge(&gpu))
                .await
                .unwrap();
        }
        let m = machine(name, cards);
        for report in publish::physical_gpus(name, &m) {
            let status = json!({"status": report.status});
            let report_name = report.metadata.name.clone().unwrap();
            gpus.create(&PostParams::default(), &report).await.unwrap();
            gpus.patch_status(
                &report_name,
                &PatchParams::default(),
                &Patch::Merge(&status),
            )
            .await
            .unwrap();
        }
        if group == "gpu-dra" {
            let slices: Api<ResourceSlice> = Api::all(client.clone());
            for slice in publish::resource_slices(name, &m, Layout::Static, 1) {
                slices.create(&PostParams::default(), &slice).await.unwrap();
            }
        }
    }
    create::<GPUClass>(
        Api::all(client.clone()),
        json!({"apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "GPUClass",
        "metadata": {"name": "a100"},
        "spec": {"selector": {"matchLabels": {"gpu.deckhouse.io/device": "a100-sxm4-40gb"}}}}),
    )
    .await;
    create::<DeviceClass>(Api::all(client.clone()), json!({"metadata": {"name": "a100.gpu.deckhouse.io"},
        "spec": {"selectors": [{"cel": {"expression":
            "device.driver == \"gpu.deckhouse.io\" && device.attributes[\"gpu.deckhouse.io\"].type == \"gpu\" && device.attributes[\"gpu.deckhouse.io\"].device == \"a100-sxm4-40gb\""}}]}})).await;

    // infer: 2 × 1 GPU, bound to the source group, with a budget.
    deployment(
        &client,
        "infer",
        1,
        &["gpu-1", "gpu-2"],
        json!({}),
        json!({GROUP: "gpu"}),
    )
    .await;
    create::<PodDisruptionBudget>(
        Api::namespaced(client.clone(), "ml"),
        json!({"metadata": {"name": "infer"},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "infer"}}}}),
    )
    .await;
    // chart: a Helm release's.
    deployment(&client, "chart", 1, &["gpu-2"], json!({
        "labels": {"app.kubernetes.io/managed-by": "Helm"},
        "annotations": {"meta.helm.sh/release-name": "trainer", "meta.helm.sh/release-namespace": "ml"}}), json!({})).await;
    // db: a StatefulSet of one pod with 2 GPUs.
    let db: StatefulSet = create(Api::namespaced(client.clone(), "ml"), json!({"metadata": {"name": "db"},
        "spec": {"replicas": 1, "serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
            "template": {"metadata": {"labels": {"app": "db"}}, "spec": {"containers": container(2)}}}})).await;
    let uid = db.metadata.uid.clone().unwrap();
    pod(
        &client,
        "db-0",
        json!({"app": "db"}),
        ("StatefulSet", "db", &uid),
        "gpu-3",
        2,
    )
    .await;
    // train: a Job of one pod.
    let job: Job = create(Api::namespaced(client.clone(), "ml"), json!({"metadata": {"name": "train"},
        "spec": {"parallelism": 1, "template": {"spec": {"restartPolicy": "Never", "containers": container(1)}}}})).await;
    let uid = job.metadata.uid.clone().unwrap();
    pod(
        &client,
        "train-x7k2p",
        json!({"job-name": "train"}),
        ("Job", "train", &uid),
        "gpu-1",
        1,
    )
    .await;
}

fn plan(plane: &ControlPlane, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["plan", "--from", "gpu", "--to", "gpu-dra"])
        .args(args)
        .env("KUBECONFIG", plane.kubeconfig())
        .env_remove("SWITCHYARD_OUTPUT")
        .output()
        .expect("run switchyard");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

fn names(list: &Value, field: &str) -> Vec<String> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|v| {
            let v = if field.is_empty() { v } else { &v[field] };
            match v {
                Value::String(s) => s.clone(),
                v => format!(
                    "{}/{}",
                    v["kind"].as_str().unwrap(),
                    v["name"].as_str().unwrap()
                ),
            }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_register_and_the_waves_of_a_real_cluster() {
    let plane = ControlPlane::start().await;
    cluster(&plane).await;

    let (code, out, err) = plan(&plane, &["-o", "json"]);
    assert_eq!(code, 0, "stdout: {out}\nstderr: {err}");
    let p: Value = serde_json::from_str(&out).unwrap();

    // The register: every workload with nvidia.com/gpu, sorted.
    let register = &p["register"];
    let rows: Vec<String> = register
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            format!(
                "{}/{}/{} x{} = {}",
                e["namespace"].as_str().unwrap(),
                e["kind"].as_str().unwrap(),
                e["name"].as_str().unwrap(),
                e["replicas"],
                e["gpusTotal"]
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            "ml/Deployment/chart x1 = 1",
            "ml/Deployment/infer x2 = 2",
            "ml/Job/train x1 = 1",
            "ml/StatefulSet/db x1 = 2",
        ]
    );
    let chart = &register[0];
    assert_eq!(
        chart["managedBy"],
        json!([{"kind": "Helm", "name": "trainer"}])
    );
    assert_eq!(chart["editableInPlace"], json!(false));
    let infer = &register[1];
    assert_eq!(infer["editableInPlace"], json!(true));
    assert_eq!(infer["nodeSelector"], json!({GROUP: "gpu"}));
    assert_eq!(infer["nodes"], json!(["gpu-1", "gpu-2"]));
    assert_eq!(infer["groups"], json!(["gpu"]));
    assert_eq!(infer["mode"], json!("exclusive"));
    assert_eq!(infer["gpusPerPod"], json!({"nvidia.com/gpu": 1}));
    assert_eq!(
        infer["gpuModels"],
        json!([{"product": "NVIDIA A100-SXM4-40GB", "memoryMiB": 40960, "source": "PhysicalGPU"}])
    );
    assert_eq!(
        infer["podDisruptionBudgets"],
        json!([{"name": "infer", "maxUnavailable": "1", "disruptionsAllowed": 1}])
    );
    assert!(
        register
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["inPlan"] == json!(true))
    );

    // The waves: the idle node first; what fits on dra-1's card and the
    // handed-over cards moves; the source always keeps room for the rest.
    let waves = p["waves"].as_array().unwrap();
    let handovers: Vec<Vec<String>> = waves
        .iter()
        .map(|w| names(&w["handovers"], "node"))
        .collect();
    assert_eq!(handovers, [["gpu-4"], ["gpu-1"], ["gpu-2"], ["gpu-3"]]);
    let moves: Vec<Vec<String>> = waves
        .iter()
        .map(|w| names(&w["moves"], "workload"))
        .collect();
    assert_eq!(
        moves,
        [
            vec!["Deployment/chart", "Job/train"],
            vec!["Deployment/infer"],
            vec!["StatefulSet/db"],
            vec![],
        ]
    );
    assert_eq!(
        waves[0]["moves"][0]["pods"],
        json!([{"node": "dra-1", "devices": ["gpu-0"]}])
    );
    assert_eq!(
        waves[0]["moves"][0]["requests"],
        json!({"gpu.deckhouse.io/a100": 1})
    );
    assert_eq!(
        waves[1]["handovers"][0]["evicts"],
        json!([{"namespace": "ml", "kind": "Deployment", "name": "infer"}])
    );
    assert_eq!(waves[1]["handovers"][0]["budgets"], json!(["ml/infer"]));
    // First fit: the card gpu-4 has left, then the handed-over gpu-1.
    assert_eq!(
        waves[1]["moves"][0]["pods"],
        json!([
        {"node": "gpu-4", "devices": ["gpu-1"]}, {"node": "gpu-1", "devices": ["gpu-0"]}])
    );
    assert_eq!(
        waves[0]["sourceAfter"]["nvidia.com/gpu"],
        json!({"available": 6, "needed": 4})
    );
    assert!(waves.iter().all(|w| w["pending"] == json!([])));
    assert_eq!(p["complete"], json!(true));
    assert_eq!(p["remaining"], json!([]));

    // The same cluster, the same bytes.
    let (_, again, _) = plan(&plane, &["-o", "json"]);
    assert_eq!(out, again);

    // Two at a time: the second wave would leave no room for db and infer.
    let (code, out, _) = plan(&plane, &["-o", "json", "--max-unavailable", "2"]);
    assert_eq!(code, 0);
    let p: Value = serde_json::from_str(&out).unwrap();
    let first: Vec<String> = names(&p["waves"][0]["handovers"], "node");
    assert_eq!(first, ["gpu-4"], "{out}");

    // YAML and the table.
    let (code, yaml, _) = plan(&plane, &["-o", "yaml"]);
    assert_eq!(code, 0);
    let from_yaml: Value = serde_yaml_ng::from_str(&yaml).unwrap();
    assert_eq!(from_yaml["waves"].as_array().unwrap().len(), 4);
    let (code, table, _) = plan(&plane, &[]);
    assert_eq!(code, 0);
    assert!(table.contains("ml         Deployment   chart"), "{table}");
    assert!(table.contains("Helm:trainer"), "{table}");
    assert!(
        table.contains("wave 1\n  hand over gpu-4 (nvidia.com/gpu=2)"),
        "{table}"
    );
    assert!(
        table.contains("move ml/Deployment/infer (gpu.deckhouse.io/a100=1) -> gpu-4,gpu-1"),
        "{table}"
    );

    // Only one namespace, an unknown group, an unknown class.
    let (code, out, _) = plan(&plane, &["-o", "json", "-n", "other"]);
    assert_eq!(code, 1, "the workloads of ml still need the source: {out}");
    let (code, _, err) = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["plan", "--from", "gpu", "--to", "nowhere"])
        .env("KUBECONFIG", plane.kubeconfig())
        .output()
        .map(|o| {
            (
                o.status.code().unwrap_or(-1),
                String::new(),
                String::from_utf8_lossy(&o.stderr).to_string(),
            )
        })
        .unwrap();
    assert_eq!(code, 2);
    assert!(
        err.contains("node group \"nowhere\" does not exist (node groups: gpu, gpu-dra)"),
        "{err}"
    );
    let (code, _, err) = plan(&plane, &["--class", "h100"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("GPU class \"h100\" does not exist (GPU classes: a100)"),
        "{err}"
    );
}

//! The planner on small snapshots built with `mk_*` helpers.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};
use switchyard_gpu::publish::{self, Layout};

use super::classes;
use super::*;

const FROM: &str = "gpu";
const TO: &str = "gpu-dra";

fn from_json<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).expect("a valid object")
}

fn mk_group(name: &str, gpu: Option<Value>) -> NodeGroup {
    let mut spec = json!({"nodeType": "Static"});
    if let Some(gpu) = gpu {
        spec["gpu"] = gpu;
    }
    from_json(json!({"apiVersion": "deckhouse.io/v1", "kind": "NodeGroup",
        "metadata": {"name": name}, "spec": spec}))
}

fn mk_node(name: &str, group: &str, allocatable: &[(&str, &str)], labels: &[(&str, &str)]) -> Node {
    let mut l: serde_json::Map<String, Value> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    l.insert("node.deckhouse.io/group".into(), json!(group));
    let a: serde_json::Map<String, Value> = allocatable
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    from_json(json!({"metadata": {"name": name, "labels": l}, "status": {"allocatable": a}}))
}

/// `n` A100-SXM4-40GB cards on `node`; `failed` of them in phase Failed.
fn mk_gpus(node: &str, n: u32, failed: u32) -> Vec<PhysicalGPU> {
    (0..n)
        .map(|i| {
            from_json(json!({
                "apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "PhysicalGPU",
                "metadata": {"name": format!("{node}-gpu-{i}"),
                             "labels": {"gpu.deckhouse.io/device": "a100-sxm4-40gb"}},
                "spec": {"node": node, "index": i, "uuid": format!("GPU-{i:04}-{}", node.len()),
                         "product": "NVIDIA A100-SXM4-40GB"},
                "status": {"phase": if i < failed { "Failed" } else { "Ready" },
                           "capabilities": {"architecture": "Ampere", "computeAPI": "CUDA",
                                            "computeCapability": "8.0", "memoryMiB": 40960,
                                            "partitionSupport": ["MIG", "TimeSlicing"]}}
            }))
        })
        .collect()
}

fn mk_class(name: &str, sharing: bool, profiles: &[&str]) -> GPUClass {
    let mut spec =
        json!({"selector": {"matchLabels": {"gpu.deckhouse.io/device": "a100-sxm4-40gb"}}});
    if sharing {
        spec["sharing"] = json!({"timeSlicingReplicas": 4});
    }
    if !profiles.is_empty() {
        spec["partitions"] = json!({"migProfiles": profiles});
    }
    from_json(
        json!({"apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "GPUClass",
        "metadata": {"name": name}, "spec": spec}),
    )
}

fn mk_device_class(name: &str, cel: &str) -> DeviceClass {
    from_json(json!({"metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": cel}}]}}))
}

fn whole_class() -> DeviceClass {
    mk_device_class(
        "a100.gpu.deckhouse.io",
        r#"device.driver == "gpu.deckhouse.io" && device.attributes["gpu.deckhouse.io"].type == "gpu""#,
    )
}

fn pod_spec(resources: &[(&str, &str)], extra: Value) -> Value {
    let limits: serde_json::Map<String, Value> = resources
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    let mut spec = json!({"containers": [{"name": "main", "image": "cuda",
        "resources": {"limits": limits}}]});
    if let Value::Object(extra) = extra {
        for (k, v) in extra {
            spec[k] = v;
        }
    }
    spec
}

fn mk_deployment(
    ns: &str,
    name: &str,
    replicas: i32,
    resources: &[(&str, &str)],
    extra: Value,
) -> Deployment {
    from_json(json!({"metadata": {"namespace": ns, "name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                 "template": {"metadata": {"labels": {"app": name}},
                              "spec": pod_spec(resources, extra)}}}))
}

/// A pod of Deployment `owner` (through its ReplicaSet) on `node`.
fn mk_pod(ns: &str, owner: &str, i: usize, node: &str, resources: &[(&str, &str)]) -> Pod {
    let mut spec = pod_spec(resources, json!({}));
    spec["nodeName"] = json!(node);
    from_json(
        json!({"metadata": {"namespace": ns, "name": format!("{owner}-abc12-{i}"),
            "labels": {"app": owner, "pod-template-hash": "abc12"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                "name": format!("{owner}-abc12"), "uid": "u", "controller": true}]},
        "spec": spec, "status": {"phase": "Running"}}),
    )
}

fn mk_pdb(ns: &str, name: &str, app: &str, max_unavailable: i32) -> PodDisruptionBudget {
    from_json(json!({"metadata": {"namespace": ns, "name": name},
        "spec": {"maxUnavailable": max_unavailable, "selector": {"matchLabels": {"app": app}}}}))
}

fn request(max_unavailable: usize) -> PlanRequest {
    PlanRequest {
        from: FROM.into(),
        to: TO.into(),
        class: None,
        max_unavailable,
        layout: Layout::Static,
        namespace: None,
        backend: Default::default(),
    }
}

/// A source group of `nodes` (name, GPUs), both groups, class a100.
fn mk_cluster(nodes: &[(&str, u32)]) -> Snapshot {
    let mut s = Snapshot {
        node_groups: vec![
            mk_group(FROM, Some(json!({"sharing": "Exclusive"}))),
            mk_group(TO, None),
        ],
        gpu_classes: vec![mk_class("a100", false, &[])],
        device_classes: vec![whole_class()],
        ..Default::default()
    };
    for (name, gpus) in nodes {
        s.nodes.push(mk_node(
            name,
            FROM,
            &[("nvidia.com/gpu", &gpus.to_string())],
            &[],
        ));
        s.physical_gpus.extend(mk_gpus(name, *gpus, 0));
    }
    s
}

fn run(name: &str, replicas: i32, gpus: &str, nodes: &[&str], s: &mut Snapshot, extra: Value) {
    s.deployments.push(mk_deployment(
        "ml",
        name,
        replicas,
        &[("nvidia.com/gpu", gpus)],
        extra,
    ));
    for (i, node) in nodes.iter().enumerate() {
        s.pods
            .push(mk_pod("ml", name, i, node, &[("nvidia.com/gpu", gpus)]));
    }
}

fn handovers<'a>(p: &Plan<'a>) -> Vec<Vec<&'a str>> {
    p.waves
        .iter()
        .map(|w| w.handovers.iter().map(|h| h.node).collect())
        .collect()
}

fn moves<'a>(p: &Plan<'a>) -> Vec<Vec<&'a str>> {
    p.waves
        .iter()
        .map(|w| w.moves.iter().map(|m| m.workload.name).collect())
        .collect()
}

#[test]
fn idle_nodes_go_first_and_each_wave_moves_what_then_fits() {
    let mut s = mk_cluster(&[("n1", 2), ("n2", 2), ("n3", 2)]);
    run(
        "big",
        1,
        "2",
        &["n1"],
        &mut s,
        json!({"nodeSelector": {"node.deckhouse.io/group": FROM}}),
    );
    run("small", 1, "1", &["n2"], &mut s, json!({}));
    let p = plan(&s, &request(1)).unwrap();
    assert_eq!(handovers(&p), [vec!["n3"], vec!["n1"], vec!["n2"]]);
    assert_eq!(moves(&p), [vec!["big"], vec!["small"], vec![]]);
    assert!(p.complete, "{p:#?}");
    let m = &p.waves[0].moves[0];
    assert_eq!(
        m.requests,
        litemap::LiteMap::from_iter([("gpu.deckhouse.io/a100".to_string(), 2)])
    );
    assert_eq!(m.pods[0].node, "n3");
    assert_eq!(m.pods[0].devices, ["gpu-0", "gpu-1"]);
    // The group selector is what the rewrite drops; the source keeps room.
    let after = &p.waves[0].source_after.get("nvidia.com/gpu").unwrap();
    assert_eq!((after.available, after.needed), (4, 1));
    assert_eq!(p.waves[1].handovers[0].evicts, []);
}

#[test]
fn a_pod_is_on_the_source_node_of_its_nodes_name() {
    // Two Node objects of one name, the later in another group: the pod of
    // a workload bound to the source group, on that name, runs on the source
    // group's node — it is in use, so the idle n2 goes first.
    let mut s = mk_cluster(&[("n1", 2), ("n2", 2)]);
    s.nodes
        .push(mk_node("n1", TO, &[("nvidia.com/gpu", "2")], &[]));
    run(
        "train",
        1,
        "2",
        &["n1"],
        &mut s,
        json!({"nodeSelector": {"node.deckhouse.io/group": FROM}}),
    );
    let p = plan(&s, &request(1)).unwrap();
    assert_eq!(handovers(&p), [vec!["n2"], vec!["n1"]]);
    assert_eq!(moves(&p), [vec!["train"], vec![]]);
}

#[test]
fn at_most_max_unavailable_nodes_a_wave_and_the_source_keeps_room() {
    let mut s = mk_cluster(&[("n1", 2), ("n2", 2), ("n3", 2), ("n4", 2), ("n5", 2)]);
    run("a", 3, "1", &["n1", "n1", "n2"], &mut s, json!({}));
    run("b", 1, "2", &["n3"], &mut s, json!({}));
    // 10 GPUs, 5 needed: two idle nodes may go at once, not three.
    let p = plan(&s, &request(3)).unwrap();
    assert_eq!(handovers(&p)[0], ["n4", "n5"]);
    assert_eq!(
        p.waves[0]
            .source_after
            .get("nvidia.com/gpu")
            .unwrap()
            .available,
        6
    );
    assert!(p.waves.iter().all(|w| w.handovers.len() <= 3));
    assert!(p.complete, "{p:#?}");
    let p1 = plan(&s, &request(1)).unwrap();
    assert!(p1.waves.iter().all(|w| w.handovers.len() <= 1));
    assert_eq!(handovers(&p1)[0], ["n4"]);
}

#[test]
fn a_workload_bound_to_the_source_group_by_affinity_stays_pending_and_blocks_the_last_node() {
    let mut s = mk_cluster(&[("n1", 2), ("n2", 2)]);
    let pinned = json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
        {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "node.deckhouse.io/group", "operator": "In", "values": [FROM]}]}]}}}});
    run("pinned", 1, "1", &["n1"], &mut s, pinned);
    run("free", 1, "1", &["n2"], &mut s, json!({}));
    let p = plan(&s, &request(1)).unwrap();
    assert_eq!(handovers(&p), [vec!["n1"]]);
    assert_eq!(moves(&p), [vec!["free"]]);
    let pending = &p.waves[0].pending;
    assert_eq!(pending.len(), 1);
    assert_eq!(pending[0].workload.name, "pinned");
    assert_eq!(
        pending[0].reason,
        "0/1 nodes of group gpu-dra can take pod 1 of 1: 1 do not match its node selector or affinity"
    );
    let blocked = p.blocked.as_ref().unwrap();
    assert_eq!(blocked.nodes, ["n2"]);
    assert_eq!(
        blocked.reason,
        "handing over n2 would leave 0 nvidia.com/gpu in group gpu for 1 needed by the workloads not moved"
    );
    assert_eq!(p.remaining.len(), 1);
    assert!(!p.complete);
}

#[test]
fn the_allocators_reason_when_the_target_has_too_few_devices() {
    let mut s = mk_cluster(&[("n1", 2)]);
    // The target group already has one node with one published card.
    s.nodes.push(mk_node("t1", TO, &[], &[]));
    let t1 = mk_gpus("t1", 1, 0);
    let machine = publish::machine_from_physical_gpus(&t1, "550.54.15", "12.4");
    s.resource_slices = publish::resource_slices("t1", &machine, Layout::Static, 1);
    run("w", 1, "2", &["n1"], &mut s, json!({}));
    let p = plan(&s, &request(1)).unwrap();
    assert!(p.waves.is_empty());
    assert_eq!(p.blocked.as_ref().unwrap().nodes, ["n1"]);
    assert_eq!(
        p.remaining[0].reason,
        "0/1 nodes of group gpu-dra can take pod 1 of 1: 1 cannot allocate its claim \
         (t1: wants 2 of a100.gpu.deckhouse.io: 1 fits)"
    );
}

#[test]
fn an_unhealthy_card_is_published_tainted_and_not_allocated() {
    let mut s = mk_cluster(&[("n1", 2), ("n2", 2)]);
    s.physical_gpus.retain(|g| g.spec.node != "n2");
    s.physical_gpus.extend(mk_gpus("n2", 2, 1));
    run("w", 1, "2", &["n1"], &mut s, json!({}));
    let p = plan(&s, &request(1)).unwrap();
    assert_eq!(handovers(&p)[0], ["n2"]);
    assert_eq!(moves(&p)[0], Vec::<&str>::new());
    assert!(
        p.remaining[0].reason.contains("taint"),
        "{}",
        p.remaining[0].reason
    );
}

#[test]
fn budgets_limit_what_one_wave_evicts() {
    let mut s = mk_cluster(&[("n1", 4), ("n2", 4), ("n3", 4), ("n4", 4), ("n5", 4)]);
    run("web", 3, "1", &["n1", "n2", "n3"], &mut s, json!({}));
    s.pod_disruption_budgets.push(mk_pdb("ml", "web", "web", 1));
    // Room for four nodes at once; the budget lets one pod of web go.
    let p = plan(&s, &request(5)).unwrap();
    assert_eq!(handovers(&p)[0], ["n4", "n5", "n1"]);
    assert_eq!(p.waves[0].handovers[2].budgets, ["ml/web"]);
    assert_eq!(p.waves[0].handovers[2].evicts[0].name, "web");
    assert_eq!(
        p.register[0].pod_disruption_budgets[0].disruptions_allowed,
        1
    );
    assert_eq!(p.register[0].pod_disruption_budgets[0].name, "web");
    assert!(p.complete, "{p:#?}");
}

#[test]
fn mig_workloads_get_the_class_profile_and_partitionable_devices() {
    let mut s = mk_cluster(&[("n1", 1), ("n2", 1)]);
    s.gpu_classes = vec![mk_class("a100", false, &["1g.5gb"])];
    s.device_classes.push(mk_device_class(
        "a100-mig-1g.5gb.gpu.deckhouse.io",
        r#"device.driver == "gpu.deckhouse.io" && device.attributes["gpu.deckhouse.io"].type == "mig" && device.attributes["gpu.deckhouse.io"].profile == "1g.5gb""#,
    ));
    s.nodes[0] = mk_node(
        "n1",
        FROM,
        &[("nvidia.com/gpu", "1"), ("nvidia.com/mig-1g.5gb", "0")],
        &[],
    );
    s.deployments.push(mk_deployment(
        "ml",
        "mig",
        2,
        &[("nvidia.com/mig-1g.5gb", "1")],
        json!({"nodeSelector": {"node.deckhouse.io/group": FROM}}),
    ));
    let mut req = request(1);
    req.layout = Layout::Partitionable;
    let p = plan(&s, &req).unwrap();
    let entry = p.register.iter().find(|e| e.name == "mig").unwrap();
    assert_eq!(entry.mode, Mode::Mig);
    let m = p
        .waves
        .iter()
        .flat_map(|w| &w.moves)
        .find(|m| m.workload.name == "mig")
        .unwrap();
    assert_eq!(
        m.requests.keys().collect::<Vec<_>>(),
        ["gpu.deckhouse.io/a100-mig-1g.5gb"]
    );
    assert_eq!(m.pods[0].devices, ["gpu-0-mig-1g-5gb-0"]);
    assert_eq!(m.pods[1].devices, ["gpu-0-mig-1g-5gb-1"]);
}

#[test]
fn time_sliced_groups_use_the_class_shares() {
    let mut s = mk_cluster(&[("n1", 4), ("n2", 4)]);
    s.node_groups[0] = mk_group(
        FROM,
        Some(json!({"sharing": "TimeSlicing", "timeSlicing": {"partitionCount": 4}})),
    );
    s.gpu_classes = vec![mk_class("a100", true, &[])];
    s.device_classes.push(mk_device_class(
        "a100-shared.gpu.deckhouse.io",
        r#"device.driver == "gpu.deckhouse.io" && device.allowMultipleAllocations"#,
    ));
    run("ts", 3, "1", &["n1", "n1", "n1"], &mut s, json!({}));
    s.deployments.push(mk_deployment(
        "ml",
        "renamed",
        1,
        &[("nvidia.com/gpu.shared", "1")],
        json!({}),
    ));
    s.pods.push(mk_pod(
        "ml",
        "renamed",
        0,
        "n1",
        &[("nvidia.com/gpu.shared", "1")],
    ));
    s.nodes[0] = mk_node(
        "n1",
        FROM,
        &[("nvidia.com/gpu", "4"), ("nvidia.com/gpu.shared", "4")],
        &[],
    );
    let mut req = request(1);
    req.layout = Layout::Shared { replicas: 4 };
    let p = plan(&s, &req).unwrap();
    let modes: BTreeMap<&str, Mode> = p.register.iter().map(|e| (e.name, e.mode)).collect();
    assert_eq!(
        modes,
        BTreeMap::from([("renamed", Mode::Shared), ("ts", Mode::TimeSliced)])
    );
    let ts = p
        .waves
        .iter()
        .flat_map(|w| &w.moves)
        .find(|m| m.workload.name == "ts")
        .unwrap();
    assert_eq!(
        ts.requests.keys().collect::<Vec<_>>(),
        ["gpu.deckhouse.io/a100-shared"]
    );
    // Three shares of one card (a quarter of its memory each).
    assert!(ts.pods.iter().all(|p| p.devices == ["gpu-0"]), "{ts:?}");
    assert!(p.complete, "{p:#?}");
}

#[test]
fn the_register_names_owners_managers_models_and_budgets() {
    let mut s = mk_cluster(&[("n1", 2)]);
    s.nodes.push(mk_node(
        "old",
        "legacy",
        &[("nvidia.com/gpu", "1")],
        &[
            ("nvidia.com/gpu.product", "Tesla-V100-SXM2-16GB"),
            ("nvidia.com/gpu.memory", "16384"),
        ],
    ));
    s.node_groups
        .push(mk_group("legacy", Some(json!({"sharing": "Exclusive"}))));
    let mut helm = mk_deployment("ml", "chart", 1, &[("nvidia.com/gpu", "1")], json!({}));
    helm.metadata.labels = Some(BTreeMap::from([(
        "app.kubernetes.io/managed-by".into(),
        "Helm".into(),
    )]));
    helm.metadata.annotations = Some(BTreeMap::from([(
        "meta.helm.sh/release-name".into(),
        "trainer".into(),
    )]));
    s.deployments.push(helm);
    s.pods
        .push(mk_pod("ml", "chart", 0, "n1", &[("nvidia.com/gpu", "1")]));
    let mut nim = mk_deployment("ml", "nim", 1, &[("nvidia.com/gpu", "1")], json!({}));
    nim.metadata.owner_references = Some(vec![from_json(
        json!({"apiVersion": "apps.nvidia.com/v1alpha1",
        "kind": "NIMService", "name": "llama", "uid": "x", "controller": true}),
    )]);
    s.deployments.push(nim);
    s.pods
        .push(mk_pod("ml", "nim", 0, "old", &[("nvidia.com/gpu", "1")]));
    let bare: Pod = from_json(json!({"metadata": {"namespace": "dev", "name": "scratch",
        "labels": {"argocd.argoproj.io/instance": "dev-tools", "kustomize.toolkit.fluxcd.io/name": "apps",
                   "kustomize.toolkit.fluxcd.io/namespace": "flux-system"}},
        "spec": pod_spec(&[("nvidia.com/gpu", "1")], json!({"nodeName": "n1"}))}));
    s.pods.push(bare);
    s.cron_jobs.push(from_json(json!({"metadata": {"namespace": "ml", "name": "nightly"},
        "spec": {"schedule": "0 0 * * *", "jobTemplate": {"spec": {"parallelism": 2,
            "template": {"spec": pod_spec(&[("nvidia.com/gpu", "1")], json!({"restartPolicy": "Never",
                "nodeSelector": {"node.deckhouse.io/group": FROM}}))}}}}})));
    s.pods.push(from_json(
        json!({"metadata": {"namespace": "ml", "name": "not-a-gpu-pod"},
        "spec": {"containers": [{"name": "c", "image": "x"}], "nodeName": "n1"}}),
    ));

    let p = plan(&s, &request(1)).unwrap();
    let rows: Vec<String> = p
        .register
        .iter()
        .map(|e| format!("{}/{}/{}", e.namespace, e.kind, e.name))
        .collect();
    assert_eq!(
        rows,
        [
            "dev/Pod/scratch",
            "ml/CronJob/nightly",
            "ml/Deployment/chart",
            "ml/Deployment/nim"
        ]
    );
    let by = |name: &str| p.register.iter().find(|e| e.name == name).unwrap();
    let helm = by("chart");
    assert_eq!(
        helm.managed_by,
        [Manager {
            kind: "Helm",
            name: "trainer".into()
        }]
    );
    assert!(!helm.editable_in_place);
    assert_eq!(helm.gpu_models[0].product, "NVIDIA A100-SXM4-40GB");
    assert_eq!(helm.gpu_models[0].memory_mib, Some(40960));
    assert_eq!(helm.nodes, ["n1"]);
    let nim = by("nim");
    assert_eq!(
        nim.owner,
        Some(OwnerRef {
            kind: "NIMService",
            name: "llama"
        })
    );
    assert_eq!(nim.managed_by[0].kind, "Operator");
    assert_eq!(
        nim.gpu_models[0],
        GpuModel {
            product: "Tesla-V100-SXM2-16GB",
            memory_mib: Some(16384),
            source: "NFD"
        }
    );
    assert!(!nim.in_plan, "it runs on another group");
    let bare = by("scratch");
    let kinds: Vec<&str> = bare.managed_by.iter().map(|m| m.kind).collect();
    assert_eq!(kinds, ["ArgoCD", "Flux"]);
    assert_eq!(bare.managed_by[1].name, "Kustomization flux-system/apps");
    let cron = by("nightly");
    assert_eq!((cron.replicas, cron.gpus_total), (2, 2));
    assert!(cron.in_plan);
    assert!(!by("chart").editable_in_place && bare.replicas == 1);
}

#[test]
fn the_same_snapshot_gives_the_same_bytes_in_any_order() {
    let mut s = mk_cluster(&[("n1", 2), ("n2", 2), ("n3", 2), ("n4", 2)]);
    run("a", 2, "1", &["n1", "n2"], &mut s, json!({}));
    run("b", 1, "2", &["n3"], &mut s, json!({}));
    run("c", 1, "1", &["n2"], &mut s, json!({}));
    s.pod_disruption_budgets.push(mk_pdb("ml", "a", "a", 1));
    let first = serde_json::to_string(&plan(&s, &request(2)).unwrap()).unwrap();
    s.nodes.reverse();
    s.pods.reverse();
    s.deployments.reverse();
    s.physical_gpus.reverse();
    let second = serde_json::to_string(&plan(&s, &request(2)).unwrap()).unwrap();
    assert_eq!(first, second);
}

#[test]
fn bad_input_is_named_by_object_and_field() {
    let mut s = mk_cluster(&[("n1", 2)]);
    s.deployments.push(mk_deployment(
        "ml",
        "odd",
        1,
        &[("nvidia.com/gpu", "one")],
        json!({}),
    ));
    let err = plan(&s, &request(1)).unwrap_err().to_string();
    assert!(
        err.starts_with("Deployment ml/odd: spec.template.spec.containers[0].resources.limits[nvidia.com/gpu]: \"one\" is not a quantity"),
        "{err}"
    );
    let mut req = request(1);
    req.to = "nowhere".into();
    assert_eq!(
        plan(&s, &req).unwrap_err().to_string(),
        "node group \"nowhere\" does not exist (node groups: gpu, gpu-dra)"
    );
    req = request(1);
    req.class = Some("h100".into());
    assert_eq!(
        plan(&s, &req).unwrap_err().to_string(),
        "GPU class \"h100\" does not exist (GPU classes: a100)"
    );
}

#[test]
fn the_first_bad_workload_by_key_is_named_whichever_thread_reads_it() {
    // The register reads the workloads in pieces, by two threads: the error
    // is the one a single reader in key order would meet first.
    for reversed in [false, true] {
        let mut s = mk_cluster(&[("n1", 2)]);
        let mut deployments = vec![
            mk_deployment("ml", "zz", 1, &[("nvidia.com/gpu", "one")], json!({})),
            mk_deployment("ml", "mm", 1, &[("nvidia.com/gpu", "1")], json!({})),
            mk_deployment("ml", "aa", 1, &[("nvidia.com/gpu", "two")], json!({})),
        ];
        if reversed {
            deployments.reverse();
        }
        s.deployments.extend(deployments);
        let err = plan(&s, &request(1)).unwrap_err().to_string();
        assert!(
            err.starts_with("Deployment ml/aa: spec.template.spec.containers[0]"),
            "{err}"
        );
    }
}

#[test]
fn a_namespace_limits_what_moves_but_not_what_the_source_must_keep() {
    let mut s = mk_cluster(&[("n1", 2), ("n2", 2), ("n3", 2)]);
    run("mine", 1, "1", &["n1"], &mut s, json!({}));
    s.deployments.push(mk_deployment(
        "other",
        "theirs",
        1,
        &[("nvidia.com/gpu", "2")],
        json!({}),
    ));
    s.pods.push(mk_pod(
        "other",
        "theirs",
        0,
        "n2",
        &[("nvidia.com/gpu", "2")],
    ));
    let mut req = request(1);
    req.namespace = Some("ml".into());
    let p = plan(&s, &req).unwrap();
    assert_eq!(p.register.len(), 1);
    assert_eq!(moves(&p)[0], ["mine"]);
    // n2 keeps the 2 GPUs `theirs` needs.
    assert_eq!(p.blocked.as_ref().unwrap().nodes, ["n2"]);
}

/// Both ways of reading the handed-over nodes' slices, compared: by class
/// (the plan) and every node's up front (what the classes must agree with).
fn by_class_and_every_node<'a>(s: &'a Snapshot, req: &PlanRequest) -> Plan<'a> {
    let by_class = plan_reading(s, req, Reading::ByClass);
    let every_node = plan_reading(s, req, Reading::EveryNode);
    match (by_class, every_node) {
        (Ok(a), Ok(b)) => {
            let (ja, jb) = (
                serde_json::to_string_pretty(&a).unwrap(),
                serde_json::to_string_pretty(&b).unwrap(),
            );
            assert!(ja == jb, "by class:\n{ja}\nevery node:\n{jb}");
            a
        }
        (a, b) => panic!("by class: {a:?}\nevery node: {b:?}"),
    }
}

/// Cards as a node's agent reports them, each with its own UUID.
fn mk_cards(node: &str, n: u32, failed: u32) -> Vec<PhysicalGPU> {
    let mut cards = mk_gpus(node, n, failed);
    for c in &mut cards {
        c.spec.uuid = format!("GPU-{node}-{}", c.spec.index);
    }
    cards
}

/// Source nodes of four kinds (4 cards, 2 cards, 4 with one failed, 4 with
/// another driver), some in zone a; two target nodes already on DRA with
/// their slices; workloads of every size, some pinned to the zone, one too
/// big for any node; an existing claim on n02's gpu-1.
fn mk_mixed_cluster(layout: Layout) -> Snapshot {
    let mut s = mk_cluster(&[]);
    // Name, cards, failed cards, labels.
    type SourceNode = (
        &'static str,
        u32,
        u32,
        &'static [(&'static str, &'static str)],
    );
    let kinds: [SourceNode; 12] = [
        ("n01", 4, 0, &[("zone", "a")]),
        ("n02", 4, 0, &[]),
        ("n03", 4, 0, &[("zone", "a")]),
        ("n04", 4, 0, &[]),
        ("n05", 2, 0, &[("zone", "a")]),
        ("n06", 2, 0, &[]),
        ("n07", 2, 0, &[]),
        ("n08", 4, 1, &[]),
        ("n09", 4, 1, &[("zone", "a")]),
        (
            "n10",
            4,
            0,
            &[("nvidia.com/cuda.driver-version.full", "550.54.15")],
        ),
        ("n11", 4, 0, &[]),
        ("n12", 4, 0, &[]),
    ];
    for (name, cards, failed, labels) in kinds {
        s.nodes.push(mk_node(
            name,
            FROM,
            &[("nvidia.com/gpu", &cards.to_string())],
            labels,
        ));
        s.physical_gpus.extend(mk_cards(name, cards, failed));
    }
    for t in ["t1", "t2"] {
        s.nodes.push(mk_node(
            t,
            TO,
            &[],
            &[("zone", "a"), ("gpu.deckhouse.io/stack", "dra")],
        ));
        let cards = mk_cards(t, 2, 0);
        let machine = publish::machine_from_physical_gpus(&cards, "0.0.0", "0.0");
        s.resource_slices
            .extend(publish::resource_slices(t, &machine, layout, 1));
        s.physical_gpus.extend(cards);
    }
    let w =
        |s: &mut Snapshot, name: &str, replicas: i32, gpus: &str, nodes: &[&str], zone: bool| {
            let extra = if zone {
                json!({"nodeSelector": {"zone": "a"}})
            } else {
                json!({})
            };
            run(name, replicas, gpus, nodes, s, extra);
        };
    w(&mut s, "a1", 1, "1", &["n01"], false);
    w(&mut s, "a2", 2, "1", &["n01", "n02"], false);
    w(&mut s, "a3", 1, "2", &["n02"], true);
    w(&mut s, "a4", 1, "3", &["n03"], false);
    w(&mut s, "a5", 1, "4", &["n04"], false);
    w(&mut s, "a6", 3, "1", &["n05", "n06", "n07"], false);
    w(&mut s, "a7", 1, "2", &["n05"], true);
    w(&mut s, "a8", 1, "3", &["n08"], false);
    w(&mut s, "a9", 2, "2", &["n09", "n10"], false);
    w(&mut s, "b1", 1, "1", &["n11"], true);
    w(&mut s, "b2", 1, "2", &["n11"], false);
    w(&mut s, "b3", 1, "1", &["n12"], false);
    // Too big for any node; bound to the source group, it must keep room.
    run(
        "big",
        1,
        "6",
        &[],
        &mut s,
        json!({"nodeSelector": {"node.deckhouse.io/group": FROM}}),
    );
    s.pod_disruption_budgets.push(mk_pdb("ml", "a2", "a2", 1));
    s.resource_claims.push(from_json(json!({
        "metadata": {"namespace": "ml", "name": "held"},
        "spec": {"devices": {"requests": [{"name": "gpu",
            "exactly": {"deviceClassName": "a100.gpu.deckhouse.io"}}]}},
        "status": {"allocation": {"devices": {"results": [{"request": "gpu",
            "driver": "gpu.deckhouse.io", "pool": "n02", "device": "gpu-1"}]}}}
    })));
    s
}

#[test]
fn node_classes_give_the_plan_that_reading_every_node_gives() {
    for max_unavailable in [1, 3] {
        let s = mk_mixed_cluster(Layout::Static);
        let p = by_class_and_every_node(&s, &request(max_unavailable));
        // The comparison covers placements, pending reasons and blocking.
        assert!(p.waves.iter().any(|w| !w.moves.is_empty()), "{p:#?}");
        let big = p.remaining.iter().find(|r| r.workload.name == "big");
        assert!(
            big.is_some_and(|r| r.reason.contains("cannot allocate its claim")),
            "{p:#?}"
        );
    }

    // Partitionable cards, MIG workloads among the others.
    let mut s = mk_mixed_cluster(Layout::Partitionable);
    s.gpu_classes = vec![mk_class("a100", false, &["1g.5gb"])];
    s.device_classes.push(mk_device_class(
        "a100-mig-1g.5gb.gpu.deckhouse.io",
        r#"device.driver == "gpu.deckhouse.io" && device.attributes["gpu.deckhouse.io"].type == "mig" && device.attributes["gpu.deckhouse.io"].profile == "1g.5gb""#,
    ));
    s.deployments.push(mk_deployment(
        "ml",
        "mig",
        5,
        &[("nvidia.com/mig-1g.5gb", "1")],
        json!({"nodeSelector": {"node.deckhouse.io/group": FROM}}),
    ));
    let mut req = request(2);
    req.layout = Layout::Partitionable;
    by_class_and_every_node(&s, &req);

    // Shared cards: no class (their allocations are per claim).
    let mut s = mk_mixed_cluster(Layout::Shared { replicas: 4 });
    s.node_groups[0] = mk_group(
        FROM,
        Some(json!({"sharing": "TimeSlicing", "timeSlicing": {"partitionCount": 4}})),
    );
    s.gpu_classes = vec![mk_class("a100", true, &[])];
    s.device_classes.push(mk_device_class(
        "a100-shared.gpu.deckhouse.io",
        r#"device.driver == "gpu.deckhouse.io" && device.allowMultipleAllocations"#,
    ));
    let mut req = request(1);
    req.layout = Layout::Shared { replicas: 4 };
    by_class_and_every_node(&s, &req);
}

/// The classes admitted: nodes alike but for their UUIDs share one, unless a
/// selector reads the UUID, a cluster slice may be gathered by any node, or
/// the cards are shared.
#[test]
fn a_class_is_admitted_only_where_members_cannot_differ() {
    let classes_of = |s: &Snapshot, layout: Layout| {
        let source: Vec<&Node> = s
            .nodes
            .iter()
            .filter(|n| n.metadata.labels.as_ref().unwrap()["node.deckhouse.io/group"] == FROM)
            .collect();
        let names: Vec<&str> = source
            .iter()
            .map(|n| n.metadata.name.as_deref().unwrap())
            .collect();
        let machine = |n: usize| {
            let cards: Vec<&PhysicalGPU> = s
                .physical_gpus
                .iter()
                .filter(|g| g.spec.node == names[n])
                .collect();
            (!cards.is_empty()).then(|| classes::machine(source[n], &cards))
        };
        let cluster: Vec<&ResourceSlice> = s.resource_slices.iter().collect();
        let requested = ["a100.gpu.deckhouse.io"].into();
        let compiler = switchyard_dra::cel::Compiler::default();
        let c = classes::Classes::new(
            &names,
            machine,
            layout,
            &cluster,
            &s.device_classes,
            &requested,
            &compiler,
        );
        names
            .iter()
            .zip(&c.of_source)
            .map(|(n, c)| (n.to_string(), *c))
            .collect::<BTreeMap<String, Option<usize>>>()
    };
    let s = mk_mixed_cluster(Layout::Static);
    let classes = classes_of(&s, Layout::Static);
    // 4 cards, 2 cards, one failed, another driver: four classes.
    let class = |n: &str| classes[n].expect("in a class");
    assert_eq!(class("n01"), class("n12"));
    assert_eq!(class("n05"), class("n07"));
    assert_eq!(class("n08"), class("n09"));
    let distinct: BTreeSet<usize> = classes.values().flatten().copied().collect();
    assert_eq!(distinct.len(), 4, "{classes:?}");

    let mut reads_uuid = s.clone();
    reads_uuid.device_classes = vec![mk_device_class(
        "a100.gpu.deckhouse.io",
        r#"device.driver == "gpu.deckhouse.io" && device.attributes["gpu.deckhouse.io"].uuid != "GPU-n01-0""#,
    )];
    assert!(
        classes_of(&reads_uuid, Layout::Static)
            .values()
            .all(Option::is_none)
    );
    by_class_and_every_node(&reads_uuid, &request(2));

    let mut any_node = s.clone();
    any_node.resource_slices[0].spec.node_name = None;
    any_node.resource_slices[0].spec.all_nodes = Some(true);
    assert!(
        classes_of(&any_node, Layout::Static)
            .values()
            .all(Option::is_none)
    );

    let shared = mk_mixed_cluster(Layout::Shared { replicas: 2 });
    assert!(
        classes_of(&shared, Layout::Shared { replicas: 2 })
            .values()
            .all(Option::is_none)
    );
}

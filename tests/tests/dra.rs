//! DRA end to end on a real control plane (etcd, kube-apiserver,
//! kube-scheduler, kube-controller-manager, v1.36.3): GPUClasses become
//! DeviceClasses through the class compiler; kubelet-less nodes publish
//! ResourceSlices modelled on NVIDIA's (A100 40GB with MIG as partitionable
//! devices, H100 80GB); pods ask for `gpu.deckhouse.io/<class>: 1` and the
//! real scheduler allocates through the extended-resource path. Before each
//! pod, our allocator predicts, per node, whether its request fits and with
//! which device; the scheduler's decision must be the same.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use switchyard_api::GPUClass;
use switchyard_class_compiler::ClassCompilerEdge as Edge;
use switchyard_core::ServiceName;
use switchyard_core::class_compiler;
use switchyard_core::effects::Effect;
use switchyard_dra::alloc::Objects;
use switchyard_dra::cel::Compiler;
use switchyard_kube::write::Writer;
use switchyard_proto::v1::domain_event::Kind;
use switchyard_testkit::eventually;
use switchyard_testkit::kube::{Components, ControlPlane, create_namespace, fake_node};

const DRIVER: &str = "gpu.deckhouse.io";

/// A GPU's attributes as NVIDIA's driver names them, plus the PhysicalGPU
/// device label class selectors use.
fn attributes(kind: &str, device: &str, product: &str, index: usize) -> Value {
    json!({
        "type": {"string": kind},
        "device": {"string": device},
        "productName": {"string": product},
        "architecture": {"string": if device.starts_with("h100") { "Hopper" } else { "Ampere" }},
        "cudaComputeCapability": {"version": if device.starts_with("h100") { "9.0.0" } else { "8.0.0" }},
        "driverVersion": {"version": "550.54.15"},
        "uuid": {"string": format!("GPU-{device}-{index}")},
        "index": {"int": index},
    })
}

/// An A100 node: two cards, each the whole card and its MIG profiles, all
/// drawing on the card's counters.
fn a100_slices(node: &str) -> Vec<Value> {
    let pool = json!({"name": node, "generation": 1, "resourceSliceCount": 2});
    let mut devices = Vec::new();
    let mut sets = Vec::new();
    for card in 0..2 {
        let set = format!("gpu-{card}-counters");
        sets.push(json!({"name": set, "counters": {"memory": {"value": "40Gi"}, "slices": {"value": "7"}}}));
        let consumes = |memory: &str, slices: u32| json!([{"counterSet": set, "counters": {"memory": {"value": memory}, "slices": {"value": slices.to_string()}}}]);
        devices.push(json!({
            "name": format!("gpu-{card}"),
            "attributes": attributes("gpu", "a100-sxm4-40gb", "NVIDIA A100-SXM4-40GB", card),
            "capacity": {"memory": {"value": "40Gi"}},
            "consumesCounters": consumes("40Gi", 7),
        }));
        for (profile, memory, slices, count) in [("1g.5gb", "5Gi", 1, 7), ("3g.20gb", "20Gi", 3, 2)]
        {
            for i in 0..count {
                let mut a = attributes("mig", "a100-sxm4-40gb", "NVIDIA A100-SXM4-40GB", card);
                a["profile"] = json!({"string": profile});
                a["parentUUID"] = json!({"string": format!("GPU-a100-sxm4-40gb-{card}")});
                devices.push(json!({
                    "name": format!("gpu-{card}-mig-{}-{i}", profile.replace('.', "-")),
                    "attributes": a,
                    "capacity": {"memory": {"value": memory}},
                    "consumesCounters": consumes(memory, slices),
                }));
            }
        }
    }
    vec![
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": format!("{node}-counters")},
            "spec": {"driver": DRIVER, "nodeName": node, "pool": pool, "sharedCounters": sets}}),
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": format!("{node}-gpus")},
            "spec": {"driver": DRIVER, "nodeName": node, "pool": pool, "devices": devices}}),
    ]
}

fn h100_slices(node: &str) -> Vec<Value> {
    let devices: Vec<Value> = (0..2)
        .map(|card| {
            json!({
                "name": format!("gpu-{card}"),
                "attributes": attributes("gpu", "h100-80gb-hbm3", "NVIDIA H100 80GB HBM3", card),
                "capacity": {"memory": {"value": "80Gi"}},
            })
        })
        .collect();
    vec![
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": format!("{node}-gpus")},
        "spec": {"driver": DRIVER, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "devices": devices}}),
    ]
}

/// Creates a GPUClass and publishes what the class compiler makes of it.
async fn gpu_class(client: &Client, edge: &Edge, spec: Value) {
    let classes: Api<GPUClass> = Api::all(client.clone());
    let class: GPUClass = serde_json::from_value(spec).unwrap();
    let created = classes
        .create(&PostParams::default(), &class)
        .await
        .expect("GPUClass");
    let fact = switchyard_kube::facts::gpu_class(&created);
    let Some(Kind::GpuClassObserved(observed)) = fact.kind else {
        unreachable!()
    };
    let variants = class_compiler::compile(&observed, &class_compiler::Profile::DECKHOUSE)
        .expect("the class compiles");
    edge.execute_one(&Effect::PublishDeviceClasses {
        gpu_class: observed.name.clone(),
        variants,
        refused: None,
        namespaces: Vec::new(),
    })
    .await
    .expect("DeviceClasses published");
}

fn pod(name: &str, resource: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"containers": [{"name": "train", "image": "registry.example.com/train:1",
            "resources": {"limits": {resource: "1"}}}]},
    }))
    .unwrap()
}

/// What our allocator says, per node, of a claim for one device of `class`
/// on top of the claims allocated so far: the device, or None.
async fn predict(client: &Client, class: &str) -> Vec<(String, Option<String>)> {
    let (objects, compiler) = snapshot(client, class).await;
    let mut out = Vec::new();
    for node in ["gpu-a", "gpu-h"] {
        let outcome = objects.allocate(node, compiler.clone());
        assert_ne!(outcome.result, "error", "{outcome:?}");
        let device = outcome.allocations.first().and_then(|a| {
            let results = a.allocation.devices.as_ref()?.results.as_ref()?;
            Some(results[0].device.clone())
        });
        out.push((node.to_string(), device));
    }
    out
}

/// The cluster's slices, classes and claims, and a pending claim for one
/// device of `class` (what the scheduler makes of an extended-resource request).
async fn snapshot(client: &Client, class: &str) -> (Objects, Arc<Compiler>) {
    let mut values: Vec<Value> = Vec::new();
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    for s in slices.list(&ListParams::default()).await.unwrap() {
        values.push(with_kind(serde_json::to_value(s).unwrap(), "ResourceSlice"));
    }
    let device_classes: Api<DeviceClass> = Api::all(client.clone());
    for c in device_classes.list(&ListParams::default()).await.unwrap() {
        values.push(with_kind(serde_json::to_value(c).unwrap(), "DeviceClass"));
    }
    let claims: Api<ResourceClaim> = Api::all(client.clone());
    for c in claims.list(&ListParams::default()).await.unwrap() {
        values.push(with_kind(serde_json::to_value(c).unwrap(), "ResourceClaim"));
    }
    values.push(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "prediction", "namespace": "ml"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": class}}]}}}));
    let objects = Objects::from_values(values).expect("API objects read");
    (objects, Arc::new(Compiler::default()))
}

fn with_kind(mut v: Value, kind: &str) -> Value {
    v["kind"] = json!(kind);
    v["apiVersion"] = json!(if kind == "Node" {
        "v1"
    } else {
        "resource.k8s.io/v1"
    });
    v
}

/// The node the scheduler bound the pod to and the devices of its claim.
async fn scheduled(client: &Client, name: &str) -> (String, Vec<(String, String)>) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "ml");
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "ml");
    until(
        "the pod bound with an allocated claim",
        Duration::from_secs(60),
        || async {
            let pod = pods.get(name).await.ok()?;
            let node = pod.spec.as_ref()?.node_name.clone()?;
            let claim = claims
                .list(&ListParams::default())
                .await
                .ok()?
                .into_iter()
                .find(|c| c.owner_references().iter().any(|o| o.name == name))?;
            let results = claim.status?.allocation?.devices?.results?;
            Some((
                node,
                results.into_iter().map(|r| (r.pool, r.device)).collect(),
            ))
        },
    )
    .await
}

/// Waits until `f` gives a value (a condition with a deadline, no sleeps).
async fn until<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let found = std::sync::Mutex::new(None);
    eventually(what, timeout, || {
        let attempt = f();
        let found = &found;
        async move {
            let value = attempt.await;
            let done = value.is_some();
            *found.lock().unwrap() = value;
            done
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    found.into_inner().unwrap().expect("found")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scheduler_decides_what_our_allocator_predicts() {
    let plane = ControlPlane::start_with(Components {
        scheduler: true,
        controller_manager: true,
        ..Components::default()
    })
    .await;
    let client = plane.client();
    switchyard_testkit::kube::install_crds(
        &client,
        switchyard_api::crds().into_iter().map(|(_, c)| c).collect(),
    )
    .await;
    create_namespace(&client, "ml").await;
    let edge = Edge::new(Writer::new(plane.config(), ServiceName::ClassCompiler).unwrap());
    gpu_class(&client, &edge, json!({"apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "GPUClass", "metadata": {"name": "a100"},
        "spec": {"selector": {"matchLabels": {"gpu.deckhouse.io/device": "a100-sxm4-40gb"}}, "partitions": {"migProfiles": ["3g.20gb"]}}})).await;
    gpu_class(&client, &edge, json!({"apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "GPUClass", "metadata": {"name": "h100"},
        "spec": {"selector": {"matchLabels": {"gpu.deckhouse.io/device": "h100-80gb-hbm3"}}}})).await;
    gpu_class(&client, &edge, json!({"apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "GPUClass", "metadata": {"name": "v100"},
        "spec": {"selector": {"matchLabels": {"gpu.deckhouse.io/device": "v100-sxm2-16gb"}}}})).await;
    let device_classes: Api<DeviceClass> = Api::all(client.clone());
    let a100 = device_classes
        .get("a100.gpu.deckhouse.io")
        .await
        .expect("the a100 DeviceClass");
    assert_eq!(
        a100.spec.extended_resource_name.as_deref(),
        Some("gpu.deckhouse.io/a100")
    );

    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    for (node, made) in [
        ("gpu-a", a100_slices("gpu-a")),
        ("gpu-h", h100_slices("gpu-h")),
    ] {
        nodes
            .create(
                &PostParams::default(),
                &fake_node(node, &[("gpu.deckhouse.io/stack", "dra")], Vec::new()),
            )
            .await
            .expect("node");
        for s in made {
            // The API server's validation accepts what the slices say.
            slices
                .create(&PostParams::default(), &serde_json::from_value(s).unwrap())
                .await
                .expect("ResourceSlice accepted");
        }
    }

    let pods: Api<Pod> = Api::namespaced(client.clone(), "ml");
    // Each pod: our prediction first, then the scheduler's decision.
    for (pod_name, resource, class, node, device) in [
        (
            "whole-a100",
            "gpu.deckhouse.io/a100",
            "a100.gpu.deckhouse.io",
            "gpu-a",
            "gpu-0",
        ),
        // gpu-0's counters are spent: the MIG slice comes from the second card.
        (
            "mig-a100",
            "gpu.deckhouse.io/a100-mig-3g.20gb",
            "a100-mig-3g.20gb.gpu.deckhouse.io",
            "gpu-a",
            "gpu-1-mig-3g-20gb-0",
        ),
        (
            "whole-h100",
            "gpu.deckhouse.io/h100",
            "h100.gpu.deckhouse.io",
            "gpu-h",
            "gpu-0",
        ),
    ] {
        let predicted = predict(&client, class).await;
        let feasible: Vec<_> = predicted.iter().filter(|(_, d)| d.is_some()).collect();
        assert_eq!(
            feasible.len(),
            1,
            "{pod_name}: one node fits: {predicted:?}"
        );
        assert_eq!(
            (feasible[0].0.as_str(), feasible[0].1.as_deref()),
            (node, Some(device)),
            "{pod_name}"
        );
        pods.create(&PostParams::default(), &pod(pod_name, resource))
            .await
            .expect("pod");
        let (bound, devices) = scheduled(&client, pod_name).await;
        assert_eq!(
            bound, node,
            "{pod_name}: the scheduler binds where we predicted"
        );
        assert_eq!(
            devices,
            [(node.to_string(), device.to_string())],
            "{pod_name}: the same device"
        );
    }

    // A class that matches no device: every node infeasible, for both.
    let predicted = predict(&client, "v100.gpu.deckhouse.io").await;
    assert!(predicted.iter().all(|(_, d)| d.is_none()), "{predicted:?}");
    // And explain says why: on each node, every free device's class selector
    // is false (the devices the pods above hold are in use first).
    let (objects, compiler) = snapshot(&client, "v100.gpu.deckhouse.io").await;
    for node in ["gpu-a", "gpu-h"] {
        let explanation = objects
            .allocator(compiler.clone())
            .unwrap()
            .explain(&objects.node(node), &objects.pending())
            .unwrap();
        let candidates = &explanation.requests[0].candidates;
        assert!(!candidates.is_empty(), "{node}: {explanation:?}");
        let mut selector_false = 0;
        for c in candidates {
            let reason = c.reason.as_deref().unwrap_or("fits on its own");
            if reason.starts_with("selector false: class v100.gpu.deckhouse.io selector #0") {
                selector_false += 1;
            } else {
                assert!(
                    reason.starts_with("in use"),
                    "{node} {}: {reason}",
                    c.device
                );
            }
        }
        assert!(selector_false > 0, "{node}: {explanation:?}");
    }
    pods.create(
        &PostParams::default(),
        &pod("v100", "gpu.deckhouse.io/v100"),
    )
    .await
    .expect("pod");
    let message = until(
        "the v100 pod reported unschedulable",
        Duration::from_secs(60),
        || async {
            let pod = pods.get("v100").await.ok()?;
            let condition = pod
                .status?
                .conditions?
                .into_iter()
                .find(|c| c.type_ == "PodScheduled")?;
            (condition.status == "False" && condition.reason.as_deref() == Some("Unschedulable"))
                .then(|| condition.message.unwrap_or_default())
        },
    )
    .await;
    assert!(message.starts_with("0/2 nodes are available"), "{message}");
    assert!(
        pods.get("v100")
            .await
            .unwrap()
            .spec
            .unwrap()
            .node_name
            .is_none()
    );
}

//! `switchyard-node-agent serve` under a real kubelet with containerd and
//! runc (the test kit's `RealNode`): kubelet registers the agent's DRA
//! plugin, the scheduler allocates a claim on the node's slices, kubelet
//! prepares it through the agent, and containerd applies the agent's CDI spec:
//! the container itself prints the card it was given.

use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use switchyard_testkit::kube::{Components, ControlPlane};
use switchyard_testkit::node::{BUSYBOX_IMAGE, NodeOptions, RealNode};
use switchyard_testkit::{KillOnDrop, eventually};

/// The device nodes the agent's CDI specs name for an 8-card machine.
const DEVICE_NODES: [&str; 11] = [
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia0",
    "/dev/nvidia1",
    "/dev/nvidia2",
    "/dev/nvidia3",
    "/dev/nvidia4",
    "/dev/nvidia5",
    "/dev/nvidia6",
    "/dev/nvidia7",
];

fn agent(plane: &ControlPlane, node: &RealNode, fixture: &str) -> KillOnDrop {
    let log = std::fs::File::create(node.root().join("agent.log")).expect("agent log");
    KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_switchyard-node-agent"))
            .args([
                "serve",
                "--gpu-source",
                &format!("fixture:{fixture}"),
                "--node",
                node.name(),
            ])
            .arg("--kubelet-dir")
            .arg(node.kubelet_dir())
            .arg("--cdi-dir")
            .arg(node.cdi_dir())
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
            .env("KUBECONFIG", plane.kubeconfig())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start the agent"),
    )
}

fn logs(node: &RealNode) -> String {
    format!(
        "--- agent.log\n{}\n--- kubelet.log\n{}",
        std::fs::read_to_string(node.root().join("agent.log"))
            .map(|s| s
                .lines()
                .rev()
                .take(30)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n"))
            .unwrap_or_default(),
        node.log_tail("kubelet")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_on_a_real_kubelet_gives_the_container_its_card() {
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
    let node = RealNode::start_with(
        &plane,
        "gpu-real-1",
        NodeOptions {
            labels: vec![("node.deckhouse.io/gpu-stack".into(), "dra".into())],
            ..NodeOptions::default()
        },
    )
    .await;
    node.make_device_nodes(&DEVICE_NODES);
    let _agent = agent(&plane, &node, "deploy/fixtures/h100-8x.yaml");

    // The slices are published and kubelet has registered the plugin: kubelet
    // says so in its log, and the agent was told (NotifyRegistrationStatus).
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    eventually(
        "the node's slice published",
        Duration::from_secs(30),
        || {
            let slices = slices.clone();
            async move {
                slices.list(&ListParams::default()).await.is_ok_and(|l| {
                    l.items
                        .iter()
                        .any(|s| s.spec.node_name.as_deref() == Some("gpu-real-1"))
                })
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(&node)));

    let classes: Api<DeviceClass> = Api::all(client.clone());
    classes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": "gpu"},
                "spec": {"selectors": [{"cel": {"expression": "device.driver == \"gpu.deckhouse.io\""}}]}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    claims
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": "one-gpu"},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "cuda-check"},
            "spec": {
                "hostNetwork": true,
                "terminationGracePeriodSeconds": 1,
                "resourceClaims": [{"name": "gpu", "resourceClaimName": "one-gpu"}],
                "containers": [{
                    "name": "main",
                    "image": BUSYBOX_IMAGE,
                    "command": ["sh", "-c", "echo visible=$NVIDIA_VISIBLE_DEVICES; ls /dev | grep nvidia; sleep 3600"],
                    "resources": {"claims": [{"name": "gpu"}]}
                }]
            }
        }))
        .unwrap(),
    )
    .await
    .unwrap();
    eventually("the claim pod Running", Duration::from_secs(90), || {
        let pods = pods.clone();
        async move {
            pods.get("cuda-check")
                .await
                .is_ok_and(|p| p.status.and_then(|s| s.phase).as_deref() == Some("Running"))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(&node)));

    // The allocated card, seen from inside the container.
    let claim = claims.get("one-gpu").await.unwrap();
    let device = claim
        .status
        .unwrap()
        .allocation
        .unwrap()
        .devices
        .unwrap()
        .results
        .unwrap()[0]
        .device
        .clone();
    let index: usize = device.strip_prefix("gpu-").unwrap().parse().unwrap();
    let machine = switchyard_gpu::source("fixture:../../deploy/fixtures/h100-8x.yaml")
        .unwrap()
        .machine()
        .unwrap();
    let uuid = &machine.gpus[index].uuid;
    let mut printed = String::new();
    eventually("the container's output", Duration::from_secs(20), || {
        printed = node
            .container_log("default", "cuda-check", "main")
            .unwrap_or_default();
        let done = printed.contains(&format!("nvidia{index}"));
        async move { done }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {printed:?}\n{}", logs(&node)));
    assert!(printed.contains(&format!("visible={uuid}")), "{printed}");
    let nodes_seen: Vec<&str> = printed
        .lines()
        .filter(|l| l.starts_with("nvidia"))
        .collect();
    assert!(nodes_seen.contains(&"nvidiactl"), "{printed}");
    assert!(
        !nodes_seen
            .iter()
            .any(|n| n.starts_with("nvidia") && n[6..].parse::<usize>().is_ok_and(|i| i != index)),
        "only the allocated card's node: {printed}"
    );
    // Registration went through kubelet's plugin manager, without the h2 refusal.
    let kubelet_log = std::fs::read_to_string(node.root().join("kubelet.log")).unwrap();
    assert!(
        !kubelet_log.contains("RegisterPlugin error"),
        "{}",
        logs(&node)
    );
}

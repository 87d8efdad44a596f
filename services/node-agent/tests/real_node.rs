//! `switchyard-node-agent serve` under a real kubelet with containerd and
//! runc (the test kit's `RealNode`): kubelet registers the agent's DRA
//! plugin, the scheduler allocates a claim on the node's slices, kubelet
//! prepares it through the agent, and containerd applies the agent's CDI spec:
//! the container itself prints the card it was given.

use std::process::Command;

mod support;

use std::time::Duration;
use support::*;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use switchyard_testkit::eventually;
use switchyard_testkit::node::{BUSYBOX_IMAGE, NodeOptions, RealNode};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_on_a_real_kubelet_gives_the_container_its_card() {
    let plane = plane().await;
    let client = plane.client();
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
    // A copy of the fixture, whose cards' health the test edits.
    let fixture = node.root().join("machine.yaml");
    let original = std::fs::read_to_string("../../deploy/fixtures/h100-8x.yaml").unwrap();
    std::fs::write(&fixture, &original).unwrap();
    let _agent = agent(&plane, &node, fixture.to_str().unwrap(), &[]);

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

    create_class(&client).await;
    create_claim(&client, "one-gpu").await;
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &claim_pod("cuda-check", "one-gpu"))
        .await
        .unwrap();
    wait_phase(&pods, &node, "cuda-check", "Running").await;

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
    // The card fails: kubelet hears it on the health stream and shows it in
    // the pod's status.
    let broken = original.replacen(
        &format!("uuid: {uuid}\n"),
        &format!("uuid: {uuid}\n  healthy: false\n"),
        1,
    );
    assert_ne!(broken, original);
    std::fs::write(&fixture, broken).unwrap();
    // kubelet names the device by the CDI ID prepare gave it.
    let resource = format!("-{device}");
    eventually(
        "the pod's allocatedResourcesStatus Unhealthy",
        Duration::from_secs(60),
        || {
            let (pods, resource) = (pods.clone(), resource.clone());
            async move {
                let Ok(pod) = pods.get("cuda-check").await else {
                    return false;
                };
                let statuses = pod
                    .status
                    .and_then(|s| s.container_statuses)
                    .unwrap_or_default();
                statuses
                    .iter()
                    .flat_map(|c| c.allocated_resources_status.iter().flatten())
                    .any(|a| {
                        a.name == "claim:gpu"
                            && a.resources.iter().flatten().any(|r| {
                                r.resource_id.starts_with("gpu.deckhouse.io/gpu=")
                                    && r.resource_id.ends_with(&resource)
                                    && r.health.as_deref() == Some("Unhealthy")
                            })
                    })
            }
        },
    )
    .await
    .unwrap_or_else(|e| {
        let status =
            futures::executor::block_on(pods.get("cuda-check")).map(|p| format!("{:?}", p.status));
        panic!("{e}: {status:?}\n{}", logs(&node))
    });

    // Registration went through kubelet's plugin manager, without the h2
    // refusal, and the health stream is served.
    let kubelet_log = std::fs::read_to_string(node.root().join("kubelet.log")).unwrap();
    assert!(
        !kubelet_log.contains("Unimplemented"),
        "kubelet found a service missing: {}",
        logs(&node)
    );
    assert!(
        !kubelet_log.contains("RegisterPlugin error"),
        "{}",
        logs(&node)
    );
}

/// A pod asking `gpus` of nvidia.com/gpu that prints what it was given,
/// then runs until the node's `/var/lib/gate/open` exists.
fn gpu_pod(name: &str, gpus: u32) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "hostNetwork": true,
            "restartPolicy": "Never",
            "volumes": [{"name": "gate", "hostPath": {"path": "/var/lib/gate", "type": "DirectoryOrCreate"}}],
            "containers": [{
                "name": "main",
                "image": BUSYBOX_IMAGE,
                "command": ["sh", "-c", "echo visible=$NVIDIA_VISIBLE_DEVICES; ls /dev | grep nvidia; until [ -e /gate/open ]; do sleep 0.1; done"],
                "volumeMounts": [{"name": "gate", "mountPath": "/gate"}],
                "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}
            }]
        }
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_device_plugin_on_a_real_kubelet_packs_replicas_and_a_finished_pod_holds_nothing() {
    let plane = plane().await;
    let client = plane.client();
    let node = RealNode::start_with(
        &plane,
        "gpu-dp-1",
        NodeOptions {
            labels: vec![("node.deckhouse.io/gpu-stack".into(), "device-plugin".into())],
            ..NodeOptions::default()
        },
    )
    .await;
    node.make_device_nodes(&DEVICE_NODES);
    let _agent = agent(
        &plane,
        &node,
        "deploy/fixtures/h100-8x.yaml",
        &["--sharing", "time-slicing:4"],
    );
    let nodes: Api<Node> = Api::all(client.clone());
    eventually("nvidia.com/gpu: 32 replicas advertised", Duration::from_secs(30), || {
        let nodes = nodes.clone();
        async move { advertised(&nodes, "gpu-dp-1", "nvidia.com/gpu").await == (Some(32), Some(32)) }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(&node)));

    // Three pods of two replicas each at once: Allocate's CDI names resolve
    // (the containers run), and the replicas land on two cards, not six.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    for i in 0..3 {
        pods.create(
            &PostParams::default(),
            &gpu_pod(&format!("replicas-{i}"), 2),
        )
        .await
        .unwrap();
        wait_phase(&pods, &node, &format!("replicas-{i}"), "Running").await;
    }
    let machine = switchyard_gpu::source("fixture:../../deploy/fixtures/h100-8x.yaml")
        .unwrap()
        .machine()
        .unwrap();
    let mut cards = std::collections::BTreeSet::new();
    for i in 0..3 {
        let printed = printed(&node, &format!("replicas-{i}"), "nvidiactl").await;
        let visible = printed
            .lines()
            .find_map(|l| l.strip_prefix("visible="))
            .unwrap_or_else(|| panic!("no NVIDIA_VISIBLE_DEVICES: {printed:?}"));
        assert!(
            !visible.contains(','),
            "two replicas of one card: {printed}"
        );
        let gpu = machine
            .gpus
            .iter()
            .find(|g| g.uuid == visible)
            .unwrap_or_else(|| panic!("{visible} is no card of the node"));
        assert!(
            printed.lines().any(|l| l == format!("nvidia{}", gpu.index)),
            "the card's device node inside: {printed}"
        );
        cards.insert(gpu.index);
    }
    assert_eq!(cards.len(), 2, "packed onto two cards: {cards:?}");

    // The pods finish: Succeeded, they hold nothing.
    std::fs::write(node.path("/var/lib/gate/open"), b"").unwrap();
    for i in 0..3 {
        wait_phase(&pods, &node, &format!("replicas-{i}"), "Succeeded").await;
    }

    // Nothing holds the node: the switch to DRA is not held, and the node
    // never advertises both stacks.
    let patch = json!({"metadata": {"labels": {"node.deckhouse.io/gpu-stack": "dra"}}});
    nodes
        .patch("gpu-dp-1", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let both = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    eventually("the switch to DRA", Duration::from_secs(20), || {
        let (nodes, slices, both) = (nodes.clone(), slices.clone(), both.clone());
        async move {
            let published = slices.list(&ListParams::default()).await.is_ok_and(|l| {
                l.items
                    .iter()
                    .any(|s| s.spec.node_name.as_deref() == Some("gpu-dp-1"))
            });
            let (_, allocatable) = advertised(&nodes, "gpu-dp-1", "nvidia.com/gpu").await;
            let gpus = allocatable.unwrap_or(0);
            if published && gpus > 0 {
                both.store(true, std::sync::atomic::Ordering::SeqCst);
            }
            published && gpus == 0
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(&node)));
    assert!(
        !both.load(std::sync::atomic::Ordering::SeqCst),
        "the node advertised both stacks at once"
    );
    let agent_log = std::fs::read_to_string(node.root().join("agent.log")).unwrap();
    assert!(
        !agent_log.contains("HandoverBlocked"),
        "finished pods held the switch: {agent_log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_stopped_with_sigterm_leaves_no_capacity_and_no_socket() {
    let plane = plane().await;
    let node = RealNode::start_with(
        &plane,
        "gpu-stop-1",
        NodeOptions {
            labels: vec![("node.deckhouse.io/gpu-stack".into(), "device-plugin".into())],
            ..NodeOptions::default()
        },
    )
    .await;
    let mut agent = agent(&plane, &node, "deploy/fixtures/h100-8x.yaml", &[]);
    let nodes: Api<Node> = Api::all(plane.client());
    eventually("nvidia.com/gpu: 8", Duration::from_secs(30), || {
        let nodes = nodes.clone();
        async move { advertised(&nodes, "gpu-stop-1", "nvidia.com/gpu").await == (Some(8), Some(8)) }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(&node)));
    let sockets = || -> Vec<String> {
        std::fs::read_dir(node.kubelet_dir().join("device-plugins"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("switchyard-"))
            .collect()
    };
    assert_eq!(sockets().len(), 1, "{:?}", sockets());
    let status = Command::new("kill")
        .args(["-TERM", &agent.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exited = switchyard_testkit::wait_for("the agent to exit", Duration::from_secs(20), || {
        agent.0.try_wait().ok().flatten()
    })
    .unwrap();
    assert!(exited.success(), "{exited:?}\n{}", logs(&node));
    assert_eq!(
        sockets(),
        Vec::<String>::new(),
        "the plugin's socket removed"
    );
    eventually("no capacity left", Duration::from_secs(20), || {
        let nodes = nodes.clone();
        async move { advertised(&nodes, "gpu-stop-1", "nvidia.com/gpu").await == (Some(0), Some(0)) }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(&node)));
}

/// kubelet's device manager keeps a resource it once allocated through a
/// device plugin (kubernetes#141426, fixed after 1.36): once a node switched
/// from the device plugin to DRA, a pod asking `nvidia.com/gpu` through a
/// DeviceClass's `extendedResourceName` must still start — also after
/// kubelet dropped the stopped plugin's endpoint (5 minutes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bridged_pod_starts_on_a_node_that_served_the_device_plugin() {
    let plane = plane().await;
    let client = plane.client();
    let node = RealNode::start_with(
        &plane,
        "gpu-bridge-1",
        NodeOptions {
            labels: vec![("node.deckhouse.io/gpu-stack".into(), "device-plugin".into())],
            ..NodeOptions::default()
        },
    )
    .await;
    node.make_device_nodes(&DEVICE_NODES);
    let _agent = agent(&plane, &node, "deploy/fixtures/h100-8x.yaml", &[]);
    let nodes: Api<Node> = Api::all(client.clone());
    eventually("nvidia.com/gpu: 8", Duration::from_secs(30), || {
        let nodes = nodes.clone();
        async move { advertised(&nodes, "gpu-bridge-1", "nvidia.com/gpu").await == (Some(8), Some(8)) }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(&node)));
    // A device-plugin pod runs and ends: kubelet's device manager has
    // allocated nvidia.com/gpu through the plugin.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &gpu_pod("legacy", 1))
        .await
        .unwrap();
    wait_phase(&pods, &node, "legacy", "Running").await;
    std::fs::write(node.path("/var/lib/gate/open"), b"").unwrap();
    wait_phase(&pods, &node, "legacy", "Succeeded").await;
    pods.delete("legacy", &Default::default()).await.unwrap();

    let patch = json!({"metadata": {"labels": {"node.deckhouse.io/gpu-stack": "dra"}}});
    nodes
        .patch(
            "gpu-bridge-1",
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
        .unwrap();
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    eventually("the switch to DRA", Duration::from_secs(30), || {
        let (nodes, slices) = (nodes.clone(), slices.clone());
        async move {
            let published = slices.list(&ListParams::default()).await.is_ok_and(|l| {
                l.items
                    .iter()
                    .any(|s| s.spec.node_name.as_deref() == Some("gpu-bridge-1"))
            });
            published && advertised(&nodes, "gpu-bridge-1", "nvidia.com/gpu").await.1 == Some(0)
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(&node)));
    let classes: Api<DeviceClass> = Api::all(client.clone());
    classes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": "bridge"},
                "spec": {
                    "selectors": [{"cel": {"expression": "device.driver == \"gpu.deckhouse.io\""}}],
                    "extendedResourceName": "nvidia.com/gpu"
                }
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let since = std::time::Instant::now();
    for (round, wait) in [
        ("early", Duration::ZERO),
        ("late", Duration::from_secs(330)),
    ] {
        // kubelet drops a stopped plugin's endpoint 5 minutes after it
        // stopped: the late round runs past that. No event marks it.
        let remaining = wait.saturating_sub(since.elapsed());
        tokio::time::sleep(remaining).await;
        let name = format!("bridged-{round}");
        let mut pod = gpu_pod(&name, 1);
        pod.spec.as_mut().unwrap().containers[0].command = Some(vec![
            "sh".into(),
            "-c".into(),
            "echo visible=$NVIDIA_VISIBLE_DEVICES; ls /dev | grep nvidia".into(),
        ]);
        pods.create(&PostParams::default(), &pod).await.unwrap();
        wait_phase(&pods, &node, &name, "Succeeded").await;
        let out = printed(&node, &name, "nvidiactl").await;
        assert!(out.contains("visible=GPU-"), "{round}: {out}");
    }
}

/// Waits until `node` advertises 8 `nvidia.com/gpu`, as capacity and allocatable.
async fn eight(nodes: &Api<Node>, node: &RealNode, what: &str) {
    eventually(what, Duration::from_secs(60), || {
        let nodes = nodes.clone();
        let name = node.name().to_string();
        async move { advertised(&nodes, &name, "nvidia.com/gpu").await == (Some(8), Some(8)) }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(node)));
}

/// kubelet forgets a device plugin when it restarts (it removes every
/// socket in device-plugins/) and when the instance it held is replaced
/// and the older one's stream ends (a rolling update with maxSurge): the
/// agent registers again each time, and a pod asking for a card runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_device_plugin_registers_again_after_kubelet_restarts_and_an_overlapping_agent_stops() {
    const NODE: &str = "gpu-dp-again";
    let plane = plane().await;
    let client = plane.client();
    let mut node = RealNode::start_with(
        &plane,
        NODE,
        NodeOptions {
            labels: vec![("node.deckhouse.io/gpu-stack".into(), "device-plugin".into())],
            ..NodeOptions::default()
        },
    )
    .await;
    node.make_device_nodes(&DEVICE_NODES);
    let fixture = "deploy/fixtures/h100-8x.yaml";
    let mut first = agent_inside(&plane, &node, fixture, &["--pod-uid", "aaaaaaaa-0001"]);
    let nodes: Api<Node> = Api::all(client.clone());
    eight(&nodes, &node, "nvidia.com/gpu: 8").await;
    let sockets = |node: &RealNode| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(node.kubelet_dir().join("device-plugins"))
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with("switchyard-"))
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    };
    assert_eq!(sockets(&node), ["switchyard-nvidia-com-gpu-aaaaaaaa.sock"]);

    // kubelet restarts: the socket is gone, the agent binds it again and
    // registers; a pod gets its card.
    node.stop_kubelet();
    node.start_kubelet();
    node.wait_ready(&plane).await;
    // (A pod admitted before the plugin is back is rejected by kubelet:
    // the scheduler still reads the allocatable of before the restart.)
    eventually(
        "the agent registered again",
        Duration::from_secs(30),
        || {
            let again = std::fs::read_to_string(node.root().join("agent.log"))
                .unwrap_or_default()
                .contains("registered again with kubelet");
            async move { again }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(&node)));
    eight(&nodes, &node, "nvidia.com/gpu: 8 after kubelet's restart").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &gpu_pod("after-restart", 1))
        .await
        .unwrap();
    wait_phase(&pods, &node, "after-restart", "Running").await;
    assert!(
        printed(&node, "after-restart", "nvidiactl")
            .await
            .contains("visible=GPU-")
    );
    assert_eq!(sockets(&node), ["switchyard-nvidia-com-gpu-aaaaaaaa.sock"]);

    // A second agent beside it (a rolling update's new pod): kubelet takes
    // the newer. The first stops; its stream's end makes kubelet drop the
    // newer one, which registers again.
    let _second = agent_inside(&plane, &node, fixture, &["--pod-uid", "bbbbbbbb-0002"]);
    eventually("both agents' sockets", Duration::from_secs(30), || {
        let both = sockets(&node).len() == 2;
        async move { both }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(&node)));
    let registered_before = std::fs::read_to_string(node.root().join("agent.log"))
        .unwrap()
        .matches("registered again with kubelet")
        .count();
    let status = Command::new("kill")
        .args(["-TERM", &first.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    switchyard_testkit::wait_for("the first agent to exit", Duration::from_secs(20), || {
        first.0.try_wait().ok().flatten()
    })
    .unwrap();
    assert_eq!(sockets(&node), ["switchyard-nvidia-com-gpu-bbbbbbbb.sock"]);
    eventually(
        "the second agent registered again",
        Duration::from_secs(30),
        || {
            let again = std::fs::read_to_string(node.root().join("agent.log"))
                .unwrap_or_default()
                .matches("registered again with kubelet")
                .count()
                > registered_before;
            async move { again }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(&node)));
    eight(&nodes, &node, "nvidia.com/gpu: 8 from the second agent").await;
    pods.create(&PostParams::default(), &gpu_pod("after-rollout", 1))
        .await
        .unwrap();
    wait_phase(&pods, &node, "after-rollout", "Running").await;
    assert!(
        printed(&node, "after-rollout", "nvidiactl")
            .await
            .contains("visible=GPU-")
    );
}

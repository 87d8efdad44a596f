//! The behaviours Kubernetes' node e2e tests ask of a DRA kubelet plugin,
//! each on a real kubelet with containerd (the test kit's `RealNode`) and
//! `switchyard-node-agent serve` as a process beside it.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use switchyard_testkit::eventually;
use switchyard_testkit::kube::ControlPlane;
use switchyard_testkit::node::{NodeOptions, RealNode};

mod support;

use support::*;

const FIXTURE: &str = "deploy/fixtures/h100-8x.yaml";

/// A DRA node `name` with the device nodes made and the class `gpu`.
async fn dra_node(plane: &ControlPlane, name: &str) -> RealNode {
    let node = RealNode::start_with(
        plane,
        name,
        NodeOptions {
            labels: vec![("node.deckhouse.io/gpu-stack".into(), "dra".into())],
            ..NodeOptions::default()
        },
    )
    .await;
    node.make_device_nodes(&DEVICE_NODES);
    node
}

/// The names of the node's slices now.
async fn slices_of(client: &kube::Client, node: &str) -> Vec<String> {
    Api::<ResourceSlice>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map(|l| {
            l.items
                .into_iter()
                .filter(|s| s.spec.node_name.as_deref() == Some(node))
                .filter_map(|s| s.metadata.name)
                .collect()
        })
        .unwrap_or_default()
}

async fn wait_slices(client: &kube::Client, node: &RealNode, present: bool, within: Duration) {
    let what = if present { "published" } else { "wiped" };
    eventually(&format!("the node's slices {what}"), within, || {
        let client = client.clone();
        let name = node.name().to_string();
        async move { slices_of(&client, &name).await.is_empty() != present }
    })
    .await
    .unwrap_or_else(|e| {
        let kubelet = std::fs::read_to_string(node.root().join("kubelet.log")).unwrap_or_default();
        let plugin_lines: Vec<&str> = kubelet
            .lines()
            .filter(|l| l.contains("DRA") || l.contains("ResourceSlice") || l.contains("plugin"))
            .collect();
        panic!(
            "{e}\n{}\n--- kubelet on plugins and slices\n{}",
            logs(node),
            plugin_lines.join("\n")
        )
    });
}

/// Waits until the agent's log has a line containing `text` (kubelet's
/// registration acknowledged, a prepare started).
fn wait_logged(node: &RealNode, text: &str, within: Duration) {
    let agent_log = node.root().join("agent.log");
    switchyard_testkit::wait_for(&format!("the agent to log {text:?}"), within, || {
        std::fs::read_to_string(&agent_log)
            .is_ok_and(|l| l.contains(text))
            .then_some(())
    })
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(node)));
}

/// The claims the agent's checkpoint holds now.
fn checkpointed(node: &RealNode) -> Vec<String> {
    let path = node
        .kubelet_dir()
        .join("plugins/gpu.deckhouse.io/checkpoint.json");
    let Ok(bytes) = std::fs::read(&path) else {
        return Vec::new();
    };
    let checkpoint: switchyard_kubelet::plugin::Checkpoint =
        serde_json::from_slice(&bytes).expect("the checkpoint parses");
    let mut claims: Vec<String> = checkpoint
        .claims
        .values()
        .map(|c| format!("{}/{}", c.namespace, c.name))
        .collect();
    claims.sort();
    claims
}

/// The claims' CDI specs in the node's CDI directory.
fn claim_specs(node: &RealNode) -> Vec<String> {
    let mut specs: Vec<String> = std::fs::read_dir(node.cdi_dir())
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("gpu.deckhouse.io-") && n.ends_with(".json"))
                .collect()
        })
        .unwrap_or_default();
    specs.sort();
    specs
}

async fn run_claim_pod(client: &kube::Client, node: &RealNode, pod: &str, claim: &str) {
    create_claim(client, claim).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &claim_pod(pod, claim))
        .await
        .unwrap();
    wait_phase(&pods, node, pod, "Running").await;
    let out = printed(node, pod, "nvidiactl").await;
    assert!(out.contains("visible=GPU-"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plugin_is_registered_again_after_kubelet_and_agent_restarts() {
    let plane = plane().await;
    let client = plane.client();
    let mut node = dra_node(&plane, "e2e-restarts").await;
    let agent_1 = agent(&plane, &node, FIXTURE, &[]);
    create_class(&client).await;
    wait_slices(&client, &node, true, Duration::from_secs(30)).await;

    // kubelet down: a pod created now runs once kubelet is back (it wipes
    // the node's slices as it starts; the agent publishes them again and
    // registers with the new kubelet).
    node.stop_kubelet();
    create_claim(&client, "while-down").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(
        &PostParams::default(),
        &claim_pod("while-down", "while-down"),
    )
    .await
    .unwrap();
    node.start_kubelet();
    wait_phase(&pods, &node, "while-down", "Running").await;
    wait_slices(&client, &node, true, Duration::from_secs(30)).await;
    run_claim_pod(&client, &node, "after-kubelet", "after-kubelet").await;

    // The agent killed and started again at once: the slices stay, kubelet
    // registers the new instance, claims are prepared by it.
    let before = slices_of(&client, node.name()).await;
    drop(agent_1);
    let _agent_2 = agent(&plane, &node, FIXTURE, &[]);
    run_claim_pod(&client, &node, "after-agent", "after-agent").await;
    assert_eq!(slices_of(&client, node.name()).await, before);
    assert_eq!(checkpointed(&node).len(), 3, "{:?}", checkpointed(&node));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepared_claims_survive_an_agent_restart_and_unprepare_is_retried() {
    let plane = plane().await;
    let client = plane.client();
    let node = dra_node(&plane, "e2e-unprepare").await;
    let agent_1 = agent(&plane, &node, FIXTURE, &[]);
    create_class(&client).await;
    wait_slices(&client, &node, true, Duration::from_secs(30)).await;
    run_claim_pod(&client, &node, "graceful", "graceful").await;
    run_claim_pod(&client, &node, "forced", "forced").await;
    assert_eq!(checkpointed(&node), ["default/forced", "default/graceful"]);
    let specs = claim_specs(&node);
    assert_eq!(specs.len(), 2, "{specs:?}");

    // A new agent instance: the prepared claims are still known.
    drop(agent_1);
    let _agent_2 = agent(&plane, &node, FIXTURE, &[]);

    // Unprepare fails while the claims' specs cannot be removed (immutable):
    // kubelet retries it, for a deleted pod and a force-deleted one alike.
    for spec in &specs {
        let status = std::process::Command::new("chattr")
            .arg("+i")
            .arg(node.cdi_dir().join(spec))
            .status()
            .unwrap();
        assert!(status.success(), "chattr +i");
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.delete("graceful", &DeleteParams::default())
        .await
        .unwrap();
    pods.delete("forced", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let kubelet_log = node.root().join("kubelet.log");
    eventually(
        "kubelet to see unprepare fail",
        Duration::from_secs(60),
        || {
            let failed = std::fs::read_to_string(&kubelet_log).is_ok_and(|l| {
                l.contains("NodeUnprepareResources") && l.contains("remove the CDI spec")
            });
            async move { failed }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(&node)));
    assert_eq!(checkpointed(&node).len(), 2, "nothing unprepared yet");
    for spec in &specs {
        let status = std::process::Command::new("chattr")
            .arg("-i")
            .arg(node.cdi_dir().join(spec))
            .status()
            .unwrap();
        assert!(status.success(), "chattr -i");
    }
    eventually("both claims unprepared", Duration::from_secs(90), || {
        let done = checkpointed(&node).is_empty() && claim_specs(&node).is_empty();
        async move { done }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {:?}\n{}", checkpointed(&node), logs(&node)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_prepare_is_retried_until_it_succeeds() {
    let plane = plane().await;
    let client = plane.client();
    let node = dra_node(&plane, "e2e-prepare").await;
    // The agent reads claims as the ServiceAccount `agent`, which may not
    // read them at first.
    let kubeconfig = agent_account(&plane, false).await;
    let _agent = agent_with(&node, FIXTURE, &[], &kubeconfig);
    create_class(&client).await;
    wait_slices(&client, &node, true, Duration::from_secs(30)).await;
    create_claim(&client, "retried").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &claim_pod("retried", "retried"))
        .await
        .unwrap();
    let kubelet_log = node.root().join("kubelet.log");
    eventually(
        "kubelet to see prepare fail",
        Duration::from_secs(60),
        || {
            let failed = std::fs::read_to_string(&kubelet_log)
                .is_ok_and(|l| l.contains("NodePrepareResources") && l.contains("forbidden"));
            async move { failed }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(&node)));
    assert!(checkpointed(&node).is_empty());
    // Allowed now: kubelet's next try prepares it.
    agent_account(&plane, true).await;
    wait_phase(&pods, &node, "retried", "Running").await;
    assert_eq!(checkpointed(&node), ["default/retried"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_wipes_the_slices_once_the_agent_is_gone_and_its_sockets_are_removed() {
    let plane = plane().await;
    let client = plane.client();
    let node = dra_node(&plane, "e2e-wipe").await;
    let mut agent = agent(&plane, &node, FIXTURE, &[]);
    wait_slices(&client, &node, true, Duration::from_secs(30)).await;
    let registration = node
        .kubelet_dir()
        .join("plugins_registry/gpu.deckhouse.io-reg.sock");
    let endpoint = node.kubelet_dir().join("plugins/gpu.deckhouse.io/dra.sock");
    wait_logged(
        &node,
        "kubelet registered the DRA plugin",
        Duration::from_secs(30),
    );
    assert!(registration.exists() && endpoint.exists());
    let status = std::process::Command::new("kill")
        .args(["-TERM", &agent.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exited = switchyard_testkit::wait_for("the agent to exit", Duration::from_secs(20), || {
        agent.0.try_wait().ok().flatten()
    })
    .unwrap();
    assert!(exited.success(), "{exited:?}\n{}", logs(&node));
    assert!(!registration.exists(), "the registration socket removed");
    assert!(!endpoint.exists(), "the DRA socket removed");
    // kubelet wipes a driver's slices 30 s after its last plugin left.
    wait_slices(&client, &node, false, Duration::from_secs(60)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkill_during_a_prepare_leaves_the_claim_prepared_once() {
    let plane = plane().await;
    let client = plane.client();
    let node = dra_node(&plane, "e2e-sigkill").await;
    // The agent reaches the API server through toxiproxy, so that a prepare
    // can be slowed down and the agent killed in the middle of it.
    let proxy = switchyard_testkit::toxiproxy::Toxiproxy::start();
    let listen = proxy.proxy("kube-apiserver", plane.url().trim_start_matches("https://"));
    let slow = plane.kubeconfig_via("slow.kubeconfig", &format!("https://{listen}"));
    let agent_1 = agent_with(&node, FIXTURE, &[], &slow);
    create_class(&client).await;
    wait_slices(&client, &node, true, Duration::from_secs(30)).await;
    wait_logged(
        &node,
        "kubelet registered the DRA plugin",
        Duration::from_secs(30),
    );
    // Every answer to the agent now takes 5 s: its read of the claim too.
    proxy.toxic("kube-apiserver", "latency", &["latency=5000"], 1.0, false);
    create_claim(&client, "killed").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &claim_pod("killed", "killed"))
        .await
        .unwrap();
    wait_logged(&node, "preparing ResourceClaim", Duration::from_secs(60));
    // SIGKILL while the claim is being read: nothing written yet.
    drop(agent_1);
    assert!(
        checkpointed(&node).is_empty(),
        "killed before the checkpoint"
    );
    let _agent_2 = agent(&plane, &node, FIXTURE, &[]);
    wait_phase(&pods, &node, "killed", "Running").await;
    let out = printed(&node, "killed", "nvidiactl").await;
    assert!(out.contains("visible=GPU-"), "{out}");
    assert_eq!(checkpointed(&node), ["default/killed"]);
    assert_eq!(claim_specs(&node).len(), 1, "{:?}", claim_specs(&node));
}

/// Two agents of one node at once, as during a DaemonSet's rolling update
/// with maxSurge (each with its pod UID): kubelet holds both plugins and
/// uses the newer; the older stops and no slice is ever wiped, the claim it
/// prepared is unprepared by the newer, which prepares the next one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_agents_at_once_hand_over_without_losing_slices_or_claims() {
    use futures::StreamExt;
    use kube::runtime::watcher;
    let plane = plane().await;
    let client = plane.client();
    let node = dra_node(&plane, "e2e-surge").await;
    let mut old = agent_inside(&plane, &node, FIXTURE, &["--pod-uid", "aaaaaaaa-0001"]);
    create_class(&client).await;
    wait_slices(&client, &node, true, Duration::from_secs(30)).await;
    run_claim_pod(&client, &node, "by-old", "by-old").await;

    // Every slice deletion from here on.
    let deleted = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let watch = {
        let deleted = deleted.clone();
        let slices: Api<ResourceSlice> = Api::all(client.clone());
        tokio::spawn(async move {
            let mut events = std::pin::pin!(watcher(slices, watcher::Config::default()));
            while let Some(event) = events.next().await {
                if let Ok(watcher::Event::Delete(s)) = event {
                    deleted
                        .lock()
                        .unwrap()
                        .push(s.metadata.name.unwrap_or_default());
                }
            }
        })
    };
    let registrations = || -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(node.kubelet_dir().join("plugins_registry"))
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    };
    let kubelet_connected = |endpoint: &str| {
        std::fs::read_to_string(node.root().join("kubelet.log"))
            .unwrap_or_default()
            .lines()
            .any(|l| {
                l.contains("Connection changed")
                    && l.contains(endpoint)
                    && l.contains("connected=true")
            })
    };

    let _new = agent_inside(&plane, &node, FIXTURE, &["--pod-uid", "bbbbbbbb-0002"]);
    eventually(
        "kubelet connected to both plugins",
        Duration::from_secs(30),
        || {
            let both =
                kubelet_connected("dra-aaaaaaaa.sock") && kubelet_connected("dra-bbbbbbbb.sock");
            async move { both }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(&node)));
    assert_eq!(
        registrations(),
        [
            "gpu.deckhouse.io-aaaaaaaa-reg.sock",
            "gpu.deckhouse.io-bbbbbbbb-reg.sock"
        ]
    );
    let status = std::process::Command::new("kill")
        .args(["-TERM", &old.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    switchyard_testkit::wait_for("the old agent to exit", Duration::from_secs(20), || {
        old.0.try_wait().ok().flatten()
    })
    .unwrap();
    assert_eq!(registrations(), ["gpu.deckhouse.io-bbbbbbbb-reg.sock"]);

    // kubelet wipes a driver's slices 30 s after its last plugin is gone:
    // with the newer one registered, never.
    let wiped = eventually("a slice deleted", Duration::from_secs(40), || {
        let any = !deleted.lock().unwrap().is_empty();
        async move { any }
    })
    .await;
    assert!(
        wiped.is_err(),
        "slices deleted: {:?}",
        deleted.lock().unwrap()
    );
    watch.abort();

    // The old one's claim unprepared through the new one; the next claim
    // prepared by it.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.delete("by-old", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "the old agent's claim unprepared",
        Duration::from_secs(60),
        || {
            let gone = checkpointed(&node).is_empty();
            async move { gone }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(&node)));
    run_claim_pod(&client, &node, "by-new", "by-new").await;
    assert_eq!(checkpointed(&node), ["default/by-new"]);
}

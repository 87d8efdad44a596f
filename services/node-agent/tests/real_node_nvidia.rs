//! NVIDIA's device plugin v0.17.4 (the image
//! `scripts/install-nvidia-device-plugin.sh` builds) as a DaemonSet pod on a
//! real kubelet with containerd (the test kit's `RealNode`), over the mock
//! NVML: switchyard-nvml-mock's `libnvidia-ml.so.1` mounted into the
//! plugin's container where its loader finds it, the fixture and the fault
//! file beside it. No Switchyard service runs: this is the stack Switchyard
//! hands nodes to and from, on the same mock the node agent reads.
//!
//! The plugin advertises the fixture's cards, kubelet allocates them through
//! it (a request of more than one card goes through its
//! GetPreferredAllocation, which reads the mock's topology and NVLinks), and
//! a critical XID written to the fault file reaches its health check, which
//! takes the card out of the Node's allocatable.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use switchyard_gpu::Machine;
use switchyard_nvml_mock::machine::MockMachine;
use switchyard_testkit::eventually;
use switchyard_testkit::node::{BUSYBOX_IMAGE, NodeOptions, RealNode};
use switchyard_testkit::nvidia::{DevicePlugin, PLUGIN_CONTAINER, PLUGIN_LABEL, PLUGIN_NAMESPACE};

mod support;

use support::*;

const FIXTURE: &str = "deploy/fixtures/h100-8x.yaml";
const NODE: &str = "nvidia-dp-1";
const RESOURCE: &str = "nvidia.com/gpu";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The plugin's pod: its status and what its container printed, for a
/// failure's message.
async fn plugin_report(client: &kube::Client, node: &RealNode) -> String {
    let pods: Api<Pod> = Api::namespaced(client.clone(), PLUGIN_NAMESPACE);
    let (key, value) = PLUGIN_LABEL;
    let listed = pods
        .list(&ListParams::default().labels(&format!("{key}={value}")))
        .await;
    let Some(pod) = listed.ok().and_then(|l| l.items.into_iter().next()) else {
        return format!("no plugin pod\n{}", logs(node));
    };
    let name = pod.metadata.name.clone().unwrap_or_default();
    let log = node
        .container_log(PLUGIN_NAMESPACE, &name, PLUGIN_CONTAINER)
        .unwrap_or_else(|| "(no log yet)".into());
    format!(
        "--- plugin pod {name}: {:?}\n{}--- {PLUGIN_CONTAINER}'s log\n{log}\n{}",
        pod.status,
        earlier_logs(node, &name),
        logs(node)
    )
}

/// The logs of the plugin container's instances before the current one, as
/// kubelet keeps them (`0.log`, `1.log`, ...): where a crash, such as a
/// missing NVML symbol, shows.
fn earlier_logs(node: &RealNode, pod: &str) -> String {
    let prefix = format!("{PLUGIN_NAMESPACE}_{pod}_");
    let Some(dir) = std::fs::read_dir(node.path("/var/log/pods"))
        .into_iter()
        .flatten()
        .flatten()
        .find(|e| e.file_name().to_string_lossy().starts_with(&prefix))
    else {
        return String::new();
    };
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir.path().join(PLUGIN_CONTAINER))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect();
    files.sort_by_key(|f| {
        f.file_stem()
            .and_then(|s| s.to_str()?.parse::<u32>().ok())
            .unwrap_or(u32::MAX)
    });
    files.pop();
    files
        .iter()
        .map(|f| {
            let text = std::fs::read_to_string(f).unwrap_or_default();
            format!("--- earlier instance: {}\n{text}", f.display())
        })
        .collect()
}

/// How often the plugin's container has restarted (a missing NVML symbol
/// kills it).
async fn plugin_restarts(client: &kube::Client) -> i32 {
    let pods: Api<Pod> = Api::namespaced(client.clone(), PLUGIN_NAMESPACE);
    let (key, value) = PLUGIN_LABEL;
    pods.list(&ListParams::default().labels(&format!("{key}={value}")))
        .await
        .unwrap()
        .items
        .iter()
        .flat_map(|p| {
            p.status
                .iter()
                .flat_map(|s| s.container_statuses.iter().flatten())
        })
        .map(|c| c.restart_count)
        .sum()
}

/// Waits until the Node advertises (capacity, allocatable) of the plugin's
/// resource; panics with the plugin's report.
async fn wait_advertised(
    client: &kube::Client,
    node: &RealNode,
    expected: (i64, i64),
    within: Duration,
) {
    let nodes: Api<Node> = Api::all(client.clone());
    let what = format!(
        "{RESOURCE} capacity {} allocatable {}",
        expected.0, expected.1
    );
    let seen =
        eventually(&what, within, || {
            let nodes = nodes.clone();
            async move {
                advertised(&nodes, NODE, RESOURCE).await == (Some(expected.0), Some(expected.1))
            }
        })
        .await;
    if let Err(e) = seen {
        let now = advertised(&nodes, NODE, RESOURCE).await;
        panic!("{e}; now {now:?}\n{}", plugin_report(client, node).await);
    }
}

/// A pod in `default` asking `gpus` of the plugin's resource that prints
/// NVIDIA_VISIBLE_DEVICES, then `printed`, then sleeps.
fn gpu_pod(name: &str, gpus: u32) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "hostNetwork": true,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": BUSYBOX_IMAGE,
                "command": ["sh", "-c", "echo visible=$NVIDIA_VISIBLE_DEVICES; echo printed; sleep 3600"],
                "resources": {"limits": {RESOURCE: gpus.to_string()}}
            }]
        }
    }))
    .unwrap()
}

/// Runs a pod of `gpus` cards and returns the fixture's indices of the cards
/// it was given.
async fn run_gpu_pod(
    client: &kube::Client,
    node: &RealNode,
    machine: &Machine,
    name: &str,
    gpus: u32,
) -> Vec<u32> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(&PostParams::default(), &gpu_pod(name, gpus))
        .await
        .unwrap();
    let running = eventually(
        &format!("pod {name} Running"),
        Duration::from_secs(60),
        || {
            let pods = pods.clone();
            async move {
                pods.get(name)
                    .await
                    .is_ok_and(|p| p.status.and_then(|s| s.phase).as_deref() == Some("Running"))
            }
        },
    )
    .await;
    if let Err(e) = running {
        let status = pods.get(name).await.map(|p| format!("{:?}", p.status));
        panic!("{e}: {status:?}\n{}", plugin_report(client, node).await);
    }
    let out = printed(node, name, "printed").await;
    let visible = out
        .lines()
        .find_map(|l| l.strip_prefix("visible="))
        .unwrap_or_else(|| panic!("{name} printed no NVIDIA_VISIBLE_DEVICES: {out:?}"));
    let cards: Vec<u32> = visible
        .split(',')
        .map(|uuid| {
            machine
                .gpus
                .iter()
                .find(|g| g.uuid == uuid)
                .unwrap_or_else(|| panic!("{name} was given {uuid:?}, no card of {FIXTURE}: {out}"))
                .index
        })
        .collect();
    assert_eq!(
        cards.len(),
        gpus as usize,
        "{name} asked for {gpus}: {visible}"
    );
    cards
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nvidia_device_plugin_on_the_mock_nvml_advertises_allocates_and_drops_a_failed_card() {
    let machine = switchyard_gpu::source(&format!("fixture:{}", repo().join(FIXTURE).display()))
        .unwrap()
        .machine()
        .unwrap();
    // Declared before the node, so that its files outlive the node's pods.
    let mock;
    let plane = plane().await;
    let client = plane.client();
    let node = RealNode::start_with(&plane, NODE, NodeOptions::default()).await;
    let library = std::env::current_exe()
        .unwrap()
        .with_file_name("libswitchyard_nvml_mock.so");
    mock = DevicePlugin::start(&client, &node, &library, &repo().join(FIXTURE)).await;

    // The plugin finds the fixture's eight cards through the mock and
    // registers them with kubelet.
    wait_advertised(&client, &node, (8, 8), Duration::from_secs(120)).await;

    // One card: Allocate puts its UUID in the container's environment.
    let one = run_gpu_pod(&client, &node, &machine, "one-gpu", 1).await;
    // Two cards: kubelet asks the plugin's GetPreferredAllocation, which
    // reads the topology of every pair of cards and their NVLinks through
    // the mock; its best-effort policy prefers two cards behind one CPU
    // (NVML_TOPOLOGY_NODE, by the mock's `Pci::host_bridges`).
    let two = run_gpu_pod(&client, &node, &machine, "two-gpus", 2).await;
    let given: BTreeSet<u32> = one.iter().chain(&two).copied().collect();
    assert_eq!(given.len(), 3, "no card given twice: {one:?} {two:?}");
    let mocked = MockMachine::from_fixture(&machine).unwrap();
    let cpu = |index: u32| mocked.cards[index as usize].pci.host_bridges();
    assert_eq!(
        cpu(two[0]),
        cpu(two[1]),
        "the preferred allocation keeps two cards behind one CPU: {two:?}"
    );
    assert_eq!(
        plugin_restarts(&client).await,
        0,
        "the plugin ran throughout\n{}",
        plugin_report(&client, &node).await
    );

    // A critical XID on a card no pod holds: the plugin's health check marks
    // it Unhealthy, kubelet takes it out of allocatable, capacity stays.
    let free = machine
        .gpus
        .iter()
        .find(|g| !given.contains(&g.index))
        .expect("a free card");
    mock.inject(&format!("xid {} 79", free.uuid));
    wait_advertised(&client, &node, (8, 7), Duration::from_secs(60)).await;
    let report = plugin_report(&client, &node).await;
    assert!(
        report.contains(&format!("Xid=79 on Device={}", free.uuid)),
        "the plugin names the card: {report}"
    );
}

//! The nvidia-operator backend on real nodes: etcd, kube-apiserver,
//! kube-scheduler and kube-controller-manager (its DaemonSet controller),
//! two nodes running kubelet with containerd and runc (the test kit's
//! `RealNode`), JetStream, inventory and the stack-assigner as processes
//! with `--backend nvidia-operator`. NVIDIA's own programs run on the nodes
//! over the mock NVML: the device plugin v0.17.4 as the GPU Operator's
//! DaemonSet (selecting `nvidia.com/gpu.deploy.device-plugin=true`), whose
//! cards kubelet's device manager advertises and allocates, and GPU Feature
//! Discovery, whose labels the stack-assigner compares the DRA driver's
//! slices with. Test-side stand-ins play what is not served here: NFD's
//! master (GFD's `features.d` file onto the Node), the operator's labeller
//! (`nvidia.com/gpu.present`, and missing deploy labels become `true`) and
//! NVIDIA's DRA kubelet plugin (a busybox pod of a real DaemonSet, and a
//! `gpu.nvidia.com` ResourceSlice of the fixture's cards while it runs).

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use switchyard_gpu::{GpuSource, Machine};
use switchyard_proto::v1::domain_event::Kind;
use switchyard_testkit::kube::{Components, create_namespace};
use switchyard_testkit::node::{BUSYBOX_IMAGE, GPU_DEVICE_NODES, NodeOptions, RealNode};
use switchyard_testkit::nvidia::{
    DevicePlugin, FeatureDiscovery, GFD_CONTAINER, GFD_LABEL, GFD_NAMESPACE, OPERATOR_PLUGIN_LABEL,
    PLUGIN_CONTAINER, PluginDaemonSet,
};

use support::*;

const POOL: &str = "gpu-scheduling.platform.example.com/pool";
const MODE: &str = "gpu-scheduling.platform.example.com/mode";
const DP: &str = "nvidia.com/gpu.deploy.device-plugin";
const VALIDATOR: &str = "nvidia.com/gpu.deploy.operator-validator";
const PLUGIN: &str = "nvidia.com/dra-kubelet-plugin";
const PRESENT: &str = "nvidia.com/gpu.present";
const GPU: &str = "nvidia.com/gpu";
const OPERATOR: &str = switchyard_testkit::nvidia::OPERATOR_NAMESPACE;
const DRA: &str = "nvidia-dra-driver-gpu";
const KUBELET_PLUGIN_POD: (&str, &str) = ("dra-driver-nvidia-gpu-component", "kubelet-plugin");
const NODES: [&str; 2] = ["gpu-1", "gpu-2"];
/// How long the platform may take to answer (real pods on two kubelets
/// beside other tests on two cores).
const PLATFORM_WAIT: Duration = Duration::from_secs(120);

/// The backend's flags, as the chart sets them.
const BACKEND_ENV: [(&str, &str); 2] = [
    ("SWITCHYARD_BACKEND", "nvidia-operator"),
    (
        "SWITCHYARD_NVIDIA_POOLS",
        "legacy=device-plugin,dra-pilot=dra",
    ),
];

fn selector((key, value): (&str, &str)) -> String {
    format!("{key}={value}")
}

/// Running pods of `namespace` labelled `label`, by node.
async fn running(c: &Client, namespace: &str, label: &str) -> BTreeMap<String, Pod> {
    Api::<Pod>::namespaced(c.clone(), namespace)
        .list(&ListParams::default().labels(label))
        .await
        .map(|list| {
            list.items
                .into_iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .filter_map(|p| Some((p.spec.as_ref()?.node_name.clone()?, p)))
                .collect()
        })
        .unwrap_or_default()
}

/// The Node's `nvidia.com/gpu` (capacity, allocatable), 0 where absent.
fn gpus(node: &Node) -> (i64, i64) {
    let of =
        |m: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>| {
            m.and_then(|m| m.get(GPU))
                .and_then(|q| q.0.parse().ok())
                .unwrap_or(0)
        };
    let status = node.status.as_ref();
    (
        of(status.and_then(|s| s.capacity.as_ref())),
        of(status.and_then(|s| s.allocatable.as_ref())),
    )
}

/// The DRA kubelet plugin's slice of a node: the fixture's cards, as
/// NVIDIA's DRA driver names their attributes.
fn dra_slice(node: &str, machine: &Machine) -> ResourceSlice {
    let devices: Vec<serde_json::Value> = machine
        .gpus
        .iter()
        .map(|gpu| {
            json!({
                "name": format!("gpu-{}", gpu.index),
                "attributes": {
                    "type": {"string": "gpu"},
                    "uuid": {"string": gpu.uuid},
                    "productName": {"string": gpu.product_name},
                    "architecture": {"string": gpu.architecture},
                },
                "capacity": {"memory": {"value": format!("{}Mi", gpu.memory_mib)}},
            })
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": format!("{node}-gpu.nvidia.com")},
        "spec": {
            "driver": "gpu.nvidia.com",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }))
    .expect("slice")
}

/// The platform around Switchyard that is not served here, once:
/// - NFD's master: GFD's labels, as written on each node, onto its Node;
/// - the operator's labeller: a GPU node gets `nvidia.com/gpu.present=true`
///   (the operator reads NFD's PCI label for that; the test knows its GPU
///   nodes) and its missing or empty deploy labels `true`;
/// - NVIDIA's DRA kubelet plugin: its node's slice while its pod runs.
async fn play_platform(c: &Client, gfd: &[FeatureDiscovery], machine: &Machine) {
    let nodes: Api<Node> = Api::all(c.clone());
    let slices: Api<ResourceSlice> = Api::all(c.clone());
    let kubelet_plugins = running(c, DRA, &selector(KUBELET_PLUGIN_POD)).await;
    for discovery in gfd {
        let name = discovery.node();
        let Ok(node) = nodes.get(name).await else {
            continue;
        };
        let labels = node.labels();
        let mut patch: BTreeMap<String, String> = discovery
            .labels()
            .unwrap_or_default()
            .into_iter()
            .filter(|(k, v)| labels.get(k) != Some(v))
            .collect();
        for key in [PRESENT, DP, VALIDATOR] {
            if labels.get(key).is_none_or(String::is_empty) {
                patch.insert(key.into(), "true".into());
            }
        }
        if !patch.is_empty() {
            let _ = nodes
                .patch(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"labels": patch}})),
                )
                .await;
        }
        let slice = format!("{name}-gpu.nvidia.com");
        let published = slices.get_opt(&slice).await.ok().flatten().is_some();
        match (kubelet_plugins.contains_key(name), published) {
            (true, false) => {
                let _ = slices
                    .create(&PostParams::default(), &dra_slice(name, machine))
                    .await;
            }
            (false, true) => {
                let _ = slices.delete(&slice, &DeleteParams::default()).await;
            }
            _ => {}
        }
    }
}

/// [`play_platform`] on every change of what it reads, and every second
/// for GFD's files (as NFD's worker reads `features.d` again).
fn spawn_platform(
    c: &Client,
    gfd: Vec<FeatureDiscovery>,
    machine: Machine,
) -> tokio::task::JoinHandle<()> {
    let c = c.clone();
    tokio::spawn(async move {
        use kube::runtime::{WatchStreamExt, watcher};
        let config = watcher::Config::default;
        let rescan = futures::stream::unfold(
            tokio::time::interval(Duration::from_secs(1)),
            |mut every| async move {
                every.tick().await;
                Some(((), every))
            },
        );
        let mut changes = futures::stream::select_all([
            watcher(Api::<Pod>::all(c.clone()), config())
                .default_backoff()
                .map(|_| ())
                .boxed(),
            watcher(Api::<Node>::all(c.clone()), config())
                .default_backoff()
                .map(|_| ())
                .boxed(),
            watcher(Api::<ResourceSlice>::all(c.clone()), config())
                .default_backoff()
                .map(|_| ())
                .boxed(),
            rescan.boxed(),
        ]);
        while changes.next().await.is_some() {
            // What else is already there is read by this one play.
            while let Some(Some(())) = changes.next().now_or_never() {}
            play_platform(&c, &gfd, &machine).await;
        }
    })
}

/// The DRA kubelet plugin's DaemonSet as the guide's chart values select
/// it, its pods a stand-in for NVIDIA's (busybox: NVIDIA's DRA driver is
/// not served here).
async fn kubelet_plugin_daemon_set(c: &Client) {
    let (key, value) = KUBELET_PLUGIN_POD;
    let ds: DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": "dra-driver-nvidia-gpu-kubelet-plugin", "namespace": DRA},
        "spec": {
            "selector": {"matchLabels": {key: value}},
            "template": {
                "metadata": {"labels": {key: value}},
                "spec": {
                    "hostNetwork": true,
                    "terminationGracePeriodSeconds": 1,
                    "nodeSelector": {PLUGIN: "true"},
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{"name": "plugins", "image": BUSYBOX_IMAGE,
                                    "command": ["sleep", "3600"]}],
                },
            },
        },
    }))
    .expect("daemonset");
    Api::<DaemonSet>::namespaced(c.clone(), DRA)
        .create(&PostParams::default(), &ds)
        .await
        .expect("create the kubelet plugin's DaemonSet");
}

/// What a node runs now: (device-plugin pod, kubelet-plugin pod,
/// `nvidia.com/gpu` allocatable, a gpu.nvidia.com slice).
async fn serving(c: &Client, name: &str) -> (bool, bool, i64, bool) {
    let node = Api::<Node>::all(c.clone()).get(name).await.expect("node");
    let slice = Api::<ResourceSlice>::all(c.clone())
        .get_opt(&format!("{name}-gpu.nvidia.com"))
        .await
        .ok()
        .flatten()
        .is_some();
    (
        running(c, OPERATOR, &selector(OPERATOR_PLUGIN_LABEL))
            .await
            .contains_key(name),
        running(c, DRA, &selector(KUBELET_PLUGIN_POD))
            .await
            .contains_key(name),
        gpus(&node).1,
        slice,
    )
}

/// The pods of NVIDIA's programs and of the stand-ins, what their
/// containers printed, and the nodes' kubelet logs: a failure's report.
async fn report(c: &Client, nodes: &[RealNode]) -> String {
    let mut out = String::new();
    for (namespace, label, container) in [
        (OPERATOR, selector(OPERATOR_PLUGIN_LABEL), PLUGIN_CONTAINER),
        (GFD_NAMESPACE, selector(GFD_LABEL), GFD_CONTAINER),
        (DRA, selector(KUBELET_PLUGIN_POD), "plugins"),
    ] {
        let pods = Api::<Pod>::namespaced(c.clone(), namespace)
            .list(&ListParams::default().labels(&label))
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        for pod in pods {
            let on = pod.spec.as_ref().and_then(|s| s.node_name.clone());
            out += &format!(
                "--- pod {namespace}/{} on {on:?}: {:?}\n",
                pod.name_any(),
                pod.status
            );
            if let Some(node) = nodes.iter().find(|n| Some(n.name()) == on.as_deref()) {
                let log = node
                    .container_log(namespace, &pod.name_any(), container)
                    .unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(30).collect();
                for line in tail.into_iter().rev() {
                    out += &format!("    {line}\n");
                }
            }
        }
    }
    for node in nodes {
        out += &format!(
            "--- kubelet of {}\n{}\n",
            node.name(),
            node.log_tail("kubelet")
        );
    }
    out
}

/// Waits until `condition` holds; panics with the platform's report and
/// the services' logs.
async fn until<F, Fut>(world: &World, nodes: &[RealNode], what: &str, condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    if let Err(e) = switchyard_testkit::eventually(what, PLATFORM_WAIT, condition).await {
        panic!(
            "{e}\n{}\n{}",
            report(&world.client, nodes).await,
            world.output()
        );
    }
}

/// The first record's position in `events` that `pred` holds for.
fn first(
    events: &[(String, switchyard_proto::v1::DomainEvent)],
    pred: impl Fn(&Kind) -> bool,
) -> Option<usize> {
    events
        .iter()
        .position(|(_, e)| e.kind.as_ref().is_some_and(&pred))
}

fn label<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.labels().get(key).map(String::as_str)
}

fn pilot_tainted(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| {
            t.iter().any(|t| {
                t.key == MODE && t.value.as_deref() == Some("dra") && t.effect == "NoSchedule"
            })
        })
}

/// The labels GPU Feature Discovery derives from what NVML reports of the
/// fixture's cards (and from their PCI class and configuration space: 3D
/// controllers, no vGPU).
fn gfd_labels_of(machine: &Machine) -> Vec<(&'static str, String)> {
    let card = &machine.gpus[0];
    let major = |version: &str| version.split('.').next().unwrap_or_default().to_string();
    vec![
        (
            "nvidia.com/gpu.product",
            card.product_name.replace(' ', "-"),
        ),
        ("nvidia.com/gpu.count", machine.gpus.len().to_string()),
        ("nvidia.com/gpu.memory", card.memory_mib.to_string()),
        (
            "nvidia.com/gpu.family",
            card.architecture.to_ascii_lowercase(),
        ),
        (
            "nvidia.com/gpu.compute.major",
            major(&card.compute_capability),
        ),
        ("nvidia.com/mig.capable", card.mig_capable.to_string()),
        (
            "nvidia.com/cuda.driver-version.full",
            machine.driver_version.clone(),
        ),
        (
            "nvidia.com/cuda.runtime-version.full",
            machine.cuda_driver_version.clone(),
        ),
        ("nvidia.com/gpu.mode", "compute".to_string()),
        ("nvidia.com/vgpu.present", "false".to_string()),
    ]
}

/// A pod asking for one `nvidia.com/gpu` on gpu-1 of the legacy pool, that
/// prints the cards it was given.
fn legacy_pod() -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "legacy-app", "namespace": "default"},
        "spec": {
            "hostNetwork": true,
            "terminationGracePeriodSeconds": 1,
            "nodeSelector": {POOL: "legacy", "kubernetes.io/hostname": "gpu-1"},
            "containers": [{
                "name": "main",
                "image": BUSYBOX_IMAGE,
                "command": ["sh", "-c", "echo visible=$NVIDIA_VISIBLE_DEVICES; echo printed; sleep 3600"],
                "resources": {"limits": {GPU: "1"}},
            }],
        },
    }))
    .expect("pod")
}

/// Whether NVIDIA's device plugin's socket is in the node's
/// `/var/lib/kubelet/device-plugins` (the plugin removes it when it stops).
fn plugin_socket(node: &RealNode) -> bool {
    node.kubelet_dir()
        .join("device-plugins/nvidia-gpu.sock")
        .exists()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nvidias_device_plugin_and_gfd_on_real_nodes_leave_the_pilot_pool_to_dra() {
    let fixture = Path::new(FIXTURE);
    let machine = switchyard_gpu::Fixture::load(fixture)
        .and_then(|f| f.machine())
        .expect("the fixture");
    let library = std::env::current_exe()
        .expect("the test's path")
        .with_file_name("libswitchyard_nvml_mock.so");
    let mut world = World::start(Components {
        scheduler: true,
        controller_manager: true,
        ..Components::default()
    })
    .await;
    let c = world.client.clone();
    create_namespace(&c, OPERATOR).await;
    create_namespace(&c, DRA).await;
    // NVIDIA's programs' files outlive the nodes' pods; the nodes go (their
    // pods removed) before the world.
    let _device_plugin;
    let mut gfd = Vec::new();
    let mut nodes = Vec::new();
    for name in NODES {
        let node = RealNode::start_with(
            &world.plane,
            name,
            NodeOptions {
                labels: vec![(POOL.into(), "legacy".into())],
                ..NodeOptions::default()
            },
        )
        .await;
        node.make_device_nodes(&GPU_DEVICE_NODES);
        nodes.push(node);
    }
    for node in &nodes {
        gfd.push(FeatureDiscovery::start(&c, node, &library, fixture).await);
    }
    let on: Vec<&RealNode> = nodes.iter().collect();
    _device_plugin =
        DevicePlugin::start_as(&c, &on, &library, fixture, &PluginDaemonSet::gpu_operator()).await;
    kubelet_plugin_daemon_set(&c).await;
    let platform = spawn_platform(&c, gfd.clone(), machine.clone());

    // Before Switchyard: GFD's labels on the Nodes, and NVIDIA's device
    // plugin's cards advertised by kubelet on every node.
    let api: Api<Node> = Api::all(c.clone());
    let expected = gfd_labels_of(&machine);
    until(
        &world,
        &nodes,
        "GFD's labels and the device plugin's cards on every node",
        || async {
            let mut all = true;
            for name in NODES {
                let Ok(node) = api.get(name).await else {
                    return false;
                };
                all &= expected
                    .iter()
                    .all(|(k, v)| label(&node, k) == Some(v.as_str()))
                    && gpus(&node) == (8, 8)
                    && serving(&c, name).await == (true, false, 8, false);
            }
            all
        },
    )
    .await;
    for discovery in &gfd {
        let written = discovery.labels().expect("GFD's labels");
        let node = api.get(discovery.node()).await.expect("node");
        for (key, value) in &written {
            assert_eq!(
                label(&node, key),
                Some(value.as_str()),
                "{key} as GFD wrote it"
            );
        }
        assert!(
            !written.contains_key(PRESENT)
                && !written
                    .keys()
                    .any(|k| k.starts_with("nvidia.com/gpu.deploy.")),
            "GFD writes neither presence nor deploy labels: {written:?}"
        );
    }
    let gfd_pods = running(&c, GFD_NAMESPACE, &selector(GFD_LABEL)).await;
    assert_eq!(gfd_pods.len(), NODES.len(), "{gfd_pods:?}");

    // A legacy workload: kubelet allocates one of the plugin's cards.
    let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
    pods.create(&PostParams::default(), &legacy_pod())
        .await
        .expect("create the legacy pod");
    let gpu_1 = &nodes[0];
    let mut printed = String::new();
    until(&world, &nodes, "legacy-app running with its card", || {
        printed = gpu_1
            .container_log("default", "legacy-app", "main")
            .unwrap_or_default();
        let done = printed.lines().any(|l| l == "printed");
        async move { done }
    })
    .await;
    let visible = printed
        .lines()
        .find_map(|l| l.strip_prefix("visible="))
        .unwrap_or_default()
        .to_string();
    assert!(
        machine.gpus.iter().any(|g| g.uuid == visible),
        "legacy-app was given {visible:?}, one card of the fixture"
    );
    let legacy = pods.get("legacy-app").await.expect("legacy-app");

    // Switchyard owns both nodes as legacy.
    world.serve_with_env("inventory", &BACKEND_ENV);
    world.serve_with_env("stack-assigner", &BACKEND_ENV);
    world.serve("claim-allocator");
    until(&world, &nodes, "both nodes owned as legacy", || async {
        let mut all = true;
        for name in NODES {
            let node = api.get(name).await.expect("node");
            all &= label(&node, MODE) == Some("legacy") && label(&node, DP) == Some("true");
        }
        all
    })
    .await;

    // The platform team puts gpu-2 into the DRA pilot pool: NVIDIA's device
    // plugin's pod goes, kubelet takes its cards out of allocatable, and
    // the DRA kubelet plugin runs and publishes the node's slice.
    api.patch(
        "gpu-2",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {POOL: "dra-pilot"}}})),
    )
    .await
    .expect("relabel gpu-2");
    until(&world, &nodes, "gpu-2 served by DRA alone", || async {
        serving(&c, "gpu-2").await == (false, true, 0, true)
    })
    .await;
    let node = api.get("gpu-2").await.expect("node");
    for (key, value) in [
        (DP, "false"),
        (VALIDATOR, "false"),
        (PLUGIN, "true"),
        (MODE, "dra"),
    ] {
        assert_eq!(label(&node, key), Some(value), "{key}: {:?}", node.labels());
    }
    assert!(pilot_tainted(&node), "the pilot taint: {:?}", node.spec);
    assert!(
        node.labels()
            .keys()
            .all(|k| !k.starts_with("nvidia.com/gpu.deploy.") || k == DP || k == VALIDATOR)
    );
    // NVIDIA's device plugin stopped on gpu-2: its socket gone from the
    // node, none of its cards allocatable.
    assert!(!plugin_socket(&nodes[1]) && plugin_socket(&nodes[0]));
    assert_eq!(gpus(&node).1, 0, "{:?}", node.status);
    // GFD is never touched: the same pod runs on, its labels stay.
    let gfd_now = running(&c, GFD_NAMESPACE, &selector(GFD_LABEL)).await;
    assert_eq!(
        gfd_now.get("gpu-2").and_then(|p| p.metadata.uid.clone()),
        gfd_pods.get("gpu-2").and_then(|p| p.metadata.uid.clone()),
        "GFD's pod on gpu-2"
    );
    for (key, value) in &expected {
        assert_eq!(label(&node, key), Some(value.as_str()), "{key} on gpu-2");
    }
    // gpu-1 is as it was: its device plugin, its eight cards, its workload.
    assert_eq!(serving(&c, "gpu-1").await, (true, false, 8, false));
    let gpu_1_node = api.get("gpu-1").await.expect("node");
    assert_eq!(label(&gpu_1_node, MODE), Some("legacy"));
    assert!(!pilot_tainted(&gpu_1_node));
    let still = pods.get("legacy-app").await.expect("legacy-app");
    assert_eq!(still.metadata.uid, legacy.metadata.uid);
    assert_eq!(
        still.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Running")
    );

    // The log shows the guide's order: the device plugin's pod gone and its
    // cards out of allocatable before the kubelet plugin's label was written.
    let events = world.events().await;
    let plugin_on = first(&events, |k| matches!(k, Kind::NodeObserved(n) if n.node == "gpu-2" && n.labels.get(PLUGIN).map(String::as_str) == Some("true")))
        .expect("the plugin label recorded");
    let device_plugin_off = first(&events, |k| matches!(k, Kind::NodeObserved(n) if n.node == "gpu-2" && n.labels.get(DP).map(String::as_str) == Some("false")))
        .expect("the device plugin label recorded off");
    let gpus_gone = first(&events, |k| matches!(k, Kind::NodeObserved(n) if n.node == "gpu-2" && n.labels.get(DP).map(String::as_str) == Some("false") && n.gpu_allocatable.is_empty()))
        .expect("the device plugin's cards recorded gone");
    let pod_gone = first(&events, |k| matches!(k, Kind::PodRemoved(p) if p.namespace == OPERATOR && p.name.starts_with("nvidia-device-plugin-daemonset")))
        .expect("the device plugin's pod recorded gone");
    assert!(
        device_plugin_off < gpus_gone && gpus_gone < plugin_on && pod_gone < plugin_on,
        "{device_plugin_off} < {gpus_gone}, {pod_gone} < {plugin_on}"
    );
    platform.abort();
}

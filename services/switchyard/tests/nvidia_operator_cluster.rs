//! The nvidia-operator backend on a real cluster: etcd, kube-apiserver,
//! kube-scheduler and kube-controller-manager (its DaemonSet controller),
//! kwok running the GPU nodes, JetStream, inventory and the stack-assigner
//! as processes with `--backend nvidia-operator`. The GPU Operator's
//! device-plugin DaemonSet and the DRA driver's kubelet-plugin DaemonSet are
//! real DaemonSets with NVIDIA's node selectors and pod labels, so the
//! DaemonSet controller makes their pods come and go as Switchyard
//! relabels; test-side stand-ins play what kwok has no model of: the
//! operator's labeller (missing deploy labels become `true`), kubelet's
//! device manager (`nvidia.com/gpu` allocatable while the device-plugin pod
//! runs) and the DRA kubelet plugin (a `gpu.nvidia.com` ResourceSlice while
//! its pod runs).

mod support;

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use switchyard_proto::v1::domain_event::Kind;
use switchyard_testkit::kube::{Components, create_namespace};
use switchyard_testkit::kwok::{Kwok, kwok_node, node_is_ready};

use support::*;

const POOL: &str = "gpu-scheduling.platform.example.com/pool";
const MODE: &str = "gpu-scheduling.platform.example.com/mode";
const DP: &str = "nvidia.com/gpu.deploy.device-plugin";
const VALIDATOR: &str = "nvidia.com/gpu.deploy.operator-validator";
const PLUGIN: &str = "nvidia.com/dra-kubelet-plugin";
const OPERATOR: &str = "gpu-operator";
const DRA: &str = "nvidia-dra-driver-gpu";
const NODES: [&str; 2] = ["gpu-1", "gpu-2"];

/// The backend's flags, as the chart sets them.
const BACKEND_ENV: [(&str, &str); 2] = [
    ("SWITCHYARD_BACKEND", "nvidia-operator"),
    (
        "SWITCHYARD_NVIDIA_POOLS",
        "legacy=device-plugin,dra-pilot=dra",
    ),
];

/// A DaemonSet that runs `labels`' pods on the nodes labelled `selector`.
async fn daemon_set(
    c: &Client,
    namespace: &str,
    name: &str,
    labels: (&str, &str),
    selector: (&str, &str),
) {
    let ds: DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": {labels.0: labels.1}},
            "template": {
                "metadata": {"labels": {labels.0: labels.1}},
                "spec": {
                    "nodeSelector": {selector.0: selector.1},
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{"name": "main", "image": "nvcr.io/nvidia/example:1"}],
                },
            },
        },
    }))
    .expect("daemonset");
    Api::<DaemonSet>::namespaced(c.clone(), namespace)
        .create(&PostParams::default(), &ds)
        .await
        .unwrap_or_else(|e| panic!("create DaemonSet {namespace}/{name}: {e}"));
}

/// Running pods of `namespace` labelled `label`, by node.
async fn running(c: &Client, namespace: &str, label: &str) -> BTreeMap<String, String> {
    Api::<Pod>::namespaced(c.clone(), namespace)
        .list(&ListParams::default().labels(label))
        .await
        .map(|list| {
            list.items
                .into_iter()
                .filter(|p| p.metadata.deletion_timestamp.is_none())
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .filter_map(|p| Some((p.spec.as_ref()?.node_name.clone()?, p.name_any())))
                .collect()
        })
        .unwrap_or_default()
}

/// The platform around Switchyard that kwok does not play, once: the
/// operator's labeller, kubelet's device manager, the DRA kubelet plugin's
/// ResourceSlice.
async fn play_platform(c: &Client, names: &[&str]) {
    let nodes: Api<Node> = Api::all(c.clone());
    let slices: Api<ResourceSlice> = Api::all(c.clone());
    let device_plugins = running(c, OPERATOR, "app=nvidia-device-plugin-daemonset").await;
    let kubelet_plugins = running(c, DRA, "dra-driver-nvidia-gpu-component=kubelet-plugin").await;
    for &name in names {
        let Ok(node) = nodes.get(name).await else {
            continue;
        };
        let labels = node.labels();
        // The labeller: a missing or empty deploy label becomes true.
        let missing: BTreeMap<&str, &str> = [DP, VALIDATOR]
            .into_iter()
            .filter(|k| labels.get(*k).is_none_or(String::is_empty))
            .map(|k| (k, "true"))
            .collect();
        if !missing.is_empty() {
            let _ = nodes
                .patch(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"labels": missing}})),
                )
                .await;
        }
        // kubelet: the device plugin's GPUs while its pod runs.
        let has = node
            .status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref())
            .is_some_and(|a| a.contains_key("nvidia.com/gpu"));
        let serving = device_plugins.contains_key(name);
        if serving != has {
            let gpus = if serving {
                json!("8")
            } else {
                serde_json::Value::Null
            };
            let _ = nodes
                .patch_status(
                    name,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"status": {
                        "capacity": {"nvidia.com/gpu": gpus},
                        "allocatable": {"nvidia.com/gpu": gpus},
                    }})),
                )
                .await;
        }
        // The DRA kubelet plugin: its node's slice while its pod runs.
        let slice = format!("{name}-gpu.nvidia.com");
        let published = slices.get_opt(&slice).await.ok().flatten().is_some();
        match (kubelet_plugins.contains_key(name), published) {
            (true, false) => {
                let devices: Vec<serde_json::Value> = (0..8)
                    .map(|minor| {
                        json!({
                            "name": format!("gpu-{minor}"),
                            "attributes": {
                                "type": {"string": "gpu"},
                                "uuid": {"string": format!("GPU-{name}-{minor}")},
                                "productName": {"string": "NVIDIA H100 80GB HBM3"},
                                "architecture": {"string": "Hopper"},
                            },
                            "capacity": {"memory": {"value": "81559Mi"}},
                        })
                    })
                    .collect();
                let object: ResourceSlice = serde_json::from_value(json!({
                    "metadata": {"name": slice},
                    "spec": {
                        "driver": "gpu.nvidia.com",
                        "nodeName": name,
                        "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                        "devices": devices,
                    },
                }))
                .expect("slice");
                let _ = slices.create(&PostParams::default(), &object).await;
            }
            (false, true) => {
                let _ = slices.delete(&slice, &DeleteParams::default()).await;
            }
            _ => {}
        }
    }
}

/// GPU nodes as GPU Feature Discovery labels them, in the pool `legacy`.
async fn create_gfd_nodes(c: &Client, names: &[&str]) {
    let api: Api<Node> = Api::all(c.clone());
    for &name in names {
        let node = kwok_node(
            name,
            &[
                ("nvidia.com/gpu.present", "true"),
                ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),
                ("nvidia.com/gpu.count", "8"),
                ("nvidia.com/gpu.memory", "81559"),
                ("nvidia.com/gpu.family", "hopper"),
                ("kubernetes.io/hostname", name),
                (POOL, "legacy"),
            ],
            &[("cpu", "64"), ("memory", "512Gi"), ("pods", "110")],
            Vec::new(),
        );
        api.create(&PostParams::default(), &node)
            .await
            .unwrap_or_else(|e| panic!("create node {name}: {e}"));
    }
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

/// What a node runs now: (device-plugin pod, kubelet-plugin pod,
/// `nvidia.com/gpu` allocatable, a gpu.nvidia.com slice).
async fn serving(c: &Client, name: &str) -> (bool, bool, bool, bool) {
    let node = Api::<Node>::all(c.clone()).get(name).await.expect("node");
    let allocatable = node
        .status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .is_some_and(|a| a.contains_key("nvidia.com/gpu"));
    let slice = Api::<ResourceSlice>::all(c.clone())
        .get_opt(&format!("{name}-gpu.nvidia.com"))
        .await
        .ok()
        .flatten()
        .is_some();
    (
        running(c, OPERATOR, "app=nvidia-device-plugin-daemonset")
            .await
            .contains_key(name),
        running(c, DRA, "dra-driver-nvidia-gpu-component=kubelet-plugin")
            .await
            .contains_key(name),
        allocatable,
        slice,
    )
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

/// The cluster the GPU Operator serves, before Switchyard: the control
/// plane with its scheduler and DaemonSet controller, kwok running the GPU
/// nodes `names` (pool `legacy`), the operator's and the DRA driver's
/// DaemonSets, and the platform stand-ins playing on every change; the
/// device plugin serving every node.
async fn platform(names: &'static [&'static str]) -> (World, Kwok, tokio::task::JoinHandle<()>) {
    let world = World::start(Components {
        scheduler: true,
        controller_manager: true,
        ..Components::default()
    })
    .await;
    let c = world.client.clone();
    let kwok = Kwok::start(&world.plane);
    create_namespace(&c, OPERATOR).await;
    create_namespace(&c, DRA).await;
    create_gfd_nodes(&c, names).await;
    world
        .until("the GPU nodes Ready", || async {
            let nodes = Api::<Node>::all(c.clone())
                .list(&ListParams::default())
                .await;
            nodes.is_ok_and(|l| l.items.iter().filter(|n| node_is_ready(n)).count() == names.len())
        })
        .await;
    // The operator's DaemonSets as the GPU Operator renders them, and the
    // DRA driver's kubelet plugin as the guide's chart values select it.
    daemon_set(
        &c,
        OPERATOR,
        "nvidia-device-plugin-daemonset",
        ("app", "nvidia-device-plugin-daemonset"),
        (DP, "true"),
    )
    .await;
    daemon_set(
        &c,
        OPERATOR,
        "nvidia-operator-validator",
        ("app", "nvidia-operator-validator"),
        (VALIDATOR, "true"),
    )
    .await;
    daemon_set(
        &c,
        DRA,
        "dra-driver-nvidia-gpu-kubelet-plugin",
        ("dra-driver-nvidia-gpu-component", "kubelet-plugin"),
        (PLUGIN, "true"),
    )
    .await;
    // Played again on every change of what it reads (kwok's heartbeats
    // renew the nodes: a write refused once is tried again).
    let platform = {
        let c = c.clone();
        tokio::spawn(async move {
            use futures::StreamExt;
            use kube::runtime::{WatchStreamExt, watcher};
            let config = watcher::Config::default;
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
            ]);
            while changes.next().await.is_some() {
                play_platform(&c, names).await;
            }
        })
    };
    // Before Switchyard: the operator's device plugin on every node.
    world
        .until("the device plugin serving every node", || async {
            let mut all = true;
            for &name in names {
                all &= serving(&c, name).await == (true, false, true, false);
            }
            all
        })
        .await;

    (world, kwok, platform)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guides_pilot_pool_is_switched_over_and_back_by_the_operators_labels() {
    let (mut world, _kwok, platform) = platform(&NODES).await;
    let c = world.client.clone();
    world.serve_with_env("inventory", &BACKEND_ENV);
    world.serve_with_env("stack-assigner", &BACKEND_ENV);
    world.serve("claim-allocator");
    let nodes: Api<Node> = Api::all(c.clone());
    world
        .until("both nodes owned as legacy", || async {
            let mut all = true;
            for name in NODES {
                let node = nodes.get(name).await.expect("node");
                all &= label(&node, MODE) == Some("legacy") && label(&node, DP) == Some("true");
            }
            all
        })
        .await;

    // The platform team puts gpu-2 into the DRA pilot pool.
    nodes
        .patch(
            "gpu-2",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {POOL: "dra-pilot"}}})),
        )
        .await
        .expect("relabel gpu-2");
    world
        .until("gpu-2 served by DRA alone", || async {
            serving(&c, "gpu-2").await == (false, true, false, true)
        })
        .await;
    let node = nodes.get("gpu-2").await.unwrap();
    for (key, value) in [
        (DP, "false"),
        (VALIDATOR, "false"),
        (PLUGIN, "true"),
        (MODE, "dra"),
    ] {
        assert_eq!(label(&node, key), Some(value), "{key}: {:?}", node.labels());
    }
    assert!(pilot_tainted(&node), "the pilot taint: {:?}", node.spec);
    // The driver, toolkit, GFD and DCGM are never touched; gpu-1 is as it was.
    assert!(
        node.labels()
            .keys()
            .all(|k| !k.starts_with("nvidia.com/gpu.deploy.") || k == DP || k == VALIDATOR)
    );
    assert_eq!(serving(&c, "gpu-1").await, (true, false, true, false));

    // The log shows the guide's order: the device plugin's pod gone and its
    // GPUs out of allocatable before the kubelet plugin's label was written.
    let events = world.events().await;
    let plugin_on = first(&events, |k| matches!(k, Kind::NodeObserved(n) if n.node == "gpu-2" && n.labels.get(PLUGIN).map(String::as_str) == Some("true")))
        .expect("the plugin label recorded");
    let device_plugin_off = first(&events, |k| matches!(k, Kind::NodeObserved(n) if n.node == "gpu-2" && n.labels.get(DP).map(String::as_str) == Some("false")))
        .expect("the device plugin label recorded off");
    let gpus_gone = first(&events, |k| matches!(k, Kind::NodeObserved(n) if n.node == "gpu-2" && n.labels.get(DP).map(String::as_str) == Some("false") && n.gpu_allocatable.is_empty()))
        .expect("the device plugin's GPUs recorded gone");
    let pod_gone = first(&events, |k| matches!(k, Kind::PodRemoved(p) if p.namespace == OPERATOR && p.name.starts_with("nvidia-device-plugin-daemonset")))
        .expect("the device plugin's pod recorded gone");
    assert!(
        device_plugin_off < gpus_gone && gpus_gone < plugin_on && pod_gone < plugin_on,
        "{device_plugin_off} < {gpus_gone}, {pod_gone} < {plugin_on}"
    );

    // The guide's failed exclusivity gate: someone puts the device plugin's
    // label back on the DRA node. Switchyard records it, cordons the node,
    // writes the label back; once the device plugin is gone again the node
    // is uncordoned.
    nodes
        .patch(
            "gpu-2",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {DP: "true"}}})),
        )
        .await
        .expect("relabel gpu-2");
    world
        .until("the lost gate recorded and healed", || async {
            let events = world.events().await;
            let lost = first(&events, |k| matches!(k, Kind::ExclusivityLost(e) if e.node == "gpu-2" && e.cordoned_by_switchyard));
            let restored = first(&events, |k| matches!(k, Kind::ExclusivityRestored(e) if e.node == "gpu-2" && e.uncordon));
            let node = nodes.get("gpu-2").await.expect("node");
            lost.is_some()
                && restored.is_some()
                && !node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false)
                && label(&node, DP) == Some("false")
                && serving(&c, "gpu-2").await == (false, true, false, true)
        })
        .await;
    let events = world.events().await;
    let cordoned = first(
        &events,
        |k| matches!(k, Kind::NodeObserved(n) if n.node == "gpu-2" && n.unschedulable),
    );
    assert!(
        cordoned.is_some(),
        "the node was cordoned while the gate failed"
    );

    // The device plugin back however the label reads: its DaemonSet's
    // selector widened by hand to every GPU node. The gate fails and stays
    // failed while the pod runs there; the alerter announces
    // D8GpuDevicePluginOnDraNode with an Event on the Node. The selector put
    // back, the pod goes and the node is uncordoned.
    world.serve_with_env(
        "alerter",
        &[
            ("SWITCHYARD_STATUS_EVERY", "1s"),
            ("SWITCHYARD_ALERTS_FOR", "D8GpuDevicePluginOnDraNode=0s"),
        ],
    );
    let device_plugin = Api::<DaemonSet>::namespaced(c.clone(), OPERATOR);
    let select = |selector: serde_json::Value| {
        let device_plugin = device_plugin.clone();
        async move {
            device_plugin
                .patch(
                    "nvidia-device-plugin-daemonset",
                    &PatchParams::default(),
                    &Patch::Merge(
                        json!({"spec": {"template": {"spec": {"nodeSelector": selector}}}}),
                    ),
                )
                .await
                .expect("patch the device plugin's selector");
        }
    };
    let lost_before = world
        .events()
        .await
        .iter()
        .filter(|(_, e)| matches!(&e.kind, Some(Kind::ExclusivityLost(l)) if l.node == "gpu-2"))
        .count();
    select(json!({DP: null, "nvidia.com/gpu.present": "true"})).await;
    let events_api = Api::<k8s_openapi::api::events::v1::Event>::namespaced(c.clone(), "default");
    world
        .until("the device plugin on gpu-2 caught and alerted", || async {
            let lost = world
                .events()
                .await
                .iter()
                .filter(
                    |(_, e)| matches!(&e.kind, Some(Kind::ExclusivityLost(l)) if l.node == "gpu-2"),
                )
                .count();
            let alerted = events_api
                .list(&ListParams::default())
                .await
                .is_ok_and(|l| {
                    l.items.iter().any(|e| {
                        e.reason.as_deref() == Some("D8GpuDevicePluginOnDraNode")
                            && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("gpu-2")
                    })
                });
            let node = nodes.get("gpu-2").await.expect("node");
            lost > lost_before
                && alerted
                && node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)
        })
        .await;
    select(json!({"nvidia.com/gpu.present": null, DP: "true"})).await;
    world
        .until("gpu-2 on DRA alone again, uncordoned", || async {
            let node = nodes.get("gpu-2").await.expect("node");
            !node
                .spec
                .as_ref()
                .and_then(|s| s.unschedulable)
                .unwrap_or(false)
                && serving(&c, "gpu-2").await == (false, true, false, true)
        })
        .await;

    // The exit evidence on the facts now: gpu-2 on DRA alone, its slice as
    // GPU Feature Discovery labelled the cards; gpu-1 on the device plugin.
    let (code, out, err) = switchyard_testkit::reference::cli_at(
        std::path::Path::new(env!("CARGO_BIN_EXE_switchyard")),
        &world.nats.url(),
        &world.plane.kubeconfig(),
        &["evidence", "--id", "ev-nvidia"],
    );
    assert_eq!(code, 0, "{out}\n{err}\n{}", world.output());
    for line in [
        "evidence of node gpu-1: passed",
        "ok     no dual advertisement: device-plugin stack: 8 device-plugin GPU resources allocatable, no GPU ResourceSlice",
        "evidence of node gpu-2: passed",
        "ok     no dual advertisement: 8 devices in 1 ResourceSlices, no device-plugin resource allocatable",
        "ok     DRA plug-in healthy: the DRA kubelet plugin runs: nvidia-dra-driver-gpu/dra-driver-nvidia-gpu-kubelet-plugin-",
        "ok     slices match GPU Feature Discovery's labels: 8 GPUs published as GPU Feature Discovery labelled them (NVIDIA-H100-80GB-HBM3, 81559 MiB)",
        "evidence ev-nvidia: 2 node(s), 0 workload(s), 0 failed",
    ] {
        assert!(out.contains(line), "{line:?} missing from\n{out}");
    }

    // And back: DRA goes first, then the device plugin, then the taint.
    nodes
        .patch(
            "gpu-2",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {POOL: "legacy"}}})),
        )
        .await
        .expect("relabel gpu-2");
    world
        .until("gpu-2 back on the device plugin, untainted", || async {
            let node = nodes.get("gpu-2").await.expect("node");
            !pilot_tainted(&node) && serving(&c, "gpu-2").await == (true, false, true, false)
        })
        .await;
    let node = nodes.get("gpu-2").await.unwrap();
    for (key, value) in [(DP, "true"), (VALIDATOR, "true"), (MODE, "legacy")] {
        assert_eq!(label(&node, key), Some(value), "{key}: {:?}", node.labels());
    }
    assert_eq!(label(&node, PLUGIN), None);
    // DRA recorded gone before the device plugin's label was written back.
    let events = world.events().await;
    let after = |from: usize, pred: &dyn Fn(&Kind) -> bool| {
        events[from..]
            .iter()
            .position(|(_, e)| e.kind.as_ref().is_some_and(pred))
            .map(|i| from + i)
    };
    let back = after(plugin_on, &|k| {
        matches!(k, Kind::NodeObserved(n) if n.node == "gpu-2" && n.labels.get(POOL).map(String::as_str) == Some("legacy"))
    })
    .expect("the move back recorded");
    let slice_gone = after(
        back,
        &|k| matches!(k, Kind::ResourceSliceRemoved(s) if s.node == "gpu-2"),
    )
    .expect("the slice recorded gone");
    let device_plugin_on = after(back, &|k| {
        matches!(k, Kind::NodeObserved(n) if n.node == "gpu-2" && n.labels.get(DP).map(String::as_str) == Some("true"))
    })
    .expect("the device plugin label recorded on");
    assert!(
        slice_gone < device_plugin_on,
        "{slice_gone} < {device_plugin_on}"
    );

    // The pilot pool by Switchyard's handover: gpu-1 cordoned, drained,
    // its pool label moved, ready on the guide's gates, uncordoned.
    let cli = |args: &[&str]| {
        switchyard_testkit::reference::cli_at(
            std::path::Path::new(env!("CARGO_BIN_EXE_switchyard")),
            &world.nats.url(),
            &world.plane.kubeconfig(),
            args,
        )
    };
    let (code, out, err) = cli(&[
        "handover",
        "--node",
        "gpu-1",
        "--to",
        "dra-pilot",
        "--id",
        "h-pilot",
    ]);
    assert_eq!(code, 0, "{out}\n{err}\n{}", world.output());
    assert!(
        out.contains("handover h-pilot of node gpu-1 started: legacy -> dra-pilot"),
        "{out}"
    );
    world
        .until("the handover of gpu-1 completed", || async {
            let events = world.events().await;
            first(
                &events,
                |k| matches!(k, Kind::HandoverCompleted(h) if h.handover_id == "h-pilot"),
            )
            .is_some()
        })
        .await;
    assert_eq!(serving(&c, "gpu-1").await, (false, true, false, true));
    let events = world.events().await;
    let ready = first(
        &events,
        |k| matches!(k, Kind::NodeReadinessObserved(r) if r.node == "gpu-1"),
    )
    .expect("readiness recorded");
    let Some(Kind::NodeReadinessObserved(r)) = &events[ready].1.kind else {
        unreachable!()
    };
    assert!(r.gpu_stack_dra && r.kubelet_plugin_running && !r.device_plugin_running);
    assert_eq!(
        (
            r.ready_physical_gpus,
            r.expected_physical_gpus,
            r.device_plugin_allocatable
        ),
        (8, 8, 0)
    );
    let moved = first(
        &events,
        |k| matches!(k, Kind::NodeGroupChanged(g) if g.handover_id == "h-pilot"),
    )
    .expect("the pool move recorded");
    let drained = first(
        &events,
        |k| matches!(k, Kind::NodeDrained(g) if g.handover_id == "h-pilot"),
    )
    .expect("the drain recorded");
    assert!(drained < moved && moved < ready);

    // And rolled back in the guide's order (asserted from the log): frozen,
    // the plugin's label removed, its slice gone, the device plugin back,
    // nvidia.com/gpu allocatable again, the pilot taint removed, uncordoned.
    let (code, out, err) = cli(&["rollback", "node", "--node", "gpu-1", "--id", "rb-pilot"]);
    assert_eq!(code, 0, "{out}\n{err}\n{}", world.output());
    world
        .until("the rollback of gpu-1 completed", || async {
            let events = world.events().await;
            first(
                &events,
                |k| matches!(k, Kind::RollbackCompleted(r) if r.rollback_id == "rb-pilot"),
            )
            .is_some()
        })
        .await;
    let events = world.events().await;
    let started = first(
        &events,
        |k| matches!(k, Kind::RollbackStarted(r) if r.rollback_id == "rb-pilot"),
    )
    .expect("the rollback recorded");
    let after = |from: usize, pred: &dyn Fn(&Kind) -> bool| {
        events[from..]
            .iter()
            .position(|(_, e)| e.kind.as_ref().is_some_and(pred))
            .map(|i| from + i)
    };
    let seen = |pred: &dyn Fn(&switchyard_proto::v1::NodeObserved) -> bool| {
        after(
            started,
            &|k| matches!(k, Kind::NodeObserved(n) if n.node == "gpu-1" && pred(n)),
        )
    };
    let lab = |n: &switchyard_proto::v1::NodeObserved, key: &str| n.labels.get(key).cloned();
    let frozen = seen(&|n| n.unschedulable).expect("frozen");
    let plugin_off = seen(&|n| lab(n, PLUGIN).is_none()).expect("the plugin label removed");
    let slice_gone = after(
        started,
        &|k| matches!(k, Kind::ResourceSliceRemoved(s) if s.node == "gpu-1"),
    )
    .expect("the slice gone");
    let device_plugin_on =
        seen(&|n| lab(n, DP).as_deref() == Some("true")).expect("the device plugin on");
    let allocatable = seen(&|n| n.gpu_allocatable.get("nvidia.com/gpu") == Some(&8))
        .expect("nvidia.com/gpu allocatable");
    let untainted =
        seen(&|n| lab(n, DP).as_deref() == Some("true") && !n.taints.iter().any(|t| t.key == MODE))
            .expect("the pilot taint removed");
    let uncordoned = after(
        frozen,
        &|k| matches!(k, Kind::NodeObserved(n) if n.node == "gpu-1" && !n.unschedulable),
    )
    .expect("uncordoned");
    assert!(
        frozen < plugin_off
            && plugin_off < slice_gone
            && slice_gone < device_plugin_on
            && device_plugin_on < allocatable
            && allocatable < untainted
            && untainted < uncordoned,
        "{frozen} {plugin_off} {slice_gone} {device_plugin_on} {allocatable} {untainted} {uncordoned}"
    );
    assert_eq!(serving(&c, "gpu-1").await, (true, false, true, false));
    platform.abort();
}

/// `switchyard <args>` against the world: (exit code, stdout, stderr).
fn cli(world: &World, args: &[&str]) -> (i32, String, String) {
    switchyard_testkit::reference::cli_at(
        std::path::Path::new(env!("CARGO_BIN_EXE_switchyard")),
        &world.nats.url(),
        &world.plane.kubeconfig(),
        args,
    )
}

/// The pods of the Deployment `app` that run, by node.
async fn placed(c: &Client, app: &str) -> BTreeMap<String, Pod> {
    Api::<Pod>::namespaced(c.clone(), "apps")
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .map(|l| {
            l.items
                .into_iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .filter_map(|p| Some((p.spec.as_ref()?.node_name.clone()?, p)))
                .collect()
        })
        .unwrap_or_default()
}

/// The guide's application side on the pilot pool Switchyard handed over:
/// a native claim pilot on a GPUClass compiled for the NVIDIA driver, and
/// the compatibility bridge — one unchanged `nvidia.com/gpu` manifest whose
/// pods run on both pools, from the device plugin on the legacy node and
/// through the driver's own class (its `extendedResourceName`) on the DRA
/// node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_pilot_pool_a_native_claim_and_an_unchanged_manifest_through_the_bridge_run() {
    let (mut world, _kwok, platform) = platform(&NODES).await;
    let c = world.client.clone();
    create_namespace(&c, "apps").await;
    world.serve_with_env("inventory", &BACKEND_ENV);
    world.serve_with_env("stack-assigner", &BACKEND_ENV);
    world.serve("class-compiler");
    world.serve("claim-allocator");
    let nodes: Api<Node> = Api::all(c.clone());
    world
        .until("both nodes owned as legacy", || async {
            let mut all = true;
            for name in NODES {
                let node = nodes.get(name).await.expect("node");
                all &= label(&node, MODE) == Some("legacy");
            }
            all
        })
        .await;
    let (code, out, err) = cli(
        &world,
        &[
            "handover",
            "--node",
            "gpu-2",
            "--to",
            "dra-pilot",
            "--id",
            "h-pilot",
        ],
    );
    assert_eq!(code, 0, "{out}\n{err}\n{}", world.output());
    world
        .until("the pilot pool handed over", || async {
            let events = world.events().await;
            first(
                &events,
                |k| matches!(k, Kind::HandoverCompleted(h) if h.handover_id == "h-pilot"),
            )
            .is_some()
        })
        .await;

    // A platform class over the NVIDIA driver's attributes.
    let class: switchyard_api::GPUClass = serde_json::from_value(json!({
        "apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "GPUClass", "metadata": {"name": "h100"},
        "spec": {"selector": {"matchLabels": {"gpu.nvidia.com/productName": "NVIDIA H100 80GB HBM3"}}},
    }))
    .expect("GPUClass");
    Api::<switchyard_api::GPUClass>::all(c.clone())
        .create(&PostParams::default(), &class)
        .await
        .expect("create the GPUClass");
    let device_classes = Api::<k8s_openapi::api::resource::v1::DeviceClass>::all(c.clone());
    world
        .until("h100's DeviceClass over gpu.nvidia.com", || async {
            device_classes
                .get_opt("h100.gpu.deckhouse.io")
                .await
                .ok()
                .flatten()
                .is_some_and(|d| {
                    serde_json::to_string(&d.spec.selectors)
                        .unwrap()
                        .contains(r#"device.driver == \"gpu.nvidia.com\""#)
                })
        })
        .await;

    // The native claim pilot: a ResourceClaimTemplate on the class, a pod
    // tolerating the pilot taint; the real scheduler allocates one of the
    // driver's devices on the DRA node.
    let template: k8s_openapi::api::resource::v1::ResourceClaimTemplate =
        serde_json::from_value(json!({
            "metadata": {"name": "one-h100", "namespace": "apps"},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": "h100.gpu.deckhouse.io"}}
            ]}}},
        }))
        .expect("template");
    Api::<k8s_openapi::api::resource::v1::ResourceClaimTemplate>::namespaced(c.clone(), "apps")
        .create(&PostParams::default(), &template)
        .await
        .expect("create the template");
    let toleration =
        json!({"key": MODE, "operator": "Equal", "value": "dra", "effect": "NoSchedule"});
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "claim-pilot", "namespace": "apps", "labels": {"app": "claim-pilot"}},
        "spec": {
            "tolerations": [toleration],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-h100"}],
            "containers": [{"name": "main", "image": "registry.example.com/cuda:1",
                            "resources": {"claims": [{"name": "gpu"}]}}],
        },
    }))
    .expect("pod");
    Api::<Pod>::namespaced(c.clone(), "apps")
        .create(&PostParams::default(), &pod)
        .await
        .expect("create the pilot pod");
    world
        .until("the claim pilot running on gpu-2", || async {
            placed(&c, "claim-pilot").await.contains_key("gpu-2")
        })
        .await;
    let claims =
        Api::<k8s_openapi::api::resource::v1::ResourceClaim>::namespaced(c.clone(), "apps")
            .list(&ListParams::default())
            .await
            .expect("claims");
    let allocated: Vec<(String, String)> = claims
        .items
        .iter()
        .flat_map(|claim| {
            claim
                .status
                .iter()
                .flat_map(|s| s.allocation.iter())
                .flat_map(|a| a.devices.iter().flat_map(|d| d.results.iter().flatten()))
                .map(|r| (r.driver.clone(), r.pool.clone()))
        })
        .collect();
    assert_eq!(
        allocated,
        [("gpu.nvidia.com".to_string(), "gpu-2".to_string())]
    );

    // The bridge: the driver's class as its chart renders it on
    // resource.k8s.io/v1, then one unchanged nvidia.com/gpu manifest
    // spread over both pools.
    let bridge: k8s_openapi::api::resource::v1::DeviceClass = serde_json::from_value(json!({
        "metadata": {"name": "gpu.nvidia.com"},
        "spec": {
            "selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}}],
            "extendedResourceName": "nvidia.com/gpu",
        },
    }))
    .expect("DeviceClass");
    device_classes
        .create(&PostParams::default(), &bridge)
        .await
        .expect("create the driver's class");
    let app: k8s_openapi::api::apps::v1::Deployment = serde_json::from_value(json!({
        "metadata": {"name": "legacy-app", "namespace": "apps"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "legacy-app"}},
            "template": {
                "metadata": {"labels": {"app": "legacy-app"}},
                "spec": {
                    "tolerations": [toleration],
                    "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                        {"labelSelector": {"matchLabels": {"app": "legacy-app"}}, "topologyKey": "kubernetes.io/hostname"}
                    ]}},
                    "containers": [{"name": "main", "image": "registry.example.com/app:1",
                                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                },
            },
        },
    }))
    .expect("deployment");
    Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(c.clone(), "apps")
        .create(&PostParams::default(), &app)
        .await
        .expect("create the deployment");
    world
        .until("legacy-app running on both pools", || async {
            placed(&c, "legacy-app").await.len() == 2
        })
        .await;
    let pods = placed(&c, "legacy-app").await;
    let bridged = |node: &str| {
        pods[node]
            .status
            .as_ref()
            .and_then(|s| s.extended_resource_claim_status.as_ref())
            .is_some()
    };
    assert!(
        bridged("gpu-2"),
        "the DRA pool's pod is served through the bridge"
    );
    assert!(
        !bridged("gpu-1"),
        "the legacy pool's pod by the device plugin"
    );

    // The guide's stage table as evidence, recorded in the log.
    let stage = |name: &str| {
        let (code, out, err) = cli(
            &world,
            &["evidence", "--stage", name, "--id", &format!("ev-{name}")],
        );
        (code, format!("{out}{err}"))
    };
    for (name, lines) in [
        (
            "pilot-pool",
            vec![
                "evidence of node gpu-2 (stage pilot-pool): passed",
                "ok     no dual advertisement: 8 devices in 1 ResourceSlices, no device-plugin resource allocatable",
                "ok     DRA plug-in healthy: the DRA kubelet plugin runs",
                "evidence ev-pilot-pool (stage pilot-pool): 1 node(s), 0 workload(s), 0 failed",
            ],
        ),
        (
            "driver-validation",
            vec![
                "ok     slices match GPU Feature Discovery's labels: 8 GPUs published as GPU Feature Discovery labelled them (NVIDIA-H100-80GB-HBM3, 81559 MiB)",
            ],
        ),
        (
            "native-claim-pilot",
            vec![
                "evidence of Pod apps/claim-pilot (stage native-claim-pilot): passed",
                "ok     bound claim, correct node: apps/claim-pilot on gpu-2: apps/claim-pilot-gpu-",
            ],
        ),
        (
            "compatibility-bridge",
            vec![
                "evidence of Deployment apps/legacy-app (stage compatibility-bridge): passed",
                "on gpu-1; DRA through nvidia.com/gpu's class: apps/legacy-app-",
            ],
        ),
    ] {
        let (code, out) = stage(name);
        assert_eq!(code, 0, "{name}: {out}\n{}", world.output());
        for line in lines {
            assert!(out.contains(line), "{name}: {line:?} missing from\n{out}");
        }
    }
    // Not yet at the final cutover: gpu-1 still runs the device plugin and
    // the manifest still asks for nvidia.com/gpu.
    let (code, out) = stage("final-cutover");
    assert_eq!(code, 1, "{out}");
    for line in [
        "evidence of node gpu-1 (stage final-cutover): FAILED",
        "FAILED no device-plugin pods or resources: device-plugin pods: gpu-operator/nvidia-device-plugin-daemonset-",
        "FAILED no legacy workload: it still asks for nvidia.com/gpu (served through the bridge): move it to a GPU class",
    ] {
        assert!(out.contains(line), "{line:?} missing from\n{out}");
    }
    let events = world.events().await;
    assert!(
        first(&events, |k| matches!(k, Kind::EvidenceChecked(c) if c.stage == "compatibility-bridge" && c.failed == 0)).is_some()
    );
    platform.abort();
}

/// A Deployment of `replicas` pods asking for `gpus` nvidia.com/gpu each,
/// bound to the legacy pool as platform teams pin their GPU workloads.
async fn legacy_deployment(c: &Client, name: &str, replicas: i32, gpus: u32) {
    let app: k8s_openapi::api::apps::v1::Deployment = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "apps"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "nodeSelector": {POOL: "legacy"},
                    "containers": [{"name": "main", "image": "registry.example.com/app:1",
                                    "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}}],
                },
            },
        },
    }))
    .expect("deployment");
    Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(c.clone(), "apps")
        .create(&PostParams::default(), &app)
        .await
        .unwrap_or_else(|e| panic!("create {name}: {e}"));
}

const WAVE_NODES: [&str; 3] = ["gpu-1", "gpu-2", "gpu-3"];

/// The guide's application waves with `switchyard plan` and `migrate` on the
/// backend: after the pilot node, the plan predicts each legacy node's
/// devices from the pilot's slice (same GPU Feature Discovery labels), and
/// the migration hands the legacy nodes over and moves the workloads in
/// waves — each moved manifest asking for the class, without its pool
/// binding, tolerating the pilot taint — until the legacy pool is empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_legacy_pool_moves_to_dra_in_application_waves() {
    let (mut world, _kwok, platform) = platform(&WAVE_NODES).await;
    let c = world.client.clone();
    create_namespace(&c, "apps").await;
    world.serve_with_env("inventory", &BACKEND_ENV);
    world.serve_with_env("stack-assigner", &BACKEND_ENV);
    world.serve("class-compiler");
    world.serve("claim-allocator");
    let class: switchyard_api::GPUClass = serde_json::from_value(json!({
        "apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "GPUClass", "metadata": {"name": "h100"},
        "spec": {"selector": {"matchLabels": {"gpu.nvidia.com/productName": "NVIDIA H100 80GB HBM3"}}},
    }))
    .expect("GPUClass");
    Api::<switchyard_api::GPUClass>::all(c.clone())
        .create(&PostParams::default(), &class)
        .await
        .expect("create the GPUClass");
    legacy_deployment(&c, "train", 2, 4).await;
    legacy_deployment(&c, "serve", 1, 2).await;
    world
        .until("the workloads running on the legacy pool", || async {
            !placed(&c, "train").await.is_empty() && !placed(&c, "serve").await.is_empty()
        })
        .await;
    // Switchyard owns the nodes as legacy: it has read the platform.
    let nodes: Api<Node> = Api::all(c.clone());
    world
        .until("every node owned as legacy", || async {
            let mut all = true;
            for name in WAVE_NODES {
                let node = nodes.get(name).await.expect("node");
                all &= label(&node, MODE) == Some("legacy");
            }
            all
        })
        .await;
    // The pilot node first: its slice is what the plan predicts the others by.
    let (code, out, err) = cli(
        &world,
        &[
            "handover",
            "--node",
            "gpu-3",
            "--to",
            "dra-pilot",
            "--id",
            "h-pilot",
        ],
    );
    assert_eq!(code, 0, "{out}\n{err}\n{}", world.output());
    world
        .until("the pilot node handed over", || async {
            let events = world.events().await;
            first(
                &events,
                |k| matches!(k, Kind::HandoverCompleted(h) if h.handover_id == "h-pilot"),
            )
            .is_some()
        })
        .await;

    // The plan, with the chart's backend flags.
    let plan = std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args([
            "plan",
            "--from",
            "legacy",
            "--to",
            "dra-pilot",
            "--class",
            "h100",
            "-o",
            "json",
        ])
        .env("KUBECONFIG", world.plane.kubeconfig())
        .envs(BACKEND_ENV)
        .output()
        .expect("run switchyard plan");
    let text = String::from_utf8_lossy(&plan.stdout);
    assert_eq!(
        plan.status.code(),
        Some(0),
        "{text}\n{}",
        String::from_utf8_lossy(&plan.stderr)
    );
    let planned: serde_json::Value = serde_json::from_str(&text).expect("the plan as JSON");
    assert_eq!(planned["complete"], true, "{text}");
    let waves = planned["waves"].as_array().expect("waves");
    assert!(waves.len() >= 2, "{text}");
    let moved: Vec<&str> = waves
        .iter()
        .flat_map(|w| w["moves"].as_array().into_iter().flatten())
        .filter_map(|m| m["workload"]["name"].as_str())
        .collect();
    assert_eq!(moved.len(), 2, "{text}");

    // A move as a dry run, for a manifest kept in Git: on this backend the
    // binding dropped is the pool label and the pilot taint is tolerated.
    let dry = std::process::Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args([
            "move",
            "--workload",
            "apps/Deployment/train",
            "--class",
            "h100",
            "--dry-run",
            "-o",
            "patch",
        ])
        .env("KUBECONFIG", world.plane.kubeconfig())
        .envs(BACKEND_ENV)
        .output()
        .expect("run switchyard move --dry-run");
    let text = String::from_utf8_lossy(&dry.stdout);
    assert_eq!(
        dry.status.code(),
        Some(0),
        "{text}\n{}",
        String::from_utf8_lossy(&dry.stderr)
    );
    let patch: serde_json::Value = serde_json::from_str(&text).expect("the patch as JSON");
    let pod = &patch["spec"]["template"]["spec"];
    assert_eq!(pod["nodeSelector"][POOL], serde_json::Value::Null, "{text}");
    assert!(
        pod["nodeSelector"]
            .as_object()
            .is_some_and(|s| s.contains_key(POOL)),
        "the pool binding removed: {text}"
    );
    assert!(
        pod["tolerations"].as_array().is_some_and(|t| t
            .iter()
            .any(|t| t["key"] == MODE && t["effect"] == "NoSchedule")),
        "{text}"
    );
    assert!(text.contains("gpu.deckhouse.io/h100"), "{text}");

    // The migration: the claim-allocator drives it from the log.
    let (code, out, err) = cli(
        &world,
        &[
            "migrate",
            "--from",
            "legacy",
            "--to",
            "dra-pilot",
            "--class",
            "h100",
            "--id",
            "mig-1",
        ],
    );
    assert_eq!(code, 0, "{out}\n{err}\n{}", world.output());
    world
        .until("the migration completed", || async {
            let events = world.events().await;
            first(
                &events,
                |k| matches!(k, Kind::MigrationCompleted(m) if m.migration_id == "mig-1"),
            )
            .is_some()
        })
        .await;
    let events = world.events().await;
    let waves_done = events
        .iter()
        .filter(|(_, e)| matches!(&e.kind, Some(Kind::EvidenceChecked(c)) if c.migration_id == "mig-1" && c.failed == 0))
        .count();
    assert!(waves_done >= 2, "{waves_done} waves' evidence passed");
    // Every node on DRA alone; the workloads on the class, tolerating the
    // pilot taint, no longer bound to the legacy pool.
    for name in WAVE_NODES {
        assert_eq!(
            serving(&c, name).await,
            (false, true, false, true),
            "{name}"
        );
    }
    let deployments = Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(c.clone(), "apps");
    for name in ["train", "serve"] {
        let d = deployments.get(name).await.expect("deployment");
        let spec = d.spec.unwrap().template.spec.unwrap();
        let limits = spec.containers[0]
            .resources
            .as_ref()
            .unwrap()
            .limits
            .clone()
            .unwrap();
        assert!(
            limits.contains_key("gpu.deckhouse.io/h100"),
            "{name}: {limits:?}"
        );
        assert!(!limits.contains_key("nvidia.com/gpu"), "{name}: {limits:?}");
        assert!(
            !spec.node_selector.unwrap_or_default().contains_key(POOL),
            "{name}"
        );
        assert!(
            spec.tolerations
                .unwrap_or_default()
                .iter()
                .any(|t| t.key.as_deref() == Some(MODE)),
            "{name}"
        );
    }
    world
        .until("the moved workloads running on DRA", || async {
            let pods = Api::<Pod>::namespaced(c.clone(), "apps")
                .list(&ListParams::default())
                .await
                .map(|l| l.items)
                .unwrap_or_default();
            let running = |app: &str| {
                pods.iter()
                    .filter(|p| p.labels().get("app").map(String::as_str) == Some(app))
                    .filter(|p| p.metadata.deletion_timestamp.is_none())
                    .filter(|p| {
                        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                    })
                    .count()
            };
            running("train") == 2 && running("serve") == 1
        })
        .await;

    // Completion: the legacy pool is empty and nothing asks for
    // nvidia.com/gpu, but the chart-wide device plugin stays for the trial
    // period; after it, the final cutover is checked on what runs now.
    let (code, out, err) = cli(&world, &["complete", "--from", "legacy", "--class", "h100"]);
    assert_ne!(code, 0, "{out}\n{err}");
    assert!(
        out.contains("devicePlugin.enabled") && out.contains("trial period"),
        "{out}\n{err}"
    );
    let (code, out, err) = cli(
        &world,
        &[
            "complete",
            "--from",
            "legacy",
            "--class",
            "h100",
            "--trial-over",
        ],
    );
    assert_eq!(code, 0, "{out}\n{err}\n{}", world.output());
    assert!(
        out.contains("pool legacy retired") && out.contains("devicePlugin.enabled=false"),
        "{out}\n{err}"
    );
    for name in WAVE_NODES {
        let node = nodes.get(name).await.expect("node");
        assert_eq!(
            label(&node, "nvidia.com/gpu.product"),
            Some("NVIDIA-H100-80GB-HBM3"),
            "{name}: GPU Feature Discovery's labels stay"
        );
    }
    platform.abort();
}

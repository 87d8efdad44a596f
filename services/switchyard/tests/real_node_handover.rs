//! A handover on a real node: kubelet with containerd and runc (the test
//! kit's `RealNode`), Switchyard's node agent beside it, the services as
//! processes on JetStream, and the commands a platform engineer types.
//! `switchyard handover` moves the node from the device-plugin stack to DRA
//! while a device-plugin pod runs on it, and `switchyard rollback node`
//! brings it back; polled from the API server all along, the node never
//! advertises both stacks, and each stack's pod sees its card from inside.
//! A rolling update of the agent's DaemonSet (maxSurge) runs the new agent
//! beside the old one and keeps the node's slices and its running claims.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use support::*;
use switchyard_api::GPUClass;
use switchyard_testkit::kube::Components;
use switchyard_testkit::node::{BUSYBOX_IMAGE, NodeOptions, RealNode};
use switchyard_testkit::reference::cli_at;

const NODE: &str = "gpu-real-0";

use switchyard_testkit::node::GPU_DEVICE_NODES as DEVICE_NODES;

fn cli(world: &World, args: &[&str]) -> (i32, String, String) {
    cli_at(
        std::path::Path::new(env!("CARGO_BIN_EXE_switchyard")),
        &world.nats.url(),
        &world.plane.kubeconfig(),
        args,
    )
}

/// (allocatable nvidia.com/gpu, slices published) of the node now.
async fn advertised(client: &Client, node: &str) -> (i64, usize) {
    let gpus = Api::<Node>::all(client.clone())
        .get(node)
        .await
        .ok()
        .and_then(|n| n.status?.allocatable?.get("nvidia.com/gpu").cloned())
        .and_then(|q| q.0.parse().ok())
        .unwrap_or(0);
    let slices = Api::<ResourceSlice>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map(|l| {
            l.items
                .iter()
                .filter(|s| s.spec.node_name.as_deref() == Some(node))
                .count()
        })
        .unwrap_or(0);
    (gpus, slices)
}

/// The container `main` of the first pod of the app `app` on the node: what
/// it printed, once it printed the control device.
async fn printed_by(world: &World, node: &RealNode, app: &str) -> String {
    let pods: Api<Pod> = Api::namespaced(world.client.clone(), "ml");
    let out = std::sync::Mutex::new(String::new());
    let found = switchyard_testkit::eventually(
        &format!("a running pod of {app} printing its card"),
        Duration::from_secs(90),
        || {
            let (pods, out) = (pods.clone(), &out);
            async move {
                let list = pods
                    .list(&ListParams::default().labels(&format!("app={app}")))
                    .await
                    .map(|l| l.items)
                    .unwrap_or_default();
                for pod in list {
                    let running =
                        pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
                    if let (true, Some(log)) =
                        (running, node.container_log("ml", &pod.name_any(), "main"))
                        && log.lines().any(|l| l == "nvidiactl")
                    {
                        *out.lock().unwrap() = log;
                        return true;
                    }
                }
                false
            }
        },
    )
    .await;
    if let Err(e) = found {
        panic!(
            "{e}\n--- kubelet\n{}\n{}",
            node.log_tail("kubelet"),
            world.plane.log_tail("kube-controller-manager")
        );
    }
    out.into_inner().unwrap()
}

/// The project's image, `localhost/switchyard:test`, from the binaries
/// cargo built for this test (`scripts/build-image.sh --no-build`), in a
/// folder of its own: the folder and the docker-archive.
fn project_image() -> (tempfile::TempDir, std::path::PathBuf) {
    let bin = switchyard_testkit::bins::binary("switchyard");
    switchyard_testkit::bins::binary("switchyard-node-agent");
    let out = tempfile::tempdir().expect("image dir");
    let archive = switchyard_testkit::chart::project_image(bin.parent(), out.path());
    (out, archive)
}

/// The node agent's DaemonSet, as the chart renders it for a node agent on
/// a fixture: a rolling update surges (the pod's UID names its sockets),
/// the image's `switchyard-node-agent serve`, root, the
/// kubelet's directory and `/var/run/cdi` from the host, the chart's pod
/// labels (what the handover's readiness selects). The test's API server is
/// on the host's loopback, so the pod is on the host's network and reads a
/// kubeconfig from the host instead of the in-cluster service.
async fn node_agent_daemonset(c: &Client, world: &World) {
    use switchyard_core::names::NODE_AGENT_POD_LABELS;
    switchyard_testkit::kube::create_namespace(c, "switchyard").await;
    let labels: serde_json::Map<String, serde_json::Value> = NODE_AGENT_POD_LABELS
        .iter()
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    let kubeconfig = world.plane.kubeconfig();
    let fixtures = std::path::Path::new(FIXTURE)
        .parent()
        .unwrap()
        .canonicalize()
        .unwrap();
    let ds: k8s_openapi::api::apps::v1::DaemonSet = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "switchyard-node-agent", "namespace": "switchyard"},
        "spec": {
            "selector": {"matchLabels": labels},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "hostNetwork": true,
                    "terminationGracePeriodSeconds": 10,
                    "tolerations": [{"operator": "Exists"}],
                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [{"key": STACK, "operator": "Exists"}]}]}}},
                    "containers": [{
                        "name": "node-agent",
                        "image": "localhost/switchyard:test",
                        "command": ["/usr/local/bin/switchyard-node-agent", "serve"],
                        "securityContext": {"runAsUser": 0, "runAsGroup": 0},
                        "env": [
                            {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                            {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
                            {"name": "SWITCHYARD_GPU_SOURCE", "value": "fixture:/fixtures/h100-8x.yaml"},
                            {"name": "KUBECONFIG", "value": "/kube/config"},
                            {"name": "SWITCHYARD_LOG_FORMAT", "value": "text"}
                        ],
                        "volumeMounts": [
                            {"name": "kubelet", "mountPath": "/var/lib/kubelet"},
                            {"name": "cdi", "mountPath": "/var/run/cdi"},
                            {"name": "fixtures", "mountPath": "/fixtures", "readOnly": true},
                            {"name": "kubeconfig", "mountPath": "/kube/config", "readOnly": true}
                        ]
                    }],
                    "volumes": [
                        {"name": "kubelet", "hostPath": {"path": "/var/lib/kubelet"}},
                        {"name": "cdi", "hostPath": {"path": "/var/run/cdi", "type": "DirectoryOrCreate"}},
                        {"name": "fixtures", "hostPath": {"path": fixtures}},
                        {"name": "kubeconfig", "hostPath": {"path": kubeconfig, "type": "File"}}
                    ]
                }
            }
        }
    }))
    .unwrap();
    Api::<k8s_openapi::api::apps::v1::DaemonSet>::namespaced(c.clone(), "switchyard")
        .create(&PostParams::default(), &ds)
        .await
        .unwrap();
}

fn printing_pod_template(
    app: &str,
    resources: serde_json::Value,
    claims: serde_json::Value,
) -> Deployment {
    serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": app, "namespace": "ml"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": app}},
            "template": {
                "metadata": {"labels": {"app": app}},
                "spec": {
                    "hostNetwork": true,
                    "terminationGracePeriodSeconds": 1,
                    "resourceClaims": claims,
                    "containers": [{
                        "name": "main",
                        "image": BUSYBOX_IMAGE,
                        "command": ["sh", "-c", "echo visible=$NVIDIA_VISIBLE_DEVICES; ls /dev | grep nvidia; sleep 3600"],
                        "resources": resources
                    }]
                }
            }
        }
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handover_and_rollback_on_a_real_node_never_advertise_both_stacks() {
    let mut world = World::start_with(
        Components {
            scheduler: true,
            controller_manager: true,
            ..Components::default()
        },
        switchyard_testkit::bins::binary,
    )
    .await;
    let c = world.client.clone();
    create_group(&c, "gpu", true).await;
    create_group(&c, "gpu-dra", false).await;
    set_module_config(&c, true, None).await;
    let node = RealNode::start_with(
        &world.plane,
        NODE,
        NodeOptions {
            labels: vec![
                (GROUP.into(), "gpu".into()),
                (
                    "node.deckhouse.io/device-gpu.config".into(),
                    "exclusive".into(),
                ),
            ],
            ..NodeOptions::default()
        },
    )
    .await;
    node.make_device_nodes(&DEVICE_NODES);
    // The role label the NodeGroup gives (kubelet may not set it itself).
    Api::<Node>::all(c.clone())
        .patch(
            NODE,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({"metadata": {"labels": {"node-role.kubernetes.io/gpu": ""}}}),
            ),
        )
        .await
        .unwrap();
    let bashible = tokio::spawn(prepare_nodes(c.clone()));
    // The node agent as a DaemonSet pod from the project's image (packed
    // from this test's binaries), as the chart deploys it.
    let (_image, archive) = project_image();
    node.import(&archive);
    node_agent_daemonset(&c, &world).await;
    for service in SERVICES {
        world.serve(service);
    }
    let class: GPUClass = serde_json::from_value(json!({
        "apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "GPUClass", "metadata": {"name": "h100"},
        "spec": {"selector": {"matchLabels": {"gpu.deckhouse.io/device": "h100-80gb-hbm3"}}},
    }))
    .unwrap();
    Api::<GPUClass>::all(c.clone())
        .create(&PostParams::default(), &class)
        .await
        .unwrap();
    let device_classes: Api<DeviceClass> = Api::all(c.clone());
    world
        .until("the DeviceClass of GPU class h100", || async {
            device_classes
                .get_opt("h100.gpu.deckhouse.io")
                .await
                .is_ok_and(|d| d.is_some())
        })
        .await;
    switchyard_testkit::kube::create_namespace(&c, "ml").await;

    // The node serves the device plugin: a pod gets its card.
    world
        .until("the device plugin's 8 cards on the node", || async {
            advertised(&c, NODE).await == (8, 0)
        })
        .await;
    Api::<Deployment>::namespaced(c.clone(), "ml")
        .create(
            &PostParams::default(),
            &printing_pod_template(
                "legacy",
                json!({"limits": {"nvidia.com/gpu": "1"}}),
                json!([]),
            ),
        )
        .await
        .unwrap();
    let legacy = printed_by(&world, &node, "legacy").await;
    assert!(legacy.contains("visible=GPU-"), "{legacy}");

    // Polled from the API server through every switch: never both.
    let both = Arc::new(AtomicBool::new(false));
    let watching = Arc::new(AtomicBool::new(true));
    let poll = {
        let (c, both, watching) = (c.clone(), both.clone(), watching.clone());
        tokio::spawn(async move {
            let mut samples = 0u64;
            while watching.load(Ordering::SeqCst) {
                let (gpus, slices) = advertised(&c, NODE).await;
                if gpus > 0 && slices > 0 {
                    both.store(true, Ordering::SeqCst);
                }
                samples += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            samples
        })
    };

    // The only device-plugin node: `legacy` goes Pending until rolled back
    // (refused without --force, as the pod would have nowhere to go).
    let (code, out, err) = cli(
        &world,
        &[
            "handover", "--node", NODE, "--to", "gpu-dra", "--force", "--wait",
        ],
    );
    assert_eq!(code, 0, "{out}\n{err}\n{}", world.output());
    world
        .until("DRA served: slices, no nvidia.com/gpu", || async {
            let (gpus, slices) = advertised(&c, NODE).await;
            gpus == 0 && slices > 0
        })
        .await;
    // A DRA pod on the class Switchyard compiled gets its card.
    let template = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-h100", "namespace": "ml"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "h100.gpu.deckhouse.io"}}]}}}
    });
    Api::<k8s_openapi::api::resource::v1::ResourceClaimTemplate>::namespaced(c.clone(), "ml")
        .create(
            &PostParams::default(),
            &serde_json::from_value(template).unwrap(),
        )
        .await
        .unwrap();
    Api::<Deployment>::namespaced(c.clone(), "ml")
        .create(
            &PostParams::default(),
            &printing_pod_template(
                "native",
                json!({"claims": [{"name": "gpu"}]}),
                json!([{"name": "gpu", "resourceClaimTemplateName": "one-h100"}]),
            ),
        )
        .await
        .unwrap();
    let native = printed_by(&world, &node, "native").await;
    assert!(native.contains("visible=GPU-"), "{native}");

    // Back to the device plugin: the DRA pod goes first (a rollback waits
    // for the node to be unused), then the node serves nvidia.com/gpu again.
    Api::<Deployment>::namespaced(c.clone(), "ml")
        .delete("native", &Default::default())
        .await
        .unwrap();
    let (code, out, err) = cli(&world, &["rollback", "node", "--node", NODE, "--wait"]);
    assert_eq!(code, 0, "{out}\n{err}\n{}", world.output());
    world
        .until("the device plugin served again", || async {
            advertised(&c, NODE).await == (8, 0)
        })
        .await;
    watching.store(false, Ordering::SeqCst);
    let samples = poll.await.unwrap();
    assert!(samples > 10, "the node was polled ({samples} samples)");
    assert!(
        !both.load(Ordering::SeqCst),
        "the node advertised both stacks at once"
    );
    bashible.abort();
}

/// The node agent's running pods, those being deleted too if `terminating`:
/// (name, UID).
async fn agent_pods_with(c: &Client, terminating: bool) -> Vec<(String, String)> {
    let selector = switchyard_core::names::NODE_AGENT_POD_LABELS
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    Api::<Pod>::namespaced(c.clone(), "switchyard")
        .list(&ListParams::default().labels(&selector))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|p| terminating || p.metadata.deletion_timestamp.is_none())
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .map(|p| (p.name_any(), p.metadata.uid.unwrap_or_default()))
        .collect()
}

/// The DRA registration sockets in the node's plugins_registry.
fn registration_sockets(node: &RealNode) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(node.kubelet_dir().join("plugins_registry"))
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.starts_with("gpu.deckhouse.io-") && n.ends_with("-reg.sock"))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_update_of_the_agent_keeps_the_slices_and_the_running_claims() {
    const NODE: &str = "gpu-real-1";
    let world = World::start_with(
        Components {
            scheduler: true,
            controller_manager: true,
            ..Components::default()
        },
        switchyard_testkit::bins::binary,
    )
    .await;
    let c = world.client.clone();
    let node = RealNode::start_with(
        &world.plane,
        NODE,
        NodeOptions {
            labels: vec![(STACK.into(), "dra".into())],
            ..NodeOptions::default()
        },
    )
    .await;
    node.make_device_nodes(&DEVICE_NODES);
    let (_image, archive) = project_image();
    node.import(&archive);
    node_agent_daemonset(&c, &world).await;
    let class: DeviceClass = serde_json::from_value(json!({
        "metadata": {"name": "gpu.deckhouse.io"},
        "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.deckhouse.io'"}}]},
    }))
    .unwrap();
    Api::<DeviceClass>::all(c.clone())
        .create(&PostParams::default(), &class)
        .await
        .unwrap();
    switchyard_testkit::kube::create_namespace(&c, "ml").await;
    let template = json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "one-gpu", "namespace": "ml"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.deckhouse.io"}}]}}}
    });
    Api::<k8s_openapi::api::resource::v1::ResourceClaimTemplate>::namespaced(c.clone(), "ml")
        .create(
            &PostParams::default(),
            &serde_json::from_value(template).unwrap(),
        )
        .await
        .unwrap();
    let claim_pod = |app: &str| {
        printing_pod_template(
            app,
            json!({"claims": [{"name": "gpu"}]}),
            json!([{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]),
        )
    };
    let deployments = Api::<Deployment>::namespaced(c.clone(), "ml");
    world
        .until("the node's slices published", || async {
            advertised(&c, NODE).await.1 > 0
        })
        .await;
    let old = agent_pods_with(&c, false).await;
    assert_eq!(old.len(), 1, "{old:?}");
    assert_eq!(
        registration_sockets(&node),
        [format!("gpu.deckhouse.io-{}-reg.sock", &old[0].1[..8])],
        "the registration socket carries the pod UID"
    );

    // A claim pod runs through the old agent.
    deployments
        .create(&PostParams::default(), &claim_pod("steady"))
        .await
        .unwrap();
    let printed = printed_by(&world, &node, "steady").await;
    assert!(printed.contains("visible=GPU-"), "{printed}");
    let pods: Api<Pod> = Api::namespaced(c.clone(), "ml");
    let steady = pods
        .list(&ListParams::default().labels("app=steady"))
        .await
        .unwrap()
        .items
        .remove(0);
    let slices: Api<ResourceSlice> = Api::all(c.clone());
    let node_slices = |list: Vec<ResourceSlice>| -> Vec<(String, String)> {
        let mut named: Vec<_> = list
            .into_iter()
            .filter(|s| s.spec.node_name.as_deref() == Some(NODE))
            .map(|s| (s.name_any(), s.metadata.uid.unwrap_or_default()))
            .collect();
        named.sort();
        named
    };
    let before = node_slices(slices.list(&ListParams::default()).await.unwrap().items);

    // Watched from here on: a slice deleted.
    let deleted = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let watch = {
        let (slices, deleted) = (slices.clone(), deleted.clone());
        tokio::spawn(async move {
            use futures::StreamExt;
            use kube::runtime::watcher;
            let mut events = std::pin::pin!(watcher(slices, watcher::Config::default()));
            while let Some(event) = events.next().await {
                if let Ok(watcher::Event::Delete(s)) = event {
                    deleted.lock().unwrap().push(s.name_any());
                }
            }
        })
    };

    // The rollout: a changed pod template.
    Api::<k8s_openapi::api::apps::v1::DaemonSet>::namespaced(c.clone(), "switchyard")
        .patch(
            "switchyard-node-agent",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"template": {"metadata": {
                "annotations": {"switchyard.test/rollout": "1"}}}}})),
        )
        .await
        .unwrap();
    let replaced = switchyard_testkit::eventually(
        "the new agent alone, registered",
        Duration::from_secs(90),
        || async {
            let now = agent_pods_with(&c, false).await;
            now.len() == 1
                && now[0].1 != old[0].1
                && registration_sockets(&node)
                    == [format!("gpu.deckhouse.io-{}-reg.sock", &now[0].1[..8])]
        },
    )
    .await;
    if let Err(e) = replaced {
        let pods = agent_pods_with(&c, true).await;
        let logs: Vec<String> = pods
            .iter()
            .map(|(name, _)| {
                format!(
                    "--- {name}\n{}",
                    node.container_log("switchyard", name, "node-agent")
                        .unwrap_or_default()
                )
            })
            .collect();
        panic!(
            "{e}: pods {pods:?}, sockets {:?}\n{}\n--- kubelet\n{}\n{}",
            registration_sockets(&node),
            logs.join("\n"),
            node.log_tail("kubelet"),
            world.output()
        );
    }
    let new = agent_pods_with(&c, false).await;

    // kubelet wipes a driver's slices 30 s after its last plugin is gone:
    // with the new one registered first, none is ever deleted.
    let wiped = switchyard_testkit::eventually("a slice deleted", Duration::from_secs(40), || {
        let deleted = deleted.clone();
        async move { !deleted.lock().unwrap().is_empty() }
    })
    .await;
    assert!(
        wiped.is_err(),
        "slices deleted during the rollout: {:?}",
        deleted.lock().unwrap()
    );
    watch.abort();
    let after = node_slices(slices.list(&ListParams::default()).await.unwrap().items);
    assert_eq!(after, before, "the same slice objects");
    let steady_now = pods.get(&steady.name_any()).await.unwrap();
    assert_eq!(steady_now.metadata.uid, steady.metadata.uid);
    let status = steady_now.status.unwrap();
    assert_eq!(status.phase.as_deref(), Some("Running"));
    assert_eq!(
        status.container_statuses.unwrap()[0].restart_count,
        0,
        "the claim pod's container kept running"
    );

    // The claim the old agent prepared is unprepared through the new one,
    // and a new claim is prepared by it.
    let checkpoint = node
        .kubelet_dir()
        .join("plugins/gpu.deckhouse.io/checkpoint.json");
    let claims_in = |path: &std::path::Path| -> usize {
        std::fs::read(path)
            .ok()
            .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
            .and_then(|v| v["claims"].as_object().map(|c| c.len()))
            .unwrap_or(0)
    };
    assert_eq!(claims_in(&checkpoint), 1);
    deployments
        .delete("steady", &Default::default())
        .await
        .unwrap();
    world
        .until(
            "the old agent's claim unprepared by the new one",
            || async {
                let specs = std::fs::read_dir(node.cdi_dir())
                    .map(|d| {
                        d.flatten()
                            .filter(|e| {
                                e.file_name()
                                    .to_string_lossy()
                                    .starts_with("gpu.deckhouse.io-")
                                    && !e.file_name().to_string_lossy().contains("device-plugin")
                            })
                            .count()
                    })
                    .unwrap_or(0);
                claims_in(&checkpoint) == 0 && specs == 0
            },
        )
        .await;
    deployments
        .create(&PostParams::default(), &claim_pod("after"))
        .await
        .unwrap();
    let printed = printed_by(&world, &node, "after").await;
    assert!(printed.contains("visible=GPU-"), "{printed}");
    assert_eq!(
        agent_pods_with(&c, false).await,
        new,
        "the same agent throughout"
    );
}

//! A handover on a real node: kubelet with containerd and runc (the test
//! kit's `RealNode`), Switchyard's node agent beside it, the services as
//! processes on JetStream, and the commands a platform engineer types.
//! `switchyard handover` moves the node from the device-plugin stack to DRA
//! while a device-plugin pod runs on it, and `switchyard rollback node`
//! brings it back; polled from the API server all along, the node never
//! advertises both stacks, and each stack's pod sees its card from inside.

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
async fn advertised(client: &Client) -> (i64, usize) {
    let gpus = Api::<Node>::all(client.clone())
        .get(NODE)
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
                .filter(|s| s.spec.node_name.as_deref() == Some(NODE))
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
            world.output()
        );
    }
    out.into_inner().unwrap()
}

/// The project's image, `localhost/switchyard:test`, from the binaries
/// cargo built for this test (`scripts/build-image.sh --no-build`).
fn project_image() -> tempfile::TempDir {
    let bin = switchyard_testkit::bins::binary("switchyard-node-agent");
    let bin_dir = bin.parent().expect("the profile's folder");
    let profile = if bin_dir.ends_with("release") {
        "release"
    } else {
        "dev"
    };
    let out = tempfile::tempdir().expect("image dir");
    let built = std::process::Command::new(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/build-image.sh"),
    )
    .args(["--profile", profile, "--no-build", "--tag", "test"])
    .arg("--bin-dir")
    .arg(bin_dir)
    .arg("--out")
    .arg(out.path())
    .output()
    .expect("run build-image.sh");
    assert!(
        built.status.success(),
        "build-image.sh: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    out
}

/// The node agent's DaemonSet, as the chart renders it for a node agent on
/// a fixture: the image's `switchyard-node-agent serve`, root, the
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
    let image = project_image();
    node.import(&image.path().join("switchyard-test.tar"));
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
            advertised(&c).await == (8, 0)
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
                let (gpus, slices) = advertised(&c).await;
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
            let (gpus, slices) = advertised(&c).await;
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
            advertised(&c).await == (8, 0)
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

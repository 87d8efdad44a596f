//! `switchyard-node-agent serve` as a process on a real control plane, with a
//! fake kubelet (device-plugin registration and pod resources over unix
//! sockets): the node's label picks the stack, and relabelling switches it.

use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use switchyard_testkit::kube::{ControlPlane, fake_node};
use switchyard_testkit::{KillOnDrop, eventually};

/// A control plane with Switchyard's CRDs and the node `gpu-1`, assigned DRA.
async fn plane_with_dra_node() -> (ControlPlane, kube::Client, Api<Node>) {
    let plane = ControlPlane::start().await;
    let client = plane.client();
    switchyard_testkit::kube::install_crds(
        &client,
        switchyard_api::crds().into_iter().map(|(_, c)| c).collect(),
    )
    .await;
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(
            &PostParams::default(),
            &fake_node(
                "gpu-1",
                &[("node.deckhouse.io/gpu-stack", "dra")],
                Vec::new(),
            ),
        )
        .await
        .unwrap();
    (plane, client, nodes)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_label_picks_the_stack_and_a_relabel_switches_it() {
    let (plane, client, nodes) = plane_with_dra_node().await;

    let kubelet_dir = tempfile::tempdir().unwrap();
    let kubelet = switchyard_kubelet::fake::Kubelet::default();
    kubelet.serve(kubelet_dir.path()).unwrap();
    let registered = kubelet.registered.clone();
    let metrics = switchyard_testkit::free_port();
    let _agent = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_switchyard-node-agent"))
            .args([
                "serve",
                "--gpu-source",
                "fixture:deploy/fixtures/h100-8x.yaml",
                "--node",
                "gpu-1",
                "--metrics-listen",
                &format!("127.0.0.1:{metrics}"),
                "--kubelet-dir",
            ])
            .arg(kubelet_dir.path())
            .arg("--cdi-dir")
            .arg(kubelet_dir.path().join("cdi"))
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
            .env("KUBECONFIG", plane.kubeconfig())
            .spawn()
            .expect("start the agent"),
    );
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let registration = kubelet_dir
        .path()
        .join("plugins_registry/gpu.deckhouse.io-reg.sock");
    eventually(
        "DRA served: the node's slice published, the plugin registered",
        Duration::from_secs(30),
        || {
            let (slices, registration) = (slices.clone(), registration.clone());
            async move {
                let list = slices
                    .list(&ListParams::default())
                    .await
                    .map(|l| l.items)
                    .unwrap_or_default();
                list.len() == 1
                    && list[0].spec.devices.as_ref().map(Vec::len) == Some(8)
                    && registration.exists()
            }
        },
    )
    .await
    .unwrap();
    assert!(
        registered.lock().unwrap().is_empty(),
        "no device plugin while DRA is served"
    );
    // The stack served, on /metrics.
    let serving = |stack: &'static str| async move {
        let body = switchyard_testkit::scrape(metrics)
            .await
            .unwrap_or_default();
        body.contains(&format!(
            "switchyard_node_agent_stack{{stack=\"{stack}\"}} 1"
        )) && body.matches("switchyard_node_agent_stack{").count() == 1
    };
    eventually("/metrics: DRA served", Duration::from_secs(10), || {
        serving("dra")
    })
    .await
    .unwrap();
    // The cards are reported, Ready, labelled for class selectors.
    let reports: Api<switchyard_api::PhysicalGPU> = Api::all(client.clone());
    let listed = reports.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(listed.len(), 8);
    assert_eq!(
        listed[0].metadata.labels.as_ref().unwrap()["gpu.deckhouse.io/device"],
        "h100-80gb-hbm3"
    );
    assert_eq!(
        listed[0].status.as_ref().unwrap().phase,
        Some(switchyard_api::GpuPhase::Ready)
    );

    nodes
        .patch(
            "gpu-1",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"labels": {"node.deckhouse.io/gpu-stack": "device-plugin"}}}),
            ),
        )
        .await
        .unwrap();
    eventually(
        "the device plugin served, DRA withdrawn",
        Duration::from_secs(30),
        || {
            let (slices, registration, registered) =
                (slices.clone(), registration.clone(), registered.clone());
            async move {
                let none = slices
                    .list(&ListParams::default())
                    .await
                    .map(|l| l.items.is_empty())
                    .unwrap_or(false);
                none && !registration.exists() && *registered.lock().unwrap() == ["nvidia.com/gpu"]
            }
        },
    )
    .await
    .unwrap();
    eventually(
        "/metrics: the device plugin served, DRA no longer",
        Duration::from_secs(10),
        || serving("device-plugin"),
    )
    .await
    .unwrap();
}

/// The agent's Events (events.k8s.io/v1, in `default`) with this reason.
async fn events_with_reason(client: &kube::Client, reason: &str) -> Vec<Event> {
    Api::<Event>::namespaced(client.clone(), "default")
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect()
}

/// Writes the fixture with card `index` marked `healthy` (atomically, as an
/// operator's editor would not, so the agent never reads half a file).
fn write_fixture(path: &std::path::Path, index: u32, healthy: bool) {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/fixtures/h100-8x.yaml"
    ))
    .unwrap();
    let card = format!("- index: {index}\n");
    assert!(text.contains(&card));
    let text = text.replace(&card, &format!("{card}  healthy: {healthy}\n"));
    let partial = path.with_extension("partial");
    std::fs::write(&partial, text).unwrap();
    std::fs::rename(partial, path).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_changes_and_refused_switches_are_recorded_as_events() {
    let (plane, client, nodes) = plane_with_dra_node().await;
    let dir = tempfile::tempdir().unwrap();
    let fixture = dir.path().join("machine.yaml");
    write_fixture(&fixture, 2, true);
    let kubelet_dir = dir.path().join("kubelet");
    let kubelet = switchyard_kubelet::fake::Kubelet::default();
    kubelet.serve(&kubelet_dir).unwrap();
    let metrics = switchyard_testkit::free_port();
    let _agent = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_switchyard-node-agent"))
            .args(["serve", "--node", "gpu-1", "--gpu-source"])
            .arg(format!("fixture:{}", fixture.display()))
            .arg("--kubelet-dir")
            .arg(&kubelet_dir)
            .arg("--cdi-dir")
            .arg(dir.path().join("cdi"))
            .args(["--metrics-listen", &format!("127.0.0.1:{metrics}")])
            .env("KUBECONFIG", plane.kubeconfig())
            .spawn()
            .expect("start the agent"),
    );
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let gpus: Api<switchyard_api::PhysicalGPU> = Api::all(client.clone());
    let uuid = "GPU-4fd41caf-a865-554f-8d72-20a7114d272f";
    // The card's health on the agent's /metrics: 1, 0, or no series.
    let health = || async move {
        let body = switchyard_testkit::scrape(metrics).await.ok()?;
        let cards = body
            .lines()
            .filter(|l| l.starts_with("switchyard_node_agent_gpu_healthy{"))
            .count();
        let line = body.lines().find(|l| {
            l.starts_with(&format!(
                "switchyard_node_agent_gpu_healthy{{uuid=\"{uuid}\",index=\"2\"}} "
            ))
        })?;
        (cards == 8).then(|| line.ends_with(" 1"))
    };
    // The card's device in the node's slice: whether it carries the taint.
    let tainted = || {
        let slices = slices.clone();
        async move {
            let list = slices.list(&ListParams::default()).await.ok()?.items;
            let devices = list.first()?.spec.devices.clone()?;
            let device = devices.iter().find(|d| {
                d.attributes
                    .as_ref()
                    .is_some_and(|a| a.get("uuid").and_then(|v| v.string.as_deref()) == Some(uuid))
            })?;
            Some(device.taints.as_ref().is_some_and(|t| {
                t.iter()
                    .any(|t| t.key == "gpu.deckhouse.io/unhealthy" && t.effect == "NoSchedule")
            }))
        }
    };
    let phase = || {
        let gpus = gpus.clone();
        async move {
            gpus.get("gpu-1-gpu-2")
                .await
                .ok()
                .and_then(|g| g.status)
                .and_then(|s| s.phase)
        }
    };
    eventually(
        "DRA served, the card healthy",
        Duration::from_secs(30),
        || async {
            tainted().await == Some(false)
                && phase().await == Some(switchyard_api::GpuPhase::Ready)
                && health().await == Some(true)
        },
    )
    .await
    .unwrap();

    // The card turns unhealthy in the fixture, as an XID would make it.
    write_fixture(&fixture, 2, false);
    eventually(
        "the card's device tainted, its PhysicalGPU Failed, /metrics 0, a Warning recorded",
        Duration::from_secs(30),
        || async {
            tainted().await == Some(true)
                && phase().await == Some(switchyard_api::GpuPhase::Failed)
                && health().await == Some(false)
                && events_with_reason(&client, "GpuHealthChanged")
                    .await
                    .iter()
                    .any(|e| e.type_.as_deref() == Some("Warning"))
        },
    )
    .await
    .unwrap();
    let recorded = events_with_reason(&client, "GpuHealthChanged").await;
    assert_eq!(recorded.len(), 1, "one card changed: {recorded:?}");
    let regarding = recorded[0].regarding.as_ref().unwrap();
    assert_eq!(regarding.kind.as_deref(), Some("PhysicalGPU"));
    assert_eq!(regarding.name.as_deref(), Some("gpu-1-gpu-2"));
    assert_eq!(
        regarding.uid,
        gpus.get("gpu-1-gpu-2").await.unwrap().metadata.uid,
        "the event names the object's UID, so kubectl describe shows it"
    );
    let note = recorded[0].note.as_deref().unwrap();
    assert!(note.contains(uuid) && note.contains("unhealthy"), "{note}");
    assert_eq!(
        recorded[0].reporting_controller.as_deref(),
        Some("switchyard-node-agent")
    );

    // Healthy again: the taint goes, the phase follows, a Normal event.
    write_fixture(&fixture, 2, true);
    eventually(
        "the taint lifted, Ready, a Normal event",
        Duration::from_secs(30),
        || async {
            tainted().await == Some(false)
                && phase().await == Some(switchyard_api::GpuPhase::Ready)
                && health().await == Some(true)
                && events_with_reason(&client, "GpuHealthChanged")
                    .await
                    .iter()
                    .any(|e| e.type_.as_deref() == Some("Normal"))
        },
    )
    .await
    .unwrap();

    // A pod holds a card through the device plugin: the switch to DRA is
    // refused, and the refusal says what holds the node.
    let relabel = |stack: &'static str, attempt: u32| {
        let nodes = nodes.clone();
        async move {
            nodes
                .patch(
                    "gpu-1",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {
                        "labels": {"node.deckhouse.io/gpu-stack": stack},
                        "annotations": {"test/attempt": attempt.to_string()},
                    }})),
                )
                .await
                .unwrap();
        }
    };
    relabel("device-plugin", 0).await;
    let registered = kubelet.registered.clone();
    eventually("the device plugin served", Duration::from_secs(30), || {
        let registered = registered.clone();
        async move { *registered.lock().unwrap() == ["nvidia.com/gpu"] }
    })
    .await
    .unwrap();
    kubelet
        .pods
        .lock()
        .unwrap()
        .push(switchyard_kubelet::fake::pod_holding(
            "ml/train-0",
            "nvidia.com/gpu",
            &[uuid],
        ));
    relabel("dra", 1).await;
    eventually(
        "HandoverBlocked recorded on the node",
        Duration::from_secs(30),
        || async {
            !events_with_reason(&client, "HandoverBlocked")
                .await
                .is_empty()
        },
    )
    .await
    .unwrap();
    let blocked = &events_with_reason(&client, "HandoverBlocked").await[0];
    assert_eq!(blocked.type_.as_deref(), Some("Warning"));
    let regarding = blocked.regarding.as_ref().unwrap();
    assert_eq!(
        (regarding.kind.as_deref(), regarding.name.as_deref()),
        (Some("Node"), Some("gpu-1"))
    );
    let note = blocked.note.as_deref().unwrap();
    assert!(
        note.contains("ml/train-0") && note.contains(uuid) && note.contains("dra"),
        "{note}"
    );
    assert!(
        slices
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "DRA not served while the device plugin's card is held"
    );

    // The pod is gone: the next look at the node switches.
    kubelet.pods.lock().unwrap().clear();
    relabel("dra", 2).await;
    eventually(
        "DRA served after the release",
        Duration::from_secs(30),
        || async { tainted().await == Some(false) },
    )
    .await
    .unwrap();
}

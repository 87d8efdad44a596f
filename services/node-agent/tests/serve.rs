//! `switchyard-node-agent serve` as a process on a real control plane, with a
//! fake kubelet (device-plugin registration and pod resources over unix
//! sockets): the node's label picks the stack, and relabelling switches it.

use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use switchyard_testkit::kube::{ControlPlane, fake_node};
use switchyard_testkit::{KillOnDrop, eventually};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_label_picks_the_stack_and_a_relabel_switches_it() {
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

    let kubelet_dir = tempfile::tempdir().unwrap();
    let kubelet = switchyard_kubelet::fake::Kubelet::default();
    kubelet.serve(kubelet_dir.path()).unwrap();
    let registered = kubelet.registered.clone();
    let _agent = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_switchyard-node-agent"))
            .args([
                "serve",
                "--gpu-source",
                "fixture:deploy/fixtures/h100-8x.yaml",
                "--node",
                "gpu-1",
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
}

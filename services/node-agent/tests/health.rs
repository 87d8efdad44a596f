//! `switchyard-node-agent serve`, as the chart's DaemonSet runs it, on a real
//! control plane: it serves its node's stack (DRA here: the node's slices on
//! the API server) and reports SERVING on gRPC health once it acts on its
//! node's assignment.

use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, ListParams, PostParams};
use switchyard_testkit::kube::{ControlPlane, fake_node};
use switchyard_testkit::{KillOnDrop, eventually};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemonset_command_serves_the_node_and_reports_health() {
    let plane = ControlPlane::start().await;
    let client = plane.client();
    switchyard_testkit::kube::install_crds(
        &client,
        switchyard_api::crds().into_iter().map(|(_, c)| c).collect(),
    )
    .await;
    Api::<Node>::all(client.clone())
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
    let kubelet = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let _agent = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_switchyard-node-agent"))
            .args([
                "serve",
                "--node-name",
                "gpu-1",
                "--gpu-source",
                "fixture:deploy/fixtures/a100-8x-mig.yaml",
            ])
            .arg("--kubelet-dir")
            .arg(kubelet.path())
            .arg("--cdi-dir")
            .arg(kubelet.path().join("cdi"))
            .args(["--health-listen", &format!("127.0.0.1:{port}")])
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
            .env("KUBECONFIG", plane.kubeconfig())
            .stdout(Stdio::null())
            .spawn()
            .expect("start switchyard-node-agent serve"),
    );
    eventually("SERVING on gRPC health", Duration::from_secs(30), || {
        switchyard_testkit::health::serving(port)
    })
    .await
    .unwrap();
    let slices: Vec<ResourceSlice> = Api::all(client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    assert_eq!(slices.len(), 1);
    assert_eq!(slices[0].spec.node_name.as_deref(), Some("gpu-1"));
    assert_eq!(slices[0].spec.devices.as_ref().unwrap().len(), 20);
    assert!(
        kubelet
            .path()
            .join("plugins_registry/gpu.deckhouse.io-reg.sock")
            .exists()
    );
}

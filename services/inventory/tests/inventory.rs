//! inventory against a real API server and a real JetStream log: every kind
//! it watches becomes facts; a restart re-lists and reports only what changed
//! meanwhile — deletions it missed included — and nothing twice.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::DeviceClass;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use switchyard_api::{PhysicalGPU, crds};
use switchyard_eventlog::nats::{NatsLog, NatsOptions};
use switchyard_eventlog::{Decoded, EventLog, ReadRequest};
use switchyard_inventory::edge::{self as inventory, InventoryOptions};
use switchyard_proto::v1::DomainEvent;
use switchyard_testkit::eventually;
use switchyard_testkit::kube::{ControlPlane, create_namespace, fake_node, install_crds};
use switchyard_testkit::nats::NatsServer;

async fn facts(log: &Arc<dyn EventLog>) -> Vec<DomainEvent> {
    log.read(ReadRequest::default())
        .await
        .unwrap()
        .into_iter()
        .filter_map(|s| match s.decode() {
            Decoded::Event(e) => Some(e),
            Decoded::Unknown { .. } => None,
        })
        .collect()
}

fn described(events: &[DomainEvent]) -> Vec<String> {
    events
        .iter()
        .map(|e| {
            format!(
                "{} {}",
                e.kind.as_ref().unwrap().type_name(),
                switchyard_core::subjects::subject_of(e)
            )
        })
        .collect()
}

async fn wait_for_facts(log: &Arc<dyn EventLog>, want: &[&str]) {
    let result = eventually(
        &format!("facts {want:?}"),
        Duration::from_secs(30),
        || async {
            let have = described(&facts(log).await);
            want.iter().all(|w| have.iter().any(|h| h == w))
        },
    )
    .await;
    if let Err(err) = result {
        panic!("{err}; the log has {:#?}", described(&facts(log).await));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inventory_reports_each_change_once_across_restarts() {
    let plane = ControlPlane::start().await;
    let client = plane.client();
    install_crds(&client, crds().into_iter().map(|(_, c)| c).collect()).await;
    let nats = NatsServer::start();
    let log: Arc<dyn EventLog> = Arc::new(
        NatsLog::connect(
            &nats.url(),
            NatsOptions {
                create: true,
                ..NatsOptions::default()
            },
        )
        .await
        .unwrap(),
    );
    let nodes: Api<Node> = Api::all(client.clone());
    for name in ["n1", "n2"] {
        nodes
            .create(
                &PostParams::default(),
                &fake_node(name, &[("node.deckhouse.io/group", "gpu")], Vec::new()),
            )
            .await
            .unwrap();
    }
    create_namespace(&client, "apps").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "apps");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p1"},
        "spec": {"nodeName": "n1", "containers": [{"name": "main", "image": "registry.example.com/app:1"}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let gpu: PhysicalGPU = serde_json::from_value(json!({
        "apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "PhysicalGPU",
        "metadata": {"name": "n1-gpu-0", "labels": {"gpu.deckhouse.io/device": "a100-sxm4-40gb"}},
        "spec": {"node": "n1", "index": 0, "uuid": "GPU-0a1b2c3d", "product": "NVIDIA A100-SXM4-40GB"},
    }))
    .unwrap();
    Api::<PhysicalGPU>::all(client.clone())
        .create(&PostParams::default(), &gpu)
        .await
        .unwrap();
    let class: DeviceClass = serde_json::from_value(json!({
        "metadata": {"name": "a100.gpu.deckhouse.io"},
        "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.deckhouse.io'"}}]},
    }))
    .unwrap();
    Api::<DeviceClass>::all(client.clone())
        .create(&PostParams::default(), &class)
        .await
        .unwrap();

    let run = || {
        tokio::spawn(inventory::run(
            client.clone(),
            log.clone(),
            InventoryOptions::default(),
            None,
        ))
    };
    let first = run();
    wait_for_facts(
        &log,
        &[
            "NodeObserved node.n1",
            "NodeObserved node.n2",
            "PodObserved pod.apps.p1",
            "PhysicalGpuObserved gpu.n1-gpu-0",
            "DeviceClassObserved deviceclass.a100_gpu_deckhouse_io",
        ],
    )
    .await;
    first.abort();
    let _ = first.await;
    let before = facts(&log).await.len();

    // While inventory is down: a node and a pod go, a node is relabelled.
    nodes.delete("n2", &DeleteParams::default()).await.unwrap();
    pods.delete("p1", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    nodes
        .patch(
            "n1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"node.deckhouse.io/gpu-stack": "dra"}}})),
        )
        .await
        .unwrap();
    let second = run();
    wait_for_facts(&log, &["NodeRemoved node.n2", "PodRemoved pod.apps.p1"]).await;
    // A marker after the re-list: a node created now.
    nodes
        .create(&PostParams::default(), &fake_node("n3", &[], Vec::new()))
        .await
        .unwrap();
    wait_for_facts(&log, &["NodeObserved node.n3"]).await;
    second.abort();
    let after = described(&facts(&log).await[before..]);
    let mut expected = vec![
        "NodeObserved node.n1".to_string(),
        "NodeRemoved node.n2".to_string(),
        "PodRemoved pod.apps.p1".to_string(),
        "NodeObserved node.n3".to_string(),
    ];
    let mut got = after.clone();
    got.sort();
    expected.sort();
    assert_eq!(
        got, expected,
        "after the restart, only the changes: {after:#?}"
    );
}

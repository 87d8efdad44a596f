//! The control-plane harness against the real kube-apiserver and etcd.

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::DeviceClass;
use kube::api::{Api, ObjectMeta, PostParams};
use switchyard_testkit::kube::ControlPlane;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_stores_nodes_and_dra_objects_and_enforces_rbac() {
    let plane = ControlPlane::start().await;
    eprintln!("etcd + kube-apiserver ready in {:?}", plane.startup);
    let client = plane.client();

    // A kubelet-less node, as scheduler_perf makes them.
    let nodes: Api<Node> = Api::all(client.clone());
    let node = Node {
        metadata: ObjectMeta {
            name: Some("gpu-0".into()),
            labels: Some([("node.deckhouse.io/group".to_string(), "gpu".to_string())].into()),
            ..Default::default()
        },
        ..Default::default()
    };
    nodes
        .create(&PostParams::default(), &node)
        .await
        .expect("create node");
    let stored = nodes.get("gpu-0").await.expect("get node");
    assert_eq!(
        stored.metadata.labels.unwrap()["node.deckhouse.io/group"],
        "gpu"
    );

    // resource.k8s.io/v1 is served.
    let classes: Api<DeviceClass> = Api::all(client.clone());
    let class = DeviceClass {
        metadata: ObjectMeta {
            name: Some("a100.gpu.deckhouse.io".into()),
            ..Default::default()
        },
        spec: Default::default(),
    };
    classes
        .create(&PostParams::default(), &class)
        .await
        .expect("create DeviceClass");
    assert_eq!(
        classes.list(&Default::default()).await.unwrap().items.len(),
        1
    );

    // RBAC is on: a user with no bindings is refused.
    let nobody: Api<Node> = Api::all(plane.impersonating("nobody", &["system:authenticated"]));
    let err = nobody
        .list(&Default::default())
        .await
        .expect_err("no rights");
    assert!(err.to_string().contains("forbidden"), "{err}");
}

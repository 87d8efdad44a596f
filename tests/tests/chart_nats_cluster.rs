//! The bundled NATS as a JetStream cluster on real nodes: `helm install` of
//! the trial with `nats.bundled.replicas=3` and `nats.streamReplicas=3` on
//! three nodes, each server's log on a volume of its own node. Every pod is
//! Ready, the three servers route to each other by their names, and
//! `switchyard log init` made the log's stream at R3 with every copy
//! current. A server's pod deleted (its node's copy goes on disk): the
//! services go on, `helm test` passes meanwhile, and the pod comes back and
//! catches up.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams};
use switchyard_eventlog::nats::{NatsLog, NatsOptions};
use switchyard_testkit::chart::{self, ChartCluster, NAMESPACE, NodeSpec, RELEASE};
use switchyard_testkit::{eventually, repo_root, run};

const WAIT: Duration = Duration::from_secs(180);

/// The trial's GPU node and two workers: a NATS server on each.
const NODES: [NodeSpec<'static>; 3] = [
    chart::TRIAL_NODES[0],
    chart::TRIAL_NODES[1],
    NodeSpec {
        name: "worker-2",
        labels: &[],
    },
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bundled_cluster_of_three_holds_the_log_at_r3_and_outlives_a_server() {
    let images = tempfile::tempdir().expect("image dir");
    let binary = switchyard_testkit::bins::binary("switchyard");
    switchyard_testkit::bins::binary("switchyard-node-agent");
    let project = chart::project_image(binary.parent(), images.path());
    let cluster = ChartCluster::start(&project, &NODES).await;
    for node in &NODES {
        cluster.local_volume(node.name, 1000).await;
    }
    let mut values = chart::trial_values(&repo_root().join("deploy/fixtures/h100-8x.yaml"));
    for set in ["nats.bundled.replicas=3", "nats.streamReplicas=3"] {
        values.extend(["--set".to_string(), set.to_string()]);
    }
    let values: Vec<&str> = values.iter().map(String::as_str).collect();
    cluster.install(&values);
    cluster.node_group("gpu", true).await;
    let took = cluster
        .until_ready(WAIT)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("helm install with three NATS servers: every pod Ready after {took:?}");

    let pods: Api<Pod> = Api::namespaced(cluster.plane.client(), NAMESPACE);
    let servers: Vec<String> = (0..3).map(|i| format!("{RELEASE}-nats-{i}")).collect();
    let mut nodes = std::collections::BTreeSet::new();
    for server in &servers {
        let pod = pods.get(server).await.expect("the server's pod");
        nodes.insert(pod.spec.and_then(|s| s.node_name).unwrap_or_default());
    }
    assert_eq!(nodes.len(), 3, "one server per node: {nodes:?}");

    let (mut forward, port) = cluster.port_forward_nats();
    let replicas = stream_copies(port).await;
    assert_eq!(replicas.len(), 3, "the stream's copies: {replicas:?}");
    assert!(
        replicas
            .iter()
            .all(|(name, current)| servers.contains(name) && *current),
        "every copy on a server of the release, current: {replicas:?}"
    );
    let _ = forward.kill();
    let _ = forward.wait();

    // A server's pod deleted: helm test (`switchyard status` in the cluster)
    // passes meanwhile, and the server comes back to a current copy.
    pods.delete(&servers[1], &DeleteParams::default().grace_period(0))
        .await
        .expect("delete a server's pod");
    run(cluster
        .helm()
        .args(["test", RELEASE, "-n", NAMESPACE, "--timeout", "2m"]));
    let back = eventually(
        "the deleted server back and every copy current",
        WAIT,
        || async {
            let ready = cluster.until_ready(Duration::from_secs(1)).await.is_ok();
            if !ready {
                return false;
            }
            let (mut forward, port) = cluster.port_forward_nats();
            let copies = stream_copies(port).await;
            let _ = forward.kill();
            let _ = forward.wait();
            copies.len() == 3 && copies.iter().all(|(_, current)| *current)
        },
    )
    .await;
    assert!(back.is_ok(), "{back:?}");
    cluster.uninstall(&[]).await;
}

/// The log stream's copies as its leader reports them: each server's name
/// and whether its copy is current (the leader's, and each replica's).
async fn stream_copies(port: u16) -> Vec<(String, bool)> {
    let log = NatsLog::connect(&format!("nats://127.0.0.1:{port}"), NatsOptions::default())
        .await
        .expect("open the release's log");
    let info = async_nats::jetstream::new(log.client().clone())
        .get_stream("SWITCHYARD_LOG")
        .await
        .expect("the log's stream")
        .info()
        .await
        .expect("its info")
        .clone();
    let cluster = info.cluster.expect("a clustered stream");
    cluster
        .leader
        .into_iter()
        .map(|leader| (leader, true))
        .chain(cluster.replicas.into_iter().map(|r| (r.name, r.current)))
        .collect()
}

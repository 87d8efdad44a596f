//! The chart on real nodes, installed as docs/getting-started.md's Install
//! says: the project's image and the bundled NATS's image loaded into each
//! node's containerd, `helm install` with the bundled NATS and the node
//! agent over a fixture machine, every pod Running and Ready, `helm test`
//! passing, and `switchyard status` on the host reaching the release's NATS
//! through `kubectl port-forward` as a user would; then bad input named.
//!
//! The nodes are real kubelets with containerd and runc in a cluster network
//! of the test's own (kube-proxy and CoreDNS from their Go modules:
//! `switchyard_testkit::chart`), so the pods use in-cluster config through
//! the `kubernetes` Service and find the NATS server by its Service's name.

use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use switchyard_testkit::chart::{self, ChartCluster, NAMESPACE, RELEASE};
use switchyard_testkit::node::RealNode;
use switchyard_testkit::{repo_root, run};

/// Every pod Running and Ready within this, from `helm install` (the bound
/// the Install section states).
const READY_WITHIN: Duration = Duration::from_secs(180);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_install_on_real_nodes_runs_every_pod_ready_and_helm_test_passes() {
    let images = tempfile::tempdir().expect("image dir");
    let binary = switchyard_testkit::bins::binary("switchyard");
    switchyard_testkit::bins::binary("switchyard-node-agent");
    let project = chart::project_image(binary.parent(), images.path());
    let cluster = ChartCluster::start(&project, &chart::TRIAL_NODES).await;
    let client = cluster.plane.client();
    cluster.local_volume("worker-1", 1000).await;

    let values = chart::trial_values(&repo_root().join("deploy/fixtures/h100-8x.yaml"));
    let values: Vec<&str> = values.iter().map(String::as_str).collect();
    let install = cluster.install(&values);
    // NOTES: how to check it, and how to load the image where pulls fail.
    let notes = String::from_utf8_lossy(&install.stdout);
    for line in [
        "helm test switchyard -n switchyard-system",
        "ctr -n k8s.io images import switchyard-test.tar",
        "port-forward svc/switchyard-nats :4222",
    ] {
        assert!(notes.contains(line), "{line} in\n{notes}");
    }
    // The group's NodeGroup, once the chart's CRDs are in.
    cluster.node_group("gpu", true).await;

    let took = cluster.until_ready(READY_WITHIN).await.unwrap_or_else(|e| {
        let logs = cluster
            .nodes
            .iter()
            .map(|n| n.log_tail("kubelet"))
            .collect::<Vec<_>>()
            .join("\n---\n");
        panic!("{e}\n--- kubelets\n{logs}")
    });
    eprintln!("helm install: every pod Ready after {took:?}");
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    // Each service runs as two pods, one of which holds its Lease (the
    // other stands by), and the leader's term is in the log.
    let leases: Api<Lease> = Api::namespaced(client.clone(), NAMESPACE);
    for service in [
        "inventory",
        "stack-assigner",
        "class-compiler",
        "claim-allocator",
        "alerter",
    ] {
        let names: Vec<String> = pods
            .list(&ListParams::default().labels(&format!("app.kubernetes.io/component={service}")))
            .await
            .unwrap()
            .items
            .iter()
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        assert_eq!(names.len(), 2, "{service}'s pods: {names:?}");
        let lease = format!("{RELEASE}-{service}");
        let holder = std::cell::RefCell::new(None);
        switchyard_testkit::eventually(
            &format!("one of {names:?} to hold {lease}"),
            Duration::from_secs(60),
            || async {
                *holder.borrow_mut() = leases
                    .get_opt(&lease)
                    .await
                    .ok()
                    .flatten()
                    .and_then(|l| l.spec?.holder_identity);
                holder.borrow().as_ref().is_some_and(|h| names.contains(h))
            },
        )
        .await
        .unwrap_or_else(|e| panic!("{e}: held by {:?}", holder.borrow()));
    }
    // The node agent runs on the GPU node only, and serves its cards.
    let agents = pods
        .list(&ListParams::default().labels("app.kubernetes.io/component=node-agent"))
        .await
        .unwrap();
    let on: Vec<_> = agents
        .items
        .iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    assert_eq!(on, ["gpu-1"]);
    let nodes: Api<Node> = Api::all(client.clone());
    switchyard_testkit::eventually("gpu-1's nvidia.com/gpu", Duration::from_secs(60), || {
        let nodes = nodes.clone();
        async move {
            nodes.get("gpu-1").await.ok().is_some_and(|n| {
                n.status
                    .and_then(|s| s.allocatable)
                    .and_then(|a| a.get("nvidia.com/gpu").cloned())
                    .is_some_and(|q| q.0 == "8")
            })
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    // Each pod's processes' memory is there to be read.
    let memory = cluster.pod_processes_memory().await;
    assert!(
        memory.keys().any(|p| p.contains("class-compiler"))
            && memory
                .values()
                .all(|m| m.resident > m.anonymous && m.anonymous > 0),
        "{memory:?}"
    );

    // `helm test`: `switchyard status` from the image, in the cluster.
    run(cluster
        .helm()
        .args(["test", RELEASE, "-n", NAMESPACE, "--timeout", "2m"]));

    // The CLI on the host, through a port-forward.
    let (mut forward, port) = cluster.port_forward_nats();
    let status = Command::new(switchyard_testkit::bins::binary("switchyard"))
        .args(["status", "--nats-url", &format!("nats://127.0.0.1:{port}")])
        .output()
        .expect("switchyard status");
    let _ = forward.kill();
    let _ = forward.wait();
    let printed = String::from_utf8_lossy(&status.stdout);
    assert!(
        status.status.success(),
        "{printed}{}",
        String::from_utf8_lossy(&status.stderr)
    );
    assert!(printed.contains("gpu-1"), "{printed}");
    cluster.uninstall(&[]).await;

    // Bad input: an image no node has, and a NATS server that is not there.
    missing_image_is_named(&cluster).await;
    unreachable_nats_is_named(&cluster).await;
}

/// `helm install` with `sets` and without its post-install hook, which
/// would wait out helm's timeout on a release that cannot start: the pods
/// are what is checked. Its uninstall goes without the pre-delete guard
/// too, which cannot run without the image or read a log it cannot reach.
fn install_broken(cluster: &ChartCluster, sets: &[&str]) {
    let mut command = cluster.helm();
    command
        .args(["install", RELEASE])
        .arg(repo_root().join("deploy/helm/switchyard"))
        .args(["-n", NAMESPACE, "--no-hooks"]);
    for set in sets {
        command.args(["--set", set]);
    }
    run(&mut command);
}

/// With `image.tag=missing` (no node has it, no registry serves it) the
/// pods' Events name the image they cannot pull.
async fn missing_image_is_named(cluster: &ChartCluster) {
    use k8s_openapi::api::core::v1::Event;
    let client = cluster.plane.client();
    install_broken(
        cluster,
        &["nats.url=nats://nats.example:4222", "image.tag=missing"],
    );
    let events: Api<Event> = Api::namespaced(client.clone(), NAMESPACE);
    switchyard_testkit::eventually(
        "an Event naming the missing image",
        Duration::from_secs(60),
        || {
            let events = events.clone();
            async move {
                events.list(&ListParams::default()).await.is_ok_and(|l| {
                    l.items.iter().any(|e| {
                        e.reason.as_deref() == Some("Failed")
                            && e.message
                                .as_deref()
                                .is_some_and(|m| m.contains("localhost/switchyard:missing"))
                    })
                })
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    cluster.uninstall(&["--no-hooks"]).await;
}

/// With a NATS URL nothing answers, the services run but are not Ready,
/// and their logs name the URL.
async fn unreachable_nats_is_named(cluster: &ChartCluster) {
    const URL: &str = "nats://nats-gone.switchyard-system.svc:4222";
    let client = cluster.plane.client();
    let nodes: Vec<&RealNode> = cluster.nodes.iter().collect();
    install_broken(cluster, &[&format!("nats.url={URL}"), "image.tag=test"]);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let selector = "app.kubernetes.io/component=class-compiler";
    let named = |pod: &Pod| {
        let name = pod.metadata.name.clone().unwrap_or_default();
        nodes.iter().any(|n| {
            n.container_log(NAMESPACE, &name, "class-compiler")
                .is_some_and(|log| log.contains(&format!("NATS at {URL}")))
        })
    };
    switchyard_testkit::eventually(
        "the class-compiler's log naming the NATS URL",
        Duration::from_secs(60),
        || {
            let pods = pods.clone();
            async move {
                pods.list(&ListParams::default().labels(selector))
                    .await
                    .is_ok_and(|l| l.items.iter().any(named))
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let compilers = pods
        .list(&ListParams::default().labels(selector))
        .await
        .unwrap();
    let ready = compilers.items.iter().any(chart::pod_ready);
    assert!(!ready, "the class-compiler is not Ready without its log");
    cluster.uninstall(&["--no-hooks"]).await;
}

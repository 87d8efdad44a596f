//! The test kit's cluster network: two real nodes in one network namespace
//! of the test's own, kube-proxy and CoreDNS from their Go modules. A pod on
//! one node finds a Service by its DNS name and reaches the pod behind it on
//! the other node, and finds `kubernetes.default`; and nothing of it is left
//! on the host once it is dropped: no link, no iptables rule, no sysctl.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, PostParams};
use serde_json::json;
use switchyard_testkit::eventually;
use switchyard_testkit::kube::create_namespace;
use switchyard_testkit::network::ClusterNetwork;
use switchyard_testkit::node::{BUSYBOX_IMAGE, NodeOptions, RealNode};

/// The host's iptables rules and its links named like the test kit's.
fn host_network() -> (String, Vec<String>) {
    let rules = |table: &str| {
        let out = Command::new("iptables-save")
            .args(["-t", table])
            .output()
            .expect("iptables-save");
        // Counters and the dump's timestamps change on their own.
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| l.split(" [").next().unwrap_or(l).to_string())
            .collect::<Vec<_>>()
            .join("\n")
    };
    let links = std::fs::read_dir("/sys/class/net")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("sy") || n == "cbr0")
        .collect();
    (format!("{}\n{}", rules("nat"), rules("filter")), links)
}

fn forwarding() -> String {
    std::fs::read_to_string(Path::new("/proc/sys/net/ipv4/ip_forward")).unwrap()
}

fn pod(name: &str, node: &str, command: &str, labels: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": BUSYBOX_IMAGE,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", command]
            }]
        }
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_on_two_nodes_reach_each_other_through_a_service_found_by_name() {
    let before = (host_network(), forwarding());
    let network = ClusterNetwork::new();
    let plane = network.start_plane().await;
    let options = || NodeOptions {
        network: Some(network.attach()),
        images: vec![ClusterNetwork::dns_image()],
        ..NodeOptions::default()
    };
    let a = RealNode::start_with(&plane, "net-a", options()).await;
    let b = RealNode::start_with(&plane, "net-b", options()).await;
    let client = plane.client();
    network.deploy_dns(&client).await;

    // A web server on node a, behind a Service.
    create_namespace(&client, "web").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "web");
    pods.create(
        &PostParams::default(),
        &pod(
            "server",
            "net-a",
            "mkdir /www && echo served-by-net-a > /www/index.html && exec httpd -f -p 8080 -h /www",
            json!({"app": "web"}),
        ),
    )
    .await
    .unwrap();
    let services: Api<Service> = Api::namespaced(client.clone(), "web");
    services
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "web"},
                "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    // kube-proxy has the server behind the Service once its endpoint is Ready.
    switchyard_testkit::wait_for(
        "the web Service's endpoint rule",
        Duration::from_secs(90),
        || {
            let out = network
                .command("iptables-save")
                .args(["-t", "nat"])
                .output()
                .ok()?;
            let rules = String::from_utf8_lossy(&out.stdout);
            rules
                .lines()
                .any(|l| l.contains("web/web") && l.contains("DNAT"))
                .then_some(())
        },
    )
    .unwrap_or_else(|e| {
        panic!(
            "{e}\n--- kubelet of net-a\n{}\n--- kube-proxy\n{}",
            a.log_tail("kubelet"),
            network.log_tail("kube-proxy")
        )
    });

    // From node b: the API server's Service by name, and the web Service.
    pods.create(
        &PostParams::default(),
        &pod(
            "client",
            "net-b",
            // (busybox's nc: Debian's static busybox wget crashes.)
            "exec 2>&1; nslookup kubernetes.default.svc.cluster.local && printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 web 80",
            json!({}),
        ),
    )
    .await
    .unwrap();
    let phase = |pods: Api<Pod>| async move {
        pods.get("client")
            .await
            .ok()
            .and_then(|p| p.status?.phase)
            .unwrap_or_default()
    };
    eventually("the client pod done", Duration::from_secs(90), || {
        let pods = pods.clone();
        async move { matches!(phase(pods).await.as_str(), "Succeeded" | "Failed") }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n--- kubelet of net-b\n{}", b.log_tail("kubelet")));
    let printed = b.container_log("web", "client", "main").unwrap_or_default();
    assert_eq!(phase(pods.clone()).await, "Succeeded", "{printed}");
    assert!(printed.contains("10.96.0.1"), "{printed}");
    assert!(printed.contains("served-by-net-a"), "{printed}");
    // The server's pod and the client's are on different nodes' ranges.
    let ip = |name: &'static str| {
        let pods = pods.clone();
        async move {
            pods.get(name)
                .await
                .unwrap()
                .status
                .unwrap()
                .pod_ip
                .unwrap()
        }
    };
    assert!(ip("server").await.starts_with("10.244.1."));
    assert!(ip("client").await.starts_with("10.244.2."));

    drop(a);
    drop(b);
    drop(plane);
    drop(network);
    assert_eq!((host_network(), forwarding()), before);
}

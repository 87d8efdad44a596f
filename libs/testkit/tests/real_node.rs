//! The test kit's real node: containerd, runc and kubelet registered to a
//! real control plane, running a pod with a network of its own — and
//! nothing of it left on the host once the node is dropped.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use serde_json::json;
use switchyard_testkit::eventually;
use switchyard_testkit::kube::{Components, ControlPlane};
use switchyard_testkit::node::{BUSYBOX_IMAGE, RealNode};

fn sysctls() -> Vec<String> {
    [
        "kernel/panic",
        "kernel/panic_on_oops",
        "vm/overcommit_memory",
    ]
    .iter()
    .map(|k| std::fs::read_to_string(Path::new("/proc/sys").join(k)).unwrap())
    .collect()
}

/// Cgroups, bridges and mounts of the host whose names mention `needle`.
fn host_traces(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for h in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
        for e in std::fs::read_dir(h.path()).into_iter().flatten().flatten() {
            if e.file_name().to_string_lossy().contains(needle) {
                found.push(e.path().display().to_string());
            }
        }
    }
    for e in std::fs::read_dir("/sys/class/net").unwrap().flatten() {
        if e.file_name().to_string_lossy().starts_with("sy") {
            found.push(format!("link {}", e.file_name().to_string_lossy()));
        }
    }
    for line in std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
    {
        if line.contains(needle) {
            found.push(format!("mount {line}"));
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_node_runs_a_networked_pod_and_leaves_nothing_behind() {
    let before = sysctls();
    let plane = ControlPlane::start_with(Components {
        scheduler: true,
        controller_manager: true,
        ..Components::default()
    })
    .await;
    let node = RealNode::start(&plane, "plain-1").await;
    let root = node.root().to_path_buf();
    let pods: Api<Pod> = Api::namespaced(plane.client(), "default");
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "net"},
            "spec": {
                "terminationGracePeriodSeconds": 1,
                "containers": [{
                    "name": "main",
                    "image": BUSYBOX_IMAGE,
                    "command": ["sh", "-c", "ip -4 addr show eth0; sleep 3600"]
                }]
            }
        }))
        .unwrap(),
    )
    .await
    .unwrap();
    eventually(
        "the pod Running with an IP",
        Duration::from_secs(60),
        || {
            let pods = pods.clone();
            async move {
                pods.get("net").await.is_ok_and(|p| {
                    let status = p.status.unwrap_or_default();
                    status.phase.as_deref() == Some("Running")
                        && status.pod_ip.is_some_and(|ip| ip.starts_with("10.244.0."))
                })
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n--- kubelet\n{}", node.log_tail("kubelet")));
    let ip = pods
        .get("net")
        .await
        .unwrap()
        .status
        .unwrap()
        .pod_ip
        .unwrap();
    let mut printed = String::new();
    eventually(
        "the container's own address",
        Duration::from_secs(20),
        || {
            printed = node
                .container_log("default", "net", "main")
                .unwrap_or_default();
            let seen = printed.contains(&format!("inet {ip}/24"));
            async move { seen }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}: {printed:?}"));
    let tag = root.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        !host_traces("plain-1").is_empty(),
        "the node's cgroups exist while it runs"
    );

    drop(node);
    assert!(!root.exists(), "the node's directory is removed");
    assert_eq!(
        host_traces("plain-1"),
        Vec::<String>::new(),
        "left on the host"
    );
    assert_eq!(host_traces(&tag), Vec::<String>::new(), "left on the host");
    assert_eq!(sysctls(), before, "kubelet's sysctls put back");
}

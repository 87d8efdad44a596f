//! What the real-node tests share: the agent as a process beside a
//! `RealNode`, the control plane they run on, and waits on pods and Nodes.

#![allow(dead_code, unused_imports)]

use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, PostParams};
use serde_json::json;
use switchyard_testkit::kube::{Components, ControlPlane};
use switchyard_testkit::node::{BUSYBOX_IMAGE, RealNode};
use switchyard_testkit::{KillOnDrop, eventually};

pub use switchyard_testkit::node::GPU_DEVICE_NODES as DEVICE_NODES;

/// The agent as a process beside the node (its sockets and CDI specs in the
/// node's directories), logging to the node's `agent.log`.
pub fn agent(plane: &ControlPlane, node: &RealNode, fixture: &str, extra: &[&str]) -> KillOnDrop {
    agent_with(node, fixture, extra, &plane.kubeconfig())
}

/// [`agent`] with extra flags and the credentials of `kubeconfig`.
pub fn agent_with(
    node: &RealNode,
    fixture: &str,
    extra: &[&str],
    kubeconfig: &std::path::Path,
) -> KillOnDrop {
    agent_on(node, &format!("fixture:{fixture}"), extra, kubeconfig, &[])
}

/// The agent on the GPU source `source` (`nvml`, `fixture:FILE`), with
/// extra flags, the credentials of `kubeconfig` and extra environment.
pub fn agent_on(
    node: &RealNode,
    source: &str,
    extra: &[&str],
    kubeconfig: &std::path::Path,
    env: &[(&str, &std::ffi::OsStr)],
) -> KillOnDrop {
    let log = std::fs::File::options()
        .create(true)
        .append(true)
        .open(node.root().join("agent.log"))
        .expect("agent log");
    KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_switchyard-node-agent"))
            .args(["serve", "--gpu-source", source, "--node", node.name()])
            .args(extra)
            .arg("--kubelet-dir")
            .arg(node.kubelet_dir())
            .arg("--cdi-dir")
            .arg(node.cdi_dir())
            .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
            .env("KUBECONFIG", kubeconfig)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start the agent"),
    )
}

/// The agent inside the node's mount namespace, on the paths a DaemonSet
/// pod sees (`/var/lib/kubelet`, `/var/run/cdi`), logging to `agent.log`:
/// for socket names longer than the host's view of the node's directory
/// leaves room for.
pub fn agent_inside(
    plane: &ControlPlane,
    node: &RealNode,
    fixture: &str,
    extra: &[&str],
) -> KillOnDrop {
    let log = std::fs::File::options()
        .create(true)
        .append(true)
        .open(node.root().join("agent.log"))
        .expect("agent log");
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
    KillOnDrop(
        node.command(env!("CARGO_BIN_EXE_switchyard-node-agent"))
            .args(["serve", "--node", node.name(), "--gpu-source"])
            .arg(format!("fixture:{root}/{fixture}"))
            .args(extra)
            .args([
                "--kubelet-dir",
                "/var/lib/kubelet",
                "--cdi-dir",
                "/var/run/cdi",
            ])
            .env("KUBECONFIG", plane.kubeconfig())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start the agent"),
    )
}

pub fn logs(node: &RealNode) -> String {
    format!(
        "--- agent.log\n{}\n--- kubelet.log\n{}",
        std::fs::read_to_string(node.root().join("agent.log"))
            .map(|s| s
                .lines()
                .rev()
                .take(30)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n"))
            .unwrap_or_default(),
        node.log_tail("kubelet")
    )
}

/// A control plane with the scheduler, the controllers and Switchyard's CRDs.
pub async fn plane() -> ControlPlane {
    let plane = ControlPlane::start_with(Components {
        scheduler: true,
        controller_manager: true,
        ..Components::default()
    })
    .await;
    switchyard_testkit::kube::install_crds(
        &plane.client(),
        switchyard_api::crds().into_iter().map(|(_, c)| c).collect(),
    )
    .await;
    plane
}

/// The Node's (capacity, allocatable) of `resource`, as numbers.
pub async fn advertised(
    nodes: &Api<Node>,
    node: &str,
    resource: &str,
) -> (Option<i64>, Option<i64>) {
    let Ok(n) = nodes.get(node).await else {
        return (None, None);
    };
    let status = n.status.unwrap_or_default();
    let of = |m: Option<std::collections::BTreeMap<String, Quantity>>| {
        m.and_then(|m| m.get(resource).and_then(|q| q.0.parse().ok()))
    };
    (of(status.capacity), of(status.allocatable))
}

/// What the pod's container `main` printed, once it has printed `last`.
pub async fn printed(node: &RealNode, pod: &str, last: &str) -> String {
    let mut out = String::new();
    let seen = eventually(&format!("{pod}'s output"), Duration::from_secs(20), || {
        out = node
            .container_log("default", pod, "main")
            .unwrap_or_default();
        let done = out.lines().any(|l| l == last);
        async move { done }
    })
    .await;
    if let Err(e) = seen {
        panic!("{e}: {out:?}\n{}", logs(node));
    }
    out
}

/// Waits until the pod is in `phase`; panics with its status and the logs.
pub async fn wait_phase(pods: &Api<Pod>, node: &RealNode, name: &str, phase: &str) {
    let reached = eventually(
        &format!("pod {name} {phase}"),
        Duration::from_secs(60),
        || {
            let pods = pods.clone();
            async move {
                pods.get(name)
                    .await
                    .is_ok_and(|p| p.status.and_then(|s| s.phase).as_deref() == Some(phase))
            }
        },
    )
    .await;
    if let Err(e) = reached {
        let status = pods.get(name).await.map(|p| format!("{:?}", p.status));
        panic!("{e}: {status:?}\n{}", logs(node));
    }
}

/// The DeviceClass `gpu`: every device of Switchyard's driver.
pub async fn create_class(client: &kube::Client) {
    Api::<DeviceClass>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "resource.k8s.io/v1",
                "kind": "DeviceClass",
                "metadata": {"name": "gpu"},
                "spec": {"selectors": [{"cel": {"expression": "device.driver == \"gpu.deckhouse.io\""}}]}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
}

/// A ResourceClaim `name` in `default` for one device of the class `gpu`.
pub async fn create_claim(client: &kube::Client, name: &str) {
    Api::<ResourceClaim>::namespaced(client.clone(), "default")
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {"name": name},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}}
            }))
            .unwrap(),
        )
        .await
        .unwrap();
}

/// A pod in `default` using the claim `claim`, printing its card and then
/// sleeping.
pub fn claim_pod(name: &str, claim: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "hostNetwork": true,
            "terminationGracePeriodSeconds": 1,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
            "containers": [{
                "name": "main",
                "image": BUSYBOX_IMAGE,
                "command": ["sh", "-c", "echo visible=$NVIDIA_VISIBLE_DEVICES; ls /dev | grep nvidia; sleep 3600"],
                "resources": {"claims": [{"name": "gpu"}]}
            }]
        }
    }))
    .unwrap()
}

/// The ServiceAccount `default/agent` with the node agent's permissions
/// (`switchyard_node_agent::PERMISSIONS` and its Events), the reading of
/// ResourceClaims only when `claims` is true (applied again to change it);
/// returns a kubeconfig with a token of it.
pub async fn agent_account(plane: &ControlPlane, claims: bool) -> std::path::PathBuf {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    use kube::api::{Patch, PatchParams};
    let client = plane.client();
    let apply = PatchParams::apply("real-node-test").force();
    Api::<ServiceAccount>::namespaced(client.clone(), "default")
        .patch(
            "agent",
            &apply,
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "agent"}})),
        )
        .await
        .unwrap();
    let rules: Vec<serde_json::Value> = switchyard_node_agent::PERMISSIONS
        .iter()
        .chain(switchyard_node_agent::EVENT_PERMISSIONS)
        .filter(|p| claims || p.resource != "resourceclaims")
        .map(|p| json!({"apiGroups": [p.group], "resources": [p.resource], "verbs": p.verbs}))
        .collect();
    Api::<ClusterRole>::all(client.clone())
        .patch(
            "real-node-agent",
            &apply,
            &Patch::Apply(json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": "real-node-agent"}, "rules": rules
            })),
        )
        .await
        .unwrap();
    Api::<ClusterRoleBinding>::all(client.clone())
        .patch(
            "real-node-agent",
            &apply,
            &Patch::Apply(json!({
                "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": "real-node-agent"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "real-node-agent"},
                "subjects": [{"kind": "ServiceAccount", "name": "agent", "namespace": "default"}]
            })),
        )
        .await
        .unwrap();
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let token = Api::<ServiceAccount>::namespaced(client, "default")
        .create_token_request("agent", &PostParams::default(), &request)
        .await
        .unwrap()
        .status
        .and_then(|s| s.token)
        .expect("a token of default/agent");
    plane.kubeconfig_as("agent.kubeconfig", &plane.url(), &token)
}

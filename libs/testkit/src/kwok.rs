//! kwok (sigs.k8s.io/kwok) beside a [`ControlPlane`]: it gives kubelet-less
//! Nodes and their pods a lifecycle — a node turns Ready and renews its Lease,
//! a pod the scheduler binds goes Running, a pod being deleted (an Eviction, a
//! delete, a scale-down) goes away — so the real scheduler and controllers see
//! what they would see with kubelets.
//!
//! The binary and its stages come from `scripts/install-kwok.sh` (kwok v0.8.0
//! from its Go module, cached by version). The kwok binary has no built-in
//! stages; it takes them from `--config` files, as kwokctl hands them to it
//! (the fast node stages with heartbeat-with-lease, the fast pod stages), and
//! the script copies those same files out of the module. A missing binary or
//! stage is a test failure that says how to build them — never a skip.
//!
//! kwok manages only Nodes annotated [`MANAGED_ANNOTATION`] (see [`kwok_node`]),
//! so tests can mix kwok nodes with bare API objects.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus, Taint};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::cache_dir;
use crate::kube::ControlPlane;

pub const KWOK_VERSION: &str = "0.8.0";

/// The annotation (key, value) that puts a Node under kwok: kwok runs with
/// `--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake`, the
/// annotation kwok's own documentation gives its nodes.
pub const MANAGED_ANNOTATION: (&str, &str) = ("kwok.x-k8s.io/node", "fake");

/// The Lease duration kwok's nodes announce; kwok renews a quarter of it
/// apart, as kubelet does (1 s here, so a heartbeat is seen quickly).
pub const NODE_LEASE_DURATION_SECONDS: u32 = 4;

/// The stages kwokctl hands kwok by default (nodes with leases, pods), as the
/// install script copies them.
const STAGES: [&str; 5] = [
    "node-initialize.yaml",
    "node-heartbeat-with-lease.yaml",
    "pod-ready.yaml",
    "pod-complete.yaml",
    "pod-delete.yaml",
];

const INSTALL_HINT: &str = "build it with `scripts/install-kwok.sh` (kwok v0.8.0 and its stages into ~/.cache/switchyard/kwok/v0.8.0) or set SWITCHYARD_KWOK to a directory holding `kwok` and `stages/`";

/// Where kwok and its stages are: `$SWITCHYARD_KWOK`, else the pinned build in the cache.
pub fn kwok_dir() -> Result<PathBuf, String> {
    let dir = match std::env::var_os("SWITCHYARD_KWOK") {
        Some(dir) => PathBuf::from(dir),
        None => cache_dir().join(format!("kwok/v{KWOK_VERSION}")),
    };
    let needed = std::iter::once(dir.join("kwok"))
        .chain(STAGES.iter().map(|stage| dir.join("stages").join(stage)));
    for path in needed {
        if !path.is_file() {
            return Err(format!("{} is missing; {INSTALL_HINT}", path.display()));
        }
    }
    Ok(dir)
}

/// A running kwok, managing the annotated Nodes of one control plane; killed
/// (and reaped) when dropped.
pub struct Kwok {
    child: Child,
    log: PathBuf,
}

impl Kwok {
    /// Starts kwok against `plane` (its admin kubeconfig), logging to
    /// `kwok.log` in the plane's directory. Panics, naming the install script,
    /// when kwok is not built.
    pub fn start(plane: &ControlPlane) -> Kwok {
        let dir = kwok_dir().unwrap_or_else(|err| panic!("{err}"));
        let log = plane.dir().join("kwok.log");
        let mut args = vec![
            format!("--kubeconfig={}", plane.kubeconfig().display()),
            "--manage-all-nodes=false".to_string(),
            format!(
                "--manage-nodes-with-annotation-selector={}={}",
                MANAGED_ANNOTATION.0, MANAGED_ANNOTATION.1
            ),
            format!("--node-lease-duration-seconds={NODE_LEASE_DURATION_SECONDS}"),
        ];
        args.extend(
            STAGES
                .iter()
                .map(|stage| format!("--config={}", dir.join("stages").join(stage).display())),
        );
        let out = File::create(&log).unwrap_or_else(|e| panic!("create {}: {e}", log.display()));
        let err = out.try_clone().expect("clone the kwok log handle");
        let child = Command::new(dir.join("kwok"))
            .args(&args)
            // kwok also reads ~/.kwok/kwok.yaml when it exists: a home of its
            // own keeps a developer's kwok settings out of the tests.
            .env("HOME", plane.dir())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", dir.join("kwok").display()));
        Kwok { child, log }
    }

    /// The last lines of kwok's log, for failure messages.
    pub fn log_tail(&self) -> String {
        crate::kube::tail(&self.log)
    }

    /// Where kwok logs.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Whether kwok has exited (it should not before it is dropped).
    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// Creates `node` (made with [`kwok_node`]) and waits until kwok has made
    /// it Ready; returns it as stored then. Panics with kwok's log if kwok
    /// exits or the node is not Ready within `timeout`.
    pub async fn create_node(
        &mut self,
        client: &kube::Client,
        node: &Node,
        timeout: Duration,
    ) -> Node {
        let nodes: kube::Api<Node> = kube::Api::all(client.clone());
        let name = node.metadata.name.clone().unwrap_or_default();
        nodes
            .create(&kube::api::PostParams::default(), node)
            .await
            .unwrap_or_else(|err| panic!("create node {name}: {err}"));
        let deadline = tokio::time::Instant::now() + timeout;
        let mut pause = Duration::from_millis(10);
        loop {
            let stored = nodes
                .get(&name)
                .await
                .unwrap_or_else(|err| panic!("get node {name}: {err}"));
            if node_is_ready(&stored) {
                return stored;
            }
            if self.exited() {
                panic!(
                    "kwok exited before node {name} was Ready\n--- kwok.log\n{}",
                    self.log_tail()
                );
            }
            if tokio::time::Instant::now() >= deadline {
                panic!(
                    "node {name} was not Ready within {timeout:?} (is it annotated {}={}?)\n--- kwok.log\n{}",
                    MANAGED_ANNOTATION.0,
                    MANAGED_ANNOTATION.1,
                    self.log_tail()
                );
            }
            // Polling a condition with a deadline: a watch would do no better here.
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(200));
        }
    }
}

impl Drop for Kwok {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether `node` has the condition Ready=True.
pub fn node_is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|conditions| {
            conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
}

/// A Node for kwok to manage: annotated [`MANAGED_ANNOTATION`], with `labels`,
/// `resources` as both capacity and allocatable (e.g. `("nvidia.com/gpu",
/// "8")`, `("cpu", "32")`, `("memory", "256Gi")`, `("pods", "110")`) and
/// `taints`. No conditions: kwok sets them (its node-initialize stage keeps
/// the given capacity and allocatable).
pub fn kwok_node(
    name: &str,
    labels: &[(&str, &str)],
    resources: &[(&str, &str)],
    taints: Vec<Taint>,
) -> Node {
    let resources: BTreeMap<String, Quantity> = resources
        .iter()
        .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
        .collect();
    Node {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            annotations: Some(
                [(
                    MANAGED_ANNOTATION.0.to_string(),
                    MANAGED_ANNOTATION.1.to_string(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            taints: (!taints.is_empty()).then_some(taints),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            allocatable: Some(resources.clone()),
            capacity: Some(resources),
            ..Default::default()
        }),
    }
}

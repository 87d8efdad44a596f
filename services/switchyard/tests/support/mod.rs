//! The harness of the tests that run Switchyard's services as processes on a
//! real control plane and JetStream: a service's process, the world they
//! run in, and the objects the tests make.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Taint};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use switchyard_api::{ModuleConfig, NodeGroup, crds};
use switchyard_eventlog::nats::{NatsLog, NatsOptions};
use switchyard_eventlog::{Decoded, EventLog, ReadRequest};
use switchyard_proto::v1::{DomainEvent, domain_event::Kind};
use switchyard_testkit::kube::{Components, ControlPlane, fake_node, install_crds};
use switchyard_testkit::nats::NatsServer;
use switchyard_testkit::{KillOnDrop, eventually};

pub const STACK: &str = "node.deckhouse.io/gpu-stack";
pub const GROUP: &str = "node.deckhouse.io/group";
pub const SETUP: &str = "node.deckhouse.io/gpu-setup-complete";
pub const WAIT: Duration = Duration::from_secs(60);

/// Eight H100s, as the node agent's fixture backend serves them.
pub const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../deploy/fixtures/h100-8x.yaml"
);

/// A node agent's process, its kubelet's sockets and their folder.
pub type NodeAgent = (
    KillOnDrop,
    switchyard_kubelet::fake::Kubelet,
    tempfile::TempDir,
);

/// A service's process (`switchyard-<name>`), killed when dropped; its log
/// kept for failures.
pub struct Service {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Service {
    pub fn start(
        name: &'static str,
        plane: &ControlPlane,
        nats: &NatsServer,
        dir: &std::path::Path,
        health: Option<u16>,
        env: &[(&str, &str)],
    ) -> Service {
        let log = dir.join(format!("{name}.log"));
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("service log");
        let binary = switchyard_testkit::bins::binary(&format!("switchyard-{name}"));
        let mut command = Command::new(binary);
        command.envs(env.iter().copied());
        if let Some(port) = health {
            command.env("SWITCHYARD_HEALTH_LISTEN", format!("127.0.0.1:{port}"));
        }
        let child = command
            .env("SWITCHYARD_TICK", "200ms")
            .env("SWITCHYARD_REISSUE", "500ms")
            .env("KUBECONFIG", plane.kubeconfig())
            .env("SWITCHYARD_NATS_URL", nats.url())
            .env(
                "SWITCHYARD_LOG_LEVEL",
                "info,switchyard_runtime=debug,switchyard_kube=debug,kube_client::client::tls=error",
            )
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("start switchyard-{name}: {e}"));
        Service { name, child, log }
    }

    pub fn output(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(40).collect();
        format!(
            "--- {} (last lines) ---\n{}",
            self.name,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        )
    }

    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.stop();
    }
}

pub struct World {
    pub plane: ControlPlane,
    pub nats: NatsServer,
    pub client: Client,
    pub dir: tempfile::TempDir,
    pub services: Vec<Service>,
}

impl World {
    pub async fn start(components: Components) -> World {
        let plane = ControlPlane::start_with(components).await;
        let client = plane.client();
        install_crds(&client, crds().into_iter().map(|(_, c)| c).collect()).await;
        World {
            plane,
            nats: NatsServer::start(),
            client,
            dir: tempfile::tempdir().expect("temp dir"),
            services: Vec::new(),
        }
    }

    pub fn serve(&mut self, name: &'static str) {
        self.serve_with_env(name, &[]);
    }

    /// Starts a service with these environment variables (its flags).
    pub fn serve_with_env(&mut self, name: &'static str, env: &[(&str, &str)]) {
        let service = Service::start(name, &self.plane, &self.nats, self.dir.path(), None, env);
        self.services.push(service);
    }

    /// Starts a service with gRPC health on a free loopback port; returns the port.
    pub fn serve_with_health(&mut self, name: &'static str) -> u16 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let service = Service::start(
            name,
            &self.plane,
            &self.nats,
            self.dir.path(),
            Some(port),
            &[],
        );
        self.services.push(service);
        port
    }

    pub fn stop(&mut self, name: &str) {
        self.services.retain(|s| s.name != name);
    }

    /// Services' logs, for a failure message.
    pub fn output(&self) -> String {
        self.services
            .iter()
            .map(Service::output)
            .collect::<Vec<_>>()
            .join("\n")
    }

    pub async fn log(&self) -> Arc<dyn EventLog> {
        Arc::new(
            NatsLog::connect(
                &self.nats.url(),
                NatsOptions {
                    create: true,
                    ..NatsOptions::default()
                },
            )
            .await
            .expect("open the log"),
        )
    }

    pub async fn events(&self) -> Vec<(String, DomainEvent)> {
        let log = self.log().await;
        log.read(ReadRequest::default())
            .await
            .expect("read the log")
            .into_iter()
            .filter_map(|s| match s.decode() {
                Decoded::Event(e) => Some((s.envelope.actor.clone(), e)),
                Decoded::Unknown { .. } => None,
            })
            .collect()
    }

    pub async fn until<F, Fut>(&self, what: &str, condition: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        if let Err(err) = eventually(what, WAIT, condition).await {
            let events: Vec<String> = self
                .events()
                .await
                .iter()
                .map(|(actor, e)| {
                    format!("{actor}: {}", serde_json::to_string(e).unwrap_or_default())
                })
                .collect();
            panic!(
                "{err}\n{}\n--- the log ---\n{}",
                self.output(),
                events.join("\n")
            );
        }
    }

    pub async fn labels(&self, node: &str) -> BTreeMap<String, String> {
        Api::<Node>::all(self.client.clone())
            .get(node)
            .await
            .expect("node")
            .labels()
            .clone()
    }

    /// Waits until `node`'s labels are exactly `want`.
    pub async fn labels_become(&self, node: &str, want: &BTreeMap<String, String>) {
        self.until(&format!("node {node} labelled {want:?}"), || async {
            self.labels(node).await == *want
        })
        .await;
    }
}

pub fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub async fn create_node(client: &Client, name: &str, labels: &[(&str, &str)], taints: Vec<Taint>) {
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &fake_node(name, labels, taints))
        .await
        .unwrap_or_else(|e| panic!("create node {name}: {e}"));
}

pub async fn create_group(client: &Client, name: &str, gpu: bool) {
    let group: NodeGroup = serde_json::from_value(json!({
        "apiVersion": "deckhouse.io/v1", "kind": "NodeGroup",
        "metadata": {"name": name},
        "spec": if gpu {
            json!({"nodeType": "Static", "gpu": {"sharing": "Exclusive"}})
        } else {
            json!({"nodeType": "Static"})
        },
    }))
    .expect("group");
    Api::<NodeGroup>::all(client.clone())
        .create(&PostParams::default(), &group)
        .await
        .unwrap_or_else(|e| panic!("create group {name}: {e}"));
}

pub async fn set_module_config(client: &Client, dra: bool, previous_version: Option<&str>) {
    let mut config = json!({
        "apiVersion": "deckhouse.io/v1alpha1", "kind": "ModuleConfig",
        "metadata": {"name": "gpu"},
        "spec": {"enabled": true, "version": 1, "settings": {"dra": {"enabled": dra}}},
    });
    if let Some(v) = previous_version {
        config["metadata"]["annotations"] = json!({"gpu.deckhouse.io/previous-module-version": v});
    }
    Api::<ModuleConfig>::all(client.clone())
        .patch(
            "gpu",
            &PatchParams::apply("test-operator").force(),
            &Patch::Apply(&config),
        )
        .await
        .expect("module config");
}

pub fn count(events: &[(String, DomainEvent)], pred: impl Fn(&Kind) -> bool) -> usize {
    events
        .iter()
        .filter(|(_, e)| e.kind.as_ref().is_some_and(&pred))
        .count()
}

/// Plays node preparation (Deckhouse's bashible, not Switchyard's part):
/// after a node's group changes, its preparation label goes and comes back
/// once the node has its new stack label.
pub async fn prepare_nodes(client: Client) {
    let nodes: Api<Node> = Api::all(client);
    let mut groups = std::collections::BTreeMap::new();
    loop {
        if let Ok(list) = nodes.list(&ListParams::default()).await {
            for node in list {
                let name = node.name_any();
                let labels = node.labels();
                let group = labels.get(GROUP).cloned().unwrap_or_default();
                let moved = groups
                    .insert(name.clone(), group.clone())
                    .is_some_and(|g| g != group);
                let patch = if moved {
                    Some(json!({"metadata": {"labels": {SETUP: null}}}))
                } else if labels.contains_key(STACK) && !labels.contains_key(SETUP) {
                    Some(json!({"metadata": {"labels": {SETUP: "true"}}}))
                } else {
                    None
                };
                if let Some(patch) = patch {
                    let _ = nodes
                        .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
                        .await;
                }
            }
        }
        // The player's own pace; the test waits on conditions, not on it.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A node agent for `node` on the fixture, with a kubelet of its own.
pub fn node_agent(world: &World, node: &str) -> NodeAgent {
    let dir = tempfile::tempdir().expect("kubelet dir");
    let kubelet = switchyard_kubelet::fake::Kubelet::default();
    kubelet
        .serve(dir.path())
        .expect("serve the kubelet's sockets");
    let log = std::fs::File::create(world.dir.path().join(format!("node-agent-{node}.log")))
        .expect("agent log");
    // Cards have UUIDs of their own on every node, as on real machines (the
    // evidence checks each is published once): the fixture's first UUID
    // group is made the node's.
    let group: String = format!(
        "{:08x}",
        node.bytes().fold(0x811c_9dc5u32, |h, b| (h ^ u32::from(b))
            .wrapping_mul(0x0100_0193))
    );
    let fixture = std::fs::read_to_string(FIXTURE).expect("the fixture");
    let fixture: String = fixture
        .lines()
        .map(|line| match line.split_once("uuid: GPU-") {
            Some((indent, rest)) if rest.len() > 8 => {
                format!("{indent}uuid: GPU-{group}{}\n", &rest[8..])
            }
            _ => format!("{line}\n"),
        })
        .collect();
    let fixture_path = dir.path().join("fixture.yaml");
    std::fs::write(&fixture_path, fixture).expect("write the node's fixture");
    let agent = Command::new(switchyard_testkit::bins::binary("switchyard-node-agent"))
        .args(["serve", "--node-name", node, "--gpu-source"])
        .arg(format!("fixture:{}", fixture_path.display()))
        .arg("--kubelet-dir")
        .arg(dir.path())
        .arg("--cdi-dir")
        .arg(dir.path().join("cdi"))
        .env("KUBECONFIG", world.plane.kubeconfig())
        .env("SWITCHYARD_LOG_LEVEL", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start the node agent");
    tokio::spawn(advertise(
        world.client.clone(),
        node.to_string(),
        kubelet.clone(),
    ));
    (KillOnDrop(agent), kubelet, dir)
}

/// Kubelet's device manager for `node` (kwok has none): the devices the
/// node agent's device plugin lists healthy are the node's capacity and
/// allocatable of its resource; none once the plugin has gone.
async fn advertise(client: Client, node: String, kubelet: switchyard_kubelet::fake::Kubelet) {
    let nodes: Api<Node> = Api::all(client);
    let mut written = BTreeMap::new();
    loop {
        let changed = kubelet.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        let now = kubelet.advertised.lock().expect("advertised").clone();
        if now != written {
            let counts: serde_json::Map<String, serde_json::Value> = now
                .iter()
                .map(|(resource, n)| (resource.clone(), json!(n.to_string())))
                .collect();
            let status = json!({"status": {"capacity": counts, "allocatable": counts}});
            if nodes
                .patch_status(&node, &PatchParams::default(), &Patch::Merge(status))
                .await
                .is_ok()
            {
                written = now;
            }
        }
        // Woken by the next change; a failed write is tried again.
        let _ = tokio::time::timeout(Duration::from_secs(1), changed).await;
    }
}

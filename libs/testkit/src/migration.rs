//! The harness of a migration on a real cluster, shared by the process tests
//! (`services/switchyard/tests`) and the `switchyard-loadtest migrate`
//! benchmark: Switchyard's services as their own processes beside a real
//! control plane and JetStream ([`World`]), a node agent per GPU node on a
//! fixture GPU source with a fake kubelet ([`node_agent`]), node preparation
//! played as Deckhouse's bashible would ([`prepare_nodes`]), and the objects
//! a migration starts from ([`MigrationCluster`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Node, Taint};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;
use switchyard_api::{GPUClass, ModuleConfig, NodeGroup, crds};
use switchyard_eventlog::nats::{NatsLog, NatsOptions};
use switchyard_eventlog::{Decoded, EventLog, ReadRequest};
use switchyard_proto::v1::{DomainEvent, domain_event::Kind};

use crate::kube::{Components, ControlPlane, create_namespace, fake_node, install_crds};

/// ResourceClaim (`namespace/name`) -> the pods it is reserved for.
pub type Reservations = BTreeMap<String, BTreeSet<String>>;
use crate::kwok::{Kwok, kwok_node, node_is_ready};
use crate::nats::Bus;
use crate::{KillOnDrop, eventually};

pub const STACK: &str = "node.deckhouse.io/gpu-stack";
pub const GROUP: &str = "node.deckhouse.io/group";
pub const SETUP: &str = "node.deckhouse.io/gpu-setup-complete";
pub const WAIT: Duration = Duration::from_secs(60);

/// Eight H100s, as the node agent's fixture backend serves them.
pub const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../deploy/fixtures/h100-8x.yaml"
);

/// Where a binary of the workspace (`switchyard-<name>`) is.
pub type Locate = fn(&str) -> PathBuf;

/// A binary next to the running executable, as `cargo build` leaves the
/// workspace's binaries beside the load test's.
pub fn beside_current_exe(name: &str) -> PathBuf {
    std::env::current_exe()
        .expect("the executable's own path")
        .with_file_name(name)
}

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
    /// The replica: its name in the Lease and the log (`<name>-<i>`), or the
    /// service's name where it runs alone.
    identity: String,
    child: Child,
    log: PathBuf,
}

impl Service {
    /// Starts `switchyard-<name>` found by `binary`, its log in `dir`, with
    /// `env` (its flags) over the harness's.
    pub fn start(
        name: &'static str,
        binary: Locate,
        plane: &ControlPlane,
        nats: &Bus,
        dir: &Path,
        health: Option<u16>,
        env: &[(&str, &str)],
    ) -> Service {
        Service::start_replica(
            name,
            name.to_string(),
            binary,
            plane,
            nats,
            dir,
            health,
            env,
        )
    }

    /// [`Service::start`] for the replica `identity` of the service, its
    /// log `<identity>.log`.
    #[allow(clippy::too_many_arguments)]
    pub fn start_replica(
        name: &'static str,
        identity: String,
        binary: Locate,
        plane: &ControlPlane,
        nats: &Bus,
        dir: &Path,
        health: Option<u16>,
        env: &[(&str, &str)],
    ) -> Service {
        let log = dir.join(format!("{identity}.log"));
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("service log");
        let mut command = Command::new(binary(&format!("switchyard-{name}")));
        command
            .env("SWITCHYARD_TICK", "200ms")
            .env("SWITCHYARD_REISSUE", "500ms")
            // Text, as on a terminal: failure messages quote the logs, and
            // the benchmarks read their fields.
            .env("SWITCHYARD_LOG_FORMAT", "text")
            .env(
                "SWITCHYARD_LOG_LEVEL",
                "info,switchyard_runtime=debug,switchyard_kube=debug,kube_client::client::tls=error",
            );
        if let Some(port) = health {
            command.env("SWITCHYARD_HEALTH_LISTEN", format!("127.0.0.1:{port}"));
        }
        // The given environment last: it may point a service elsewhere (a
        // kubeconfig through a proxy).
        let child = command
            .env("KUBECONFIG", plane.kubeconfig())
            .env("SWITCHYARD_NATS_URL", nats.url())
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("start switchyard-{name}: {e}"));
        Service {
            name,
            identity,
            child,
            log,
        }
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The replica's name.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Whether the process has ended (a deposed leader stops).
    pub fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// The process id, e.g. to read its CPU time in `/proc`.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    pub fn output(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        // SWITCHYARD_TEST_LOG_LINES=N shows more of it.
        let lines = std::env::var("SWITCHYARD_TEST_LOG_LINES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(40);
        let tail: Vec<&str> = text.lines().rev().take(lines).collect();
        format!(
            "--- {} (last lines) ---\n{}",
            self.identity,
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
    /// One nats-server, or a JetStream cluster holding the log's stream
    /// on each of its servers.
    pub nats: Bus,
    pub client: Client,
    pub dir: tempfile::TempDir,
    pub services: Vec<Service>,
    /// Where the services' and node agents' binaries are.
    pub binary: Locate,
    /// Environment every service started from now on gets (before its own).
    pub service_env: Vec<(String, String)>,
    /// The NKey seed the harness reads the log with, on a secured bus.
    pub reader: Option<PathBuf>,
    /// Environment of one service, over `service_env` (its own account's
    /// kubeconfig, say).
    pub env_of: BTreeMap<&'static str, Vec<(String, String)>>,
    /// Environment of every node agent started from now on (where to send
    /// traces, say).
    pub agent_env: Vec<(String, String)>,
    /// How many replicas of each service that runs elected are started:
    /// more than one, they are elected by a Lease in `default`.
    pub replicas: usize,
    /// Environment of one replica (by identity), over its service's.
    pub replica_env: BTreeMap<String, Vec<(String, String)>>,
}

/// A bus that asks for credentials: the server's `authorization`, the seed
/// that may create the stream (log-init's) and the one the harness reads the
/// log with (an operator's).
pub struct SecuredBus {
    pub authorization: String,
    pub creator: PathBuf,
    pub reader: PathBuf,
}

/// A connection to `url` as the NKey user whose seed is in `seed`, its
/// inboxes under `_INBOX.<public key>` as Switchyard's own are.
pub async fn connect_as(url: &str, seed: &Path) -> async_nats::Client {
    let text = std::fs::read_to_string(seed)
        .unwrap_or_else(|e| panic!("read the seed {}: {e}", seed.display()));
    let pair = nkeys::KeyPair::from_seed(text.trim()).expect("an NKey seed");
    async_nats::ConnectOptions::new()
        .nkey(text.trim().to_string())
        .custom_inbox_prefix(format!("_INBOX.{}", pair.public_key()))
        .connect(url)
        .await
        .unwrap_or_else(|e| panic!("connect to {url} as {}: {e}", pair.public_key()))
}

impl World {
    /// The world of a test: the binaries built by cargo for it
    /// ([`crate::bins::binary`]).
    pub async fn start(components: Components) -> World {
        World::start_with(components, crate::bins::binary).await
    }

    /// The world with the binaries `binary` finds.
    pub async fn start_with(components: Components, binary: Locate) -> World {
        World::start_on(components, binary, None, 1).await
    }

    /// The world with its log on `servers` nats-servers (more than one: a
    /// JetStream cluster, the stream with a copy on each and every service
    /// requiring as many).
    pub async fn start_on_servers(components: Components, binary: Locate, servers: usize) -> World {
        World::start_on(components, binary, None, servers).await
    }

    /// The world on a bus that asks for credentials (each service must then
    /// be given its own, with `serve_with_env`).
    pub async fn start_secured(components: Components, bus: SecuredBus) -> World {
        World::start_on(components, crate::bins::binary, Some(bus), 1).await
    }

    async fn start_on(
        components: Components,
        binary: Locate,
        bus: Option<SecuredBus>,
        servers: usize,
    ) -> World {
        let plane = ControlPlane::start_with(components).await;
        let client = plane.client();
        install_crds(&client, crds().into_iter().map(|(_, c)| c).collect()).await;
        let extra = bus
            .as_ref()
            .map(|b| b.authorization.clone())
            .unwrap_or_default();
        let nats = Bus::start(
            servers,
            crate::nats::NatsOptions {
                extra,
                ..crate::nats::NatsOptions::default()
            },
        )
        .await;
        // What `switchyard log init` does before the services start: they
        // never create the stream themselves.
        let options = NatsOptions {
            create: true,
            replicas: nats.replicas(),
            ..NatsOptions::default()
        };
        match &bus {
            Some(bus) => NatsLog::open(connect_as(&nats.url(), &bus.creator).await, options).await,
            None => NatsLog::connect(&nats.url(), options).await,
        }
        .expect("create the log's stream");
        let replicas = nats.replicas();
        World {
            reader: bus.map(|b| b.reader),
            plane,
            nats,
            client,
            dir: tempfile::tempdir().expect("temp dir"),
            services: Vec::new(),
            binary,
            // Every service requires the stream's copies: one opened with
            // fewer is refused.
            service_env: vec![(
                "SWITCHYARD_NATS_STREAM_REPLICAS".into(),
                replicas.to_string(),
            )],
            env_of: BTreeMap::new(),
            agent_env: Vec::new(),
            replicas: 1,
            replica_env: BTreeMap::new(),
        }
    }

    pub fn serve(&mut self, name: &'static str) {
        self.serve_with_env(name, &[]);
    }

    /// Starts a service with these environment variables (its flags).
    pub fn serve_with_env(&mut self, name: &'static str, env: &[(&str, &str)]) {
        self.start_service(name, None, env);
    }

    /// Starts a service with gRPC health on a free loopback port; returns the port.
    pub fn serve_with_health(&mut self, name: &'static str) -> u16 {
        let port = crate::free_port();
        self.start_service(name, Some(port), &[]);
        port
    }

    fn start_service(&mut self, name: &'static str, health: Option<u16>, env: &[(&str, &str)]) {
        for identity in self.replicas_of(name) {
            self.start_replica(name, identity, health, env);
        }
    }

    /// The replicas of `name` started: `<name>-<i>` for a service that runs
    /// elected with standbys, else the one named as the service.
    pub fn replicas_of(&self, name: &str) -> Vec<String> {
        let elected = switchyard_core::authors::ELECTED
            .iter()
            .any(|s| s.as_str() == name);
        if self.replicas > 1 && elected {
            (0..self.replicas).map(|i| format!("{name}-{i}")).collect()
        } else {
            vec![name.to_string()]
        }
    }

    fn start_replica(
        &mut self,
        name: &'static str,
        identity: String,
        health: Option<u16>,
        env: &[(&str, &str)],
    ) {
        let own = self.env_of.get(name).map(Vec::as_slice).unwrap_or_default();
        let replica = self
            .replica_env
            .get(&identity)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let elected = identity != name;
        let election = [
            (
                "SWITCHYARD_LEASE_NAMESPACE".to_string(),
                "default".to_string(),
            ),
            ("SWITCHYARD_IDENTITY".to_string(), identity.clone()),
            ("SWITCHYARD_LEASE_DURATION".to_string(), "6s".to_string()),
            ("SWITCHYARD_LEASE_MARGIN".to_string(), "2s".to_string()),
        ];
        let election = if elected { &election[..] } else { &[] };
        let env: Vec<(&str, &str)> = self
            .service_env
            .iter()
            .chain(own)
            .chain(election)
            .chain(replica)
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .chain(env.iter().copied())
            .collect();
        let service = Service::start_replica(
            name,
            identity,
            self.binary,
            &self.plane,
            &self.nats,
            self.dir.path(),
            health,
            &env,
        );
        self.services.push(service);
    }

    /// Stops every replica of the service `name` (SIGKILL).
    pub fn stop(&mut self, name: &str) {
        self.services.retain(|s| s.name != name);
    }

    /// Kills the replica `identity` (SIGKILL) if it still runs, and starts
    /// it again, as its pod's restart would.
    pub fn restart_replica(&mut self, identity: &str) {
        let Some(at) = self.services.iter().position(|s| s.identity == identity) else {
            panic!("no replica {identity}");
        };
        let name = self.services.remove(at).name;
        self.start_replica(name, identity.to_string(), None, &[]);
    }

    /// Kills the replica `identity` (SIGKILL) without starting it again.
    pub fn kill_replica(&mut self, identity: &str) {
        if let Some(service) = self.services.iter_mut().find(|s| s.identity == identity) {
            service.stop();
        }
    }

    /// Whether the replica `identity` has stopped.
    pub fn replica_exited(&mut self, identity: &str) -> bool {
        self.services
            .iter_mut()
            .find(|s| s.identity == identity)
            .is_some_and(Service::exited)
    }

    /// Who holds the Lease of the service `name` now, if anyone.
    pub async fn leader_of(&self, name: &str) -> Option<String> {
        let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
            Api::namespaced(self.client.clone(), "default");
        leases
            .get_opt(&format!("switchyard-{name}"))
            .await
            .ok()
            .flatten()
            .and_then(|l| l.spec)
            .and_then(|s| s.holder_identity)
    }

    /// All that the service `name` logged, every run of it.
    pub fn service_log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{name}.log"))).unwrap_or_default()
    }

    /// Services' logs, for a failure message.
    pub fn output(&self) -> String {
        self.services
            .iter()
            .map(Service::output)
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The log, as the harness reads it (with the reader's key on a
    /// secured bus).
    /// The log as the services read it: behind the fence, a deposed
    /// leader's records passed over.
    pub async fn log(&self) -> Arc<dyn EventLog> {
        Arc::new(switchyard_eventlog::fence::Fenced::new(
            self.stored_log().await,
        ))
    }

    /// The log's every stored record, fenced ones too.
    pub async fn stored_log(&self) -> Arc<dyn EventLog> {
        let log = match &self.reader {
            Some(seed) => {
                let client = connect_as(&self.nats.url(), seed).await;
                NatsLog::open(client, NatsOptions::default()).await
            }
            None => NatsLog::connect(&self.nats.url(), NatsOptions::default()).await,
        };
        Arc::new(log.expect("open the log"))
    }

    pub async fn events(&self) -> Vec<(String, DomainEvent)> {
        events_in(self.log().await.as_ref()).await
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

/// Plays the platform's part of a node's move (Deckhouse's, not
/// Switchyard's): node-manager labels a node that joined a group with the
/// group's role, `node-role.kubernetes.io/<group>`; node preparation
/// (bashible) takes the node's preparation label away and puts it back once
/// the node has its new stack label. Follows the Nodes with a watch (a
/// poll of every Node would load the API server in proportion to the
/// cluster's size, whatever changes).
pub async fn prepare_nodes(client: Client) {
    let nodes: Api<Node> = Api::all(client);
    let mut groups = BTreeMap::new();
    let changes = watcher(nodes.clone(), watcher::Config::default())
        .default_backoff()
        .applied_objects();
    futures::pin_mut!(changes);
    loop {
        let node = match changes.try_next().await {
            Ok(Some(node)) => node,
            Ok(None) => return,
            // The watcher backs off and lists again by itself.
            Err(_) => continue,
        };
        let name = node.name_any();
        let labels = node.labels();
        let group = labels.get(GROUP).cloned().unwrap_or_default();
        let moved = groups
            .insert(name.clone(), group.clone())
            .is_some_and(|g| g != group);
        let patch = if moved {
            json!({"metadata": {"labels": {SETUP: null, format!("node-role.kubernetes.io/{group}"): ""}}})
        } else if labels.contains_key(STACK) && !labels.contains_key(SETUP) {
            json!({"metadata": {"labels": {SETUP: "true"}}})
        } else {
            continue;
        };
        // The change comes back through the watch; a failed write is tried
        // again a few times (nothing else would bring the node round).
        for _ in 0..5 {
            let written = nodes
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await;
            if written.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// A node agent for `node` on the fixture, with a kubelet of its own.
pub fn node_agent(world: &World, node: &str) -> NodeAgent {
    node_agent_with(world, node, 8)
}

/// [`node_agent`] on the first `gpus` cards of the fixture (at most 8).
pub fn node_agent_with(world: &World, node: &str, gpus: usize) -> NodeAgent {
    assert!((1..=8).contains(&gpus), "the fixture has 8 cards: {gpus}");
    let dir = tempfile::tempdir().expect("kubelet dir");
    let kubelet = switchyard_kubelet::fake::Kubelet::default();
    kubelet
        .serve(dir.path())
        .expect("serve the kubelet's sockets");
    // The fixture's first `gpus` cards; the agent gives them UUIDs of the
    // node's own (`fixture-per-node:`), as on real machines (the evidence
    // checks each is published once).
    let fixture = std::fs::read_to_string(FIXTURE).expect("the fixture");
    let mut cards = 0;
    let fixture: String = fixture
        .lines()
        .take_while(|line| {
            cards += usize::from(line.starts_with("- index: "));
            cards <= gpus
        })
        .map(|line| format!("{line}\n"))
        .collect();
    std::fs::write(dir.path().join("fixture.yaml"), fixture).expect("write the node's fixture");
    let agent = spawn_node_agent(world, node, dir.path());
    tokio::spawn(advertise(
        world.client.clone(),
        node.to_string(),
        kubelet.clone(),
    ));
    (KillOnDrop(agent), kubelet, dir)
}

/// Starts `node`'s agent on the kubelet and fixture in `dir`, its log
/// appended to the node's.
fn spawn_node_agent(world: &World, node: &str, dir: &Path) -> std::process::Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(world.dir.path().join(format!("node-agent-{node}.log")))
        .expect("agent log");
    let fixture_path = dir.join("fixture.yaml");
    Command::new((world.binary)("switchyard-node-agent"))
        .args(["serve", "--node-name", node, "--gpu-source"])
        .arg(format!("fixture-per-node:{}", fixture_path.display()))
        .arg("--kubelet-dir")
        .arg(dir)
        .arg("--cdi-dir")
        .arg(dir.join("cdi"))
        .env("KUBECONFIG", world.plane.kubeconfig())
        .env("SWITCHYARD_LOG_LEVEL", "info")
        .env("SWITCHYARD_LOG_FORMAT", "text")
        .envs(world.agent_env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start the node agent")
}

/// Kubelet's device manager for `node` (kwok has none): the devices the
/// node agent's device plugin lists healthy are the node's capacity and
/// allocatable of its resource; none once the plugin has gone, and none
/// before a plugin registered (the kwok node is made with `nvidia.com/gpu`
/// as a device-plugin node shows it; kubelet shows what a plugin lists).
async fn advertise(client: Client, node: String, kubelet: switchyard_kubelet::fake::Kubelet) {
    let nodes: Api<Node> = Api::all(client);
    let mut written = None;
    loop {
        let changed = kubelet.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        let mut now = kubelet.advertised.lock().expect("advertised").clone();
        now.entry("nvidia.com/gpu".to_string()).or_insert(0);
        if written.as_ref() != Some(&now) {
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
                written = Some(now);
            }
        }
        // Woken by the next change; a failed write is tried again.
        let _ = tokio::time::timeout(Duration::from_secs(1), changed).await;
    }
}

/// A kwok GPU node of the source group `gpu`: `gpus` H100s on the device
/// plugin, as the NodeGroup's node preparation labels them.
pub fn gpu_node(name: &str, gpus: usize) -> Node {
    let gpus = gpus.to_string();
    kwok_node(
        name,
        &[
            (GROUP, "gpu"),
            ("node-role.kubernetes.io/gpu", ""),
            ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),
            ("node.deckhouse.io/device-gpu.config", "exclusive"),
        ],
        &[
            ("nvidia.com/gpu", &gpus),
            ("cpu", "64"),
            ("memory", "512Gi"),
            ("pods", "110"),
        ],
        Vec::new(),
    )
}

/// Switchyard's node-agent DaemonSet as the chart labels it: kwok runs its
/// pods on the nodes the stack-assigner labels `dra` (the agents themselves
/// run as processes beside it, one per node).
pub async fn create_node_agent_daemonset(client: &Client) {
    create_namespace(client, "switchyard").await;
    let api: Api<DaemonSet> = Api::namespaced(client.clone(), "switchyard");
    let labels = json!({
        "app.kubernetes.io/name": "switchyard",
        "app.kubernetes.io/component": "node-agent",
    });
    let ds: DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": "switchyard-node-agent"},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {STACK: "dra"},
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{"name": "main", "image": "registry.example.com/agent:1"}],
                },
            },
        },
    }))
    .expect("daemonset");
    api.create(&PostParams::default(), &ds)
        .await
        .expect("create the node agent's DaemonSet");
}

/// Creates [`gpu_deployment`] `name` in `ml`.
pub async fn create_gpu_deployment(client: &Client, name: &str, replicas: i32) {
    Api::<Deployment>::namespaced(client.clone(), "ml")
        .create(&PostParams::default(), &gpu_deployment(name, replicas))
        .await
        .unwrap_or_else(|e| panic!("create {name}: {e}"));
}

/// A Deployment `name` on the device plugin: `replicas` pods of one
/// `nvidia.com/gpu` each, bound to the source group.
pub fn gpu_deployment(name: &str, replicas: i32) -> Deployment {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "nodeSelector": {GROUP: "gpu"},
                    "containers": [{
                        "name": "main", "image": "registry.example.com/app:1",
                        "resources": {"limits": {"nvidia.com/gpu": "1"}},
                    }],
                },
            },
        },
    }))
    .expect("deployment")
}

/// What a [`MigrationCluster`] is made of.
pub struct ClusterOptions<'a> {
    /// The GPU nodes, in the source group `gpu`.
    pub nodes: &'a [String],
    pub gpus_per_node: usize,
    /// Where the services' and node agents' binaries are.
    pub binary: Locate,
    /// Environment of every service (its flags), over the harness's.
    pub service_env: Vec<(String, String)>,
    /// Environment of every node agent, over the harness's.
    pub agent_env: Vec<(String, String)>,
    /// The module's version before an upgrade to this one, if it was
    /// upgraded (the upgrade hold).
    pub previous_version: Option<&'a str>,
    /// The services' API-server traffic through toxiproxy with these toxics
    /// (none: straight to the API server).
    pub toxics: &'a [Toxic<'a>],
    /// The services on their own ServiceAccounts with the chart's RBAC, in
    /// a priority level of API Priority and Fairness this many concurrency
    /// shares wide that rejects what it cannot seat (429); `None`: as the
    /// cluster's admin, which priority and fairness exempts.
    pub flow_shares: Option<u32>,
    /// How many nats-servers the log is on: 1, or a JetStream cluster of
    /// this many with a copy of the stream on each.
    pub nats_servers: usize,
    /// How many replicas of each service that runs elected (more than one:
    /// standbys, each replica reaching the API server and NATS through a
    /// proxy of its own, to cut it off).
    pub replicas: usize,
}

/// The priority level and flow schema the services' accounts are put in.
pub const FLOW_LEVEL: &str = "switchyard-narrow";

/// A toxic on the connections to the API server: its toxiproxy type, its
/// attributes, the share of connections it strikes, and whether it acts on
/// the requests (upstream) or the answers.
#[derive(Clone, Copy, Debug)]
pub struct Toxic<'a> {
    pub kind: &'a str,
    pub attributes: &'a [&'a str],
    pub toxicity: f32,
    pub upstream: bool,
}

/// A cluster migrating from `gpu` to `gpu-dra`: the control plane with
/// scheduler and controller-manager, kwok running the nodes (in `gpu`) with a
/// node agent each, node preparation played, every deciding service and
/// inventory as processes, the GPUClass `h100` (Step 2, from the
/// PhysicalGPUs' device label) and the namespace `ml`.
pub struct MigrationCluster {
    pub world: World,
    pub kwok: Kwok,
    pub agents: Vec<NodeAgent>,
    /// The GPU nodes, as `agents` serve them.
    nodes: Vec<String>,
    bashible: tokio::task::JoinHandle<()>,
    /// The proxy the services reach the API server through, if any.
    pub toxiproxy: Option<crate::toxiproxy::Toxiproxy>,
    /// The loopback port of the stack-assigner's /metrics (kept across its
    /// restarts).
    pub stack_assigner_metrics: u16,
    /// With standbys: the proxies each replica reaches the API server
    /// (`kube-<identity>`) and NATS (`nats-<identity>`) through.
    pub replica_proxies: Option<crate::toxiproxy::Toxiproxy>,
}

impl Drop for MigrationCluster {
    fn drop(&mut self) {
        self.bashible.abort();
    }
}

/// The services a migration runs on, as processes.
pub const SERVICES: [&str; 5] = [
    "inventory",
    "stack-assigner",
    "class-compiler",
    "claim-allocator",
    "alerter",
];

impl MigrationCluster {
    /// Kills `node`'s agent with SIGKILL and starts it again on the same
    /// kubelet and cards, as the DaemonSet's restart would.
    pub fn restart_agent(&mut self, node: &str) {
        let i = self
            .nodes
            .iter()
            .position(|n| n == node)
            .unwrap_or_else(|| panic!("no agent for node {node}"));
        let (agent, _, dir) = &mut self.agents[i];
        let _ = agent.0.kill();
        let _ = agent.0.wait();
        agent.0 = spawn_node_agent(&self.world, node, dir.path());
    }

    pub async fn start(options: ClusterOptions<'_>) -> MigrationCluster {
        let mut world = World::start_on_servers(
            Components {
                scheduler: true,
                controller_manager: true,
                flow_control: options.flow_shares.is_some(),
                ..Components::default()
            },
            options.binary,
            options.nats_servers,
        )
        .await;
        world.service_env.extend(options.service_env);
        world.agent_env = options.agent_env;
        let server = world.plane.url();
        let toxiproxy = (!options.toxics.is_empty()).then(|| {
            let proxy = crate::toxiproxy::Toxiproxy::start();
            let upstream = world.plane.url().trim_start_matches("https://").to_string();
            let listen = proxy.proxy("kube-apiserver", &upstream);
            for toxic in options.toxics {
                proxy.toxic(
                    "kube-apiserver",
                    toxic.kind,
                    toxic.attributes,
                    toxic.toxicity,
                    toxic.upstream,
                );
            }
            let config = world
                .plane
                .kubeconfig_via("toxiproxy.kubeconfig", &format!("https://{listen}"));
            world
                .service_env
                .push(("KUBECONFIG".into(), config.to_string_lossy().into_owned()));
            (proxy, format!("https://{listen}"))
        });
        let (toxiproxy, server) = match toxiproxy {
            Some((proxy, listen)) => (Some(proxy), listen),
            None => (None, server),
        };
        if let Some(shares) = options.flow_shares {
            for (service, kubeconfig) in service_accounts(&world, &server, shares).await {
                world.env_of.insert(
                    service,
                    vec![(
                        "KUBECONFIG".into(),
                        kubeconfig.to_string_lossy().into_owned(),
                    )],
                );
            }
        }
        let replica_proxies =
            (options.replicas > 1).then(|| replica_proxies(&mut world, options.replicas));
        let c = world.client.clone();
        let kwok = Kwok::start(&world.plane);
        create_group(&c, "gpu", true).await;
        create_group(&c, "gpu-dra", false).await;
        set_module_config(&c, true, options.previous_version).await;
        create_kwok_nodes(&c, &kwok, options.nodes, options.gpus_per_node).await;
        let agents = options
            .nodes
            .iter()
            .map(|n| node_agent_with(&world, n, options.gpus_per_node))
            .collect();
        create_node_agent_daemonset(&c).await;
        let bashible = tokio::spawn(prepare_nodes(c.clone()));
        let stack_assigner_metrics = crate::free_port();
        world.env_of.entry("stack-assigner").or_default().push((
            "SWITCHYARD_METRICS_LISTEN".into(),
            format!("127.0.0.1:{stack_assigner_metrics}"),
        ));
        for service in SERVICES {
            world.serve(service);
        }
        let class: GPUClass = serde_json::from_value(json!({
            "apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "GPUClass", "metadata": {"name": "h100"},
            "spec": {"selector": {"matchLabels": {"gpu.deckhouse.io/device": "h100-80gb-hbm3"}}},
        }))
        .expect("the GPUClass");
        Api::<GPUClass>::all(c.clone())
            .create(&PostParams::default(), &class)
            .await
            .expect("create the GPUClass");
        // Step 2 is done when the class-compiler has published the class's
        // DeviceClass (a move before it is refused for that, not for Step 3).
        let device_classes: Api<DeviceClass> = Api::all(c.clone());
        world
            .until("the DeviceClass of GPU class h100", || async {
                device_classes
                    .get_opt("h100.gpu.deckhouse.io")
                    .await
                    .is_ok_and(|d| d.is_some())
            })
            .await;
        // And inventory has recorded the module's settings as set above (DRA
        // on, its feature gates ready): before that the stack-assigner knows
        // no stack for gpu-dra, and a handover is refused for it (seen with
        // the API server answering inventory 429 at start).
        world
            .until(
                "inventory to record DRA on with its feature gates ready",
                || async {
                    let settings =
                        world
                            .events()
                            .await
                            .into_iter()
                            .rev()
                            .find_map(|(_, e)| match e.kind {
                                Some(Kind::ModuleSettingsObserved(m)) => Some(m),
                                _ => None,
                            });
                    settings.is_some_and(|m| m.dra_enabled && m.feature_gates_ready)
                },
            )
            .await;
        create_namespace(&c, "ml").await;
        MigrationCluster {
            world,
            kwok,
            agents,
            nodes: options.nodes.to_vec(),
            bashible,
            toxiproxy,
            stack_assigner_metrics,
            replica_proxies,
        }
    }
}

/// `replicas` of each elected service from now on, each reaching the API
/// server and NATS (one server) through proxies of its own on a toxiproxy
/// started for them.
fn replica_proxies(world: &mut World, replicas: usize) -> crate::toxiproxy::Toxiproxy {
    world.replicas = replicas;
    let proxy = crate::toxiproxy::Toxiproxy::start();
    let kube = world.plane.url().trim_start_matches("https://").to_string();
    let nats = world.nats.url().trim_start_matches("nats://").to_string();
    for service in SERVICES {
        for identity in world.replicas_of(service) {
            let to_kube = proxy.proxy(&format!("kube-{identity}"), &kube);
            let to_nats = proxy.proxy(&format!("nats-{identity}"), &nats);
            let kubeconfig = world.plane.kubeconfig_via(
                &format!("{identity}.kubeconfig"),
                &format!("https://{to_kube}"),
            );
            world.replica_env.insert(
                identity,
                vec![
                    (
                        "KUBECONFIG".into(),
                        kubeconfig.to_string_lossy().into_owned(),
                    ),
                    ("SWITCHYARD_NATS_URL".into(), format!("nats://{to_nats}")),
                ],
            );
        }
    }
    proxy
}

/// The chart's ServiceAccounts and RBAC, as `helm template` renders them
/// (release `switchyard` in `switchyard-system`), created; a priority level
/// `shares` concurrency shares wide that rejects what it cannot seat, with
/// a flow schema putting those accounts in it; and a kubeconfig with a
/// token of each service's account (for `server`), by service.
async fn service_accounts(
    world: &World,
    server: &str,
    shares: u32,
) -> BTreeMap<&'static str, PathBuf> {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::flowcontrol::v1::{FlowSchema, PriorityLevelConfiguration};
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    const NAMESPACE: &str = "switchyard-system";
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/helm/switchyard");
    let helm = crate::helm_binary().unwrap_or_else(|e| panic!("{e}"));
    let out = Command::new(&helm)
        .args(["template", "switchyard"])
        .arg(&chart)
        .args(["--namespace", NAMESPACE])
        // The chart needs a bus to render; the test's own is used instead.
        .args(["--set", "nats.url=nats://127.0.0.1:4222"])
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", helm.display()));
    assert!(
        out.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let docs: Vec<serde_json::Value> = text
        .split("\n---")
        .filter_map(|doc| serde_yaml_ng::from_str(doc).ok())
        .filter(|doc: &serde_json::Value| doc.is_object())
        .collect();
    let c = world.client.clone();
    create_namespace(&c, NAMESPACE).await;
    let pp = PostParams::default();
    let mut accounts = BTreeMap::new();
    for doc in docs {
        let namespace = doc["metadata"]["namespace"]
            .as_str()
            .unwrap_or(NAMESPACE)
            .to_string();
        let namespace = namespace.as_str();
        let what = format!("{} {}", doc["kind"], doc["metadata"]["name"]);
        let created = match doc["kind"].as_str() {
            Some("ServiceAccount") => {
                let component = doc["metadata"]["labels"]["app.kubernetes.io/component"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string();
                let account: ServiceAccount =
                    serde_json::from_value(doc).expect("a ServiceAccount");
                accounts.insert(component, account.name_any());
                Api::namespaced(c.clone(), namespace)
                    .create(&pp, &account)
                    .await
                    .map(drop)
            }
            Some("ClusterRole") => Api::<ClusterRole>::all(c.clone())
                .create(&pp, &serde_json::from_value(doc).expect("a ClusterRole"))
                .await
                .map(drop),
            Some("ClusterRoleBinding") => Api::<ClusterRoleBinding>::all(c.clone())
                .create(
                    &pp,
                    &serde_json::from_value(doc).expect("a ClusterRoleBinding"),
                )
                .await
                .map(drop),
            Some("Role") => Api::<Role>::namespaced(c.clone(), namespace)
                .create(&pp, &serde_json::from_value(doc).expect("a Role"))
                .await
                .map(drop),
            Some("RoleBinding") => Api::<RoleBinding>::namespaced(c.clone(), namespace)
                .create(&pp, &serde_json::from_value(doc).expect("a RoleBinding"))
                .await
                .map(drop),
            _ => Ok(()),
        };
        created.unwrap_or_else(|e| panic!("create the chart's {what}: {e}"));
    }
    let level: PriorityLevelConfiguration = serde_json::from_value(json!({
        "metadata": {"name": FLOW_LEVEL},
        "spec": {"type": "Limited", "limited": {
            "nominalConcurrencyShares": shares,
            "lendablePercent": 0,
            "borrowingLimitPercent": 0,
            "limitResponse": {"type": "Reject"},
        }},
    }))
    .expect("a PriorityLevelConfiguration");
    Api::<PriorityLevelConfiguration>::all(c.clone())
        .create(&pp, &level)
        .await
        .expect("create the priority level");
    let subjects: Vec<serde_json::Value> = accounts
        .values()
        .map(|name| json!({"kind": "ServiceAccount", "serviceAccount": {"namespace": NAMESPACE, "name": name}}))
        .collect();
    let schema: FlowSchema = serde_json::from_value(json!({
        "metadata": {"name": FLOW_LEVEL},
        "spec": {
            "priorityLevelConfiguration": {"name": FLOW_LEVEL},
            "matchingPrecedence": 100,
            "distinguisherMethod": {"type": "ByUser"},
            "rules": [{
                "subjects": subjects,
                "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"], "clusterScope": true, "namespaces": ["*"]}],
                "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}],
            }],
        },
    }))
    .expect("a FlowSchema");
    Api::<FlowSchema>::all(c.clone())
        .create(&pp, &schema)
        .await
        .expect("create the flow schema");
    let mut kubeconfigs = BTreeMap::new();
    for service in SERVICES {
        let account = accounts
            .get(service)
            .unwrap_or_else(|| panic!("the chart renders no ServiceAccount for {service}"));
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                expiration_seconds: Some(3600),
                ..TokenRequestSpec::default()
            }),
            ..TokenRequest::default()
        };
        let token = Api::<ServiceAccount>::namespaced(c.clone(), NAMESPACE)
            .create_token_request(account, &pp, &request)
            .await
            .unwrap_or_else(|e| panic!("a token of {account}: {e}"))
            .status
            .and_then(|status| status.token)
            .unwrap_or_else(|| panic!("the API server gave {account} no token"));
        let kubeconfig =
            world
                .plane
                .kubeconfig_as(&format!("{service}.kubeconfig"), server, &token);
        kubeconfigs.insert(service, kubeconfig);
    }
    kubeconfigs
}

/// How many requests API Priority and Fairness rejected (429) in the
/// services' priority level, from the API server's metrics.
pub async fn rejected_requests(client: &Client) -> u64 {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .expect("a request");
    let text = client
        .request_text(request)
        .await
        .expect("the API server's metrics");
    text.lines()
        .filter(|line| {
            line.starts_with("apiserver_flowcontrol_rejected_requests_total{")
                && line.contains(&format!("priority_level=\"{FLOW_LEVEL}\""))
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Creates the GPU nodes, a few at a time, and waits until kwok has made
/// them all Ready.
async fn create_kwok_nodes(client: &Client, kwok: &Kwok, names: &[String], gpus: usize) {
    let api: Api<Node> = Api::all(client.clone());
    futures::stream::iter(names)
        .map(|name| {
            let api = api.clone();
            async move {
                api.create(&PostParams::default(), &gpu_node(name, gpus))
                    .await
                    .unwrap_or_else(|e| panic!("create node {name}: {e}"));
            }
        })
        .buffer_unordered(16)
        .collect::<()>()
        .await;
    let ready = eventually(
        &format!("{} nodes Ready", names.len()),
        WAIT + Duration::from_millis(100) * names.len() as u32,
        || async {
            api.list(&Default::default()).await.is_ok_and(|list| {
                let ready: std::collections::BTreeSet<String> = list
                    .items
                    .iter()
                    .filter(|n| node_is_ready(n))
                    .map(|n| n.name_any())
                    .collect();
                names.iter().all(|n| ready.contains(n))
            })
        },
    )
    .await;
    if let Err(err) = ready {
        panic!("{err}\n--- kwok.log\n{}", kwok.log_tail());
    }
}

/// The log's events, decoded, with their authors.
pub async fn events_in(log: &dyn EventLog) -> Vec<(String, DomainEvent)> {
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

/// The ResourceSlices the API server lists, and those inventory's
/// records hold live now, by name: the facts the claim-allocator checks
/// evidence on are current for slices when the two are equal.
pub async fn slices_listed_and_recorded(
    client: &Client,
    events: &[(String, DomainEvent)],
) -> (BTreeSet<String>, BTreeSet<String>) {
    let listed = Api::<ResourceSlice>::all(client.clone())
        .list(&Default::default())
        .await
        .map(|l| l.items.iter().map(ResourceExt::name_any).collect())
        .unwrap_or_default();
    let mut recorded = BTreeSet::new();
    for (_, e) in events {
        match &e.kind {
            Some(Kind::ResourceSliceObserved(s)) => {
                recorded.insert(s.name.clone());
            }
            Some(Kind::ResourceSliceRemoved(s)) => {
                recorded.remove(&s.name);
            }
            _ => {}
        }
    }
    (listed, recorded)
}

/// Each ResourceClaim (`namespace/name`) with the pods it is reserved
/// for, as the API server lists them and as inventory last recorded them.
pub async fn claims_listed_and_recorded(
    client: &Client,
    events: &[(String, DomainEvent)],
) -> (Reservations, Reservations) {
    let listed = Api::<ResourceClaim>::all(client.clone())
        .list(&Default::default())
        .await
        .map(|l| {
            l.items
                .iter()
                .map(|claim| {
                    let pods = claim
                        .status
                        .as_ref()
                        .and_then(|s| s.reserved_for.as_ref())
                        .into_iter()
                        .flatten()
                        .filter(|r| r.resource == "pods")
                        .map(|r| r.name.clone())
                        .collect();
                    (
                        format!(
                            "{}/{}",
                            claim.namespace().unwrap_or_default(),
                            claim.name_any()
                        ),
                        pods,
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    let mut recorded = Reservations::new();
    for (_, e) in events {
        match &e.kind {
            Some(Kind::ResourceClaimObserved(c)) => {
                recorded.insert(
                    format!("{}/{}", c.namespace, c.name),
                    c.reserved_for.iter().cloned().collect(),
                );
            }
            Some(Kind::ResourceClaimRemoved(c)) => {
                recorded.remove(&format!("{}/{}", c.namespace, c.name));
            }
            _ => {}
        }
    }
    (listed, recorded)
}

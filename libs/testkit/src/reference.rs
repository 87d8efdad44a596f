//! The simulator's reference migration driven on a real cluster: its
//! cluster before the migration made on kwok, each of its steps run as the
//! command an operator types, and the end compared with the simulator's —
//! optionally with a fault in every step, the services' API traffic through
//! toxiproxy, or on their own accounts in a narrow priority level. Shared by
//! the process tests (`services/switchyard/tests/migration_cluster.rs`) and
//! the `switchyard-loadtest soak` command.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod, ResourceQuota};
use kube::Client;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use switchyard_proto::v1::DomainEvent;
use switchyard_proto::v1::domain_event::Kind;

use crate::migration::{
    ClusterOptions, Locate, MigrationCluster, SETUP, STACK, Toxic, WAIT, World,
};

/// How [`run`] drives the scenario.
pub struct Options<'a> {
    /// A fault in every step, from this seed (`None`: none).
    pub faults: Option<u64>,
    /// The services' API traffic through toxiproxy with these toxics, while
    /// another client keeps changing the objects under them.
    pub toxics: &'a [Toxic<'a>],
    /// The services on their own accounts in a priority level this many
    /// concurrency shares wide ([`ClusterOptions::flow_shares`]).
    pub flow_shares: Option<u32>,
    /// Where the services' and node agents' binaries are.
    pub binary: Locate,
    /// The `switchyard` CLI the steps are typed into.
    pub cli: &'a Path,
    /// How many nats-servers the log is on. More than one: a JetStream
    /// cluster with a copy of the stream on each, whose faults are the
    /// cluster's own (its stream's leader killed, a server cut off from the
    /// others, a server's store wiped), and which must end with every
    /// server's store holding every record.
    pub nats_servers: usize,
    /// How many replicas of each elected service. More than one: the faults
    /// are the leaders' own — the leader of the service that takes the
    /// step's command killed, cut off from the API server, cut off from
    /// NATS — and the standby must take over.
    pub replicas: usize,
}

/// Switchyard's own share of the migration's wall time, from the log from
/// `first` on: each decision's distance from the record before it (what it
/// reacted to), summed; the rest is the cluster's (pods stopping and
/// starting, kubelet, the scheduler) and the operator's typing.
pub fn decision_share(
    records: &[switchyard_eventlog::StoredEvent],
    first: u64,
) -> std::time::Duration {
    let mut previous = None;
    let mut share = 0i64;
    for r in records.iter().filter(|r| r.sequence >= first) {
        let at = r.envelope.recorded_at_unix_nanos;
        if let Some(before) = previous
            && r.envelope.actor != "inventory"
        {
            share += at - before;
        }
        previous = Some(at);
    }
    std::time::Duration::from_nanos(share.max(0) as u64)
}

/// A fault struck during a step.
#[derive(Clone, Debug)]
pub struct Struck {
    /// The simulator's step, e.g. "step 3: hand over gpu-0".
    pub step: String,
    /// Which fault: "kill inventory", "kill the node agent", "kill the
    /// waiting CLI", "restart nats-server", ...
    pub fault: &'static str,
    /// What was done, in words (and, for the API server and etcd, how soon
    /// a change made on their return was recorded).
    pub what: String,
    /// How many records into the step it struck (the kill point).
    pub after: u64,
    /// With standbys: from the fault to the record of the term a standby
    /// began (the failover).
    pub failover: Option<std::time::Duration>,
}

impl std::fmt::Display for Struck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {}, {} record(s) into the step",
            self.step, self.what, self.after
        )
    }
}

/// What a [`run`] met on its way to the simulator's end (it panics, naming
/// the difference, when it does not get there).
#[derive(Debug, Default)]
pub struct Report {
    /// The faults struck, one per step.
    pub struck: Vec<Struck>,
    /// Requests the narrow priority level rejected (429).
    pub rejected: Option<u64>,
    /// With toxics: changes made under the services, and lines of their
    /// logs naming a 409.
    pub changes: Option<(usize, usize)>,
}

/// Whether the last record of GPU class `name` names a DeviceClass.
pub fn class_published(events: &[(String, switchyard_proto::v1::DomainEvent)], name: &str) -> bool {
    events
        .iter()
        .rev()
        .find_map(|(_, e)| match &e.kind {
            Some(Kind::GpuClassObserved(c)) if c.name == name => {
                Some(!c.device_class_names.is_empty())
            }
            Some(Kind::GpuClassRemoved(c)) if c.name == name => Some(false),
            _ => None,
        })
        .unwrap_or(false)
}

/// Whether the record holds what a migration's commands are decided on, as
/// an operator's `switchyard status` would show it: DRA on with its feature
/// gates ready, every workload of `names` in `ml` with `pods` running pods,
/// and GPU class h100 with its DeviceClass.
pub fn recorded_for_migration(
    events: &[(String, switchyard_proto::v1::DomainEvent)],
    names: &[String],
    pods: usize,
) -> bool {
    let (recorded, running) = recorded_in(events, "ml");
    let dra = events.iter().rev().find_map(|(_, e)| match &e.kind {
        Some(Kind::ModuleSettingsObserved(m)) => Some(m.dra_enabled && m.feature_gates_ready),
        _ => None,
    });
    dra == Some(true)
        && names.iter().all(|n| recorded.contains(n))
        && running == pods
        && class_published(events, "h100")
}

/// The workloads (by name) inventory's records hold live in `namespace`,
/// and how many of their pods they hold running.
pub fn recorded_in(
    events: &[(String, switchyard_proto::v1::DomainEvent)],
    namespace: &str,
) -> (std::collections::BTreeSet<String>, usize) {
    use switchyard_proto::v1::PodPhase;
    let mut workloads = std::collections::BTreeSet::new();
    let mut running = std::collections::BTreeSet::new();
    for (_, e) in events {
        match &e.kind {
            Some(Kind::WorkloadObserved(w)) => {
                if let Some(id) = w.workload.as_ref().filter(|id| id.namespace == namespace) {
                    workloads.insert(id.name.clone());
                }
            }
            Some(Kind::WorkloadRemoved(w)) => {
                if let Some(id) = w.workload.as_ref().filter(|id| id.namespace == namespace) {
                    workloads.remove(&id.name);
                }
            }
            Some(Kind::PodObserved(p)) if p.namespace == namespace => {
                if p.phase == PodPhase::Running as i32 {
                    running.insert(p.name.clone());
                } else {
                    running.remove(&p.name);
                }
            }
            Some(Kind::PodRemoved(p)) if p.namespace == namespace => {
                running.remove(&p.name);
            }
            _ => {}
        }
    }
    (workloads, running.len())
}

/// The pods of `app` in `ml`.
pub async fn pods_of(client: &Client, app: &str) -> Vec<Pod> {
    Api::<Pod>::namespaced(client.clone(), "ml")
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await
        .expect("list pods")
        .items
}

/// The ResourceQuota `gpu-quota` in `ml` with this `spec.hard`.
pub async fn create_quota(client: &Client, hard: serde_json::Value) {
    let quota: ResourceQuota = serde_json::from_value(json!({
        "metadata": {"name": "gpu-quota"},
        "spec": {"hard": hard},
    }))
    .expect("the quota");
    Api::<ResourceQuota>::namespaced(client.clone(), "ml")
        .create(&PostParams::default(), &quota)
        .await
        .expect("create the quota");
}

/// How many pods of these apps run.
pub async fn running_of(client: &Client, apps: &[&str]) -> usize {
    let mut running = 0;
    for app in apps {
        running += running_on(&pods_of(client, app).await).len();
    }
    running
}

/// The nodes the running pods among `pods` run on.
pub fn running_on(pods: &[Pod]) -> Vec<String> {
    pods.iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .filter_map(|p| p.spec.as_ref().and_then(|s| s.node_name.clone()))
        .collect()
}

/// A GPU node as a migration leaves it: the labels Deckhouse, Switchyard
/// and NVIDIA own, the taints and whether it is cordoned.
type NodeEnd = (
    BTreeMap<String, String>,
    Vec<switchyard_proto::v1::Taint>,
    bool,
);

/// A workload as a migration leaves it: its pod template as placement reads
/// it (resources, node selector), and its pods' nodes and phases.
type WorkloadEnd = (
    switchyard_proto::v1::WorkloadPlacement,
    Vec<(String, switchyard_proto::v1::PodPhase)>,
);

/// The part of a cluster a migration changes, as the simulator and the API
/// server each show it.
#[derive(Debug, PartialEq)]
pub struct EndState {
    nodes: BTreeMap<String, NodeEnd>,
    workloads: BTreeMap<String, WorkloadEnd>,
    /// The namespace's quota.
    quota: BTreeMap<String, String>,
    /// Per NodeGroup: whether it has spec.gpu.
    groups: BTreeMap<String, bool>,
}

/// The simulator's workloads with every container's CPU limit `cpu`
/// instead of its own, in its facts (what the cluster is made from) and in
/// the end expected of them: real nodes have the machine's CPUs, not a
/// simulated node's.
pub fn with_cpu_limit(
    facts: &mut [switchyard_proto::v1::DomainEvent],
    expected: &mut EndState,
    cpu: &str,
) {
    let set = |placement: &mut switchyard_proto::v1::WorkloadPlacement| {
        for limits in placement.container_limits.values_mut() {
            if let Some(quantity) = limits.quantities.get_mut("cpu") {
                *quantity = cpu.to_string();
            }
        }
    };
    for fact in facts {
        if let Some(Kind::WorkloadObserved(w)) = &mut fact.kind
            && let Some(placement) = &mut w.placement
        {
            set(placement);
        }
    }
    for (placement, _) in expected.workloads.values_mut() {
        set(placement);
    }
}

pub const PARITY_NODES: [&str; 2] = ["gpu-0", "gpu-1"];
pub const PARITY_GROUPS: [&str; 2] = ["gpu", "gpu-dra"];

fn owned_labels(labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    labels
        .iter()
        .filter(|(k, _)| {
            [
                "node.deckhouse.io/",
                "node-role.kubernetes.io/",
                "nvidia.com/",
                "gpu.deckhouse.io/",
            ]
            .iter()
            .any(|p| k.starts_with(p))
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn sim_end_state(sim: &switchyard_sim::Simulator) -> EndState {
    let nodes = PARITY_NODES
        .iter()
        .map(|n| {
            (
                n.to_string(),
                (
                    owned_labels(sim.node_labels(n).expect("the simulator's node")),
                    sim.node_taints(n).unwrap_or_default().to_vec(),
                    sim.node_unschedulable(n).unwrap_or_default(),
                ),
            )
        })
        .collect();
    let workloads = sim
        .workloads()
        .iter()
        .map(|w| {
            let mut pods = sim.workload_pods(w);
            pods.sort();
            (
                w.name.clone(),
                (sim.workload_placement(w).cloned().unwrap_or_default(), pods),
            )
        })
        .collect();
    EndState {
        nodes,
        workloads,
        quota: sim.quota("ml", "gpu-quota").cloned().unwrap_or_default(),
        groups: PARITY_GROUPS
            .iter()
            .map(|g| (g.to_string(), sim.group_has_gpu(g).unwrap_or_default()))
            .collect(),
    }
}

/// The same view of the cluster on the API server, through the facts the
/// inventory reports.
pub async fn cluster_end_state(client: &Client, names: &[String]) -> EndState {
    use switchyard_kube::facts;
    let mut nodes = BTreeMap::new();
    for n in PARITY_NODES {
        let node = Api::<Node>::all(client.clone()).get(n).await.expect("node");
        let Some(Kind::NodeObserved(fact)) = facts::node(&node).kind else {
            panic!("a node's fact")
        };
        nodes.insert(
            n.to_string(),
            (owned_labels(&fact.labels), fact.taints, fact.unschedulable),
        );
    }
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "ml");
    let mut workloads = BTreeMap::new();
    for name in names {
        let d = deployments.get(name).await.expect("deployment");
        let placement = facts::placement(d.spec.as_ref().and_then(|s| s.template.spec.as_ref()));
        let mut pods: Vec<(String, switchyard_proto::v1::PodPhase)> = pods_of(client, name)
            .await
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| match facts::pod(p).kind {
                Some(Kind::PodObserved(o)) => Some((
                    o.node,
                    switchyard_proto::v1::PodPhase::try_from(o.phase).unwrap_or_default(),
                )),
                _ => None,
            })
            .collect();
        pods.sort();
        workloads.insert(name.clone(), (placement, pods));
    }
    let quota = Api::<ResourceQuota>::namespaced(client.clone(), "ml")
        .get("gpu-quota")
        .await
        .ok()
        .and_then(|q| q.spec)
        .and_then(|s| s.hard)
        .unwrap_or_default()
        .into_iter()
        .map(|(k, q)| (k, q.0))
        .collect();
    let mut groups = BTreeMap::new();
    for g in PARITY_GROUPS {
        let group = Api::<switchyard_api::NodeGroup>::all(client.clone())
            .get(g)
            .await
            .expect("group");
        groups.insert(g.to_string(), group.spec.gpu.is_some());
    }
    EndState {
        nodes,
        workloads,
        quota,
        groups,
    }
}

/// What strikes during a step.
#[derive(Clone, Copy, Debug)]
enum Fault {
    Kill(&'static str),
    /// A node's agent (the n-th fault strikes gpu-(n mod 2)'s).
    KillAgent,
    /// The operator's `switchyard` waiting for the step: killed, then the
    /// same command typed again (the same `--id`).
    KillCli,
    RestartNats,
    RestartApiServer,
    PauseEtcd,
    Junk,
    /// On a JetStream cluster: the server leading the stream killed
    /// (SIGKILL) and, once another leads, started again.
    KillStreamLeader,
    /// On a JetStream cluster: a server's routes to the others cut for a
    /// while, then joined again.
    CutOffServer,
    /// On a JetStream cluster: a server killed, its store wiped, and started
    /// again with nothing.
    WipeServer,
    /// With standbys: the leader of the service killed (SIGKILL), started
    /// again once a standby leads.
    KillLeader(&'static str),
    /// With standbys: the leader of the service cut off from the API
    /// server (its proxy stopped) until a standby leads.
    CutLeaderFromApi(&'static str),
    /// With standbys: the leader of the service cut off from NATS until a
    /// standby leads.
    CutLeaderFromNats(&'static str),
}

impl Fault {
    /// The fault's kind, for reports.
    fn name(self) -> &'static str {
        match self {
            Fault::Kill("inventory") => "kill inventory",
            Fault::Kill("stack-assigner") => "kill stack-assigner",
            Fault::Kill("class-compiler") => "kill class-compiler",
            Fault::Kill("claim-allocator") => "kill claim-allocator",
            Fault::Kill("alerter") => "kill alerter",
            Fault::Kill(_) => "kill a service",
            Fault::KillAgent => "kill a node agent",
            Fault::KillCli => "kill the waiting CLI",
            Fault::RestartNats => "restart nats-server",
            Fault::RestartApiServer => "restart kube-apiserver",
            Fault::PauseEtcd => "pause etcd",
            Fault::Junk => "publish a record that is no envelope",
            Fault::KillStreamLeader => "kill the stream's leader",
            Fault::CutOffServer => "cut a nats-server off",
            Fault::WipeServer => "wipe a nats-server's store",
            Fault::KillLeader(_) => "kill the leader",
            Fault::CutLeaderFromApi(_) => "cut the leader off the API server",
            Fault::CutLeaderFromNats(_) => "cut the leader off NATS",
        }
    }
}

/// A small deterministic generator (SplitMix64): the same seed, the same
/// faults; and where in the list of faults the steps start.
struct Seeded(u64, usize);

impl Seeded {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// The fault of the `n`-th step and how many records after the
    /// command's first it strikes: the faults in turn from a place the seed
    /// picks — each service killed, nats-server, the API server and etcd,
    /// a record that is no envelope — at a point the seed picks.
    /// A step that does not wait (`evidence`, `complete`) has the next
    /// fault instead of the CLI's kill: an answer printed is all it waits for.
    /// With standbys, the `k`-th fault of the leader of `owner` (the
    /// service taking the step's command): killed, cut off from the API
    /// server, cut off from NATS, in turn.
    fn fault(
        &mut self,
        n: usize,
        waits: bool,
        cluster: bool,
        owner: Option<(&'static str, usize)>,
    ) -> (Fault, u64) {
        if let Some((service, k)) = owner {
            if n == 0 {
                self.1 = self.below(3) as usize;
            }
            let faults = [
                Fault::KillLeader(service),
                Fault::CutLeaderFromApi(service),
                Fault::CutLeaderFromNats(service),
            ];
            return (faults[(self.1 + k) % faults.len()], self.below(4));
        }
        const CLUSTER_FAULTS: [Fault; 3] = [
            Fault::KillStreamLeader,
            Fault::CutOffServer,
            Fault::WipeServer,
        ];
        if cluster {
            if n == 0 {
                self.1 = self.below(CLUSTER_FAULTS.len() as u64) as usize;
            }
            return (
                CLUSTER_FAULTS[(self.1 + n) % CLUSTER_FAULTS.len()],
                self.below(4),
            );
        }
        const FAULTS: [Fault; 11] = [
            Fault::Kill("inventory"),
            Fault::KillCli,
            Fault::RestartNats,
            Fault::Kill("stack-assigner"),
            Fault::KillAgent,
            Fault::RestartApiServer,
            Fault::Kill("class-compiler"),
            Fault::Junk,
            Fault::Kill("claim-allocator"),
            Fault::PauseEtcd,
            Fault::Kill("alerter"),
        ];
        if n == 0 {
            self.1 = self.below(FAULTS.len() as u64) as usize;
        }
        let mut at = (self.1 + n) % FAULTS.len();
        if matches!(FAULTS[at], Fault::KillCli) && !waits {
            at = (at + 1) % FAULTS.len();
        }
        (FAULTS[at], self.below(4))
    }
}

/// Runs the `switchyard` CLI at `cli` as the operator `ops@example.com`
/// against the bus at `nats` and the API server of `kubeconfig` (taken apart
/// from the world, which a fault may be changing meanwhile).
pub fn cli_at(
    cli: &Path,
    nats: &str,
    kubeconfig: &Path,
    args: &[impl AsRef<std::ffi::OsStr>],
) -> (i32, String, String) {
    let out = cli_command(cli, nats, kubeconfig, args)
        .output()
        .expect("run switchyard");
    exit_and_output(out)
}

/// `switchyard_log_records_passed_over_total` of `service` and `reason` in
/// a scrape of /metrics.
fn passed_over(metrics: &str, service: &str, reason: &str) -> Option<f64> {
    let series = format!(
        "switchyard_log_records_passed_over_total{{service=\"{service}\",reason=\"{reason}\"}} "
    );
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(&series))
        .and_then(|value| value.trim().parse().ok())
}

/// `switchyard` with `args` as the operator `ops@example.com`, on the bus
/// at `nats` and the cluster of `kubeconfig`; not started.
pub fn cli_command(
    cli: &Path,
    nats: &str,
    kubeconfig: &Path,
    args: &[impl AsRef<std::ffi::OsStr>],
) -> Command {
    let mut command = Command::new(cli);
    command
        .args(args)
        .env("SWITCHYARD_NATS_URL", nats)
        .env("KUBECONFIG", kubeconfig)
        .env("SWITCHYARD_ACTOR", "ops@example.com")
        .env("SWITCHYARD_TIMEOUT", "5m");
    command
}

fn exit_and_output(out: std::process::Output) -> (i32, String, String) {
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Strikes `fault` on the cluster (`cli`: the waiting command's process);
/// returns what it did, for the report.
async fn strike(cluster: &mut MigrationCluster, fault: Fault, n: usize, cli: u32) -> String {
    if let Fault::KillAgent = fault {
        let node = PARITY_NODES[n % PARITY_NODES.len()];
        cluster.restart_agent(node);
        return format!("killed the node agent of {node} (SIGKILL) and started it again");
    }
    let metrics_port = cluster.stack_assigner_metrics;
    let world = &mut cluster.world;
    match fault {
        Fault::Kill(service) => {
            world.stop(service);
            world.serve(service);
            format!("killed {service} (SIGKILL) and started it again")
        }
        Fault::KillAgent => unreachable!("struck above"),
        Fault::KillCli => {
            let killed = Command::new("kill")
                .args(["-KILL", &cli.to_string()])
                .status()
                .expect("run kill");
            format!(
                "killed the waiting switchyard (SIGKILL{}) and typed the command again",
                if killed.success() {
                    ""
                } else {
                    ": it had ended"
                }
            )
        }
        Fault::RestartNats => {
            world.nats.server_mut().expect("one nats-server").restart();
            "killed nats-server (SIGKILL) and started it again".into()
        }
        Fault::KillStreamLeader | Fault::CutOffServer | Fault::WipeServer => {
            strike_nats_cluster(world, fault, n).await
        }
        Fault::KillLeader(_) | Fault::CutLeaderFromApi(_) | Fault::CutLeaderFromNats(_) => {
            unreachable!("struck by strike_leader")
        }
        Fault::RestartApiServer => {
            let started = std::time::Instant::now();
            world.plane.restart_apiserver().await;
            let down = started.elapsed();
            let seen = fact_after_return(world, n).await;
            format!(
                "killed kube-apiserver and started it again (down {down:?}); a change made on its return recorded after {seen:?}"
            )
        }
        Fault::PauseEtcd => {
            world.plane.pause_etcd();
            // Longer than a watch waits for its next event before the API
            // server's own timeout; a pause, the fault itself.
            tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            world.plane.resume_etcd();
            let seen = fact_after_return(world, n).await;
            format!("paused etcd for 5 s; a change made on its return recorded after {seen:?}")
        }
        Fault::Junk => {
            let client = async_nats::connect(world.nats.url())
                .await
                .expect("connect to NATS");
            async_nats::jetstream::new(client)
                .publish("switchyard.log.junk", "not a proto".into())
                .await
                .expect("publish")
                .await
                .expect("stored");
            // Passed over, and counted where an alert reads it.
            let counted = || async {
                crate::scrape(metrics_port)
                    .await
                    .ok()
                    .and_then(|text| passed_over(&text, "stack-assigner", "malformed"))
                    .unwrap_or(0.0)
            };
            crate::eventually(
                "the stack-assigner to count it on /metrics",
                WAIT,
                || async { counted().await >= 1.0 },
            )
            .await
            .unwrap_or_else(|e| panic!("{e}\n{}", world.output()));
            let counted = counted().await;
            format!(
                "published 11 bytes that are no envelope on switchyard.log.junk; the stack-assigner's /metrics counts {counted} passed over as malformed"
            )
        }
    }
}

/// The service that takes the command of step `s`: the stack-assigner a
/// node's handover and rollback, the claim-allocator the rest.
fn step_owner(s: &str) -> &'static str {
    if s.starts_with("step 3: hand over") || s.starts_with("rollback: node") {
        "stack-assigner"
    } else {
        "claim-allocator"
    }
}

/// The term of `service` a replica other than `deposed` began after log
/// sequence `after`: its holder and when it was recorded.
async fn term_after(
    log: &dyn switchyard_eventlog::EventLog,
    service: &str,
    deposed: &str,
    after: u64,
) -> Option<(String, u64, i64)> {
    let subject = switchyard_eventlog::Subject::new(switchyard_core::subjects::LEADERS_SUBJECT)
        .expect("a subject");
    let records = log
        .read(switchyard_eventlog::ReadRequest {
            subject: Some(subject),
            from: after + 1,
            limit: None,
        })
        .await
        .ok()?;
    records.iter().find_map(|r| match r.decode() {
        switchyard_eventlog::Decoded::Event(DomainEvent {
            kind: Some(Kind::LeaderTermStarted(term)),
        }) if term.service == service && term.holder != deposed => {
            Some((term.holder, r.sequence, r.envelope.recorded_at_unix_nanos))
        }
        _ => None,
    })
}

/// Strikes the leader of `service` (run with standbys): killed, or cut off
/// from the API server or NATS; waits for a standby to begin its term and,
/// for a cut, for the deposed leader to stop on its own; then starts the
/// deposed one again (as its pod's restart would), its proxies back.
/// What it did, and the failover: from the fault to the new term's record.
async fn strike_leader(
    cluster: &mut MigrationCluster,
    fault: Fault,
    service: &'static str,
) -> (String, std::time::Duration) {
    let world = &mut cluster.world;
    let proxies = cluster
        .replica_proxies
        .as_ref()
        .expect("standbys reach the servers through proxies");
    // A replica that stopped on its own (a leader that stepped down, say,
    // starved of CPU past its margin) comes back, as Kubernetes restarts
    // its pod, before the next fault needs it as the standby.
    let mut came_back = Vec::new();
    for other in crate::migration::SERVICES {
        for identity in world.replicas_of(other) {
            if world.replica_exited(&identity) {
                world.restart_replica(&identity);
                came_back.push(identity);
            }
        }
    }
    if !came_back.is_empty() {
        eprintln!("started again, having stopped on their own: {came_back:?}");
    }
    let leader = std::cell::RefCell::new(None);
    crate::eventually(&format!("{service} to have a leader"), WAIT, || async {
        *leader.borrow_mut() = world.leader_of(service).await;
        leader.borrow().is_some()
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", world.output()));
    let leader = leader.into_inner().expect("a leader");
    let log = world.log().await;
    let before = log
        .last_sequence(None)
        .await
        .expect("the log's last sequence");
    let struck_at = switchyard_eventlog::now_nanos();
    let did = match fault {
        Fault::KillLeader(_) => {
            world.kill_replica(&leader);
            format!("killed {leader}, the leader of {service} (SIGKILL)")
        }
        Fault::CutLeaderFromApi(_) => {
            proxies.set_enabled(&format!("kube-{leader}"), false);
            format!("cut {leader}, the leader of {service}, off the API server")
        }
        Fault::CutLeaderFromNats(_) => {
            proxies.set_enabled(&format!("nats-{leader}"), false);
            format!("cut {leader}, the leader of {service}, off NATS")
        }
        _ => unreachable!("not a leader's fault"),
    };
    let term = std::cell::RefCell::new(None);
    crate::eventually(
        &format!("a standby of {service} to lead after {did}"),
        WAIT,
        || async {
            *term.borrow_mut() = term_after(log.as_ref(), service, &leader, before).await;
            term.borrow().is_some()
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", world.output()));
    let (holder, sequence, at) = term.into_inner().expect("a term");
    let failover = std::time::Duration::from_nanos(at.saturating_sub(struck_at).max(0) as u64);
    let mut what = format!("{did}; {holder} led from record {sequence}, {failover:?} after");
    if !matches!(fault, Fault::KillLeader(_)) {
        let deadline = std::time::Instant::now() + WAIT;
        while !world.replica_exited(&leader) {
            assert!(
                std::time::Instant::now() < deadline,
                "{leader}, deposed, still runs {WAIT:?} after {holder} began its term: a deposed leader must stop\n{}",
                world.output()
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        what.push_str(&format!("; {leader} stepped down and stopped on its own"));
        proxies.set_enabled(&format!("kube-{leader}"), true);
        proxies.set_enabled(&format!("nats-{leader}"), true);
    }
    world.restart_replica(&leader);
    what.push_str(", started again as a standby");
    (what, failover)
}

/// Strikes a fault of the JetStream cluster the log is on (the `n`-th
/// fault: which server, when it is not the leader); returns what it did.
async fn strike_nats_cluster(world: &mut World, fault: Fault, n: usize) -> String {
    let output = world.output();
    let cluster = world.nats.cluster_mut().expect("a JetStream cluster");
    let size = cluster.servers.len();
    let stream = switchyard_eventlog::nats::NatsOptions::default().stream;
    match fault {
        Fault::KillStreamLeader => {
            let leader = std::cell::Cell::new(0);
            let led = crate::eventually("the stream to have a leader", WAIT, || async {
                cluster
                    .stream_leader(&stream)
                    .await
                    .map(|l| leader.set(l))
                    .is_some()
            })
            .await;
            if let Err(e) = led {
                panic!("{e}\n{}\n{output}", cluster.stream_views(&stream).await);
            }
            let killed = leader.get();
            let started = std::time::Instant::now();
            cluster.servers[killed].kill();
            // A pod killed is started again by its StatefulSet within
            // seconds: the others elect a leader meanwhile if two of them
            // can (a server still catching up from a wiped store cannot
            // vote yet), else once it is back.
            let cluster = &*cluster;
            let moved = crate::eventually(
                "another server to lead the stream",
                std::time::Duration::from_secs(10),
                || async {
                    cluster
                        .stream_leader(&stream)
                        .await
                        .is_some_and(|l| l != killed)
                },
            )
            .await
            .is_ok();
            let elected = started.elapsed();
            let cluster = world.nats.cluster_mut().expect("a JetStream cluster");
            cluster.servers[killed].restart();
            let cluster = &*cluster;
            let led = crate::eventually("the stream to have a leader", WAIT, || async {
                cluster.stream_leader(&stream).await.is_some()
            })
            .await;
            assert!(
                led.is_ok(),
                "{led:?}\n{}\n{output}",
                cluster.stream_views(&stream).await
            );
            if moved {
                format!(
                    "killed n{killed}, the stream's leader (SIGKILL); another led {elected:?} later; started n{killed} again"
                )
            } else {
                format!(
                    "killed n{killed}, the stream's leader (SIGKILL); no other led within {elected:?}; started n{killed} again, and the stream had a leader {:?} after the kill",
                    started.elapsed()
                )
            }
        }
        Fault::CutOffServer => {
            // A different server each time this fault comes round.
            let k = (n + n / size) % size;
            cluster.cut_off(k);
            let alone = crate::eventually(&format!("n{k} to have no route"), WAIT, || async {
                cluster.routed_to(k).await.is_ok_and(|r| r.is_empty())
            })
            .await;
            assert!(alone.is_ok(), "n{k} still routed: {alone:?}\n{output}");
            // Longer than the stream's servers take to elect a leader
            // without it; a cut, the fault itself.
            tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            cluster.rejoin(k);
            let joined = crate::eventually(
                &format!("n{k} routed to the others again"),
                WAIT,
                || async {
                    cluster
                        .routed_to(k)
                        .await
                        .is_ok_and(|r| r.len() == size - 1)
                },
            )
            .await;
            assert!(joined.is_ok(), "{joined:?}\n{output}");
            format!("cut n{k}'s routes to the other servers for 5 s, then joined it again")
        }
        Fault::WipeServer => {
            // A different server each time this fault comes round.
            let k = (n + n / size) % size;
            cluster.wipe(k);
            format!("killed n{k} (SIGKILL), wiped its store and started it again with nothing")
        }
        _ => unreachable!("not a fault of the JetStream cluster"),
    }
}

/// Every server of the JetStream cluster the log is on holds every record
/// in its own store (once healed), and no record is stored twice.
async fn every_server_holds_the_log(world: &World, struck: &[Struck]) {
    let Some(cluster) = world.nats.cluster() else {
        return;
    };
    let records = world
        .stored_log()
        .await
        .read(switchyard_eventlog::ReadRequest::default())
        .await
        .expect("read the log");
    let mut ids = std::collections::BTreeSet::new();
    for record in &records {
        assert!(
            ids.insert(record.envelope.id.as_str()),
            "record {} stored twice (again at sequence {})\nfaults: {struck:#?}",
            record.envelope.id,
            record.sequence
        );
    }
    let head = records.last().map_or(0, |r| r.sequence);
    let whole = (head, records.len() as u64);
    let stream = switchyard_eventlog::nats::NatsOptions::default().stream;
    for i in 0..cluster.servers.len() {
        let held = crate::eventually(&format!("n{i} to hold the whole log"), WAIT, || async {
            cluster.stream_state(i, &stream).await == Some(whole)
        })
        .await;
        assert!(
            held.is_ok(),
            "n{i} holds (last sequence, records) {:?}; the log is {whole:?}\nfaults: {struck:#?}",
            cluster.stream_state(i, &stream).await
        );
    }
}

/// How long after the API server answers again inventory records a change
/// made then: a label (outside what the scenario compares) on gpu-0, from
/// the API server's return to the fact's recording time.
async fn fact_after_return(world: &World, n: usize) -> std::time::Duration {
    let value = format!("fault-{n}");
    let back = switchyard_eventlog::now_nanos();
    Api::<Node>::all(world.client.clone())
        .patch(
            "gpu-0",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({"metadata": {"labels": {"fault.switchyard.test/n": value}}}),
            ),
        )
        .await
        .expect("label gpu-0");
    let log = world.log().await;
    let recorded = std::cell::Cell::new(0);
    world
        .until(
            "inventory to record the change made on the API server's return",
            || async {
                let records = log
                    .read(switchyard_eventlog::ReadRequest {
                        subject: Some(switchyard_eventlog::Subject::new("node.gpu-0").unwrap()),
                        ..Default::default()
                    })
                    .await
                    .unwrap_or_default();
                let found = records.iter().find_map(|r| match r.decode() {
                    switchyard_eventlog::Decoded::Event(e) => match &e.kind {
                        Some(Kind::NodeObserved(o))
                            if o.labels.get("fault.switchyard.test/n") == Some(&value) =>
                        {
                            Some(r.envelope.recorded_at_unix_nanos)
                        }
                        _ => None,
                    },
                    _ => None,
                });
                found.map(|at| recorded.set(at)).is_some()
            },
        )
        .await;
    std::time::Duration::from_nanos((recorded.get() - back).max(0) as u64)
}

/// Decisions (records of the deciding services) recorded twice: the same
/// event, payload and all, on the same subject, by the same author.
/// With `SWITCHYARD_TEST_KEEP=DIR`, a run that did not end as the simulator
/// leaves its services' logs and the log's records (one per line, decoded)
/// in a new folder under DIR, and says where on stderr.
async fn keep_for_diagnosis(world: &World) {
    let Some(root) = std::env::var_os("SWITCHYARD_TEST_KEEP") else {
        return;
    };
    let kept = match tempfile::Builder::new().prefix("run-").tempdir_in(&root) {
        Ok(dir) => dir.keep(),
        Err(err) => {
            eprintln!("SWITCHYARD_TEST_KEEP: cannot make a folder under {root:?}: {err}");
            return;
        }
    };
    for entry in std::fs::read_dir(world.dir.path())
        .into_iter()
        .flatten()
        .flatten()
    {
        if entry.path().extension().is_some_and(|e| e == "log") {
            let _ = std::fs::copy(entry.path(), kept.join(entry.file_name()));
        }
    }
    let records = world
        .log()
        .await
        .read(switchyard_eventlog::ReadRequest::default())
        .await
        .unwrap_or_default();
    let lines: String = records
        .iter()
        .map(|r| {
            let e = &r.envelope;
            let what = match r.decode() {
                switchyard_eventlog::Decoded::Event(event) => format!("{:?}", event.kind),
                unknown => format!("{unknown:?}"),
            };
            format!(
                "{} {} {} {} {what}\n",
                r.sequence, e.recorded_at_unix_nanos, e.actor, e.subject
            )
        })
        .collect();
    let _ = std::fs::write(kept.join("records.txt"), lines);
    eprintln!(
        "kept the services' logs and the records in {}",
        kept.display()
    );
}

/// Decisions recorded twice: a record whose payload is the one its actor
/// last recorded of the same type on the same subject, nothing of that kind
/// decided in between. (The same decision again after another, A -> B -> A
/// -> B, is a change each time: a node handed over and rolled back twice.)
pub fn recorded_twice(records: &[switchyard_eventlog::StoredEvent]) -> Vec<String> {
    let mut last: BTreeMap<(&str, &str, &str), &[u8]> = BTreeMap::new();
    let mut twice = Vec::new();
    for record in records {
        let envelope = &record.envelope;
        if envelope.actor == "inventory" || envelope.event_type.is_empty() {
            continue;
        }
        let key = (
            envelope.actor.as_str(),
            envelope.subject.as_str(),
            envelope.event_type.as_str(),
        );
        if last.insert(key, &envelope.payload) == Some(&envelope.payload[..]) {
            twice.push(format!(
                "sequence {}: {} by {} on {}",
                record.sequence, envelope.event_type, envelope.actor, envelope.subject
            ));
        }
    }
    twice
}

/// Facts inventory recorded twice in a row for one object: a repeat the
/// observer should have dropped (after a restart, a re-list).
pub fn facts_repeated(records: &[switchyard_eventlog::StoredEvent]) -> Vec<String> {
    let mut last: BTreeMap<&str, &[u8]> = BTreeMap::new();
    let mut repeated = Vec::new();
    for record in records {
        let envelope = &record.envelope;
        if envelope.actor != "inventory" {
            continue;
        }
        if last.insert(&envelope.subject, &envelope.payload) == Some(&envelope.payload[..]) {
            repeated.push(format!(
                "sequence {}: {} on {}",
                record.sequence, envelope.event_type, envelope.subject
            ));
        }
    }
    repeated
}

/// Bumps the resourceVersion of every node and of every Deployment in `ml`
/// once a second (an annotation no one reads), as another controller would:
/// a write conditioned on an older read meets 409 Conflict. (Every 100 ms,
/// with the toxics' latency, no conditioned write could ever land: a
/// livelock no real controller makes.) Returns
/// how many changes it made when stopped.
fn keep_changing(
    c: kube::Client,
    names: Vec<String>,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<usize>,
) {
    let (stop, mut stopped) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let nodes: Api<Node> = Api::all(c.clone());
        let deployments: Api<Deployment> = Api::namespaced(c, "ml");
        let mut changes = 0usize;
        let mut interval = tokio::time::interval(std::time::Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = &mut stopped => return changes,
                _ = interval.tick() => {}
            }
            let patch =
                json!({"metadata": {"annotations": {"example.com/touched": changes.to_string()}}});
            let params = kube::api::PatchParams::default();
            for n in PARITY_NODES {
                if nodes
                    .patch(n, &params, &kube::api::Patch::Merge(&patch))
                    .await
                    .is_ok()
                {
                    changes += 1;
                }
            }
            for name in &names {
                if deployments
                    .patch(name, &params, &kube::api::Patch::Merge(&patch))
                    .await
                    .is_ok()
                {
                    changes += 1;
                }
            }
        }
    });
    (stop, task)
}

/// The reference's cluster: two GPU nodes of eight H100s in `gpu`, four
/// workloads on the device plugin, DRA on from the start.
pub fn reference_config() -> switchyard_sim::SimConfig {
    switchyard_sim::SimConfig {
        gpu_nodes: 2,
        gpus_per_node: 8,
        card: switchyard_sim::Card::h100(),
        workloads: 4,
        upgraded_with_dra: false,
        legacy_nodes: 0,
        ..switchyard_sim::SimConfig::default()
    }
}

/// The simulator's run of `config`: its steps, every one passed, and the
/// cluster as it leaves it.
pub async fn simulate(
    config: switchyard_sim::SimConfig,
) -> (Vec<switchyard_scenario::StepReport>, EndState) {
    let outcome = switchyard_scenario::run_reference(
        config,
        switchyard_runtime::Local::default(),
        (),
        |_| {},
    )
    .await;
    let steps = step_lines(&outcome.steps);
    assert!(outcome.ok(), "the simulator's run:\n{}", steps.join("\n"));
    let expected = sim_end_state(&outcome.migration.sim);
    (outcome.steps, expected)
}

pub async fn run(options: Options<'_>) -> Report {
    let Options {
        faults,
        toxics,
        flow_shares,
        binary,
        cli,
        nats_servers,
        replicas,
    } = options;
    let mut report = Report::default();
    let config = reference_config();
    let (simulated, expected) = simulate(config.clone()).await;
    let steps = step_lines(&simulated);
    let mut faults = faults.map(|seed| Seeded(seed, 0));
    let mut struck: Vec<Struck> = Vec::new();

    let (mut cluster, names) =
        simulated_cluster(config, toxics, flow_shares, binary, nats_servers, replicas).await;
    let c = cluster.world.client.clone();
    let changing = (!toxics.is_empty()).then(|| keep_changing(c.clone(), names.clone()));

    // Each of the simulator's steps as the command an operator types.
    // Each command that starts a process has an id of its own, so that,
    // typed again after a kill, it follows that process.
    for (i, step) in simulated.iter().enumerate() {
        let s = step.step.as_str();
        let Some(args) = operator_command(s, &format!("step-{i}")) else {
            continue;
        };
        if s == "step 5: verify" {
            wait_for_evidence_facts(s, &cluster.world).await;
        }
        let (code, out, err) = match &mut faults {
            None => {
                let world = &cluster.world;
                cli_at(cli, &world.nats.url(), &world.plane.kubeconfig(), &args)
            }
            Some(seeded) => {
                type_under_fault(&mut cluster, seeded, &mut struck, cli, s, &args).await
            }
        };
        let world = &cluster.world;
        assert_eq!(
            code,
            0,
            "{s}: {args:?}\n{out}\n{err}\n{}\nfaults: {struck:#?}",
            world.output()
        );
        if s.starts_with("completion") {
            // Its effects are applied before the rollbacks that follow, as in
            // the simulator, which settles after every step.
            wait_for_completion_effects(world, &c, &names, &expected).await;
        }
    }

    if let Some((stop, task)) = changing {
        let _ = stop.send(());
        let changes = task.await.expect("the changing task");
        report.changes = Some((changes, conflicts_logged(&cluster)));
    }
    settles_to_the_simulators(&cluster, &c, &names, &expected, &steps, &struck).await;
    every_server_holds_the_log(&cluster.world, &struck).await;
    if flow_shares.is_some() {
        let rejected = crate::migration::rejected_requests(&c).await;
        assert!(
            rejected > 0,
            "the priority level rejected nothing: the run did not meet a 429"
        );
        report.rejected = Some(rejected);
    }
    report.struck = struck;
    report
}

/// The simulator's steps, one line each: "ok step: detail".
pub fn step_lines(steps: &[switchyard_scenario::StepReport]) -> Vec<String> {
    steps
        .iter()
        .map(|s| {
            format!(
                "{} {}: {}",
                if s.ok { "ok" } else { "FAILED" },
                s.step,
                s.detail
            )
        })
        .collect()
}

/// Waits for `complete`'s effects: the quota translated as the simulator's
/// (`expected`), and the leftover labels cleared.
async fn wait_for_completion_effects(
    world: &World,
    c: &Client,
    names: &[String],
    expected: &EndState,
) {
    world
        .until(
            "the quota translated and the leftover labels cleared",
            || completion_applied(c, names, expected),
        )
        .await;
}

/// Whether `complete`'s effects are on the cluster: the quota translated as
/// the simulator's (`expected`), and the leftover labels cleared.
pub async fn completion_applied(c: &Client, names: &[String], expected: &EndState) -> bool {
    let state = cluster_end_state(c, names).await;
    state.quota == expected.quota
        && state.nodes.values().all(|(labels, _, _)| {
            !labels.contains_key("node.deckhouse.io/device-gpu.config")
                && !labels.keys().any(|k| k.starts_with("nvidia.com/"))
        })
}

/// The simulator's cluster before the migration, on kwok: its nodes'
/// labels, its Deployments and its quota; once every workload runs on the
/// device plugin and inventory has recorded what the commands are decided
/// on. With it, the Deployments' names.
async fn simulated_cluster(
    config: switchyard_sim::SimConfig,
    toxics: &[Toxic<'_>],
    flow_shares: Option<u32>,
    binary: Locate,
    nats_servers: usize,
    replicas: usize,
) -> (MigrationCluster, Vec<String>) {
    let mut before = switchyard_sim::Simulator::new(config);
    let facts = before.take_facts();
    let nodes: Vec<String> = PARITY_NODES.iter().map(|n| n.to_string()).collect();
    let cluster = MigrationCluster::start(ClusterOptions {
        nodes: &nodes,
        gpus_per_node: 8,
        binary,
        service_env: Vec::new(),
        agent_env: Vec::new(),
        previous_version: None,
        toxics,
        flow_shares,
        nats_servers,
        replicas,
    })
    .await;
    let world = &cluster.world;
    let c = world.client.clone();
    label_nodes_as_simulated(&c, &before).await;
    let (names, pods) = create_simulated_workloads(
        &c,
        &facts,
        &json!({"image": "registry.example.com/train:1"}),
    )
    .await;
    assert!(names.len() >= 2, "the scenario moves several workloads");
    let hard = before
        .quota("ml", "gpu-quota")
        .expect("the simulator's quota");
    create_quota(&c, json!(hard)).await;
    world
        .until("every workload running on the device plugin", || async {
            let apps: Vec<&str> = names.iter().map(String::as_str).collect();
            running_of(&c, &apps).await == pods
        })
        .await;

    // Commands are decided on the facts inventory recorded, which trail the
    // API server (by seconds under 429s: a move typed at once was refused,
    // "Deployment ml/train-0 is not known"). The steps start once the record
    // holds the workloads and their running pods, as an operator's would
    // after `switchyard status`.
    world
        .until(
            "inventory to record the workloads and their running pods",
            || async {
                let (workloads, running) = recorded_in(&world.events().await, "ml");
                names.iter().all(|n| workloads.contains(n)) && running == pods
            },
        )
        .await;
    // A move is refused while the record has the GPU class without its
    // DeviceClass ("wait for the class-compiler to publish it"): step 2 is
    // done once the record shows it published.
    world
        .until(
            "inventory to record GPU class h100 with its DeviceClass",
            || async { class_published(&world.events().await, "h100") },
        )
        .await;
    (cluster, names)
}

/// Labels the parity nodes as the simulator has them (less the labels the
/// services write).
pub async fn label_nodes_as_simulated(c: &Client, before: &switchyard_sim::Simulator) {
    let nodes: Api<Node> = Api::all(c.clone());
    for n in PARITY_NODES {
        let labels: BTreeMap<&String, &String> = before
            .node_labels(n)
            .expect("the simulator's node")
            .iter()
            .filter(|(k, _)| ![STACK, SETUP].contains(&k.as_str()))
            .collect();
        nodes
            .patch(
                n,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(json!({"metadata": {"labels": labels}})),
            )
            .await
            .expect("label the node as the simulator has it");
    }
}

/// A Deployment in `ml` for each workload the simulator observed; their
/// names, and how many pods they run.
pub async fn create_simulated_workloads(
    c: &Client,
    facts: &[switchyard_proto::v1::DomainEvent],
    container: &serde_json::Value,
) -> (Vec<String>, usize) {
    let deployments: Api<Deployment> = Api::namespaced(c.clone(), "ml");
    let mut names = Vec::new();
    let mut pods = 0;
    for fact in facts {
        let Some(Kind::WorkloadObserved(w)) = &fact.kind else {
            continue;
        };
        let id = w.workload.clone().expect("workload");
        let placement = w.placement.clone().unwrap_or_default();
        let containers: Vec<_> = placement
            .container_limits
            .iter()
            .map(|(name, limits)| {
                let mut spec = json!({"name": name, "resources": {"limits": limits.quantities}});
                for (k, v) in container.as_object().into_iter().flatten() {
                    spec[k] = v.clone();
                }
                spec
            })
            .collect();
        let d: Deployment = serde_json::from_value(json!({
            "metadata": {"name": id.name},
            "spec": {
                "replicas": w.replicas,
                "selector": {"matchLabels": {"app": id.name}},
                "template": {
                    "metadata": {"labels": {"app": id.name}},
                    "spec": {
                        "containers": containers,
                        "nodeSelector": placement.node_selector,
                        "terminationGracePeriodSeconds": 1,
                    },
                },
            },
        }))
        .expect("deployment");
        deployments
            .create(&PostParams::default(), &d)
            .await
            .expect("create the simulator's workload");
        pods += w.replicas as usize;
        names.push(id.name);
    }
    (names, pods)
}

/// The command an operator types for the simulator's step `s` (`id`: the
/// process it starts); `None` for the cluster's set-up.
pub fn operator_command(s: &str, id: &str) -> Option<Vec<String>> {
    let args: Vec<String> = if let Some(node) = s.strip_prefix("step 3: hand over ") {
        [
            "handover", "--node", node, "--to", "gpu-dra", "--id", id, "--wait",
        ]
        .map(String::from)
        .to_vec()
    } else if let Some(name) = s.strip_prefix("step 4: move ") {
        let workload = format!("ml/Deployment/{name}");
        [
            "move",
            "--workload",
            &workload,
            "--class",
            "h100",
            "--id",
            id,
            "--wait",
        ]
        .map(String::from)
        .to_vec()
    } else if s == "step 5: verify" {
        ["evidence"].map(String::from).to_vec()
    } else if s.starts_with("completion") {
        ["complete", "--from", "gpu", "--class", "h100"]
            .map(String::from)
            .to_vec()
    } else if let Some(node) = s.strip_prefix("rollback: node ") {
        ["rollback", "node", "--node", node, "--id", id, "--wait"]
            .map(String::from)
            .to_vec()
    } else if let Some(name) = s.strip_prefix("rollback: application ") {
        let workload = format!("ml/Deployment/{name}");
        [
            "rollback",
            "app",
            "--workload",
            &workload,
            "--id",
            id,
            "--wait",
        ]
        .map(String::from)
        .to_vec()
    } else {
        // Steps 1 and 2 are the cluster's set-up: gpu-dra, DRA on, the
        // GPUClass h100 and its DeviceClass.
        assert!(
            s.starts_with("step 1:") || s == "step 2: create GPU class h100",
            "a step this test does not drive: {s}"
        );
        return None;
    };
    Some(args)
}

/// Before step 5 (`s`): evidence is checked on the facts inventory recorded;
/// under 429s its watch of ResourceSlices can trail the API server by
/// seconds. What is checked is the cluster as it is, so the check waits for
/// the record to reach it (a failure names both).
async fn wait_for_evidence_facts(s: &str, world: &World) {
    let log = world.log().await;
    if let Err(e) = evidence_facts_recorded(&world.client, log.as_ref()).await {
        panic!("{s}: {e}\n{}", world.output());
    }
}

/// Waits until inventory's records hold the ResourceSlices and the
/// ResourceClaims' reservations the API server lists (what `evidence`
/// checks); what differs when they do not within [`WAIT`].
pub async fn evidence_facts_recorded(
    client: &Client,
    log: &dyn switchyard_eventlog::EventLog,
) -> Result<(), String> {
    use crate::migration::{claims_listed_and_recorded, events_in, slices_listed_and_recorded};
    recorded_as_listed("the ResourceSlices", || async {
        slices_listed_and_recorded(client, &events_in(log).await).await
    })
    .await?;
    // So can its watch of ResourceClaims: the scheduler's
    // reservations for the moved pods reach the log after the pods'
    // Running, and the evidence checks both.
    recorded_as_listed("the ResourceClaims' reservations", || async {
        claims_listed_and_recorded(client, &events_in(log).await).await
    })
    .await
}

/// Types `args` for step `s` with the next fault of `seeded` struck while
/// it runs, and again where the fault kept it from being taken; its exit
/// code and output.
async fn type_under_fault(
    cluster: &mut MigrationCluster,
    seeded: &mut Seeded,
    struck: &mut Vec<Struck>,
    cli: &Path,
    s: &str,
    args: &[String],
) -> (i32, String, String) {
    let waits = args.iter().any(|a| a == "--wait");
    let on_cluster = cluster.world.nats.cluster().is_some();
    let owner = cluster.replica_proxies.is_some().then(|| {
        let service = step_owner(s);
        let earlier = struck
            .iter()
            .filter(|x| step_owner(&x.step) == service)
            .count();
        (service, earlier)
    });
    let (fault, after) = seeded.fault(struck.len(), waits, on_cluster, owner);
    let log = cluster.world.log().await;
    let before = log
        .last_sequence(None)
        .await
        .expect("the log's last sequence");
    let (nats, kubeconfig) = (cluster.world.nats.url(), cluster.world.plane.kubeconfig());
    let child = cli_command(cli, &nats, &kubeconfig, args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run switchyard");
    let pid = child.id();
    let command = tokio::task::spawn_blocking(move || {
        exit_and_output(child.wait_with_output().expect("wait for switchyard"))
    });
    // The point: `after` more records once the command's first
    // is in, or the command's end, whichever comes first.
    crate::eventually("the command taken", WAIT, || async {
        command.is_finished()
            || log
                .last_sequence(None)
                .await
                .is_ok_and(|l| l > before + after)
    })
    .await
    .unwrap_or_else(|e| panic!("{s}: {e}\n{}", cluster.world.output()));
    drop(log);
    let (what, failover) = match fault {
        Fault::KillLeader(service)
        | Fault::CutLeaderFromApi(service)
        | Fault::CutLeaderFromNats(service) => {
            let (what, took) = strike_leader(cluster, fault, service).await;
            (what, Some(took))
        }
        _ => (strike(cluster, fault, struck.len(), pid).await, None),
    };
    struck.push(Struck {
        step: s.to_string(),
        fault: fault.name(),
        what,
        after,
        failover,
    });
    eprintln!("struck: {}", struck.last().expect("pushed"));
    let first = command.await.expect("the command's thread");
    // A command started while nats-server was down is refused
    // at once ("connect to NATS at ..."): nothing was sent.
    let refused = first.0 != 0 && first.2.contains("connect to NATS at");
    match fault {
        Fault::KillCli | Fault::RestartNats if matches!(fault, Fault::KillCli) || refused => {
            // Typed again: the same id follows the process the
            // first one started, if it got that far.
            let again = type_again(cluster, cli, args).await;
            if let Some(last) = struck.last_mut() {
                let said = again.2.lines().next().unwrap_or("");
                last.what.push_str(&format!(" (it said: {said})"));
            }
            again
        }
        // The service that answers it killed after it took the
        // command and before it answered, for a command that
        // names no process (`complete`: the CLI does not send
        // it again by itself). As the error tells the operator:
        // look, and type it again only if it was not taken.
        _ if first.0 != 0 && first.2.contains("did not answer in time") => {
            let taken = taken_since(cluster, before).await;
            let last = struck.last_mut().expect("the fault struck");
            if taken {
                last.what
                    .push_str(" (the command was taken before: its records are in the log)");
                (0, first.1, first.2)
            } else {
                last.what
                    .push_str(" (the command was not taken: typed again)");
                type_again(cluster, cli, args).await
            }
        }
        _ => first,
    }
}

/// `args` typed again, on the cluster as it is now.
async fn type_again(
    cluster: &MigrationCluster,
    cli: &Path,
    args: &[String],
) -> (i32, String, String) {
    let (nats, kubeconfig) = (cluster.world.nats.url(), cluster.world.plane.kubeconfig());
    let (args, cli) = (args.to_vec(), cli.to_path_buf());
    tokio::task::spawn_blocking(move || cli_at(&cli, &nats, &kubeconfig, &args))
        .await
        .expect("the command's thread")
}

/// Whether the log holds, after sequence `before`, the records of a
/// `complete` taken.
async fn taken_since(cluster: &MigrationCluster, before: u64) -> bool {
    let log = cluster.world.log().await;
    let since = log
        .read(switchyard_eventlog::ReadRequest {
            from: before + 1,
            ..Default::default()
        })
        .await
        .expect("read the log");
    since.iter().any(|r| {
        matches!(
            r.envelope.event_type.as_str(),
            "ResourceQuotaTranslated"
                | "LeftoverLabelsCleared"
                | "SourceGroupRetired"
                | "CompletionRefused"
        )
    })
}

/// Lines of the services' logs naming a 409.
fn conflicts_logged(cluster: &MigrationCluster) -> usize {
    cluster
        .world
        .services
        .iter()
        .map(|s| {
            std::fs::read_to_string(s.log_path())
                .unwrap_or_default()
                .matches("409")
                .count()
        })
        .sum()
}

/// The end state settles to the simulator's (`expected`), and nothing was
/// decided twice or observed twice; a failure names the simulator's
/// `steps` and the faults `struck`.
async fn settles_to_the_simulators(
    cluster: &MigrationCluster,
    c: &Client,
    names: &[String],
    expected: &EndState,
    steps: &[String],
    struck: &[Struck],
) {
    let settled = crate::eventually("the simulator's end state", WAIT, || async {
        cluster_end_state(c, names).await == *expected
    })
    .await;
    let actual = cluster_end_state(c, names).await;
    if settled.is_err() {
        keep_for_diagnosis(&cluster.world).await;
    }
    assert!(
        settled.is_ok(),
        "kwok:\n{actual:#?}\nthe simulator:\n{expected:#?}\n{}\nfaults: {struck:#?}",
        steps.join("\n")
    );
    assert_eq!(actual, *expected);
    // Nothing decided twice, no fact repeated: a restarted service took up
    // where its records end.
    let records = cluster
        .world
        .log()
        .await
        .read(switchyard_eventlog::ReadRequest::default())
        .await
        .expect("read the log");
    assert_eq!(
        recorded_twice(&records),
        Vec::<String>::new(),
        "faults: {struck:#?}"
    );
    assert_eq!(
        facts_repeated(&records),
        Vec::<String>::new(),
        "faults: {struck:#?}"
    );
}

/// Waits for inventory to record `what` as the API server lists it (`read`
/// gives both, listed first; something must be listed); an error names
/// both.
async fn recorded_as_listed<T, F, Fut>(what: &str, read: F) -> Result<(), String>
where
    T: PartialEq + Default + std::fmt::Debug,
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = (T, T)>,
{
    let waited = crate::eventually(
        &format!("inventory to record {what} the API server lists"),
        WAIT,
        || async {
            let (listed, recorded) = read().await;
            listed != T::default() && listed == recorded
        },
    )
    .await;
    match waited {
        Ok(()) => Ok(()),
        Err(e) => {
            let (listed, recorded) = read().await;
            Err(format!("{e}\nlisted: {listed:?}\nrecorded: {recorded:?}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::recorded_twice;
    use switchyard_eventlog::{Envelope, StoredEvent};

    fn record(sequence: u64, actor: &str, payload: &[u8]) -> StoredEvent {
        StoredEvent {
            sequence,
            envelope: Envelope {
                actor: actor.into(),
                subject: "node.gpu-1".into(),
                event_type: "io.switchyard.stack.assigned".into(),
                payload: payload.to_vec().into(),
                ..Envelope::default()
            },
            raw: Default::default(),
            malformed: None,
        }
    }

    #[test]
    fn a_decision_again_right_after_itself_is_twice_and_after_another_is_not() {
        let handed_over_and_back = [
            record(1, "stack-assigner", b"dp"),
            record(2, "stack-assigner", b"dra"),
            record(3, "stack-assigner", b"dp"),
            record(4, "inventory", b"dp"),
        ];
        assert!(recorded_twice(&handed_over_and_back).is_empty());
        let doubled = [
            record(1, "stack-assigner", b"dp"),
            record(2, "stack-assigner", b"dra"),
            record(3, "stack-assigner", b"dra"),
        ];
        assert_eq!(
            recorded_twice(&doubled),
            ["sequence 3: io.switchyard.stack.assigned by stack-assigner on node.gpu-1"]
        );
    }
}

//! `switchyard migrate` at scale on a real cluster: etcd, kube-apiserver,
//! kube-scheduler, kube-controller-manager, kwok running N GPU nodes and their
//! pods, JetStream, Switchyard's five log services and a node agent per node
//! as their own processes — the harness of the migration tests
//! (`switchyard_testkit::migration`). W one-card Deployments run on the
//! device plugin; `switchyard migrate --max-unavailable K --wait` moves the
//! nodes and the workloads to DRA wave by wave.
//!
//! Measured over the migration's wall time (the CLI's start to its exit):
//! - CPU time (utime + stime in `/proc/PID/stat`) of every process, by
//!   component: Switchyard's services, node agents and CLI; Kubernetes; the
//!   harness (this process: the fake kubelets and node preparation).
//! - Switchyard's own latency, from the log's clock: each time a service
//!   decides or writes after reading records, the time from the earliest of
//!   those records' recording to its decisions recorded and writes done (the
//!   services log it at debug, `switchyard_runtime::reaction`); for a node
//!   agent, from its Node's `gpu-stack=dra` to its first ResourceSlice, both
//!   seen by this process's watch.
//! - The share of the wall time in which Switchyard was at it, as the union
//!   of intervals, less the writes' round trips to the API server (the
//!   cluster's part): `own` takes each reaction from its records' recording;
//!   `own_from_the_service_free` from the later of that and the service's
//!   previous reaction done (a service reacts to one batch of records at a
//!   time: until then it was at that reaction, counted there, or waiting on
//!   its writes), and reading records that changed nothing — or a tick's or
//!   a command's effects issued again — from their reading. `own` adds the
//!   node agents' intervals as this process's watch saw them (the label to
//!   the first slice); `own_from_the_service_free` adds each agent's own part
//!   as it logged it (its node's change seen to its switch done, less its
//!   calls to the API server and kubelet), and is also given without them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::{Deployment, DeploymentStrategy};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use switchyard_eventlog::{EventLog, ReadRequest};
use switchyard_testkit::KillOnDrop;
use switchyard_testkit::migration::{
    ClusterOptions, GROUP, MigrationCluster, SERVICES, SETUP, STACK, World, beside_current_exe,
    gpu_deployment,
};

#[derive(clap::Args)]
pub struct Args {
    /// GPU nodes in the source group.
    #[arg(long, default_value_t = 200)]
    nodes: usize,
    /// Cards per node (the 8x H100 fixture's first G).
    #[arg(long, default_value_t = 8)]
    gpus_per_node: usize,
    /// Deployments of one pod and one card each.
    #[arg(long, default_value_t = 1000)]
    workloads: usize,
    /// Nodes handed over at once (the wave's size).
    #[arg(long, default_value_t = 10)]
    max_unavailable: u32,
    /// How the workloads' pods are replaced (their Deployments' strategy):
    /// recreate, or rolling-update (Kubernetes' default: one pod more than
    /// the replicas while it rolls, so one card more).
    #[arg(long, value_enum, default_value_t = Strategy::Recreate)]
    strategy: Strategy,
    /// How long the migration may take, in seconds.
    #[arg(long, default_value_t = 3600)]
    timeout_s: u64,
    /// Copy the services', node agents' and CLI's logs here.
    #[arg(long)]
    keep_logs: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
enum Strategy {
    Recreate,
    RollingUpdate,
}

fn unix_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// Clock ticks per second of `/proc/PID/stat`'s times.
fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

/// A process's state, utime + stime (ticks) and parent, from `/proc/PID/stat`.
fn stat(pid: u32) -> Option<(char, u64, u32)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The name is in parentheses and may hold spaces: fields follow the last ')'.
    let rest = &text[text.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let state = fields.first()?.chars().next()?;
    let ppid = fields.get(1)?.parse().ok()?;
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((state, utime + stime, ppid))
}

fn rss_kib(pid: u32) -> u64 {
    crate::status_kib(&pid.to_string(), "VmRSS:").unwrap_or(0)
}

/// The component a process is counted in, from its executable's name.
fn component(pid: u32) -> String {
    let argv0 = std::fs::read(format!("/proc/{pid}/cmdline"))
        .ok()
        .and_then(|c| {
            c.split(|b| *b == 0)
                .next()
                .map(|s| String::from_utf8_lossy(s).into_owned())
        })
        .unwrap_or_default();
    let name = Path::new(&argv0)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    match name.as_str() {
        "switchyard-node-agent" => "switchyard node agents".into(),
        "switchyard" => "switchyard CLI".into(),
        n if n.starts_with("switchyard-") => n.to_string(),
        "" => "other".into(),
        n => n.to_string(),
    }
}

/// CPU ticks of this process and every descendant, by process.
fn cpu_by_process() -> BTreeMap<u32, (String, u64)> {
    let me = std::process::id();
    let mut all: BTreeMap<u32, (u32, u64)> = BTreeMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        if let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>()
            && let Some((_, ticks, ppid)) = stat(pid)
        {
            all.insert(pid, (ppid, ticks));
        }
    }
    let mut ours = BTreeSet::from([me]);
    loop {
        let more: Vec<u32> = all
            .iter()
            .filter(|(pid, (ppid, _))| ours.contains(ppid) && !ours.contains(*pid))
            .map(|(pid, _)| *pid)
            .collect();
        if more.is_empty() {
            break;
        }
        ours.extend(more);
    }
    ours.into_iter()
        .filter_map(|pid| {
            let (_, ticks) = all.get(&pid)?;
            let name = if pid == me {
                "harness (switchyard-loadtest)".to_string()
            } else {
                component(pid)
            };
            Some((pid, (name, *ticks)))
        })
        .collect()
}

fn is_switchyard(component: &str) -> bool {
    component.starts_with("switchyard")
}

/// One reaction of a service, as it logged it (µs).
struct Reaction {
    service: String,
    /// What it reacted to: records, a tick or a command.
    input: String,
    /// From the earliest record read to the decisions recorded and the
    /// writes done.
    since_recorded: i64,
    done: i64,
    /// When the service took the records from the log (0: not logged).
    received: i64,
    /// Whether it decided or wrote anything: a reaction to the records, not
    /// only the time to read them.
    acted: bool,
    /// How long appending its decisions to the log took.
    appending: i64,
    /// The writes: when they were sent, and how long until the API server
    /// had answered them all (0: none).
    write_started: i64,
    writing: i64,
}

impl Reaction {
    /// Switchyard's own part: all but the writes' round trips.
    fn own(&self) -> i64 {
        self.since_recorded - self.writing
    }

    /// When Switchyard itself was at it: before the writes went out, and
    /// after they came back; from the record's recording, or from `free`
    /// where the service was busy until then with an earlier reaction.
    fn own_intervals(&self, free: i64) -> Vec<(i64, i64)> {
        let start = (self.done - self.since_recorded).max(free);
        if self.writing == 0 {
            return vec![(start, self.done)];
        }
        vec![
            (start, self.write_started),
            (self.write_started + self.writing, self.done),
        ]
    }
}

/// Where a service's reactions spent their time (µs, summed).
#[derive(Default)]
struct Parts {
    /// From the later of the records' recording and the service free to
    /// the service taking them.
    waiting: i64,
    appending: i64,
    /// The writes' round trips to the API server.
    writing: i64,
    deciding: i64,
    /// Reading records that changed nothing.
    unchanged: i64,
    /// Ticks and commands that decided nothing: effects issued again.
    ticks: i64,
}

/// A node agent's switch to DRA, as it logged it (µs since the epoch): from
/// its node's change seen to the switch done, and the calls to the API server
/// (its slices) and to kubelet it waited on.
struct Switch {
    seen: i64,
    done: i64,
    api: (i64, i64),
    kubelet: (i64, i64),
}

impl Switch {
    /// The agent's own part: the switch less its calls.
    fn own_intervals(&self) -> Vec<(i64, i64)> {
        let mut calls: Vec<(i64, i64)> = [self.api, self.kubelet]
            .into_iter()
            .filter(|(_, took)| *took > 0)
            .map(|(start, took)| (start, start + took))
            .collect();
        calls.sort();
        let mut out = Vec::new();
        let mut at = self.seen;
        for (start, end) in calls {
            if start > at {
                out.push((at, start));
            }
            at = at.max(end);
        }
        if self.done > at {
            out.push((at, self.done));
        }
        out
    }

    /// From the node's change seen to the first slice written, less the
    /// wait on kubelet before it.
    fn own_latency(&self) -> i64 {
        let (kubelet_start, kubelet) = self.kubelet;
        let before_write = if kubelet > 0 && kubelet_start < self.api.0 {
            kubelet
        } else {
            0
        };
        self.api.0 - self.seen - before_write
    }
}

/// The node agents' switches to DRA in the logs in `dir`.
fn switches(dir: &Path) -> Vec<Switch> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if !name.starts_with("node-agent-") {
            continue;
        }
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        for line in text
            .lines()
            .filter(|l| l.contains(" serving ") && l.contains("stack=Some(Dra)"))
        {
            let (Some(seen), Some(done), Some(api_started)) = (
                field(line, "seen_unix_us"),
                field(line, "done_unix_us"),
                field(line, "api_started_unix_us"),
            ) else {
                continue;
            };
            out.push(Switch {
                seen,
                done,
                api: (api_started, field(line, "api_us").unwrap_or(0)),
                kubelet: (
                    field(line, "kubelet_started_unix_us").unwrap_or(0),
                    field(line, "kubelet_us").unwrap_or(0),
                ),
            });
        }
    }
    out
}

/// A string field as tracing writes it: `name="value"`.
fn text_field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    let at = line.find(&format!("{name}=\""))? + name.len() + 2;
    line[at..].split('"').next()
}

fn field(line: &str, name: &str) -> Option<i64> {
    let at = line.find(&format!("{name}="))? + name.len() + 1;
    line[at..]
        .split(|c: char| !c.is_ascii_digit() && c != '-')
        .next()?
        .parse()
        .ok()
}

/// The reactions a service logged (`switchyard_runtime::reaction`), and how
/// many decisions it made on a tick (no record to time them from).
fn reactions(service: &str, log: &Path) -> (Vec<Reaction>, usize) {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let mut out = Vec::new();
    let mut on_tick = 0;
    for line in text
        .lines()
        .filter(|l| l.contains("switchyard_runtime::reaction"))
    {
        if line.contains("decided on a tick") {
            on_tick += field(line, "decisions").unwrap_or(0) as usize;
        } else if let (Some(since_recorded), Some(done)) = (
            field(line, "since_recorded_us"),
            field(line, "done_unix_us"),
        ) {
            out.push(Reaction {
                service: service.to_string(),
                input: text_field(line, "input").unwrap_or("records").to_string(),
                since_recorded,
                done,
                received: field(line, "received_unix_us").unwrap_or(0),
                acted: field(line, "decisions").unwrap_or(0) > 0
                    || field(line, "writes").unwrap_or(0) > 0,
                appending: field(line, "appending_us").unwrap_or(0),
                write_started: field(line, "write_started_unix_us").unwrap_or(0),
                writing: field(line, "writing_us").unwrap_or(0),
            });
        }
    }
    (out, on_tick)
}

/// p50 / p99 / max of `values` (ms).
fn summary(mut values: Vec<f64>) -> Value {
    if values.is_empty() {
        return json!({"count": 0});
    }
    values.sort_by(f64::total_cmp);
    let at = |p: f64| values[((values.len() - 1) as f64 * p).round() as usize];
    json!({
        "count": values.len(),
        "p50_ms": round(at(0.5)),
        "p99_ms": round(at(0.99)),
        "max_ms": round(values[values.len() - 1]),
    })
}

fn round(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The length of the union of `intervals` (µs), each clipped to `window`.
fn union_us(mut intervals: Vec<(i64, i64)>, window: (i64, i64)) -> i64 {
    intervals.retain_mut(|(a, b)| {
        *a = (*a).max(window.0);
        *b = (*b).min(window.1);
        a < b
    });
    intervals.sort();
    let mut total = 0;
    let mut current: Option<(i64, i64)> = None;
    for (a, b) in intervals {
        current = match current {
            Some((ca, cb)) if a <= cb => Some((ca, cb.max(b))),
            Some((ca, cb)) => {
                total += cb - ca;
                Some((a, b))
            }
            None => Some((a, b)),
        };
    }
    total + current.map_or(0, |(a, b)| b - a)
}

/// When each node was first seen labelled `gpu-stack=dra`, and when its
/// first ResourceSlice was seen (this process's watch, µs).
#[derive(Default)]
struct AgentTimes {
    dra_label: BTreeMap<String, i64>,
    first_slice: BTreeMap<String, i64>,
}

/// What the watches of [`watch_agents`] saw.
enum Seen {
    /// A node, and whether it is labelled `gpu-stack=dra`.
    Node(String, bool),
    /// A ResourceSlice of a node.
    Slice(String),
    /// A watch has listed what exists.
    Listed,
}

/// Follows the nodes and slices into `times`; the receiver hears once both
/// watches have listed what exists (what changes after that is seen).
fn watch_agents(
    client: Client,
    times: Arc<Mutex<AgentTimes>>,
) -> (
    tokio::task::JoinHandle<()>,
    tokio::sync::oneshot::Receiver<()>,
) {
    let (listed_tx, listed) = tokio::sync::oneshot::channel();
    let handle = tokio::spawn(async move {
        let nodes = watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
            .default_backoff()
            .map_ok(|event| match event {
                watcher::Event::Apply(n) | watcher::Event::InitApply(n) => {
                    let dra = n.labels().get(STACK).is_some_and(|s| s == "dra");
                    Some(Seen::Node(n.name_any(), dra))
                }
                watcher::Event::InitDone => Some(Seen::Listed),
                _ => None,
            });
        let slices = watcher(
            Api::<ResourceSlice>::all(client),
            watcher::Config::default(),
        )
        .default_backoff()
        .map_ok(|event| match event {
            watcher::Event::Apply(s) | watcher::Event::InitApply(s) => {
                Some(Seen::Slice(s.spec.node_name.unwrap_or_default()))
            }
            watcher::Event::InitDone => Some(Seen::Listed),
            _ => None,
        });
        let merged = futures::stream::select(nodes.boxed(), slices.boxed());
        futures::pin_mut!(merged);
        let mut listed_tx = Some(listed_tx);
        let mut listings = 0;
        while let Some(seen) = merged.next().await {
            let Ok(Some(seen)) = seen else {
                continue;
            };
            let now = unix_us();
            let mut times = times.lock().expect("agent times");
            match seen {
                Seen::Node(node, true) => {
                    times.dra_label.entry(node).or_insert(now);
                }
                Seen::Node(_, false) => {}
                Seen::Slice(node) => {
                    times.first_slice.entry(node).or_insert(now);
                }
                Seen::Listed => {
                    listings += 1;
                    if listings == 2
                        && let Some(tx) = listed_tx.take()
                    {
                        let _ = tx.send(());
                    }
                }
            }
        }
    });
    (handle, listed)
}

async fn count_running(client: &Client) -> anyhow::Result<usize> {
    let pods = Api::<Pod>::namespaced(client.clone(), "ml")
        .list(&ListParams::default())
        .await?;
    Ok(pods
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .count())
}

/// Polls `condition` every `every` until it holds or `timeout` passes.
async fn until<F, Fut>(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut condition: F,
) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<bool>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if condition().await.unwrap_or(false) {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(every).await;
    }
}

pub async fn run(args: Args) -> anyhow::Result<Value> {
    anyhow::ensure!(
        (1..=8).contains(&args.gpus_per_node),
        "--gpus-per-node: 1 to 8 (the fixture's cards)"
    );
    anyhow::ensure!(
        args.workloads <= args.nodes * args.gpus_per_node,
        "--workloads: at most nodes x gpus-per-node ({}) one-card pods fit",
        args.nodes * args.gpus_per_node
    );
    let mut binaries = vec![
        "switchyard".to_string(),
        "switchyard-node-agent".to_string(),
    ];
    binaries.extend(SERVICES.iter().map(|s| format!("switchyard-{s}")));
    for binary in &binaries {
        let path = beside_current_exe(binary);
        anyhow::ensure!(
            path.is_file(),
            "{} is missing: cargo build --release -p switchyard -p switchyard-node-agent -p switchyard-inventory -p switchyard-stack-assigner -p switchyard-class-compiler -p switchyard-claim-allocator -p switchyard-alerter",
            path.display()
        );
    }
    let names: Vec<String> = (0..args.nodes).map(|i| format!("gpu-{i:03}")).collect();
    let setup_started = Instant::now();
    // The services with the flags they ship with (tick 1s, re-issue 2s), and
    // their reactions logged.
    let cluster = MigrationCluster::start(ClusterOptions {
        nodes: &names,
        gpus_per_node: args.gpus_per_node,
        binary: beside_current_exe,
        service_env: [
            ("SWITCHYARD_TICK", "1s"),
            ("SWITCHYARD_REISSUE", "2s"),
            (
                "SWITCHYARD_LOG_LEVEL",
                "info,switchyard_runtime::reaction=debug,switchyard_eventlog::nats=debug,kube_client::client::tls=error",
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
        agent_env: Vec::new(),
        previous_version: None,
        toxics: &[],
        flow_shares: None,
        nats_servers: 1,
        replicas: 1,
    })
    .await;
    eprintln!(
        "{} nodes Ready, services and node agents started ({:.1} s)",
        args.nodes,
        setup_started.elapsed().as_secs_f64()
    );
    let measured = measure(&args, &cluster, setup_started).await;
    if let Some(dir) = &args.keep_logs {
        std::fs::create_dir_all(dir)?;
        for entry in std::fs::read_dir(cluster.world.dir.path())?.flatten() {
            let _ = std::fs::copy(entry.path(), dir.join(entry.file_name()));
        }
        let _ = std::fs::copy(cluster.kwok.log_path(), dir.join("kwok.log"));
    }
    measured
}

/// A node that is not yet as the migration starts from, and why.
fn not_ready(n: &Node, cards: &str) -> Option<String> {
    let labels = n.labels();
    let allocatable = n
        .status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .and_then(|a| a.get("nvidia.com/gpu"))
        .map(|q| q.0.as_str());
    let ready = labels.get(STACK).map(String::as_str) == Some("device-plugin")
        && labels.contains_key(SETUP)
        && allocatable == Some(cards);
    (!ready).then(|| {
        format!(
            "{}: {STACK}={:?}, {SETUP}={:?}, nvidia.com/gpu allocatable {allocatable:?}",
            n.name_any(),
            labels.get(STACK),
            labels.get(SETUP)
        )
    })
}

/// Waits for the setup, runs the migration and measures what it cost.
async fn measure(
    args: &Args,
    cluster: &MigrationCluster,
    setup_started: Instant,
) -> anyhow::Result<Value> {
    let world = &cluster.world;
    let c = world.client.clone();
    let setup_timeout = Duration::from_secs(120) + Duration::from_millis(500) * args.nodes as u32;
    wait_for_nodes(args, &c, setup_started, setup_timeout).await?;
    let workloads_running_s = start_workloads(args, &c, setup_timeout).await?;
    let log = world.log().await;
    let log_before = wait_for_log_still(&log, setup_timeout).await?;
    let setup_s = setup_started.elapsed().as_secs_f64();

    let agent_times = Arc::new(Mutex::new(AgentTimes::default()));
    let (watching, listed) = watch_agents(c.clone(), agent_times.clone());
    tokio::time::timeout(setup_timeout, listed)
        .await
        .map_err(|_| {
            anyhow::anyhow!("the node and slice watches did not list in {setup_timeout:?}")
        })?
        .map_err(|_| anyhow::anyhow!("the node and slice watches ended"))?;

    let ticks = clock_ticks();
    let run = run_migration(args, world, setup_started).await?;
    watching.abort();
    let output = std::fs::read_to_string(&run.out_path).unwrap_or_default();
    let errors = std::fs::read_to_string(run.out_path.with_extension("err")).unwrap_or_default();

    let cpu = cpu_seconds(&run, ticks);
    let switchyard_cpu: f64 = cpu
        .iter()
        .filter(|(n, _)| is_switchyard(n))
        .map(|(_, s)| s)
        .sum();
    let all_cpu: f64 = cpu.values().sum();
    let reacting = reacting(world, &run, &agent_times);
    let outcome = outcome(&c, &log, log_before, &output).await?;
    let mut rss: BTreeMap<String, Value> = BTreeMap::new();
    for (name, kib) in &run.peak_rss {
        rss.insert(name.clone(), json!(kib / 1024));
    }
    let wall = run.wall;
    let share = |s: f64| round(s / wall * 100.0);
    Ok(json!({
        "nodes": args.nodes,
        "gpus_per_node": args.gpus_per_node,
        "workloads": args.workloads,
        "max_unavailable": args.max_unavailable,
        "strategy": args.strategy,
        "setup_s": round(setup_s),
        "workloads_running_s": round(workloads_running_s),
        "migration": {
            "exit": run.status.code(),
            "wall_s": round(wall),
            "waves_completed_lines": outcome.waves,
            "last_line": output.lines().last().unwrap_or_default(),
            "stderr": errors.lines().take(5).collect::<Vec<_>>(),
            "nodes_on_dra": outcome.on_dra,
            "workloads_moved": outcome.moved,
            "pods_running": outcome.running,
            "log_records": outcome.records,
            "log_records_by_actor": outcome.by_actor,
        },
        "cpu_s": cpu.iter().map(|(k, v)| (k.clone(), json!(round(*v)))).collect::<serde_json::Map<_, _>>(),
        "cpu_share_of_wall_pct": {
            "switchyard": share(switchyard_cpu),
            "all_processes": share(all_cpu),
            "note": "CPU seconds over the wall time (100 = one core busy; this machine has 2)",
        },
        "switchyard_own_latency": reacting.latency,
        "write_round_trips": reacting.write_round_trips,
        "reaction_time_by_part": reacting.breakdown,
        "decisions_on_a_tick": reacting.on_tick,
        "switchyard_reacting_share_of_wall_pct": {
            "own": share(reacting.busy_us as f64 / 1e6),
            "own_from_the_service_free": share(reacting.busy_from_free_us as f64 / 1e6),
            "own_from_the_service_free_services_only": share(reacting.services_from_free_us as f64 / 1e6),
            "with_the_writes_round_trips": share(reacting.busy_with_writes_us as f64 / 1e6),
        },
        "peak_rss_mib": rss,
    }))
}

/// Setup phase: every node on the device plugin with its cards, and the DeviceClass.
async fn wait_for_nodes(
    args: &Args,
    c: &Client,
    setup_started: Instant,
    setup_timeout: Duration,
) -> anyhow::Result<()> {
    let nodes: Api<Node> = Api::all(c.clone());
    let cards = args.gpus_per_node.to_string();
    let last_waiting = Mutex::new(String::new());
    until(
        "every node on the device plugin, prepared, its cards allocatable",
        setup_timeout,
        Duration::from_secs(1),
        || async {
            let list = nodes.list(&ListParams::default()).await?;
            let waiting: Vec<String> = list
                .items
                .iter()
                .filter_map(|n| not_ready(n, &cards))
                .collect();
            if let Some(first) = waiting.first() {
                *last_waiting.lock().expect("waiting") =
                    format!("{} nodes, e.g. {first}", waiting.len());
            }
            Ok(list.items.len() == args.nodes && waiting.is_empty())
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e}: {}", last_waiting.lock().expect("waiting")))?;
    eprintln!(
        "every node on the device plugin ({:.1} s)",
        setup_started.elapsed().as_secs_f64()
    );
    let classes: Api<DeviceClass> = Api::all(c.clone());
    until(
        "the GPUClass's DeviceClass",
        setup_timeout,
        Duration::from_secs(1),
        || async { Ok(!classes.list(&ListParams::default()).await?.items.is_empty()) },
    )
    .await
}

/// Setup phase: creates the workloads and waits for their pods; returns the seconds.
async fn start_workloads(args: &Args, c: &Client, setup_timeout: Duration) -> anyhow::Result<f64> {
    let created = Instant::now();
    let deployments: Api<Deployment> = Api::namespaced(c.clone(), "ml");
    futures::stream::iter(0..args.workloads)
        .map(|i| {
            let mut d = gpu_deployment(&format!("app-{i:04}"), 1);
            if let (Strategy::Recreate, Some(spec)) = (args.strategy, d.spec.as_mut()) {
                spec.strategy = Some(DeploymentStrategy {
                    type_: Some("Recreate".into()),
                    rolling_update: None,
                });
            }
            let deployments = deployments.clone();
            async move {
                deployments
                    .create(&PostParams::default(), &d)
                    .await
                    .map(|_| ())
            }
        })
        .buffer_unordered(16)
        .try_collect::<()>()
        .await?;
    until(
        "every workload's pod running",
        setup_timeout + Duration::from_millis(200) * args.workloads as u32,
        Duration::from_secs(2),
        || async { Ok(count_running(c).await? == args.workloads) },
    )
    .await?;
    let workloads_running_s = created.elapsed().as_secs_f64();
    eprintln!(
        "{} workloads running ({workloads_running_s:.1} s)",
        args.workloads
    );
    Ok(workloads_running_s)
}

/// Setup phase: waits for the log to stand still; returns its last sequence.
async fn wait_for_log_still(
    log: &Arc<dyn EventLog>,
    setup_timeout: Duration,
) -> anyhow::Result<u64> {
    // Inventory has recorded the cluster once the log stands still: the
    // same last sequence read 3 s running.
    let last: Mutex<(Option<u64>, u32)> = Mutex::new((None, 0));
    until(
        "the log standing still for 3 s",
        setup_timeout,
        Duration::from_secs(1),
        || async {
            let now = log.last_sequence(None).await?;
            let mut last = last.lock().expect("last sequence");
            *last = match *last {
                (Some(seq), still) if seq == now => (Some(seq), still + 1),
                _ => (Some(now), 0),
            };
            Ok(last.1 >= 3)
        },
    )
    .await?;
    Ok(last.lock().expect("last sequence").0.unwrap_or_default())
}

/// The migration CLI's run, and the processes as sampled around it.
struct MigrationRun {
    status: std::process::ExitStatus,
    /// The CLI's wall time (s).
    wall: f64,
    started_us: i64,
    ended_us: i64,
    cli_pid: u32,
    /// The CLI's own CPU ticks, read while it was a zombie.
    cli_ticks: u64,
    /// CPU ticks by process before and after the migration.
    before: BTreeMap<u32, (String, u64)>,
    after: BTreeMap<u32, (String, u64)>,
    /// Peak resident memory by component (KiB), sampled every 5 s.
    peak_rss: BTreeMap<String, u64>,
    /// Where the CLI's stdout went (its stderr: the same with `.err`).
    out_path: PathBuf,
}

/// Migration phase: runs `switchyard migrate ... --wait` to its exit, sampling processes.
async fn run_migration(
    args: &Args,
    world: &World,
    setup_started: Instant,
) -> anyhow::Result<MigrationRun> {
    let out_path = world.dir.path().join("migrate.out");
    let before = cpu_by_process();
    eprintln!(
        "migrating ({:.1} s of setup)",
        setup_started.elapsed().as_secs_f64()
    );
    let started_us = unix_us();
    let started = Instant::now();
    let mut cli = KillOnDrop(
        Command::new(beside_current_exe("switchyard"))
            .args([
                "migrate", "--from", "gpu", "--to", "gpu-dra", "--class", "h100",
            ])
            .args(["--max-unavailable", &args.max_unavailable.to_string()])
            .args(["--id", "bench", "--wait"])
            .env("SWITCHYARD_NATS_URL", world.nats.url())
            .env("KUBECONFIG", world.plane.kubeconfig())
            .env("SWITCHYARD_ACTOR", "ops@example.com")
            .env("SWITCHYARD_TIMEOUT", format!("{}s", args.timeout_s))
            .stdout(std::fs::File::create(&out_path)?)
            .stderr(std::fs::File::create(out_path.with_extension("err"))?)
            .spawn()?,
    );
    let cli_pid = cli.0.id();
    let (cli_ticks, peak_rss) = follow_cli(cli_pid).await;
    let after = cpu_by_process();
    let status = cli.0.wait()?;
    let wall = started.elapsed().as_secs_f64();
    let ended_us = unix_us();
    Ok(MigrationRun {
        status,
        wall,
        started_us,
        ended_us,
        cli_pid,
        cli_ticks,
        before,
        after,
        peak_rss,
        out_path,
    })
}

/// Migration phase: follows the CLI to its exit; returns its CPU ticks and the peak RSS.
async fn follow_cli(cli_pid: u32) -> (u64, BTreeMap<String, u64>) {
    // The CLI's CPU time is read while it is a zombie, before it is reaped.
    let mut cli_ticks = 0;
    let mut peak_rss: BTreeMap<String, u64> = BTreeMap::new();
    let mut sampled = Instant::now() - Duration::from_secs(10);
    loop {
        match stat(cli_pid) {
            Some(('Z', t, _)) => {
                cli_ticks = t;
                break;
            }
            Some((_, t, _)) => cli_ticks = t,
            None => break,
        }
        if sampled.elapsed() >= Duration::from_secs(5) {
            sampled = Instant::now();
            let mut now: BTreeMap<String, u64> = BTreeMap::new();
            for (pid, (name, _)) in cpu_by_process() {
                *now.entry(name).or_default() += rss_kib(pid);
            }
            for (name, kib) in now {
                let peak = peak_rss.entry(name).or_default();
                *peak = (*peak).max(kib);
            }
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    (cli_ticks, peak_rss)
}

/// Analysis phase: CPU seconds by component over the migration.
fn cpu_seconds(run: &MigrationRun, ticks: f64) -> BTreeMap<String, f64> {
    // Processes that came and went meanwhile are not in both readings: only
    // the CLI, counted apart.
    let mut cpu: BTreeMap<String, f64> = BTreeMap::new();
    for (pid, (name, t)) in &run.after {
        if *pid == run.cli_pid {
            continue;
        }
        let was = run.before.get(pid).map_or(0, |(_, t)| *t);
        *cpu.entry(name.clone()).or_default() += t.saturating_sub(was) as f64 / ticks;
    }
    *cpu.entry("switchyard CLI".into()).or_default() += run.cli_ticks as f64 / ticks;
    cpu
}

/// When and for how long Switchyard was at it over the migration.
struct Reacting {
    latency: Value,
    write_round_trips: Value,
    breakdown: Value,
    on_tick: BTreeMap<&'static str, usize>,
    busy_us: i64,
    busy_from_free_us: i64,
    services_from_free_us: i64,
    busy_with_writes_us: i64,
}

/// Analysis phase: Switchyard's latencies, time by part and busy time over the migration.
fn reacting(world: &World, run: &MigrationRun, agent_times: &Mutex<AgentTimes>) -> Reacting {
    let (started_us, ended_us) = (run.started_us, run.ended_us);
    let (mut all, on_tick) = reactions_within(world, started_us, ended_us);
    let (mut from_free, breakdown) = time_by_part(&all);
    all.retain(|r| r.acted);
    // From each record's recording: time a service spent on earlier
    // reactions (their writes included) counts again.
    let mut intervals: Vec<(i64, i64)> = all.iter().flat_map(|r| r.own_intervals(0)).collect();
    let mut with_writes: Vec<(i64, i64)> = all
        .iter()
        .map(|r| (r.done - r.since_recorded, r.done))
        .collect();
    let mut by_service: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut writes_by_service: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for r in &all {
        by_service
            .entry(r.service.clone())
            .or_default()
            .push(r.own() as f64 / 1000.0);
        if r.writing > 0 {
            writes_by_service
                .entry(r.service.clone())
                .or_default()
                .push(r.writing as f64 / 1000.0);
        }
    }
    let services_from_free_us = union_us(from_free.clone(), (started_us, ended_us));
    let agents = std::mem::take(&mut *agent_times.lock().expect("agent times"));
    let mut agent_ms = Vec::new();
    for (node, labelled) in &agents.dra_label {
        if let Some(slice) = agents.first_slice.get(node)
            && slice >= labelled
        {
            agent_ms.push((slice - labelled) as f64 / 1000.0);
            intervals.push((*labelled, *slice));
            with_writes.push((*labelled, *slice));
        }
    }
    // From the service free: a node agent's own part, as it logged it.
    let switched: Vec<Switch> = switches(world.dir.path())
        .into_iter()
        .filter(|s| s.done >= started_us && s.done <= ended_us)
        .collect();
    let mut agent_own_ms = Vec::new();
    for switch in &switched {
        agent_own_ms.push(switch.own_latency() as f64 / 1000.0);
        from_free.extend(switch.own_intervals());
    }
    let busy_us = union_us(intervals, (started_us, ended_us));
    let busy_from_free_us = union_us(from_free, (started_us, ended_us));
    let breakdown = parts_json(&breakdown);
    let busy_with_writes_us = union_us(with_writes, (started_us, ended_us));
    let write_round_trips: Value = writes_by_service
        .iter()
        .map(|(s, v)| (s.clone(), summary(v.clone())))
        .collect::<serde_json::Map<_, _>>()
        .into();
    let latency: Value = by_service
        .iter()
        .map(|(s, v)| (s.clone(), summary(v.clone())))
        .chain([
            (
                "node agents (gpu-stack=dra to the first slice, seen by the harness)".to_string(),
                summary(agent_ms),
            ),
            (
                "node agents own (node change seen to its slices written, less kubelet)"
                    .to_string(),
                summary(agent_own_ms),
            ),
        ])
        .collect::<serde_json::Map<_, _>>()
        .into();
    Reacting {
        latency,
        write_round_trips,
        breakdown,
        on_tick,
        busy_us,
        busy_from_free_us,
        services_from_free_us,
        busy_with_writes_us,
    }
}

/// Analysis phase: the services' reactions within the migration, and decisions on a tick.
fn reactions_within(
    world: &World,
    started_us: i64,
    ended_us: i64,
) -> (Vec<Reaction>, BTreeMap<&'static str, usize>) {
    let mut all = Vec::new();
    let mut on_tick = BTreeMap::new();
    for service in &world.services {
        let (found, ticked) = reactions(service.name(), service.log_path());
        all.extend(found);
        on_tick.insert(service.name(), ticked);
    }
    all.retain(|r| r.done >= started_us && r.done <= ended_us);
    all.sort_by_key(|r| (r.service.clone(), r.done));
    (all, on_tick)
}

/// Analysis phase: reactions' intervals from the service free, and each service's parts.
fn time_by_part(all: &[Reaction]) -> (Vec<(i64, i64)>, BTreeMap<String, Parts>) {
    // From the later of the recording and the service's previous reaction
    // done: a service reacts to one batch at a time, so until then it was
    // at that reaction (counted there) or waiting on its writes (Kubernetes').
    // Records that changed nothing count from their reading.
    let mut from_free: Vec<(i64, i64)> = Vec::new();
    let mut breakdown: BTreeMap<String, Parts> = BTreeMap::new();
    for (i, r) in all.iter().enumerate() {
        let free = match i.checked_sub(1).map(|p| &all[p]) {
            Some(previous) if previous.service == r.service => previous.done,
            _ => 0,
        };
        let parts = breakdown.entry(r.service.clone()).or_default();
        if !r.acted {
            // Effects issued again (their first answer not seen yet) are
            // the API server's time, as for any reaction.
            from_free.extend(r.own_intervals(r.received));
            parts.writing += r.writing;
            if r.input == "records" {
                parts.unchanged += r.done - r.received - r.writing;
            } else {
                parts.ticks += r.done - r.received - r.writing;
            }
            continue;
        }
        from_free.extend(r.own_intervals(free));
        let waiting = if r.received > 0 {
            r.received - (r.done - r.since_recorded).max(free)
        } else {
            0
        };
        parts.waiting += waiting;
        parts.appending += r.appending;
        parts.writing += r.writing;
        parts.deciding += r.done - r.received.max(free) - r.appending - r.writing;
    }
    (from_free, breakdown)
}

/// Report phase: each service's time by part, in seconds.
fn parts_json(breakdown: &BTreeMap<String, Parts>) -> Value {
    breakdown
        .iter()
        .map(|(service, parts)| {
            let s = |us: i64| round(us as f64 / 1e6);
            (
                service.clone(),
                json!({
                    "free_to_read_s": s(parts.waiting),
                    "appending_to_the_log_s": s(parts.appending),
                    "kubernetes_writes_s": s(parts.writing),
                    "deciding_and_the_rest_s": s(parts.deciding),
                    "records_that_changed_nothing_s": s(parts.unchanged),
                    "ticks_and_commands_s": s(parts.ticks),
                }),
            )
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// What the migration left: nodes, workloads and the log's new records.
struct Outcome {
    on_dra: usize,
    moved: usize,
    running: usize,
    records: usize,
    by_actor: BTreeMap<String, usize>,
    waves: usize,
}

/// Outcome phase: nodes on DRA, workloads moved and running, records logged meanwhile.
async fn outcome(
    c: &Client,
    log: &Arc<dyn EventLog>,
    log_before: u64,
    output: &str,
) -> anyhow::Result<Outcome> {
    // The outcome: every node on the target group serving DRA, every
    // workload rewritten and running.
    let nodes: Api<Node> = Api::all(c.clone());
    let list = nodes.list(&ListParams::default()).await?;
    let on_dra = list
        .items
        .iter()
        .filter(|n| {
            n.labels().get(GROUP).map(String::as_str) == Some("gpu-dra")
                && n.labels().get(STACK).map(String::as_str) == Some("dra")
        })
        .count();
    let deployments = Api::<Deployment>::namespaced(c.clone(), "ml")
        .list(&ListParams::default())
        .await?;
    let moved = deployments
        .items
        .iter()
        .filter(|d| {
            serde_json::to_string(&d.spec)
                .unwrap_or_default()
                .contains("gpu.deckhouse.io/h100")
        })
        .count();
    let running = count_running(c).await?;
    let records = log
        .read(ReadRequest {
            from: log_before + 1,
            ..ReadRequest::default()
        })
        .await?;
    let mut by_actor: BTreeMap<String, usize> = BTreeMap::new();
    for r in &records {
        *by_actor.entry(r.envelope.actor.clone()).or_default() += 1;
    }
    let waves = output
        .lines()
        .filter(|l| l.contains("wave") && l.contains("completed"))
        .count();
    Ok(Outcome {
        on_dra,
        moved,
        running,
        records: records.len(),
        by_actor,
        waves,
    })
}

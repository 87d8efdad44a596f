//! The Kubernetes edge under load, on a real control plane (etcd +
//! kube-apiserver) and a real JetStream log: inventory and stack-assigner run
//! in this process as they run in their own. Measures the control plane's
//! start-up, the latency from a Node's creation to its gpu-stack label (watch
//! → fact → decision → Server-Side Apply) for N nodes created at once, and the
//! time to relabel a wave of nodes when DRA is turned on.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use switchyard_api::{ModuleConfig, NodeGroup};
use switchyard_eventlog::EventLog;
use switchyard_eventlog::nats::{NatsLog, NatsOptions};
use switchyard_inventory::edge::{self as inventory, InventoryOptions};
use switchyard_kube::write::Writer;
use switchyard_runtime::ServiceName;
use switchyard_runtime::host::{self, HostOptions};
use switchyard_stack_assigner::StackAssignerEdge;
use switchyard_testkit::eventually;
use switchyard_testkit::kube::{ControlPlane, fake_node, install_crds};
use switchyard_testkit::nats::{Bus, NatsOptions as ServerOptions};

const STACK: &str = "node.deckhouse.io/gpu-stack";
const GROUP: &str = "node.deckhouse.io/group";

#[derive(clap::Args)]
pub struct Args {
    /// Nodes created at once; each one's creation-to-label latency is measured.
    #[arg(long, default_value_t = 1000)]
    nodes: usize,
    /// Nodes of a group relabelled together when DRA is turned on.
    #[arg(long, default_value_t = 100)]
    wave: usize,
    /// Nodes then created one at a time, each waited for.
    #[arg(long, default_value_t = 100)]
    single: usize,
    /// Node creations in flight at once.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// How nats-server fsyncs: one whole run (a fresh control plane and
    /// server) per value, in this order — `default,always,default,always`
    /// alternates them.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [crate::Sync::Always])]
    sync: Vec<crate::Sync>,
    /// The log on this many nats-servers: one whole run per value, after the
    /// `--sync` runs' order (`1,3`: on one server at R1, then on a JetStream
    /// cluster of three with the stream at R3, for each `--sync`).
    #[arg(long, value_delimiter = ',', default_values_t = [1])]
    nats_servers: Vec<usize>,
}

/// When each node was first seen with each gpu-stack value.
type Seen = Arc<Mutex<BTreeMap<(String, String), Instant>>>;

fn watch_labels(client: Client, seen: Seen) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let stream = watcher(Api::<Node>::all(client), watcher::Config::default())
            .default_backoff()
            .applied_objects();
        futures::pin_mut!(stream);
        while let Ok(Some(node)) = stream.try_next().await {
            if let Some(stack) = node.labels().get(STACK) {
                seen.lock()
                    .unwrap()
                    .entry((node.name_any(), stack.clone()))
                    .or_insert_with(Instant::now);
            }
        }
    })
}

async fn wait_labelled(
    seen: &Seen,
    names: &[String],
    stack: &str,
    deadline: Duration,
) -> anyhow::Result<()> {
    // The latencies come from the watcher's timestamps; this only waits.
    let labelled = || {
        let seen = seen.lock().unwrap();
        names
            .iter()
            .filter(|n| seen.contains_key(&((*n).clone(), stack.to_string())))
            .count()
    };
    eventually(
        &format!("{} nodes labelled {stack}", names.len()),
        deadline,
        || std::future::ready(labelled() == names.len()),
    )
    .await
    .map_err(|e| anyhow::anyhow!("{e} ({} labelled)", labelled()))
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

async fn group(client: &Client, name: &str, gpu: bool) -> anyhow::Result<()> {
    let spec = if gpu {
        json!({"nodeType": "Static", "gpu": {"sharing": "Exclusive"}})
    } else {
        json!({"nodeType": "Static"})
    };
    let group: NodeGroup = serde_json::from_value(json!({
        "apiVersion": "deckhouse.io/v1", "kind": "NodeGroup",
        "metadata": {"name": name}, "spec": spec,
    }))?;
    Api::<NodeGroup>::all(client.clone())
        .create(&PostParams::default(), &group)
        .await?;
    Ok(())
}

async fn module(client: &Client, dra: bool) -> anyhow::Result<()> {
    let config = json!({
        "apiVersion": "deckhouse.io/v1alpha1", "kind": "ModuleConfig",
        "metadata": {"name": "gpu"},
        "spec": {"enabled": true, "version": 1, "settings": {"dra": {"enabled": dra}}},
    });
    Api::<ModuleConfig>::all(client.clone())
        .patch(
            "gpu",
            &PatchParams::apply("loadtest").force(),
            &Patch::Apply(&config),
        )
        .await?;
    Ok(())
}

pub async fn run(args: Args) -> anyhow::Result<Value> {
    let mut runs = Vec::new();
    for &sync in &args.sync {
        for &servers in &args.nats_servers {
            runs.push(run_once(&args, sync, servers).await?);
        }
    }
    Ok(match runs.len() {
        1 => runs.pop().expect("one run"),
        _ => Value::Array(runs),
    })
}

async fn run_once(args: &Args, sync: crate::Sync, servers: usize) -> anyhow::Result<Value> {
    let started = Instant::now();
    let plane = ControlPlane::start().await;
    let startup = started.elapsed();
    let client = plane.client();
    install_crds(
        &client,
        switchyard_api::crds().into_iter().map(|(_, c)| c).collect(),
    )
    .await;
    let nats = Bus::start(
        servers,
        ServerOptions {
            sync_always: sync == crate::Sync::Always,
            ..ServerOptions::default()
        },
    )
    .await;
    let log: Arc<dyn EventLog> = Arc::new(
        NatsLog::connect(
            &nats.url(),
            NatsOptions {
                create: true,
                replicas: nats.replicas(),
                ..NatsOptions::default()
            },
        )
        .await?,
    );
    group(&client, "gpu", true).await?;
    group(&client, "wave", false).await?;
    module(&client, false).await?;

    let seen: Seen = Arc::default();
    let watching = watch_labels(client.clone(), seen.clone());
    let inventory = tokio::spawn(inventory::run(
        client.clone(),
        log.clone(),
        InventoryOptions::default(),
        None,
    ));
    let (progress, _) = tokio::sync::watch::channel(Default::default());
    let assigner = tokio::spawn(host::run(
        ServiceName::StackAssigner.core(),
        log.clone(),
        StackAssignerEdge::new(Writer::new(plane.config(), ServiceName::StackAssigner)?),
        None,
        HostOptions::default(),
        progress,
        None,
    ));

    let nodes: Api<Node> = Api::all(client.clone());
    let created = create_at_once(args, &nodes, &seen).await?;
    let (turned_on, wave_done) = wave_to_dra(args, &client, &nodes, &seen, &log).await?;
    let single = one_at_a_time(args, &nodes, &seen).await?;

    inventory.abort();
    assigner.abort();
    watching.abort();
    let events = log.last_sequence(None).await?;
    Ok(json!({
        "sync": sync,
        "nats_servers": servers,
        "stream_replicas": nats.replicas(),
        "control_plane_startup_ms": startup.as_millis(),
        "nodes": args.nodes,
        "create_to_label_ms": {
            "p50": percentile(&created.latencies, 0.50),
            "p99": percentile(&created.latencies, 0.99),
            "max": percentile(&created.latencies, 1.0),
        },
        "all_nodes_labelled_after_first_create_ms": created.all_labelled.duration_since(created.first).as_millis(),
        "one_at_a_time_create_to_label_ms": {
            "nodes": args.single,
            "p50": percentile(&single, 0.50),
            "p99": percentile(&single, 0.99),
        },
        "wave": args.wave,
        "wave_relabel_ms": wave_done.duration_since(turned_on).as_millis(),
        "log_events": events,
    }))
}

/// What creating the nodes at once measured.
struct AtOnce {
    /// Each node's creation to its device-plugin label, sorted.
    latencies: Vec<Duration>,
    /// The first creation.
    first: Instant,
    /// The last node labelled.
    all_labelled: Instant,
}

/// Step 1: N nodes of a spec.gpu group, created at once: creation → device-plugin label.
async fn create_at_once(args: &Args, nodes: &Api<Node>, seen: &Seen) -> anyhow::Result<AtOnce> {
    let names: Vec<String> = (0..args.nodes).map(|i| format!("gpu-{i:05}")).collect();
    let created_at: Vec<(String, Instant)> = futures::stream::iter(names.iter().cloned())
        .map(|name| {
            let nodes = nodes.clone();
            async move {
                nodes
                    .create(
                        &PostParams::default(),
                        &fake_node(&name, &[(GROUP, "gpu")], Vec::new()),
                    )
                    .await?;
                anyhow::Ok((name, Instant::now()))
            }
        })
        .buffer_unordered(args.concurrency)
        .try_collect()
        .await?;
    let first = created_at.iter().map(|(_, t)| *t).min().expect("nodes");
    wait_labelled(seen, &names, "device-plugin", Duration::from_secs(600)).await?;
    let mut latencies: Vec<Duration> = {
        let seen = seen.lock().unwrap();
        created_at
            .iter()
            .map(|(name, at)| {
                seen[&(name.clone(), "device-plugin".to_string())].saturating_duration_since(*at)
            })
            .collect()
    };
    latencies.sort();
    let all_labelled = {
        let seen = seen.lock().unwrap();
        names
            .iter()
            .map(|n| seen[&(n.clone(), "device-plugin".to_string())])
            .max()
            .expect("nodes")
    };
    Ok(AtOnce {
        latencies,
        first,
        all_labelled,
    })
}

/// Step 2, a wave turned to DRA: returns when DRA was turned on and all were labelled.
async fn wave_to_dra(
    args: &Args,
    client: &Client,
    nodes: &Api<Node>,
    seen: &Seen,
    log: &Arc<dyn EventLog>,
) -> anyhow::Result<(Instant, Instant)> {
    // 2. A wave: W nodes of a group without spec.gpu, no stack while DRA is
    //    off; DRA on → every one labelled dra.
    let wave: Vec<String> = (0..args.wave).map(|i| format!("wave-{i:04}")).collect();
    for name in &wave {
        nodes
            .create(
                &PostParams::default(),
                &fake_node(name, &[(GROUP, "wave")], Vec::new()),
            )
            .await?;
    }
    // Every wave node known to the stack-assigner (decided: no stack) first.
    let decided = || async {
        log.read(Default::default())
            .await
            .map(|records| {
                records
                    .iter()
                    .filter(|r| {
                        r.envelope.event_type == "StackAssigned"
                            && r.envelope.subject.contains("wave-")
                    })
                    .count()
            })
            .unwrap_or(0)
    };
    eventually(
        "the wave nodes decided",
        Duration::from_secs(120),
        || async { decided().await >= wave.len() },
    )
    .await
    .map_err(|e| anyhow::anyhow!(e))?;
    let turned_on = Instant::now();
    module(client, true).await?;
    wait_labelled(seen, &wave, "dra", Duration::from_secs(600)).await?;
    let wave_done = {
        let seen = seen.lock().unwrap();
        wave.iter()
            .map(|n| seen[&(n.clone(), "dra".to_string())])
            .max()
            .expect("wave")
    };
    Ok((turned_on, wave_done))
}

/// Step 3, one node at a time: returns each node's create-to-label latency, sorted.
async fn one_at_a_time(
    args: &Args,
    nodes: &Api<Node>,
    seen: &Seen,
) -> anyhow::Result<Vec<Duration>> {
    // 3. One node at a time on the loaded cluster: the latency without a queue.
    let mut single = Vec::with_capacity(args.single);
    for i in 0..args.single {
        let name = format!("single-{i:04}");
        let at = Instant::now();
        nodes
            .create(
                &PostParams::default(),
                &fake_node(&name, &[(GROUP, "gpu")], Vec::new()),
            )
            .await?;
        wait_labelled(
            seen,
            std::slice::from_ref(&name),
            "device-plugin",
            Duration::from_secs(60),
        )
        .await?;
        single.push(seen.lock().unwrap()[&(name, "device-plugin".to_string())].duration_since(at));
    }
    single.sort();
    Ok(single)
}

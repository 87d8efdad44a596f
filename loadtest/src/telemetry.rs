//! What tracing costs the services' hot path: the stack-assigner hosted by
//! the runtime on a log (embedded, or JetStream as deployed), following N
//! node facts as inventory
//! appends them — each decided on (a `StackAssigned` per node), the decisions
//! appended, their effects issued — with and without the OpenTelemetry layer
//! (spans for the records handled, the decisions and the effects, the trace
//! context in every record appended, the ids in the log lines), in the same
//! run, rounds alternating. Nothing is exported: that happens off the hot
//! path, in batches. The metrics are counted in both. The traced rounds
//! record the traces `OTEL_TRACES_SAMPLER` chooses (every one by default),
//! as a service would.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use switchyard_core::ServiceName;
use switchyard_core::effects::{Effect, EffectExecutor, Outcome};
use switchyard_core::names::GPU_STACK_LABEL;
use switchyard_eventlog::embedded::{Durability, EmbeddedLog, EmbeddedOptions};
use switchyard_eventlog::nats::{NatsLog, NatsOptions};
use switchyard_eventlog::{EventLog, append_facts, now_nanos};
use switchyard_proto::v1::{
    DomainEvent, GpuSharing, GpuSpec, ModuleSettingsObserved, NodeGroupObserved, domain_event::Kind,
};
use switchyard_runtime::host::{self, HostOptions, Progress};
use switchyard_runtime::telemetry::{Export, Telemetry};
use switchyard_testkit::nats::{NatsOptions as ServerOptions, NatsServer};
use tracing_subscriber::prelude::*;

use crate::cores::{ev, node_fact};

#[derive(clap::Args)]
pub struct Args {
    /// Node facts the service follows per round.
    #[arg(long, default_value_t = 5_000)]
    nodes: usize,
    /// Rounds per mode (the median is reported).
    #[arg(long, default_value_t = 7)]
    rounds: usize,
    /// Run one mode only (to profile it alone): `traced` or `untraced`.
    #[arg(long, value_parser = ["traced", "untraced"])]
    only: Option<String>,
    /// The log the service runs on: the embedded one without fsync (for
    /// tests and throw-away runs: the hot path at its cheapest, tracing's
    /// largest share), the embedded one as a process runs it (group
    /// commit), or JetStream on a nats-server started here, as the services
    /// run in a cluster.
    #[arg(long, value_enum, default_value_t = Log::EmbeddedNosync)]
    log: Log,
    /// How nats-server fsyncs (with `--log jetstream`): `always`, as the
    /// chart runs it, or the server's default.
    #[arg(long, value_enum, default_value_t = crate::Sync::Always)]
    sync: crate::Sync,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Log {
    EmbeddedNosync,
    Embedded,
    Jetstream,
}

/// Where a round's log is: each round starts on an empty one.
#[derive(Clone)]
enum Where {
    Embedded(Durability),
    /// The server's URL and the round's stream.
    Jetstream {
        url: String,
        stream: String,
    },
}

/// Writes nothing, as a cluster that takes every write would.
struct Accepts;

impl EffectExecutor for Accepts {
    type Error = std::convert::Infallible;
    async fn execute(&mut self, effects: Vec<Effect>) -> Vec<Result<Outcome, Self::Error>> {
        effects.iter().map(|_| Ok(Outcome::default())).collect()
    }
}

fn setup() -> Vec<DomainEvent> {
    vec![
        ev(Kind::NodeGroupObserved(NodeGroupObserved {
            group: "gpu".into(),
            node_type: "Static".into(),
            gpu: Some(GpuSpec {
                sharing: GpuSharing::Exclusive as i32,
                ..Default::default()
            }),
            ..Default::default()
        })),
        ev(Kind::ModuleSettingsObserved(ModuleSettingsObserved {
            dra_enabled: false,
            feature_gates_ready: true,
            module_version: "2.0.0".into(),
            previous_module_version: String::new(),
            ..Default::default()
        })),
    ]
}

/// One round: the microseconds per node fact from the first append to the
/// service having read its last decision.
fn round(nodes: usize, traced: bool, at: Where) -> anyhow::Result<f64> {
    // Both modes log as a service does (JSON lines at info, here to nowhere);
    // the traced one adds what init_tracing adds for traces.
    let dispatch = if traced {
        let (telemetry, _) = Telemetry::new("stack-assigner", &Export::None);
        tracing::Dispatch::new(
            tracing_subscriber::registry()
                .with(telemetry.layer("stack-assigner"))
                .with(switchyard_runtime::logging::TraceIds::default())
                .with(lines()),
        )
    } else {
        // No tracer: every span made, as without one, none carried on.
        switchyard_eventlog::trace::sample_with(None);
        tracing::Dispatch::new(tracing_subscriber::registry().with(lines()))
    };
    // One thread, one runtime, this subscriber: the mode is the only change.
    std::thread::scope(|scope| {
        scope
            .spawn(|| {
                tracing::dispatcher::with_default(&dispatch, || {
                    tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()?
                        .block_on(follow(nodes, at))
                })
            })
            .join()
            .map_err(|_| anyhow::anyhow!("the round panicked"))?
    })
}

async fn follow(nodes: usize, at: Where) -> anyhow::Result<f64> {
    let dir = tempfile::tempdir()?;
    let log: Arc<dyn EventLog> = match at {
        Where::Embedded(durability) => Arc::new(EmbeddedLog::open(
            dir.path(),
            EmbeddedOptions {
                durability,
                ..EmbeddedOptions::default()
            },
        )?),
        Where::Jetstream { url, stream } => Arc::new(
            NatsLog::connect(
                &url,
                NatsOptions {
                    subject_prefix: format!("telemetry.{}", stream.to_lowercase()),
                    stream,
                    ..NatsOptions::default()
                },
            )
            .await?,
        ),
    };
    append_facts(log.as_ref(), ServiceName::Inventory, &setup(), now_nanos()).await?;
    let (progress, mut watching) = tokio::sync::watch::channel(Progress::default());
    let service = tokio::spawn(host::run(
        ServiceName::StackAssigner.core(),
        log.clone(),
        Accepts,
        None,
        HostOptions {
            tick: Duration::from_secs(3600),
            reissue: Duration::from_secs(3600),
            ..HostOptions::default()
        },
        progress,
        None,
    ));
    watching.wait_for(|p| p.ready).await?;
    let facts: Vec<DomainEvent> = (0..nodes)
        .map(|i| {
            node_fact(
                &format!("node-{i:05}"),
                "gpu",
                false,
                &[(GPU_STACK_LABEL, "device-plugin")],
                8,
            )
        })
        .collect();
    let base = log.last_sequence(None).await?;
    let started = Instant::now();
    append_facts(log.as_ref(), ServiceName::Inventory, &facts, now_nanos()).await?;
    // Caught up: every fact and a StackAssigned for each read back (the
    // service's decisions land between inventory's batches).
    let done = base + 2 * nodes as u64;
    let caught_up = tokio::time::timeout(
        Duration::from_secs(120),
        watching.wait_for(|p| p.sequence >= done),
    )
    .await
    .is_ok_and(|r| r.is_ok());
    anyhow::ensure!(
        caught_up,
        "the stack-assigner did not decide on all {nodes} nodes in 120 s: it read up to {}, expected {done}, the log ends at {}",
        watching.borrow().sequence,
        log.last_sequence(None).await?
    );
    let took = started.elapsed();
    service.abort();
    let head = log.last_sequence(None).await?;
    anyhow::ensure!(
        head == done,
        "{} records after {nodes} node facts, expected a decision each",
        head - base
    );
    Ok(took.as_secs_f64() * 1e6 / nodes as f64)
}

/// JSON lines at info, as a service writes them, to nowhere.
fn lines<S>() -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    tracing_subscriber::fmt::layer()
        .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
        .event_format(switchyard_runtime::logging::JsonLines {
            service: "stack-assigner",
        })
        .with_writer(std::io::sink)
        .with_ansi(false)
        .with_filter(tracing_subscriber::filter::LevelFilter::INFO)
}

/// What the metrics cost per fact, in ns: the counters and gauges the host
/// updates for one fact followed (read up to it and to the decision it
/// appended, folded, appended, the effect issued), a million times over.
/// They are counted in both modes above, so they are timed apart.
fn metrics_per_fact() -> f64 {
    const FACTS: u64 = 1_000_000;
    let mut metrics = switchyard_runtime::metrics::metrics().service("stack-assigner");
    let started = Instant::now();
    for sequence in 0..FACTS {
        let sequence = std::hint::black_box(sequence);
        metrics.read_up_to(2 * sequence);
        metrics.folded();
        metrics.appended(1);
        metrics.read_up_to(2 * sequence + 1);
        metrics.effect("SetStackLabel", true, None);
    }
    started.elapsed().as_secs_f64() * 1e9 / FACTS as f64
}

/// The sampler the traced rounds record with, as the variables name it.
fn sampler() -> String {
    let var = |name| std::env::var(name).unwrap_or_default();
    match (var("OTEL_TRACES_SAMPLER"), var("OTEL_TRACES_SAMPLER_ARG")) {
        (name, _) if name.is_empty() => "parentbased_always_on (default)".into(),
        (name, arg) if arg.is_empty() => name,
        (name, arg) => format!("{name} {arg}"),
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

pub async fn run(args: Args) -> anyhow::Result<Value> {
    let modes: &[bool] = match args.only.as_deref() {
        Some("traced") => &[true],
        Some(_) => &[false],
        None => &[false, true],
    };
    // One server for the run, a stream per round.
    let server = match args.log {
        Log::EmbeddedNosync | Log::Embedded => None,
        Log::Jetstream => {
            let options = ServerOptions {
                sync_always: args.sync == crate::Sync::Always,
                ..ServerOptions::default()
            };
            Some(tokio::task::spawn_blocking(move || NatsServer::start_with(options)).await?)
        }
    };
    let mut rounds = 0;
    let mut at = || {
        rounds += 1;
        match &server {
            None if args.log == Log::Embedded => Where::Embedded(Durability::GroupCommit),
            None => Where::Embedded(Durability::NoSync),
            Some(server) => Where::Jetstream {
                url: server.url(),
                stream: format!("TELEMETRY_R{rounds}"),
            },
        }
    };
    let (mut plain, mut traced) = (Vec::new(), Vec::new());
    // A warm-up round of each, not counted.
    for &mode in modes {
        round(args.nodes, mode, at())?;
    }
    for _ in 0..args.rounds {
        for &mode in modes {
            let took = round(args.nodes, mode, at())?;
            if mode { &mut traced } else { &mut plain }.push(took);
        }
    }
    if args.only.is_some() {
        let took = median(if plain.is_empty() { traced } else { plain });
        return Ok(json!({
            "nodes": args.nodes,
            "rounds": args.rounds,
            "log": args.log,
            "only": args.only,
            "us_per_fact": took,
            "sampler": sampler(),
        }));
    }
    let (plain, traced) = (median(plain), median(traced));
    let metrics_ns = metrics_per_fact();
    Ok(json!({
        "metrics_ns_per_fact": metrics_ns,
        "metrics_share_of_untraced": metrics_ns / 1000.0 / plain,
        "nodes": args.nodes,
        "rounds": args.rounds,
        "log": args.log,
        "sync": (args.log == Log::Jetstream).then_some(args.sync),
        "us_per_fact_untraced": plain,
        "us_per_fact_traced": traced,
        "traced_over_untraced": traced / plain,
        "sampler": sampler(),
    }))
}

//! Event log benchmarks.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use async_nats::jetstream::{self, stream::Config, stream::StorageType};
use bytes::Bytes;
use serde_json::{Value, json};
use switchyard_eventlog::embedded::{Durability, EmbeddedLog, EmbeddedOptions};
use switchyard_eventlog::nats::{NatsLog, NatsOptions};
use switchyard_eventlog::{EventLog, Expected, NewEvent, Payload, ReadRequest, Subject};
use switchyard_testkit::nats::{Bus, NatsOptions as ServerOptions};

#[derive(clap::Args)]
pub struct Args {
    /// Payload bytes per event.
    #[arg(long, default_value_t = 256)]
    payload: usize,
    /// Concurrent appenders to the embedded log (each on its own subject).
    /// Group commit needs concurrency: each fsync carries what queued meanwhile.
    #[arg(long, default_value_t = 512)]
    producers: usize,
    /// Concurrent publishers to JetStream, backend and bare loop alike; one
    /// comparison per value.
    #[arg(long, value_delimiter = ',', default_values_t = [64, 512])]
    nats_producers: Vec<usize>,
    /// Events per append call.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// How an append stores its events: one atomic batch on the producer's
    /// subject, one atomic batch across `--batch` subjects, or one by one
    /// across them (`append_each`, as the inventory appends facts).
    #[arg(long, value_enum, default_value_t = Append::OneSubject)]
    append: Append,
    /// Events appended with an fsync per append.
    #[arg(long, default_value_t = 5_000)]
    fsync_events: usize,
    /// Events appended with group commit (and then replayed).
    #[arg(long, default_value_t = 1_000_000)]
    group_events: usize,
    /// Events published to JetStream, by the backend and by the bare loop each.
    #[arg(long, default_value_t = 50_000)]
    nats_events: usize,
    /// How nats-server fsyncs, one JetStream run per value in this order
    /// (`always`: fsync before every ack, as `deploy/nats/jetstream.conf`
    /// and the chart run it; `default`: the server's default).
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [crate::Sync::Default, crate::Sync::Always])]
    sync: Vec<crate::Sync>,
    /// The JetStream runs on this many nats-servers, one run per value after
    /// `--sync`'s (`1,3`: one server at R1, then a JetStream cluster of
    /// three on loopback with the stream at R3; backend and bare loop alike).
    #[arg(long, value_delimiter = ',', default_values_t = [1])]
    nats_servers: Vec<usize>,
    /// Directory for the embedded logs (a temp dir under it); default: the system temp dir.
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
enum Append {
    OneSubject,
    Across,
    Each,
}

fn payload(size: usize) -> Bytes {
    Bytes::from((0..size).map(|i| (i * 31 % 251) as u8).collect::<Vec<u8>>())
}

fn event(id: String, body: &Bytes) -> NewEvent {
    NewEvent {
        payload: Payload::Raw {
            event_type: "BenchEvent".into(),
            schema_version: 1,
            bytes: body.clone(),
        },
        ..NewEvent::new(id, 0, Default::default())
    }
}

/// Appends `total` events from `producers` concurrent tasks, `batch` an
/// append as `append` says; returns events/s.
async fn drive(
    log: Arc<dyn EventLog>,
    total: usize,
    producers: usize,
    (batch, append): (usize, Append),
    body: &Bytes,
    tag: &str,
) -> anyhow::Result<f64> {
    let per_producer = total / producers;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for p in 0..producers {
        let log = log.clone();
        let body = body.clone();
        let tag = tag.to_string();
        tasks.push(tokio::spawn(async move {
            let subject = Subject::new(format!("bench.{tag}.p{p}")).unwrap();
            let mut n = 0;
            while n < per_producer {
                let size = batch.min(per_producer - n);
                let events = (0..size).map(|i| event(format!("{tag}-{p}-{}", n + i), &body));
                match append {
                    Append::OneSubject => {
                        log.append(&subject, Expected::Any, events.collect())
                            .await?
                    }
                    Append::Across | Append::Each => {
                        let across = events
                            .enumerate()
                            .map(|(i, e)| (Subject::new(format!("{subject}.{i}")).unwrap(), e))
                            .collect();
                        if matches!(append, Append::Each) {
                            log.append_each(across).await?
                        } else {
                            log.append_batch(across, &[]).await?
                        }
                    }
                };
                n += size;
            }
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok((per_producer * producers) as f64 / start.elapsed().as_secs_f64())
}

async fn embedded(args: &Args, body: &Bytes, root: &std::path::Path) -> anyhow::Result<Value> {
    let mut results = serde_json::Map::new();
    for (name, durability, total) in [
        (
            "fsync_each_append",
            Durability::FsyncEachAppend,
            args.fsync_events,
        ),
        ("group_commit", Durability::GroupCommit, args.group_events),
    ] {
        let dir = root.join(name);
        let log: Arc<dyn EventLog> = Arc::new(EmbeddedLog::open(
            &dir,
            EmbeddedOptions {
                durability,
                ..Default::default()
            },
        )?);
        let rate = drive(
            log.clone(),
            total,
            args.producers,
            (args.batch, args.append),
            body,
            name,
        )
        .await?;
        results.insert(format!("append_{name}_events_per_s"), json!(rate.round()));
        results.insert(format!("append_{name}_events"), json!(total));
    }

    // Replay: reopen (recovery scan), then read everything in pages.
    let dir = root.join("group_commit");
    let open_start = Instant::now();
    let log = EmbeddedLog::open_read_only(&dir)?;
    let open_s = open_start.elapsed().as_secs_f64();
    let start = Instant::now();
    let (mut from, mut count, mut bytes) = (1, 0u64, 0u64);
    loop {
        let page = log
            .read(ReadRequest {
                subject: None,
                from,
                limit: Some(8192),
            })
            .await?;
        let Some(last) = page.last() else { break };
        from = last.sequence + 1;
        count += page.len() as u64;
        bytes += page.iter().map(|e| e.raw.len() as u64).sum::<u64>();
    }
    let replay_s = start.elapsed().as_secs_f64();
    results.insert("replay_events".into(), json!(count));
    results.insert(
        "replay_events_per_s".into(),
        json!((count as f64 / replay_s).round()),
    );
    results.insert(
        "replay_mib_per_s".into(),
        json!(((bytes as f64 / replay_s) / (1 << 20) as f64).round()),
    );
    results.insert("open_recovery_scan_s".into(), json!(open_s));
    results.insert(
        "bytes_per_record_on_disk".into(),
        json!(dir_size(&dir)? / count.max(1)),
    );
    Ok(Value::Object(results))
}

fn dir_size(dir: &std::path::Path) -> anyhow::Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir)? {
        total += entry?.metadata()?.len();
    }
    Ok(total)
}

/// The bare loop: the same concurrency, payload and acks, straight through async-nats.
async fn bare_jetstream(
    url: &str,
    replicas: usize,
    total: usize,
    producers: usize,
    body: &Bytes,
    tag: &str,
) -> anyhow::Result<f64> {
    // A cluster's servers, comma-separated.
    let client = async_nats::connect(url.split(',').collect::<Vec<_>>()).await?;
    let js = jetstream::new(client);
    js.get_or_create_stream(Config {
        name: "BARE".into(),
        subjects: vec!["bare.>".into()],
        storage: StorageType::File,
        duplicate_window: Duration::from_secs(120),
        num_replicas: replicas,
        ..Default::default()
    })
    .await?;
    let per_producer = total / producers;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for p in 0..producers {
        let js = js.clone();
        let body = body.clone();
        let tag = tag.to_string();
        tasks.push(tokio::spawn(async move {
            let subject = format!("bare.p{p}");
            for n in 0..per_producer {
                let mut headers = HeaderMap::new();
                headers.insert("Nats-Msg-Id", format!("{tag}-{p}-{n}").as_str());
                js.publish_with_headers(subject.clone(), headers, body.clone())
                    .await?
                    .await?;
            }
            anyhow::Ok(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok((per_producer * producers) as f64 / start.elapsed().as_secs_f64())
}

async fn jetstream(
    args: &Args,
    sync: crate::Sync,
    servers: usize,
    body: &Bytes,
) -> anyhow::Result<Value> {
    let options = ServerOptions {
        sync_always: sync == crate::Sync::Always,
        ..ServerOptions::default()
    };
    let bus = Bus::start(servers, options).await;
    let (url, replicas) = (bus.url(), bus.replicas());
    let version = match &bus {
        Bus::Server(server) => server.version(),
        Bus::Cluster(cluster) => cluster.servers[0].version(),
    };
    let log: Arc<dyn EventLog> = Arc::new(
        NatsLog::connect(
            &url,
            NatsOptions {
                replicas,
                ..NatsOptions::default()
            },
        )
        .await?,
    );
    let mut runs = Vec::new();
    for &producers in &args.nats_producers {
        // Alternate the two so neither profits from a warmer server: bare, backend, bare, backend.
        let (mut bare, mut backend) = (Vec::new(), Vec::new());
        for round in 0..2 {
            let tag = format!("nats{producers}r{round}");
            bare.push(
                bare_jetstream(
                    &url,
                    replicas,
                    args.nats_events / 2,
                    producers,
                    body,
                    &format!("bare-{tag}"),
                )
                .await?,
            );
            backend.push(
                drive(
                    log.clone(),
                    args.nats_events / 2,
                    producers,
                    (args.batch, args.append),
                    body,
                    &tag,
                )
                .await?,
            );
        }
        let bare_rate = bare.iter().sum::<f64>() / bare.len() as f64;
        let backend_rate = backend.iter().sum::<f64>() / backend.len() as f64;
        runs.push(json!({
            "producers": producers,
            "bare_async_nats_events_per_s": bare_rate.round(),
            "backend_events_per_s": backend_rate.round(),
            "backend_to_bare_ratio": (backend_rate / bare_rate * 1000.0).round() / 1000.0,
        }));
    }
    Ok(json!({
        "server": version,
        "sync": sync,
        "nats_servers": servers,
        "stream_replicas": replicas,
        "events_each": args.nats_events,
        "runs": runs,
    }))
}

pub async fn run(args: Args) -> anyhow::Result<Value> {
    let body = payload(args.payload);
    let root = match &args.dir {
        Some(dir) => tempfile::tempdir_in(dir)?,
        None => tempfile::tempdir()?,
    };
    let embedded = embedded(&args, &body, root.path()).await?;
    let mut jetstream_runs = Vec::new();
    for &sync in &args.sync {
        for &servers in &args.nats_servers {
            jetstream_runs.push(jetstream(&args, sync, servers, &body).await?);
        }
    }
    let jetstream = Value::Array(jetstream_runs);
    Ok(json!({
        "benchmark": "eventlog",
        "payload_bytes": args.payload,
        "producers": args.producers,
        "events_per_append": args.batch,
        "append": args.append,
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "embedded": embedded,
        "jetstream": jetstream,
        "peak_rss_kib": crate::peak_rss_kib(),
    }))
}

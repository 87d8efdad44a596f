//! `switchyard log show` and `switchyard log verify`.

use std::io::Write;
use std::process::ExitCode;
use std::time::{Duration, UNIX_EPOCH};

use anyhow::Context;
use clap::{Args, Subcommand};
use serde_json::json;
use switchyard_eventlog::embedded::{EmbeddedLog, verify_dir};
use switchyard_eventlog::keys::Keyring;
use switchyard_eventlog::{
    Decoded, EventLog, Problem, ReadRequest, StoredEvent, Subject, VerifyReport,
};

use crate::backend::{Backend, open};
use crate::output::Output;

const PAGE: usize = 4096;

#[derive(Subcommand, Debug)]
pub enum LogCommand {
    /// Print events of the log, oldest first.
    Show(ShowArgs),
    /// Check every checksum and hash chain (and a stream's configuration);
    /// exit 1 if anything is wrong.
    Verify(VerifyArgs),
    /// Create the JetStream stream of the log, once, before the services
    /// start (they never create it: a log deleted or replaced must not
    /// silently start over empty). An existing stream is checked instead.
    Init(InitArgs),
    /// The JSON Schema of each CloudEvent type's `data` (the services
    /// publish every record on `switchyard.events.<noun>.<verb>`): one file
    /// per type, `<type>.json`, into a directory, or all as one JSON object
    /// keyed by type.
    Schemas(SchemasArgs),
}

#[derive(Args, Debug)]
pub struct SchemasArgs {
    /// Write `<type>.json` per CloudEvent type into this directory (e.g.
    /// docs/integrations/schemas).
    #[arg(long)]
    pub out: Option<std::path::PathBuf>,
}

#[derive(Args, Debug)]
pub struct InitArgs {
    #[command(flatten)]
    pub nats: switchyard_runtime::connect::NatsArgs,
    #[command(flatten)]
    pub events: switchyard_runtime::cloudevents::EventsArgs,
}

#[derive(Args, Debug)]
pub struct ShowArgs {
    #[command(flatten)]
    pub backend: Backend,
    /// Only events of this subject (aggregate), e.g. node.worker-1.
    #[arg(long, env = "SWITCHYARD_SUBJECT")]
    pub subject: Option<String>,
    /// First sequence to show.
    #[arg(long, default_value_t = 1)]
    pub from: u64,
    /// Show at most this many events.
    #[arg(long)]
    pub limit: Option<usize>,
    /// table: one line per event; json: one JSON object per line with the
    /// envelope fields and the decoded payload.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table, env = "SWITCHYARD_OUTPUT")]
    pub output: Output,
}

#[derive(Args, Debug)]
pub struct VerifyArgs {
    #[command(flatten)]
    pub backend: Backend,
    /// The keyring (identity -> NKey public keys): every record must be
    /// signed by the key of the author it names; each that is not is named.
    #[arg(long, env = "SWITCHYARD_KEYRING")]
    pub keyring: Option<std::path::PathBuf>,
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table, env = "SWITCHYARD_OUTPUT")]
    pub output: Output,
}

/// Writes to stdout; a closed pipe (`| head`) ends the command quietly.
fn emit(out: &mut impl Write, line: std::fmt::Arguments) -> anyhow::Result<bool> {
    match out.write_fmt(line).and_then(|_| out.write_all(b"\n")) {
        Ok(()) => Ok(true),
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(err) => Err(err).context("write to stdout"),
    }
}

pub async fn show(args: ShowArgs) -> anyhow::Result<ExitCode> {
    let subject = args.subject.as_deref().map(Subject::new).transpose()?;
    let log = open(&args.backend).await?;
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    if args.output == Output::Table
        && !emit(
            &mut out,
            format_args!(
                "{:>8}  {:<30}  {:<28}  {:<26}  {:<16}  ID",
                "SEQ", "RECORDED", "SUBJECT", "TYPE", "ACTOR"
            ),
        )?
    {
        return Ok(ExitCode::SUCCESS);
    }
    let mut from = args.from;
    let mut remaining = args.limit.unwrap_or(usize::MAX);
    while remaining > 0 {
        let request = ReadRequest {
            subject: subject.clone(),
            from,
            limit: Some(remaining.min(PAGE)),
        };
        let page = log.read(request).await?;
        let Some(last) = page.last() else { break };
        from = last.sequence + 1;
        remaining -= page.len();
        for event in &page {
            let written = match args.output {
                Output::Json => emit(&mut out, format_args!("{}", event_json(event)?))?,
                Output::Table => emit(&mut out, format_args!("{}", event_row(event)))?,
            };
            if !written {
                return Ok(ExitCode::SUCCESS);
            }
        }
    }
    let _ = out.flush();
    Ok(ExitCode::SUCCESS)
}

fn recorded_at(nanos: i64) -> String {
    match u64::try_from(nanos) {
        Ok(nanos) => {
            humantime::format_rfc3339_nanos(UNIX_EPOCH + Duration::from_nanos(nanos)).to_string()
        }
        Err(_) => format!("{nanos}ns before the epoch"),
    }
}

fn event_row(event: &StoredEvent) -> String {
    let e = &event.envelope;
    format!(
        "{:>8}  {:<30}  {:<28}  {:<26}  {:<16}  {}",
        event.sequence,
        recorded_at(e.recorded_at_unix_nanos),
        e.subject,
        e.event_type,
        e.actor,
        e.id
    )
}

/// One event as JSON: the envelope's fields and the decoded payload (canonical
/// protobuf JSON); a payload this build cannot decode is shown raw, with why.
pub fn event_json(event: &StoredEvent) -> anyhow::Result<serde_json::Value> {
    let e = &event.envelope;
    let payload = match event.decode() {
        Decoded::Event(domain) => serde_json::to_value(&domain)?,
        Decoded::Unknown {
            event_type,
            schema_version,
            reason,
            raw,
        } => json!({
            "undecodable": {
                "event_type": event_type,
                "schema_version": schema_version,
                "reason": reason.to_string(),
                "raw_hex": hex::encode(raw),
            }
        }),
    };
    Ok(json!({
        "sequence": event.sequence,
        "id": e.id,
        "subject": e.subject,
        "recorded_at": recorded_at(e.recorded_at_unix_nanos),
        "recorded_at_unix_nanos": e.recorded_at_unix_nanos,
        "correlation_id": e.correlation_id,
        "causation_id": e.causation_id,
        "actor": e.actor,
        "trace": e.trace.as_ref().map(|t| json!({"traceparent": t.traceparent, "tracestate": t.tracestate})),
        "schema_version": e.schema_version,
        "event_type": e.event_type,
        "prev_hash": hex::encode(&e.prev_hash),
        "hash": hex::encode(event.hash()),
        "payload": payload,
    }))
}

pub async fn verify(args: VerifyArgs) -> anyhow::Result<ExitCode> {
    let mut report = match (&args.backend.data_dir, args.backend.nats()) {
        // Straight from the files: a damaged log that will not open is still checked.
        (Some(dir), _) => {
            if !dir.is_dir() {
                anyhow::bail!("--data-dir {}: no such directory", dir.display());
            }
            verify_dir(dir).with_context(|| format!("verify {}", dir.display()))?
        }
        (None, Some(nats)) => {
            let client = nats.client("cli").await?;
            // Opened whatever its configuration: the report names what is off.
            nats.stream
                .open_with(client, false, false)
                .await?
                .verify()
                .await?
        }
        (None, None) => unreachable!("clap requires --data-dir or --nats"),
    };
    if let Some(path) = &args.keyring {
        check_authors(&args.backend, &Keyring::load(path)?, &mut report).await?;
    }
    print_report(&report, args.output)?;
    Ok(if report.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Checks every record's signature against `keyring`; each record it does
/// not vouch for is a problem, named by sequence, type, subject and actor.
async fn check_authors(
    backend: &Backend,
    keyring: &Keyring,
    report: &mut VerifyReport,
) -> anyhow::Result<()> {
    let log: Box<dyn EventLog> = match (&backend.data_dir, backend.nats()) {
        (Some(dir), _) => Box::new(EmbeddedLog::open_read_only(dir)?),
        (None, Some(nats)) => {
            let client = nats.client("cli").await?;
            Box::new(nats.stream.open_with(client, false, false).await?)
        }
        (None, None) => unreachable!("clap requires --data-dir or --nats"),
    };
    let mut authenticated = 0;
    let mut problems = Vec::new();
    switchyard_eventlog::replay(log.as_ref(), 0, |stored| {
        // A record that is no envelope is reported as such already.
        if stored.malformed.is_some() {
            return;
        }
        let e = &stored.envelope;
        match switchyard_runtime::authorship::vouch(keyring, &stored, &stored.decode()) {
            Ok(_) => authenticated += 1,
            Err(why) => problems.push(Problem {
                location: format!("sequence {}", stored.sequence),
                sequence: Some(stored.sequence),
                what: format!("{} on {} by {:?}: {why}", e.event_type, e.subject, e.actor),
            }),
        }
    })
    .await?;
    report.problems.extend(problems);
    report.authenticated = Some(authenticated);
    Ok(())
}

pub async fn init(args: InitArgs) -> anyhow::Result<ExitCode> {
    let client = args.nats.client("cli").await?;
    let stream = &args.nats.stream;
    let existed = async_nats::jetstream::new(client.clone())
        .get_stream(&stream.stream)
        .await
        .is_ok();
    let log = stream.open(client.clone(), true).await?;
    let last = log.last_sequence(None).await?;
    if existed {
        println!(
            "stream {} exists and is configured as the log must be ({} records)",
            stream.stream, last
        );
    } else {
        println!(
            "created stream {} on {}.> (file storage, {} replica(s), deny delete and purge, no limits)",
            stream.stream, stream.subject_prefix, stream.stream_replicas
        );
    }
    if !args.events.events_prefix.is_empty() {
        let js = async_nats::jetstream::new(client);
        switchyard_runtime::cloudevents::ensure_stream(&js, &args.events).await?;
        println!(
            "stream {} keeps the log's CloudEvents on {}.> for {}",
            args.events.events_stream,
            args.events.events_prefix,
            humantime::format_duration(args.events.events_max_age)
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn print_report(report: &VerifyReport, output: Output) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match output {
        Output::Json => {
            let value = json!({
                "ok": report.is_ok(),
                "records": report.records,
                "subjects": report.subjects,
                "last_sequence": report.last_sequence,
                "chain_head": report.chain_head,
                "authenticated": report.authenticated,
                "problems": report.problems.iter().map(|p| json!({
                    "location": p.location, "sequence": p.sequence, "what": p.what,
                })).collect::<Vec<_>>(),
                "undecodable": report.undecodable.iter().map(|u| json!({
                    "sequence": u.sequence, "event_type": u.event_type,
                    "schema_version": u.schema_version, "reason": u.reason.to_string(),
                })).collect::<Vec<_>>(),
            });
            writeln!(out, "{value}")?;
        }
        Output::Table => {
            let verdict = if report.is_ok() { "ok" } else { "DAMAGED" };
            writeln!(
                out,
                "{verdict}: {} records, {} subjects, last sequence {}",
                report.records, report.subjects, report.last_sequence
            )?;
            if !report.chain_head.is_empty() {
                writeln!(out, "chain head: {}", report.chain_head)?;
            }
            if let Some(authenticated) = report.authenticated {
                writeln!(
                    out,
                    "authorship: {authenticated} of {} records signed by the author they name",
                    report.records
                )?;
            }
            for problem in &report.problems {
                writeln!(out, "problem: {problem}")?;
            }
            for unknown in &report.undecodable {
                writeln!(
                    out,
                    "kept raw: sequence {} {} (schema {}): {}",
                    unknown.sequence, unknown.event_type, unknown.schema_version, unknown.reason
                )?;
            }
        }
    }
    Ok(())
}

/// `switchyard log schemas`: every event type's schema, from the compiled
/// protos — the same that `dataschema` of each CloudEvent names.
pub fn schemas(args: SchemasArgs) -> anyhow::Result<ExitCode> {
    let mut all = serde_json::Map::new();
    for (_, ce_type, _) in switchyard_proto::v1::EVENT_TYPES {
        let schema = switchyard_proto::schema::event_schema(ce_type)
            .with_context(|| format!("no schema for the event type {ce_type}"))?;
        match &args.out {
            Some(dir) => {
                std::fs::create_dir_all(dir)
                    .with_context(|| format!("create {}", dir.display()))?;
                let path = dir.join(format!("{ce_type}.json"));
                std::fs::write(&path, serde_json::to_string_pretty(&schema)? + "\n")
                    .with_context(|| format!("write {}", path.display()))?;
            }
            None => {
                all.insert(ce_type.to_string(), schema);
            }
        }
    }
    if args.out.is_none() {
        crate::output::write_stdout(&(serde_json::to_string_pretty(&all)? + "\n"))?;
    }
    Ok(ExitCode::SUCCESS)
}

//! `switchyard demo`: the reference migration in one process, on the embedded
//! log, against the simulated cluster.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use serde_json::json;
use switchyard_eventlog::embedded::{EmbeddedLog, EmbeddedOptions};
use switchyard_eventlog::{EventLog, LogError, NewEvent, Payload, Subject, append_in_order};
use switchyard_runtime::Actors;
use switchyard_scenario::{
    Check, LogSink, Logged, StepReport, nvidia_backend, nvidia_cores, run_nvidia_guide,
    run_reference,
};
use switchyard_sim::{SECOND, SimConfig};

use std::fmt::Write;

use crate::output::{Output, write_stdout};
use crate::state::Folded;

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// `deckhouse`: the reference migration, Switchyard's node agent serving
    /// both stacks. `nvidia-operator`: the NVIDIA guide's migration on a
    /// simulated GPU Operator and DRA driver (pools `legacy` and
    /// `dra-pilot`; the workloads bound to the legacy pool fit on half the
    /// nodes, the pilot pool taking the other half).
    #[arg(long, env = "SWITCHYARD_DEMO_BACKEND", default_value = "deckhouse", value_parser = ["deckhouse", "nvidia-operator"])]
    pub backend: String,
    /// GPU nodes of the source group (spec.gpu, device plugin).
    #[arg(long, env = "SWITCHYARD_DEMO_NODES", default_value_t = 4)]
    pub nodes: usize,
    #[arg(long, env = "SWITCHYARD_DEMO_GPUS_PER_NODE", default_value_t = 8)]
    pub gpus_per_node: u32,
    /// Deployments requesting nvidia.com/gpu (as many as fit in all nodes but one).
    #[arg(long, env = "SWITCHYARD_DEMO_WORKLOADS", default_value_t = 6)]
    pub workloads: usize,
    /// Seed of the simulated cluster: the same seed gives the same log.
    #[arg(long, env = "SWITCHYARD_DEMO_SEED", default_value_t = 1)]
    pub seed: u64,
    /// Where to write the migration log (an empty or new directory); default: a new temp dir.
    #[arg(long, env = "SWITCHYARD_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table, env = "SWITCHYARD_OUTPUT")]
    pub output: Output,
}

fn check_args(args: &DemoArgs) -> anyhow::Result<()> {
    if !(2..=1000).contains(&args.nodes) {
        bail!(
            "--nodes {}: expected 2 to 1000 GPU nodes (one must stay free to drain)",
            args.nodes
        );
    }
    if !(1..=16).contains(&args.gpus_per_node) {
        bail!("--gpus-per-node {}: expected 1 to 16", args.gpus_per_node);
    }
    if !(1..=5000).contains(&args.workloads) {
        bail!("--workloads {}: expected 1 to 5000", args.workloads);
    }
    if args.backend == "nvidia-operator" && args.gpus_per_node == 1 && args.nodes < 4 {
        bail!(
            "--nodes {} --gpus-per-node 1: the nvidia-operator demo needs 4 nodes or more with one GPU each (the pilot pool takes half, and the bridge test needs a free GPU on each pool beside the legacy workloads), or 2 GPUs per node",
            args.nodes
        );
    }
    Ok(())
}

/// A fresh directory for the log: the given one if it holds no log yet, else a new temp dir.
fn data_dir(args: &DemoArgs) -> anyhow::Result<PathBuf> {
    match &args.data_dir {
        Some(dir) => {
            if dir.exists() {
                let has_log = std::fs::read_dir(dir)
                    .with_context(|| format!("--data-dir {}", dir.display()))?
                    .any(|e| e.is_ok_and(|e| e.path().extension().is_some_and(|x| x == "seg")));
                if has_log {
                    bail!(
                        "--data-dir {} already holds a migration log; the demo writes a new one: choose an empty or new directory",
                        dir.display()
                    );
                }
            }
            Ok(dir.clone())
        }
        None => Ok(tempfile::Builder::new()
            .prefix("switchyard-demo-")
            .tempdir()?
            .keep()),
    }
}

/// Appends the migration log to the embedded log as the run goes: consecutive
/// events of one aggregate as one batch, with ids that depend only on the seed
/// and the sequence, so the same seed writes the same bytes.
struct EmbeddedSink {
    log: EmbeddedLog,
    seed: u64,
}

impl LogSink for EmbeddedSink {
    type Error = LogError;
    async fn append(&mut self, records: &[Logged]) -> Result<(), LogError> {
        let mut events = Vec::with_capacity(records.len());
        for r in records {
            let subject = Subject::new(r.subject())?;
            events.push((
                subject,
                NewEvent {
                    id: format!("demo-{}-{:08}", self.seed, r.seq),
                    recorded_at_unix_nanos: r.at,
                    correlation_id: format!("migration-seed-{}", self.seed),
                    causation_id: String::new(),
                    actor: r.actor.to_string(),
                    trace: None,
                    payload: Payload::Domain(r.event.clone()),
                    term: None,
                },
            ));
        }
        append_in_order(&self.log, events).await.map(drop)
    }
}

pub async fn demo(args: DemoArgs) -> anyhow::Result<ExitCode> {
    check_args(&args)?;
    let dir = data_dir(&args)?;
    let config = SimConfig {
        seed: args.seed,
        gpu_nodes: args.nodes,
        gpus_per_node: args.gpus_per_node,
        workloads: args.workloads,
        ..SimConfig::default()
    };
    let started = Instant::now();
    let progress = ProgressBar::new_spinner();
    progress.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed}] {pos} steps  {msg}").expect("template"),
    );
    // The six services, each a ractor actor around its core; the log is
    // appended to the embedded log as the migration goes.
    let sink = EmbeddedSink {
        log: EmbeddedLog::open(&dir, EmbeddedOptions::default())?,
        seed: args.seed,
    };
    let on_step = |step: &StepReport| {
        progress.inc(1);
        progress.set_message(step.step.clone());
        if !step.ok {
            progress.println(format!("FAILED {}: {}", step.step, step.detail));
        }
    };
    let outcome = if args.backend == "nvidia-operator" {
        let backend = nvidia_backend();
        let config = SimConfig {
            card: switchyard_sim::Card::h100(),
            ..config.clone()
        };
        let services = Actors::spawn_cores(nvidia_cores(&backend))
            .await
            .context("start the services")?;
        run_nvidia_guide(config, backend, services, sink, on_step).await
    } else {
        let services = Actors::spawn().await.context("start the services")?;
        run_reference(config.clone(), services, sink, on_step).await
    };
    progress.set_message("checking the migration log");
    let log = &outcome.migration.sink.log;
    let report = log.verify().await?;
    let mut checks: Vec<Check> = outcome.checks.clone();
    let written = outcome.migration.log.len() as u64;
    checks.push(Check {
        name: "log-verified",
        ok: report.is_ok() && report.records == written,
        detail: format!(
            "{} records, chain head {}",
            report.records, report.chain_head
        ),
    });
    // Replay from disk: the log on disk folds into the same state as the live run.
    let folded = Folded::read(log, None).await?;
    let same = folded.states == outcome.states.clone().decided();
    checks.push(Check {
        name: "replay-from-disk",
        ok: same,
        detail: format!("{} events folded from {}", folded.events, dir.display()),
    });
    let simulated_s = (outcome.migration.sim.now() - config.start) / SECOND;
    let (steps, migration) = (outcome.steps, outcome.migration);
    migration.sink.log.close();
    migration.services.stop().await;
    progress.finish_and_clear();

    let ok = steps.iter().all(|s| s.ok) && checks.iter().all(|c| c.ok);
    let mut text = String::new();
    match args.output {
        Output::Json => {
            let summary = json!({
                "ok": ok,
                "seed": args.seed,
                "backend": args.backend,
                "nodes": args.nodes,
                "gpus_per_node": args.gpus_per_node,
                "workloads": args.workloads,
                "data_dir": dir,
                "events": written,
                "simulated_seconds": simulated_s,
                "wall_ms": started.elapsed().as_millis() as u64,
                "steps": steps.iter().map(|s| json!({"step": s.step, "ok": s.ok, "detail": s.detail, "at": s.at})).collect::<Vec<_>>(),
                "invariants": checks.iter().map(|c| json!({"name": c.name, "ok": c.ok, "detail": c.detail})).collect::<Vec<_>>(),
                "final_state": folded.to_json(),
            });
            writeln!(text, "{summary}")?;
        }
        Output::Table => {
            writeln!(text, "{:<4}  {:<44}  DETAIL", "", "STEP")?;
            for s in &steps {
                writeln!(
                    text,
                    "{:<4}  {:<44}  {}",
                    if s.ok { "ok" } else { "FAIL" },
                    s.step,
                    s.detail
                )?;
            }
            writeln!(text)?;
            writeln!(text, "{:<4}  {:<44}  DETAIL", "", "INVARIANT")?;
            for c in &checks {
                writeln!(
                    text,
                    "{:<4}  {:<44}  {}",
                    if c.ok { "ok" } else { "FAIL" },
                    c.name,
                    c.detail
                )?;
            }
            writeln!(text)?;
            text += &folded.render_table();
            writeln!(text)?;
            writeln!(
                text,
                "{} events in {} ({} s simulated, {} ms wall); inspect with: switchyard log show --data-dir {}",
                written,
                dir.display(),
                simulated_s,
                started.elapsed().as_millis(),
                dir.display()
            )?;
        }
    }
    write_stdout(&text)?;
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

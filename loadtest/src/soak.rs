//! The fault soak: the simulator's reference migration on kwok with a fault
//! in every step ([`switchyard_testkit::reference`], as the CI test
//! `the_reference_scenario_survives_a_fault_in_every_step` runs it once),
//! once per seed. Each seed picks where in the list of faults the steps
//! start and how many records into each step its fault strikes. A run that
//! does not end as the simulator's stops the soak and names its seed (run it
//! again alone with `SWITCHYARD_FAULT_SEED=<seed>` on the test). Needs the
//! services, the node agent and `switchyard` built beside this binary
//! (`cargo build --release -p switchyard -p switchyard-node-agent
//! -p switchyard-loadtest` builds them all).

use std::collections::BTreeMap;
use std::time::Instant;

use futures::FutureExt;
use serde_json::{Value, json};
use switchyard_testkit::migration::beside_current_exe;
use switchyard_testkit::reference::{self, Options};

#[derive(clap::Args)]
pub struct Args {
    /// How many runs, a seed each.
    #[arg(long, default_value_t = 10)]
    iterations: u64,
    /// The first run's seed; run i has seed + i.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// The log on this many nats-servers: 3 (or 5) is a JetStream cluster
    /// with a copy of the stream on each, and the faults are the cluster's
    /// (its stream's leader killed, a server cut off, a store wiped).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=7))]
    nats_servers: u64,
    /// Each elected service as this many replicas: 2 runs them with a
    /// standby, and the faults are the leaders' (killed, cut off from the
    /// API server, cut off from NATS).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=3))]
    replicas: u64,
}

pub async fn run(args: Args) -> anyhow::Result<Value> {
    let started = Instant::now();
    let cli = beside_current_exe("switchyard");
    anyhow::ensure!(
        cli.exists(),
        "{} is not built (cargo build --release -p switchyard -p switchyard-node-agent -p switchyard-loadtest)",
        cli.display()
    );
    // Faults survived by kind; kill points (records into the step) by step.
    let mut survived: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut points: BTreeMap<String, BTreeMap<u64, u64>> = BTreeMap::new();
    let mut seconds = Vec::new();
    for i in 0..args.iterations {
        let seed = args.seed + i;
        let run_started = Instant::now();
        // A run that fails panics, naming the difference; its cluster's
        // processes are ended as it unwinds.
        let run = std::panic::AssertUnwindSafe(reference::run(Options {
            faults: Some(seed),
            toxics: &[],
            flow_shares: None,
            binary: beside_current_exe,
            cli: &cli,
            nats_servers: args.nats_servers as usize,
            replicas: args.replicas as usize,
        }))
        .catch_unwind()
        .await;
        let report = match run {
            Ok(report) => report,
            Err(panic) => {
                let why = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "a panic".into());
                anyhow::bail!(
                    "seed {seed} failed after {i} passed run(s) (SWITCHYARD_FAULT_SEED={seed} on the_reference_scenario_survives_a_fault_in_every_step runs it alone):\n{why}"
                );
            }
        };
        for struck in &report.struck {
            *survived.entry(struck.fault).or_default() += 1;
            *points
                .entry(struck.step.clone())
                .or_default()
                .entry(struck.after)
                .or_default() += 1;
            eprintln!("seed {seed}: {struck}");
        }
        let took = run_started.elapsed().as_secs_f64();
        eprintln!(
            "seed {seed}: passed in {took:.0} s, {} faults survived",
            report.struck.len()
        );
        seconds.push(took);
    }
    let faults: u64 = survived.values().sum();
    Ok(json!({
        "iterations": args.iterations,
        "first_seed": args.seed,
        "nats_servers": args.nats_servers,
        "replicas": args.replicas,
        "faults_survived": faults,
        "survived_by_fault": survived,
        "kill_points_by_step": points,
        "seconds_per_run": {
            "min": seconds.iter().copied().fold(f64::INFINITY, f64::min),
            "max": seconds.iter().copied().fold(0.0, f64::max),
        },
        "elapsed_s": started.elapsed().as_secs_f64(),
    }))
}

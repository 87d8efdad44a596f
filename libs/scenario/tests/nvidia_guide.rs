//! The NVIDIA guide's migration on the simulated GPU Operator and DRA driver
//! (`switchyard demo --backend nvidia-operator`): at many sizes and seeds
//! every step succeeds, every invariant holds and each stage of the guide's
//! table is recorded with its evidence passed, and the same seed gives the
//! same log byte for byte.

use prost::Message;
use switchyard_proto::v1::domain_event::Kind;
use switchyard_runtime::{Local, Services};
use switchyard_scenario::{Outcome, nvidia_backend, nvidia_cores, run_nvidia_guide};
use switchyard_sim::{Card, SimConfig};

async fn run(config: SimConfig) -> Outcome<Local> {
    let backend = nvidia_backend();
    let services = Local::with_cores(nvidia_cores(&backend));
    run_nvidia_guide(config, backend, services, (), |_| {}).await
}

fn describe<S: Services>(outcome: &Outcome<S>) -> String {
    let steps = outcome
        .steps
        .iter()
        .map(|s| (s.ok, s.step.as_str(), s.detail.as_str()));
    let checks = outcome
        .checks
        .iter()
        .map(|c| (c.ok, c.name, c.detail.as_str()));
    steps
        .chain(checks)
        .map(|(ok, name, detail)| {
            format!("{} {name}: {detail}\n", if ok { "ok  " } else { "FAIL" })
        })
        .collect()
}

/// The stages recorded as checked with nothing failed, in log order.
fn stages_passed<S: Services>(outcome: &Outcome<S>) -> Vec<String> {
    outcome
        .migration
        .log
        .iter()
        .filter_map(|l| match &l.event.kind {
            Some(Kind::EvidenceChecked(c)) if c.failed == 0 && !c.stage.is_empty() => {
                Some(c.stage.clone())
            }
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn the_guide_runs_every_stage_at_many_sizes_and_seeds() {
    for seed in 0..12u64 {
        let gpus_per_node = [1, 2, 4, 8][seed as usize % 4];
        // One GPU per node takes 4 nodes (`switchyard demo` refuses fewer).
        let least = if gpus_per_node == 1 { 4 } else { 2 };
        let config = SimConfig {
            seed,
            card: Card::h100(),
            gpu_nodes: least + seed as usize % 5,
            gpus_per_node,
            workloads: 1 + seed as usize % 6,
            ..SimConfig::default()
        };
        let outcome = run(config.clone()).await;
        assert!(outcome.ok(), "{config:?}\n{}", describe(&outcome));
        assert_eq!(
            stages_passed(&outcome),
            [
                "baseline",
                "pilot-pool",
                "driver-validation",
                "native-claim-pilot",
                "compatibility-bridge",
                "application-wave",
                "final-cutover",
            ],
            "{config:?}"
        );
    }
}

#[tokio::test]
async fn the_same_seed_gives_a_byte_identical_log() {
    let config = SimConfig {
        card: Card::h100(),
        ..SimConfig::default()
    };
    let encode = |outcome: &Outcome<Local>| -> Vec<(i64, String, Vec<u8>)> {
        outcome
            .migration
            .log
            .iter()
            .map(|l| (l.at, l.actor.to_string(), l.event.encode_to_vec()))
            .collect()
    };
    let first = run(config.clone()).await;
    let second = run(config).await;
    assert!(first.ok(), "{}", describe(&first));
    assert_eq!(encode(&first), encode(&second));
}

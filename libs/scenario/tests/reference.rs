//! The reference migration end to end on the simulator: every step succeeds,
//! every invariant holds, and the same seed gives the same log byte for byte.

use prost::Message;
use switchyard_scenario::{Outcome, run_reference};
use switchyard_sim::SimConfig;

fn run(seed: u64) -> Outcome {
    run_reference(
        SimConfig {
            seed,
            ..SimConfig::default()
        },
        |_| {},
    )
}

fn describe(outcome: &Outcome) -> String {
    let mut text = String::new();
    for step in &outcome.steps {
        text += &format!(
            "{} {}: {}\n",
            if step.ok { "ok  " } else { "FAIL" },
            step.step,
            step.detail
        );
    }
    for check in &outcome.checks {
        text += &format!(
            "{} {}: {}\n",
            if check.ok { "ok  " } else { "FAIL" },
            check.name,
            check.detail
        );
    }
    text
}

#[test]
fn the_reference_migration_completes_with_every_invariant_holding() {
    let outcome = run(1);
    assert!(outcome.ok(), "{}", describe(&outcome));
    let names: Vec<&str> = outcome.steps.iter().map(|s| s.step.as_str()).collect();
    assert!(
        names.iter().filter(|n| n.starts_with("step 3")).count() >= 4,
        "{names:?}"
    );
    assert!(names.iter().any(|n| n.starts_with("rollback: node")));
    assert!(
        names.contains(&"hold: remove spec.gpu from gpu-legacy"),
        "the upgrade hold is shown and released"
    );
    assert!(
        outcome.steps[0].detail.contains("gpu-legacy"),
        "{}",
        outcome.steps[0].detail
    );
    assert!(names.iter().any(|n| n.starts_with("rollback: application")));
}

#[test]
fn the_same_seed_gives_a_byte_identical_log() {
    let encode = |outcome: &Outcome| -> Vec<(i64, &'static str, Vec<u8>)> {
        outcome
            .migration
            .log
            .iter()
            .map(|l| (l.at, l.actor, l.event.encode_to_vec()))
            .collect()
    };
    let (a, b) = (run(7), run(7));
    assert_eq!(encode(&a), encode(&b));
    assert_ne!(encode(&a), encode(&run(8)), "another seed, another cluster");
}

#[test]
fn many_seeds_and_sizes_complete() {
    for seed in 0..12 {
        let config = SimConfig {
            seed,
            gpu_nodes: 2 + (seed as usize % 4),
            gpus_per_node: [2, 4, 8][seed as usize % 3],
            workloads: 3 + seed as usize % 6,
            upgraded_with_dra: seed % 2 == 0,
            ..SimConfig::default()
        };
        let outcome = run_reference(config.clone(), |_| {});
        assert!(outcome.ok(), "{config:?}\n{}", describe(&outcome));
    }
}

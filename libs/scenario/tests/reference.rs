//! The reference migration end to end on the simulator: every step succeeds,
//! every invariant holds, the same seed gives the same log byte for byte, and
//! the services give the same log whether they run in process or as actors.

use prost::Message;
use switchyard_runtime::{Actors, Local, Services};
use switchyard_scenario::{Outcome, run_reference};
use switchyard_sim::{Card, SimConfig};

async fn run(seed: u64) -> Outcome<Local> {
    run_reference(
        SimConfig {
            seed,
            ..SimConfig::default()
        },
        Local::default(),
        (),
        |_| {},
    )
    .await
}

fn describe<S: Services>(outcome: &Outcome<S>) -> String {
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

fn encode<S: Services>(outcome: &Outcome<S>) -> Vec<(i64, &'static str, Vec<u8>)> {
    outcome
        .migration
        .log
        .iter()
        .map(|l| (l.at, l.actor.as_str(), l.event.encode_to_vec()))
        .collect()
}

#[tokio::test]
async fn the_reference_migration_completes_with_every_invariant_holding() {
    let outcome = run(1).await;
    assert!(outcome.ok(), "{}", describe(&outcome));
    let names: Vec<&str> = outcome.steps.iter().map(|s| s.step.as_str()).collect();
    assert!(
        names.iter().filter(|n| n.starts_with("step 3")).count() >= 4,
        "{names:?}"
    );
    assert!(names.iter().any(|n| n.starts_with("rollback: node")));
    assert!(names.iter().any(|n| n.starts_with("rollback: application")));
    assert!(
        names.contains(&"hold: remove spec.gpu from gpu-legacy"),
        "the upgrade hold is shown and released"
    );
    assert!(
        outcome.steps[0].detail.contains("gpu-legacy"),
        "{}",
        outcome.steps[0].detail
    );
    let actors: std::collections::BTreeSet<&str> = outcome
        .migration
        .log
        .iter()
        .map(|l| l.actor.as_str())
        .collect();
    assert_eq!(
        actors.into_iter().collect::<Vec<_>>(),
        [
            "alerter",
            "claim-allocator",
            "class-compiler",
            "inventory",
            "node-agent",
            "stack-assigner"
        ],
        "all six services wrote to the log"
    );
}

#[tokio::test]
async fn the_same_seed_gives_a_byte_identical_log() {
    let (a, b) = (run(7).await, run(7).await);
    assert_eq!(encode(&a), encode(&b));
    assert_ne!(
        encode(&a),
        encode(&run(8).await),
        "another seed, another cluster"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn actors_and_in_process_services_write_the_same_log() {
    let config = SimConfig {
        seed: 3,
        ..SimConfig::default()
    };
    let local = run_reference(config.clone(), Local::default(), (), |_| {}).await;
    let actors = Actors::spawn().await.expect("spawn the services");
    let with_actors = run_reference(config, actors, (), |_| {}).await;
    assert!(with_actors.ok(), "{}", describe(&with_actors));
    assert_eq!(encode(&local), encode(&with_actors));
    assert_eq!(local.states, with_actors.states);
    with_actors.migration.services.stop().await;
}

#[tokio::test]
async fn many_seeds_and_sizes_complete() {
    for seed in 0..12 {
        let config = SimConfig {
            seed,
            gpu_nodes: 2 + (seed as usize % 4),
            gpus_per_node: [2, 4, 8][seed as usize % 3],
            workloads: 3 + seed as usize % 6,
            upgraded_with_dra: seed % 2 == 0,
            ..SimConfig::default()
        };
        let outcome = run_reference(config.clone(), Local::default(), (), |_| {}).await;
        assert!(outcome.ok(), "{config:?}\n{}", describe(&outcome));
    }
}

#[tokio::test]
async fn another_card_model_migrates_on_its_own_class() {
    let outcome = run_reference(
        SimConfig {
            card: Card::h100(),
            ..SimConfig::default()
        },
        Local::default(),
        (),
        |_| {},
    )
    .await;
    assert!(outcome.ok(), "{}", describe(&outcome));
    let names: Vec<&str> = outcome.steps.iter().map(|s| s.step.as_str()).collect();
    assert!(
        names.contains(&"step 2: create GPU class h100"),
        "{names:?}"
    );
    let quota = outcome
        .migration
        .sim
        .quota("ml", "gpu-quota")
        .expect("the quota");
    assert!(
        quota.contains_key("requests.gpu.deckhouse.io/h100")
            && !quota.contains_key("requests.nvidia.com/gpu"),
        "{quota:?}"
    );
    let before = switchyard_sim::Simulator::new(outcome.migration.sim.config().clone());
    assert_eq!(
        before.node_labels("gpu-0").unwrap()["nvidia.com/gpu.product"],
        "NVIDIA-H100-80GB-HBM3",
        "the nodes are labelled with the card's product"
    );
}

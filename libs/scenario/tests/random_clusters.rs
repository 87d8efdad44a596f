//! Property test over random clusters (1,000 cases): the whole migration, with its rollbacks,
//! keeps every invariant — one stack per node, the rules, the hold and its
//! alert, replay, and rollback restoring labels, taints, group and manifest
//! exactly.

use proptest::prelude::*;
use switchyard_core::authors::check_author;
use switchyard_runtime::Local;
use switchyard_scenario::run_reference;
use switchyard_sim::{SECOND, SimConfig};

fn config() -> impl Strategy<Value = SimConfig> {
    (
        any::<u64>(),
        2usize..6,
        prop::sample::select(vec![1u32, 2, 4, 8]),
        1usize..10,
        any::<bool>(),
        1usize..3,
        5i64..120,
    )
        .prop_map(
            |(
                seed,
                gpu_nodes,
                gpus_per_node,
                workloads,
                upgraded_with_dra,
                legacy_nodes,
                prep_s,
            )| SimConfig {
                seed,
                gpu_nodes,
                gpus_per_node,
                workloads,
                upgraded_with_dra,
                legacy_nodes,
                prep_delay: prep_s * SECOND,
                ..SimConfig::default()
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1000, ..ProptestConfig::default() })]

    #[test]
    fn every_random_cluster_migrates_and_rolls_back_with_all_invariants(config in config()) {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let outcome = runtime.block_on(run_reference(config.clone(), Local::default(), (), |_| {}));
        for check in &outcome.checks {
            prop_assert!(check.ok, "{:?}: {} failed: {}", config, check.name, check.detail);
        }
        for step in &outcome.steps {
            prop_assert!(step.ok, "{:?}: {} failed: {}", config, step.step, step.detail);
        }
        // Every record is written by a service that may write its kind: the
        // table `log verify` and the services check signers against.
        for record in &outcome.migration.log {
            let kind = record.event.kind.as_ref().expect("every record has a kind");
            let author = check_author(record.actor.as_str(), kind);
            prop_assert!(author.is_ok(), "{:?}: record {} ({}): {:?}", config, record.seq, record.type_name(), author);
        }
    }
}

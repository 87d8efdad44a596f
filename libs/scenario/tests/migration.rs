//! A migration in waves on the simulated cluster, through the services: the
//! claim-allocator runs the plan (wave started, the stack-assigner hands the
//! wave's nodes over, the wave's workloads are moved and verified, next wave),
//! pauses after a wave when asked and resumes, and the circuit breaker stops
//! it when moved pods stay Pending — each wave done only with its exit
//! evidence — all from the log, the same log for the
//! same seed.

use switchyard_core::authors::check_author;
use switchyard_core::command::MigrationAction;
use switchyard_proto::v1::{MigrationStarted, PlannedWave, WorkloadRef, domain_event::Kind};
use switchyard_runtime::Local;
use switchyard_scenario::{Migration, StepFailed};
use switchyard_sim::{SECOND, SimConfig};

const SOURCE: &str = "gpu";
const TARGET: &str = "gpu-dra";

async fn cluster(seed: u64) -> Migration<Local> {
    let config = SimConfig {
        seed,
        gpu_nodes: 4,
        gpus_per_node: 4,
        workloads: 4,
        upgraded_with_dra: false,
        ..SimConfig::default()
    };
    let mut m = Migration::new(config, Local::default(), ()).await;
    m.sim.set_group(TARGET, None);
    m.sim.set_dra_enabled(true);
    m.sim.create_gpu_class("a100");
    m.pump().await;
    m
}

/// Waves of `max_unavailable` source nodes; each workload goes in the first
/// wave after which the handed-over GPUs hold it and every workload before it.
fn plan(m: &Migration<Local>, id: &str, max_unavailable: usize) -> MigrationStarted {
    let nodes = m.sim.nodes_in(SOURCE);
    let mut workloads: Vec<WorkloadRef> = m.sim.workloads();
    let gpus_per_node = 4;
    let mut waves = Vec::new();
    let mut capacity = 0;
    let mut placed = 0;
    for chunk in nodes.chunks(max_unavailable) {
        capacity += chunk.len() as u32 * gpus_per_node;
        let mut wave = PlannedWave {
            nodes: chunk.to_vec(),
            workloads: Vec::new(),
        };
        while let Some(w) = workloads.first() {
            let need = m.sim.workload_gpus(w);
            if placed + need > capacity {
                break;
            }
            placed += need;
            wave.workloads.push(workloads.remove(0));
        }
        waves.push(wave);
    }
    MigrationStarted {
        migration_id: id.into(),
        source_group: SOURCE.into(),
        target_group: TARGET.into(),
        gpu_class: "a100".into(),
        max_unavailable: max_unavailable as u32,
        pause_after_wave: false,
        waves,
        pending_limit_seconds: 600,
    }
}

/// The migration's steps in words; first, every record of the log is
/// checked to be written by a service that may write its kind.
fn kinds_of(m: &Migration<Local>, id: &str) -> Vec<String> {
    for record in &m.log {
        let kind = record.event.kind.as_ref().expect("every record has a kind");
        if let Err(why) = check_author(record.actor.as_str(), kind) {
            panic!("record {} ({}): {why}", record.seq, record.type_name());
        }
    }
    m.log
        .iter()
        .filter_map(|l| match &l.event.kind {
            Some(Kind::WaveStarted(w)) if w.migration_id == id => {
                Some(format!("WaveStarted {} {:?}", w.wave + 1, w.nodes))
            }
            Some(Kind::WaveCompleted(w)) if w.migration_id == id => {
                Some(format!("WaveCompleted {}", w.wave + 1))
            }
            Some(Kind::EvidenceChecked(c)) if c.migration_id == id => Some(format!(
                "EvidenceChecked {}: {} nodes, {} workloads, {} failed",
                c.wave + 1,
                c.nodes,
                c.workloads,
                c.failed
            )),
            Some(Kind::MigrationPaused(p)) if p.migration_id == id => {
                Some(format!("MigrationPaused {}", p.wave + 1))
            }
            Some(Kind::MigrationResumed(p)) if p.migration_id == id => {
                Some(format!("MigrationResumed {}", p.wave + 1))
            }
            Some(Kind::MigrationCompleted(c)) if c.migration_id == id => {
                Some(format!("MigrationCompleted {}", c.waves))
            }
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn the_waves_run_by_themselves_to_the_end() {
    let mut m = cluster(3).await;
    let plan = plan(&m, "mig-1", 2);
    let workloads: usize = plan.waves.iter().map(|w| w.workloads.len()).sum();
    assert_eq!(workloads, 4, "the plan moves every workload: {plan:?}");
    assert_eq!(m.migrate(plan).await, Ok("2 wave(s)".into()));
    assert_eq!(
        kinds_of(&m, "mig-1"),
        [
            "WaveStarted 1 [\"gpu-0\", \"gpu-1\"]",
            // Each wave done only with its evidence, every record passed.
            "EvidenceChecked 1: 2 nodes, 3 workloads, 0 failed",
            "WaveCompleted 1",
            "WaveStarted 2 [\"gpu-2\", \"gpu-3\"]",
            "EvidenceChecked 2: 2 nodes, 1 workloads, 0 failed",
            "WaveCompleted 2",
            "MigrationCompleted 2"
        ]
    );
    // Every node is on the target group, every workload verified there, no pod waits.
    assert!(m.sim.nodes_in(SOURCE).is_empty());
    assert_eq!(m.sim.nodes_in(TARGET).len(), 4);
    let states = m.states().await;
    assert_eq!(states.claims.moves().verified.len(), 4);
    assert_eq!(m.sim.pending_pods(), 0);
    // The handovers and moves are the wave's, by their ids.
    assert!(m.log.iter().any(|l| matches!(&l.event.kind,
        Some(Kind::HandoverCompleted(h)) if h.handover_id == "mig-1/wave-2/gpu-3")));
    // Never more nodes out of service than max_unavailable.
    let mut out = std::collections::BTreeSet::new();
    for l in &m.log {
        match &l.event.kind {
            Some(Kind::HandoverStarted(h)) => {
                out.insert(h.node.clone());
            }
            Some(Kind::HandoverCompleted(h)) => {
                out.remove(&h.node);
            }
            _ => {}
        }
        assert!(out.len() <= 2, "{out:?} handed over at once");
    }
    let checks = m.final_checks().await;
    assert!(checks.iter().all(|c| c.ok), "{checks:?}");
}

#[tokio::test]
async fn the_same_seed_gives_the_same_migration_log() {
    let mut logs = Vec::new();
    for _ in 0..2 {
        let mut m = cluster(7).await;
        let plan = plan(&m, "mig-1", 1);
        m.migrate(plan).await.expect("completes");
        let log: Vec<_> = m.log.iter().map(|l| (l.at, l.event.clone())).collect();
        logs.push(log);
    }
    assert_eq!(logs[0], logs[1]);
}

#[tokio::test]
async fn a_migration_pauses_after_each_wave_when_asked_and_resumes() {
    let mut m = cluster(3).await;
    let mut plan = plan(&m, "mig-1", 2);
    plan.pause_after_wave = true;
    let paused = m.migrate(plan).await.unwrap_err().to_string();
    assert!(
        paused.starts_with("paused in wave 1: wave 1 is done"),
        "{paused}"
    );
    assert_eq!(m.sim.nodes_in(SOURCE).len(), 2, "wave 2 waits");
    assert_eq!(
        m.control_migration("mig-1", MigrationAction::Resume).await,
        Ok("2 wave(s)".into())
    );
    assert!(m.sim.nodes_in(SOURCE).is_empty());
    // A migration that ended takes no more commands.
    assert_eq!(
        m.control_migration("mig-1", MigrationAction::Pause).await,
        Err(StepFailed::Refused("migration mig-1 has ended".into()))
    );
}

#[tokio::test]
async fn the_breaker_stops_a_migration_whose_moved_pods_stay_pending() {
    let mut m = cluster(3).await;
    let mut plan = plan(&m, "mig-1", 1);
    // Every workload in the first wave: one node's cards cannot hold them all.
    let all: Vec<WorkloadRef> = plan
        .waves
        .iter_mut()
        .flat_map(|w| std::mem::take(&mut w.workloads))
        .collect();
    plan.waves[0].workloads = all;
    plan.pending_limit_seconds = 300;
    let outcome = m.migrate(plan).await;
    assert_eq!(
        outcome,
        Err(StepFailed::NotReached(
            "migration mig-1 did not complete".into()
        )),
        "the moves wait; the breaker has not tripped yet"
    );
    m.wait(301 * SECOND).await;
    let paused = m
        .log
        .iter()
        .find_map(|l| match &l.event.kind {
            Some(Kind::MigrationPaused(p)) => Some(p.clone()),
            _ => None,
        })
        .expect("the breaker paused the migration");
    assert!(paused.tripped);
    assert!(
        paused.reason.starts_with(
            "moved pods are not running with their claims 300 s after their move: Deployment ml/"
        ),
        "{}",
        paused.reason
    );
    // Paused: no new wave starts.
    assert!(!m.log.iter().any(|l| matches!(&l.event.kind,
        Some(Kind::WaveStarted(w)) if w.wave == 1)));
}

#[tokio::test]
async fn a_plan_that_breaks_its_own_limits_is_refused() {
    let mut m = cluster(3).await;
    let mut wide = plan(&m, "mig-1", 2);
    wide.max_unavailable = 1;
    assert_eq!(
        m.migrate(wide).await,
        Err(StepFailed::Refused(
            "waves[0]: 2 nodes, more than max_unavailable 1".into()
        ))
    );
    let mut unknown = plan(&m, "mig-2", 2);
    unknown.gpu_class = "h100".into();
    assert_eq!(
        m.migrate(unknown).await,
        Err(StepFailed::Refused(
            "GPU class h100 does not exist (known: a100)".into()
        ))
    );
}

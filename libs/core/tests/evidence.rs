//! Exit evidence: what each check sees on the facts, and a wave done only
//! with its evidence (or stopped by it, naming the failure).

mod support;

use support::*;
use switchyard_core::claim_allocator::evidence::{
    self, CLAIMS_RESERVED, Moved, NO_DUAL_ADVERTISEMENT, PLUGIN_HEALTHY, PODS_ON_TARGET,
    RESTART_AND_CLEANUP, SLICES_MATCH,
};
use switchyard_core::claim_allocator::{ClaimAllocator, Input};
use switchyard_core::command::{
    CheckEvidence, ControlMigration, MigrationAction, wave_handover_id, wave_move_id,
};
use switchyard_proto::v1::{
    AllocatedDevice, ApplicationMoveStarted, ApplicationMoveVerified, DomainEvent, EvidenceItem,
    GpuPhase, HandoverCompleted, MigrationStarted, PhysicalGpuObserved, PlannedWave, PodPhase,
    ResourceClaimObserved, WorkloadRef, domain_event::Kind,
};

const SECOND: i64 = 1_000_000_000;

fn web() -> WorkloadRef {
    WorkloadRef {
        namespace: "apps".into(),
        kind: "Deployment".into(),
        name: "web".into(),
    }
}

fn gpu(node: &str, i: u32) -> DomainEvent {
    ev(Kind::PhysicalGpuObserved(PhysicalGpuObserved {
        name: format!("{node}-gpu-{i}"),
        node: node.into(),
        index: i,
        uuid: format!("GPU-{node}-{i}"),
        product: "NVIDIA A100-SXM4-40GB".into(),
        device: "a100-sxm4-40gb".into(),
        memory_mib: 40_960,
        phase: GpuPhase::Ready as i32,
    }))
}

/// A DRA node of gpu-dra with two cards, its node agent running, published.
fn dra_node(name: &str) -> Vec<DomainEvent> {
    let mut facts = vec![
        NodeSpec {
            labels: &[
                ("node.deckhouse.io/gpu-setup-complete", ""),
                ("node.deckhouse.io/gpu-stack", "dra"),
            ],
            gpus: 2,
            ..NodeSpec::new(name, "gpu-dra")
        }
        .fact(),
        gpu(name, 0),
        gpu(name, 1),
        mk_node_agent_pod(name),
        mk_slice(name, vec![mk_card(name, 0), mk_card(name, 1)]),
    ];
    facts.push(mk_class("a100"));
    facts
}

fn claim(pod: &str, node: &str, reserved: bool) -> DomainEvent {
    ev(Kind::ResourceClaimObserved(ResourceClaimObserved {
        namespace: "apps".into(),
        name: format!("{pod}-gpu-x1"),
        device_classes: vec!["a100-whole".into()],
        node: node.into(),
        allocated: vec![AllocatedDevice {
            request: "gpu".into(),
            driver: "gpu.deckhouse.io".into(),
            pool: node.into(),
            device: "gpu-0".into(),
        }],
        reserved_for: if reserved {
            vec![pod.into()]
        } else {
            Vec::new()
        },
        owner_pod: pod.into(),
    }))
}

/// web moved to d1: its pod running there with its claim reserved.
fn moved_web() -> Vec<DomainEvent> {
    vec![
        mk_workload("apps", "web", 1, mk_placement(&[], &[])),
        mk_app_pod("apps", "web-7c9-a", "web", "d1", PodPhase::Running, (1, 1)),
        claim("web-7c9-a", "d1", true),
    ]
}

fn core_with(facts: &[DomainEvent]) -> ClaimAllocator {
    let mut core = ClaimAllocator::default();
    for fact in facts {
        core.apply(fact, 0);
    }
    core
}

fn failed(items: &[EvidenceItem]) -> Vec<(&str, &str)> {
    items
        .iter()
        .filter(|i| !i.passed)
        .map(|i| (i.check.as_str(), i.detail.as_str()))
        .collect()
}

fn to_gpu_dra(w: WorkloadRef) -> Moved {
    Moved {
        workload: w,
        target_group: "gpu-dra".into(),
        gpu_class: "a100".into(),
    }
}

#[test]
fn a_dra_node_with_matching_slices_shows_its_evidence() {
    let core = core_with(&dra_node("d1"));
    let items = evidence::node_evidence(core.cluster(), "d1");
    let checks: Vec<&str> = items.iter().map(|i| i.check.as_str()).collect();
    assert_eq!(
        checks,
        [NO_DUAL_ADVERTISEMENT, PLUGIN_HEALTHY, SLICES_MATCH]
    );
    assert_eq!(failed(&items), Vec::<(&str, &str)>::new());
    assert_eq!(
        items[2].detail,
        "2 cards published with the PhysicalGPUs' UUIDs (NVIDIA A100-SXM4-40GB, 40960 MiB)"
    );
}

#[test]
fn both_allocators_advertising_a_node_is_a_dual_advertisement() {
    let mut facts = dra_node("d1");
    facts[0] = NodeSpec {
        labels: &[("node.deckhouse.io/gpu-stack", "dra")],
        gpus: 2,
        allocatable: &[("nvidia.com/gpu", 2)],
        ..NodeSpec::new("d1", "gpu-dra")
    }
    .fact();
    let core = core_with(&facts);
    let items = evidence::node_evidence(core.cluster(), "d1");
    let failures = failed(&items);
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(failures[0].0, NO_DUAL_ADVERTISEMENT);
    assert!(
        failures[0]
            .1
            .starts_with("2 device-plugin GPU resources (nvidia.com/gpu, MIG, shared) are allocatable while 2 devices are published"),
        "{}",
        failures[0].1
    );
}

#[test]
fn a_pod_holding_device_plugin_gpus_on_a_dra_node_is_a_dual_advertisement() {
    let mut facts = dra_node("d1");
    let mut holder = mk_app_pod("apps", "old-0", "old", "d1", PodPhase::Running, (0, 0));
    let mut done = mk_app_pod("apps", "old-1", "old", "d1", PodPhase::Succeeded, (0, 0));
    for pod in [&mut holder, &mut done] {
        if let Some(Kind::PodObserved(p)) = &mut pod.kind {
            p.device_plugin_gpus = 1;
        }
    }
    facts.extend([holder, done]);
    let core = core_with(&facts);
    let items = evidence::node_evidence(core.cluster(), "d1");
    let failures = failed(&items);
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(failures[0].0, NO_DUAL_ADVERTISEMENT);
    assert_eq!(
        failures[0].1,
        "pods hold device-plugin GPUs on a node that publishes 2 devices in 1 ResourceSlices: apps/old-0",
        "a finished pod holds nothing"
    );
    // Gone: the node passes.
    let mut core = core;
    core.handle(Input::Fact(&mk_pod_removed("apps", "old-0")), 0);
    assert!(failed(&evidence::node_evidence(core.cluster(), "d1")).is_empty());
}

#[test]
fn a_dra_node_without_slices_fails_and_says_so() {
    let mut facts = dra_node("d1");
    facts.retain(|f| !matches!(f.kind, Some(Kind::ResourceSliceObserved(_))));
    let core = core_with(&facts);
    let items = evidence::node_evidence(core.cluster(), "d1");
    let failures = failed(&items)
        .into_iter()
        .map(|(check, _)| check)
        .collect::<Vec<_>>();
    assert_eq!(failures, [NO_DUAL_ADVERTISEMENT, SLICES_MATCH]);
}

#[test]
fn slices_that_differ_from_the_physical_gpus_name_the_difference() {
    let mut wrong_memory = mk_card("d1", 1);
    wrong_memory.memory_mib = 81_920;
    let mut facts = dra_node("d1");
    // gpu-1 with the wrong memory; gpu-0 published for another node.
    facts.push(mk_slice("d1", vec![wrong_memory]));
    facts.push(mk_slice("d2", vec![mk_card("d1", 0)]));
    let core = core_with(&facts);
    let items = evidence::node_evidence(core.cluster(), "d1");
    let failures = failed(&items);
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(failures[0].0, SLICES_MATCH);
    assert_eq!(
        failures[0].1,
        "PhysicalGPU d1-gpu-0 (GPU-d1-0) is published for node \"d2\" as gpu-0; \
         gpu-1: memory 81920 MiB in the slice, 40960 MiB on PhysicalGPU d1-gpu-1"
    );
}

#[test]
fn a_device_plugin_node_shows_only_that_nothing_else_advertises_it() {
    let core = core_with(&[NodeSpec {
        allocatable: &[("nvidia.com/gpu", 8)],
        gpus: 8,
        labels: &[("node.deckhouse.io/gpu-stack", "device-plugin")],
        ..NodeSpec::new("g1", "gpu")
    }
    .fact()]);
    let items = evidence::node_evidence(core.cluster(), "g1");
    assert_eq!(items.len(), 1);
    assert!(items[0].passed, "{:?}", items[0]);
    assert_eq!(
        items[0].detail,
        "device-plugin stack: 8 device-plugin GPU resources allocatable, no GPU ResourceSlice"
    );
}

#[test]
fn a_moved_workload_shows_its_pods_claims_and_cleanup() {
    let mut facts = dra_node("d1");
    facts.extend(moved_web());
    let core = core_with(&facts);
    let items = evidence::workload_evidence(core.cluster(), &to_gpu_dra(web()));
    let checks: Vec<&str> = items.iter().map(|i| i.check.as_str()).collect();
    assert_eq!(
        checks,
        [PODS_ON_TARGET, CLAIMS_RESERVED, RESTART_AND_CLEANUP]
    );
    assert_eq!(failed(&items), Vec::<(&str, &str)>::new());
    assert_eq!(items[0].detail, "1 pods running in group gpu-dra on d1");
}

#[test]
fn an_unreserved_claim_a_leaked_claim_and_a_pod_elsewhere_each_fail() {
    let mut facts = dra_node("d1");
    facts.extend(moved_web());
    facts.push(claim("web-7c9-a", "d1", false));
    facts.push(claim("web-old-z", "g1", true));
    facts.push(
        NodeSpec {
            gpus: 2,
            ..NodeSpec::new("g1", "gpu")
        }
        .fact(),
    );
    let core = core_with(&facts);
    let failures = failed(&evidence::workload_evidence(
        core.cluster(),
        &to_gpu_dra(web()),
    ))
    .into_iter()
    .map(|(c, d)| format!("{c}: {d}"))
    .collect::<Vec<_>>();
    assert_eq!(
        failures,
        [
            "claims allocated and reserved: pod web-7c9-a: 0 of 1 claims reserved for it",
            "restart and cleanup: claims of deleted pods are left: web-old-z-gpu-x1 (pod web-old-z is gone)",
        ]
    );
    // The pod on the device plugin's group: not placed as asked.
    let mut facts = dra_node("d1");
    facts.extend(moved_web());
    facts.push(
        NodeSpec {
            gpus: 2,
            ..NodeSpec::new("g1", "gpu")
        }
        .fact(),
    );
    facts.push(mk_app_pod(
        "apps",
        "web-7c9-a",
        "web",
        "g1",
        PodPhase::Running,
        (1, 1),
    ));
    let core = core_with(&facts);
    let items = evidence::workload_evidence(core.cluster(), &to_gpu_dra(web()));
    assert_eq!(
        items[0].detail,
        "pod web-7c9-a runs on node g1 in group \"gpu\""
    );
    assert!(!items[0].passed);
}

#[test]
fn no_pods_is_no_evidence() {
    let mut facts = dra_node("d1");
    facts.push(mk_workload("apps", "web", 0, mk_placement(&[], &[])));
    let core = core_with(&facts);
    let items = evidence::workload_evidence(core.cluster(), &to_gpu_dra(web()));
    assert!(items.iter().all(|i| !i.passed), "{items:?}");
}

/// A migration of one wave (d1, then web), handed over and moved.
fn migrating(pending_limit_seconds: u64) -> ClaimAllocator {
    let plan = MigrationStarted {
        migration_id: "mig".into(),
        source_group: "gpu".into(),
        target_group: "gpu-dra".into(),
        gpu_class: "a100".into(),
        max_unavailable: 1,
        pause_after_wave: false,
        waves: vec![PlannedWave {
            nodes: vec!["d1".into()],
            workloads: vec![web()],
        }],
        pending_limit_seconds,
    };
    let mut facts = dra_node("d1");
    facts.retain(|f| !matches!(f.kind, Some(Kind::ResourceSliceObserved(_))));
    facts.extend(moved_web());
    let mut core = core_with(&facts);
    let decided = core.handle(Input::Migrate(&plan), 0);
    assert!(matches!(
        decided.last().and_then(|d| d.kind.as_ref()),
        Some(Kind::WaveStarted(_))
    ));
    for (at, step) in [
        ev(Kind::HandoverCompleted(HandoverCompleted {
            handover_id: wave_handover_id("mig", 0, "d1"),
            node: "d1".into(),
            target_group: "gpu-dra".into(),
        })),
        ev(Kind::ApplicationMoveStarted(ApplicationMoveStarted {
            move_id: wave_move_id("mig", 0, &web()),
            workload: Some(web()),
            source_group: "gpu".into(),
            target_group: "gpu-dra".into(),
            gpu_class: "a100".into(),
        })),
        ev(Kind::ApplicationMoveVerified(ApplicationMoveVerified {
            move_id: wave_move_id("mig", 0, &web()),
            workload: Some(web()),
            pod_nodes: vec!["d1".into()],
            claims_allocated: 1,
        })),
    ]
    .into_iter()
    .enumerate()
    {
        core.apply(&step, at as i64 * SECOND);
    }
    core
}

fn kinds(decisions: &[DomainEvent]) -> Vec<&'static str> {
    decisions
        .iter()
        .map(|d| d.kind.as_ref().unwrap().type_name())
        .collect()
}

#[test]
fn a_wave_waits_for_its_evidence_and_is_done_only_with_it() {
    let mut core = migrating(60);
    // The node publishes no slice yet: the wave waits.
    assert_eq!(
        kinds(&core.handle(Input::Tick, 30 * SECOND)),
        Vec::<&str>::new()
    );
    let decided = core.handle(
        Input::Fact(&mk_slice("d1", vec![mk_card("d1", 0), mk_card("d1", 1)])),
        31 * SECOND,
    );
    assert_eq!(
        kinds(&decided),
        [
            "EvidenceRecorded",
            "EvidenceRecorded",
            "EvidenceChecked",
            "WaveCompleted",
            "MigrationCompleted"
        ]
    );
    let Some(Kind::EvidenceRecorded(node)) = &decided[0].kind else {
        unreachable!()
    };
    assert_eq!(
        (node.check_id.as_str(), node.node.as_str(), node.passed),
        ("mig/wave-1/evidence", "d1", true)
    );
    let Some(Kind::EvidenceRecorded(app)) = &decided[1].kind else {
        unreachable!()
    };
    assert_eq!((app.workload.as_ref(), app.passed), (Some(&web()), true));
}

#[test]
fn failed_evidence_stops_the_migration_past_the_limit_naming_it() {
    let mut core = migrating(60);
    assert!(core.handle(Input::Tick, 62 * SECOND).is_empty());
    let decided = core.handle(Input::Tick, 63 * SECOND);
    assert_eq!(
        kinds(&decided),
        [
            "EvidenceRecorded",
            "EvidenceRecorded",
            "EvidenceChecked",
            "MigrationPaused"
        ]
    );
    let Some(Kind::MigrationPaused(p)) = &decided[3].kind else {
        unreachable!()
    };
    assert!(p.tripped);
    assert_eq!(
        p.reason,
        "the evidence of wave 1 failed 60 s after its last step: node d1: no dual advertisement: \
         the node is on the dra stack but publishes no GPU ResourceSlice (device-plugin resources allocatable: 0)"
    );
    // Fixed and resumed: checked again, done.
    core.apply(&mk_slice("d1", vec![mk_card("d1", 0), mk_card("d1", 1)]), 0);
    let decided = core.handle(
        Input::ControlMigration(&ControlMigration {
            migration_id: "mig".into(),
            action: MigrationAction::Resume,
            reason: String::new(),
        }),
        70 * SECOND,
    );
    assert!(
        kinds(&decided).contains(&"WaveCompleted"),
        "{:?}",
        kinds(&decided)
    );
}

#[test]
fn the_operator_checks_a_wave_or_everything_and_unknown_scopes_are_refused() {
    let mut core = migrating(60);
    let done = core.handle(
        Input::Fact(&mk_slice("d1", vec![mk_card("d1", 0), mk_card("d1", 1)])),
        31 * SECOND,
    );
    assert!(kinds(&done).contains(&"MigrationCompleted"));
    let check = |migration: &str, wave: Option<u32>| CheckEvidence {
        check_id: "ev-1".into(),
        migration_id: migration.into(),
        wave,
        stage: None,
    };
    let decided = core.handle(Input::CheckEvidence(&check("mig", Some(0))), 40 * SECOND);
    assert_eq!(
        kinds(&decided),
        ["EvidenceRecorded", "EvidenceRecorded", "EvidenceChecked"]
    );
    let Some(Kind::EvidenceChecked(c)) = &decided[2].kind else {
        unreachable!()
    };
    assert_eq!(
        (c.check_id.as_str(), c.nodes, c.workloads, c.failed),
        ("ev-1", 1, 1, 0)
    );
    // No migration named: every GPU node and every verified move.
    let decided = core.handle(Input::CheckEvidence(&check("", None)), 41 * SECOND);
    let Some(Kind::EvidenceChecked(c)) = &decided.last().unwrap().kind else {
        unreachable!()
    };
    assert_eq!((c.nodes, c.workloads, c.failed), (1, 1, 0));
    for (cmd, reason) in [
        (check("nope", None), "migration nope does not exist"),
        (
            check("mig", Some(1)),
            "wave 2 of migration mig has not started (1 of 1 waves started)",
        ),
    ] {
        let decided = core.handle(Input::CheckEvidence(&cmd), 42 * SECOND);
        let Some(Kind::MigrationRefused(r)) = &decided[0].kind else {
            panic!("{decided:?}")
        };
        assert_eq!(r.reason, reason);
    }
}

//! Moves of the kinds beyond Deployments: a DaemonSet is bound to the target
//! group and restarted, a CronJob's Job template is edited and verified on its
//! next run (no restart), a Job is refused (its template is immutable), and
//! completion does not wait for a CronJob's Jobs or finished Jobs.

mod support;

use support::*;
use switchyard_core::claim_allocator::completion::Completion;
use switchyard_core::claim_allocator::{ClaimAllocator, Input};
use switchyard_core::command::{Complete, MoveApplication};
use switchyard_core::effects::Effect;
use switchyard_core::rollback::plan_workload_rollback;
use switchyard_proto::v1::{
    DomainEvent, PodPhase, WorkloadObserved, WorkloadPlacement, WorkloadRef, domain_event::Kind,
};

fn names(decisions: &[DomainEvent]) -> Vec<&'static str> {
    decisions
        .iter()
        .map(|d| d.kind.as_ref().unwrap().type_name())
        .collect()
}

fn reference(kind: &str, name: &str) -> WorkloadRef {
    WorkloadRef {
        namespace: "apps".into(),
        kind: kind.into(),
        name: name.into(),
    }
}

fn observed(
    kind: &str,
    name: &str,
    replicas: u32,
    placement: WorkloadPlacement,
    owner: Option<WorkloadRef>,
) -> DomainEvent {
    ev(Kind::WorkloadObserved(WorkloadObserved {
        workload: Some(reference(kind, name)),
        replicas,
        placement: Some(placement),
        managed_by: String::new(),
        owner: owner.map(Box::new),
        restarted_at: String::new(),
    }))
}

/// A pod of `owner` (kind, name) with (allocated, needed) claims.
fn pod(
    name: &str,
    owner: (&str, &str),
    node: &str,
    phase: PodPhase,
    claims: (u32, u32),
) -> DomainEvent {
    let mut pod = mk_pod("apps", name, node, owner, owner.1, phase);
    if let Some(Kind::PodObserved(p)) = &mut pod.kind {
        p.claims_allocated = claims.0;
        p.claims_needed = claims.1;
    }
    pod
}

fn on_gpu() -> WorkloadPlacement {
    mk_placement(
        &[("nvidia.com/gpu", "1")],
        &[("node.deckhouse.io/group", "gpu")],
    )
}

fn cluster(workloads: &[DomainEvent]) -> ClaimAllocator {
    let mut core = ClaimAllocator::default();
    let mut facts = vec![
        mk_group("gpu", true),
        mk_group("gpu-dra", false),
        mk_class("a100"),
    ];
    facts.push(NodeSpec::new("w1", "gpu").fact());
    facts.extend(mk_ready_dra_node("d1", "gpu-dra", 2));
    facts.extend(workloads.iter().cloned());
    for fact in &facts {
        core.handle(Input::Fact(fact), 0);
    }
    core
}

fn move_of(core: &mut ClaimAllocator, workload: WorkloadRef) -> Vec<DomainEvent> {
    let cmd = MoveApplication {
        allow_managed: false,
        move_id: format!("m-{}", workload.name),
        workload,
        target_group: "gpu-dra".into(),
        gpu_class: "a100".into(),
    };
    core.handle(Input::MoveApplication(&cmd), 0)
}

fn rewritten_to(decisions: &[DomainEvent]) -> WorkloadPlacement {
    decisions
        .iter()
        .find_map(|d| match &d.kind {
            Some(Kind::WorkloadRewritten(r)) => r.after.clone(),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no rewrite in {decisions:?}"))
}

#[test]
fn a_daemonset_is_bound_to_the_target_group_restarted_and_verified_on_every_node() {
    let ds = reference("DaemonSet", "exporter");
    let mut core = cluster(&[observed("DaemonSet", "exporter", 1, on_gpu(), None)]);
    let decisions = move_of(&mut core, ds.clone());
    assert_eq!(
        names(&decisions),
        ["ApplicationMoveStarted", "WorkloadRewritten"]
    );
    let after = rewritten_to(&decisions);
    // Not unbound (it would ask for a device on every node): bound to the target.
    assert_eq!(
        after,
        mk_placement(
            &[("gpu.deckhouse.io/a100", "1")],
            &[("node.deckhouse.io/group", "gpu-dra")]
        )
    );
    // Written, and its controller has not seen the new spec yet (0 desired).
    let d = core.handle(
        Input::Fact(&observed("DaemonSet", "exporter", 0, after.clone(), None)),
        0,
    );
    assert_eq!(names(&d), ["WorkloadRestarted"]);
    assert!(
        core.moves()
            .effects(core.cluster())
            .contains(&Effect::RestartWorkload {
                workload: ds.clone(),
                restarted_at: "m-exporter".into()
            })
    );
    // A pod running on the target with its claim is not enough while the
    // desired count is not known.
    let running = with_restart(
        pod(
            "exporter-a",
            ("DaemonSet", "exporter"),
            "d1",
            PodPhase::Running,
            (1, 1),
        ),
        "m-exporter",
    );
    assert!(core.handle(Input::Fact(&running), 0).is_empty());
    // The restart shows, and the controller wants two pods: one is not all
    // of them.
    let restarted = with_restart(
        observed("DaemonSet", "exporter", 2, after.clone(), None),
        "m-exporter",
    );
    assert!(core.handle(Input::Fact(&restarted), 0).is_empty());
    for fact in mk_ready_dra_node("d2", "gpu-dra", 2) {
        core.handle(Input::Fact(&fact), 0);
    }
    // A pod from before the restart does not count.
    let before_restart = pod(
        "exporter-b",
        ("DaemonSet", "exporter"),
        "d2",
        PodPhase::Running,
        (1, 1),
    );
    assert!(core.handle(Input::Fact(&before_restart), 0).is_empty());
    let d = core.handle(Input::Fact(&with_restart(before_restart, "m-exporter")), 0);
    assert_eq!(names(&d), ["ApplicationMoveVerified"]);
    let Some(Kind::ApplicationMoveVerified(v)) = &d[0].kind else {
        unreachable!()
    };
    assert_eq!(v.pod_nodes, ["d1", "d2"]);
}

#[test]
fn a_job_is_refused_and_one_made_by_a_cronjob_names_it() {
    let cron = reference("CronJob", "nightly");
    let mut core = cluster(&[
        observed("Job", "once", 1, on_gpu(), None),
        observed("Job", "nightly-29000000", 1, on_gpu(), Some(cron)),
    ]);
    let refused = |d: &[DomainEvent]| match &d[0].kind {
        Some(Kind::ApplicationMoveRefused(r)) => r.reason.clone(),
        other => panic!("{other:?}"),
    };
    let reason = refused(&move_of(&mut core, reference("Job", "once")));
    assert!(
        reason.contains("spec.template) cannot be changed"),
        "{reason}"
    );
    assert!(reason.contains("--dry-run -o yaml"), "{reason}");
    let reason = refused(&move_of(&mut core, reference("Job", "nightly-29000000")));
    assert!(reason.contains("move the CronJob"), "{reason}");
    assert!(reason.contains("CronJob apps/nightly"), "{reason}");
    assert!(core.moves().effects(core.cluster()).is_empty());
}

#[test]
fn a_cronjob_is_edited_not_restarted_and_verified_on_a_run_from_the_new_template() {
    let cron = reference("CronJob", "nightly");
    let mut core = cluster(&[
        observed("CronJob", "nightly", 0, on_gpu(), None),
        // A run started before the move, still on the device plugin.
        observed("Job", "nightly-1", 1, on_gpu(), Some(cron.clone())),
        pod(
            "nightly-1-x",
            ("Job", "nightly-1"),
            "w1",
            PodPhase::Running,
            (0, 0),
        ),
    ]);
    let decisions = move_of(&mut core, cron.clone());
    let after = rewritten_to(&decisions);
    assert_eq!(
        after,
        mk_placement(&[("gpu.deckhouse.io/a100", "1")], &[]),
        "unbound from the source group like a Deployment"
    );
    // The template is written: no restart, and the old run holds the move.
    let d = core.handle(
        Input::Fact(&observed("CronJob", "nightly", 0, after.clone(), None)),
        0,
    );
    assert!(d.is_empty(), "{d:?}");
    assert!(
        core.moves()
            .effects(core.cluster())
            .iter()
            .all(|e| !matches!(e, Effect::RestartWorkload { .. }))
    );
    // The old run ends; the next run's pod waits for its claim: not yet.
    core.handle(
        Input::Fact(&pod(
            "nightly-1-x",
            ("Job", "nightly-1"),
            "w1",
            PodPhase::Succeeded,
            (0, 0),
        )),
        0,
    );
    core.handle(
        Input::Fact(&observed(
            "Job",
            "nightly-2",
            1,
            after.clone(),
            Some(cron.clone()),
        )),
        0,
    );
    assert!(
        core.handle(
            Input::Fact(&pod(
                "nightly-2-y",
                ("Job", "nightly-2"),
                "",
                PodPhase::Pending,
                (0, 0)
            )),
            0
        )
        .is_empty()
    );
    // A pod of another CronJob's Job does not count for this one.
    core.handle(
        Input::Fact(&observed(
            "Job",
            "other-1",
            1,
            after.clone(),
            Some(reference("CronJob", "other")),
        )),
        0,
    );
    assert!(
        core.handle(
            Input::Fact(&pod(
                "other-1-z",
                ("Job", "other-1"),
                "d1",
                PodPhase::Running,
                (1, 1)
            )),
            0
        )
        .is_empty()
    );
    // Running on the target group with its claim: verified.
    let d = core.handle(
        Input::Fact(&pod(
            "nightly-2-y",
            ("Job", "nightly-2"),
            "d1",
            PodPhase::Running,
            (1, 1),
        )),
        0,
    );
    assert_eq!(names(&d), ["ApplicationMoveVerified"]);
    let Some(Kind::ApplicationMoveVerified(v)) = &d[0].kind else {
        unreachable!()
    };
    assert_eq!(
        (v.pod_nodes.clone(), v.claims_allocated),
        (vec!["d1".to_string()], 1)
    );
    assert!(core.moves().effects(core.cluster()).is_empty());
}

#[test]
fn a_cronjob_rollback_restores_the_template_without_a_restart() {
    let cron = reference("CronJob", "nightly");
    let mut core = cluster(&[observed("CronJob", "nightly", 0, on_gpu(), None)]);
    let mut log: Vec<(u64, DomainEvent)> = Vec::new();
    let push = |log: &mut Vec<(u64, DomainEvent)>, events: Vec<DomainEvent>| {
        for e in events {
            let seq = log.len() as u64 + 1;
            log.push((seq, e));
        }
    };
    let decisions = move_of(&mut core, cron.clone());
    let after = rewritten_to(&decisions);
    push(&mut log, decisions);
    core.handle(
        Input::Fact(&observed("CronJob", "nightly", 0, after.clone(), None)),
        0,
    );
    core.handle(
        Input::Fact(&observed("Job", "nightly-2", 1, after, Some(cron.clone()))),
        0,
    );
    let d = core.handle(
        Input::Fact(&pod(
            "nightly-2-y",
            ("Job", "nightly-2"),
            "d1",
            PodPhase::Running,
            (1, 1),
        )),
        0,
    );
    assert_eq!(names(&d), ["ApplicationMoveVerified"]);
    push(&mut log, d);
    let planned = plan_workload_rollback(&log, &cron, "rb-nightly").expect("plan");
    assert_eq!(
        names(&core.handle(Input::Rollback(&planned), 0)),
        ["RollbackStarted"]
    );
    assert_eq!(
        core.moves().effects(core.cluster()),
        [Effect::SetPlacement {
            workload: cron.clone(),
            placement: on_gpu()
        }]
    );
    let d = core.handle(
        Input::Fact(&observed("CronJob", "nightly", 0, on_gpu(), None)),
        0,
    );
    assert_eq!(names(&d), ["StepCompensated", "RollbackCompleted"]);
    assert!(core.moves().effects(core.cluster()).is_empty());
}

#[test]
fn completion_does_not_wait_for_a_cronjobs_jobs_or_finished_jobs() {
    let cron = reference("CronJob", "nightly");
    let moved = mk_placement(&[("gpu.deckhouse.io/a100", "1")], &[]);
    let mut core = ClaimAllocator::default();
    for fact in [
        mk_group("gpu", true),
        mk_group("gpu-dra", false),
        mk_class("a100"),
        observed("CronJob", "nightly", 0, moved, None),
        observed("Job", "nightly-1", 0, on_gpu(), Some(cron)),
        observed("Job", "done", 0, on_gpu(), None),
        observed("Job", "running", 1, on_gpu(), None),
    ] {
        core.handle(Input::Fact(&fact), 0);
    }
    let cmd = Complete {
        source_group: "gpu".into(),
        gpu_class: "a100".into(),
        trial_period_over: false,
    };
    let d = Completion::default().complete(core.cluster(), &cmd);
    let Some(Kind::CompletionRefused(r)) = &d[0].kind else {
        panic!("{d:?}")
    };
    assert!(
        r.reason
            .ends_with("1 still request nvidia.com/gpu: Job apps/running"),
        "{}",
        r.reason
    );
    // The running Job is gone (its history removed): nothing waits.
    core.handle(
        Input::Fact(&ev(Kind::WorkloadRemoved(
            switchyard_proto::v1::WorkloadRemoved {
                workload: Some(reference("Job", "running")),
            },
        ))),
        0,
    );
    let d = Completion::default().complete(core.cluster(), &cmd);
    assert_eq!(names(&d), ["CompletionRefused"]);
    let Some(Kind::CompletionRefused(r)) = &d[0].kind else {
        unreachable!()
    };
    assert!(
        r.reason.contains("keeps its spec.gpu"),
        "only the trial holds it: {}",
        r.reason
    );
}

//! Application moves: the manifest rewrite, the refusals of the reference, and
//! the verification of Step 5.

mod support;

use support::*;
use switchyard_core::claim_allocator::{ClaimAllocator, Input};
use switchyard_core::command::MoveApplication;
use switchyard_core::effects::Effect;
use switchyard_core::placement::rewrite;
use switchyard_proto::v1::{
    DomainEvent, PodPhase, WorkloadPlacement, WorkloadRef, domain_event::Kind,
};

fn web() -> WorkloadRef {
    WorkloadRef {
        namespace: "apps".into(),
        kind: "Deployment".into(),
        name: "web".into(),
    }
}

fn names(decisions: &[DomainEvent]) -> Vec<&'static str> {
    decisions
        .iter()
        .map(|d| d.kind.as_ref().unwrap().type_name())
        .collect()
}

fn before() -> switchyard_proto::v1::WorkloadPlacement {
    mk_placement(
        &[("nvidia.com/gpu", "1"), ("cpu", "2")],
        &[("node.deckhouse.io/group", "gpu"), ("disk", "ssd")],
    )
}

fn cluster(with_ready_target: bool) -> ClaimAllocator {
    let mut core = ClaimAllocator::default();
    let mut facts = vec![
        mk_group("gpu", true),
        mk_group("gpu-dra", false),
        mk_class("a100"),
        mk_workload("apps", "web", 1, before()),
    ];
    if with_ready_target {
        facts.extend(mk_ready_dra_node("d1", "gpu-dra", 2));
    }
    for fact in &facts {
        core.handle(Input::Fact(fact), 0);
    }
    core
}

fn move_web(core: &mut ClaimAllocator, class: &str) -> Vec<DomainEvent> {
    let cmd = MoveApplication {
        allow_managed: false,
        move_id: "m-web".into(),
        workload: web(),
        target_group: "gpu-dra".into(),
        gpu_class: class.into(),
    };
    core.handle(Input::MoveApplication(&cmd), 0)
}

#[test]
fn the_rewrite_changes_the_gpu_request_and_the_group_binding_only() {
    let after = rewrite(&before(), "node.deckhouse.io/group", "gpu", "a100", None);
    assert_eq!(
        after,
        mk_placement(
            &[("gpu.deckhouse.io/a100", "1"), ("cpu", "2")],
            &[("disk", "ssd")]
        )
    );
    // A selector for another group is not the binding to the source group: kept.
    let other = mk_placement(
        &[("nvidia.com/gpu", "2")],
        &[("node.deckhouse.io/group", "elsewhere")],
    );
    assert_eq!(
        rewrite(&other, "node.deckhouse.io/group", "gpu", "a100", None).node_selector["node.deckhouse.io/group"],
        "elsewhere"
    );
}

#[test]
fn an_application_is_moved_restarted_and_verified() {
    let mut core = cluster(true);
    let decisions = move_web(&mut core, "a100");
    assert_eq!(
        names(&decisions),
        ["ApplicationMoveStarted", "WorkloadRewritten"]
    );
    let Some(Kind::WorkloadRewritten(rw)) = &decisions[1].kind else {
        unreachable!()
    };
    assert_eq!(
        rw.before.as_ref(),
        Some(&before()),
        "the before-image is the manifest as it was"
    );
    let after = rw.after.clone().unwrap();
    assert_eq!(
        core.moves().effects(core.cluster()),
        [Effect::SetPlacement {
            workload: web(),
            placement: after.clone()
        }]
    );

    // The edge wrote the manifest: restart it.
    let decisions = core.handle(
        Input::Fact(&mk_workload("apps", "web", 1, after.clone())),
        0,
    );
    assert_eq!(names(&decisions), ["WorkloadRestarted"]);
    assert!(
        core.moves()
            .effects(core.cluster())
            .contains(&Effect::RestartWorkload {
                workload: web(),
                restarted_at: "m-web".into()
            })
    );
    // What the cluster shows is not written again: the rewritten template is
    // seen, and once the restart shows in it, nothing is wanted.
    assert!(
        !core
            .moves()
            .effects(core.cluster())
            .iter()
            .any(|e| matches!(e, Effect::SetPlacement { .. }))
    );
    let restarted = |placement: &WorkloadPlacement| {
        with_restart(mk_workload("apps", "web", 1, placement.clone()), "m-web")
    };
    assert!(core.handle(Input::Fact(&restarted(&after)), 0).is_empty());
    assert_eq!(core.moves().effects(core.cluster()), []);
    // Something undoes the rewrite mid-move: it is wanted again.
    assert!(
        core.handle(Input::Fact(&restarted(&before())), 0)
            .is_empty()
    );
    assert_eq!(
        core.moves().effects(core.cluster()),
        [Effect::SetPlacement {
            workload: web(),
            placement: after.clone()
        }]
    );
    assert!(core.handle(Input::Fact(&restarted(&after)), 0).is_empty());

    // Old pod on the source node, then a new one Pending: not verified.
    assert!(
        core.handle(
            Input::Fact(&mk_app_pod(
                "apps",
                "web-old",
                "web",
                "w1",
                PodPhase::Running,
                (0, 0)
            )),
            0
        )
        .is_empty()
    );
    core.handle(Input::Fact(&mk_pod_removed("apps", "web-old")), 0);
    assert!(
        core.handle(
            Input::Fact(&mk_app_pod(
                "apps",
                "web-new",
                "web",
                "",
                PodPhase::Pending,
                (0, 1)
            )),
            0
        )
        .is_empty()
    );
    // Running on the DRA node with its claim allocated, but made before
    // the restart (the rewrite's rollout): its controller is about to
    // replace it, so it does not count.
    assert!(
        core.handle(
            Input::Fact(&mk_app_pod(
                "apps",
                "web-new",
                "web",
                "d1",
                PodPhase::Running,
                (1, 1)
            )),
            0
        )
        .is_empty()
    );
    core.handle(Input::Fact(&mk_pod_removed("apps", "web-new")), 0);
    // The restart's pod, running on the DRA node with its claim: verified.
    let decisions = core.handle(
        Input::Fact(&with_restart(
            mk_app_pod("apps", "web-rst", "web", "d1", PodPhase::Running, (1, 1)),
            "m-web",
        )),
        0,
    );
    assert_eq!(names(&decisions), ["ApplicationMoveVerified"]);
    let Some(Kind::ApplicationMoveVerified(v)) = &decisions[0].kind else {
        unreachable!()
    };
    assert_eq!(
        (v.pod_nodes.clone(), v.claims_allocated),
        (vec!["d1".to_string()], 1)
    );
    assert!(core.moves().effects(core.cluster()).is_empty());
}

#[test]
fn moving_before_a_target_node_is_ready_is_refused() {
    let mut core = cluster(false);
    let decisions = move_web(&mut core, "a100");
    let Some(Kind::ApplicationMoveRefused(r)) = &decisions[0].kind else {
        panic!("{decisions:?}")
    };
    assert!(
        r.reason
            .contains("hand over a node before moving the application"),
        "{}",
        r.reason
    );
    // A cordoned node is not ready for workloads either.
    for fact in mk_ready_dra_node("d1", "gpu-dra", 2) {
        core.handle(Input::Fact(&fact), 0);
    }
    let labels = [
        ("node.deckhouse.io/gpu-setup-complete", ""),
        ("node.deckhouse.io/gpu-stack", "dra"),
    ];
    core.handle(
        Input::Fact(
            &NodeSpec {
                labels: &labels,
                unschedulable: true,
                ..NodeSpec::new("d1", "gpu-dra")
            }
            .fact(),
        ),
        0,
    );
    assert_eq!(
        names(&move_web(&mut core, "a100")),
        ["ApplicationMoveRefused"]
    );
}

#[test]
fn a_wrong_class_name_is_refused_with_the_known_classes() {
    // Common mistakes: "No ResourceClaim was created — the class name is wrong".
    let mut core = cluster(true);
    let decisions = move_web(&mut core, "a10O");
    let Some(Kind::ApplicationMoveRefused(r)) = &decisions[0].kind else {
        panic!("{decisions:?}")
    };
    assert!(
        r.reason.contains("a10O")
            && r.reason.contains("known: a100")
            && r.reason.contains("gpuclass"),
        "{}",
        r.reason
    );
}

#[test]
fn unknown_workloads_and_workloads_without_gpus_are_refused() {
    let mut core = cluster(true);
    let cmd = MoveApplication {
        allow_managed: false,
        move_id: "m".into(),
        workload: WorkloadRef {
            name: "ghost".into(),
            ..web()
        },
        target_group: "gpu-dra".into(),
        gpu_class: "a100".into(),
    };
    assert_eq!(
        names(&core.handle(Input::MoveApplication(&cmd), 0)),
        ["ApplicationMoveRefused"]
    );
    core.handle(
        Input::Fact(&mk_workload(
            "apps",
            "cpu-only",
            1,
            mk_placement(&[("cpu", "1")], &[]),
        )),
        0,
    );
    let cmd = MoveApplication {
        workload: WorkloadRef {
            name: "cpu-only".into(),
            ..web()
        },
        ..cmd
    };
    let decisions = core.handle(Input::MoveApplication(&cmd), 0);
    let Some(Kind::ApplicationMoveRefused(r)) = &decisions[0].kind else {
        panic!()
    };
    assert!(r.reason.contains("nothing to move"), "{}", r.reason);
}

fn move_web_to(core: &mut ClaimAllocator, target_group: &str) -> Vec<DomainEvent> {
    let cmd = MoveApplication {
        allow_managed: false,
        move_id: "m-web".into(),
        workload: web(),
        target_group: target_group.into(),
        gpu_class: "a100".into(),
    };
    core.handle(Input::MoveApplication(&cmd), 0)
}

#[test]
fn without_a_target_group_the_one_group_with_ready_nodes_is_taken() {
    let mut core = cluster(true);
    let decisions = move_web_to(&mut core, "");
    let Some(Kind::ApplicationMoveStarted(started)) = &decisions[0].kind else {
        panic!("{decisions:?}")
    };
    assert_eq!(started.target_group, "gpu-dra");
    assert_eq!(started.source_group, "gpu");
}

#[test]
fn without_a_target_group_none_or_several_candidates_are_refused() {
    let mut core = cluster(false);
    let decisions = move_web_to(&mut core, "");
    let Some(Kind::ApplicationMoveRefused(r)) = &decisions[0].kind else {
        panic!("{decisions:?}")
    };
    assert!(
        r.reason
            .contains("hand over a node before moving the application"),
        "{}",
        r.reason
    );

    let mut core = cluster(true);
    for fact in
        std::iter::once(mk_group("gpu-dra-2", false)).chain(mk_ready_dra_node("d2", "gpu-dra-2", 2))
    {
        core.handle(Input::Fact(&fact), 0);
    }
    let decisions = move_web_to(&mut core, "");
    let Some(Kind::ApplicationMoveRefused(r)) = &decisions[0].kind else {
        panic!("{decisions:?}")
    };
    assert_eq!(
        r.reason,
        "groups gpu-dra, gpu-dra-2 all have ready nodes: name the target group"
    );
    // Named, the move goes.
    assert_eq!(
        names(&move_web_to(&mut core, "gpu-dra-2")),
        ["ApplicationMoveStarted", "WorkloadRewritten"]
    );
}

#[test]
fn a_managed_manifest_is_not_edited_in_place_unless_asked() {
    let mut core = cluster(true);
    let Some(Kind::WorkloadObserved(mut fact)) = mk_workload("apps", "web", 1, before()).kind
    else {
        unreachable!()
    };
    fact.managed_by = "Helm release apps/web".into();
    core.handle(
        Input::Fact(&DomainEvent {
            kind: Some(Kind::WorkloadObserved(fact)),
        }),
        0,
    );
    let decisions = move_web(&mut core, "a100");
    let Some(Kind::ApplicationMoveRefused(r)) = &decisions[0].kind else {
        panic!("{decisions:?}")
    };
    assert!(
        r.reason.starts_with(
            "Deployment apps/web is managed by Helm release apps/web, which would undo an edit made here"
        ),
        "{}",
        r.reason
    );
    let cmd = MoveApplication {
        allow_managed: true,
        move_id: "m-web".into(),
        workload: web(),
        target_group: "gpu-dra".into(),
        gpu_class: "a100".into(),
    };
    assert_eq!(
        names(&core.handle(Input::MoveApplication(&cmd), 0)),
        ["ApplicationMoveStarted", "WorkloadRewritten"]
    );
}

//! Rollback, at both levels: planned from a log prefix, carried out by the
//! cores, restoring labels, taints, group and manifest exactly.

mod support;

use prost::Message;
use support::*;
use switchyard_core::claim_allocator::{self, ClaimAllocator};
use switchyard_core::command::MoveApplication;
use switchyard_core::command::StartHandover;
use switchyard_core::effects::Effect;
use switchyard_core::names::{GPU_SETUP_COMPLETE_LABEL, GPU_STACK_LABEL};
use switchyard_core::rollback::{plan_node_rollback, plan_workload_rollback};
use switchyard_core::stack_assigner::{Input, StackAssigner};
use switchyard_proto::v1::{DomainEvent, PodPhase, Taint, WorkloadRef, domain_event::Kind};

/// Records every input and decision with a sequence, as the log would.
#[derive(Default)]
struct Log {
    events: Vec<(u64, DomainEvent)>,
}

impl Log {
    fn push(&mut self, events: impl IntoIterator<Item = DomainEvent>) -> Vec<DomainEvent> {
        let mut pushed = Vec::new();
        for event in events {
            let seq = self.events.len() as u64 + 1;
            self.events.push((seq, event.clone()));
            pushed.push(event);
        }
        pushed
    }

    fn seq_of(&self, name: &str) -> Vec<u64> {
        self.events
            .iter()
            .filter(|(_, e)| e.kind.as_ref().unwrap().type_name() == name)
            .map(|(s, _)| *s)
            .collect()
    }
}

fn names(decisions: &[DomainEvent]) -> Vec<&'static str> {
    decisions
        .iter()
        .map(|d| d.kind.as_ref().unwrap().type_name())
        .collect()
}

fn taint() -> Taint {
    Taint {
        key: "dedicated".into(),
        value: "gpu".into(),
        effect: "NoSchedule".into(),
    }
}

const ORIGINAL: &[(&str, &str)] = &[
    ("node-role.kubernetes.io/gpu", ""),
    ("nvidia.com/gpu.product", "A100"),
    (GPU_SETUP_COMPLETE_LABEL, ""),
    (GPU_STACK_LABEL, "device-plugin"),
];

fn fact(core: &mut StackAssigner, log: &mut Log, fact: DomainEvent) -> Vec<DomainEvent> {
    log.push([fact.clone()]);
    let decisions = core.handle_fact(&fact, 0);
    log.push(decisions)
}

/// Hands w1 over from `gpu` to `gpu-dra` and returns the log so far.
fn handed_over() -> (StackAssigner, Log) {
    let mut core = StackAssigner::default();
    let mut log = Log::default();
    for f in [
        mk_settings(true, true, ""),
        mk_group("gpu", true),
        mk_group("gpu-dra", false),
    ] {
        fact(&mut core, &mut log, f);
    }
    let w1 = |group, labels, unschedulable| {
        NodeSpec {
            labels,
            taints: vec![taint()],
            unschedulable,
            ..NodeSpec::new("w1", group)
        }
        .fact()
    };
    fact(&mut core, &mut log, w1("gpu", ORIGINAL, false));
    let cmd = StartHandover {
        handover_id: "h1".into(),
        node: "w1".into(),
        target_group: "gpu-dra".into(),
        force: false,
    };
    let d = core.handle(Input::StartHandover(&cmd), 0);
    log.push(d);
    let cordoned_dp = [
        ("node-role.kubernetes.io/gpu", ""),
        ("nvidia.com/gpu.product", "A100"),
        (GPU_SETUP_COMPLETE_LABEL, ""),
        (GPU_STACK_LABEL, "device-plugin"),
    ];
    fact(&mut core, &mut log, w1("gpu", &cordoned_dp, true));
    let dra = [
        ("nvidia.com/gpu.product", "A100"),
        (GPU_SETUP_COMPLETE_LABEL, ""),
        (GPU_STACK_LABEL, "dra"),
    ];
    fact(&mut core, &mut log, w1("gpu-dra", &dra, true));
    // Node preparation starts over for DRA (the old label goes) and writes it again.
    let preparing = [("nvidia.com/gpu.product", "A100"), (GPU_STACK_LABEL, "dra")];
    fact(&mut core, &mut log, w1("gpu-dra", &preparing, true));
    fact(&mut core, &mut log, w1("gpu-dra", &dra, true));
    for f in mk_ready_dra_node("w1", "gpu-dra", 2).into_iter().skip(1) {
        fact(&mut core, &mut log, f);
    }
    let d = fact(&mut core, &mut log, w1("gpu-dra", &dra, false));
    assert_eq!(names(&d), ["NodeUncordoned", "HandoverCompleted"]);
    (core, log)
}

#[test]
fn a_node_rollback_is_a_handover_back_that_restores_the_before_image() {
    let (mut core, mut log) = handed_over();
    let planned = plan_node_rollback(&log.events, "w1", "rb-1").expect("plan");
    assert_eq!(
        planned.encode_to_vec(),
        plan_node_rollback(&log.events, "w1", "rb-1")
            .unwrap()
            .encode_to_vec(),
        "a pure function of the log prefix"
    );
    let Some(Kind::RollbackStarted(r)) = &planned.kind else {
        unreachable!()
    };
    let expected_plan: Vec<u64> = ["NodeUncordoned", "NodeGroupChanged", "NodeCordoned"]
        .iter()
        .map(|n| log.seq_of(n)[0])
        .collect();
    assert_eq!(
        r.plan, expected_plan,
        "forward steps undone in reverse order"
    );
    assert_eq!(r.through_sequence, log.events.len() as u64);
    let back = r.node_restore.as_ref().unwrap();
    assert_eq!(
        (back.source_group.as_str(), back.target_group.as_str()),
        ("gpu-dra", "gpu")
    );

    log.push([planned.clone()]);
    let d = core.handle(Input::Rollback(&planned), 100);
    assert_eq!(names(&d), ["RollbackStarted"]);
    assert_eq!(
        core.handovers().effects(&core.cluster().backend),
        [Effect::Cordon { node: "w1".into() }]
    );

    let dra = [
        ("nvidia.com/gpu.product", "A100"),
        (GPU_SETUP_COMPLETE_LABEL, ""),
        (GPU_STACK_LABEL, "dra"),
    ];
    let w1 = |group, labels, taints: Vec<Taint>, unschedulable| {
        NodeSpec {
            labels,
            taints,
            unschedulable,
            ..NodeSpec::new("w1", group)
        }
        .fact()
    };
    // Cordon and drain (the node is empty): the cordon compensates the forward uncordon.
    let d = fact(
        &mut core,
        &mut log,
        w1("gpu-dra", &dra, vec![taint()], true),
    );
    assert_eq!(names(&d), ["StepCompensated", "NodeDrained"]);
    let Some(Kind::StepCompensated(step)) = &d[0].kind else {
        unreachable!()
    };
    assert_eq!(step.compensated_sequence, expected_plan[0]);
    assert_eq!(
        step.compensation
            .as_ref()
            .unwrap()
            .kind
            .as_ref()
            .unwrap()
            .type_name(),
        "NodeCordoned"
    );

    // The restore effect carries exactly the before-image.
    let original = back.labels_before.clone();
    assert_eq!(original["node.deckhouse.io/group"], "gpu");
    assert_eq!(
        core.handovers().effects(&core.cluster().backend),
        [Effect::RestoreNode {
            node: "w1".into(),
            labels: original.clone(),
            taints: vec![taint()]
        }]
    );
    // Not restored while anything differs: a label left over, or a taint missing.
    let leftover = [
        ("node-role.kubernetes.io/gpu", ""),
        ("nvidia.com/gpu.product", "A100"),
        ("leftover", "x"),
    ];
    let not_restored = |d: Vec<DomainEvent>| !names(&d).contains(&"StepCompensated");
    assert!(not_restored(fact(
        &mut core,
        &mut log,
        w1("gpu", &leftover, vec![taint()], true)
    )));
    assert!(not_restored(fact(
        &mut core,
        &mut log,
        w1("gpu", &ORIGINAL[..2], vec![], true)
    )));
    // Restored (the preparation labels still say DRA: node preparation owns them).
    let restored = [
        ("node-role.kubernetes.io/gpu", ""),
        ("nvidia.com/gpu.product", "A100"),
        (GPU_SETUP_COMPLETE_LABEL, ""),
        (GPU_STACK_LABEL, "dra"),
    ];
    let d = fact(
        &mut core,
        &mut log,
        w1("gpu", &restored, vec![taint()], true),
    );
    assert_eq!(
        names(&d),
        ["StepCompensated"],
        "(the stack moved back with the group label)"
    );
    assert_eq!(
        core.stack_of("w1"),
        Some(switchyard_proto::v1::Stack::DevicePlugin)
    );
    let Some(Kind::StepCompensated(step)) = &d[0].kind else {
        unreachable!()
    };
    let Some(Kind::NodeGroupChanged(changed)) = step.compensation.as_ref().unwrap().kind.as_ref()
    else {
        unreachable!()
    };
    assert_eq!(
        (changed.from_group.as_str(), changed.to_group.as_str()),
        ("gpu-dra", "gpu")
    );
    assert_eq!(
        changed.labels_before["node.deckhouse.io/group"], "gpu-dra",
        "before: as the forward handover left it"
    );

    // Verification on the device plugin: preparation starts over (the label
    // left from DRA goes), writes it again, and nvidia.com/gpu is allocatable
    // again; then uncordon: the node is exactly as before.
    let on_device_plugin = |labels, allocatable, unschedulable| {
        NodeSpec {
            labels,
            taints: vec![taint()],
            unschedulable,
            allocatable,
            ..NodeSpec::new("w1", "gpu")
        }
        .fact()
    };
    assert!(
        fact(
            &mut core,
            &mut log,
            on_device_plugin(&ORIGINAL[..2], &[], true)
        )
        .is_empty()
    );
    assert!(
        fact(&mut core, &mut log, on_device_plugin(ORIGINAL, &[], true)).is_empty(),
        "not before nvidia.com/gpu is allocatable"
    );
    let d = fact(
        &mut core,
        &mut log,
        on_device_plugin(ORIGINAL, &[("nvidia.com/gpu", 2)], true),
    );
    assert_eq!(names(&d), ["NodeReadinessObserved"]);
    let d = fact(
        &mut core,
        &mut log,
        on_device_plugin(ORIGINAL, &[("nvidia.com/gpu", 2)], false),
    );
    assert_eq!(
        names(&d),
        ["StepCompensated", "HandoverCompleted", "RollbackCompleted"]
    );
    let node = &core.cluster().nodes["w1"];
    assert_eq!(
        node.labels.to_map(),
        original,
        "labels byte-identical to the before-image"
    );
    assert_eq!(node.taints, vec![taint()]);
    assert!(core.handovers().active.is_empty());

    // And the rollback itself can be rolled back: the node goes to DRA again.
    let again = plan_node_rollback(&log.events, "w1", "rb-2").expect("plan");
    let Some(Kind::RollbackStarted(r2)) = &again.kind else {
        unreachable!()
    };
    assert_eq!(r2.node_restore.as_ref().unwrap().target_group, "gpu-dra");
}

#[test]
fn node_rollbacks_need_a_completed_handover() {
    let mut core = StackAssigner::default();
    let mut log = Log::default();
    for f in [
        mk_settings(true, true, ""),
        mk_group("gpu", true),
        mk_group("gpu-dra", false),
        mk_node("w1", Some("gpu")),
    ] {
        fact(&mut core, &mut log, f);
    }
    assert!(
        plan_node_rollback(&log.events, "w1", "rb")
            .unwrap_err()
            .to_string()
            .contains("has not been handed over")
    );
    let cmd = StartHandover {
        handover_id: "h1".into(),
        node: "w1".into(),
        target_group: "gpu-dra".into(),
        force: false,
    };
    let d = core.handle(Input::StartHandover(&cmd), 0);
    log.push(d);
    let err = plan_node_rollback(&log.events, "w1", "rb")
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("h1") && err.contains("has not completed"),
        "{err}"
    );
}

fn web() -> WorkloadRef {
    WorkloadRef {
        namespace: "apps".into(),
        kind: "Deployment".into(),
        name: "web".into(),
    }
}

#[test]
fn an_application_rollback_restores_the_manifest_and_restarts() {
    let original = mk_placement(
        &[("nvidia.com/gpu", "1")],
        &[("node.deckhouse.io/group", "gpu")],
    );
    let mut core = ClaimAllocator::default();
    let mut log = Log::default();
    let feed = |core: &mut ClaimAllocator, log: &mut Log, f: DomainEvent| {
        log.push([f.clone()]);
        let d = core.handle(claim_allocator::Input::Fact(&f), 0);
        log.push(d)
    };
    for f in [
        mk_group("gpu", true),
        mk_group("gpu-dra", false),
        mk_class("a100"),
        mk_workload("apps", "web", 1, original.clone()),
    ] {
        feed(&mut core, &mut log, f);
    }
    feed(&mut core, &mut log, NodeSpec::new("w1", "gpu").fact());
    for f in mk_ready_dra_node("d1", "gpu-dra", 1) {
        feed(&mut core, &mut log, f);
    }
    let cmd = MoveApplication {
        allow_managed: false,
        move_id: "m1".into(),
        workload: web(),
        target_group: "gpu-dra".into(),
        gpu_class: "a100".into(),
    };
    let d = core.handle(claim_allocator::Input::MoveApplication(&cmd), 0);
    log.push(d);
    let moved = switchyard_core::placement::rewrite(
        &original,
        "node.deckhouse.io/group",
        "gpu",
        "a100",
        None,
    );
    feed(
        &mut core,
        &mut log,
        mk_workload("apps", "web", 1, moved.clone()),
    );
    // The restart shows in the template.
    feed(
        &mut core,
        &mut log,
        with_restart(mk_workload("apps", "web", 1, moved.clone()), "m1"),
    );
    let d = feed(
        &mut core,
        &mut log,
        with_restart(
            mk_app_pod("apps", "web-1", "web", "d1", PodPhase::Running, (1, 1)),
            "m1",
        ),
    );
    assert_eq!(names(&d), ["ApplicationMoveVerified"]);

    let planned = plan_workload_rollback(&log.events, &web(), "rb-web").expect("plan");
    let Some(Kind::RollbackStarted(r)) = &planned.kind else {
        unreachable!()
    };
    assert_eq!(r.plan, log.seq_of("WorkloadRewritten"));
    assert_eq!(
        r.workload_restore.as_ref().unwrap().after.as_ref(),
        Some(&original)
    );
    log.push([planned.clone()]);
    assert_eq!(
        names(&core.handle(claim_allocator::Input::Rollback(&planned), 0)),
        ["RollbackStarted"]
    );
    assert_eq!(
        core.moves().effects(core.cluster()),
        [Effect::SetPlacement {
            workload: web(),
            placement: original.clone()
        }]
    );

    let d = feed(
        &mut core,
        &mut log,
        mk_workload("apps", "web", 1, original.clone()),
    );
    assert_eq!(names(&d), ["StepCompensated", "WorkloadRestarted"]);
    feed(
        &mut core,
        &mut log,
        with_restart(mk_workload("apps", "web", 1, original.clone()), "rb-web"),
    );
    feed(&mut core, &mut log, mk_pod_removed("apps", "web-1"));
    // A pod back on the device plugin but from before the rollback's
    // restart is about to be replaced: the rollback is not done yet.
    let d = feed(
        &mut core,
        &mut log,
        mk_app_pod("apps", "web-2", "web", "w1", PodPhase::Running, (0, 0)),
    );
    assert!(d.is_empty(), "{:?}", names(&d));
    feed(&mut core, &mut log, mk_pod_removed("apps", "web-2"));
    let d = feed(
        &mut core,
        &mut log,
        with_restart(
            mk_app_pod("apps", "web-3", "web", "w1", PodPhase::Running, (0, 0)),
            "rb-web",
        ),
    );
    assert_eq!(names(&d), ["RollbackCompleted"]);
    assert_eq!(
        core.cluster()
            .workloads
            .values()
            .next()
            .unwrap()
            .placement
            .get(),
        original,
        "manifest exactly as before"
    );
    assert!(core.moves().active.is_empty() && core.moves().verified.is_empty());
}

#[test]
fn workloads_never_moved_have_nothing_to_roll_back() {
    let err = plan_workload_rollback(&[], &web(), "rb")
        .unwrap_err()
        .to_string();
    assert!(err.contains("has not been moved"), "{err}");
}

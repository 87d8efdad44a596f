//! The node handover, step by step: facts in, decisions and effects out.

mod support;

use support::*;
use switchyard_core::command::StartHandover;
use switchyard_core::effects::Effect;
use switchyard_core::names::{
    GPU_SETUP_COMPLETE_LABEL, GPU_STACK_LABEL, MODULE_NAMESPACE, NODE_AGENT_APP, VENDOR_ADAPTER_APP,
};
use switchyard_core::stack_assigner::{Input, StackAssigner};
use switchyard_proto::v1::{
    DomainEvent, EvictionBlocked, HandoverStep, NodeProvisioning, PodPhase, Stack, Taint,
    domain_event::Kind,
};

const S: i64 = 1_000_000_000;

fn names(decisions: &[DomainEvent]) -> Vec<&'static str> {
    decisions
        .iter()
        .map(|d| d.kind.as_ref().unwrap().type_name())
        .collect()
}

fn dedicated() -> Taint {
    Taint {
        key: "dedicated".into(),
        value: "gpu".into(),
        effect: "NoSchedule".into(),
    }
}

const W1_LABELS: &[(&str, &str)] = &[
    ("node-role.kubernetes.io/gpu", ""),
    ("nvidia.com/gpu.product", "A100"),
];

/// A cluster with DRA on, the source group `gpu` (spec.gpu), the empty target
/// `gpu-dra`, and node w1 in `gpu` running one app pod and one DaemonSet pod.
fn cluster() -> StackAssigner {
    let mut core = StackAssigner::default();
    let w1 = NodeSpec {
        labels: W1_LABELS,
        taints: vec![dedicated()],
        ..NodeSpec::new("w1", "gpu")
    };
    for fact in [
        mk_settings(true, true, ""),
        mk_group("gpu", true),
        mk_group("gpu-dra", false),
        w1.fact(),
        mk_pod(
            "apps",
            "web-1",
            "w1",
            ("Deployment", "web"),
            "web",
            PodPhase::Running,
        ),
        mk_pod(
            MODULE_NAMESPACE,
            "dp-1",
            "w1",
            ("DaemonSet", "nvidia-device-plugin"),
            "nvidia-device-plugin",
            PodPhase::Running,
        ),
    ] {
        core.handle_fact(&fact, 0);
    }
    core
}

fn start(core: &mut StackAssigner, node: &str, target: &str, now: i64) -> Vec<DomainEvent> {
    let cmd = StartHandover {
        handover_id: format!("h-{node}"),
        node: node.into(),
        target_group: target.into(),
    };
    core.handle(Input::StartHandover(&cmd), now)
}

#[test]
fn a_node_is_handed_over_step_by_step_with_its_before_image() {
    let mut core = cluster();
    let decisions = start(&mut core, "w1", "gpu-dra", 10 * S);
    assert_eq!(names(&decisions), ["HandoverStarted"]);
    let Some(Kind::HandoverStarted(started)) = &decisions[0].kind else {
        unreachable!()
    };
    assert_eq!(
        (started.source_group.as_str(), started.target_group.as_str()),
        ("gpu", "gpu-dra")
    );
    assert_eq!(started.labels_before["nvidia.com/gpu.product"], "A100");
    assert_eq!(started.taints_before, vec![dedicated()]);
    assert_eq!(
        core.handovers.effects(),
        [Effect::Cordon { node: "w1".into() }]
    );

    // 1. cordon observed
    let cordoned = NodeSpec {
        labels: W1_LABELS,
        taints: vec![dedicated()],
        unschedulable: true,
        ..NodeSpec::new("w1", "gpu")
    };
    let decisions = core.handle_fact(&cordoned.fact(), 20 * S);
    assert_eq!(names(&decisions), ["NodeCordoned"]);
    let Some(Kind::NodeCordoned(c)) = &decisions[0].kind else {
        unreachable!()
    };
    assert!(!c.was_unschedulable);
    assert_eq!(
        c.to_evict
            .iter()
            .map(|p| p.name.as_str())
            .collect::<Vec<_>>(),
        ["web-1"],
        "DaemonSet pods stay"
    );
    assert_eq!(
        core.handovers.effects(),
        [Effect::Drain { node: "w1".into() }]
    );

    // 2. the app pod is evicted
    let decisions = core.handle_fact(&mk_pod_removed("apps", "web-1"), 30 * S);
    assert_eq!(names(&decisions), ["NodeDrained"]);
    assert_eq!(
        core.handovers.effects(),
        [Effect::MoveToGroup {
            node: "w1".into(),
            group: "gpu-dra".into(),
            from_group: "gpu".into()
        }]
    );

    // 3. relabelled into gpu-dra, old role label gone: stack becomes DRA, then wait for readiness
    let moved = NodeSpec {
        labels: &[("nvidia.com/gpu.product", "A100")],
        taints: vec![dedicated()],
        unschedulable: true,
        ..NodeSpec::new("w1", "gpu-dra")
    };
    let decisions = core.handle_fact(&moved.fact(), 40 * S);
    assert_eq!(names(&decisions), ["StackAssigned", "NodeGroupChanged"]);
    let Some(Kind::NodeGroupChanged(changed)) = &decisions[1].kind else {
        unreachable!()
    };
    assert_eq!(changed.labels_before["node.deckhouse.io/group"], "gpu");
    assert!(
        changed
            .labels_before
            .contains_key("node-role.kubernetes.io/gpu")
    );
    assert_eq!(changed.labels_after["node.deckhouse.io/group"], "gpu-dra");
    assert_eq!(core.stack_of("w1"), Some(Stack::Dra));
    assert!(
        core.handovers.effects().is_empty(),
        "waiting for the node's preparation"
    );

    // 4. node preparation: labels, PhysicalGPUs, node agent and adapter pods
    let prepared = NodeSpec {
        labels: &[
            ("nvidia.com/gpu.product", "A100"),
            (GPU_SETUP_COMPLETE_LABEL, ""),
            (GPU_STACK_LABEL, "dra"),
        ],
        taints: vec![dedicated()],
        unschedulable: true,
        ..NodeSpec::new("w1", "gpu-dra")
    };
    for fact in [
        prepared.fact(),
        mk_gpu("w1-gpu-0", "w1", true),
        mk_gpu("w1-gpu-1", "w1", true),
        mk_pod(
            MODULE_NAMESPACE,
            "agent-w1",
            "w1",
            ("DaemonSet", NODE_AGENT_APP),
            NODE_AGENT_APP,
            PodPhase::Running,
        ),
    ] {
        assert!(
            core.handle_fact(&fact, 50 * S).is_empty(),
            "not ready before the adapter runs"
        );
    }
    let decisions = core.handle_fact(
        &mk_pod(
            MODULE_NAMESPACE,
            "adapter-w1",
            "w1",
            ("DaemonSet", VENDOR_ADAPTER_APP),
            VENDOR_ADAPTER_APP,
            PodPhase::Running,
        ),
        60 * S,
    );
    assert_eq!(names(&decisions), ["NodeReadinessObserved"]);
    assert_eq!(
        core.handovers.effects(),
        [Effect::Uncordon { node: "w1".into() }]
    );

    // 5. uncordoned
    let done = NodeSpec {
        unschedulable: false,
        ..prepared
    };
    let decisions = core.handle_fact(&done.fact(), 70 * S);
    assert_eq!(names(&decisions), ["NodeUncordoned", "HandoverCompleted"]);
    assert!(core.handovers.active.is_empty());
    assert_eq!(core.handovers.completed["h-w1"], "w1");
    assert!(core.handovers.effects().is_empty());
}

#[test]
fn an_empty_node_already_cordoned_passes_two_steps_at_once() {
    let mut core = StackAssigner::default();
    for fact in [
        mk_settings(true, true, ""),
        mk_group("gpu", true),
        mk_group("gpu-dra", false),
    ] {
        core.handle_fact(&fact, 0);
    }
    let node = NodeSpec {
        unschedulable: true,
        ..NodeSpec::new("w2", "gpu")
    };
    core.handle_fact(&node.fact(), 0);
    let decisions = start(&mut core, "w2", "gpu-dra", S);
    assert_eq!(
        names(&decisions),
        ["HandoverStarted", "NodeCordoned", "NodeDrained"]
    );
    let Some(Kind::NodeCordoned(c)) = &decisions[1].kind else {
        unreachable!()
    };
    assert!(
        c.was_unschedulable,
        "the before-image says it was cordoned already"
    );
}

#[test]
fn a_blocked_drain_stalls_once_with_the_pods_that_stay() {
    let mut core = cluster();
    start(&mut core, "w1", "gpu-dra", 0);
    let cordoned = NodeSpec {
        labels: W1_LABELS,
        unschedulable: true,
        ..NodeSpec::new("w1", "gpu")
    };
    core.handle_fact(&cordoned.fact(), S);
    // The drain's eviction of web-1 was refused; the edge recorded why.
    core.handle_fact(
        &DomainEvent {
            kind: Some(Kind::EvictionBlocked(EvictionBlocked {
                node: "w1".into(),
                namespace: "apps".into(),
                pod: "web-1".into(),
                reason: "Cannot evict pod as it would violate the pod's disruption budget.".into(),
                disruption_budgets: vec!["apps/web".into()],
            })),
        },
        S,
    );
    let deadline = S + core.handovers.deadlines.drain;
    assert!(
        core.handle(Input::Tick, deadline).is_empty(),
        "not before the deadline"
    );
    let decisions = core.handle(Input::Tick, deadline + 1);
    assert_eq!(names(&decisions), ["HandoverStalled"]);
    let Some(Kind::HandoverStalled(stalled)) = &decisions[0].kind else {
        unreachable!()
    };
    assert_eq!(stalled.step(), HandoverStep::Drain);
    assert!(
        stalled.reason.contains(
            "apps/web-1 (eviction refused: Cannot evict pod as it would violate the pod's disruption budget. (PodDisruptionBudget apps/web))"
        ),
        "{}",
        stalled.reason
    );
    assert_eq!(stalled.deadline_unix_nanos, deadline);
    assert!(
        core.handle(Input::Tick, deadline + 60 * S).is_empty(),
        "reported once"
    );
    assert_eq!(
        core.handovers.effects(),
        [Effect::Drain { node: "w1".into() }],
        "and still tried"
    );
    // Once the pod goes, the handover moves on.
    assert_eq!(
        names(&core.handle_fact(&mk_pod_removed("apps", "web-1"), deadline + 61 * S)),
        ["NodeDrained"]
    );
}

#[test]
fn readiness_stall_names_every_missing_condition() {
    let mut core = cluster();
    start(&mut core, "w1", "gpu-dra", 0);
    core.handle_fact(
        &NodeSpec {
            unschedulable: true,
            ..NodeSpec::new("w1", "gpu")
        }
        .fact(),
        0,
    );
    core.handle_fact(&mk_pod_removed("apps", "web-1"), 0);
    core.handle_fact(
        &NodeSpec {
            unschedulable: true,
            ..NodeSpec::new("w1", "gpu-dra")
        }
        .fact(),
        0,
    );
    core.handle_fact(&mk_gpu("w1-gpu-0", "w1", true), 0);
    let decisions = core.handle(Input::Tick, core.handovers.deadlines.wait_ready + 1);
    let Some(Kind::HandoverStalled(stalled)) = &decisions[0].kind else {
        panic!("{decisions:?}")
    };
    for missing in [
        "node.deckhouse.io/gpu-setup-complete",
        "node.deckhouse.io/gpu-stack=dra",
        "1 of 2 PhysicalGPU objects are Ready",
        "gpu-node-agent",
        "nvidia-dra-adapter",
    ] {
        assert!(
            stalled.reason.contains(missing),
            "{missing}: {}",
            stalled.reason
        );
    }
}

#[test]
fn handovers_are_refused_with_the_reference_explanation() {
    let mut core = cluster();
    for (name, provisioning, expected) in [
        (
            "si1",
            NodeProvisioning::StaticInstance,
            "managed by a StaticInstance",
        ),
        ("cl1", NodeProvisioning::Cloud, "is a cloud node"),
    ] {
        core.handle_fact(
            &NodeSpec {
                provisioning,
                ..NodeSpec::new(name, "gpu")
            }
            .fact(),
            0,
        );
        let decisions = start(&mut core, name, "gpu-dra", 0);
        let Some(Kind::HandoverRefused(refused)) = &decisions[0].kind else {
            panic!("{decisions:?}")
        };
        assert!(
            refused.reason.contains(expected)
                && refused.reason.contains("recreated by its own group"),
            "{}",
            refused.reason
        );
    }
    let refused = |decisions: Vec<DomainEvent>| match &decisions[0].kind {
        Some(Kind::HandoverRefused(r)) => r.reason.clone(),
        other => panic!("expected a refusal, got {other:?}"),
    };
    assert!(refused(start(&mut core, "nope", "gpu-dra", 0)).contains("not known"));
    assert!(refused(start(&mut core, "w1", "missing", 0)).contains("does not exist"));
    assert!(refused(start(&mut core, "w1", "gpu", 0)).contains("already in group gpu"));
    start(&mut core, "w1", "gpu-dra", 0);
    assert!(refused(start(&mut core, "w1", "gpu-dra", 0)).contains("already being handed over"));

    // With DRA off a group without spec.gpu would leave the cards idle.
    let mut off = cluster();
    off.handle_fact(&mk_settings(false, true, ""), 0);
    let reason = refused(start(&mut off, "w1", "gpu-dra", 0));
    assert!(
        reason.contains("no stack would manage") && reason.contains("sit idle"),
        "{reason}"
    );
}

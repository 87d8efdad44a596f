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
    DomainEvent, EvictionBlocked, HandoverStep, NodeGroupWritten, NodeProvisioning, PodPhase,
    Stack, Taint, domain_event::Kind, event,
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
        // These tests run with Deckhouse's gpu-node-agent and vendor adapter.
        mk_deckhouse_selectors(),
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
        force: false,
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
        core.handovers().effects(&core.cluster().backend),
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
        core.handovers().effects(&core.cluster().backend),
        [Effect::Drain { node: "w1".into() }]
    );

    // 2. the app pod is evicted
    let decisions = core.handle_fact(&mk_pod_removed("apps", "web-1"), 30 * S);
    assert_eq!(names(&decisions), ["NodeDrained"]);
    assert_eq!(
        core.handovers().effects(&core.cluster().backend),
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
        core.handovers().effects(&core.cluster().backend).is_empty(),
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
        mk_slice_of("w1", 2),
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
        core.handovers().effects(&core.cluster().backend),
        [Effect::Uncordon { node: "w1".into() }]
    );

    // 5. uncordoned
    let done = NodeSpec {
        unschedulable: false,
        ..prepared
    };
    let decisions = core.handle_fact(&done.fact(), 70 * S);
    assert_eq!(names(&decisions), ["NodeUncordoned", "HandoverCompleted"]);
    assert!(core.handovers().active.is_empty());
    assert_eq!(core.handovers().completed["h-w1"], "w1");
    assert!(core.handovers().effects(&core.cluster().backend).is_empty());
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
    let deadline = S + core.handovers().deadlines.drain;
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
        core.handovers().effects(&core.cluster().backend),
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
    let decisions = core.handle(Input::Tick, core.handovers().deadlines.wait_ready + 1);
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

// ---------------------------------------------------------------- readiness gates
//
// given(facts) → when(input) → then(expected decisions), as cqrs-es tests read.

/// A core that has seen `facts` (deciding on them as the service would).
fn given(facts: Vec<DomainEvent>) -> StackAssigner {
    let mut core = StackAssigner::default();
    for fact in facts {
        core.handle_fact(&fact, 0);
    }
    core
}

fn handover_cmd(node: &str, target: &str, force: bool) -> StartHandover {
    StartHandover {
        handover_id: format!("h-{node}"),
        node: node.into(),
        target_group: target.into(),
        force,
    }
}

fn when_facts(core: &mut StackAssigner, facts: Vec<DomainEvent>, now: i64) -> Vec<DomainEvent> {
    facts
        .into_iter()
        .flat_map(|f| core.handle_fact(&f, now))
        .collect()
}

const DP_LABELS: &[(&str, &str)] = &[
    (GPU_STACK_LABEL, "device-plugin"),
    (GPU_SETUP_COMPLETE_LABEL, ""),
    ("node-role.kubernetes.io/gpu", ""),
];
/// The stale device-plugin-era label, still there after the move; the stack label already says dra.
const MOVED_STALE: &[(&str, &str)] = &[(GPU_STACK_LABEL, "dra"), (GPU_SETUP_COMPLETE_LABEL, "")];
const MOVED_UNPREPARED: &[(&str, &str)] = &[(GPU_STACK_LABEL, "dra")];

/// w1 on the device plugin with `cards` Ready PhysicalGPUs and the chart's
/// node agent; gpu-dra empty; another device-plugin node w2 keeps the group
/// served.
fn dp_cluster(cards: u32) -> Vec<DomainEvent> {
    let mut facts = vec![
        mk_settings(true, true, ""),
        mk_group("gpu", true),
        mk_group("gpu-dra", false),
        NodeSpec {
            labels: DP_LABELS,
            gpus: cards,
            allocatable: &[("nvidia.com/gpu", 8)],
            ..NodeSpec::new("w1", "gpu")
        }
        .fact(),
        NodeSpec {
            labels: DP_LABELS,
            ..NodeSpec::new("w2", "gpu")
        }
        .fact(),
        mk_node_agent_pod("w1"),
    ];
    for i in 0..cards {
        facts.push(mk_gpu(&format!("w1-gpu-{i}"), "w1", true));
    }
    facts
}

/// Cordons, drains and moves w1 into `to`; the node after the move has
/// `labels` and reports `gpus` (its nvidia.com/gpu capacity on DRA: 0).
fn moved(
    core: &mut StackAssigner,
    to: &str,
    labels: &'static [(&'static str, &'static str)],
    gpus: u32,
) {
    let cmd = handover_cmd("w1", to, false);
    assert_eq!(
        names(&core.handle(Input::StartHandover(&cmd), 0)),
        ["HandoverStarted"]
    );
    let from = core.handovers().active["w1"].source_group.clone();
    let cordoned = NodeSpec {
        labels: DP_LABELS,
        unschedulable: true,
        gpus,
        ..NodeSpec::new("w1", if from == "gpu" { "gpu" } else { "gpu-dra" })
    };
    core.handle_fact(&cordoned.fact(), S);
    let after = NodeSpec {
        labels,
        unschedulable: true,
        gpus,
        ..NodeSpec::new("w1", to)
    };
    let decisions = core.handle_fact(&after.fact(), 2 * S);
    assert!(
        names(&decisions).contains(&"NodeGroupChanged"),
        "{decisions:?}"
    );
}

/// w1 (2 cards, nothing to drain) handed over to gpu-dra, cordoned: its
/// group move is due.
fn at_the_move() -> StackAssigner {
    let mut core = given(dp_cluster(2));
    core.handle(
        Input::StartHandover(&handover_cmd("w1", "gpu-dra", false)),
        0,
    );
    let cordoned = NodeSpec {
        labels: DP_LABELS,
        unschedulable: true,
        gpus: 2,
        ..NodeSpec::new("w1", "gpu")
    };
    core.handle_fact(&cordoned.fact(), S);
    core
}

#[test]
fn a_stale_setup_label_from_the_device_plugin_era_is_not_ready() {
    // given a node handed over whose gpu-setup-complete survived the move
    let mut core = given(dp_cluster(2));
    moved(&mut core, "gpu-dra", MOVED_STALE, 2);
    // when everything else holds, then nothing: the label is not fresh
    assert!(core.handle_fact(&mk_slice_of("w1", 2), 2 * S).is_empty());
    assert!(core.handle(Input::Tick, 3 * S).is_empty());
    let decisions = core.handle(Input::Tick, 3 * S + core.handovers().deadlines.wait_ready);
    let Some(Kind::HandoverStalled(stalled)) = &decisions[0].kind else {
        panic!("{decisions:?}")
    };
    assert!(
        stalled
            .reason
            .contains("node.deckhouse.io/gpu-setup-complete is left from before the group change"),
        "{}",
        stalled.reason
    );
    // when preparation takes it away and writes it again, then ready
    let unprepared = NodeSpec {
        labels: MOVED_UNPREPARED,
        unschedulable: true,
        ..NodeSpec::new("w1", "gpu-dra")
    };
    assert!(core.handle_fact(&unprepared.fact(), 4 * S).is_empty());
    let prepared = NodeSpec {
        labels: MOVED_STALE,
        unschedulable: true,
        ..NodeSpec::new("w1", "gpu-dra")
    };
    assert_eq!(
        names(&core.handle_fact(&prepared.fact(), 5 * S)),
        ["NodeReadinessObserved"]
    );
}

#[test]
fn a_label_seen_after_the_move_as_written_is_fresh_whatever_inventory_missed() {
    // given a node cordoned and drained, moved by the edge's write, which
    // took gpu-setup-complete away with the group change
    let mut core = at_the_move();
    assert!(
        core.effects()
            .iter()
            .any(|e| matches!(e, Effect::MoveToGroup { group, .. } if group == "gpu-dra")),
        "{:?}",
        core.effects()
    );
    let written = event(Kind::NodeGroupWritten(NodeGroupWritten {
        node: "w1".into(),
        from_group: "gpu".into(),
        to_group: "gpu-dra".into(),
        labels_removed: vec![GPU_SETUP_COMPLETE_LABEL.into()],
    }));
    core.apply(&written, 2 * S);
    core.apply(&mk_slice_of("w1", 2), 2 * S);
    // when inventory (restarted) first sees the node with the label written
    // again, with the value it had before the move
    let prepared = NodeSpec {
        labels: MOVED_STALE,
        unschedulable: true,
        gpus: 2,
        ..NodeSpec::new("w1", "gpu-dra")
    };
    // then its stack, the group change and the readiness, at once
    assert_eq!(
        names(&core.handle_fact(&prepared.fact(), 3 * S)),
        ["StackAssigned", "NodeGroupChanged", "NodeReadinessObserved"]
    );
}

#[test]
fn the_move_as_written_for_another_group_does_not_vouch_for_the_label() {
    // given the edge's write of a move to another group than the handover's
    let mut core = given(dp_cluster(2));
    moved(&mut core, "gpu-dra", MOVED_STALE, 2);
    let elsewhere = event(Kind::NodeGroupWritten(NodeGroupWritten {
        node: "w1".into(),
        from_group: "gpu".into(),
        to_group: "gpu-other".into(),
        labels_removed: vec![GPU_SETUP_COMPLETE_LABEL.into()],
    }));
    core.apply(&elsewhere, 3 * S);
    // then the label left from before the move is still not fresh
    assert!(core.handle(Input::Tick, 4 * S).is_empty());
}

#[test]
fn preparation_recorded_before_the_move_itself_still_counts_as_after_it() {
    // given a node cordoned and drained, whose group change is decided on a
    // fact that still carries the old gpu-setup-complete...
    let mut core = at_the_move();
    let after = NodeSpec {
        labels: MOVED_STALE,
        unschedulable: true,
        gpus: 2,
        ..NodeSpec::new("w1", "gpu-dra")
    }
    .fact();
    let changed = core
        .clone()
        .handle_fact(&after, 2 * S)
        .into_iter()
        .find(|d| matches!(d.kind, Some(Kind::NodeGroupChanged(_))))
        .expect("the group change");
    // ...while preparation took the label away and wrote it again, recorded
    // in the log before the group change is
    let unprepared = NodeSpec {
        labels: MOVED_UNPREPARED,
        unschedulable: true,
        gpus: 2,
        ..NodeSpec::new("w1", "gpu-dra")
    }
    .fact();
    for fact in [&after, &unprepared, &after, &changed, &mk_slice_of("w1", 2)] {
        core.apply(fact, 2 * S);
    }
    // then the label written after the removal counts: ready
    assert_eq!(
        names(&core.handle(Input::Tick, 3 * S)),
        ["NodeReadinessObserved"]
    );
}

#[test]
fn a_refreshed_setup_label_counts_as_written_after_the_move() {
    let mut core = given(dp_cluster(2));
    moved(&mut core, "gpu-dra", MOVED_STALE, 2);
    assert!(core.handle_fact(&mk_slice_of("w1", 2), 2 * S).is_empty());
    // preparation refreshes the value (a new generation) without removing it first
    let refreshed = NodeSpec {
        labels: &[(GPU_STACK_LABEL, "dra"), (GPU_SETUP_COMPLETE_LABEL, "2")],
        unschedulable: true,
        ..NodeSpec::new("w1", "gpu-dra")
    };
    assert_eq!(
        names(&core.handle_fact(&refreshed.fact(), 3 * S)),
        ["NodeReadinessObserved"]
    );
}

#[test]
fn eight_cards_before_and_zero_capacity_after_is_not_ready() {
    // given a device-plugin node with 8 Ready PhysicalGPUs
    let mut core = given(dp_cluster(8));
    assert_eq!(
        core.handle(
            Input::StartHandover(&handover_cmd("w1", "gpu-dra", false)),
            0
        )
        .iter()
        .find_map(|d| match &d.kind {
            Some(Kind::HandoverStarted(h)) => Some(h.cards_before),
            _ => None,
        }),
        Some(8),
        "the before-image records the cards"
    );
    let mut core = given(dp_cluster(8));
    // the node comes back from the move with nvidia.com/gpu capacity 0 and
    // its PhysicalGPUs re-discovered: none of them yet
    moved(&mut core, "gpu-dra", MOVED_UNPREPARED, 0);
    let mut gone: Vec<DomainEvent> = (0..8)
        .map(|i| {
            ev(Kind::PhysicalGpuRemoved(
                switchyard_proto::v1::PhysicalGpuRemoved {
                    name: format!("w1-gpu-{i}"),
                    node: "w1".into(),
                },
            ))
        })
        .collect();
    gone.push(mk_slice_of("w1", 8));
    gone.push(
        NodeSpec {
            labels: MOVED_STALE,
            unschedulable: true,
            gpus: 0,
            ..NodeSpec::new("w1", "gpu-dra")
        }
        .fact(),
    );
    // when everything else holds, then no readiness with 0 of 0
    assert!(when_facts(&mut core, gone, 3 * S).is_empty());
    let stalled = core.handle(Input::Tick, 3 * S + core.handovers().deadlines.wait_ready);
    let Some(Kind::HandoverStalled(stalled)) = &stalled[0].kind else {
        panic!("{stalled:?}")
    };
    assert!(
        stalled
            .reason
            .contains("0 of 8 PhysicalGPU objects are Ready"),
        "{}",
        stalled.reason
    );
    // 7 Ready are still too few
    let seven: Vec<DomainEvent> = (0..7)
        .map(|i| mk_gpu(&format!("w1-gpu-{i}"), "w1", true))
        .collect();
    assert!(when_facts(&mut core, seven, 4 * S).is_empty());
    let decisions = core.handle_fact(&mk_gpu("w1-gpu-7", "w1", true), 5 * S);
    let Some(Kind::NodeReadinessObserved(r)) = &decisions[0].kind else {
        panic!("{decisions:?}")
    };
    assert_eq!((r.ready_physical_gpus, r.expected_physical_gpus), (8, 8));
}

#[test]
fn the_charts_node_agent_satisfies_readiness_without_a_vendor_adapter() {
    // given the default selectors (Switchyard's chart: no vendor adapter)
    let mut facts = dp_cluster(2);
    facts.retain(|f| !matches!(&f.kind, Some(Kind::PodObserved(_))));
    let mut core = given(facts);
    moved(&mut core, "gpu-dra", MOVED_UNPREPARED, 2);
    let prepared = NodeSpec {
        labels: MOVED_STALE,
        unschedulable: true,
        ..NodeSpec::new("w1", "gpu-dra")
    };
    // a Deckhouse-labelled agent pod is not the chart's node agent
    let deckhouse_agent = mk_daemon_pod(
        MODULE_NAMESPACE,
        "agent-w1",
        "w1",
        &[("app", NODE_AGENT_APP)],
    );
    let facts = vec![prepared.fact(), deckhouse_agent, mk_slice_of("w1", 2)];
    assert!(when_facts(&mut core, facts, 3 * S).is_empty());
    let stalled = core.handle(Input::Tick, 3 * S + core.handovers().deadlines.wait_ready);
    let Some(Kind::HandoverStalled(stalled)) = &stalled[0].kind else {
        panic!("{stalled:?}")
    };
    assert!(
        stalled.reason.contains("no running gpu-node-agent pod (app.kubernetes.io/name=switchyard,app.kubernetes.io/component=node-agent)"),
        "{}",
        stalled.reason
    );
    assert!(
        !stalled.reason.contains("vendor adapter"),
        "{}",
        stalled.reason
    );
    // when the chart's node agent runs, then ready
    let decisions = core.handle_fact(&mk_node_agent_pod("w1"), 4 * S);
    let Some(Kind::NodeReadinessObserved(r)) = &decisions[0].kind else {
        panic!("{decisions:?}")
    };
    assert!(r.node_agent_running && r.vendor_adapter_running);
}

#[test]
fn a_node_moved_to_dra_is_ready_once_it_serves_dra() {
    // given w1 moved into gpu-dra, prepared afresh, its node agent running,
    // but the agent has not switched yet: no slice, nvidia.com/gpu allocatable
    let mut core = given(dp_cluster(2));
    moved(&mut core, "gpu-dra", MOVED_UNPREPARED, 2);
    let advertising = NodeSpec {
        labels: MOVED_STALE,
        unschedulable: true,
        allocatable: &[("nvidia.com/gpu", 2)],
        ..NodeSpec::new("w1", "gpu-dra")
    };
    // then not ready: the reference's conditions hold, DRA is not served
    assert!(core.handle_fact(&advertising.fact(), 3 * S).is_empty());
    let late = 3 * S + core.handovers().deadlines.wait_ready;
    let stalled = core.clone().handle(Input::Tick, late);
    let Some(Kind::HandoverStalled(stalled)) = &stalled[0].kind else {
        panic!("{stalled:?}")
    };
    assert!(
        stalled
            .reason
            .contains("the node is on the dra stack but publishes no GPU ResourceSlice (device-plugin resources allocatable: 2)"),
        "{}",
        stalled.reason
    );
    // when its slice is published while the device plugin still advertises
    // the cards, then still not: two allocators
    assert!(core.handle_fact(&mk_slice_of("w1", 2), 4 * S).is_empty());
    // when the device plugin's resource is gone, then ready
    let serving = NodeSpec {
        labels: MOVED_STALE,
        unschedulable: true,
        ..NodeSpec::new("w1", "gpu-dra")
    };
    let decisions = core.handle_fact(&serving.fact(), 5 * S);
    let Some(Kind::NodeReadinessObserved(r)) = &decisions[0].kind else {
        panic!("{decisions:?}")
    };
    assert_eq!(r.device_plugin_allocatable, 0);
}

#[test]
fn the_configured_selectors_are_recorded_once_and_decide_the_same_on_replay() {
    let deckhouse = switchyard_core::cluster::ReadinessSelectors::parse(
        &format!("app={NODE_AGENT_APP}"),
        &format!("app={VENDOR_ADAPTER_APP}"),
    )
    .unwrap();
    let mut core = StackAssigner::with_selectors(deckhouse.clone());
    let recorded = core.catch_up(0);
    assert_eq!(names(&recorded), ["ReadinessSelectorsConfigured"]);
    assert_eq!(core.cluster().selectors, deckhouse);
    // a restart with the same flags records nothing; a replay without flags decides the same
    let mut restarted = StackAssigner::with_selectors(deckhouse.clone());
    let mut replayed = StackAssigner::default();
    for e in &recorded {
        restarted.apply(e, 0);
        replayed.apply(e, 0);
    }
    assert!(restarted.catch_up(1).is_empty());
    assert_eq!(replayed.cluster().selectors, deckhouse);
    // a selector that is not one is refused, naming the flag
    let err = switchyard_core::cluster::ReadinessSelectors::parse("app in gpu", "").unwrap_err();
    assert!(
        err.contains("--node-agent-selector") && err.contains("parentheses"),
        "{err}"
    );
}

#[test]
fn handing_back_to_the_device_plugin_waits_for_allocatable_nvidia_gpu() {
    // given w1 on DRA in gpu-dra (2 cards), handed over to gpu (spec.gpu)
    let mut core = given(vec![
        mk_settings(true, true, ""),
        mk_group("gpu", true),
        mk_group("gpu-dra", false),
        NodeSpec {
            labels: &[(GPU_STACK_LABEL, "dra"), (GPU_SETUP_COMPLETE_LABEL, "")],
            ..NodeSpec::new("w1", "gpu-dra")
        }
        .fact(),
        mk_gpu("w1-gpu-0", "w1", true),
        mk_gpu("w1-gpu-1", "w1", true),
    ]);
    moved(&mut core, "gpu", &[(GPU_STACK_LABEL, "device-plugin")], 2);
    assert_eq!(core.stack_of("w1"), Some(Stack::DevicePlugin));
    // when both labels are fresh but nothing is allocatable, then not ready
    let labelled = NodeSpec {
        labels: &[
            (GPU_STACK_LABEL, "device-plugin"),
            (GPU_SETUP_COMPLETE_LABEL, ""),
        ],
        unschedulable: true,
        ..NodeSpec::new("w1", "gpu")
    };
    assert!(core.handle_fact(&labelled.fact(), 3 * S).is_empty());
    let stalled = core.handle(Input::Tick, 3 * S + core.handovers().deadlines.wait_ready);
    let Some(Kind::HandoverStalled(stalled)) = &stalled[0].kind else {
        panic!("{stalled:?}")
    };
    assert!(
        stalled
            .reason
            .contains("0 of 2 nvidia.com/gpu (or MIG, time-slicing) resources are allocatable"),
        "{}",
        stalled.reason
    );
    // one card's worth is not the node's
    let one = NodeSpec {
        allocatable: &[("nvidia.com/gpu", 1)],
        ..labelled
    };
    assert!(core.handle_fact(&one.fact(), 4 * S).is_empty());
    // when nvidia.com/gpu returns to allocatable (here as MIG partitions), then ready
    let back = NodeSpec {
        allocatable: &[("nvidia.com/mig-1g.5gb", 14)],
        ..one
    };
    let decisions = core.handle_fact(&back.fact(), 5 * S);
    let Some(Kind::NodeReadinessObserved(r)) = &decisions[0].kind else {
        panic!("{decisions:?}")
    };
    assert_eq!(r.device_plugin_allocatable, 14);
}

#[test]
fn a_switch_to_the_device_plugin_is_held_while_dra_claims_are_allocated() {
    // given a DRA node of a group without spec.gpu, with an allocated claim
    let mut core = given(vec![
        mk_settings(true, true, ""),
        mk_group("gpu-x", false),
        NodeSpec::new("n1", "gpu-x").fact(),
        mk_claim("ml", "train-0-gpu", "n1"),
        mk_claim("ml", "elsewhere", "n2"),
    ]);
    assert_eq!(core.stack_of("n1"), Some(Stack::Dra));
    // when spec.gpu is set again, then the switch is held, naming the claim
    let decisions = core.handle_fact(&mk_group("gpu-x", true), S);
    assert_eq!(names(&decisions), ["StackSwitchHeld"]);
    let Some(Kind::StackSwitchHeld(held)) = &decisions[0].kind else {
        unreachable!()
    };
    assert_eq!(held.claims, ["ml/train-0-gpu"]);
    assert!(held.reason.contains("drain it first"), "{}", held.reason);
    assert_eq!(core.stack_of("n1"), Some(Stack::Dra), "the stack stays");
    assert!(
        core.rule_violations().is_empty(),
        "a held switch is no violation"
    );
    assert!(
        core.effects().iter().any(|e| matches!(e,
            Effect::NodeEvent { node, reason, message }
                if node == "n1" && reason == "StackSwitchHeld" && message.contains("ml/train-0-gpu"))),
        "an Event on the Node: {:?}",
        core.effects()
    );
    // a relabel of the node, or an unrelated claim, decides nothing new
    assert!(
        core.handle_fact(&NodeSpec::new("n1", "gpu-x").fact(), 2 * S)
            .is_empty()
    );
    assert!(
        core.handle_fact(&mk_claim_removed("ml", "elsewhere"), 2 * S)
            .is_empty()
    );
    // when the claim goes, then the switch happens
    let decisions = core.handle_fact(&mk_claim_removed("ml", "train-0-gpu"), 3 * S);
    assert_eq!(names(&decisions), ["StackAssigned"]);
    assert_eq!(core.stack_of("n1"), Some(Stack::DevicePlugin));
    assert!(core.switch_holds().is_empty());
    assert!(
        !core
            .effects()
            .iter()
            .any(|e| matches!(e, Effect::NodeEvent { .. }))
    );
}

#[test]
fn the_last_device_plugin_node_is_refused_while_nvidia_gpu_workloads_need_it_unless_forced() {
    let workload = mk_workload(
        "ml",
        "train",
        2,
        mk_placement(
            &[("nvidia.com/gpu", "1")],
            &[("node.deckhouse.io/group", "gpu")],
        ),
    );
    let mut facts = dp_cluster(2);
    facts.retain(|f| !matches!(&f.kind, Some(Kind::NodeObserved(n)) if n.node == "w2"));
    facts.push(workload.clone());
    // given w1, the only device-plugin node, and a workload asking for nvidia.com/gpu
    let mut core = given(facts.clone());
    // when handed over without force, then refused naming the workload
    let decisions = core.handle(
        Input::StartHandover(&handover_cmd("w1", "gpu-dra", false)),
        0,
    );
    let Some(Kind::HandoverRefused(refused)) = &decisions[0].kind else {
        panic!("{decisions:?}")
    };
    assert_eq!(decisions.len(), 1);
    assert_eq!(
        refused
            .would_go_pending
            .iter()
            .map(|w| format!("{}/{}/{}", w.namespace, w.kind, w.name))
            .collect::<Vec<_>>(),
        ["ml/Deployment/train"]
    );
    assert!(
        refused.reason.contains("last device-plugin node") && refused.reason.contains("force"),
        "{}",
        refused.reason
    );
    assert!(core.handovers().active.is_empty());
    // when forced, then started
    let decisions = core.handle(
        Input::StartHandover(&handover_cmd("w1", "gpu-dra", true)),
        0,
    );
    assert_eq!(names(&decisions)[0], "HandoverStarted");
    // with another device-plugin node left, no force is needed
    let mut core = given(
        dp_cluster(2)
            .into_iter()
            .chain([workload.clone()])
            .collect(),
    );
    assert_eq!(
        names(&core.handle(
            Input::StartHandover(&handover_cmd("w1", "gpu-dra", false)),
            0
        ))[0],
        "HandoverStarted"
    );
    // ... but w2 is then the last one
    let decisions = core.handle(
        Input::StartHandover(&handover_cmd("w2", "gpu-dra", false)),
        0,
    );
    assert_eq!(names(&decisions), ["HandoverRefused"]);
    // and without nvidia.com/gpu workloads the last node goes
    let mut core = given(facts.into_iter().filter(|f| *f != workload).collect());
    assert_eq!(
        names(&core.handle(
            Input::StartHandover(&handover_cmd("w1", "gpu-dra", false)),
            0
        ))[0],
        "HandoverStarted"
    );
}

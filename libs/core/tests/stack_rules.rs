//! One test per reference rule of the stack split and the upgrade hold, in the
//! given / when / then shape: facts go in, decisions come out.

mod support;

use support::*;
use switchyard_core::names::ALERT_HELD_ON_DRA;
use switchyard_core::stack_assigner::StackAssigner;
use switchyard_proto::v1::{DomainEvent, ReleaseReason, Stack, StackReason, domain_event::Kind};

fn given(facts: &[DomainEvent]) -> StackAssigner {
    let mut core = StackAssigner::default();
    for fact in facts {
        core.handle_fact(fact, 0);
    }
    core
}

fn stack(core: &StackAssigner, node: &str) -> (Stack, StackReason) {
    let a = &core.assignments()[node];
    (a.stack, a.reason)
}

fn names(decisions: &[DomainEvent]) -> Vec<&'static str> {
    decisions
        .iter()
        .map(|d| d.kind.as_ref().unwrap().type_name())
        .collect()
}

#[test]
fn group_with_spec_gpu_is_served_by_the_device_plugin() {
    let core = given(&[
        mk_settings(true, true, ""),
        mk_group("gpu", true),
        mk_node("w1", Some("gpu")),
    ]);
    assert_eq!(
        stack(&core, "w1"),
        (Stack::DevicePlugin, StackReason::GroupHasSpecGpu)
    );
}

#[test]
fn dra_enabled_serves_every_other_node_by_dra() {
    let core = given(&[
        mk_settings(true, true, ""),
        mk_group("gpu-dra", false),
        mk_node("w1", Some("gpu-dra")),
        mk_node("w2", Some("unrelated")),
        mk_node("w3", None),
    ]);
    for node in ["w1", "w2", "w3"] {
        assert_eq!(
            stack(&core, node),
            (Stack::Dra, StackReason::DraEnabled),
            "{node}"
        );
    }
}

#[test]
fn control_plane_nodes_get_no_dra() {
    let core = given(&[mk_settings(true, true, ""), mk_control_plane("cp1")]);
    assert_eq!(
        stack(&core, "cp1"),
        (Stack::None, StackReason::ControlPlane)
    );
}

#[test]
fn opted_out_nodes_get_no_dra() {
    let core = given(&[
        mk_settings(true, true, ""),
        mk_group("gpu-dra", false),
        mk_opted_out("w1", "gpu-dra"),
    ]);
    assert_eq!(
        stack(&core, "w1"),
        (Stack::None, StackReason::GpuDisabledLabel)
    );
}

#[test]
fn without_spec_gpu_and_without_dra_no_stack_manages_the_node() {
    // Common mistakes: "No stack manages the node".
    let core = given(&[
        mk_settings(false, true, ""),
        mk_group("gpu-dra", false),
        mk_node("w1", Some("gpu-dra")),
    ]);
    assert_eq!(
        stack(&core, "w1"),
        (Stack::None, StackReason::NoSpecGpuDraDisabled)
    );
}

#[test]
fn feature_gates_not_ready_keep_dra_off() {
    // Common mistakes: "DRA is not deployed on the group's nodes ... the feature gates are not ready".
    let core = given(&[mk_settings(true, false, ""), mk_node("w1", Some("gpu-dra"))]);
    assert_eq!(
        stack(&core, "w1"),
        (Stack::None, StackReason::FeatureGatesNotReady)
    );
}

#[test]
fn fresh_install_does_not_hold_groups_with_spec_gpu() {
    let core = given(&[
        mk_group("gpu", true),
        mk_node("w1", Some("gpu")),
        mk_settings(true, true, ""),
    ]);
    assert!(core.held().is_empty());
    assert_eq!(
        stack(&core, "w1"),
        (Stack::DevicePlugin, StackReason::GroupHasSpecGpu)
    );
}

#[test]
fn upgrade_with_dra_enabled_holds_every_group_with_spec_gpu_and_alerts() {
    let mut core = given(&[
        mk_group("gpu", true),
        mk_group("gpu-b", true),
        mk_group("plain", false),
        mk_node("w1", Some("gpu")),
        mk_node("w2", Some("plain")),
    ]);
    let decisions = core.handle_fact(&mk_settings(true, true, "1.9.0"), 0);
    assert_eq!(core.held().iter().collect::<Vec<_>>(), ["gpu", "gpu-b"]);
    // The alerter fires D8GpuNodeGroupHeldOnDra for each held group.
    let mut alerter = switchyard_core::alerter::Alerter::default();
    let alerts: Vec<DomainEvent> = decisions
        .iter()
        .flat_map(|d| alerter.handle(d, 0))
        .collect();
    let alerts: Vec<_> = alerts
        .iter()
        .filter_map(|d| match &d.kind {
            Some(Kind::AlertRaised(a)) => {
                Some((a.alert_name.as_str(), a.labels["node_group"].as_str()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(
        alerts,
        [(ALERT_HELD_ON_DRA, "gpu"), (ALERT_HELD_ON_DRA, "gpu-b")]
    );
    assert_eq!(stack(&core, "w1"), (Stack::Dra, StackReason::HeldOnDra));
    assert_eq!(stack(&core, "w2"), (Stack::Dra, StackReason::DraEnabled));
}

#[test]
fn upgrade_with_dra_disabled_holds_nothing() {
    let core = given(&[
        mk_group("gpu", true),
        mk_node("w1", Some("gpu")),
        mk_settings(false, true, "1.9.0"),
    ]);
    assert!(core.held().is_empty());
    assert_eq!(
        stack(&core, "w1"),
        (Stack::DevicePlugin, StackReason::GroupHasSpecGpu)
    );
}

#[test]
fn the_hold_is_taken_on_the_first_run_only() {
    let mut core = given(&[mk_group("gpu", true), mk_settings(true, true, "1.9.0")]);
    let decisions = core.handle_fact(&mk_group("gpu-new", true), 0);
    assert!(
        decisions.is_empty(),
        "a group created after the upgrade is not held: {:?}",
        names(&decisions)
    );
    let decisions = core.handle_fact(&mk_settings(true, true, "1.9.0"), 0);
    assert!(!names(&decisions).contains(&"NodeGroupHeldOnDra"));
    assert_eq!(core.held().iter().collect::<Vec<_>>(), ["gpu"]);
}

#[test]
fn removing_spec_gpu_releases_the_group_it_stays_on_dra_and_the_alert_clears() {
    let mut core = given(&[
        mk_group("gpu", true),
        mk_node("w1", Some("gpu")),
        mk_settings(true, true, "1.9.0"),
    ]);
    let decisions = core.handle_fact(&mk_group("gpu", false), 0);
    assert_eq!(names(&decisions), ["NodeGroupReleased", "StackAssigned"]);
    let Some(Kind::NodeGroupReleased(released)) = &decisions[0].kind else {
        unreachable!()
    };
    assert_eq!(released.reason(), ReleaseReason::SpecGpuRemoved);
    assert!(core.held().is_empty());
    assert_eq!(
        stack(&core, "w1"),
        (Stack::Dra, StackReason::DraEnabled),
        "stays on DRA"
    );
}

#[test]
fn setting_spec_gpu_again_after_release_moves_the_group_to_the_device_plugin() {
    let mut core = given(&[
        mk_group("gpu", true),
        mk_node("w1", Some("gpu")),
        mk_settings(true, true, "1.9.0"),
        mk_group("gpu", false),
    ]);
    let decisions = core.handle_fact(&mk_group("gpu", true), 0);
    assert_eq!(names(&decisions), ["StackAssigned"]);
    assert_eq!(
        stack(&core, "w1"),
        (Stack::DevicePlugin, StackReason::GroupHasSpecGpu)
    );
}

#[test]
fn disabling_dra_releases_all_groups() {
    let mut core = given(&[
        mk_group("gpu", true),
        mk_group("gpu-b", true),
        mk_node("w1", Some("gpu")),
        mk_settings(true, true, "1.9.0"),
    ]);
    let decisions = core.handle_fact(&mk_settings(false, true, "1.9.0"), 0);
    let released: Vec<_> = decisions
        .iter()
        .filter_map(|d| match &d.kind {
            Some(Kind::NodeGroupReleased(r)) => Some((r.group.as_str(), r.reason())),
            _ => None,
        })
        .collect();
    assert_eq!(
        released,
        [
            ("gpu", ReleaseReason::DraDisabled),
            ("gpu-b", ReleaseReason::DraDisabled)
        ]
    );
    assert!(core.held().is_empty());
    assert_eq!(
        stack(&core, "w1"),
        (Stack::DevicePlugin, StackReason::GroupHasSpecGpu)
    );
}

#[test]
fn deleting_a_held_group_releases_it() {
    let mut core = given(&[mk_group("gpu", true), mk_settings(true, true, "1.9.0")]);
    let decisions = core.handle_fact(&mk_group_removed("gpu"), 0);
    assert_eq!(names(&decisions), ["NodeGroupReleased"]);
    assert!(core.held().is_empty());
}

#[test]
fn moving_a_node_between_groups_changes_its_stack() {
    let mut core = given(&[
        mk_settings(true, true, ""),
        mk_group("gpu", true),
        mk_group("gpu-dra", false),
        mk_node("w1", Some("gpu")),
    ]);
    let decisions = core.handle_fact(&mk_node("w1", Some("gpu-dra")), 0);
    let Some(Kind::StackAssigned(assigned)) = &decisions[0].kind else {
        panic!("{decisions:?}")
    };
    assert_eq!(
        (assigned.previous_stack(), assigned.stack()),
        (Stack::DevicePlugin, Stack::Dra)
    );
    assert_eq!(assigned.group, "gpu-dra");
    assert!(core.cluster().members["gpu-dra"].contains("w1"));
    assert!(!core.cluster().members.contains_key("gpu"));
}

#[test]
fn an_unchanged_fact_decides_nothing() {
    let mut core = given(&[
        mk_settings(true, true, ""),
        mk_group("gpu", true),
        mk_node("w1", Some("gpu")),
    ]);
    assert!(core.handle_fact(&mk_node("w1", Some("gpu")), 0).is_empty());
    assert!(core.handle_fact(&mk_group("gpu", true), 0).is_empty());
    core.handle_fact(&mk_node_removed("w1"), 0);
    assert!(!core.assignments().contains_key("w1"));
}

// ------------------------------------------------- the nvidia-operator backend

use std::collections::BTreeMap;
use switchyard_core::backend::{Backend, NvidiaOperator};

const POOL: &str = "gpu-scheduling.platform.example.com/pool";

fn nvidia_backend() -> Backend {
    Backend::NvidiaOperator(Box::new(NvidiaOperator {
        pools: BTreeMap::from([
            ("legacy".to_string(), Stack::DevicePlugin),
            ("dra-pilot".to_string(), Stack::Dra),
        ]),
        ..NvidiaOperator::default()
    }))
}

/// A GPU node as GPU Feature Discovery labels it, in `pool` if any.
fn gfd_node(name: &str, pool: Option<&str>) -> DomainEvent {
    let mut labels = vec![("nvidia.com/gpu.present", "true")];
    if let Some(pool) = pool {
        labels.push((POOL, pool));
    }
    mk_node_labels(name, None, &labels)
}

/// A stack-assigner started with `--backend nvidia-operator`, caught up on
/// `facts`.
fn given_on_nvidia(facts: &[DomainEvent]) -> (StackAssigner, Vec<DomainEvent>) {
    let mut core = StackAssigner::default().on_backend(nvidia_backend());
    let mut decided = core.catch_up(0);
    for fact in facts {
        decided.extend(core.handle_fact(fact, 0));
    }
    (core, decided)
}

#[test]
fn on_the_nvidia_backend_the_pool_decides_the_stack() {
    let (core, decided) = given_on_nvidia(&[
        mk_settings(false, true, ""),
        gfd_node("gpu-legacy-01", Some("legacy")),
        gfd_node("gpu-dra-01", Some("dra-pilot")),
        gfd_node("gpu-other", Some("unlisted")),
        gfd_node("gpu-plain", None),
        mk_node("cpu-1", None),
    ]);
    // The backend is recorded first, so a replay decides the same.
    assert_eq!(names(&decided)[0], "BackendConfigured");
    assert_eq!(core.cluster().backend, nvidia_backend());
    assert_eq!(
        stack(&core, "gpu-legacy-01"),
        (Stack::DevicePlugin, StackReason::PoolStack)
    );
    // dra.enabled is the ModuleConfig's, Deckhouse's: it plays no part here.
    assert_eq!(
        stack(&core, "gpu-dra-01"),
        (Stack::Dra, StackReason::PoolStack)
    );
    for node in ["gpu-other", "gpu-plain"] {
        assert_eq!(
            stack(&core, node),
            (Stack::DevicePlugin, StackReason::OperatorDefault),
            "{node}"
        );
    }
    // No nvidia.com/gpu.present=true: the operator deploys nothing there.
    assert_eq!(
        stack(&core, "cpu-1"),
        (Stack::None, StackReason::NoGpuPresent)
    );
}

#[test]
fn on_the_nvidia_backend_a_dra_pool_waits_for_the_feature_gates() {
    let (core, _) = given_on_nvidia(&[
        mk_settings(true, false, ""),
        gfd_node("gpu-dra-01", Some("dra-pilot")),
        gfd_node("gpu-legacy-01", Some("legacy")),
        mk_control_plane("cp1"),
    ]);
    // Never a silent fall back to the device plugin.
    assert_eq!(
        stack(&core, "gpu-dra-01"),
        (Stack::None, StackReason::FeatureGatesNotReady)
    );
    assert_eq!(
        stack(&core, "gpu-legacy-01"),
        (Stack::DevicePlugin, StackReason::PoolStack)
    );
    assert_eq!(
        stack(&core, "cp1"),
        (Stack::None, StackReason::ControlPlane)
    );
}

#[test]
fn the_backend_is_recorded_only_when_it_changes_and_read_back_as_written() {
    let (mut core, _) = given_on_nvidia(&[mk_settings(true, true, "")]);
    // Caught up again with the same flags: nothing new to record.
    assert!(!names(&core.catch_up(1)).contains(&"BackendConfigured"));
    let recorded = nvidia_backend().to_event();
    assert_eq!(Backend::from_event(&recorded), nvidia_backend());
    // Started with the default backend on a log that names none: nothing
    // recorded (logs of the deckhouse backend stay as they were).
    let mut plain = StackAssigner::default().on_backend(Backend::Deckhouse);
    assert!(!names(&plain.catch_up(0)).contains(&"BackendConfigured"));
}

#[test]
fn on_the_nvidia_backend_an_upgrade_holds_no_group() {
    let (core, decided) = given_on_nvidia(&[
        mk_group("gpu", true),
        mk_settings(true, true, "1.9.0"),
        gfd_node("gpu-legacy-01", Some("legacy")),
    ]);
    assert!(
        !names(&decided).contains(&"NodeGroupHeldOnDra"),
        "{:?}",
        names(&decided)
    );
    assert!(core.held().is_empty());
}

#[test]
fn on_the_nvidia_backend_nodegroups_are_pools_by_their_label() {
    // Where NodeGroups exist, their label names the pool: each NodeGroup
    // given a stack, whatever its spec.gpu says.
    let backend = Backend::NvidiaOperator(Box::new(NvidiaOperator {
        pool_label: switchyard_core::names::GROUP_LABEL.into(),
        pools: BTreeMap::from([
            ("gpu".to_string(), Stack::DevicePlugin),
            ("gpu-dra".to_string(), Stack::Dra),
        ]),
        ..NvidiaOperator::default()
    }));
    let mut core = StackAssigner::default().on_backend(backend);
    core.catch_up(0);
    for fact in [
        mk_group("gpu", true),
        mk_group("gpu-dra", true),
        mk_settings(false, true, ""),
        mk_node_labels("a", Some("gpu"), &[("nvidia.com/gpu.present", "true")]),
        mk_node_labels("b", Some("gpu-dra"), &[("nvidia.com/gpu.present", "true")]),
    ] {
        core.handle_fact(&fact, 0);
    }
    assert_eq!(
        stack(&core, "a"),
        (Stack::DevicePlugin, StackReason::PoolStack)
    );
    assert_eq!(stack(&core, "b"), (Stack::Dra, StackReason::PoolStack));
    assert_eq!(core.cluster().nodes["b"].group(), Some("gpu-dra"));
}

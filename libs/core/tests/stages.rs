//! The NVIDIA guide's stage table as evidence: given a cluster the GPU
//! Operator and the DRA driver serve, mid-migration, when the operator asks
//! for one stage, then what is recorded and whether it passed.

mod support;

use std::collections::BTreeMap;

use support::*;
use switchyard_core::claim_allocator::stages::Stage;
use switchyard_core::claim_allocator::{ClaimAllocator, Input};
use switchyard_core::command::CheckEvidence;
use switchyard_proto::v1::{
    AllocatedDevice, DomainEvent, EvidenceRecorded, PodPhase, ResourceClaimObserved, Toleration,
    Tolerations, domain_event::Kind,
};

const PLUGIN: &str = "nvidia.com/dra-kubelet-plugin";
const DP: &str = "nvidia.com/gpu.deploy.device-plugin";

/// A pod of Deployment `app` asking for `gpus` nvidia.com/gpu; `bridged`:
/// served through DRA's implicit claim.
fn legacy_pod(name: &str, app: &str, node: &str, gpus: u32, bridged: bool) -> DomainEvent {
    let mut pod = mk_app_pod(
        "apps",
        name,
        app,
        node,
        PodPhase::Running,
        if bridged { (1, 1) } else { (0, 0) },
    );
    if let Some(Kind::PodObserved(p)) = &mut pod.kind {
        if bridged {
            p.bridged_gpus = gpus;
        } else {
            p.device_plugin_gpus = gpus;
        }
    }
    pod
}

/// gpu-1 on the device plugin, gpu-2 handed over to DRA.
fn migrating() -> ClaimAllocator {
    let mut core = ClaimAllocator::default();
    let facts = [
        ev(Kind::BackendConfigured(guide_backend().to_event())),
        mk_gfd_node("gpu-1", &[(DP, "true")], 2),
        mk_daemon_pod(
            "gpu-operator",
            "nvidia-device-plugin-daemonset-a",
            "gpu-1",
            &[("app", "nvidia-device-plugin-daemonset")],
        ),
        mk_gfd_node("gpu-2", &[(DP, "false"), (PLUGIN, "true")], 0),
        mk_daemon_pod(
            "nvidia-dra-driver-gpu",
            "dra-driver-nvidia-gpu-kubelet-plugin-b",
            "gpu-2",
            &[("dra-driver-nvidia-gpu-component", "kubelet-plugin")],
        ),
        mk_h100_slice("gpu-2"),
    ];
    for fact in facts {
        core.handle(Input::Fact(&fact), 0);
    }
    core
}

fn check(core: &mut ClaimAllocator, stage: Stage) -> Vec<DomainEvent> {
    core.handle(
        Input::CheckEvidence(&CheckEvidence {
            check_id: format!("ev-{}", stage.name()),
            migration_id: String::new(),
            wave: None,
            stage: Some(stage),
        }),
        0,
    )
}

fn records(decided: &[DomainEvent]) -> Vec<&EvidenceRecorded> {
    decided
        .iter()
        .filter_map(|d| match &d.kind {
            Some(Kind::EvidenceRecorded(r)) => Some(r),
            _ => None,
        })
        .collect()
}

/// (subject, check, passed) of each item.
fn items(decided: &[DomainEvent]) -> Vec<(String, String, bool)> {
    records(decided)
        .iter()
        .flat_map(|r| {
            let subject = match &r.workload {
                Some(w) => format!("{}/{}", w.kind, w.name),
                None => r.node.clone(),
            };
            r.items
                .iter()
                .map(move |i| (subject.clone(), i.check.clone(), i.passed))
        })
        .collect()
}

fn s(subject: &str, check: &str, passed: bool) -> (String, String, bool) {
    (subject.into(), check.into(), passed)
}

#[test]
fn the_pilot_pool_and_the_driver_are_shown_on_the_dra_nodes_only() {
    let mut core = migrating();
    let decided = check(&mut core, Stage::PilotPool);
    assert_eq!(
        items(&decided),
        [
            s("gpu-2", "no dual advertisement", true),
            s("gpu-2", "DRA plug-in healthy", true)
        ]
    );
    assert!(records(&decided).iter().all(|r| r.stage == "pilot-pool"));
    let Some(Kind::EvidenceChecked(c)) = &decided.last().unwrap().kind else {
        panic!("{decided:?}")
    };
    assert_eq!((c.stage.as_str(), c.nodes, c.failed), ("pilot-pool", 1, 0));

    let decided = check(&mut core, Stage::DriverValidation);
    assert_eq!(
        items(&decided),
        [s(
            "gpu-2",
            "slices match GPU Feature Discovery's labels",
            true
        )]
    );
}

#[test]
fn a_stage_with_nothing_to_show_is_refused_not_passed() {
    let mut core = ClaimAllocator::default();
    core.handle(
        Input::Fact(&ev(Kind::BackendConfigured(guide_backend().to_event()))),
        0,
    );
    core.handle(Input::Fact(&mk_gfd_node("gpu-1", &[(DP, "true")], 2)), 0);
    let decided = check(&mut core, Stage::PilotPool);
    let Some(Kind::MigrationRefused(r)) = &decided[0].kind else {
        panic!("{decided:?}")
    };
    assert_eq!(
        r.reason,
        "stage pilot-pool: no node is served by DRA: no evidence to check"
    );
    let decided = check(&mut core, Stage::CompatibilityBridge);
    assert!(
        matches!(&decided[0].kind, Some(Kind::MigrationRefused(r)) if r.reason.starts_with("stage compatibility-bridge: no workload asking for nvidia.com/gpu may run on a DRA node")),
        "{decided:?}"
    );
}

#[test]
fn the_native_claim_pilot_needs_its_claim_bound_on_the_pods_node() {
    let mut core = migrating();
    let pod = mk_app_pod(
        "apps",
        "cuda-check",
        "cuda-check",
        "gpu-2",
        PodPhase::Running,
        (1, 1),
    );
    core.handle(Input::Fact(&pod), 0);
    // No claim reserved for it yet: not bound.
    assert_eq!(
        items(&check(&mut core, Stage::NativeClaimPilot)),
        [s(
            "Deployment/cuda-check",
            "bound claim, correct node",
            false
        )]
    );
    let claim = ev(Kind::ResourceClaimObserved(ResourceClaimObserved {
        namespace: "apps".into(),
        name: "cuda-check-gpu".into(),
        device_classes: vec!["h100.gpu.deckhouse.io".into()],
        node: "gpu-2".into(),
        allocated: vec![AllocatedDevice {
            request: "gpu".into(),
            driver: "gpu.nvidia.com".into(),
            pool: "gpu-2".into(),
            device: "gpu-0".into(),
        }],
        reserved_for: vec!["cuda-check".into()],
        owner_pod: "cuda-check".into(),
    }));
    core.handle(Input::Fact(&claim), 0);
    let decided = check(&mut core, Stage::NativeClaimPilot);
    assert_eq!(
        items(&decided),
        [s(
            "Deployment/cuda-check",
            "bound claim, correct node",
            true
        )]
    );
    assert_eq!(
        records(&decided)[0].items[0].detail,
        "apps/cuda-check on gpu-2: apps/cuda-check-gpu (gpu.nvidia.com/gpu-2/gpu-0)"
    );
}

#[test]
fn the_bridge_needs_one_unchanged_manifest_on_both_pools_and_dra_serving_the_dra_one() {
    let mut core = migrating();
    // The bridge test: unchanged resources, tolerating the pilot taint, in
    // no pool. Beside it a legacy workload pinned to its pool: not a test.
    let mut bridge_test = mk_placement(&[("nvidia.com/gpu", "1")], &[]);
    bridge_test.tolerations = Some(Tolerations {
        items: vec![Toleration {
            key: "gpu-scheduling.platform.example.com/mode".into(),
            operator: "Equal".into(),
            value: "dra".into(),
            effect: "NoSchedule".into(),
            toleration_seconds: None,
        }],
    });
    core.handle(
        Input::Fact(&mk_workload("apps", "web", 2, bridge_test.clone())),
        0,
    );
    let mut pinned = bridge_test;
    pinned.node_selector.insert(
        "gpu-scheduling.platform.example.com/pool".into(),
        "legacy".into(),
    );
    core.handle(Input::Fact(&mk_workload("apps", "db", 1, pinned)), 0);
    core.handle(Input::Fact(&legacy_pod("db-a", "db", "gpu-1", 1, false)), 0);
    let decided = check(&mut core, Stage::CompatibilityBridge);
    assert!(
        matches!(&decided[0].kind, Some(Kind::MigrationRefused(_))),
        "a pinned workload is no bridge test: {decided:?}"
    );
    core.handle(
        Input::Fact(&legacy_pod("web-a", "web", "gpu-1", 1, false)),
        0,
    );
    // Only on the legacy pool so far.
    let decided = check(&mut core, Stage::CompatibilityBridge);
    assert_eq!(
        items(&decided),
        [s(
            "Deployment/web",
            "expected placement and implicit DRA allocation",
            false
        )]
    );
    assert_eq!(
        records(&decided)[0].items[0].detail,
        "no pod runs on the DRA pool"
    );
    // A pod on the DRA node served by the bridge: shown.
    core.handle(
        Input::Fact(&legacy_pod("web-b", "web", "gpu-2", 1, true)),
        0,
    );
    let decided = check(&mut core, Stage::CompatibilityBridge);
    assert_eq!(
        records(&decided)[0].items[0].detail,
        "device plugin: apps/web-a on gpu-1; DRA through nvidia.com/gpu's class: apps/web-b on gpu-2"
    );
    assert!(records(&decided)[0].passed);
    // The bridged pod is no dual advertisement on the DRA node.
    assert_eq!(
        items(&check(&mut core, Stage::PilotPool))[0],
        s("gpu-2", "no dual advertisement", true)
    );
    // Final cutover: the device plugin is still on gpu-1, and the manifest
    // still asks for nvidia.com/gpu.
    assert_eq!(
        items(&check(&mut core, Stage::FinalCutover)),
        [
            s("gpu-1", "no device-plugin pods or resources", false),
            s("gpu-2", "no device-plugin pods or resources", true),
            s("Deployment/db", "no legacy workload", false),
            s("Deployment/web", "no legacy workload", false),
        ]
    );
    // The baseline register: what each node offers, where the manifests run.
    assert_eq!(
        items(&check(&mut core, Stage::Baseline)),
        [
            s("gpu-1", "node capacity", true),
            s("gpu-2", "node capacity", true),
            s("Deployment/db", "device-plugin scheduling", true),
            s("Deployment/web", "device-plugin scheduling", true),
        ]
    );
}

// ---------------------------------------------------------------- application waves

/// gpu-3 handed over to the pilot pool as the guide leaves it: the device
/// plugin and the validator off, the kubelet plugin's label and pod, the
/// ownership label, the pilot taint, its slice.
fn ready_pilot_node(core: &mut ClaimAllocator) {
    let mut node = mk_gfd_node(
        "gpu-3",
        &[
            (DP, "false"),
            ("nvidia.com/gpu.deploy.operator-validator", "false"),
            (PLUGIN, "true"),
            ("gpu-scheduling.platform.example.com/mode", "dra"),
            ("gpu-scheduling.platform.example.com/pool", "dra-pilot"),
        ],
        0,
    );
    if let Some(Kind::NodeObserved(n)) = &mut node.kind {
        n.taints = vec![pilot_taint()];
    }
    for fact in [
        node,
        mk_daemon_pod(
            "nvidia-dra-driver-gpu",
            "dra-driver-nvidia-gpu-kubelet-plugin-c",
            "gpu-3",
            &[("dra-driver-nvidia-gpu-component", "kubelet-plugin")],
        ),
        mk_h100_slice("gpu-3"),
        mk_class("h100"),
    ] {
        core.handle(Input::Fact(&fact), 0);
    }
}

fn pilot_taint() -> switchyard_proto::v1::Taint {
    switchyard_proto::v1::Taint {
        key: "gpu-scheduling.platform.example.com/mode".into(),
        value: "dra".into(),
        effect: "NoSchedule".into(),
    }
}

#[test]
fn a_move_to_the_dra_pool_tolerates_the_pilot_taint_and_keeps_the_tolerations_before_it_for_the_rollback()
 {
    use switchyard_core::command::MoveApplication;
    use switchyard_proto::v1::{Toleration, Tolerations, WorkloadRef};
    let mut core = migrating();
    let mut placement = mk_placement(
        &[("nvidia.com/gpu", "1")],
        &[("gpu-scheduling.platform.example.com/pool", "legacy")],
    );
    // As inventory records it: every toleration, here one of its own.
    let own = Toleration {
        key: "dedicated".into(),
        operator: "Exists".into(),
        ..Toleration::default()
    };
    placement.tolerations = Some(Tolerations {
        items: vec![own.clone()],
    });
    core.handle(
        Input::Fact(&mk_workload("apps", "web", 1, placement.clone())),
        0,
    );
    let web = WorkloadRef {
        namespace: "apps".into(),
        kind: "Deployment".into(),
        name: "web".into(),
    };
    let cmd = MoveApplication {
        move_id: "m1".into(),
        workload: web,
        target_group: String::new(),
        gpu_class: "h100".into(),
        allow_managed: false,
    };
    // No node of the DRA pool ready yet (gpu-2 is in no pool).
    core.handle(Input::Fact(&mk_class("h100")), 0);
    let decided = core.handle(Input::MoveApplication(&cmd), 0);
    assert!(
        matches!(&decided[0].kind, Some(Kind::ApplicationMoveRefused(r)) if r.reason.starts_with("no node of a pool configured dra is ready")),
        "{decided:?}"
    );
    ready_pilot_node(&mut core);
    let decided = core.handle(Input::MoveApplication(&cmd), 0);
    let Some(Kind::ApplicationMoveStarted(started)) = &decided[0].kind else {
        panic!("{decided:?}")
    };
    assert_eq!(
        (started.source_group.as_str(), started.target_group.as_str()),
        ("legacy", "dra-pilot")
    );
    let Some(Kind::WorkloadRewritten(rewritten)) = &decided[1].kind else {
        panic!("{decided:?}")
    };
    let after = rewritten.after.as_ref().unwrap();
    assert!(after.node_selector.is_empty(), "the pool binding goes");
    assert_eq!(
        after.container_limits["main"].quantities,
        BTreeMap::from([("gpu.deckhouse.io/h100".to_string(), "1".to_string())])
    );
    assert_eq!(
        after.tolerations.as_ref().unwrap().items,
        [
            own,
            Toleration {
                key: "gpu-scheduling.platform.example.com/mode".into(),
                operator: "Equal".into(),
                value: "dra".into(),
                effect: "NoSchedule".into(),
                toleration_seconds: None,
            }
        ]
    );
    // The before-image is what the rollback writes back: tolerations as they were.
    assert_eq!(rewritten.before.as_ref(), Some(&placement));
}

//! The "Common mistakes" table of the reference, reproduced on the simulated
//! cluster through the services: each observation appears for its cause, and
//! Switchyard says why. (The last row — a card hidden by NVIDIA_VISIBLE_DEVICES
//! — happens inside a container, which the simulator does not model.)

use switchyard_core::effects::Effect;
use switchyard_proto::v1::{PodPhase, ResourceList, WorkloadPlacement, WorkloadRef};
use switchyard_runtime::Local;
use switchyard_scenario::Migration;
use switchyard_sim::SimConfig;

async fn cluster(upgraded_with_dra: bool, enable_dra: bool) -> Migration<Local> {
    let config = SimConfig {
        seed: 5,
        gpu_nodes: 3,
        gpus_per_node: 4,
        workloads: 3,
        upgraded_with_dra,
        ..SimConfig::default()
    };
    let mut m = Migration::new(config, Local::default(), ()).await;
    m.sim.set_group("gpu-dra", None);
    if enable_dra {
        m.sim.set_dra_enabled(true);
    }
    m.sim.create_gpu_class("a100");
    m.pump().await;
    m
}

fn limits(resource: &str, count: &str, selector: Option<&str>) -> WorkloadPlacement {
    WorkloadPlacement {
        container_limits: [(
            "main".to_string(),
            ResourceList {
                quantities: [(resource.to_string(), count.to_string())].into(),
            },
        )]
        .into(),
        container_requests: Default::default(),
        node_selector: selector
            .map(|g| [("node.deckhouse.io/group".to_string(), g.to_string())].into())
            .unwrap_or_default(),
        tolerations: None,
    }
}

#[tokio::test]
async fn no_stack_manages_the_node_without_spec_gpu_and_dra_off() {
    let mut m = cluster(false, false).await;
    let err = m
        .hand_over("gpu-0", "gpu-dra")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("no stack would manage node gpu-0") && err.contains("sit idle"),
        "{err}"
    );
    let states = m.states().await;
    assert_eq!(
        states.stack.assignments()["gpu-0"].stack,
        switchyard_proto::v1::Stack::DevicePlugin,
        "nothing moved"
    );
}

#[tokio::test]
async fn held_on_dra_is_firing_after_an_upgrade_with_dra_on() {
    let mut m = cluster(true, false).await;
    let states = m.states().await;
    assert!(states.stack.held().contains("gpu-legacy"));
    let firing: Vec<_> = states
        .alerter
        .firing()
        .keys()
        .map(|(name, labels)| (name.clone(), labels["node_group"].clone()))
        .collect();
    assert_eq!(
        firing,
        [(
            "D8GpuNodeGroupHeldOnDra".to_string(),
            "gpu-legacy".to_string()
        )]
    );
}

#[tokio::test]
async fn the_pod_stays_on_the_old_nodes_while_the_manifest_keeps_nvidia_gpu() {
    let mut m = cluster(false, true).await;
    m.hand_over("gpu-0", "gpu-dra").await.expect("handover");
    let workload = m.sim.workloads()[0].clone();
    // The binding removed by hand, but the nvidia.com/gpu request kept.
    m.sim.execute(&Effect::SetPlacement {
        workload: workload.clone(),
        placement: limits("nvidia.com/gpu", "1", None),
    });
    m.sim.execute(&Effect::RestartWorkload {
        workload: workload.clone(),
        restarted_at: "by-hand".into(),
    });
    m.pump().await;
    let pods = m.sim.workload_pods(&workload);
    assert!(!pods.is_empty());
    for (node, phase) in pods {
        assert_eq!(phase, PodPhase::Running);
        assert_eq!(
            m.sim.group_of(&node),
            Some("gpu"),
            "nvidia.com/gpu only exists on device-plugin nodes"
        );
    }
}

#[tokio::test]
async fn the_pod_is_pending_until_the_target_group_has_free_devices() {
    let mut m = cluster(false, true).await;
    m.hand_over("gpu-0", "gpu-dra").await.expect("handover");
    let big = WorkloadRef {
        namespace: "ml".into(),
        kind: "Deployment".into(),
        name: "big".into(),
    };
    // More GPUs than the one DRA node has.
    let before = limits("nvidia.com/gpu", "3", Some("gpu"));
    m.sim.add_workload(&big, 2, before);
    m.pump().await;
    let err = m
        .move_application(&big, "gpu-dra", "a100")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("pods pending"), "{err}");
    assert!(
        m.sim
            .workload_pods(&big)
            .iter()
            .any(|(_, phase)| *phase == PodPhase::Pending)
    );
    // "Hand over the next node": the move completes on its own.
    m.hand_over("gpu-1", "gpu-dra")
        .await
        .expect("second handover");
    let states = m.states().await;
    assert!(
        states
            .claims
            .moves()
            .verified
            .keys()
            .any(|(_, _, name)| name == "big"),
        "verified once devices are free"
    );
}

#[tokio::test]
async fn no_resource_claim_without_the_right_class_name() {
    let mut m = cluster(false, true).await;
    m.hand_over("gpu-0", "gpu-dra").await.expect("handover");
    let workload = m.sim.workloads()[0].clone();
    let err = m
        .move_application(&workload, "gpu-dra", "a10O")
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("GPU class a10O does not exist") && err.contains("gpuclass"),
        "{err}"
    );
}

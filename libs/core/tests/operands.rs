//! The nvidia-operator backend writes a node's stack as the NVIDIA guide
//! does by hand, each step once the cluster shows the one before done:
//! given the facts, when the stack-assigner has decided, then the effects it
//! wants now.

mod support;

use std::collections::BTreeMap;

use support::*;
use switchyard_core::backend::operands;
use switchyard_core::backend::{Backend, NvidiaOperator};
use switchyard_core::effects::Effect;
use switchyard_core::stack_assigner::StackAssigner;
use switchyard_proto::v1::{
    DomainEvent, NodeObserved, ResourceSliceObserved, Stack, Taint, domain_event::Kind,
};

const POOL: &str = "gpu-scheduling.platform.example.com/pool";
const MODE: &str = "gpu-scheduling.platform.example.com/mode";
const DP: &str = "nvidia.com/gpu.deploy.device-plugin";
const VALIDATOR: &str = "nvidia.com/gpu.deploy.operator-validator";
const PLUGIN: &str = "nvidia.com/dra-kubelet-plugin";

fn backend() -> NvidiaOperator {
    NvidiaOperator {
        pools: BTreeMap::from([
            ("legacy".to_string(), Stack::DevicePlugin),
            ("dra-pilot".to_string(), Stack::Dra),
        ]),
        ..NvidiaOperator::default()
    }
}

/// A GPU node in `pool` with these labels besides, device-plugin GPUs
/// allocatable, tainted or not with the pilot taint.
fn node(pool: &str, labels: &[(&str, &str)], allocatable: u32, tainted: bool) -> DomainEvent {
    let mut all: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    all.insert("nvidia.com/gpu.present".into(), "true".into());
    all.insert(POOL.into(), pool.into());
    ev(Kind::NodeObserved(NodeObserved {
        node: "gpu-1".into(),
        labels: all,
        gpu_count: 8,
        gpu_allocatable: if allocatable > 0 {
            BTreeMap::from([("nvidia.com/gpu".to_string(), allocatable)])
        } else {
            BTreeMap::new()
        },
        taints: if tainted {
            vec![operands::pilot_taint(&backend())]
        } else {
            Vec::new()
        },
        ..Default::default()
    }))
}

fn device_plugin_pod() -> DomainEvent {
    mk_daemon_pod(
        "gpu-operator",
        "nvidia-device-plugin-daemonset-x1",
        "gpu-1",
        &[("app", "nvidia-device-plugin-daemonset")],
    )
}

fn kubelet_plugin_pod() -> DomainEvent {
    mk_daemon_pod(
        "nvidia-dra-driver-gpu",
        "dra-driver-nvidia-gpu-kubelet-plugin-x1",
        "gpu-1",
        &[("dra-driver-nvidia-gpu-component", "kubelet-plugin")],
    )
}

fn slice() -> DomainEvent {
    ev(Kind::ResourceSliceObserved(ResourceSliceObserved {
        name: "gpu-1-gpu.nvidia.com-x".into(),
        driver: "gpu.nvidia.com".into(),
        node: "gpu-1".into(),
        pool: "gpu-1".into(),
        devices: 8,
        ..Default::default()
    }))
}

/// The stack-assigner on the backend, having folded `facts`: the effects
/// it wants for the node now.
fn wanted(facts: &[DomainEvent]) -> (StackAssigner, Vec<Effect>) {
    let mut core =
        StackAssigner::default().on_backend(Backend::NvidiaOperator(Box::new(backend())));
    core.catch_up(0);
    core.handle_fact(&mk_settings(false, true, ""), 0);
    for fact in facts {
        core.handle_fact(fact, 0);
    }
    let effects = core.effects();
    (core, effects)
}

fn labels(pairs: &[(&str, Option<&str>)]) -> Effect {
    Effect::SetOperandLabels {
        node: "gpu-1".into(),
        labels: pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.map(str::to_string)))
            .collect(),
        unless_paused: true,
    }
}

fn taint(present: bool) -> Effect {
    Effect::SetNodeTaint {
        node: "gpu-1".into(),
        taint: Taint {
            key: MODE.into(),
            value: "dra".into(),
            effect: "NoSchedule".into(),
        },
        present,
    }
}

#[test]
fn to_dra_the_device_plugin_goes_first_and_the_kubelet_plugin_only_once_it_is_gone() {
    // Given a node of the DRA pool still as the operator deployed it.
    let (_, effects) = wanted(&[
        node("dra-pilot", &[(DP, "true"), (VALIDATOR, "true")], 8, false),
        device_plugin_pod(),
    ]);
    // Then: the pilot taint, the device plugin and validator off, the
    // ownership label — and not yet the kubelet plugin's.
    assert_eq!(
        effects,
        vec![
            taint(true),
            labels(&[
                (MODE, Some("dra")),
                (DP, Some("false")),
                (VALIDATOR, Some("false"))
            ]),
        ]
    );

    // When the labels are written but the device plugin still runs there.
    let written = [(DP, "false"), (VALIDATOR, "false"), (MODE, "dra")];
    let (core, effects) = wanted(&[node("dra-pilot", &written, 8, true), device_plugin_pod()]);
    assert_eq!(effects, vec![], "waits for the device plugin to go");
    let waiting = operands::waiting_for(
        "gpu-1",
        Stack::Dra,
        &core.cluster().nodes["gpu-1"],
        core.cluster(),
        &backend(),
    )
    .expect("waiting");
    assert!(
        waiting.contains(
            "the device plugin is still deployed there (1 pod(s), 8 GPU resource(s) allocatable)"
        ),
        "{waiting}"
    );

    // Its pod gone but its GPUs still allocatable (kubelet keeps them a
    // while): still waiting.
    let (_, effects) = wanted(&[node("dra-pilot", &written, 8, true)]);
    assert_eq!(effects, vec![]);

    // Both gone: the kubelet plugin's label.
    let (_, effects) = wanted(&[node("dra-pilot", &written, 0, true)]);
    assert_eq!(effects, vec![labels(&[(PLUGIN, Some("true"))])]);

    // All written: nothing more.
    let mut done = written.to_vec();
    done.push((PLUGIN, "true"));
    let (_, effects) = wanted(&[node("dra-pilot", &done, 0, true)]);
    assert_eq!(effects, vec![]);
}

#[test]
fn to_the_device_plugin_dra_goes_first_its_claims_and_slices_then_the_device_plugin_then_the_taint()
{
    let on_dra = [
        (DP, "false"),
        (VALIDATOR, "false"),
        (MODE, "dra"),
        (PLUGIN, "true"),
    ];
    // Given a DRA node whose pool now says device plugin.
    let (_, effects) = wanted(&[
        node("legacy", &on_dra, 0, true),
        kubelet_plugin_pod(),
        slice(),
    ]);
    assert_eq!(
        effects,
        vec![labels(&[(MODE, Some("legacy")), (PLUGIN, None)])]
    );

    // The label is gone but the plugin's pod and slice are still there.
    let dra_off = [(DP, "false"), (VALIDATOR, "false"), (MODE, "legacy")];
    let (_, effects) = wanted(&[
        node("legacy", &dra_off, 0, true),
        kubelet_plugin_pod(),
        slice(),
    ]);
    assert_eq!(
        effects,
        vec![],
        "waits for the kubelet plugin and its slices"
    );
    let (_, effects) = wanted(&[node("legacy", &dra_off, 0, true), slice()]);
    assert_eq!(effects, vec![], "waits for the slices");

    // DRA gone: the device plugin and the validator on.
    let (_, effects) = wanted(&[node("legacy", &dra_off, 0, true)]);
    assert_eq!(
        effects,
        vec![labels(&[(DP, Some("true")), (VALIDATOR, Some("true"))])]
    );

    // Then the pilot taint goes, once the device plugin serves the node
    // again: its pod running and its GPUs allocatable.
    let legacy = [(DP, "true"), (VALIDATOR, "true"), (MODE, "legacy")];
    let (_, effects) = wanted(&[node("legacy", &legacy, 0, true), device_plugin_pod()]);
    assert_eq!(effects, vec![], "no GPU allocatable yet");
    let (_, effects) = wanted(&[node("legacy", &legacy, 8, true)]);
    assert_eq!(effects, vec![], "no device-plugin pod yet");
    let (_, effects) = wanted(&[node("legacy", &legacy, 8, true), device_plugin_pod()]);
    assert_eq!(effects, vec![taint(false)]);
    let (_, effects) = wanted(&[node("legacy", &legacy, 8, false)]);
    assert_eq!(effects, vec![]);
}

#[test]
fn never_the_device_plugin_while_a_claim_is_allocated_on_the_node() {
    let dra_off = [(DP, "false"), (VALIDATOR, "false"), (MODE, "legacy")];
    let (_, effects) = wanted(&[
        node("legacy", &dra_off, 0, true),
        mk_claim("team-a", "train", "gpu-1"),
    ]);
    assert!(
        !effects.iter().any(
            |e| matches!(e, Effect::SetOperandLabels { labels, .. } if labels.contains_key(DP))
        ),
        "{effects:?}"
    );
}

#[test]
fn nothing_is_written_while_the_driver_manager_has_paused_the_operands() {
    let paused = [
        (DP, "paused-for-driver-upgrade"),
        (VALIDATOR, "paused-for-driver-upgrade"),
    ];
    let (core, effects) = wanted(&[node("dra-pilot", &paused, 0, true)]);
    assert_eq!(effects, vec![], "{effects:?}");
    let waiting = operands::waiting_for(
        "gpu-1",
        Stack::Dra,
        &core.cluster().nodes["gpu-1"],
        core.cluster(),
        &backend(),
    )
    .unwrap();
    assert!(waiting.contains("paused"), "{waiting}");
    // A paused `true` on a device-plugin node reads as on: nothing to write.
    let (_, effects) = wanted(&[node(
        "legacy",
        &[(MODE, "legacy"), paused[0], paused[1]],
        8,
        false,
    )]);
    assert_eq!(effects, vec![]);
}

#[test]
fn a_node_in_no_pool_and_one_without_gpus_lose_only_switchyards_labels() {
    // Missing deploy labels read as on (the operator adds them): only the
    // ownership label is written for the operator's default.
    let (_, effects) = wanted(&[node("unlisted", &[], 8, false)]);
    assert_eq!(effects, vec![labels(&[(MODE, Some("legacy"))])]);
    // No gpu.present: the plugin and ownership labels go, the rest stays.
    let mut gone = mk_node_labels(
        "gpu-1",
        None,
        &[(MODE, "dra"), (PLUGIN, "true"), (DP, "false")],
    );
    if let Some(Kind::NodeObserved(n)) = &mut gone.kind {
        n.labels.insert(POOL.into(), "dra-pilot".into());
    }
    let (_, effects) = wanted(&[gone]);
    assert_eq!(effects, vec![labels(&[(MODE, None), (PLUGIN, None)])]);
}

// ------------------------------------------- exit evidence on this backend

use switchyard_core::claim_allocator::evidence::{
    NO_DUAL_ADVERTISEMENT, PLUGIN_HEALTHY, SLICES_MATCH_GFD, node_evidence,
};
use switchyard_proto::v1::SliceDevice;

/// The node's slice as the NVIDIA driver publishes H100s: `n` devices,
/// productName with spaces, memory.
fn h100_slice(n: u32, memory_mib: u64) -> DomainEvent {
    ev(Kind::ResourceSliceObserved(ResourceSliceObserved {
        name: "gpu-1-gpu.nvidia.com-x".into(),
        driver: "gpu.nvidia.com".into(),
        node: "gpu-1".into(),
        pool: "gpu-1".into(),
        devices: n,
        device_list: (0..n)
            .map(|minor| SliceDevice {
                name: format!("gpu-{minor}"),
                r#type: "gpu".into(),
                uuid: format!("GPU-{minor}"),
                product: "NVIDIA H100 80GB HBM3".into(),
                memory_mib,
            })
            .collect(),
    }))
}

const GFD: [(&str, &str); 3] = [
    ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),
    ("nvidia.com/gpu.count", "8"),
    ("nvidia.com/gpu.memory", "81559"),
];

fn dra_node_labels() -> Vec<(&'static str, &'static str)> {
    let mut labels = vec![
        (DP, "false"),
        (VALIDATOR, "false"),
        (MODE, "dra"),
        (PLUGIN, "true"),
    ];
    labels.extend(GFD);
    labels
}

fn evidence(facts: &[DomainEvent]) -> Vec<(String, bool, String)> {
    let (core, _) = wanted(facts);
    node_evidence(core.cluster(), "gpu-1")
        .into_iter()
        .map(|i| (i.check, i.passed, i.detail))
        .collect()
}

#[test]
fn a_dra_node_passes_on_the_drivers_slices_against_gpu_feature_discoverys_labels() {
    let items = evidence(&[
        node("dra-pilot", &dra_node_labels(), 0, true),
        kubelet_plugin_pod(),
        h100_slice(8, 81559),
    ]);
    assert_eq!(
        items
            .iter()
            .map(|(c, p, _)| (c.as_str(), *p))
            .collect::<Vec<_>>(),
        vec![
            (NO_DUAL_ADVERTISEMENT, true),
            (PLUGIN_HEALTHY, true),
            (SLICES_MATCH_GFD, true)
        ],
        "{items:#?}"
    );
    assert_eq!(
        items[2].2,
        "8 GPUs published as GPU Feature Discovery labelled them (NVIDIA-H100-80GB-HBM3, 81559 MiB)"
    );
}

#[test]
fn a_dra_node_fails_on_a_missing_card_other_memory_no_plugin_or_the_device_plugin_back() {
    // Seven cards published of eight, another memory size, no plugin pod.
    let items = evidence(&[
        node("dra-pilot", &dra_node_labels(), 0, true),
        h100_slice(7, 40960),
    ]);
    let failed: Vec<(&str, &str)> = items
        .iter()
        .filter(|(_, passed, _)| !passed)
        .map(|(c, _, d)| (c.as_str(), d.as_str()))
        .collect();
    assert_eq!(failed.len(), 2, "{items:#?}");
    assert_eq!(
        failed[0],
        (
            PLUGIN_HEALTHY,
            "no DRA kubelet-plugin pod (dra-driver-nvidia-gpu-component=kubelet-plugin) is running on the node"
        )
    );
    assert!(
        failed[1].1.starts_with("7 GPUs published by gpu.nvidia.com, 8 labelled nvidia.com/gpu.count; gpu-0: memory 40960 MiB in the slice, 81559 MiB labelled nvidia.com/gpu.memory"),
        "{}",
        failed[1].1
    );
    // The device plugin's pod back on the DRA node, its GPUs allocatable.
    let items = evidence(&[
        node("dra-pilot", &dra_node_labels(), 0, true),
        kubelet_plugin_pod(),
        device_plugin_pod(),
        h100_slice(8, 81559),
    ]);
    assert_eq!(
        (items[0].0.as_str(), items[0].1, items[0].2.as_str()),
        (
            NO_DUAL_ADVERTISEMENT,
            false,
            "the device plugin runs on this DRA node: gpu-operator/nvidia-device-plugin-daemonset-x1"
        )
    );
    let items = evidence(&[
        node("dra-pilot", &dra_node_labels(), 8, true),
        kubelet_plugin_pod(),
        h100_slice(8, 81559),
    ]);
    assert!(
        !items[0].1 && items[0].2.contains("both allocators advertise the node"),
        "{items:#?}"
    );
}

#[test]
fn a_gate_lost_again_before_its_uncordon_took_keeps_the_cordon_switchyards() {
    let cordoned = |mut fact: DomainEvent| {
        if let Some(Kind::NodeObserved(n)) = &mut fact.kind {
            n.unschedulable = true;
        }
        fact
    };
    let mut labels = dra_node_labels();
    labels[0] = (DP, "true");
    let lost = node("dra-pilot", &labels, 0, true);
    let healed = cordoned(node("dra-pilot", &dra_node_labels(), 0, true));
    // Lost while schedulable: Switchyard cordons it.
    let (core, _) = wanted(std::slice::from_ref(&lost));
    assert!(core.exclusivity_lost()["gpu-1"].0);
    // Healed while still cordoned: its uncordon is due.
    let (core, effects) = wanted(&[lost.clone(), healed.clone()]);
    assert!(core.exclusivity_lost().is_empty());
    assert!(
        effects.contains(&Effect::Uncordon {
            node: "gpu-1".into()
        }),
        "{effects:?}"
    );
    // Lost again before the node read schedulable: still Switchyard's
    // cordon, and no uncordon while the gate fails.
    let again = cordoned(node("dra-pilot", &dra_node_labels(), 8, true));
    let (core, effects) = wanted(&[lost, healed, again]);
    assert!(
        core.exclusivity_lost()["gpu-1"].0,
        "{:?}",
        core.exclusivity_lost()
    );
    assert!(
        !effects.iter().any(|e| matches!(e, Effect::Uncordon { .. })),
        "{effects:?}"
    );
    // Healed for good: uncordoned.
    let (_, effects) = wanted(&[
        node("dra-pilot", &labels, 0, true),
        cordoned(node("dra-pilot", &dra_node_labels(), 0, true)),
        cordoned(node("dra-pilot", &dra_node_labels(), 8, true)),
        cordoned(node("dra-pilot", &dra_node_labels(), 0, true)),
    ]);
    assert!(
        effects.contains(&Effect::Uncordon {
            node: "gpu-1".into()
        }),
        "{effects:?}"
    );
}

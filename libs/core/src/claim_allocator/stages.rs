//! The NVIDIA guide's stage table ("Migrate Workloads in Stages") as
//! evidence: each stage's "Exit evidence" column, checked on the facts as
//! they are when asked and recorded like the exit evidence of nodes and
//! moves (`EvidenceRecorded`, `EvidenceChecked`, each naming the stage).
//!
//! | stage | subjects | items |
//! |---|---|---|
//! | baseline | GPU nodes; workloads asking for `nvidia.com/gpu` | node capacity; device-plugin scheduling |
//! | pilot-pool | nodes DRA serves | no dual advertisement, DRA plug-in healthy |
//! | driver-validation | nodes DRA serves | slices matching the cards (product, memory, UUID, node) |
//! | native-claim-pilot | pods with their own claims on those nodes | bound claim, correct node |
//! | compatibility-bridge | workloads asking for `nvidia.com/gpu` | expected placement and implicit DRA allocation, on both pools |
//! | application-wave | verified moves | the moves' evidence |
//! | final-cutover | GPU nodes; workloads asking for `nvidia.com/gpu` | no device-plugin pods or resources; no legacy workloads |
//!
//! A stage with no subject is refused, not passed: evidence is never a
//! count that can be zero.

use crate::backend::dispatch::strategy;
use std::collections::BTreeMap;

use switchyard_proto::v1::{
    DomainEvent, EvidenceChecked, EvidenceItem, EvidenceRecorded, PodPhase, WorkloadRef,
    domain_event::Kind, event,
};

use super::evidence::{self, Moved};
use super::node_gates::{
    NO_DUAL_ADVERTISEMENT, PLUGIN_HEALTHY, SLICES_MATCH, SLICES_MATCH_GFD, item,
};
use crate::backend::nvidia;
use crate::cluster::{Cluster, ObjectKey, Pod};
use crate::names::{GPU_STACK_LABEL, NVIDIA_GPU};

/// A stage of the guide's table (its NIM and scale rows are application
/// waves as far as the evidence goes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Stage {
    Baseline,
    PilotPool,
    DriverValidation,
    NativeClaimPilot,
    CompatibilityBridge,
    ApplicationWave,
    FinalCutover,
}

impl Stage {
    pub const ALL: [Stage; 7] = [
        Stage::Baseline,
        Stage::PilotPool,
        Stage::DriverValidation,
        Stage::NativeClaimPilot,
        Stage::CompatibilityBridge,
        Stage::ApplicationWave,
        Stage::FinalCutover,
    ];

    /// As the CLI and the log name it.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Baseline => "baseline",
            Stage::PilotPool => "pilot-pool",
            Stage::DriverValidation => "driver-validation",
            Stage::NativeClaimPilot => "native-claim-pilot",
            Stage::CompatibilityBridge => "compatibility-bridge",
            Stage::ApplicationWave => "application-wave",
            Stage::FinalCutover => "final-cutover",
        }
    }

    pub fn parse(name: &str) -> Result<Stage, String> {
        Stage::ALL
            .into_iter()
            .find(|s| s.name() == name)
            .ok_or_else(|| {
                format!(
                    "stage {name:?} is not a stage of the guide's table; expected one of {}",
                    Stage::ALL.map(Stage::name).join(", ")
                )
            })
    }
}

pub const NODE_CAPACITY: &str = "node capacity";
pub const DEVICE_PLUGIN_SCHEDULING: &str = "device-plugin scheduling";
pub const BOUND_CLAIM: &str = "bound claim, correct node";
pub const BRIDGE_PLACEMENT: &str = "expected placement and implicit DRA allocation";
pub const NO_DEVICE_PLUGIN: &str = "no device-plugin pods or resources";
pub const NO_LEGACY_WORKLOAD: &str = "no legacy workload";

/// One subject's evidence: a node's, or a workload's.
type Subject = (String, Option<WorkloadRef>, Vec<EvidenceItem>);

/// Whether DRA serves `node`: on `nvidia-operator` its kubelet plugin's
/// label is on, on `deckhouse` its gpu-stack label says `dra`.
pub fn serves_dra(cluster: &Cluster, node: &str) -> bool {
    let Some(facts) = cluster.nodes.get(node) else {
        return false;
    };
    strategy(&cluster.backend).serves_dra(facts)
}

/// The pods asking for device-plugin GPU resources (served by the device
/// plugin or through the bridge), by the workload that owns them (a pod
/// no controller owns is its own).
fn legacy_pods(cluster: &Cluster) -> BTreeMap<WorkloadRef, Vec<(&ObjectKey, &Pod)>> {
    let mut by_owner: BTreeMap<WorkloadRef, Vec<(&ObjectKey, &Pod)>> = BTreeMap::new();
    for (key, pod) in &cluster.pods {
        if pod.device_plugin_gpus + pod.bridged_gpus == 0
            || matches!(pod.phase, PodPhase::Succeeded | PodPhase::Failed)
        {
            continue;
        }
        let owner = pod.owner(&key.0).unwrap_or_else(|| WorkloadRef {
            namespace: key.0.clone(),
            kind: "Pod".into(),
            name: key.1.clone(),
        });
        by_owner.entry(owner).or_default().push((key, pod));
    }
    by_owner
}

fn pod_name(key: &ObjectKey) -> String {
    format!("{}/{}", key.0, key.1)
}

/// The node items of `node_evidence` that `stage` names.
fn node_items(cluster: &Cluster, node: &str, checks: &[&str]) -> Vec<EvidenceItem> {
    evidence::node_evidence(cluster, node)
        .into_iter()
        .filter(|i| checks.contains(&i.check.as_str()))
        .collect()
}

/// Baseline: what the node offers now, by the device plugin or by DRA.
fn capacity(cluster: &Cluster, node: &str) -> EvidenceItem {
    let facts = &cluster.nodes[node];
    let gfd = match (
        facts.labels.get(nvidia::GFD_COUNT),
        facts.labels.get(nvidia::GFD_PRODUCT),
    ) {
        (Some(count), Some(product)) => format!(
            "; GPU Feature Discovery: {count} × {product}{}",
            facts
                .labels
                .get(nvidia::GFD_MEMORY_MIB)
                .map_or(String::new(), |m| format!(", {m} MiB"))
        ),
        _ => String::new(),
    };
    let published: usize = cluster
        .slices
        .values()
        .filter(|s| s.node == node && evidence::GPU_DRIVERS.contains(&s.driver.as_str()))
        .map(|s| s.devices.len())
        .sum();
    let allocatable = facts.device_plugin_allocatable;
    let result = if allocatable == 0 && published == 0 {
        Err(format!(
            "no GPU resource allocatable and no GPU device published{gfd}"
        ))
    } else {
        Ok(format!(
            "{allocatable} device-plugin GPU resource(s) allocatable, {published} device(s) published to DRA{gfd}"
        ))
    };
    item(NODE_CAPACITY, result)
}

/// Baseline: where a workload's pods run on device-plugin GPUs now.
fn scheduling(pods: &[(&ObjectKey, &Pod)]) -> EvidenceItem {
    let pending: Vec<String> = pods
        .iter()
        .filter(|(_, p)| p.node.is_empty() || p.phase != PodPhase::Running)
        .map(|(k, _)| pod_name(k))
        .collect();
    let placed: Vec<String> = pods
        .iter()
        .filter(|(_, p)| !p.node.is_empty() && p.phase == PodPhase::Running)
        .map(|(k, p)| {
            format!(
                "{} on {} ({} GPU)",
                pod_name(k),
                p.node,
                p.device_plugin_gpus + p.bridged_gpus
            )
        })
        .collect();
    item(
        DEVICE_PLUGIN_SCHEDULING,
        if pending.is_empty() {
            Ok(placed.join(", "))
        } else {
            Err(format!("not running: {}", pending.join(", ")))
        },
    )
}

/// Native claim pilot: the pod runs on a DRA node with each of its claims
/// allocated there and reserved for it.
fn bound_claim(cluster: &Cluster, key: &ObjectKey, pod: &Pod) -> EvidenceItem {
    let name = pod_name(key);
    let claims: Vec<(&ObjectKey, &crate::cluster::Claim)> = cluster
        .claims
        .iter()
        .filter(|((ns, _), c)| *ns == key.0 && c.reserved_for.contains(&key.1))
        .collect();
    let result = if pod.phase != PodPhase::Running {
        Err(format!("{name} is not running ({:?})", pod.phase))
    } else if pod.claims_allocated < pod.claims_needed || claims.is_empty() {
        Err(format!(
            "{name}: {} of {} claims allocated, {} reserved for it",
            pod.claims_allocated,
            pod.claims_needed,
            claims.len()
        ))
    } else if let Some((k, c)) = claims.iter().find(|(_, c)| *c.node != *pod.node) {
        Err(format!(
            "{name} runs on {}, its claim {} is allocated on {:?}",
            pod.node,
            pod_name(k),
            c.node
        ))
    } else {
        Ok(format!(
            "{name} on {}: {}",
            pod.node,
            claims
                .iter()
                .map(|(k, c)| format!("{} ({})", pod_name(k), c.devices.join(", ")))
                .collect::<Vec<_>>()
                .join("; ")
        ))
    };
    item(BOUND_CLAIM, result)
}

/// Whether the bridge test is meant for `w`: its pods may run on a DRA node.
/// Some run there already; or on the nvidia-operator backend its template is
/// not bound to a pool other than a DRA one and tolerates the pilot taint
/// where DRA nodes carry it. A legacy workload pinned to its pool, as most
/// are during the migration, is not a bridge test.
fn may_reach_dra(cluster: &Cluster, w: &WorkloadRef, pods: &[(&ObjectKey, &Pod)]) -> bool {
    if pods.iter().any(|(_, p)| serves_dra(cluster, &p.node)) {
        return true;
    }
    let key = (w.namespace.clone(), w.kind.clone(), w.name.clone());
    let placement = cluster.workloads.get(&key).map(|w| w.placement.get());
    strategy(&cluster.backend).placement_reaches_dra(placement.as_ref())
}

/// Compatibility bridge: one unchanged manifest placed on both pools —
/// served by the device plugin on a device-plugin node, through the
/// scheduler's extended-resource claim on a DRA node.
fn bridge(cluster: &Cluster, pods: &[(&ObjectKey, &Pod)]) -> EvidenceItem {
    let mut wrong = Vec::new();
    let (mut on_legacy, mut on_dra) = (Vec::new(), Vec::new());
    for (key, pod) in pods {
        let name = pod_name(key);
        if pod.node.is_empty() || pod.phase != PodPhase::Running {
            wrong.push(format!("{name} is not running"));
        } else if serves_dra(cluster, &pod.node) {
            if pod.bridged_gpus == 0 || pod.device_plugin_gpus > 0 {
                wrong.push(format!(
                    "{name} on DRA node {} is not served through the bridge ({} GPU(s) by the device plugin, {} by DRA)",
                    pod.node, pod.device_plugin_gpus, pod.bridged_gpus
                ));
            } else if pod.claims_allocated < pod.claims_needed {
                wrong.push(format!("{name}: its implicit claim is not allocated"));
            } else {
                on_dra.push(format!("{name} on {}", pod.node));
            }
        } else if pod.bridged_gpus > 0 {
            wrong.push(format!(
                "{name} on device-plugin node {} got an implicit DRA claim",
                pod.node
            ));
        } else {
            on_legacy.push(format!("{name} on {}", pod.node));
        }
    }
    if on_legacy.is_empty() {
        wrong.push("no pod runs on the device-plugin pool".into());
    }
    if on_dra.is_empty() {
        wrong.push("no pod runs on the DRA pool".into());
    }
    item(
        BRIDGE_PLACEMENT,
        if wrong.is_empty() {
            Ok(format!(
                "device plugin: {}; DRA through {NVIDIA_GPU}'s class: {}",
                on_legacy.join(", "),
                on_dra.join(", ")
            ))
        } else {
            Err(wrong.join("; "))
        },
    )
}

/// Final cutover, per node: no device-plugin pod, no device-plugin GPU
/// resource allocatable.
pub(crate) fn no_device_plugin(cluster: &Cluster, node: &str) -> EvidenceItem {
    let facts = &cluster.nodes[node];
    let pods = strategy(&cluster.backend).device_plugin_pods(node, cluster);
    let mut seen = Vec::new();
    if !pods.is_empty() {
        seen.push(format!("device-plugin pods: {}", pods.join(", ")));
    }
    if facts.device_plugin_allocatable > 0 {
        seen.push(format!(
            "{} device-plugin GPU resource(s) allocatable",
            facts.device_plugin_allocatable
        ));
    }
    if facts.labels.get(GPU_STACK_LABEL).map(String::as_str)
        == Some(crate::names::STACK_DEVICE_PLUGIN)
    {
        seen.push(format!("{GPU_STACK_LABEL}=device-plugin"));
    }
    item(
        NO_DEVICE_PLUGIN,
        if seen.is_empty() {
            Ok("no device-plugin pod, no device-plugin GPU resource allocatable".into())
        } else {
            Err(seen.join("; "))
        },
    )
}

/// The subjects of `stage` and their items; `moved`: the verified moves.
fn subjects(cluster: &Cluster, stage: Stage, moved: &[Moved]) -> Vec<Subject> {
    let gpu_nodes = evidence::gpu_nodes(cluster);
    let dra_nodes: Vec<String> = gpu_nodes
        .iter()
        .filter(|n| serves_dra(cluster, n))
        .cloned()
        .collect();
    let slices_check = if strategy(&cluster.backend).slices_compared_with_gfd() {
        SLICES_MATCH_GFD
    } else {
        SLICES_MATCH
    };
    let node = |n: &String, items| (n.clone(), None, items);
    let workload = |w: &WorkloadRef, items| (String::new(), Some(w.clone()), items);
    match stage {
        Stage::Baseline => gpu_nodes
            .iter()
            .map(|n| node(n, vec![capacity(cluster, n)]))
            .chain(
                legacy_pods(cluster)
                    .iter()
                    .map(|(w, pods)| workload(w, vec![scheduling(pods)])),
            )
            .collect(),
        Stage::PilotPool => dra_nodes
            .iter()
            .map(|n| {
                node(
                    n,
                    node_items(cluster, n, &[NO_DUAL_ADVERTISEMENT, PLUGIN_HEALTHY]),
                )
            })
            .collect(),
        Stage::DriverValidation => dra_nodes
            .iter()
            .map(|n| node(n, node_items(cluster, n, &[slices_check])))
            .collect(),
        Stage::NativeClaimPilot => cluster
            .pods
            .iter()
            .filter(|(_, p)| {
                serves_dra(cluster, &p.node)
                    && p.claims_needed > u32::from(p.bridged_gpus > 0)
                    && !p.is_daemon()
            })
            .map(|(key, pod)| {
                let w = pod.owner(&key.0).unwrap_or_else(|| WorkloadRef {
                    namespace: key.0.clone(),
                    kind: "Pod".into(),
                    name: key.1.clone(),
                });
                workload(&w, vec![bound_claim(cluster, key, pod)])
            })
            .collect(),
        Stage::CompatibilityBridge => legacy_pods(cluster)
            .iter()
            .filter(|(w, pods)| may_reach_dra(cluster, w, pods))
            .map(|(w, pods)| workload(w, vec![bridge(cluster, pods)]))
            .collect(),
        Stage::ApplicationWave => moved
            .iter()
            .map(|m| workload(&m.workload, evidence::workload_evidence(cluster, m)))
            .collect(),
        Stage::FinalCutover => gpu_nodes
            .iter()
            .map(|n| node(n, vec![no_device_plugin(cluster, n)]))
            .chain(legacy_pods(cluster).iter().map(|(w, pods)| {
                let bridged = pods.iter().any(|(_, p)| p.bridged_gpus > 0);
                workload(
                    w,
                    vec![item(
                        NO_LEGACY_WORKLOAD,
                        Err(format!(
                            "it still asks for {NVIDIA_GPU} ({}): move it to a GPU class",
                            if bridged {
                                "served through the bridge"
                            } else {
                                "served by the device plugin"
                            }
                        )),
                    )],
                )
            }))
            .collect(),
    }
}

/// What a stage with no subject lacks, in words.
fn nothing(stage: Stage) -> &'static str {
    match stage {
        Stage::Baseline | Stage::FinalCutover => "no GPU node",
        Stage::PilotPool | Stage::DriverValidation => "no node is served by DRA",
        Stage::NativeClaimPilot => "no pod with its own ResourceClaims runs on a DRA node",
        Stage::CompatibilityBridge => {
            "no workload asking for nvidia.com/gpu may run on a DRA node (none runs there, none tolerates the pilot taint unbound to a legacy pool)"
        }
        Stage::ApplicationWave => "no verified move",
    }
}

/// The evidence of `stage` as recorded, or why there is none to check.
pub fn check(
    cluster: &Cluster,
    stage: Stage,
    check_id: &str,
    moved: &[Moved],
) -> Result<Vec<DomainEvent>, String> {
    let subjects = subjects(cluster, stage, moved);
    if subjects.is_empty() {
        return Err(format!(
            "stage {}: {}: no evidence to check",
            stage.name(),
            nothing(stage)
        ));
    }
    let (mut nodes, mut workloads, mut failed) = (0, 0, 0);
    let mut out: Vec<DomainEvent> = subjects
        .into_iter()
        .map(|(node, workload, items)| {
            let passed = items.iter().all(|i| i.passed);
            nodes += u32::from(workload.is_none());
            workloads += u32::from(workload.is_some());
            failed += u32::from(!passed);
            event(Kind::EvidenceRecorded(EvidenceRecorded {
                check_id: check_id.to_string(),
                node,
                workload,
                items,
                passed,
                stage: stage.name().into(),
                ..EvidenceRecorded::default()
            }))
        })
        .collect();
    out.push(event(Kind::EvidenceChecked(EvidenceChecked {
        check_id: check_id.to_string(),
        nodes,
        workloads,
        failed,
        stage: stage.name().into(),
        ..EvidenceChecked::default()
    })));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_stage_parses_back_from_its_name() {
        for stage in Stage::ALL {
            assert_eq!(Stage::parse(stage.name()), Ok(stage));
        }
        assert_eq!(
            Stage::parse("nim"),
            Err("stage \"nim\" is not a stage of the guide's table; expected one of baseline, pilot-pool, driver-validation, native-claim-pilot, compatibility-bridge, application-wave, final-cutover".into())
        );
    }
}

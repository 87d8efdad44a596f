//! Exit evidence (the NVIDIA guide's "Migrate Workloads in Stages" table and
//! "Collect Validation and Scheduling Evidence"), checked on the facts as they
//! are when asked — never on a label or a count left from before:
//!
//! - a node: no dual advertisement (no device-plugin resource allocatable on
//!   a node that publishes GPU ResourceSlices, no pod there holding
//!   device-plugin GPUs, and none published on a device-plugin node); on DRA, the plug-in healthy (its pod running, its
//!   PhysicalGPUs Ready) and the slices matching the PhysicalGPUs (product,
//!   memory, UUID, node);
//! - a workload: its pods running on the target group; each pod's claims
//!   allocated on its node, reserved for it, from the class's DeviceClasses;
//!   restart and cleanup (the pods the move recreated hold claims again, and
//!   no claim generated for a pod that is gone is left). A CronJob's pods are
//!   its runs': those in progress, and the completed ones made from the
//!   class's template (their claims are released with them, so they count for
//!   where they ran, not for claims held now).
//!
//! A wave is done only once its evidence passes; [`check`] records it.

use crate::backend::dispatch::strategy;

use switchyard_proto::v1::{
    DomainEvent, EvidenceChecked, EvidenceItem, EvidenceRecorded, PodPhase, WorkloadRef,
    domain_event::Kind, event,
};

pub use super::node_gates::{
    CLAIMS_RESERVED, GPU_DRIVERS, NO_DUAL_ADVERTISEMENT, PLUGIN_HEALTHY, PODS_ON_TARGET,
    RESTART_AND_CLEANUP, SLICES_MATCH, SLICES_MATCH_GFD,
};
use super::node_gates::{gpu_slices, item};
use crate::cluster::{Cluster, workload_key};

/// A workload whose evidence is wanted: where it was moved, with which class.
#[derive(Clone, Debug, PartialEq)]
pub struct Moved {
    pub workload: WorkloadRef,
    pub target_group: String,
    pub gpu_class: String,
}

/// What one check covers and where it is recorded.
#[derive(Clone, Debug, PartialEq)]
pub struct Scope {
    pub check_id: String,
    pub migration_id: String,
    pub wave: u32,
    pub nodes: Vec<String>,
    pub workloads: Vec<Moved>,
}

/// The nodes with GPUs: cards reported, device-plugin GPU resources
/// allocatable, or GPU devices published to DRA.
pub fn gpu_nodes(cluster: &Cluster) -> Vec<String> {
    let publishing: std::collections::BTreeSet<&str> =
        gpu_slices(cluster).map(|(_, s)| s.node.as_str()).collect();
    cluster
        .nodes
        .iter()
        .filter(|(name, n)| {
            cluster.cards(name) > 0
                || n.device_plugin_allocatable > 0
                || publishing.contains(name.as_str())
        })
        .map(|(name, _)| name.clone())
        .collect()
}

/// The evidence of one node, as its backend's strategy assembles it.
pub fn node_evidence(cluster: &Cluster, node: &str) -> Vec<EvidenceItem> {
    let Some(facts) = cluster.nodes.get(node) else {
        return vec![item(
            NO_DUAL_ADVERTISEMENT,
            Err(format!("node {node} does not exist")),
        )];
    };
    strategy(&cluster.backend).node_evidence(cluster, node, facts)
}

/// The evidence of one moved workload.
pub fn workload_evidence(cluster: &Cluster, moved: &Moved) -> Vec<EvidenceItem> {
    let w = &moved.workload;
    let key = workload_key(w);
    let scheduled = w.kind == "CronJob";
    let mut pods = cluster.named_pods_of(&key);
    if scheduled {
        pods.retain(|(_, p)| match p.phase {
            PodPhase::Failed => false,
            PodPhase::Succeeded => p.claims_needed > 0,
            _ => true,
        });
    }
    let replicas = cluster.workloads.get(&key).map_or(0, |w| w.replicas);
    let pods = WorkloadPods {
        cluster,
        moved,
        scheduled,
        pods,
    };
    vec![
        item(PODS_ON_TARGET, pods.placed(replicas)),
        item(CLAIMS_RESERVED, pods.claims()),
        item(RESTART_AND_CLEANUP, pods.cleanup()),
    ]
}

/// A moved workload's pods, as its evidence reads them (a CronJob's: its
/// runs in progress and those completed from a template with claims).
struct WorkloadPods<'c> {
    cluster: &'c Cluster,
    moved: &'c Moved,
    /// Whether the workload is a CronJob.
    scheduled: bool,
    pods: Vec<(&'c str, &'c crate::cluster::Pod)>,
}

impl WorkloadPods<'_> {
    /// A completed run of a CronJob: it counts where it ran; its claims are gone.
    fn completed(&self, p: &crate::cluster::Pod) -> bool {
        self.scheduled && p.phase == PodPhase::Succeeded
    }

    /// Pods-on-target phase: every pod running on the target group, as many as the replicas.
    fn placed(&self, replicas: u32) -> Result<String, String> {
        let (cluster, moved, pods) = (self.cluster, self.moved, &self.pods);
        let w = &moved.workload;
        let group_of = |node: &str| {
            cluster
                .nodes
                .get(node)
                .and_then(|n| n.group())
                .unwrap_or_default()
                .to_string()
        };
        if pods.is_empty() {
            return Err(format!(
                "{} {}/{} has no pods (replicas {replicas})",
                w.kind, w.namespace, w.name
            ));
        }
        let wrong: Vec<String> = pods
            .iter()
            .filter_map(|(name, p)| {
                let group = group_of(&p.node);
                if p.phase != PodPhase::Running && !self.completed(p) {
                    Some(format!("pod {name} is {:?}", p.phase))
                } else if group != moved.target_group {
                    Some(format!(
                        "pod {name} runs on node {} in group {group:?}",
                        p.node
                    ))
                } else {
                    None
                }
            })
            .collect();
        let running = pods.len() - wrong.len();
        if !wrong.is_empty() {
            Err(wrong.join("; "))
        } else if (running as u32) < replicas {
            Err(format!("{running} of {replicas} replicas running"))
        } else {
            let mut nodes: Vec<&str> = pods.iter().map(|(_, p)| &*p.node).collect();
            nodes.sort_unstable();
            nodes.dedup();
            Ok(format!(
                "{running} pods {} in group {} on {}",
                if self.scheduled {
                    "running or completed"
                } else {
                    "running"
                },
                moved.target_group,
                nodes.join(", ")
            ))
        }
    }

    /// Claims phase: each pod in progress holds its claims, allocated on its node.
    fn claims(&self) -> Result<String, String> {
        let pods = &self.pods;
        let classes = self.cluster.gpu_classes.get(&self.moved.gpu_class);
        let mut claims_total = 0usize;
        let mut wrong = Vec::new();
        for (name, pod) in pods {
            if pod.claims_needed == 0 {
                wrong.push(format!("pod {name} requests no ResourceClaim"));
                continue;
            }
            if self.completed(pod) {
                continue;
            }
            claims_total += self.pod_claims(name, pod, classes, &mut wrong);
        }
        let in_progress = pods.iter().filter(|(_, p)| !self.completed(p)).count();
        if pods.is_empty() {
            Err("no pods, so no claims to show".into())
        } else if wrong.is_empty() && in_progress == 0 {
            Ok(format!(
                "no run in progress; the {} completed runs from the class's template were bound with \
                 their claims allocated (released with them)",
                pods.len()
            ))
        } else if wrong.is_empty() {
            Ok(format!(
                "{claims_total} claims allocated on their pods' nodes and reserved for them"
            ))
        } else {
            Err(wrong.join("; "))
        }
    }

    /// Claims phase of one pod: what is wrong added to `wrong`; returns how many it holds.
    fn pod_claims(
        &self,
        name: &str,
        pod: &crate::cluster::Pod,
        classes: Option<&Vec<String>>,
        wrong: &mut Vec<String>,
    ) -> usize {
        let w = &self.moved.workload;
        let held: Vec<(&String, &crate::cluster::Claim)> = self
            .cluster
            .claims
            .range((w.namespace.clone(), String::new())..)
            .take_while(|((ns, _), _)| *ns == w.namespace)
            .filter(|(_, c)| c.reserved_for.iter().any(|p| p == name))
            .map(|((_, claim), c)| (claim, c))
            .collect();
        if (held.len() as u32) < pod.claims_needed {
            wrong.push(format!(
                "pod {name}: {} of {} claims reserved for it",
                held.len(),
                pod.claims_needed
            ));
        }
        let mut claims = 0;
        for (claim, c) in held {
            claims += 1;
            if c.devices.is_empty() {
                wrong.push(format!("claim {claim} of pod {name} is not allocated"));
            } else if c.node != *pod.node {
                wrong.push(format!(
                    "claim {claim} of pod {name} is allocated on node {:?}, the pod runs on {:?}",
                    c.node, pod.node
                ));
            }
            if let Some(classes) = classes {
                let foreign: Vec<&String> = c
                    .device_classes
                    .iter()
                    .filter(|d| !classes.contains(d))
                    .collect();
                // An implicit claim (the extended resource) names the class's
                // DeviceClass too; a claim naming none is someone else's.
                if !foreign.is_empty() {
                    wrong.push(format!(
                        "claim {claim} of pod {name} requests DeviceClass {} outside GPU class {}",
                        foreign
                            .iter()
                            .map(|s| s.as_str())
                            .collect::<Vec<_>>()
                            .join(", "),
                        self.moved.gpu_class
                    ));
                }
            }
        }
        claims
    }

    /// Cleanup phase: recreated pods hold claims again, no deleted pod's claim is left.
    fn cleanup(&self) -> Result<String, String> {
        let (cluster, pods) = (self.cluster, &self.pods);
        let w = &self.moved.workload;
        // Claims generated for this workload's pods that are gone.
        let prefix = format!("{}-", w.name);
        let leaked: Vec<String> = cluster
            .claims
            .range((w.namespace.clone(), String::new())..)
            .take_while(|((ns, _), _)| *ns == w.namespace)
            .filter(|(_, c)| c.owner_pod.starts_with(&prefix))
            .filter(|(_, c)| {
                !cluster
                    .pods
                    .contains_key(&(w.namespace.clone(), c.owner_pod.clone()))
            })
            .map(|((_, claim), c)| format!("{claim} (pod {} is gone)", c.owner_pod))
            .collect();
        if pods.is_empty() {
            Err("no pods, so no restart to show".into())
        } else if !leaked.is_empty() {
            Err(format!(
                "claims of deleted pods are left: {}",
                leaked.join(", ")
            ))
        } else if pods
            .iter()
            .any(|(_, p)| p.claims_allocated < p.claims_needed)
        {
            Err("a recreated pod has not got its claims again".into())
        } else {
            Ok(format!(
                "the {} pods recreated by the move hold their claims again; no claim of a deleted pod is left",
                pods.len()
            ))
        }
    }
}

/// The evidence of `scope` as recorded: one `EvidenceRecorded` per node and
/// workload, then `EvidenceChecked`.
pub fn check(cluster: &Cluster, scope: &Scope) -> Vec<DomainEvent> {
    let record = |node: String, workload: Option<WorkloadRef>, items: Vec<EvidenceItem>| {
        event(Kind::EvidenceRecorded(EvidenceRecorded {
            check_id: scope.check_id.clone(),
            migration_id: scope.migration_id.clone(),
            wave: scope.wave,
            node,
            workload,
            passed: items.iter().all(|i| i.passed),
            items,
            stage: String::new(),
        }))
    };
    let mut out: Vec<DomainEvent> = scope
        .nodes
        .iter()
        .map(|n| record(n.clone(), None, node_evidence(cluster, n)))
        .chain(scope.workloads.iter().map(|m| {
            record(
                String::new(),
                Some(m.workload.clone()),
                workload_evidence(cluster, m),
            )
        }))
        .collect();
    let failed = out
        .iter()
        .filter(|e| matches!(&e.kind, Some(Kind::EvidenceRecorded(r)) if !r.passed))
        .count() as u32;
    out.push(event(Kind::EvidenceChecked(EvidenceChecked {
        check_id: scope.check_id.clone(),
        migration_id: scope.migration_id.clone(),
        wave: scope.wave,
        nodes: scope.nodes.len() as u32,
        workloads: scope.workloads.len() as u32,
        failed,
        stage: String::new(),
    })));
    out
}

/// The first failure of a check's records, in words, for a pause's reason.
pub fn first_failure(records: &[DomainEvent]) -> Option<String> {
    records.iter().find_map(|e| match &e.kind {
        Some(Kind::EvidenceRecorded(r)) if !r.passed => {
            let subject = match &r.workload {
                Some(w) => format!("{} {}/{}", w.kind, w.namespace, w.name),
                None => format!("node {}", r.node),
            };
            let failed = r.items.iter().find(|i| !i.passed)?;
            Some(format!("{subject}: {}: {}", failed.check, failed.detail))
        }
        _ => None,
    })
}

/// How a check is named where the last of each is kept (`switchyard
/// status`, the alerter's series): its id, and for a migration's check —
/// whose waves share the operator's id — the wave too.
pub fn check_key(checked: &switchyard_proto::v1::EvidenceChecked) -> String {
    if checked.migration_id.is_empty() {
        checked.check_id.clone()
    } else {
        format!("{} wave {}", checked.check_id, checked.wave + 1)
    }
}

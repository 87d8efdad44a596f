//! Application moves (reference, "Step 4. Move an application" and "Step 5"):
//! the workload's `nvidia.com/gpu: N` becomes `gpu.deckhouse.io/<class>: N`, the
//! `node.deckhouse.io/group: <source>` node selector goes, everything else stays;
//! then the workload is restarted and the move is verified: its pods run on
//! nodes of the target group with their claims allocated.
//!
//! A move is refused while no node of the target group is ready — "hand over the
//! node before moving the application, otherwise its Pods wait for devices that
//! do not exist in the cluster yet" — and when the GPU class does not exist.
//!
//! The kinds differ in where the template lives and how the change takes
//! effect: a Deployment or StatefulSet is restarted; a DaemonSet too, and its
//! group binding is moved to the target group rather than dropped (a DaemonSet
//! runs on every node its selector matches, so without one it would ask for a
//! device on every node of the cluster); a CronJob's Job template is edited and
//! the change takes effect at its next run — no restart — so the move is
//! verified on the pods of a run made from the new template; a Job's template is
//! immutable, so a Job is refused.
//!
//! On the `nvidia-operator` backend the group is the node's pool (its pool
//! label is the binding dropped), a node is ready when the guide's gates hold
//! on it (`operands::handover_ready`), and a move adds a toleration of the
//! pilot taint DRA nodes carry — the rollback restores the tolerations as
//! they were.

use crate::backend::dispatch::strategy;
use std::collections::BTreeMap;

use switchyard_proto::v1::{
    ApplicationMoveRefused, ApplicationMoveStarted, ApplicationMoveVerified, DomainEvent, PodPhase,
    RollbackCompleted, StepCompensated, WorkloadPlacement, WorkloadRef, WorkloadRestarted,
    WorkloadRewritten, domain_event::Kind, event,
};

use crate::backend::Backend;
use crate::cluster::{Cluster, WorkloadKey, workload_key};
use crate::command::MoveApplication;
use crate::effects::Effect;
use crate::names::NVIDIA_GPU;
use crate::placement::rewrite;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MoveStep {
    /// Waiting to see the rewritten pod template.
    Rewrite,
    /// Restarted; waiting for its pods on the target group with claims allocated.
    Verify,
}

#[derive(Clone, Debug, PartialEq)]
pub struct AppMove {
    pub id: String,
    pub workload: WorkloadRef,
    pub source_group: String,
    pub target_group: String,
    pub gpu_class: String,
    pub step: MoveStep,
    pub before: WorkloadPlacement,
    pub after: WorkloadPlacement,
    /// A rollback: the sequence of the forward rewrite it compensates.
    pub compensates: Option<u64>,
    /// A rollback whose compensation is recorded; the restart that follows it
    /// may not be (a stop between the two).
    pub compensated: bool,
}

/// The claim-allocator's application moves.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct AppMoves {
    pub active: BTreeMap<WorkloadKey, AppMove>,
    /// Verified moves, by workload.
    pub verified: BTreeMap<WorkloadKey, VerifiedMove>,
    /// The label that names a node's group, as the backend recorded in the
    /// log says (`Backend::group_label`).
    pub group_label: Option<String>,
}

/// A verified move: where the workload went, requesting which class.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VerifiedMove {
    pub id: String,
    pub target_group: String,
    pub gpu_class: String,
}

/// The verification of `m` on `pods`: their nodes and claims.
fn verified_on(m: &AppMove, pods: &[&crate::cluster::Pod]) -> Vec<DomainEvent> {
    let mut pod_nodes: Vec<String> = pods.iter().map(|p| p.node.to_string()).collect();
    pod_nodes.sort();
    vec![event(Kind::ApplicationMoveVerified(
        ApplicationMoveVerified {
            move_id: m.id.clone(),
            workload: Some(m.workload.clone()),
            pod_nodes,
            claims_allocated: pods.iter().map(|p| p.claims_allocated).sum(),
        },
    ))]
}

/// Nodes of `group` ready for workloads, not cordoned: all four readiness
/// conditions, or on the `nvidia-operator` backend the guide's gates of a
/// node DRA serves.
pub fn ready_nodes<'a>(cluster: &'a Cluster, group: &str) -> impl Iterator<Item = &'a String> + 'a {
    let members = cluster.members.get(group).into_iter().flatten();
    members.filter(move |node| {
        let facts = &cluster.nodes[node.as_str()];
        !facts.unschedulable && strategy(&cluster.backend).workload_ready(node, facts, cluster)
    })
}

/// Whether `group` is a DRA group a move may go to: a group without
/// `spec.gpu` (not the device plugin's), or a pool configured `dra`.
fn dra_group(cluster: &Cluster, group: &str) -> bool {
    strategy(&cluster.backend).is_dra_group(cluster, group)
}

/// Groups a move may go to when none is named: DRA groups with a ready
/// node, sorted.
pub fn target_groups(cluster: &Cluster) -> Vec<&str> {
    cluster
        .members
        .keys()
        .filter(|group| dra_group(cluster, group))
        .filter(|group| ready_nodes(cluster, group).next().is_some())
        .map(String::as_str)
        .collect()
}

impl AppMoves {
    /// Folds this core's own events.
    pub fn apply(&mut self, event: &DomainEvent) {
        let Some(kind) = &event.kind else { return };
        match kind {
            Kind::BackendConfigured(b) => {
                self.group_label = Some(Backend::from_event(b).group_label().to_string());
            }
            Kind::ApplicationMoveStarted(e) => {
                let Some(workload) = &e.workload else { return };
                // Before- and after-image arrive with the WorkloadRewritten that
                // is always decided together with the start.
                self.active.insert(
                    workload_key(workload),
                    AppMove {
                        id: e.move_id.clone(),
                        workload: workload.clone(),
                        source_group: e.source_group.clone(),
                        target_group: e.target_group.clone(),
                        gpu_class: e.gpu_class.clone(),
                        step: MoveStep::Rewrite,
                        before: WorkloadPlacement::default(),
                        after: WorkloadPlacement::default(),
                        compensates: None,
                        compensated: false,
                    },
                );
            }
            Kind::RollbackStarted(e) => {
                let Some(restore) = &e.workload_restore else {
                    return;
                };
                let Some(workload) = &restore.workload else {
                    return;
                };
                let after = restore.after.clone().unwrap_or_default();
                self.active.insert(
                    workload_key(workload),
                    AppMove {
                        id: e.rollback_id.clone(),
                        workload: workload.clone(),
                        source_group: String::new(),
                        target_group: after
                            .node_selector
                            .get(
                                self.group_label
                                    .as_deref()
                                    .unwrap_or(crate::names::GROUP_LABEL),
                            )
                            .cloned()
                            .unwrap_or_default(),
                        gpu_class: String::new(),
                        step: MoveStep::Rewrite,
                        before: restore.before.clone().unwrap_or_default(),
                        after,
                        compensates: e.plan.first().copied(),
                        compensated: false,
                    },
                );
            }
            Kind::StepCompensated(e) => {
                if let Some(m) = self.active.values_mut().find(|m| {
                    m.id == e.rollback_id && m.compensates == Some(e.compensated_sequence)
                }) {
                    m.compensated = true;
                }
                if let Some(compensation) = &e.compensation {
                    self.apply(compensation);
                }
            }
            Kind::RollbackCompleted(e) => {
                let key = self
                    .active
                    .iter()
                    .find(|(_, m)| m.id == e.rollback_id)
                    .map(|(k, _)| k.clone());
                if let Some(key) = key {
                    self.active.remove(&key);
                    self.verified.remove(&key);
                }
            }
            Kind::WorkloadRewritten(e) => {
                if let Some(m) = e
                    .workload
                    .as_ref()
                    .and_then(|w| self.active.get_mut(&workload_key(w)))
                {
                    m.before = e.before.clone().unwrap_or_default();
                    m.after = e.after.clone().unwrap_or_default();
                }
            }
            Kind::WorkloadRestarted(e) => {
                if let Some(m) = e
                    .workload
                    .as_ref()
                    .and_then(|w| self.active.get_mut(&workload_key(w)))
                {
                    m.step = MoveStep::Verify;
                }
            }
            Kind::ApplicationMoveVerified(e) => {
                if let Some(w) = &e.workload {
                    let key = workload_key(w);
                    let (target_group, gpu_class) = self
                        .active
                        .remove(&key)
                        .map(|m| (m.target_group, m.gpu_class))
                        .unwrap_or_default();
                    self.verified.insert(
                        key,
                        VerifiedMove {
                            id: e.move_id.clone(),
                            target_group,
                            gpu_class,
                        },
                    );
                }
            }
            _ => {}
        }
    }

    /// Starts a move — the start and the decided rewrite with its before-image —
    /// or refuses it with the reason.
    pub fn start(&self, cluster: &Cluster, cmd: &MoveApplication) -> Vec<DomainEvent> {
        let refuse = |reason: String| {
            vec![event(Kind::ApplicationMoveRefused(
                ApplicationMoveRefused {
                    workload: Some(cmd.workload.clone()),
                    reason,
                },
            ))]
        };
        let w = &cmd.workload;
        let name = format!("{} {}/{}", w.kind, w.namespace, w.name);
        let key = workload_key(w);
        if w.kind == "Job" {
            let made_by = cluster.workloads.get(&key).and_then(|j| j.cron_job());
            return refuse(match made_by {
                Some(cron_job) => format!(
                    "{name} was made by CronJob {}/{cron_job}: a Job's pod template cannot be \
                     changed; move the CronJob, and its next run starts on the target group",
                    w.namespace
                ),
                None => format!(
                    "{name}: a Job's pod template (spec.template) cannot be changed; let it finish \
                     on the device plugin, or delete it and create it again from the manifest \
                     `switchyard move --dry-run -o yaml` prints"
                ),
            });
        }
        let Some(workload) = cluster.workloads.get(&key) else {
            return refuse(format!(
                "{name} is not known: inventory has recorded no such workload (one created just now may not be recorded yet)"
            ));
        };
        if self.active.contains_key(&key) {
            return refuse(format!("{name} is already being moved"));
        }
        if !cluster.gpu_classes.contains_key(&cmd.gpu_class) {
            let known: Vec<&str> = cluster.gpu_classes.keys().map(String::as_str).collect();
            return refuse(format!(
                "GPU class {} does not exist (known: {}); check the name against `d8 k get gpuclass`",
                cmd.gpu_class,
                known.join(", ")
            ));
        }
        if cluster
            .gpu_classes
            .get(&cmd.gpu_class)
            .is_some_and(Vec::is_empty)
        {
            return refuse(format!(
                "GPU class {} has no DeviceClass yet: wait for the class-compiler to publish it",
                cmd.gpu_class
            ));
        }
        if !workload.managed_by().is_empty() && !cmd.allow_managed {
            return refuse(format!(
                "{name} is managed by {}, which would undo an edit made here: change the manifest \
                 where it lives (`switchyard move --dry-run -o patch` prints the change), or move \
                 it in place anyway with --allow-managed",
                workload.managed_by()
            ));
        }
        if !workload.placement.requests_nvidia_gpu() {
            return refuse(format!(
                "{name} requests no {NVIDIA_GPU}: there is nothing to move"
            ));
        }
        let target_group = match cmd.target_group.as_str() {
            "" => match target_groups(cluster).as_slice() {
                [one] => one.to_string(),
                [] => {
                    let groups = strategy(&cluster.backend).dra_groups_described();
                    return refuse(format!(
                        "no node of {groups} is ready: hand over a node before \
                         moving the application, otherwise its Pods wait for devices that do not \
                         exist in the cluster yet"
                    ));
                }
                several => {
                    return refuse(format!(
                        "groups {} all have ready nodes: name the target group",
                        several.join(", ")
                    ));
                }
            },
            given => given.to_string(),
        };
        if ready_nodes(cluster, &target_group).next().is_none() {
            return refuse(format!(
                "no node of group {target_group} is ready: hand over a node before moving the \
                 application, otherwise its Pods wait for devices that do not exist in the cluster yet"
            ));
        }
        let placement = workload.placement.get();
        let group_label = cluster.backend.group_label();
        let source_group = placement
            .node_selector
            .get(group_label)
            .cloned()
            .unwrap_or_default();
        let pilot_taint = strategy(&cluster.backend).pilot_taint();
        let mut after = rewrite(
            &placement,
            group_label,
            &source_group,
            &cmd.gpu_class,
            pilot_taint.as_ref(),
        );
        if w.kind == "DaemonSet" {
            after
                .node_selector
                .insert(group_label.to_string(), target_group.clone());
        }
        vec![
            event(Kind::ApplicationMoveStarted(ApplicationMoveStarted {
                move_id: cmd.move_id.clone(),
                workload: Some(w.clone()),
                source_group,
                target_group,
                gpu_class: cmd.gpu_class.clone(),
            })),
            event(Kind::WorkloadRewritten(Box::new(WorkloadRewritten {
                move_id: cmd.move_id.clone(),
                workload: Some(w.clone()),
                before: Some(placement),
                after: Some(after),
            }))),
        ]
    }

    /// Decisions for the move of `key`, given the facts.
    pub fn decide_workload(&self, cluster: &Cluster, key: &WorkloadKey) -> Vec<DomainEvent> {
        let Some(m) = self.active.get(key) else {
            return Vec::new();
        };
        let Some(workload) = cluster.workloads.get(key) else {
            return Vec::new();
        };
        let restarted = event(Kind::WorkloadRestarted(WorkloadRestarted {
            move_id: m.id.clone(),
            workload: Some(m.workload.clone()),
            restarted_at_before: workload.restarted_at().to_string(),
            restarted_at: m.id.clone(),
        }));
        // A CronJob is not restarted: its next run is made from the template.
        let scheduled = m.workload.kind == "CronJob";
        let restored = || {
            event(Kind::RollbackCompleted(RollbackCompleted {
                rollback_id: m.id.clone(),
            }))
        };
        let rewritten = workload.placement.is(&m.after);
        // Pods count for a restarted workload only once the cluster shows the
        // restart, and only pods the restart made (their template's
        // `restartedAt` is the move's): until then the pods running are the
        // ones it replaces — also after the template shows it, while its
        // controller rolls the pods.
        let restart_shown = workload.restarted_at() == m.id;
        let made_by_restart = |p: &crate::cluster::Pod| *p.restarted_at == *m.id;
        match (m.step, m.compensates) {
            (MoveStep::Rewrite, None) if rewritten && scheduled => {
                self.verify_scheduled(cluster, key, m)
            }
            (MoveStep::Rewrite, None) if rewritten => vec![restarted],
            (MoveStep::Rewrite, Some(_)) if m.compensated && rewritten => {
                vec![if scheduled { restored() } else { restarted }]
            }
            (MoveStep::Rewrite, Some(compensated)) if workload.placement.is(&m.after) => vec![
                event(Kind::StepCompensated(Box::new(StepCompensated {
                    rollback_id: m.id.clone(),
                    compensated_sequence: compensated,
                    compensation: Some(Box::new(event(Kind::WorkloadRewritten(Box::new(
                        WorkloadRewritten {
                            move_id: m.id.clone(),
                            workload: Some(m.workload.clone()),
                            before: Some(m.before.clone()),
                            after: Some(m.after.clone()),
                        },
                    ))))),
                }))),
                if scheduled { restored() } else { restarted },
            ],
            (MoveStep::Verify, _) if !restart_shown => Vec::new(),
            (MoveStep::Verify, Some(_)) => {
                // Back on the device plugin: running pods, on the source group if bound to it.
                let pods = cluster.pods_of(key);
                let in_group = |node: &str| {
                    m.target_group.is_empty()
                        || cluster.nodes.get(node).and_then(|n| n.group())
                            == Some(m.target_group.as_str())
                };
                let back = pods.len() as u32 == workload.replicas
                    && pods.iter().all(|p| {
                        p.phase == PodPhase::Running && in_group(&p.node) && made_by_restart(p)
                    });
                if back { vec![restored()] } else { Vec::new() }
            }
            (MoveStep::Verify, None) => {
                let pods = cluster.pods_of(key);
                let on_target = |node: &str| {
                    cluster.nodes.get(node).and_then(|n| n.group()) == Some(m.target_group.as_str())
                };
                let verified = pods.len() as u32 == workload.replicas
                    && workload.replicas > 0
                    && pods.iter().all(|p| {
                        p.phase == PodPhase::Running
                            && made_by_restart(p)
                            && on_target(&p.node)
                            && p.claims_needed > 0
                            && p.claims_allocated >= p.claims_needed
                    });
                if !verified {
                    return Vec::new();
                }
                verified_on(m, &pods)
            }
            (MoveStep::Rewrite, _) => Vec::new(),
        }
    }

    /// A CronJob's move, verified on a run made from the new template: every
    /// pod of it still running or waiting is on the target group with its
    /// claims (a run started before the edit holds the move until it ends),
    /// and at least one pod with claims has run there.
    fn verify_scheduled(
        &self,
        cluster: &Cluster,
        key: &WorkloadKey,
        m: &AppMove,
    ) -> Vec<DomainEvent> {
        let pods = cluster.pods_of(key);
        let on_target = |node: &str| {
            cluster.nodes.get(node).and_then(|n| n.group()) == Some(m.target_group.as_str())
        };
        let finished =
            |p: &&crate::cluster::Pod| matches!(p.phase, PodPhase::Succeeded | PodPhase::Failed);
        let with_claims =
            |p: &&crate::cluster::Pod| p.claims_needed > 0 && p.claims_allocated >= p.claims_needed;
        let unfinished_ok = pods
            .iter()
            .filter(|p| !finished(p))
            .all(|p| p.phase == PodPhase::Running && on_target(&p.node) && with_claims(p));
        let ran: Vec<&crate::cluster::Pod> = pods
            .iter()
            .copied()
            .filter(|p| {
                matches!(p.phase, PodPhase::Running | PodPhase::Succeeded)
                    && on_target(&p.node)
                    && with_claims(p)
            })
            .collect();
        if unfinished_ok && !ran.is_empty() {
            verified_on(m, &ran)
        } else {
            Vec::new()
        }
    }

    /// What the edge should be doing for the moves in progress: what the
    /// cluster does not show yet — the rewritten template until it is seen
    /// (and again should something undo it), the restart until the template
    /// carries the move's `restartedAt`. A workload not seen has nothing to
    /// write to.
    pub fn effects(&self, cluster: &Cluster) -> Vec<Effect> {
        let mut effects = Vec::new();
        for (key, m) in &self.active {
            let Some(workload) = cluster.workloads.get(key) else {
                continue;
            };
            if !workload.placement.is(&m.after) {
                effects.push(Effect::SetPlacement {
                    workload: m.workload.clone(),
                    placement: m.after.clone(),
                });
            }
            if m.step == MoveStep::Verify && workload.restarted_at() != m.id {
                effects.push(Effect::RestartWorkload {
                    workload: m.workload.clone(),
                    restarted_at: m.id.clone(),
                });
            }
        }
        effects
    }
}

//! The node handover state machine (reference, "Step 3. Hand a node over"):
//! cordon → drain → move to the target group → wait until ready → uncordon.
//!
//! Each step ends with an event, decided when the cluster facts show the step
//! done: `NodeCordoned`, `NodeDrained`, `NodeGroupChanged`, `NodeReadinessObserved`,
//! `NodeUncordoned`, then `HandoverCompleted`. `HandoverStarted` records the
//! node's before-image (labels, taints, `spec.unschedulable`), which the events
//! carry on so that a rollback restores the node exactly. What the edge should
//! be doing meanwhile is [`Handovers::effects`], a function of the state: after a
//! restart the effects are simply issued again (they are idempotent). A step that
//! does not finish within its deadline — time comes from the events — yields one
//! `HandoverStalled` with the reason.
//!
//! Readiness is observed after the group change, never carried over from
//! before it: `node.deckhouse.io/gpu-setup-complete` counts only once it was
//! written after the `NodeGroupChanged` — the label was seen absent since
//! (node preparation takes it away when it starts over), or its value differs
//! from the one the group change found (preparation refreshed it). The cards
//! expected are the node's before-image (`HandoverStarted.cards_before`), not
//! its `nvidia.com/gpu` capacity, which is 0 on a DRA node. Handing back to
//! the device plugin waits for `nvidia.com/gpu` (or its MIG and time-slicing
//! resources) to be allocatable on the node again, one per card at least.

use crate::backend::dispatch::strategy;
use std::collections::BTreeMap;

use switchyard_proto::v1::{
    DomainEvent, HandoverCompleted, HandoverRefused, HandoverStalled, HandoverStarted,
    HandoverStep, NodeCordoned, NodeDrained, NodeGroupChanged, NodeObserved, NodeProvisioning,
    NodeReadinessObserved, NodeUncordoned, PodRef, RollbackCompleted, Stack, StepCompensated,
    Taint, domain_event::Kind, event,
};

use crate::backend::Backend;
use crate::cluster::{Cluster, Node};
use crate::command::StartHandover;
use crate::effects::Effect;
use crate::names::{GPU_SETUP_COMPLETE_LABEL, GROUP_LABEL, NODE_ROLE_PREFIX, PREPARATION_LABELS};
use crate::stack_rules;

const SECOND: i64 = 1_000_000_000;

/// How long each step may take before the handover is reported stalled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Deadlines {
    pub cordon: i64,
    pub drain: i64,
    pub move_group: i64,
    pub wait_ready: i64,
    pub uncordon: i64,
}

impl Default for Deadlines {
    fn default() -> Self {
        Deadlines {
            cordon: 120 * SECOND,
            drain: 15 * 60 * SECOND,
            move_group: 120 * SECOND,
            wait_ready: 20 * 60 * SECOND,
            uncordon: 120 * SECOND,
        }
    }
}

impl Deadlines {
    fn of(&self, step: HandoverStep) -> i64 {
        match step {
            HandoverStep::Cordon => self.cordon,
            HandoverStep::Drain => self.drain,
            HandoverStep::MoveGroup => self.move_group,
            HandoverStep::WaitReady => self.wait_ready,
            HandoverStep::Uncordon | HandoverStep::Unspecified => self.uncordon,
        }
    }
}

/// A handover in progress.
#[derive(Clone, Debug, PartialEq)]
pub struct Handover {
    pub id: String,
    pub node: String,
    pub source_group: String,
    pub target_group: String,
    pub step: HandoverStep,
    /// Recorded time at which the current step began.
    pub step_since: i64,
    pub stalled: bool,
    pub labels_before: BTreeMap<String, String>,
    pub taints_before: Vec<Taint>,
    pub was_unschedulable: bool,
    pub to_evict: Vec<PodRef>,
    /// Set when this is a rollback: a handover back that restores the node.
    pub rollback: Option<RollbackMode>,
    /// The uncordon is recorded; the completion that follows it may not be
    /// (a stop between the two).
    pub uncordoned: bool,
    /// Before-image: the cards the node had (`HandoverStarted.cards_before`).
    pub cards_before: u32,
    /// The `gpu-setup-complete` value the group change found on the node,
    /// until the label is seen absent: a label still carrying it is left
    /// from before the move and does not count as prepared.
    pub stale_setup_label: Option<String>,
    /// The label was seen absent on the node in its target group, or the
    /// move as the edge wrote it took it away (`NodeGroupWritten`): whatever
    /// is written next is fresh, even if that fact was recorded before the
    /// group change (preparation can be quicker than the record of the move,
    /// and a restarted inventory sees none of the writes in between).
    pub setup_absent_seen: bool,
}

impl Handover {
    /// The handover `started` records, at its cordon since `at`: a
    /// rollback's handover back when `rollback` is given.
    fn started(started: &HandoverStarted, rollback: Option<RollbackMode>, at: i64) -> Handover {
        Handover {
            id: started.handover_id.clone(),
            node: started.node.clone(),
            source_group: started.source_group.clone(),
            target_group: started.target_group.clone(),
            step: HandoverStep::Cordon,
            step_since: at,
            stalled: false,
            labels_before: started.labels_before.clone(),
            taints_before: started.taints_before.clone(),
            was_unschedulable: started.was_unschedulable,
            to_evict: Vec::new(),
            rollback,
            uncordoned: false,
            cards_before: started.cards_before,
            stale_setup_label: None,
            setup_absent_seen: false,
        }
    }

    /// Whether `gpu-setup-complete` was written after the group change.
    pub fn setup_label_fresh(&self, facts: &Node) -> bool {
        self.step >= HandoverStep::WaitReady
            && facts
                .labels
                .get(GPU_SETUP_COMPLETE_LABEL)
                .is_some_and(|v| self.stale_setup_label.as_ref() != Some(v))
    }

    /// Whether the node is moved. A forward handover is done moving when the
    /// node carries the target group and not the source group's role label;
    /// a rollback when the node's labels and taints are its before-image
    /// again.
    fn moved(&self, cluster: &Cluster, facts: &Node) -> bool {
        match &self.rollback {
            // nvidia-operator: the pool label is the move; the operand
            // labels follow it, in the guide's order, once the node's stack
            // is decided again (`operands::effects`).
            _ if strategy(&cluster.backend).moves_by_group_label() => {
                facts.group().unwrap_or_default() == self.target_group
            }
            None => {
                facts.group() == Some(self.target_group.as_str())
                    && !facts
                        .labels
                        .contains_key(&format!("{NODE_ROLE_PREFIX}{}", self.source_group))
            }
            Some(_) => {
                comparable(facts.labels.iter()) == comparable(self.labels_before.iter())
                    && facts.taints == self.taints_before
            }
        }
    }

    /// Whether the node is released. Forward: uncordoned. Rollback:
    /// spec.unschedulable as it was.
    fn released(&self, facts: &Node) -> bool {
        match &self.rollback {
            None => !facts.unschedulable,
            Some(_) => facts.unschedulable == self.was_unschedulable,
        }
    }

    /// `HandoverCompleted`, after `NodeUncordoned` unless that is recorded.
    fn completion(&self) -> Vec<DomainEvent> {
        let uncordoned = (!self.uncordoned).then(|| {
            event(Kind::NodeUncordoned(NodeUncordoned {
                handover_id: self.id.clone(),
                node: self.node.clone(),
                was_unschedulable: true,
            }))
        });
        let completed = event(Kind::HandoverCompleted(HandoverCompleted {
            handover_id: self.id.clone(),
            node: self.node.clone(),
            target_group: self.target_group.clone(),
        }));
        uncordoned.into_iter().chain([completed]).collect()
    }
}

/// A handover back to the source group, restoring the before-image
/// (`labels_before`, `taints_before`, `was_unschedulable`) of the handover it undoes.
#[derive(Clone, Debug, PartialEq)]
pub struct RollbackMode {
    pub rollback_id: String,
    /// Forward steps this rollback compensates, by sequence.
    pub undo_uncordon: u64,
    pub undo_group_change: u64,
    pub undo_cordon: u64,
    /// The forward group change: its after-image is the state being left.
    pub undone: NodeGroupChanged,
}

impl RollbackMode {
    /// The steps of a handover back that restore a forward step are recorded as
    /// compensations of it; the last one also completes the rollback.
    fn wrap(&self, decision: DomainEvent) -> Vec<DomainEvent> {
        let compensated = match &decision.kind {
            Some(Kind::NodeCordoned(_)) => self.undo_uncordon,
            Some(Kind::NodeGroupChanged(_)) => self.undo_group_change,
            Some(Kind::NodeUncordoned(_)) => self.undo_cordon,
            Some(Kind::HandoverCompleted(_)) => {
                return vec![
                    decision,
                    event(Kind::RollbackCompleted(RollbackCompleted {
                        rollback_id: self.rollback_id.clone(),
                    })),
                ];
            }
            _ => return vec![decision],
        };
        vec![event(Kind::StepCompensated(Box::new(StepCompensated {
            rollback_id: self.rollback_id.clone(),
            compensated_sequence: compensated,
            compensation: Some(Box::new(decision)),
        })))]
    }
}

/// Labels as compared after a restore: without the preparation labels.
fn comparable<'a>(
    labels: impl Iterator<Item = (&'a String, &'a String)>,
) -> BTreeMap<&'a str, &'a str> {
    labels
        .filter(|(k, _)| !PREPARATION_LABELS.contains(&k.as_str()))
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

/// All handovers: the ones in progress by node, the finished ones by id.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Handovers {
    pub deadlines: Deadlines,
    pub active: BTreeMap<String, Handover>,
    /// Handover id -> node, for handovers that completed.
    pub completed: BTreeMap<String, String>,
    /// Rollbacks whose handover back completed but whose `RollbackCompleted`
    /// is not recorded yet (a stop between the two).
    pub rollbacks_completing: std::collections::BTreeSet<String>,
}

/// The stack `node` would get as a member of `group`.
pub(crate) fn stack_in_group(
    cluster: &Cluster,
    node: &Node,
    group: &str,
    held: bool,
) -> (Stack, switchyard_proto::v1::StackReason) {
    let mut moved = node.clone();
    moved.move_to(cluster.backend.group_label(), group);
    stack_rules::rule(&moved, cluster, held)
}

impl Handovers {
    pub fn new(deadlines: Deadlines) -> Self {
        Handovers {
            deadlines,
            ..Handovers::default()
        }
    }

    /// Folds this core's own events; `at` is the event's recorded time.
    pub fn apply(&mut self, event: &DomainEvent, at: i64) {
        let Some(kind) = &event.kind else { return };
        let advance = |active: &mut BTreeMap<String, Handover>, node: &str, step: HandoverStep| {
            if let Some(h) = active.get_mut(node) {
                h.step = step;
                h.step_since = at;
                h.stalled = false;
            }
        };
        match kind {
            Kind::HandoverStarted(e) => {
                self.active
                    .insert(e.node.clone(), Handover::started(e, None, at));
            }
            Kind::RollbackStarted(e) => {
                let Some(back) = &e.node_restore else { return };
                let [undo_uncordon, undo_group_change, undo_cordon] = e.plan[..] else {
                    return;
                };
                let mode = RollbackMode {
                    rollback_id: e.rollback_id.clone(),
                    undo_uncordon,
                    undo_group_change,
                    undo_cordon,
                    undone: e
                        .undone_group_change
                        .as_deref()
                        .cloned()
                        .unwrap_or_default(),
                };
                self.active
                    .insert(back.node.clone(), Handover::started(back, Some(mode), at));
            }
            Kind::StepCompensated(e) => {
                if let Some(compensation) = &e.compensation {
                    self.apply(compensation, at);
                }
            }
            Kind::NodeCordoned(e) => {
                if let Some(h) = self.active.get_mut(&e.node) {
                    h.to_evict = e.to_evict.clone();
                }
                advance(&mut self.active, &e.node, HandoverStep::Drain);
            }
            Kind::NodeDrained(e) => advance(&mut self.active, &e.node, HandoverStep::MoveGroup),
            Kind::NodeGroupChanged(e) => {
                advance(&mut self.active, &e.node, HandoverStep::WaitReady);
                if let Some(h) = self.active.get_mut(&e.node)
                    && !h.setup_absent_seen
                {
                    h.stale_setup_label = e.labels_after.get(GPU_SETUP_COMPLETE_LABEL).cloned();
                }
            }
            Kind::NodeGroupWritten(e) => {
                // The move as written took the label away: whatever is on
                // the node from now on was written by preparation since.
                if let Some(h) = self.active.get_mut(&e.node)
                    && h.step >= HandoverStep::MoveGroup
                    && h.target_group == e.to_group
                {
                    h.stale_setup_label = None;
                    h.setup_absent_seen = true;
                }
            }
            Kind::NodeObserved(NodeObserved { node, labels, .. }) => {
                // Preparation took the label away after the move: whatever
                // it writes next is fresh.
                if let Some(h) = self.active.get_mut(node)
                    && h.step >= HandoverStep::MoveGroup
                    && labels.get(GROUP_LABEL) == Some(&h.target_group)
                    && !labels.contains_key(GPU_SETUP_COMPLETE_LABEL)
                {
                    h.stale_setup_label = None;
                    h.setup_absent_seen = true;
                }
            }
            Kind::NodeReadinessObserved(e) => {
                advance(&mut self.active, &e.node, HandoverStep::Uncordon)
            }
            Kind::HandoverStalled(e) => {
                if let Some(h) = self.active.get_mut(&e.node) {
                    h.stalled = true;
                }
            }
            Kind::NodeUncordoned(e) => {
                if let Some(h) = self.active.get_mut(&e.node) {
                    h.uncordoned = true;
                }
            }
            Kind::HandoverCompleted(e) => {
                if let Some(mode) = self.active.remove(&e.node).and_then(|h| h.rollback) {
                    self.rollbacks_completing.insert(mode.rollback_id);
                }
                self.completed.insert(e.handover_id.clone(), e.node.clone());
            }
            Kind::RollbackCompleted(e) => {
                self.rollbacks_completing.remove(&e.rollback_id);
            }
            _ => {}
        }
    }

    /// Starts a handover, or refuses it with the reason.
    pub fn start(
        &self,
        cluster: &Cluster,
        held: &std::collections::BTreeSet<String>,
        cmd: &StartHandover,
    ) -> Vec<DomainEvent> {
        let refuse = |reason: String| {
            vec![event(Kind::HandoverRefused(HandoverRefused {
                node: cmd.node.clone(),
                target_group: cmd.target_group.clone(),
                reason,
                would_go_pending: Vec::new(),
            }))]
        };
        let Some(node) = cluster.nodes.get(&cmd.node) else {
            return refuse(format!(
                "node {} is not known: inventory has recorded no such node",
                cmd.node
            ));
        };
        match node.provisioning {
            NodeProvisioning::StaticInstance => {
                return refuse(format!(
                    "node {} is managed by a StaticInstance: it cannot be moved by changing its group label, it is recreated by its own group",
                    cmd.node
                ));
            }
            NodeProvisioning::Cloud => {
                return refuse(format!(
                    "node {} is a cloud node: it cannot be moved by changing its group label, it is recreated by its own group",
                    cmd.node
                ));
            }
            _ => {}
        }
        if let Some(h) = self.active.get(&cmd.node) {
            return refuse(format!(
                "node {} is already being handed over (handover {}, step {})",
                cmd.node,
                h.id,
                h.step.as_str_name()
            ));
        }
        if !strategy(&cluster.backend).group_known(cluster, &cmd.target_group) {
            return refuse(strategy(&cluster.backend).unknown_group(&cmd.target_group));
        }
        let source = node.group().unwrap_or_default().to_string();
        if source == cmd.target_group {
            return refuse(format!(
                "node {} is already in group {}",
                cmd.node, cmd.target_group
            ));
        }
        let (target_stack, reason) = stack_in_group(
            cluster,
            node,
            &cmd.target_group,
            held.contains(&cmd.target_group),
        );
        if target_stack == Stack::None {
            return refuse(format!(
                "in group {} no stack would manage node {} ({}): its cards would sit idle",
                cmd.target_group,
                cmd.node,
                reason.as_str_name()
            ));
        }
        vec![event(Kind::HandoverStarted(HandoverStarted {
            handover_id: cmd.handover_id.clone(),
            node: cmd.node.clone(),
            source_group: source,
            target_group: cmd.target_group.clone(),
            labels_before: node.labels.to_map(),
            taints_before: node.taints.clone(),
            was_unschedulable: node.unschedulable,
            cards_before: cluster.cards(&cmd.node),
        }))]
    }

    /// The `RollbackCompleted` of rollbacks whose handover back completed
    /// without it being recorded.
    pub fn rollbacks_due(&self) -> Vec<DomainEvent> {
        self.rollbacks_completing
            .iter()
            .map(|id| {
                event(Kind::RollbackCompleted(RollbackCompleted {
                    rollback_id: id.clone(),
                }))
            })
            .collect()
    }

    /// The decisions for the handover of `node` (if any), given the facts and the time.
    pub fn decide_node(
        &self,
        cluster: &Cluster,
        held: &std::collections::BTreeSet<String>,
        node: &str,
        now: i64,
    ) -> Vec<DomainEvent> {
        let Some(h) = self.active.get(node) else {
            return Vec::new();
        };
        let Some(facts) = cluster.nodes.get(node) else {
            return self.stall(h, now, format!("node {node} is gone"));
        };
        let decisions = self.step_decisions(cluster, held, h, facts, now);
        match &h.rollback {
            None => decisions,
            Some(mode) => decisions.into_iter().flat_map(|d| mode.wrap(d)).collect(),
        }
    }

    /// The decision that ends the current step, if the facts show it done, or a
    /// stall once its deadline has passed.
    fn step_decisions(
        &self,
        cluster: &Cluster,
        held: &std::collections::BTreeSet<String>,
        h: &Handover,
        facts: &Node,
        now: i64,
    ) -> Vec<DomainEvent> {
        match h.step {
            HandoverStep::Cordon => self.decide_cordoned(cluster, h, facts, now),
            HandoverStep::Drain => self.decide_drained(cluster, h, now),
            HandoverStep::MoveGroup => self.decide_group_changed(cluster, h, facts, now),
            HandoverStep::WaitReady => self.decide_ready(cluster, held, h, facts, now),
            HandoverStep::Uncordon if h.released(facts) => h.completion(),
            HandoverStep::Uncordon | HandoverStep::Unspecified => {
                self.stall(h, now, format!("node {} is still cordoned", h.node))
            }
        }
    }

    /// `NodeCordoned`, with the pods the drain is to evict, once the node is
    /// unschedulable.
    fn decide_cordoned(
        &self,
        cluster: &Cluster,
        h: &Handover,
        facts: &Node,
        now: i64,
    ) -> Vec<DomainEvent> {
        let node = h.node.as_str();
        if !facts.unschedulable {
            return self.stall(h, now, format!("node {node} is not cordoned yet"));
        }
        let to_evict = cluster
            .pods_on(node)
            .filter(|(_, pod)| !pod.is_daemon())
            .map(|((namespace, name), pod)| PodRef {
                namespace: namespace.clone(),
                name: name.clone(),
                owner: pod.owner(namespace),
            })
            .collect();
        vec![event(Kind::NodeCordoned(NodeCordoned {
            handover_id: h.id.clone(),
            node: h.node.clone(),
            was_unschedulable: h.was_unschedulable,
            to_evict,
        }))]
    }

    /// `NodeDrained` once no pod but a DaemonSet's is left on the node; a
    /// stall names those left, and why their eviction was refused.
    fn decide_drained(&self, cluster: &Cluster, h: &Handover, now: i64) -> Vec<DomainEvent> {
        let node = h.node.as_str();
        if !cluster.pods_on(node).any(|(_, pod)| !pod.is_daemon()) {
            return vec![event(Kind::NodeDrained(NodeDrained {
                handover_id: h.id.clone(),
                node: h.node.clone(),
                evicted: h.to_evict.clone(),
            }))];
        }
        let left: Vec<String> = cluster
            .pods_on(node)
            .filter(|(_, pod)| !pod.is_daemon())
            .map(|(key, _)| match cluster.eviction_blocks.get(key) {
                Some(why) => format!("{}/{} (eviction refused: {why})", key.0, key.1),
                None => format!("{}/{}", key.0, key.1),
            })
            .collect();
        self.stall(
            h,
            now,
            format!(
                "{} pods are still on node {node}: {}",
                left.len(),
                left.join(", ")
            ),
        )
    }

    /// `NodeGroupChanged`, with the images before and after, once the node
    /// is moved.
    fn decide_group_changed(
        &self,
        cluster: &Cluster,
        h: &Handover,
        facts: &Node,
        now: i64,
    ) -> Vec<DomainEvent> {
        if !h.moved(cluster, facts) {
            return self.stall(
                h,
                now,
                format!(
                    "node {} is still labelled {}={}",
                    h.node,
                    cluster.backend.group_label(),
                    facts.group().unwrap_or_default()
                ),
            );
        }
        let (labels_before, taints_before) = match &h.rollback {
            None => (h.labels_before.clone(), h.taints_before.clone()),
            Some(mode) => (
                mode.undone.labels_after.clone(),
                mode.undone.taints_after.clone(),
            ),
        };
        vec![event(Kind::NodeGroupChanged(NodeGroupChanged {
            handover_id: h.id.clone(),
            node: h.node.clone(),
            from_group: h.source_group.clone(),
            to_group: h.target_group.clone(),
            labels_before,
            taints_before,
            labels_after: facts.labels.to_map(),
            taints_after: facts.taints.clone(),
        }))]
    }

    /// `NodeReadinessObserved` once the backend finds the node ready for
    /// the stack it gets in its target group; a stall names what it misses.
    fn decide_ready(
        &self,
        cluster: &Cluster,
        held: &std::collections::BTreeSet<String>,
        h: &Handover,
        facts: &Node,
        now: i64,
    ) -> Vec<DomainEvent> {
        let node = h.node.as_str();
        let (stack, _) = stack_in_group(
            cluster,
            facts,
            &h.target_group,
            held.contains(&h.target_group),
        );
        match strategy(&cluster.backend).handover_ready(
            node,
            stack,
            facts,
            cluster,
            h.cards_before,
            h.setup_label_fresh(facts),
        ) {
            Ok(seen) => vec![event(Kind::NodeReadinessObserved(NodeReadinessObserved {
                handover_id: h.id.clone(),
                node: h.node.clone(),
                ..seen
            }))],
            Err(missing) => self.stall(
                h,
                now,
                format!("node {node} is not ready: {}", missing.join("; ")),
            ),
        }
    }

    /// One `HandoverStalled` once the step's deadline has passed.
    fn stall(&self, h: &Handover, now: i64, reason: String) -> Vec<DomainEvent> {
        let deadline = h.step_since + self.deadlines.of(h.step);
        if h.stalled || now <= deadline {
            return Vec::new();
        }
        vec![event(Kind::HandoverStalled(HandoverStalled {
            handover_id: h.id.clone(),
            node: h.node.clone(),
            step: h.step as i32,
            reason,
            deadline_unix_nanos: deadline,
        }))]
    }

    /// What the edge should be doing for the handovers in progress.
    pub fn effects(&self, backend: &Backend) -> Vec<Effect> {
        let node = |h: &Handover| h.node.clone();
        let strategy = strategy(backend);
        self.active
            .values()
            .filter_map(|h| match (h.step, &h.rollback) {
                (HandoverStep::Cordon, _) => Some(Effect::Cordon { node: node(h) }),
                (HandoverStep::Drain, _) => Some(Effect::Drain { node: node(h) }),
                // A backend that moves a node by its group label alone
                // writes only that, forward and back alike.
                (HandoverStep::MoveGroup, _) if strategy.moves_by_group_label() => {
                    strategy.move_by_group_label(&h.node, &h.target_group)
                }
                (HandoverStep::MoveGroup, None) => Some(Effect::MoveToGroup {
                    node: node(h),
                    group: h.target_group.clone(),
                    from_group: h.source_group.clone(),
                }),
                (HandoverStep::MoveGroup, Some(_)) => Some(Effect::RestoreNode {
                    node: node(h),
                    labels: h.labels_before.clone(),
                    taints: h.taints_before.clone(),
                }),
                (HandoverStep::WaitReady | HandoverStep::Unspecified, _) => None,
                (HandoverStep::Uncordon, Some(_)) if h.was_unschedulable => None,
                (HandoverStep::Uncordon, _) => Some(Effect::Uncordon { node: node(h) }),
            })
            .collect()
    }
}

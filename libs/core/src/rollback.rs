//! Rollback planning: a pure function of a log prefix.
//!
//! Rollback happens at two independent levels (reference, "Rollback"): an
//! application goes back to its `nvidia.com/gpu` request and its binding to the
//! source group and is restarted; a node goes back into its group with spec.gpu
//! "in the same order as the handover: cordon, drain, group change,
//! verification". The planner reads the forward steps from the log and returns
//! a `RollbackStarted` that names them (in the order they are undone) and carries
//! the before-images to restore; the cores then carry it out, recording each
//! restoring step as a `StepCompensated` of the forward step it undoes. Nothing
//! in the log is changed or removed.

use switchyard_proto::v1::{
    DomainEvent, HandoverStarted, NodeGroupChanged, RollbackStarted, WorkloadRef,
    WorkloadRewritten, domain_event::Kind, rollback_started::Target,
};

use crate::cluster::workload_key;

/// A log prefix: (sequence, event), in log order.
pub type LogPrefix<'a> = &'a [(u64, DomainEvent)];

/// The event itself, or the compensation a `StepCompensated` carries.
fn effective(event: &DomainEvent) -> Option<&Kind> {
    match &event.kind {
        Some(Kind::StepCompensated(step)) => {
            step.compensation.as_ref().and_then(|c| c.kind.as_ref())
        }
        kind => kind.as_ref(),
    }
}

fn through(log: LogPrefix<'_>) -> u64 {
    log.last().map_or(0, |(seq, _)| *seq)
}

/// Why a rollback cannot be planned from the log.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RollbackRefused {
    #[error("node {node} has not been handed over: there is nothing to roll back")]
    NodeNotHandedOver { node: String },
    #[error(
        "handover {handover_id} of node {node} has not completed; roll back a node once its handover is done"
    )]
    HandoverNotCompleted { node: String, handover_id: String },
    #[error("{kind} {namespace}/{name} has not been moved: there is nothing to roll back")]
    WorkloadNotMoved {
        kind: String,
        namespace: String,
        name: String,
    },
}

/// Plans the rollback of the last handover of `node` in `log`.
pub fn plan_node_rollback(
    log: LogPrefix<'_>,
    node: &str,
    rollback_id: &str,
) -> Result<DomainEvent, RollbackRefused> {
    // The last handover of the node: a forward one, or a rollback's handover back.
    let start = log.iter().rposition(|(_, e)| match &e.kind {
        Some(Kind::HandoverStarted(h)) => h.node == node,
        Some(Kind::RollbackStarted(r)) => r.node_restore.as_ref().is_some_and(|h| h.node == node),
        _ => false,
    });
    let Some(start) = start else {
        return Err(RollbackRefused::NodeNotHandedOver {
            node: node.to_string(),
        });
    };
    let handover: &HandoverStarted = match &log[start].1.kind {
        Some(Kind::HandoverStarted(h)) => h,
        Some(Kind::RollbackStarted(r)) => r.node_restore.as_ref().expect("matched above"),
        _ => unreachable!("matched above"),
    };
    let (mut cordoned, mut changed, mut uncordoned, mut completed) = (None, None, None, false);
    for (seq, event) in &log[start + 1..] {
        match effective(event) {
            Some(Kind::NodeCordoned(e)) if e.handover_id == handover.handover_id => {
                cordoned = Some(*seq)
            }
            Some(Kind::NodeGroupChanged(e)) if e.handover_id == handover.handover_id => {
                changed = Some((*seq, e.clone()))
            }
            Some(Kind::NodeUncordoned(e)) if e.handover_id == handover.handover_id => {
                uncordoned = Some(*seq)
            }
            Some(Kind::HandoverCompleted(e)) if e.handover_id == handover.handover_id => {
                completed = true
            }
            _ => {}
        }
    }
    let (Some(cordoned), Some((changed_seq, changed)), Some(uncordoned), true) =
        (cordoned, changed, uncordoned, completed)
    else {
        return Err(RollbackRefused::HandoverNotCompleted {
            node: node.to_string(),
            handover_id: handover.handover_id.clone(),
        });
    };
    Ok(started(
        rollback_id,
        Target::Node(node.to_string()),
        through(log),
        vec![uncordoned, changed_seq, cordoned],
        Some(HandoverStarted {
            handover_id: rollback_id.to_string(),
            node: node.to_string(),
            source_group: handover.target_group.clone(),
            target_group: handover.source_group.clone(),
            labels_before: handover.labels_before.clone(),
            taints_before: handover.taints_before.clone(),
            was_unschedulable: handover.was_unschedulable,
            cards_before: handover.cards_before,
        }),
        None,
        Some(changed),
    ))
}

/// Plans the rollback of the last manifest rewrite of `workload` in `log`.
pub fn plan_workload_rollback(
    log: LogPrefix<'_>,
    workload: &WorkloadRef,
    rollback_id: &str,
) -> Result<DomainEvent, RollbackRefused> {
    let key = workload_key(workload);
    let last = log
        .iter()
        .rev()
        .find_map(|(seq, event)| match effective(event) {
            Some(Kind::WorkloadRewritten(e))
                if e.workload.as_ref().map(workload_key) == Some(key.clone()) =>
            {
                Some((*seq, e))
            }
            _ => None,
        });
    let Some((seq, rewritten)) = last else {
        return Err(RollbackRefused::WorkloadNotMoved {
            kind: workload.kind.clone(),
            namespace: workload.namespace.clone(),
            name: workload.name.clone(),
        });
    };
    Ok(started(
        rollback_id,
        Target::Workload(workload.clone()),
        through(log),
        vec![seq],
        None,
        Some(WorkloadRewritten {
            move_id: rollback_id.to_string(),
            workload: Some(workload.clone()),
            before: rewritten.after.clone(),
            after: rewritten.before.clone(),
        }),
        None,
    ))
}

#[allow(clippy::too_many_arguments)]
fn started(
    rollback_id: &str,
    target: Target,
    through_sequence: u64,
    plan: Vec<u64>,
    node_restore: Option<HandoverStarted>,
    workload_restore: Option<WorkloadRewritten>,
    undone_group_change: Option<NodeGroupChanged>,
) -> DomainEvent {
    DomainEvent {
        kind: Some(Kind::RollbackStarted(RollbackStarted {
            rollback_id: rollback_id.to_string(),
            target: Some(target),
            through_sequence,
            plan,
            node_restore: node_restore.map(Box::new),
            workload_restore: workload_restore.map(Box::new),
            undone_group_change: undone_group_change.map(Box::new),
        })),
    }
}

//! Aggregates: which log subject an event belongs to.

use std::collections::BTreeMap;

use switchyard_proto::v1::{DomainEvent, WorkloadRef, domain_event::Kind};

use crate::names::ALERT_LABEL_NODE_GROUP;

/// The subject of every service's leader terms.
pub const LEADERS_SUBJECT: &str = "cluster.leaders";

/// A name as one token of a subject: what is not an ASCII letter, digit,
/// `-` or `_` becomes `_`.
pub fn token(s: &str) -> String {
    s.replace(
        |c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'),
        "_",
    )
}

/// The aggregate (log subject) of an event: `node.<name>`, `group.<name>`,
/// `workload.<ns>.<name>`, `cluster.<kind>` for cluster-wide facts.
pub fn subject_of(event: &DomainEvent) -> String {
    let workload = |w: &Option<WorkloadRef>| {
        w.as_ref().map_or("workload.unknown".into(), |w| {
            format!("workload.{}.{}", token(&w.namespace), token(&w.name))
        })
    };
    let Some(kind) = &event.kind else {
        return "cluster.unknown".into();
    };
    match kind {
        Kind::NodeObserved(e) => format!("node.{}", token(&e.node)),
        Kind::NodeRemoved(e) => format!("node.{}", token(&e.node)),
        Kind::StackAssigned(e) => format!("node.{}", token(&e.node)),
        Kind::HandoverStarted(e) => format!("node.{}", token(&e.node)),
        Kind::HandoverRefused(e) => format!("node.{}", token(&e.node)),
        Kind::NodeCordoned(e) => format!("node.{}", token(&e.node)),
        Kind::NodeDrained(e) => format!("node.{}", token(&e.node)),
        Kind::NodeGroupChanged(e) => format!("node.{}", token(&e.node)),
        Kind::NodeReadinessObserved(e) => format!("node.{}", token(&e.node)),
        Kind::NodeUncordoned(e) => format!("node.{}", token(&e.node)),
        Kind::HandoverCompleted(e) => format!("node.{}", token(&e.node)),
        Kind::HandoverStalled(e) => format!("node.{}", token(&e.node)),
        Kind::LeftoverLabelsCleared(e) => format!("node.{}", token(&e.node)),
        Kind::NodeGroupObserved(e) => format!("group.{}", token(&e.group)),
        Kind::NodeGroupRemoved(e) => format!("group.{}", token(&e.group)),
        Kind::NodeGroupHeldOnDra(e) => format!("group.{}", token(&e.group)),
        Kind::NodeGroupReleased(e) => format!("group.{}", token(&e.group)),
        Kind::SourceGroupRetired(e) => format!("group.{}", token(&e.group)),
        Kind::CompletionRefused(e) => format!("group.{}", token(&e.source_group)),
        Kind::WorkloadObserved(e) => workload(&e.workload),
        Kind::WorkloadRemoved(e) => workload(&e.workload),
        Kind::ApplicationMoveStarted(e) => workload(&e.workload),
        Kind::ApplicationMoveRefused(e) => workload(&e.workload),
        Kind::WorkloadRewritten(e) => workload(&e.workload),
        Kind::WorkloadRestarted(e) => workload(&e.workload),
        Kind::ApplicationMoveVerified(e) => workload(&e.workload),
        Kind::PodObserved(e) => format!("pod.{}.{}", token(&e.namespace), token(&e.name)),
        Kind::PodRemoved(e) => format!("pod.{}.{}", token(&e.namespace), token(&e.name)),
        Kind::PhysicalGpuObserved(e) => format!("gpu.{}", token(&e.name)),
        Kind::PhysicalGpuRemoved(e) => format!("gpu.{}", token(&e.name)),
        Kind::GpuClassObserved(e) => format!("gpuclass.{}", token(&e.name)),
        Kind::ResourceSliceObserved(e) => format!("slice.{}", token(&e.name)),
        Kind::ResourceSliceRemoved(e) => format!("slice.{}", token(&e.name)),
        Kind::DeviceClassObserved(e) => format!("deviceclass.{}", token(&e.name)),
        Kind::DeviceClassRemoved(e) => format!("deviceclass.{}", token(&e.name)),
        Kind::EvictionBlocked(e) => format!("node.{}", token(&e.node)),
        Kind::NodeGroupWritten(e) => format!("node.{}", token(&e.node)),
        Kind::GpuClassRemoved(e) => format!("gpuclass.{}", token(&e.name)),
        Kind::GpuClassRetired(e) => format!("gpuclass.{}", token(&e.gpu_class)),
        Kind::ResourceClaimObserved(e) => {
            format!("claim.{}.{}", token(&e.namespace), token(&e.name))
        }
        Kind::ResourceClaimRemoved(e) => {
            format!("claim.{}.{}", token(&e.namespace), token(&e.name))
        }
        Kind::GpuClassCompiled(e) => format!("gpuclass.{}", token(&e.gpu_class)),
        Kind::ResourceQuotaObserved(e) => {
            format!("quota.{}.{}", token(&e.namespace), token(&e.name))
        }
        Kind::ResourceQuotaTranslated(e) => {
            format!("quota.{}.{}", token(&e.namespace), token(&e.name))
        }
        Kind::ModuleSettingsObserved(_) => "cluster.module".into(),
        Kind::RollbackStarted(e) => format!("rollback.{}", token(&e.rollback_id)),
        Kind::StepCompensated(e) => format!("rollback.{}", token(&e.rollback_id)),
        Kind::RollbackCompleted(e) => format!("rollback.{}", token(&e.rollback_id)),
        Kind::MigrationStarted(e) => format!("migration.{}", token(&e.migration_id)),
        // An evidence check outside a migration refused.
        Kind::MigrationRefused(e) if e.migration_id.is_empty() => "cluster.evidence".into(),
        Kind::MigrationRefused(e) => format!("migration.{}", token(&e.migration_id)),
        Kind::WaveStarted(e) => format!("migration.{}", token(&e.migration_id)),
        Kind::WaveCompleted(e) => format!("migration.{}", token(&e.migration_id)),
        Kind::MigrationPaused(e) => format!("migration.{}", token(&e.migration_id)),
        Kind::MigrationResumed(e) => format!("migration.{}", token(&e.migration_id)),
        Kind::MigrationAborted(e) => format!("migration.{}", token(&e.migration_id)),
        Kind::MigrationCompleted(e) => format!("migration.{}", token(&e.migration_id)),
        Kind::AlertRaised(e) => alert(&e.alert_name, &e.labels),
        Kind::AlertCleared(e) => alert(&e.alert_name, &e.labels),
        Kind::ReadinessSelectorsConfigured(_) => "cluster.readiness-selectors".into(),
        Kind::BackendConfigured(_) => "cluster.backend".into(),
        Kind::ExclusivityLost(e) => format!("node.{}", token(&e.node)),
        Kind::ExclusivityRestored(e) => format!("node.{}", token(&e.node)),
        Kind::StackSwitchHeld(e) => format!("node.{}", token(&e.node)),
        Kind::EvidenceRecorded(e) if e.workload.is_some() => workload(&e.workload),
        Kind::EvidenceRecorded(e) => format!("node.{}", token(&e.node)),
        Kind::EvidenceChecked(e) if e.migration_id.is_empty() => "cluster.evidence".into(),
        Kind::EvidenceChecked(e) => format!("migration.{}", token(&e.migration_id)),
        // Every service's terms on one subject: a reader learns them all
        // in one read (see the eventlog's fence).
        Kind::LeaderTermStarted(_) => LEADERS_SUBJECT.into(),
    }
}

fn alert(name: &str, labels: &BTreeMap<String, String>) -> String {
    match labels.get(ALERT_LABEL_NODE_GROUP) {
        Some(group) => format!("alert.{}.{}", token(name), token(group)),
        None => format!("alert.{}", token(name)),
    }
}

/// The process an event is a step of — a handover, an application move or a
/// rollback — by its id; `None` for facts and one-off decisions. A process's
/// steps share the correlation id of the command that started it.
pub fn process_of(event: &DomainEvent) -> Option<&str> {
    let id = match event.kind.as_ref()? {
        Kind::HandoverStarted(e) => &e.handover_id,
        Kind::NodeCordoned(e) => &e.handover_id,
        Kind::NodeDrained(e) => &e.handover_id,
        Kind::NodeGroupChanged(e) => &e.handover_id,
        Kind::NodeReadinessObserved(e) => &e.handover_id,
        Kind::NodeUncordoned(e) => &e.handover_id,
        Kind::HandoverCompleted(e) => &e.handover_id,
        Kind::HandoverStalled(e) => &e.handover_id,
        Kind::ApplicationMoveStarted(e) => &e.move_id,
        Kind::WorkloadRewritten(e) => &e.move_id,
        Kind::WorkloadRestarted(e) => &e.move_id,
        Kind::ApplicationMoveVerified(e) => &e.move_id,
        Kind::RollbackStarted(e) => &e.rollback_id,
        Kind::StepCompensated(e) => &e.rollback_id,
        Kind::RollbackCompleted(e) => &e.rollback_id,
        Kind::MigrationStarted(e) => &e.migration_id,
        Kind::WaveStarted(e) => &e.migration_id,
        Kind::WaveCompleted(e) => &e.migration_id,
        Kind::MigrationPaused(e) => &e.migration_id,
        Kind::MigrationResumed(e) => &e.migration_id,
        Kind::MigrationAborted(e) => &e.migration_id,
        Kind::MigrationCompleted(e) => &e.migration_id,
        // A wave's evidence is a step of its migration; the operator's own
        // check, outside one, a process of its own.
        Kind::EvidenceRecorded(e) if e.migration_id.is_empty() => &e.check_id,
        Kind::EvidenceRecorded(e) => &e.migration_id,
        Kind::EvidenceChecked(e) if e.migration_id.is_empty() => &e.check_id,
        Kind::EvidenceChecked(e) => &e.migration_id,
        _ => return None,
    };
    (!id.is_empty()).then_some(id.as_str())
}

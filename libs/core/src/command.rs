//! Operators' commands: what a person asks a service to do. They are not in
//! the log; what the owning service decides on one is.

use switchyard_proto::v1::{DomainEvent, MigrationStarted, WorkloadRef};

/// An operator's request to hand `node` over to `target_group`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StartHandover {
    pub handover_id: String,
    pub node: String,
    pub target_group: String,
    /// Hand the last device-plugin node over even though `nvidia.com/gpu`
    /// workloads would go Pending.
    pub force: bool,
}

/// An operator's request to move a workload to `target_group`, requesting `gpu_class`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MoveApplication {
    pub move_id: String,
    pub workload: WorkloadRef,
    /// Empty: the one group without `spec.gpu` that has ready nodes.
    pub target_group: String,
    pub gpu_class: String,
    /// Edit the manifest in place even if something else keeps it.
    pub allow_managed: bool,
}

/// An operator's request to complete the migration away from `source_group`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Complete {
    pub source_group: String,
    /// The GPU class whose devices the quotas are translated to.
    pub gpu_class: String,
    /// The trial period on DRA is over: rollbacks are no longer needed.
    pub trial_period_over: bool,
}

/// What an operator does to a running migration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MigrationAction {
    Pause,
    Resume,
    /// End it; the current wave is rolled back (by the rollbacks the
    /// operator's CLI plans from the log and sends with it).
    Abort,
}

/// An operator's request to pause, resume or abort a migration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControlMigration {
    pub migration_id: String,
    pub action: MigrationAction,
    pub reason: String,
}

/// An operator's request to check the exit evidence now and record it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckEvidence {
    pub check_id: String,
    /// Empty: every GPU node and every verified move.
    pub migration_id: String,
    /// One wave (0-based) of the migration; `None`: its waves started so far.
    pub wave: Option<u32>,
}

/// The id of a wave's own evidence check.
pub fn wave_evidence_id(migration_id: &str, wave: u32) -> String {
    format!("{migration_id}/wave-{}/evidence", wave + 1)
}

/// The id of the handover of `node` in wave `wave` (0-based) of a migration.
pub fn wave_handover_id(migration_id: &str, wave: u32, node: &str) -> String {
    format!("{migration_id}/wave-{}/{node}", wave + 1)
}

/// The id of the move of `workload` in wave `wave` (0-based) of a migration.
pub fn wave_move_id(migration_id: &str, wave: u32, workload: &WorkloadRef) -> String {
    format!(
        "{migration_id}/wave-{}/{}/{}/{}",
        wave + 1,
        workload.namespace,
        workload.kind,
        workload.name
    )
}

/// An operator's command, for the service that owns it.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    StartHandover(StartHandover),
    MoveApplication(MoveApplication),
    Complete(Complete),
    /// A migration's plan: its waves, to run by themselves.
    Migrate(MigrationStarted),
    ControlMigration(ControlMigration),
    CheckEvidence(CheckEvidence),
    /// A planned rollback (`RollbackStarted`), for the node's or workload's owner.
    Rollback(DomainEvent),
}

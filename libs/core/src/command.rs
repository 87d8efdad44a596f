//! Operators' commands: what a person asks a service to do. They are not in
//! the log; what the owning service decides on one is.

use switchyard_proto::v1::{DomainEvent, MigrationStarted, WorkloadRef, domain_event::Kind};

use crate::service_name::ServiceName;

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
    /// One stage of the NVIDIA guide's table, checked on the cluster as it is.
    pub stage: Option<crate::claim_allocator::stages::Stage>,
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

impl Command {
    /// The command's name, e.g. `StartHandover` (a span's name).
    pub fn name(&self) -> &'static str {
        match self {
            Command::StartHandover(_) => "StartHandover",
            Command::MoveApplication(_) => "MoveApplication",
            Command::Complete(_) => "Complete",
            Command::Migrate(_) => "Migrate",
            Command::ControlMigration(_) => "ControlMigration",
            Command::CheckEvidence(_) => "CheckEvidence",
            Command::Rollback(_) => "Rollback",
        }
    }

    /// The process the command starts, by the id its sender gave it — a
    /// handover, a move, a rollback, a migration, an evidence check of its
    /// own. Sent again with the same id (an operator whose `--wait` was cut
    /// short types it again), it starts nothing new: the runtime answers
    /// with the process already recorded.
    pub fn process(&self) -> Option<&str> {
        let id = match self {
            Command::StartHandover(c) => &c.handover_id,
            Command::MoveApplication(c) => &c.move_id,
            Command::Migrate(m) => &m.migration_id,
            Command::CheckEvidence(c) if c.migration_id.is_empty() => &c.check_id,
            Command::Rollback(event) => return crate::subjects::process_of(event),
            // These act on what exists: each one is a new decision.
            Command::CheckEvidence(_) | Command::Complete(_) | Command::ControlMigration(_) => {
                return None;
            }
        };
        (!id.is_empty()).then_some(id.as_str())
    }

    /// Why this command is not the one that started its process, whose
    /// first record is `first`: the same id given to another node, workload
    /// or group. `None` when it is the same request.
    pub fn differs_from(&self, first: &DomainEvent) -> Option<String> {
        use switchyard_proto::v1::domain_event::Kind;
        use switchyard_proto::v1::rollback_started::Target;
        let id = self.process().unwrap_or_default();
        let asked: String;
        let started: String;
        match (self, first.kind.as_ref()) {
            (Command::StartHandover(c), Some(Kind::HandoverStarted(s))) => {
                asked = format!("node {} to group {}", c.node, c.target_group);
                started = format!("node {} to group {}", s.node, s.target_group);
            }
            (Command::MoveApplication(c), Some(Kind::ApplicationMoveStarted(s))) => {
                let workload = |w: Option<&WorkloadRef>| {
                    w.map_or("?".into(), |w| {
                        format!("{} {}/{}", w.kind, w.namespace, w.name)
                    })
                };
                asked = format!("{} to class {}", workload(Some(&c.workload)), c.gpu_class);
                started = format!("{} to class {}", workload(s.workload.as_ref()), s.gpu_class);
            }
            (Command::Migrate(m), Some(Kind::MigrationStarted(s))) => {
                asked = format!("group {} to {}", m.source_group, m.target_group);
                started = format!("group {} to {}", s.source_group, s.target_group);
            }
            (Command::Rollback(event), Some(Kind::RollbackStarted(s))) => {
                let target = |t: Option<&Target>| match t {
                    Some(Target::Node(n)) => format!("node {n}"),
                    Some(Target::Workload(w)) => {
                        format!("{} {}/{}", w.kind, w.namespace, w.name)
                    }
                    None => "?".into(),
                };
                let Some(Kind::RollbackStarted(r)) = &event.kind else {
                    return Some(format!("{id} is a rollback; this command is not one"));
                };
                asked = target(r.target.as_ref());
                started = target(s.target.as_ref());
            }
            (
                Command::CheckEvidence(_),
                Some(Kind::EvidenceRecorded(_) | Kind::EvidenceChecked(_)),
            ) => {
                return None;
            }
            _ => {
                return Some(format!(
                    "{id} is already the id of another kind of process (its first record: {})",
                    first.kind.as_ref().map_or("none", |k| k.type_name())
                ));
            }
        }
        (asked != started).then(|| {
            format!(
                "{id} was started for {started}; this command asks for {asked} (give it a new id)"
            )
        })
    }
}

impl Command {
    /// The service that owns the command.
    pub fn owner(&self) -> ServiceName {
        match self {
            Command::StartHandover(_) => ServiceName::StackAssigner,
            Command::MoveApplication(_)
            | Command::Complete(_)
            | Command::Migrate(_)
            | Command::ControlMigration(_)
            | Command::CheckEvidence(_) => ServiceName::ClaimAllocator,
            Command::Rollback(event) => match &event.kind {
                Some(Kind::RollbackStarted(r)) if r.node_restore.is_some() => {
                    ServiceName::StackAssigner
                }
                _ => ServiceName::ClaimAllocator,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use switchyard_proto::v1::domain_event::Kind;
    use switchyard_proto::v1::{ApplicationMoveStarted, HandoverStarted, event};

    use super::*;

    fn handover(id: &str, node: &str) -> Command {
        Command::StartHandover(StartHandover {
            handover_id: id.into(),
            node: node.into(),
            target_group: "gpu-dra".into(),
            force: false,
        })
    }

    #[test]
    fn a_command_names_the_process_it_starts_and_only_that() {
        assert_eq!(handover("h1", "n1").process(), Some("h1"));
        assert_eq!(handover("", "n1").process(), None);
        let complete = Command::Complete(Complete {
            source_group: "gpu".into(),
            gpu_class: "h100".into(),
            trial_period_over: false,
        });
        assert_eq!(complete.process(), None);
        let own_check = |migration: &str| {
            Command::CheckEvidence(CheckEvidence {
                check_id: "c1".into(),
                migration_id: migration.into(),
                wave: None,
                stage: None,
            })
        };
        assert_eq!(own_check("").process(), Some("c1"));
        // A migration's check is one more step of the migration.
        assert_eq!(own_check("m1").process(), None);
    }

    #[test]
    fn the_same_id_for_something_else_is_named() {
        let started = event(Kind::HandoverStarted(HandoverStarted {
            handover_id: "h1".into(),
            node: "n1".into(),
            source_group: "gpu".into(),
            target_group: "gpu-dra".into(),
            ..Default::default()
        }));
        assert_eq!(handover("h1", "n1").differs_from(&started), None);
        assert_eq!(
            handover("h1", "n2").differs_from(&started).as_deref(),
            Some(
                "h1 was started for node n1 to group gpu-dra; this command asks for node n2 to group gpu-dra (give it a new id)"
            )
        );
        let moved = event(Kind::ApplicationMoveStarted(ApplicationMoveStarted {
            move_id: "h1".into(),
            ..Default::default()
        }));
        assert_eq!(
            handover("h1", "n1").differs_from(&moved).as_deref(),
            Some(
                "h1 is already the id of another kind of process (its first record: ApplicationMoveStarted)"
            )
        );
    }
}

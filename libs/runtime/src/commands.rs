//! Operator commands over NATS: a service takes them as requests on
//! `switchyard.cmd.<service>` and answers with its decisions or a refusal.

use std::time::Duration;

use prost::Message;
use switchyard_core::command::{
    CheckEvidence, Complete, ControlMigration, MigrationAction, MoveApplication, StartHandover,
};
use switchyard_core::{Command, ServiceName};
use switchyard_proto::v1::migration_control_command::Action;
use switchyard_proto::v1::{CommandReply, ServiceCommand, domain_event::Kind, service_command};

/// How long a command may wait for the service's answer.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(30);

/// The NATS subject a service takes commands on.
pub fn command_subject(service: ServiceName) -> String {
    format!("switchyard.cmd.{service}")
}

/// A command that could not be sent or was not answered.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("{service} did not answer within {} s", REPLY_TIMEOUT.as_secs())]
    Timeout { service: ServiceName },
    #[error("send the command to {service}: {source}")]
    Request {
        service: ServiceName,
        #[source]
        source: async_nats::RequestError,
    },
    #[error("{service}'s answer is not a CommandReply: {source}")]
    Reply {
        service: ServiceName,
        #[source]
        source: prost::DecodeError,
    },
}

/// Why a request is not a command a service takes.
#[derive(Debug, thiserror::Error)]
pub enum CommandRefused {
    #[error("the command is not a ServiceCommand: {0}")]
    Undecodable(#[from] prost::DecodeError),
    #[error(
        "the command is empty: expected start_handover, rollback, move_application or complete"
    )]
    Empty,
    #[error("actor: expected the operator's identity, got nothing")]
    NoActor,
    #[error("actor: {0:?} is a service's name; expected the operator's identity")]
    ActorIsAService(String),
    #[error("start_handover: handover_id, node and target_group must all be set")]
    IncompleteHandover,
    #[error(
        "move_application: move_id, workload (namespace, kind, name) and gpu_class must all be set"
    )]
    IncompleteMove,
    #[error("complete: source_group and gpu_class must both be set")]
    IncompleteCompletion,
    #[error("migrate: migration_id, source_group, target_group and gpu_class must all be set")]
    IncompleteMigration,
    #[error("control_migration: migration_id and an action (pause, resume, abort) must be set")]
    IncompleteControl,
    #[error("check_evidence: check_id must be set")]
    IncompleteEvidenceCheck,
    #[error("check_evidence: wave is set without migration_id; expected both or neither")]
    WaveWithoutMigration,
    #[error("rollback: expected a RollbackStarted event")]
    NotARollback,
    #[error("{service} does not take this command; {owner} does")]
    NotOwner {
        service: ServiceName,
        owner: ServiceName,
    },
}

/// A command as a service takes it: what is asked, by whom, for which
/// migration or wave.
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub command: Command,
    /// The correlation id of the decisions; empty: each process's own id.
    pub correlation_id: String,
    /// Who asks (recorded as the actor of the command's decisions).
    pub actor: String,
}

/// Reads a request into a command, or says why it is refused.
pub fn decode(request: &[u8]) -> Result<Request, CommandRefused> {
    let request = ServiceCommand::decode(request)?;
    if request.actor.is_empty() {
        return Err(CommandRefused::NoActor);
    }
    if request.actor.parse::<ServiceName>().is_ok() {
        return Err(CommandRefused::ActorIsAService(request.actor));
    }
    let Some(command) = request.command else {
        return Err(CommandRefused::Empty);
    };
    Ok(Request {
        command: command_of(command)?,
        correlation_id: request.correlation_id,
        actor: request.actor,
    })
}

fn command_of(command: service_command::Command) -> Result<Command, CommandRefused> {
    match command {
        service_command::Command::StartHandover(c) => {
            if c.node.is_empty() || c.target_group.is_empty() || c.handover_id.is_empty() {
                return Err(CommandRefused::IncompleteHandover);
            }
            Ok(Command::StartHandover(StartHandover {
                handover_id: c.handover_id,
                node: c.node,
                target_group: c.target_group,
                force: c.force,
            }))
        }
        service_command::Command::Rollback(event) => {
            if !matches!(event.kind, Some(Kind::RollbackStarted(_))) {
                return Err(CommandRefused::NotARollback);
            }
            Ok(Command::Rollback(event))
        }
        service_command::Command::MoveApplication(c) => {
            let workload = c.workload.unwrap_or_default();
            if c.move_id.is_empty()
                || c.gpu_class.is_empty()
                || workload.namespace.is_empty()
                || workload.kind.is_empty()
                || workload.name.is_empty()
            {
                return Err(CommandRefused::IncompleteMove);
            }
            Ok(Command::MoveApplication(MoveApplication {
                move_id: c.move_id,
                workload,
                target_group: c.target_group,
                gpu_class: c.gpu_class,
                allow_managed: c.allow_managed,
            }))
        }
        service_command::Command::Complete(c) => {
            if c.source_group.is_empty() || c.gpu_class.is_empty() {
                return Err(CommandRefused::IncompleteCompletion);
            }
            Ok(Command::Complete(Complete {
                source_group: c.source_group,
                gpu_class: c.gpu_class,
                trial_period_over: c.trial_period_over,
            }))
        }
        service_command::Command::Migrate(plan) => {
            if plan.migration_id.is_empty()
                || plan.source_group.is_empty()
                || plan.target_group.is_empty()
                || plan.gpu_class.is_empty()
            {
                return Err(CommandRefused::IncompleteMigration);
            }
            Ok(Command::Migrate(plan))
        }
        service_command::Command::ControlMigration(c) => {
            let action = match Action::try_from(c.action) {
                Ok(Action::Pause) => MigrationAction::Pause,
                Ok(Action::Resume) => MigrationAction::Resume,
                Ok(Action::Abort) => MigrationAction::Abort,
                Ok(Action::Unspecified) | Err(_) => return Err(CommandRefused::IncompleteControl),
            };
            if c.migration_id.is_empty() {
                return Err(CommandRefused::IncompleteControl);
            }
            Ok(Command::ControlMigration(ControlMigration {
                migration_id: c.migration_id,
                action,
                reason: c.reason,
            }))
        }
        service_command::Command::CheckEvidence(c) => {
            if c.check_id.is_empty() {
                return Err(CommandRefused::IncompleteEvidenceCheck);
            }
            if c.wave.is_some() && c.migration_id.is_empty() {
                return Err(CommandRefused::WaveWithoutMigration);
            }
            Ok(Command::CheckEvidence(CheckEvidence {
                check_id: c.check_id,
                migration_id: c.migration_id,
                wave: c.wave,
            }))
        }
    }
}

/// Sends a command to a running service and waits for its reply.
pub async fn send(
    client: &async_nats::Client,
    service: ServiceName,
    command: ServiceCommand,
) -> Result<CommandReply, CommandError> {
    let reply = tokio::time::timeout(
        REPLY_TIMEOUT,
        client.request(command_subject(service), command.encode_to_vec().into()),
    )
    .await
    .map_err(|_| CommandError::Timeout { service })?
    .map_err(|source| CommandError::Request { service, source })?;
    CommandReply::decode(reply.payload).map_err(|source| CommandError::Reply { service, source })
}

//! Operator commands over NATS: a service takes them as requests on
//! `switchyard.cmd.<service>` and answers with its decisions or a refusal.

use std::time::Duration;

use prost::Message;
use switchyard_core::command::StartHandover;
use switchyard_core::{Command, ServiceName};
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
    #[error("the command is empty: expected start_handover or rollback")]
    Empty,
    #[error("start_handover: handover_id, node and target_group must all be set")]
    IncompleteHandover,
    #[error("rollback: expected a RollbackStarted event")]
    NotARollback,
    #[error("{service} does not take this command; {owner} does")]
    NotOwner {
        service: ServiceName,
        owner: ServiceName,
    },
}

/// Reads a request into a command, or says why it is refused.
pub fn decode(request: &[u8]) -> Result<Command, CommandRefused> {
    let Some(command) = ServiceCommand::decode(request)?.command else {
        return Err(CommandRefused::Empty);
    };
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

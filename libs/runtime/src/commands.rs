//! Operator commands over NATS: a service takes them as requests on
//! `switchyard.cmd.<service>` and answers with its decisions or a refusal.

use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use prost::Message;
use switchyard_core::claim_allocator::Stage;
use switchyard_core::command::{
    CheckEvidence, Complete, ControlMigration, MigrationAction, MoveApplication, StartHandover,
};
use switchyard_core::{Command, ServiceName};
use switchyard_eventlog::SigningKey;
use switchyard_eventlog::keys::Keyring;
use switchyard_eventlog::trace;
use switchyard_proto::v1::migration_control_command::Action;
use switchyard_proto::v1::{CommandReply, ServiceCommand, domain_event::Kind, service_command};
use tracing::Instrument;

/// How long a command may wait for the service's answer.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a command is sent again while nothing subscribes to its
/// service's subject (a restart, a rollout): nobody received it, so sending
/// it again cannot do it twice.
pub const NO_RESPONDERS_PATIENCE: Duration = Duration::from_secs(30);
/// How long a command is sent again while its service answers that it
/// could not take it yet (`send_again`: its view of the log not caught up,
/// after a NATS server went away): nothing was decided, so sending it again
/// cannot do it twice.
pub const CATCHING_UP_PATIENCE: Duration = Duration::from_secs(60);

/// How far a signed command's time may be from the service's clock (either
/// way: clocks differ a little): older, it is refused as a replay.
pub const COMMAND_VALIDITY: Duration = Duration::from_secs(300);

/// The NATS subject a service takes commands on.
pub fn command_subject(service: ServiceName) -> String {
    format!("switchyard.cmd.{service}")
}

/// A command that could not be sent or was not answered.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error(
        "{service} did not answer in time: the command may have been taken (the service stopped before it answered?); `switchyard status` shows whether it was, before you send it again"
    )]
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
    #[error(
        "the answer to the command is not {service}'s: {why} (a forged answer: \
         something other than {service} answers on switchyard.cmd.{service})"
    )]
    Unauthenticated { service: ServiceName, why: String },
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
    #[error(
        "the command is not signed: this service takes commands signed by an operator's key \
         (`--signing-key`, a seed from `switchyard keys new`)"
    )]
    Unsigned,
    #[error("the command's signature by {signer} does not hold: {why}")]
    BadSignature { signer: String, why: String },
    #[error("the command is signed by {signer}, a key of no identity in the keyring")]
    UnknownSigner { signer: String },
    #[error("the command is signed by {identity}, a service; expected an operator's key")]
    SignedByService { identity: String },
    #[error(
        "issued_at_unix_nanos: signed {age_seconds} s from this service's clock; \
         expected within {} s (a command sent again later is refused)",
        COMMAND_VALIDITY.as_secs()
    )]
    Stale { age_seconds: i64 },
    #[error("actor: {actor:?} is not the signer's identity {identity:?}")]
    ActorIsNotSigner { actor: String, identity: String },
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
    #[error("check_evidence.stage: {0}")]
    UnknownStage(String),
    #[error(
        "check_evidence: stage is set with migration_id; a stage is checked on the cluster as it is, a migration's waves by migration and wave"
    )]
    StageInMigration,
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

/// The name of the command a request carries (`StartHandover`), or
/// `unreadable` — for its span, before it is checked.
pub fn name_of(request: &[u8]) -> &'static str {
    ServiceCommand::decode(request)
        .ok()
        .and_then(|r| r.command)
        .and_then(|c| command_of(c).ok())
        .map_or("unreadable", |c| c.name())
}

/// Reads a request into a command, or says why it is refused. With a
/// keyring, the command must be signed by an operator's key of it, at most
/// [`COMMAND_VALIDITY`] from `now` (Unix nanoseconds), and its actor is the
/// identity that key belongs to — whatever the request says of itself.
pub fn decode(
    request: &[u8],
    keyring: Option<&Keyring>,
    now: i64,
) -> Result<Request, CommandRefused> {
    let mut request = ServiceCommand::decode(request)?;
    if let Some(keyring) = keyring {
        let identity = signed_by(&request, keyring, now)?;
        if !request.actor.is_empty() && request.actor != identity {
            return Err(CommandRefused::ActorIsNotSigner {
                actor: request.actor,
                identity,
            });
        }
        request.actor = identity;
    }
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

/// The keyring identity whose key signed `request`, if it is an operator's
/// and the command is recent.
fn signed_by(
    request: &ServiceCommand,
    keyring: &Keyring,
    now: i64,
) -> Result<String, CommandRefused> {
    if request.signer.is_empty() || request.signature.is_empty() {
        return Err(CommandRefused::Unsigned);
    }
    let signer = request.signer.clone();
    let bad = |why: String| CommandRefused::BadSignature {
        signer: signer.clone(),
        why,
    };
    let mut unsigned = request.clone();
    unsigned.signature = Vec::new();
    verify(&signer, &unsigned.encode_to_vec(), &request.signature).map_err(bad)?;
    let Some(identity) = keyring.identity_of(&signer) else {
        return Err(CommandRefused::UnknownSigner { signer });
    };
    if identity.parse::<ServiceName>().is_ok() {
        return Err(CommandRefused::SignedByService {
            identity: identity.to_string(),
        });
    }
    let age = now.saturating_sub(request.issued_at_unix_nanos);
    if age.unsigned_abs() > COMMAND_VALIDITY.as_nanos() as u64 {
        return Err(CommandRefused::Stale {
            age_seconds: age / 1_000_000_000,
        });
    }
    Ok(identity.to_string())
}

/// Checks an ed25519 signature by an NKey user public key.
fn verify(signer: &str, bytes: &[u8], signature: &[u8]) -> Result<(), String> {
    let key = nkeys::KeyPair::from_public_key(signer)
        .map_err(|e| format!("the signer is not an NKey public key: {e}"))?;
    if key.key_pair_type() != nkeys::KeyPairType::User {
        return Err("the signer is not a user key (U...)".into());
    }
    key.verify(bytes, signature).map_err(|e| e.to_string())
}

/// Signs `command` as the operator whose key `key` is, at `now` (Unix
/// nanoseconds).
pub fn sign(command: &mut ServiceCommand, key: &SigningKey, now: i64) {
    command.issued_at_unix_nanos = now;
    command.signer = key.public_key();
    command.signature = Vec::new();
    command.signature = key
        .sign(&command.encode_to_vec())
        .expect("a key pair with its seed signs");
}

/// Signs `reply` as the service whose key `key` is, as the answer to the
/// command whose bytes are `request`.
pub fn sign_reply(reply: &mut CommandReply, request: &[u8], key: &SigningKey) {
    reply.command_digest = blake3::hash(request).as_bytes().to_vec();
    reply.signer = key.public_key();
    reply.signature = Vec::new();
    reply.signature = key
        .sign(&reply.encode_to_vec())
        .expect("a key pair with its seed signs");
}

/// Whether `reply` is `service`'s answer to the command whose bytes are
/// `request`: signed by a key the keyring lists for `service`, over this
/// command's digest.
pub fn check_reply(
    reply: &CommandReply,
    request: &[u8],
    service: ServiceName,
    keyring: &Keyring,
) -> Result<(), CommandError> {
    let fail = |why: String| CommandError::Unauthenticated { service, why };
    if reply.signer.is_empty() || reply.signature.is_empty() {
        return Err(fail("it is not signed".into()));
    }
    let mut unsigned = reply.clone();
    unsigned.signature = Vec::new();
    verify(&reply.signer, &unsigned.encode_to_vec(), &reply.signature).map_err(|why| {
        fail(format!(
            "its signature by {} does not hold: {why}",
            reply.signer
        ))
    })?;
    match keyring.identity_of(&reply.signer) {
        Some(identity) if identity == service.as_str() => {}
        Some(identity) => return Err(fail(format!("it is signed by {identity}"))),
        None => {
            return Err(fail(format!(
                "it is signed by {}, a key of no identity in the keyring",
                reply.signer
            )));
        }
    }
    if reply.command_digest != blake3::hash(request).as_bytes() {
        return Err(fail("it answers another command".into()));
    }
    Ok(())
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
            let stage = match c.stage.as_str() {
                "" => None,
                name => Some(Stage::parse(name).map_err(CommandRefused::UnknownStage)?),
            };
            if stage.is_some() && !c.migration_id.is_empty() {
                return Err(CommandRefused::StageInMigration);
            }
            Ok(Command::CheckEvidence(CheckEvidence {
                check_id: c.check_id,
                migration_id: c.migration_id,
                wave: c.wave,
                stage,
            }))
        }
    }
}

/// Sends a command to a running service and waits for its reply; with a
/// keyring, the reply must be the service's own answer to this command.
async fn send_once(
    client: &async_nats::Client,
    service: ServiceName,
    command: ServiceCommand,
    keyring: Option<&Keyring>,
) -> Result<CommandReply, CommandError> {
    let request = command.encode_to_vec();
    // A command that names its process (a handover's, a move's, ... id) is
    // answered the same way when it comes again: the service follows what
    // the first one started, or decides it once if it never got it.
    let parsed = command.command.clone().and_then(|c| command_of(c).ok());
    let resumable = parsed.as_ref().is_some_and(|c| c.process().is_some());
    // The command's span is the root of what it starts: its trace context
    // goes with the request, for the service to continue.
    let trace::Traced { span, context } = trace::span_in(None, || {
        tracing::info_span!(
            "command",
            otel.name = %format_args!("send {}", parsed.as_ref().map_or("command", Command::name)),
            %service,
        )
    });
    let mut headers = async_nats::HeaderMap::new();
    trace::insert_headers(&mut headers, context.as_ref().map(trace::to_w3c).as_ref());
    let once = || async {
        tokio::time::timeout(
            REPLY_TIMEOUT,
            client.request_with_headers(
                command_subject(service),
                headers.clone(),
                request.clone().into(),
            ),
        )
        .await
        .map_err(|_| CommandError::Timeout { service })?
        .map_err(|source| match source.kind() {
            async_nats::RequestErrorKind::TimedOut => CommandError::Timeout { service },
            _ => CommandError::Request { service, source },
        })
    };
    let timeouts = std::sync::atomic::AtomicU32::new(0);
    // Nobody took it: sent again while the service comes back. Not answered
    // (the service may have stopped after taking it): sent again, a few
    // times, only if it names its process; another command could be decided
    // twice, and the error says to look first.
    let reply = once
        .retry(
            ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(100))
                .with_max_delay(Duration::from_secs(2))
                .with_total_delay(Some(NO_RESPONDERS_PATIENCE))
                .without_max_times(),
        )
        .when(|err| match err {
            CommandError::Request { source, .. } => {
                source.kind() == async_nats::RequestErrorKind::NoResponders
            }
            CommandError::Timeout { .. } => {
                resumable && timeouts.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < 3
            }
            _ => false,
        })
        .notify(|err, pause| {
            tracing::info!(%service, ?pause, %err, "not answered (the service restarting?): sending the command again");
        })
        .instrument(span)
        .await?;
    let reply = CommandReply::decode(reply.payload)
        .map_err(|source| CommandError::Reply { service, source })?;
    if let Some(keyring) = keyring {
        check_reply(&reply, &request, service, keyring)?;
    }
    Ok(reply)
}

/// Sends a command to a running service and waits for its reply; with a
/// keyring, the reply must be the service's own answer to this command.
/// Sent again for up to [`CATCHING_UP_PATIENCE`] while the service answers
/// that it could not take the command yet (nothing decided): the operator
/// waits for a service catching up with the log rather than types the
/// command again.
pub async fn send(
    client: &async_nats::Client,
    service: ServiceName,
    command: ServiceCommand,
    keyring: Option<&Keyring>,
) -> Result<CommandReply, CommandError> {
    let once = || async {
        let reply = send_once(client, service, command.clone(), keyring).await?;
        if reply.send_again {
            return Err(NotYet::Reply(reply));
        }
        Ok(reply)
    };
    let answered = once
        .retry(
            ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(200))
                .with_max_delay(Duration::from_secs(2))
                .with_total_delay(Some(CATCHING_UP_PATIENCE))
                .without_max_times(),
        )
        .when(|err| matches!(err, NotYet::Reply(_)))
        .notify(|err, pause| {
            if let NotYet::Reply(reply) = err {
                tracing::info!(%service, ?pause, why = %reply.error, "not taken yet: sending the command again");
            }
        })
        .await;
    match answered {
        Ok(reply) | Err(NotYet::Reply(reply)) => Ok(reply),
        Err(NotYet::Failed(err)) => Err(err),
    }
}

/// A [`send`] attempt that did not end in an answer to keep.
enum NotYet {
    /// Answered "not taken yet".
    Reply(CommandReply),
    Failed(CommandError),
}

impl From<CommandError> for NotYet {
    fn from(err: CommandError) -> Self {
        NotYet::Failed(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;
    use std::sync::Arc;
    use switchyard_proto::v1::StartHandoverCommand;

    const NOW: i64 = 1_764_000_000_000_000_000;

    struct Keys {
        operator: SigningKey,
        assigner: SigningKey,
        ring: Keyring,
    }

    fn keys() -> Keys {
        let operator = Arc::new(nkeys::KeyPair::new_user());
        let assigner = Arc::new(nkeys::KeyPair::new_user());
        let ring = Keyring::from_identities(
            "test",
            BTreeMap::from([
                ("ops@example.com".to_string(), vec![operator.public_key()]),
                ("stack-assigner".to_string(), vec![assigner.public_key()]),
            ]),
        )
        .unwrap();
        Keys {
            operator,
            assigner,
            ring,
        }
    }

    fn handover(actor: &str) -> ServiceCommand {
        ServiceCommand {
            command: Some(service_command::Command::StartHandover(
                StartHandoverCommand {
                    handover_id: "h1".into(),
                    node: "n1".into(),
                    target_group: "gpu-dra".into(),
                    force: false,
                },
            )),
            actor: actor.into(),
            ..ServiceCommand::default()
        }
    }

    fn signed(mut command: ServiceCommand, key: &SigningKey, at: i64) -> Vec<u8> {
        sign(&mut command, key, at);
        command.encode_to_vec()
    }

    #[test]
    fn a_signed_command_is_recorded_as_its_signers_identity() {
        let k = keys();
        let request = decode(&signed(handover(""), &k.operator, NOW), Some(&k.ring), NOW).unwrap();
        assert_eq!(request.actor, "ops@example.com");
        // The actor the request states must be the signer's, if stated.
        let same = signed(handover("ops@example.com"), &k.operator, NOW);
        assert_eq!(
            decode(&same, Some(&k.ring), NOW + 1).unwrap().actor,
            "ops@example.com"
        );
        // Without a keyring the service takes the stated actor, as before.
        assert_eq!(
            decode(&handover("alice").encode_to_vec(), None, NOW)
                .unwrap()
                .actor,
            "alice"
        );
    }

    #[test]
    fn every_command_the_keyring_does_not_vouch_for_is_refused_with_why() {
        let k = keys();
        let refusal =
            |bytes: &[u8], now: i64| decode(bytes, Some(&k.ring), now).unwrap_err().to_string();
        assert!(
            refusal(&handover("alice").encode_to_vec(), NOW)
                .starts_with("the command is not signed")
        );
        assert_eq!(
            refusal(&signed(handover("alice"), &k.operator, NOW), NOW),
            "actor: \"alice\" is not the signer's identity \"ops@example.com\""
        );
        assert_eq!(
            refusal(&signed(handover(""), &k.assigner, NOW), NOW),
            "the command is signed by stack-assigner, a service; expected an operator's key"
        );
        let stranger = Arc::new(nkeys::KeyPair::new_user());
        assert!(
            refusal(&signed(handover(""), &stranger, NOW), NOW).contains("a key of no identity")
        );
        // Sent again ten minutes later.
        let old = signed(handover(""), &k.operator, NOW);
        assert!(
            refusal(&old, NOW + 600_000_000_000).starts_with("issued_at_unix_nanos: signed 600 s")
        );
        // Changed after signing: another node.
        let mut tampered = handover("");
        sign(&mut tampered, &k.operator, NOW);
        if let Some(service_command::Command::StartHandover(c)) = &mut tampered.command {
            c.node = "n2".into();
        }
        assert!(refusal(&tampered.encode_to_vec(), NOW).contains("signature by"));
    }

    #[test]
    fn only_the_services_own_answer_to_this_command_is_taken() {
        let k = keys();
        let request = signed(handover(""), &k.operator, NOW);
        let mut genuine = CommandReply::default();
        sign_reply(&mut genuine, &request, &k.assigner);
        assert!(check_reply(&genuine, &request, ServiceName::StackAssigner, &k.ring).is_ok());
        let why = |reply: &CommandReply, request: &[u8]| {
            check_reply(reply, request, ServiceName::StackAssigner, &k.ring)
                .unwrap_err()
                .to_string()
        };
        // A rogue's answer, unsigned: a forged refusal.
        let forged = CommandReply {
            error: "node is busy".into(),
            ..CommandReply::default()
        };
        assert!(
            why(&forged, &request).contains("it is not signed"),
            "{}",
            why(&forged, &request)
        );
        // Signed by an operator, not by the service.
        let mut by_operator = forged.clone();
        sign_reply(&mut by_operator, &request, &k.operator);
        assert!(why(&by_operator, &request).contains("it is signed by ops@example.com"));
        // The service's genuine answer to an earlier command, sent again.
        let other = signed(handover(""), &k.operator, NOW + 1);
        assert!(why(&genuine, &other).contains("it answers another command"));
        // Changed after signing.
        let mut altered = genuine.clone();
        altered.error = "refused".into();
        assert!(why(&altered, &request).contains("does not hold"));
    }
}

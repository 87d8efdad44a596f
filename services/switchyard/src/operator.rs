//! What every command that changes the cluster shares: it goes to the owning
//! service over NATS with the operator's identity and the migration's
//! correlation id, prints the decisions in words, and with `--wait` follows
//! the log until the process it started is done, printing each step as it
//! is recorded and why it is held when it stalls.

use std::collections::BTreeSet;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use futures::StreamExt;
use switchyard_core::ServiceName;
use switchyard_core::subjects::process_of;
use switchyard_eventlog::keys::Keyring;
use switchyard_eventlog::{Decoded, EventLog, now_nanos};
use switchyard_proto::v1::{CommandReply, DomainEvent, ServiceCommand, domain_event::Kind};
use switchyard_runtime::connect::NatsArgs;

use crate::output::{Format, write_stdout};

/// Who asks, for which migration, and whether to wait for the outcome.
#[derive(Args, Debug, Clone)]
pub struct OperatorArgs {
    /// Who asks, where the services take unsigned commands (no keyring):
    /// recorded as the actor of the decisions; default $USER. With
    /// `--signing-key` the actor is the identity the keyring gives the key,
    /// and a different `--actor` is refused.
    #[arg(long, env = "SWITCHYARD_ACTOR")]
    pub actor: Option<String>,
    /// The keyring the chart publishes: the service's answer must be signed
    /// by its key, over this command (a forged answer is an error).
    #[arg(long, env = "SWITCHYARD_KEYRING")]
    pub keyring: Option<std::path::PathBuf>,
    /// The migration or wave this belongs to (the decisions' correlation id);
    /// default: the process's own id.
    #[arg(long, env = "SWITCHYARD_CORRELATION_ID")]
    pub correlation_id: Option<String>,
    /// Follow the process until it is done, printing each step.
    #[arg(long, env = "SWITCHYARD_WAIT")]
    pub wait: bool,
    /// How long --wait waits before giving up (the process goes on).
    #[arg(long, default_value = "15m", value_parser = humantime::parse_duration, env = "SWITCHYARD_TIMEOUT")]
    pub timeout: Duration,
    /// table: a line per step, in words; json / yaml: the decisions themselves.
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Table, env = "SWITCHYARD_OUTPUT")]
    pub output: Format,
    #[command(flatten)]
    pub nats: NatsArgs,
}

/// Exit codes: done (0), refused or failed (1), still going at the timeout (2).
const REFUSED: u8 = 1;
const TIMED_OUT: u8 = 2;

impl OperatorArgs {
    /// The operator's identity as the request states it: `--actor`; else,
    /// signed, none (the service records the key's identity); else the login
    /// name.
    pub fn actor(&self) -> anyhow::Result<String> {
        if let Some(actor) = &self.actor {
            return Ok(actor.clone());
        }
        if self.nats.signing_key.is_some() {
            return Ok(String::new());
        }
        std::env::var("USER")
            .ok()
            .filter(|a| !a.is_empty())
            .context("actor: say who asks with --actor (or SWITCHYARD_ACTOR); $USER is not set")
    }

    fn keyring(&self) -> anyhow::Result<Option<Keyring>> {
        Ok(match &self.keyring {
            Some(path) => Some(Keyring::load(path)?),
            None => None,
        })
    }

    /// Sends `command` to `service` and reports the outcome (waiting for it
    /// with `--wait`).
    pub async fn run(
        &self,
        service: ServiceName,
        command: switchyard_proto::v1::service_command::Command,
    ) -> anyhow::Result<ExitCode> {
        if self.output == Format::Patch {
            anyhow::bail!("-o patch: only with --dry-run (`switchyard move --dry-run -o patch`)");
        }
        let actor = self.actor()?;
        let client = self.nats.client("cli").await?;
        // Behind the fence, as the services read it.
        let log = if self.wait {
            let stored = self.nats.stream.open(client.clone(), false).await?;
            Some(switchyard_eventlog::fence::Fenced::new(
                std::sync::Arc::new(stored),
            ))
        } else {
            None
        };
        // Where to follow from: nothing the command decides is before this.
        let from = match &log {
            Some(log) => log.last_sequence(None).await? + 1,
            None => 0,
        };
        let request = self.request(actor, command)?;
        let keyring = self.keyring()?;
        let reply =
            switchyard_runtime::commands::send(&client, service, request, keyring.as_ref()).await?;
        let refused = self.report(&reply)?;
        if refused {
            return Ok(ExitCode::from(REFUSED));
        }
        // Sent again (the same id): followed from its first record, which
        // shows what it did before this command too.
        let from = match reply.resumed_from_sequence {
            0 => from,
            first => first,
        };
        match log {
            Some(log) => self.follow(&log, from, &reply).await,
            None => Ok(ExitCode::SUCCESS),
        }
    }

    /// Sends `command` to `service` as the operator; the service's answer.
    pub async fn send(
        &self,
        service: ServiceName,
        command: switchyard_proto::v1::service_command::Command,
    ) -> anyhow::Result<CommandReply> {
        let request = self.request(self.actor()?, command)?;
        let keyring = self.keyring()?;
        let client = self.nats.client("cli").await?;
        Ok(switchyard_runtime::commands::send(&client, service, request, keyring.as_ref()).await?)
    }

    fn request(
        &self,
        actor: String,
        command: switchyard_proto::v1::service_command::Command,
    ) -> anyhow::Result<ServiceCommand> {
        let mut request = ServiceCommand {
            command: Some(command),
            correlation_id: self.correlation_id.clone().unwrap_or_default(),
            actor,
            ..ServiceCommand::default()
        };
        if let Some(key) = self.nats.signer()? {
            switchyard_runtime::commands::sign(&mut request, &key, now_nanos());
        }
        Ok(request)
    }

    /// Prints the service's answer; true if it refused.
    pub fn report(&self, reply: &CommandReply) -> anyhow::Result<bool> {
        if !reply.error.is_empty() {
            eprintln!("refused: {}", reply.error);
            return Ok(true);
        }
        if !reply.resumed_process.is_empty() {
            eprintln!(
                "{} was started already (its first record: sequence {}); nothing new is decided",
                reply.resumed_process, reply.resumed_from_sequence
            );
        }
        for decision in &reply.decisions {
            self.print(decision)?;
        }
        // Refused: nothing but refusals. Completion decides what it can and
        // says what waits (the source group kept for the trial period).
        Ok(!reply.decisions.is_empty() && reply.decisions.iter().all(is_refusal))
    }

    /// The records of `process` from sequence `from` up to the first that
    /// `last` accepts, as recorded (a process answered as resumed).
    pub async fn recorded(
        &self,
        process: &str,
        from: u64,
        last: impl Fn(&DomainEvent) -> bool,
    ) -> anyhow::Result<Vec<DomainEvent>> {
        let client = self.nats.client("cli").await?;
        let log = self.nats.stream.open(client, false).await?;
        let end = log.last_sequence(None).await?;
        let mut stream = log.follow(None, from).await?;
        let mut events = Vec::new();
        while let Some(next) = stream.next().await {
            let next = next?;
            if let Decoded::Event(event) = next.decode()
                && process_of(&event) == Some(process)
            {
                let done = last(&event);
                events.push(event);
                if done {
                    return Ok(events);
                }
            }
            if next.sequence >= end {
                break;
            }
        }
        anyhow::bail!("the log has no end of {process} after sequence {from}")
    }

    pub(crate) fn print(&self, event: &DomainEvent) -> anyhow::Result<()> {
        let text = match self.output {
            Format::Table => format!("{}\n", describe(event)),
            Format::Json => format!("{}\n", serde_json::to_string(event)?),
            Format::Yaml | Format::Patch => format!("---\n{}", serde_yaml_ng::to_string(event)?),
        };
        write_stdout(&text)
    }

    /// Follows the log from `from` until every process the reply started is
    /// done, printing their steps (and the evictions refused on their nodes).
    async fn follow(
        &self,
        log: &dyn EventLog,
        from: u64,
        reply: &CommandReply,
    ) -> anyhow::Result<ExitCode> {
        let mut open: BTreeSet<String> = reply
            .decisions
            .iter()
            .filter_map(process_of)
            .map(str::to_string)
            .chain((!reply.resumed_process.is_empty()).then(|| reply.resumed_process.clone()))
            .collect();
        let mut nodes: BTreeSet<String> = reply.decisions.iter().filter_map(node_of).collect();
        // The reply's decisions are printed already; they come again first.
        let mut printed: Vec<&DomainEvent> = reply.decisions.iter().collect();
        let paused = |d: &DomainEvent| matches!(d.kind, Some(Kind::MigrationPaused(_)));
        for done in reply
            .decisions
            .iter()
            .filter(|d| ends_process(d) || paused(d))
        {
            if let Some(p) = process_of(done) {
                open.remove(p);
            }
        }
        let deadline = Instant::now() + self.timeout;
        let mut stream = log.follow(None, from).await?;
        while !open.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            let next = match tokio::time::timeout(left, stream.next()).await {
                Ok(Some(next)) => next?,
                Ok(None) => anyhow::bail!("the log ended while waiting"),
                Err(_) => {
                    let open: Vec<String> = open.into_iter().collect();
                    eprintln!(
                        "timed out after {}: still going: {} (it goes on; follow it with `switchyard status`)",
                        humantime::format_duration(self.timeout),
                        open.join(", ")
                    );
                    return Ok(ExitCode::from(TIMED_OUT));
                }
            };
            let Decoded::Event(event) = next.decode() else {
                continue;
            };
            // A migration's own steps, and the handovers and moves of its
            // waves (their ids start with the migration's).
            let ours = process_of(&event).is_some_and(|p| {
                open.contains(p) || open.iter().any(|o| p.starts_with(&format!("{o}/")))
            }) || matches!(&event.kind, Some(Kind::EvictionBlocked(b)) if nodes.contains(&b.node));
            if !ours {
                continue;
            }
            nodes.extend(node_of(&event));
            if let Some(i) = printed.iter().position(|p| **p == event) {
                printed.swap_remove(i);
                continue;
            }
            self.print(&event)?;
            if let Some(Kind::MigrationPaused(p)) = &event.kind {
                // A pause ends the wait: the breaker's says why it stopped.
                return Ok(if p.tripped {
                    ExitCode::from(REFUSED)
                } else {
                    ExitCode::SUCCESS
                });
            }
            if ends_process(&event)
                && let Some(p) = process_of(&event)
            {
                open.remove(p);
            }
        }
        Ok(ExitCode::SUCCESS)
    }
}

fn is_refusal(event: &DomainEvent) -> bool {
    matches!(
        &event.kind,
        Some(
            Kind::HandoverRefused(_)
                | Kind::ApplicationMoveRefused(_)
                | Kind::CompletionRefused(_)
                | Kind::MigrationRefused(_)
        )
    )
}

/// The last step of a process: after it nothing more is recorded for it.
fn ends_process(event: &DomainEvent) -> bool {
    matches!(
        &event.kind,
        Some(
            Kind::HandoverCompleted(_)
                | Kind::ApplicationMoveVerified(_)
                | Kind::RollbackCompleted(_)
                | Kind::MigrationCompleted(_)
                | Kind::MigrationAborted(_)
        )
    )
}

/// The node a handover (or a node's rollback) works on.
fn node_of(event: &DomainEvent) -> Option<String> {
    match &event.kind {
        Some(Kind::HandoverStarted(e)) => Some(e.node.clone()),
        Some(Kind::RollbackStarted(e)) => e.node_restore.as_ref().map(|h| h.node.clone()),
        _ => None,
    }
}

fn workload(w: &Option<switchyard_proto::v1::WorkloadRef>) -> String {
    w.as_ref().map_or("?".into(), |w| {
        format!("{} {}/{}", w.kind, w.namespace, w.name)
    })
}

/// An event in words, for people.
pub fn describe(event: &DomainEvent) -> String {
    let Some(kind) = &event.kind else {
        return "(empty event)".into();
    };
    describe_handover(kind)
        .or_else(|| describe_application(kind))
        .or_else(|| describe_migration(kind))
        .or_else(|| describe_evidence(kind))
        .unwrap_or_else(|| kind.type_name().to_string())
}

/// A handover's or a node's event in words; None for any other.
fn describe_handover(kind: &Kind) -> Option<String> {
    let text = match kind {
        Kind::HandoverStarted(e) => format!(
            "handover {} of node {} started: {} -> {}",
            e.handover_id, e.node, e.source_group, e.target_group
        ),
        Kind::HandoverRefused(e) => format!(
            "handover of node {} to {} refused: {}",
            e.node, e.target_group, e.reason
        ),
        Kind::NodeCordoned(e) => format!(
            "node {} cordoned; {} pod(s) to evict",
            e.node,
            e.to_evict.len()
        ),
        Kind::NodeDrained(e) => format!(
            "node {} drained ({} pod(s) evicted)",
            e.node,
            e.evicted.len()
        ),
        Kind::NodeGroupChanged(e) => format!(
            "node {} moved from group {} to {}",
            e.node, e.from_group, e.to_group
        ),
        Kind::NodeReadinessObserved(e) => format!(
            "node {} ready: gpu-setup-complete {}, gpu-stack=dra {}, {}/{} PhysicalGPUs Ready, node agent running {}, vendor adapter running {}",
            e.node,
            e.gpu_setup_complete,
            e.gpu_stack_dra,
            e.ready_physical_gpus,
            e.expected_physical_gpus,
            e.node_agent_running,
            e.vendor_adapter_running
        ),
        Kind::NodeUncordoned(e) => format!("node {} uncordoned", e.node),
        Kind::HandoverCompleted(e) => format!(
            "handover {} done: node {} serves group {}",
            e.handover_id, e.node, e.target_group
        ),
        Kind::HandoverStalled(e) => format!(
            "handover {} of node {} is held: {}",
            e.handover_id, e.node, e.reason
        ),
        Kind::EvictionBlocked(e) => format!(
            "eviction of pod {}/{} from node {} refused: {}{}",
            e.namespace,
            e.pod,
            e.node,
            e.reason,
            if e.disruption_budgets.is_empty() {
                String::new()
            } else {
                format!(" (PodDisruptionBudget {})", e.disruption_budgets.join(", "))
            }
        ),
        _ => return None,
    };
    Some(text)
}

/// An application move's, a completion's or a rollback's event in words; None for any other.
fn describe_application(kind: &Kind) -> Option<String> {
    let text = match kind {
        Kind::ApplicationMoveStarted(e) => format!(
            "move {} of {} started: group {} -> {}, class {}",
            e.move_id,
            workload(&e.workload),
            if e.source_group.is_empty() {
                "(none)"
            } else {
                &e.source_group
            },
            e.target_group,
            e.gpu_class
        ),
        Kind::ApplicationMoveRefused(e) => {
            format!("move of {} refused: {}", workload(&e.workload), e.reason)
        }
        Kind::WorkloadRewritten(e) => format!("{} rewritten", workload(&e.workload)),
        Kind::WorkloadRestarted(e) => format!("{} restarted", workload(&e.workload)),
        Kind::ApplicationMoveVerified(e) => format!(
            "move {} done: {} runs on {} with {} claim(s) allocated",
            e.move_id,
            workload(&e.workload),
            e.pod_nodes.join(", "),
            e.claims_allocated
        ),
        Kind::ResourceQuotaTranslated(e) => format!(
            "ResourceQuota {}/{} translated: {:?} -> {:?}",
            e.namespace, e.name, e.hard_before, e.hard_after
        ),
        Kind::LeftoverLabelsCleared(e) => format!(
            "node {}: leftover labels cleared: {}",
            e.node,
            e.removed.keys().cloned().collect::<Vec<_>>().join(", ")
        ),
        Kind::SourceGroupRetired(e) if e.next_step.is_empty() => {
            format!("group {} retired (spec.gpu removed)", e.group)
        }
        Kind::SourceGroupRetired(e) => format!("pool {} retired; next: {}", e.group, e.next_step),
        Kind::CompletionRefused(e) => format!(
            "completion of group {} refused: {}",
            e.source_group, e.reason
        ),
        Kind::RollbackStarted(e) => format!(
            "rollback {} started: {} step(s) to undo",
            e.rollback_id,
            e.plan.len()
        ),
        Kind::StepCompensated(e) => {
            let what = e
                .compensation
                .as_deref()
                .map_or_else(|| "a step".to_string(), describe);
            format!("rollback {}: undone: {what}", e.rollback_id)
        }
        Kind::RollbackCompleted(e) => format!("rollback {} done", e.rollback_id),
        _ => return None,
    };
    Some(text)
}

/// A migration's or a wave's event in words; None for any other.
fn describe_migration(kind: &Kind) -> Option<String> {
    let text = match kind {
        Kind::MigrationStarted(e) => format!(
            "migration {} started: {} -> {}, class {}, {} wave(s) of at most {} node(s)",
            e.migration_id,
            e.source_group,
            e.target_group,
            e.gpu_class,
            e.waves.len(),
            e.max_unavailable
        ),
        Kind::MigrationRefused(e) => format!("migration {} refused: {}", e.migration_id, e.reason),
        Kind::WaveStarted(e) => format!(
            "migration {}: wave {} started: nodes {}; then moves {}",
            e.migration_id,
            e.wave + 1,
            e.nodes.join(", "),
            e.workloads
                .iter()
                .map(|w| format!("{} {}/{}", w.kind, w.namespace, w.name))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Kind::WaveCompleted(e) => {
            format!("migration {}: wave {} done", e.migration_id, e.wave + 1)
        }
        Kind::MigrationPaused(e) => format!(
            "migration {} paused in wave {}{}: {}",
            e.migration_id,
            e.wave + 1,
            if e.tripped {
                " by the circuit breaker"
            } else {
                ""
            },
            e.reason
        ),
        Kind::MigrationResumed(e) => {
            format!(
                "migration {} resumed in wave {}",
                e.migration_id,
                e.wave + 1
            )
        }
        Kind::MigrationAborted(e) => format!(
            "migration {} aborted in wave {}: {}",
            e.migration_id,
            e.wave + 1,
            e.reason
        ),
        Kind::MigrationCompleted(e) => {
            format!("migration {} done: {} wave(s)", e.migration_id, e.waves)
        }
        _ => return None,
    };
    Some(text)
}

/// An evidence event in words; None for any other.
fn describe_evidence(kind: &Kind) -> Option<String> {
    let text = match kind {
        Kind::EvidenceRecorded(e) => {
            let subject = match &e.workload {
                Some(_) => workload(&e.workload),
                None => format!("node {}", e.node),
            };
            let wave = if !e.stage.is_empty() {
                format!(" (stage {})", e.stage)
            } else if e.migration_id.is_empty() {
                String::new()
            } else {
                format!(" (migration {}, wave {})", e.migration_id, e.wave + 1)
            };
            let mut text = format!(
                "evidence of {subject}{wave}: {}",
                if e.passed { "passed" } else { "FAILED" }
            );
            for item in &e.items {
                text.push_str(&format!(
                    "\n  {:<6} {}: {}",
                    if item.passed { "ok" } else { "FAILED" },
                    item.check,
                    item.detail
                ));
            }
            text
        }
        Kind::EvidenceChecked(e) => format!(
            "evidence {}{}: {} node(s), {} workload(s), {} failed",
            e.check_id,
            if !e.stage.is_empty() {
                format!(" (stage {})", e.stage)
            } else if e.migration_id.is_empty() {
                String::new()
            } else {
                format!(" (migration {}, wave {})", e.migration_id, e.wave + 1)
            },
            e.nodes,
            e.workloads,
            e.failed
        ),
        _ => return None,
    };
    Some(text)
}

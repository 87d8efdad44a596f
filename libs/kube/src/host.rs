//! A decision service as a process: its core, the log and the cluster.
//!
//! On start the core is rebuilt by folding the whole log, then asked what a
//! crash may have kept from being recorded ([`ServiceCore::catch_up`]). From
//! then on the host follows the log: another service's record goes to the core
//! and the decisions are appended; its own records were folded when decided
//! and are skipped. Time passes in ticks (deadlines). Operator commands arrive
//! as NATS requests on `switchyard.cmd.<service>`. After each input the core's
//! effects are executed by the [`Edge`]; an effect still wanted is issued again
//! after a pause that doubles with each failure.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt};
use prost::Message;
use switchyard_core::effects::Effect;
use switchyard_core::handover::StartHandover;
use switchyard_eventlog::{Decoded, EventLog};
use switchyard_proto::v1::{
    CommandReply, DomainEvent, ServiceCommand, domain_event::Kind, service_command,
};
use switchyard_runtime::{
    ALERTER, CLAIM_ALLOCATOR, CLASS_COMPILER, Command, INVENTORY, NODE_AGENT, Record,
    STACK_ASSIGNER, ServiceCore,
};
use tokio::sync::watch;

use crate::edge::{Edge, EdgeError, Outcome};
use crate::{append_as, now_nanos};

/// Records taken from the log at once before the effects are issued.
const FOLLOW_BATCH: usize = 512;

/// The NATS subject a service takes commands on.
pub fn command_subject(service: &str) -> String {
    format!("switchyard.cmd.{service}")
}

#[derive(Clone, Debug)]
pub struct HostOptions {
    /// How often time passes for the core (deadlines, stalls).
    pub tick: Duration,
    /// How long an issued effect may take to show in the facts before it is
    /// issued again.
    pub reissue: Duration,
    /// Objects written at once.
    pub parallel: usize,
}

impl Default for HostOptions {
    fn default() -> Self {
        HostOptions {
            tick: Duration::from_secs(1),
            reissue: Duration::from_secs(2),
            parallel: 16,
        }
    }
}

/// What the host reports to probes: the sequence up to which it has caught up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// True once the rebuild from the log is done.
    pub ready: bool,
    pub sequence: u64,
}

fn actor_name(actor: &str) -> &'static str {
    [
        INVENTORY,
        NODE_AGENT,
        STACK_ASSIGNER,
        CLASS_COMPILER,
        CLAIM_ALLOCATOR,
        ALERTER,
    ]
    .into_iter()
    .find(|name| *name == actor)
    .unwrap_or("operator")
}

struct Host {
    core: Box<dyn ServiceCore>,
    log: Arc<dyn EventLog>,
    edge: Option<Edge>,
    options: HostOptions,
    /// Sequences this host appended (already folded): skipped when followed.
    own: BTreeSet<u64>,
    /// Effect (debug form) -> when last issued and how many failures in a row.
    issued: BTreeMap<String, (Instant, u32)>,
    /// Eviction refusals already recorded, by pod.
    blocked: BTreeMap<(String, String), DomainEvent>,
}

impl Host {
    async fn append(&mut self, decisions: &[DomainEvent]) -> anyhow::Result<()> {
        if decisions.is_empty() {
            return Ok(());
        }
        let sequences = append_as(&self.log, self.core.name(), decisions, now_nanos()).await?;
        self.own.extend(sequences);
        Ok(())
    }

    async fn command(&mut self, request: &[u8]) -> CommandReply {
        let refuse = |error: String| CommandReply {
            decisions: Vec::new(),
            error,
        };
        let command = match ServiceCommand::decode(request) {
            Err(err) => return refuse(format!("the command is not a ServiceCommand: {err}")),
            Ok(ServiceCommand { command: None }) => {
                return refuse("the command is empty: expected start_handover or rollback".into());
            }
            Ok(ServiceCommand {
                command: Some(command),
            }) => command,
        };
        let command = match command {
            service_command::Command::StartHandover(c) => {
                if c.node.is_empty() || c.target_group.is_empty() || c.handover_id.is_empty() {
                    return refuse(
                        "start_handover: handover_id, node and target_group must all be set".into(),
                    );
                }
                Command::StartHandover(StartHandover {
                    handover_id: c.handover_id,
                    node: c.node,
                    target_group: c.target_group,
                })
            }
            service_command::Command::Rollback(event) => {
                if !matches!(event.kind, Some(Kind::RollbackStarted(_))) {
                    return refuse("rollback: expected a RollbackStarted event".into());
                }
                Command::Rollback(event)
            }
        };
        if command.owner() != self.core.name() {
            return refuse(format!(
                "{} does not take this command; {} does",
                self.core.name(),
                command.owner()
            ));
        }
        let decisions = self.core.command(&command, now_nanos());
        match self.append(&decisions).await {
            Ok(()) => CommandReply {
                decisions,
                error: String::new(),
            },
            Err(err) => refuse(format!("the decisions could not be recorded: {err}")),
        }
    }

    /// Issues the effects the core wants now, unless issued a moment ago.
    /// Objects are written concurrently (up to `options.parallel`); the
    /// effects on one object one after the other, in the core's order.
    async fn execute_effects(&mut self) -> anyhow::Result<()> {
        let Some(edge) = self.edge.clone() else {
            return Ok(());
        };
        let effects: Vec<(String, Effect)> = self
            .core
            .effects()
            .into_iter()
            .map(|e| (format!("{e:?}"), e))
            .collect();
        let wanted: BTreeSet<&String> = effects.iter().map(|(key, _)| key).collect();
        self.issued.retain(|key, _| wanted.contains(key));
        let mut by_object: BTreeMap<String, Vec<(String, Effect)>> = BTreeMap::new();
        for (key, effect) in effects {
            if let Some((at, failures)) = self.issued.get(&key) {
                let pause = self.options.reissue * 2u32.pow((*failures).min(5));
                if at.elapsed() < pause {
                    continue;
                }
            }
            by_object
                .entry(effect.object())
                .or_default()
                .push((key, effect));
        }
        let results: Vec<(String, Result<Outcome, EdgeError>)> =
            futures::stream::iter(by_object.into_values().map(|effects| {
                let edge = edge.clone();
                async move {
                    let mut done = Vec::with_capacity(effects.len());
                    for (key, effect) in effects {
                        tracing::debug!(?effect, "issuing");
                        done.push((key, edge.execute(&effect).await));
                    }
                    done
                }
            }))
            .buffer_unordered(self.options.parallel.max(1))
            .flat_map(futures::stream::iter)
            .collect()
            .await;
        let mut news = Vec::new();
        for (key, result) in results {
            match result {
                Ok(outcome) => {
                    if !outcome.evicted.is_empty() {
                        tracing::info!(evicted = ?outcome.evicted, "evictions accepted");
                    }
                    self.issued.insert(key, (Instant::now(), 0));
                    for block in outcome.blocked {
                        let event = DomainEvent {
                            kind: Some(Kind::EvictionBlocked(block.clone())),
                        };
                        let pod = (block.namespace.clone(), block.pod.clone());
                        if self.blocked.get(&pod) != Some(&event) {
                            tracing::warn!(node = block.node, pod = %format!("{}/{}", pod.0, pod.1), reason = block.reason, budgets = ?block.disruption_budgets, "eviction refused");
                            self.blocked.insert(pod, event.clone());
                            news.push(event);
                        }
                    }
                }
                Err(err) => {
                    let failures = self.issued.get(&key).map_or(0, |(_, f)| f + 1);
                    tracing::warn!(%err, failures, "effect failed; it is issued again later");
                    self.issued.insert(key, (Instant::now(), failures));
                }
            }
        }
        for event in &news {
            self.core.fold(event, now_nanos());
        }
        self.append(&news).await
    }
}

/// Runs a decision service until the log fails or `shutdown` fires.
pub async fn run(
    mut core: Box<dyn ServiceCore>,
    log: Arc<dyn EventLog>,
    edge: Option<Edge>,
    commands: Option<async_nats::Client>,
    options: HostOptions,
    progress: watch::Sender<Progress>,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut last = 0;
    let folded = switchyard_eventlog::replay(log.as_ref(), 0, |stored| {
        if let Decoded::Event(event) = stored.decode() {
            core.fold(&event, stored.envelope.recorded_at_unix_nanos);
        }
        last = stored.sequence;
    })
    .await?;
    tracing::info!(service = core.name(), folded, elapsed = ?started.elapsed(), "rebuilt from the log");
    let mut host = Host {
        core,
        log: log.clone(),
        edge,
        options: options.clone(),
        own: BTreeSet::new(),
        issued: BTreeMap::new(),
        blocked: BTreeMap::new(),
    };
    let due = host.core.catch_up(now_nanos());
    if !due.is_empty() {
        tracing::info!(
            decisions = due.len(),
            "recording decisions the log was missing"
        );
    }
    host.append(&due).await?;
    let _ = progress.send(Progress {
        ready: true,
        sequence: last,
    });
    let mut follow = log.follow(None, last + 1).await?;
    let mut requests = match &commands {
        Some(client) => Some(
            client
                .subscribe(command_subject(host.core.name()))
                .await
                .map_err(|e| anyhow::anyhow!("subscribe to commands: {e}"))?,
        ),
        None => None,
    };
    let mut tick = tokio::time::interval(options.tick);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    host.execute_effects().await?;
    loop {
        tokio::select! {
            stored = follow.next() => {
                // This record and whatever else is ready: decided together,
                // appended together, then the effects issued once.
                let mut batch = vec![stored];
                while batch.len() < FOLLOW_BATCH {
                    match follow.next().now_or_never() {
                        Some(next) => batch.push(next),
                        None => break,
                    }
                }
                let mut decisions = Vec::new();
                for stored in batch {
                    let Some(stored) = stored else {
                        anyhow::bail!("the log's follow stream ended");
                    };
                    let stored = stored?;
                    let _ = progress.send(Progress { ready: true, sequence: stored.sequence });
                    if host.own.remove(&stored.sequence) {
                        continue;
                    }
                    let Decoded::Event(event) = stored.decode() else { continue };
                    let actor = actor_name(&stored.envelope.actor);
                    if actor == host.core.name() {
                        // Written by an earlier run of this service: fold only.
                        host.core.fold(&event, stored.envelope.recorded_at_unix_nanos);
                        continue;
                    }
                    decisions.extend(host.core.on_record(&Record { actor, event }, now_nanos()));
                }
                host.append(&decisions).await?;
            }
            _ = tick.tick() => {
                let decisions = host.core.tick(now_nanos());
                host.append(&decisions).await?;
            }
            Some(request) = async {
                match requests.as_mut() {
                    Some(sub) => sub.next().await,
                    None => std::future::pending().await,
                }
            } => {
                let reply = host.command(&request.payload).await;
                if let (Some(to), Some(client)) = (request.reply, &commands) {
                    client
                        .publish(to, reply.encode_to_vec().into())
                        .await
                        .map_err(|e| anyhow::anyhow!("reply to a command: {e}"))?;
                }
            }
        }
        host.execute_effects().await?;
    }
}

/// Sends a command to a running service and waits for its reply.
pub async fn send_command(
    client: &async_nats::Client,
    service: &str,
    command: ServiceCommand,
) -> anyhow::Result<CommandReply> {
    let reply = tokio::time::timeout(
        Duration::from_secs(30),
        client.request(command_subject(service), command.encode_to_vec().into()),
    )
    .await
    .map_err(|_| anyhow::anyhow!("{service} did not answer within 30 s"))?
    .map_err(|e| anyhow::anyhow!("send the command to {service}: {e}"))?;
    Ok(CommandReply::decode(reply.payload)?)
}

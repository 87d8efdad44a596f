//! A service as a process: its core, the log and an [`EffectExecutor`].
//!
//! On start the core is rebuilt by folding the whole log, then asked what a
//! crash may have kept from being recorded ([`Core::catch_up`]). From then on
//! the host follows the log: another service's record goes to the core and the
//! decisions are appended; its own records were folded when decided and are
//! skipped. Time passes in ticks (deadlines). Operator commands arrive as NATS
//! requests on `switchyard.cmd.<service>` ([`crate::commands`]). After each
//! input the core's effects are handed to the executor; an effect still
//! wanted is issued again after a pause that grows with each failure
//! (exponential backoff, from `reissue` up to 32 times that).

pub use crate::health::Progress;
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use prost::Message;
use switchyard_core::effects::{Effect, EffectExecutor};
use switchyard_core::subjects::{process_of, subject_of};
use switchyard_core::{Command, Core, Input, ServiceName};
use switchyard_eventlog::keys::{Keyring, KeyringError};
use switchyard_eventlog::trace::{self, SpanContext};
use switchyard_eventlog::{
    Attributed, Decoded, EventLog, LogError, ReadRequest, StoredEvent, UnknownReason,
    append_attributed, now_nanos,
};
use switchyard_proto::v1::{CommandReply, DomainEvent, TraceContext, domain_event::Kind, event};
use tokio::sync::watch;
use tracing::Instrument;

use crate::AbortOnDrop;
use crate::commands::{self, command_subject};
use crate::metrics::ServiceMetrics;

/// Records taken from the log at once before the effects are issued.
const FOLLOW_BATCH: usize = 512;

/// The flags of every service hosted on the log: where the log is, and how
/// the host runs the core.
#[derive(clap::Args, Clone, Debug)]
pub struct ServiceArgs {
    #[command(flatten)]
    pub nats: crate::connect::NatsArgs,
    #[command(flatten)]
    pub host: HostArgs,
    #[command(flatten)]
    pub election: crate::leader::ElectionArgs,
}

/// How the host runs a core and its effects.
#[derive(clap::Args, Clone, Debug)]
pub struct HostArgs {
    /// Serve the gRPC health protocol (grpc.health.v1) here, for probes.
    #[arg(long, env = "SWITCHYARD_HEALTH_LISTEN")]
    pub health_listen: Option<SocketAddr>,
    /// Serve Prometheus metrics on /metrics here (see docs/operations/metrics-and-alerts.md).
    #[arg(long, env = "SWITCHYARD_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
    /// How often time passes for the core (deadlines).
    #[arg(long, env = "SWITCHYARD_TICK", default_value = "1s", value_parser = humantime::parse_duration)]
    pub tick: Duration,
    /// How long an issued effect may take to show before it is issued again.
    #[arg(long, env = "SWITCHYARD_REISSUE", default_value = "2s", value_parser = humantime::parse_duration)]
    pub reissue: Duration,
    /// How many objects the service's writers write at once.
    #[arg(long, env = "SWITCHYARD_PARALLEL", default_value_t = 16)]
    pub parallel: usize,
    /// The keyring (identity -> NKey public keys) the chart publishes: a
    /// record that is not signed by the key of the service it names (or,
    /// for an operator's command, by a service) is passed over, never
    /// folded or decided on, and said in the service's log. Commands must
    /// then be signed by an operator's key of it, and their actor is that
    /// key's identity.
    #[arg(long, env = "SWITCHYARD_KEYRING")]
    pub keyring: Option<std::path::PathBuf>,
}

#[derive(Clone, Debug)]
pub struct HostOptions {
    /// How often time passes for the core (deadlines, stalls).
    pub tick: Duration,
    /// How long an issued effect may take to show in the facts before it is
    /// issued again; the first pause of the backoff after a failure.
    pub reissue: Duration,
    /// Whose records and commands count: records that fail its check are
    /// passed over, commands not signed by an operator of it refused.
    pub keyring: Option<Arc<Keyring>>,
    /// The service's key: it signs the answers to commands.
    pub signer: Option<switchyard_eventlog::SigningKey>,
}

impl Default for HostOptions {
    fn default() -> Self {
        HostOptions {
            tick: Duration::from_secs(1),
            reissue: Duration::from_secs(2),
            keyring: None,
            signer: None,
        }
    }
}

impl From<&HostArgs> for HostOptions {
    fn from(args: &HostArgs) -> Self {
        HostOptions {
            tick: args.tick,
            reissue: args.reissue,
            keyring: None,
            signer: None,
        }
    }
}

/// Why a host stopped.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("the log: {0}")]
    Log(#[from] LogError),
    #[error("the log's follow stream ended")]
    FollowEnded,
    #[error("subscribe to {subject}: {source}")]
    Subscribe {
        subject: String,
        #[source]
        source: async_nats::SubscribeError,
    },
    #[error("reply to a command: {0}")]
    Reply(#[from] async_nats::PublishError),
    #[error(transparent)]
    Keyring(#[from] KeyringError),
    #[error("no longer the leader: {why}")]
    Deposed { why: String },
    #[error(transparent)]
    Election(#[from] crate::leader::ElectionError),
}

/// The service an envelope's `actor` names, if it is one (an operator's
/// records carry a person's name).
fn author(actor: &str) -> Option<ServiceName> {
    actor.parse().ok()
}

/// The record's event, unless it cannot be read or (with a keyring) its
/// signature does not vouch for the author it names: then it is passed over
/// as a record this build cannot read is, with the reason.
fn readable(stored: &StoredEvent, keyring: Option<&Keyring>) -> Decoded {
    let decoded = stored.decode();
    let (Decoded::Event(_), Some(keyring)) = (&decoded, keyring) else {
        return decoded;
    };
    match crate::authorship::vouch(keyring, stored, &decoded) {
        Ok(_) => decoded,
        Err(why) => Decoded::Unknown {
            event_type: stored.envelope.event_type.clone(),
            schema_version: stored.envelope.schema_version,
            reason: UnknownReason::Unauthenticated(why),
            raw: stored.envelope.payload.clone(),
        },
    }
}

/// Notes an eviction refusal this service recorded, so the same refusal met
/// again after a restart is not recorded twice.
fn remember_blocked(blocked: &mut BTreeMap<(String, String), DomainEvent>, event: &DomainEvent) {
    if let Some(Kind::EvictionBlocked(block)) = &event.kind {
        blocked.insert((block.namespace.clone(), block.pod.clone()), event.clone());
    }
}

/// A record this build cannot read: kept in the log (nothing is deleted),
/// passed over by the core — as a record of a newer writer is — and said in
/// the service's log, so an operator finds it (`switchyard log verify` names
/// it too).
fn pass_over(
    service: ServiceName,
    stored: &switchyard_eventlog::StoredEvent,
    reason: &UnknownReason,
) {
    crate::metrics::metrics().passed_over(service.as_str(), reason);
    let envelope = &stored.envelope;
    let what = match reason {
        UnknownReason::Unauthenticated(_) => {
            "a record its signature does not vouch for (forged, or written without the author's key)"
        }
        UnknownReason::Malformed(_) => {
            "a record that is not an envelope of the log (published by something other than its writers)"
        }
        _ => "a record this build cannot read",
    };
    tracing::warn!(
        sequence = stored.sequence,
        subject = envelope.subject,
        event_type = envelope.event_type,
        actor = envelope.actor,
        %reason,
        "passed over {what}"
    );
}

/// The alerter's own alerts, raised and cleared, as `/metrics` shows them
/// firing (one service exports them: every service reads them).
fn firing(service: ServiceName, event: &DomainEvent) {
    if service == ServiceName::Alerter {
        crate::metrics::metrics().alert(event);
    }
}

/// Keeps the correlation id a process's first step carries (the command's,
/// or the record it was decided on), so its later steps carry it too (also
/// those another service decides).
fn remember_correlation(
    correlations: &mut BTreeMap<String, String>,
    event: &DomainEvent,
    correlation_id: &str,
) {
    if let Some(process) = process_of(event)
        && !correlation_id.is_empty()
    {
        correlations
            .entry(process.to_string())
            .or_insert_with(|| correlation_id.to_string());
    }
}

/// Keeps the trace a process's first step was decided in, so its later
/// steps continue it (also those another service decides, on facts that
/// carry no trace): one handover, one trace.
fn remember_trace(
    traces: &mut BTreeMap<String, SpanContext>,
    event: &DomainEvent,
    trace: Option<&SpanContext>,
) {
    if let (Some(process), Some(trace)) = (process_of(event), trace) {
        traces
            .entry(process.to_string())
            .or_insert_with(|| trace.clone());
    }
}

/// The event's type name, for span names.
fn type_name(event: &DomainEvent) -> &'static str {
    event.kind.as_ref().map_or("Unknown", Kind::type_name)
}

/// Of the effects wanted now, in their order, those not issued within their
/// pause (as of `now`); the issued ones no longer wanted are forgotten. The
/// wanted effects are walked in order beside the issued ones, so each check
/// is a comparison rather than a search: thousands stay wanted while a large
/// cluster moves.
fn due(issued: &mut BTreeMap<Effect, Issued>, wanted: &[Effect], now: Instant) -> Vec<Effect> {
    let mut order: Vec<usize> = (0..wanted.len()).collect();
    order.sort_by(|&a, &b| wanted[a].cmp(&wanted[b]));
    let mut held = vec![false; wanted.len()];
    let mut next = order.iter().peekable();
    issued.retain(|effect, issued| {
        while next.next_if(|&&i| wanted[i] < *effect).is_some() {}
        let mut still = false;
        while let Some(&i) = next.next_if(|&&i| wanted[i] == *effect) {
            still = true;
            held[i] = now.saturating_duration_since(issued.at) < issued.pause;
        }
        still
    });
    wanted
        .iter()
        .zip(held)
        .filter(|(_, held)| !held)
        .map(|(effect, _)| effect.clone())
        .collect()
}

/// An effect issued: when, and the pause before it may go again.
struct Issued {
    at: Instant,
    pause: Duration,
    /// The pauses after failures, growing; reset by a success.
    backoff: ExponentialBackoff,
    /// The trace of the input that first wanted it: each attempt's span
    /// continues it.
    trace: Option<SpanContext>,
}

struct Host<E> {
    core: Box<dyn Core>,
    log: Arc<dyn EventLog>,
    executor: E,
    options: HostOptions,
    /// Sequences this host appended (already folded): skipped when followed.
    own: BTreeSet<u64>,
    /// Effects issued and still wanted, by value.
    issued: BTreeMap<Effect, Issued>,
    /// Eviction refusals already recorded, by pod.
    blocked: BTreeMap<(String, String), DomainEvent>,
    /// The correlation id of each process (handover, move, rollback) a
    /// command started: its later steps are recorded with it.
    correlations: BTreeMap<String, String>,
    /// The log sequence of each process's first record: a command that
    /// would start it again is answered with it instead.
    started: BTreeMap<String, u64>,
    /// The service's series.
    metrics: ServiceMetrics,
    /// The trace of each process (its first step's).
    traces: BTreeMap<String, SpanContext>,
    /// The trace each aggregate (`node.<name>`, ...) was last recorded in
    /// since the effects were last issued: an effect first issued on its
    /// object continues it. Emptied once they are issued (an issued effect
    /// keeps its own).
    aggregates: BTreeMap<String, SpanContext>,
    /// The trace of the input handled last (its last decision, the record
    /// or the command): effects on objects in no trace continue it.
    cause: Option<SpanContext>,
    /// The term this replica leads its service in, when it runs elected
    /// and leads.
    own_term: Option<u64>,
}

/// Notes the sequence of a process's first record.
fn remember_start(started: &mut BTreeMap<String, u64>, event: &DomainEvent, sequence: u64) {
    if let Some(process) = process_of(event) {
        started.entry(process.to_string()).or_insert(sequence);
    }
}

/// The pauses before an effect that keeps failing is issued again: from
/// `reissue`, doubling, up to 32 times that.
fn backoff(reissue: Duration) -> ExponentialBackoff {
    ExponentialBuilder::default()
        .with_min_delay(reissue)
        .with_max_delay(reissue * 32)
        .without_max_times()
        .build()
}

impl<E: EffectExecutor> Host<E> {
    /// Appends decisions made on no record or command (a tick, a catch-up,
    /// what effects met), each in the trace of its process, if it has one.
    async fn append(&mut self, decisions: &[DomainEvent]) -> Result<(), HostError> {
        let service = self.core.service();
        let traces = self.decision_traces(decisions, None);
        self.append_by(service.as_str(), decisions, &traces).await
    }

    /// A span for each decision, in the trace of its process (the trace its
    /// first step was decided in) or else in `cause`'s; their trace
    /// contexts, to record with the decisions. The last is the cause of the
    /// effects they make wanted.
    fn decision_traces(
        &mut self,
        decisions: &[DomainEvent],
        cause: Option<&SpanContext>,
    ) -> Vec<Option<SpanContext>> {
        let traces: Vec<Option<SpanContext>> = decisions
            .iter()
            .map(|decision| {
                let process = process_of(decision);
                let parent = process.and_then(|p| self.traces.get(p)).or(cause);
                let trace = trace::span_in(parent, || {
                    tracing::info_span!(
                        "decision",
                        otel.name = %format_args!("decide {}", type_name(decision)),
                        process = process.unwrap_or_default(),
                    )
                })
                .context;
                remember_trace(&mut self.traces, decision, trace.as_ref());
                trace
            })
            .collect();
        if let Some(Some(last)) = traces.last() {
            self.cause = Some(last.clone());
        }
        traces
    }

    /// Appends `decisions` as `actor` wrote them, each with the correlation
    /// id of the process it is a step of and the trace it was decided in.
    async fn append_by(
        &mut self,
        actor: &str,
        decisions: &[DomainEvent],
        traces: &[Option<SpanContext>],
    ) -> Result<(), HostError> {
        if decisions.is_empty() {
            return Ok(());
        }
        for (event, trace) in decisions.iter().zip(traces) {
            if let Some(trace) = trace {
                self.aggregates.insert(subject_of(event), trace.clone());
            }
        }
        let attributed: Vec<Attributed> = decisions
            .iter()
            .zip(traces)
            .map(|(event, trace)| Attributed {
                event,
                correlation_id: process_of(event)
                    .and_then(|p| self.correlations.get(p))
                    .map_or("", String::as_str),
                trace: trace.as_ref().map(trace::to_w3c),
            })
            .collect();
        let sequences = append_attributed(
            self.log.as_ref(),
            self.core.service().as_str(),
            actor,
            &attributed,
            now_nanos(),
        )
        .await?;
        for (decision, sequence) in decisions.iter().zip(&sequences) {
            remember_start(&mut self.started, decision, *sequence);
            firing(self.core.service(), decision);
        }
        self.metrics.appended(sequences.len());
        self.own.extend(sequences);
        Ok(())
    }

    /// The trace an effect is written in: that of its first attempt, else
    /// the last its object's aggregate was recorded in (the process that
    /// wants it), else the current input's.
    fn effect_trace(&self, effect: &Effect) -> Option<&SpanContext> {
        if let Some(issued) = self.issued.get(effect) {
            return issued.trace.as_ref();
        }
        effect
            .aggregate()
            .and_then(|aggregate| self.aggregates.get(&aggregate))
            .or(self.cause.as_ref())
    }

    /// Takes an operator's command; the answer is signed with the service's
    /// key, when it has one.
    /// `behind`: why the command cannot be decided now (the service's view
    /// not caught up with the log), its refusal.
    async fn command(&mut self, request: &[u8], behind: Option<String>) -> CommandReply {
        let mut reply = match behind {
            Some(error) => CommandReply {
                error,
                send_again: true,
                ..CommandReply::default()
            },
            None => self.answer(request).await,
        };
        if let Some(key) = &self.options.signer {
            commands::sign_reply(&mut reply, request, key);
        }
        reply
    }

    async fn answer(&mut self, request: &[u8]) -> CommandReply {
        let refuse = |error: String| CommandReply {
            error,
            ..CommandReply::default()
        };
        let commands::Request {
            command,
            correlation_id,
            actor,
        } = match commands::decode(request, self.options.keyring.as_deref(), now_nanos()) {
            Ok(request) => request,
            Err(why) => return refuse(why.to_string()),
        };
        let service = self.core.service();
        if command.owner() != service {
            let owner = command.owner();
            return refuse(commands::CommandRefused::NotOwner { service, owner }.to_string());
        }
        if let Some(process) = command.process()
            && let Some(&from) = self.started.get(process)
        {
            return self.resume(&command, process, from).await;
        }
        let decisions = self.core.decide(Input::Command(&command), now_nanos());
        let cause = self.cause.clone();
        let traces = self.decision_traces(&decisions, cause.as_ref());
        for decision in &decisions {
            // None given: each process is its own correlation.
            let own = process_of(decision).unwrap_or_default();
            let correlation = match correlation_id.as_str() {
                "" => own,
                given => given,
            };
            remember_correlation(&mut self.correlations, decision, correlation);
        }
        match self.append_by(&actor, &decisions, &traces).await {
            Ok(()) => CommandReply {
                decisions,
                ..CommandReply::default()
            },
            Err(err) => refuse(format!("the decisions could not be recorded: {err}")),
        }
    }

    /// The answer to a command whose process is recorded already from
    /// `from`: nothing decided again; where to follow it — or why not, when
    /// the same id asked for something else.
    async fn resume(&mut self, command: &Command, process: &str, from: u64) -> CommandReply {
        let first = self
            .log
            .read(ReadRequest {
                subject: None,
                from,
                limit: Some(1),
            })
            .await;
        let differs = match first.as_deref() {
            Ok([stored]) => match readable(stored, self.options.keyring.as_deref()) {
                Decoded::Event(event) => command.differs_from(&event),
                Decoded::Unknown { reason, .. } => Some(format!(
                    "the first record of {process} (sequence {from}) cannot be read: {reason}"
                )),
            },
            Ok(_) => Some(format!(
                "the first record of {process} (sequence {from}) is not in the log"
            )),
            Err(err) => Some(format!(
                "the first record of {process} (sequence {from}) could not be read: {err}"
            )),
        };
        if let Some(error) = differs {
            return CommandReply {
                error,
                ..CommandReply::default()
            };
        }
        tracing::info!(
            process,
            from,
            "a command for a process already started: answered with where it starts"
        );
        CommandReply {
            resumed_process: process.to_string(),
            resumed_from_sequence: from,
            ..CommandReply::default()
        }
    }

    /// Hands the executor the effects the core wants now, unless issued a
    /// moment ago; records the eviction refusals they met.
    async fn execute_effects(&mut self) -> Result<Written, HostError> {
        let wanted = self.core.effects();
        let due = due(&mut self.issued, &wanted, Instant::now());
        if due.is_empty() {
            self.aggregates.clear();
            return Ok(Written::default());
        }
        for effect in &due {
            tracing::debug!(?effect, "issuing");
        }
        let first = due.iter().filter(|e| !self.issued.contains_key(*e)).count();
        let (traced, spans) = self.effect_spans(&due);
        let started = now_nanos();
        let results = self.executor.execute_in_spans(traced).await;
        let written = Written {
            first,
            started,
            took: now_nanos() - started,
        };
        let reissue = self.options.reissue;
        let mut news = Vec::new();
        for ((effect, result), (span, context)) in due.into_iter().zip(results).zip(spans) {
            self.metrics.effect(
                effect.kind(),
                !self.issued.contains_key(&effect),
                result.as_ref().err().map(E::metric_label),
            );
            let trace = self.effect_trace(&effect).cloned();
            let issued = self.issued.entry(effect).or_insert_with(|| Issued {
                at: Instant::now(),
                pause: reissue,
                backoff: backoff(reissue),
                trace,
            });
            issued.at = Instant::now();
            match result {
                Ok(outcome) => {
                    issued.pause = reissue;
                    // The pause after a failure that follows a success is
                    // twice `reissue`: the first step is the success's.
                    issued.backoff = backoff(reissue);
                    issued.backoff.next();
                    self.note_outcome(outcome, context.as_ref(), &mut news);
                }
                Err(err) => {
                    span.record("otel.status_code", "ERROR");
                    span.record("error", tracing::field::display(&err));
                    issued.pause = issued.backoff.next().unwrap_or(reissue * 32);
                    tracing::warn!(%err, pause = ?issued.pause, "effect failed; it is issued again later");
                }
            }
        }
        let (news, traces): (Vec<DomainEvent>, Vec<Option<SpanContext>>) = news.into_iter().unzip();
        for event in &news {
            self.core.fold(event, now_nanos());
        }
        // Every effect wanted now has its trace: the aggregates' are for the
        // effects the next decisions make wanted.
        self.aggregates.clear();
        let service = self.core.service();
        self.append_by(service.as_str(), &news, &traces).await?;
        Ok(written)
    }
}

/// An effect as the executor takes it: with its span, or the ids of a
/// trace not recorded.
type TracedEffect = (Effect, tracing::Span, Option<TraceContext>);

/// An effect's span and the trace context it is in.
type EffectSpan = (tracing::Span, Option<SpanContext>);

impl<E: EffectExecutor> Host<E> {
    /// A span for each effect due, in the trace of the input that first
    /// wanted it; with each effect its span and, where the trace is not
    /// recorded (no span), its ids, for what it writes to carry on.
    fn effect_spans(&self, due: &[Effect]) -> (Vec<TracedEffect>, Vec<EffectSpan>) {
        let mut traced = Vec::with_capacity(due.len());
        let mut spans = Vec::with_capacity(due.len());
        for effect in due {
            let trace::Traced { span, context } = trace::span_in(self.effect_trace(effect), || {
                tracing::info_span!(
                    "effect",
                    otel.name = %format_args!("write {}", effect.kind()),
                    object = %effect.object(),
                    otel.status_code = tracing::field::Empty,
                    error = tracing::field::Empty,
                )
            });
            let carried = if span.is_none() {
                context.as_ref().map(trace::to_w3c)
            } else {
                None
            };
            traced.push((effect.clone(), span.clone(), carried));
            spans.push((span, context));
        }
        (traced, spans)
    }

    /// What an effect that succeeded met, added to `news` in its trace
    /// (`context`): the group move it wrote, and the eviction refusals not
    /// recorded already.
    fn note_outcome(
        &mut self,
        outcome: switchyard_core::effects::Outcome,
        context: Option<&SpanContext>,
        news: &mut Vec<(DomainEvent, Option<SpanContext>)>,
    ) {
        if !outcome.evicted.is_empty() {
            tracing::info!(evicted = ?outcome.evicted, "evictions accepted");
        }
        if let Some(moved) = outcome.group_written {
            tracing::info!(node = moved.node, from = moved.from_group, to = moved.to_group, removed = ?moved.labels_removed, "node moved to its group");
            news.push((event(Kind::NodeGroupWritten(moved)), context.cloned()));
        }
        for block in outcome.blocked {
            let pod = (block.namespace.clone(), block.pod.clone());
            let refused = event(Kind::EvictionBlocked(block));
            if self.blocked.get(&pod) != Some(&refused) {
                if let Some(Kind::EvictionBlocked(b)) = &refused.kind {
                    tracing::warn!(node = b.node, pod = %format!("{}/{}", pod.0, pod.1), reason = b.reason, budgets = ?b.disruption_budgets, "eviction refused");
                }
                self.blocked.insert(pod, refused.clone());
                news.push((refused, context.cloned()));
            } else {
                tracing::debug!(pod = %format!("{}/{}", pod.0, pod.1), "eviction still refused, as recorded before");
            }
        }
    }
}

/// The effects one [`Host::execute_effects`] issued: how many for the first
/// time (writes, not re-issues), and when and how long the executor took.
#[derive(Default)]
struct Written {
    first: usize,
    started: i64,
    took: i64,
}

/// How often a service asks where the log ends, for its lag.
const LOG_HEAD_EVERY: Duration = Duration::from_secs(5);

/// Asks every [`LOG_HEAD_EVERY`] where the log ends, for the service's
/// `switchyard_log_head_sequence` and `switchyard_log_lag_records`, until
/// the returned guard is dropped. A failed question is asked again later.
fn watch_log_head(metrics: ServiceMetrics, log: Arc<dyn EventLog>) -> AbortOnDrop {
    AbortOnDrop(tokio::spawn(async move {
        let mut every = tokio::time::interval(LOG_HEAD_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            match log.last_sequence(None).await {
                Ok(head) => metrics.log_head(head),
                Err(err) => tracing::debug!(%err, "could not ask where the log ends"),
            }
        }
    }))
}

/// A record followed, or the end of the log.
type Followed = Option<Result<StoredEvent, LogError>>;

/// The records the host takes from the log at once: `first`, and whatever
/// else is ready, up to [`FOLLOW_BATCH`].
fn ready_batch(
    first: Followed,
    follow: &mut BoxStream<'static, Result<StoredEvent, LogError>>,
) -> Vec<Followed> {
    let mut batch = vec![first];
    while batch.len() < FOLLOW_BATCH {
        match follow.next().now_or_never() {
            Some(next) => batch.push(next),
            None => break,
        }
    }
    batch
}

/// Takes operator commands on `switchyard.cmd.<service>`, where a NATS
/// client is given.
async fn subscribe_commands(
    commands: Option<&async_nats::Client>,
    service: ServiceName,
) -> Result<Option<async_nats::Subscriber>, HostError> {
    let requests = match commands {
        Some(client) => {
            let subject = command_subject(service);
            Some(
                client
                    .subscribe(subject.clone())
                    .await
                    .map_err(|source| HostError::Subscribe { subject, source })?,
            )
        }
        None => None,
    };
    Ok(requests)
}

impl<E: EffectExecutor> Host<E> {
    /// The host of `core`, rebuilt by folding the whole log (`started`: when
    /// the service started, for the time it took); the last sequence read.
    async fn rebuild(
        core: Box<dyn Core>,
        log: Arc<dyn EventLog>,
        executor: E,
        options: HostOptions,
        metrics: ServiceMetrics,
        started: Instant,
    ) -> Result<(Self, u64), HostError> {
        let service = core.service();
        let mut host = Host {
            core,
            log: log.clone(),
            executor,
            options,
            own: BTreeSet::new(),
            issued: BTreeMap::new(),
            blocked: BTreeMap::new(),
            correlations: BTreeMap::new(),
            started: BTreeMap::new(),
            metrics,
            traces: BTreeMap::new(),
            aggregates: BTreeMap::new(),
            cause: None,
            own_term: None,
        };
        let mut last = 0;
        let mut passed_over = 0;
        let folded = switchyard_eventlog::replay(log.as_ref(), 0, |stored| {
            if !host.fold_only(&stored) {
                passed_over += 1;
            }
            last = stored.sequence;
        })
        .await?;
        host.metrics.read_up_to(last);
        tracing::info!(%service, folded, passed_over, elapsed = ?started.elapsed(), "rebuilt from the log");
        Ok((host, last))
    }

    /// Folds a record as a rebuild does, deciding nothing: into the core,
    /// and what the host keeps beside it. Whether it could be read.
    fn fold_only(&mut self, stored: &StoredEvent) -> bool {
        let decoded = readable(stored, self.options.keyring.as_deref());
        self.fold_read(stored, decoded)
    }

    /// [`Host::fold_only`] of a record already read as `decoded`.
    fn fold_read(&mut self, stored: &StoredEvent, decoded: Decoded) -> bool {
        let service = self.core.service();
        match decoded {
            Decoded::Event(event) => {
                self.core
                    .fold(&event, stored.envelope.recorded_at_unix_nanos);
                self.metrics.folded();
                firing(service, &event);
                remember_correlation(
                    &mut self.correlations,
                    &event,
                    &stored.envelope.correlation_id,
                );
                let traced = stored.envelope.trace.as_ref().and_then(trace::from_w3c);
                remember_trace(&mut self.traces, &event, traced.as_ref());
                remember_start(&mut self.started, &event, stored.sequence);
                if author(&stored.envelope.actor) == Some(service) {
                    remember_blocked(&mut self.blocked, &event);
                }
                true
            }
            Decoded::Unknown { reason, .. } => {
                pass_over(service, stored, &reason);
                false
            }
        }
    }

    /// Stops at a record that begins a term of this service other than
    /// this replica's own: another replica leads now.
    fn check_term(&self, stored: &StoredEvent, event: &DomainEvent) -> Result<(), HostError> {
        let service = self.core.service();
        match switchyard_eventlog::fence::term_started(event) {
            Some(term)
                if term.service == service.as_str()
                    && stored.sequence > self.own_term.unwrap_or(0) =>
            {
                let this = match self.own_term {
                    Some(own) => format!("this replica's term {own} is over"),
                    None => "this replica runs unelected and must not write beside it".into(),
                };
                Err(HostError::Deposed {
                    why: format!(
                        "{} began term {} of {service} in the log: {this}",
                        term.holder, stored.sequence
                    ),
                })
            }
            _ => Ok(()),
        }
    }

    /// Takes a batch of records followed as a standby does: each folded,
    /// nothing decided.
    fn fold_batch(
        &mut self,
        batch: Vec<Followed>,
        progress: &watch::Sender<Progress>,
    ) -> Result<(), HostError> {
        for stored in batch {
            let stored = self.taken(stored, progress)?;
            let decoded = readable(&stored, self.options.keyring.as_deref());
            if self.own_term.is_some()
                && let Decoded::Event(event) = &decoded
            {
                self.check_term(&stored, event)?;
            }
            self.fold_read(&stored, decoded);
        }
        Ok(())
    }

    /// A record taken from the log: how far the service has read, for its
    /// health and its series.
    fn taken(
        &self,
        followed: Followed,
        progress: &watch::Sender<Progress>,
    ) -> Result<StoredEvent, HostError> {
        let stored = followed.ok_or(HostError::FollowEnded)??;
        progress.send_replace(Progress {
            ready: true,
            sequence: stored.sequence,
        });
        self.metrics.read_up_to(stored.sequence);
        Ok(stored)
    }

    /// Follows the log as a standby — every record folded, nothing
    /// decided, no effect issued, no command taken — until this replica
    /// wins the election. Then it begins its term in the log, reads the
    /// log up to that record and records what the last leader may have
    /// left undecided ([`Core::catch_up`]), as a restarted service does:
    /// a failover costs the election and one catch-up, not a replay.
    async fn stand_by(
        &mut self,
        elected: Elected,
        follow: &mut BoxStream<'static, Result<StoredEvent, LogError>>,
        progress: &watch::Sender<Progress>,
        nats: Option<async_nats::Client>,
    ) -> Result<crate::leader::Leading, HostError> {
        let Elected { election, log } = elected;
        let identity = election.identity().to_string();
        let service = self.core.service();
        tracing::info!(%service, identity, "standing by: following the log until this replica leads");
        let mut winning = std::pin::pin!(election.lead(nats));
        let leading = loop {
            tokio::select! {
                won = &mut winning => break won?,
                stored = follow.next() => {
                    let batch = ready_batch(stored, follow);
                    self.fold_batch(batch, progress)?;
                }
            }
        };
        let won = Instant::now();
        let term = log
            .begin_term(service.as_str(), &identity, now_nanos())
            .await?;
        self.own_term = Some(term);
        crate::metrics::metrics().leading(service.as_str(), true);
        while progress.borrow().sequence < term {
            let stored = follow.next().await;
            let batch = ready_batch(stored, follow);
            self.fold_batch(batch, progress)?;
        }
        self.catch_up().await?;
        tracing::info!(%service, identity, term, took = ?won.elapsed(), "leading: term begun and the log read to it");
        Ok(leading)
    }

    /// Records the decisions a crash may have kept from being recorded
    /// ([`Core::catch_up`]).
    async fn catch_up(&mut self) -> Result<(), HostError> {
        let due = self.core.catch_up(now_nanos());
        if !due.is_empty() {
            tracing::info!(
                decisions = due.len(),
                "recording decisions the log was missing"
            );
        }
        self.append(&due).await
    }

    /// A batch of records followed (the first `received` at that time):
    /// this service's own folded or skipped, another's decided on; the
    /// decisions appended together.
    async fn react_to_records(
        &mut self,
        batch: Vec<Followed>,
        received: i64,
        progress: &watch::Sender<Progress>,
    ) -> Result<Reacting, HostError> {
        let service = self.core.service();
        self.cause = None;
        let mut decisions = Vec::new();
        let mut decision_traces = Vec::new();
        let mut earliest: Option<i64> = None;
        for stored in batch {
            let stored = self.taken(stored, progress)?;
            if self.own.remove(&stored.sequence) {
                continue;
            }
            let event = match readable(&stored, self.options.keyring.as_deref()) {
                Decoded::Event(event) => event,
                Decoded::Unknown { reason, .. } => {
                    pass_over(service, &stored, &reason);
                    continue;
                }
            };
            self.check_term(&stored, &event)?;
            // Read once: its spans and maps keep the ids, not the text.
            let traced = stored.envelope.trace.as_ref().and_then(trace::from_w3c);
            self.remember_record(&stored, &event, traced.as_ref());
            if author(&stored.envelope.actor) == Some(service) {
                // Written by an earlier run of this service: fold only.
                self.core
                    .fold(&event, stored.envelope.recorded_at_unix_nanos);
                remember_blocked(&mut self.blocked, &event);
                firing(service, &event);
                continue;
            }
            let recorded = stored.envelope.recorded_at_unix_nanos;
            earliest = Some(earliest.map_or(recorded, |e| e.min(recorded)));
            let (decided, traces) = self.decide_on_record(&stored, &event, traced.as_ref());
            decision_traces.extend(traces);
            decisions.extend(decided);
        }
        let appending = now_nanos();
        self.append_by(service.as_str(), &decisions, &decision_traces)
            .await?;
        let appended = now_nanos();
        // Records this service wrote itself only: nothing to time
        // unless effects go out after them.
        Ok(Reacting {
            input: "records",
            earliest: earliest.unwrap_or(received),
            received,
            appending: appended - appending,
            decisions: decisions.len(),
            from_records: earliest.is_some(),
        })
    }

    /// What a record followed tells the host beside the core: its object's
    /// trace, its process's correlation id, trace and first sequence.
    fn remember_record(
        &mut self,
        stored: &StoredEvent,
        event: &DomainEvent,
        traced: Option<&SpanContext>,
    ) {
        if let Some(trace) = traced {
            self.aggregates
                .insert(stored.envelope.subject.clone(), trace.clone());
        }
        remember_correlation(
            &mut self.correlations,
            event,
            &stored.envelope.correlation_id,
        );
        remember_trace(&mut self.traces, event, traced);
        remember_start(&mut self.started, event, stored.sequence);
        self.metrics.folded();
    }

    /// The core's decisions on another service's record, each with the
    /// trace it is decided in.
    fn decide_on_record(
        &mut self,
        stored: &StoredEvent,
        event: &DomainEvent,
        traced: Option<&SpanContext>,
    ) -> (Vec<DomainEvent>, Vec<Option<SpanContext>>) {
        // A record in a trace is handled in a span of it; a fact
        // outside any only if something is decided on it.
        let handling = |stored: &StoredEvent| {
            trace::span_in(traced, || {
                tracing::info_span!(
                    "record",
                    otel.name = %format_args!("handle {}", stored.envelope.event_type),
                    sequence = stored.sequence,
                    subject = stored.envelope.subject,
                    actor = stored.envelope.actor,
                )
            })
        };
        let handled = traced.is_some().then(|| handling(stored));
        let decided = match &handled {
            Some(handled) => handled
                .span
                .in_scope(|| self.core.decide(Input::Record(event), now_nanos())),
            None => self.core.decide(Input::Record(event), now_nanos()),
        };
        let cause = match (handled, decided.is_empty()) {
            (Some(handled), _) => handled.context,
            (None, false) => handling(stored).context,
            (None, true) => None,
        };
        if cause.is_some() {
            self.cause = cause.clone();
        }
        // A process this record starts (a wave's handover, the
        // move after it) belongs to the record's migration.
        for decision in &decided {
            remember_correlation(
                &mut self.correlations,
                decision,
                &stored.envelope.correlation_id,
            );
        }
        let traces = self.decision_traces(&decided, cause.as_ref());
        (decided, traces)
    }

    /// Time passed: the core's decisions on it, appended.
    async fn react_to_tick(&mut self) -> Result<Reacting, HostError> {
        let received = now_nanos();
        self.cause = None;
        let decisions = self.core.decide(Input::Tick, now_nanos());
        let appending = now_nanos();
        self.append(&decisions).await?;
        if !decisions.is_empty() {
            tracing::debug!(target: "switchyard_runtime::reaction", decisions = decisions.len(), "decided on a tick");
        }
        Ok(Reacting {
            input: "tick",
            earliest: received,
            received,
            appending: now_nanos() - appending,
            decisions: decisions.len(),
            from_records: false,
        })
    }

    /// An operator's command, answered (on `commands`) in a span of the
    /// trace it was sent in.
    async fn react_to_command(
        &mut self,
        request: async_nats::Message,
        commands: Option<&async_nats::Client>,
        behind: Option<String>,
    ) -> Result<Reacting, HostError> {
        let service = self.core.service();
        let received = now_nanos();
        let answering = Instant::now();
        let sent_in = trace::from_headers(request.headers.as_ref());
        let trace::Traced { span, context } =
            trace::span_in(sent_in.as_ref().and_then(trace::from_w3c).as_ref(), || {
                tracing::info_span!(
                    "command",
                    otel.name = %format_args!("command {}", commands::name_of(&request.payload)),
                    %service,
                )
            });
        // What the command decides is in its trace.
        self.cause = context;
        let reply = self
            .command(&request.payload, behind)
            .instrument(span)
            .await;
        crate::metrics::metrics().command(service.as_str(), answering.elapsed().as_secs_f64());
        let decisions = reply.decisions.len();
        if let (Some(to), Some(client)) = (request.reply, commands) {
            client.publish(to, reply.encode_to_vec().into()).await?;
        }
        Ok(Reacting {
            input: "command",
            earliest: received,
            received,
            appending: 0,
            decisions,
            from_records: false,
        })
    }
}

/// How a replica of a service that runs with standbys is elected, and the
/// log (behind its fence) it begins its terms in.
pub struct Elected {
    pub election: crate::leader::Election,
    pub log: Arc<switchyard_eventlog::fence::Fenced>,
}

/// Runs a service until the log fails: rebuilt from `log`, its effects
/// executed by `executor`, operator commands taken on `commands` if given.
/// `elected`: it runs with standbys, and decides only while it leads —
/// standing by until it wins, stopping (with [`HostError::Deposed`]) when
/// it loses the lead.
pub async fn run<E: EffectExecutor>(
    core: Box<dyn Core>,
    log: Arc<dyn EventLog>,
    executor: E,
    commands: Option<async_nats::Client>,
    options: HostOptions,
    progress: watch::Sender<Progress>,
    elected: Option<Elected>,
) -> Result<(), HostError> {
    let started = Instant::now();
    let service = core.service();
    let metrics = crate::metrics::metrics().service(service.as_str());
    let _head = watch_log_head(metrics.clone(), log.clone());
    let (mut host, last) = Host::rebuild(
        core,
        log.clone(),
        executor,
        options.clone(),
        metrics,
        started,
    )
    .await?;
    if elected.is_none() {
        host.catch_up().await?;
    }
    progress.send_replace(Progress {
        ready: true,
        sequence: last,
    });
    let mut follow = log.follow(None, last + 1).await?;
    let Some(elected) = elected else {
        return lead(
            &mut host,
            &mut follow,
            log.as_ref(),
            commands,
            options,
            &progress,
        )
        .await;
    };
    crate::metrics::metrics().leading(service.as_str(), false);
    let stood = host
        .stand_by(elected, &mut follow, &progress, commands.clone())
        .await;
    let mut leading = stood?;
    let ended = tokio::select! {
        ended = lead(&mut host, &mut follow, log.as_ref(), commands, options, &progress) => ended,
        why = leading.lost() => Err(HostError::Deposed { why }),
    };
    crate::metrics::metrics().leading(service.as_str(), false);
    leading.step_down().await;
    ended
}

/// Leads: decides on what the log brings, on ticks and on commands, and
/// issues the effects, until the log fails.
async fn lead<E: EffectExecutor>(
    host: &mut Host<E>,
    follow: &mut BoxStream<'static, Result<StoredEvent, LogError>>,
    log: &dyn EventLog,
    commands: Option<async_nats::Client>,
    options: HostOptions,
    progress: &watch::Sender<Progress>,
) -> Result<(), HostError> {
    let service = host.core.service();
    let mut requests = subscribe_commands(commands.as_ref(), service).await?;
    let mut tick = tokio::time::interval(options.tick);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    host.execute_effects().await?;
    loop {
        // The earliest recording time of the records decided on, and the
        // decisions made: what the reaction below is timed from.
        let reacting = tokio::select! {
            stored = follow.next() => {
                let received = now_nanos();
                // This record and whatever else is ready: decided together,
                // appended together, then the effects issued once.
                let batch = ready_batch(stored, follow);
                host.react_to_records(batch, received, progress).await?
            }
            _ = tick.tick() => host.react_to_tick().await?,
            Some(request) = async {
                match requests.as_mut() {
                    Some(sub) => sub.next().await,
                    None => std::future::pending().await,
                }
            } => {
                let behind = catch_up_to_head(host, follow, log, progress).await?;
                host.react_to_command(request, commands.as_ref(), behind).await?
            }
        };
        let written = host.execute_effects().await?;
        reacting.log(&written);
    }
}

/// How long a command waits for its service to read the log up to where it
/// ended when the command came: well within the time the sender waits for
/// the answer ([`commands::REPLY_TIMEOUT`]).
const COMMAND_CATCH_UP: Duration = Duration::from_secs(10);

/// Takes the records appended before a command came (another service's
/// answer to the command before it, say) however far behind following the
/// log is — re-following after the server it was on went away, say — so that
/// the command is decided on the log as it stood when it came, not on an
/// older view. `None` once caught up; else why the command is not decided
/// (where the log ends unread, or not reached in [`COMMAND_CATCH_UP`]), for
/// its refusal.
async fn catch_up_to_head<E: EffectExecutor>(
    host: &mut Host<E>,
    follow: &mut BoxStream<'static, Result<StoredEvent, LogError>>,
    log: &dyn EventLog,
    progress: &watch::Sender<Progress>,
) -> Result<Option<String>, HostError> {
    let service = host.core.service();
    // `progress` holds the last record taken (kept whether or not health
    // watches it).
    let head = match log.last_sequence(None).await {
        Ok(head) => head,
        Err(err) => {
            return Ok(Some(format!(
                "not taken: {service} could not read where the log ends ({err})"
            )));
        }
    };
    let deadline = tokio::time::Instant::now() + COMMAND_CATCH_UP;
    let behind = head.saturating_sub(progress.borrow().sequence);
    if behind > 0 {
        tracing::debug!(%service, behind, head, "a command came: reading the log to its end first");
    }
    while progress.borrow().sequence < head {
        let Ok(stored) = tokio::time::timeout_at(deadline, follow.next()).await else {
            let read = progress.borrow().sequence;
            tracing::warn!(%service, read, head, "a command came and the log could not be read to its end in time: not taken");
            return Ok(Some(format!(
                "not taken: {service} has read the log up to record {read} of {head} and did not reach its end in {COMMAND_CATCH_UP:?}"
            )));
        };
        let batch = ready_batch(stored, follow);
        let reacting = host.react_to_records(batch, now_nanos(), progress).await?;
        let written = host.execute_effects().await?;
        reacting.log(&written);
    }
    Ok(None)
}

/// One input's reaction, for its timing (ns): the earliest recording time of
/// the records decided on (a tick's or a command's arrival), when the service
/// took the input, how long appending its decisions took, and how many it
/// made; `from_records` when another's records were among them.
struct Reacting {
    input: &'static str,
    earliest: i64,
    received: i64,
    appending: i64,
    decisions: usize,
    from_records: bool,
}

impl Reacting {
    /// Switchyard's own latency: from the recording of a fact (or another
    /// service's decision) to this service's decisions recorded and its
    /// writes sent, and how long the writes took (the API server's part)
    /// — for the benchmarks, which read it from the service's log. Records
    /// that changed nothing are logged too: the service was busy with
    /// them; so are a tick's or a command's decisions and writes (effects
    /// issued again among them), which keep it from the log meanwhile.
    fn log(self, written: &Written) {
        if self.from_records || self.decisions > 0 || written.took > 0 {
            let Reacting {
                input,
                earliest,
                received,
                appending,
                decisions,
                from_records: _,
            } = self;
            let done = now_nanos();
            tracing::debug!(
                target: "switchyard_runtime::reaction",
                input,
                since_recorded_us = (done - earliest) / 1000,
                received_unix_us = received / 1000,
                appending_us = appending / 1000,
                done_unix_us = done / 1000,
                writing_us = written.took / 1000,
                write_started_unix_us = written.started / 1000,
                decisions,
                writes = written.first,
                "reacted"
            );
        }
    }
}

/// Why a hosted service could not start or stopped; `E` is its own part
/// (its executor's, or an observer's) failure.
#[derive(Debug, thiserror::Error)]
pub enum ServeError<E: std::error::Error + 'static> {
    #[error(transparent)]
    Connect(#[from] crate::connect::ConnectError),
    #[error(transparent)]
    Host(#[from] HostError),
    #[error(transparent)]
    Service(E),
}

/// Runs `service` as a process: connected to the log and to NATS for
/// operator commands, health on `--health-listen`, its effects executed by
/// the executor `executor` builds.
pub async fn serve<E, F>(
    service: ServiceName,
    args: &ServiceArgs,
    executor: F,
) -> Result<(), ServeError<E::Error>>
where
    E: EffectExecutor,
    F: std::future::Future<Output = Result<E, E::Error>>,
{
    serve_core(service.core(), args, executor).await
}

/// [`serve`] with a core the service configured from its own flags (what it
/// records of them goes to the log, so a replay needs no flags).
pub async fn serve_core<E, F>(
    core: Box<dyn Core>,
    args: &ServiceArgs,
    executor: F,
) -> Result<(), ServeError<E::Error>>
where
    E: EffectExecutor,
    F: std::future::Future<Output = Result<E, E::Error>>,
{
    let service = core.service();
    let mut options = HostOptions::from(&args.host);
    if let Some(path) = &args.host.keyring {
        options.keyring = Some(Arc::new(Keyring::load(path).map_err(HostError::from)?));
    }
    options.signer = args.nats.signer()?;
    let executor = executor.await.map_err(ServeError::Service)?;
    let client = args.nats.service_client(service.as_str()).await?;
    let log = args.nats.log(client.clone()).await?;
    let (progress, watching) = watch::channel(Progress::default());
    crate::health::spawn(args.host.health_listen, service.as_str(), watching);
    crate::metrics::spawn(args.host.metrics_listen);
    let election = args
        .election
        .election(service)
        .await
        .map_err(HostError::from)?;
    let elected = election.map(|election| Elected {
        election,
        log: log.clone(),
    });
    tracing::info!(%service, elected = elected.is_some(), "starting");
    run(
        core,
        log,
        executor,
        Some(client),
        options,
        progress,
        elected,
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cordon(node: &str) -> Effect {
        Effect::Cordon { node: node.into() }
    }

    fn issued_at(at: Instant) -> Issued {
        Issued {
            at,
            pause: Duration::from_secs(2),
            backoff: backoff(Duration::from_secs(2)),
            trace: None,
        }
    }

    #[test]
    fn effects_not_issued_are_due_in_the_order_the_core_wants_them() {
        let wanted = vec![
            cordon("c"),
            Effect::Drain { node: "a".into() },
            cordon("a"),
            cordon("b"),
        ];
        let mut issued = BTreeMap::new();
        assert_eq!(due(&mut issued, &wanted, Instant::now()), wanted);
    }

    #[test]
    fn an_effect_issued_within_its_pause_waits_and_one_no_longer_wanted_is_forgotten() {
        let now = Instant::now();
        let mut issued = BTreeMap::from([
            (cordon("a"), issued_at(now)),
            (cordon("b"), issued_at(now - Duration::from_secs(3))),
            (cordon("gone"), issued_at(now)),
            (cordon("z"), issued_at(now)),
        ]);
        let wanted = vec![cordon("z"), cordon("b"), cordon("a"), cordon("new")];
        assert_eq!(
            due(&mut issued, &wanted, now),
            vec![cordon("b"), cordon("new")]
        );
        assert_eq!(
            issued.keys().cloned().collect::<Vec<_>>(),
            vec![cordon("a"), cordon("b"), cordon("z")]
        );
    }

    #[test]
    fn an_effect_wanted_twice_waits_or_goes_as_one() {
        let now = Instant::now();
        let mut issued = BTreeMap::from([(cordon("a"), issued_at(now))]);
        let wanted = vec![cordon("a"), cordon("b"), cordon("a")];
        assert_eq!(due(&mut issued, &wanted, now), vec![cordon("b")]);
        let later = now + Duration::from_secs(2);
        assert_eq!(due(&mut issued, &wanted, later), wanted);
    }
}

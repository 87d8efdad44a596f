//! The migration log for integrations: every record, as it is appended, is
//! published as a CloudEvent (structured JSON mode of the NATS protocol
//! binding) on `switchyard.events.<noun>.<verb>` — the event's CloudEvent
//! type `io.switchyard.<noun>.<verb>` with its last two tokens — and kept in
//! the JetStream stream `SWITCHYARD_EVENTS`, so an integration subscribes
//! with any stock client and one that was away replays what it missed.
//!
//! The publisher (in the alerter) follows the log from the record after the
//! last one the stream holds: none is lost across its restarts, none
//! published twice (each message's `Nats-Msg-Id` is the record's id), and
//! they are published in log order. A record this build cannot read is not
//! published (it is passed over, as everywhere).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use async_nats::HeaderMap;
use async_nats::jetstream::{self, stream};
use futures::{FutureExt, StreamExt};
use serde_json::{Value, json};
use switchyard_eventlog::{Decoded, EventLog, LogError, StoredEvent};
use switchyard_proto::v1::DomainEvent;

/// How many publishes may await their acknowledgement at once.
const IN_FLIGHT: usize = 256;

/// Where the CloudEvents go.
#[derive(clap::Args, Clone, Debug)]
pub struct EventsArgs {
    /// Subject prefix of the CloudEvents (`<prefix>.<noun>.<verb>`); empty:
    /// none are published.
    #[arg(
        long,
        env = "SWITCHYARD_EVENTS_PREFIX",
        default_value = "switchyard.events"
    )]
    pub events_prefix: String,
    /// JetStream stream that keeps them (`switchyard log init` creates it).
    #[arg(
        long,
        env = "SWITCHYARD_EVENTS_STREAM",
        default_value = "SWITCHYARD_EVENTS"
    )]
    pub events_stream: String,
    /// How long the stream keeps a CloudEvent (the log keeps every record
    /// for ever).
    #[arg(long, env = "SWITCHYARD_EVENTS_MAX_AGE", default_value = "7d", value_parser = humantime::parse_duration)]
    pub events_max_age: Duration,
}

/// Why publishing stopped.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("the log: {0}")]
    Log(#[from] LogError),
    #[error("the log's follow stream ended")]
    FollowEnded,
    #[error("stream {stream}: {message}")]
    Stream { stream: String, message: String },
    #[error("publish {subject}: {message}")]
    Publish { subject: String, message: String },
}

/// The NATS subject of a CloudEvent type: `io.switchyard.handover.completed`
/// on `<prefix>.handover.completed`.
pub fn subject_for(prefix: &str, cloudevent_type: &str) -> String {
    let rest = cloudevent_type
        .strip_prefix("io.switchyard.")
        .unwrap_or(cloudevent_type);
    format!("{prefix}.{rest}")
}

/// A record as a CloudEvent in the JSON format: the required attributes
/// (`specversion`, `id` — the record's id —, `source`, `type`), `subject`
/// (the record's aggregate, `node.gpu-0`), `time`, `datacontenttype`,
/// `dataschema`, the distributed-tracing extension (`traceparent`,
/// `tracestate`), the sequence extension (`sequence`, the log sequence as a
/// decimal string), `correlationid` and `actor`, and `data`: the event's
/// message in canonical protobuf JSON.
pub fn cloudevent(stored: &StoredEvent, event: &DomainEvent, source: &str) -> Option<Value> {
    let kind = event.kind.as_ref()?;
    let envelope = &stored.envelope;
    // A DomainEvent is {"<case>": {...}}: the message is its one value.
    let data = match serde_json::to_value(event).ok()? {
        Value::Object(cases) => cases.into_iter().next()?.1,
        _ => return None,
    };
    let ce_type = kind.cloudevent_type();
    let mut attributes = json!({
        "specversion": "1.0",
        "id": envelope.id,
        "source": source,
        "type": ce_type,
        "subject": envelope.subject,
        "time": rfc3339(envelope.recorded_at_unix_nanos),
        "datacontenttype": "application/json",
        "dataschema": format!("{}{ce_type}.json", switchyard_proto::schema::EVENT_SCHEMA_BASE),
        "sequence": stored.sequence.to_string(),
        "actor": envelope.actor,
    });
    if !envelope.correlation_id.is_empty() {
        attributes["correlationid"] = envelope.correlation_id.clone().into();
    }
    if let Some(trace) = &envelope.trace {
        if !trace.traceparent.is_empty() {
            attributes["traceparent"] = trace.traceparent.clone().into();
        }
        if !trace.tracestate.is_empty() {
            attributes["tracestate"] = trace.tracestate.clone().into();
        }
    }
    attributes["data"] = data;
    Some(attributes)
}

/// Unix nanoseconds as RFC 3339 in UTC.
fn rfc3339(nanos: i64) -> String {
    let at = UNIX_EPOCH + Duration::from_nanos(u64::try_from(nanos).unwrap_or(0));
    humantime::format_rfc3339_nanos(at.max(UNIX_EPOCH)).to_string()
}

/// The stream that keeps the CloudEvents: made if missing (a stream that
/// exists is used as it is).
pub async fn ensure_stream(
    js: &jetstream::Context,
    args: &EventsArgs,
) -> Result<stream::Stream, PublishError> {
    js.get_or_create_stream(stream::Config {
        name: args.events_stream.clone(),
        subjects: vec![format!("{}.>", args.events_prefix)],
        storage: stream::StorageType::File,
        retention: stream::RetentionPolicy::Limits,
        discard: stream::DiscardPolicy::Old,
        max_age: args.events_max_age,
        duplicate_window: Duration::from_secs(120),
        description: Some("Switchyard's migration log as CloudEvents, for integrations".into()),
        ..Default::default()
    })
    .await
    .map_err(|e| PublishError::Stream {
        stream: args.events_stream.clone(),
        message: e.to_string(),
    })
}

/// The log sequence of the last record the stream holds, 0 if it never
/// held one; `None` when it held some and has let them all expire (a quiet
/// spell longer than its max age).
async fn last_published(
    stream: &mut stream::Stream,
    name: &str,
) -> Result<Option<u64>, PublishError> {
    let failed = |message: String| PublishError::Stream {
        stream: name.to_string(),
        message,
    };
    let state = stream
        .info()
        .await
        .map_err(|e| failed(e.to_string()))?
        .state
        .clone();
    let last = state.last_sequence;
    if last == 0 {
        return Ok(Some(0));
    }
    if state.messages == 0 {
        return Ok(None);
    }
    let message = stream
        .get_raw_message(last)
        .await
        .map_err(|e| failed(e.to_string()))?;
    let event: Value = serde_json::from_slice(&message.payload)
        .map_err(|e| failed(format!("message {last} is no CloudEvent: {e}")))?;
    event["sequence"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .map(Some)
        .ok_or_else(|| failed(format!("message {last} has no sequence")))
}

/// Publishes every record of `log` after the last the stream holds, then
/// each as it is appended, until the log or NATS fails. `acked` is the log
/// sequence of the last record whose publication (and every one before it)
/// was acknowledged: a run after a failure goes on from there, as the
/// stream may hold later records whose earlier ones were lost (the
/// stream's duplicate window drops those published twice).
pub async fn publish(
    log: Arc<dyn EventLog>,
    client: async_nats::Client,
    args: EventsArgs,
    source: String,
    acked: &mut Option<u64>,
) -> Result<(), PublishError> {
    let js = jetstream::new(client);
    let mut stream = ensure_stream(&js, &args).await?;
    let from = match (
        *acked,
        last_published(&mut stream, &args.events_stream).await?,
    ) {
        (Some(acked), _) => acked + 1,
        (None, Some(last)) => last + 1,
        (None, None) => {
            let head = log.last_sequence(None).await?;
            tracing::warn!(
                stream = args.events_stream,
                head,
                "the stream let every CloudEvent expire: publishing from the log's end"
            );
            head + 1
        }
    };
    tracing::info!(
        stream = args.events_stream,
        prefix = args.events_prefix,
        from,
        "publishing the log as CloudEvents"
    );
    let mut follow = log.follow(None, from).await?;
    let mut acks = VecDeque::new();
    loop {
        // What is ready goes out before its acknowledgements are awaited.
        let next = if acks.is_empty() {
            follow.next().await
        } else {
            match follow.next().now_or_never() {
                Some(next) => next,
                None => {
                    settle(&mut acks, 0, acked).await?;
                    continue;
                }
            }
        };
        let stored = next.ok_or(PublishError::FollowEnded)??;
        let Decoded::Event(event) = stored.decode() else {
            continue;
        };
        let Some(body) = cloudevent(&stored, &event, &source) else {
            continue;
        };
        let subject = subject_for(
            &args.events_prefix,
            body["type"].as_str().unwrap_or_default(),
        );
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Msg-Id", stored.envelope.id.as_str());
        headers.insert("content-type", "application/cloudevents+json");
        switchyard_eventlog::trace::insert_headers(&mut headers, stored.envelope.trace.as_ref());
        let ack = js
            .publish_with_headers(subject.clone(), headers, body.to_string().into())
            .await
            .map_err(|e| PublishError::Publish {
                subject: subject.clone(),
                message: e.to_string(),
            })?;
        acks.push_back((stored.sequence, subject, ack));
        settle(&mut acks, IN_FLIGHT, acked).await?;
    }
}

/// A publication awaiting its acknowledgement: the record's log sequence,
/// the subject, the ack.
type Pending = (u64, String, jetstream::context::PublishAckFuture);

/// Awaits acknowledgements, in order, until at most `keep` are pending;
/// `acked` follows them.
async fn settle(
    acks: &mut VecDeque<Pending>,
    keep: usize,
    acked: &mut Option<u64>,
) -> Result<(), PublishError> {
    while acks.len() > keep {
        let (sequence, subject, ack) = acks.pop_front().expect("pending");
        ack.await.map_err(|e| PublishError::Publish {
            subject,
            message: e.to_string(),
        })?;
        *acked = Some(sequence);
    }
    Ok(())
}

/// Runs [`publish`] for the life of the process: after a failure it starts
/// again (from the stream's last record) after a pause, and says why.
pub fn spawn(log: Arc<dyn EventLog>, client: async_nats::Client, args: EventsArgs, source: String) {
    if args.events_prefix.is_empty() {
        return;
    }
    tokio::spawn(async move {
        let mut pause = Duration::from_secs(1);
        let mut acked = None;
        loop {
            let started = std::time::Instant::now();
            let result = publish(
                log.clone(),
                client.clone(),
                args.clone(),
                source.clone(),
                &mut acked,
            )
            .await;
            if let Err(err) = result {
                tracing::warn!(%err, ?pause, "publishing CloudEvents stopped; starting again");
            }
            if started.elapsed() > Duration::from_secs(60) {
                pause = Duration::from_secs(1);
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(30));
        }
    });
}

//! Appending in log order: the events go in atomic batches of up to
//! [`MAX_BATCH_EVENTS`], whatever their subjects, so a stop never falls
//! inside one and a reaction's decisions cost one round trip; what comes next
//! waits for the batch before it. Facts, which stand alone, go one by one
//! ([`append_facts`]).

use switchyard_core::ServiceName;
use switchyard_core::subjects::subject_of;
use switchyard_proto::v1::{DomainEvent, TraceContext};

use crate::{EventLog, LogError, MAX_BATCH_EVENTS, NewEvent, Payload, Subject};

/// Wall-clock time, Unix nanoseconds: what a writer records as the time of
/// what it appends (cores get time as data, never read it).
pub fn now_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

/// Appends `events` in order, as atomic batches of at most
/// [`MAX_BATCH_EVENTS`] across their subjects. Returns the log sequence of
/// each event.
pub async fn append_in_order(
    log: &dyn EventLog,
    events: Vec<(Subject, NewEvent)>,
) -> Result<Vec<u64>, LogError> {
    in_chunks(events, |chunk| log.append_batch(chunk, &[])).await
}

/// Appends `events` in chunks of at most [`MAX_BATCH_EVENTS`], one after
/// the other, with `append`; the sequences of all of them.
async fn in_chunks<F, Fut>(
    events: Vec<(Subject, NewEvent)>,
    append: F,
) -> Result<Vec<u64>, LogError>
where
    F: Fn(Vec<(Subject, NewEvent)>) -> Fut,
    Fut: std::future::Future<Output = Result<crate::AppendAck, LogError>>,
{
    let mut sequences = Vec::with_capacity(events.len());
    let mut events = events.into_iter().peekable();
    while events.peek().is_some() {
        let chunk: Vec<_> = events.by_ref().take(MAX_BATCH_EVENTS).collect();
        sequences.extend(append(chunk).await?.sequences);
    }
    Ok(sequences)
}

/// Appends an observer's facts, recorded at `at`, each under its
/// aggregate's subject with a fresh id, as `actor`: one by one
/// ([`EventLog::append_each`]) in chunks of at most [`MAX_BATCH_EVENTS`],
/// since a fact stands alone. Returns the log sequence of each event.
pub async fn append_facts(
    log: &dyn EventLog,
    actor: ServiceName,
    events: &[DomainEvent],
    at: i64,
) -> Result<Vec<u64>, LogError> {
    let attributed: Vec<Attributed> = events.iter().map(Attributed::fact).collect();
    let events = attributed_events(actor.as_str(), actor.as_str(), &attributed, at)?;
    in_chunks(events, |chunk| log.append_each(chunk)).await
}

/// An event to append with what it belongs to.
#[derive(Clone, Debug)]
pub struct Attributed<'a> {
    pub event: &'a DomainEvent,
    /// The migration, wave or process it is a step of; empty if none.
    pub correlation_id: &'a str,
    /// The trace (span) it was decided in.
    pub trace: Option<TraceContext>,
}

impl<'a> Attributed<'a> {
    /// A fact: part of no process, in no trace.
    pub fn fact(event: &'a DomainEvent) -> Self {
        Attributed {
            event,
            correlation_id: "",
            trace: None,
        }
    }
}

/// Appends `events`, each with its correlation id (the migration, wave or
/// process it belongs to) and trace context, as written by `actor` (a
/// service, or the operator whose command they answer); ids are
/// `<writer>-<uuid>`. Returns the log sequence of each event.
pub async fn append_attributed(
    log: &dyn EventLog,
    writer: &str,
    actor: &str,
    events: &[Attributed<'_>],
    at: i64,
) -> Result<Vec<u64>, LogError> {
    append_in_order(log, attributed_events(writer, actor, events, at)?).await
}

/// `events` as the log takes them: each under its aggregate's subject, with
/// a fresh id `<writer>-<uuid>`, its correlation id, trace and `actor`.
fn attributed_events(
    writer: &str,
    actor: &str,
    events: &[Attributed<'_>],
    at: i64,
) -> Result<Vec<(Subject, NewEvent)>, LogError> {
    events
        .iter()
        .map(|attributed| {
            let event = attributed.event;
            Ok((
                Subject::new(subject_of(event))?,
                NewEvent {
                    id: format!("{writer}-{}", uuid::Uuid::new_v4()),
                    recorded_at_unix_nanos: at,
                    correlation_id: attributed.correlation_id.to_string(),
                    causation_id: String::new(),
                    actor: actor.to_string(),
                    trace: attributed.trace.clone(),
                    payload: Payload::Domain(event.clone()),
                    term: None,
                },
            ))
        })
        .collect()
}

//! Appending in log order: the events go in atomic batches of up to
//! [`MAX_BATCH_EVENTS`], whatever their subjects, so a stop never falls
//! inside one and a reaction's decisions cost one round trip; what comes next
//! waits for the batch before it.

use switchyard_core::ServiceName;
use switchyard_core::subjects::subject_of;
use switchyard_proto::v1::DomainEvent;

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
    let mut sequences = Vec::with_capacity(events.len());
    let mut events = events.into_iter().peekable();
    while events.peek().is_some() {
        let batch: Vec<_> = events.by_ref().take(MAX_BATCH_EVENTS).collect();
        let ack = log.append_batch(batch, &[]).await?;
        sequences.extend(ack.sequences);
    }
    Ok(sequences)
}

/// Appends a service's decisions (or an observer's facts), recorded at `at`,
/// each under its aggregate's subject with a fresh id. Returns the log
/// sequence of each event.
pub async fn append_as(
    log: &dyn EventLog,
    actor: ServiceName,
    events: &[DomainEvent],
    at: i64,
) -> Result<Vec<u64>, LogError> {
    let events: Vec<(&DomainEvent, &str)> = events.iter().map(|e| (e, "")).collect();
    append_attributed(log, actor.as_str(), actor.as_str(), &events, at).await
}

/// Appends `events`, each with its correlation id (the migration, wave or
/// process it belongs to), as written by `actor` (a service, or the operator
/// whose command they answer); ids are `<writer>-<uuid>`. Returns the log
/// sequence of each event.
pub async fn append_attributed(
    log: &dyn EventLog,
    writer: &str,
    actor: &str,
    events: &[(&DomainEvent, &str)],
    at: i64,
) -> Result<Vec<u64>, LogError> {
    let mut batch = Vec::with_capacity(events.len());
    for (event, correlation_id) in events {
        let subject = Subject::new(subject_of(event))?;
        batch.push((
            subject,
            NewEvent {
                id: format!("{writer}-{}", uuid::Uuid::new_v4()),
                recorded_at_unix_nanos: at,
                correlation_id: correlation_id.to_string(),
                causation_id: String::new(),
                actor: actor.to_string(),
                trace: None,
                payload: Payload::Domain((*event).clone()),
            },
        ));
    }
    append_in_order(log, batch).await
}

//! The Kubernetes edge of Switchyard.
//!
//! - [`facts`]: Kubernetes objects as fact events (pure).
//! - [`inventory`]: watchers over Nodes, NodeGroups, the ModuleConfig,
//!   GPUClasses, PhysicalGPUs, Pods, workloads, quotas, ResourceSlices and
//!   DeviceClasses that append what changed to the log, once — across watch
//!   restarts, re-lists and restarts of the process.
//! - [`edge`]: the writers that execute the cores' effects with one field
//!   manager per service: Server-Side Apply for the fields a service owns,
//!   read-decide-write with a resourceVersion precondition for removing what
//!   others own, drains through the Eviction API, retries with backoff.
//! - [`host`]: a decision service (stack-assigner) as a process: rebuilt from
//!   the log, following it, deciding, appending, executing its effects, taking
//!   operator commands over NATS.

#![forbid(unsafe_code)]

pub mod edge;
pub mod facts;
pub mod host;
pub mod inventory;

use std::sync::Arc;

use switchyard_core::subjects::subject_of;
use switchyard_eventlog::{EventLog, Expected, LogError, NewEvent, Payload, Subject};
use switchyard_proto::v1::DomainEvent;

/// Wall-clock time at the edge, Unix nanoseconds (cores get it as data).
pub fn now_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i64)
}

/// Appends events to the log as one service: consecutive events of one
/// subject go in one atomic batch. Returns the log sequence of each event.
pub async fn append_as(
    log: &Arc<dyn EventLog>,
    actor: &str,
    events: &[DomainEvent],
    at: i64,
) -> Result<Vec<u64>, LogError> {
    let mut sequences = Vec::with_capacity(events.len());
    let mut i = 0;
    while i < events.len() {
        let subject = subject_of(&events[i]);
        let mut batch = Vec::new();
        while i < events.len()
            && subject_of(&events[i]) == subject
            && batch.len() < switchyard_eventlog::MAX_BATCH_EVENTS
        {
            batch.push(NewEvent {
                id: format!("{actor}-{}", uuid::Uuid::new_v4()),
                recorded_at_unix_nanos: at,
                correlation_id: String::new(),
                causation_id: String::new(),
                actor: actor.to_string(),
                trace: None,
                payload: Payload::Domain(events[i].clone()),
            });
            i += 1;
        }
        let ack = log
            .append(&Subject::new(subject)?, Expected::Any, batch)
            .await?;
        sequences.extend(ack.sequences);
    }
    Ok(sequences)
}

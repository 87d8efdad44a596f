//! The append-only migration log.
//!
//! One trait, [`EventLog`], with two backends that pass one conformance suite:
//! - [`embedded::EmbeddedLog`]: segment files with per-record checksums, a hash chain,
//!   group commit and torn-tail recovery — the default for one process;
//! - [`nats::NatsLog`]: a NATS JetStream stream that denies delete and purge.
//!
//! Records are [`Envelope`]s. The log never reads a clock: the writer passes the
//! recorded time in. Every record carries the BLAKE3 hash of the previous record of
//! its subject (aggregate), so each aggregate's history is tamper-evident on both
//! backends; the embedded backend also chains every frame of the log.

#![forbid(unsafe_code)]

mod append;
mod error;
pub mod fence;
mod follow;
mod record;

pub mod embedded;
pub mod keys;
pub mod nats;
pub mod trace;

#[cfg(feature = "conformance")]
pub mod conformance;

use async_trait::async_trait;
use futures::stream::BoxStream;

pub use append::{Attributed, append_attributed, append_facts, append_in_order, now_nanos};
pub use error::LogError;
pub use record::{
    Decoded, NewEvent, Payload, Signature, SigningKey, StoredEvent, Subject, UnknownReason,
};
pub use switchyard_proto::v1::{DomainEvent, Envelope, TraceContext};

/// Largest encoded envelope the log accepts. JetStream's default `max_payload` is
/// 1 MiB including headers; staying well below keeps both backends alike.
pub const MAX_RECORD_BYTES: usize = 256 * 1024;

/// Most events in one append. Matches JetStream's limit on an atomic batch.
pub const MAX_BATCH_EVENTS: usize = 1000;

/// What the writer believes the subject's last sequence to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expected {
    /// No check. The backend still keeps the subject's hash chain intact by
    /// retrying internally when another writer got in between.
    Any,
    /// The subject must have no events yet.
    Empty,
    /// The subject's last event must have exactly this (log-wide) sequence.
    Sequence(u64),
}

impl Expected {
    /// The sequence the subject's last event must have, if any check is asked for.
    pub fn required(self) -> Option<u64> {
        match self {
            Expected::Any => None,
            Expected::Empty => Some(0),
            Expected::Sequence(seq) => Some(seq),
        }
    }
}

/// The outcome of a successful append.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppendAck {
    /// Log sequence of every event of the batch, in order. For duplicates this is
    /// the sequence under which the event was first stored.
    pub sequences: Vec<u64>,
    /// How many events of the batch were already in the log (same id) and were
    /// not stored again.
    pub duplicates: usize,
}

impl AppendAck {
    pub fn last_sequence(&self) -> u64 {
        self.sequences.last().copied().unwrap_or(0)
    }
}

/// Which events to read.
#[derive(Clone, Debug, Default)]
pub struct ReadRequest {
    /// Only this subject; all subjects when `None`.
    pub subject: Option<Subject>,
    /// First log sequence to return (sequences start at 1; 0 means from the start).
    pub from: u64,
    /// At most this many events; `None` for all that exist when the read starts.
    pub limit: Option<usize>,
}

/// What `verify` found. Problems are listed, not raised: a damaged log is still
/// described as far as it can be read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VerifyReport {
    pub records: u64,
    pub subjects: u64,
    pub last_sequence: u64,
    /// Head of the log-wide hash chain (embedded backend) — publish it to anchor
    /// the log; empty where the backend has no log-wide chain.
    pub chain_head: String,
    /// Events this build cannot decode (unknown type or newer schema). They are
    /// kept, not dropped; reported so an operator knows a newer writer was here.
    pub undecodable: Vec<UndecodableEvent>,
    pub problems: Vec<Problem>,
    /// Records whose signature vouches for their author, when a keyring
    /// was given (see [`keys::Keyring::check`]); the others are problems.
    pub authenticated: Option<u64>,
}

impl VerifyReport {
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UndecodableEvent {
    pub sequence: u64,
    pub event_type: String,
    pub schema_version: u32,
    pub reason: UnknownReason,
}

/// One thing wrong with the stored log, located as precisely as the backend can.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Problem {
    /// Where: a segment file and byte offset, or a stream sequence.
    pub location: String,
    pub sequence: Option<u64>,
    pub what: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.sequence {
            Some(seq) => write!(f, "{} (sequence {seq}): {}", self.location, self.what),
            None => write!(f, "{}: {}", self.location, self.what),
        }
    }
}

/// The migration log. Both backends implement it and pass [`conformance`].
#[async_trait]
pub trait EventLog: Send + Sync {
    /// Appends `events` to `subject` as one batch: all of them or none.
    /// A failed `expected` check is [`LogError::Conflict`]; nothing is written then.
    async fn append(
        &self,
        subject: &Subject,
        expected: Expected,
        events: Vec<NewEvent>,
    ) -> Result<AppendAck, LogError> {
        let events = events.into_iter().map(|e| (subject.clone(), e)).collect();
        self.append_batch(events, &[(subject.clone(), expected)])
            .await
    }

    /// Appends `events`, each to its own subject, in this order, as one atomic
    /// batch: all of them or none. `expected` holds the checks, at most one per
    /// subject of the batch; a subject without one is appended as with
    /// [`Expected::Any`]. A failed check is [`LogError::Conflict`] and nothing
    /// is written. A retry with the same ids is acknowledged as the earlier
    /// append, with `duplicates` counting every event.
    async fn append_batch(
        &self,
        events: Vec<(Subject, NewEvent)>,
        expected: &[(Subject, Expected)],
    ) -> Result<AppendAck, LogError>;

    /// Appends `events`, each to its own subject, one by one rather than as
    /// one batch: for records that stand alone (observed facts), where
    /// all-or-nothing across subjects is not worth its price (JetStream
    /// stages every atomic batch; see the backend). Each event is chained to
    /// its subject's head and stored once (a retry is recognised by its id),
    /// and a subject's events keep their order; events of different subjects
    /// may be stored in another order than given. A failure may leave some
    /// events stored and others not; the error names the event it stopped at.
    /// The ack gives each event's sequence in the order given. Backends whose
    /// batches cost no more than their events keep the default: one atomic
    /// batch, which gives all of these guarantees and more.
    async fn append_each(&self, events: Vec<(Subject, NewEvent)>) -> Result<AppendAck, LogError> {
        self.append_batch(events, &[]).await
    }

    /// Events that exist when the read starts, in log order.
    async fn read(&self, request: ReadRequest) -> Result<Vec<StoredEvent>, LogError>;

    /// Events from `from` on, then every new one as it is appended. The stream
    /// ends only with an error or when the log is closed.
    async fn follow(
        &self,
        subject: Option<Subject>,
        from: u64,
    ) -> Result<BoxStream<'static, Result<StoredEvent, LogError>>, LogError>;

    /// Sequence of the last event of `subject`, or of the whole log; 0 if none.
    async fn last_sequence(&self, subject: Option<&Subject>) -> Result<u64, LogError>;

    /// Checks every record: checksums, hash chains, sequences, decodability.
    async fn verify(&self) -> Result<VerifyReport, LogError>;
}

/// Reads the whole log from `from` on, page by page, handing each event to
/// `fold`; the next page is read while the current one is folded. Returns the
/// number of events folded.
pub async fn replay(
    log: &dyn EventLog,
    from: u64,
    mut fold: impl FnMut(StoredEvent),
) -> Result<u64, LogError> {
    const PAGE: usize = 8192;
    let page_from = |from| ReadRequest {
        subject: None,
        from,
        limit: Some(PAGE),
    };
    let mut current = log.read(page_from(from)).await?;
    let mut count = 0;
    while let Some(last) = current.last() {
        let mut next = Box::pin(log.read(page_from(last.sequence + 1)));
        // Start the next read (the embedded backend reads on a blocking thread)
        // before folding this page.
        let early = futures::poll!(next.as_mut());
        for event in current.drain(..) {
            fold(event);
            count += 1;
        }
        current = match early {
            std::task::Poll::Ready(page) => page?,
            std::task::Poll::Pending => next.await?,
        };
    }
    Ok(count)
}

/// Per-subject chain check shared by both backends' `verify`: each record's
/// `prev_hash` must be the hash of the subject's previous record.
#[derive(Default)]
pub(crate) struct SubjectChains {
    /// Last sequence and hash per subject; `None` after unreadable records were
    /// skipped, since the skipped record may have belonged to the subject.
    heads: std::collections::BTreeMap<String, (u64, Option<[u8; 32]>)>,
    /// Records were skipped: subjects first seen after that may have had earlier ones.
    skipped: bool,
}

impl SubjectChains {
    /// Feeds one record; returns a description of the break if the chain is broken.
    pub(crate) fn check(&mut self, event: &StoredEvent) -> Option<String> {
        let envelope = &event.envelope;
        let problem = match self.heads.get(&envelope.subject) {
            None if !self.skipped && !envelope.prev_hash.is_empty() => Some(format!(
                "subject {}: first record has prev_hash {} but no earlier record exists",
                envelope.subject,
                hex::encode(&envelope.prev_hash)
            )),
            Some((prev_seq, Some(hash))) if hash.as_slice() != envelope.prev_hash.as_slice() => {
                Some(format!(
                    "subject {}: prev_hash {} does not match the hash {} of its previous record (sequence {prev_seq})",
                    envelope.subject,
                    hex::encode(&envelope.prev_hash),
                    hex::encode(hash)
                ))
            }
            _ => None,
        };
        self.heads.insert(
            envelope.subject.clone(),
            (event.sequence, Some(event.hash())),
        );
        problem
    }

    /// Unreadable records were skipped: the next record of any subject is
    /// accepted as the new anchor of its chain, so one damaged record is
    /// reported once rather than again for every subject.
    pub(crate) fn skip_unreadable(&mut self) {
        self.skipped = true;
        for head in self.heads.values_mut() {
            head.1 = None;
        }
    }

    pub(crate) fn len(&self) -> u64 {
        self.heads.len() as u64
    }
}

/// Records an undecodable event in the report, if `event` is one.
pub(crate) fn note_undecodable(report: &mut VerifyReport, event: &StoredEvent) {
    if let Decoded::Unknown {
        event_type,
        schema_version,
        reason,
        ..
    } = event.decode()
    {
        report.undecodable.push(UndecodableEvent {
            sequence: event.sequence,
            event_type,
            schema_version,
            reason,
        });
    }
}

//! The fence of elected writers: a service that runs with standbys writes
//! each record with its term ([`LeaderTerm`]: the sequence of the
//! `LeaderTermStarted` record that began it). A record stored after a later
//! term of the same service began is fenced: [`Fenced`] never hands it to a
//! reader, so a deposed leader — paused past its lease, cut off from the API
//! server — cannot change what anybody folds or decides, whatever it still
//! appends. Whether a record is fenced depends only on the records before it
//! in the log, so every reader, and every replay, agrees.
//!
//! The terms of every service are on one subject ([`LEADERS_SUBJECT`]):
//! a reader learns them all in one read, and a follower of the whole log as
//! they come.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;
use switchyard_core::subjects::LEADERS_SUBJECT;
use switchyard_proto::v1::{DomainEvent, LeaderTerm, LeaderTermStarted, domain_event::Kind};

use crate::{
    AppendAck, Decoded, EventLog, Expected, LogError, NewEvent, ReadRequest, StoredEvent, Subject,
    VerifyReport,
};

/// What the fence knows of the terms.
#[derive(Debug, Default)]
struct Terms {
    /// Each service's terms (the sequences of their records).
    started: BTreeMap<String, BTreeSet<u64>>,
    /// Every term record up to this log sequence is known.
    known_to: u64,
    /// The next sequence to read the terms' subject from.
    read_from: u64,
}

impl Terms {
    /// Notes `stored` if it starts a term.
    fn learn(&mut self, stored: &StoredEvent) {
        if let Decoded::Event(event) = stored.decode()
            && let Some(term) = term_started(&event)
        {
            self.started
                .entry(term.service.clone())
                .or_default()
                .insert(stored.sequence);
        }
    }

    /// The later term of its service that fences `stored`, if one does.
    fn fenced_by(&self, stored: &StoredEvent) -> Option<u64> {
        let term = stored.envelope.term.as_ref()?;
        self.started
            .get(&term.service)?
            .range(term.sequence + 1..stored.sequence)
            .next()
            .copied()
    }
}

fn leaders() -> Subject {
    Subject::new(LEADERS_SUBJECT).expect("a valid subject")
}

/// A log behind the fence: reads and follows pass fenced records over, and
/// appends carry the writer's term once it has begun one
/// ([`Fenced::begin_term`]).
pub struct Fenced {
    inner: Arc<dyn EventLog>,
    terms: Arc<tokio::sync::Mutex<Terms>>,
    writing: Mutex<Option<LeaderTerm>>,
}

impl Fenced {
    pub fn new(inner: Arc<dyn EventLog>) -> Self {
        Fenced {
            inner,
            terms: Arc::default(),
            writing: Mutex::new(None),
        }
    }

    /// Begins a term of `service` led by `holder` (recorded at `at`): its
    /// record is appended, and every later append through this log carries
    /// the term. Returns the term (the record's sequence).
    pub async fn begin_term(&self, service: &str, holder: &str, at: i64) -> Result<u64, LogError> {
        let event = DomainEvent::from(Kind::LeaderTermStarted(LeaderTermStarted {
            service: service.to_string(),
            holder: holder.to_string(),
        }));
        let mut record = NewEvent::new(
            format!("{service}-term-{}", uuid::Uuid::new_v4()),
            at,
            event,
        );
        record.actor = service.to_string();
        let sequence = self
            .inner
            .append(&leaders(), Expected::Any, vec![record])
            .await?
            .last_sequence();
        *self.writing.lock().expect("term lock") = Some(LeaderTerm {
            service: service.to_string(),
            sequence,
        });
        tracing::info!(
            service,
            holder,
            term = sequence,
            "began a term as the leader"
        );
        Ok(sequence)
    }

    /// The term this writer's appends carry, if it began one.
    pub fn term(&self) -> Option<u64> {
        self.writing
            .lock()
            .expect("term lock")
            .as_ref()
            .map(|t| t.sequence)
    }

    fn stamped(&self, events: Vec<(Subject, NewEvent)>) -> Vec<(Subject, NewEvent)> {
        let Some(term) = self.writing.lock().expect("term lock").clone() else {
            return events;
        };
        events
            .into_iter()
            .map(|(subject, mut event)| {
                event.term = Some(term.clone());
                (subject, event)
            })
            .collect()
    }
}

/// How long the fence keeps asking for the terms while the log does not
/// answer (a cluster between leaders): as long as an append keeps trying.
const REFRESH_PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);

/// Where the log ends, and the term records from `from` on.
async fn load_terms(inner: &dyn EventLog, from: u64) -> Result<(u64, Vec<StoredEvent>), LogError> {
    let head = inner.last_sequence(None).await?;
    let records = inner
        .read(ReadRequest {
            subject: Some(leaders()),
            from,
            limit: None,
        })
        .await?;
    Ok((head, records))
}

/// Reads the terms' subject on from where `terms` stopped, so that every
/// term record up to where the log ended when asked is known; asked again
/// for up to [`REFRESH_PATIENCE`] while the log does not answer.
async fn refresh(inner: &dyn EventLog, terms: &mut Terms) -> Result<(), LogError> {
    use backon::Retryable;
    let from = terms.read_from;
    let (head, records) = (|| load_terms(inner, from))
        .retry(
            backon::ExponentialBuilder::default()
                .with_max_delay(std::time::Duration::from_secs(2))
                .with_total_delay(Some(REFRESH_PATIENCE))
                .without_max_times(),
        )
        .notify(|err, pause| {
            tracing::warn!(%err, ?pause, "the fence could not read the leaders' terms; trying again");
        })
        .await?;
    for stored in &records {
        terms.learn(stored);
        terms.read_from = stored.sequence + 1;
    }
    terms.known_to = terms.known_to.max(head);
    Ok(())
}

/// Says that a record was passed over as fenced.
fn passed_over(stored: &StoredEvent, by: u64) {
    let term = stored.envelope.term.as_ref();
    tracing::warn!(
        sequence = stored.sequence,
        subject = stored.envelope.subject,
        event_type = stored.envelope.event_type,
        service = term.map_or("", |t| t.service.as_str()),
        term = term.map_or(0, |t| t.sequence),
        superseded_by = by,
        "passed over a record of a deposed leader (fenced: a later term began before it was stored)"
    );
}

#[async_trait]
impl EventLog for Fenced {
    async fn append_batch(
        &self,
        events: Vec<(Subject, NewEvent)>,
        expected: &[(Subject, Expected)],
    ) -> Result<AppendAck, LogError> {
        self.inner
            .append_batch(self.stamped(events), expected)
            .await
    }

    async fn append_each(&self, events: Vec<(Subject, NewEvent)>) -> Result<AppendAck, LogError> {
        self.inner.append_each(self.stamped(events)).await
    }

    async fn read(&self, request: ReadRequest) -> Result<Vec<StoredEvent>, LogError> {
        let limit = request.limit;
        let mut out = Vec::new();
        let mut from = request.from;
        loop {
            let page = self
                .inner
                .read(ReadRequest {
                    subject: request.subject.clone(),
                    from,
                    limit: limit.map(|l| l - out.len()),
                })
                .await?;
            // A page cut short by the limit may have more after it.
            let more = limit.is_some_and(|l| page.len() == l - out.len()) && !page.is_empty();
            let mut terms = self.terms.lock().await;
            if page
                .iter()
                .any(|r| r.envelope.term.is_some() && r.sequence > terms.known_to)
            {
                refresh(self.inner.as_ref(), &mut terms).await?;
            }
            if let Some(last) = page.last() {
                from = last.sequence + 1;
            }
            for stored in page {
                match terms.fenced_by(&stored) {
                    Some(by) => passed_over(&stored, by),
                    None => out.push(stored),
                }
            }
            if !more || limit.is_some_and(|l| out.len() >= l) {
                return Ok(out);
            }
        }
    }

    async fn follow(
        &self,
        subject: Option<Subject>,
        from: u64,
    ) -> Result<BoxStream<'static, Result<StoredEvent, LogError>>, LogError> {
        {
            let mut terms = self.terms.lock().await;
            if terms.known_to + 1 < from {
                refresh(self.inner.as_ref(), &mut terms).await?;
            }
        }
        // Following the whole log, every term record comes in order: the
        // terms are known up to each record as it comes.
        let whole = subject.is_none();
        let records = self.inner.follow(subject, from).await?;
        let terms = self.terms.clone();
        let inner = self.inner.clone();
        Ok(records
            .filter_map(move |next| {
                let terms = terms.clone();
                let inner = inner.clone();
                async move {
                    let stored = match next {
                        Ok(stored) => stored,
                        Err(err) => return Some(Err(err)),
                    };
                    let mut terms = terms.lock().await;
                    terms.learn(&stored);
                    if whole {
                        terms.known_to = terms.known_to.max(stored.sequence);
                    } else if stored.envelope.term.is_some()
                        && stored.sequence > terms.known_to
                        && let Err(err) = refresh(inner.as_ref(), &mut terms).await
                    {
                        return Some(Err(err));
                    }
                    match terms.fenced_by(&stored) {
                        Some(by) => {
                            passed_over(&stored, by);
                            None
                        }
                        None => Some(Ok(stored)),
                    }
                }
            })
            .boxed())
    }

    async fn last_sequence(&self, subject: Option<&Subject>) -> Result<u64, LogError> {
        self.inner.last_sequence(subject).await
    }

    async fn verify(&self) -> Result<VerifyReport, LogError> {
        self.inner.verify().await
    }
}

/// Whether `payload` starts a term (what a standby watches for).
pub fn term_started(event: &DomainEvent) -> Option<&LeaderTermStarted> {
    match &event.kind {
        Some(Kind::LeaderTermStarted(term)) => Some(term),
        _ => None,
    }
}

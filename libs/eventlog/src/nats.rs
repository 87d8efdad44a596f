//! The NATS JetStream backend.
//!
//! One file-storage stream (deny delete, deny purge) holds the log; an aggregate
//! `node.worker-1` is the stream subject `<prefix>.node.worker-1`. Appends carry
//! `Nats-Msg-Id` (the event id) for de-duplication and
//! `Nats-Expected-Last-Subject-Sequence` for optimistic concurrency; a batch of
//! several events is one JetStream atomic batch, stored whole or not at all.
//! Reads use ordered consumers. After a timeout or a lost connection an append
//! is retried with the same ids until its deadline; the server's de-duplication
//! (or, on a standalone server, a look at the subject's last message) makes sure
//! a retried event is stored once.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_nats::HeaderMap;
use async_nats::jetstream::{
    self,
    consumer::{DeliverPolicy, pull::OrderedConfig},
    context::{PublishError, PublishErrorKind},
    stream::{Config, LastRawMessageErrorKind, RawMessageErrorKind, StorageType, Stream},
};
use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;

use crate::record::{EncodedEvent, validate_batch};
use crate::{
    AppendAck, EventLog, Expected, LogError, MAX_RECORD_BYTES, NewEvent, Problem, ReadRequest,
    StoredEvent, Subject, SubjectChains, VerifyReport, note_undecodable,
};

const MSG_ID: &str = "Nats-Msg-Id";
const EXPECTED_LAST_SUBJECT_SEQUENCE: &str = "Nats-Expected-Last-Subject-Sequence";
const BATCH_ID: &str = "Nats-Batch-Id";
const BATCH_SEQUENCE: &str = "Nats-Batch-Sequence";
const BATCH_COMMIT: &str = "Nats-Batch-Commit";

/// Wrong last sequence, with and without the number.
const WRONG_LAST_SEQUENCE: [u64; 2] = [10071, 10164];
/// An id of an atomic batch is already stored (or repeated in the batch).
const DUPLICATE_IN_BATCH: u64 = 10201;
/// Message over the stream's max_msg_size.
const MESSAGE_TOO_LARGE: u64 = 10054;
/// Nothing was stored and trying again can succeed: an incomplete (abandoned)
/// batch, too many batches in flight.
const RETRYABLE: [u64; 2] = [10176, 10210];

#[derive(Clone, Debug)]
pub struct NatsOptions {
    /// Stream name, e.g. `SWITCHYARD_LOG`.
    pub stream: String,
    /// Subject prefix of the stream; aggregates live under `<prefix>.>`.
    pub subject_prefix: String,
    /// How long to wait for one publish acknowledgement.
    pub ack_timeout: Duration,
    /// How long an append keeps retrying through timeouts and reconnects.
    pub retry_for: Duration,
    /// Create the stream if it does not exist (writers); readers leave it alone.
    pub create: bool,
}

impl Default for NatsOptions {
    fn default() -> Self {
        NatsOptions {
            stream: "SWITCHYARD_LOG".into(),
            subject_prefix: "switchyard.log".into(),
            ack_timeout: Duration::from_secs(5),
            retry_for: Duration::from_secs(60),
            create: true,
        }
    }
}

/// The log on a JetStream stream.
pub struct NatsLog {
    client: async_nats::Client,
    js: jetstream::Context,
    stream: Stream,
    options: NatsOptions,
    /// Last sequence and hash of each subject this process has seen; a stale
    /// entry is caught by the server's expected-sequence check and reloaded.
    heads: Mutex<BTreeMap<String, Head>>,
    /// Appends retried after a timeout or a lost connection, for metrics and tests.
    retried: AtomicU64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Head {
    seq: u64,
    hash: Option<[u8; 32]>,
}

const EMPTY: Head = Head { seq: 0, hash: None };

impl NatsLog {
    /// Connects to `url` and opens (or, with `options.create`, creates) the stream.
    /// The first connection attempt fails fast; once connected, the client
    /// reconnects on its own. Services that must wait for the server pass their
    /// own client to [`NatsLog::open`].
    pub async fn connect(url: &str, options: NatsOptions) -> Result<Self, LogError> {
        let client = async_nats::ConnectOptions::new()
            .name("switchyard-eventlog")
            .connect(url)
            .await
            .map_err(|err| LogError::nats(format!("connect to {url}"), err))?;
        Self::open(client, options).await
    }

    pub async fn open(client: async_nats::Client, options: NatsOptions) -> Result<Self, LogError> {
        let js = jetstream::ContextBuilder::new()
            .timeout(options.ack_timeout)
            .build(client.clone());
        let stream = if options.create {
            js.get_or_create_stream(Config {
                name: options.stream.clone(),
                subjects: vec![format!("{}.>", options.subject_prefix)],
                storage: StorageType::File,
                deny_delete: true,
                deny_purge: true,
                allow_atomic_publish: true,
                allow_direct: true,
                duplicate_window: Duration::from_secs(120),
                max_message_size: (MAX_RECORD_BYTES + 4096) as i32,
                ..Default::default()
            })
            .await
            .map_err(|err| LogError::nats(format!("create stream {}", options.stream), err))?
        } else {
            js.get_stream(&options.stream)
                .await
                .map_err(|err| LogError::nats(format!("open stream {}", options.stream), err))?
        };
        let config = &stream.cached_info().config;
        let mut missing = Vec::new();
        if !config.deny_delete {
            missing.push("deny_delete");
        }
        if !config.deny_purge {
            missing.push("deny_purge");
        }
        if !missing.is_empty() {
            return Err(LogError::nats(
                format!("open stream {}", options.stream),
                format!(
                    "the stream lacks {}; an audit log needs a stream created with deny_delete and deny_purge (they cannot be changed later)",
                    missing.join(" and ")
                ),
            ));
        }
        if options.create && !config.allow_atomic_publish {
            return Err(LogError::nats(
                format!("open stream {}", options.stream),
                "the stream does not allow atomic batch publish (allow_atomic); batches could be half-stored",
            ));
        }
        Ok(NatsLog {
            client,
            js,
            stream,
            options,
            heads: Mutex::new(BTreeMap::new()),
            retried: AtomicU64::new(0),
        })
    }

    fn stream_subject(&self, subject: &Subject) -> String {
        format!("{}.{}", self.options.subject_prefix, subject)
    }

    fn cached_head(&self, subject: &Subject) -> Option<Head> {
        self.heads
            .lock()
            .expect("heads lock")
            .get(subject.as_str())
            .copied()
    }

    fn remember(&self, subject: &Subject, head: Head) {
        let mut heads = self.heads.lock().expect("heads lock");
        match heads.get_mut(subject.as_str()) {
            Some(known) if known.seq > head.seq => {}
            Some(known) => *known = head,
            None => {
                heads.insert(subject.to_string(), head);
            }
        }
    }

    /// The subject's last message from the server: its head and event id.
    async fn load_head(&self, subject: &Subject) -> Result<(Head, Option<String>), LogError> {
        match self
            .stream
            .get_last_raw_message_by_subject(&self.stream_subject(subject))
            .await
        {
            Ok(message) => {
                let head = Head {
                    seq: message.sequence,
                    hash: Some(*blake3::hash(&message.payload).as_bytes()),
                };
                let id = message.headers.get(MSG_ID).map(|v| v.as_str().to_string());
                self.heads
                    .lock()
                    .expect("heads lock")
                    .insert(subject.to_string(), head);
                Ok((head, id))
            }
            Err(err) if err.kind() == LastRawMessageErrorKind::NoMessageFound => {
                self.heads
                    .lock()
                    .expect("heads lock")
                    .remove(subject.as_str());
                Ok((EMPTY, None))
            }
            Err(err) => Err(LogError::nats(
                format!("read last message of {subject}"),
                err,
            )),
        }
    }

    /// If the subject's last messages are exactly this batch (`ids`, in order,
    /// contiguous as an atomic batch is stored), the acknowledgement of that
    /// earlier append; `head_id` is the id of the message at `head`, if known.
    async fn stored_as_tail(
        &self,
        subject: &Subject,
        head: Head,
        head_id: Option<&str>,
        ids: &[&str],
    ) -> Result<Option<AppendAck>, LogError> {
        let count = ids.len() as u64;
        let Some(first) = (head.seq + 1)
            .checked_sub(count)
            .filter(|first| *first >= 1)
        else {
            return Ok(None);
        };
        if head_id.is_some_and(|id| id != ids[ids.len() - 1]) {
            return Ok(None);
        }
        let stream_subject = self.stream_subject(subject);
        for (seq, id) in (first..=head.seq).zip(ids) {
            if seq == head.seq && head_id.is_some() {
                continue;
            }
            let message = match self.stream.get_raw_message(seq).await {
                Ok(message) => message,
                Err(err) if err.kind() == RawMessageErrorKind::NoMessageFound => return Ok(None),
                Err(err) => return Err(LogError::nats(format!("read stream sequence {seq}"), err)),
            };
            let stored_id = message.headers.get(MSG_ID).map(|v| v.as_str());
            if message.subject.as_str() != stream_subject || stored_id != Some(*id) {
                return Ok(None);
            }
        }
        Ok(Some(AppendAck {
            sequences: (first..=head.seq).collect(),
            duplicates: ids.len(),
        }))
    }

    /// [`Self::load_head`], retried through timeouts and reconnects until
    /// `deadline` — an append in progress must not give up on a read.
    async fn load_head_until(
        &self,
        subject: &Subject,
        deadline: Instant,
    ) -> Result<(Head, Option<String>), LogError> {
        let mut backoff = Duration::from_millis(50);
        loop {
            match self.load_head(subject).await {
                Err(err) if Instant::now() < deadline => {
                    tracing::debug!(%subject, error = %err, "reading the subject's head retried");
                    self.retried.fetch_add(1, Ordering::Relaxed);
                    // Back off between attempts (a retry pace, not a wait for an event).
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                }
                result => return result,
            }
        }
    }

    /// Publishes the batch chained to `head`; returns the acks' sequences.
    async fn publish(
        &self,
        subject: &Subject,
        head: Head,
        events: &[EncodedEvent],
        originals: &[NewEvent],
        attempt: u32,
    ) -> Result<(Vec<u64>, bool, Head), PublishError> {
        let stream_subject = self.stream_subject(subject);
        let mut prev = head.hash;
        let mut bodies = Vec::with_capacity(events.len());
        for event in events {
            let body = event.finish(prev.as_ref());
            prev = Some(*blake3::hash(&body).as_bytes());
            bodies.push(body);
        }
        let batch_id = (events.len() > 1).then(|| {
            let key = format!("{}/{}/{attempt}", events[0].id, events.len());
            blake3::hash(key.as_bytes()).to_hex()[..32].to_string()
        });
        let last = events.len() - 1;
        let mut ack = None;
        for (i, (event, body)) in events.iter().zip(bodies).enumerate() {
            let mut headers = HeaderMap::new();
            headers.insert(MSG_ID, event.id.as_str());
            if i == 0 {
                headers.insert(
                    EXPECTED_LAST_SUBJECT_SEQUENCE,
                    head.seq.to_string().as_str(),
                );
            }
            if let Some(trace) = &originals[i].trace {
                if !trace.traceparent.is_empty() {
                    headers.insert("traceparent", trace.traceparent.as_str());
                }
                if !trace.tracestate.is_empty() {
                    headers.insert("tracestate", trace.tracestate.as_str());
                }
            }
            if let Some(batch_id) = &batch_id {
                headers.insert(BATCH_ID, batch_id.as_str());
                headers.insert(BATCH_SEQUENCE, (i + 1).to_string().as_str());
                if i == last {
                    headers.insert(BATCH_COMMIT, "1");
                }
            }
            if i < last {
                // Non-commit messages of an atomic batch get no acknowledgement.
                self.client
                    .publish_with_headers(stream_subject.clone(), headers, body)
                    .await
                    .map_err(|err| PublishError::with_source(PublishErrorKind::BrokenPipe, err))?;
            } else {
                ack = Some(
                    self.js
                        .publish_with_headers(stream_subject.clone(), headers, body)
                        .await?
                        .await?,
                );
            }
        }
        let ack = ack.expect("a batch has a last event");
        let first = ack.sequence + 1 - events.len() as u64;
        let head = Head {
            seq: ack.sequence,
            hash: prev,
        };
        Ok(((first..=ack.sequence).collect(), ack.duplicate, head))
    }

    async fn bound(&self, subject: Option<&Subject>) -> Result<u64, LogError> {
        match subject {
            Some(subject) => Ok(self.load_head(subject).await?.0.seq),
            None => {
                let info = self.stream.get_info().await.map_err(|err| {
                    LogError::nats(format!("stream info {}", self.options.stream), err)
                })?;
                Ok(info.state.last_sequence)
            }
        }
    }

    async fn consumer_from(
        &self,
        subject: Option<&Subject>,
        from: u64,
    ) -> Result<jetstream::consumer::pull::Ordered, LogError> {
        let filter_subject = match subject {
            Some(subject) => self.stream_subject(subject),
            None => format!("{}.>", self.options.subject_prefix),
        };
        let consumer = self
            .stream
            .create_consumer(OrderedConfig {
                filter_subject,
                deliver_policy: DeliverPolicy::ByStartSequence {
                    start_sequence: from.max(1),
                },
                ..Default::default()
            })
            .await
            .map_err(|err| LogError::nats("create ordered consumer", err))?;
        consumer
            .messages()
            .await
            .map_err(|err| LogError::nats("consume", err))
    }
}

fn error_code(err: &PublishError) -> Option<u64> {
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        if let Some(js) = cause.downcast_ref::<jetstream::Error>() {
            return Some(js.error_code().0);
        }
        source = cause.source();
    }
    None
}

fn to_stored(message: &jetstream::Message) -> Result<StoredEvent, LogError> {
    let seq = message
        .info()
        .map_err(|err| LogError::nats("read message metadata", err))?
        .stream_sequence;
    StoredEvent::from_raw(seq, message.payload.clone())
        .map_err(|err| LogError::nats(format!("decode stream sequence {seq}"), err))
}

#[async_trait]
impl EventLog for NatsLog {
    async fn append(
        &self,
        subject: &Subject,
        expected: Expected,
        events: Vec<NewEvent>,
    ) -> Result<AppendAck, LogError> {
        validate_batch(subject, &events)?;
        let encoded = events
            .iter()
            .map(|e| e.encode(subject))
            .collect::<Result<Vec<_>, _>>()?;
        let ids: Vec<&str> = encoded.iter().map(|e| e.id.as_str()).collect();
        let deadline = Instant::now() + self.options.retry_for;
        let gave_up = |err: &dyn std::fmt::Display| {
            LogError::nats(
                format!(
                    "append to {subject} (gave up after {:?})",
                    self.options.retry_for
                ),
                err,
            )
        };
        let mut attempt = 0u32;
        let mut head = self.cached_head(subject);
        loop {
            if attempt > 0 && Instant::now() >= deadline {
                return Err(gave_up(&"still conflicting or unreachable"));
            }
            let (current, current_id, from_cache) = match head.take() {
                Some(head) => (head, None, true),
                None => {
                    let (head, id) = self.load_head_until(subject, deadline).await?;
                    (head, id, false)
                }
            };
            if let Some(required) = expected.required() {
                if current.seq != required && from_cache {
                    // The cache may be behind; ask the server before refusing.
                    continue;
                }
                if current.seq != required {
                    // A retry of a batch that was stored although its ack was lost
                    // finds the subject moved on by exactly that batch.
                    if let Some(ack) = self
                        .stored_as_tail(subject, current, current_id.as_deref(), &ids)
                        .await?
                    {
                        return Ok(ack);
                    }
                    return Err(LogError::Conflict {
                        subject: subject.to_string(),
                        expected: required,
                        actual: current.seq.to_string(),
                    });
                }
            }
            let err = match self
                .publish(subject, current, &encoded, &events, attempt)
                .await
            {
                Ok((sequences, duplicate, new_head)) => {
                    if !duplicate {
                        self.remember(subject, new_head);
                    }
                    let duplicates = if duplicate { sequences.len() } else { 0 };
                    return Ok(AppendAck {
                        sequences,
                        duplicates,
                    });
                }
                Err(err) => err,
            };
            attempt += 1;
            let code = error_code(&err);
            if err.kind() == PublishErrorKind::MaxPayloadExceeded || code == Some(MESSAGE_TOO_LARGE)
            {
                let size = encoded
                    .iter()
                    .map(|e| e.finish(None).len())
                    .max()
                    .unwrap_or(0);
                return Err(LogError::Oversize {
                    id: ids[ids.len() - 1].to_string(),
                    size,
                    limit: MAX_RECORD_BYTES,
                });
            }
            if err.kind() == PublishErrorKind::WrongLastSequence
                || code.is_some_and(|c| WRONG_LAST_SEQUENCE.contains(&c))
            {
                // Another writer got in first, or an earlier attempt of this very
                // batch was stored before its ack was lost.
                let (latest, latest_id) = self.load_head_until(subject, deadline).await?;
                if let Some(ack) = self
                    .stored_as_tail(subject, latest, latest_id.as_deref(), &ids)
                    .await?
                {
                    return Ok(ack);
                }
                // Any: try again on the new head. Also on a clustered stream, where
                // 10164 can mean a write in flight rather than a moved subject.
                if expected == Expected::Any || expected.required() == Some(latest.seq) {
                    head = Some(latest);
                    continue;
                }
                return Err(LogError::Conflict {
                    subject: subject.to_string(),
                    expected: expected.required().unwrap_or(current.seq),
                    actual: latest.seq.to_string(),
                });
            }
            if code == Some(DUPLICATE_IN_BATCH) {
                // Some id of the batch is stored already. Fine if the whole batch is
                // the subject's tail (a retry); anything else is refused whole.
                let (latest, latest_id) = self.load_head_until(subject, deadline).await?;
                if let Some(ack) = self
                    .stored_as_tail(subject, latest, latest_id.as_deref(), &ids)
                    .await?
                {
                    return Ok(ack);
                }
                return Err(LogError::InvalidBatch {
                    subject: subject.to_string(),
                    count: ids.len(),
                    expected: "events that are not stored yet; some of these ids are already stored \
                               (a retry is recognised while the batch is still the subject's latest events)"
                        .into(),
                });
            }
            if code.is_some_and(|c| !RETRYABLE.contains(&c))
                || err.kind() == PublishErrorKind::StreamNotFound
            {
                return Err(LogError::nats(format!("append to {subject}"), err));
            }
            // Timeout, lost connection, abandoned or throttled batch: it may or may
            // not be stored. Retry with the same ids; de-duplication keeps it single.
            if Instant::now() >= deadline {
                return Err(gave_up(&err));
            }
            tracing::debug!(%subject, attempt, error = %err, "append retried");
            self.retried.fetch_add(1, Ordering::Relaxed);
        }
    }

    async fn read(&self, request: ReadRequest) -> Result<Vec<StoredEvent>, LogError> {
        let from = request.from.max(1);
        let limit = request.limit.unwrap_or(usize::MAX);
        let bound = self.bound(request.subject.as_ref()).await?;
        let mut out = Vec::new();
        if bound < from || limit == 0 {
            return Ok(out);
        }
        let mut messages = self.consumer_from(request.subject.as_ref(), from).await?;
        while let Some(message) = messages.next().await {
            let message = message.map_err(|err| LogError::nats("read", err))?;
            let pending = message.info().map(|i| i.pending).unwrap_or(0);
            let event = to_stored(&message)?;
            let seq = event.sequence;
            out.push(event);
            if seq >= bound || out.len() >= limit || pending == 0 {
                break;
            }
        }
        Ok(out)
    }

    async fn follow(
        &self,
        subject: Option<Subject>,
        from: u64,
    ) -> Result<BoxStream<'static, Result<StoredEvent, LogError>>, LogError> {
        let messages = self.consumer_from(subject.as_ref(), from).await?;
        Ok(messages
            .map(|message| match message {
                Ok(message) => to_stored(&message),
                Err(err) => Err(LogError::nats("follow", err)),
            })
            .boxed())
    }

    async fn last_sequence(&self, subject: Option<&Subject>) -> Result<u64, LogError> {
        self.bound(subject).await
    }

    async fn verify(&self) -> Result<VerifyReport, LogError> {
        let mut report = VerifyReport::default();
        let info =
            self.stream.get_info().await.map_err(|err| {
                LogError::nats(format!("stream info {}", self.options.stream), err)
            })?;
        let location = |seq: u64| format!("stream {} sequence {seq}", self.options.stream);
        if !info.config.deny_delete || !info.config.deny_purge {
            report.problems.push(Problem {
                location: format!("stream {}", self.options.stream),
                sequence: None,
                what: "the stream allows delete or purge".into(),
            });
        }
        let last = info.state.last_sequence;
        let mut expected_seq = 1;
        let mut chains = SubjectChains::default();
        if last > 0 {
            let mut messages = self.consumer_from(None, 1).await?;
            while let Some(message) = messages.next().await {
                let message = message.map_err(|err| LogError::nats("verify", err))?;
                let seq = message
                    .info()
                    .map_err(|err| LogError::nats("verify", err))?
                    .stream_sequence;
                if seq != expected_seq {
                    report.problems.push(Problem {
                        location: location(seq),
                        sequence: Some(seq),
                        what: format!("sequences {expected_seq}..{} are missing", seq - 1),
                    });
                }
                expected_seq = seq + 1;
                report.records += 1;
                match StoredEvent::from_raw(seq, message.payload.clone()) {
                    Ok(event) => {
                        let aggregate = message
                            .subject
                            .as_str()
                            .strip_prefix(&format!("{}.", self.options.subject_prefix))
                            .unwrap_or_default();
                        if aggregate != event.envelope.subject {
                            report.problems.push(Problem {
                                location: location(seq),
                                sequence: Some(seq),
                                what: format!(
                                    "stored on subject {} but the envelope says {}",
                                    message.subject, event.envelope.subject
                                ),
                            });
                        }
                        let msg_id = message
                            .headers
                            .as_ref()
                            .and_then(|h| h.get(MSG_ID))
                            .map(|v| v.as_str());
                        if msg_id != Some(event.envelope.id.as_str()) {
                            report.problems.push(Problem {
                                location: location(seq),
                                sequence: Some(seq),
                                what: format!(
                                    "Nats-Msg-Id {msg_id:?} differs from the event id {}",
                                    event.envelope.id
                                ),
                            });
                        }
                        if let Some(what) = chains.check(&event) {
                            report.problems.push(Problem {
                                location: location(seq),
                                sequence: Some(seq),
                                what,
                            });
                        }
                        note_undecodable(&mut report, &event);
                    }
                    Err(err) => report.problems.push(Problem {
                        location: location(seq),
                        sequence: Some(seq),
                        what: format!("payload does not decode as an Envelope: {err}"),
                    }),
                }
                if seq >= last {
                    break;
                }
            }
        }
        report.subjects = chains.len();
        report.last_sequence = last;
        Ok(report)
    }
}

impl NatsLog {
    /// How many publish attempts were retried after a timeout or a lost connection.
    pub fn retried_publishes(&self) -> u64 {
        self.retried.load(Ordering::Relaxed)
    }

    /// The underlying client, for callers that share the connection.
    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }
}

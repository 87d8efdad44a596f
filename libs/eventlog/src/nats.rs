//! The NATS JetStream backend.
//!
//! One file-storage stream (deny delete, deny purge) holds the log; an aggregate
//! `node.worker-1` is the stream subject `<prefix>.node.worker-1`. Appends carry
//! `Nats-Msg-Id` (the event id) for de-duplication and
//! `Nats-Expected-Last-Subject-Sequence` (on each subject's first event of a
//! batch) for optimistic concurrency; a batch of several events, on one
//! subject or several, is one JetStream atomic batch, stored whole or not at
//! all (`append_each` sends its events as single publishes instead,
//! pipelined, each checked against its subject's head). The subjects' heads
//! an append chains to come from this process's own appends and from what
//! its followers read, so a service appending after the facts it follows
//! needs no extra round trip; a stale head is refused by the server and read
//! again. Reads use ordered consumers. After a timeout or a lost connection an append
//! is retried with the same ids until its deadline; the server's de-duplication
//! (or, on a standalone server, a look at the subject's last message) makes sure
//! a retried event is stored once.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
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

use crate::record::{EncodedEvent, batch_label, batch_subjects, expectation_of, validate_batch};
use crate::{
    AppendAck, EventLog, Expected, LogError, MAX_RECORD_BYTES, NewEvent, Problem, ReadRequest,
    StoredEvent, Subject, SubjectChains, TraceContext, VerifyReport, note_undecodable,
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
/// batch, too many batches in flight; or a message of the same id is being
/// stored right now (10158, "duplicate message id is in process": on a
/// cluster, a retry after a leader change meets the old leader's proposal of
/// it still in flight), and trying again is answered as its duplicate once it
/// is stored, or stores it if it was not.
const RETRYABLE: [u64; 3] = [10158, 10176, 10210];
/// The stream does not exist.
const STREAM_NOT_FOUND: u64 = 10059;
/// JetStream cannot answer now: "system temporarily unavailable", "cluster
/// can not handle request" — a cluster between meta or stream leaders.
const CLUSTER_UNAVAILABLE: [u64; 2] = [10008, 10009];

/// Whether `error` says the cluster is between leaders (trying again helps).
fn between_leaders(error: &jetstream::Error) -> bool {
    CLUSTER_UNAVAILABLE.contains(&error.error_code().0)
}

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
    /// Create the stream if it does not exist: only `switchyard log init`
    /// (and test harnesses) do; a service that found its log gone must not
    /// start over on an empty one.
    pub create: bool,
    /// How many servers hold a copy of the stream: what it is created with,
    /// and the least an opened stream must have.
    pub replicas: usize,
    /// Refuse to open a stream not configured as the log must be (every
    /// writer and reader); off only for `verify`, which reports it.
    pub check_config: bool,
    /// The key this writer signs its records with, if it signs.
    pub signer: Option<crate::SigningKey>,
}

impl Default for NatsOptions {
    fn default() -> Self {
        NatsOptions {
            stream: "SWITCHYARD_LOG".into(),
            subject_prefix: "switchyard.log".into(),
            ack_timeout: Duration::from_secs(5),
            retry_for: Duration::from_secs(60),
            create: true,
            replicas: 1,
            check_config: true,
            signer: None,
        }
    }
}

/// The log on a JetStream stream.
pub struct NatsLog {
    client: async_nats::Client,
    js: jetstream::Context,
    stream: Stream,
    options: NatsOptions,
    /// Last sequence and hash of each subject this process has seen, appended
    /// or followed; a stale entry is caught by the server's expected-sequence
    /// check and reloaded.
    heads: Heads,
    /// Appends retried after a timeout or a lost connection, for metrics and tests.
    retried: AtomicU64,
    /// Subject heads an append had to read from the server (its cache did not
    /// know them, or knew them wrong), for metrics and tests.
    head_reads: AtomicU64,
}

/// A batch on its way: its events encoded, each with its subject's index.
struct Outgoing<'a> {
    /// The stream subject of each of the batch's subjects.
    stream_subjects: Vec<String>,
    /// Index into `stream_subjects` of each event's subject.
    of_event: Vec<usize>,
    ids: Vec<&'a str>,
    traces: Vec<Option<&'a TraceContext>>,
    encoded: &'a [EncodedEvent],
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Head {
    seq: u64,
    hash: Option<[u8; 32]>,
}

const EMPTY: Head = Head { seq: 0, hash: None };

type Heads = Arc<Mutex<BTreeMap<String, Head>>>;

/// Notes `head` as `subject`'s, unless a later one is known already.
fn remember_in(heads: &Heads, subject: &str, head: Head) {
    let mut heads = heads.lock().expect("heads lock");
    match heads.get_mut(subject) {
        Some(known) if known.seq > head.seq => {}
        Some(known) => *known = head,
        None => {
            heads.insert(subject.to_string(), head);
        }
    }
}

impl NatsLog {
    /// Connects to `url` (several servers of a cluster: comma-separated) and
    /// opens (or, with `options.create`, creates) the stream.
    /// The first connection attempt fails fast; once connected, the client
    /// reconnects on its own. Services that must wait for the server pass their
    /// own client to [`NatsLog::open`].
    pub async fn connect(url: &str, options: NatsOptions) -> Result<Self, LogError> {
        let client = async_nats::ConnectOptions::new()
            .name("switchyard-eventlog")
            .connect(url.split(',').map(str::trim).collect::<Vec<_>>())
            .await
            .map_err(|err| LogError::nats(format!("connect to {url}"), err))?;
        Self::open(client, options).await
    }

    pub async fn open(client: async_nats::Client, options: NatsOptions) -> Result<Self, LogError> {
        let js = jetstream::ContextBuilder::new()
            .timeout(options.ack_timeout)
            .build(client.clone());
        let stream = open_stream(&js, &options).await?;
        let altered = config_problems(&stream.cached_info().config, &options);
        if options.check_config && !altered.is_empty() {
            return Err(LogError::nats(
                format!("open stream {}", options.stream),
                format!(
                    "the stream is not configured as Switchyard's log must be: {}",
                    altered.join("; ")
                ),
            ));
        }
        Ok(NatsLog {
            client,
            js,
            stream,
            options,
            heads: Arc::new(Mutex::new(BTreeMap::new())),
            retried: AtomicU64::new(0),
            head_reads: AtomicU64::new(0),
        })
    }

    /// `event` encoded for `subject`, to be signed with this writer's key.
    fn encode(&self, subject: &Subject, event: &NewEvent) -> Result<EncodedEvent, LogError> {
        let mut encoded = event.encode(subject)?;
        encoded.signer = self.options.signer.clone();
        Ok(encoded)
    }

    /// The stream subjects' prefix, with its dot.
    fn prefix(&self) -> String {
        format!("{}.", self.options.subject_prefix)
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
        remember_in(&self.heads, subject.as_str(), head);
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

    /// If this batch is stored already (an earlier attempt whose ack was
    /// lost), its acknowledgement. `latest` holds each subject's head and its
    /// event id, from the server: a subject whose last message is its last
    /// event of the batch places the batch, which an atomic batch stores
    /// contiguously; every other position must then hold the batch's event.
    async fn stored_as_batch(
        &self,
        batch: &Outgoing<'_>,
        latest: &[(Head, Option<String>)],
    ) -> Result<Option<AppendAck>, LogError> {
        let count = batch.ids.len();
        for (j, (head, head_id)) in latest.iter().enumerate() {
            let Some(k) = batch.of_event.iter().rposition(|&s| s == j) else {
                continue;
            };
            if head_id.as_deref() != Some(batch.ids[k]) {
                continue;
            }
            let Some(first) = head.seq.checked_sub(k as u64).filter(|first| *first >= 1) else {
                continue;
            };
            let mut whole = true;
            for (i, id) in batch.ids.iter().enumerate() {
                let seq = first + i as u64;
                if i == k {
                    continue;
                }
                let message = match self.stream.get_raw_message(seq).await {
                    Ok(message) => message,
                    Err(err) if err.kind() == RawMessageErrorKind::NoMessageFound => {
                        whole = false;
                        break;
                    }
                    Err(err) => {
                        return Err(LogError::nats(format!("read stream sequence {seq}"), err));
                    }
                };
                let stored_id = message.headers.get(MSG_ID).map(|v| v.as_str());
                if message.subject.as_str() != batch.stream_subjects[batch.of_event[i]]
                    || stored_id != Some(*id)
                {
                    whole = false;
                    break;
                }
            }
            if whole {
                return Ok(Some(AppendAck {
                    sequences: (first..first + count as u64).collect(),
                    duplicates: count,
                }));
            }
        }
        Ok(None)
    }

    /// Whether `batch` is stored as a whole after `since` (the heads the
    /// first attempt chained on), whatever was appended after it: a retry
    /// whose first attempt was stored though its ack was lost, found when the
    /// batch is no longer its subjects' latest events (another writer on
    /// the same subject got in between). The batch is stored contiguously;
    /// its first event is the first on its subject after that subject's head
    /// in `since`.
    async fn stored_since(
        &self,
        batch: &Outgoing<'_>,
        since: &[Head],
    ) -> Result<Option<AppendAck>, LogError> {
        let count = batch.ids.len();
        let Some(&j) = batch.of_event.first() else {
            return Ok(None);
        };
        let subject = &batch.stream_subjects[j];
        let after = since.get(j).map_or(0, |h| h.seq) + 1;
        let found = self
            .stream
            .raw_message_builder()
            .sequence(after)
            .next_by_subject(subject.clone())
            .send()
            .await;
        let message = match found {
            Ok(message) => message,
            Err(err) if err.kind() == RawMessageErrorKind::NoMessageFound => return Ok(None),
            Err(err) => {
                return Err(LogError::nats(
                    format!("read {subject} from sequence {after}"),
                    err,
                ));
            }
        };
        if message.headers.get(MSG_ID).map(|v| v.as_str()) != Some(batch.ids[0]) {
            return Ok(None);
        }
        let first = message.sequence;
        for (i, id) in batch.ids.iter().enumerate().skip(1) {
            let seq = first + i as u64;
            let message = match self.stream.get_raw_message(seq).await {
                Ok(message) => message,
                Err(err) if err.kind() == RawMessageErrorKind::NoMessageFound => return Ok(None),
                Err(err) => {
                    return Err(LogError::nats(format!("read stream sequence {seq}"), err));
                }
            };
            if message.subject.as_str() != batch.stream_subjects[batch.of_event[i]]
                || message.headers.get(MSG_ID).map(|v| v.as_str()) != Some(*id)
            {
                return Ok(None);
            }
        }
        Ok(Some(AppendAck {
            sequences: (first..first + count as u64).collect(),
            duplicates: count,
        }))
    }

    /// The subjects' heads and last event ids from the server, read together.
    async fn load_heads_until(
        &self,
        subjects: impl IntoIterator<Item = &Subject>,
        deadline: Instant,
    ) -> Result<Vec<(Head, Option<String>)>, LogError> {
        futures::future::try_join_all(
            subjects
                .into_iter()
                .map(|subject| self.load_head_until(subject, deadline)),
        )
        .await
    }

    /// [`Self::load_head`], retried through timeouts and reconnects until
    /// `deadline` — an append in progress must not give up on a read.
    async fn load_head_until(
        &self,
        subject: &Subject,
        deadline: Instant,
    ) -> Result<(Head, Option<String>), LogError> {
        let mut backoff = Duration::from_millis(50);
        self.head_reads.fetch_add(1, Ordering::Relaxed);
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

    /// Publishes the batch, each subject's events chained to its head in
    /// `heads`; returns the events' sequences, whether the server had them
    /// already, and each subject's new head.
    async fn publish(
        &self,
        batch: &Outgoing<'_>,
        heads: &[Head],
        attempt: u32,
    ) -> Result<(Vec<u64>, bool, Vec<Head>), PublishError> {
        let events = &batch.encoded;
        let mut prev: Vec<Option<[u8; 32]>> = heads.iter().map(|h| h.hash).collect();
        let mut expectation_sent = vec![false; heads.len()];
        let batch_id = (events.len() > 1).then(|| {
            let key = format!("{}/{}/{attempt}", events[0].id, events.len());
            blake3::hash(key.as_bytes()).to_hex()[..32].to_string()
        });
        let last = events.len() - 1;
        let mut ack = None;
        for (i, event) in events.iter().enumerate() {
            let j = batch.of_event[i];
            let body = event.finish(prev[j].as_ref());
            prev[j] = Some(*blake3::hash(&body).as_bytes());
            // The check goes on each subject's first event only: the server
            // checks it against the stream before the batch.
            let check = (!expectation_sent[j]).then_some(heads[j].seq);
            expectation_sent[j] = true;
            let mut headers = event_headers(&event.id, check, batch.traces[i]);
            if let Some(batch_id) = &batch_id {
                headers.insert(BATCH_ID, batch_id.as_str());
                headers.insert(BATCH_SEQUENCE, (i + 1).to_string().as_str());
                if i == last {
                    headers.insert(BATCH_COMMIT, "1");
                }
            }
            let stream_subject = batch.stream_subjects[j].clone();
            if i < last {
                // Non-commit messages of an atomic batch get no acknowledgement.
                self.client
                    .publish_with_headers(stream_subject, headers, body)
                    .await
                    .map_err(|err| PublishError::with_source(PublishErrorKind::BrokenPipe, err))?;
            } else {
                ack = Some(
                    self.js
                        .publish_with_headers(stream_subject, headers, body)
                        .await?
                        .await?,
                );
            }
        }
        let ack = ack.expect("a batch has a last event");
        let first = ack.sequence + 1 - events.len() as u64;
        let mut new_heads: Vec<Head> = heads
            .iter()
            .zip(prev)
            .map(|(head, hash)| Head {
                seq: head.seq,
                hash,
            })
            .collect();
        for (i, &j) in batch.of_event.iter().enumerate() {
            new_heads[j].seq = first + i as u64;
        }
        Ok(((first..=ack.sequence).collect(), ack.duplicate, new_heads))
    }

    /// [`EventLog::append_each`]: rounds of pipelined single publishes —
    /// each round sends the next event of every subject, each checked
    /// against its subject's head, then awaits their acks. A single publish
    /// costs the server a fraction of an atomic batch, which it stages in a
    /// store of its own (on a one-replica file stream, a new file store per
    /// batch: about 5 ms whatever its size). An event refused on a moved
    /// head, or whose answer was lost, goes again in the next round on the
    /// head read from the server — unless that head is the event itself.
    async fn publish_each(&self, events: &[(Subject, NewEvent)]) -> Result<AppendAck, LogError> {
        let encoded = events
            .iter()
            .map(|(subject, event)| self.encode(subject, event))
            .collect::<Result<Vec<_>, _>>()?;
        // Each subject's events still to store, in order.
        let mut queues: BTreeMap<&Subject, std::collections::VecDeque<usize>> = BTreeMap::new();
        for (i, (subject, _)) in events.iter().enumerate() {
            queues.entry(subject).or_default().push_back(i);
        }
        // The head each subject's next event chains to; `None` where the
        // server must be asked.
        let mut heads: BTreeMap<&Subject, Option<Head>> = queues
            .keys()
            .map(|&subject| (subject, self.cached_head(subject)))
            .collect();
        let mut sequences = vec![0u64; events.len()];
        let mut duplicates = 0;
        let deadline = Instant::now() + self.options.retry_for;
        let mut round = 0u32;
        loop {
            let unknown: Vec<&Subject> = queues
                .keys()
                .copied()
                .filter(|subject| heads[subject].is_none())
                .collect();
            let loaded = self
                .load_heads_until(unknown.iter().copied(), deadline)
                .await?;
            for (subject, (head, last_id)) in unknown.into_iter().zip(loaded) {
                let queue = queues.get_mut(subject).expect("a subject with events");
                // Stored by an earlier round whose answer was lost.
                if let Some(&i) = queue.front()
                    && last_id.as_deref() == Some(encoded[i].id.as_str())
                {
                    sequences[i] = head.seq;
                    duplicates += 1;
                    queue.pop_front();
                }
                heads.insert(subject, Some(head));
            }
            queues.retain(|_, queue| !queue.is_empty());
            if queues.is_empty() {
                return Ok(AppendAck {
                    sequences,
                    duplicates,
                });
            }
            if round > 0 && Instant::now() >= deadline {
                return Err(LogError::nats(
                    format!(
                        "append to {} (gave up after {:?})",
                        batch_label(events),
                        self.options.retry_for
                    ),
                    "still conflicting or unreachable",
                ));
            }
            round += 1;
            // Send every subject's next event, in the order given (so a
            // round of distinct subjects is stored as given), then await
            // the answers.
            let mut next: Vec<(usize, &Subject)> = queues
                .iter()
                .map(|(&subject, queue)| (queue[0], subject))
                .collect();
            next.sort_unstable();
            let mut sent = Vec::with_capacity(next.len());
            for (i, subject) in next {
                let head = heads[subject].expect("read above");
                let body = encoded[i].finish(head.hash.as_ref());
                let hash = *blake3::hash(&body).as_bytes();
                let headers =
                    event_headers(&encoded[i].id, Some(head.seq), events[i].1.trace.as_ref());
                let ack = self
                    .js
                    .publish_with_headers(self.stream_subject(subject), headers, body)
                    .await;
                sent.push((subject, i, hash, ack));
            }
            let answers = futures::future::join_all(sent.into_iter().map(
                |(subject, i, hash, ack)| async move {
                    let answer = match ack {
                        Ok(ack) => ack.await,
                        Err(err) => Err(err),
                    };
                    (subject, i, hash, answer)
                },
            ))
            .await;
            for (subject, i, hash, answer) in answers {
                let err = match answer {
                    Ok(ack) => {
                        sequences[i] = ack.sequence;
                        if ack.duplicate {
                            // Stored before, maybe chained elsewhere: the
                            // subject's next event reads its head.
                            duplicates += 1;
                            heads.insert(subject, None);
                        } else {
                            let head = Head {
                                seq: ack.sequence,
                                hash: Some(hash),
                            };
                            self.remember(subject, head);
                            heads.insert(subject, Some(head));
                        }
                        queues.get_mut(subject).expect("sent").pop_front();
                        continue;
                    }
                    Err(err) => err,
                };
                match self.refusal_of(&err).await {
                    Refusal::TooLarge => {
                        return Err(LogError::Oversize {
                            id: encoded[i].id.clone(),
                            size: encoded[i].encoded_len(),
                            limit: MAX_RECORD_BYTES,
                        });
                    }
                    Refusal::DuplicateInBatch | Refusal::Fatal => {
                        return Err(LogError::nats(
                            format!("append {} to {subject}", encoded[i].id),
                            err,
                        ));
                    }
                    Refusal::MovedHead => {
                        tracing::debug!(%subject, round, "append refused on a moved head; reading the head");
                    }
                    Refusal::Retry => {
                        // It may or may not be stored; the head read tells.
                        tracing::debug!(%subject, round, error = %err, "append retried");
                        self.retried.fetch_add(1, Ordering::Relaxed);
                    }
                }
                heads.insert(subject, None);
            }
        }
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
        ordered_consumer(&self.stream, self.filter_subject(subject), from).await
    }

    /// The stream subjects of `subject`, or of the whole log.
    fn filter_subject(&self, subject: Option<&Subject>) -> String {
        match subject {
            Some(subject) => self.stream_subject(subject),
            None => format!("{}.>", self.options.subject_prefix),
        }
    }
}

/// The stream Switchyard's log is: file storage, nothing ever deleted
/// (deny delete and purge, no limits, no rollups, no message TTLs), atomic
/// batches, direct reads, a two-minute duplicate window.
fn expected_config(options: &NatsOptions) -> Config {
    Config {
        name: options.stream.clone(),
        description: Some(
            "Switchyard's migration log (append-only; owned by Switchyard)".to_string(),
        ),
        subjects: vec![format!("{}.>", options.subject_prefix)],
        storage: StorageType::File,
        num_replicas: options.replicas,
        deny_delete: true,
        deny_purge: true,
        allow_atomic_publish: true,
        allow_direct: true,
        duplicate_window: Duration::from_secs(120),
        max_message_size: (MAX_RECORD_BYTES + 4096) as i32,
        ..Default::default()
    }
}

/// Where `config` differs from what the log needs: each setting that could
/// lose or rewrite records, named with what it must be.
pub(crate) fn config_problems(config: &Config, options: &NatsOptions) -> Vec<String> {
    use async_nats::jetstream::stream::{PersistenceMode, RetentionPolicy};
    let mut problems = Vec::new();
    let mut expect = |ok: bool, what: String| {
        if !ok {
            problems.push(what);
        }
    };
    expect(
        config.deny_delete,
        "deny_delete is off; it must be on (it cannot be turned on later: the stream must be made again)".into(),
    );
    expect(
        config.deny_purge,
        "deny_purge is off; it must be on (it cannot be turned on later: the stream must be made again)".into(),
    );
    expect(
        config.max_messages <= 0,
        format!(
            "max_msgs is {}; the log must have no message limit (-1)",
            config.max_messages
        ),
    );
    expect(
        config.max_bytes <= 0,
        format!(
            "max_bytes is {}; the log must have no size limit (-1)",
            config.max_bytes
        ),
    );
    expect(
        config.max_messages_per_subject <= 0,
        format!(
            "max_msgs_per_subject is {}; the log must have no per-subject limit (-1)",
            config.max_messages_per_subject
        ),
    );
    expect(
        config.max_age.is_zero(),
        format!(
            "max_age is {:?}; the log must keep records for ever (0)",
            config.max_age
        ),
    );
    expect(
        config.retention == RetentionPolicy::Limits,
        format!("retention is {:?}; it must be limits", config.retention),
    );
    expect(
        config.storage == StorageType::File,
        format!("storage is {:?}; it must be file", config.storage),
    );
    expect(
        !config.allow_rollup,
        "allow_rollup_hdrs is on; a rollup would purge a subject's records".into(),
    );
    expect(
        !config.allow_message_ttl,
        "allow_msg_ttl is on; records could expire".into(),
    );
    expect(
        config.persist_mode != Some(PersistenceMode::Async),
        "persist_mode is async; records could be acknowledged before they are stored".into(),
    );
    expect(
        !config.sealed,
        "the stream is sealed; nothing can be appended".into(),
    );
    expect(
        config.num_replicas >= options.replicas,
        format!(
            "it has {} replica(s); at least {} expected",
            config.num_replicas, options.replicas
        ),
    );
    let subjects = format!("{}.>", options.subject_prefix);
    expect(
        config.subjects == [subjects.clone()],
        format!(
            "its subjects are {:?}; they must be [{subjects:?}]",
            config.subjects
        ),
    );
    expect(
        config.allow_atomic_publish,
        "allow_atomic is off; batches could be half-stored".into(),
    );
    problems
}

/// An ordered consumer of `filter_subject`'s messages from `from` on.
///
/// A request that timed out or found no responder is made again for a
/// while: a server that has just restarted answers once JetStream has
/// recovered its streams, which can take longer than one request waits.
async fn ordered_consumer(
    stream: &Stream,
    filter_subject: String,
    from: u64,
) -> Result<jetstream::consumer::pull::Ordered, LogError> {
    use async_nats::jetstream::stream::ConsumerErrorKind;
    use backon::Retryable;
    let create = || {
        stream.create_consumer(OrderedConfig {
            filter_subject: filter_subject.clone(),
            deliver_policy: DeliverPolicy::ByStartSequence {
                start_sequence: from.max(1),
            },
            ..Default::default()
        })
    };
    let consumer = create
        .retry(patient_backoff(CONSUMER_PATIENCE))
        .when(|err| match err.kind() {
            ConsumerErrorKind::TimedOut | ConsumerErrorKind::Request => true,
            ConsumerErrorKind::JetStream(js) => between_leaders(&js),
            _ => false,
        })
        .await
        .map_err(|err| LogError::nats("create ordered consumer", err))?;
    consumer
        .messages()
        .await
        .map_err(|err| LogError::nats("consume", err))
}

/// Why the stream could not be opened (or created), and whether trying
/// again can change it.
struct OpenFailure {
    error: LogError,
    /// No answer in time, no server taking the request, JetStream not
    /// available yet: a server restarting, or a cluster between leaders.
    transient: bool,
}

/// The log's stream, opened (or with `options.create`, created if it does
/// not exist). A failure a server coming back or a cluster electing a leader
/// explains is tried again, paced, for up to `options.retry_for`: a command
/// typed meanwhile waits rather than fails. A stream that does not exist is
/// refused at once.
async fn open_stream(js: &jetstream::Context, options: &NatsOptions) -> Result<Stream, LogError> {
    use backon::Retryable;
    use jetstream::context::{CreateStreamErrorKind, GetStreamErrorKind};
    let attempt = || async {
        if options.create {
            js.get_or_create_stream(expected_config(options))
                .await
                .map_err(|err| OpenFailure {
                    transient: match err.kind() {
                        CreateStreamErrorKind::TimedOut
                        | CreateStreamErrorKind::JetStreamUnavailable => true,
                        CreateStreamErrorKind::JetStream(js) => between_leaders(&js),
                        _ => false,
                    },
                    error: LogError::nats(format!("create stream {}", options.stream), err),
                })
        } else {
            js.get_stream(&options.stream).await.map_err(|err| {
                let missing = matches!(err.kind(), GetStreamErrorKind::JetStream(js)
                    if js.error_code().0 == STREAM_NOT_FOUND);
                let hint = if missing {
                    "; Switchyard never creates its log by itself (a log that was deleted must not be replaced by an empty one): create it once with `switchyard log init`"
                } else {
                    ""
                };
                OpenFailure {
                    transient: match err.kind() {
                        GetStreamErrorKind::Request => true,
                        GetStreamErrorKind::JetStream(js) => between_leaders(&js),
                        _ => false,
                    },
                    error: LogError::nats(
                        format!("open stream {}", options.stream),
                        format!("{err}{hint}"),
                    ),
                }
            })
        }
    };
    attempt
        .retry(patient_backoff(options.retry_for))
        .when(|failure| failure.transient)
        .notify(|failure, pause| {
            tracing::warn!(error = %failure.error, ?pause, "the log's stream did not answer; trying again")
        })
        .await
        .map_err(|failure| failure.error)
}

/// How long a consumer's creation is tried again after a timeout or while
/// the cluster is between leaders: as long as an append is by default
/// ([`NatsOptions::retry_for`]).
const CONSUMER_PATIENCE: Duration = Duration::from_secs(60);

/// The pauses between attempts of a request the cluster may answer soon
/// (a server back, a leader elected): from 200 ms, doubling, up to 2 s,
/// for `total` in all.
fn patient_backoff(total: Duration) -> backon::ExponentialBuilder {
    backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(200))
        .with_max_delay(Duration::from_secs(2))
        .with_jitter()
        .without_max_times()
        .with_total_delay(Some(total))
}

/// The pauses between attempts to follow again after the consumer failed:
/// from 100 ms, doubling, up to 2 s, for as long as it takes.
fn refollow_backoff() -> backon::ExponentialBackoff {
    use backon::BackoffBuilder;
    backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(100))
        .with_max_delay(Duration::from_secs(2))
        .with_jitter()
        .without_max_times()
        .build()
}

/// How often a follower asks its client which server it is connected to.
const SERVER_CHECK: Duration = Duration::from_millis(100);

/// A follower that outlives its consumer. An ordered consumer lives in the
/// server's memory: a server restart (or a lost connection the client gives
/// up on) ends it with `consumer not found`. The follower then makes a new
/// one from the record after the last it passed on, so nothing is lost and
/// nothing is passed on twice.
///
/// A restarted server is seen at once: the client reconnects to a server of
/// another id, and the follower makes its consumer again there. (Left to
/// itself the consumer finds out only after its missed heartbeats and its
/// retries, 15 s and more, while the service decides on a stale view.)
struct Following {
    stream: Stream,
    client: async_nats::Client,
    /// The id of the server the consumer was made on.
    server: String,
    check: tokio::time::Interval,
    filter: String,
    messages: Option<jetstream::consumer::pull::Ordered>,
    /// The sequence of the next record to pass on.
    next: u64,
    backoff: backon::ExponentialBackoff,
    heads: Heads,
    prefix: String,
}

impl Following {
    async fn next_event(&mut self) -> StoredEvent {
        loop {
            let failure = match &mut self.messages {
                None => {
                    let server = self.client.server_info().server_id;
                    match ordered_consumer(&self.stream, self.filter.clone(), self.next).await {
                        Ok(messages) => {
                            tracing::info!(from = self.next, "following the log again");
                            self.messages = Some(messages);
                            self.server = server;
                            continue;
                        }
                        Err(err) => err.to_string(),
                    }
                }
                Some(messages) => {
                    let next = match next_or_restarted(
                        messages,
                        &mut self.check,
                        &self.client,
                        &self.server,
                    )
                    .await
                    {
                        Ok(next) => next,
                        Err(now) => {
                            tracing::info!(
                                from = self.next,
                                server = now,
                                was = self.server,
                                "the server was restarted: following again at once"
                            );
                            self.messages = None;
                            continue;
                        }
                    };
                    match next {
                        Some(Ok(message)) => match to_stored(&message, &self.prefix) {
                            // Sequence numbers are the stream's: one below `next`
                            // was passed on before the consumer was made again.
                            Ok(stored) if stored.sequence < self.next => continue,
                            Ok(stored) => {
                                self.next = stored.sequence + 1;
                                self.backoff = refollow_backoff();
                                if let Some(subject) =
                                    message.subject.as_str().strip_prefix(&self.prefix)
                                {
                                    let head = Head {
                                        seq: stored.sequence,
                                        hash: Some(stored.hash()),
                                    };
                                    remember_in(&self.heads, subject, head);
                                }
                                return stored;
                            }
                            Err(err) => err.to_string(),
                        },
                        Some(Err(err)) => format!("follow: {err}"),
                        None => "the consumer's messages ended".to_string(),
                    }
                }
            };
            self.messages = None;
            let pause = self.backoff.next().unwrap_or(Duration::from_secs(2));
            tracing::warn!(error = %failure, from = self.next, ?pause, "following the log failed; following again");
            // A retry pace while the server is away, not a wait for an event.
            tokio::time::sleep(pause).await;
        }
    }
}

/// The consumer's next message, or `Err` with the id of the server the
/// client is connected to now if that is no longer `server`'s.
async fn next_or_restarted(
    messages: &mut jetstream::consumer::pull::Ordered,
    check: &mut tokio::time::Interval,
    client: &async_nats::Client,
    server: &str,
) -> Result<Option<Result<jetstream::Message, jetstream::consumer::pull::OrderedError>>, String> {
    loop {
        tokio::select! {
            biased;
            next = messages.next() => return Ok(next),
            _ = check.tick() => {
                if client.connection_state() == async_nats::connection::State::Connected {
                    let now = client.server_info().server_id;
                    if now != server {
                        return Err(now);
                    }
                }
            }
        }
    }
}

/// An event's headers: its id (de-duplication), the subject's expected last
/// sequence if `check`, and its trace context.
fn event_headers(id: &str, check: Option<u64>, trace: Option<&TraceContext>) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(MSG_ID, id);
    if let Some(seq) = check {
        headers.insert(EXPECTED_LAST_SUBJECT_SEQUENCE, seq.to_string().as_str());
    }
    crate::trace::insert_headers(&mut headers, trace);
    headers
}

/// What a refused or unanswered publish means for the append.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Refusal {
    /// A message is over the stream's limit.
    TooLarge,
    /// A subject's last sequence is not the expected one.
    MovedHead,
    /// An id of the atomic batch is stored already.
    DuplicateInBatch,
    /// Nothing a retry can change.
    Fatal,
    /// Timeout, lost connection, abandoned or throttled batch: it may or may
    /// not be stored, and trying again with the same ids can succeed.
    Retry,
}

/// What a refused publish means; `None` where no server answered for the
/// stream's subjects: the stream is gone, or (on a cluster) between leaders,
/// which only the stream's info tells.
fn refusal(err: &PublishError) -> Option<Refusal> {
    let code = error_code(err);
    Some(
        if err.kind() == PublishErrorKind::MaxPayloadExceeded || code == Some(MESSAGE_TOO_LARGE) {
            Refusal::TooLarge
        } else if err.kind() == PublishErrorKind::WrongLastSequence
            || code.is_some_and(|c| WRONG_LAST_SEQUENCE.contains(&c))
        {
            Refusal::MovedHead
        } else if code == Some(DUPLICATE_IN_BATCH) {
            Refusal::DuplicateInBatch
        } else if err.kind() == PublishErrorKind::StreamNotFound {
            return None;
        } else if code.is_some_and(|c| !RETRYABLE.contains(&c) && !CLUSTER_UNAVAILABLE.contains(&c))
        {
            Refusal::Fatal
        } else {
            Refusal::Retry
        },
    )
}

impl NatsLog {
    /// What a refused publish means. One no server answered is asked of the
    /// stream itself: deleted, nothing a retry can change; still there, its
    /// servers are between leaders (a leader killed: no server takes the
    /// subjects until a new one is elected), and a retry finds the new one.
    async fn refusal_of(&self, err: &PublishError) -> Refusal {
        match refusal(err) {
            Some(refused) => refused,
            None => match self.js.get_stream(&self.options.stream).await {
                Err(err)
                    if matches!(err.kind(), jetstream::context::GetStreamErrorKind::JetStream(js)
                        if js.error_code().0 == STREAM_NOT_FOUND) =>
                {
                    Refusal::Fatal
                }
                _ => Refusal::Retry,
            },
        }
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

/// The record a message holds; `prefix` is the stream subjects' prefix with
/// its dot. Bytes that are no envelope (some other client published them on
/// the log's subjects) give a record readers pass over.
fn to_stored(message: &jetstream::Message, prefix: &str) -> Result<StoredEvent, LogError> {
    let seq = message
        .info()
        .map_err(|err| LogError::nats("read message metadata", err))?
        .stream_sequence;
    let subject = message.subject.as_str();
    Ok(StoredEvent::from_stored(
        seq,
        subject.strip_prefix(prefix).unwrap_or(subject),
        message.payload.clone(),
    ))
}

/// An `append_batch` under way: the batch and what it checks.
struct Append<'a> {
    subjects: &'a [Subject],
    label: &'a str,
    batch: &'a Outgoing<'a>,
    /// The head sequence each subject must have, where one is expected.
    required: &'a [Option<u64>],
    deadline: Instant,
}

impl Append<'_> {
    /// The conflict on subject `j`, whose head is at `actual`.
    fn conflict(&self, j: usize, actual: u64) -> LogError {
        LogError::Conflict {
            subject: self.subjects[j].to_string(),
            expected: self.required[j].unwrap_or(actual),
            actual: actual.to_string(),
        }
    }
}

/// What a refused or unanswered publish leads to.
enum Next {
    /// The batch is stored after all.
    Stored(AppendAck),
    /// Try again on these heads (`None`: ask the server).
    Retry(Vec<Option<(Head, bool)>>),
}

impl NatsLog {
    /// The error of an append to `label` that ran out of time.
    fn gave_up(&self, label: &str, err: &dyn std::fmt::Display) -> LogError {
        LogError::nats(
            format!(
                "append to {label} (gave up after {:?})",
                self.options.retry_for
            ),
            err,
        )
    }

    /// Heads phase: loads from the server each subject's head not known.
    async fn load_missing_heads(
        &self,
        subjects: &[Subject],
        heads: &mut [Option<(Head, bool)>],
        deadline: Instant,
    ) -> Result<(), LogError> {
        let missing: Vec<usize> = (0..subjects.len())
            .filter(|&j| heads[j].is_none())
            .collect();
        let loaded = self
            .load_heads_until(missing.iter().map(|&j| &subjects[j]), deadline)
            .await?;
        for (&j, (head, _)) in missing.iter().zip(loaded) {
            heads[j] = Some((head, false));
        }
        Ok(())
    }

    /// Check phase: a head is not the required one: the batch found stored, or a conflict.
    async fn refused_before_publish(
        &self,
        append: &Append<'_>,
        j: usize,
        first_chained: Option<&[Head]>,
    ) -> Result<AppendAck, LogError> {
        // A retry of a batch that was stored although its ack was lost finds
        // the subjects moved on by exactly that batch.
        let latest = self
            .load_heads_until(append.subjects, append.deadline)
            .await?;
        if let Some(ack) = self.stored_as_batch(append.batch, &latest).await? {
            return Ok(ack);
        }
        if let Some(since) = first_chained
            && let Some(ack) = self.stored_since(append.batch, since).await?
        {
            return Ok(ack);
        }
        Err(append.conflict(j, latest[j].0.seq))
    }

    /// Refusal phase: a refused or unanswered publish: stored after all, a retry, or an error.
    async fn after_refusal(
        &self,
        append: &Append<'_>,
        err: PublishError,
        attempt: u32,
        since: &[Head],
    ) -> Result<Next, LogError> {
        let Append {
            subjects,
            label,
            batch,
            required,
            deadline,
        } = *append;
        let refused = self.refusal_of(&err).await;
        if refused == Refusal::TooLarge {
            let (i, size) = batch
                .encoded
                .iter()
                .map(|e| e.finish(None).len())
                .enumerate()
                .max_by_key(|(_, size)| *size)
                .unwrap_or((0, 0));
            return Err(LogError::Oversize {
                id: batch.ids[i].to_string(),
                size,
                limit: MAX_RECORD_BYTES,
            });
        }
        if refused == Refusal::MovedHead {
            // Another writer got in first on some subject, or an earlier
            // attempt of this very batch was stored before its ack was lost.
            tracing::debug!(batch = %label, attempt, "append refused on a moved head; reading the heads");
            let latest = self.load_heads_until(subjects, deadline).await?;
            if let Some(ack) = self.stored_as_batch(batch, &latest).await? {
                return Ok(Next::Stored(ack));
            }
            // Unchecked subjects: try again on the new heads. Also where the
            // check still holds: on a clustered stream 10164 can mean a write
            // in flight rather than a moved subject.
            if let Some(j) =
                (0..subjects.len()).find(|&j| required[j].is_some_and(|r| r != latest[j].0.seq))
            {
                return Err(append.conflict(j, latest[j].0.seq));
            }
            return Ok(Next::Retry(
                latest.into_iter().map(|(h, _)| Some((h, false))).collect(),
            ));
        }
        if refused == Refusal::DuplicateInBatch {
            // Some id of the batch is stored already. Fine if the whole batch
            // is stored as it is (a retry); anything else is refused whole.
            let latest = self.load_heads_until(subjects, deadline).await?;
            if let Some(ack) = self.stored_as_batch(batch, &latest).await? {
                return Ok(Next::Stored(ack));
            }
            if let Some(ack) = self.stored_since(batch, since).await? {
                return Ok(Next::Stored(ack));
            }
            return Err(LogError::InvalidBatch {
                subject: label.to_string(),
                count: batch.ids.len(),
                expected: "events that are not stored yet; some of these ids are already stored \
                           (a retry is recognised while the batch is still a subject's latest events)"
                    .into(),
            });
        }
        if refused == Refusal::Fatal {
            return Err(LogError::nats(format!("append to {label}"), err));
        }
        // Timeout, lost connection, abandoned or throttled batch: it may or may
        // not be stored. Retry with the same ids, on the server's heads;
        // de-duplication keeps it single.
        if Instant::now() >= deadline {
            return Err(self.gave_up(label, &err));
        }
        tracing::debug!(batch = %label, attempt, error = %err, "append retried");
        self.retried.fetch_add(1, Ordering::Relaxed);
        Ok(Next::Retry(vec![None; subjects.len()]))
    }
}

#[async_trait]
impl EventLog for NatsLog {
    async fn append_batch(
        &self,
        events: Vec<(Subject, NewEvent)>,
        expected: &[(Subject, Expected)],
    ) -> Result<AppendAck, LogError> {
        validate_batch(&events, expected)?;
        let subjects: Vec<Subject> = batch_subjects(&events).into_iter().cloned().collect();
        let label = batch_label(&events);
        let position: BTreeMap<&str, usize> = subjects
            .iter()
            .enumerate()
            .map(|(j, s)| (s.as_str(), j))
            .collect();
        let encoded = events
            .iter()
            .map(|(subject, event)| self.encode(subject, event))
            .collect::<Result<Vec<_>, _>>()?;
        let batch = Outgoing {
            stream_subjects: subjects.iter().map(|s| self.stream_subject(s)).collect(),
            of_event: events.iter().map(|(s, _)| position[s.as_str()]).collect(),
            ids: encoded.iter().map(|e| e.id.as_str()).collect(),
            traces: events.iter().map(|(_, e)| e.trace.as_ref()).collect(),
            encoded: &encoded,
        };
        let required: Vec<Option<u64>> = subjects
            .iter()
            .map(|s| expectation_of(expected, s).required())
            .collect();
        let deadline = Instant::now() + self.options.retry_for;
        let append = Append {
            subjects: &subjects,
            label: &label,
            batch: &batch,
            required: &required,
            deadline,
        };
        let mut attempt = 0u32;
        // The heads the first attempt chained on: a batch stored by an
        // attempt whose ack was lost lies after them.
        let mut first_chained: Option<Vec<Head>> = None;
        // Each subject's head: from the cache (`true`) or the server (`false`),
        // or `None` where the server must be asked.
        let mut heads: Vec<Option<(Head, bool)>> = subjects
            .iter()
            .map(|s| self.cached_head(s).map(|h| (h, true)))
            .collect();
        loop {
            if attempt > 0 && Instant::now() >= deadline {
                return Err(self.gave_up(&label, &"still conflicting or unreachable"));
            }
            self.load_missing_heads(&subjects, &mut heads, deadline)
                .await?;
            let current: Vec<(Head, bool)> = heads.iter().map(|h| h.expect("loaded")).collect();
            let mut refused = None;
            for (j, &(head, from_cache)) in current.iter().enumerate() {
                match required[j] {
                    // The cache may be behind; ask the server before refusing.
                    Some(required) if head.seq != required && from_cache => heads[j] = None,
                    Some(required) if head.seq != required => refused = Some(j),
                    _ => {}
                }
            }
            if heads.iter().any(Option::is_none) {
                continue;
            }
            if let Some(j) = refused {
                return self
                    .refused_before_publish(&append, j, first_chained.as_deref())
                    .await;
            }
            let chained: Vec<Head> = current.iter().map(|(h, _)| *h).collect();
            let since = first_chained.get_or_insert_with(|| chained.clone()).clone();
            let err = match self.publish(&batch, &chained, attempt).await {
                Ok((sequences, duplicate, new_heads)) => {
                    if !duplicate {
                        for (subject, head) in subjects.iter().zip(new_heads) {
                            self.remember(subject, head);
                        }
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
            match self.after_refusal(&append, err, attempt, &since).await? {
                Next::Stored(ack) => return Ok(ack),
                Next::Retry(next) => heads = next,
            }
        }
    }

    async fn append_each(&self, events: Vec<(Subject, NewEvent)>) -> Result<AppendAck, LogError> {
        validate_batch(&events, &[])?;
        self.publish_each(&events).await
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
            let event = to_stored(&message, &self.prefix())?;
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
        let filter = self.filter_subject(subject.as_ref());
        // The first consumer is made here, so a log that cannot be read at
        // all fails the call; later ones are made again by the stream.
        let server = self.client.server_info().server_id;
        let messages = ordered_consumer(&self.stream, filter.clone(), from).await?;
        let mut check = tokio::time::interval(SERVER_CHECK);
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let following = Following {
            stream: self.stream.clone(),
            client: self.client.clone(),
            server,
            check,
            filter,
            messages: Some(messages),
            next: from.max(1),
            backoff: refollow_backoff(),
            // What passes by tells this process each subject's head, so its
            // next append there chains to it without a rejected first attempt.
            heads: self.heads.clone(),
            prefix: self.prefix(),
        };
        Ok(
            futures::stream::unfold(following, |mut following| async move {
                let event = following.next_event().await;
                Some((Ok(event), following))
            })
            .boxed(),
        )
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
        for what in config_problems(&info.config, &self.options) {
            report.problems.push(Problem {
                location: format!("stream {}", self.options.stream),
                sequence: None,
                what,
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

    /// How many subject heads appends had to read from the server: the
    /// subjects this process neither wrote nor followed since they moved.
    pub fn head_reads(&self) -> u64 {
        self.head_reads.load(Ordering::Relaxed)
    }

    /// The underlying client, for callers that share the connection.
    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }
}

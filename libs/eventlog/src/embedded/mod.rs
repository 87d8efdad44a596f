//! The embedded backend: append-only segment files in one directory.
//!
//! One writer thread owns the files. Appends queue up on a channel; the writer
//! takes everything queued (group commit), checks each append's expected
//! sequence, writes all frames with one `write` and one `fdatasync`, and only then
//! acknowledges. An acknowledged append therefore survives `kill -9` and power
//! loss. On open, a torn tail (an unacknowledged, partly written batch) is
//! reported and cut off; damage anywhere else refuses to open, naming the
//! segment and byte offset. A second process on the same directory gets
//! [`LogError::Locked`].

mod scan;
pub(crate) mod segment;
mod writer;

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use async_trait::async_trait;
use futures::stream::BoxStream;
use tokio::sync::{mpsc, oneshot, watch};

use crate::record::validate_batch;
use crate::{
    AppendAck, EventLog, Expected, LogError, NewEvent, ReadRequest, StoredEvent, Subject,
    VerifyReport,
};
use segment::FrameCursor;

pub use scan::{TornTail, verify_dir};

/// When an append counts as durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// `fdatasync` for every append on its own.
    FsyncEachAppend,
    /// One `fdatasync` for all appends queued while the previous one ran.
    GroupCommit,
    /// No fsync: survives a process crash (the page cache keeps the data), not
    /// a power loss. For tests and throw-away runs only.
    NoSync,
}

#[derive(Clone, Debug)]
pub struct EmbeddedOptions {
    pub durability: Durability,
    /// A new segment is started once the current one reaches this size.
    pub segment_bytes: u64,
    /// How many recent event ids are remembered for de-duplication.
    pub dedup_window: usize,
    /// Most appends committed together by one group commit.
    pub max_group: usize,
    /// The key this writer signs its records with, if it signs.
    pub signer: Option<crate::SigningKey>,
}

impl Default for EmbeddedOptions {
    fn default() -> Self {
        EmbeddedOptions {
            durability: Durability::GroupCommit,
            segment_bytes: 64 << 20,
            dedup_window: 100_000,
            max_group: 4096,
            signer: None,
        }
    }
}

/// What opening the log found.
#[derive(Clone, Debug, Default)]
pub struct OpenReport {
    pub segments: usize,
    pub records: u64,
    /// A torn tail that was cut off (or, read-only, ignored).
    pub torn_tail: Option<TornTail>,
}

#[derive(Clone, Debug)]
pub(crate) struct SegmentInfo {
    pub path: PathBuf,
    /// Bytes of the segment that hold committed records.
    pub len: u64,
}

/// A subject's last record: its sequence and the hash the next record links to.
pub(crate) type SubjectHead = (u64, [u8; 32]);

/// Every `INDEX_EVERY`-th record is indexed, so a read seeks close to its start.
pub(crate) const INDEX_EVERY: u64 = 256;

#[derive(Clone, Copy, Debug)]
pub(crate) struct IndexPoint {
    pub seq: u64,
    pub segment: usize,
    pub offset: u64,
}

/// The committed part of the log, as readers see it.
#[derive(Clone, Debug, Default)]
pub(crate) struct Index {
    pub segments: Vec<SegmentInfo>,
    pub sparse: Vec<IndexPoint>,
    pub last_seq: u64,
    pub subject_last: BTreeMap<String, u64>,
}

impl Index {
    fn start_point(&self, from: u64) -> Option<IndexPoint> {
        let idx = self.sparse.partition_point(|p| p.seq <= from);
        idx.checked_sub(1).map(|i| self.sparse[i])
    }
}

pub(crate) struct Shared {
    pub dir: PathBuf,
    pub index: RwLock<Index>,
    /// Ticks with the last committed sequence. The writer thread owns the
    /// sender, so followers end when the writer stops.
    pub committed: watch::Receiver<u64>,
}

pub(crate) struct WriteRequest {
    /// Each event with its subject, in log order.
    pub events: Vec<(Subject, crate::record::EncodedEvent)>,
    /// The checks, at most one per subject of the batch.
    pub expected: Vec<(Subject, Expected)>,
    pub reply: oneshot::Sender<Result<AppendAck, LogError>>,
}

impl WriteRequest {
    /// Upper bound of the bytes this append adds to a segment.
    pub(crate) fn encoded_len(&self) -> usize {
        self.events
            .iter()
            .map(|(_, e)| e.encoded_len() + segment::FRAME_HEADER)
            .sum()
    }
}

/// The embedded event log. Cheap to share behind an `Arc`.
pub struct EmbeddedLog {
    shared: Arc<Shared>,
    tx: Option<mpsc::Sender<WriteRequest>>,
    writer: Option<std::thread::JoinHandle<()>>,
    report: OpenReport,
    _lock: Option<File>,
    signer: Option<crate::SigningKey>,
}

impl EmbeddedLog {
    /// Opens (creating if needed) the log in `dir` for writing. Takes the
    /// directory's lock, recovers a torn tail, and starts the writer thread.
    pub fn open(dir: impl AsRef<Path>, options: EmbeddedOptions) -> Result<Self, LogError> {
        let dir = dir.as_ref().to_path_buf();
        std::fs::create_dir_all(&dir).map_err(LogError::io(format!("create {}", dir.display())))?;
        let lock = lock_dir(&dir)?;
        let recovered = scan::recover(&dir, true, options.dedup_window)?;
        let report = recovered.report.clone();
        let (shared, writer_state) = writer::Writer::start(&dir, recovered, options.clone())?;
        let (tx, rx) = mpsc::channel(options.max_group.max(1) * 4);
        let writer = std::thread::Builder::new()
            .name("eventlog-writer".into())
            .spawn(move || writer_state.run(rx))
            .map_err(LogError::io("start the event log writer thread"))?;
        Ok(EmbeddedLog {
            shared,
            tx: Some(tx),
            writer: Some(writer),
            report,
            _lock: Some(lock),
            signer: options.signer,
        })
    }

    /// Opens the log for reading only: no lock, no recovery writes. A torn tail
    /// is reported and left alone; appends are refused.
    pub fn open_read_only(dir: impl AsRef<Path>) -> Result<Self, LogError> {
        let dir = dir.as_ref().to_path_buf();
        if !dir.is_dir() {
            return Err(LogError::Io {
                context: format!("open event log {}", dir.display()),
                error: std::io::Error::new(std::io::ErrorKind::NotFound, "no such directory"),
            });
        }
        let recovered = scan::recover(&dir, false, 0)?;
        let report = recovered.report.clone();
        // No writer: followers end once they have read the snapshot.
        let (_, committed) = watch::channel(recovered.index.last_seq);
        let shared = Arc::new(Shared {
            dir,
            index: RwLock::new(recovered.index),
            committed,
        });
        Ok(EmbeddedLog {
            shared,
            tx: None,
            writer: None,
            report,
            _lock: None,
            signer: None,
        })
    }

    pub fn open_report(&self) -> &OpenReport {
        &self.report
    }

    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// Stops the writer after the appends already queued, and waits for it.
    pub fn close(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.tx.take();
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

impl Drop for EmbeddedLog {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn lock_dir(dir: &Path) -> Result<File, LogError> {
    let path = dir.join("LOCK");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(LogError::io(format!("open {}", path.display())))?;
    match file.try_lock() {
        Ok(()) => {
            file.set_len(0)
                .map_err(LogError::io(format!("write {}", path.display())))?;
            std::io::Write::write_all(
                &mut &file,
                format!("pid {}\n", std::process::id()).as_bytes(),
            )
            .map_err(LogError::io(format!("write {}", path.display())))?;
            Ok(file)
        }
        Err(std::fs::TryLockError::WouldBlock) => {
            let holder = std::fs::read_to_string(&path).unwrap_or_default();
            Err(LogError::Locked {
                dir: dir.to_path_buf(),
                holder: holder.trim().to_string(),
            })
        }
        Err(std::fs::TryLockError::Error(err)) => {
            Err(LogError::io(format!("lock {}", path.display()))(err))
        }
    }
}

/// What a read needs from the index, taken under its lock and nothing more, so
/// the file reads happen without holding it.
pub(crate) struct ReadPlan {
    segments: Vec<SegmentInfo>,
    start: Option<IndexPoint>,
    last_seq: u64,
}

impl Index {
    pub(crate) fn plan(&self, request: &ReadRequest) -> ReadPlan {
        let from = request.from.max(1);
        let last_seq = match &request.subject {
            Some(subject) => self
                .subject_last
                .get(subject.as_str())
                .copied()
                .unwrap_or(0),
            None => self.last_seq,
        };
        let start = (from <= last_seq).then(|| self.start_point(from)).flatten();
        let segments = match start {
            Some(point) => self.segments[point.segment..].to_vec(),
            None => Vec::new(),
        };
        ReadPlan {
            segments,
            start: start.map(|p| IndexPoint { segment: 0, ..p }),
            last_seq,
        }
    }
}

/// Reads committed records, starting near `from` thanks to the sparse index.
pub(crate) fn read_committed(
    plan: &ReadPlan,
    request: &ReadRequest,
) -> Result<Vec<StoredEvent>, LogError> {
    let from = request.from.max(1);
    let limit = request.limit.unwrap_or(usize::MAX);
    let mut out = Vec::new();
    let Some(start) = plan.start else {
        return Ok(out);
    };
    if limit == 0 {
        return Ok(out);
    }
    for (segment_idx, segment) in plan.segments.iter().enumerate() {
        let offset = if segment_idx == 0 {
            start.offset
        } else {
            segment::SEGMENT_HEADER
        };
        let mut cursor = FrameCursor::open(&segment.path, offset, segment.len)
            .map_err(LogError::io(format!("open {}", segment.path.display())))?;
        loop {
            let frame = match cursor.next_frame() {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(err) => return Err(scan::cursor_error(&segment.path, err)),
            };
            if frame.seq < from {
                continue;
            }
            let seq = frame.seq;
            let event =
                StoredEvent::from_raw(seq, frame.body).map_err(|err| LogError::Corrupt {
                    segment: segment.path.clone(),
                    offset: frame.offset,
                    what: format!("record does not decode as an Envelope: {err}"),
                })?;
            if request
                .subject
                .as_ref()
                .is_none_or(|s| s.as_str() == event.envelope.subject)
            {
                out.push(event);
                if out.len() >= limit {
                    return Ok(out);
                }
            }
            if seq >= plan.last_seq {
                return Ok(out);
            }
        }
    }
    Ok(out)
}

impl Shared {
    pub(crate) fn read_blocking(
        &self,
        request: &ReadRequest,
    ) -> Result<Vec<StoredEvent>, LogError> {
        let plan = self.index.read().expect("index lock").plan(request);
        read_committed(&plan, request)
    }
}

#[async_trait]
impl EventLog for EmbeddedLog {
    async fn append_batch(
        &self,
        events: Vec<(Subject, NewEvent)>,
        expected: &[(Subject, Expected)],
    ) -> Result<AppendAck, LogError> {
        let tx = self.tx.as_ref().ok_or_else(|| LogError::Io {
            context: format!("append to {}", self.shared.dir.display()),
            error: std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                "the log is open read-only",
            ),
        })?;
        validate_batch(&events, expected)?;
        let events = events
            .into_iter()
            .map(|(subject, event)| {
                let mut encoded = event.encode(&subject)?;
                encoded.signer = self.signer.clone();
                Ok((subject, encoded))
            })
            .collect::<Result<Vec<_>, LogError>>()?;
        let (reply, ack) = oneshot::channel();
        tx.send(WriteRequest {
            events,
            expected: expected.to_vec(),
            reply,
        })
        .await
        .map_err(|_| LogError::Closed)?;
        ack.await.map_err(|_| LogError::Closed)?
    }

    async fn read(&self, request: ReadRequest) -> Result<Vec<StoredEvent>, LogError> {
        let shared = self.shared.clone();
        tokio::task::spawn_blocking(move || shared.read_blocking(&request))
            .await
            .map_err(|err| LogError::io("read task")(std::io::Error::other(err)))?
    }

    async fn follow(
        &self,
        subject: Option<Subject>,
        from: u64,
    ) -> Result<BoxStream<'static, Result<StoredEvent, LogError>>, LogError> {
        let shared = self.shared.clone();
        let changes = self.shared.committed.clone();
        Ok(crate::follow::paged(
            from,
            move |from| {
                let shared = shared.clone();
                let request = ReadRequest {
                    subject: subject.clone(),
                    from,
                    limit: Some(1024),
                };
                async move {
                    tokio::task::spawn_blocking(move || shared.read_blocking(&request))
                        .await
                        .map_err(|err| LogError::io("read task")(std::io::Error::other(err)))?
                }
            },
            changes,
        ))
    }

    async fn last_sequence(&self, subject: Option<&Subject>) -> Result<u64, LogError> {
        let index = self.shared.index.read().expect("index lock");
        Ok(match subject {
            None => index.last_seq,
            Some(subject) => index
                .subject_last
                .get(subject.as_str())
                .copied()
                .unwrap_or(0),
        })
    }

    async fn verify(&self) -> Result<VerifyReport, LogError> {
        let shared = self.shared.clone();
        tokio::task::spawn_blocking(move || {
            let limits: BTreeMap<PathBuf, u64> = {
                let index = shared.index.read().expect("index lock");
                index
                    .segments
                    .iter()
                    .map(|s| (s.path.clone(), s.len))
                    .collect()
            };
            scan::verify(&shared.dir, Some(&limits))
        })
        .await
        .map_err(|err| LogError::io("verify task")(std::io::Error::other(err)))?
    }
}

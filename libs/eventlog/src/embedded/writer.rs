//! The writer thread: the only code that writes segment files.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use tokio::sync::{mpsc, watch};

use super::scan::Recovered;
use super::segment::{self, FLAG_END_OF_BATCH, SEGMENT_HEADER, encode_frame, next_chain};
use super::{
    Durability, EmbeddedOptions, INDEX_EVERY, IndexPoint, SegmentInfo, Shared, SubjectHead,
    WriteRequest,
};
use crate::record::batch_label;
use crate::{AppendAck, LogError};

/// Recently appended ids, for de-duplication of retried appends.
struct RecentIds {
    by_id: HashMap<Arc<str>, u64>,
    order: VecDeque<Arc<str>>,
    capacity: usize,
}

impl RecentIds {
    fn new(capacity: usize, recovered: VecDeque<(String, u64)>) -> Self {
        let mut ids = RecentIds {
            by_id: HashMap::new(),
            order: VecDeque::new(),
            capacity,
        };
        for (id, seq) in recovered {
            ids.insert(&id, seq);
        }
        ids
    }

    fn get(&self, id: &str) -> Option<u64> {
        self.by_id.get(id).copied()
    }

    /// Remembers `id`; returns the oldest id it pushed out of the window.
    fn insert(&mut self, id: &str, seq: u64) -> Option<(Arc<str>, u64)> {
        if self.capacity == 0 {
            return None;
        }
        let evicted = if self.order.len() >= self.capacity {
            self.order
                .pop_front()
                .and_then(|old| self.by_id.remove_entry(&old))
        } else {
            None
        };
        let id: Arc<str> = Arc::from(id);
        self.by_id.insert(id.clone(), seq);
        self.order.push_back(id);
        evicted
    }

    /// Undoes the newest `count` inserts, bringing back the ids they pushed out
    /// (`evicted`, oldest first), so a failed write leaves the window as it was.
    fn undo(&mut self, count: usize, evicted: Vec<(Arc<str>, u64)>) {
        for _ in 0..count.min(self.order.len()) {
            if let Some(id) = self.order.pop_back() {
                self.by_id.remove(&id);
            }
        }
        for (id, seq) in evicted.into_iter().rev() {
            self.by_id.insert(id.clone(), seq);
            self.order.push_front(id);
        }
    }
}

pub(crate) struct Writer {
    shared: Arc<Shared>,
    notify: watch::Sender<u64>,
    options: EmbeddedOptions,
    file: File,
    path: PathBuf,
    len: u64,
    next_seq: u64,
    chain: [u8; 32],
    heads: BTreeMap<String, SubjectHead>,
    recent: RecentIds,
    /// Set when a failed write could not be undone; every later append fails.
    failed: Option<String>,
}

/// What a group changed, so a failed write can be undone in memory.
#[derive(Default)]
struct Undo {
    /// Each subject the group appended to, with its head before the group
    /// (the earliest, where several requests appended to it).
    heads: BTreeMap<String, Option<SubjectHead>>,
    /// How many ids the group added to the de-duplication window.
    ids: usize,
    /// Ids the group pushed out of the de-duplication window, oldest first.
    evicted: Vec<(Arc<str>, u64)>,
}

impl Writer {
    pub(crate) fn start(
        dir: &Path,
        recovered: Recovered,
        options: EmbeddedOptions,
    ) -> Result<(Arc<Shared>, Writer), LogError> {
        let Recovered {
            mut index,
            chain,
            heads,
            recent_ids,
            ..
        } = recovered;
        let next_seq = index.last_seq + 1;
        if index.segments.is_empty() {
            let (path, _) = create_segment(dir, next_seq)?;
            index.segments.push(SegmentInfo {
                path,
                len: SEGMENT_HEADER,
            });
            index.sparse.push(IndexPoint {
                seq: next_seq,
                segment: 0,
                offset: SEGMENT_HEADER,
            });
        }
        let last = index.segments.last().expect("one segment").clone();
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&last.path)
            .map_err(LogError::io(format!("open {}", last.path.display())))?;
        let (notify, committed) = watch::channel(index.last_seq);
        let shared = Arc::new(Shared {
            dir: dir.to_path_buf(),
            index: RwLock::new(index),
            committed,
        });
        let writer = Writer {
            shared: shared.clone(),
            notify,
            recent: RecentIds::new(options.dedup_window, recent_ids),
            options,
            file,
            path: last.path,
            len: last.len,
            next_seq,
            chain,
            heads,
            failed: None,
        };
        Ok((shared, writer))
    }

    pub(crate) fn run(mut self, mut rx: mpsc::Receiver<WriteRequest>) {
        let grouped = self.options.durability != Durability::FsyncEachAppend;
        while let Some(first) = rx.blocking_recv() {
            let mut group = vec![first];
            while grouped && group.len() < self.options.max_group {
                match rx.try_recv() {
                    Ok(request) => group.push(request),
                    Err(_) => break,
                }
            }
            self.commit(group);
        }
        let _ = self.file.sync_data();
    }

    fn commit(&mut self, group: Vec<WriteRequest>) {
        if let Some(reason) = &self.failed {
            for request in group {
                let _ = request.reply.send(Err(failed_error(&self.path, reason)));
            }
            return;
        }
        if self.len >= self.options.segment_bytes
            && let Err(err) = self.roll()
        {
            let reason = err.to_string();
            for request in group {
                let _ = request.reply.send(Err(failed_error(&self.path, &reason)));
            }
            return;
        }

        let (start_len, start_seq, start_chain) = (self.len, self.next_seq, self.chain);
        let segment = self.shared.index.read().expect("index lock").segments.len() - 1;
        let mut undo = Undo::default();
        let mut buf = Vec::with_capacity(group.iter().map(|r| r.encoded_len()).sum());
        let mut new_points = Vec::new();
        let outcomes: Vec<Result<AppendAck, LogError>> = group
            .iter()
            .map(|request| self.stage(request, segment, &mut buf, &mut undo, &mut new_points))
            .collect();

        if !buf.is_empty() {
            if let Err(err) = self.write_and_sync(&buf) {
                let reason = format!("write {}: {err}", self.path.display());
                // Undo in memory and on disk; if the file cannot be cut back, stop writing.
                self.next_seq = start_seq;
                self.chain = start_chain;
                for (subject, head) in std::mem::take(&mut undo.heads) {
                    match head {
                        Some(head) => self.heads.insert(subject, head),
                        None => self.heads.remove(&subject),
                    };
                }
                self.recent
                    .undo(undo.ids, std::mem::take(&mut undo.evicted));
                if let Err(err) = self.file.set_len(start_len) {
                    self.failed = Some(format!("{reason}; cutting the file back failed: {err}"));
                }
                self.len = start_len;
                for (request, outcome) in group.into_iter().zip(outcomes) {
                    let outcome = outcome.and_then(|_| Err(failed_error(&self.path, &reason)));
                    let _ = request.reply.send(outcome);
                }
                return;
            }
            self.len += buf.len() as u64;
            self.publish(&undo, new_points);
        }
        for (request, outcome) in group.into_iter().zip(outcomes) {
            let _ = request.reply.send(outcome);
        }
    }

    /// Checks one append and encodes its frames into `buf`.
    fn stage(
        &mut self,
        request: &WriteRequest,
        segment: usize,
        buf: &mut Vec<u8>,
        undo: &mut Undo,
        new_points: &mut Vec<IndexPoint>,
    ) -> Result<AppendAck, LogError> {
        // De-duplication comes first: a retry of a stored batch is acknowledged again.
        let known: Vec<Option<u64>> = request
            .events
            .iter()
            .map(|(_, e)| self.recent.get(&e.id))
            .collect();
        let duplicates = known.iter().filter(|k| k.is_some()).count();
        if duplicates == request.events.len() {
            return Ok(AppendAck {
                sequences: known.into_iter().flatten().collect(),
                duplicates,
            });
        }
        if duplicates > 0 {
            let stored: Vec<&str> = request
                .events
                .iter()
                .zip(&known)
                .filter(|(_, k)| k.is_some())
                .map(|((_, e), _)| e.id.as_str())
                .collect();
            return Err(LogError::InvalidBatch {
                subject: batch_label(&request.events),
                count: request.events.len(),
                expected: format!(
                    "all events new or all already stored (a batch is stored whole), but {stored:?} are stored already"
                ),
            });
        }
        // Every check before anything is staged: a batch is stored whole or not at all.
        for (subject, expected) in &request.expected {
            let actual = self.heads.get(subject.as_str()).map_or(0, |(seq, _)| *seq);
            if let Some(expected) = expected.required()
                && expected != actual
            {
                return Err(LogError::Conflict {
                    subject: subject.to_string(),
                    expected,
                    actual: actual.to_string(),
                });
            }
        }

        let mut sequences = Vec::with_capacity(request.events.len());
        let last = request.events.len() - 1;
        for (i, (subject, event)) in request.events.iter().enumerate() {
            let head = self.heads.get(subject.as_str()).copied();
            if !undo.heads.contains_key(subject.as_str()) {
                undo.heads.insert(subject.to_string(), head);
            }
            let seq = self.next_seq;
            if seq.is_multiple_of(INDEX_EVERY) {
                new_points.push(IndexPoint {
                    seq,
                    segment,
                    offset: self.len + buf.len() as u64,
                });
            }
            let flags = if i == last { FLAG_END_OF_BATCH } else { 0 };
            let prev = head.map(|(_, hash)| hash);
            let parts = event.body_parts(prev.as_ref());
            let hash = encode_frame(buf, seq, flags, &self.chain, &parts.as_slices());
            self.chain = next_chain(&self.chain, &hash);
            undo.evicted.extend(self.recent.insert(&event.id, seq));
            undo.ids += 1;
            sequences.push(seq);
            self.next_seq += 1;
            match self.heads.get_mut(subject.as_str()) {
                Some(slot) => *slot = (seq, hash),
                None => {
                    self.heads.insert(subject.to_string(), (seq, hash));
                }
            }
        }
        Ok(AppendAck {
            sequences,
            duplicates: 0,
        })
    }

    fn write_and_sync(&mut self, buf: &[u8]) -> std::io::Result<()> {
        std::os::unix::fs::FileExt::write_all_at(&self.file, buf, self.len)?;
        if self.options.durability != Durability::NoSync {
            self.file.sync_data()?;
        }
        Ok(())
    }

    /// Makes a committed group visible to readers and followers.
    fn publish(&self, undo: &Undo, new_points: Vec<IndexPoint>) {
        let last_seq = self.next_seq - 1;
        {
            let mut index = self.shared.index.write().expect("index lock");
            index.segments.last_mut().expect("one segment").len = self.len;
            index.sparse.extend(new_points);
            index.last_seq = last_seq;
            for subject in undo.heads.keys() {
                let seq = self.heads[subject.as_str()].0;
                match index.subject_last.get_mut(subject) {
                    Some(slot) => *slot = seq,
                    None => {
                        index.subject_last.insert(subject.to_string(), seq);
                    }
                }
            }
        }
        self.notify.send_replace(last_seq);
    }

    fn roll(&mut self) -> Result<(), LogError> {
        self.file
            .sync_data()
            .map_err(LogError::io(format!("fsync {}", self.path.display())))?;
        let (path, file) = create_segment(&self.shared.dir, self.next_seq)?;
        let mut index = self.shared.index.write().expect("index lock");
        let segment = index.segments.len();
        index.segments.push(SegmentInfo {
            path: path.clone(),
            len: SEGMENT_HEADER,
        });
        index.sparse.push(IndexPoint {
            seq: self.next_seq,
            segment,
            offset: SEGMENT_HEADER,
        });
        self.file = file;
        self.path = path;
        self.len = SEGMENT_HEADER;
        Ok(())
    }
}

fn failed_error(path: &Path, reason: &str) -> LogError {
    LogError::Io {
        context: format!("append to {}", path.display()),
        error: std::io::Error::other(reason.to_string()),
    }
}

/// Creates a segment with its header, durably (file and directory entry), and
/// returns it open for writing.
fn create_segment(dir: &Path, first_seq: u64) -> Result<(PathBuf, File), LogError> {
    let path = dir.join(segment::segment_name(first_seq));
    let created = std::fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .open(&path)
        .and_then(|mut file| {
            file.write_all(&segment::encode_segment_header(first_seq))?;
            file.sync_all()?;
            File::open(dir)?.sync_all()?;
            Ok(file)
        });
    match created {
        Ok(file) => Ok((path, file)),
        Err(err) => {
            // Leave no half-made segment behind, or every later roll would trip on it.
            let _ = std::fs::remove_file(&path);
            Err(LogError::io(format!("create segment {}", path.display()))(
                err,
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn undo_restores_the_dedup_window_exactly() {
        let mut ids = RecentIds::new(
            3,
            VecDeque::from([
                ("a".to_string(), 1),
                ("b".to_string(), 2),
                ("c".to_string(), 3),
            ]),
        );
        let evicted: Vec<_> = [("d", 4), ("e", 5)]
            .iter()
            .filter_map(|(id, seq)| ids.insert(id, *seq))
            .collect();
        assert_eq!(ids.get("a"), None, "pushed out of the window");
        ids.undo(2, evicted);
        assert_eq!(
            (ids.get("a"), ids.get("b"), ids.get("c")),
            (Some(1), Some(2), Some(3))
        );
        assert_eq!((ids.get("d"), ids.get("e")), (None, None));
        let order: Vec<&str> = ids.order.iter().map(|id| &**id).collect();
        assert_eq!(order, ["a", "b", "c"]);
    }
}

//! Reading a log directory from disk: recovery on open, and `verify`.

use std::collections::{BTreeMap, VecDeque};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use bytes::Bytes;

use super::segment::{
    self, CursorError, Defect, FrameCursor, SEGMENT_HEADER, ZERO_CHAIN, find_intact_frame,
    next_chain,
};
use super::{INDEX_EVERY, Index, IndexPoint, OpenReport, SegmentInfo, SubjectHead};
use crate::{LogError, Problem, StoredEvent, SubjectChains, VerifyReport, note_undecodable};

/// An unacknowledged, partly written batch found at the end of the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TornTail {
    pub segment: PathBuf,
    /// Where the kept part of the segment ends.
    pub offset: u64,
    pub dropped_bytes: u64,
    /// Complete records of the unfinished batch that were dropped with it.
    pub dropped_records: u64,
}

/// The state of a log directory after recovery.
pub(crate) struct Recovered {
    pub index: Index,
    pub report: OpenReport,
    pub chain: [u8; 32],
    pub heads: BTreeMap<String, SubjectHead>,
    pub recent_ids: VecDeque<(String, u64)>,
}

pub(crate) fn cursor_error(path: &Path, err: CursorError) -> LogError {
    match err {
        CursorError::Io(err) => LogError::io(format!("read {}", path.display()))(err),
        CursorError::Defect(defect) => LogError::Corrupt {
            segment: path.to_path_buf(),
            offset: defect.offset,
            what: defect.kind.to_string(),
        },
    }
}

/// Segment files of `dir`, ordered by their first sequence.
fn list_segments(dir: &Path) -> Result<Vec<PathBuf>, LogError> {
    let entries =
        std::fs::read_dir(dir).map_err(LogError::io(format!("list {}", dir.display())))?;
    let mut segments = Vec::new();
    for entry in entries {
        let path = entry
            .map_err(LogError::io(format!("list {}", dir.display())))?
            .path();
        if path.extension().is_some_and(|e| e == "seg") {
            let first = segment::parse_segment_name(&path).ok_or_else(|| LogError::Corrupt {
                segment: path.clone(),
                offset: 0,
                what: "segment file name is not <20-digit first sequence>.seg".into(),
            })?;
            segments.push((first, path));
        }
    }
    segments.sort();
    Ok(segments.into_iter().map(|(_, path)| path).collect())
}

fn read_range(path: &Path, start: u64, end: u64) -> Result<Bytes, LogError> {
    let file =
        std::fs::File::open(path).map_err(LogError::io(format!("open {}", path.display())))?;
    let mut data = vec![0u8; (end - start) as usize];
    file.read_exact_at(&mut data, start)
        .map_err(LogError::io(format!("read {}", path.display())))?;
    Ok(Bytes::from(data))
}

fn all_zero(path: &Path, len: u64) -> Result<bool, LogError> {
    Ok(read_range(path, 0, len)?.iter().all(|b| *b == 0))
}

fn file_len(path: &Path) -> Result<u64, LogError> {
    Ok(std::fs::metadata(path)
        .map_err(LogError::io(format!("stat {}", path.display())))?
        .len())
}

/// A record of a batch whose end has not been seen yet.
struct Pending {
    seq: u64,
    offset: u64,
    subject: String,
    id: String,
    hash: [u8; 32],
}

/// Scans every segment, rebuilding the index. With `repair`, a torn tail is
/// truncated (and an empty trailing segment removed); without, it is only
/// reported. Any other damage is [`LogError::Corrupt`].
pub(crate) fn recover(
    dir: &Path,
    repair: bool,
    dedup_window: usize,
) -> Result<Recovered, LogError> {
    let paths = list_segments(dir)?;
    let mut recovery = Recovery {
        repair,
        dedup_window,
        index: Index::default(),
        report: OpenReport::default(),
        chain: ZERO_CHAIN,
        heads: BTreeMap::new(),
        recent_ids: VecDeque::new(),
        next_seq: 1,
    };
    for (i, path) in paths.iter().enumerate() {
        let is_last = i + 1 == paths.len();
        let len = file_len(path)?;
        if !recovery.segment_header(path, len, is_last)? {
            break;
        }
        recovery.segment(path, len, is_last)?;
    }
    Ok(recovery.finish())
}

/// A recovery under way: what the segments scanned so far hold.
struct Recovery {
    repair: bool,
    dedup_window: usize,
    index: Index,
    report: OpenReport,
    chain: [u8; 32],
    heads: BTreeMap<String, SubjectHead>,
    recent_ids: VecDeque<(String, u64)>,
    /// The sequence the next record must have.
    next_seq: u64,
}

/// What scanning a segment's frames left.
struct Scanned {
    /// The records of a batch whose end was not seen.
    pending: Vec<Pending>,
    /// Where the segment's last complete batch ends.
    kept_end: u64,
    /// The damage the last segment's frames stopped at.
    defect_at: Option<Defect>,
}

impl Recovery {
    /// Header phase: checks a segment's first sequence; false for a torn last segment.
    fn segment_header(&mut self, path: &Path, len: u64, is_last: bool) -> Result<bool, LogError> {
        let header = read_range(path, 0, len.min(SEGMENT_HEADER))?;
        let header_ok = segment::parse_segment_header(&header);
        let next_seq = self.next_seq;
        match header_ok {
            Ok(first) if first == next_seq => Ok(true),
            Ok(first) => Err(LogError::Corrupt {
                segment: path.to_path_buf(),
                offset: 8,
                what: format!(
                    "segment starts at sequence {first}, expected {next_seq} (a segment is missing or misnamed)"
                ),
            }),
            // A crash while a new segment was being started leaves a short, empty
            // or zero-filled file (its header never reached the disk).
            Err(_) if is_last && (len < SEGMENT_HEADER || all_zero(path, len)?) => {
                self.report.torn_tail = Some(TornTail {
                    segment: path.to_path_buf(),
                    offset: 0,
                    dropped_bytes: len,
                    dropped_records: 0,
                });
                if self.repair {
                    std::fs::remove_file(path)
                        .map_err(LogError::io(format!("remove {}", path.display())))?;
                }
                Ok(false)
            }
            Err(what) => Err(LogError::Corrupt {
                segment: path.to_path_buf(),
                offset: 0,
                what,
            }),
        }
    }

    /// Segment phase: indexes a segment's records, then checks what follows its last batch.
    fn segment(&mut self, path: &Path, len: u64, is_last: bool) -> Result<(), LogError> {
        let segment_idx = self.index.segments.len();
        self.index.segments.push(SegmentInfo {
            path: path.to_path_buf(),
            len: SEGMENT_HEADER,
        });
        self.index.sparse.push(IndexPoint {
            seq: self.next_seq,
            segment: segment_idx,
            offset: SEGMENT_HEADER,
        });
        let scanned = self.frames(path, len, is_last, segment_idx)?;
        self.tail(path, len, is_last, &scanned)?;
        self.index.segments[segment_idx].len = scanned.kept_end;
        Ok(())
    }

    /// Frames phase: reads and checks a segment's frames, committing each batch as it ends.
    fn frames(
        &mut self,
        path: &Path,
        len: u64,
        is_last: bool,
        segment_idx: usize,
    ) -> Result<Scanned, LogError> {
        let mut cursor = FrameCursor::open(path, SEGMENT_HEADER, len)
            .map_err(LogError::io(format!("open {}", path.display())))?;
        let mut pending: Vec<Pending> = Vec::new();
        let mut pending_chain = self.chain;
        let mut kept_end = SEGMENT_HEADER;
        let mut defect_at = None;
        loop {
            let frame = match cursor.next_frame() {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(CursorError::Defect(defect)) if is_last => {
                    defect_at = Some(defect);
                    break;
                }
                Err(err) => return Err(cursor_error(path, err)),
            };
            let expected_seq = self.next_seq + pending.len() as u64;
            let corrupt = |what: String| LogError::Corrupt {
                segment: path.to_path_buf(),
                offset: frame.offset,
                what,
            };
            if frame.seq != expected_seq {
                return Err(corrupt(format!(
                    "record has sequence {}, expected {expected_seq}",
                    frame.seq
                )));
            }
            if frame.prev_chain != pending_chain {
                return Err(corrupt(format!(
                    "log hash chain broken: record links to {}, but the chain before it is {}",
                    hex::encode(frame.prev_chain),
                    hex::encode(pending_chain)
                )));
            }
            let event = StoredEvent::from_raw(frame.seq, frame.body.clone())
                .map_err(|err| corrupt(format!("record does not decode as an Envelope: {err}")))?;
            let hash = event.hash();
            pending_chain = next_chain(&pending_chain, &hash);
            pending.push(Pending {
                seq: frame.seq,
                offset: frame.offset,
                subject: event.envelope.subject,
                id: event.envelope.id,
                hash,
            });
            if frame.ends_batch() {
                self.commit(&mut pending, segment_idx);
                self.chain = pending_chain;
                kept_end = frame.end();
            }
        }
        Ok(Scanned {
            pending,
            kept_end,
            defect_at,
        })
    }

    /// Commit phase: a complete batch's records indexed, their heads and ids kept.
    fn commit(&mut self, pending: &mut Vec<Pending>, segment_idx: usize) {
        for record in pending.drain(..) {
            if record.seq % INDEX_EVERY == 0 {
                self.index.sparse.push(IndexPoint {
                    seq: record.seq,
                    segment: segment_idx,
                    offset: record.offset,
                });
            }
            self.heads.insert(record.subject, (record.seq, record.hash));
            self.recent_ids.push_back((record.id, record.seq));
            if self.recent_ids.len() > self.dedup_window {
                self.recent_ids.pop_front();
            }
            self.next_seq = record.seq + 1;
        }
    }

    /// Tail phase: damage after a segment's last batch, or a torn tail (cut with `repair`).
    fn tail(
        &mut self,
        path: &Path,
        len: u64,
        is_last: bool,
        scanned: &Scanned,
    ) -> Result<(), LogError> {
        let Scanned {
            pending,
            kept_end,
            defect_at,
        } = scanned;
        let kept_end = *kept_end;
        if let Some(defect) = defect_at {
            // Damage followed by an intact record is inside the log, not a torn write.
            let rest = read_range(path, defect.offset, len)?;
            if let Some(pos) = find_intact_frame(&rest, 1, self.next_seq) {
                return Err(LogError::Corrupt {
                    segment: path.to_path_buf(),
                    offset: defect.offset,
                    what: format!(
                        "{}, and an intact record follows at byte offset {}: the log is damaged, not torn",
                        defect.kind,
                        defect.offset + pos as u64
                    ),
                });
            }
        }
        if defect_at.is_some() || !pending.is_empty() {
            if !is_last {
                return Err(LogError::Corrupt {
                    segment: path.to_path_buf(),
                    offset: pending.first().map_or(kept_end, |p| p.offset),
                    what: "segment ends inside a batch".into(),
                });
            }
            self.report.torn_tail = Some(TornTail {
                segment: path.to_path_buf(),
                offset: kept_end,
                dropped_bytes: len - kept_end,
                dropped_records: pending.len() as u64,
            });
            if self.repair {
                let file = std::fs::OpenOptions::new()
                    .write(true)
                    .open(path)
                    .map_err(LogError::io(format!("open {}", path.display())))?;
                file.set_len(kept_end)
                    .map_err(LogError::io(format!("truncate {}", path.display())))?;
                file.sync_all()
                    .map_err(LogError::io(format!("fsync {}", path.display())))?;
            }
        }
        Ok(())
    }

    /// Final phase: a torn tail logged, the index's and the report's totals set.
    fn finish(self) -> Recovered {
        let Recovery {
            repair,
            mut index,
            mut report,
            chain,
            heads,
            recent_ids,
            next_seq,
            ..
        } = self;
        if let Some(torn) = &report.torn_tail {
            tracing::warn!(
                segment = %torn.segment.display(),
                offset = torn.offset,
                dropped_bytes = torn.dropped_bytes,
                dropped_records = torn.dropped_records,
                repaired = repair,
                "event log had a torn tail (an unacknowledged batch)"
            );
        }
        index.last_seq = next_seq - 1;
        index.subject_last = heads
            .iter()
            .map(|(s, (seq, _))| (s.clone(), *seq))
            .collect();
        report.segments = index.segments.len();
        report.records = index.last_seq;
        Recovered {
            index,
            report,
            chain,
            heads,
            recent_ids,
        }
    }
}

/// Checks a log directory without opening it for writing: checksums, sequences,
/// the log-wide chain, every subject's chain and decodability. Damage is listed
/// (segment and byte offset) and reading resumes at the next intact record.
pub fn verify_dir(dir: &Path) -> Result<VerifyReport, LogError> {
    verify(dir, None)
}

/// As [`verify_dir`]; `limits` caps each segment at its committed length, so a
/// live writer's half-written group is not mistaken for damage.
pub(crate) fn verify(
    dir: &Path,
    limits: Option<&BTreeMap<PathBuf, u64>>,
) -> Result<VerifyReport, LogError> {
    let mut report = VerifyReport::default();
    let mut chains = SubjectChains::default();
    let mut chain = ZERO_CHAIN;
    let mut next_seq = 1u64;
    // The last record's sequence (0 before any): a damaged frame may carry
    // any sequence, u64::MAX included, after which no next one exists.
    let mut last_seq = 0u64;
    let mut last_ends_batch = true;
    let mut resynced = false;
    let paths = list_segments(dir)?;
    for path in &paths {
        let location = |offset: u64| format!("{} @ byte {offset}", path.display());
        let len = match limits {
            Some(limits) => match limits.get(path) {
                Some(len) => *len,
                None => continue, // created after the snapshot
            },
            None => file_len(path)?,
        };
        let header = read_range(path, 0, len.min(SEGMENT_HEADER))?;
        match segment::parse_segment_header(&header) {
            Ok(first) if first != next_seq => report.problems.push(Problem {
                location: location(8),
                sequence: None,
                what: format!("segment starts at sequence {first}, expected {next_seq}"),
            }),
            Ok(_) => {}
            Err(what) => {
                report.problems.push(Problem {
                    location: location(0),
                    sequence: None,
                    what,
                });
                continue;
            }
        }
        let mut cursor = FrameCursor::open(path, SEGMENT_HEADER, len)
            .map_err(LogError::io(format!("open {}", path.display())))?;
        loop {
            let frame = match cursor.next_frame() {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(CursorError::Io(err)) => {
                    return Err(LogError::io(format!("read {}", path.display()))(err));
                }
                Err(CursorError::Defect(defect)) => {
                    let rest = read_range(path, defect.offset, len)?;
                    match find_intact_frame(&rest, 1, next_seq) {
                        Some(pos) => {
                            let resume = defect.offset + pos as u64;
                            report.problems.push(Problem {
                                location: location(defect.offset),
                                sequence: Some(next_seq),
                                what: format!(
                                    "{}; {} bytes unreadable, reading resumes at byte {resume}",
                                    defect.kind,
                                    resume - defect.offset
                                ),
                            });
                            cursor = FrameCursor::open(path, resume, len)
                                .map_err(LogError::io(format!("open {}", path.display())))?;
                            chains.skip_unreadable();
                            resynced = true;
                            continue;
                        }
                        None => {
                            report.problems.push(Problem {
                                location: location(defect.offset),
                                sequence: Some(next_seq),
                                what: format!(
                                    "{}; torn tail of {} bytes",
                                    defect.kind,
                                    len - defect.offset
                                ),
                            });
                            break;
                        }
                    }
                }
            };
            let problem = |what: String| Problem {
                location: location(frame.offset),
                sequence: Some(frame.seq),
                what,
            };
            if std::mem::take(&mut resynced) {
                // Re-anchor after the skipped bytes; the skip is already reported.
                next_seq = frame.seq;
                chain = frame.prev_chain;
            }
            if frame.seq != next_seq {
                report.problems.push(problem(format!(
                    "sequence {} where {next_seq} was expected",
                    frame.seq
                )));
            }
            if frame.prev_chain != chain {
                report.problems.push(problem(format!(
                    "log hash chain broken: links to {}, the chain before it is {}",
                    hex::encode(frame.prev_chain),
                    hex::encode(chain)
                )));
            }
            last_seq = frame.seq;
            next_seq = frame.seq.saturating_add(1);
            last_ends_batch = frame.ends_batch();
            match StoredEvent::from_raw(frame.seq, frame.body.clone()) {
                Ok(event) => {
                    if let Some(what) = chains.check(&event) {
                        report.problems.push(problem(what));
                    }
                    note_undecodable(&mut report, &event);
                    chain = next_chain(&frame.prev_chain, &event.hash());
                }
                Err(err) => {
                    report.problems.push(problem(format!(
                        "record does not decode as an Envelope: {err}"
                    )));
                    chain = next_chain(&frame.prev_chain, blake3::hash(&frame.body).as_bytes());
                }
            }
            report.records += 1;
        }
    }
    if !last_ends_batch {
        report.problems.push(Problem {
            location: paths
                .last()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            sequence: Some(last_seq),
            what: "the log ends inside a batch (torn tail)".into(),
        });
    }
    report.subjects = chains.len();
    report.last_sequence = last_seq;
    report.chain_head = hex::encode(chain);
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{NewEvent, Subject};
    use segment::{FLAG_END_OF_BATCH, encode_frame, encode_segment_header, segment_name};
    use switchyard_proto::v1::{NodeRemoved, domain_event::Kind};

    /// A one-segment log whose frames carry these sequences (each its own
    /// batch, checksums and log-wide chain intact).
    fn log_with_sequences(sequences: &[u64]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let mut file = encode_segment_header(1).to_vec();
        let mut chain = ZERO_CHAIN;
        for (i, &seq) in sequences.iter().enumerate() {
            let event = NewEvent::new(
                format!("e{i}"),
                1,
                Kind::NodeRemoved(NodeRemoved { node: "n1".into() }).into(),
            );
            let body = event
                .encode(&Subject::new(format!("node.n{i}")).unwrap())
                .unwrap()
                .finish(None);
            let hash = encode_frame(&mut file, seq, FLAG_END_OF_BATCH, &chain, &[&body]);
            chain = next_chain(&chain, &hash);
        }
        std::fs::write(dir.path().join(segment_name(1)), file).unwrap();
        dir
    }

    /// Found by the `segment` fuzz target: a frame whose checksum holds but
    /// whose sequence is u64::MAX made `verify` overflow computing the next.
    #[test]
    fn verify_reports_a_frame_with_the_largest_sequence() {
        let dir = log_with_sequences(&[1, u64::MAX]);
        let report = verify_dir(dir.path()).unwrap();
        assert_eq!(report.records, 2);
        assert_eq!(report.last_sequence, u64::MAX);
        let whats: Vec<&str> = report.problems.iter().map(|p| p.what.as_str()).collect();
        assert_eq!(
            whats,
            [format!("sequence {} where 2 was expected", u64::MAX)]
        );
        // Opening refuses it, naming the record.
        let err = recover(dir.path(), false, 0).err().unwrap().to_string();
        assert!(
            err.contains(&format!("record has sequence {}, expected 2", u64::MAX)),
            "{err}"
        );
    }

    #[test]
    fn verify_names_the_last_sequence_of_a_sound_log() {
        let dir = log_with_sequences(&[1, 2, 3]);
        let report = verify_dir(dir.path()).unwrap();
        assert!(report.is_ok(), "{:?}", report.problems);
        assert_eq!((report.records, report.last_sequence), (3, 3));
    }
}

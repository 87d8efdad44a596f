//! Reading a log directory from disk: recovery on open, and `verify`.

use std::collections::{BTreeMap, VecDeque};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use bytes::Bytes;

use super::segment::{
    self, CursorError, FrameCursor, SEGMENT_HEADER, ZERO_CHAIN, find_intact_frame, next_chain,
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
    let mut index = Index::default();
    let mut report = OpenReport::default();
    let mut chain = ZERO_CHAIN;
    let mut heads = BTreeMap::new();
    let mut recent_ids = VecDeque::new();
    let mut next_seq = 1u64;

    for (i, path) in paths.iter().enumerate() {
        let is_last = i + 1 == paths.len();
        let len = file_len(path)?;
        let header = read_range(path, 0, len.min(SEGMENT_HEADER))?;
        let header_ok = segment::parse_segment_header(&header);
        match header_ok {
            Ok(first) if first == next_seq => {}
            Ok(first) => {
                return Err(LogError::Corrupt {
                    segment: path.clone(),
                    offset: 8,
                    what: format!(
                        "segment starts at sequence {first}, expected {next_seq} (a segment is missing or misnamed)"
                    ),
                });
            }
            // A crash while a new segment was being started leaves a short, empty
            // or zero-filled file (its header never reached the disk).
            Err(_) if is_last && (len < SEGMENT_HEADER || all_zero(path, len)?) => {
                report.torn_tail = Some(TornTail {
                    segment: path.clone(),
                    offset: 0,
                    dropped_bytes: len,
                    dropped_records: 0,
                });
                if repair {
                    std::fs::remove_file(path)
                        .map_err(LogError::io(format!("remove {}", path.display())))?;
                }
                break;
            }
            Err(what) => {
                return Err(LogError::Corrupt {
                    segment: path.clone(),
                    offset: 0,
                    what,
                });
            }
        }
        let segment_idx = index.segments.len();
        index.segments.push(SegmentInfo {
            path: path.clone(),
            len: SEGMENT_HEADER,
        });
        index.sparse.push(IndexPoint {
            seq: next_seq,
            segment: segment_idx,
            offset: SEGMENT_HEADER,
        });

        let mut cursor = FrameCursor::open(path, SEGMENT_HEADER, len)
            .map_err(LogError::io(format!("open {}", path.display())))?;
        let mut pending: Vec<Pending> = Vec::new();
        let mut pending_chain = chain;
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
            let expected_seq = next_seq + pending.len() as u64;
            let corrupt = |what: String| LogError::Corrupt {
                segment: path.clone(),
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
                for record in pending.drain(..) {
                    if record.seq % INDEX_EVERY == 0 {
                        index.sparse.push(IndexPoint {
                            seq: record.seq,
                            segment: segment_idx,
                            offset: record.offset,
                        });
                    }
                    heads.insert(record.subject, (record.seq, record.hash));
                    recent_ids.push_back((record.id, record.seq));
                    if recent_ids.len() > dedup_window {
                        recent_ids.pop_front();
                    }
                    next_seq = record.seq + 1;
                }
                chain = pending_chain;
                kept_end = frame.end();
            }
        }

        if let Some(defect) = &defect_at {
            // Damage followed by an intact record is inside the log, not a torn write.
            let rest = read_range(path, defect.offset, len)?;
            if let Some(pos) = find_intact_frame(&rest, 1, next_seq) {
                return Err(LogError::Corrupt {
                    segment: path.clone(),
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
                    segment: path.clone(),
                    offset: pending.first().map_or(kept_end, |p| p.offset),
                    what: "segment ends inside a batch".into(),
                });
            }
            report.torn_tail = Some(TornTail {
                segment: path.clone(),
                offset: kept_end,
                dropped_bytes: len - kept_end,
                dropped_records: pending.len() as u64,
            });
            if repair {
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
        index.segments[segment_idx].len = kept_end;
    }
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
    Ok(Recovered {
        index,
        report,
        chain,
        heads,
        recent_ids,
    })
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

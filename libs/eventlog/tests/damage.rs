//! Damage to the embedded log's files: a flipped byte inside the log is a hard
//! error naming the segment and byte offset; a torn tail (an unacknowledged batch
//! cut short, as power loss leaves it) is reported and cut off; a second writer
//! is refused.

use std::path::{Path, PathBuf};

use switchyard_eventlog::embedded::{EmbeddedLog, EmbeddedOptions, verify_dir};
use switchyard_eventlog::{EventLog, Expected, LogError, NewEvent, ReadRequest, Subject};
use switchyard_proto::v1::{NodeRemoved, domain_event::Kind};

const SEGMENT_HEADER: u64 = 24;
const FRAME_HEADER: u64 = 49;

fn event(id: &str) -> NewEvent {
    NewEvent::new(
        id,
        0,
        Kind::NodeRemoved(NodeRemoved {
            node: format!("node-{id}"),
        })
        .into(),
    )
}

/// Writes `batches` batches of `per_batch` events into small segments and closes the log.
async fn write_log(dir: &Path, batches: usize, per_batch: usize) {
    let options = EmbeddedOptions {
        segment_bytes: 4096,
        ..EmbeddedOptions::default()
    };
    let log = EmbeddedLog::open(dir, options).unwrap();
    let subject = Subject::new("damage.test").unwrap();
    for b in 0..batches {
        let batch = (0..per_batch)
            .map(|i| event(&format!("b{b}-{i}")))
            .collect();
        log.append(&subject, Expected::Any, batch).await.unwrap();
    }
    log.close();
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut segments: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    segments.sort();
    segments
}

/// Start offsets of the frames of a segment, read with the documented format.
fn frame_offsets(segment: &Path) -> Vec<u64> {
    let data = std::fs::read(segment).unwrap();
    let mut offsets = Vec::new();
    let mut at = SEGMENT_HEADER;
    while at + FRAME_HEADER <= data.len() as u64 {
        offsets.push(at);
        let len = u32::from_le_bytes(data[at as usize + 4..at as usize + 8].try_into().unwrap());
        at += FRAME_HEADER + len as u64;
    }
    offsets
}

fn flip_byte(path: &Path, offset: u64) {
    let mut data = std::fs::read(path).unwrap();
    data[offset as usize] ^= 0x5a;
    std::fs::write(path, data).unwrap();
}

#[tokio::test]
async fn flipped_byte_in_a_middle_segment_names_segment_and_offset() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), 40, 2).await;
    let segs = segments(dir.path());
    assert!(segs.len() >= 3, "want several segments, got {}", segs.len());
    let victim = &segs[1];
    let frames = frame_offsets(victim);
    let frame = frames[frames.len() / 2];
    flip_byte(victim, frame + FRAME_HEADER + 3);

    let report = verify_dir(dir.path()).unwrap();
    assert_eq!(report.problems.len(), 1, "{:?}", report.problems);
    let problem = &report.problems[0];
    assert_eq!(
        problem.location,
        format!("{} @ byte {frame}", victim.display())
    );
    assert!(problem.what.contains("checksum"), "{problem}");
    // Reading resumed after the damaged record: everything else was checked.
    assert_eq!(report.records, 79);

    match EmbeddedLog::open(dir.path(), EmbeddedOptions::default()) {
        Err(LogError::Corrupt {
            segment,
            offset,
            what,
        }) => {
            assert_eq!((&segment, offset), (victim, frame), "{what}");
        }
        Err(other) => panic!("expected Corrupt, got {other}"),
        Ok(_) => panic!("a damaged log must not open"),
    }
    let err = EmbeddedLog::open_read_only(dir.path())
        .err()
        .expect("read-only open refuses too");
    assert!(
        err.to_string().contains(&format!("byte offset {frame}")),
        "{err}"
    );
}

#[tokio::test]
async fn flipped_byte_before_the_last_record_is_damage_not_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), 10, 1).await;
    let last = segments(dir.path()).pop().unwrap();
    let frames = frame_offsets(&last);
    assert!(frames.len() >= 2);
    let frame = frames[frames.len() - 2];
    flip_byte(&last, frame + 20);
    let Err(LogError::Corrupt { offset, what, .. }) =
        EmbeddedLog::open(dir.path(), EmbeddedOptions::default())
    else {
        panic!("damage followed by an intact record must not be cut off as a torn tail");
    };
    assert_eq!(offset, frame);
    assert!(what.contains("intact record follows"), "{what}");
}

#[tokio::test]
async fn torn_tail_is_reported_and_cut_to_the_last_whole_batch() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), 3, 3).await; // 9 records, one segment
    let segs = segments(dir.path());
    assert_eq!(segs.len(), 1);
    let seg = &segs[0];
    let frames = frame_offsets(seg);
    assert_eq!(frames.len(), 9);
    // Power loss in the middle of the third batch's last record.
    let cut = frames[8] + 30;
    std::fs::OpenOptions::new()
        .write(true)
        .open(seg)
        .unwrap()
        .set_len(cut)
        .unwrap();

    let read_only = EmbeddedLog::open_read_only(dir.path()).unwrap();
    assert!(read_only.open_report().torn_tail.is_some());
    assert_eq!(read_only.last_sequence(None).await.unwrap(), 6);
    drop(read_only);
    assert_eq!(
        std::fs::metadata(seg).unwrap().len(),
        cut,
        "read-only open changes nothing"
    );
    assert!(
        !verify_dir(dir.path()).unwrap().is_ok(),
        "verify flags the torn tail"
    );

    let log = EmbeddedLog::open(dir.path(), EmbeddedOptions::default()).unwrap();
    let torn = log
        .open_report()
        .torn_tail
        .clone()
        .expect("torn tail reported");
    assert_eq!(torn.segment, *seg);
    assert_eq!(
        torn.offset, frames[6],
        "cut back to the end of the last whole batch"
    );
    assert_eq!(
        torn.dropped_records, 2,
        "the batch's two complete records go with it"
    );
    assert_eq!(torn.dropped_bytes, cut - frames[6]);
    assert_eq!(std::fs::metadata(seg).unwrap().len(), frames[6]);

    // The log goes on from there, and the chain holds.
    let subject = Subject::new("damage.test").unwrap();
    let ack = log
        .append(&subject, Expected::Sequence(6), vec![event("after")])
        .await
        .unwrap();
    assert_eq!(ack.sequences, vec![7]);
    let events = log.read(ReadRequest::default()).await.unwrap();
    assert_eq!(events.len(), 7);
    assert!(log.verify().await.unwrap().is_ok());
}

#[tokio::test]
async fn second_writer_on_a_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let first = EmbeddedLog::open(dir.path(), EmbeddedOptions::default()).unwrap();
    let err = EmbeddedLog::open(dir.path(), EmbeddedOptions::default())
        .err()
        .expect("second writer refused");
    assert!(matches!(err, LogError::Locked { .. }), "{err}");
    assert!(
        err.to_string()
            .contains(&format!("pid {}", std::process::id())),
        "{err}"
    );
    // Readers are welcome while the writer runs.
    EmbeddedLog::open_read_only(dir.path()).unwrap();
    drop(first);
    EmbeddedLog::open(dir.path(), EmbeddedOptions::default()).expect("lock released on close");
}

#[tokio::test]
async fn reopened_log_continues_sequences_chains_and_dedup() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), 50, 3).await;
    let log = EmbeddedLog::open(
        dir.path(),
        EmbeddedOptions {
            segment_bytes: 4096,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(log.last_sequence(None).await.unwrap(), 150);
    let subject = Subject::new("damage.test").unwrap();
    // A retry of the last batch from before the restart is recognised.
    let retry = (0..3).map(|i| event(&format!("b49-{i}"))).collect();
    let ack = log
        .append(&subject, Expected::Sequence(147), retry)
        .await
        .unwrap();
    assert_eq!((ack.sequences, ack.duplicates), (vec![148, 149, 150], 3));
    let ack = log
        .append(&subject, Expected::Sequence(150), vec![event("new")])
        .await
        .unwrap();
    assert_eq!(ack.sequences, vec![151]);
    let page = log
        .read(ReadRequest {
            subject: None,
            from: 140,
            limit: Some(20),
        })
        .await
        .unwrap();
    assert_eq!(page.first().unwrap().sequence, 140);
    assert_eq!(page.last().unwrap().sequence, 151);
    let report = log.verify().await.unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
    assert_eq!(report.records, 151);
}

#[tokio::test]
async fn followers_end_when_the_log_is_closed() {
    use futures::StreamExt;
    let dir = tempfile::tempdir().unwrap();
    let log = EmbeddedLog::open(dir.path(), EmbeddedOptions::default()).unwrap();
    let subject = Subject::new("follow.close").unwrap();
    log.append(&subject, Expected::Any, vec![event("only")])
        .await
        .unwrap();
    let mut follow = log.follow(None, 1).await.unwrap();
    assert_eq!(follow.next().await.unwrap().unwrap().envelope.id, "only");
    log.close();
    let end = tokio::time::timeout(std::time::Duration::from_secs(10), follow.next()).await;
    assert!(
        matches!(end, Ok(None)),
        "the stream ends once the writer has stopped"
    );
}

#[tokio::test]
async fn zero_filled_new_segment_is_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    write_log(dir.path(), 5, 1).await;
    // Power lost while the next segment was being created: its header never landed.
    let stray = dir.path().join("00000000000000000006.seg");
    std::fs::write(&stray, [0u8; 24]).unwrap();
    let log = EmbeddedLog::open(dir.path(), EmbeddedOptions::default()).expect("opens");
    let torn = log.open_report().torn_tail.clone().expect("reported");
    assert_eq!((torn.segment, torn.dropped_bytes), (stray.clone(), 24));
    assert!(!stray.exists(), "the empty segment is removed");
    let subject = Subject::new("damage.test").unwrap();
    let ack = log
        .append(&subject, Expected::Sequence(5), vec![event("next")])
        .await
        .unwrap();
    assert_eq!(ack.sequences, vec![6]);
}

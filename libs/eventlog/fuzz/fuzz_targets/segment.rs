//! Any bytes as the embedded log's segment files, read the three ways a log
//! directory is read: `verify_dir` (`switchyard log verify`), opening read-only
//! (`status`, `replay`, `log show`) and opening for writing (a service's
//! start, which repairs a torn tail). None of them panics; a log that opens
//! read-only reads back every record it counted; a log that opens for writing
//! takes an append and opens again with one record more.
//!
//! The first byte chooses how the rest becomes files, so the fuzzer gets past
//! the checksums: 0 — the rest is the segment file; 1 — a valid segment
//! header, then the rest; 2 — frames built here (see [`Builder`]).
//!
//! Run: `scripts/fuzz.sh` (all targets), or
//! `cd libs/eventlog/fuzz && cargo +nightly fuzz run segment -- -max_total_time=60`

#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use switchyard_eventlog::embedded::{Durability, EmbeddedLog, EmbeddedOptions, verify_dir};
use switchyard_eventlog::{EventLog, NewEvent, Payload, ReadRequest, Subject};

const MAGIC: &[u8; 7] = b"SWYSEG\0";
const FRAME_HEADER: usize = 4 + 4 + 8 + 1 + 32;
/// Separates the frames of structured input.
const SEPARATOR: &[u8] = b"\xffFRAME";

fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("a runtime")
    })
}

/// A directory of this process's own, emptied before each input.
fn log_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let base = Path::new("/dev/shm");
        let base = if base.is_dir() {
            base.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        base.join(format!("switchyard-fuzz-segment-{}", std::process::id()))
    })
    .clone()
}

fn segment_name(first_seq: u64) -> String {
    format!("{first_seq:020}.seg")
}

fn segment_header(first_seq: u64) -> Vec<u8> {
    let mut header = vec![0u8; 24];
    header[..7].copy_from_slice(MAGIC);
    header[7] = 1;
    header[8..16].copy_from_slice(&first_seq.to_le_bytes());
    let crc = crc32(&header[..16]);
    header[16..20].copy_from_slice(&crc.to_le_bytes());
    header
}

/// CRC-32 (IEEE), as the segment format uses; kept here rather than depend
/// on the crate the log uses, so the target checks the format, not reuses it.
fn crc32(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// Structured input: frames separated by [`SEPARATOR`], each a control byte
/// and the record's body, written with correct checksums, sequences and
/// log-wide chain unless the control byte says otherwise:
/// bit 0 ends a batch; bit 1 starts a new segment before the frame; bit 2
/// takes the sequence from the body's first 8 bytes; bit 3 breaks the chain;
/// bit 4 flips a byte of the frame (checksum mismatch); bit 5 cuts the file
/// in the middle of the frame and ends the input (a torn write).
struct Builder {
    files: Vec<(u64, Vec<u8>)>,
    next_seq: u64,
    chain: [u8; 32],
}

impl Builder {
    fn build(input: &[u8]) -> Vec<(u64, Vec<u8>)> {
        let mut builder = Builder {
            files: vec![(1, segment_header(1))],
            next_seq: 1,
            chain: [0; 32],
        };
        for chunk in split(input, SEPARATOR) {
            let Some((&control, body)) = chunk.split_first() else {
                continue;
            };
            if !builder.frame(control, body) {
                break;
            }
        }
        builder.files
    }

    /// Writes one frame; false once the input ends here.
    fn frame(&mut self, control: u8, mut body: &[u8]) -> bool {
        if control & 2 != 0 {
            self.files
                .push((self.next_seq, segment_header(self.next_seq)));
        }
        let mut seq = self.next_seq;
        if control & 4 != 0 && body.len() >= 8 {
            seq = u64::from_le_bytes(body[..8].try_into().unwrap());
            body = &body[8..];
        }
        let mut prev_chain = self.chain;
        if control & 8 != 0 {
            prev_chain[0] ^= 1;
        }
        let mut frame = Vec::with_capacity(FRAME_HEADER + body.len());
        frame.extend_from_slice(&[0; 4]);
        frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
        frame.extend_from_slice(&seq.to_le_bytes());
        frame.push(control & 1);
        frame.extend_from_slice(&prev_chain);
        frame.extend_from_slice(body);
        let crc = crc32(&frame[4..]);
        frame[..4].copy_from_slice(&crc.to_le_bytes());
        if control & 16 != 0 {
            let at = frame.len() / 2;
            frame[at] ^= 0x40;
        }
        let torn = control & 32 != 0;
        if torn {
            frame.truncate(frame.len() / 2);
        }
        let file = &mut self.files.last_mut().expect("a segment").1;
        file.extend_from_slice(&frame);
        let record_hash = blake3(body);
        self.chain = next_chain(&prev_chain, &record_hash);
        self.next_seq = seq.wrapping_add(1);
        !torn
    }
}

fn blake3(data: &[u8]) -> [u8; 32] {
    *::blake3::hash(data).as_bytes()
}

fn next_chain(prev: &[u8; 32], record: &[u8; 32]) -> [u8; 32] {
    let mut hasher = ::blake3::Hasher::new();
    hasher.update(prev);
    hasher.update(record);
    *hasher.finalize().as_bytes()
}

fn split<'a>(data: &'a [u8], separator: &'a [u8]) -> impl Iterator<Item = &'a [u8]> {
    let mut rest = Some(data);
    std::iter::from_fn(move || {
        let current = rest?;
        match current
            .windows(separator.len())
            .position(|w| w == separator)
        {
            Some(at) => {
                rest = Some(&current[at + separator.len()..]);
                Some(&current[..at])
            }
            None => {
                rest = None;
                Some(current)
            }
        }
    })
}

fn write_files(dir: &Path, files: &[(u64, Vec<u8>)]) {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).expect("create the log directory");
    for (first_seq, bytes) in files {
        std::fs::write(dir.join(segment_name(*first_seq)), bytes).expect("write a segment");
    }
}

fn read_all(log: &EmbeddedLog) -> (u64, usize) {
    runtime().block_on(async {
        let last = log.last_sequence(None).await.expect("last_sequence");
        let records = log
            .read(ReadRequest::default())
            .await
            .expect("a log that opened reads back");
        (last, records.len())
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let files = match mode % 3 {
        0 => vec![(1, rest.to_vec())],
        1 => vec![(1, [segment_header(1), rest.to_vec()].concat())],
        _ => Builder::build(rest),
    };
    let dir = log_dir();
    write_files(&dir, &files);

    if let Ok(report) = verify_dir(&dir) {
        let _ = report.is_ok();
    }

    if let Ok(log) = EmbeddedLog::open_read_only(&dir) {
        let (last, read) = read_all(&log);
        assert_eq!(read as u64, last, "every record counted reads back");
        assert_eq!(log.open_report().records, last);
        let _ = runtime().block_on(log.verify());
    }

    let options = EmbeddedOptions {
        durability: Durability::NoSync,
        ..EmbeddedOptions::default()
    };
    let Ok(log) = EmbeddedLog::open(&dir, options) else {
        return;
    };
    let (last, read) = read_all(&log);
    assert_eq!(read as u64, last);
    let event = NewEvent {
        payload: Payload::Raw {
            event_type: "FuzzAppended".into(),
            schema_version: 1,
            bytes: bytes::Bytes::from_static(b"x"),
        },
        ..NewEvent::new(
            "fuzz-appended-after-recovery",
            1,
            switchyard_eventlog::DomainEvent::default(),
        )
    };
    let subject = Subject::new("fuzz.appended").expect("a valid subject");
    let appended = runtime().block_on(log.append_batch(vec![(subject, event)], &[]));
    log.close();
    let ack = appended.expect("a log that opened for writing takes an append");
    let reopened = EmbeddedLog::open_read_only(&dir).expect("a repaired log opens again");
    let (after, read) = read_all(&reopened);
    assert_eq!(read as u64, after);
    if ack.duplicates == 0 {
        assert_eq!(after, last + 1, "the append is the one new record");
    }
});

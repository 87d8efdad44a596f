//! The on-disk format of the embedded log.
//!
//! A log directory holds segment files named by the sequence of their first
//! record (`00000000000000000001.seg`). A segment starts with a 24-byte header:
//!
//! ```text
//! magic "SWYSEG\0" + format version (1 byte) | first_seq u64 | crc32 of the previous 16 bytes u32 | 0u32
//! ```
//!
//! then frames, all integers little-endian:
//!
//! ```text
//! crc32 u32 | len u32 | seq u64 | flags u8 | prev_chain [32] | body [len]
//! ```
//!
//! `crc32` covers everything after itself. `body` is the encoded `Envelope`.
//! `prev_chain` is the log-wide chain value before this frame, where
//! `chain(n) = BLAKE3(chain(n-1) || BLAKE3(body(n)))` and `chain(0)` is all zeros,
//! so changing any record changes every later chain value. Flag bit 0 marks the
//! last frame of an appended batch: recovery never keeps half a batch.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;

use bytes::Bytes;

use crate::MAX_RECORD_BYTES;

pub(crate) const MAGIC: &[u8; 7] = b"SWYSEG\0";
pub(crate) const FORMAT_VERSION: u8 = 1;
pub(crate) const SEGMENT_HEADER: u64 = 24;
pub(crate) const FRAME_HEADER: usize = 4 + 4 + 8 + 1 + 32;
pub(crate) const FLAG_END_OF_BATCH: u8 = 1;
pub(crate) const ZERO_CHAIN: [u8; 32] = [0; 32];

const READ_CHUNK: usize = 1 << 20;

pub(crate) fn segment_name(first_seq: u64) -> String {
    format!("{first_seq:020}.seg")
}

/// The first sequence of a segment, from its file name.
pub(crate) fn parse_segment_name(path: &Path) -> Option<u64> {
    let name = path.file_name()?.to_str()?;
    let stem = name.strip_suffix(".seg")?;
    (stem.len() == 20).then(|| stem.parse().ok()).flatten()
}

pub(crate) fn encode_segment_header(first_seq: u64) -> [u8; SEGMENT_HEADER as usize] {
    let mut header = [0u8; SEGMENT_HEADER as usize];
    header[..7].copy_from_slice(MAGIC);
    header[7] = FORMAT_VERSION;
    header[8..16].copy_from_slice(&first_seq.to_le_bytes());
    let crc = crc32fast::hash(&header[..16]);
    header[16..20].copy_from_slice(&crc.to_le_bytes());
    header
}

/// Checks a segment header; returns its first sequence or what is wrong.
pub(crate) fn parse_segment_header(header: &[u8]) -> Result<u64, String> {
    if header.len() < SEGMENT_HEADER as usize {
        return Err(format!(
            "segment header is {} bytes, expected {SEGMENT_HEADER}",
            header.len()
        ));
    }
    if &header[..7] != MAGIC {
        return Err("not a Switchyard segment (bad magic)".into());
    }
    if header[7] != FORMAT_VERSION {
        return Err(format!(
            "segment format version {} is not supported (this build reads {FORMAT_VERSION})",
            header[7]
        ));
    }
    let crc = u32::from_le_bytes(header[16..20].try_into().unwrap());
    if crc != crc32fast::hash(&header[..16]) {
        return Err("segment header checksum mismatch".into());
    }
    Ok(u64::from_le_bytes(header[8..16].try_into().unwrap()))
}

/// Appends one frame whose body is the concatenation of `body`; returns the
/// BLAKE3 hash of the body (the record's hash).
pub(crate) fn encode_frame(
    out: &mut Vec<u8>,
    seq: u64,
    flags: u8,
    prev_chain: &[u8; 32],
    body: &[&[u8]],
) -> [u8; 32] {
    let start = out.len();
    let len: usize = body.iter().map(|part| part.len()).sum();
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&(len as u32).to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.push(flags);
    out.extend_from_slice(prev_chain);
    let body_start = out.len();
    for part in body {
        out.extend_from_slice(part);
    }
    let crc = crc32fast::hash(&out[start + 4..]);
    out[start..start + 4].copy_from_slice(&crc.to_le_bytes());
    *blake3::hash(&out[body_start..]).as_bytes()
}

pub(crate) fn next_chain(prev_chain: &[u8; 32], record_hash: &[u8; 32]) -> [u8; 32] {
    let mut hasher = blake3::Hasher::new();
    hasher.update(prev_chain);
    hasher.update(record_hash);
    *hasher.finalize().as_bytes()
}

#[derive(Clone, Debug)]
pub(crate) struct Frame {
    pub offset: u64,
    pub seq: u64,
    pub flags: u8,
    pub prev_chain: [u8; 32],
    pub body: Bytes,
}

impl Frame {
    pub(crate) fn len(&self) -> u64 {
        (FRAME_HEADER + self.body.len()) as u64
    }

    pub(crate) fn end(&self) -> u64 {
        self.offset + self.len()
    }

    pub(crate) fn ends_batch(&self) -> bool {
        self.flags & FLAG_END_OF_BATCH != 0
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum DefectKind {
    /// The frame runs past the end of the file.
    Truncated,
    /// The length field is larger than any record can be.
    BadLength(u32),
    BadChecksum,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Defect {
    pub offset: u64,
    pub kind: DefectKind,
}

impl std::fmt::Display for DefectKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DefectKind::Truncated => f.write_str("record runs past the end of the segment"),
            DefectKind::BadLength(len) => {
                write!(
                    f,
                    "record length {len} is over the limit of {MAX_RECORD_BYTES} bytes"
                )
            }
            DefectKind::BadChecksum => f.write_str("record checksum mismatch"),
        }
    }
}

/// Parses the frame at `pos` of `data`. `Ok(None)`: fewer bytes than a frame needs.
fn parse_frame(data: &Bytes, pos: usize, offset: u64) -> Result<Option<Frame>, Defect> {
    let rest = &data[pos..];
    if rest.len() < FRAME_HEADER {
        return Ok(None);
    }
    let len = u32::from_le_bytes(rest[4..8].try_into().unwrap());
    if len as usize > MAX_RECORD_BYTES {
        return Err(Defect {
            offset,
            kind: DefectKind::BadLength(len),
        });
    }
    let total = FRAME_HEADER + len as usize;
    if rest.len() < total {
        return Ok(None);
    }
    let crc = u32::from_le_bytes(rest[..4].try_into().unwrap());
    if crc != crc32fast::hash(&rest[4..total]) {
        return Err(Defect {
            offset,
            kind: DefectKind::BadChecksum,
        });
    }
    Ok(Some(Frame {
        offset,
        seq: u64::from_le_bytes(rest[8..16].try_into().unwrap()),
        flags: rest[16],
        prev_chain: rest[17..49].try_into().unwrap(),
        body: data.slice(pos + FRAME_HEADER..pos + total),
    }))
}

/// Reads the frames of one segment between two offsets, a chunk at a time.
pub(crate) struct FrameCursor {
    file: File,
    end: u64,
    buf: Bytes,
    buf_start: u64,
    pos: usize,
}

impl FrameCursor {
    pub(crate) fn open(path: &Path, start: u64, end: u64) -> std::io::Result<Self> {
        Ok(FrameCursor {
            file: File::open(path)?,

            end,
            buf: Bytes::new(),
            buf_start: start,
            pos: 0,
        })
    }

    pub(crate) fn offset(&self) -> u64 {
        self.buf_start + self.pos as u64
    }

    fn refill(&mut self, at_least: usize) -> std::io::Result<()> {
        let offset = self.offset();
        let want = READ_CHUNK.max(at_least).min((self.end - offset) as usize);
        let mut chunk = vec![0u8; want];
        let mut filled = 0;
        while filled < want {
            let n = self
                .file
                .read_at(&mut chunk[filled..], offset + filled as u64)?;
            if n == 0 {
                break;
            }
            filled += n;
        }
        chunk.truncate(filled);
        self.buf = Bytes::from(chunk);
        self.buf_start = offset;
        self.pos = 0;
        Ok(())
    }

    /// The next frame; `None` at the end offset.
    pub(crate) fn next_frame(&mut self) -> Result<Option<Frame>, CursorError> {
        let offset = self.offset();
        if offset >= self.end {
            return Ok(None);
        }
        if let Some(frame) = parse_frame(&self.buf, self.pos, offset)? {
            self.pos += frame.len() as usize;
            return Ok(Some(frame));
        }
        // Not enough bytes buffered: load the frame (or the rest of the range) afresh.
        let needed = if self.buf.len() - self.pos >= FRAME_HEADER {
            FRAME_HEADER
                + u32::from_le_bytes(self.buf[self.pos + 4..self.pos + 8].try_into().unwrap())
                    as usize
        } else {
            FRAME_HEADER
        };
        self.refill(needed).map_err(CursorError::Io)?;
        match parse_frame(&self.buf, 0, offset)? {
            Some(frame) => {
                self.pos = frame.len() as usize;
                Ok(Some(frame))
            }
            None => Err(Defect {
                offset,
                kind: DefectKind::Truncated,
            }
            .into()),
        }
    }
}

#[derive(Debug)]
pub(crate) enum CursorError {
    Io(std::io::Error),
    Defect(Defect),
}

impl From<Defect> for CursorError {
    fn from(defect: Defect) -> Self {
        CursorError::Defect(defect)
    }
}

/// After a defect at `from`, looks for any intact frame later in `data` with a
/// plausible sequence. Finding one means the damage is inside the log, not a torn
/// tail. Returns the offset (relative to `data`) of that frame.
pub(crate) fn find_intact_frame(data: &Bytes, from: usize, min_seq: u64) -> Option<usize> {
    let plausible = min_seq..min_seq.saturating_add(1 << 40);
    (from..data.len().saturating_sub(FRAME_HEADER)).find(|&pos| {
        let seq = u64::from_le_bytes(data[pos + 8..pos + 16].try_into().unwrap());
        plausible.contains(&seq) && matches!(parse_frame(data, pos, 0), Ok(Some(_)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_round_trip_and_checksum() {
        let mut out = Vec::new();
        encode_frame(&mut out, 7, FLAG_END_OF_BATCH, &[3; 32], &[b"hel", b"lo"]);
        let data = Bytes::from(out.clone());
        let frame = parse_frame(&data, 0, 100).unwrap().unwrap();
        assert_eq!(
            (frame.offset, frame.seq, frame.flags),
            (100, 7, FLAG_END_OF_BATCH)
        );
        assert_eq!(&frame.body[..], b"hello");
        assert_eq!(frame.prev_chain, [3; 32]);

        let mut damaged = out.clone();
        damaged[FRAME_HEADER + 1] ^= 0x40;
        let err = parse_frame(&Bytes::from(damaged), 0, 100).unwrap_err();
        assert_eq!(
            err,
            Defect {
                offset: 100,
                kind: DefectKind::BadChecksum
            }
        );

        assert!(
            parse_frame(&Bytes::from(out[..out.len() - 1].to_vec()), 0, 0)
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn segment_header_round_trip() {
        let header = encode_segment_header(42);
        assert_eq!(parse_segment_header(&header), Ok(42));
        let mut bad = header;
        bad[9] ^= 1;
        assert!(parse_segment_header(&bad).unwrap_err().contains("checksum"));
        assert_eq!(
            parse_segment_name(Path::new("/x/00000000000000000042.seg")),
            Some(42)
        );
        assert_eq!(segment_name(42), "00000000000000000042.seg");
    }

    #[test]
    fn intact_frame_is_found_after_damage() {
        let mut out = Vec::new();
        encode_frame(&mut out, 1, 1, &ZERO_CHAIN, &[b"first"]);
        let second = out.len();
        encode_frame(&mut out, 2, 1, &ZERO_CHAIN, &[b"second"]);
        out[10] ^= 0xff; // damage the first frame's sequence bytes
        let data = Bytes::from(out);
        assert_eq!(find_intact_frame(&data, 1, 1), Some(second));
        assert_eq!(find_intact_frame(&data, second + 1, 1), None);
    }
}

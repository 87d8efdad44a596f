//! Faults injected while the library runs: lines appended to the file that
//! `SWITCHYARD_NVML_MOCK_FAULTS` names (the format is in the crate's docs).

use std::fmt;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// One line of the fault file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// `xid <uuid> <n>`: a critical XID error, `nvmlEventTypeXidCriticalError`
    /// with `eventData` n, on the card (a MIG device's UUID: on its card, with
    /// the MIG device's GPU and compute instance ids).
    Xid { uuid: String, xid: u64 },
    /// `ecc <uuid>`: a double-bit ECC error, `nvmlEventTypeDoubleBitEccError`.
    Ecc { uuid: String },
    /// `lost <uuid>`: the card fell off the bus.
    Lost { uuid: String },
}

impl Fault {
    /// The UUID the fault names.
    pub fn uuid(&self) -> &str {
        match self {
            Fault::Xid { uuid, .. } | Fault::Ecc { uuid } | Fault::Lost { uuid } => uuid,
        }
    }
}

/// A line as it is written to the file, without its newline.
impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Fault::Xid { uuid, xid } => write!(f, "xid {uuid} {xid}"),
            Fault::Ecc { uuid } => write!(f, "ecc {uuid}"),
            Fault::Lost { uuid } => write!(f, "lost {uuid}"),
        }
    }
}

impl FromStr for Fault {
    type Err = String;

    fn from_str(line: &str) -> Result<Fault, String> {
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["xid", uuid, xid] => Ok(Fault::Xid {
                uuid: uuid.to_string(),
                xid: xid
                    .parse()
                    .map_err(|_| format!("{line:?}: the XID {xid:?} is not a number"))?,
            }),
            ["ecc", uuid] => Ok(Fault::Ecc {
                uuid: uuid.to_string(),
            }),
            ["lost", uuid] => Ok(Fault::Lost {
                uuid: uuid.to_string(),
            }),
            _ => Err(format!(
                "{line:?} is not `xid <uuid> <n>`, `ecc <uuid>` or `lost <uuid>`"
            )),
        }
    }
}

/// The fault file, read from where the last reading stopped.
#[derive(Debug)]
pub struct FaultFile {
    path: PathBuf,
    offset: u64,
}

impl FaultFile {
    pub fn new(path: PathBuf) -> FaultFile {
        FaultFile { path, offset: 0 }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The faults on the lines completed since the last reading, in order (a
    /// line not yet ended by its newline waits for the next reading); blank
    /// lines and `#` comments are skipped, a line that does not parse is an
    /// `Err` naming it. A file not there yet has nothing to say; one that
    /// shrank was written anew and is read from its start.
    pub fn read_new(&mut self) -> std::io::Result<Vec<Result<Fault, String>>> {
        let mut file = match std::fs::File::open(&self.path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        if file.metadata()?.len() < self.offset {
            self.offset = 0;
        }
        file.seek(SeekFrom::Start(self.offset))?;
        let mut appended = Vec::new();
        file.read_to_end(&mut appended)?;
        let Some(end) = appended.iter().rposition(|b| *b == b'\n') else {
            return Ok(Vec::new());
        };
        self.offset += end as u64 + 1;
        Ok(String::from_utf8_lossy(&appended[..end])
            .lines()
            .map(str::trim)
            .filter(|line| !line.is_empty() && !line.starts_with('#'))
            .map(str::parse)
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn lines_are_read_once_in_order_and_only_when_complete() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("faults");
        let mut faults = FaultFile::new(path.clone());
        assert_eq!(faults.read_new().unwrap(), vec![], "no file yet");

        let mut file = std::fs::File::create(&path).unwrap();
        write!(file, "# a comment\nxid GPU-1 79\n\necc GPU-2\nlost GP").unwrap();
        assert_eq!(
            faults.read_new().unwrap(),
            vec![
                Ok(Fault::Xid {
                    uuid: "GPU-1".into(),
                    xid: 79
                }),
                Ok(Fault::Ecc {
                    uuid: "GPU-2".into()
                }),
            ]
        );
        assert_eq!(faults.read_new().unwrap(), vec![], "the last line is open");
        write!(file, "U-3\nxid GPU-1 x\n").unwrap();
        let read = faults.read_new().unwrap();
        assert_eq!(
            read[0],
            Ok(Fault::Lost {
                uuid: "GPU-3".into()
            })
        );
        assert!(read[1].as_ref().unwrap_err().contains("not a number"));
        assert_eq!(faults.read_new().unwrap(), vec![]);

        // Written anew, shorter: read from the start.
        std::fs::write(&path, "lost GPU-4\n").unwrap();
        assert_eq!(
            faults.read_new().unwrap(),
            vec![Ok(Fault::Lost {
                uuid: "GPU-4".into()
            })]
        );
    }

    #[test]
    fn a_fault_prints_as_the_line_it_parses_from() {
        for line in ["xid GPU-1 13", "ecc MIG-2", "lost GPU-3"] {
            assert_eq!(line.parse::<Fault>().unwrap().to_string(), line);
        }
        assert!("reset GPU-1".parse::<Fault>().is_err());
        assert!("xid GPU-1".parse::<Fault>().is_err());
    }
}

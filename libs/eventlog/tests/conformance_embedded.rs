//! The conformance suite on the embedded backend.

use switchyard_eventlog::embedded::{EmbeddedLog, EmbeddedOptions};

async fn embedded() -> (EmbeddedLog, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("temp dir");
    let log = EmbeddedLog::open(dir.path(), EmbeddedOptions::default()).expect("open embedded log");
    (log, dir)
}

switchyard_eventlog::conformance_suite!(embedded());

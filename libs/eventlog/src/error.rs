use std::path::PathBuf;

/// Failures of the log. Domain refusals live in the cores; these are about storage.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// The optimistic-concurrency check failed: somebody else appended first.
    /// Reload the subject, decide again, retry.
    #[error("conflict on subject {subject}: expected last sequence {expected}, but it is {actual}")]
    Conflict {
        subject: String,
        expected: u64,
        /// The subject's actual last sequence, where the backend reports it.
        actual: String,
    },

    #[error("invalid subject {subject:?}: {expected}")]
    InvalidSubject { subject: String, expected: String },

    #[error("invalid event {id:?} field {field}: {expected}")]
    InvalidEvent {
        id: String,
        field: &'static str,
        expected: String,
    },

    #[error("event {id:?}: the encoded record is {size} bytes, over the limit of {limit} bytes")]
    Oversize {
        id: String,
        size: usize,
        limit: usize,
    },

    #[error("batch of {count} events for subject {subject}: {expected}")]
    InvalidBatch {
        subject: String,
        count: usize,
        expected: String,
    },

    #[error(
        "event log directory {dir} is in use by another writer ({holder}); stop it or use another --data-dir"
    )]
    Locked { dir: PathBuf, holder: String },

    /// Damage that is not a torn tail: the log is not opened rather than
    /// silently skipping records.
    #[error("corrupt event log: segment {segment}, byte offset {offset}: {what}")]
    Corrupt {
        segment: PathBuf,
        offset: u64,
        what: String,
    },

    // The I/O error is part of the message (not a `#[source]`), so printing the
    // error alone tells the whole story.
    #[error("{context}: {error}")]
    Io {
        context: String,
        error: std::io::Error,
    },

    #[error("NATS JetStream {operation}: {message}")]
    Nats { operation: String, message: String },

    #[error("the event log is closed")]
    Closed,
}

impl LogError {
    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> LogError {
        let context = context.into();
        move |error| LogError::Io { context, error }
    }

    pub(crate) fn nats(operation: impl Into<String>, err: impl std::fmt::Display) -> LogError {
        LogError::Nats {
            operation: operation.into(),
            message: err.to_string(),
        }
    }

    /// A short, stable label for metrics.
    pub fn metric_label(&self) -> &'static str {
        match self {
            LogError::Conflict { .. } => "conflict",
            LogError::InvalidSubject { .. } => "invalid_subject",
            LogError::InvalidEvent { .. } => "invalid_event",
            LogError::Oversize { .. } => "oversize",
            LogError::InvalidBatch { .. } => "invalid_batch",
            LogError::Locked { .. } => "locked",
            LogError::Corrupt { .. } => "corrupt",
            LogError::Io { .. } => "io",
            LogError::Nats { .. } => "nats",
            LogError::Closed => "closed",
        }
    }
}

//! Subjects, the event a writer hands in, the record a reader gets back.

use bytes::Bytes;
use prost::Message;
use switchyard_proto::v1::{DomainEvent, Envelope, LeaderTerm, SCHEMA_VERSION, TraceContext};

use crate::{Expected, LogError, MAX_BATCH_EVENTS, MAX_RECORD_BYTES};

const MAX_SUBJECT_LEN: usize = 255;
const MAX_ID_LEN: usize = 128;
const MAX_TRACESTATE_LEN: usize = 512;

/// An aggregate's name, e.g. `node.worker-1`: dot-separated tokens of ASCII
/// letters, digits, `-` and `_`. The same rules as a NATS subject token, so one
/// subject means the same aggregate on both backends.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Subject(String);

impl Subject {
    pub fn new(subject: impl Into<String>) -> Result<Self, LogError> {
        let subject = subject.into();
        let invalid = |expected: &str| LogError::InvalidSubject {
            subject: subject.clone(),
            expected: expected.to_string(),
        };
        if subject.is_empty() || subject.len() > MAX_SUBJECT_LEN {
            return Err(invalid(&format!("1 to {MAX_SUBJECT_LEN} characters")));
        }
        if subject.split('.').any(str::is_empty) {
            return Err(invalid("dot-separated tokens, none of them empty"));
        }
        if let Some(c) = subject
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
        {
            return Err(invalid(&format!(
                "only ASCII letters, digits, '-', '_' and '.', found {c:?}"
            )));
        }
        Ok(Subject(subject))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Subject {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for Subject {
    type Err = LogError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Subject::new(s)
    }
}

/// The payload of a new event.
#[derive(Clone, Debug, PartialEq)]
pub enum Payload {
    /// A domain event of this build's schema.
    Domain(DomainEvent),
    /// An already-encoded payload, e.g. one copied from a newer writer's log.
    /// Stored as given; readers that do not know it keep it raw.
    Raw {
        event_type: String,
        schema_version: u32,
        bytes: Bytes,
    },
}

/// An event as a writer hands it to [`crate::EventLog::append`].
#[derive(Clone, Debug, PartialEq)]
pub struct NewEvent {
    /// Unique id; the de-duplication key. Visible ASCII, at most 128 bytes.
    pub id: String,
    /// Recorded time in Unix nanoseconds, read at the edge, never in a core.
    pub recorded_at_unix_nanos: i64,
    pub correlation_id: String,
    pub causation_id: String,
    pub actor: String,
    pub trace: Option<TraceContext>,
    pub payload: Payload,
    /// The writer's term as its service's leader, if it runs elected (see
    /// [`crate::fence`]).
    pub term: Option<LeaderTerm>,
}

impl NewEvent {
    /// A domain event with the given id and time; the other fields empty.
    pub fn new(id: impl Into<String>, recorded_at_unix_nanos: i64, event: DomainEvent) -> Self {
        NewEvent {
            id: id.into(),
            recorded_at_unix_nanos,
            correlation_id: String::new(),
            causation_id: String::new(),
            actor: String::new(),
            trace: None,
            payload: Payload::Domain(event),
            term: None,
        }
    }

    pub fn with_actor(mut self, actor: impl Into<String>) -> Self {
        self.actor = actor.into();
        self
    }

    pub fn with_correlation(mut self, correlation_id: impl Into<String>) -> Self {
        self.correlation_id = correlation_id.into();
        self
    }

    pub fn with_causation(mut self, causation_id: impl Into<String>) -> Self {
        self.causation_id = causation_id.into();
        self
    }

    /// Checks the fields that do not depend on the log's state.
    pub(crate) fn validate(&self) -> Result<(), LogError> {
        let invalid = |field, expected: &str| LogError::InvalidEvent {
            id: self.id.clone(),
            field,
            expected: expected.to_string(),
        };
        if self.id.is_empty() || self.id.len() > MAX_ID_LEN {
            return Err(invalid("id", "1 to 128 characters"));
        }
        if !self.id.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(invalid("id", "visible ASCII without spaces"));
        }
        if let Some(trace) = &self.trace
            && !trace.traceparent.is_empty()
            && !is_traceparent(&trace.traceparent)
        {
            return Err(invalid(
                "trace.traceparent",
                "a W3C traceparent: 00-<32 hex>-<16 hex>-<2 hex>",
            ));
        }
        // W3C caps tracestate at 512 characters; it also travels as a NATS header,
        // outside the record's own size limit.
        if let Some(trace) = &self.trace
            && (trace.tracestate.len() > MAX_TRACESTATE_LEN
                || !trace.tracestate.bytes().all(|b| (0x20..0x7f).contains(&b)))
        {
            return Err(invalid(
                "trace.tracestate",
                "a W3C tracestate: at most 512 printable ASCII characters",
            ));
        }
        match &self.payload {
            Payload::Domain(event) if event.kind.is_none() => {
                Err(invalid("payload", "a domain event with its kind set"))
            }
            Payload::Raw { event_type, .. } if event_type.is_empty() => {
                Err(invalid("payload.event_type", "the event's type name"))
            }
            Payload::Raw {
                schema_version: 0, ..
            } => Err(invalid("payload.schema_version", "a version of 1 or more")),
            _ => Ok(()),
        }
    }

    /// Encodes the envelope without `prev_hash`, which only the log knows.
    /// See [`EncodedEvent::finish`].
    pub(crate) fn encode(&self, subject: &Subject) -> Result<EncodedEvent, LogError> {
        let (event_type, schema_version, payload) = match &self.payload {
            Payload::Domain(event) => {
                let kind = event.kind.as_ref().expect("validated");
                (
                    kind.type_name().to_string(),
                    SCHEMA_VERSION,
                    Bytes::from(event.encode_to_vec()),
                )
            }
            Payload::Raw {
                event_type,
                schema_version,
                bytes,
            } => (event_type.clone(), *schema_version, bytes.clone()),
        };
        let envelope = Envelope {
            id: self.id.clone(),
            subject: subject.as_str().to_string(),
            sequence: 0,
            recorded_at_unix_nanos: self.recorded_at_unix_nanos,
            correlation_id: self.correlation_id.clone(),
            causation_id: self.causation_id.clone(),
            actor: self.actor.clone(),
            trace: self.trace.clone(),
            schema_version,
            event_type,
            payload,
            prev_hash: Vec::new(),
            signer: String::new(),
            signature: Vec::new(),
            term: self.term.clone(),
        };
        let size = envelope.encoded_len() + PREV_HASH_FIELD_LEN + SIGNATURE_FIELDS_LEN;
        if size > MAX_RECORD_BYTES {
            return Err(LogError::Oversize {
                id: self.id.clone(),
                size,
                limit: MAX_RECORD_BYTES,
            });
        }
        Ok(EncodedEvent {
            id: self.id.clone(),
            without_prev: envelope.encode_to_vec(),
            signer: None,
        })
    }
}

/// Tag byte of `Envelope.prev_hash` (field 12, length-delimited) and its length.
const PREV_HASH_TAG: u8 = (12 << 3) | 2;
const PREV_HASH_FIELD_LEN: usize = 2 + 32;
/// Tag bytes of `Envelope.signer` (13) and `Envelope.signature` (14), both
/// length-delimited; an NKey public key is 56 characters, a signature 64 bytes.
const SIGNER_TAG: u8 = (13 << 3) | 2;
const SIGNATURE_TAG: u8 = (14 << 3) | 2;
const SIGNATURE_LEN: usize = 64;
const SIGNATURE_FIELD_LEN: usize = 2 + SIGNATURE_LEN;
const SIGNATURE_FIELDS_LEN: usize = 2 + 56 + SIGNATURE_FIELD_LEN;

/// The key a writer signs its records with (an NKey: ed25519).
pub type SigningKey = std::sync::Arc<nkeys::KeyPair>;

/// An envelope encoded by the writer, waiting for the log to supply `prev_hash`.
#[derive(Clone, Debug)]
pub(crate) struct EncodedEvent {
    pub id: String,
    without_prev: Vec<u8>,
    /// Signs the stored bytes, when the writer signs.
    pub signer: Option<SigningKey>,
}

impl EncodedEvent {
    /// The stored bytes: the envelope as the writer encoded it, then
    /// `prev_hash`, `signer` and `signature`, in this order — exactly the
    /// bytes prost produces for the whole envelope, but for `term` (field
    /// 15, which prost would put last) coming before them; protobuf takes
    /// fields in any order. The writer's encoding work stays off the log's
    /// critical section. The signature covers every byte before it.
    pub(crate) fn finish(&self, prev_hash: Option<&[u8; 32]>) -> Bytes {
        Bytes::from(self.body_parts(prev_hash).concat())
    }

    /// The stored bytes in two pieces, for writers that copy them anyway.
    pub(crate) fn body_parts<'a>(&'a self, prev_hash: Option<&[u8; 32]>) -> BodyParts<'a> {
        let mut tail = Vec::with_capacity(PREV_HASH_FIELD_LEN + SIGNATURE_FIELDS_LEN);
        if let Some(hash) = prev_hash {
            tail.extend_from_slice(&[PREV_HASH_TAG, 32]);
            tail.extend_from_slice(hash);
        }
        let Some(key) = &self.signer else {
            return BodyParts {
                envelope: &self.without_prev,
                tail,
            };
        };
        let public = key.public_key();
        tail.extend_from_slice(&[SIGNER_TAG, public.len() as u8]);
        tail.extend_from_slice(public.as_bytes());
        let mut signed = Vec::with_capacity(self.without_prev.len() + tail.len() + 66);
        signed.extend_from_slice(&self.without_prev);
        signed.extend_from_slice(&tail);
        let signature = key.sign(&signed).expect("a key pair with its seed signs");
        signed.extend_from_slice(&[SIGNATURE_TAG, SIGNATURE_LEN as u8]);
        signed.extend_from_slice(&signature);
        BodyParts {
            envelope: &[],
            tail: signed,
        }
    }

    pub(crate) fn encoded_len(&self) -> usize {
        self.without_prev.len() + PREV_HASH_FIELD_LEN + SIGNATURE_FIELDS_LEN
    }
}

/// An envelope's stored bytes: the envelope as the writer encoded it, then
/// the fields only the log adds (or, signed, all of it in `tail`).
pub(crate) struct BodyParts<'a> {
    envelope: &'a [u8],
    tail: Vec<u8>,
}

impl<'a> BodyParts<'a> {
    pub(crate) fn concat(&self) -> Vec<u8> {
        self.as_slices().concat()
    }

    pub(crate) fn as_slices(&self) -> [&[u8]; 2] {
        [self.envelope, &self.tail]
    }
}

/// Who signed a record, as its bytes show.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Signature {
    /// No signature: written by a writer without a key (or forged).
    Unsigned,
    /// Signed by the key `signer` (an NKey public key), and the signature
    /// holds over the stored bytes.
    Valid { signer: String },
    /// A signature that does not hold, or is not where the log puts it.
    Invalid { signer: String, why: String },
}

fn is_traceparent(value: &str) -> bool {
    let parts: Vec<&str> = value.split('-').collect();
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    parts.len() == 4
        && hex(parts[0], 2)
        && hex(parts[1], 32)
        && hex(parts[2], 16)
        && hex(parts[3], 2)
}

/// A record read back from the log.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredEvent {
    /// Position in the whole log (starting at 1).
    pub sequence: u64,
    /// The decoded envelope, with `sequence` filled in.
    pub envelope: Envelope,
    /// The stored bytes, exactly as appended.
    pub raw: Bytes,
    /// Why the stored bytes are not an envelope, for a record some other
    /// client published on the log's subjects: `envelope` is then empty but
    /// for its sequence and subject, and [`StoredEvent::decode`] says so.
    pub malformed: Option<String>,
}

impl StoredEvent {
    pub(crate) fn from_raw(sequence: u64, raw: Bytes) -> Result<Self, prost::DecodeError> {
        let mut envelope = Envelope::decode(raw.clone())?;
        envelope.sequence = sequence;
        Ok(StoredEvent {
            sequence,
            envelope,
            raw,
            malformed: None,
        })
    }

    /// The record at `sequence`, stored on `subject`, whatever its bytes are:
    /// bytes that are no envelope give a record readers pass over (its
    /// [`Decoded::Unknown`] says why) rather than an error that would stop
    /// them at it for good — the log denies deleting it.
    pub fn from_stored(sequence: u64, subject: &str, raw: Bytes) -> Self {
        Self::from_raw(sequence, raw.clone()).unwrap_or_else(|err| StoredEvent {
            sequence,
            envelope: Envelope {
                sequence,
                subject: subject.to_string(),
                ..Envelope::default()
            },
            raw,
            malformed: Some(format!("the record does not decode as an Envelope: {err}")),
        })
    }

    /// BLAKE3 of the stored bytes; the next record of the subject carries it.
    pub fn hash(&self) -> [u8; 32] {
        *blake3::hash(&self.raw).as_bytes()
    }

    /// Whether the record is signed, and whether the signature holds: it
    /// must be the record's last field and cover every stored byte before it.
    pub fn signature(&self) -> Signature {
        let envelope = &self.envelope;
        if self.malformed.is_some() || (envelope.signer.is_empty() && envelope.signature.is_empty())
        {
            return Signature::Unsigned;
        }
        let signer = envelope.signer.clone();
        let invalid = |why: &str| Signature::Invalid {
            signer: signer.clone(),
            why: why.to_string(),
        };
        let raw = &self.raw[..];
        let Some(signed_len) = raw.len().checked_sub(SIGNATURE_FIELD_LEN) else {
            return invalid("the record is shorter than a signature");
        };
        if raw[signed_len..signed_len + 2] != [SIGNATURE_TAG, SIGNATURE_LEN as u8]
            || raw[signed_len + 2..] != envelope.signature[..]
        {
            return invalid("the signature is not the record's last field");
        }
        let key = match nkeys::KeyPair::from_public_key(&signer) {
            Ok(key) => key,
            Err(err) => return invalid(&format!("the signer is not a public key: {err}")),
        };
        match key.verify(&raw[..signed_len], &envelope.signature) {
            Ok(()) => Signature::Valid { signer },
            Err(_) => invalid("the signature does not hold over the record's bytes"),
        }
    }

    /// The payload as a domain event, or the reason it is kept raw.
    pub fn decode(&self) -> Decoded {
        let envelope = &self.envelope;
        if let Some(why) = &self.malformed {
            return Decoded::Unknown {
                event_type: String::new(),
                schema_version: 0,
                reason: UnknownReason::Malformed(why.clone()),
                raw: self.raw.clone(),
            };
        }
        let unknown = |reason| Decoded::Unknown {
            event_type: envelope.event_type.clone(),
            schema_version: envelope.schema_version,
            reason,
            raw: envelope.payload.clone(),
        };
        if envelope.schema_version > SCHEMA_VERSION || envelope.schema_version == 0 {
            return unknown(UnknownReason::UnsupportedSchema {
                supported: SCHEMA_VERSION,
            });
        }
        match DomainEvent::decode(envelope.payload.clone()) {
            Err(err) => unknown(UnknownReason::Undecodable(err.to_string())),
            Ok(DomainEvent { kind: None }) => unknown(UnknownReason::UnknownType),
            Ok(event) => {
                let name = event
                    .kind
                    .as_ref()
                    .map(|k| k.type_name())
                    .unwrap_or_default();
                if name != envelope.event_type {
                    unknown(UnknownReason::Undecodable(format!(
                        "event_type says {} but the payload is {name}",
                        envelope.event_type
                    )))
                } else {
                    Decoded::Event(event)
                }
            }
        }
    }
}

/// A record's payload, decoded when this build understands it.
#[derive(Clone, Debug, PartialEq)]
pub enum Decoded {
    Event(DomainEvent),
    /// Kept as raw bytes with its type name; never dropped.
    Unknown {
        event_type: String,
        schema_version: u32,
        reason: UnknownReason,
        raw: Bytes,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UnknownReason {
    /// Written with a schema version this build does not know.
    UnsupportedSchema { supported: u32 },
    /// An event type added after this build.
    UnknownType,
    /// The payload does not decode as the type it claims to be.
    Undecodable(String),
    /// The record is no envelope at all: something other than a writer of
    /// the log published it on the log's subjects.
    Malformed(String),
    /// The record's signature does not vouch for the author it names (a
    /// reader with a keyring says so; the log itself does not judge).
    Unauthenticated(String),
}

impl std::fmt::Display for UnknownReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            UnknownReason::UnsupportedSchema { supported } => {
                write!(
                    f,
                    "schema version not supported (this build reads 1 to {supported})"
                )
            }
            UnknownReason::UnknownType => f.write_str("event type unknown to this build"),
            UnknownReason::Undecodable(msg) => write!(f, "payload does not decode: {msg}"),
            UnknownReason::Malformed(msg) => f.write_str(msg),
            UnknownReason::Unauthenticated(msg) => write!(f, "authorship: {msg}"),
        }
    }
}

/// Checks a batch before it reaches the writer, so bad input fails fast and whole.
/// The subjects of a batch, each once, in the order they first appear: how a
/// batch names itself in errors.
pub(crate) fn batch_subjects<T>(events: &[(Subject, T)]) -> Vec<&Subject> {
    let mut subjects: Vec<&Subject> = Vec::new();
    for (subject, _) in events {
        if !subjects.contains(&subject) {
            subjects.push(subject);
        }
    }
    subjects
}

/// What a batch names itself by in errors: its subject, or its subjects.
pub(crate) fn batch_label<T>(events: &[(Subject, T)]) -> String {
    batch_subjects(events)
        .iter()
        .map(|s| s.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

pub(crate) fn validate_batch(
    events: &[(Subject, NewEvent)],
    expected: &[(Subject, Expected)],
) -> Result<(), LogError> {
    let invalid = |expected: String| LogError::InvalidBatch {
        subject: batch_label(events),
        count: events.len(),
        expected,
    };
    if events.is_empty() {
        return Err(invalid("at least one event".into()));
    }
    if events.len() > MAX_BATCH_EVENTS {
        return Err(invalid(format!(
            "at most {MAX_BATCH_EVENTS} events per append"
        )));
    }
    let mut seen = std::collections::BTreeSet::new();
    for (_, event) in events {
        event.validate()?;
        if events.len() > 1 && !seen.insert(event.id.as_str()) {
            return Err(invalid(format!(
                "unique event ids, but {:?} appears twice",
                event.id
            )));
        }
    }
    let subjects = batch_subjects(events);
    let mut checked = std::collections::BTreeSet::new();
    for (subject, _) in expected {
        if !subjects.contains(&subject) {
            return Err(invalid(format!(
                "expectations only for the batch's subjects, but one names {subject}"
            )));
        }
        if !checked.insert(subject.as_str()) {
            return Err(invalid(format!(
                "at most one expectation per subject, but {subject} has two"
            )));
        }
    }
    Ok(())
}

/// The expectation `expected` holds for `subject` ([`Expected::Any`] if none).
pub(crate) fn expectation_of(expected: &[(Subject, Expected)], subject: &Subject) -> Expected {
    expected
        .iter()
        .find(|(s, _)| s == subject)
        .map_or(Expected::Any, |(_, e)| *e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_follow_nats_token_rules() {
        assert!(Subject::new("node.worker-1").is_ok());
        assert!(Subject::new("node.ip-10-0-0-1.ec2.internal").is_ok());
        for bad in [
            "", "node..a", ".node", "node.", "node.*", "node.>", "a b", "ä",
        ] {
            let err = Subject::new(bad).unwrap_err().to_string();
            assert!(err.contains("invalid subject"), "{bad:?}: {err}");
        }
        assert!(Subject::new("a".repeat(256)).is_err());
    }

    #[test]
    fn finish_appends_prev_hash_exactly_as_prost_encodes_it() {
        use switchyard_proto::v1::{NodeRemoved, domain_event::Kind};
        let event = NewEvent::new(
            "e1",
            5,
            Kind::NodeRemoved(NodeRemoved { node: "n1".into() }).into(),
        )
        .with_actor("inventory");
        let subject = Subject::new("node.n1").unwrap();
        let encoded = event.encode(&subject).unwrap();
        let hash = [7u8; 32];
        let stored = encoded.finish(Some(&hash));
        let mut envelope = Envelope::decode(stored.clone()).unwrap();
        assert_eq!(&envelope.prev_hash[..], &hash);
        assert_eq!(envelope.encode_to_vec(), stored.to_vec());
        envelope.prev_hash = Vec::new();
        assert_eq!(envelope.encode_to_vec(), encoded.finish(None).to_vec());
    }

    #[test]
    fn oversize_payload_names_the_limit() {
        let event = NewEvent {
            payload: Payload::Raw {
                event_type: "Big".into(),
                schema_version: 1,
                bytes: Bytes::from(vec![0u8; MAX_RECORD_BYTES]),
            },
            ..NewEvent::new("big-1", 0, DomainEvent::default())
        };
        let err = event
            .encode(&Subject::new("s").unwrap())
            .unwrap_err()
            .to_string();
        assert!(err.contains("big-1") && err.contains("262144"), "{err}");
    }

    #[test]
    fn traceparent_shape_is_checked() {
        assert!(is_traceparent(
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        ));
        assert!(!is_traceparent("00-xyz-00f067aa0ba902b7-01"));
    }
}

//! Any bytes as a stored record, the way both backends read one: decoding
//! never panics; a record that is no envelope is kept, marked malformed, and
//! read as `Unknown`; a decoded event is the type its envelope names; the
//! signature check and a keyring's verdict never panic, and a record the
//! keyring accepts has a valid signature.
//!
//! Run: `scripts/fuzz.sh` (all targets), or
//! `cd libs/eventlog/fuzz && cargo +nightly fuzz run envelope -- -max_total_time=60`

#![no_main]

use std::collections::BTreeMap;
use std::sync::OnceLock;

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use switchyard_eventlog::keys::Keyring;
use switchyard_eventlog::{Decoded, Signature, StoredEvent, UnknownReason};

/// The public key of the seeds' signed records (see `examples/seeds.rs`).
const SEED_SIGNER: &str = "UDVEU3DD4KOFECV66VIHWEZOYX4ZKR3WV27L464SIIPOU2IUI3JCYSJF";

fn keyring() -> &'static Keyring {
    static KEYRING: OnceLock<Keyring> = OnceLock::new();
    KEYRING.get_or_init(|| {
        Keyring::from_identities(
            "fuzz",
            BTreeMap::from([("inventory".to_string(), vec![SEED_SIGNER.to_string()])]),
        )
        .expect("the seed signer is a user key")
    })
}

fn is_service(name: &str) -> bool {
    ["inventory", "stack-assigner"].contains(&name)
}

fuzz_target!(|data: &[u8]| {
    let raw = Bytes::copy_from_slice(data);
    let record = StoredEvent::from_stored(7, "node.n1", raw.clone());
    assert_eq!(record.sequence, 7);
    assert_eq!(record.envelope.sequence, 7);
    assert_eq!(record.raw, raw);
    let _ = record.hash();

    match record.decode() {
        Decoded::Event(event) => {
            assert!(record.malformed.is_none());
            let kind = event.kind.as_ref().expect("a decoded event has its kind");
            assert_eq!(kind.type_name(), record.envelope.event_type);
        }
        Decoded::Unknown { reason, .. } => {
            assert_eq!(
                matches!(reason, UnknownReason::Malformed(_)),
                record.malformed.is_some()
            );
            let _ = reason.to_string();
        }
    }

    let signature = record.signature();
    if record.malformed.is_some() {
        assert_eq!(signature, Signature::Unsigned);
    }
    if keyring().check(&record, is_service).is_ok() {
        assert!(
            matches!(signature, Signature::Valid { .. }),
            "{signature:?}"
        );
    }
});

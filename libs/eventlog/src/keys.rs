//! Who may write the log: the public keys of every identity (each service by
//! its name, each operator by theirs), published with the chart; and the
//! check of a record's authorship against them, offline.
//!
//! A keyring file is YAML (or JSON), an identity's keys newest first:
//!
//! ```yaml
//! inventory: [UDXU4RCSJNZOIQHZNWXHXORDPRTGNJAHAHFRGZNEEJCPQTT2M7NLCNF4]
//! stack-assigner: [UB..., UC...]   # rotated: the old key still verifies older records
//! ops@example.com: [UA...]
//! ```
//!
//! Keys rotate by adding the new key in front of the old: records signed
//! with either keep verifying; a key removed no longer vouches for anything.

use std::collections::BTreeMap;
use std::path::Path;

use crate::{Signature, StoredEvent};

/// Public keys by identity, and identity by key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Keyring {
    by_key: BTreeMap<String, String>,
}

/// Why a keyring cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum KeyringError {
    #[error("read keyring {path}: {message}")]
    Read { path: String, message: String },
    #[error("keyring {path}: identity {identity:?}: key {key:?}: {message}")]
    Key {
        path: String,
        identity: String,
        key: String,
        message: String,
    },
    #[error("keyring {path}: key {key} is listed for both {first:?} and {second:?}")]
    Shared {
        path: String,
        key: String,
        first: String,
        second: String,
    },
}

impl Keyring {
    /// Reads a keyring file; every key must be an NKey user public key
    /// (`U...`) and belong to one identity only.
    pub fn load(path: &Path) -> Result<Keyring, KeyringError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| KeyringError::Read {
            path: shown.clone(),
            message: e.to_string(),
        })?;
        let identities: BTreeMap<String, Vec<String>> =
            serde_yaml_ng::from_str(&text).map_err(|e| KeyringError::Read {
                path: shown.clone(),
                message: format!("expected a map of identity to a list of public keys: {e}"),
            })?;
        Keyring::from_identities(&shown, identities)
    }

    /// A keyring from identities and their keys; `source` names it in errors.
    pub fn from_identities(
        source: &str,
        identities: BTreeMap<String, Vec<String>>,
    ) -> Result<Keyring, KeyringError> {
        let mut by_key: BTreeMap<String, String> = BTreeMap::new();
        for (identity, keys) in identities {
            for key in keys {
                let bad = |message: String| KeyringError::Key {
                    path: source.to_string(),
                    identity: identity.clone(),
                    key: key.clone(),
                    message,
                };
                let pair = nkeys::KeyPair::from_public_key(&key)
                    .map_err(|e| bad(format!("not an NKey public key: {e}")))?;
                if pair.key_pair_type() != nkeys::KeyPairType::User {
                    return Err(bad("expected a user key (U...)".into()));
                }
                if let Some(first) = by_key.get(&key) {
                    return Err(KeyringError::Shared {
                        path: source.to_string(),
                        key: key.clone(),
                        first: first.clone(),
                        second: identity.clone(),
                    });
                }
                by_key.insert(key, identity.clone());
            }
        }
        Ok(Keyring { by_key })
    }

    /// The identity a public key belongs to.
    pub fn identity_of(&self, key: &str) -> Option<&str> {
        self.by_key.get(key).map(String::as_str)
    }

    /// Who wrote `record`, if its signature holds and its key is known and
    /// vouches for the record's actor: a record that names a service as its
    /// actor must be signed by that service; one that names a person (an
    /// operator's command, recorded by the service that took it) by a
    /// service (`is_service` tells which identities are services).
    pub fn check(
        &self,
        record: &StoredEvent,
        is_service: impl Fn(&str) -> bool,
    ) -> Result<String, String> {
        let signer = match record.signature() {
            Signature::Unsigned => return Err("not signed".into()),
            Signature::Invalid { signer, why } => {
                return Err(format!("signature of {signer} does not hold: {why}"));
            }
            Signature::Valid { signer } => signer,
        };
        let Some(identity) = self.identity_of(&signer) else {
            return Err(format!("signed by {signer}, a key of no known identity"));
        };
        let actor = &record.envelope.actor;
        if is_service(actor) && identity != actor {
            return Err(format!(
                "claims to be written by {actor} but is signed by {identity}"
            ));
        }
        if !is_service(actor) && !is_service(identity) {
            return Err(format!(
                "written for {actor:?} and signed by {identity}, which is not a service"
            ));
        }
        Ok(identity.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{NewEvent, Subject};
    use std::sync::Arc;
    use switchyard_proto::v1::{NodeRemoved, domain_event::Kind};

    fn record(actor: &str, key: Option<&nkeys::KeyPair>, prev: Option<&[u8; 32]>) -> StoredEvent {
        let event = NewEvent::new(
            "e1",
            5,
            Kind::NodeRemoved(NodeRemoved { node: "n1".into() }).into(),
        )
        .with_actor(actor);
        let mut encoded = event.encode(&Subject::new("node.n1").unwrap()).unwrap();
        encoded.signer = key.map(|k| Arc::new(k.clone()));
        StoredEvent::from_raw(7, encoded.finish(prev)).unwrap()
    }

    fn ring(pairs: &[(&str, &nkeys::KeyPair)]) -> Keyring {
        let mut identities: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (identity, key) in pairs {
            identities
                .entry(identity.to_string())
                .or_default()
                .push(key.public_key());
        }
        Keyring::from_identities("test", identities).unwrap()
    }

    fn is_service(name: &str) -> bool {
        ["inventory", "stack-assigner"].contains(&name)
    }

    #[test]
    fn a_signed_record_is_the_envelope_prost_encodes_and_verifies() {
        use prost::Message;
        let inventory = nkeys::KeyPair::new_user();
        let signed = record("inventory", Some(&inventory), Some(&[9u8; 32]));
        assert_eq!(
            signed.signature(),
            Signature::Valid {
                signer: inventory.public_key()
            }
        );
        // The stored bytes are exactly prost's encoding of the whole envelope
        // (`sequence` is the log's, not stored).
        let mut again = signed.envelope.clone();
        again.sequence = 0;
        assert_eq!(again.encode_to_vec(), signed.raw.to_vec());
        let keys = ring(&[("inventory", &inventory)]);
        assert_eq!(keys.check(&signed, is_service), Ok("inventory".into()));
    }

    #[test]
    fn forged_tampered_and_unknown_records_are_named() {
        let inventory = nkeys::KeyPair::new_user();
        let assigner = nkeys::KeyPair::new_user();
        let stranger = nkeys::KeyPair::new_user();
        let keys = ring(&[("inventory", &inventory), ("stack-assigner", &assigner)]);
        // Unsigned, as a writer without the key would append it.
        assert_eq!(
            keys.check(&record("inventory", None, None), is_service),
            Err("not signed".into())
        );
        // Signed by another service than it claims.
        assert_eq!(
            keys.check(&record("inventory", Some(&assigner), None), is_service),
            Err("claims to be written by inventory but is signed by stack-assigner".into())
        );
        // Signed by a key nobody published.
        let err = keys
            .check(&record("inventory", Some(&stranger), None), is_service)
            .unwrap_err();
        assert!(err.contains("a key of no known identity"), "{err}");
        // One byte changed after signing.
        let signed = record("inventory", Some(&inventory), None);
        let mut raw = signed.raw.to_vec();
        let at = raw.iter().position(|&b| b == b'n').unwrap();
        raw[at] = b'm';
        let tampered = StoredEvent::from_raw(7, raw.into()).unwrap();
        assert!(matches!(tampered.signature(), Signature::Invalid { .. }));
        assert!(keys.check(&tampered, is_service).is_err());
        // A person's command, recorded and signed by the service that took it.
        assert_eq!(
            keys.check(
                &record("ops@example.com", Some(&assigner), None),
                is_service
            ),
            Ok("stack-assigner".into())
        );
    }

    #[test]
    fn a_rotated_key_still_verifies_older_records() {
        let old = nkeys::KeyPair::new_user();
        let new = nkeys::KeyPair::new_user();
        let keys = ring(&[("inventory", &new), ("inventory", &old)]);
        for key in [&old, &new] {
            assert_eq!(
                keys.check(&record("inventory", Some(key), None), is_service),
                Ok("inventory".into())
            );
        }
        let shared = Keyring::from_identities(
            "test",
            BTreeMap::from([
                ("inventory".to_string(), vec![old.public_key()]),
                ("alerter".to_string(), vec![old.public_key()]),
            ]),
        );
        assert!(matches!(shared, Err(KeyringError::Shared { .. })));
    }
}

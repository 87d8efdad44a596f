//! Whether a record is what it claims: its signature holds, its key is a
//! known identity's, that identity is the actor it names (or, for an
//! operator's command, the service that took it) and writes records of its
//! kind at all. The services pass over what fails; `log verify` names it.

use switchyard_core::ServiceName;
use switchyard_core::authors::check_author;
use switchyard_eventlog::keys::Keyring;
use switchyard_eventlog::{Decoded, StoredEvent};

/// Whether an identity of the keyring is one of the services.
pub fn is_service(identity: &str) -> bool {
    identity.parse::<ServiceName>().is_ok()
}

/// The identity that wrote `record`, or why the keyring does not vouch for
/// it; `decoded` is the record's event as read already.
pub fn vouch(keyring: &Keyring, record: &StoredEvent, decoded: &Decoded) -> Result<String, String> {
    let signer = keyring.check(record, is_service)?;
    if let Decoded::Event(event) = decoded
        && let Some(kind) = &event.kind
    {
        check_author(&signer, kind)?;
    }
    Ok(signer)
}

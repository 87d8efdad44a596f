//! The observers' core — inventory's, and the node agents' for their GPUs: a
//! fact is recorded once, unless it repeats the last report of its object.

use std::collections::BTreeMap;

use prost::Message;
use switchyard_proto::v1::{DomainEvent, domain_event::Kind};

use crate::service::ServiceName;
use crate::subjects::subject_of;

/// Which observer reports a fact: node agents report their GPUs, inventory the rest.
pub fn observer_of(fact: &DomainEvent) -> ServiceName {
    match fact.kind {
        Some(Kind::PhysicalGpuObserved(_) | Kind::PhysicalGpuRemoved(_)) => ServiceName::NodeAgent,
        _ => ServiceName::Inventory,
    }
}

/// Whether the event is an observer's report of the cluster (not a decision):
/// a kind only the observers write ([`crate::authors`]).
pub fn is_fact(event: &DomainEvent) -> bool {
    event
        .kind
        .as_ref()
        .is_some_and(crate::authors::is_observation)
}

/// Inventory's and the node agents' memory of what they last reported per
/// object: an observation that changes nothing is not appended again.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Observer {
    /// Subject -> BLAKE3 of the last fact reported for it.
    last: BTreeMap<String, [u8; 32]>,
}

impl Observer {
    /// The fact to append, or `None` if it repeats the last report of its object.
    pub fn observe(&mut self, fact: DomainEvent) -> Option<DomainEvent> {
        let subject = subject_of(&fact);
        let removal = matches!(
            fact.kind,
            Some(
                Kind::NodeRemoved(_)
                    | Kind::PodRemoved(_)
                    | Kind::PhysicalGpuRemoved(_)
                    | Kind::NodeGroupRemoved(_)
                    | Kind::ResourceSliceRemoved(_)
                    | Kind::DeviceClassRemoved(_)
                    | Kind::GpuClassRemoved(_)
                    | Kind::ResourceClaimRemoved(_)
                    | Kind::WorkloadRemoved(_)
            )
        );
        if removal {
            return self.last.remove(&subject).map(|_| fact);
        }
        let hash = *blake3::hash(&fact.encode_to_vec()).as_bytes();
        if self.last.get(&subject) == Some(&hash) {
            return None;
        }
        self.last.insert(subject, hash);
        Some(fact)
    }
}

/// An observing service (inventory or a node agent) as a core: it decides
/// nothing on the log; an observation is recorded unless it repeats.
#[derive(Clone, Debug, PartialEq)]
pub struct ObserverCore {
    pub(crate) service: ServiceName,
    pub(crate) observer: Observer,
}

impl ObserverCore {
    pub fn new(service: ServiceName) -> Self {
        ObserverCore {
            service,
            observer: Observer::default(),
        }
    }
}

//! What every service's core is given: the six services by name, the inputs
//! a core decides on, and the records it writes. The [`crate::cores::Core`]
//! trait the runtime hosts, and which core is which service's, are in
//! [`crate::cores`].

use switchyard_proto::v1::DomainEvent;

use crate::command::Command;
pub use crate::service_name::{ServiceName, UnknownService};

/// One record for the log: who wrote it and what.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    pub actor: ServiceName,
    pub event: DomainEvent,
}

/// What a core decides on.
#[derive(Clone, Copy, Debug)]
pub enum Input<'a> {
    /// A fact seen in the cluster, for its observer: recorded unless it repeats.
    Observed(&'a DomainEvent),
    /// A record of the log written by another service (or a person).
    Record(&'a DomainEvent),
    /// An operator's command.
    Command(&'a Command),
    /// Time passed (deadlines).
    Tick,
}

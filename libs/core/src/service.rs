//! The shape every service's core shares: the six services by name, the
//! inputs a core decides on, and the one [`Core`] trait — fold a record,
//! decide on an input, catch up after a rebuild, the effects still wanted —
//! that the runtime hosts, whichever service it is. Which core is which
//! service's is in [`crate::cores`].

use std::any::Any;

use switchyard_proto::v1::DomainEvent;

use crate::command::Command;
use crate::effects::Effect;
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

/// The one shape of every service's core: deterministic, no I/O, time as data.
pub trait Core: Send + 'static {
    /// The service this core decides for.
    fn service(&self) -> ServiceName;
    /// Folds a record of the log, its own or another's, without deciding:
    /// the rebuild of a (re)started service. `at` is its recorded time.
    fn fold(&mut self, event: &DomainEvent, at: i64);
    /// Decides on an input (a record is folded first); the decisions are
    /// folded already and go to the log in this order.
    fn decide(&mut self, input: Input<'_>, now: i64) -> Vec<DomainEvent>;
    /// After a rebuild: the decisions the log shows due but not recorded
    /// (a late start, or a stop between appends), folded.
    fn catch_up(&mut self, now: i64) -> Vec<DomainEvent>;
    /// What the edge should be doing now: a function of the state, so after
    /// a restart the effects are simply issued again.
    fn effects(&self) -> Vec<Effect>;
    /// Invariant violations the core sees in its own state, by invariant.
    fn violations(&self) -> Vec<(&'static str, String)> {
        Vec::new()
    }
    /// A copy of the state, for checks and reports (the simulator's
    /// invariants, `switchyard demo`): downcast to the core's own type.
    fn snapshot(&self) -> Box<dyn Any + Send>;
}

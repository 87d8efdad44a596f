//! The shape every service's core shares: the six services by name, the
//! inputs a core decides on, and the one [`Core`] trait — fold a record,
//! decide on an input, catch up after a rebuild, the effects still wanted —
//! that the runtime hosts, whichever service it is. Which core is which
//! service's is in [`crate::cores`].

use std::any::Any;
use std::fmt;
use std::str::FromStr;

use switchyard_proto::v1::{DomainEvent, domain_event::Kind};

use crate::command::Command;
use crate::effects::Effect;

/// The six services of Switchyard.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ServiceName {
    Inventory,
    NodeAgent,
    StackAssigner,
    ClassCompiler,
    ClaimAllocator,
    Alerter,
}

impl ServiceName {
    /// Every service, in the order the runtime lists them.
    pub const ALL: [ServiceName; 6] = [
        ServiceName::Inventory,
        ServiceName::NodeAgent,
        ServiceName::StackAssigner,
        ServiceName::ClassCompiler,
        ServiceName::ClaimAllocator,
        ServiceName::Alerter,
    ];

    /// The services that decide on the log, in the order they see a record:
    /// fixed, so the log is too.
    pub const DISPATCH_ORDER: [ServiceName; 4] = [
        ServiceName::StackAssigner,
        ServiceName::ClassCompiler,
        ServiceName::ClaimAllocator,
        ServiceName::Alerter,
    ];

    /// The name as it appears in the log's `actor`, flags and object names.
    pub const fn as_str(self) -> &'static str {
        match self {
            ServiceName::Inventory => "inventory",
            ServiceName::NodeAgent => "node-agent",
            ServiceName::StackAssigner => "stack-assigner",
            ServiceName::ClassCompiler => "class-compiler",
            ServiceName::ClaimAllocator => "claim-allocator",
            ServiceName::Alerter => "alerter",
        }
    }
}

impl fmt::Display for ServiceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is not one of the six services.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownService(pub String);

impl fmt::Display for UnknownService {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} is not a service: expected one of inventory, node-agent, stack-assigner, class-compiler, claim-allocator, alerter",
            self.0
        )
    }
}

impl std::error::Error for UnknownService {}

impl FromStr for ServiceName {
    type Err = UnknownService;
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        ServiceName::ALL
            .into_iter()
            .find(|s| s.as_str() == name)
            .ok_or_else(|| UnknownService(name.to_string()))
    }
}

/// One record for the log: who wrote it and what.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    pub actor: ServiceName,
    pub event: DomainEvent,
}

impl Command {
    /// The service that owns the command.
    pub fn owner(&self) -> ServiceName {
        match self {
            Command::StartHandover(_) => ServiceName::StackAssigner,
            Command::MoveApplication(_)
            | Command::Complete(_)
            | Command::Migrate(_)
            | Command::ControlMigration(_)
            | Command::CheckEvidence(_) => ServiceName::ClaimAllocator,
            Command::Rollback(event) => match &event.kind {
                Some(Kind::RollbackStarted(r)) if r.node_restore.is_some() => {
                    ServiceName::StackAssigner
                }
                _ => ServiceName::ClaimAllocator,
            },
        }
    }
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

impl Effect {
    /// The service whose core wants this effect, and whose writers (field
    /// manager, permissions) carry it out.
    pub fn owner(&self) -> ServiceName {
        match self {
            Effect::Cordon { .. }
            | Effect::Uncordon { .. }
            | Effect::Drain { .. }
            | Effect::MoveToGroup { .. }
            | Effect::RestoreNode { .. }
            | Effect::NodeEvent { .. }
            | Effect::SetStackLabel { .. }
            | Effect::SetOperandLabels { .. }
            | Effect::SetNodeTaint { .. } => ServiceName::StackAssigner,
            Effect::SetPlacement { .. }
            | Effect::RestartWorkload { .. }
            | Effect::RemoveSpecGpu { .. }
            | Effect::SetQuota { .. }
            | Effect::RemoveNodeLabels { .. } => ServiceName::ClaimAllocator,
            Effect::PublishDeviceClasses { .. } | Effect::RetireDeviceClasses { .. } => {
                ServiceName::ClassCompiler
            }
        }
    }
}

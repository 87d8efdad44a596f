//! The one shape every service's core has, and which core decides for which
//! service: the [`Core`] trait the runtime hosts — fold a record, decide on an
//! input, catch up after a rebuild, the effects still wanted — each core's
//! answer to it, and the typed copy of a core's state ([`CoreState`]) that
//! checks and reports read. A core's own module knows nothing of this trait:
//! it has `apply(event, at)`, `handle(input, now)`, `catch_up(now)` and
//! `effects()`, with time as data everywhere.

use switchyard_proto::v1::DomainEvent;

use crate::alerter::Alerter;
use crate::claim_allocator::{self, ClaimAllocator};
use crate::class_compiler::ClassCompiler;
use crate::command::Command;
use crate::effects::Effect;
use crate::inventory::{ObserverCore, is_fact, observer_of};
use crate::service::{Input, ServiceName};
use crate::stack_assigner::{self, StackAssigner};

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
    /// invariants, `switchyard demo`).
    fn snapshot(&self) -> CoreState;
}

/// A copy of one core's state, by the core's type.
#[derive(Clone, Debug, PartialEq)]
pub enum CoreState {
    /// Inventory's or a node agent's memory of what it reported.
    Observer(Box<ObserverCore>),
    StackAssigner(Box<StackAssigner>),
    ClassCompiler(Box<ClassCompiler>),
    ClaimAllocator(Box<ClaimAllocator>),
    Alerter(Box<Alerter>),
}

impl ServiceName {
    /// A fresh core of this service.
    pub fn core(self) -> Box<dyn Core> {
        match self {
            ServiceName::Inventory | ServiceName::NodeAgent => Box::new(ObserverCore::new(self)),
            ServiceName::StackAssigner => Box::new(StackAssigner::default()),
            ServiceName::ClassCompiler => Box::new(ClassCompiler::default()),
            ServiceName::ClaimAllocator => Box::new(ClaimAllocator::default()),
            ServiceName::Alerter => Box::new(Alerter::default()),
        }
    }
}

/// One fresh core of each service, in [`ServiceName::ALL`]'s order.
pub fn all() -> Vec<Box<dyn Core>> {
    ServiceName::ALL
        .into_iter()
        .map(ServiceName::core)
        .collect()
}

impl Core for ObserverCore {
    fn service(&self) -> ServiceName {
        self.service
    }
    /// A rebuilt observer remembers the facts it reported, so it does not
    /// report them again.
    fn fold(&mut self, event: &DomainEvent, _at: i64) {
        if is_fact(event) && observer_of(event) == self.service {
            self.observer.observe(event.clone());
        }
    }
    fn decide(&mut self, input: Input<'_>, _now: i64) -> Vec<DomainEvent> {
        match input {
            Input::Observed(fact) => self.observer.observe(fact.clone()).into_iter().collect(),
            _ => Vec::new(),
        }
    }
    fn catch_up(&mut self, _now: i64) -> Vec<DomainEvent> {
        Vec::new()
    }
    fn effects(&self) -> Vec<Effect> {
        Vec::new()
    }
    fn snapshot(&self) -> CoreState {
        CoreState::Observer(Box::new(self.clone()))
    }
}

impl Core for StackAssigner {
    fn service(&self) -> ServiceName {
        ServiceName::StackAssigner
    }
    fn fold(&mut self, event: &DomainEvent, at: i64) {
        self.apply(event, at);
    }
    fn decide(&mut self, input: Input<'_>, now: i64) -> Vec<DomainEvent> {
        match input {
            Input::Record(event) => self.handle_fact(event, now),
            Input::Command(Command::StartHandover(cmd)) => {
                self.handle(stack_assigner::Input::StartHandover(cmd), now)
            }
            Input::Command(Command::Rollback(planned)) => {
                self.handle(stack_assigner::Input::Rollback(planned), now)
            }
            Input::Tick => self.handle(stack_assigner::Input::Tick, now),
            Input::Command(_) | Input::Observed(_) => Vec::new(),
        }
    }
    fn catch_up(&mut self, now: i64) -> Vec<DomainEvent> {
        StackAssigner::catch_up(self, now)
    }
    fn effects(&self) -> Vec<Effect> {
        StackAssigner::effects(self)
    }
    fn violations(&self) -> Vec<(&'static str, String)> {
        self.rule_violations()
            .into_iter()
            .map(|v| ("stack-rules", v))
            .collect()
    }
    fn snapshot(&self) -> CoreState {
        CoreState::StackAssigner(Box::new(self.clone()))
    }
}

impl Core for ClassCompiler {
    fn service(&self) -> ServiceName {
        ServiceName::ClassCompiler
    }
    fn fold(&mut self, event: &DomainEvent, at: i64) {
        self.apply(event, at);
    }
    fn decide(&mut self, input: Input<'_>, now: i64) -> Vec<DomainEvent> {
        match input {
            Input::Record(event) => self.handle(event, now),
            _ => Vec::new(),
        }
    }
    fn catch_up(&mut self, now: i64) -> Vec<DomainEvent> {
        ClassCompiler::catch_up(self, now)
    }
    fn effects(&self) -> Vec<Effect> {
        ClassCompiler::effects(self)
    }
    fn snapshot(&self) -> CoreState {
        CoreState::ClassCompiler(Box::new(self.clone()))
    }
}

impl Core for ClaimAllocator {
    fn service(&self) -> ServiceName {
        ServiceName::ClaimAllocator
    }
    fn fold(&mut self, event: &DomainEvent, at: i64) {
        self.apply(event, at);
    }
    fn decide(&mut self, input: Input<'_>, now: i64) -> Vec<DomainEvent> {
        match input {
            Input::Record(event) => self.handle(claim_allocator::Input::Fact(event), now),
            Input::Command(Command::MoveApplication(cmd)) => {
                self.handle(claim_allocator::Input::MoveApplication(cmd), now)
            }
            Input::Command(Command::Rollback(planned)) => {
                self.handle(claim_allocator::Input::Rollback(planned), now)
            }
            Input::Command(Command::Complete(cmd)) => {
                self.handle(claim_allocator::Input::Complete(cmd), now)
            }
            Input::Command(Command::Migrate(plan)) => {
                self.handle(claim_allocator::Input::Migrate(plan), now)
            }
            Input::Command(Command::ControlMigration(cmd)) => {
                self.handle(claim_allocator::Input::ControlMigration(cmd), now)
            }
            Input::Command(Command::CheckEvidence(cmd)) => {
                self.handle(claim_allocator::Input::CheckEvidence(cmd), now)
            }
            Input::Tick if self.migrating() => self.handle(claim_allocator::Input::Tick, now),
            Input::Command(Command::StartHandover(_)) | Input::Observed(_) | Input::Tick => {
                Vec::new()
            }
        }
    }
    fn catch_up(&mut self, now: i64) -> Vec<DomainEvent> {
        ClaimAllocator::catch_up(self, now)
    }
    fn effects(&self) -> Vec<Effect> {
        ClaimAllocator::effects(self)
    }
    fn snapshot(&self) -> CoreState {
        CoreState::ClaimAllocator(Box::new(self.clone()))
    }
}

impl Core for Alerter {
    fn service(&self) -> ServiceName {
        ServiceName::Alerter
    }
    fn fold(&mut self, event: &DomainEvent, at: i64) {
        self.apply(event, at);
    }
    fn decide(&mut self, input: Input<'_>, now: i64) -> Vec<DomainEvent> {
        match input {
            Input::Record(event) => self.handle(event, now),
            _ => Vec::new(),
        }
    }
    fn catch_up(&mut self, now: i64) -> Vec<DomainEvent> {
        Alerter::catch_up(self, now)
    }
    fn effects(&self) -> Vec<Effect> {
        Vec::new()
    }
    fn snapshot(&self) -> CoreState {
        CoreState::Alerter(Box::new(self.clone()))
    }
}

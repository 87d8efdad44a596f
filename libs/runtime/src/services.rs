//! Each service's shell around its core.

use switchyard_core::alerter::Alerter;
use switchyard_core::app_move::{self, ClaimAllocator};
use switchyard_core::class_compiler::ClassCompiler;
use switchyard_core::completion::Completion;
use switchyard_core::effects::Effect;
use switchyard_core::stack::{Input, StackAssigner};
use switchyard_core::subjects::Observer;
use switchyard_proto::v1::DomainEvent;

use crate::{
    ALERTER, CLAIM_ALLOCATOR, CLASS_COMPILER, Command, INVENTORY, NODE_AGENT, Record,
    STACK_ASSIGNER,
};

/// A service's state, handed out for checks and reports.
#[derive(Clone, Debug, PartialEq)]
pub enum CoreState {
    Observer(&'static str),
    Stack(Box<StackAssigner>),
    Compiler(Box<ClassCompiler>),
    Claims(Box<ClaimAllocator>, Box<Completion>),
    Alerter(Box<Alerter>),
}

/// The shell of one service: what it does with records, commands and time.
pub trait ServiceCore: Send + 'static {
    fn name(&self) -> &'static str;
    /// A record of the log written by another service: fold it, return the decisions.
    fn on_record(&mut self, record: &Record, now: i64) -> Vec<DomainEvent>;
    /// Folds a record of the log, its own or another's, without deciding: the
    /// rebuild of a restarted service.
    fn fold(&mut self, _event: &DomainEvent, _at: i64) {}
    /// After a rebuild: the decisions the log shows due but not recorded.
    fn catch_up(&mut self, _now: i64) -> Vec<DomainEvent> {
        Vec::new()
    }
    /// Observers only: the fact to append, or `None` if it changes nothing.
    fn observe(&mut self, fact: DomainEvent) -> Option<DomainEvent> {
        Some(fact)
    }
    fn command(&mut self, _command: &Command, _now: i64) -> Vec<DomainEvent> {
        Vec::new()
    }
    fn tick(&mut self, _now: i64) -> Vec<DomainEvent> {
        Vec::new()
    }
    fn effects(&self) -> Vec<Effect> {
        Vec::new()
    }
    fn violations(&self) -> Vec<(&'static str, String)> {
        Vec::new()
    }
    fn snapshot(&self) -> CoreState;
}

/// One of each service, in a fixed order.
pub fn service_cores() -> Vec<Box<dyn ServiceCore>> {
    vec![
        Box::new(ObserverService {
            name: INVENTORY,
            observer: Observer::default(),
        }),
        Box::new(ObserverService {
            name: NODE_AGENT,
            observer: Observer::default(),
        }),
        Box::new(StackService::default()),
        Box::new(CompilerService::default()),
        Box::new(ClaimsService::default()),
        Box::new(AlerterService::default()),
    ]
}

/// inventory and node-agent: report what changed, once.
struct ObserverService {
    name: &'static str,
    observer: Observer,
}

impl ServiceCore for ObserverService {
    fn name(&self) -> &'static str {
        self.name
    }
    fn on_record(&mut self, _record: &Record, _now: i64) -> Vec<DomainEvent> {
        Vec::new()
    }
    fn observe(&mut self, fact: DomainEvent) -> Option<DomainEvent> {
        self.observer.observe(fact)
    }
    fn snapshot(&self) -> CoreState {
        CoreState::Observer(self.name)
    }
}

#[derive(Default)]
struct StackService {
    core: StackAssigner,
}

impl ServiceCore for StackService {
    fn name(&self) -> &'static str {
        STACK_ASSIGNER
    }
    fn on_record(&mut self, record: &Record, now: i64) -> Vec<DomainEvent> {
        self.core.handle_fact(&record.event, now)
    }
    fn fold(&mut self, event: &DomainEvent, at: i64) {
        self.core.apply(event, at);
    }
    fn catch_up(&mut self, now: i64) -> Vec<DomainEvent> {
        self.core.catch_up(now)
    }
    fn command(&mut self, command: &Command, now: i64) -> Vec<DomainEvent> {
        match command {
            Command::StartHandover(cmd) => self.core.handle(Input::StartHandover(cmd), now),
            Command::Rollback(planned) => self.core.handle(Input::Rollback(planned), now),
            _ => Vec::new(),
        }
    }
    fn tick(&mut self, now: i64) -> Vec<DomainEvent> {
        self.core.handle(Input::Tick, now)
    }
    fn effects(&self) -> Vec<Effect> {
        self.core.effects()
    }
    fn violations(&self) -> Vec<(&'static str, String)> {
        self.core
            .rule_violations()
            .into_iter()
            .map(|v| ("stack-rules", v))
            .collect()
    }
    fn snapshot(&self) -> CoreState {
        CoreState::Stack(Box::new(self.core.clone()))
    }
}

#[derive(Default)]
struct CompilerService {
    core: ClassCompiler,
}

impl ServiceCore for CompilerService {
    fn name(&self) -> &'static str {
        CLASS_COMPILER
    }
    fn on_record(&mut self, record: &Record, _now: i64) -> Vec<DomainEvent> {
        self.core.handle(&record.event)
    }
    fn fold(&mut self, event: &DomainEvent, _at: i64) {
        self.core.apply(event);
    }
    fn catch_up(&mut self, _now: i64) -> Vec<DomainEvent> {
        self.core.catch_up()
    }
    fn effects(&self) -> Vec<Effect> {
        self.core.effects()
    }
    fn snapshot(&self) -> CoreState {
        CoreState::Compiler(Box::new(self.core.clone()))
    }
}

/// claim-allocator: application moves, completion (quota translation).
#[derive(Default)]
struct ClaimsService {
    core: ClaimAllocator,
    completion: Completion,
}

impl ServiceCore for ClaimsService {
    fn name(&self) -> &'static str {
        CLAIM_ALLOCATOR
    }
    fn on_record(&mut self, record: &Record, _now: i64) -> Vec<DomainEvent> {
        self.completion.apply(&record.event);
        self.core.handle(app_move::Input::Fact(&record.event))
    }
    fn fold(&mut self, event: &DomainEvent, _at: i64) {
        self.completion.apply(event);
        self.core.apply(event);
    }
    fn catch_up(&mut self, _now: i64) -> Vec<DomainEvent> {
        self.core.catch_up()
    }
    fn command(&mut self, command: &Command, _now: i64) -> Vec<DomainEvent> {
        match command {
            Command::MoveApplication(cmd) => {
                self.core.handle(app_move::Input::MoveApplication(cmd))
            }
            Command::Rollback(planned) => self.core.handle(app_move::Input::Rollback(planned)),
            Command::Complete(cmd) => {
                let decisions = self.completion.complete(&self.core.cluster, cmd);
                for decision in &decisions {
                    self.completion.apply(decision);
                }
                decisions
            }
            Command::StartHandover(_) => Vec::new(),
        }
    }
    fn effects(&self) -> Vec<Effect> {
        let mut effects = self.core.moves.effects();
        effects.extend(self.completion.effects(&self.core.cluster));
        effects
    }
    fn snapshot(&self) -> CoreState {
        CoreState::Claims(
            Box::new(self.core.clone()),
            Box::new(self.completion.clone()),
        )
    }
}

#[derive(Default)]
struct AlerterService {
    core: Alerter,
}

impl ServiceCore for AlerterService {
    fn name(&self) -> &'static str {
        ALERTER
    }
    fn on_record(&mut self, record: &Record, _now: i64) -> Vec<DomainEvent> {
        self.core.handle(&record.event)
    }
    fn fold(&mut self, event: &DomainEvent, _at: i64) {
        self.core.apply(event);
    }
    fn catch_up(&mut self, _now: i64) -> Vec<DomainEvent> {
        self.core.catch_up()
    }
    fn snapshot(&self) -> CoreState {
        CoreState::Alerter(Box::new(self.core.clone()))
    }
}

//! The six services of Switchyard — inventory, node-agent, stack-assigner,
//! class-compiler, claim-allocator, alerter — each a thin shell around its pure
//! core, and the dispatch that makes them one system: every record of the log
//! goes to every service but its author, in a fixed order, and each service's
//! decisions become records in turn. [`Local`] runs the services in process;
//! [`Actors`] runs each as a ractor actor, called with a timeout. Both give the
//! same records in the same order, so the same log.

#![forbid(unsafe_code)]

mod actors;
mod services;

pub use actors::Actors;
pub use services::{CoreState, ServiceCore, service_cores};

use switchyard_core::app_move::MoveApplication;
use switchyard_core::completion::Complete;
use switchyard_core::effects::Effect;
use switchyard_core::handover::StartHandover;
use switchyard_proto::v1::{DomainEvent, domain_event::Kind};

pub const INVENTORY: &str = "inventory";
pub const NODE_AGENT: &str = "node-agent";
pub const STACK_ASSIGNER: &str = "stack-assigner";
pub const CLASS_COMPILER: &str = "class-compiler";
pub const CLAIM_ALLOCATOR: &str = "claim-allocator";
pub const ALERTER: &str = "alerter";

/// The order in which services see a record: fixed, so the log is too.
pub const DISPATCH_ORDER: [&str; 4] = [STACK_ASSIGNER, CLASS_COMPILER, CLAIM_ALLOCATOR, ALERTER];

/// One record for the log: who wrote it and what.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    pub actor: &'static str,
    pub event: DomainEvent,
}

/// An operator's command, for the service that owns it.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    StartHandover(StartHandover),
    MoveApplication(MoveApplication),
    Complete(Complete),
    /// A planned rollback (`RollbackStarted`), for the node's or workload's owner.
    Rollback(DomainEvent),
}

impl Command {
    /// The service that owns the command.
    pub fn owner(&self) -> &'static str {
        match self {
            Command::StartHandover(_) => STACK_ASSIGNER,
            Command::MoveApplication(_) | Command::Complete(_) => CLAIM_ALLOCATOR,
            Command::Rollback(event) => match &event.kind {
                Some(Kind::RollbackStarted(r)) if r.node_restore.is_some() => STACK_ASSIGNER,
                _ => CLAIM_ALLOCATOR,
            },
        }
    }
}

/// Which observer reports a fact: node agents report their GPUs, inventory the rest.
pub fn observer_of(fact: &DomainEvent) -> &'static str {
    match fact.kind {
        Some(Kind::PhysicalGpuObserved(_) | Kind::PhysicalGpuRemoved(_)) => NODE_AGENT,
        _ => INVENTORY,
    }
}

/// The services, however they run.
#[allow(async_fn_in_trait)]
pub trait Services {
    /// A fact seen in the cluster: the records it leads to, in log order (the
    /// fact itself first, unless it repeats the last report of its object).
    async fn observe(&mut self, fact: DomainEvent, now: i64) -> Vec<Record>;
    /// An operator command and everything it leads to.
    async fn command(&mut self, command: Command, now: i64) -> Vec<Record>;
    /// Time passed: deadlines.
    async fn tick(&mut self, now: i64) -> Vec<Record>;
    /// What the edge should be doing now, from every service.
    async fn effects(&mut self) -> Vec<Effect>;
    /// Invariant violations the services see in their own state.
    async fn violations(&mut self) -> Vec<(&'static str, String)>;
    /// The services' states, for checks and reports.
    async fn snapshot(&mut self) -> Vec<CoreState>;
}

/// Runs `first` through the services: each record goes to every service but
/// its author, in [`DISPATCH_ORDER`]; decisions are queued behind it.
async fn dispatch<F, Fut>(first: Vec<Record>, now: i64, mut deliver: F) -> Vec<Record>
where
    F: FnMut(&'static str, Record, i64) -> Fut,
    Fut: std::future::Future<Output = Vec<DomainEvent>>,
{
    let mut queue: std::collections::VecDeque<Record> = first.into();
    let mut out = Vec::new();
    while let Some(record) = queue.pop_front() {
        for service in DISPATCH_ORDER {
            if service != record.actor {
                for event in deliver(service, record.clone(), now).await {
                    queue.push_back(Record {
                        actor: service,
                        event,
                    });
                }
            }
        }
        out.push(record);
    }
    out
}

/// The services in process, called directly.
pub struct Local {
    cores: Vec<Box<dyn ServiceCore>>,
}

impl Default for Local {
    fn default() -> Self {
        Local {
            cores: service_cores(),
        }
    }
}

impl Local {
    fn core(&mut self, name: &str) -> &mut dyn ServiceCore {
        self.cores
            .iter_mut()
            .find(|c| c.name() == name)
            .expect("known service")
            .as_mut()
    }
}

impl Services for Local {
    async fn observe(&mut self, fact: DomainEvent, now: i64) -> Vec<Record> {
        let observer = observer_of(&fact);
        let Some(fact) = self.core(observer).observe(fact) else {
            return Vec::new();
        };
        self.redispatch(
            vec![Record {
                actor: observer,
                event: fact,
            }],
            now,
        )
        .await
    }

    async fn command(&mut self, command: Command, now: i64) -> Vec<Record> {
        let owner = command.owner();
        let first: Vec<Record> = self
            .core(owner)
            .command(&command, now)
            .into_iter()
            .map(|event| Record {
                actor: owner,
                event,
            })
            .collect();
        self.redispatch(first, now).await
    }

    async fn tick(&mut self, now: i64) -> Vec<Record> {
        let first: Vec<Record> = self
            .core(STACK_ASSIGNER)
            .tick(now)
            .into_iter()
            .map(|event| Record {
                actor: STACK_ASSIGNER,
                event,
            })
            .collect();
        self.redispatch(first, now).await
    }

    async fn effects(&mut self) -> Vec<Effect> {
        self.cores.iter().flat_map(|c| c.effects()).collect()
    }

    async fn violations(&mut self) -> Vec<(&'static str, String)> {
        self.cores.iter().flat_map(|c| c.violations()).collect()
    }

    async fn snapshot(&mut self) -> Vec<CoreState> {
        self.cores.iter().map(|c| c.snapshot()).collect()
    }
}

impl Local {
    /// Decisions of one service (already folded by it) go to the others.
    async fn redispatch(&mut self, first: Vec<Record>, now: i64) -> Vec<Record> {
        let cores = &mut self.cores;
        dispatch(first, now, |service, record, now| {
            let decisions = cores
                .iter_mut()
                .find(|c| c.name() == service)
                .expect("known")
                .on_record(&record, now);
            std::future::ready(decisions)
        })
        .await
    }
}

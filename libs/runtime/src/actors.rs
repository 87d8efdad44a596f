//! Every service as a ractor actor. The actor's state is the service's core;
//! every message is answered (`call_t!` with a timeout, never an unbounded
//! call); a core never returns an error, so an actor only stops when asked.

use std::collections::BTreeMap;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, call_t};
use switchyard_core::effects::Effect;
use switchyard_proto::v1::DomainEvent;

use switchyard_core::inventory::observer_of;
use switchyard_core::{Command, Core, Input, Record, ServiceName};

use crate::{CoreState, Services, dispatch};

/// How long one call to a service may take before it counts as failed.
const CALL_TIMEOUT_MS: u64 = 10_000;

pub enum ServiceMsg {
    Record(Record, i64, RpcReplyPort<Vec<DomainEvent>>),
    Observe(DomainEvent, i64, RpcReplyPort<Vec<DomainEvent>>),
    Command(Command, i64, RpcReplyPort<Vec<DomainEvent>>),
    Tick(i64, RpcReplyPort<Vec<DomainEvent>>),
    Effects(RpcReplyPort<Vec<Effect>>),
    Violations(RpcReplyPort<Vec<(&'static str, String)>>),
    Snapshot(RpcReplyPort<CoreState>),
}

/// The actor type shared by all six services; the core decides what it is.
struct ServiceActor;

impl Actor for ServiceActor {
    type Msg = ServiceMsg;
    type State = Box<dyn Core>;
    type Arguments = Box<dyn Core>;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        core: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(core)
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        core: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // A caller that gave up has dropped its port; that is not the actor's failure.
        match message {
            ServiceMsg::Record(record, now, reply) => {
                let _ = reply.send(core.decide(Input::Record(&record.event), now));
            }
            ServiceMsg::Observe(fact, now, reply) => {
                let _ = reply.send(core.decide(Input::Observed(&fact), now));
            }
            ServiceMsg::Command(command, now, reply) => {
                let _ = reply.send(core.decide(Input::Command(&command), now));
            }
            ServiceMsg::Tick(now, reply) => {
                let _ = reply.send(core.decide(Input::Tick, now));
            }
            ServiceMsg::Effects(reply) => {
                let _ = reply.send(core.effects());
            }
            ServiceMsg::Violations(reply) => {
                let _ = reply.send(core.violations());
            }
            ServiceMsg::Snapshot(reply) => {
                let _ = reply.send(core.snapshot());
            }
        }
        Ok(())
    }
}

/// The six services as actors.
pub struct Actors {
    refs: BTreeMap<ServiceName, ActorRef<ServiceMsg>>,
    /// In a fixed order, for effects and snapshots.
    order: Vec<ServiceName>,
    handles: Vec<tokio::task::JoinHandle<()>>,
}

/// A failed call means an actor is gone: nothing sensible can continue.
fn lost(service: ServiceName, err: impl std::fmt::Display) -> ! {
    panic!("service {service} did not answer: {err}")
}

impl Actors {
    /// Spawns one actor per service.
    pub async fn spawn() -> Result<Actors, ractor::SpawnErr> {
        let mut refs = BTreeMap::new();
        let mut order = Vec::new();
        let mut handles = Vec::new();
        for core in switchyard_core::cores::all() {
            let name = core.service();
            let (actor, handle) =
                Actor::spawn(Some(format!("switchyard-{name}")), ServiceActor, core).await?;
            refs.insert(name, actor);
            order.push(name);
            handles.push(handle);
        }
        Ok(Actors {
            refs,
            order,
            handles,
        })
    }

    fn actor(&self, name: ServiceName) -> &ActorRef<ServiceMsg> {
        &self.refs[&name]
    }

    /// Stops every actor and waits for them.
    pub async fn stop(self) {
        for actor in self.refs.values() {
            actor.stop(None);
        }
        for handle in self.handles {
            let _ = handle.await;
        }
    }

    /// `author`'s events, and everything they lead to, through the other services.
    async fn spread(&self, author: ServiceName, events: Vec<DomainEvent>, now: i64) -> Vec<Record> {
        let first = events
            .into_iter()
            .map(|event| Record {
                actor: author,
                event,
            })
            .collect();
        dispatch(first, now, |service, record, now| {
            self.send_record(service, record, now)
        })
        .await
    }

    async fn send_record(
        &self,
        service: ServiceName,
        record: Record,
        now: i64,
    ) -> Vec<DomainEvent> {
        call_t!(
            self.actor(service),
            ServiceMsg::Record,
            CALL_TIMEOUT_MS,
            record,
            now
        )
        .unwrap_or_else(|err| lost(service, err))
    }
}

impl Services for Actors {
    async fn observe(&mut self, fact: DomainEvent, now: i64) -> Vec<Record> {
        let observer = observer_of(&fact);
        let seen = call_t!(
            self.actor(observer),
            ServiceMsg::Observe,
            CALL_TIMEOUT_MS,
            fact,
            now
        )
        .unwrap_or_else(|err| lost(observer, err));
        self.spread(observer, seen, now).await
    }

    async fn command(&mut self, command: Command, now: i64) -> Vec<Record> {
        let owner = command.owner();
        let decisions = call_t!(
            self.actor(owner),
            ServiceMsg::Command,
            CALL_TIMEOUT_MS,
            command,
            now
        )
        .unwrap_or_else(|err| lost(owner, err));
        self.spread(owner, decisions, now).await
    }

    async fn tick(&mut self, now: i64) -> Vec<Record> {
        let service = ServiceName::StackAssigner;
        let decisions = call_t!(self.actor(service), ServiceMsg::Tick, CALL_TIMEOUT_MS, now)
            .unwrap_or_else(|err| lost(service, err));
        self.spread(service, decisions, now).await
    }

    async fn effects(&mut self) -> Vec<Effect> {
        let mut effects = Vec::new();
        for &name in &self.order {
            effects.extend(
                call_t!(self.actor(name), ServiceMsg::Effects, CALL_TIMEOUT_MS)
                    .unwrap_or_else(|err| lost(name, err)),
            );
        }
        effects
    }

    async fn violations(&mut self) -> Vec<(&'static str, String)> {
        let mut violations = Vec::new();
        for &name in &self.order {
            violations.extend(
                call_t!(self.actor(name), ServiceMsg::Violations, CALL_TIMEOUT_MS)
                    .unwrap_or_else(|err| lost(name, err)),
            );
        }
        violations
    }

    async fn snapshot(&mut self) -> Vec<CoreState> {
        let mut states = Vec::new();
        for &name in &self.order {
            states.push(
                call_t!(self.actor(name), ServiceMsg::Snapshot, CALL_TIMEOUT_MS)
                    .unwrap_or_else(|err| lost(name, err)),
            );
        }
        states
    }
}

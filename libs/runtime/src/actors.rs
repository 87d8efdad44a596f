//! Every service as a ractor actor, under a supervisor. The actor's state is
//! the service's core; every message is answered (`call` with a timeout,
//! never an unbounded call). A core that panics fails its actor; the
//! supervisor starts a new one that rebuilds the core from the log so far
//! (every record dispatched, in order) and the caller gets, instead of the
//! lost answer, what the rebuilt core finds due ([`Core::catch_up`]) — what
//! a restarted process would do. The failure is reported as a violation
//! (`service-restarted`); a service failing more than [`MAX_RESTARTS`] times
//! is given up and reported, never a panic of the whole system.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ractor::{
    Actor, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent, rpc::CallResult,
};
use switchyard_core::effects::Effect;
use switchyard_core::inventory::observer_of;
use switchyard_core::{Command, Core, Input, Record, ServiceName};
use switchyard_proto::v1::DomainEvent;

use crate::{CoreState, Services, dispatch, records};

/// How long one call to a service may take before it counts as failed.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a restart may take: the rebuilt core folds the whole log so far.
const RESTART_TIMEOUT: Duration = Duration::from_secs(300);

/// How often one service is restarted before it is given up.
pub const MAX_RESTARTS: u32 = 3;

/// The log so far, with each record's time: what a restarted core folds.
type History = Arc<Mutex<Vec<(DomainEvent, i64)>>>;

pub enum ServiceMsg {
    Record(DomainEvent, i64, RpcReplyPort<Vec<DomainEvent>>),
    Observe(DomainEvent, i64, RpcReplyPort<Vec<DomainEvent>>),
    Command(Command, i64, RpcReplyPort<Vec<DomainEvent>>),
    Tick(i64, RpcReplyPort<Vec<DomainEvent>>),
    CatchUp(i64, RpcReplyPort<Vec<DomainEvent>>),
    Effects(RpcReplyPort<Vec<Effect>>),
    Violations(RpcReplyPort<Vec<(&'static str, String)>>),
    Snapshot(RpcReplyPort<CoreState>),
}

/// A service's core, fresh, or rebuilt from the log by folding it.
enum Start {
    Fresh(Box<dyn Core>),
    Rebuild(ServiceName, History),
}

/// The actor type shared by all six services; the core decides what it is.
struct ServiceActor;

impl Actor for ServiceActor {
    type Msg = ServiceMsg;
    type State = Box<dyn Core>;
    type Arguments = Start;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        start: Start,
    ) -> Result<Self::State, ActorProcessingErr> {
        Ok(match start {
            Start::Fresh(core) => core,
            Start::Rebuild(service, history) => {
                let mut core = service.core();
                for (event, at) in lock(&history).iter() {
                    core.fold(event, *at);
                }
                core
            }
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        core: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        // A caller that gave up has dropped its port; that is not the actor's failure.
        match message {
            ServiceMsg::Record(event, now, reply) => {
                let _ = reply.send(core.decide(Input::Record(&event), now));
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
            ServiceMsg::CatchUp(now, reply) => {
                let _ = reply.send(core.catch_up(now));
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

enum SupervisorMsg {
    /// The actor of `service` now: once `failed` (an actor that stopped
    /// answering) has been replaced; `None` once the service is given up.
    Current {
        service: ServiceName,
        failed: Option<ActorId>,
        reply: RpcReplyPort<Option<ActorRef<ServiceMsg>>>,
    },
}

/// Starts the services' actors linked to itself and replaces a failed one
/// with a core rebuilt from the log.
struct Supervisor;

struct SupervisorState {
    history: History,
    children: BTreeMap<ServiceName, ActorRef<ServiceMsg>>,
    restarts: BTreeMap<ServiceName, u32>,
    given_up: Vec<ServiceName>,
}

impl SupervisorState {
    fn service_of(&self, id: ActorId) -> Option<ServiceName> {
        self.children
            .iter()
            .find(|(_, actor)| actor.get_id() == id)
            .map(|(service, _)| *service)
    }

    /// Replaces `service`'s actor with one rebuilt from the log; gives the
    /// service up after [`MAX_RESTARTS`].
    async fn restart(&mut self, myself: &ActorRef<SupervisorMsg>, service: ServiceName) {
        if let Some(old) = self.children.remove(&service) {
            old.stop(None);
        }
        loop {
            let restarts = self.restarts.entry(service).or_default();
            *restarts += 1;
            if *restarts > MAX_RESTARTS {
                tracing::error!(%service, "failed too often: given up");
                self.given_up.push(service);
                break;
            }
            let name = format!("switchyard-{service}-{restarts}");
            let start = Start::Rebuild(service, self.history.clone());
            match Actor::spawn_linked(Some(name), ServiceActor, start, myself.get_cell()).await {
                Ok((actor, _)) => {
                    tracing::warn!(%service, restarts = *restarts, "restarted from the log");
                    self.children.insert(service, actor);
                    break;
                }
                Err(err) => tracing::error!(%service, %err, "the rebuilt core did not start"),
            }
        }
    }
}

impl Actor for Supervisor {
    type Msg = SupervisorMsg;
    type State = SupervisorState;
    type Arguments = (History, Vec<Box<dyn Core>>);

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        (history, cores): Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        let mut children = BTreeMap::new();
        for core in cores {
            let service = core.service();
            let (actor, _) = Actor::spawn_linked(
                Some(format!("switchyard-{service}")),
                ServiceActor,
                Start::Fresh(core),
                myself.get_cell(),
            )
            .await?;
            children.insert(service, actor);
        }
        Ok(SupervisorState {
            history,
            children,
            restarts: BTreeMap::new(),
            given_up: Vec::new(),
        })
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        for child in state.children.values() {
            let _ = child.stop_and_wait(None, Some(CALL_TIMEOUT)).await;
        }
        Ok(())
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            SupervisorMsg::Current {
                service,
                failed,
                reply,
            } => {
                let current = state.children.get(&service);
                if current.is_some_and(|c| Some(c.get_id()) == failed) {
                    // The caller saw the failure before this supervisor did
                    // (or the actor stopped answering without failing).
                    state.restart(&myself, service).await;
                    let _ = reply.send(state.children.get(&service).cloned());
                } else {
                    let _ = reply.send(current.cloned());
                }
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        let (who, why) = match &event {
            SupervisionEvent::ActorFailed(who, err) => (who.get_id(), err.to_string()),
            SupervisionEvent::ActorTerminated(who, _, reason) => (
                who.get_id(),
                reason.clone().unwrap_or_else(|| "stopped".into()),
            ),
            _ => return Ok(()),
        };
        // Only a current child matters: a replaced one stopping is expected.
        if let Some(service) = state.service_of(who) {
            tracing::warn!(%service, why, "a service's actor stopped");
            state.restart(&myself, service).await;
        }
        Ok(())
    }
}

/// The six services as actors under one supervisor.
pub struct Actors {
    supervisor: ActorRef<SupervisorMsg>,
    handle: tokio::task::JoinHandle<()>,
    /// The actor of each service, as last known.
    refs: Mutex<BTreeMap<ServiceName, ActorRef<ServiceMsg>>>,
    /// In a fixed order, for effects and snapshots.
    order: Vec<ServiceName>,
    history: History,
    /// For a restarted service, how much of the history its rebuilt core
    /// folded: records of the round in flight before that are not sent again.
    rebuilt_through: Mutex<BTreeMap<ServiceName, usize>>,
    /// Services that failed and were restarted (or given up), with the input.
    failures: Mutex<Vec<String>>,
}

/// A lock whose holder panicked still guards consistent data here: every
/// update under it is a single insert or push.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Actors {
    /// Spawns one actor per service.
    pub async fn spawn() -> Result<Actors, ractor::SpawnErr> {
        Actors::spawn_cores(switchyard_core::cores::all()).await
    }

    /// Spawns an actor for each of `cores` (one per service); a restarted
    /// service gets a fresh core of its own kind rebuilt from the log.
    pub async fn spawn_cores(cores: Vec<Box<dyn Core>>) -> Result<Actors, ractor::SpawnErr> {
        let order: Vec<ServiceName> = cores.iter().map(|c| c.service()).collect();
        let history: History = Arc::default();
        let (supervisor, handle) = Actor::spawn(None, Supervisor, (history.clone(), cores)).await?;
        let actors = Actors {
            supervisor,
            handle,
            refs: Mutex::default(),
            order,
            history,
            rebuilt_through: Mutex::default(),
            failures: Mutex::default(),
        };
        for &service in &actors.order {
            if let Some(actor) = actors.replacement(service, None).await {
                lock(&actors.refs).insert(service, actor);
            }
        }
        Ok(actors)
    }

    /// Stops every actor and waits for them.
    pub async fn stop(self) {
        self.supervisor.stop(None);
        let _ = self.handle.await;
    }

    /// The current actor of `service`, replacing `failed` if it is still current.
    async fn replacement(
        &self,
        service: ServiceName,
        failed: Option<ActorId>,
    ) -> Option<ActorRef<ServiceMsg>> {
        let answer = self
            .supervisor
            .call(
                |reply| SupervisorMsg::Current {
                    service,
                    failed,
                    reply,
                },
                Some(RESTART_TIMEOUT),
            )
            .await;
        match answer {
            Ok(CallResult::Success(current)) => current,
            _ => None,
        }
    }

    /// Asks `service`; if its actor failed, asks the rebuilt one `after`
    /// instead (what is due, for an input; the same, for a query). `None`
    /// once the service is given up.
    async fn ask<T: Send + 'static>(
        &self,
        service: ServiceName,
        what: &str,
        message: impl Fn(RpcReplyPort<T>) -> ServiceMsg,
        after: impl Fn(RpcReplyPort<T>) -> ServiceMsg,
    ) -> Option<T> {
        let actor = lock(&self.refs).get(&service)?.clone();
        if let Ok(CallResult::Success(answer)) = actor.call(&message, Some(CALL_TIMEOUT)).await {
            return Some(answer);
        }
        let mut failed = actor.get_id();
        for _ in 0..=MAX_RESTARTS {
            let Some(next) = self.replacement(service, Some(failed)).await else {
                break;
            };
            lock(&self.refs).insert(service, next.clone());
            let folded = lock(&self.history).len();
            lock(&self.rebuilt_through).insert(service, folded);
            lock(&self.failures).push(format!(
                "{service} failed on {what} and was restarted from the log"
            ));
            if let Ok(CallResult::Success(answer)) = next.call(&after, Some(CALL_TIMEOUT)).await {
                return Some(answer);
            }
            failed = next.get_id();
        }
        lock(&self.refs).remove(&service);
        lock(&self.failures).push(format!("{service} failed too often and was given up"));
        None
    }

    /// An input for `service`: its decisions, or (failed) what its rebuilt
    /// core finds due.
    async fn input(
        &self,
        service: ServiceName,
        what: &str,
        now: i64,
        message: impl Fn(RpcReplyPort<Vec<DomainEvent>>) -> ServiceMsg,
    ) -> Vec<DomainEvent> {
        self.ask(service, what, message, |reply| {
            ServiceMsg::CatchUp(now, reply)
        })
        .await
        .unwrap_or_default()
    }

    fn remember(&self, records: &[Record], now: i64) {
        lock(&self.history).extend(records.iter().map(|r| (r.event.clone(), now)));
    }

    /// `author`'s events, and everything they lead to, through the other
    /// services; each record is in the history before anyone decides on it.
    async fn spread(&self, author: ServiceName, events: Vec<DomainEvent>, now: i64) -> Vec<Record> {
        let base = lock(&self.history).len();
        let first = records(author, events);
        self.remember(&first, now);
        dispatch(first, now, |service, position, record, now| async move {
            let folded = lock(&self.rebuilt_through).get(&service).copied();
            if folded.is_some_and(|folded| base + position < folded) {
                // Its rebuilt core folded this record already.
                return Vec::new();
            }
            let event = record.event;
            let decided = self
                .input(service, "a record", now, |reply| {
                    ServiceMsg::Record(event.clone(), now, reply)
                })
                .await;
            let decisions = records(service, decided);
            self.remember(&decisions, now);
            decisions.into_iter().map(|r| r.event).collect()
        })
        .await
    }
}

impl Services for Actors {
    async fn observe(&mut self, fact: DomainEvent, now: i64) -> Vec<Record> {
        let observer = observer_of(&fact);
        let seen = self
            .input(observer, "an observation", now, |reply| {
                ServiceMsg::Observe(fact.clone(), now, reply)
            })
            .await;
        self.spread(observer, seen, now).await
    }

    async fn command(&mut self, command: Command, now: i64) -> Vec<Record> {
        let owner = command.owner();
        let decisions = self
            .input(owner, "a command", now, |reply| {
                ServiceMsg::Command(command.clone(), now, reply)
            })
            .await;
        self.spread(owner, decisions, now).await
    }

    async fn tick(&mut self, now: i64) -> Vec<Record> {
        let mut records = Vec::new();
        for service in ServiceName::DISPATCH_ORDER {
            let decisions = self
                .input(service, "a tick", now, |reply| ServiceMsg::Tick(now, reply))
                .await;
            records.extend(self.spread(service, decisions, now).await);
        }
        records
    }

    async fn effects(&mut self) -> Vec<Effect> {
        let mut effects = Vec::new();
        for &name in &self.order {
            let asked = self
                .ask(
                    name,
                    "its effects",
                    ServiceMsg::Effects,
                    ServiceMsg::Effects,
                )
                .await;
            effects.extend(asked.unwrap_or_default());
        }
        effects
    }

    async fn violations(&mut self) -> Vec<(&'static str, String)> {
        let mut violations = Vec::new();
        for &name in &self.order {
            let asked = self
                .ask(
                    name,
                    "its checks",
                    ServiceMsg::Violations,
                    ServiceMsg::Violations,
                )
                .await;
            violations.extend(asked.unwrap_or_default());
        }
        violations.extend(
            std::mem::take(&mut *lock(&self.failures))
                .into_iter()
                .map(|failure| ("service-restarted", failure)),
        );
        violations
    }

    async fn snapshot(&mut self) -> Vec<CoreState> {
        let mut states = Vec::new();
        for &name in &self.order {
            let asked = self
                .ask(
                    name,
                    "its state",
                    ServiceMsg::Snapshot,
                    ServiceMsg::Snapshot,
                )
                .await;
            states.extend(asked);
        }
        states
    }
}

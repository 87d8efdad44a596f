//! The one runtime of Switchyard: it hosts any service's [`Core`].
//!
//! - [`host`]: a service as a process — its core rebuilt from the log, caught
//!   up, following the log, deciding, appending, taking operator commands over
//!   NATS ([`commands`]), its effects executed by an [`EffectExecutor`] (the
//!   service's Kubernetes writers, or the simulator) and issued again with
//!   backoff while still wanted.
//! - [`Local`] and [`Actors`]: the six services in one process (the demo and
//!   the scenario tests), called directly or as ractor actors under a
//!   supervisor. Every record goes to every service but its author, in
//!   [`ServiceName::DISPATCH_ORDER`], and each service's decisions become
//!   records in turn; both modes give the same records in the same order, so
//!   the same log.
//! - [`connect`]: the flags and connection every service and command shares
//!   (`--nats-url`, `--nats-creds`, `--stream`), [`health`] for probes,
//!   [`metrics`] for Prometheus and [`telemetry`] for OpenTelemetry traces.

#![forbid(unsafe_code)]

mod actors;
pub mod authorship;
pub mod cloudevents;
pub mod commands;
pub mod connect;
pub mod health;
pub mod host;
pub mod leader;
pub mod logging;
pub mod metrics;
pub mod process;
pub mod telemetry;

pub use actors::{Actors, MAX_RESTARTS};
pub use logging::init_tracing;
pub use process::service_main;
pub use switchyard_core::effects::{EffectExecutor, NoEffects, Outcome};
pub use switchyard_core::{Command, Core, CoreState, Input, Record, ServiceName};
pub use telemetry::Telemetry;

/// Stops a task when dropped.
pub(crate) struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

use switchyard_core::effects::Effect;
use switchyard_core::inventory::observer_of;
use switchyard_proto::v1::DomainEvent;

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
/// its author, in [`ServiceName::DISPATCH_ORDER`]; decisions are queued behind
/// it. `deliver` also gets the record's position in the round (`first` and
/// then the decisions, in the order they were made, which is the log's).
async fn dispatch<F, Fut>(first: Vec<Record>, now: i64, mut deliver: F) -> Vec<Record>
where
    F: FnMut(ServiceName, usize, Record, i64) -> Fut,
    Fut: std::future::Future<Output = Vec<DomainEvent>>,
{
    let mut queue: std::collections::VecDeque<Record> = first.into();
    let mut out = Vec::new();
    while let Some(record) = queue.pop_front() {
        let position = out.len();
        for service in ServiceName::DISPATCH_ORDER {
            if service != record.actor {
                for event in deliver(service, position, record.clone(), now).await {
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

pub(crate) fn records(actor: ServiceName, events: Vec<DomainEvent>) -> Vec<Record> {
    events
        .into_iter()
        .map(|event| Record { actor, event })
        .collect()
}

/// The services in process, called directly.
pub struct Local {
    cores: Vec<Box<dyn Core>>,
}

impl Default for Local {
    fn default() -> Self {
        Local {
            cores: switchyard_core::cores::all(),
        }
    }
}

impl Local {
    /// The services of `cores` (one per service), e.g. a stack-assigner
    /// configured for another backend.
    pub fn with_cores(cores: Vec<Box<dyn Core>>) -> Self {
        Local { cores }
    }

    fn core(&mut self, service: ServiceName) -> &mut dyn Core {
        self.cores
            .iter_mut()
            .find(|c| c.service() == service)
            .expect("one core of every service")
            .as_mut()
    }

    /// `author`'s decisions (already folded by it) and what they lead to.
    async fn spread(
        &mut self,
        author: ServiceName,
        events: Vec<DomainEvent>,
        now: i64,
    ) -> Vec<Record> {
        let cores = &mut self.cores;
        dispatch(records(author, events), now, |service, _, record, now| {
            let decisions = cores
                .iter_mut()
                .find(|c| c.service() == service)
                .expect("one core of every service")
                .decide(Input::Record(&record.event), now);
            std::future::ready(decisions)
        })
        .await
    }
}

impl Services for Local {
    async fn observe(&mut self, fact: DomainEvent, now: i64) -> Vec<Record> {
        let observer = observer_of(&fact);
        let seen = self.core(observer).decide(Input::Observed(&fact), now);
        self.spread(observer, seen, now).await
    }

    async fn command(&mut self, command: Command, now: i64) -> Vec<Record> {
        let owner = command.owner();
        let decisions = self.core(owner).decide(Input::Command(&command), now);
        self.spread(owner, decisions, now).await
    }

    async fn tick(&mut self, now: i64) -> Vec<Record> {
        let mut records = Vec::new();
        for service in ServiceName::DISPATCH_ORDER {
            let decisions = self.core(service).decide(Input::Tick, now);
            records.extend(self.spread(service, decisions, now).await);
        }
        records
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

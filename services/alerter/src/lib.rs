//! alerter: alert rules over the log (D8GpuNodeGroupHeldOnDra while a group is held on DRA).
//!
//! The decisions are the pure core `switchyard_core::alerter`; its only
//! output is its records in the log. This crate is the service around it —
//! its flags and its process, hosted by `switchyard_runtime`.
//!
//! [`doctor`] holds the evidence the alerter's rules stand on: the
//! reference's "Common mistakes" diagnosed over a snapshot of the cluster
//! (`switchyard doctor`, `switchyard explain pod`).

#![forbid(unsafe_code)]

pub mod doctor;
pub mod state_metrics;

use switchyard_api::rbac::Permission;
use switchyard_core::ServiceName;
use switchyard_core::effects::{NoEffects, NotExecuted};
use switchyard_runtime::cloudevents::{self, EventsArgs};
use switchyard_runtime::host::{self, ServeError, ServiceArgs};

pub const SERVICE: ServiceName = ServiceName::Alerter;

/// What the alerter may do, in its own namespace (a Role): record Events.
pub const PERMISSIONS: &[Permission] = &[Permission::new("", "events", &["create", "patch"])];

/// The flags of `switchyard-alerter` (and `switchyard serve alerter`).
#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    #[command(flatten)]
    pub service: ServiceArgs,
    #[command(flatten)]
    pub events: EventsArgs,
}

/// Runs the service on the JetStream log until the log fails. It also
/// publishes the log as CloudEvents for integrations
/// ([`switchyard_runtime::cloudevents`]) and serves the migration's state as
/// series on `/metrics` ([`state_metrics`]), each following the log on a
/// connection of its own.
pub async fn run(args: Args) -> Result<(), ServeError<NotExecuted>> {
    let nats = &args.service.nats;
    let client = nats.service_client(SERVICE.as_str()).await?;
    let log = nats.log(client.clone()).await?;
    if !args.events.events_prefix.is_empty() {
        let source = format!("/switchyard/{}", nats.stream.stream);
        cloudevents::spawn(log.clone(), client, args.events.clone(), source);
    }
    spawn_state_metrics(log);
    host::serve(SERVICE, &args.service, async { Ok(NoEffects) }).await
}

/// Folds the log into a [`state_metrics::MigrationState`] served at each
/// scrape; after a failure of the log it goes on from the last record it
/// folded.
pub fn spawn_state_metrics(log: std::sync::Arc<dyn switchyard_eventlog::EventLog>) {
    let state = std::sync::Arc::new(std::sync::Mutex::new(
        state_metrics::MigrationState::default(),
    ));
    let collector = state_metrics::StateCollector::new(state.clone());
    switchyard_runtime::metrics::metrics()
        .register_with(|registry| registry.register_collector(Box::new(collector)));
    tokio::spawn(async move {
        loop {
            if let Err(err) = state_metrics::follow(log.clone(), state.clone()).await {
                tracing::warn!(%err, "following the log for the state's metrics stopped; following it again");
            }
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
    });
}

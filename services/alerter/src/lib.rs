//! alerter: alert rules over the log (D8GpuNodeGroupHeldOnDra while a group is held on DRA).
//!
//! The decisions are the pure core `switchyard_core::alerter`; its only
//! output is its records in the log. This crate is the service around it —
//! its flags and its process, hosted by `switchyard_runtime`.

#![forbid(unsafe_code)]

pub mod module_status;
pub mod state_metrics;

use switchyard_api::rbac::Permission;
use switchyard_core::ServiceName;
use switchyard_core::effects::{NoEffects, NotExecuted};
use switchyard_runtime::cloudevents::{self, EventsArgs};
use switchyard_runtime::host::{self, ServeError, ServiceArgs};

pub const SERVICE: ServiceName = ServiceName::Alerter;

/// What the alerter may do in the cluster (a ClusterRole): read the
/// ModuleConfig CRD (whose it is decides where the module status goes) and
/// write the module status, on the `gpu` ModuleConfig or its own
/// GPUModuleStatus — those objects only (creating one cannot be limited by
/// name: Kubernetes does not know the name before the object exists).
pub const PERMISSIONS: &[Permission] = &[
    Permission::named(
        "apiextensions.k8s.io",
        "customresourcedefinitions",
        &["get"],
        &["moduleconfigs.deckhouse.io"],
    ),
    Permission::named("deckhouse.io", "moduleconfigs", &["get"], &["gpu"]),
    Permission::named("deckhouse.io", "moduleconfigs/status", &["patch"], &["gpu"]),
    Permission::named("gpu.deckhouse.io", "gpumodulestatuses", &["get"], &["gpu"]),
    Permission::new("gpu.deckhouse.io", "gpumodulestatuses", &["create"]),
    Permission::named(
        "gpu.deckhouse.io",
        "gpumodulestatuses/status",
        &["patch"],
        &["gpu"],
    ),
];

/// The alerter's Events (an alert starting to fire, on its Node, NodeGroup,
/// PhysicalGPU or the module status object), in `default` where events
/// about cluster-scoped objects live (a Role there).
pub const EVENT_PERMISSIONS: &[Permission] = &[Permission::new(
    "events.k8s.io",
    "events",
    // list: a restart does not announce again what the Events still say.
    &["create", "patch", "list"],
)];

/// The flags of `switchyard-alerter` (and `switchyard serve alerter`).
#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    #[command(flatten)]
    pub service: ServiceArgs,
    #[command(flatten)]
    pub events: EventsArgs,
    #[command(flatten)]
    pub status: module_status::StatusArgs,
}

/// `switchyard-alerter` as a process: its flags, logs and traces, and
/// [`run`]. Its own binary and the image's multi-call `switchyard` call it.
pub fn main() -> std::process::ExitCode {
    switchyard_runtime::service_main("switchyard-alerter", "Switchyard's alerter", run)
}

/// Runs the service on the JetStream log until the log fails. It also
/// publishes the log as CloudEvents for integrations
/// ([`switchyard_runtime::cloudevents`]), serves the migration's state as
/// series on `/metrics` ([`state_metrics`]) and writes the module status
/// ([`module_status`]); the publisher and the state follow the log on a
/// connection of their own, beside the service's.
pub async fn run(args: Args) -> Result<(), ServeError<NotExecuted>> {
    let nats = &args.service.nats;
    let client = nats.service_client(SERVICE.as_str()).await?;
    let log = nats.log(client.clone()).await?;
    if !args.events.events_prefix.is_empty() {
        let source = format!("/switchyard/{}", nats.stream.stream);
        cloudevents::spawn(log.clone(), client, args.events.clone(), source);
    }
    let state = spawn_state_metrics(log);
    match kube::Config::infer().await {
        Ok(config) => match kube::Client::try_from(config) {
            Ok(client) => {
                tokio::spawn(module_status::run(client, state, args.status.clone()));
            }
            Err(err) => {
                tracing::warn!(error = %err, "no Kubernetes client: the module status is not written")
            }
        },
        Err(err) => {
            tracing::warn!(error = %err, "no Kubernetes API (in-cluster config or KUBECONFIG): the module status is not written")
        }
    }
    host::serve(SERVICE, &args.service, async { Ok(NoEffects) }).await
}

/// Folds the log into a [`state_metrics::MigrationState`] served at each
/// scrape; after a failure of the log it goes on from the last record it
/// folded.
pub fn spawn_state_metrics(
    log: std::sync::Arc<dyn switchyard_eventlog::EventLog>,
) -> std::sync::Arc<std::sync::Mutex<state_metrics::MigrationState>> {
    let state = std::sync::Arc::new(std::sync::Mutex::new(
        state_metrics::MigrationState::default(),
    ));
    let collector = state_metrics::StateCollector::new(state.clone());
    switchyard_runtime::metrics::metrics()
        .register_with(|registry| registry.register_collector(Box::new(collector)));
    let following = state.clone();
    tokio::spawn(async move {
        loop {
            if let Err(err) = state_metrics::follow(log.clone(), following.clone()).await {
                tracing::warn!(%err, "following the log for the state's metrics stopped; following it again");
            }
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
    });
    state
}

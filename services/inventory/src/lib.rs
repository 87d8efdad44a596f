//! inventory: the cluster's objects — Nodes, NodeGroups, the ModuleConfig,
//! GPUClasses, PhysicalGPUs, Pods, workloads, quotas, ResourceSlices,
//! DeviceClasses, ResourceClaims — watched and recorded in the log as facts,
//! each change once.
//!
//! The dedupe is the pure core `switchyard_core::inventory`, the facts are
//! built by the Kubernetes adapter (`switchyard_kube::facts`); this crate is
//! the service around them: its watchers ([`edge`]), its flags and its
//! process.

#![forbid(unsafe_code)]

pub mod edge;

use edge::InventoryOptions;
use switchyard_api::rbac::Permission;
use switchyard_core::ServiceName;
use switchyard_eventlog::LogError;
use switchyard_runtime::connect::NatsArgs;
use switchyard_runtime::host::{HostError, Progress, ServeError};

pub const SERVICE: ServiceName = ServiceName::Inventory;

/// What inventory may do: watch every kind it reports; it writes nothing.
pub const PERMISSIONS: &[Permission] = &[
    Permission::read("", "nodes"),
    Permission::read("", "pods"),
    Permission::read("", "resourcequotas"),
    Permission::read("apps", "deployments"),
    Permission::read("apps", "statefulsets"),
    Permission::read("apps", "daemonsets"),
    Permission::read("batch", "jobs"),
    Permission::read("batch", "cronjobs"),
    Permission::read("deckhouse.io", "nodegroups"),
    Permission::read("deckhouse.io", "moduleconfigs"),
    Permission::read("gpu.deckhouse.io", "gpuclasses"),
    Permission::read("gpu.deckhouse.io", "physicalgpus"),
    Permission::read("resource.k8s.io", "resourceslices"),
    Permission::read("resource.k8s.io", "deviceclasses"),
    Permission::read("resource.k8s.io", "resourceclaims"),
];

/// The API server's own endpoints inventory reads: `/metrics`, for the
/// feature gates (`kubernetes_feature_enabled`). `/version` is every
/// authenticated user's (system:public-info-viewer).
pub const NON_RESOURCE_PERMISSIONS: &[(&str, &[&str])] = &[("/metrics", &["get"])];

/// The flags of `switchyard-inventory` (and `switchyard serve inventory`).
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    #[command(flatten)]
    pub nats: NatsArgs,
    /// Serve the gRPC health protocol (grpc.health.v1) here, for probes.
    #[arg(long, env = "SWITCHYARD_HEALTH_LISTEN")]
    pub health_listen: Option<std::net::SocketAddr>,
    /// Serve Prometheus metrics on /metrics here (see docs/operations/metrics-and-alerts.md).
    #[arg(long, env = "SWITCHYARD_METRICS_LISTEN")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    #[command(flatten)]
    pub election: switchyard_runtime::leader::ElectionArgs,
    /// The module version inventory reports with the module settings.
    #[arg(long, env = "SWITCHYARD_MODULE_VERSION", default_value = env!("CARGO_PKG_VERSION"))]
    pub module_version: String,
    /// The backend that serves the GPUs. On `nvidia-operator` no gpu
    /// ModuleConfig is expected: the platform's facts (Kubernetes version,
    /// feature gates, DRA API) are recorded without one.
    #[arg(long, env = "SWITCHYARD_BACKEND", default_value = "deckhouse", value_parser = ["deckhouse", "nvidia-operator"])]
    pub backend: String,
}

/// Why inventory stopped, besides the connection to the log.
#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    #[error("find the Kubernetes API (in-cluster config or KUBECONFIG): {0}")]
    Config(#[from] kube::config::InferConfigError),
    #[error("connect to the Kubernetes API: {0}")]
    Client(#[from] kube::Error),
    #[error("the log: {0}")]
    Log(#[from] LogError),
}

/// `switchyard-inventory` as a process: its flags, logs and traces, and
/// [`run`]. Its own binary and the image's multi-call `switchyard` call it.
pub fn main() -> std::process::ExitCode {
    switchyard_runtime::service_main("switchyard-inventory", "Switchyard's inventory", run)
}

/// Runs inventory against the cluster (in-cluster config or KUBECONFIG) and
/// the JetStream log until the log fails.
pub async fn run(args: Args) -> Result<(), ServeError<InventoryError>> {
    let service = |e: InventoryError| ServeError::Service(e);
    let config = kube::Config::infer().await.map_err(|e| service(e.into()))?;
    let kube = kube::Client::try_from(switchyard_kube::watch::client_config(config))
        .map_err(|e| service(e.into()))?;
    let client = args.nats.service_client(SERVICE.as_str()).await?;
    let log = args.nats.log(client.clone()).await?;
    let election = args
        .election
        .election(SERVICE)
        .await
        .map_err(HostError::from)?;
    // Ready at once: inventory decides nothing, its rebuild is its own records.
    let (progress, watching) = tokio::sync::watch::channel(Progress {
        ready: true,
        sequence: 0,
    });
    switchyard_runtime::health::spawn(args.health_listen, SERVICE.as_str(), watching);
    switchyard_runtime::metrics::spawn(args.metrics_listen);
    // Each fact appended, counted as it lands.
    let (appended, mut landed) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let metrics = switchyard_runtime::metrics::metrics().service(SERVICE.as_str());
        while let Some(sequence) = landed.recv().await {
            metrics.appended(1);
            metrics.read_up_to(sequence);
        }
    });
    tracing::info!(service = %SERVICE, "starting");
    let options = InventoryOptions {
        module_version: args.module_version,
        without_module_config: args.backend == "nvidia-operator",
    };
    let Some(election) = election else {
        edge::run(kube, log, options, Some(appended))
            .await
            .map_err(|e| service(e.into()))?;
        drop(progress);
        return Ok(());
    };
    // With standbys: a standby waits (its state is the cluster's, read
    // when it leads); the leader begins its term, and stops when it loses
    // the lead.
    let identity = election.identity().to_string();
    let metrics = switchyard_runtime::metrics::metrics();
    metrics.leading(SERVICE.as_str(), false);
    tracing::info!(service = %SERVICE, identity, "standing by until this replica leads");
    let mut leading = election.lead(Some(client)).await.map_err(HostError::from)?;
    log.begin_term(
        SERVICE.as_str(),
        &identity,
        switchyard_eventlog::now_nanos(),
    )
    .await
    .map_err(|e| service(e.into()))?;
    metrics.leading(SERVICE.as_str(), true);
    let ended = tokio::select! {
        ended = edge::run(kube, log, options, Some(appended)) => ended.map_err(|e| service(e.into())),
        why = leading.lost() => Err(HostError::Deposed { why }.into()),
    };
    metrics.leading(SERVICE.as_str(), false);
    leading.step_down().await;
    drop(progress);
    ended
}

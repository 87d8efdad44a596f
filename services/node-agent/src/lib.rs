//! node-agent: the per-node half of Switchyard. It reads the node's GPUs
//! (NVML, or a fixture where no GPU is present), reports their PhysicalGPUs
//! and serves exactly one stack — the DRA kubelet plugin and the node's
//! ResourceSlices, or the device-plugin API — the one its Node's
//! `node.deckhouse.io/gpu-stack` label names, switching when the label
//! changes and the old stack is unused. The machine is `switchyard_gpu`'s,
//! the kubelet protocols `switchyard_kubelet`'s; this crate is the service
//! around them: its edge ([`edge`]: the node's watchers, its writers, the
//! stack it serves), its flags and its process (`switchyard-node-agent
//! serve`, the chart's DaemonSet; [`cli`], with `discover`).

#![forbid(unsafe_code)]

pub mod cli;
mod discover;
pub mod edge;

use std::net::SocketAddr;
use std::path::PathBuf;

use edge::{NodeOptions, RunError, serve_node};
use switchyard_api::rbac::Permission;
use switchyard_core::ServiceName;
use switchyard_gpu::publish::{Layout, parse_layout};
use switchyard_kubelet::deviceplugin::{Sharing, parse_sharing};
use switchyard_runtime::host::Progress;

pub const SERVICE: ServiceName = ServiceName::NodeAgent;

/// Every verb on what the node agent owns for its node (the chart's
/// admission policy keeps it to its own node's objects).
const OWN: &[&str] = &[
    "get", "list", "watch", "create", "patch", "update", "delete",
];

/// What the node agent may do: watch its Node, write its node's PhysicalGPUs
/// and ResourceSlices, read the ResourceClaims it prepares.
pub const PERMISSIONS: &[Permission] = &[
    Permission::read("", "nodes"),
    Permission::new("gpu.deckhouse.io", "physicalgpus", OWN),
    Permission::new("gpu.deckhouse.io", "physicalgpus/status", OWN),
    Permission::new("resource.k8s.io", "resourceslices", OWN),
    Permission::read("resource.k8s.io", "resourceclaims"),
];

/// In `default`, where Events about cluster-scoped objects live: its
/// `GpuHealthChanged` and `HandoverBlocked` Events.
pub const EVENT_PERMISSIONS: &[Permission] = &[Permission::new(
    "events.k8s.io",
    "events",
    &["create", "patch"],
)];

/// The flags of `switchyard-node-agent serve` (and `switchyard serve node-agent`).
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    /// The node this agent runs on (NODE_NAME from the downward API).
    #[arg(long = "node-name", alias = "node", env = "NODE_NAME")]
    pub node: String,
    /// `nvml`, `fixture:FILE` (a YAML machine; see deploy/fixtures/), or
    /// `fixture-per-node:FILE`: a machine shared by several nodes, each card's
    /// UUID made the node's own (its first eight hex digits from the node's
    /// name), as the chart's `nodeAgent.gpuSource=fixture` runs it.
    #[arg(long, env = "SWITCHYARD_GPU_SOURCE", default_value = "nvml")]
    pub gpu_source: String,
    /// How the DRA stack publishes cards: static, partitionable or shared:N.
    #[arg(long, env = "SWITCHYARD_LAYOUT", default_value = "static", value_parser = parse_layout)]
    pub layout: Layout,
    /// How the device-plugin stack shares cards: exclusive, time-slicing:N or mig.
    #[arg(long, env = "SWITCHYARD_SHARING", default_value = "exclusive", value_parser = parse_sharing)]
    pub sharing: Sharing,
    /// Kubelet's root directory (plugins_registry, plugins, device-plugins, pod-resources).
    #[arg(
        long,
        env = "SWITCHYARD_KUBELET_DIR",
        default_value = "/var/lib/kubelet"
    )]
    pub kubelet_dir: PathBuf,
    /// Where CDI specs go.
    #[arg(long, env = "SWITCHYARD_CDI_DIR", default_value = "/var/run/cdi")]
    pub cdi_dir: PathBuf,
    /// The agent pod's UID (POD_UID, from the downward API's metadata.uid).
    /// With it the agent's sockets carry the UID, so that during a
    /// DaemonSet rolling update with maxSurge the new pod serves beside the
    /// old one: kubelet holds both and prefers the newer, the node's
    /// ResourceSlices stay, and the two share the claims' checkpoint under a
    /// lock file.
    #[arg(long, env = "POD_UID", value_parser = parse_pod_uid)]
    pub pod_uid: Option<String>,
    /// Serve the gRPC health protocol (grpc.health.v1) here, for probes:
    /// serving once the node's assignment is acted on.
    #[arg(long, env = "SWITCHYARD_HEALTH_LISTEN")]
    pub health_listen: Option<SocketAddr>,
    /// Serve Prometheus metrics on /metrics here: the stack served, the
    /// claims prepared, prepare/unprepare latency and errors.
    #[arg(long, env = "SWITCHYARD_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,
}

/// A pod UID as the downward API gives it (`metadata.uid`): letters, digits
/// and `-`, which go into socket names.
pub fn parse_pod_uid(s: &str) -> Result<String, String> {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        Ok(s.to_string())
    } else {
        Err(format!(
            "{s:?}: expected a pod UID (letters, digits and '-'), as the downward API's metadata.uid gives it"
        ))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum NodeAgentError {
    #[error("find the Kubernetes API (in-cluster config or KUBECONFIG): {0}")]
    Config(#[from] kube::config::InferConfigError),
    #[error("connect to the Kubernetes API: {0}")]
    Client(#[from] kube::Error),
    #[error("{0}")]
    Agent(#[source] RunError),
}

/// `switchyard-node-agent` as a process: `serve` or `discover`
/// ([`cli::Cli`]). Its own binary and the image's multi-call `switchyard`
/// call it.
pub fn main() -> std::process::ExitCode {
    <cli::Cli as clap::Parser>::parse().run()
}

/// Serves the node's assigned stack until the agent fails.
pub async fn run(args: Args) -> Result<(), NodeAgentError> {
    let config = kube::Config::infer().await?;
    let client = kube::Client::try_from(switchyard_kube::watch::client_config(config))?;
    let (progress, watching) = tokio::sync::watch::channel(Progress::default());
    switchyard_runtime::health::spawn(args.health_listen, SERVICE.as_str(), watching);
    switchyard_runtime::metrics::metrics().register_with(switchyard_kubelet::metrics::register);
    switchyard_runtime::metrics::spawn(args.metrics_listen);
    tracing::info!(service = %SERVICE, node = %args.node, "starting");
    let options = NodeOptions {
        node: args.node,
        gpu_source: args.gpu_source,
        layout: args.layout,
        sharing: args.sharing,
        kubelet_dir: args.kubelet_dir,
        cdi_dir: args.cdi_dir,
        instance: args.pod_uid,
    };
    serve_node(client, options, move || {
        let _ = progress.send(Progress {
            ready: true,
            sequence: 0,
        });
    })
    .await
    .map_err(NodeAgentError::Agent)
}

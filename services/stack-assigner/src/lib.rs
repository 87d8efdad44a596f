//! stack-assigner: which stack serves each node, the upgrade hold, node handovers and their rollback.
//!
//! The decisions are the pure core `switchyard_core::stack_assigner`; this crate
//! is the service around it — its writers ([`edge`]), its flags and its
//! process, hosted by `switchyard_runtime`.

#![forbid(unsafe_code)]

pub mod edge;

use switchyard_api::rbac::Permission;
use switchyard_core::ServiceName;
use switchyard_core::cluster::{PodSelector, ReadinessSelectors};
use switchyard_core::names::{NODE_AGENT_SELECTOR, VENDOR_ADAPTER_SELECTOR};
use switchyard_core::stack_assigner::StackAssigner;
use switchyard_kube::write::EdgeError;
use switchyard_runtime::host::{self, ServeError, ServiceArgs};

pub use edge::StackAssignerEdge;

pub const SERVICE: ServiceName = ServiceName::StackAssigner;

/// What the stack-assigner may do: label and cordon nodes (Server-Side Apply
/// and read-decide-write patches), drain them through evictions, read the
/// budgets that refuse one; it watches what its rules read.
pub const PERMISSIONS: &[Permission] = &[
    Permission::new("", "nodes", &["get", "list", "watch", "patch"]),
    Permission::read("", "pods"),
    Permission::new("", "pods/eviction", &["create"]),
    Permission::read("policy", "poddisruptionbudgets"),
    Permission::read("deckhouse.io", "nodegroups"),
    Permission::read("deckhouse.io", "moduleconfigs"),
    Permission::new("", "events", &["create"]),
];

/// The flags of `switchyard-stack-assigner` (and `switchyard serve stack-assigner`).
#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    #[command(flatten)]
    pub service: ServiceArgs,
    #[command(flatten)]
    pub readiness: ReadinessArgs,
}

/// Which pods are "the gpu-node-agent and vendor adapter Pods" of a node's
/// readiness, in label-selector syntax. The defaults are the pods of
/// Switchyard's own chart; for Deckhouse's, `app=gpu-node-agent` and
/// `app=nvidia-dra-adapter`.
#[derive(clap::Args, Clone, Debug)]
pub struct ReadinessArgs {
    /// The node agent's pods (as deploy/helm/switchyard labels its DaemonSet's).
    #[arg(long, env = "SWITCHYARD_NODE_AGENT_SELECTOR", default_value = NODE_AGENT_SELECTOR, value_parser = node_agent_selector)]
    pub node_agent_selector: PodSelector,
    /// The vendor adapter's pods; empty: the deployment has none (Switchyard's
    /// node agent is the kubelet plugin of both stacks).
    #[arg(long, env = "SWITCHYARD_VENDOR_ADAPTER_SELECTOR", default_value = VENDOR_ADAPTER_SELECTOR, value_parser = PodSelector::parse)]
    pub vendor_adapter_selector: PodSelector,
}

fn node_agent_selector(text: &str) -> Result<PodSelector, String> {
    let parsed = PodSelector::parse(text).map_err(|e| e.to_string())?;
    if parsed.selector.is_none() {
        return Err("must not be empty: readiness needs the node agent's pod (e.g. app.kubernetes.io/component=node-agent)".into());
    }
    Ok(parsed)
}

impl ReadinessArgs {
    pub fn selectors(&self) -> ReadinessSelectors {
        ReadinessSelectors {
            node_agent: self.node_agent_selector.clone(),
            vendor_adapter: self.vendor_adapter_selector.clone(),
        }
    }
}

/// Runs the service against the cluster (in-cluster config or KUBECONFIG)
/// and the JetStream log until the log fails. The readiness selectors are
/// recorded in the log when they differ from the last record.
pub async fn run(args: Args) -> Result<(), ServeError<EdgeError>> {
    let edge = StackAssignerEdge::infer(args.service.host.parallel);
    let core = StackAssigner::with_selectors(args.readiness.selectors());
    host::serve_core(Box::new(core), &args.service, edge).await
}

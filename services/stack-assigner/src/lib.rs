//! stack-assigner: which stack serves each node, the upgrade hold, node handovers and their rollback.
//!
//! The decisions are the pure core `switchyard_core::stack_assigner`; this crate
//! is the service around it — its writers ([`edge`]), its flags and its
//! process, hosted by `switchyard_runtime`.

#![forbid(unsafe_code)]

pub mod edge;

use switchyard_api::rbac::Permission;
use switchyard_core::ServiceName;
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
];

/// The flags of `switchyard-stack-assigner` (and `switchyard serve stack-assigner`).
pub type Args = ServiceArgs;

/// Runs the service against the cluster (in-cluster config or KUBECONFIG)
/// and the JetStream log until the log fails.
pub async fn run(args: Args) -> Result<(), ServeError<EdgeError>> {
    let edge = StackAssignerEdge::infer(args.host.parallel);
    host::serve(SERVICE, &args, edge).await
}

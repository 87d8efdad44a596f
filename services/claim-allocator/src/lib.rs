//! claim-allocator: application moves (manifest rewrite, restart, verification), their rollback, and completion (quotas, leftover labels, the source group).
//!
//! The decisions are the pure core `switchyard_core::claim_allocator`; this crate
//! is the service around it — its writers ([`edge`]), its flags and its
//! process, hosted by `switchyard_runtime`.

#![forbid(unsafe_code)]

pub mod edge;

use switchyard_api::rbac::Permission;
use switchyard_core::ServiceName;
use switchyard_kube::write::EdgeError;
use switchyard_runtime::host::{self, ServeError, ServiceArgs};

pub use edge::ClaimAllocatorEdge;

pub const SERVICE: ServiceName = ServiceName::ClaimAllocator;

/// What the claim-allocator may do: rewrite and restart workloads (moves),
/// translate quotas, clear nodes' leftover device-plugin labels and retire
/// the source group's `spec.gpu` (completion); it reads what verifying a move
/// needs.
pub const PERMISSIONS: &[Permission] = &[
    Permission::new("", "nodes", &["get", "patch"]),
    Permission::new("apps", "deployments", &["get", "list", "watch", "patch"]),
    Permission::new("apps", "statefulsets", &["get", "list", "watch", "patch"]),
    Permission::new("apps", "daemonsets", &["get", "list", "watch", "patch"]),
    Permission::new("batch", "cronjobs", &["get", "list", "watch", "patch"]),
    Permission::read("", "pods"),
    Permission::new("", "resourcequotas", &["get", "list", "watch", "patch"]),
    Permission::new(
        "deckhouse.io",
        "nodegroups",
        &["get", "list", "watch", "patch"],
    ),
    Permission::read("resource.k8s.io", "resourceclaims"),
    Permission::read("resource.k8s.io", "resourceslices"),
    Permission::read("resource.k8s.io", "deviceclasses"),
    Permission::new(
        "resource.k8s.io",
        "resourceclaims/status",
        &["patch", "update"],
    ),
];

/// The flags of `switchyard-claim-allocator` (and `switchyard serve claim-allocator`).
pub type Args = ServiceArgs;

/// `switchyard-claim-allocator` as a process: its flags, logs and traces, and
/// [`run`]. Its own binary and the image's multi-call `switchyard` call it.
pub fn main() -> std::process::ExitCode {
    switchyard_runtime::service_main(
        "switchyard-claim-allocator",
        "Switchyard's claim-allocator",
        run,
    )
}

/// Runs the service against the cluster (in-cluster config or KUBECONFIG)
/// and the JetStream log until the log fails.
pub async fn run(args: Args) -> Result<(), ServeError<EdgeError>> {
    let edge = ClaimAllocatorEdge::infer(args.host.parallel);
    host::serve(SERVICE, &args, edge).await
}

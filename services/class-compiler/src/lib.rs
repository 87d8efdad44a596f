//! class-compiler: GPU classes compiled into DeviceClasses, their namespace restriction and status.
//!
//! The decisions are the pure core `switchyard_core::class_compiler`; this crate
//! is the service around it — its writers ([`edge`]), its flags and its
//! process, hosted by `switchyard_runtime`.

#![forbid(unsafe_code)]

pub mod edge;

use switchyard_api::rbac::Permission;
use switchyard_core::ServiceName;
use switchyard_kube::write::EdgeError;
use switchyard_runtime::host::{self, ServeError, ServiceArgs};

pub use edge::ClassCompilerEdge;

pub const SERVICE: ServiceName = ServiceName::ClassCompiler;

/// What the class-compiler may do: publish a GPUClass's DeviceClasses and
/// status, and its namespace restriction (an admission policy and binding).
pub const PERMISSIONS: &[Permission] = &[
    Permission::read("gpu.deckhouse.io", "gpuclasses"),
    Permission::read("gpu.deckhouse.io", "physicalgpus"),
    Permission::new(
        "gpu.deckhouse.io",
        "gpuclasses/status",
        &["patch", "update"],
    ),
    Permission::new(
        "resource.k8s.io",
        "deviceclasses",
        &["get", "list", "watch", "create", "patch", "delete"],
    ),
    Permission::new(
        "admissionregistration.k8s.io",
        "validatingadmissionpolicies",
        &["get", "create", "patch", "delete"],
    ),
    Permission::new(
        "admissionregistration.k8s.io",
        "validatingadmissionpolicybindings",
        &["get", "create", "patch", "delete"],
    ),
];

/// The flags of `switchyard-class-compiler` (and `switchyard serve class-compiler`).
pub type Args = ServiceArgs;

/// `switchyard-class-compiler` as a process: its flags, logs and traces, and
/// [`run`]. Its own binary and the image's multi-call `switchyard` call it.
pub fn main() -> std::process::ExitCode {
    switchyard_runtime::service_main(
        "switchyard-class-compiler",
        "Switchyard's class-compiler",
        run,
    )
}

/// Runs the service against the cluster (in-cluster config or KUBECONFIG)
/// and the JetStream log until the log fails.
pub async fn run(args: Args) -> Result<(), ServeError<EdgeError>> {
    let edge = ClassCompilerEdge::infer(args.host.parallel);
    host::serve(SERVICE, &args, edge).await
}

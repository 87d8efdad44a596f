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

use switchyard_api::rbac::Permission;
use switchyard_core::ServiceName;
use switchyard_core::effects::{NoEffects, NotExecuted};
use switchyard_runtime::host::{self, ServeError, ServiceArgs};

pub const SERVICE: ServiceName = ServiceName::Alerter;

/// What the alerter may do, in its own namespace (a Role): record Events.
pub const PERMISSIONS: &[Permission] = &[Permission::new("", "events", &["create", "patch"])];

/// The flags of `switchyard-alerter` (and `switchyard serve alerter`).
pub type Args = ServiceArgs;

/// Runs the service on the JetStream log until the log fails.
pub async fn run(args: Args) -> Result<(), ServeError<NotExecuted>> {
    host::serve(SERVICE, &args, async { Ok(NoEffects) }).await
}

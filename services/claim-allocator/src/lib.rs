//! claim-allocator: application moves (manifest rewrite, restart, verification), their rollback, and completion (quotas, leftover labels, the source group).
//!
//! The decisions are the pure core `switchyard_core::claim_allocator`; this crate
//! is the service around it — its writers ([`edge`]), its flags and its
//! process, hosted by `switchyard_runtime`.

#![forbid(unsafe_code)]

pub mod edge;

use switchyard_core::ServiceName;
use switchyard_kube::write::{EdgeError, Writer};
use switchyard_runtime::connect::NatsArgs;
use switchyard_runtime::host::{self, HostArgs, ServeError};

pub use edge::ClaimAllocatorEdge;

pub const SERVICE: ServiceName = ServiceName::ClaimAllocator;

/// The flags of `switchyard-claim-allocator` (and `switchyard serve claim-allocator`).
#[derive(clap::Args, Debug, Clone)]
pub struct Args {
    #[command(flatten)]
    pub nats: NatsArgs,
    #[command(flatten)]
    pub host: HostArgs,
    /// How many objects the service writes at once.
    #[arg(long, env = "SWITCHYARD_PARALLEL", default_value_t = 16)]
    pub parallel: usize,
}

/// Runs the service against the cluster (in-cluster config or KUBECONFIG)
/// and the JetStream log until the log fails.
pub async fn run(args: Args) -> Result<(), ServeError<EdgeError>> {
    let edge = async {
        let writer = Writer::infer(SERVICE).await?.with_parallel(args.parallel);
        Ok(ClaimAllocatorEdge::new(writer))
    };
    host::serve(SERVICE, &args.nats, &args.host, edge).await
}

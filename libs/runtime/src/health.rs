//! The gRPC health protocol (`grpc.health.v1`) for probes: not serving until
//! the service is ready (rebuilt from the log, or acting on its node's
//! assignment), serving from then on.

use std::net::SocketAddr;

use tokio::sync::watch;

/// Serves health on `listen` until the server fails; `service` is the name
/// probes may ask for besides the empty one.
pub async fn serve(
    listen: SocketAddr,
    service: &'static str,
    mut progress: watch::Receiver<Progress>,
) -> Result<(), tonic::transport::Error> {
    let (reporter, server) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
    tokio::spawn(async move {
        // Ready already (an observer is at once), or once it becomes so.
        loop {
            if progress.borrow_and_update().ready {
                reporter
                    .set_service_status("", tonic_health::ServingStatus::Serving)
                    .await;
                reporter
                    .set_service_status(service, tonic_health::ServingStatus::Serving)
                    .await;
                break;
            }
            if progress.changed().await.is_err() {
                break;
            }
        }
    });
    tonic::transport::Server::builder()
        .add_service(server)
        .serve(listen)
        .await
}

/// Starts [`serve`] in the background when `listen` is given; a failure is logged.
pub fn spawn(
    listen: Option<SocketAddr>,
    service: &'static str,
    progress: watch::Receiver<Progress>,
) {
    if let Some(listen) = listen {
        tokio::spawn(async move {
            if let Err(err) = serve(listen, service, progress).await {
                tracing::error!(%err, %listen, "the health server stopped");
            }
        });
    }
}

/// What the host reports to probes: the sequence up to which it has caught up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// True once the rebuild from the log is done.
    pub ready: bool,
    pub sequence: u64,
}

//! The conformance suite on the NATS JetStream backend, against a real nats-server.

use switchyard_eventlog::nats::{NatsLog, NatsOptions};
use switchyard_testkit::nats::NatsServer;

async fn nats() -> (NatsLog, NatsServer) {
    let server = tokio::task::spawn_blocking(NatsServer::start)
        .await
        .expect("start nats-server");
    let log = NatsLog::connect(&server.url(), NatsOptions::default())
        .await
        .expect("connect");
    (log, server)
}

switchyard_eventlog::conformance_suite!(nats());

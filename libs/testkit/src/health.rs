//! Probing a process's gRPC health server (`grpc.health.v1`) as kubelet's
//! probes do.

/// Whether the health server on loopback `port` answers SERVING for the
/// whole server (service `""`); `false` while it does not listen yet.
pub async fn serving(port: u16) -> bool {
    let Ok(endpoint) = tonic::transport::Endpoint::try_from(format!("http://127.0.0.1:{port}"))
    else {
        return false;
    };
    let Ok(channel) = endpoint.connect().await else {
        return false;
    };
    let answer = tonic_health::pb::health_client::HealthClient::new(channel)
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await;
    answer.is_ok_and(|a| {
        a.into_inner().status
            == tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    })
}

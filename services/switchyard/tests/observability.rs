//! What an integration sees of a handover on a real cluster (the control
//! plane, kwok, JetStream, the services and node agents as processes): one
//! OpenTelemetry trace across the CLI, every service and the node agent,
//! read back from a real Jaeger.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::Api;
use support::*;
use switchyard_core::names::TRACEPARENT_ANNOTATION;
use switchyard_eventlog::{Decoded, ReadRequest};
use switchyard_proto::v1::domain_event::Kind;
use switchyard_testkit::eventually;
use switchyard_testkit::jaeger::{Jaeger, Trace};
use switchyard_testkit::reference::cli_command;

/// The `switchyard` CLI under test.
fn switchyard() -> &'static std::path::Path {
    std::path::Path::new(env!("CARGO_BIN_EXE_switchyard"))
}

/// The trace id of a W3C traceparent (`00-<trace id>-<span id>-<flags>`).
fn trace_id(traceparent: &str) -> &str {
    traceparent.split('-').nth(1).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_is_one_trace_across_the_cli_the_services_and_the_node_agent() {
    let jaeger = Jaeger::start().await;
    let otel: Vec<(String, String)> = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", jaeger.otlp_endpoint()),
        // Batches sent every 100 ms, not 5 s: the test reads them back.
        ("OTEL_BSP_SCHEDULE_DELAY", "100".to_string()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let nodes = ["gpu-0".to_string(), "gpu-1".to_string()];
    let cluster = MigrationCluster::start(ClusterOptions {
        nodes: &nodes,
        gpus_per_node: 8,
        binary: switchyard_testkit::bins::binary,
        service_env: otel.clone(),
        agent_env: otel.clone(),
        previous_version: None,
        toxics: &[],
        flow_shares: None,
    })
    .await;
    let world = &cluster.world;

    let out = cli_command(
        switchyard(),
        &world.nats.url(),
        &world.plane.kubeconfig(),
        &[
            "handover", "--node", "gpu-0", "--to", "gpu-dra", "--id", "h-gpu-0", "--wait",
        ],
    )
    .envs(otel.iter().map(|(k, v)| (k, v)))
    .output()
    .expect("run switchyard handover");
    assert!(
        out.status.success(),
        "{}\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        world.output()
    );

    // The CLI's span is the root: it flushed it before it exited.
    let roots = jaeger
        .traces("switchyard", "send StartHandover")
        .await
        .expect("ask Jaeger");
    assert_eq!(roots.len(), 1, "the CLI's traces: {roots:?}");
    let id = roots[0]["traceID"].as_str().expect("traceID").to_string();

    // Every service's part arrives with its next batch.
    let everyone: BTreeSet<&str> = [
        "switchyard",
        "stack-assigner",
        "claim-allocator",
        "class-compiler",
        "alerter",
        "node-agent",
    ]
    .into();
    let complete = |trace: &Trace| {
        trace.services().is_superset(&everyone)
            && trace.named("node-agent", "switch to dra").count() > 0
            && trace
                .named("stack-assigner", "decide HandoverCompleted")
                .count()
                > 0
    };
    let arrived = eventually(
        "every service's spans in the handover's trace",
        Duration::from_secs(30),
        || async { jaeger.trace(&id).await.is_ok_and(|t| complete(&t)) },
    )
    .await;
    let trace = jaeger.trace(&id).await.unwrap_or_default();
    assert!(
        arrived.is_ok(),
        "{arrived:?}: the trace has spans of {:?}:\n{:#?}",
        trace.services(),
        trace.spans
    );
    let root: Vec<_> = trace.spans.iter().filter(|s| s.parent.is_none()).collect();
    assert_eq!(root.len(), 1, "one root: {root:#?}");
    assert_eq!(
        (root[0].service.as_str(), root[0].name.as_str()),
        ("switchyard", "send StartHandover")
    );
    assert!(
        trace.orphans().is_empty(),
        "spans whose parent is not in the trace: {:#?}",
        trace.orphans()
    );
    for (service, name) in [
        ("stack-assigner", "command StartHandover"),
        ("stack-assigner", "decide HandoverStarted"),
        ("stack-assigner", "write Cordon"),
        ("stack-assigner", "write MoveToGroup"),
        ("stack-assigner", "write SetStackLabel"),
        ("stack-assigner", "write Uncordon"),
        ("claim-allocator", "handle HandoverStarted"),
        ("alerter", "handle HandoverCompleted"),
    ] {
        assert!(
            trace.named(service, name).count() > 0,
            "no {service} span {name:?} in\n{:#?}",
            trace.spans
        );
    }

    // The records of the handover carry the trace and its process.
    let records = world
        .log()
        .await
        .read(ReadRequest {
            subject: Some("node.gpu-0".parse().unwrap()),
            from: 1,
            limit: None,
        })
        .await
        .expect("read gpu-0's records");
    let mut steps = BTreeSet::new();
    for stored in &records {
        let Decoded::Event(event) = stored.decode() else {
            continue;
        };
        let step = matches!(
            event.kind,
            Some(
                Kind::HandoverStarted(_)
                    | Kind::NodeCordoned(_)
                    | Kind::NodeDrained(_)
                    | Kind::NodeGroupChanged(_)
                    | Kind::NodeUncordoned(_)
                    | Kind::HandoverCompleted(_)
            )
        );
        if !step {
            continue;
        }
        let envelope = &stored.envelope;
        steps.insert(envelope.event_type.clone());
        let traceparent = envelope
            .trace
            .as_ref()
            .map(|t| t.traceparent.as_str())
            .unwrap_or_default();
        assert_eq!(
            trace_id(traceparent),
            id,
            "{} (sequence {}) is in another trace: {traceparent:?}",
            envelope.event_type,
            stored.sequence
        );
        assert_eq!(
            envelope.correlation_id, "h-gpu-0",
            "{}",
            envelope.event_type
        );
    }
    assert_eq!(
        steps.len(),
        6,
        "the handover's six steps in gpu-0's records: {steps:?}"
    );

    // The node says which trace its stack was set in.
    let node = Api::<Node>::all(world.client.clone())
        .get("gpu-0")
        .await
        .expect("gpu-0");
    let annotation = node
        .annotations()
        .get(TRACEPARENT_ANNOTATION)
        .cloned()
        .unwrap_or_default();
    assert_eq!(trace_id(&annotation), id, "{TRACEPARENT_ANNOTATION}");
}

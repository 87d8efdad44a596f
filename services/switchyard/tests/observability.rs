//! What an integration sees of a handover on a real cluster (the control
//! plane, kwok, JetStream, the services and node agents as processes): one
//! OpenTelemetry trace across the CLI, every service and the node agent,
//! read back from a real Jaeger; and the handover's events as CloudEvents,
//! received by the stock `nats` CLI, in order, each valid against its
//! JSON Schema.

mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::Api;
use serde_json::Value;
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

/// `nats sub` of the stock CLI (natscli), each message it prints (`--dump=-`:
/// a JSON object per message, NUL-terminated) sent on as it comes.
struct Subscriber {
    _process: switchyard_testkit::KillOnDrop,
    messages: std::sync::mpsc::Receiver<Value>,
}

impl Subscriber {
    /// Subscribes to `subject` from the start of the stream that keeps it
    /// (`--all`: what was published before, then live).
    fn start(nats_url: &str, subject: &str) -> Subscriber {
        let nats = switchyard_testkit::natscli_binary().unwrap_or_else(|e| panic!("{e}"));
        let mut child = std::process::Command::new(nats)
            .args(["--server", nats_url, "sub", subject, "--all", "--dump=-"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start nats sub");
        let stdout = child.stdout.take().expect("stdout");
        let (send, messages) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for message in std::io::BufReader::new(stdout).split(0) {
                let Ok(bytes) = message else { return };
                let text = String::from_utf8_lossy(&bytes);
                let text = text.trim();
                if text.is_empty() {
                    continue;
                }
                let value = serde_json::from_str(text)
                    .unwrap_or_else(|e| panic!("nats sub printed no JSON ({e}): {text}"));
                if send.send(value).is_err() {
                    return;
                }
            }
        });
        Subscriber {
            _process: switchyard_testkit::KillOnDrop(child),
            messages,
        }
    }

    /// Messages until one `until` holds (it included), at most `timeout`.
    fn until(
        &self,
        timeout: Duration,
        until: impl Fn(&Value) -> bool,
    ) -> Result<Vec<Value>, Vec<Value>> {
        let deadline = std::time::Instant::now() + timeout;
        let mut got = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.messages.recv_timeout(left) {
                Ok(message) => {
                    let done = until(&message);
                    got.push(message);
                    if done {
                        return Ok(got);
                    }
                }
                Err(_) => return Err(got),
            }
        }
    }
}

/// A dumped message's body (base64 in natscli's dump) as JSON.
fn body(message: &Value) -> Value {
    use base64::Engine;
    let data = message["Data"].as_str().unwrap_or_default();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data)
        .unwrap_or_else(|e| panic!("{message}: Data is no base64: {e}"));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{message}: no JSON body: {e}"))
}

/// A dumped message's header `name` (its first value).
fn header<'a>(message: &'a Value, name: &str) -> Option<&'a str> {
    message["Header"][name][0].as_str()
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
        nats_servers: 1,
        replicas: 1,
    })
    .await;
    let world = &cluster.world;

    // An integration subscribes with the stock CLI before the handover.
    let js = async_nats::jetstream::new(
        async_nats::connect(world.nats.url())
            .await
            .expect("connect"),
    );
    world
        .until("the alerter to make the CloudEvents' stream", || async {
            js.get_stream("SWITCHYARD_EVENTS").await.is_ok()
        })
        .await;
    let subscriber = Subscriber::start(&world.nats.url(), "switchyard.events.>");

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
    // The spans of each step; the last ones (the alerter's of the handover's
    // end) arrive with a later batch than the stack-assigner's.
    let expected = [
        ("node-agent", "switch to dra"),
        ("stack-assigner", "command StartHandover"),
        ("stack-assigner", "decide HandoverStarted"),
        ("stack-assigner", "write Cordon"),
        ("stack-assigner", "write MoveToGroup"),
        ("stack-assigner", "write SetStackLabel"),
        ("stack-assigner", "write Uncordon"),
        ("stack-assigner", "decide HandoverCompleted"),
        ("claim-allocator", "handle HandoverStarted"),
        ("alerter", "handle HandoverCompleted"),
    ];
    let complete = |trace: &Trace| {
        trace.services().is_superset(&everyone)
            && expected
                .iter()
                .all(|(service, name)| trace.named(service, name).count() > 0)
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
    for (service, name) in expected {
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
                    | Kind::NodeReadinessObserved(_)
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
        7,
        "the handover's seven steps in gpu-0's records: {steps:?}"
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

    // The CloudEvents: every one valid, the handover's in order, in its trace.
    let received = subscriber
        .until(Duration::from_secs(30), |message| {
            let event = body(message);
            event["type"] == "io.switchyard.handover.completed"
                && event["correlationid"] == "h-gpu-0"
        })
        .unwrap_or_else(|got| {
            panic!(
                "no handover.completed for h-gpu-0 among {} CloudEvents:\n{got:#?}",
                got.len()
            )
        });
    let mut validators = std::collections::BTreeMap::new();
    let mut last_sequence = 0u64;
    let mut handover = Vec::new();
    for message in &received {
        let event = body(message);
        let ce_type = event["type"].as_str().expect("type").to_string();
        for attribute in [
            "specversion",
            "id",
            "source",
            "type",
            "subject",
            "time",
            "sequence",
        ] {
            assert!(
                event[attribute].is_string(),
                "{attribute} missing from {event}"
            );
        }
        assert_eq!(event["specversion"], "1.0");
        assert_eq!(
            message["Subject"].as_str(),
            Some(
                format!(
                    "switchyard.events.{}",
                    ce_type.trim_start_matches("io.switchyard.")
                )
                .as_str()
            )
        );
        assert_eq!(
            header(message, "content-type"),
            Some("application/cloudevents+json")
        );
        assert_eq!(header(message, "Nats-Msg-Id"), event["id"].as_str());
        let sequence: u64 = event["sequence"]
            .as_str()
            .unwrap()
            .parse()
            .expect("a sequence");
        assert!(
            sequence > last_sequence,
            "{sequence} after {last_sequence}: out of log order"
        );
        last_sequence = sequence;
        let validator = validators.entry(ce_type.clone()).or_insert_with(|| {
            let schema = switchyard_proto::schema::event_schema(&ce_type)
                .unwrap_or_else(|| panic!("no schema for {ce_type}"));
            assert_eq!(event["dataschema"], schema["$id"], "{ce_type}");
            jsonschema::validator_for(&schema).expect("a valid schema")
        });
        let errors: Vec<String> = validator
            .iter_errors(&event["data"])
            .map(|e| e.to_string())
            .collect();
        assert!(
            errors.is_empty(),
            "{ce_type}: {errors:?}\n{}",
            event["data"]
        );
        if event["correlationid"] == "h-gpu-0" {
            assert_eq!(
                trace_id(event["traceparent"].as_str().unwrap_or_default()),
                id,
                "{ce_type} is not in the handover's trace"
            );
            handover.push(ce_type);
        }
    }
    assert_eq!(
        handover,
        [
            "io.switchyard.handover.started",
            "io.switchyard.node.cordoned",
            "io.switchyard.node.drained",
            "io.switchyard.node.group_changed",
            "io.switchyard.node_readiness.observed",
            "io.switchyard.node.uncordoned",
            "io.switchyard.handover.completed",
        ],
        "the handover's CloudEvents, in the order received"
    );

    // The Python example of the docs (nats-py) replays them from the stream.
    let python = switchyard_testkit::nats_py_python().unwrap_or_else(|e| panic!("{e}"));
    let example = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/integrations/follow_migration.py"
    );
    let child = tokio::process::Command::new(python)
        .arg(example)
        .args(["--server", &world.nats.url()])
        .args([
            "--subject",
            "switchyard.events.handover.>",
            "--all",
            "--count",
            "2",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run the Python example");
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .expect("the Python example to stop after two events")
        .expect("the Python example's output");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line:?}: {e}")))
        .collect();
    let seen: Vec<(&str, &str, &str)> = lines
        .iter()
        .map(|l| {
            (
                l["type"].as_str().unwrap_or_default(),
                l["correlationid"].as_str().unwrap_or_default(),
                l["trace_id"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("io.switchyard.handover.started", "h-gpu-0", id.as_str()),
            ("io.switchyard.handover.completed", "h-gpu-0", id.as_str()),
        ]
    );
}

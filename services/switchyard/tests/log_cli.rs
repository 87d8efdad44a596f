//! `switchyard log show` / `log verify` run as a user would: the real binary,
//! against an embedded log directory and against a real nats-server.

use std::path::Path;
use std::process::{Command, Output};

use switchyard_eventlog::embedded::{EmbeddedLog, EmbeddedOptions};
use switchyard_eventlog::nats::{NatsLog, NatsOptions};
use switchyard_eventlog::{EventLog, Expected, NewEvent, Subject};
use switchyard_proto::v1::{NodeCordoned, NodeGroupChanged, TraceContext, domain_event::Kind};
use switchyard_testkit::nats::NatsServer;

fn switchyard(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(args)
        .output()
        .expect("run switchyard")
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).unwrap()
}

/// The same little handover on any backend.
async fn write_handover(log: &dyn EventLog) {
    let node = Subject::new("node.worker-1").unwrap();
    let mut cordoned = NewEvent::new(
        "h1-cordon",
        1_764_000_000_000_000_000,
        Kind::NodeCordoned(NodeCordoned {
            handover_id: "h1".into(),
            node: "worker-1".into(),
            was_unschedulable: false,
            to_evict: Vec::new(),
        })
        .into(),
    )
    .with_actor("stack-assigner")
    .with_correlation("migration-1");
    cordoned.trace = Some(TraceContext {
        traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
        tracestate: String::new(),
    });
    let moved = NewEvent::new(
        "h1-move",
        1_764_000_001_000_000_000,
        Kind::NodeGroupChanged(NodeGroupChanged {
            handover_id: "h1".into(),
            node: "worker-1".into(),
            from_group: "gpu".into(),
            to_group: "gpu-dra".into(),
            labels_before: [("node.deckhouse.io/group".to_string(), "gpu".to_string())].into(),
            labels_after: [("node.deckhouse.io/group".to_string(), "gpu-dra".to_string())].into(),
            ..Default::default()
        })
        .into(),
    )
    .with_actor("stack-assigner")
    .with_causation("h1-cordon");
    log.append(&node, Expected::Empty, vec![cordoned, moved])
        .await
        .unwrap();
    let group = Subject::new("group.gpu").unwrap();
    log.append(
        &group,
        Expected::Empty,
        vec![NewEvent::new(
            "g1",
            5,
            Kind::NodeCordoned(NodeCordoned::default()).into(),
        )],
    )
    .await
    .unwrap();
}

async fn embedded_log(dir: &Path) {
    let log = EmbeddedLog::open(dir, EmbeddedOptions::default()).unwrap();
    write_handover(&log).await;
    log.close();
}

#[tokio::test]
async fn show_prints_envelopes_and_decoded_payloads() {
    let dir = tempfile::tempdir().unwrap();
    embedded_log(dir.path()).await;
    let data_dir = dir.path().to_str().unwrap();

    let out = switchyard(&["log", "show", "--data-dir", data_dir, "-o", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = stdout(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    let first = &lines[0];
    assert_eq!(first["sequence"], 1);
    assert_eq!(first["id"], "h1-cordon");
    assert_eq!(first["subject"], "node.worker-1");
    assert_eq!(first["actor"], "stack-assigner");
    assert_eq!(first["correlation_id"], "migration-1");
    assert_eq!(first["recorded_at"], "2025-11-24T16:00:00.000000000Z");
    assert_eq!(
        first["trace"]["traceparent"],
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    );
    assert_eq!(first["event_type"], "NodeCordoned");
    assert_eq!(first["schema_version"], 1);
    assert_eq!(first["prev_hash"], "");
    assert_eq!(first["payload"]["node_cordoned"]["node"], "worker-1");
    let second = &lines[1];
    assert_eq!(
        second["prev_hash"], first["hash"],
        "the subject's hash chain"
    );
    assert_eq!(second["causation_id"], "h1-cordon");
    assert_eq!(
        second["payload"]["node_group_changed"]["labels_before"]["node.deckhouse.io/group"],
        "gpu"
    );

    let out = switchyard(&[
        "log",
        "show",
        "--data-dir",
        data_dir,
        "--subject",
        "group.gpu",
        "-o",
        "json",
    ]);
    let ids: Vec<String> = stdout(&out)
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["id"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(ids, ["g1"]);

    let out = switchyard(&[
        "log",
        "show",
        "--data-dir",
        data_dir,
        "--from",
        "2",
        "--limit",
        "1",
    ]);
    let table = stdout(&out);
    let rows: Vec<&str> = table.lines().collect();
    assert_eq!(rows.len(), 2, "{table}");
    assert!(rows[0].contains("SEQ") && rows[0].contains("SUBJECT"));
    assert!(
        rows[1].contains("h1-move") && rows[1].contains("NodeGroupChanged"),
        "{table}"
    );

    let out = switchyard(&[
        "log",
        "show",
        "--data-dir",
        data_dir,
        "--subject",
        "bad subject",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid subject \"bad subject\""));
}

#[tokio::test]
async fn verify_passes_a_sound_log_and_names_segment_and_offset_of_damage() {
    let dir = tempfile::tempdir().unwrap();
    embedded_log(dir.path()).await;
    let data_dir = dir.path().to_str().unwrap();
    let out = switchyard(&["log", "verify", "--data-dir", data_dir]);
    assert!(out.status.success(), "{}", stdout(&out));
    assert!(
        stdout(&out).starts_with("ok: 3 records, 2 subjects, last sequence 3"),
        "{}",
        stdout(&out)
    );

    // Flip one byte inside the second record's body.
    let segment = dir.path().join("00000000000000000001.seg");
    let mut data = std::fs::read(&segment).unwrap();
    let first_len = u32::from_le_bytes(data[28..32].try_into().unwrap()) as usize;
    let second = 24 + 49 + first_len;
    data[second + 49 + 10] ^= 0x01;
    std::fs::write(&segment, data).unwrap();

    let out = switchyard(&["log", "verify", "--data-dir", data_dir, "-o", "json"]);
    assert_eq!(out.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    assert_eq!(report["ok"], false);
    assert_eq!(
        report["problems"][0]["location"],
        format!("{} @ byte {second}", segment.display())
    );
    assert!(
        report["problems"][0]["what"]
            .as_str()
            .unwrap()
            .contains("checksum")
    );

    let out = switchyard(&["log", "show", "--data-dir", data_dir]);
    assert!(
        !out.status.success(),
        "a damaged log is not shown as if it were whole"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains(&format!("byte offset {second}")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_log_shows_the_same_records_as_the_embedded_log() {
    let server = tokio::task::spawn_blocking(NatsServer::start)
        .await
        .unwrap();
    let log = NatsLog::connect(
        &server.url(),
        NatsOptions {
            stream: "AUDIT".into(),
            ..NatsOptions::default()
        },
    )
    .await
    .unwrap();
    write_handover(&log).await;
    let dir = tempfile::tempdir().unwrap();
    embedded_log(dir.path()).await;

    let url = server.url();
    let from_nats = switchyard(&[
        "log", "show", "--nats", &url, "--stream", "AUDIT", "-o", "json",
    ]);
    assert!(
        from_nats.status.success(),
        "{}",
        String::from_utf8_lossy(&from_nats.stderr)
    );
    let from_dir = switchyard(&[
        "log",
        "show",
        "--data-dir",
        dir.path().to_str().unwrap(),
        "-o",
        "json",
    ]);
    assert_eq!(stdout(&from_nats).lines().count(), 3);
    assert_eq!(
        stdout(&from_nats),
        stdout(&from_dir),
        "both backends store byte-identical records"
    );

    let out = switchyard(&["log", "verify", "--nats", &url, "--stream", "AUDIT"]);
    assert!(out.status.success(), "{}", stdout(&out));
    assert!(
        stdout(&out).starts_with("ok: 3 records, 2 subjects"),
        "{}",
        stdout(&out)
    );

    let out = switchyard(&["log", "show", "--nats", &url, "--stream", "MISSING"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("MISSING"));
}

/// The stream is Switchyard's own: `log init` makes it once; a stream an
/// administrator altered (a message limit that would cut the log) is named
/// by `log verify` and refused by every service and command; a stream
/// deleted is never silently made again by a service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_altered_or_deleted_stream_is_refused_never_recreated() {
    let server = tokio::task::spawn_blocking(NatsServer::start)
        .await
        .unwrap();
    let url = server.url();
    let out = switchyard(&["log", "init", "--nats-url", &url]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout(&out).starts_with("created stream SWITCHYARD_LOG on switchyard.log.>"),
        "{}",
        stdout(&out)
    );
    let log = NatsLog::connect(
        &url,
        NatsOptions {
            create: false,
            ..NatsOptions::default()
        },
    )
    .await
    .expect("the stream log init made is the log");
    write_handover(&log).await;
    let out = switchyard(&["log", "init", "--nats-url", &url]);
    assert!(
        stdout(&out).contains("exists and is configured as the log must be (3 records)"),
        "{}",
        stdout(&out)
    );

    // An administrator caps the stream at 10 messages.
    let js = async_nats::jetstream::new(log.client().clone());
    let mut config = js
        .get_stream("SWITCHYARD_LOG")
        .await
        .unwrap()
        .cached_info()
        .config
        .clone();
    config.max_messages = 10;
    js.update_stream(config).await.expect("update the stream");
    let out = switchyard(&["log", "verify", "--nats", &url]);
    assert!(!out.status.success(), "{}", stdout(&out));
    assert!(
        stdout(&out).contains("max_msgs is 10; the log must have no message limit (-1)"),
        "{}",
        stdout(&out)
    );
    let out = switchyard(&["log", "show", "--nats", &url]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not configured as Switchyard's log must be"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Deleted: a service (opening as every service does) refuses to start
    // over on an empty stream.
    js.delete_stream("SWITCHYARD_LOG")
        .await
        .expect("delete the stream");
    let args = switchyard_runtime::connect::NatsArgs {
        nats_url: url.clone(),
        auth: Default::default(),
        signing_key: None,
        stream: switchyard_runtime::connect::StreamArgs {
            stream: "SWITCHYARD_LOG".into(),
            subject_prefix: "switchyard.log".into(),
            stream_replicas: 1,
        },
    };
    let client = args.service_client("stack-assigner").await.unwrap();
    let err = match args.log(client).await {
        Ok(_) => panic!("a service opened a log that does not exist"),
        Err(err) => err.to_string(),
    };
    assert!(
        err.contains("create it once with `switchyard log init`"),
        "{err}"
    );
    assert!(
        js.get_stream("SWITCHYARD_LOG").await.is_err(),
        "nothing made the stream again"
    );
}

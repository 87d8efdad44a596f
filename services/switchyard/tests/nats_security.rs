//! The bus as the chart secures it, on a real nats-server running the
//! authorization `helm template` renders from the keys `switchyard keys chart`
//! made: each identity does what its role needs and is refused the rest, and
//! what a stolen service key can still publish is named by `log verify`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use async_nats::jetstream;
use serde::Deserialize;
use switchyard_eventlog::{append_attributed, now_nanos};
use switchyard_proto::v1::{DomainEvent, ModuleSettingsObserved, NodeObserved, domain_event::Kind};
use switchyard_runtime::connect::{NatsArgs, NatsAuthArgs, StreamArgs};
use switchyard_testkit::helm_binary;
use switchyard_testkit::nats::{NatsOptions, NatsServer};
use tokio::sync::mpsc;

const STREAM: &str = "SWITCHYARD_LOG";

fn switchyard(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(args)
        .output()
        .expect("run switchyard")
}

/// What a release's keys and its rendered server configuration are.
struct Release {
    dir: tempfile::TempDir,
    /// The chart's `auth.conf`, as rendered.
    authorization: String,
}

impl Release {
    /// `switchyard keys chart`, an operator's `keys new`, and `helm template`
    /// of the chart with them.
    fn render() -> Release {
        let dir = tempfile::tempdir().unwrap();
        let keys = dir.path().join("keys");
        let out = switchyard(&["keys", "chart", "--out", keys.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let values = dir.path().join("values.yaml");
        std::fs::write(&values, &out.stdout).unwrap();
        let operator = dir.path().join("operator");
        let out = switchyard(&[
            "keys",
            "new",
            "--identity",
            "ops@example.com",
            "--seed-file",
            operator.to_str().unwrap(),
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let line = String::from_utf8_lossy(&out.stdout);
        let key = line
            .trim()
            .strip_prefix("ops@example.com: [")
            .and_then(|k| k.strip_suffix(']'))
            .unwrap_or_else(|| panic!("keys new printed {line:?}"));
        let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/helm/switchyard");
        let helm = helm_binary().unwrap_or_else(|e| panic!("{e}"));
        let out = Command::new(helm)
            .args(["template", "sy"])
            .arg(&chart)
            .arg("-f")
            .arg(&values)
            .args([
                "--set",
                "nats.bundled.enabled=true",
                "--set",
                "security.seedsSecret=sy-keys",
                "--set-json",
                &format!("security.operators={{\"ops@example.com\":[\"{key}\"]}}"),
            ])
            .output()
            .expect("run helm");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let config_map = |name: &str, key: &str| -> String {
            serde_yaml_ng::Deserializer::from_str(&text)
                .filter_map(|doc| serde_json::Value::deserialize(doc).ok())
                .find(|doc| doc["kind"] == "ConfigMap" && doc["metadata"]["name"] == name)
                .and_then(|doc| doc["data"][key].as_str().map(str::to_string))
                .unwrap_or_else(|| panic!("the chart renders ConfigMap {name} with {key}"))
        };
        let authorization = config_map("sy-switchyard-nats", "auth.conf");
        std::fs::write(
            dir.path().join("keyring.yaml"),
            config_map("sy-switchyard-keyring", "keyring.yaml"),
        )
        .unwrap();
        Release { dir, authorization }
    }

    fn seed(&self, identity: &str) -> PathBuf {
        match identity {
            "ops@example.com" => self.dir.path().join("operator"),
            service => self.dir.path().join("keys").join(service),
        }
    }

    fn keyring(&self) -> PathBuf {
        self.dir.path().join("keyring.yaml")
    }

    fn public_key(&self, identity: &str) -> String {
        switchyard_runtime::connect::read_seed(&self.seed(identity))
            .unwrap()
            .public_key()
    }

    fn args(&self, url: &str, identity: &str) -> NatsArgs {
        NatsArgs {
            nats_url: url.to_string(),
            auth: NatsAuthArgs {
                nats_nkey: Some(self.seed(identity)),
                ..NatsAuthArgs::default()
            },
            signing_key: Some(self.seed(identity)),
            stream: StreamArgs {
                stream: STREAM.into(),
                subject_prefix: "switchyard.log".into(),
                stream_replicas: 1,
            },
        }
    }

    /// A connection as `identity`, and the errors the server sends it.
    async fn connect(
        &self,
        url: &str,
        identity: &str,
    ) -> (async_nats::Client, mpsc::UnboundedReceiver<String>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let options = async_nats::ConnectOptions::new().event_callback(move |event| {
            let tx = tx.clone();
            async move {
                if let async_nats::Event::ServerError(err) = event {
                    let _ = tx.send(err.to_string());
                }
            }
        });
        let options = self.args(url, identity).auth.apply(options).await.unwrap();
        (options.connect(url).await.unwrap(), rx)
    }
}

/// Waits (up to 10 s) for the server to refuse something with a message
/// holding `expected`.
async fn refused(errors: &mut mpsc::UnboundedReceiver<String>, expected: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut seen = Vec::new();
    loop {
        match tokio::time::timeout_at(deadline, errors.recv()).await {
            Ok(Some(error)) if error.contains(expected) => return,
            Ok(Some(error)) => seen.push(error),
            Ok(None) | Err(_) => {
                panic!("the server did not refuse {expected:?}; it said {seen:?}")
            }
        }
    }
}

fn node(name: &str) -> DomainEvent {
    DomainEvent {
        kind: Some(Kind::NodeObserved(NodeObserved {
            node: name.into(),
            ..NodeObserved::default()
        })),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_identity_does_what_its_role_needs_and_nothing_else() {
    let release = Release::render();
    let server = tokio::task::spawn_blocking({
        let extra = release.authorization.clone();
        move || {
            NatsServer::start_with(NatsOptions {
                extra,
                ..NatsOptions::default()
            })
        }
    })
    .await
    .unwrap();
    let url = server.url();

    // No credentials: no connection.
    let anonymous = async_nats::ConnectOptions::new()
        .max_reconnects(Some(1))
        .connect(&url)
        .await;
    assert!(anonymous.is_err(), "an unauthenticated client connected");
    let out = switchyard(&["log", "init", "--nats-url", &url]);
    assert!(!out.status.success(), "log init without credentials worked");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("uthorization"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // log-init creates the stream; nothing else does.
    let seed = release.seed("log-init");
    let out = switchyard(&[
        "log",
        "init",
        "--nats-url",
        &url,
        "--nats-nkey",
        seed.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // A service appends its facts, signed, and follows the log.
    let inventory = release.args(&url, "inventory");
    let client = inventory.service_client("inventory").await.unwrap();
    let log = inventory.log(client).await.unwrap();
    append_attributed(
        log.as_ref(),
        "inventory",
        "inventory",
        &[(&node("n1"), "")],
        now_nanos(),
    )
    .await
    .unwrap();
    let mut follow = log.follow(None, 1).await.unwrap();
    let first = tokio::time::timeout(
        Duration::from_secs(10),
        futures::StreamExt::next(&mut follow),
    )
    .await
    .expect("the follower passes the record on")
    .expect("a record")
    .unwrap();
    assert_eq!(first.envelope.actor, "inventory");

    // An operator reads and verifies it.
    let operator_seed = release.seed("ops@example.com");
    let keyring = release.keyring();
    let verify = || {
        switchyard(&[
            "log",
            "verify",
            "--nats-url",
            &url,
            "--nats-nkey",
            operator_seed.to_str().unwrap(),
            "--keyring",
            keyring.to_str().unwrap(),
        ])
    };
    let out = verify();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // A service may not take another's commands, send commands, or read
    // another's replies.
    let (client, mut errors) = release.connect(&url, "inventory").await;
    let _sub = client
        .subscribe("switchyard.cmd.stack-assigner")
        .await
        .unwrap();
    refused(
        &mut errors,
        "Subscription to \"switchyard.cmd.stack-assigner\"",
    )
    .await;
    client
        .publish(
            "switchyard.cmd.stack-assigner",
            "24 bytes of a command".into(),
        )
        .await
        .unwrap();
    refused(&mut errors, "Publish to \"switchyard.cmd.stack-assigner\"").await;
    let theirs = format!("_INBOX.{}.>", release.public_key("stack-assigner"));
    let _sub = client.subscribe(theirs.clone()).await.unwrap();
    refused(&mut errors, &format!("Subscription to \"{theirs}\"")).await;

    // An operator may not answer commands in a service's place, nor append.
    let (client, mut errors) = release.connect(&url, "ops@example.com").await;
    let _sub = client.subscribe("switchyard.cmd.>").await.unwrap();
    refused(&mut errors, "Subscription to \"switchyard.cmd.>\"").await;
    client
        .publish("switchyard.log.node.n1", "not a record".into())
        .await
        .unwrap();
    refused(&mut errors, "Publish to \"switchyard.log.node.n1\"").await;

    // No service may alter, purge or delete the stream.
    let (client, mut errors) = release.connect(&url, "stack-assigner").await;
    let js = jetstream::ContextBuilder::new()
        .timeout(Duration::from_secs(2))
        .build(client);
    let shrunk = jetstream::stream::Config {
        name: STREAM.into(),
        subjects: vec!["switchyard.log.>".into()],
        max_messages: 10,
        ..Default::default()
    };
    assert!(
        js.update_stream(&shrunk).await.is_err(),
        "a service altered the stream"
    );
    refused(
        &mut errors,
        &format!("Publish to \"$JS.API.STREAM.UPDATE.{STREAM}\""),
    )
    .await;
    assert!(
        js.delete_stream(STREAM).await.is_err(),
        "a service deleted the stream"
    );
    refused(
        &mut errors,
        &format!("Publish to \"$JS.API.STREAM.DELETE.{STREAM}\""),
    )
    .await;
    assert!(
        js.create_stream(jetstream::stream::Config {
            name: "ANOTHER".into(),
            subjects: vec!["another.>".into()],
            ..Default::default()
        })
        .await
        .is_err(),
        "a service created a stream"
    );
    refused(&mut errors, "Publish to \"$JS.API.STREAM.CREATE.ANOTHER\"").await;

    // What a stolen service key can still publish on its own subjects: a
    // record claiming another author, and one of a kind it never writes.
    // Both are named.
    let assigner = release.args(&url, "stack-assigner");
    let client = assigner.service_client("stack-assigner").await.unwrap();
    let log = assigner.log(client).await.unwrap();
    let settings = DomainEvent {
        kind: Some(Kind::ModuleSettingsObserved(ModuleSettingsObserved {
            dra_enabled: false,
            ..ModuleSettingsObserved::default()
        })),
    };
    for actor in ["inventory", "stack-assigner"] {
        append_attributed(
            log.as_ref(),
            "stack-assigner",
            actor,
            &[(&settings, "")],
            now_nanos(),
        )
        .await
        .unwrap();
    }
    let out = verify();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let problems: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("problem:"))
        .collect();
    assert_eq!(problems.len(), 2, "{stdout}");
    assert!(
        problems[0].contains("claims to be written by inventory but is signed by stack-assigner"),
        "{stdout}"
    );
    assert!(
        problems[1].contains(
            "signed by stack-assigner, which never writes this kind of record (its author: inventory)"
        ),
        "{stdout}"
    );
    // The stream is as log-init made it, with every record.
    assert!(!stdout.contains("configured"), "{stdout}");
    assert_eq!(log.last_sequence(None).await.unwrap(), 3);
}

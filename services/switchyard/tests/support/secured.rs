//! A release secured as the chart does it: the keys `switchyard keys chart`
//! makes, an operator's key, and the server authorization and keyring
//! `helm template` renders from them.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;
use switchyard_runtime::connect::{NatsArgs, NatsAuthArgs, StreamArgs};
use switchyard_testkit::helm_binary;
use switchyard_testkit::migration::SecuredBus;
use tokio::sync::mpsc;

pub const STREAM: &str = "SWITCHYARD_LOG";
/// The operator whose key the release lists.
pub const OPERATOR: &str = "ops@example.com";

pub fn switchyard(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(args)
        .output()
        .expect("run switchyard")
}

/// What a release's keys and its rendered server configuration are.
pub struct Release {
    pub dir: tempfile::TempDir,
    /// The chart's `auth.conf`, as rendered.
    pub authorization: String,
}

impl Release {
    /// `switchyard keys chart`, an operator's `keys new`, and `helm template`
    /// of the chart with them.
    pub fn render() -> Release {
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

    pub fn seed(&self, identity: &str) -> PathBuf {
        match identity {
            "ops@example.com" => self.dir.path().join("operator"),
            service => self.dir.path().join("keys").join(service),
        }
    }

    pub fn keyring(&self) -> PathBuf {
        self.dir.path().join("keyring.yaml")
    }

    pub fn public_key(&self, identity: &str) -> String {
        switchyard_runtime::connect::read_seed(&self.seed(identity))
            .unwrap()
            .public_key()
    }

    pub fn args(&self, url: &str, identity: &str) -> NatsArgs {
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
    pub async fn connect(
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

impl Release {
    /// The bus of a world that runs on this release's authorization: the
    /// stream made with log-init's key, the harness reading as the operator.
    pub fn bus(&self) -> SecuredBus {
        SecuredBus {
            authorization: self.authorization.clone(),
            creator: self.seed("log-init"),
            reader: self.seed(OPERATOR),
        }
    }
}

//! Where a command reads the log: an embedded data directory or a JetStream
//! stream, reached with the same flags as every service.

use std::path::PathBuf;

use clap::Args;
use switchyard_eventlog::EventLog;
use switchyard_eventlog::embedded::EmbeddedLog;
use switchyard_eventlog::nats::NatsLog;
use switchyard_runtime::connect::NatsArgs;

/// Where the log lives: an embedded data directory or a JetStream stream
/// (the same `--nats-url`, `--nats-creds`, `--stream` as every service).
#[derive(Args, Debug, Clone)]
pub struct Backend {
    /// Directory of an embedded log.
    #[arg(
        long,
        env = "SWITCHYARD_DATA_DIR",
        required_unless_present = "nats_url",
        conflicts_with = "nats_url"
    )]
    pub data_dir: Option<PathBuf>,
    /// NATS server URL of a JetStream log, e.g. nats://127.0.0.1:4222.
    #[arg(long = "nats-url", alias = "nats", env = "SWITCHYARD_NATS_URL")]
    pub nats_url: Option<String>,
    #[command(flatten)]
    pub auth: switchyard_runtime::connect::NatsAuthArgs,
    #[command(flatten)]
    pub stream: switchyard_runtime::connect::StreamArgs,
}

impl Backend {
    /// The JetStream connection, when the log is a stream.
    pub fn nats(&self) -> Option<switchyard_runtime::connect::NatsArgs> {
        self.nats_url
            .as_ref()
            .map(|url| switchyard_runtime::connect::NatsArgs {
                nats_url: url.clone(),
                auth: self.auth.clone(),
                signing_key: None,
                stream: self.stream.clone(),
            })
    }
}

/// The stream the log is on; it must exist.
pub async fn connect_nats(nats: &NatsArgs) -> anyhow::Result<NatsLog> {
    let client = nats.client("cli").await?;
    Ok(nats.stream.open(client, false).await?)
}

/// The log as the services read it: behind the fence, so a deposed
/// leader's records are passed over here too.
pub async fn open(backend: &Backend) -> anyhow::Result<Box<dyn EventLog>> {
    let log: std::sync::Arc<dyn EventLog> = match (&backend.data_dir, backend.nats()) {
        (Some(dir), _) => {
            let log = EmbeddedLog::open_read_only(dir)?;
            if let Some(torn) = &log.open_report().torn_tail {
                eprintln!(
                    "warning: {} ends in a torn tail at byte {} ({} bytes, an unacknowledged batch); a writer will cut it off on open",
                    torn.segment.display(),
                    torn.offset,
                    torn.dropped_bytes
                );
            }
            std::sync::Arc::new(log)
        }
        (None, Some(nats)) => std::sync::Arc::new(connect_nats(&nats).await?),
        (None, None) => unreachable!("clap requires --data-dir or --nats"),
    };
    Ok(Box::new(switchyard_eventlog::fence::Fenced::new(log)))
}

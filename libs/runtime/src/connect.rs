//! The connection every service and every command shares: one set of flags
//! (`--nats-url`, `--nats-creds`, `--stream`, `--subject-prefix`, each also
//! read from the environment) and one way to reach the JetStream log.

use std::path::PathBuf;
use std::sync::Arc;

use switchyard_eventlog::nats::{NatsLog, NatsOptions};
use switchyard_eventlog::{EventLog, LogError};

/// Where the JetStream log is and how to reach it.
#[derive(clap::Args, Debug, Clone)]
pub struct NatsArgs {
    /// NATS server URL of the JetStream log, e.g. nats://nats:4222.
    #[arg(long = "nats-url", env = "SWITCHYARD_NATS_URL")]
    pub nats_url: String,
    /// A NATS credentials file (JWT and NKey seed).
    #[arg(long, env = "SWITCHYARD_NATS_CREDS")]
    pub nats_creds: Option<PathBuf>,
    /// A file holding this writer's NKey seed (`SU...`, made with
    /// `switchyard keys new`): every record it appends is signed with it,
    /// and its public key goes into the keyring the chart publishes.
    #[arg(long, env = "SWITCHYARD_SIGNING_KEY")]
    pub signing_key: Option<PathBuf>,
    #[command(flatten)]
    pub stream: StreamArgs,
}

/// Which stream holds the log.
#[derive(clap::Args, Debug, Clone)]
pub struct StreamArgs {
    /// JetStream stream that holds the log.
    #[arg(long, env = "SWITCHYARD_NATS_STREAM", default_value = "SWITCHYARD_LOG")]
    pub stream: String,
    /// Subject prefix of the stream.
    #[arg(
        long,
        env = "SWITCHYARD_NATS_SUBJECT_PREFIX",
        default_value = "switchyard.log"
    )]
    pub subject_prefix: String,
    /// How many servers hold a copy of the stream (3 across failure domains
    /// in production): `switchyard log init` creates it so, and a stream
    /// with fewer is refused.
    #[arg(long, env = "SWITCHYARD_NATS_STREAM_REPLICAS", default_value_t = 1)]
    pub stream_replicas: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("read NATS credentials {}: {source}", path.display())]
    Credentials {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("connect to NATS at {url}: {source}")]
    Connect {
        url: String,
        #[source]
        source: async_nats::ConnectError,
    },
    #[error("signing key {}: {message}", path.display())]
    SigningKey { path: PathBuf, message: String },
    #[error("open the log on stream {stream}: {source}")]
    Log {
        stream: String,
        #[source]
        source: LogError,
    },
}

impl NatsArgs {
    /// A service's NATS connection, named `switchyard-<service>`: retried
    /// until the server answers (a service may start before it).
    pub async fn service_client(&self, service: &str) -> Result<async_nats::Client, ConnectError> {
        self.connect(service, true).await
    }

    /// A command's NATS connection, named `switchyard-<name>`: an unreachable
    /// server is an error at once.
    pub async fn client(&self, name: &str) -> Result<async_nats::Client, ConnectError> {
        self.connect(name, false).await
    }

    async fn connect(&self, name: &str, retry: bool) -> Result<async_nats::Client, ConnectError> {
        let mut options = async_nats::ConnectOptions::new().name(format!("switchyard-{name}"));
        if retry {
            options = options.retry_on_initial_connect();
        }
        if let Some(path) = &self.nats_creds {
            options = options.credentials_file(path).await.map_err(|source| {
                ConnectError::Credentials {
                    path: path.clone(),
                    source,
                }
            })?;
        }
        options
            .connect(&self.nats_url)
            .await
            .map_err(|source| ConnectError::Connect {
                url: self.nats_url.clone(),
                source,
            })
    }

    /// The log on `client`. The stream must exist and be configured as the
    /// log must be: a service never creates it (`switchyard log init` does,
    /// once), so a log deleted or replaced is an error, not a fresh start.
    pub async fn log(&self, client: async_nats::Client) -> Result<Arc<dyn EventLog>, ConnectError> {
        let signer = self.signer()?;
        Ok(Arc::new(
            self.stream.open_signed(client, false, true, signer).await?,
        ))
    }

    /// The key records are signed with, if `--signing-key` names one.
    pub fn signer(&self) -> Result<Option<switchyard_eventlog::SigningKey>, ConnectError> {
        let Some(path) = &self.signing_key else {
            return Ok(None);
        };
        let bad = |message: String| ConnectError::SigningKey {
            path: path.clone(),
            message,
        };
        let seed = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        let pair = nkeys::KeyPair::from_seed(seed.trim())
            .map_err(|e| bad(format!("expected an NKey user seed (SU...): {e}")))?;
        if pair.key_pair_type() != nkeys::KeyPairType::User {
            return Err(bad("expected a user seed (SU...)".into()));
        }
        Ok(Some(Arc::new(pair)))
    }
}

impl StreamArgs {
    /// The log on `client`; with `create` (`switchyard log init`), the
    /// stream is created if it does not exist yet, else it must exist.
    pub async fn open(
        &self,
        client: async_nats::Client,
        create: bool,
    ) -> Result<NatsLog, ConnectError> {
        self.open_with(client, create, true).await
    }

    /// [`Self::open`]; without `check_config` a stream configured otherwise
    /// than the log must be is opened anyway (to report it: `log verify`).
    pub async fn open_with(
        &self,
        client: async_nats::Client,
        create: bool,
        check_config: bool,
    ) -> Result<NatsLog, ConnectError> {
        self.open_signed(client, create, check_config, None).await
    }

    /// [`Self::open_with`], appending records signed with `signer`.
    pub async fn open_signed(
        &self,
        client: async_nats::Client,
        create: bool,
        check_config: bool,
        signer: Option<switchyard_eventlog::SigningKey>,
    ) -> Result<NatsLog, ConnectError> {
        let options = NatsOptions {
            signer,
            stream: self.stream.clone(),
            subject_prefix: self.subject_prefix.clone(),
            create,
            replicas: self.stream_replicas,
            check_config,
            ..NatsOptions::default()
        };
        NatsLog::open(client, options)
            .await
            .map_err(|source| ConnectError::Log {
                stream: self.stream.clone(),
                source,
            })
    }
}

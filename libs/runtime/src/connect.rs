//! The connection every service and every command shares: one set of flags
//! (`--nats-url`, `--nats-creds`, `--stream`, `--subject-prefix`, each also
//! read from the environment) and one way to reach the JetStream log.

use std::path::PathBuf;
use std::sync::Arc;

use switchyard_eventlog::LogError;
use switchyard_eventlog::fence::Fenced;
use switchyard_eventlog::nats::{NatsLog, NatsOptions};

/// Where the JetStream log is and how to reach it.
#[derive(clap::Args, Debug, Clone)]
pub struct NatsArgs {
    /// NATS server URL of the JetStream log, e.g. nats://nats:4222; for a
    /// cluster, several, comma-separated (the client connects to one that
    /// answers and reconnects to the others).
    #[arg(long = "nats-url", env = "SWITCHYARD_NATS_URL", value_parser = parse_servers)]
    pub nats_url: String,
    #[command(flatten)]
    pub auth: NatsAuthArgs,
    /// A file holding this writer's NKey seed (`SU...`, made with
    /// `switchyard keys new`): every record it appends is signed with it,
    /// and its public key goes into the keyring the chart publishes.
    #[arg(long, env = "SWITCHYARD_SIGNING_KEY")]
    pub signing_key: Option<PathBuf>,
    #[command(flatten)]
    pub stream: StreamArgs,
}

/// `--nats-url`'s servers: each comma-separated part.
pub fn servers(urls: &str) -> Vec<&str> {
    urls.split(',').map(str::trim).collect()
}

/// `--nats-url` as given, once each server in it is a NATS URL; an error
/// names the one that is not. Empty stays empty: commands that need no
/// server take it so.
fn parse_servers(urls: &str) -> Result<String, String> {
    if urls.is_empty() {
        return Ok(String::new());
    }
    for server in servers(urls) {
        server.parse::<async_nats::ServerAddr>().map_err(|e| {
            format!("`{server}` is no NATS server URL (nats://HOST:PORT, several comma-separated for a cluster): {e}")
        })?;
    }
    Ok(urls.to_string())
}

/// Who connects to NATS, and over what.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct NatsAuthArgs {
    /// A NATS credentials file (JWT and NKey seed).
    #[arg(long, env = "SWITCHYARD_NATS_CREDS")]
    pub nats_creds: Option<PathBuf>,
    /// A file holding an NKey user seed (`SU...`) to authenticate with: the
    /// server's authorization names its public key with exactly the
    /// permissions of this service or operator (the chart's bundled server
    /// does). Replies come to inboxes under `_INBOX.<public key>`, which no
    /// other user may read.
    #[arg(long, env = "SWITCHYARD_NATS_NKEY")]
    pub nats_nkey: Option<PathBuf>,
    /// A PEM file of the CA that signed the server's certificate: the
    /// connection must be TLS and the server's certificate must chain to it.
    #[arg(long, env = "SWITCHYARD_NATS_TLS_CA")]
    pub nats_tls_ca: Option<PathBuf>,
}

impl NatsAuthArgs {
    /// `options` with these credentials and TLS.
    pub async fn apply(
        &self,
        mut options: async_nats::ConnectOptions,
    ) -> Result<async_nats::ConnectOptions, ConnectError> {
        if let Some(path) = &self.nats_creds {
            options = options.credentials_file(path).await.map_err(|source| {
                ConnectError::Credentials {
                    path: path.clone(),
                    error: source,
                }
            })?;
        }
        if let Some(path) = &self.nats_nkey {
            let pair = read_seed(path)?;
            let seed = pair.seed().expect("a key pair read from a seed has it");
            options = options
                .nkey(seed)
                .custom_inbox_prefix(inbox_prefix(&pair.public_key()));
        }
        if let Some(ca) = &self.nats_tls_ca {
            if !ca.is_file() {
                return Err(ConnectError::Credentials {
                    path: ca.clone(),
                    error: std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        "expected a PEM file of the server's CA",
                    ),
                });
            }
            options = options.add_root_certificates(ca.clone()).require_tls(true);
        }
        Ok(options)
    }
}

/// Where the replies to a user's requests go: under its public key, so the
/// server's permissions can give each user its own inboxes only.
pub fn inbox_prefix(public_key: &str) -> String {
    format!("_INBOX.{public_key}")
}

/// Reads an NKey user seed (`SU...`) from a file.
pub fn read_seed(path: &std::path::Path) -> Result<nkeys::KeyPair, ConnectError> {
    let bad = |message: String| ConnectError::Seed {
        path: path.to_path_buf(),
        message,
    };
    let seed = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    let pair = nkeys::KeyPair::from_seed(seed.trim())
        .map_err(|e| bad(format!("expected an NKey user seed (SU...): {e}")))?;
    if pair.key_pair_type() != nkeys::KeyPairType::User {
        return Err(bad("expected a user seed (SU...)".into()));
    }
    Ok(pair)
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

/// Why a connection to the bus or the log failed. Each message holds its
/// cause's (no error chain: printed alone, as the services do, or with its
/// chain, as the CLI does, it reads the same, once).
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("read NATS credentials {}: {error}", path.display())]
    Credentials {
        path: PathBuf,
        error: std::io::Error,
    },
    #[error("connect to NATS at {url}: {error}")]
    Connect {
        url: String,
        error: async_nats::ConnectError,
    },
    #[error("NKey seed {}: {message}", path.display())]
    Seed { path: PathBuf, message: String },
    #[error("open the log on stream {stream}: {error}")]
    Log { stream: String, error: LogError },
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
            // A service waits for its server: say which, each time it fails
            // (a pod that is not Ready says why in its log).
            let url = self.nats_url.clone();
            options = options
                .retry_on_initial_connect()
                .event_callback(move |event| {
                    let url = url.clone();
                    async move { log_event(&url, &event) }
                });
        }
        self.auth
            .apply(options)
            .await?
            .connect(servers(&self.nats_url))
            .await
            .map_err(|error| ConnectError::Connect {
                url: self.nats_url.clone(),
                error,
            })
    }

    /// The log on `client`. The stream must exist and be configured as the
    /// log must be: a service never creates it (`switchyard log init` does,
    /// once), so a log deleted or replaced is an error, not a fresh start.
    /// It is behind the fence ([`Fenced`]): a deposed leader's records are
    /// passed over, and a leader's appends carry its term.
    pub async fn log(&self, client: async_nats::Client) -> Result<Arc<Fenced>, ConnectError> {
        let signer = self.signer()?;
        let log = self.stream.open_signed(client, false, true, signer).await?;
        Ok(Arc::new(Fenced::new(Arc::new(log))))
    }

    /// The key records are signed with, if `--signing-key` names one.
    pub fn signer(&self) -> Result<Option<switchyard_eventlog::SigningKey>, ConnectError> {
        let Some(path) = &self.signing_key else {
            return Ok(None);
        };
        Ok(Some(Arc::new(read_seed(path)?)))
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
            .map_err(|error| ConnectError::Log {
                stream: self.stream.clone(),
                error,
            })
    }
}

/// A service's connection event, naming the server: failures and lost
/// connections as warnings, the rest as information.
fn log_event(url: &str, event: &async_nats::Event) {
    match event {
        async_nats::Event::Connected => {
            tracing::info!(nats_url = url, "connected to NATS at {url}")
        }
        async_nats::Event::Disconnected
        | async_nats::Event::ClientError(_)
        | async_nats::Event::ServerError(_)
        | async_nats::Event::SlowConsumer(_) => {
            tracing::warn!(nats_url = url, "NATS at {url}: {event}")
        }
        _ => tracing::info!(nats_url = url, "NATS at {url}: {event}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cluster_is_its_servers_comma_separated_and_a_bad_one_is_named() {
        let cluster = "nats://a:4222, nats://b:4222,nats://c:4222";
        assert_eq!(parse_servers(cluster).as_deref(), Ok(cluster));
        assert_eq!(
            servers(cluster),
            ["nats://a:4222", "nats://b:4222", "nats://c:4222"]
        );
        let err = parse_servers("nats://a:4222,nats://b:port").unwrap_err();
        assert!(
            err.starts_with("`nats://b:port` is no NATS server URL"),
            "{err}"
        );
        assert_eq!(parse_servers("").as_deref(), Ok(""));
    }
}

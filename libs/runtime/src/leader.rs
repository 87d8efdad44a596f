//! Leader election for a service that runs with standbys: one Kubernetes
//! Lease per service, held by one replica (`kube-lease-manager` takes and
//! renews it). The crate keeps saying "leader" while its renewals fail, so
//! the leader also reads the Lease itself and steps down once it could not
//! see its own renewal for the lease's duration less a margin — before any
//! standby may take the Lease. A leader paused past even that is stopped by
//! the log's fence ([`switchyard_eventlog::fence`]).

use std::time::{Duration, Instant, SystemTime};

use backon::{ExponentialBuilder, Retryable};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube_lease_manager::{LeaseManager, LeaseManagerBuilder};
use switchyard_core::ServiceName;
use tokio::sync::watch;

/// How often the leader renews its Lease and reads it back.
const RENEW_EVERY: Duration = Duration::from_secs(2);

/// How long a replica keeps trying to read its Lease when it starts.
const START_PATIENCE: Duration = Duration::from_secs(60);

/// How a service's replicas elect their leader.
#[derive(clap::Args, Clone, Debug)]
pub struct ElectionArgs {
    /// Run with standbys: the namespace of the Kubernetes Lease this
    /// service's replicas are elected by (the chart gives the release's).
    /// The leader decides, writes and takes commands; a standby follows the
    /// log and takes over when the leader stops renewing. Without it the
    /// service runs alone, unelected.
    #[arg(long, env = "SWITCHYARD_LEASE_NAMESPACE")]
    pub lease_namespace: Option<String>,
    /// The Lease's name; default `switchyard-<service>`.
    #[arg(long, env = "SWITCHYARD_LEASE_NAME")]
    pub lease_name: Option<String>,
    /// This replica's name in the Lease and in the log's term records (the
    /// chart gives its pod's name); default the host's name.
    #[arg(long, env = "SWITCHYARD_IDENTITY")]
    pub identity: Option<String>,
    /// How long the Lease holds unrenewed: a standby takes over this long
    /// after the leader's last renewal. Whole seconds, more than 2.
    #[arg(long, env = "SWITCHYARD_LEASE_DURATION", default_value = "15s", value_parser = humantime::parse_duration)]
    pub lease_duration: Duration,
    /// A leader that could not renew for the lease's duration less this
    /// stops leading on its own: the most clock skew between nodes
    /// tolerated.
    #[arg(long, env = "SWITCHYARD_LEASE_MARGIN", default_value = "5s", value_parser = humantime::parse_duration)]
    pub lease_margin: Duration,
}

/// Why a replica could not take part in the election.
#[derive(Debug, thiserror::Error)]
pub enum ElectionError {
    #[error(
        "--lease-duration {duration:?} and --lease-margin {margin:?}: expected whole seconds, a duration over {RENEW_EVERY:?} and a margin of at least {RENEW_EVERY:?} below it"
    )]
    Timing {
        duration: Duration,
        margin: Duration,
    },
    #[error("find the Kubernetes API for the Lease (in-cluster config or KUBECONFIG): {0}")]
    Config(#[from] kube::config::InferConfigError),
    #[error("the Lease {namespace}/{name}: {source}")]
    Lease {
        namespace: String,
        name: String,
        #[source]
        source: kube_lease_manager::LeaseManagerError,
    },
    #[error("connect to the Kubernetes API for the Lease: {0}")]
    Client(#[from] kube::Error),
    #[error("the Lease's manager stopped")]
    Stopped,
}

/// A replica standing for election.
pub struct Election {
    manager: LeaseManager,
    api: Api<Lease>,
    name: String,
    identity: String,
    /// How long after a renewal this replica may still lead.
    leads_for: Duration,
}

impl ElectionArgs {
    /// The election `service`'s replica stands in, if it runs elected.
    pub async fn election(&self, service: ServiceName) -> Result<Option<Election>, ElectionError> {
        let Some(namespace) = &self.lease_namespace else {
            return Ok(None);
        };
        let (duration, margin) = (self.lease_duration, self.lease_margin);
        let whole = |d: Duration| d.subsec_nanos() == 0;
        if !whole(duration)
            || !whole(margin)
            || duration <= RENEW_EVERY
            || margin < RENEW_EVERY
            || margin >= duration
        {
            return Err(ElectionError::Timing { duration, margin });
        }
        let name = self
            .lease_name
            .clone()
            .unwrap_or_else(|| format!("switchyard-{service}"));
        let identity = match &self.identity {
            Some(identity) => identity.clone(),
            None => hostname(),
        };
        let client = kube::Client::try_default().await?;
        // The crate renews `grace` before expiry: every RENEW_EVERY. It
        // reads (or creates) the Lease first: tried again while the API
        // does not answer, as a restarted pod would be.
        let build = || {
            LeaseManagerBuilder::new(client.clone(), &name)
                .with_namespace(namespace)
                .with_identity(&identity)
                .with_duration(duration.as_secs())
                .with_grace(duration.as_secs() - RENEW_EVERY.as_secs())
                .build()
        };
        let manager = build
            .retry(
                ExponentialBuilder::default()
                    .with_max_delay(Duration::from_secs(5))
                    .with_total_delay(Some(START_PATIENCE))
                    .without_max_times(),
            )
            .notify(|err, pause| {
                tracing::warn!(lease = name, %err, ?pause, "could not read the Lease; trying again");
            })
            .await
            .map_err(|source| ElectionError::Lease {
                namespace: namespace.clone(),
                name: name.clone(),
                source,
            })?;
        Ok(Some(Election {
            manager,
            api: Api::namespaced(client, namespace),
            name,
            identity,
            leads_for: duration - margin,
        }))
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

impl Election {
    /// This replica's name.
    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// Waits until this replica holds the Lease; from then on it leads until
    /// [`Leading::lost`] says otherwise: the Lease lost or not seen renewed,
    /// or `nats` (the service's connection to the log) down for as long.
    pub async fn lead(self, nats: Option<async_nats::Client>) -> Result<Leading, ElectionError> {
        let Election {
            manager,
            api,
            name,
            identity,
            leads_for,
        } = self;
        let (mut held, manager) = manager.watch().await;
        if held.wait_for(|held| *held).await.is_err() {
            return Err(ElectionError::Stopped);
        }
        let won = Instant::now();
        tracing::info!(lease = name, identity, "won the Lease: leading");
        let (lost, lost_rx) = watch::channel(None);
        let guard = Guard {
            api,
            name,
            identity,
            leads_for,
            nats,
        };
        let guard = tokio::spawn(guard.watch(held, won, lost));
        Ok(Leading {
            lost: lost_rx,
            guard: Some(crate::AbortOnDrop(guard)),
            manager: Some(manager),
        })
    }
}

/// What a leader watches to know it still leads.
struct Guard {
    api: Api<Lease>,
    name: String,
    identity: String,
    /// How long after the last renewal seen this replica may still lead.
    leads_for: Duration,
    nats: Option<async_nats::Client>,
}

impl Guard {
    /// Watches the Lease and the log's connection while this replica
    /// leads; says why it lost the lead, once the Lease went to another
    /// replica or was not seen renewed for `leads_for`, or the connection
    /// to NATS was down for as long. Holding `held` keeps the crate
    /// renewing the Lease; dropping it releases it.
    async fn watch(
        self,
        mut held: watch::Receiver<bool>,
        won: Instant,
        lost: watch::Sender<Option<String>>,
    ) {
        let Guard {
            api,
            name,
            identity,
            leads_for,
            nats,
        } = self;
        let mut until = won + leads_for;
        let mut nats_down: Option<Instant> = None;
        let mut every = tokio::time::interval(RENEW_EVERY);
        let why = loop {
            tokio::select! {
                changed = held.changed() => {
                    if changed.is_err() || !*held.borrow() {
                        break "the Lease went to another replica".to_string();
                    }
                }
                _ = every.tick() => {
                    match tokio::time::timeout(RENEW_EVERY, api.get(&name)).await {
                        Ok(Ok(lease)) => {
                            let spec = lease.spec.unwrap_or_default();
                            if spec.holder_identity.as_deref() != Some(identity.as_str()) {
                                break format!(
                                    "the Lease is held by {} now",
                                    spec.holder_identity.as_deref().unwrap_or("nobody")
                                );
                            }
                            if let Some(renewed) = spec.renew_time {
                                let age = SystemTime::now()
                                    .duration_since(SystemTime::from(renewed.0))
                                    .unwrap_or_default();
                                if let Some(at) = Instant::now().checked_sub(age) {
                                    until = until.max(at + leads_for);
                                }
                            }
                        }
                        Ok(Err(err)) => tracing::warn!(lease = name, %err, "could not read the Lease back"),
                        Err(_) => tracing::warn!(lease = name, "the Lease could not be read back in time"),
                    }
                    if Instant::now() >= until {
                        break format!(
                            "the Lease was not seen renewed for {leads_for:?} (the Kubernetes API out of reach?): stepping down before a standby may take it"
                        );
                    }
                    let connected = nats.as_ref().is_none_or(|client| {
                        client.connection_state() == async_nats::connection::State::Connected
                    });
                    nats_down = if connected { None } else { nats_down.or(Some(Instant::now())) };
                    if nats_down.is_some_and(|since| since.elapsed() >= leads_for) {
                        break format!(
                            "cut off from NATS for {leads_for:?}: stepping down for a standby that reaches the log"
                        );
                    }
                }
            }
        };
        tracing::warn!(lease = name, identity, why, "lost the lead");
        let _ = lost.send(Some(why));
        // `held` is dropped here: the crate releases the Lease, if it still
        // holds it and reaches the API, so a standby need not wait for it
        // to expire.
    }
}

/// A replica leading its service.
pub struct Leading {
    lost: watch::Receiver<Option<String>>,
    guard: Option<crate::AbortOnDrop>,
    manager: Option<
        tokio::task::JoinHandle<Result<LeaseManager, kube_lease_manager::LeaseManagerError>>,
    >,
}

/// How long a leader that steps down waits for the Lease to be released.
const RELEASE_PATIENCE: Duration = Duration::from_secs(2);

impl Leading {
    /// Waits until this replica no longer leads; why.
    pub async fn lost(&mut self) -> String {
        match self.lost.wait_for(Option::is_some).await {
            Ok(why) => why.clone().unwrap_or_default(),
            Err(_) => "the Lease's guard stopped".into(),
        }
    }

    /// Stops leading: the Lease released (if this replica still holds it
    /// and the API answers within a moment), so a standby takes over at
    /// once rather than when it expires.
    pub async fn step_down(mut self) {
        // Dropping the guard drops the last receiver: the crate releases.
        self.guard.take();
        if let Some(manager) = self.manager.take() {
            match tokio::time::timeout(RELEASE_PATIENCE, manager).await {
                Ok(Ok(Ok(_))) => tracing::info!("released the Lease"),
                Ok(Ok(Err(err))) => tracing::warn!(%err, "could not release the Lease; it expires"),
                _ => tracing::warn!("the Lease was not released in time; it expires"),
            }
        }
    }
}

impl Drop for Leading {
    fn drop(&mut self) {
        if let Some(manager) = &self.manager {
            manager.abort();
        }
    }
}

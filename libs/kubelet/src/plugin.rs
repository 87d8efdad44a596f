//! The DRA kubelet plugin.
//!
//! Two unix sockets: the registration socket kubelet finds in its
//! plugins_registry directory (`Registration`: GetInfo names the driver, the
//! DRA socket and `v1.DRAPlugin`), and the DRA socket (`DRAPlugin`).
//!
//! NodePrepareResources, per claim: if the checkpoint already has it, the
//! same answer again; otherwise the ResourceClaim is read (through a
//! [`ClaimSource`], the API server in production), the results of its
//! allocation for this driver and this node's pool become CDI devices named
//! after the claim UID (`gpu.deckhouse.io/gpu=<uid>-<device>`), the claim's
//! CDI spec is written atomically, and then the checkpoint records the claim
//! (atomically, fsynced) before the answer goes back. NodeUnprepareResources
//! removes the spec, then the checkpoint entry; an unknown claim is already
//! unprepared. A crash between two steps leaves a state that the repeated
//! call — kubelet repeats it — completes.
//!
//! The checkpoint is the only state kept across calls, and each call reads
//! it under an exclusive lock on `serialize.lock` beside it: two agents of
//! one node (a DaemonSet's rolling update with maxSurge, each on sockets
//! named after its pod's UID) serve the same claims, and kubelet may prepare
//! a claim through one and unprepare it through the other.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::resource::v1::ResourceClaim;
use serde::{Deserialize, Serialize};
use switchyard_gpu::Machine;
use switchyard_gpu::publish::DRIVER;
use tokio::sync::Mutex;
use tonic::{Request, Response, Status};

use crate::cdi;
use crate::dra;
use crate::dra_health;
use crate::pluginregistration as reg;

/// Where prepare reads a claim from.
#[async_trait::async_trait]
pub trait ClaimSource: Send + Sync {
    async fn claim(&self, namespace: &str, name: &str) -> Result<ResourceClaim, ClaimError>;
}

/// Why a claim could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    /// From the API server.
    #[error("read ResourceClaim {namespace}/{name}: {source}")]
    Read {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    /// A source holding claims as JSON could not decode this one.
    #[error("decode ResourceClaim {namespace}/{name}: {source}")]
    Decode {
        namespace: String,
        name: String,
        #[source]
        source: serde_json::Error,
    },
    /// The source has no such claim.
    #[error("ResourceClaim {namespace}/{name} not found")]
    NotFound { namespace: String, name: String },
}

/// Why the checkpoint could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("read the checkpoint {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("checkpoint {}: {source}", path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("lock {}: {source}", path.display())]
    Lock {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Why a claim could not be prepared (the answer kubelet gets for it).
#[derive(Debug, thiserror::Error)]
enum PrepareError {
    #[error("the node is switching away from DRA: no new claim is prepared")]
    Closing,
    #[error(transparent)]
    Claim(#[from] ClaimError),
    #[error("ResourceClaim {namespace}/{name} has UID {found:?}, kubelet asked for {asked}")]
    Uid {
        namespace: String,
        name: String,
        found: Option<String>,
        asked: String,
    },
    #[error("ResourceClaim {namespace}/{name} is not allocated")]
    NotAllocated { namespace: String, name: String },
    #[error(
        "ResourceClaim {namespace}/{name}: device {pool}/{device} is not in this node's pool {node}"
    )]
    OtherPool {
        namespace: String,
        name: String,
        pool: String,
        device: String,
        node: String,
    },
    #[error("ResourceClaim {namespace}/{name}: device {device} is not published by this node")]
    Unpublished {
        namespace: String,
        name: String,
        device: String,
    },
    #[error("encode the CDI spec: {0}")]
    EncodeSpec(#[source] serde_json::Error),
    #[error("write the CDI spec: {0}")]
    WriteSpec(#[source] std::io::Error),
    #[error("write the checkpoint: {0}")]
    WriteCheckpoint(#[source] std::io::Error),
}

/// Why a claim could not be unprepared (the answer kubelet gets for it).
#[derive(Debug, thiserror::Error)]
enum UnprepareError {
    #[error("remove the CDI spec: {0}")]
    RemoveSpec(#[source] std::io::Error),
    #[error("write the checkpoint: {0}")]
    WriteCheckpoint(#[source] std::io::Error),
}

/// Why the plugin stopped serving, or could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("create the socket directory {}: {source}", dir.display())]
    CreateDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("bind {}: {source}", socket.display())]
    Bind {
        socket: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("serve the DRA socket {}: {source}", socket.display())]
    Dra {
        socket: PathBuf,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("serve the registration socket {}: {source}", socket.display())]
    Registration {
        socket: PathBuf,
        #[source]
        source: tonic::transport::Error,
    },
}

/// Claims from the API server.
pub struct ApiClaims(pub kube::Client);

#[async_trait::async_trait]
impl ClaimSource for ApiClaims {
    async fn claim(&self, namespace: &str, name: &str) -> Result<ResourceClaim, ClaimError> {
        kube::Api::<ResourceClaim>::namespaced(self.0.clone(), namespace)
            .get(name)
            .await
            .map_err(|source| ClaimError::Read {
                namespace: namespace.to_string(),
                name: name.to_string(),
                source,
            })
    }
}

/// One prepared device, as answered to kubelet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedDevice {
    pub requests: Vec<String>,
    pub pool: String,
    pub device: String,
    pub cdi_ids: Vec<String>,
    pub share_id: Option<String>,
}

/// A prepared claim, as checkpointed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedClaim {
    pub namespace: String,
    pub name: String,
    pub devices: Vec<PreparedDevice>,
}

/// The checkpoint: claim UID → what was prepared.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub claims: BTreeMap<String, PreparedClaim>,
}

impl Checkpoint {
    /// The prepared claims, as namespace/name.
    fn names(&self) -> Vec<String> {
        self.claims
            .values()
            .map(|c| format!("{}/{}", c.namespace, c.name))
            .collect()
    }
}

/// The lock file beside the checkpoint (the name the Kubernetes DRA helper
/// gives its own).
const LOCK_FILE: &str = "serialize.lock";

/// The checkpoint at `path` (an absent one is empty).
fn load(path: &Path) -> Result<Checkpoint, CheckpointError> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|source| CheckpointError::Parse {
            path: path.to_path_buf(),
            source,
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Checkpoint::default()),
        Err(source) => Err(CheckpointError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

/// The checkpoint while one call holds both locks.
struct Locked<'a> {
    checkpoint: Checkpoint,
    _file: std::fs::File,
    _serial: tokio::sync::MutexGuard<'a, ()>,
}

/// The plugin's configuration.
pub struct Config {
    pub node: String,
    /// The machine the node publishes (device name → card).
    pub machine: Machine,
    /// Where CDI specs go (`/var/run/cdi` on a node).
    pub cdi_dir: PathBuf,
    /// The checkpoint file (under the plugin's directory on a node).
    pub checkpoint: PathBuf,
    /// The DRA socket kubelet connects to (`GetInfo`'s endpoint).
    pub endpoint: PathBuf,
}

/// The DRA kubelet plugin.
pub struct DraPlugin {
    config: Config,
    claims: Arc<dyn ClaimSource>,
    /// Prepare and unprepare run one at a time, in this process (this lock)
    /// and across the node's agents (the lock file): each reads and rewrites
    /// the checkpoint.
    serial: Mutex<()>,
    registered: std::sync::Mutex<Option<reg::RegistrationStatus>>,
    /// Set while the node switches away from DRA: no new claim is prepared.
    closing: std::sync::atomic::AtomicBool,
    /// The published devices and whether each is healthy, for kubelet's
    /// health stream.
    health: tokio::sync::watch::Sender<Vec<(String, bool)>>,
    /// Set when the sockets stop being served: the health streams end, so
    /// the server's graceful stop does not wait on kubelet.
    ended: tokio::sync::watch::Sender<bool>,
}

impl DraPlugin {
    /// Checks that the checkpoint can be read (an absent one is empty).
    pub fn new(config: Config, claims: Arc<dyn ClaimSource>) -> Result<DraPlugin, CheckpointError> {
        let state = load(&config.checkpoint)?;
        crate::metrics::prepared(state.claims.len());
        Ok(DraPlugin {
            config,
            claims,
            serial: Mutex::new(()),
            registered: std::sync::Mutex::new(None),
            closing: std::sync::atomic::AtomicBool::new(false),
            health: tokio::sync::watch::Sender::new(Vec::new()),
            ended: tokio::sync::watch::Sender::new(false),
        })
    }

    /// The checkpoint, read while this call alone may change it: held until
    /// the returned guard is dropped.
    async fn locked(&self) -> Result<Locked<'_>, CheckpointError> {
        let serial = self.serial.lock().await;
        let path = self.config.checkpoint.with_file_name(LOCK_FILE);
        let file = tokio::task::spawn_blocking({
            let path = path.clone();
            move || {
                let file = std::fs::OpenOptions::new()
                    .create(true)
                    .truncate(false)
                    .write(true)
                    .open(&path)?;
                file.lock()?;
                Ok(file)
            }
        })
        .await
        .map_err(std::io::Error::other)
        .and_then(|opened| opened)
        .map_err(|source| CheckpointError::Lock { path, source })?;
        Ok(Locked {
            checkpoint: load(&self.config.checkpoint)?,
            _file: file,
            _serial: serial,
        })
    }

    /// The node's devices as published in `slices`: healthy unless they
    /// carry the unhealthy taint. kubelet hears of a change at once.
    pub fn set_health(&self, slices: &[k8s_openapi::api::resource::v1::ResourceSlice]) {
        let devices = slices
            .iter()
            .flat_map(|s| s.spec.devices.iter().flatten())
            .map(|d| {
                let tainted = d
                    .taints
                    .iter()
                    .flatten()
                    .any(|t| t.key == switchyard_gpu::publish::UNHEALTHY_TAINT);
                (d.name.clone(), !tainted)
            })
            .collect();
        self.health.send_replace(devices);
    }

    /// The claims prepared and not unprepared yet (namespace/name).
    pub async fn prepared(&self) -> Result<Vec<String>, CheckpointError> {
        Ok(self.locked().await?.checkpoint.names())
    }

    /// Stops preparing new claims if none is prepared now (checked and set
    /// under the checkpoint's lock, so no prepare slips in between);
    /// otherwise the prepared claims.
    pub async fn close(&self) -> Result<Result<(), Vec<String>>, CheckpointError> {
        let state = self.locked().await?;
        if !state.checkpoint.claims.is_empty() {
            return Ok(Err(state.checkpoint.names()));
        }
        self.closing
            .store(true, std::sync::atomic::Ordering::SeqCst);
        Ok(Ok(()))
    }

    /// Prepares again after a [`Self::close`] that did not lead to a switch.
    pub fn reopen(&self) {
        self.closing
            .store(false, std::sync::atomic::Ordering::SeqCst);
    }

    /// What kubelet last said about the registration.
    pub fn registration(&self) -> Option<reg::RegistrationStatus> {
        self.registered.lock().expect("registration").clone()
    }

    fn spec_path(&self, uid: &str) -> PathBuf {
        self.config.cdi_dir.join(format!("{DRIVER}-{uid}.json"))
    }

    fn save(&self, checkpoint: &Checkpoint) -> std::io::Result<()> {
        let bytes = serde_json::to_vec_pretty(checkpoint).map_err(std::io::Error::other)?;
        cdi::write_atomically(&self.config.checkpoint, &bytes)
    }

    /// The CDI edits of a published device: the card's (or MIG device's)
    /// UUID for NVIDIA's container runtime, and the card's device node.
    fn edits(&self, device: &str) -> Option<cdi::ContainerEdits> {
        for gpu in &self.config.machine.gpus {
            let node = cdi::DeviceNode {
                path: format!("/dev/nvidia{}", gpu.index),
            };
            let uuid = if device == format!("gpu-{}", gpu.index) {
                Some(gpu.uuid.clone())
            } else {
                gpu.mig_devices
                    .iter()
                    .find(|m| {
                        device == switchyard_gpu::publish::mig_name(gpu.index, &m.profile, m.index)
                    })
                    .map(|m| m.uuid.clone())
            };
            if let Some(uuid) = uuid {
                return Some(cdi::ContainerEdits {
                    env: vec![format!("NVIDIA_VISIBLE_DEVICES={uuid}")],
                    device_nodes: vec![node],
                });
            }
        }
        None
    }

    async fn prepare(
        &self,
        claim: &dra::Claim,
        checkpoint: &mut Checkpoint,
    ) -> Result<Vec<PreparedDevice>, PrepareError> {
        if let Some(done) = checkpoint.claims.get(&claim.uid) {
            return Ok(done.devices.clone());
        }
        if self.closing.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(PrepareError::Closing);
        }
        tracing::info!(claim = %format_args!("{}/{}", claim.namespace, claim.name), uid = %claim.uid, "preparing ResourceClaim");
        let object = self.claims.claim(&claim.namespace, &claim.name).await?;
        if object.metadata.uid.as_deref() != Some(claim.uid.as_str()) {
            return Err(PrepareError::Uid {
                namespace: claim.namespace.clone(),
                name: claim.name.clone(),
                found: object.metadata.uid,
                asked: claim.uid.clone(),
            });
        }
        let results = object
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.as_ref())
            .ok_or_else(|| PrepareError::NotAllocated {
                namespace: claim.namespace.clone(),
                name: claim.name.clone(),
            })?;
        let mut devices = Vec::new();
        let mut spec = cdi::Spec {
            cdi_version: cdi::VERSION.into(),
            kind: cdi::KIND.into(),
            devices: Vec::new(),
            container_edits: cdi::ContainerEdits::default(),
        };
        for r in results.iter().filter(|r| r.driver == DRIVER) {
            if r.pool != self.config.node {
                return Err(PrepareError::OtherPool {
                    namespace: claim.namespace.clone(),
                    name: claim.name.clone(),
                    pool: r.pool.clone(),
                    device: r.device.clone(),
                    node: self.config.node.clone(),
                });
            }
            let edits = self
                .edits(&r.device)
                .ok_or_else(|| PrepareError::Unpublished {
                    namespace: claim.namespace.clone(),
                    name: claim.name.clone(),
                    device: r.device.clone(),
                })?;
            let name = format!("{}-{}", claim.uid, r.device);
            spec.devices.push(cdi::Device {
                name: name.clone(),
                container_edits: edits,
            });
            devices.push(PreparedDevice {
                requests: vec![r.request.clone()],
                pool: r.pool.clone(),
                device: r.device.clone(),
                cdi_ids: vec![cdi::qualified(&name)],
                share_id: r.share_id.clone(),
            });
        }
        spec.container_edits.device_nodes = cdi::CONTROL_NODES
            .iter()
            .map(|p| cdi::DeviceNode {
                path: p.to_string(),
            })
            .collect();
        let bytes = serde_json::to_vec_pretty(&spec).map_err(PrepareError::EncodeSpec)?;
        cdi::write_atomically(&self.spec_path(&claim.uid), &bytes)
            .map_err(PrepareError::WriteSpec)?;
        checkpoint.claims.insert(
            claim.uid.clone(),
            PreparedClaim {
                namespace: claim.namespace.clone(),
                name: claim.name.clone(),
                devices: devices.clone(),
            },
        );
        self.save(checkpoint)
            .map_err(PrepareError::WriteCheckpoint)?;
        Ok(devices)
    }

    async fn unprepare(
        &self,
        claim: &dra::Claim,
        checkpoint: &mut Checkpoint,
    ) -> Result<(), UnprepareError> {
        cdi::remove(&self.spec_path(&claim.uid)).map_err(UnprepareError::RemoveSpec)?;
        if checkpoint.claims.remove(&claim.uid).is_some() {
            self.save(checkpoint)
                .map_err(UnprepareError::WriteCheckpoint)?;
        }
        Ok(())
    }
}

/// The whole call failed: the checkpoint could not be read (kubelet tries
/// again).
fn internal(e: CheckpointError) -> Status {
    Status::internal(e.to_string())
}

/// The registration service, on the registration socket.
pub struct RegistrationService(pub Arc<DraPlugin>);

#[tonic::async_trait]
impl reg::registration_server::Registration for RegistrationService {
    async fn get_info(
        &self,
        _: Request<reg::InfoRequest>,
    ) -> Result<Response<reg::PluginInfo>, Status> {
        Ok(Response::new(reg::PluginInfo {
            r#type: "DRAPlugin".into(),
            name: DRIVER.into(),
            endpoint: self.0.config.endpoint.display().to_string(),
            supported_versions: vec!["v1.DRAPlugin".into()],
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<reg::RegistrationStatus>,
    ) -> Result<Response<reg::RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if status.plugin_registered {
            tracing::info!(driver = DRIVER, "kubelet registered the DRA plugin");
        } else {
            tracing::warn!(error = %status.error, "kubelet refused the plugin's registration");
        }
        *self.0.registered.lock().expect("registration") = Some(status);
        Ok(Response::new(reg::RegistrationStatusResponse {}))
    }
}

/// The DRA service, on the DRA socket.
pub struct DraService(pub Arc<DraPlugin>);

#[tonic::async_trait]
impl dra::dra_plugin_server::DraPlugin for DraService {
    async fn node_prepare_resources(
        &self,
        request: Request<dra::NodePrepareResourcesRequest>,
    ) -> Result<Response<dra::NodePrepareResourcesResponse>, Status> {
        let mut state = self.0.locked().await.map_err(internal)?;
        let mut out = BTreeMap::new();
        for claim in request.into_inner().claims {
            let started = std::time::Instant::now();
            let prepared = self.0.prepare(&claim, &mut state.checkpoint).await;
            crate::metrics::claim(
                crate::metrics::Operation::prepare,
                started.elapsed().as_secs_f64(),
                prepared.is_err(),
            );
            let answer = match prepared {
                Ok(devices) => dra::NodePrepareResourceResponse {
                    devices: devices
                        .into_iter()
                        .map(|d| dra::Device {
                            request_names: d.requests,
                            pool_name: d.pool,
                            device_name: d.device,
                            cdi_device_ids: d.cdi_ids,
                            share_id: d.share_id,
                        })
                        .collect(),
                    error: String::new(),
                },
                Err(error) => dra::NodePrepareResourceResponse {
                    devices: Vec::new(),
                    error: error.to_string(),
                },
            };
            out.insert(claim.uid, answer);
        }
        crate::metrics::prepared(state.checkpoint.claims.len());
        Ok(Response::new(dra::NodePrepareResourcesResponse {
            claims: out.into_iter().collect(),
        }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<dra::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<dra::NodeUnprepareResourcesResponse>, Status> {
        let mut state = self.0.locked().await.map_err(internal)?;
        let mut out = BTreeMap::new();
        for claim in request.into_inner().claims {
            let started = std::time::Instant::now();
            let error = self
                .0
                .unprepare(&claim, &mut state.checkpoint)
                .await
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            crate::metrics::claim(
                crate::metrics::Operation::unprepare,
                started.elapsed().as_secs_f64(),
                !error.is_empty(),
            );
            out.insert(claim.uid, dra::NodeUnprepareResourceResponse { error });
        }
        crate::metrics::prepared(state.checkpoint.claims.len());
        Ok(Response::new(dra::NodeUnprepareResourcesResponse {
            claims: out.into_iter().collect(),
        }))
    }
}

/// How often the whole health list goes to kubelet again (it forgets a
/// device's health after [`HEALTH_TIMEOUT_SECONDS`]).
const HEALTH_REFRESH: std::time::Duration = std::time::Duration::from_secs(10);
/// How long kubelet trusts a device's health without news.
pub const HEALTH_TIMEOUT_SECONDS: i64 = 30;

/// The device health service, on the DRA socket: the node's devices and
/// their health on connect, on every change and every
/// [`HEALTH_REFRESH`].
pub struct HealthService(pub Arc<DraPlugin>);

type HealthStream = std::pin::Pin<
    Box<dyn futures::Stream<Item = Result<dra_health::NodeWatchResourcesResponse, Status>> + Send>,
>;

#[tonic::async_trait]
impl dra_health::dra_resource_health_server::DraResourceHealth for HealthService {
    type NodeWatchResourcesStream = HealthStream;

    async fn node_watch_resources(
        &self,
        _: Request<dra_health::NodeWatchResourcesRequest>,
    ) -> Result<Response<HealthStream>, Status> {
        let mut changes = self.0.health.subscribe();
        let mut ended = self.0.ended.subscribe();
        let pool = self.0.config.node.clone();
        let (tx, rx) = tokio::sync::mpsc::channel(2);
        tokio::spawn(async move {
            let mut refresh = tokio::time::interval(HEALTH_REFRESH);
            loop {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_secs() as i64);
                let devices = changes
                    .borrow_and_update()
                    .iter()
                    .map(|(device, healthy)| dra_health::DeviceHealth {
                        device: Some(dra_health::DeviceIdentifier {
                            pool_name: pool.clone(),
                            device_name: device.clone(),
                        }),
                        health: if *healthy {
                            dra_health::HealthStatus::Healthy
                        } else {
                            dra_health::HealthStatus::Unhealthy
                        } as i32,
                        last_updated_time: now,
                        health_check_timeout_seconds: HEALTH_TIMEOUT_SECONDS,
                        message: if *healthy {
                            String::new()
                        } else {
                            "the card is unhealthy (lost, or a critical XID)".into()
                        },
                    })
                    .collect();
                let sent = tx
                    .send(Ok(dra_health::NodeWatchResourcesResponse { devices }))
                    .await;
                if sent.is_err() {
                    return;
                }
                tokio::select! {
                    changed = changes.changed() => if changed.is_err() { return },
                    _ = refresh.tick() => {}
                    _ = tx.closed() => return,
                    _ = ended.wait_for(|ended| *ended) => return,
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

/// Serves both sockets until `shutdown` resolves; removes the sockets after.
pub async fn serve(
    plugin: Arc<DraPlugin>,
    registration_socket: &Path,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let (ready, _) = tokio::sync::oneshot::channel();
    serve_notifying(plugin, registration_socket, ready, shutdown).await
}

/// [`serve`], saying on `ready` once both sockets are bound; if it fails
/// before, `ready` is dropped unsent and the error returned.
pub async fn serve_notifying(
    plugin: Arc<DraPlugin>,
    registration_socket: &Path,
    ready: tokio::sync::oneshot::Sender<()>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let dra_socket = plugin.config.endpoint.clone();
    for socket in [registration_socket, dra_socket.as_path()] {
        let _ = std::fs::remove_file(socket);
        if let Some(dir) = socket.parent() {
            std::fs::create_dir_all(dir).map_err(|source| ServeError::CreateDir {
                dir: dir.to_path_buf(),
                source,
            })?;
        }
    }
    let bind = |socket: &Path| {
        tokio::net::UnixListener::bind(socket).map_err(|source| ServeError::Bind {
            socket: socket.to_path_buf(),
            source,
        })
    };
    let dra_listener = bind(&dra_socket)?;
    let reg_listener = bind(registration_socket)?;
    let _ = ready.send(());
    let (stop_dra, stopped_dra) = tokio::sync::oneshot::channel::<()>();
    let dra_server = tonic::transport::Server::builder()
        .add_service(dra::dra_plugin_server::DraPluginServer::new(DraService(
            plugin.clone(),
        )))
        .add_service(
            dra_health::dra_resource_health_server::DraResourceHealthServer::new(HealthService(
                plugin.clone(),
            )),
        )
        .serve_with_incoming_shutdown(crate::authority::incoming(dra_listener), async {
            let _ = stopped_dra.await;
        });
    let reg_server = tonic::transport::Server::builder()
        .add_service(reg::registration_server::RegistrationServer::new(
            RegistrationService(plugin.clone()),
        ))
        .serve_with_incoming_shutdown(crate::authority::incoming(reg_listener), async move {
            shutdown.await;
            plugin.ended.send_replace(true);
            let _ = stop_dra.send(());
        });
    let (a, b) = tokio::join!(dra_server, reg_server);
    for socket in [registration_socket, dra_socket.as_path()] {
        let _ = std::fs::remove_file(socket);
    }
    a.map_err(|source| ServeError::Dra {
        socket: dra_socket,
        source,
    })?;
    b.map_err(|source| ServeError::Registration {
        socket: registration_socket.to_path_buf(),
        source,
    })?;
    Ok(())
}

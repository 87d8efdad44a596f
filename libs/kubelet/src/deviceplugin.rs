//! The device-plugin API (`deviceplugin.v1beta1`): the NodeGroup's
//! `spec.gpu` sharing modes as kubelet resources.
//!
//! - Exclusive: `nvidia.com/gpu`, one device per card (its UUID).
//! - TimeSlicing with `partitionCount` N: `nvidia.com/gpu`, N devices per card
//!   (`<uuid>::<replica>`); containers given replicas of one card share it.
//! - MIG: one resource per profile (`nvidia.com/mig-1g.5gb`), one device per
//!   MIG device (its UUID).
//!
//! One [`DevicePlugin`] serves one resource on its own socket in kubelet's
//! device-plugins directory and registers it with kubelet's `Registration`
//! service. ListAndWatch streams the device list again whenever the machine
//! changes (a card turning unhealthy); Allocate answers with
//! `NVIDIA_VISIBLE_DEVICES` and the CDI device names
//! (`gpu.deckhouse.io/gpu=<uuid>`).
//!
//! kubelet forgets a plugin in two ways, and the plugin registers again:
//! - kubelet restarts: it removes every socket in the directory and makes a
//!   new `kubelet.sock`; the plugin binds its socket again and registers.
//! - kubelet drops the plugin's stream: when an older instance of a
//!   resource ends its stream (a DaemonSet's rolling update with maxSurge),
//!   kubelet disconnects whichever instance it holds for that resource; the
//!   instance whose stream kubelet closed registers again at once.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use switchyard_gpu::Machine;
use tokio::sync::watch;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::cdi;

/// `v1beta1`, generated from `proto/kubelet/deviceplugin/v1beta1`.
pub mod api {
    tonic::include_proto!("v1beta1");
}

/// The API version sent to kubelet on registration.
pub const VERSION: &str = "v1beta1";

/// Why a device plugin stopped serving, or could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("bind {}: {source}", socket.display())]
    Bind {
        socket: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("connect to kubelet at {}: {source}", kubelet.display())]
    Connect {
        kubelet: PathBuf,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("register {resource} with kubelet: {source}")]
    Register {
        resource: String,
        #[source]
        source: Status,
    },
    #[error("serve {resource}: {source}")]
    Serve {
        resource: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("the server of {resource} ended: {source}")]
    Ended {
        resource: String,
        #[source]
        source: tokio::task::JoinError,
    },
}

/// How a node group shares its cards (`spec.gpu.sharing`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sharing {
    Exclusive,
    TimeSlicing { replicas: u32 },
    Mig,
}

/// A [`Sharing`] as a flag names it: `exclusive`, `time-slicing:N` or `mig`.
pub fn parse_sharing(s: &str) -> Result<Sharing, String> {
    match s.split_once(':') {
        None if s == "exclusive" => Ok(Sharing::Exclusive),
        None if s == "mig" => Ok(Sharing::Mig),
        Some(("time-slicing", n)) => match n.parse::<u32>() {
            Ok(replicas) if replicas >= 2 => Ok(Sharing::TimeSlicing { replicas }),
            _ => Err(format!(
                "time-slicing:{n}: expected time-slicing:N with N >= 2"
            )),
        },
        _ => Err(format!("{s:?}: expected exclusive, time-slicing:N or mig")),
    }
}

/// The resources a machine offers under `sharing`, with each device ID and
/// the card or MIG device UUID it stands for.
pub fn resources(
    machine: &Machine,
    sharing: Sharing,
) -> BTreeMap<String, Vec<(String, String, bool)>> {
    let mut out: BTreeMap<String, Vec<(String, String, bool)>> = BTreeMap::new();
    for gpu in &machine.gpus {
        match sharing {
            Sharing::Mig if gpu.mig_enabled => {
                for m in &gpu.mig_devices {
                    out.entry(format!("nvidia.com/mig-{}", m.profile))
                        .or_default()
                        .push((m.uuid.clone(), m.uuid.clone(), gpu.healthy));
                }
            }
            Sharing::Mig | Sharing::Exclusive => out
                .entry("nvidia.com/gpu".into())
                .or_default()
                .push((gpu.uuid.clone(), gpu.uuid.clone(), gpu.healthy)),
            Sharing::TimeSlicing { replicas } => {
                for r in 0..replicas.max(1) {
                    out.entry("nvidia.com/gpu".into()).or_default().push((
                        format!("{}::{r}", gpu.uuid),
                        gpu.uuid.clone(),
                        gpu.healthy,
                    ));
                }
            }
        }
    }
    out
}

/// Shared by a node's device plugins while it may switch away from them.
/// Closed, no Allocate is answered. [`Gate::close`] returns once every
/// Allocate admitted before has been answered: from then on, what containers
/// hold is what kubelet's pod resources API lists (kubelet records an
/// allocation as the answer reaches it), and nothing else holds the node.
#[derive(Debug, Default)]
pub struct Gate {
    state: std::sync::Mutex<GateState>,
    answered: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct GateState {
    closed: bool,
    /// Allocate calls admitted and not answered yet.
    in_flight: usize,
}

/// An admitted Allocate; dropped once answered.
struct Admitted<'a>(&'a Gate);

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        let mut state = self.0.state.lock().expect("gate");
        state.in_flight -= 1;
        if state.in_flight == 0 {
            self.0.answered.notify_waiters();
        }
    }
}

impl Gate {
    /// Closes the gate and waits until the Allocate calls admitted before
    /// are answered.
    pub async fn close(&self) {
        loop {
            let answered = self.answered.notified();
            {
                let mut state = self.state.lock().expect("gate");
                state.closed = true;
                if state.in_flight == 0 {
                    return;
                }
            }
            answered.await;
        }
    }

    pub fn reopen(&self) {
        self.state.lock().expect("gate").closed = false;
    }

    /// Admits an Allocate unless closed.
    fn admit(&self) -> Option<Admitted<'_>> {
        let mut state = self.state.lock().expect("gate");
        if state.closed {
            return None;
        }
        state.in_flight += 1;
        Some(Admitted(self))
    }
}

/// One resource served to kubelet.
pub struct DevicePlugin {
    resource: String,
    sharing: Sharing,
    machine: watch::Receiver<Machine>,
    /// Closed while the node switches away from the device plugins: no new
    /// device is handed out.
    gate: Arc<Gate>,
    /// The ListAndWatch streams open now (kubelet holds one while it uses
    /// the plugin).
    watched: Arc<AtomicUsize>,
    /// Told when kubelet closes a stream (not when the plugin ends one): the
    /// serving loop registers again at once if no stream is left.
    closed_by_kubelet: Arc<tokio::sync::Notify>,
}

/// Counts an open ListAndWatch stream while it lives.
struct Watching(Arc<AtomicUsize>);

impl Watching {
    fn new(count: &Arc<AtomicUsize>) -> Watching {
        count.fetch_add(1, Ordering::SeqCst);
        Watching(count.clone())
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl DevicePlugin {
    pub fn new(
        resource: &str,
        sharing: Sharing,
        machine: watch::Receiver<Machine>,
    ) -> DevicePlugin {
        DevicePlugin::closable(resource, sharing, machine, Arc::default())
    }

    /// A plugin that refuses Allocate while `gate` is closed.
    pub fn closable(
        resource: &str,
        sharing: Sharing,
        machine: watch::Receiver<Machine>,
        gate: Arc<Gate>,
    ) -> DevicePlugin {
        DevicePlugin {
            resource: resource.to_string(),
            sharing,
            machine,
            gate,
            watched: Arc::default(),
            closed_by_kubelet: Arc::default(),
        }
    }

    fn devices(&self, machine: &Machine) -> Vec<(String, String, bool)> {
        resources(machine, self.sharing)
            .remove(&self.resource)
            .unwrap_or_default()
    }

    /// Device ID → the card or MIG device UUID it stands for.
    fn card_of(&self) -> BTreeMap<String, String> {
        self.devices(&self.machine.borrow())
            .into_iter()
            .map(|(id, card, _)| (id, card))
            .collect()
    }

    fn list(&self, machine: &Machine) -> api::ListAndWatchResponse {
        api::ListAndWatchResponse {
            devices: self
                .devices(machine)
                .into_iter()
                .map(|(id, _, healthy)| api::Device {
                    id,
                    health: if healthy { "Healthy" } else { "Unhealthy" }.into(),
                    topology: None,
                })
                .collect(),
        }
    }
}

type Watch = Pin<Box<dyn Stream<Item = Result<api::ListAndWatchResponse, Status>> + Send>>;

#[tonic::async_trait]
impl api::device_plugin_server::DevicePlugin for Arc<DevicePlugin> {
    async fn get_device_plugin_options(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<api::DevicePluginOptions>, Status> {
        Ok(Response::new(api::DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: true,
        }))
    }

    type ListAndWatchStream = Watch;

    async fn list_and_watch(&self, _: Request<api::Empty>) -> Result<Response<Watch>, Status> {
        let plugin = self.clone();
        let mut machine = self.machine.clone();
        let stream = async_stream(move |tx| async move {
            let watching = Watching::new(&plugin.watched);
            let mut last = None;
            loop {
                let list = plugin.list(&machine.borrow_and_update());
                if last.as_ref() != Some(&list) {
                    if tx.send(Ok(list.clone())).await.is_err() {
                        break;
                    }
                    last = Some(list);
                }
                tokio::select! {
                    changed = machine.changed() => if changed.is_err() {
                        // The plugin's last list was sent: it ends the stream.
                        return;
                    },
                    () = tx.closed() => break,
                }
            }
            // kubelet closed the stream.
            drop(watching);
            plugin.closed_by_kubelet.notify_one();
        });
        Ok(Response::new(stream))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<api::PreferredAllocationRequest>,
    ) -> Result<Response<api::PreferredAllocationResponse>, Status> {
        let card_of = self.card_of();
        let card_of: BTreeMap<&str, &str> = card_of
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let mut responses = Vec::new();
        for c in request.into_inner().container_requests {
            let size = usize::try_from(c.allocation_size).unwrap_or(0);
            let mut chosen: Vec<String> = c.must_include_device_i_ds.clone();
            // The available replicas by card, in order.
            let mut free: BTreeMap<&str, Vec<&String>> = BTreeMap::new();
            for id in c
                .available_device_i_ds
                .iter()
                .filter(|id| !chosen.contains(id))
            {
                if let Some(card) = card_of.get(id.as_str()) {
                    free.entry(card).or_default().push(id);
                }
            }
            for ids in free.values_mut() {
                ids.sort();
            }
            // As few cards as possible: the cards already chosen first; then
            // the card with the fewest free replicas that still covers what
            // is left (best fit), else the one with the most.
            let mut order: Vec<&str> = chosen
                .iter()
                .filter_map(|id| card_of.get(id.as_str()).copied())
                .collect();
            order.dedup();
            let mut need = size.saturating_sub(chosen.len());
            while need > 0 {
                let card = match order.iter().find(|card| free.contains_key(**card)) {
                    Some(card) => *card,
                    None => {
                        let fits = free
                            .iter()
                            .filter(|(_, ids)| ids.len() >= need)
                            .min_by_key(|(card, ids)| (ids.len(), **card));
                        let most = || {
                            free.iter().max_by(|(a, x), (b, y)| {
                                x.len().cmp(&y.len()).then_with(|| b.cmp(a))
                            })
                        };
                        match fits.or_else(most) {
                            Some((card, _)) => *card,
                            None => break,
                        }
                    }
                };
                let ids = free.remove(card).unwrap_or_default();
                for id in ids.into_iter().take(need) {
                    chosen.push(id.clone());
                    need -= 1;
                }
            }
            responses.push(api::ContainerPreferredAllocationResponse {
                device_i_ds: chosen,
            });
        }
        Ok(Response::new(api::PreferredAllocationResponse {
            container_responses: responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<api::AllocateRequest>,
    ) -> Result<Response<api::AllocateResponse>, Status> {
        let request = request.into_inner();
        let Some(_admitted) = self.gate.admit() else {
            return Err(Status::unavailable(format!(
                "{}: the node is switching away from the device plugins",
                self.resource
            )));
        };
        let card_of = self.card_of();
        let card_of: BTreeMap<&str, &str> = card_of
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let mut responses = Vec::new();
        for c in request.container_requests {
            let mut uuids: Vec<&str> = Vec::new();
            for id in &c.devices_ids {
                let uuid = card_of.get(id.as_str()).ok_or_else(|| {
                    Status::invalid_argument(format!("{}: unknown device {id}", self.resource))
                })?;
                if !uuids.contains(uuid) {
                    uuids.push(uuid);
                }
            }
            responses.push(api::ContainerAllocateResponse {
                envs: [("NVIDIA_VISIBLE_DEVICES".to_string(), uuids.join(","))]
                    .into_iter()
                    .collect(),
                cdi_devices: uuids
                    .iter()
                    .map(|u| api::CdiDevice {
                        name: cdi::qualified(u),
                    })
                    .collect(),
                ..Default::default()
            });
        }
        Ok(Response::new(api::AllocateResponse {
            container_responses: responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<api::PreStartContainerRequest>,
    ) -> Result<Response<api::PreStartContainerResponse>, Status> {
        Ok(Response::new(api::PreStartContainerResponse {}))
    }
}

/// A stream fed by a task.
fn async_stream<F, Fut>(f: F) -> Watch
where
    F: FnOnce(tokio::sync::mpsc::Sender<Result<api::ListAndWatchResponse, Status>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tokio::spawn(f(tx));
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

/// Serves `plugin` on `socket` (in kubelet's device-plugins directory),
/// registers it with kubelet at `kubelet_socket`, and serves until
/// `shutdown`; the socket is removed after.
pub async fn serve(
    plugin: Arc<DevicePlugin>,
    socket: &Path,
    kubelet_socket: &Path,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let (ready, _) = tokio::sync::oneshot::channel();
    serve_notifying(plugin, socket, kubelet_socket, ready, shutdown).await
}

/// How often a served plugin checks that kubelet still knows it.
const CHECK_EVERY: Duration = Duration::from_secs(1);
/// How long a registered plugin may go unwatched before it registers again
/// (kubelet opens its stream right after a registration).
const UNWATCHED_FOR: Duration = Duration::from_secs(2);

/// A unix socket's identity (device, inode), if it exists.
fn identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// The plugin's gRPC server on its socket.
struct Listening {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
    /// The socket file it listens on.
    socket: Option<(u64, u64)>,
}

impl Listening {
    fn start(plugin: &Arc<DevicePlugin>, socket: &Path) -> Result<Listening, ServeError> {
        let _ = std::fs::remove_file(socket);
        let listener =
            tokio::net::UnixListener::bind(socket).map_err(|source| ServeError::Bind {
                socket: socket.to_path_buf(),
                source,
            })?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tonic::transport::Server::builder()
            .add_service(api::device_plugin_server::DevicePluginServer::new(
                plugin.clone(),
            ))
            .serve_with_incoming_shutdown(crate::authority::incoming(listener), async {
                let _ = stopped.await;
            });
        Ok(Listening {
            stop,
            task: tokio::spawn(server),
            socket: identity(socket),
        })
    }

    /// Stops serving once the open streams have ended.
    async fn stop(self, resource: &str) -> Result<(), ServeError> {
        let _ = self.stop.send(());
        let served = self.task.await.map_err(|source| ServeError::Ended {
            resource: resource.to_string(),
            source,
        })?;
        served.map_err(|source| ServeError::Serve {
            resource: resource.to_string(),
            source,
        })
    }
}

/// [`serve`], saying on `ready` once kubelet accepted the registration; if
/// it fails before, `ready` is dropped unsent and the error returned. While
/// it serves, it registers again whenever kubelet has forgotten it.
pub async fn serve_notifying(
    plugin: Arc<DevicePlugin>,
    socket: &Path,
    kubelet_socket: &Path,
    ready: tokio::sync::oneshot::Sender<()>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let resource = plugin.resource.clone();
    let mut listening = Listening::start(&plugin, socket)?;
    if let Err(e) = register(kubelet_socket, socket, &resource).await {
        listening.task.abort();
        let _ = std::fs::remove_file(socket);
        return Err(e);
    }
    let _ = ready.send(());
    let mut registered_with = identity(kubelet_socket);
    let mut unwatched_since: Option<tokio::time::Instant> = None;
    let mut check = tokio::time::interval(CHECK_EVERY);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let closed_by_kubelet = tokio::select! {
            biased;
            () = &mut shutdown => break,
            ended = &mut listening.task => {
                let _ = std::fs::remove_file(socket);
                return ended
                    .map_err(|source| ServeError::Ended { resource: resource.clone(), source })?
                    .map_err(|source| ServeError::Serve { resource: resource.clone(), source });
            }
            () = plugin.closed_by_kubelet.notified() => true,
            _ = check.tick() => false,
        };
        let kubelet = identity(kubelet_socket);
        if kubelet.is_none() {
            // kubelet is down: it registers nothing now.
            continue;
        }
        let moved = identity(socket) != listening.socket;
        let dropped = if plugin.watched.load(Ordering::SeqCst) == 0 {
            // A stream kubelet closed is not opened again: at once. One
            // never opened after a registration: after a grace.
            closed_by_kubelet
                || unwatched_since
                    .get_or_insert_with(tokio::time::Instant::now)
                    .elapsed()
                    >= UNWATCHED_FOR
        } else {
            unwatched_since = None;
            false
        };
        if !(moved || dropped || kubelet != registered_with) {
            continue;
        }
        if moved {
            // kubelet restarted and removed the socket.
            match Listening::start(&plugin, socket) {
                Ok(new) => {
                    if let Err(e) = std::mem::replace(&mut listening, new).stop(&resource).await {
                        tracing::warn!(error = %e, "stopping the device plugin's old server");
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "binding the device plugin's socket again");
                    continue;
                }
            }
        }
        match register(kubelet_socket, socket, &resource).await {
            Ok(()) => {
                tracing::info!(%resource, "registered again with kubelet");
                registered_with = kubelet;
                unwatched_since = None;
            }
            Err(e) => tracing::warn!(error = %e, "registering again with kubelet"),
        }
    }
    let stopped = listening.stop(&resource).await;
    let _ = std::fs::remove_file(socket);
    stopped
}

async fn register(kubelet_socket: &Path, socket: &Path, resource: &str) -> Result<(), ServeError> {
    let kubelet: PathBuf = kubelet_socket.to_path_buf();
    let channel = crate::connect(kubelet.clone())
        .await
        .map_err(|source| ServeError::Connect { kubelet, source })?;
    let mut client = api::registration_client::RegistrationClient::new(channel);
    client
        .register(api::RegisterRequest {
            version: VERSION.into(),
            // Relative to kubelet's device-plugins directory.
            endpoint: socket
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default()
                .to_string(),
            resource_name: resource.to_string(),
            options: Some(api::DevicePluginOptions {
                pre_start_required: false,
                get_preferred_allocation_available: true,
            }),
        })
        .await
        .map_err(|source| ServeError::Register {
            resource: resource.to_string(),
            source,
        })?;
    Ok(())
}

/// A connector to a unix socket, for tonic's client.
pub fn tower_service(
    path: PathBuf,
) -> impl tower::Service<
    tonic::transport::Uri,
    Response = hyper_util::rt::TokioIo<tokio::net::UnixStream>,
    Error = std::io::Error,
    Future = impl Send,
> + Clone {
    tower::service_fn(move |_| {
        let path = path.clone();
        async move {
            Ok(hyper_util::rt::TokioIo::new(
                tokio::net::UnixStream::connect(path).await?,
            ))
        }
    })
}

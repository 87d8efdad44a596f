//! Serving exactly one stack: the node's assigned stack (the `gpu-stack`
//! label stack-assigner writes) decides whether the agent serves the DRA
//! kubelet plugin (and publishes the node's ResourceSlices) or the
//! device-plugin API.
//!
//! A switch stops the old API completely before the new one starts:
//! - the device plugins first tell kubelet they have no devices, then stop
//!   and remove their sockets;
//! - the DRA plugin withdraws the node's ResourceSlices, then stops and
//!   removes its sockets.
//!
//! A switch is refused while the old stack is in use — claims prepared by the
//! DRA plugin, or devices the device plugins handed to containers — with the
//! list of what is in use, for a `HandoverBlocked` report.

use std::path::PathBuf;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::ResourceSlice;
use switchyard_gpu::Machine;
use switchyard_gpu::publish::{self, Layout};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use switchyard_kubelet::deviceplugin::{self, DevicePlugin, Gate, Sharing};
use switchyard_kubelet::plugin::{self, ClaimSource, DraPlugin};
use switchyard_kubelet::podresources::{DeviceUsage, UsageError};
pub use switchyard_kubelet::stack::Stack;
use switchyard_kubelet::{cdi, metrics};

/// Where the node's ResourceSlices go (the API server in production).
#[async_trait::async_trait]
pub trait SlicePublisher: Send + Sync {
    async fn publish(&self, slices: Vec<ResourceSlice>) -> Result<(), SliceError>;
    async fn withdraw(&self) -> Result<(), SliceError>;
    /// Returns once the node advertises none of `resources` (device-plugin
    /// resource names) as allocatable, as the API server shows it: kubelet
    /// writes the Node's status a moment after a device plugin stops.
    async fn wait_unadvertised(&self, resources: &[String]) -> Result<(), SliceError> {
        let _ = resources;
        Ok(())
    }
}

/// Why the node's ResourceSlices could not be published or withdrawn.
#[derive(Debug, thiserror::Error)]
pub enum SliceError {
    #[error("list the node's ResourceSlices: {source}")]
    List {
        #[source]
        source: kube::Error,
    },
    #[error("encode ResourceSlice {name}: {source}")]
    Encode {
        name: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("apply ResourceSlice {name}: {source}")]
    Apply {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("delete ResourceSlice {name}: {source}")]
    Delete {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("the Node still advertises {} after {waited:?}: the device plugins' devices must be gone before the node's slices are published", resources.join(", "))]
    StillAdvertised {
        resources: Vec<String>,
        waited: std::time::Duration,
    },
    #[error("watch the Node: {0}")]
    WatchNode(String),
}

/// A switch refused: the old stack is still in use.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the node's {from:?} stack is in use: {}", in_use.join(", "))]
pub struct HandoverBlocked {
    pub from: Stack,
    /// Prepared claims (namespace/name) or allocated device IDs.
    pub in_use: Vec<String>,
}

/// Why the agent could not serve a stack or tell of a changed machine.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// The switch is refused: the old stack is still in use (nothing changed).
    #[error(transparent)]
    Blocked(#[from] HandoverBlocked),
    /// Publishing the node's ResourceSlices (DRA started, or the machine
    /// changed).
    #[error(transparent)]
    Publish(SliceError),
    /// Withdrawing the node's ResourceSlices (switching away from DRA; DRA
    /// stays served).
    #[error(transparent)]
    Withdraw(SliceError),
    /// Writing or removing the device plugins' CDI spec.
    #[error("{action} the device plugins' CDI spec {}: {source}", path.display())]
    CdiSpec {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Reading the devices containers hold (switching away from the device
    /// plugins; they stay served).
    #[error(transparent)]
    Usage(#[from] UsageError),
    /// Loading the DRA plugin's checkpoint.
    #[error(transparent)]
    Checkpoint(#[from] plugin::CheckpointError),
    /// The DRA plugin failed before it was serving.
    #[error(transparent)]
    DraPlugin(#[from] plugin::ServeError),
    /// The DRA plugin's task ended (or panicked) before it was serving, with
    /// no error to tell.
    #[error("the DRA plugin did not start")]
    DraPluginNotStarted,
    /// A device plugin failed before kubelet accepted it.
    #[error(transparent)]
    DevicePlugin(#[from] deviceplugin::ServeError),
    /// A device plugin's task ended (or panicked) before kubelet accepted it,
    /// with no error to tell.
    #[error("a device plugin did not start")]
    DevicePluginNotStarted,
}

/// Paths and settings of the agent.
pub struct AgentConfig {
    pub node: String,
    /// Kubelet's plugins_registry directory (the DRA registration socket).
    pub plugins_registry: PathBuf,
    /// The DRA plugin's directory (its socket and checkpoint).
    pub plugin_dir: PathBuf,
    /// Kubelet's device-plugins directory (kubelet.sock, the plugins' sockets).
    pub device_plugins: PathBuf,
    pub cdi_dir: PathBuf,
    pub layout: Layout,
    pub sharing: Sharing,
    /// The agent pod's UID, when two agents may serve the node at once (a
    /// DaemonSet's rolling update with maxSurge): each names its sockets
    /// after it, so kubelet holds both and prefers the newer.
    pub instance: Option<String>,
}

/// How much of the pod UID a socket name carries: its first group (32
/// random bits), so that the longest names (a MIG profile's device plugin
/// under `/var/lib/kubelet/device-plugins/`) stay within the 107 bytes a
/// unix socket path may have.
const INSTANCE_TAG: usize = 8;

impl AgentConfig {
    /// `<stem><suffix>`, or `<stem>-<tag><suffix>` for one of several
    /// instances (the tag: the pod UID's first [`INSTANCE_TAG`] characters).
    fn socket_name(&self, stem: &str, suffix: &str) -> String {
        match &self.instance {
            Some(uid) => {
                let tag: String = uid.chars().take(INSTANCE_TAG).collect();
                format!("{stem}-{tag}{suffix}")
            }
            None => format!("{stem}{suffix}"),
        }
    }
}

/// Removes the sockets in `dir` named `<prefix>…<suffix>` that nothing
/// listens on: left by an agent that was killed, so kubelet does not keep
/// dialling them.
fn remove_dead_sockets(dir: &std::path::Path, prefix: &str, suffix: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for path in entries.flatten().map(|e| e.path()) {
        let named = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with(prefix) && n.ends_with(suffix));
        if named
            && std::os::unix::net::UnixStream::connect(&path)
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused)
        {
            tracing::info!(socket = %path.display(), "removing a socket nothing serves");
            let _ = std::fs::remove_file(&path);
        }
    }
}

struct Server<E> {
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), E>>,
}

impl<E> Server<E> {
    async fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

enum Running {
    Dra {
        plugin: Arc<DraPlugin>,
        server: Server<plugin::ServeError>,
    },
    DevicePlugins {
        machine: watch::Sender<Machine>,
        servers: Vec<Server<deviceplugin::ServeError>>,
        gate: Arc<Gate>,
    },
}

/// The node agent's serving half.
pub struct Agent {
    config: AgentConfig,
    machine: Machine,
    claims: Arc<dyn ClaimSource>,
    slices: Arc<dyn SlicePublisher>,
    usage: Arc<dyn DeviceUsage>,
    running: Option<Running>,
    generation: i64,
    waits: Waits,
}

/// What the last switch of stacks waited on (µs since the epoch, µs): the
/// API server (the node's slices published or withdrawn) and kubelet (the
/// devices it holds). The rest of the switch is the agent's own.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Waits {
    pub api: Option<Span>,
    pub kubelet: Option<Span>,
}

/// From its first start to its last end, the calls of one kind a switch made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub started_unix_us: i64,
    pub took_us: i64,
}

pub(crate) fn now_unix_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// `call`, its time added to `span`.
async fn timed<T>(span: &mut Option<Span>, call: impl Future<Output = T>) -> T {
    let started = now_unix_us();
    let out = call.await;
    let ended = now_unix_us();
    let first = span.map_or(started, |s| s.started_unix_us);
    *span = Some(Span {
        started_unix_us: first,
        took_us: ended - first,
    });
    out
}

impl Agent {
    pub fn new(
        config: AgentConfig,
        machine: Machine,
        claims: Arc<dyn ClaimSource>,
        slices: Arc<dyn SlicePublisher>,
        usage: Arc<dyn DeviceUsage>,
    ) -> Agent {
        Agent {
            config,
            machine,
            claims,
            slices,
            usage,
            running: None,
            generation: 0,
            waits: Waits::default(),
        }
    }

    /// What the last [`Agent::serve`] that switched waited on.
    pub fn waits(&self) -> Waits {
        self.waits
    }

    /// The machine as it changed (a card's health): the served stack tells
    /// kubelet or the scheduler — the device plugins' lists, or the node's
    /// slices again at the next generation with the taint.
    pub async fn update(&mut self, machine: Machine) -> Result<(), AgentError> {
        self.machine = machine;
        match &self.running {
            None => {}
            Some(Running::DevicePlugins { machine, .. }) => {
                let _ = machine.send(self.machine.clone());
            }
            Some(Running::Dra { .. }) => {
                self.generation += 1;
                self.republish().await?;
            }
        }
        Ok(())
    }

    /// Publishes the node's slices (at the current generation) while DRA is
    /// served, and tells kubelet's health stream: after a change of the
    /// machine, or again when one was deleted (kubelet wipes a node's slices
    /// when it starts).
    pub async fn republish(&mut self) -> Result<(), AgentError> {
        if let Some(Running::Dra { plugin, .. }) = &self.running {
            let c = &self.config;
            let slices =
                publish::resource_slices(&c.node, &self.machine, c.layout, self.generation);
            plugin.set_health(&slices);
            self.slices
                .publish(slices)
                .await
                .map_err(AgentError::Publish)?;
        }
        Ok(())
    }

    /// The stack served now.
    pub fn serving(&self) -> Option<Stack> {
        match &self.running {
            None => None,
            Some(Running::Dra { .. }) => Some(Stack::Dra),
            Some(Running::DevicePlugins { .. }) => Some(Stack::DevicePlugin),
        }
    }

    /// Serves `stack` (or nothing): stops the other one first, and refuses
    /// while it is in use.
    pub async fn serve(&mut self, stack: Option<Stack>) -> Result<(), AgentError> {
        if self.serving() == stack {
            return Ok(());
        }
        self.waits = Waits::default();
        match self.running.take() {
            None => {}
            Some(Running::Dra { plugin, server }) => {
                // No prepare can slip in between the check and the stop.
                let refused: Option<AgentError> = match plugin.close().await {
                    Ok(Ok(())) => None,
                    Ok(Err(prepared)) => Some(
                        HandoverBlocked {
                            from: Stack::Dra,
                            in_use: prepared,
                        }
                        .into(),
                    ),
                    Err(e) => Some(e.into()),
                };
                if let Some(e) = refused {
                    self.running = Some(Running::Dra { plugin, server });
                    return Err(e);
                }
                if let Err(e) = timed(&mut self.waits.api, self.slices.withdraw()).await {
                    plugin.reopen();
                    self.running = Some(Running::Dra { plugin, server });
                    return Err(AgentError::Withdraw(e));
                }
                server.stop().await;
            }
            Some(Running::DevicePlugins {
                machine,
                servers,
                gate,
            }) => {
                // No Allocate is answered from here on, and those admitted
                // before are answered: what kubelet holds is all.
                gate.close().await;
                let in_use = match timed(&mut self.waits.kubelet, self.usage.in_use()).await {
                    Ok(in_use) => in_use,
                    Err(e) => {
                        gate.reopen();
                        self.running = Some(Running::DevicePlugins {
                            machine,
                            servers,
                            gate,
                        });
                        return Err(e.into());
                    }
                };
                if !in_use.is_empty() {
                    gate.reopen();
                    self.running = Some(Running::DevicePlugins {
                        machine,
                        servers,
                        gate,
                    });
                    return Err(HandoverBlocked {
                        from: Stack::DevicePlugin,
                        in_use,
                    }
                    .into());
                }
                // Kubelet hears there is nothing left before the sockets go.
                let mut empty = self.machine.clone();
                empty.gpus.clear();
                let _ = machine.send(empty);
                // No more changes: each ListAndWatch stream sends the empty
                // list, then ends, and its server can stop.
                drop(machine);
                for server in servers {
                    server.stop().await;
                }
                // Nothing holds a device: no container needs its CDI names.
                let path = self.config.cdi_dir.join(cdi::DEVICE_PLUGIN_SPEC);
                cdi::remove(&path).map_err(|source| AgentError::CdiSpec {
                    action: "remove",
                    path,
                    source,
                })?;
            }
        }
        match stack {
            None => {}
            Some(Stack::Dra) => self.start_dra().await?,
            Some(Stack::DevicePlugin) => self.start_device_plugins().await?,
        }
        metrics::serving(self.serving());
        Ok(())
    }

    async fn start_dra(&mut self) -> Result<(), AgentError> {
        let c = &self.config;
        let plugin = Arc::new(DraPlugin::new(
            plugin::Config {
                node: c.node.clone(),
                machine: self.machine.clone(),
                cdi_dir: c.cdi_dir.clone(),
                checkpoint: c.plugin_dir.join("checkpoint.json"),
                endpoint: c.plugin_dir.join(c.socket_name("dra", ".sock")),
            },
            self.claims.clone(),
        )?);
        self.generation += 1;
        let slices = publish::resource_slices(&c.node, &self.machine, c.layout, self.generation);
        plugin.set_health(&slices);
        // Never both stacks at once, as the API server shows the node: the
        // device plugins' resources are gone from its allocatable first.
        let served: Vec<String> = deviceplugin::resources(&self.machine, c.sharing)
            .into_keys()
            .collect();
        timed(&mut self.waits.api, self.slices.wait_unadvertised(&served))
            .await
            .map_err(AgentError::Publish)?;
        timed(&mut self.waits.api, self.slices.publish(slices))
            .await
            .map_err(AgentError::Publish)?;
        let (stop, stopped) = oneshot::channel::<()>();
        remove_dead_sockets(&c.plugins_registry, publish::DRIVER, "-reg.sock");
        remove_dead_sockets(&c.plugin_dir, "dra", ".sock");
        let registration = c
            .plugins_registry
            .join(c.socket_name(publish::DRIVER, "-reg.sock"));
        let p = plugin.clone();
        let (ready_tx, ready) = oneshot::channel();
        let task = tokio::spawn(async move {
            let served = plugin::serve_notifying(p, &registration, ready_tx, async {
                let _ = stopped.await;
            })
            .await;
            if let Err(e) = &served {
                tracing::error!(error = %e, "the DRA plugin stopped");
            }
            served
        });
        if ready.await.is_err() {
            // It ended before serving: with its error, if it has one.
            return Err(match task.await {
                Ok(Err(e)) => AgentError::DraPlugin(e),
                _ => AgentError::DraPluginNotStarted,
            });
        }
        self.running = Some(Running::Dra {
            plugin,
            server: Server { stop, task },
        });
        Ok(())
    }

    async fn start_device_plugins(&mut self) -> Result<(), AgentError> {
        // The names Allocate answers with resolve before kubelet can ask.
        let path = self.config.cdi_dir.join(cdi::DEVICE_PLUGIN_SPEC);
        let spec = cdi::device_plugin_spec(&self.machine);
        serde_json::to_vec_pretty(&spec)
            .map_err(std::io::Error::other)
            .and_then(|bytes| cdi::write_atomically(&path, &bytes))
            .map_err(|source| AgentError::CdiSpec {
                action: "write",
                path,
                source,
            })?;
        let (machine, watch) = watch::channel(self.machine.clone());
        let gate: Arc<Gate> = Arc::default();
        let mut servers = Vec::new();
        let kubelet = self.config.device_plugins.join("kubelet.sock");
        remove_dead_sockets(&self.config.device_plugins, "switchyard-", ".sock");
        for resource in deviceplugin::resources(&self.machine, self.config.sharing).into_keys() {
            let socket = self.config.device_plugins.join(self.config.socket_name(
                &format!("switchyard-{}", resource.replace(['/', '.'], "-")),
                ".sock",
            ));
            let plugin = Arc::new(DevicePlugin::closable(
                &resource,
                self.config.sharing,
                watch.clone(),
                gate.clone(),
            ));
            let (stop, stopped) = oneshot::channel::<()>();
            let (ready_tx, ready) = oneshot::channel();
            let kubelet = kubelet.clone();
            let task = tokio::spawn(async move {
                let served =
                    deviceplugin::serve_notifying(plugin, &socket, &kubelet, ready_tx, async {
                        let _ = stopped.await;
                    })
                    .await;
                if let Err(e) = &served {
                    tracing::error!(error = %e, "a device plugin stopped");
                }
                served
            });
            if ready.await.is_err() {
                // It ended before kubelet accepted it: with its error, if it
                // has one.
                return Err(match task.await {
                    Ok(Err(e)) => AgentError::DevicePlugin(e),
                    _ => AgentError::DevicePluginNotStarted,
                });
            }
            servers.push(Server { stop, task });
        }
        self.running = Some(Running::DevicePlugins {
            machine,
            servers,
            gate,
        });
        Ok(())
    }

    /// Stops serving as the process ends (SIGTERM, SIGINT): the device
    /// plugins tell kubelet they have no devices, end their streams and
    /// remove their sockets, so the node advertises nothing stale; the DRA
    /// plugin removes its sockets and leaves the node's slices, which kubelet
    /// keeps across a quick restart and wipes once no plugin is back. Unlike
    /// a switch, nothing in use holds this: the containers keep what they
    /// were given.
    pub async fn shutdown(&mut self) {
        match self.running.take() {
            None => {}
            Some(Running::Dra { server, .. }) => server.stop().await,
            Some(Running::DevicePlugins {
                machine, servers, ..
            }) => {
                let mut empty = self.machine.clone();
                empty.gpus.clear();
                let _ = machine.send(empty);
                drop(machine);
                for server in servers {
                    server.stop().await;
                }
            }
        }
        metrics::serving(None);
    }
}

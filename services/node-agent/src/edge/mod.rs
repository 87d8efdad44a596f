//! The node agent's edge: it reads the machine, reports its PhysicalGPUs
//! (`physical_gpus`), watches its Node's `node.deckhouse.io/gpu-stack`
//! label and serves that stack ([`agent`]) — the DRA kubelet plugin with the
//! node's ResourceSlices ([`slices`]), or the device-plugin API — switching
//! when the label changes and the old stack is unused, and follows the
//! cards' health. What people should see is recorded as Events (`events`).
//! The servers kubelet talks to are `switchyard_kubelet`'s. [`serve_node`]
//! is what `switchyard-node-agent serve` (the chart's DaemonSet) and its
//! alias `switchyard serve node-agent` run.

pub mod agent;
mod events;
mod physical_gpus;
pub mod slices;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use switchyard_core::names::TRACEPARENT_ANNOTATION;
use switchyard_gpu::publish::{self, Layout};
use switchyard_kubelet::deviceplugin::Sharing;
use switchyard_kubelet::metrics;
use switchyard_kubelet::plugin::ApiClaims;
use switchyard_kubelet::podresources::PodResourcesUsage;
use switchyard_proto::v1::TraceContext;
use tracing::Instrument;

use agent::{Agent, AgentConfig, AgentError, Span, Stack, now_unix_us};
use events::Events;
use physical_gpus::report;
use slices::ApiSlices;

/// The field manager of the node agent's writes.
pub const FIELD_MANAGER: &str = "switchyard-node-agent";

/// Why the agent could not run: the machine could not be read. (Once it
/// runs, what fails is logged and tried again.)
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("open the GPU source {spec}: {source}")]
    Source {
        spec: String,
        #[source]
        source: switchyard_gpu::SourceError,
    },
    #[error("read the machine: {0}")]
    Machine(#[source] switchyard_gpu::SourceError),
    #[error("read the machine: {0}")]
    MachineTask(#[source] tokio::task::JoinError),
    #[error("listen for SIGTERM: {0}")]
    Signal(#[source] std::io::Error),
}

/// How the agent runs on its node.
pub struct NodeOptions {
    pub node: String,
    /// `nvml`, `fixture:FILE` or `fixture-per-node:FILE`.
    pub gpu_source: String,
    pub layout: Layout,
    pub sharing: Sharing,
    /// Kubelet's root directory (plugins_registry, plugins, device-plugins, pod-resources).
    pub kubelet_dir: PathBuf,
    pub cdi_dir: PathBuf,
    /// The agent pod's UID, when a DaemonSet's rolling update may run two
    /// agents on the node at once (see [`AgentConfig::instance`]).
    pub instance: Option<String>,
}

/// The stack a node's label assigns.
fn assigned(node: &Node) -> Option<Stack> {
    Stack::from_label(node.labels().get("node.deckhouse.io/gpu-stack")?)
}

/// Runs the agent until the node watch ends or the process is interrupted;
/// `started` is called once the machine is read and the first stack served.
pub async fn serve_node(
    client: kube::Client,
    args: NodeOptions,
    started: impl FnOnce(),
) -> Result<(), RunError> {
    let (source, machine) = read_machine(&args.gpu_source, &args.node).await?;
    metrics::gpus(&machine.gpus);
    // The reports are inventory's; serving the stack does not wait for them.
    let reported = match report(&client, &args.node, &machine).await {
        Ok(reported) => reported,
        Err(e) => {
            tracing::warn!(error = %e, "reporting PhysicalGPUs");
            BTreeMap::new()
        }
    };
    let events = Events::new(client.clone(), &args.node);
    let mut health = watch_health(source.clone());
    let agent = new_agent(&client, &args, machine.clone());
    // SIGTERM (a DaemonSet pod stopped) ends serving as SIGINT does.
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(RunError::Signal)?;
    let mut watch = std::pin::pin!(node_watch(&client, &args.node));
    // The node's own slices: one deleted while DRA is served (kubelet wipes
    // a node's slices when it starts) is published again.
    let mut slice_watch = std::pin::pin!(slice_watch(&client, &args.node));
    let mut seen = NodeSeen::new(&args.node);
    let mut serving = Serving {
        client,
        node: args.node,
        agent,
        events,
        machine,
        reported,
    };
    // A refused switch is tried again on the next change or retry tick.
    let mut retry = tokio::time::interval(std::time::Duration::from_secs(30));
    let mut started = Some(started);
    loop {
        tokio::select! {
            event = watch.next() => match event {
                Some(node) => seen.saw(&node),
                None => {
                    serving.agent.shutdown().await;
                    return Ok(());
                }
            },
            _ = retry.tick() => {}
            Some(event) = slice_watch.next() => {
                if matches!(event, watcher::Event::Delete(_) | watcher::Event::InitDone)
                    && serving.agent.serving() == Some(Stack::Dra)
                    && let Err(e) = serving.agent.republish().await
                {
                    tracing::warn!(error = %e, "publishing the node's slices again");
                }
                continue;
            }
            Some(change) = health.recv() => {
                if !serving.health_changed(change).await {
                    // Another error on a card already marked: nothing changes.
                    continue;
                }
            }
            _ = tokio::signal::ctrl_c() => {
                serving.agent.shutdown().await;
                return Ok(());
            }
            _ = terminate.recv() => {
                serving.agent.shutdown().await;
                return Ok(());
            }
        }
        if let Some(stack) = seen.wanted
            && serving.agent.serving() != stack
        {
            serving.switch(stack, &seen).await;
        }
        // Ready once the node's assignment has been acted on.
        if seen.wanted.is_some()
            && let Some(started) = started.take()
        {
            started();
        }
    }
}

/// Startup phase: opens the GPU source `spec` and reads the machine.
async fn read_machine(
    spec: &str,
    node: &str,
) -> Result<(Arc<dyn switchyard_gpu::GpuSource>, switchyard_gpu::Machine), RunError> {
    let source: Arc<dyn switchyard_gpu::GpuSource> = Arc::from(
        switchyard_gpu::source_on(spec, Some(node)).map_err(|source| RunError::Source {
            spec: spec.to_string(),
            source,
        })?,
    );
    // NVML blocks: off the async runtime.
    let read = source.clone();
    let machine = tokio::task::spawn_blocking(move || read.machine())
        .await
        .map_err(RunError::MachineTask)?
        .map_err(RunError::Machine)?;
    Ok((source, machine))
}

/// Startup phase: follows the cards' health off the async runtime, into a channel.
fn watch_health(
    source: Arc<dyn switchyard_gpu::GpuSource>,
) -> tokio::sync::mpsc::Receiver<switchyard_gpu::HealthChange> {
    let (health_tx, health) = tokio::sync::mpsc::channel::<switchyard_gpu::HealthChange>(16);
    tokio::task::spawn_blocking(move || {
        let result = source.watch_health(&mut |change| {
            if change.is_probe() {
                // A liveness probe from the source: is the watch still wanted?
                return !health_tx.is_closed();
            }
            health_tx.blocking_send(change).is_ok()
        });
        if let Err(e) = result {
            tracing::error!(error = %e, "watching GPU health");
        }
    });
    health
}

/// Startup phase: the agent for `machine`, on kubelet's directories and the API.
fn new_agent(client: &kube::Client, args: &NodeOptions, machine: switchyard_gpu::Machine) -> Agent {
    let k = &args.kubelet_dir;
    Agent::new(
        AgentConfig {
            node: args.node.clone(),
            plugins_registry: k.join("plugins_registry"),
            plugin_dir: k.join("plugins").join(publish::DRIVER),
            device_plugins: k.join("device-plugins"),
            cdi_dir: args.cdi_dir.clone(),
            layout: args.layout,
            sharing: args.sharing,
            instance: args.instance.clone(),
        },
        machine,
        Arc::new(ApiClaims(client.clone())),
        Arc::new(ApiSlices::new(client.clone(), &args.node)),
        Arc::new(PodResourcesUsage {
            socket: k.join("pod-resources/kubelet.sock"),
            prefix: "nvidia.com/".into(),
        }),
    )
}

/// Startup phase: the watch of the agent's own Node.
fn node_watch(
    client: &kube::Client,
    node: &str,
) -> impl futures::Stream<Item = Node> + Send + use<> {
    let nodes: kube::Api<Node> = kube::Api::all(client.clone());
    let config = switchyard_kube::watch::config().fields(&format!("metadata.name={node}"));
    switchyard_kube::watch::resilient(
        watcher(nodes, config).applied_objects(),
        format!("Node {node}"),
    )
}

/// Startup phase: the watch of the node's own ResourceSlices of the driver.
fn slice_watch(
    client: &kube::Client,
    node: &str,
) -> impl futures::Stream<Item = watcher::Event<k8s_openapi::api::resource::v1::ResourceSlice>>
+ Send
+ use<> {
    let slices_api: kube::Api<k8s_openapi::api::resource::v1::ResourceSlice> =
        kube::Api::all(client.clone());
    switchyard_kube::watch::resilient(
        watcher(
            slices_api,
            switchyard_kube::watch::config().fields(&format!(
                "spec.nodeName={},spec.driver={}",
                node,
                publish::DRIVER
            )),
        ),
        format!("ResourceSlices of {node}"),
    )
}

/// What the agent last saw of its Node.
struct NodeSeen {
    /// The stack the node's label assigns, once the node has been seen.
    wanted: Option<Option<Stack>>,
    /// When the node last changed, as this agent saw it (µs since the epoch).
    seen_unix_us: i64,
    /// The trace the node's stack was last assigned in.
    trace: Option<TraceContext>,
    /// The Node, for its events.
    node_ref: ObjectReference,
}

impl NodeSeen {
    /// Before the node is seen: nothing wanted, a reference by name.
    fn new(node: &str) -> NodeSeen {
        NodeSeen {
            wanted: None,
            seen_unix_us: 0,
            trace: None,
            node_ref: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(node.to_string()),
                ..ObjectReference::default()
            },
        }
    }

    /// Loop phase: the node changed: the stack it assigns, its trace and its reference.
    fn saw(&mut self, node: &Node) {
        self.seen_unix_us = now_unix_us();
        let wanted = Some(assigned(node));
        if wanted != self.wanted {
            tracing::info!(stack = ?wanted.flatten(), "the node's assigned stack");
        }
        self.wanted = wanted;
        self.trace = node
            .annotations()
            .get(TRACEPARENT_ANNOTATION)
            .map(|traceparent| TraceContext {
                traceparent: traceparent.clone(),
                tracestate: String::new(),
            });
        self.node_ref = node.object_ref(&());
    }
}

/// The agent serving its node, and the machine it reports.
struct Serving {
    client: kube::Client,
    node: String,
    agent: Agent,
    events: Events,
    machine: switchyard_gpu::Machine,
    /// The node's PhysicalGPUs as last reported, by card UUID.
    reported: BTreeMap<String, ObjectReference>,
}

impl Serving {
    /// Loop phase: applies a health change, reports and records it; false if nothing changes.
    async fn health_changed(&mut self, change: switchyard_gpu::HealthChange) -> bool {
        let before = self.machine.clone();
        if change.uuid.is_empty() {
            // NVML cannot say which card was lost: all are suspect.
            for gpu in &mut self.machine.gpus {
                gpu.healthy = false;
            }
        } else {
            self.machine.apply(&change);
        }
        if self.machine == before {
            return false;
        }
        metrics::gpus(&self.machine.gpus);
        if let Err(e) = self.agent.update(self.machine.clone()).await {
            tracing::warn!(error = %e, "publishing the health change");
        }
        match report(&self.client, &self.node, &self.machine).await {
            Ok(now) => self.reported = now,
            Err(e) => tracing::warn!(error = %e, "reporting PhysicalGPUs"),
        }
        for (gpu, was) in self.machine.gpus.iter().zip(&before.gpus) {
            if gpu.healthy != was.healthy {
                tracing::warn!(uuid = %gpu.uuid, healthy = gpu.healthy, reason = %change.reason, "GpuHealthChanged");
                self.events
                    .gpu_health_changed(gpu, &change.reason, &self.reported)
                    .await;
            }
        }
        true
    }

    /// Loop phase: switches the agent to `stack` in the trace it was assigned in.
    async fn switch(&mut self, stack: Option<Stack>, seen: &NodeSeen) {
        let parent = seen
            .trace
            .as_ref()
            .and_then(switchyard_eventlog::trace::from_w3c);
        let switch = switchyard_eventlog::trace::span_in(parent.as_ref(), || {
            tracing::info_span!(
                "switch",
                otel.name = %format_args!("switch to {}", stack.map_or("no stack", Stack::label)),
                node = self.node,
                otel.status_code = tracing::field::Empty,
            )
        })
        .span;
        let switched = self.agent.serve(stack).instrument(switch.clone()).await;
        if switched.is_err() {
            switch.record("otel.status_code", "ERROR");
        }
        match switched {
            Ok(()) => {
                // From the node's change seen to the switch done, with
                // what it waited on (the API server, kubelet): the
                // benchmarks take the agent's own part from it.
                let waits = self.agent.waits();
                let span = |s: Option<Span>| s.map_or((0, 0), |s| (s.started_unix_us, s.took_us));
                let (api_started, api) = span(waits.api);
                let (kubelet_started, kubelet) = span(waits.kubelet);
                tracing::info!(
                    parent: &switch,
                    ?stack,
                    seen_unix_us = seen.seen_unix_us,
                    done_unix_us = now_unix_us(),
                    api_started_unix_us = api_started,
                    api_us = api,
                    kubelet_started_unix_us = kubelet_started,
                    kubelet_us = kubelet,
                    "serving"
                );
            }
            Err(AgentError::Blocked(blocked)) => {
                tracing::warn!(parent: &switch, error = %blocked, "HandoverBlocked: the switch waits");
                self.events
                    .handover_blocked(&blocked, stack, &seen.node_ref)
                    .await;
            }
            Err(e) => tracing::warn!(parent: &switch, error = %e, "switching stacks"),
        }
    }
}

//! The node agent as a process: reads the machine, reports its PhysicalGPUs,
//! watches its Node's `node.deckhouse.io/gpu-stack` label and serves that
//! stack, switching when the label changes and the old stack is unused, and
//! follows the cards' health. What people should see is recorded as Events:
//! `GpuHealthChanged` on a PhysicalGPU, `HandoverBlocked` on the Node. Used by `switchyard-node-agent serve` (the chart's
//! DaemonSet) and its alias `switchyard serve node-agent`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use switchyard_core::names::TRACEPARENT_ANNOTATION;
use switchyard_gpu::publish::{self, Layout};
use switchyard_proto::v1::TraceContext;
use tracing::Instrument;

use crate::agent::{Agent, AgentConfig, AgentError, HandoverBlocked, Stack};
use crate::deviceplugin::Sharing;
use crate::plugin::ApiClaims;
use crate::podresources::PodResourcesUsage;
use crate::slices::ApiSlices;

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

/// Why the node's PhysicalGPUs could not be reported (logged; the agent
/// serves without them).
#[derive(Debug, thiserror::Error)]
enum ReportError {
    #[error("encode PhysicalGPU {name}: {source}")]
    Encode {
        name: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("apply PhysicalGPU {name}: {source}")]
    Apply {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("apply the status of PhysicalGPU {name}: {source}")]
    ApplyStatus {
        name: String,
        #[source]
        source: kube::Error,
    },
}

/// How the agent runs on its node.
pub struct NodeOptions {
    pub node: String,
    /// `nvml` or `fixture:FILE`.
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

/// A pod UID as the downward API gives it (`metadata.uid`): letters, digits
/// and `-`, which go into socket names.
pub fn parse_pod_uid(s: &str) -> Result<String, String> {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        Ok(s.to_string())
    } else {
        Err(format!(
            "{s:?}: expected a pod UID (letters, digits and '-'), as the downward API's metadata.uid gives it"
        ))
    }
}

/// `static`, `partitionable` or `shared:N`.
pub fn parse_layout(s: &str) -> Result<Layout, String> {
    match s.split_once(':') {
        None if s == "static" => Ok(Layout::Static),
        None if s == "partitionable" => Ok(Layout::Partitionable),
        Some(("shared", n)) => match n.parse::<u32>() {
            Ok(replicas) if replicas >= 2 => Ok(Layout::Shared { replicas }),
            _ => Err(format!("shared:{n}: expected shared:N with N >= 2")),
        },
        _ => Err(format!("{s:?}: expected static, partitionable or shared:N")),
    }
}

/// `exclusive`, `time-slicing:N` or `mig`.
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

/// The stack a node's label assigns.
fn assigned(node: &Node) -> Option<Stack> {
    Stack::from_label(node.labels().get("node.deckhouse.io/gpu-stack")?)
}

/// Applies the node's PhysicalGPU reports (spec and labels, then status) by
/// Server-Side Apply under the agent's field manager; returns references to
/// them (with their UIDs, for events), keyed by card UUID.
async fn report(
    client: &kube::Client,
    node: &str,
    machine: &switchyard_gpu::Machine,
) -> Result<BTreeMap<String, ObjectReference>, ReportError> {
    let api: kube::Api<switchyard_api::PhysicalGPU> = kube::Api::all(client.clone());
    let params = kube::api::PatchParams::apply(crate::slices::FIELD_MANAGER).force();
    let mut reported = BTreeMap::new();
    for gpu in publish::physical_gpus(node, machine) {
        let name = gpu.name_any();
        let mut object = serde_json::to_value(&gpu).map_err(|source| ReportError::Encode {
            name: name.clone(),
            source,
        })?;
        object["apiVersion"] = "gpu.deckhouse.io/v1alpha1".into();
        object["kind"] = "PhysicalGPU".into();
        let status = object.as_object_mut().and_then(|o| o.remove("status"));
        let applied = api
            .patch(&name, &params, &kube::api::Patch::Apply(&object))
            .await
            .map_err(|source| ReportError::Apply {
                name: name.clone(),
                source,
            })?;
        if let Some(status) = status {
            let patch = serde_json::json!({"apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "PhysicalGPU", "status": status});
            api.patch_status(&name, &params, &kube::api::Patch::Apply(&patch))
                .await
                .map_err(|source| ReportError::ApplyStatus {
                    name: name.clone(),
                    source,
                })?;
        }
        reported.insert(gpu.spec.uuid.clone(), applied.object_ref(&()));
    }
    Ok(reported)
}

/// What the agent tells people through Kubernetes Events (events.k8s.io/v1,
/// in `default`, where events about cluster-scoped objects live):
/// `GpuHealthChanged` on a PhysicalGPU, `HandoverBlocked` on the Node.
struct Events {
    recorder: Recorder,
    node: String,
}

impl Events {
    fn new(client: kube::Client, node: &str) -> Events {
        Events {
            recorder: Recorder::new(
                client,
                Reporter {
                    controller: "switchyard-node-agent".into(),
                    instance: Some(node.to_string()),
                },
            ),
            node: node.to_string(),
        }
    }

    async fn publish(&self, event: Event, regarding: &ObjectReference) {
        if let Err(e) = self.recorder.publish(&event, regarding).await {
            tracing::warn!(error = %e, reason = %event.reason, "recording an event");
        }
    }

    async fn gpu_health_changed(
        &self,
        gpu: &switchyard_gpu::Gpu,
        reason: &str,
        reported: &BTreeMap<String, ObjectReference>,
    ) {
        let regarding = reported
            .get(&gpu.uuid)
            .cloned()
            .unwrap_or_else(|| ObjectReference {
                api_version: Some("gpu.deckhouse.io/v1alpha1".into()),
                kind: Some("PhysicalGPU".into()),
                name: Some(publish::physical_gpu_name(&self.node, gpu.index)),
                ..ObjectReference::default()
            });
        let (type_, action, note) = if gpu.healthy {
            (
                EventType::Normal,
                "Untaint",
                format!(
                    "GPU {} ({}, index {}) is healthy again ({reason}); its devices no longer carry the {} taint",
                    gpu.uuid,
                    gpu.product_name,
                    gpu.index,
                    publish::UNHEALTHY_TAINT
                ),
            )
        } else {
            (
                EventType::Warning,
                "Taint",
                format!(
                    "GPU {} ({}, index {}) is unhealthy ({reason}); its devices carry the {}:NoSchedule taint and the device plugins list them Unhealthy",
                    gpu.uuid,
                    gpu.product_name,
                    gpu.index,
                    publish::UNHEALTHY_TAINT
                ),
            )
        };
        let event = Event {
            type_,
            reason: "GpuHealthChanged".into(),
            note: Some(note),
            action: action.into(),
            secondary: None,
        };
        self.publish(event, &regarding).await;
    }

    async fn handover_blocked(
        &self,
        blocked: &HandoverBlocked,
        to: Option<Stack>,
        node: &ObjectReference,
    ) {
        let event = Event {
            type_: EventType::Warning,
            reason: "HandoverBlocked".into(),
            note: Some(format!(
                "{blocked}; the switch to {} waits until they are released",
                to.map_or("no stack", Stack::label)
            )),
            action: "SwitchStack".into(),
            secondary: None,
        };
        self.publish(event, node).await;
    }
}

/// Runs the agent until the node watch ends or the process is interrupted;
/// `started` is called once the machine is read and the first stack served.
pub async fn serve_node(
    client: kube::Client,
    args: NodeOptions,
    started: impl FnOnce(),
) -> Result<(), RunError> {
    let source: Arc<dyn switchyard_gpu::GpuSource> = Arc::from(
        switchyard_gpu::source(&args.gpu_source).map_err(|source| RunError::Source {
            spec: args.gpu_source.clone(),
            source,
        })?,
    );
    // NVML blocks: off the async runtime.
    let read = source.clone();
    let mut machine = tokio::task::spawn_blocking(move || read.machine())
        .await
        .map_err(RunError::MachineTask)?
        .map_err(RunError::Machine)?;
    crate::metrics::gpus(&machine.gpus);
    // The reports are inventory's; serving the stack does not wait for them.
    let mut reported = match report(&client, &args.node, &machine).await {
        Ok(reported) => reported,
        Err(e) => {
            tracing::warn!(error = %e, "reporting PhysicalGPUs");
            BTreeMap::new()
        }
    };
    let events = Events::new(client.clone(), &args.node);
    let (health_tx, mut health) = tokio::sync::mpsc::channel::<switchyard_gpu::HealthChange>(16);
    let watch = source.clone();
    tokio::task::spawn_blocking(move || {
        let result = watch.watch_health(&mut |change| {
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
    let k = &args.kubelet_dir;
    let mut agent = Agent::new(
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
        machine.clone(),
        Arc::new(ApiClaims(client.clone())),
        Arc::new(ApiSlices::new(client.clone(), &args.node)),
        Arc::new(PodResourcesUsage {
            socket: k.join("pod-resources/kubelet.sock"),
            prefix: "nvidia.com/".into(),
        }),
    );
    // SIGTERM (a DaemonSet pod stopped) ends serving as SIGINT does.
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(RunError::Signal)?;
    let nodes: kube::Api<Node> = kube::Api::all(client.clone());
    let config = switchyard_kube::watch::config().fields(&format!("metadata.name={}", args.node));
    let mut watch = std::pin::pin!(switchyard_kube::watch::resilient(
        watcher(nodes, config).applied_objects(),
        format!("Node {}", args.node),
    ));
    // The node's own slices: one deleted while DRA is served (kubelet wipes
    // a node's slices when it starts) is published again.
    let slices_api: kube::Api<k8s_openapi::api::resource::v1::ResourceSlice> =
        kube::Api::all(client.clone());
    let mut slice_watch = std::pin::pin!(switchyard_kube::watch::resilient(
        watcher(
            slices_api,
            switchyard_kube::watch::config().fields(&format!(
                "spec.nodeName={},spec.driver={}",
                args.node,
                publish::DRIVER
            )),
        ),
        format!("ResourceSlices of {}", args.node),
    ));
    let mut node_ref = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(args.node.clone()),
        ..ObjectReference::default()
    };
    // A refused switch is tried again on the next change or retry tick.
    let mut retry = tokio::time::interval(std::time::Duration::from_secs(30));
    let mut wanted = None;
    // When the node last changed, as this agent saw it (µs since the epoch).
    let mut seen_unix_us = 0;
    let mut started = Some(started);
    // The trace the node's stack was last assigned in.
    let mut trace: Option<TraceContext> = None;
    loop {
        tokio::select! {
            event = watch.next() => match event {
                Some(node) => {
                    seen_unix_us = crate::agent::now_unix_us();
                    wanted = Some(assigned(&node));
                    trace = node
                        .annotations()
                        .get(TRACEPARENT_ANNOTATION)
                        .map(|traceparent| TraceContext {
                            traceparent: traceparent.clone(),
                            tracestate: String::new(),
                        });
                    node_ref = node.object_ref(&());
                }
                None => {
                    agent.shutdown().await;
                    return Ok(());
                }
            },
            _ = retry.tick() => {}
            Some(event) = slice_watch.next() => {
                if matches!(event, watcher::Event::Delete(_) | watcher::Event::InitDone)
                    && agent.serving() == Some(Stack::Dra)
                    && let Err(e) = agent.republish().await
                {
                    tracing::warn!(error = %e, "publishing the node's slices again");
                }
                continue;
            }
            Some(change) = health.recv() => {
                let before = machine.clone();
                if change.uuid.is_empty() {
                    // NVML cannot say which card was lost: all are suspect.
                    for gpu in &mut machine.gpus {
                        gpu.healthy = false;
                    }
                } else {
                    machine.apply(&change);
                }
                if machine == before {
                    // Another error on a card already marked: nothing changes.
                    continue;
                }
                crate::metrics::gpus(&machine.gpus);
                if let Err(e) = agent.update(machine.clone()).await {
                    tracing::warn!(error = %e, "publishing the health change");
                }
                match report(&client, &args.node, &machine).await {
                    Ok(now) => reported = now,
                    Err(e) => tracing::warn!(error = %e, "reporting PhysicalGPUs"),
                }
                for (gpu, was) in machine.gpus.iter().zip(&before.gpus) {
                    if gpu.healthy != was.healthy {
                        tracing::warn!(uuid = %gpu.uuid, healthy = gpu.healthy, reason = %change.reason, "GpuHealthChanged");
                        events.gpu_health_changed(gpu, &change.reason, &reported).await;
                    }
                }
            }
            _ = tokio::signal::ctrl_c() => {
                agent.shutdown().await;
                return Ok(());
            }
            _ = terminate.recv() => {
                agent.shutdown().await;
                return Ok(());
            }
        }
        if let Some(stack) = wanted
            && agent.serving() != stack
        {
            let parent = trace
                .as_ref()
                .and_then(switchyard_eventlog::trace::from_w3c);
            let switch = switchyard_eventlog::trace::span_in(parent.as_ref(), || {
                tracing::info_span!(
                    "switch",
                    otel.name = %format_args!("switch to {}", stack.map_or("no stack", Stack::label)),
                    node = args.node,
                    otel.status_code = tracing::field::Empty,
                )
            })
            .span;
            let switched = agent.serve(stack).instrument(switch.clone()).await;
            if switched.is_err() {
                switch.record("otel.status_code", "ERROR");
            }
            match switched {
                Ok(()) => {
                    // From the node's change seen to the switch done, with
                    // what it waited on (the API server, kubelet): the
                    // benchmarks take the agent's own part from it.
                    let waits = agent.waits();
                    let span = |s: Option<crate::agent::Span>| {
                        s.map_or((0, 0), |s| (s.started_unix_us, s.took_us))
                    };
                    let (api_started, api) = span(waits.api);
                    let (kubelet_started, kubelet) = span(waits.kubelet);
                    tracing::info!(
                        parent: &switch,
                        ?stack,
                        seen_unix_us,
                        done_unix_us = crate::agent::now_unix_us(),
                        api_started_unix_us = api_started,
                        api_us = api,
                        kubelet_started_unix_us = kubelet_started,
                        kubelet_us = kubelet,
                        "serving"
                    );
                }
                Err(AgentError::Blocked(blocked)) => {
                    tracing::warn!(parent: &switch, error = %blocked, "HandoverBlocked: the switch waits");
                    events.handover_blocked(&blocked, stack, &node_ref).await;
                }
                Err(e) => tracing::warn!(parent: &switch, error = %e, "switching stacks"),
            }
        }
        // Ready once the node's assignment has been acted on.
        if wanted.is_some()
            && let Some(started) = started.take()
        {
            started();
        }
    }
}

//! `switchyard-node-agent`: the per-node half of Switchyard.
//!
//! `discover` reads the node's GPUs (NVML, or a fixture where no GPU is
//! present) and prints what the node would publish: its PhysicalGPU reports
//! and, for the DRA stack, its ResourceSlices — as one `List`, so that the
//! output can be applied, or given to `switchyard dra allocate`.

use std::process::ExitCode;

use std::sync::Arc;

use clap::{Parser, Subcommand, ValueEnum};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::runtime::{WatchStreamExt, watcher};
use switchyard_gpu::publish::{self, Layout};
use switchyard_kubelet::agent::{Agent, AgentConfig, Stack};
use switchyard_kubelet::deviceplugin::Sharing;
use switchyard_kubelet::plugin::ApiClaims;
use switchyard_kubelet::podresources::PodResourcesUsage;
use switchyard_kubelet::slices::ApiSlices;
use tracing_subscriber::EnvFilter;

#[derive(Parser)]
#[command(name = "switchyard-node-agent", about = "Switchyard's node agent")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the node's PhysicalGPU reports and ResourceSlices.
    Discover(DiscoverArgs),
    /// Serve the node's assigned stack (its node.deckhouse.io/gpu-stack
    /// label): the DRA kubelet plugin and the node's ResourceSlices, or the
    /// device-plugin API; switch when the label changes and the old stack is
    /// unused.
    Serve(ServeArgs),
}

#[derive(clap::Args)]
struct ServeArgs {
    #[arg(long, env = "SWITCHYARD_GPU_SOURCE", default_value = "nvml")]
    gpu_source: String,
    #[arg(long, env = "NODE_NAME")]
    node: String,
    /// How the DRA stack publishes cards: static, partitionable or shared:N.
    #[arg(long, default_value = "static", value_parser = parse_layout)]
    layout: Layout,
    /// How the device-plugin stack shares cards: exclusive, time-slicing:N or mig.
    #[arg(long, default_value = "exclusive", value_parser = parse_sharing)]
    sharing: Sharing,
    /// Kubelet's root directory (plugins_registry, plugins, device-plugins, pod-resources).
    #[arg(long, default_value = "/var/lib/kubelet")]
    kubelet_dir: std::path::PathBuf,
    #[arg(long, default_value = "/var/run/cdi")]
    cdi_dir: std::path::PathBuf,
}

fn parse_sharing(s: &str) -> Result<Sharing, String> {
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
    match node
        .labels()
        .get("node.deckhouse.io/gpu-stack")
        .map(String::as_str)
    {
        Some("dra") => Some(Stack::Dra),
        Some("device-plugin") => Some(Stack::DevicePlugin),
        _ => None,
    }
}

async fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let source: Arc<dyn switchyard_gpu::GpuSource> =
        Arc::from(switchyard_gpu::source(&args.gpu_source)?);
    // NVML blocks: off the async runtime.
    let read = source.clone();
    let mut machine = tokio::task::spawn_blocking(move || read.machine()).await??;
    let client = kube::Client::try_default().await?;
    // The reports are inventory's; serving the stack does not wait for them.
    if let Err(e) = report(&client, &args.node, &machine).await {
        tracing::warn!(error = %e, "reporting PhysicalGPUs");
    }
    let (health_tx, mut health) = tokio::sync::mpsc::channel::<switchyard_gpu::HealthChange>(16);
    let watch = source.clone();
    tokio::task::spawn_blocking(move || {
        let result = watch.watch_health(&mut |change| {
            if change.uuid.is_empty() && change.healthy {
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
        },
        machine.clone(),
        Arc::new(ApiClaims(client.clone())),
        Arc::new(ApiSlices::new(client.clone(), &args.node)),
        Arc::new(PodResourcesUsage {
            socket: k.join("pod-resources/kubelet.sock"),
            prefix: "nvidia.com/".into(),
        }),
    );
    let nodes: kube::Api<Node> = kube::Api::all(client.clone());
    let config = watcher::Config::default().fields(&format!("metadata.name={}", args.node));
    let mut events = std::pin::pin!(watcher(nodes, config).applied_objects());
    // A refused switch is tried again on the next change or retry tick.
    let mut retry = tokio::time::interval(std::time::Duration::from_secs(30));
    let mut wanted = None;
    loop {
        tokio::select! {
            event = events.next() => match event {
                Some(Ok(node)) => wanted = Some(assigned(&node)),
                Some(Err(e)) => tracing::warn!(error = %e, "watching the node"),
                None => return Ok(ExitCode::SUCCESS),
            },
            _ = retry.tick() => {}
            Some(change) = health.recv() => {
                if change.uuid.is_empty() {
                    // NVML cannot say which card was lost: all are suspect.
                    for gpu in &mut machine.gpus {
                        gpu.healthy = false;
                    }
                } else {
                    machine.apply(&change);
                }
                tracing::warn!(uuid = %change.uuid, healthy = change.healthy, reason = %change.reason, "GpuHealthChanged");
                if let Err(e) = agent.update(machine.clone()).await {
                    tracing::warn!(error = %e, "publishing the health change");
                }
                if let Err(e) = report(&client, &args.node, &machine).await {
                    tracing::warn!(error = %e, "reporting PhysicalGPUs");
                }
            }
            _ = tokio::signal::ctrl_c() => return Ok(ExitCode::SUCCESS),
        }
        if let Some(stack) = wanted
            && agent.serving() != stack
        {
            match agent.serve(stack).await {
                Ok(()) => tracing::info!(?stack, "serving"),
                Err(e) => tracing::warn!(error = %e, "HandoverBlocked: the switch waits"),
            }
        }
    }
}

#[derive(clap::Args)]
struct DiscoverArgs {
    /// `nvml`, or `fixture:FILE` (a YAML machine; see deploy/fixtures/).
    #[arg(long, env = "SWITCHYARD_GPU_SOURCE", default_value = "nvml")]
    gpu_source: String,
    /// The node's name (the pool and the reports are named after it).
    #[arg(long, env = "NODE_NAME")]
    node: Option<String>,
    /// `static` (cards as configured, MIG devices of MIG-mode cards),
    /// `partitionable` (every MIG profile on the cards' counters) or
    /// `shared:N` (whole cards shared by N consumers).
    #[arg(long, default_value = "static", value_parser = parse_layout)]
    layout: Layout,
    /// The pool's generation.
    #[arg(long, default_value_t = 1)]
    generation: i64,
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Yaml)]
    output: Format,
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Json,
    Yaml,
}

fn parse_layout(s: &str) -> Result<Layout, String> {
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

/// Applies the node's PhysicalGPU reports (spec and labels, then status) by
/// Server-Side Apply under the agent's field manager.
async fn report(
    client: &kube::Client,
    node: &str,
    machine: &switchyard_gpu::Machine,
) -> anyhow::Result<()> {
    let api: kube::Api<switchyard_api::PhysicalGPU> = kube::Api::all(client.clone());
    let params = kube::api::PatchParams::apply(switchyard_kubelet::slices::FIELD_MANAGER).force();
    for gpu in publish::physical_gpus(node, machine) {
        let name = gpu.name_any();
        let mut object = serde_json::to_value(&gpu)?;
        object["apiVersion"] = "gpu.deckhouse.io/v1alpha1".into();
        object["kind"] = "PhysicalGPU".into();
        let status = object.as_object_mut().and_then(|o| o.remove("status"));
        api.patch(&name, &params, &kube::api::Patch::Apply(&object))
            .await?;
        if let Some(status) = status {
            let patch = serde_json::json!({"apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "PhysicalGPU", "status": status});
            api.patch_status(&name, &params, &kube::api::Patch::Apply(&patch))
                .await?;
        }
    }
    Ok(())
}

fn discover(args: DiscoverArgs) -> anyhow::Result<ExitCode> {
    let node = match args.node {
        Some(node) => node,
        None => std::fs::read_to_string("/etc/hostname")
            .map(|h| h.trim().to_string())
            .map_err(|_| {
                anyhow::anyhow!("no --node given, NODE_NAME unset and no /etc/hostname")
            })?,
    };
    let source = switchyard_gpu::source(&args.gpu_source)?;
    let machine = source.machine()?;
    let mut items = Vec::new();
    for gpu in publish::physical_gpus(&node, &machine) {
        let mut value = serde_json::to_value(&gpu)?;
        value["apiVersion"] = "gpu.deckhouse.io/v1alpha1".into();
        value["kind"] = "PhysicalGPU".into();
        items.push(value);
    }
    for slice in publish::resource_slices(&node, &machine, args.layout, args.generation) {
        let mut value = serde_json::to_value(&slice)?;
        value["apiVersion"] = "resource.k8s.io/v1".into();
        value["kind"] = "ResourceSlice".into();
        items.push(value);
    }
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items});
    match args.output {
        Format::Json => println!("{}", serde_json::to_string_pretty(&list)?),
        Format::Yaml => print!("{}", serde_yaml_ng::to_string(&list)?),
    }
    Ok(ExitCode::SUCCESS)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Discover(args) => discover(args),
        Command::Serve(args) => {
            tracing_subscriber::fmt()
                .with_env_filter(EnvFilter::from_default_env())
                .init();
            match tokio::runtime::Runtime::new() {
                Ok(runtime) => runtime.block_on(serve(args)),
                Err(e) => Err(e.into()),
            }
        }
    };
    result.unwrap_or_else(|e| {
        eprintln!("error: {e:#}");
        ExitCode::from(2)
    })
}

//! `switchyard-node-agent`: the per-node half of Switchyard.
//!
//! `discover` reads the node's GPUs (NVML, or a fixture where no GPU is
//! present) and prints what the node would publish: its PhysicalGPU reports
//! and, for the DRA stack, its ResourceSlices — as one `List`, so that the
//! output can be applied, or given to `switchyard dra allocate`.

use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use switchyard_gpu::publish::{self, Layout};
use switchyard_kubelet::deviceplugin::Sharing;
use switchyard_kubelet::run::{NodeOptions, parse_layout, parse_sharing, serve_node};
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
                Ok(runtime) => runtime.block_on(async move {
                    let client = kube::Client::try_default().await?;
                    let options = NodeOptions {
                        node: args.node,
                        gpu_source: args.gpu_source,
                        layout: args.layout,
                        sharing: args.sharing,
                        kubelet_dir: args.kubelet_dir,
                        cdi_dir: args.cdi_dir,
                    };
                    serve_node(client, options, || {})
                        .await
                        .map_err(|e| anyhow::anyhow!("{e}"))?;
                    Ok(ExitCode::SUCCESS)
                }),
                Err(e) => Err(e.into()),
            }
        }
    };
    result.unwrap_or_else(|e| {
        eprintln!("error: {e:#}");
        ExitCode::from(2)
    })
}

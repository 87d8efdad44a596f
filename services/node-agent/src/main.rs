//! `switchyard-node-agent`: the per-node half of Switchyard.
//!
//! `discover` reads the node's GPUs (NVML, or a fixture where no GPU is
//! present) and prints what the node would publish: its PhysicalGPU reports
//! and, for the DRA stack, its ResourceSlices — as one `List`, so that the
//! output can be applied, or given to `switchyard dra allocate`.

use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use switchyard_gpu::publish::{self, Layout};

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
    };
    result.unwrap_or_else(|e| {
        eprintln!("error: {e:#}");
        ExitCode::from(2)
    })
}

//! `switchyard-node-agent discover`: the node's PhysicalGPU reports and
//! ResourceSlices, printed as one `List`, so that the output can be applied,
//! or given to `switchyard dra allocate`.

use std::process::ExitCode;

use clap::ValueEnum;
use switchyard_gpu::publish::{self, Layout, parse_layout};

#[derive(clap::Args)]
pub struct DiscoverArgs {
    /// `nvml`, `fixture:FILE` (a YAML machine; see deploy/fixtures/), or
    /// `fixture-per-node:FILE`: a machine shared by several nodes, each card's
    /// UUID made the node's own (its first eight hex digits from the node's
    /// name), as the chart's `nodeAgent.gpuSource=fixture` runs it.
    #[arg(long, env = "SWITCHYARD_GPU_SOURCE", default_value = "nvml")]
    gpu_source: String,
    /// The node's name (the pool and the reports are named after it).
    #[arg(long, env = "NODE_NAME")]
    node: Option<String>,
    /// `static` (cards as configured, MIG devices of MIG-mode cards),
    /// `partitionable` (every MIG profile on the cards' counters) or
    /// `shared:N` (whole cards shared by N consumers).
    #[arg(long, env = "SWITCHYARD_LAYOUT", default_value = "static", value_parser = parse_layout)]
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

pub fn discover(args: DiscoverArgs) -> anyhow::Result<ExitCode> {
    let node = match args.node {
        Some(node) => node,
        None => std::fs::read_to_string("/etc/hostname")
            .map(|h| h.trim().to_string())
            .map_err(|_| {
                anyhow::anyhow!("no --node given, NODE_NAME unset and no /etc/hostname")
            })?,
    };
    let source = switchyard_gpu::source_on(&args.gpu_source, Some(&node))?;
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

//! `switchyard dra`: the DRA engine on files.
//! - `eval`: a device selector evaluated as Kubernetes does, against a device
//!   of a ResourceSlice;
//! - `allocate`: what the scheduler's allocator decides for claims on a node;
//! - `explain`: why each candidate device was passed over.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{Args, Subcommand};
use k8s_openapi::api::resource::v1::ResourceSlice;
use switchyard_dra::Quantity;
use switchyard_dra::alloc::{NodeReport, Objects};
use switchyard_dra::cel::{Attribute, Compiler, Device, SelectorError};

use crate::output::{Output, write_stdout};

#[derive(Subcommand, Debug)]
pub enum DraCommand {
    /// Evaluate a device selector (CEL) against a device of a ResourceSlice;
    /// prints true, false or the error (exit 0, 1 or 2).
    Eval(EvalArgs),
    /// Allocate claims on a node as the Kubernetes scheduler would. FILEs hold
    /// any mix of ResourceSlices, DeviceClasses, ResourceClaims and Nodes;
    /// claims with status.allocation count as allocated, the others are
    /// allocated together in file order. Exit 0 allocated, 1 unschedulable,
    /// 2 error.
    Allocate(AllocateArgs),
    /// For each request of the pending claims, every candidate device on the
    /// node with the first reason it was passed over.
    Explain(ExplainArgs),
}

#[derive(Args, Debug)]
pub struct AllocateArgs {
    /// Files of objects (YAML or JSON; several documents and Lists allowed).
    #[arg(short = 'f', long = "file", required = true, num_args = 1..)]
    pub files: Vec<PathBuf>,
    #[arg(long)]
    pub node: String,
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Json)]
    pub output: Format,
}

#[derive(Args, Debug)]
pub struct ExplainArgs {
    /// Files of objects, as for `dra allocate`.
    #[arg(short = 'f', long = "file", required = true, num_args = 1..)]
    pub files: Vec<PathBuf>,
    #[arg(long)]
    pub node: String,
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table, env = "SWITCHYARD_OUTPUT")]
    pub output: Output,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Format {
    Json,
    Yaml,
}

/// Every document of the files, as JSON values: each file bounded in size
/// and nesting before it is parsed ([`switchyard_dra::input`]).
fn documents(paths: &[PathBuf]) -> anyhow::Result<Vec<serde_json::Value>> {
    let mut out = Vec::new();
    for path in paths {
        out.extend(switchyard_dra::input::documents(
            &path.display().to_string(),
            &read_bounded(path)?,
        )?);
    }
    Ok(out)
}

/// A file's text, refused unread if it is over the input limit.
fn read_bounded(path: &PathBuf) -> anyhow::Result<String> {
    let size = std::fs::metadata(path)
        .with_context(|| format!("read {}", path.display()))?
        .len();
    anyhow::ensure!(
        size <= switchyard_dra::input::MAX_INPUT_BYTES as u64,
        "{}: {size} bytes; at most {} are read",
        path.display(),
        switchyard_dra::input::MAX_INPUT_BYTES
    );
    std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))
}

fn allocate(args: AllocateArgs) -> anyhow::Result<ExitCode> {
    let objects = Objects::from_values(documents(&args.files)?)?;
    let outcome = objects.allocate(&args.node, Arc::new(Compiler::default()));
    match args.output {
        Format::Json => println!("{}", serde_json::to_string_pretty(&outcome)?),
        Format::Yaml => print!("{}", serde_yaml_ng::to_string(&outcome)?),
    }
    Ok(ExitCode::from(match outcome.result.as_str() {
        "allocated" => 0,
        "unschedulable" => 1,
        _ => 2,
    }))
}

fn explain(args: ExplainArgs) -> anyhow::Result<ExitCode> {
    let objects = Objects::from_values(documents(&args.files)?)?;
    let report = objects.explain(&args.node, Arc::new(Compiler::default()))?;
    match args.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&report)?),
        Output::Table => write_stdout(&report_table(&report, ""))?,
    }
    Ok(ExitCode::from(if report.allocated() { 0 } else { 1 }))
}

/// A node's report as `dra explain` prints it, each line after `indent`:
/// the verdict, then per request every candidate device and its reason.
pub fn report_table(report: &NodeReport, indent: &str) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let verdict = match &report.error {
        Some(e) => format!("{} ({e})", report.result),
        None => report.result.clone(),
    };
    let _ = writeln!(out, "{indent}node {}: {verdict}", report.node);
    for r in &report.requests {
        let _ = writeln!(
            out,
            "{indent}claim {} request {} (class {}, wants {}):",
            r.claim, r.request, r.class, r.wants
        );
        if r.candidates.is_empty() {
            let _ = writeln!(out, "{indent}  no devices on this node");
        }
        for c in &r.candidates {
            match &c.reason {
                Some(reason) => _ = writeln!(out, "{indent}  {}: {reason}", c.device),
                None => _ = writeln!(out, "{indent}  {}: fits on its own", c.device),
            }
        }
    }
    out
}

#[derive(Args, Debug)]
pub struct EvalArgs {
    /// The CEL expression, e.g. "device.attributes['gpu.deckhouse.io'].model == 'a100-sxm4-40gb'".
    #[arg(long)]
    pub expr: String,
    /// A file with ResourceSlices (YAML or JSON; several YAML documents allowed).
    #[arg(short = 'f', long)]
    pub file: PathBuf,
    /// The device's name; default: the first device of the first slice.
    #[arg(long)]
    pub device: Option<String>,
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table, env = "SWITCHYARD_OUTPUT")]
    pub output: Output,
}

fn slices(path: &PathBuf) -> anyhow::Result<Vec<ResourceSlice>> {
    let mut out = Vec::new();
    let documents =
        switchyard_dra::input::documents(&path.display().to_string(), &read_bounded(path)?)?;
    for (i, value) in documents.into_iter().enumerate() {
        if value.get("kind").and_then(|k| k.as_str()) != Some("ResourceSlice") {
            continue;
        }
        let slice: ResourceSlice = switchyard_dra::input::strict(value).with_context(|| {
            format!(
                "{}: document {} is not a valid ResourceSlice",
                path.display(),
                i + 1
            )
        })?;
        out.push(slice);
    }
    anyhow::ensure!(
        !out.is_empty(),
        "{}: no ResourceSlice in the file",
        path.display()
    );
    Ok(out)
}

/// A device of a ResourceSlice as selectors see it.
pub fn device_of(
    slice: &ResourceSlice,
    device: &k8s_openapi::api::resource::v1::Device,
) -> anyhow::Result<Device> {
    let mut attributes = std::collections::BTreeMap::new();
    for (name, a) in device.attributes.iter().flatten() {
        let value = match (a.int, a.bool, &a.string, &a.version) {
            (Some(i), None, None, None) => Attribute::Int(i),
            (None, Some(b), None, None) => Attribute::Bool(b),
            (None, None, Some(s), None) => Attribute::String(s.clone()),
            (None, None, None, Some(v)) => Attribute::Version(v.clone()),
            // A list (list-typed attributes are off in 1.36) or nothing:
            // every selector on the device fails, as in Kubernetes.
            (None, None, None, None) => Attribute::Unsupported,
            _ => anyhow::bail!(
                "device {}: attribute {name}: expected exactly one of int, bool, string, version",
                device.name
            ),
        };
        attributes.insert(name.clone(), value);
    }
    let mut capacity = std::collections::BTreeMap::new();
    for (name, c) in device.capacity.iter().flatten() {
        let q = Quantity::parse(&c.value.0).map_err(|e| {
            anyhow::anyhow!(
                "device {}: capacity {name}: {:?}: {e}",
                device.name,
                c.value.0
            )
        })?;
        capacity.insert(name.clone(), q);
    }
    Ok(Device {
        driver: slice.spec.driver.clone(),
        allow_multiple_allocations: device.allow_multiple_allocations.unwrap_or(false),
        attributes,
        capacity,
    })
}

pub fn run(command: DraCommand) -> anyhow::Result<ExitCode> {
    let args = match command {
        DraCommand::Eval(args) => args,
        DraCommand::Allocate(args) => return allocate(args),
        DraCommand::Explain(args) => return explain(args),
    };
    let slices = slices(&args.file)?;
    let found = slices.iter().find_map(|slice| {
        slice
            .spec
            .devices
            .iter()
            .flatten()
            .find(|d| args.device.as_deref().is_none_or(|name| d.name == name))
            .map(|d| (slice, d))
    });
    let Some((slice, device)) = found else {
        anyhow::bail!(
            "{}: no device {}",
            args.file.display(),
            args.device
                .as_deref()
                .map_or("at all".to_string(), |d| format!("named {d:?}"))
        );
    };
    let result = Compiler::default().eval(&args.expr, &device_of(slice, device)?);
    let (text, code) = match &result {
        Ok(true) => ("true".to_string(), 0),
        Ok(false) => ("false".to_string(), 1),
        Err(e) => (e.to_string(), 2),
    };
    match args.output {
        Output::Table => {
            if code == 2 {
                eprintln!("error: {text}");
            } else {
                println!("{text}");
            }
        }
        Output::Json => {
            let value = match &result {
                Ok(b) => serde_json::json!({"device": device.name, "result": b}),
                Err(SelectorError::Compile(e)) => {
                    serde_json::json!({"device": device.name, "compileError": e.to_string()})
                }
                Err(SelectorError::Eval(e)) => {
                    serde_json::json!({"device": device.name, "error": e.to_string()})
                }
            };
            println!("{value}");
        }
    }
    Ok(ExitCode::from(code))
}

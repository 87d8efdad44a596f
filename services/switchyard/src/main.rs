//! `switchyard`: the command line for people, and the image's one binary.
//!
//! Multi-call: run under a service's name (`switchyard-inventory`, ...,
//! `switchyard-node-agent`, the image's links to this binary, which the
//! chart runs), it is that service, the same program as the service's own
//! binary. One binary instead of seven keeps the image that every GPU node
//! pulls small.

#![forbid(unsafe_code)]

/// mimalloc: the cores allocate many small strings and maps; it is much
/// faster than the system allocator for that, and wastes less memory.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::Path;
use std::process::ExitCode;

use clap::Parser;
use switchyard::cli;

fn main() -> ExitCode {
    let argv0 = std::env::args_os().next().unwrap_or_default();
    let name = Path::new(&argv0).file_name().and_then(|n| n.to_str());
    match name {
        Some("switchyard-inventory") => switchyard_inventory::main(),
        Some("switchyard-stack-assigner") => switchyard_stack_assigner::main(),
        Some("switchyard-class-compiler") => switchyard_class_compiler::main(),
        Some("switchyard-claim-allocator") => switchyard_claim_allocator::main(),
        Some("switchyard-alerter") => switchyard_alerter::main(),
        Some("switchyard-node-agent") => switchyard_node_agent::main(),
        _ => command_line(),
    }
}

/// The command line for people.
#[tokio::main]
async fn command_line() -> ExitCode {
    let cli = cli::Cli::parse();
    let (service, level) = cli.logging();
    let telemetry = switchyard_runtime::init_tracing(service, level);
    let result = cli.run().await;
    telemetry.flush().await;
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            ExitCode::from(2)
        }
    }
}

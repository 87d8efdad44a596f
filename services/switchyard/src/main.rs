//! `switchyard`: the command line for people.

#![forbid(unsafe_code)]

/// mimalloc: the cores allocate many small strings and maps; it is much
/// faster than the system allocator for that, and wastes less memory.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod backend;
mod cli;
mod complete;
mod crdgen;
mod demo;
mod doctor;
mod dra_cmd;
mod evidence_cmd;
mod handover;
mod keys_cmd;
mod kube_args;
mod log_cmd;
mod migrate;
mod move_cmd;
mod operator;
mod output;
mod plan;
mod rollback;
mod serve;
mod state;

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = cli::Cli::parse();
    let (service, level) = cli.logging();
    let telemetry = switchyard_runtime::init_tracing(service, level);
    let result = cli.run().await;
    telemetry.flush().await;
    match result {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::from(2)
        }
    }
}

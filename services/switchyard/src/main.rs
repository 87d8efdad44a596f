//! `switchyard`: the command line for people.

#![forbid(unsafe_code)]

/// mimalloc: the cores allocate many small strings and maps; it is much
/// faster than the system allocator for that, and wastes less memory.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::Parser;
use switchyard::cli;

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

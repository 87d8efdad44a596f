//! `switchyard-claim-allocator`: the claim-allocator as a process.

use std::process::ExitCode;

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "switchyard-claim-allocator",
    version,
    about = "Switchyard's claim-allocator"
)]
struct Cli {
    #[command(flatten)]
    args: switchyard_claim_allocator::Args,
}

#[tokio::main]
async fn main() -> ExitCode {
    let telemetry = switchyard_runtime::init_tracing("claim-allocator", "info");
    let result = switchyard_claim_allocator::run(Cli::parse().args).await;
    telemetry.flush().await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::from(2)
        }
    }
}

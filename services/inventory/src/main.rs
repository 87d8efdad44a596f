//! `switchyard-inventory`: the inventory as a process.

use std::process::ExitCode;

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "switchyard-inventory",
    version,
    about = "Switchyard's inventory"
)]
struct Cli {
    #[command(flatten)]
    args: switchyard_inventory::Args,
}

#[tokio::main]
async fn main() -> ExitCode {
    let telemetry = switchyard_runtime::init_tracing("inventory", "info");
    let result = switchyard_inventory::run(Cli::parse().args).await;
    telemetry.flush().await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::from(2)
        }
    }
}

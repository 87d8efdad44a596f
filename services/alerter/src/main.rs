//! `switchyard-alerter`: the alerter as a process.

use std::process::ExitCode;

use clap::Parser;

#[derive(Parser)]
#[command(name = "switchyard-alerter", version, about = "Switchyard's alerter")]
struct Cli {
    #[command(flatten)]
    args: switchyard_alerter::Args,
}

#[tokio::main]
async fn main() -> ExitCode {
    let telemetry = switchyard_runtime::init_tracing("alerter", "info");
    let result = switchyard_alerter::run(Cli::parse().args).await;
    telemetry.flush().await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::from(2)
        }
    }
}

//! `switchyard-stack-assigner`: the stack-assigner as a process.

use std::process::ExitCode;

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "switchyard-stack-assigner",
    version,
    about = "Switchyard's stack-assigner"
)]
struct Cli {
    #[command(flatten)]
    args: switchyard_stack_assigner::Args,
}

#[tokio::main]
async fn main() -> ExitCode {
    let telemetry = switchyard_runtime::init_tracing("stack-assigner", "info");
    let result = switchyard_stack_assigner::run(Cli::parse().args).await;
    telemetry.flush().await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::from(2)
        }
    }
}

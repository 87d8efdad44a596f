//! `switchyard-class-compiler`: the class-compiler as a process.

use std::process::ExitCode;

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "switchyard-class-compiler",
    version,
    about = "Switchyard's class-compiler"
)]
struct Cli {
    #[command(flatten)]
    args: switchyard_class_compiler::Args,
}

#[tokio::main]
async fn main() -> ExitCode {
    let telemetry = switchyard_runtime::init_tracing("class-compiler", "info");
    let result = switchyard_class_compiler::run(Cli::parse().args).await;
    telemetry.flush().await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            ExitCode::from(2)
        }
    }
}

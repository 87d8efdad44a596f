//! `switchyard-node-agent`'s command line: `serve` the node's assigned
//! stack, or `discover` what the node would publish.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::discover;

#[derive(Parser)]
#[command(
    name = "switchyard-node-agent",
    version,
    about = "Switchyard's node agent"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the node's PhysicalGPU reports and ResourceSlices.
    Discover(discover::DiscoverArgs),
    /// Serve the node's assigned stack (its node.deckhouse.io/gpu-stack
    /// label): the DRA kubelet plugin and the node's ResourceSlices, or the
    /// device-plugin API; switch when the label changes and the old stack is
    /// unused.
    Serve(crate::Args),
}

impl Cli {
    /// Runs the command; an error is printed and exits 2.
    pub fn run(self) -> ExitCode {
        let result = match self.command {
            Command::Discover(args) => discover::discover(args),
            Command::Serve(args) => tokio::runtime::Runtime::new()
                .map_err(anyhow::Error::from)
                .and_then(|rt| {
                    Ok(rt.block_on(async {
                        // In the runtime: traces are exported from a task of it.
                        let telemetry = switchyard_runtime::init_tracing("node-agent", "info");
                        let served = crate::run(args).await;
                        telemetry.flush().await;
                        served
                    })?)
                })
                .map(|()| ExitCode::SUCCESS),
        };
        result.unwrap_or_else(|e| {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        })
    }
}

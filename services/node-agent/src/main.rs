//! `switchyard-node-agent`: `serve` the node's assigned stack, or `discover`
//! what the node would publish ([`switchyard_node_agent::cli`]).

use std::process::ExitCode;

use clap::Parser;
use switchyard_node_agent::cli::Cli;

fn main() -> ExitCode {
    Cli::parse().run()
}

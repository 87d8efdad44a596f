//! `switchyard serve <service>`: a service as a process, the same as its own
//! binary `switchyard-<service>` with the same flags (the chart runs the
//! service binaries; this alias is for one binary on a workstation).

use std::process::ExitCode;

use clap::Subcommand;

#[derive(Subcommand, Debug)]
pub enum Service {
    /// = switchyard-inventory
    Inventory(switchyard_inventory::Args),
    /// = switchyard-stack-assigner
    StackAssigner(Box<switchyard_stack_assigner::Args>),
    /// = switchyard-class-compiler
    ClassCompiler(switchyard_class_compiler::Args),
    /// = switchyard-claim-allocator
    ClaimAllocator(switchyard_claim_allocator::Args),
    /// = switchyard-alerter
    Alerter(switchyard_alerter::Args),
    /// = switchyard-node-agent serve
    NodeAgent(switchyard_node_agent::Args),
}

impl Service {
    /// The service's name, as its logs give it.
    pub fn name(&self) -> &'static str {
        match self {
            Service::Inventory(_) => "inventory",
            Service::StackAssigner(_) => "stack-assigner",
            Service::ClassCompiler(_) => "class-compiler",
            Service::ClaimAllocator(_) => "claim-allocator",
            Service::Alerter(_) => "alerter",
            Service::NodeAgent(_) => "node-agent",
        }
    }
}

pub async fn serve(service: Service) -> anyhow::Result<ExitCode> {
    match service {
        Service::Inventory(args) => switchyard_inventory::run(args).await?,
        Service::StackAssigner(args) => switchyard_stack_assigner::run(*args).await?,
        Service::ClassCompiler(args) => switchyard_class_compiler::run(args).await?,
        Service::ClaimAllocator(args) => switchyard_claim_allocator::run(args).await?,
        Service::Alerter(args) => switchyard_alerter::run(args).await?,
        Service::NodeAgent(args) => switchyard_node_agent::run(args).await?,
    }
    Ok(ExitCode::SUCCESS)
}

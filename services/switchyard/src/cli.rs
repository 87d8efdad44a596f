//! The command line: which command runs. Each command is a module owning
//! its arguments; every flag can also come from the environment.

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

#[derive(Parser, Debug)]
#[command(
    name = "switchyard",
    version,
    about = "Switchyard: move GPU nodes and workloads from the device plugin to DRA, one at a time"
)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the reference migration in one process: the cores on the embedded
    /// log, against a simulated cluster. Exits non-zero if an invariant fails.
    Demo(crate::demo::DemoArgs),
    /// Nodes by group and stack, held groups, alerts, handovers, moves.
    Status(crate::state::StatusArgs),
    /// The state as of a log sequence.
    Replay(crate::state::ReplayArgs),
    /// Inspect and check the migration log.
    #[command(subcommand)]
    Log(crate::log_cmd::LogCommand),
    /// Signing keys of services and operators (NKeys).
    #[command(subcommand)]
    Keys(crate::keys_cmd::KeysCommand),
    /// Print the CustomResourceDefinitions from the Rust types, or write them
    /// into a Helm chart's crds/ directory.
    Crdgen(crate::crdgen::CrdgenArgs),
    /// Write a man page (section 1) for every command and subcommand into a
    /// directory: switchyard.1, switchyard-log-show.1, ... (read one with
    /// `man -l DIR/switchyard.1`, or write them into a man1/ directory of
    /// MANPATH).
    Man(crate::man::ManArgs),
    /// Run one service as a process against the cluster (in-cluster config or
    /// KUBECONFIG) and the JetStream log: the same as its own binary,
    /// `switchyard-<service>`.
    #[command(subcommand)]
    Serve(crate::serve::Service),
    /// Hand a node over to another group (a command to the running stack-assigner).
    Handover(crate::handover::HandoverArgs),
    /// Move a workload to a GPU class: its nvidia.com/gpu request becomes the
    /// class's, the binding to the source group goes, it restarts (a command
    /// to the running claim-allocator); --dry-run prints the change.
    Move(Box<crate::move_cmd::MoveArgs>),
    /// Complete the migration from a group: quotas, leftover labels, and after
    /// the trial period the group's spec.gpu (a command to the claim-allocator).
    Complete(crate::complete::CompleteArgs),
    /// Undo the last handover of a node or move of a workload (planned from
    /// the log, carried out by the running stack-assigner or claim-allocator).
    #[command(subcommand)]
    Rollback(crate::rollback::RollbackCommand),
    /// Dynamic Resource Allocation: evaluate device selectors as Kubernetes does.
    #[command(subcommand)]
    Dra(crate::dra_cmd::DraCommand),
    /// Diagnose the reference's "Common mistakes" (and the NVIDIA guide's
    /// troubleshooting list) on the live cluster, read-only: each finding
    /// with its objects, cause and fix. Exit 0 nothing found (or only
    /// informational findings), 1 a warning, 2 error.
    Doctor(crate::doctor::DoctorArgs),
    /// Why an object is as it is, from what the API server holds.
    #[command(subcommand)]
    Explain(crate::doctor::ExplainCommand),
    /// The migration-wave register and the proposed waves, from the live
    /// cluster (read only): which nodes of --from to hand over to --to in
    /// which order, and which workloads then fit, as the scheduler would
    /// allocate them. Exit 0: complete; 1: something stays; 2: an error.
    Plan(crate::plan::PlanArgs),
    /// Run the plan's waves by themselves: hand over, move what now fits,
    /// verify, next (a migration the running claim-allocator drives from the
    /// log); `pause`, `resume`, `abort` (which rolls the current wave back).
    Migrate(crate::migrate::MigrateArgs),
    /// Check the exit evidence now and record it in the log, per node and
    /// workload: no dual advertisement, the DRA plug-in healthy, slices
    /// matching the PhysicalGPUs, pods on the target group, claims allocated
    /// and reserved, restart and cleanup. Exit 0: all shown; 1: some fail.
    Evidence(crate::evidence_cmd::EvidenceArgs),
}

impl Cli {
    /// Who logs and at what level when `RUST_LOG` says nothing: a service
    /// run by `serve` as its own binary would, a command only its warnings.
    pub fn logging(&self) -> (&'static str, &'static str) {
        match &self.command {
            Command::Serve(service) => (service.name(), "info"),
            _ => ("switchyard", "warn"),
        }
    }

    pub async fn run(self) -> anyhow::Result<ExitCode> {
        match self.command {
            Command::Demo(args) => crate::demo::demo(args).await,
            Command::Status(args) => crate::state::current(args).await,
            Command::Replay(args) => crate::state::replay(args).await,
            Command::Crdgen(args) => crate::crdgen::crdgen(args),
            Command::Man(args) => crate::man::man(args, &trees()),
            Command::Serve(service) => crate::serve::serve(service).await,
            Command::Handover(args) => crate::handover::handover(args).await,
            Command::Move(args) => crate::move_cmd::move_workload(*args).await,
            Command::Complete(args) => crate::complete::complete(args).await,
            Command::Dra(command) => crate::dra_cmd::run(command),
            Command::Doctor(args) => crate::doctor::doctor(args).await,
            Command::Explain(command) => crate::doctor::explain(command).await,
            Command::Plan(args) => crate::plan::run(args).await,
            Command::Migrate(args) => crate::migrate::migrate(args).await,
            Command::Evidence(args) => crate::evidence_cmd::evidence(args).await,
            Command::Rollback(crate::rollback::RollbackCommand::Node(args)) => {
                crate::rollback::rollback_node(args).await
            }
            Command::Rollback(crate::rollback::RollbackCommand::App(args)) => {
                crate::rollback::rollback_app(args).await
            }
            Command::Log(crate::log_cmd::LogCommand::Show(args)) => {
                crate::log_cmd::show(args).await
            }
            Command::Log(crate::log_cmd::LogCommand::Verify(args)) => {
                crate::log_cmd::verify(args).await
            }
            Command::Log(crate::log_cmd::LogCommand::Init(args)) => {
                crate::log_cmd::init(args).await
            }
            Command::Log(crate::log_cmd::LogCommand::Schemas(args)) => {
                crate::log_cmd::schemas(args)
            }
            Command::Keys(command) => crate::keys_cmd::run(command),
        }
    }
}

/// The command trees the reference and the man pages cover: `switchyard`'s
/// and the node agent's.
pub fn trees() -> [clap::Command; 2] {
    [Cli::command(), switchyard_node_agent::cli::Cli::command()]
}

//! Command-line arguments. Every flag can also come from the environment.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};

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
    Demo(DemoArgs),
    /// Nodes by group and stack, held groups, alerts, handovers, moves.
    Status(StateArgs),
    /// The state as of a log sequence.
    Replay(ReplayArgs),
    /// Inspect and check the migration log.
    #[command(subcommand)]
    Log(LogCommand),
    /// Print the CustomResourceDefinitions from the Rust types, or write them
    /// into a Helm chart's crds/ directory.
    Crdgen(CrdgenArgs),
    /// Run one service as a process against the cluster (in-cluster config or
    /// KUBECONFIG) and the JetStream log: the same as its own binary,
    /// `switchyard-<service>`.
    #[command(subcommand)]
    Serve(crate::serve::Service),
    /// Hand a node over to another group (a command to the running stack-assigner).
    Handover(crate::handover::HandoverArgs),
    /// Undo the last handover of a node (planned from the log, carried out by
    /// the running stack-assigner).
    #[command(subcommand)]
    Rollback(RollbackCommand),
    /// Dynamic Resource Allocation: evaluate device selectors as Kubernetes does.
    #[command(subcommand)]
    Dra(crate::dra_cmd::DraCommand),
}

#[derive(Subcommand, Debug)]
pub enum RollbackCommand {
    /// Restore a node's labels, taints and cordon state as before its last handover.
    Node(crate::rollback::RollbackNodeArgs),
}

#[derive(Args, Debug)]
pub struct CrdgenArgs {
    /// Write one file per CRD into this directory (e.g. deploy/helm/switchyard/crds).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// GPU nodes of the source group (spec.gpu, device plugin).
    #[arg(long, env = "SWITCHYARD_DEMO_NODES", default_value_t = 4)]
    pub nodes: usize,
    #[arg(long, env = "SWITCHYARD_DEMO_GPUS_PER_NODE", default_value_t = 8)]
    pub gpus_per_node: u32,
    /// Deployments requesting nvidia.com/gpu (as many as fit in all nodes but one).
    #[arg(long, env = "SWITCHYARD_DEMO_WORKLOADS", default_value_t = 6)]
    pub workloads: usize,
    /// Seed of the simulated cluster: the same seed gives the same log.
    #[arg(long, env = "SWITCHYARD_DEMO_SEED", default_value_t = 1)]
    pub seed: u64,
    /// Where to write the migration log (an empty or new directory); default: a new temp dir.
    #[arg(long, env = "SWITCHYARD_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table, env = "SWITCHYARD_OUTPUT")]
    pub output: Output,
}

#[derive(Args, Debug)]
pub struct StateArgs {
    #[command(flatten)]
    pub backend: Backend,
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table, env = "SWITCHYARD_OUTPUT")]
    pub output: Output,
}

#[derive(Args, Debug)]
pub struct ReplayArgs {
    #[command(flatten)]
    pub state: StateArgs,
    /// Fold the log up to and including this sequence.
    #[arg(long)]
    pub until: u64,
}

#[derive(Subcommand, Debug)]
pub enum LogCommand {
    /// Print events of the log, oldest first.
    Show(ShowArgs),
    /// Check every checksum and hash chain; exit 1 if anything is wrong.
    Verify(VerifyArgs),
}

/// Where the log lives: an embedded data directory or a JetStream stream
/// (the same `--nats-url`, `--nats-creds`, `--stream` as every service).
#[derive(Args, Debug, Clone)]
pub struct Backend {
    /// Directory of an embedded log.
    #[arg(
        long,
        env = "SWITCHYARD_DATA_DIR",
        required_unless_present = "nats_url",
        conflicts_with = "nats_url"
    )]
    pub data_dir: Option<PathBuf>,
    /// NATS server URL of a JetStream log, e.g. nats://127.0.0.1:4222.
    #[arg(long = "nats-url", alias = "nats", env = "SWITCHYARD_NATS_URL")]
    pub nats_url: Option<String>,
    /// A NATS credentials file (JWT and NKey seed).
    #[arg(long, env = "SWITCHYARD_NATS_CREDS")]
    pub nats_creds: Option<PathBuf>,
    #[command(flatten)]
    pub stream: switchyard_runtime::connect::StreamArgs,
}

impl Backend {
    /// The JetStream connection, when the log is a stream.
    pub fn nats(&self) -> Option<switchyard_runtime::connect::NatsArgs> {
        self.nats_url
            .as_ref()
            .map(|url| switchyard_runtime::connect::NatsArgs {
                nats_url: url.clone(),
                nats_creds: self.nats_creds.clone(),
                stream: self.stream.clone(),
            })
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

#[derive(Args, Debug)]
pub struct ShowArgs {
    #[command(flatten)]
    pub backend: Backend,
    /// Only events of this subject (aggregate), e.g. node.worker-1.
    #[arg(long, env = "SWITCHYARD_SUBJECT")]
    pub subject: Option<String>,
    /// First sequence to show.
    #[arg(long, default_value_t = 1)]
    pub from: u64,
    /// Show at most this many events.
    #[arg(long)]
    pub limit: Option<usize>,
    /// table: one line per event; json: one JSON object per line with the
    /// envelope fields and the decoded payload.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table, env = "SWITCHYARD_OUTPUT")]
    pub output: Output,
}

#[derive(Args, Debug)]
pub struct VerifyArgs {
    #[command(flatten)]
    pub backend: Backend,
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table, env = "SWITCHYARD_OUTPUT")]
    pub output: Output,
}

impl Cli {
    pub async fn run(self) -> anyhow::Result<ExitCode> {
        match self.command {
            Command::Demo(args) => crate::demo::demo(args).await,
            Command::Status(args) => crate::log_cmd::status(args, None).await,
            Command::Replay(args) => crate::log_cmd::status(args.state, Some(args.until)).await,
            Command::Crdgen(args) => crdgen(args),
            Command::Serve(service) => crate::serve::serve(service).await,
            Command::Handover(args) => crate::handover::handover(args).await,
            Command::Dra(command) => crate::dra_cmd::run(command),
            Command::Rollback(RollbackCommand::Node(args)) => {
                crate::rollback::rollback_node(args).await
            }
            Command::Log(LogCommand::Show(args)) => crate::log_cmd::show(args).await,
            Command::Log(LogCommand::Verify(args)) => crate::log_cmd::verify(args).await,
        }
    }
}

fn crdgen(args: CrdgenArgs) -> anyhow::Result<ExitCode> {
    let mut all = String::new();
    for (file, crd) in switchyard_api::crds() {
        let yaml = switchyard_api::to_yaml(&crd);
        match &args.out {
            Some(dir) => {
                std::fs::create_dir_all(dir)?;
                std::fs::write(dir.join(file), yaml)?;
            }
            None => all += &format!("---\n{yaml}"),
        }
    }
    if args.out.is_none() {
        crate::log_cmd::write_stdout(&all)?;
    }
    Ok(ExitCode::SUCCESS)
}

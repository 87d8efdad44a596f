//! `switchyard rollback node` and `switchyard rollback app`: planned from the
//! log, carried out by the running service that owns the node or workload.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use switchyard_core::ServiceName;
use switchyard_core::rollback::RollbackRefused;
use switchyard_proto::v1::{DomainEvent, WorkloadRef, service_command};

use crate::operator::OperatorArgs;

#[derive(Subcommand, Debug)]
pub enum RollbackCommand {
    /// Restore a node's labels, taints and cordon state as before its last
    /// handover: cordon, drain, group change, verification.
    Node(RollbackNodeArgs),
    /// Restore a workload's manifest as before its last move and restart it.
    App(RollbackAppArgs),
}

#[derive(Args, Debug)]
pub struct RollbackNodeArgs {
    /// The node whose last handover to undo.
    #[arg(long)]
    pub node: String,
    #[command(flatten)]
    pub operator: OperatorArgs,
}

#[derive(Args, Debug)]
pub struct RollbackAppArgs {
    /// The workload whose last move to undo: NAMESPACE/KIND/NAME.
    #[arg(long, value_parser = crate::move_cmd::parse_workload)]
    pub workload: WorkloadRef,
    #[command(flatten)]
    pub operator: OperatorArgs,
}

/// Reads the whole log into the prefix a rollback is planned from.
pub(crate) async fn log_prefix(operator: &OperatorArgs) -> anyhow::Result<Vec<(u64, DomainEvent)>> {
    let client = operator.nats.client("cli").await?;
    let log = operator.nats.stream.open(client, false).await?;
    let mut prefix = Vec::new();
    switchyard_eventlog::replay(&log, 0, |stored| {
        if let switchyard_eventlog::Decoded::Event(event) = stored.decode() {
            prefix.push((stored.sequence, event));
        }
    })
    .await?;
    Ok(prefix)
}

/// Sends a planned rollback to its owner, or says why the log refuses it.
pub(crate) async fn send(
    operator: &OperatorArgs,
    owner: ServiceName,
    planned: Result<DomainEvent, RollbackRefused>,
) -> anyhow::Result<ExitCode> {
    match planned {
        Ok(planned) => {
            operator
                .run(owner, service_command::Command::Rollback(planned))
                .await
        }
        Err(why) => {
            eprintln!("refused: {why}");
            Ok(ExitCode::from(1))
        }
    }
}

pub async fn rollback_node(args: RollbackNodeArgs) -> anyhow::Result<ExitCode> {
    let prefix = log_prefix(&args.operator).await?;
    let id = format!("rollback-{}", uuid::Uuid::new_v4());
    let planned = switchyard_core::rollback::plan_node_rollback(&prefix, &args.node, &id);
    send(&args.operator, ServiceName::StackAssigner, planned).await
}

pub async fn rollback_app(args: RollbackAppArgs) -> anyhow::Result<ExitCode> {
    let prefix = log_prefix(&args.operator).await?;
    let id = format!("rollback-{}", uuid::Uuid::new_v4());
    let planned = switchyard_core::rollback::plan_workload_rollback(&prefix, &args.workload, &id);
    send(&args.operator, ServiceName::ClaimAllocator, planned).await
}

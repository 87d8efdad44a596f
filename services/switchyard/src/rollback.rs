//! `switchyard rollback node`: planned from the log, carried out by the
//! running stack-assigner.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use switchyard_core::ServiceName;
use switchyard_proto::v1::{ServiceCommand, service_command};
use switchyard_runtime::connect::NatsArgs;

#[derive(Subcommand, Debug)]
pub enum RollbackCommand {
    /// Restore a node's labels, taints and cordon state as before its last handover.
    Node(RollbackNodeArgs),
}

#[derive(Args, Debug)]
pub struct RollbackNodeArgs {
    /// The node whose last handover to undo.
    #[arg(long)]
    pub node: String,
    #[command(flatten)]
    pub nats: NatsArgs,
}

pub async fn rollback_node(args: RollbackNodeArgs) -> anyhow::Result<ExitCode> {
    let client = args.nats.client("cli").await?;
    let log = args.nats.log(client.clone()).await?;
    let mut prefix = Vec::new();
    switchyard_eventlog::replay(log.as_ref(), 0, |stored| {
        if let switchyard_eventlog::Decoded::Event(event) = stored.decode() {
            prefix.push((stored.sequence, event));
        }
    })
    .await?;
    let rollback_id = format!("rollback-{}", uuid::Uuid::new_v4());
    let planned =
        match switchyard_core::rollback::plan_node_rollback(&prefix, &args.node, &rollback_id) {
            Ok(planned) => planned,
            Err(why) => {
                eprintln!("refused: {why}");
                return Ok(ExitCode::from(1));
            }
        };
    let command = ServiceCommand {
        command: Some(service_command::Command::Rollback(planned)),
    };
    let reply =
        switchyard_runtime::commands::send(&client, ServiceName::StackAssigner, command).await?;
    crate::handover::report(reply)
}

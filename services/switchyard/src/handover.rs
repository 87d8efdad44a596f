//! `switchyard handover`: a command to the running stack-assigner.

use std::process::ExitCode;

use clap::Args;
use switchyard_core::ServiceName;
use switchyard_proto::v1::{StartHandoverCommand, service_command};

use crate::operator::OperatorArgs;

#[derive(Args, Debug)]
pub struct HandoverArgs {
    /// The node to hand over.
    #[arg(long)]
    pub node: String,
    /// The group to move it to, e.g. gpu-dra.
    #[arg(long)]
    pub to: String,
    /// Id of the handover; default: a new one.
    #[arg(long)]
    pub id: Option<String>,
    /// Hand the last device-plugin node over even though nvidia.com/gpu
    /// workloads still need it (they go Pending until moved).
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub operator: OperatorArgs,
}

pub async fn handover(args: HandoverArgs) -> anyhow::Result<ExitCode> {
    let command = service_command::Command::StartHandover(StartHandoverCommand {
        handover_id: args
            .id
            .unwrap_or_else(|| format!("handover-{}", uuid::Uuid::new_v4())),
        node: args.node,
        target_group: args.to,
        force: args.force,
    });
    args.operator.run(ServiceName::StackAssigner, command).await
}

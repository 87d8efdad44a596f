//! `switchyard handover`: a command to the running stack-assigner.

use std::process::ExitCode;

use clap::Args;
use switchyard_core::ServiceName;
use switchyard_proto::v1::{CommandReply, ServiceCommand, StartHandoverCommand, service_command};
use switchyard_runtime::connect::NatsArgs;

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
    pub nats: NatsArgs,
}

/// Prints a service's answer: each decision as its type and JSON; exit 1 if
/// the command or the handover was refused.
pub fn report(reply: CommandReply) -> anyhow::Result<ExitCode> {
    if !reply.error.is_empty() {
        eprintln!("refused: {}", reply.error);
        return Ok(ExitCode::from(1));
    }
    let mut refused = false;
    for decision in &reply.decisions {
        let Some(kind) = &decision.kind else { continue };
        let json = serde_json::to_string(decision).unwrap_or_default();
        println!("{} {json}", kind.type_name());
        refused |= matches!(
            kind,
            switchyard_proto::v1::domain_event::Kind::HandoverRefused(_)
        );
    }
    Ok(if refused {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

pub async fn handover(args: HandoverArgs) -> anyhow::Result<ExitCode> {
    let client = args.nats.client("cli").await?;
    let command = ServiceCommand {
        command: Some(service_command::Command::StartHandover(
            StartHandoverCommand {
                handover_id: args
                    .id
                    .unwrap_or_else(|| format!("handover-{}", uuid::Uuid::new_v4())),
                node: args.node,
                target_group: args.to,
                force: args.force,
            },
        )),
    };
    let reply =
        switchyard_runtime::commands::send(&client, ServiceName::StackAssigner, command).await?;
    report(reply)
}

//! `switchyard rollback node` and `switchyard rollback app`: planned from the
//! log, carried out by the running service that owns the node or workload.

use std::process::ExitCode;

use clap::{Args, Subcommand};
use switchyard_core::ServiceName;
use switchyard_core::rollback::RollbackRefused;
use switchyard_proto::v1::rollback_started::Target;
use switchyard_proto::v1::{DomainEvent, WorkloadRef, domain_event::Kind, service_command};

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
    /// Id of the rollback; default: a new one. Given again, it follows the
    /// rollback of that id instead of starting another (as after a `--wait`
    /// cut short).
    #[arg(long)]
    pub id: Option<String>,
    #[command(flatten)]
    pub operator: OperatorArgs,
}

#[derive(Args, Debug)]
pub struct RollbackAppArgs {
    /// The workload whose last move to undo: NAMESPACE/KIND/NAME.
    #[arg(long, value_parser = crate::move_cmd::parse_workload)]
    pub workload: WorkloadRef,
    /// Id of the rollback; default: a new one. Given again, it follows the
    /// rollback of that id instead of starting another (as after a `--wait`
    /// cut short).
    #[arg(long)]
    pub id: Option<String>,
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
        Err(why) => refused(&why),
    }
}

fn refused(why: &dyn std::fmt::Display) -> anyhow::Result<ExitCode> {
    eprintln!("refused: {why}");
    Ok(ExitCode::from(1))
}

/// The rollback's id, and the rollback already recorded under it if there
/// is one: sent again as recorded (its owner answers where it is), since
/// the log, planned again, may have nothing left to roll back. Refused when
/// that rollback was of something else.
fn id_and_recorded(
    prefix: &[(u64, DomainEvent)],
    id: Option<String>,
    target: Target,
) -> Result<(String, Option<DomainEvent>), String> {
    let id = id.unwrap_or_else(|| format!("rollback-{}", uuid::Uuid::new_v4()));
    let recorded = prefix.iter().find_map(|(_, event)| match &event.kind {
        Some(Kind::RollbackStarted(r)) if r.rollback_id == id => Some((event, r)),
        _ => None,
    });
    match recorded {
        None => Ok((id, None)),
        Some((event, r)) if r.target.as_ref() == Some(&target) => Ok((id, Some(event.clone()))),
        Some((_, r)) => Err(format!(
            "rollback {id} was of {}; this asks for {} (give it a new id)",
            describe(r.target.as_ref()),
            describe(Some(&target))
        )),
    }
}

fn describe(target: Option<&Target>) -> String {
    match target {
        Some(Target::Node(node)) => format!("node {node}"),
        Some(Target::Workload(w)) => format!("{} {}/{}", w.kind, w.namespace, w.name),
        None => "nothing".into(),
    }
}

pub async fn rollback_node(args: RollbackNodeArgs) -> anyhow::Result<ExitCode> {
    let prefix = log_prefix(&args.operator).await?;
    let planned = match id_and_recorded(&prefix, args.id, Target::Node(args.node.clone())) {
        Ok((_, Some(recorded))) => Ok(recorded),
        Ok((id, None)) => switchyard_core::rollback::plan_node_rollback(&prefix, &args.node, &id),
        Err(why) => return refused(&why),
    };
    send(&args.operator, ServiceName::StackAssigner, planned).await
}

pub async fn rollback_app(args: RollbackAppArgs) -> anyhow::Result<ExitCode> {
    let prefix = log_prefix(&args.operator).await?;
    let target = Target::Workload(args.workload.clone());
    let planned = match id_and_recorded(&prefix, args.id, target) {
        Ok((_, Some(recorded))) => Ok(recorded),
        Ok((id, None)) => {
            switchyard_core::rollback::plan_workload_rollback(&prefix, &args.workload, &id)
        }
        Err(why) => return refused(&why),
    };
    send(&args.operator, ServiceName::ClaimAllocator, planned).await
}

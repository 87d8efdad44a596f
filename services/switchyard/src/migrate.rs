//! `switchyard migrate`: the waves of `switchyard plan`, run by themselves —
//! the plan computed from the live cluster and sent to the running
//! claim-allocator, which records it and drives each wave (hand over, move
//! what now fits, verify, next) from the log; `pause`, `resume` and `abort`
//! (abort rolls the current wave back, node by node and workload by workload).

use std::collections::BTreeSet;
use std::process::ExitCode;
use std::time::Duration;
use switchyard_claim_allocator::edge::MOVED_KINDS;

use clap::Args;
use switchyard_core::ServiceName;
use switchyard_core::command::{wave_handover_id, wave_move_id};
use switchyard_core::rollback::{plan_node_rollback, plan_workload_rollback};
use switchyard_gpu::publish::{Layout, parse_layout};
use switchyard_planner::{self as plan, PlanRequest};
use switchyard_proto::v1::{
    DomainEvent, MigrationControlCommand, MigrationStarted, PlannedWave, WorkloadRef,
    domain_event::Kind, migration_control_command::Action, service_command,
};

use crate::kube_args::{KubeArgs, NamespaceArgs};
use crate::operator::OperatorArgs;

/// `switchyard migrate --from A --to B ...` starts a migration;
/// `switchyard migrate pause|resume|abort --id ID` steers one.
#[derive(Args, Debug)]
pub struct MigrateArgs {
    /// pause: stop starting new steps (what is in flight goes on); resume:
    /// go on after a pause (the operator's, a wave's end, or the breaker's);
    /// abort: end the migration and roll its current wave back. None: start one.
    #[arg(value_enum, requires = "id")]
    pub action: Option<MigrateAction>,
    /// The source node group (device plugin).
    #[arg(long, required_unless_present = "action", conflicts_with = "action")]
    pub from: Option<String>,
    /// The target node group (DRA).
    #[arg(long, required_unless_present = "action", conflicts_with = "action")]
    pub to: Option<String>,
    /// The GPUClass moved workloads request; default: the only one.
    #[arg(long, env = "SWITCHYARD_CLASS")]
    pub class: Option<String>,
    /// Nodes handed over at once, at most.
    #[arg(long, env = "SWITCHYARD_MAX_UNAVAILABLE", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_unavailable: u32,
    /// Pause after each wave until `switchyard migrate resume`.
    #[arg(long)]
    pub pause_after_wave: bool,
    /// The circuit breaker: pause when moved pods are not running with their
    /// claims this long after their move started.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    pub pending_limit: Duration,
    /// How handed-over nodes publish their cards (the node agent's --layout).
    #[arg(long, env = "SWITCHYARD_LAYOUT", default_value = "static", value_parser = parse_layout)]
    pub layout: Layout,
    /// Id of the migration (the correlation id of everything it does); to
    /// start one, default: a new one.
    #[arg(long)]
    pub id: Option<String>,
    /// Why (recorded with a pause or an abort).
    #[arg(long, default_value = "")]
    pub reason: String,
    #[command(flatten)]
    pub kube: KubeArgs,
    #[command(flatten)]
    pub namespaces: NamespaceArgs,
    #[command(flatten)]
    pub operator: OperatorArgs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum MigrateAction {
    Pause,
    Resume,
    Abort,
}

pub async fn migrate(args: MigrateArgs) -> anyhow::Result<ExitCode> {
    let Some(action) = args.action else {
        return begin(args).await;
    };
    let control = ControlArgs {
        id: args.id.clone().unwrap_or_default(),
        reason: args.reason.clone(),
        operator: args.operator.clone(),
    };
    match action {
        MigrateAction::Pause => self::control(control, Action::Pause).await,
        MigrateAction::Resume => self::control(control, Action::Resume).await,
        MigrateAction::Abort => abort(control).await,
    }
}

/// A pause, resume or abort of one migration.
struct ControlArgs {
    id: String,
    reason: String,
    operator: OperatorArgs,
}

/// The waves the claim-allocator runs: each wave's nodes, then the workloads
/// the plan moves in it (those the claim-allocator moves in place:
/// Deployments, StatefulSets, DaemonSets and CronJobs — a CronJob's at its
/// next run, which its wave waits for; the others, Jobs included, are named
/// and left to the operator).
fn waves(plan: &plan::Plan) -> (Vec<PlannedWave>, Vec<String>) {
    let mut left = Vec::new();
    let waves = plan
        .waves
        .iter()
        .map(|wave| PlannedWave {
            nodes: wave.handovers.iter().map(|h| h.node.to_string()).collect(),
            workloads: wave
                .moves
                .iter()
                .filter_map(|m| {
                    let w = &m.workload;
                    if MOVED_KINDS.contains(&w.kind) {
                        Some(WorkloadRef {
                            namespace: w.namespace.to_string(),
                            kind: w.kind.to_string(),
                            name: w.name.to_string(),
                        })
                    } else {
                        left.push(format!(
                            "{w} (wave {}): move it with its own tooling",
                            wave.number
                        ));
                        None
                    }
                })
                .collect(),
        })
        .collect();
    (waves, left)
}

async fn begin(args: MigrateArgs) -> anyhow::Result<ExitCode> {
    let client = args.kube.client().await?;
    // The backend the services run on, as the stack-assigner recorded it
    // in the log (none recorded: deckhouse).
    let backend = crate::rollback::log_prefix(&args.operator)
        .await?
        .iter()
        .rev()
        .find_map(|(_, e)| match &e.kind {
            Some(Kind::BackendConfigured(b)) => {
                Some(switchyard_core::backend::Backend::from_event(b))
            }
            _ => None,
        })
        .unwrap_or_default();
    let snapshot = crate::plan::snapshot(&client, &backend).await?;
    let (Some(from), Some(to)) = (args.from.clone(), args.to.clone()) else {
        anyhow::bail!("--from and --to: both groups must be given");
    };
    let request = PlanRequest {
        from,
        to,
        class: args.class.clone(),
        max_unavailable: args.max_unavailable as usize,
        layout: args.layout,
        namespace: args.namespaces.only().map(str::to_string),
        backend,
    };
    let plan = plan::plan(&snapshot, &request)?;
    let (waves, left) = waves(&plan);
    for line in &left {
        eprintln!("not moved in place: {line}");
    }
    for pending in &plan.remaining {
        eprintln!(
            "stays on {}: {}",
            plan.from,
            serde_json::to_string(pending).unwrap_or_default()
        );
    }
    let id = args
        .id
        .unwrap_or_else(|| format!("migration-{}", uuid::Uuid::new_v4()));
    let started = MigrationStarted {
        migration_id: id.clone(),
        source_group: plan.from.clone(),
        target_group: plan.to.clone(),
        gpu_class: plan.class.clone(),
        max_unavailable: args.max_unavailable,
        pause_after_wave: args.pause_after_wave,
        waves,
        pending_limit_seconds: args.pending_limit.as_secs(),
    };
    let mut operator = args.operator;
    // Everything the migration does carries its id.
    operator.correlation_id.get_or_insert(id);
    operator
        .run(
            ServiceName::ClaimAllocator,
            service_command::Command::Migrate(started),
        )
        .await
}

async fn control(args: ControlArgs, action: Action) -> anyhow::Result<ExitCode> {
    let command = service_command::Command::ControlMigration(MigrationControlCommand {
        migration_id: args.id.clone(),
        action: action as i32,
        reason: args.reason.clone(),
    });
    let mut operator = args.operator;
    operator.correlation_id.get_or_insert(args.id);
    operator.run(ServiceName::ClaimAllocator, command).await
}

/// Aborts the migration, then rolls back what its current wave did: the
/// workloads it moved (newest first), then the nodes it handed over.
async fn abort(args: ControlArgs) -> anyhow::Result<ExitCode> {
    let prefix = crate::rollback::log_prefix(&args.operator).await?;
    let Some(wave) = prefix.iter().rev().find_map(|(_, e)| match &e.kind {
        Some(Kind::WaveStarted(w)) if w.migration_id == args.id => Some(w.clone()),
        _ => None,
    }) else {
        return control(args, Action::Abort).await;
    };
    let done = |pred: &dyn Fn(&DomainEvent) -> bool| prefix.iter().any(|(_, e)| pred(e));
    let moved: Vec<WorkloadRef> = wave
        .workloads
        .iter()
        .filter(|w| {
            let id = wave_move_id(&args.id, wave.wave, w);
            done(&|e| matches!(&e.kind, Some(Kind::WorkloadRewritten(r)) if r.move_id == id))
        })
        .cloned()
        .collect();
    let handed: BTreeSet<String> = wave
        .nodes
        .iter()
        .filter(|n| {
            let id = wave_handover_id(&args.id, wave.wave, n);
            done(&|e| matches!(&e.kind, Some(Kind::HandoverCompleted(h)) if h.handover_id == id))
        })
        .cloned()
        .collect();
    let code = control(
        ControlArgs {
            id: args.id.clone(),
            reason: args.reason.clone(),
            operator: args.operator.clone(),
        },
        Action::Abort,
    )
    .await?;
    if code != ExitCode::SUCCESS {
        return Ok(code);
    }
    let mut failed = false;
    let mut operator = args.operator.clone();
    operator.correlation_id.get_or_insert(args.id.clone());
    for w in moved.iter().rev() {
        let id = format!("rollback-{}", uuid::Uuid::new_v4());
        let planned = plan_workload_rollback(&prefix, w, &id);
        let code = crate::rollback::send(&operator, ServiceName::ClaimAllocator, planned).await?;
        failed |= code != ExitCode::SUCCESS;
    }
    for node in &handed {
        let id = format!("rollback-{}", uuid::Uuid::new_v4());
        let planned = plan_node_rollback(&prefix, node, &id);
        let code = crate::rollback::send(&operator, ServiceName::StackAssigner, planned).await?;
        failed |= code != ExitCode::SUCCESS;
    }
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

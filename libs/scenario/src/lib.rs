//! The reference migration, end to end, deterministically: the six services of
//! Switchyard (in process or as ractor actors, see `switchyard-runtime`)
//! against the simulated cluster, every fact and decision recorded in order as
//! the migration log.
//!
//! [`Migration`] is the engine: it hands the simulator's facts to the services,
//! records what they decide, executes their effects on the simulator, and moves
//! the simulated clock on when nothing else happens. [`run_reference`] is the
//! scenario of the reference document: Step 1 (a `gpu-dra` group, DRA on),
//! Step 2 (a GPU class), Steps 3–4 node by node and application by application,
//! Step 5 verification, completion, the upgrade hold released, then a rollback
//! of one node and one application — checking the invariants as it goes.

#![forbid(unsafe_code)]

mod nvidia;
pub use nvidia::{nvidia_backend, nvidia_cores, run_nvidia_guide};

use std::collections::BTreeMap;

use switchyard_core::alerter::Alerter;
use switchyard_core::claim_allocator::ClaimAllocator;
use switchyard_core::class_compiler::ClassCompiler;
use switchyard_core::cluster::workload_key;
use switchyard_core::command::Complete;
use switchyard_core::command::MoveApplication;
use switchyard_core::command::StartHandover;
use switchyard_core::command::{ControlMigration, MigrationAction};
use switchyard_core::effects::EffectExecutor;
use switchyard_core::names::{ALERT_HELD_ON_DRA, ALERT_LABEL_NODE_GROUP, STACK_DEVICE_PLUGIN};
use switchyard_core::rollback::{RollbackRefused, plan_node_rollback, plan_workload_rollback};
use switchyard_core::stack_assigner::StackAssigner;
use switchyard_proto::v1::{
    DomainEvent, HandoverStarted, MigrationStarted, Stack, WorkloadRef, domain_event::Kind,
};
use switchyard_runtime::{Command, CoreState, Record, ServiceName, Services};
use switchyard_sim::{SimConfig, Simulator};

/// One record of the migration log, as the engine produced it.
#[derive(Clone, Debug, PartialEq)]
pub struct Logged {
    pub seq: u64,
    /// Recorded (simulated) time, Unix nanoseconds.
    pub at: i64,
    /// The service that wrote it.
    pub actor: ServiceName,
    pub event: DomainEvent,
}

impl Logged {
    pub fn type_name(&self) -> &'static str {
        self.event.kind.as_ref().map_or("", |k| k.type_name())
    }

    /// The aggregate the event belongs to, as a log subject.
    pub fn subject(&self) -> String {
        switchyard_core::subjects::subject_of(&self.event)
    }
}

/// The result of one invariant check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    pub name: &'static str,
    pub ok: bool,
    pub detail: String,
}

/// The cores' states, as the services hold them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct States {
    pub stack: StackAssigner,
    /// Application moves and completion.
    pub claims: ClaimAllocator,
    pub alerter: Alerter,
    pub compiler: ClassCompiler,
}

impl States {
    pub fn from_snapshot(snapshot: Vec<CoreState>) -> States {
        let mut states = States::default();
        for state in snapshot {
            match state {
                CoreState::StackAssigner(s) => states.stack = *s,
                CoreState::ClaimAllocator(c) => states.claims = *c,
                CoreState::Alerter(a) => states.alerter = *a,
                CoreState::ClassCompiler(c) => states.compiler = *c,
                CoreState::Observer(_) => {}
            }
        }
        states
    }

    /// Folds one event of the log into every core.
    pub fn fold(&mut self, event: &DomainEvent, at: i64) {
        self.stack.apply(event, at);
        self.claims.apply(event, at);
        self.alerter.apply(event, at);
        self.compiler.apply(event, at);
    }

    /// What the log decides: the state without the configuration the
    /// services were started with (their flags, which a replay does not
    /// have; what they configured is in the log).
    pub fn decided(mut self) -> States {
        self.stack = self.stack.decided();
        self
    }

    /// Folds a log into fresh cores: what a restarted system would know.
    pub fn replay<'a>(events: impl IntoIterator<Item = (&'a DomainEvent, i64)>) -> States {
        let mut states = States::default();
        for (event, at) in events {
            states.fold(event, at);
        }
        states
    }
}

/// Why a step of the migration did not get where it goes.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StepFailed {
    /// The service that owns the command refused it, with its reason.
    #[error("{0}")]
    Refused(String),
    /// The log does not allow the rollback.
    #[error(transparent)]
    Rollback(#[from] RollbackRefused),
    /// The cluster settled elsewhere: what it shows instead.
    #[error("{0}")]
    NotReached(String),
}

/// Where the engine appends the migration log as it goes.
#[allow(async_fn_in_trait)]
pub trait LogSink {
    type Error: std::error::Error;
    async fn append(&mut self, records: &[Logged]) -> Result<(), Self::Error>;
}

/// Keeps the log in memory only (`Migration::log`).
impl LogSink for () {
    type Error = std::convert::Infallible;
    async fn append(&mut self, _records: &[Logged]) -> Result<(), Self::Error> {
        Ok(())
    }
}

/// The engine: services, simulator, log.
pub struct Migration<S: Services, L: LogSink = ()> {
    pub sim: Simulator,
    pub services: S,
    pub sink: L,
    pub log: Vec<Logged>,
    /// Violations seen while running, by invariant.
    pub violations: BTreeMap<&'static str, Vec<String>>,
    commands: u64,
    /// How much of `log` the sink has.
    flushed: usize,
}

/// Most pump rounds before the engine gives up on quiescence.
const MAX_ROUNDS: usize = 100_000;

impl<S: Services, L: LogSink> Migration<S, L> {
    pub async fn new(config: SimConfig, services: S, sink: L) -> Self {
        Migration::on(Simulator::new(config), services, sink).await
    }

    /// The engine over a simulator made already (another platform's).
    pub async fn on(sim: Simulator, services: S, sink: L) -> Self {
        let mut migration = Migration {
            sim,
            services,
            sink,
            log: Vec::new(),
            violations: BTreeMap::new(),
            commands: 0,
            flushed: 0,
        };
        migration.pump().await;
        migration
    }

    /// Hands what was recorded since the last flush to the sink.
    async fn flush(&mut self) {
        if self.flushed == self.log.len() {
            return;
        }
        let result = self.sink.append(&self.log[self.flushed..]).await;
        self.flushed = self.log.len();
        if let Err(err) = result {
            self.violation("log-append", err.to_string());
        }
    }

    fn record(&mut self, records: Vec<Record>) -> Vec<DomainEvent> {
        let now = self.sim.now();
        records
            .into_iter()
            .map(|r| {
                self.log.push(Logged {
                    seq: self.log.len() as u64 + 1,
                    at: now,
                    actor: r.actor,
                    event: r.event.clone(),
                });
                r.event
            })
            .collect()
    }

    fn next_id(&mut self, prefix: &str) -> String {
        self.commands += 1;
        format!("{prefix}-{}", self.commands)
    }

    /// The services' current states.
    pub async fn states(&mut self) -> States {
        States::from_snapshot(self.services.snapshot().await)
    }

    /// Feeds facts, executes effects and moves the clock until nothing is left to happen.
    pub async fn pump(&mut self) {
        for _ in 0..MAX_ROUNDS {
            let facts = self.sim.take_facts();
            if !facts.is_empty() {
                let now = self.sim.now();
                for fact in facts {
                    let records = self.services.observe(fact, now).await;
                    self.record(records);
                }
                self.check_running().await;
                continue;
            }
            let effects = self.services.effects().await;
            // The simulator carries every effect out: its error type is Infallible.
            let _: Vec<Result<_, std::convert::Infallible>> =
                EffectExecutor::execute(&mut self.sim, effects).await;
            if self.sim.has_facts() {
                continue;
            }
            match self.sim.next_timer() {
                Some(at) => {
                    self.sim.advance_to(at);
                    let records = self.services.tick(self.sim.now()).await;
                    self.record(records);
                }
                None => {
                    self.flush().await;
                    return;
                }
            }
            self.flush().await;
        }
        self.violation("quiescence", "the cluster never settled".into());
        self.flush().await;
    }

    fn violation(&mut self, invariant: &'static str, detail: String) {
        let list = self.violations.entry(invariant).or_default();
        if list.len() < 10 {
            list.push(detail);
        }
    }

    /// Invariants that must hold after every round of facts.
    async fn check_running(&mut self) {
        // 1. Never a GPU advertised by both allocators.
        for node in self.sim.nodes_with_both_stacks() {
            self.violation(
                "one-stack-per-node",
                format!("node {node} runs the device plugin and the DRA adapter"),
            );
        }
        // 2. Every node's stack as the rules say, per the services themselves.
        for (invariant, detail) in self.services.violations().await {
            let invariant = if invariant == "stack-rules" {
                "stack-rules"
            } else {
                "service"
            };
            self.violation(invariant, detail);
        }
    }

    /// Sends a command and lets the cluster settle; a refusal is the error.
    async fn run_command(&mut self, command: Command) -> Result<(), StepFailed> {
        let records = self.services.command(command, self.sim.now()).await;
        let decisions = self.record(records);
        match decisions.first().and_then(|d| d.kind.as_ref()) {
            Some(Kind::HandoverRefused(r)) => return Err(StepFailed::Refused(r.reason.clone())),
            Some(Kind::ApplicationMoveRefused(r)) => {
                return Err(StepFailed::Refused(r.reason.clone()));
            }
            _ => {}
        }
        self.pump().await;
        Ok(())
    }

    fn logged_since(&self, start: usize) -> impl Iterator<Item = &DomainEvent> {
        self.log[start..].iter().map(|l| &l.event)
    }

    /// `kubectl apply` of GPU class `class`; Ok once the class-compiler
    /// published its DeviceClasses.
    pub async fn create_class(&mut self, class: &str) -> Result<String, StepFailed> {
        self.sim.create_gpu_class(class);
        self.pump().await;
        let compiled = self
            .states()
            .await
            .claims
            .cluster()
            .gpu_classes
            .get(class)
            .cloned()
            .unwrap_or_default();
        if compiled.is_empty() {
            Err(StepFailed::NotReached(
                "the class has no DeviceClass".into(),
            ))
        } else {
            Ok(format!(
                "DeviceClass {}, requested as {}{class}",
                compiled.join(", "),
                switchyard_core::names::CLASS_RESOURCE_PREFIX
            ))
        }
    }

    /// Hands `node` over to `group`; Ok once the handover completed.
    pub async fn hand_over(&mut self, node: &str, group: &str) -> Result<String, StepFailed> {
        let id = self.next_id(&format!("handover-{node}"));
        let start = self.log.len();
        let cmd = StartHandover {
            handover_id: id.clone(),
            node: node.into(),
            target_group: group.into(),
            force: false,
        };
        self.run_command(Command::StartHandover(cmd)).await?;
        self.handover_outcome(start, &id, node)
    }

    fn handover_outcome(&self, start: usize, id: &str, node: &str) -> Result<String, StepFailed> {
        let mut stalled = None;
        for event in self.logged_since(start) {
            match &event.kind {
                Some(Kind::HandoverCompleted(c)) if c.handover_id == id => {
                    return Ok(id.to_string());
                }
                Some(Kind::HandoverStalled(s)) if s.handover_id == id => {
                    stalled = Some(s.reason.clone())
                }
                _ => {}
            }
        }
        Err(StepFailed::NotReached(stalled.unwrap_or_else(|| {
            format!("handover {id} of {node} did not complete")
        })))
    }

    /// Moves a workload to `group` with `class`; Ok once verified.
    pub async fn move_application(
        &mut self,
        workload: &WorkloadRef,
        group: &str,
        class: &str,
    ) -> Result<String, StepFailed> {
        let id = self.next_id(&format!("move-{}", workload.name));
        let start = self.log.len();
        let cmd = MoveApplication {
            allow_managed: false,
            move_id: id.clone(),
            workload: workload.clone(),
            target_group: group.into(),
            gpu_class: class.into(),
        };
        self.run_command(Command::MoveApplication(cmd)).await?;
        let verified = self
            .logged_since(start)
            .any(|e| matches!(&e.kind, Some(Kind::ApplicationMoveVerified(v)) if v.move_id == id));
        if verified {
            Ok(id)
        } else {
            Err(StepFailed::NotReached(format!(
                "{} is not verified: {} pods pending",
                workload.name,
                self.sim.pending_pods()
            )))
        }
    }

    /// Starts a migration in waves and lets it run; Ok once it completed, else
    /// where it stopped (the pause's reason).
    pub async fn migrate(&mut self, plan: MigrationStarted) -> Result<String, StepFailed> {
        let id = plan.migration_id.clone();
        let start = self.log.len();
        let records = self
            .services
            .command(Command::Migrate(plan), self.sim.now())
            .await;
        let decisions = self.record(records);
        if let Some(Kind::MigrationRefused(r)) = decisions.first().and_then(|d| d.kind.as_ref()) {
            return Err(StepFailed::Refused(r.reason.clone()));
        }
        self.pump().await;
        self.migration_outcome(start, &id)
    }

    /// Pauses, resumes or aborts a migration and lets the cluster settle; Ok
    /// once it completed, else where it stands.
    pub async fn control_migration(
        &mut self,
        migration_id: &str,
        action: MigrationAction,
    ) -> Result<String, StepFailed> {
        let start = self.log.len();
        let cmd = ControlMigration {
            migration_id: migration_id.into(),
            action,
            reason: String::new(),
        };
        self.run_command(Command::ControlMigration(cmd)).await?;
        if let Some(Kind::MigrationRefused(r)) = self
            .logged_since(start)
            .next()
            .and_then(|d| d.kind.as_ref())
        {
            return Err(StepFailed::Refused(r.reason.clone()));
        }
        self.migration_outcome(start, migration_id)
    }

    /// Lets `nanos` of time pass (the services tick), then settles.
    pub async fn wait(&mut self, nanos: i64) {
        let at = self.sim.now() + nanos;
        self.sim.advance_to(at);
        let records = self.services.tick(self.sim.now()).await;
        self.record(records);
        self.pump().await;
    }

    fn migration_outcome(&self, start: usize, id: &str) -> Result<String, StepFailed> {
        let mut outcome = Err(StepFailed::NotReached(format!(
            "migration {id} did not complete"
        )));
        for event in self.logged_since(start) {
            match &event.kind {
                Some(Kind::MigrationCompleted(c)) if c.migration_id == id => {
                    outcome = Ok(format!("{} wave(s)", c.waves));
                }
                Some(Kind::MigrationPaused(p)) if p.migration_id == id => {
                    outcome = Err(StepFailed::NotReached(format!(
                        "paused in wave {}: {}",
                        p.wave + 1,
                        p.reason
                    )));
                }
                Some(Kind::MigrationResumed(r)) if r.migration_id == id => {
                    outcome = Err(StepFailed::NotReached(format!(
                        "migration {id} did not complete"
                    )));
                }
                Some(Kind::MigrationAborted(a)) if a.migration_id == id => {
                    outcome = Err(StepFailed::NotReached(format!(
                        "aborted in wave {}",
                        a.wave + 1
                    )));
                }
                _ => {}
            }
        }
        outcome
    }

    /// Runs the completion steps; returns the refusal reasons, if any.
    pub async fn complete(
        &mut self,
        source_group: &str,
        class: &str,
        trial_period_over: bool,
    ) -> Vec<String> {
        let cmd = Complete {
            source_group: source_group.into(),
            gpu_class: class.into(),
            trial_period_over,
        };
        let records = self
            .services
            .command(Command::Complete(cmd), self.sim.now())
            .await;
        let decisions = self.record(records);
        self.pump().await;
        decisions
            .iter()
            .filter_map(|d| match &d.kind {
                Some(Kind::CompletionRefused(r)) => Some(r.reason.clone()),
                _ => None,
            })
            .collect()
    }

    /// The log as (sequence, event), the input of the rollback planner.
    pub fn log_prefix(&self) -> Vec<(u64, DomainEvent)> {
        self.log.iter().map(|l| (l.seq, l.event.clone())).collect()
    }

    fn completed(&self, rollback_id: &str) -> bool {
        self.log.iter().any(|l| matches!(&l.event.kind, Some(Kind::RollbackCompleted(r)) if r.rollback_id == rollback_id))
    }

    /// Rolls the last handover of `node` back; checks the node is exactly as before.
    pub async fn roll_back_node(&mut self, node: &str) -> Result<String, StepFailed> {
        let id = self.next_id(&format!("rollback-{node}"));
        let planned = plan_node_rollback(&self.log_prefix(), node, &id)?;
        let restore: Option<HandoverStarted> = match &planned.kind {
            Some(Kind::RollbackStarted(r)) => r.node_restore.as_deref().cloned(),
            _ => None,
        };
        self.run_command(Command::Rollback(planned)).await?;
        if !self.completed(&id) {
            return Err(StepFailed::NotReached(format!(
                "rollback {id} of {node} did not complete"
            )));
        }
        if let Some(before) = restore {
            let labels = self.sim.node_labels(node).cloned().unwrap_or_default();
            let taints = self
                .sim
                .node_taints(node)
                .map(<[_]>::to_vec)
                .unwrap_or_default();
            if labels != before.labels_before || taints != before.taints_before {
                self.violation(
                    "rollback-restores-exactly",
                    format!(
                        "node {node}: labels {labels:?} taints {taints:?}, before {:?} {:?}",
                        before.labels_before, before.taints_before
                    ),
                );
            }
        }
        Ok(id)
    }

    /// Rolls the last move of `workload` back; checks the manifest is exactly as before.
    pub async fn roll_back_application(
        &mut self,
        workload: &WorkloadRef,
    ) -> Result<String, StepFailed> {
        let id = self.next_id(&format!("rollback-{}", workload.name));
        let planned = plan_workload_rollback(&self.log_prefix(), workload, &id)?;
        let original = match &planned.kind {
            Some(Kind::RollbackStarted(r)) => {
                r.workload_restore.as_ref().and_then(|w| w.after.clone())
            }
            _ => None,
        };
        self.run_command(Command::Rollback(planned)).await?;
        if !self.completed(&id) {
            return Err(StepFailed::NotReached(format!(
                "rollback of {} did not complete: {} pods pending",
                workload.name,
                self.sim.pending_pods()
            )));
        }
        if self.sim.workload_placement(workload) != original.as_ref() {
            self.violation(
                "rollback-restores-exactly",
                format!("{}: manifest differs from before the move", workload.name),
            );
        }
        Ok(id)
    }

    /// Checks that need the whole run: replay, alerts, no pod left waiting.
    pub async fn final_checks(&mut self) -> Vec<Check> {
        self.flush().await;
        let mut checks: Vec<Check> = [
            "one-stack-per-node",
            "stack-rules",
            "rollback-restores-exactly",
            "quiescence",
            "service",
            "log-append",
        ]
        .iter()
        .map(|name| {
            let found = self.violations.get(name);
            Check {
                name,
                ok: found.is_none(),
                detail: found.map(|v| v.join("; ")).unwrap_or_default(),
            }
        })
        .collect();

        // Replay: folding the log into fresh cores gives the services' state.
        let live = self.states().await;
        let replayed = States::replay(self.log.iter().map(|l| (&l.event, l.at)));
        let same = replayed == live.clone().decided();
        checks.push(Check {
            name: "replay-same-state",
            ok: same,
            detail: if same {
                format!("{} events folded", self.log.len())
            } else {
                "replayed state differs".into()
            },
        });

        // D8GpuNodeGroupHeldOnDra fires exactly for the held groups.
        let firing: Vec<String> = live
            .alerter
            .firing()
            .keys()
            .filter(|(name, _)| name == ALERT_HELD_ON_DRA)
            .filter_map(|(_, labels)| labels.get(ALERT_LABEL_NODE_GROUP).cloned())
            .collect();
        let held: Vec<String> = live.stack.held().iter().cloned().collect();
        checks.push(Check {
            name: "held-groups-alert",
            ok: firing == held,
            detail: format!("held: {held:?}, firing for: {firing:?}"),
        });

        let pending = self.sim.pending_pods();
        checks.push(Check {
            name: "no-pod-left-pending",
            ok: pending == 0,
            detail: format!("{pending} pending pods"),
        });
        checks
    }
}

/// What happened in one step of the scenario.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepReport {
    pub step: String,
    pub ok: bool,
    pub detail: String,
    /// Simulated time when the step ended.
    pub at: i64,
}

/// The outcome of the reference scenario.
pub struct Outcome<S: Services, L: LogSink = ()> {
    pub migration: Migration<S, L>,
    pub steps: Vec<StepReport>,
    pub checks: Vec<Check>,
    /// The services' states at the end.
    pub states: States,
}

impl<S: Services, L: LogSink> Outcome<S, L> {
    pub fn ok(&self) -> bool {
        self.steps.iter().all(|s| s.ok) && self.checks.iter().all(|c| c.ok)
    }
}

/// The steps reported so far; `progress` hears about each as it ends.
struct Steps<P: FnMut(&StepReport)> {
    reports: Vec<StepReport>,
    progress: P,
}

impl<P: FnMut(&StepReport)> Steps<P> {
    /// No step reported yet.
    fn new(progress: P) -> Self {
        Steps {
            reports: Vec::new(),
            progress,
        }
    }

    /// The run's outcome: the steps reported, then the migration's final
    /// checks and the cores' states.
    async fn outcome<S: Services, L: LogSink>(self, mut m: Migration<S, L>) -> Outcome<S, L> {
        let checks = m.final_checks().await;
        let states = m.states().await;
        Outcome {
            migration: m,
            steps: self.reports,
            checks,
            states,
        }
    }

    /// Reports one step's result at the simulator's time.
    fn report(&mut self, sim: &Simulator, step: &str, result: Result<String, StepFailed>) {
        let (ok, detail) = match result {
            Ok(detail) => (true, detail),
            Err(failed) => (false, failed.to_string()),
        };
        let report = StepReport {
            step: step.to_string(),
            ok,
            detail,
            at: sim.now(),
        };
        (self.progress)(&report);
        self.reports.push(report);
    }
}

/// The reference's source group.
const SOURCE: &str = "gpu";
/// The reference's target group.
const TARGET: &str = "gpu-dra";

/// Runs the reference scenario; `progress` hears about every step as it ends.
pub async fn run_reference<S: Services, L: LogSink>(
    config: SimConfig,
    services: S,
    sink: L,
    progress: impl FnMut(&StepReport),
) -> Outcome<S, L> {
    let class = config.card.class.clone();
    let class = class.as_str();
    let mut m = Migration::new(config, services, sink).await;
    let mut steps = Steps::new(progress);

    reference_enable_dra(&mut m, &mut steps).await;
    // Step 2: a GPU class; the class-compiler publishes its DeviceClass.
    let result = m.create_class(class).await;
    steps.report(&m.sim, &format!("step 2: create GPU class {class}"), result);
    let handed_over = reference_hand_over_and_move(&mut m, &mut steps, class).await;
    reference_verify(&mut m, &mut steps).await;
    reference_complete(&mut m, &mut steps, class).await;
    reference_release_holds(&mut m, &mut steps).await;
    reference_roll_back(&mut m, &mut steps, &handed_over).await;

    steps.outcome(m).await
}

/// Step 1 phase: the target group created and DRA enabled.
async fn reference_enable_dra<S: Services, L: LogSink>(
    m: &mut Migration<S, L>,
    steps: &mut Steps<impl FnMut(&StepReport)>,
) {
    // Step 1: the target group, then DRA on (a cluster upgraded with DRA on has
    // it already, and the groups it served are held on DRA since the first run).
    m.sim.set_group(TARGET, None);
    if !m.states().await.stack.cluster().module.dra_enabled {
        m.sim.set_dra_enabled(true);
    }
    m.pump().await;
    let states = m.states().await;
    let held: Vec<String> = states.stack.held().iter().cloned().collect();
    steps.report(
        &m.sim,
        "step 1: create gpu-dra and enable DRA",
        Ok(if held.is_empty() {
            "no group held".into()
        } else {
            format!(
                "held on DRA since the upgrade, D8GpuNodeGroupHeldOnDra firing: {}",
                held.join(", ")
            )
        }),
    );
}

/// Steps 3 and 4 phase: nodes handed over, workloads moved; returns the nodes handed over.
async fn reference_hand_over_and_move<S: Services, L: LogSink>(
    m: &mut Migration<S, L>,
    steps: &mut Steps<impl FnMut(&StepReport)>,
    class: &str,
) -> Vec<String> {
    // Steps 3 and 4, repeated: hand over a node, then move what fits on DRA.
    let mut waiting: Vec<WorkloadRef> = m.sim.workloads();
    let mut handed_over = Vec::new();
    loop {
        // Move what fits now; the rest waits for the next node.
        while let Some(i) = waiting
            .iter()
            .position(|w| m.sim.fits_on_class(w, TARGET, class))
        {
            let workload = waiting.remove(i);
            let result = m.move_application(&workload, TARGET, class).await;
            steps.report(&m.sim, &format!("step 4: move {}", workload.name), result);
        }
        let Some(node) = m.sim.nodes_in(SOURCE).first().cloned() else {
            break;
        };
        let result = m.hand_over(&node, TARGET).await;
        let failed = result.is_err();
        steps.report(&m.sim, &format!("step 3: hand over {node}"), result);
        if failed {
            break;
        }
        handed_over.push(node);
    }
    for workload in &waiting {
        steps.report(
            &m.sim,
            &format!("step 4: move {}", workload.name),
            Err(StepFailed::NotReached("no room on DRA nodes".into())),
        );
    }
    handed_over
}

/// Step 5: every application verified on the target group.
async fn reference_verify<S: Services, L: LogSink>(
    m: &mut Migration<S, L>,
    steps: &mut Steps<impl FnMut(&StepReport)>,
) {
    let states = m.states().await;
    let verified = states.claims.moves().verified.len();
    let total = m.sim.workloads().len();
    let pending = m.sim.pending_pods();
    steps.report(
        &m.sim,
        "step 5: verify",
        if verified == total && pending == 0 {
            Ok(format!(
                "{verified}/{total} applications on {TARGET} with claims allocated"
            ))
        } else {
            Err(StepFailed::NotReached(format!(
                "{verified}/{total} applications verified, {pending} pods pending"
            )))
        },
    );
}

/// Completion; the source group stays for the trial period.
async fn reference_complete<S: Services, L: LogSink>(
    m: &mut Migration<S, L>,
    steps: &mut Steps<impl FnMut(&StepReport)>,
    class: &str,
) {
    let refusals = m.complete(SOURCE, class, false).await;
    let quota = m.sim.quota("ml", "gpu-quota").cloned().unwrap_or_default();
    let translated = !quota.contains_key("requests.nvidia.com/gpu")
        && quota.contains_key(&format!("requests.gpu.deckhouse.io/{class}"));
    steps.report(
        &m.sim,
        "completion: quotas and leftover labels",
        if translated {
            Ok(refusals.join("; "))
        } else {
            Err(StepFailed::NotReached(format!(
                "quota not translated: {quota:?}"
            )))
        },
    );
}

/// Hold phase: spec.gpu removed from each group held on DRA.
async fn reference_release_holds<S: Services, L: LogSink>(
    m: &mut Migration<S, L>,
    steps: &mut Steps<impl FnMut(&StepReport)>,
) {
    // The upgrade hold ends the way the reference says: spec.gpu removed, the
    // group stays on DRA and the alert clears.
    for group in m.states().await.stack.held().clone() {
        m.sim.set_group(&group, None);
        m.pump().await;
        let states = m.states().await;
        let nodes = m.sim.nodes_in(&group);
        let on_dra = nodes
            .iter()
            .all(|n| states.stack.stack_of(n) == Some(Stack::Dra));
        let released = !states.stack.held().contains(&group);
        let cleared = states.alerter.firing().is_empty();
        steps.report(
            &m.sim,
            &format!("hold: remove spec.gpu from {group}"),
            if on_dra && released && cleared {
                Ok(format!(
                    "released; {} stays on DRA, alert cleared",
                    nodes.join(", ")
                ))
            } else {
                Err(StepFailed::NotReached(format!(
                    "released: {released}, nodes on DRA: {on_dra}, alert cleared: {cleared}"
                )))
            },
        );
    }
}

/// Rollback phase: nodes back to the device plugin, then the smallest moved workload.
async fn reference_roll_back<S: Services, L: LogSink>(
    m: &mut Migration<S, L>,
    steps: &mut Steps<impl FnMut(&StepReport)>,
    handed_over: &[String],
) {
    // Rollback: a node back to the device plugin — as many as the smallest moved
    // application needs, since a rollback needs Device Plugin nodes — then that
    // application onto it.
    let verified = m.states().await.claims.moves().verified.clone();
    let smallest = m
        .sim
        .workloads()
        .into_iter()
        .filter(|w| verified.contains_key(&workload_key(w)))
        .min_by_key(|w| (m.sim.workload_gpus(w), w.name.clone()));
    let mut rolled_back_ok = true;
    for node in handed_over.iter().rev() {
        let result = m.roll_back_node(node).await;
        rolled_back_ok &= result.is_ok();
        steps.report(&m.sim, &format!("rollback: node {node}"), result);
        let need = smallest.as_ref().map_or(0, |w| m.sim.workload_gpus(w));
        if !rolled_back_ok || m.sim.free_gpus_on(STACK_DEVICE_PLUGIN) >= need {
            break;
        }
    }
    if let Some(workload) = smallest.filter(|_| rolled_back_ok) {
        let result = m.roll_back_application(&workload).await;
        steps.report(
            &m.sim,
            &format!("rollback: application {}", workload.name),
            result,
        );
    }
}

//! The reference migration, end to end, deterministically: the cores of
//! Switchyard (stack-assigner with node handovers, claim-allocator with
//! application moves, completion, rollback planning) against the simulated
//! cluster, every fact and decision recorded in order as the migration log.
//!
//! [`Migration`] is the engine: it feeds the simulator's facts to the cores,
//! records their decisions, executes their effects on the simulator, and moves
//! the simulated clock on when nothing else happens. [`run_reference`] is the
//! scenario of the reference document: Step 1 (a `gpu-dra` group, DRA on),
//! Step 2 (a GPU class), Steps 3–4 node by node and application by application,
//! Step 5 verification, completion, then a rollback of one node and one
//! application — checking the invariants as it goes.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;

use switchyard_core::app_move::{self, ClaimAllocator, MoveApplication};
use switchyard_core::cluster::{Cluster, workload_key};
use switchyard_core::completion::{Complete, Completion};
use switchyard_core::handover::StartHandover;
use switchyard_core::names::{ALERT_LABEL_NODE_GROUP, STACK_DEVICE_PLUGIN, STACK_DRA};
use switchyard_core::rollback::{plan_node_rollback, plan_workload_rollback};
use switchyard_core::stack::{self, Input, StackAssigner};
use switchyard_proto::v1::{DomainEvent, HandoverStarted, Stack, WorkloadRef, domain_event::Kind};
use switchyard_sim::{SimConfig, Simulator};

/// One record of the migration log, as the engine produced it.
#[derive(Clone, Debug, PartialEq)]
pub struct Logged {
    pub seq: u64,
    /// Recorded (simulated) time, Unix nanoseconds.
    pub at: i64,
    /// The service that wrote it.
    pub actor: &'static str,
    pub event: DomainEvent,
}

impl Logged {
    pub fn type_name(&self) -> &'static str {
        self.event.kind.as_ref().map_or("", |k| k.type_name())
    }

    /// The aggregate the event belongs to, as a log subject.
    pub fn subject(&self) -> String {
        subject_of(&self.event)
    }
}

/// The aggregate (log subject) of an event: `node.<name>`, `group.<name>`,
/// `workload.<ns>.<name>`, `cluster.<kind>` for cluster-wide facts.
pub fn subject_of(event: &DomainEvent) -> String {
    let token = |s: &str| {
        s.replace(
            |c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'),
            "_",
        )
    };
    let workload = |w: &Option<WorkloadRef>| {
        w.as_ref().map_or("workload.unknown".into(), |w| {
            format!("workload.{}.{}", token(&w.namespace), token(&w.name))
        })
    };
    let Some(kind) = &event.kind else {
        return "cluster.unknown".into();
    };
    match kind {
        Kind::NodeObserved(e) => format!("node.{}", token(&e.node)),
        Kind::NodeRemoved(e) => format!("node.{}", token(&e.node)),
        Kind::StackAssigned(e) => format!("node.{}", token(&e.node)),
        Kind::HandoverStarted(e) => format!("node.{}", token(&e.node)),
        Kind::HandoverRefused(e) => format!("node.{}", token(&e.node)),
        Kind::NodeCordoned(e) => format!("node.{}", token(&e.node)),
        Kind::NodeDrained(e) => format!("node.{}", token(&e.node)),
        Kind::NodeGroupChanged(e) => format!("node.{}", token(&e.node)),
        Kind::NodeReadinessObserved(e) => format!("node.{}", token(&e.node)),
        Kind::NodeUncordoned(e) => format!("node.{}", token(&e.node)),
        Kind::HandoverCompleted(e) => format!("node.{}", token(&e.node)),
        Kind::HandoverStalled(e) => format!("node.{}", token(&e.node)),
        Kind::LeftoverLabelsCleared(e) => format!("node.{}", token(&e.node)),
        Kind::NodeGroupObserved(e) => format!("group.{}", token(&e.group)),
        Kind::NodeGroupRemoved(e) => format!("group.{}", token(&e.group)),
        Kind::NodeGroupHeldOnDra(e) => format!("group.{}", token(&e.group)),
        Kind::NodeGroupReleased(e) => format!("group.{}", token(&e.group)),
        Kind::SourceGroupRetired(e) => format!("group.{}", token(&e.group)),
        Kind::CompletionRefused(e) => format!("group.{}", token(&e.source_group)),
        Kind::WorkloadObserved(e) => workload(&e.workload),
        Kind::ApplicationMoveStarted(e) => workload(&e.workload),
        Kind::ApplicationMoveRefused(e) => workload(&e.workload),
        Kind::WorkloadRewritten(e) => workload(&e.workload),
        Kind::WorkloadRestarted(e) => workload(&e.workload),
        Kind::ApplicationMoveVerified(e) => workload(&e.workload),
        Kind::PodObserved(e) => format!("pod.{}.{}", token(&e.namespace), token(&e.name)),
        Kind::PodRemoved(e) => format!("pod.{}.{}", token(&e.namespace), token(&e.name)),
        Kind::PhysicalGpuObserved(e) => format!("gpu.{}", token(&e.name)),
        Kind::PhysicalGpuRemoved(e) => format!("gpu.{}", token(&e.name)),
        Kind::GpuClassObserved(e) => format!("gpuclass.{}", token(&e.name)),
        Kind::ResourceQuotaObserved(e) => {
            format!("quota.{}.{}", token(&e.namespace), token(&e.name))
        }
        Kind::ResourceQuotaTranslated(e) => {
            format!("quota.{}.{}", token(&e.namespace), token(&e.name))
        }
        Kind::ModuleSettingsObserved(_) => "cluster.module".into(),
        Kind::RollbackStarted(e) => format!("rollback.{}", token(&e.rollback_id)),
        Kind::StepCompensated(e) => format!("rollback.{}", token(&e.rollback_id)),
        Kind::RollbackCompleted(e) => format!("rollback.{}", token(&e.rollback_id)),
        Kind::AlertRaised(e) => alert(&e.alert_name, &e.labels),
        Kind::AlertCleared(e) => alert(&e.alert_name, &e.labels),
    }
}

fn alert(name: &str, labels: &BTreeMap<String, String>) -> String {
    let token = |s: &str| {
        s.replace(
            |c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'),
            "_",
        )
    };
    match labels.get(ALERT_LABEL_NODE_GROUP) {
        Some(group) => format!("alert.{}.{}", token(name), token(group)),
        None => format!("alert.{}", token(name)),
    }
}

/// The result of one invariant check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Check {
    pub name: &'static str,
    pub ok: bool,
    pub detail: String,
}

/// The engine: cores, simulator, log.
pub struct Migration {
    pub sim: Simulator,
    pub stack: StackAssigner,
    pub claims: ClaimAllocator,
    pub completion: Completion,
    /// Completion's view of the cluster (it folds facts like every core).
    pub completion_cluster: Cluster,
    pub log: Vec<Logged>,
    /// Violations seen while running, by invariant.
    pub violations: BTreeMap<&'static str, Vec<String>>,
    commands: u64,
}

/// Most pump rounds before the engine gives up on quiescence.
const MAX_ROUNDS: usize = 100_000;

impl Migration {
    pub fn new(config: SimConfig) -> Self {
        let mut migration = Migration {
            sim: Simulator::new(config),
            stack: StackAssigner::default(),
            claims: ClaimAllocator::default(),
            completion: Completion::default(),
            completion_cluster: Cluster::default(),
            log: Vec::new(),
            violations: BTreeMap::new(),
            commands: 0,
        };
        migration.pump();
        migration
    }

    fn record(&mut self, actor: &'static str, events: Vec<DomainEvent>) -> Vec<DomainEvent> {
        for event in &events {
            self.log.push(Logged {
                seq: self.log.len() as u64 + 1,
                at: self.sim.now(),
                actor,
                event: event.clone(),
            });
        }
        events
    }

    fn next_id(&mut self, prefix: &str) -> String {
        self.commands += 1;
        format!("{prefix}-{}", self.commands)
    }

    /// Feeds facts, executes effects and moves the clock until nothing is left to happen.
    pub fn pump(&mut self) {
        for _ in 0..MAX_ROUNDS {
            let facts = self.sim.take_facts();
            if !facts.is_empty() {
                let now = self.sim.now();
                for fact in facts {
                    self.record("inventory", vec![fact.clone()]);
                    let decisions = self.stack.handle_fact(&fact, now);
                    self.record("stack-assigner", decisions);
                    let decisions = self.claims.handle(app_move::Input::Fact(&fact));
                    self.record("claim-allocator", decisions);
                    self.completion_cluster.apply(&fact);
                }
                self.check_running();
                continue;
            }
            let mut effects = self.stack.effects();
            effects.extend(self.claims.moves.effects());
            effects.extend(self.completion.effects(&self.completion_cluster));
            for effect in &effects {
                self.sim.execute(effect);
            }
            if self.sim.has_facts() {
                continue;
            }
            match self.sim.next_timer() {
                Some(at) => {
                    self.sim.advance_to(at);
                    let decisions = self.stack.handle(Input::Tick, self.sim.now());
                    self.record("stack-assigner", decisions);
                }
                None => return,
            }
        }
        self.violation("quiescence", "the cluster never settled".into());
    }

    fn violation(&mut self, invariant: &'static str, detail: String) {
        let list = self.violations.entry(invariant).or_default();
        if list.len() < 10 {
            list.push(detail);
        }
    }

    /// Invariants that must hold after every fact.
    fn check_running(&mut self) {
        // 1. Never a GPU advertised by both allocators.
        for node in self.sim.nodes_with_both_stacks() {
            self.violation(
                "one-stack-per-node",
                format!("node {node} runs the device plugin and the DRA adapter"),
            );
        }
        // 2. Every node's stack as the rules say.
        let mut wrong = Vec::new();
        for (name, node) in &self.stack.cluster.nodes {
            let group = node.group().unwrap_or_default();
            let expected = stack::rule(node, &self.stack.cluster, self.stack.held.contains(group));
            match self.stack.assignments.get(name) {
                Some(a) if (a.stack, a.reason) == expected => {}
                other => wrong.push(format!(
                    "node {name}: decided {other:?}, rules say {expected:?}"
                )),
            }
        }
        for detail in wrong {
            self.violation("stack-rules", detail);
        }
    }

    /// Hands `node` over to `group`; Ok once the handover completed.
    pub fn hand_over(&mut self, node: &str, group: &str) -> Result<String, String> {
        let id = self.next_id(&format!("handover-{node}"));
        let cmd = StartHandover {
            handover_id: id.clone(),
            node: node.into(),
            target_group: group.into(),
        };
        let decisions = self
            .stack
            .handle(Input::StartHandover(&cmd), self.sim.now());
        let decisions = self.record("stack-assigner", decisions);
        if let Some(Kind::HandoverRefused(r)) = decisions.first().and_then(|d| d.kind.as_ref()) {
            return Err(r.reason.clone());
        }
        self.pump();
        if self.stack.handovers.completed.contains_key(&id) {
            Ok(id)
        } else {
            Err(self.handover_trouble(node))
        }
    }

    fn handover_trouble(&self, node: &str) -> String {
        match self.stack.handovers.active.get(node) {
            Some(h) => format!(
                "handover of {node} stopped at step {}",
                h.step.as_str_name()
            ),
            None => format!("handover of {node} did not complete"),
        }
    }

    /// Moves a workload to `group` with `class`; Ok once verified.
    pub fn move_application(
        &mut self,
        workload: &WorkloadRef,
        group: &str,
        class: &str,
    ) -> Result<String, String> {
        let id = self.next_id(&format!("move-{}", workload.name));
        let cmd = MoveApplication {
            move_id: id.clone(),
            workload: workload.clone(),
            target_group: group.into(),
            gpu_class: class.into(),
        };
        let decisions = self.claims.handle(app_move::Input::MoveApplication(&cmd));
        let decisions = self.record("claim-allocator", decisions);
        if let Some(Kind::ApplicationMoveRefused(r)) =
            decisions.first().and_then(|d| d.kind.as_ref())
        {
            return Err(r.reason.clone());
        }
        self.pump();
        if self.claims.moves.verified.get(&workload_key(workload)) == Some(&id) {
            Ok(id)
        } else {
            Err(format!(
                "{} is not verified: {} pods pending",
                workload.name,
                self.sim.pending_pods()
            ))
        }
    }

    /// Runs the completion steps; returns the refusal reasons, if any.
    pub fn complete(
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
        let decisions = self.completion.complete(&self.completion_cluster, &cmd);
        for decision in &decisions {
            self.completion.apply(decision);
        }
        let decisions = self.record("claim-allocator", decisions);
        self.pump();
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
    pub fn roll_back_node(&mut self, node: &str) -> Result<String, String> {
        let id = self.next_id(&format!("rollback-{node}"));
        let planned = plan_node_rollback(&self.log_prefix(), node, &id)?;
        let restore: Option<HandoverStarted> = match &planned.kind {
            Some(Kind::RollbackStarted(r)) => r.node_restore.as_deref().cloned(),
            _ => None,
        };
        let decisions = self.stack.handle(Input::Rollback(&planned), self.sim.now());
        let decisions = self.record("stack-assigner", decisions);
        if let Some(Kind::HandoverRefused(r)) = decisions.first().and_then(|d| d.kind.as_ref()) {
            return Err(r.reason.clone());
        }
        self.pump();
        if !self.completed(&id) {
            return Err(self.handover_trouble(node));
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
    pub fn roll_back_application(&mut self, workload: &WorkloadRef) -> Result<String, String> {
        let id = self.next_id(&format!("rollback-{}", workload.name));
        let planned = plan_workload_rollback(&self.log_prefix(), workload, &id)?;
        let original = match &planned.kind {
            Some(Kind::RollbackStarted(r)) => {
                r.workload_restore.as_ref().and_then(|w| w.after.clone())
            }
            _ => None,
        };
        let decisions = self.claims.handle(app_move::Input::Rollback(&planned));
        let decisions = self.record("claim-allocator", decisions);
        if let Some(Kind::ApplicationMoveRefused(r)) =
            decisions.first().and_then(|d| d.kind.as_ref())
        {
            return Err(r.reason.clone());
        }
        self.pump();
        if !self.completed(&id) {
            return Err(format!(
                "rollback of {} did not complete: {} pods pending",
                workload.name,
                self.sim.pending_pods()
            ));
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
    pub fn final_checks(&self) -> Vec<Check> {
        let mut checks: Vec<Check> = [
            "one-stack-per-node",
            "stack-rules",
            "rollback-restores-exactly",
            "quiescence",
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

        // Replay: folding the log into fresh cores gives the same state.
        let mut stack = StackAssigner::default();
        let mut claims = ClaimAllocator::default();
        let mut completion = Completion::default();
        for logged in &self.log {
            stack.apply(&logged.event, logged.at);
            claims.apply(&logged.event);
            completion.apply(&logged.event);
        }
        let same = stack == self.stack && claims == self.claims && completion == self.completion;
        checks.push(Check {
            name: "replay-same-state",
            ok: same,
            detail: if same {
                format!("{} events folded", self.log.len())
            } else {
                "replayed state differs".into()
            },
        });

        // Alerts: D8GpuNodeGroupHeldOnDra fires exactly for the held groups.
        let mut firing: BTreeMap<String, i64> = BTreeMap::new();
        for logged in &self.log {
            match &logged.event.kind {
                Some(Kind::AlertRaised(a)) => {
                    *firing
                        .entry(
                            a.labels
                                .get(ALERT_LABEL_NODE_GROUP)
                                .cloned()
                                .unwrap_or_default(),
                        )
                        .or_default() += 1
                }
                Some(Kind::AlertCleared(a)) => {
                    *firing
                        .entry(
                            a.labels
                                .get(ALERT_LABEL_NODE_GROUP)
                                .cloned()
                                .unwrap_or_default(),
                        )
                        .or_default() -= 1
                }
                _ => {}
            }
        }
        let alerts_ok = firing
            .iter()
            .all(|(group, n)| *n == i64::from(self.stack.held.contains(group)));
        checks.push(Check {
            name: "held-groups-alert",
            ok: alerts_ok,
            detail: format!("held: {:?}", self.stack.held),
        });

        let pending = self.sim.pending_pods();
        checks.push(Check {
            name: "no-pod-left-pending",
            ok: pending == 0,
            detail: format!("{pending} pending pods"),
        });
        checks
    }

    /// Nodes per (group, stack label).
    pub fn nodes_by_group_and_stack(&self) -> BTreeMap<(String, String), usize> {
        let mut counts = BTreeMap::new();
        for (name, node) in &self.stack.cluster.nodes {
            let stack = match self.stack.stack_of(name) {
                Some(Stack::DevicePlugin) => STACK_DEVICE_PLUGIN,
                Some(Stack::Dra) => STACK_DRA,
                _ => "none",
            };
            *counts
                .entry((
                    node.group().unwrap_or_default().to_string(),
                    stack.to_string(),
                ))
                .or_default() += 1;
        }
        counts
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
pub struct Outcome {
    pub migration: Migration,
    pub steps: Vec<StepReport>,
    pub checks: Vec<Check>,
}

impl Outcome {
    pub fn ok(&self) -> bool {
        self.steps.iter().all(|s| s.ok) && self.checks.iter().all(|c| c.ok)
    }
}

/// Runs the reference scenario; `progress` hears about every step as it ends.
pub fn run_reference(config: SimConfig, mut progress: impl FnMut(&StepReport)) -> Outcome {
    const SOURCE: &str = "gpu";
    const TARGET: &str = "gpu-dra";
    const CLASS: &str = "a100";
    let mut m = Migration::new(config);
    let mut steps = Vec::new();
    let mut report = |m: &Migration, step: String, result: Result<String, String>| {
        let (ok, detail) = match result {
            Ok(detail) => (true, detail),
            Err(detail) => (false, detail),
        };
        let report = StepReport {
            step,
            ok,
            detail,
            at: m.sim.now(),
        };
        progress(&report);
        steps.push(report);
    };

    // Step 1: the target group, then DRA on (a cluster upgraded with DRA on has
    // it already, and the groups it served are held on DRA since the first run).
    m.sim.set_group(TARGET, None);
    if !m.stack.cluster.module.dra_enabled {
        m.sim.set_dra_enabled(true);
    }
    m.pump();
    let held: Vec<String> = m.stack.held.iter().cloned().collect();
    report(
        &m,
        "step 1: create gpu-dra and enable DRA".into(),
        Ok(if held.is_empty() {
            "no group held".into()
        } else {
            format!(
                "held on DRA since the upgrade, D8GpuNodeGroupHeldOnDra firing: {}",
                held.join(", ")
            )
        }),
    );
    // Step 2: a GPU class.
    m.sim.create_gpu_class(CLASS);
    m.pump();
    report(
        &m,
        "step 2: create GPU class a100".into(),
        Ok("gpu.deckhouse.io/a100".into()),
    );

    // Steps 3 and 4, repeated: hand over a node, then move what fits on DRA.
    let mut waiting: Vec<WorkloadRef> = m.sim.workloads();
    let mut handed_over = Vec::new();
    loop {
        loop {
            let free = m.sim.free_class_gpus_in(TARGET, CLASS);
            let Some(i) = waiting.iter().position(|w| m.sim.workload_gpus(w) <= free) else {
                break;
            };
            let workload = waiting.remove(i);
            let result = m.move_application(&workload, TARGET, CLASS);
            report(&m, format!("step 4: move {}", workload.name), result);
        }
        let Some(node) = m.sim.nodes_in(SOURCE).first().cloned() else {
            break;
        };
        let result = m.hand_over(&node, TARGET);
        let failed = result.is_err();
        report(&m, format!("step 3: hand over {node}"), result);
        if failed {
            break;
        }
        handed_over.push(node);
    }
    for workload in &waiting {
        report(
            &m,
            format!("step 4: move {}", workload.name),
            Err("no room on DRA nodes".into()),
        );
    }

    // Step 5: every application verified on the target group.
    let verified = m.claims.moves.verified.len();
    let total = m.sim.workloads().len();
    let all_running = m.sim.pending_pods() == 0;
    report(
        &m,
        "step 5: verify".into(),
        if verified == total && all_running {
            Ok(format!(
                "{verified}/{total} applications on {TARGET} with claims allocated"
            ))
        } else {
            Err(format!(
                "{verified}/{total} applications verified, {} pods pending",
                m.sim.pending_pods()
            ))
        },
    );

    // Completion; the source group stays for the trial period.
    let refusals = m.complete(SOURCE, CLASS, false);
    let quota = m.sim.quota("ml", "gpu-quota").cloned().unwrap_or_default();
    let translated = !quota.contains_key("requests.nvidia.com/gpu")
        && quota.contains_key("requests.gpu.deckhouse.io/a100");
    report(
        &m,
        "completion: quotas and leftover labels".into(),
        if translated {
            Ok(refusals.join("; "))
        } else {
            Err(format!("quota not translated: {quota:?}"))
        },
    );

    // The upgrade hold ends the way the reference says: spec.gpu removed, the
    // group stays on DRA and the alert clears.
    for group in m.stack.held.clone() {
        m.sim.set_group(&group, None);
        m.pump();
        let nodes = m.sim.nodes_in(&group);
        let on_dra = nodes
            .iter()
            .all(|n| m.stack.stack_of(n) == Some(Stack::Dra));
        let cleared = !m.stack.held.contains(&group);
        report(
            &m,
            format!("hold: remove spec.gpu from {group}"),
            if on_dra && cleared {
                Ok(format!(
                    "released; {} stays on DRA, alert cleared",
                    nodes.join(", ")
                ))
            } else {
                Err(format!("released: {cleared}, nodes on DRA: {on_dra}"))
            },
        );
    }

    // Rollback: a node back to the device plugin — as many as the smallest moved
    // application needs, since a rollback needs Device Plugin nodes — then that
    // application onto it.
    let smallest = m
        .sim
        .workloads()
        .into_iter()
        .filter(|w| m.claims.moves.verified.contains_key(&workload_key(w)))
        .min_by_key(|w| (m.sim.workload_gpus(w), w.name.clone()));
    let mut rolled_back_ok = true;
    for node in handed_over.iter().rev() {
        let result = m.roll_back_node(node);
        rolled_back_ok &= result.is_ok();
        report(&m, format!("rollback: node {node}"), result);
        let need = smallest.as_ref().map_or(0, |w| m.sim.workload_gpus(w));
        if !rolled_back_ok || m.sim.free_gpus_on(STACK_DEVICE_PLUGIN) >= need {
            break;
        }
    }
    if let Some(workload) = smallest.filter(|_| rolled_back_ok) {
        let result = m.roll_back_application(&workload);
        report(
            &m,
            format!("rollback: application {}", workload.name),
            result,
        );
    }

    let checks = m.final_checks();
    Outcome {
        migration: m,
        steps,
        checks,
    }
}

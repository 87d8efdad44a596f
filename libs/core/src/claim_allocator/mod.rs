//! The claim-allocator core: application moves ([`moves`]), migrations in
//! waves ([`migration`]) and completion ([`completion`]) over the cluster facts.

pub mod completion;
pub mod evidence;
pub mod migration;
pub mod moves;
pub mod node_gates;
pub mod stages;

pub use completion::Completion;
pub use evidence::check_key;
pub use stages::Stage;

use std::collections::BTreeSet;

use switchyard_proto::v1::{
    ApplicationMoveRefused, DomainEvent, PodObserved, PodRemoved, WorkloadRef, domain_event::Kind,
    event,
};

use crate::cluster::{Cluster, WorkloadKey, workload_key};
use crate::command::{CheckEvidence, Complete, ControlMigration, MigrationAction, MoveApplication};
use crate::effects::Effect;
use migration::Migrations;
use moves::AppMoves;
use switchyard_proto::v1::{
    MigrationAborted, MigrationPaused, MigrationRefused, MigrationResumed, MigrationStarted,
};

/// The claim-allocator core: cluster facts, application moves, migrations,
/// completion.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClaimAllocator {
    pub(crate) cluster: Cluster,
    pub(crate) moves: AppMoves,
    pub(crate) completion: Completion,
    pub(crate) migrations: Migrations,
}

/// An input of the claim-allocator.
#[derive(Clone, Copy, Debug)]
pub enum Input<'a> {
    Fact(&'a DomainEvent),
    MoveApplication(&'a MoveApplication),
    /// A workload rollback planned by `rollback::plan_workload_rollback`.
    Rollback(&'a DomainEvent),
    /// A migration's plan.
    Migrate(&'a MigrationStarted),
    ControlMigration(&'a ControlMigration),
    /// The operator asks for the exit evidence now.
    CheckEvidence(&'a CheckEvidence),
    /// The operator completes the migration of a group (or pool).
    Complete(&'a Complete),
    /// Time passed: the migrations' circuit breaker.
    Tick,
}

impl ClaimAllocator {
    // Read-only views: what the alerter, `status`, `/metrics` and the
    // checks read. The state itself is the core's own.

    /// The cluster as this core has folded it.
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// The application moves, active and finished.
    pub fn moves(&self) -> &AppMoves {
        &self.moves
    }

    /// The migrations, active and ended.
    pub fn migrations(&self) -> &Migrations {
        &self.migrations
    }

    /// Folds an event recorded (or decided) at `at`.
    pub fn apply(&mut self, event: &DomainEvent, at: i64) {
        self.cluster.apply(event);
        self.moves.apply(event);
        self.completion.apply(event);
        self.migrations.apply(event, at);
    }

    /// The completion steps an operator asks for (or why not yet), folded.
    fn complete(&mut self, cmd: &Complete, now: i64) -> Vec<DomainEvent> {
        let decisions = self.completion.complete(&self.cluster, cmd);
        for decision in &decisions {
            self.apply(decision, now);
        }
        decisions
    }

    /// Whether a migration is in progress (its breaker reads the time).
    pub(crate) fn migrating(&self) -> bool {
        !self.migrations.active.is_empty()
    }

    /// What the edge should keep true: the moves' rewrites and restarts, then
    /// completion's quotas, labels and group.
    pub fn effects(&self) -> Vec<Effect> {
        let mut effects = self.moves.effects(&self.cluster);
        effects.extend(self.completion.effects(&self.cluster));
        effects
    }

    /// Folds the input, decides, folds the decisions; returns the decisions.
    /// `now` is the time of the decision (the migrations' breaker reads it).
    pub fn handle(&mut self, input: Input<'_>, now: i64) -> Vec<DomainEvent> {
        let mut out = Vec::new();
        let mut trigger = None;
        let keys: Vec<WorkloadKey> = match input {
            Input::Complete(cmd) => return self.complete(cmd, now),
            Input::Tick => Vec::new(),
            Input::Migrate(plan) => {
                let decision = self.migrate(plan);
                self.apply(&decision, now);
                out.push(decision);
                Vec::new()
            }
            Input::ControlMigration(cmd) => {
                let decision = self.control(cmd);
                self.apply(&decision, now);
                out.push(decision);
                Vec::new()
            }
            Input::CheckEvidence(cmd) => {
                for decision in self.check_evidence(cmd) {
                    self.apply(&decision, now);
                    out.push(decision);
                }
                Vec::new()
            }
            Input::Fact(fact) => {
                trigger = Some(fact);
                // A move follows its workload's own pods: a pod's fact can move
                // on only the move of the workload that owned it before the
                // fact or owns it after; a node's, any move.
                let pod = match &fact.kind {
                    Some(Kind::PodObserved(PodObserved {
                        namespace, name, ..
                    }))
                    | Some(Kind::PodRemoved(PodRemoved { namespace, name })) => {
                        Some((namespace.clone(), name.clone()))
                    }
                    _ => None,
                };
                let mut owners = BTreeSet::new();
                owners.extend(pod.as_ref().and_then(|key| self.move_of_pod(key)));
                self.apply(fact, now);
                owners.extend(pod.as_ref().and_then(|key| self.move_of_pod(key)));
                match &fact.kind {
                    Some(Kind::WorkloadObserved(f)) => {
                        f.workload.iter().map(workload_key).collect()
                    }
                    Some(Kind::PodObserved(_) | Kind::PodRemoved(_)) => {
                        owners.into_iter().collect()
                    }
                    Some(Kind::NodeObserved(_)) => self.moves.active.keys().cloned().collect(),
                    _ => Vec::new(),
                }
            }
            Input::MoveApplication(cmd) => {
                for decision in self.moves.start(&self.cluster, cmd) {
                    self.apply(&decision, now);
                    out.push(decision);
                }
                vec![workload_key(&cmd.workload)]
            }
            Input::Rollback(started) => {
                let Some(Kind::RollbackStarted(r)) = &started.kind else {
                    return out;
                };
                let Some(workload) = r.workload_restore.as_ref().and_then(|w| w.workload.clone())
                else {
                    return out;
                };
                let key = workload_key(&workload);
                if let Some(m) = self.moves.active.get(&key) {
                    out.push(event(Kind::ApplicationMoveRefused(
                        ApplicationMoveRefused {
                            workload: Some(workload.clone()),
                            reason: format!(
                                "{} {}/{} is being moved ({}); roll it back once that is done",
                                workload.kind, workload.namespace, workload.name, m.id
                            ),
                        },
                    )));
                    return out;
                }
                self.apply(started, now);
                out.push(started.clone());
                vec![key]
            }
        };
        self.follow(keys, now, &mut out);
        self.run_migrations(trigger, now, &mut out);
        out
    }

    /// A migration's plan checked: recorded as started, or refused.
    fn migrate(&self, plan: &MigrationStarted) -> DomainEvent {
        let refuse = |reason: String| {
            event(Kind::MigrationRefused(MigrationRefused {
                migration_id: plan.migration_id.clone(),
                reason,
            }))
        };
        if self.migrations.active.contains_key(&plan.migration_id)
            || self.migrations.ended.contains_key(&plan.migration_id)
        {
            return refuse(format!("migration {} exists already", plan.migration_id));
        }
        if let Some(other) = self.migrations.active.values().find(|m| {
            m.plan.source_group == plan.source_group || m.plan.target_group == plan.target_group
        }) {
            return refuse(format!(
                "migration {} from {} to {} is running: finish, pause or abort it first",
                other.plan.migration_id, other.plan.source_group, other.plan.target_group
            ));
        }
        if plan.waves.is_empty() {
            return refuse("the plan has no waves: nothing to migrate".into());
        }
        if plan.max_unavailable == 0 {
            return refuse("max_unavailable: expected at least 1".into());
        }
        for (i, wave) in plan.waves.iter().enumerate() {
            if wave.nodes.len() > plan.max_unavailable as usize {
                return refuse(format!(
                    "waves[{i}]: {} nodes, more than max_unavailable {}",
                    wave.nodes.len(),
                    plan.max_unavailable
                ));
            }
        }
        if !self.cluster.gpu_classes.contains_key(&plan.gpu_class) {
            let known: Vec<&str> = self
                .cluster
                .gpu_classes
                .keys()
                .map(String::as_str)
                .collect();
            return refuse(format!(
                "GPU class {} does not exist (known: {})",
                plan.gpu_class,
                known.join(", ")
            ));
        }
        event(Kind::MigrationStarted(plan.clone()))
    }

    /// The evidence the operator asks for, checked on the facts now: one
    /// wave's, each started wave's of a migration, or (no migration named)
    /// every GPU node's and every verified move's.
    fn check_evidence(&self, cmd: &CheckEvidence) -> Vec<DomainEvent> {
        let refuse = |reason: String| {
            vec![event(Kind::MigrationRefused(MigrationRefused {
                migration_id: cmd.migration_id.clone(),
                reason,
            }))]
        };
        if cmd.migration_id.is_empty() {
            let moved: Vec<evidence::Moved> = self
                .moves
                .verified
                .iter()
                .map(|((namespace, kind, name), v)| evidence::Moved {
                    workload: WorkloadRef {
                        namespace: namespace.clone(),
                        kind: kind.clone(),
                        name: name.clone(),
                    },
                    target_group: v.target_group.clone(),
                    gpu_class: v.gpu_class.clone(),
                })
                .collect();
            if let Some(stage) = cmd.stage {
                return stages::check(&self.cluster, stage, &cmd.check_id, &moved)
                    .unwrap_or_else(refuse);
            }
            let scope = evidence::Scope {
                check_id: cmd.check_id.clone(),
                migration_id: String::new(),
                wave: 0,
                nodes: evidence::gpu_nodes(&self.cluster),
                workloads: moved,
            };
            if scope.nodes.is_empty() && scope.workloads.is_empty() {
                return refuse("no GPU node and no verified move: no evidence to check".into());
            }
            return evidence::check(&self.cluster, &scope);
        }
        let id = &cmd.migration_id;
        let Some(m) = self
            .migrations
            .active
            .get(id)
            .or_else(|| self.migrations.ended.get(id))
        else {
            return refuse(format!("migration {id} does not exist"));
        };
        let waves: Vec<u32> = match cmd.wave {
            Some(w) if w >= m.next => {
                return refuse(format!(
                    "wave {} of migration {id} has not started ({} of {} waves started)",
                    w + 1,
                    m.next,
                    m.plan.waves.len()
                ));
            }
            Some(w) => vec![w],
            None if m.next == 0 => {
                return refuse(format!("migration {id} has started no wave yet"));
            }
            None => (0..m.next).collect(),
        };
        waves
            .into_iter()
            .filter_map(|w| migration::wave_scope(&m.plan, w, cmd.check_id.clone()))
            .flat_map(|scope| evidence::check(&self.cluster, &scope))
            .collect()
    }

    /// Pause, resume or abort, as the operator asks — or why not.
    fn control(&self, cmd: &ControlMigration) -> DomainEvent {
        let id = &cmd.migration_id;
        let Some(m) = self.migrations.active.get(id) else {
            return event(Kind::MigrationRefused(MigrationRefused {
                migration_id: id.clone(),
                reason: if self.migrations.ended.contains_key(id) {
                    format!("migration {id} has ended")
                } else {
                    format!("migration {id} does not exist")
                },
            }));
        };
        let wave = m.wave.unwrap_or(m.next);
        let reason = match cmd.reason.as_str() {
            "" => "asked by the operator".to_string(),
            given => given.to_string(),
        };
        match cmd.action {
            MigrationAction::Pause => event(Kind::MigrationPaused(MigrationPaused {
                migration_id: id.clone(),
                wave,
                reason,
                tripped: false,
            })),
            MigrationAction::Resume => event(Kind::MigrationResumed(MigrationResumed {
                migration_id: id.clone(),
                wave,
            })),
            MigrationAction::Abort => event(Kind::MigrationAborted(MigrationAborted {
                migration_id: id.clone(),
                wave,
                reason,
            })),
        }
    }

    /// Moves every running migration on as far as the facts allow.
    fn run_migrations(
        &mut self,
        trigger: Option<&DomainEvent>,
        now: i64,
        out: &mut Vec<DomainEvent>,
    ) {
        if self.migrations.active.is_empty() {
            return;
        }
        let mut trigger = trigger;
        // A wave's end and the next wave's start can follow from one fact.
        for _ in 0..4 {
            let decisions = self
                .migrations
                .decide(&self.cluster, &self.moves, trigger.take(), now);
            if decisions.is_empty() {
                break;
            }
            for decision in decisions {
                self.apply(&decision, now);
                out.push(decision);
            }
        }
    }

    /// After a rebuild from the log: the next steps of the moves in progress
    /// that the facts already allow (a late start or a crash kept them from
    /// being recorded), folded.
    pub fn catch_up(&mut self, now: i64) -> Vec<DomainEvent> {
        let mut out = Vec::new();
        let keys: Vec<WorkloadKey> = self.moves.active.keys().cloned().collect();
        self.follow(keys, now, &mut out);
        self.run_migrations(None, now, &mut out);
        out
    }

    /// The workload in a move that pod `key` belongs to, if any: its owner,
    /// or the CronJob whose Job owns it.
    fn move_of_pod(&self, key: &(String, String)) -> Option<WorkloadKey> {
        let owner = self.cluster.pods.get(key)?.owner_key(&key.0);
        if self.moves.active.contains_key(&owner) {
            return Some(owner);
        }
        let cron_job = self.cluster.workloads.get(&owner)?.cron_job()?;
        let parent = (key.0.clone(), "CronJob".to_string(), cron_job.to_string());
        self.moves.active.contains_key(&parent).then_some(parent)
    }

    /// Moves each workload of `keys` on as far as the facts allow.
    fn follow(&mut self, keys: Vec<WorkloadKey>, now: i64, out: &mut Vec<DomainEvent>) {
        for key in keys {
            // Rewrite seen -> restarted -> verified can follow from one fact.
            for _ in 0..3 {
                let decisions = self.moves.decide_workload(&self.cluster, &key);
                if decisions.is_empty() {
                    break;
                }
                for decision in decisions {
                    self.apply(&decision, now);
                    out.push(decision);
                }
            }
        }
    }
}

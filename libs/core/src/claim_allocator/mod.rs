//! The claim-allocator core: application moves ([`moves`]) and completion
//! ([`completion`]) over the cluster facts.

pub mod completion;
pub mod moves;

use switchyard_proto::v1::{ApplicationMoveRefused, DomainEvent, domain_event::Kind, event};

use crate::cluster::{Cluster, WorkloadKey, workload_key};
use crate::command::{Command, Complete, MoveApplication};
use crate::effects::Effect;
use crate::service::{self, Core, ServiceName};
use completion::Completion;
use moves::AppMoves;

/// The claim-allocator core: cluster facts, application moves, completion.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClaimAllocator {
    pub cluster: Cluster,
    pub moves: AppMoves,
    pub completion: Completion,
}

/// An input of the claim-allocator.
#[derive(Clone, Copy, Debug)]
pub enum Input<'a> {
    Fact(&'a DomainEvent),
    MoveApplication(&'a MoveApplication),
    /// A workload rollback planned by `rollback::plan_workload_rollback`.
    Rollback(&'a DomainEvent),
}

impl ClaimAllocator {
    pub fn apply(&mut self, event: &DomainEvent) {
        self.cluster.apply(event);
        self.moves.apply(event);
        self.completion.apply(event);
    }

    /// The completion steps an operator asks for (or why not yet), folded.
    pub fn complete(&mut self, cmd: &Complete) -> Vec<DomainEvent> {
        let decisions = self.completion.complete(&self.cluster, cmd);
        for decision in &decisions {
            self.apply(decision);
        }
        decisions
    }

    /// What the edge should keep true: the moves' rewrites and restarts, then
    /// completion's quotas, labels and group.
    pub fn effects(&self) -> Vec<Effect> {
        let mut effects = self.moves.effects();
        effects.extend(self.completion.effects(&self.cluster));
        effects
    }

    /// Folds the input, decides, folds the decisions; returns the decisions.
    pub fn handle(&mut self, input: Input<'_>) -> Vec<DomainEvent> {
        let mut out = Vec::new();
        let keys: Vec<WorkloadKey> = match input {
            Input::Fact(fact) => {
                self.apply(fact);
                match &fact.kind {
                    Some(Kind::WorkloadObserved(f)) => {
                        f.workload.iter().map(workload_key).collect()
                    }
                    Some(Kind::PodObserved(_) | Kind::PodRemoved(_) | Kind::NodeObserved(_)) => {
                        self.moves.active.keys().cloned().collect()
                    }
                    _ => Vec::new(),
                }
            }
            Input::MoveApplication(cmd) => {
                for decision in self.moves.start(&self.cluster, cmd) {
                    self.apply(&decision);
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
                self.apply(started);
                out.push(started.clone());
                vec![key]
            }
        };
        self.follow(keys, &mut out);
        out
    }

    /// After a rebuild from the log: the next steps of the moves in progress
    /// that the facts already allow (a late start or a crash kept them from
    /// being recorded), folded.
    pub fn catch_up(&mut self) -> Vec<DomainEvent> {
        let mut out = Vec::new();
        let keys: Vec<WorkloadKey> = self.moves.active.keys().cloned().collect();
        self.follow(keys, &mut out);
        out
    }

    /// Moves each workload of `keys` on as far as the facts allow.
    fn follow(&mut self, keys: Vec<WorkloadKey>, out: &mut Vec<DomainEvent>) {
        for key in keys {
            // Rewrite seen -> restarted -> verified can follow from one fact.
            for _ in 0..3 {
                let decisions = self.moves.decide_workload(&self.cluster, &key);
                if decisions.is_empty() {
                    break;
                }
                for decision in decisions {
                    self.apply(&decision);
                    out.push(decision);
                }
            }
        }
    }
}

impl Core for ClaimAllocator {
    fn service(&self) -> ServiceName {
        ServiceName::ClaimAllocator
    }
    fn fold(&mut self, event: &DomainEvent, _at: i64) {
        self.apply(event);
    }
    fn decide(&mut self, input: service::Input<'_>, _now: i64) -> Vec<DomainEvent> {
        match input {
            service::Input::Record(event) => self.handle(Input::Fact(event)),
            service::Input::Command(Command::MoveApplication(cmd)) => {
                self.handle(Input::MoveApplication(cmd))
            }
            service::Input::Command(Command::Rollback(planned)) => {
                self.handle(Input::Rollback(planned))
            }
            service::Input::Command(Command::Complete(cmd)) => self.complete(cmd),
            service::Input::Command(Command::StartHandover(_))
            | service::Input::Observed(_)
            | service::Input::Tick => Vec::new(),
        }
    }
    fn catch_up(&mut self, _now: i64) -> Vec<DomainEvent> {
        ClaimAllocator::catch_up(self)
    }
    fn effects(&self) -> Vec<Effect> {
        ClaimAllocator::effects(self)
    }
    fn snapshot(&self) -> Box<dyn std::any::Any + Send> {
        Box::new(self.clone())
    }
}

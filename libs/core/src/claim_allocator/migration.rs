//! A migration in waves (the NVIDIA guide's staged waves; the reference's
//! "Steps 3 and 4 repeat while the source group still has nodes and
//! workloads"): each wave's nodes are handed over (by the stack-assigner,
//! which takes `WaveStarted`), then the wave's workloads are moved and
//! verified, then the next wave starts — all recorded, so a restart of any
//! service or of the CLI goes on where the log says.
//!
//! The circuit breaker pauses the migration (`MigrationPaused` with
//! `tripped`) when a node's handover is refused, an eviction on a wave's node
//! is refused (a PodDisruptionBudget), a move is refused, or the moved pods
//! are not all running with their claims `pending_limit_seconds` after their
//! moves started. A pause stops new steps (no new move, no new wave); what is
//! in flight goes on. `resume` lifts it; `abort` ends the migration, and the
//! CLI rolls the current wave back, each node and workload by its own
//! rollback.

use std::collections::{BTreeMap, BTreeSet};

use switchyard_proto::v1::{
    DomainEvent, MigrationAborted, MigrationCompleted, MigrationPaused, MigrationStarted,
    WaveCompleted, WaveStarted, WorkloadRef, domain_event::Kind, event,
};

use crate::cluster::{Cluster, WorkloadKey, workload_key};
use crate::command::{MoveApplication, wave_evidence_id, wave_handover_id, wave_move_id};

use super::evidence::{self, Moved, Scope};
use super::moves::AppMoves;

/// Where a migration stands.
#[derive(Clone, Debug, PartialEq)]
pub struct Migration {
    pub plan: MigrationStarted,
    /// The wave in progress (started, not completed).
    pub wave: Option<u32>,
    /// The next wave to start.
    pub next: u32,
    /// Why it is paused; `None` while it runs.
    pub paused: Option<String>,
    /// Nodes of the current wave handed over.
    pub handed_over: BTreeSet<String>,
    /// Workloads of the current wave whose move started, and when.
    pub moving: BTreeMap<WorkloadKey, i64>,
    /// Workloads of the current wave whose move is verified.
    pub moved: BTreeSet<WorkloadKey>,
    /// When the current wave's last handover or move ended (or the
    /// migration was resumed): its evidence is waited for from then, up to
    /// the pending limit.
    pub settled_at: i64,
}

impl Migration {
    fn current(&self) -> Option<&switchyard_proto::v1::PlannedWave> {
        self.wave.and_then(|w| self.plan.waves.get(w as usize))
    }
}

/// The claim-allocator's migrations.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Migrations {
    pub active: BTreeMap<String, Migration>,
    /// Completed or aborted, by id: their plans (evidence is checked on
    /// their waves after the end too).
    pub ended: BTreeMap<String, Migration>,
}

impl Migrations {
    /// Folds an event recorded at `at`.
    pub fn apply(&mut self, event: &DomainEvent, at: i64) {
        let Some(kind) = &event.kind else { return };
        match kind {
            Kind::MigrationStarted(e) => {
                self.active.insert(
                    e.migration_id.clone(),
                    Migration {
                        plan: e.clone(),
                        wave: None,
                        next: 0,
                        paused: None,
                        handed_over: BTreeSet::new(),
                        moving: BTreeMap::new(),
                        moved: BTreeSet::new(),
                        settled_at: at,
                    },
                );
            }
            Kind::WaveStarted(e) => {
                if let Some(m) = self.active.get_mut(&e.migration_id) {
                    m.wave = Some(e.wave);
                    m.next = e.wave + 1;
                    m.handed_over.clear();
                    m.moving.clear();
                    m.moved.clear();
                    m.settled_at = at;
                }
            }
            Kind::WaveCompleted(e) => {
                if let Some(m) = self.active.get_mut(&e.migration_id) {
                    m.wave = None;
                }
            }
            Kind::MigrationPaused(e) => {
                if let Some(m) = self.active.get_mut(&e.migration_id) {
                    m.paused = Some(e.reason.clone());
                }
            }
            Kind::MigrationResumed(e) => {
                if let Some(m) = self.active.get_mut(&e.migration_id) {
                    m.paused = None;
                    // The breaker's clock starts again for moves still going.
                    for started in m.moving.values_mut() {
                        *started = at;
                    }
                    m.settled_at = at;
                }
            }
            Kind::MigrationAborted(MigrationAborted { migration_id, .. })
            | Kind::MigrationCompleted(MigrationCompleted { migration_id, .. }) => {
                if let Some(m) = self.active.remove(migration_id) {
                    self.ended.insert(migration_id.clone(), m);
                }
            }
            Kind::HandoverCompleted(e) => {
                for m in self.active.values_mut() {
                    let Some(wave) = m.wave else { continue };
                    if e.handover_id == wave_handover_id(&m.plan.migration_id, wave, &e.node) {
                        m.handed_over.insert(e.node.clone());
                        m.settled_at = at;
                    }
                }
            }
            Kind::ApplicationMoveStarted(e) => {
                let Some(w) = &e.workload else { return };
                for m in self.active.values_mut() {
                    let Some(wave) = m.wave else { continue };
                    if e.move_id == wave_move_id(&m.plan.migration_id, wave, w) {
                        m.moving.insert(workload_key(w), at);
                    }
                }
            }
            Kind::ApplicationMoveVerified(e) => {
                let Some(w) = &e.workload else { return };
                for m in self.active.values_mut() {
                    let Some(wave) = m.wave else { continue };
                    if e.move_id == wave_move_id(&m.plan.migration_id, wave, w) {
                        m.moved.insert(workload_key(w));
                        m.settled_at = at;
                    }
                }
            }
            _ => {}
        }
    }

    /// The next steps of every running migration the facts allow, given the
    /// record just folded (`trigger`, for the breaker) and the time.
    pub fn decide(
        &self,
        cluster: &Cluster,
        moves: &AppMoves,
        trigger: Option<&DomainEvent>,
        now: i64,
    ) -> Vec<DomainEvent> {
        let mut out = Vec::new();
        for m in self.active.values() {
            if m.paused.is_some() {
                continue;
            }
            if let Some(reason) = trip(m, cluster, trigger, now) {
                out.push(pause(m, reason, true));
                continue;
            }
            out.extend(step(m, cluster, moves, now));
        }
        out
    }
}

fn pause(m: &Migration, reason: String, tripped: bool) -> DomainEvent {
    event(Kind::MigrationPaused(MigrationPaused {
        migration_id: m.plan.migration_id.clone(),
        wave: m.wave.unwrap_or(m.next),
        reason,
        tripped,
    }))
}

fn name(w: &WorkloadRef) -> String {
    format!("{} {}/{}", w.kind, w.namespace, w.name)
}

/// Why the circuit breaker stops `m` now, if it does.
fn trip(
    m: &Migration,
    cluster: &Cluster,
    trigger: Option<&DomainEvent>,
    now: i64,
) -> Option<String> {
    let wave = m.current()?;
    let on_wave_node = |node: &str| wave.nodes.iter().any(|n| n == node);
    match trigger.and_then(|t| t.kind.as_ref()) {
        Some(Kind::HandoverRefused(r)) if on_wave_node(&r.node) => {
            return Some(format!(
                "the handover of node {} was refused: {}",
                r.node, r.reason
            ));
        }
        Some(Kind::EvictionBlocked(b)) if on_wave_node(&b.node) => {
            let budgets = if b.disruption_budgets.is_empty() {
                String::new()
            } else {
                format!(
                    " by PodDisruptionBudget {}",
                    b.disruption_budgets.join(", ")
                )
            };
            return Some(format!(
                "the eviction of pod {}/{} from node {} was refused{budgets}: {}",
                b.namespace, b.pod, b.node, b.reason
            ));
        }
        Some(Kind::ApplicationMoveRefused(r))
            if r.workload
                .as_ref()
                .is_some_and(|w| wave.workloads.contains(w)) =>
        {
            return Some(format!(
                "the move of {} was refused: {}",
                r.workload.as_ref().map(name).unwrap_or_default(),
                r.reason
            ));
        }
        _ => {}
    }
    let limit = (m.plan.pending_limit_seconds as i64).saturating_mul(1_000_000_000);
    if limit == 0 {
        return None;
    }
    let late: Vec<String> = m
        .moving
        .iter()
        .filter(|(key, started)| !m.moved.contains(*key) && now - **started > limit)
        .map(|(key, _)| {
            let pending: Vec<&str> = cluster
                .named_pods_of(key)
                .into_iter()
                .filter(|(_, p)| {
                    p.phase != switchyard_proto::v1::PodPhase::Running
                        || p.claims_allocated < p.claims_needed
                })
                .map(|(name, _)| name)
                .collect();
            let (ns, kind, wname) = key;
            if pending.is_empty() {
                format!("{kind} {ns}/{wname}")
            } else {
                format!("{kind} {ns}/{wname} (pods {})", pending.join(", "))
            }
        })
        .collect();
    (!late.is_empty()).then(|| {
        format!(
            "moved pods are not running with their claims {} s after their move: {}",
            m.plan.pending_limit_seconds,
            late.join(", ")
        )
    })
}

/// The scope of wave `wave` of `plan`'s evidence.
pub fn wave_scope(plan: &MigrationStarted, wave: u32, check_id: String) -> Option<Scope> {
    let planned = plan.waves.get(wave as usize)?;
    Some(Scope {
        check_id,
        migration_id: plan.migration_id.clone(),
        wave,
        nodes: planned.nodes.clone(),
        workloads: planned
            .workloads
            .iter()
            .map(|w| Moved {
                workload: w.clone(),
                target_group: plan.target_group.clone(),
                gpu_class: plan.gpu_class.clone(),
            })
            .collect(),
    })
}

/// The next step of a running migration.
fn step(m: &Migration, cluster: &Cluster, moves: &AppMoves, now: i64) -> Vec<DomainEvent> {
    let id = &m.plan.migration_id;
    let Some(wave_index) = m.wave else {
        let Some(next) = m.plan.waves.get(m.next as usize) else {
            return vec![event(Kind::MigrationCompleted(MigrationCompleted {
                migration_id: id.clone(),
                waves: m.plan.waves.len() as u32,
            }))];
        };
        return vec![event(Kind::WaveStarted(WaveStarted {
            migration_id: id.clone(),
            wave: m.next,
            nodes: next.nodes.clone(),
            workloads: next.workloads.clone(),
            target_group: m.plan.target_group.clone(),
        }))];
    };
    let Some(wave) = m.current() else {
        return Vec::new();
    };
    if wave.nodes.iter().any(|n| !m.handed_over.contains(n)) {
        return Vec::new();
    }
    let mut out = Vec::new();
    for w in &wave.workloads {
        let key = workload_key(w);
        if m.moving.contains_key(&key) || moves.active.contains_key(&key) {
            continue;
        }
        let cmd = MoveApplication {
            move_id: wave_move_id(id, wave_index, w),
            workload: w.clone(),
            target_group: m.plan.target_group.clone(),
            gpu_class: m.plan.gpu_class.clone(),
            allow_managed: false,
        };
        let started = moves.start(cluster, &cmd);
        if let Some(Kind::ApplicationMoveRefused(r)) = started.first().and_then(|d| d.kind.as_ref())
        {
            let reason = format!("the move of {} was refused: {}", name(w), r.reason);
            out.extend(started);
            out.push(pause(m, reason, true));
            return out;
        }
        out.extend(started);
    }
    if !out.is_empty() {
        return out;
    }
    if wave
        .workloads
        .iter()
        .all(|w| m.moved.contains(&workload_key(w)))
    {
        // Done only with its evidence: recorded once it passes, or once
        // the pending limit is out, with the pause that names the failure.
        let Some(scope) = wave_scope(&m.plan, wave_index, wave_evidence_id(id, wave_index)) else {
            return out;
        };
        let records = evidence::check(cluster, &scope);
        if let Some(failure) = evidence::first_failure(&records) {
            let limit = (m.plan.pending_limit_seconds as i64).saturating_mul(1_000_000_000);
            if limit == 0 || now - m.settled_at <= limit {
                return out;
            }
            let reason = format!(
                "the evidence of wave {} failed {} s after its last step: {}",
                wave_index + 1,
                m.plan.pending_limit_seconds,
                failure
            );
            out.extend(records);
            out.push(pause(m, reason, true));
            return out;
        }
        out.extend(records);
        out.push(event(Kind::WaveCompleted(WaveCompleted {
            migration_id: id.clone(),
            wave: wave_index,
            nodes: wave.nodes.clone(),
            workloads: wave.workloads.clone(),
        })));
        let more = (wave_index as usize + 1) < m.plan.waves.len();
        if m.plan.pause_after_wave && more {
            out.push(pause(
                m,
                format!(
                    "wave {} is done; `switchyard migrate resume --id {id}` starts the next",
                    wave_index + 1
                ),
                false,
            ));
        }
    }
    out
}

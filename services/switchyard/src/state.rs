//! The migration's state as of a log sequence: `switchyard status` and
//! `switchyard replay`. The log is folded into the same cores that wrote it.

use std::collections::BTreeMap;
use std::process::ExitCode;

use clap::Args;
use serde_json::{Value, json};
use switchyard_eventlog::{Decoded, EventLog, UnknownReason};
use switchyard_proto::v1::{HandoverStep, Stack, domain_event::Kind};
use switchyard_scenario::States;

use crate::backend::{Backend, open};
use crate::output::{Output, write_stdout};

/// Everything the services know after folding a log prefix.
#[derive(Default)]
pub struct Folded {
    pub states: States,
    pub last_sequence: u64,
    pub last_recorded_at: i64,
    pub events: u64,
    /// Rollback id -> completed.
    pub rollbacks: BTreeMap<String, bool>,
    /// Evidence check id -> its summary, as last recorded.
    pub evidence: BTreeMap<String, switchyard_proto::v1::EvidenceChecked>,
    /// Records passed over: kept raw (an unknown type, a newer schema, a
    /// payload that does not decode) or no envelope of the log at all.
    pub undecodable: u64,
    /// Of those, the records that are no envelope (some other client
    /// published them on the log's subjects).
    pub malformed: u64,
}

impl Folded {
    /// Folds the log from the start through `until` (everything when `None`).
    pub async fn read(log: &dyn EventLog, until: Option<u64>) -> anyhow::Result<Folded> {
        let mut folded = Folded::default();
        if until == Some(0) {
            return Ok(folded);
        }
        switchyard_eventlog::replay(log, 1, |stored| {
            if until.is_some_and(|until| stored.sequence > until) {
                return;
            }
            folded.last_sequence = stored.sequence;
            folded.last_recorded_at = stored.envelope.recorded_at_unix_nanos;
            folded.events += 1;
            match stored.decode() {
                Decoded::Event(event) => {
                    folded.apply(&event, stored.envelope.recorded_at_unix_nanos)
                }
                Decoded::Unknown { reason, .. } => {
                    folded.undecodable += 1;
                    if matches!(reason, UnknownReason::Malformed(_)) {
                        folded.malformed += 1;
                    }
                }
            }
        })
        .await?;
        Ok(folded)
    }

    fn apply(&mut self, event: &switchyard_proto::v1::DomainEvent, at: i64) {
        self.states.fold(event, at);
        match &event.kind {
            Some(Kind::RollbackStarted(r)) => {
                self.rollbacks.insert(r.rollback_id.clone(), false);
            }
            Some(Kind::RollbackCompleted(r)) => {
                self.rollbacks.insert(r.rollback_id.clone(), true);
            }
            Some(Kind::EvidenceChecked(c)) => {
                let key = switchyard_core::claim_allocator::check_key(c);
                self.evidence.insert(key, c.clone());
            }
            _ => {}
        }
    }

    /// The drain of a handover in progress: its pods the Eviction API refused.
    fn blocked_evictions(
        &self,
        h: &switchyard_core::stack_assigner::Handover,
    ) -> Vec<(String, String)> {
        if h.step != HandoverStep::Drain {
            return Vec::new();
        }
        self.states.stack.cluster().blocked_evictions(&h.node)
    }

    /// What is in flight, one line each: handovers, application moves,
    /// rollbacks and migrations neither paused nor ended.
    pub fn in_flight(&self) -> Vec<String> {
        let mut busy = Vec::new();
        for h in self.states.stack.handovers().active.values() {
            busy.push(format!(
                "handover {} of node {} ({} -> {}) at {}",
                h.id,
                h.node,
                h.source_group,
                h.target_group,
                h.step.as_str_name()
            ));
        }
        for m in self.states.claims.moves().active.values() {
            busy.push(format!(
                "application move {} of {}/{} to {}",
                m.id, m.workload.namespace, m.workload.name, m.target_group
            ));
        }
        for (id, done) in &self.rollbacks {
            if !done {
                busy.push(format!("rollback {id}"));
            }
        }
        for m in self.states.claims.migrations().active.values() {
            if m.paused.is_none() {
                busy.push(format!(
                    "migration {} ({} -> {}): `switchyard migrate pause --id {}` stops it between steps",
                    m.plan.migration_id, m.plan.source_group, m.plan.target_group, m.plan.migration_id
                ));
            }
        }
        busy
    }

    fn stack_name(stack: Option<Stack>) -> &'static str {
        match stack {
            Some(Stack::DevicePlugin) => "device-plugin",
            Some(Stack::Dra) => "dra",
            _ => "none",
        }
    }

    /// Nodes per group and stack.
    pub fn nodes_by_group(&self) -> BTreeMap<String, BTreeMap<&'static str, Vec<String>>> {
        let mut groups: BTreeMap<String, BTreeMap<&'static str, Vec<String>>> = BTreeMap::new();
        for (name, node) in &self.states.stack.cluster().nodes {
            let group = node.group().unwrap_or("(none)").to_string();
            let stack = Self::stack_name(self.states.stack.stack_of(name));
            groups
                .entry(group)
                .or_default()
                .entry(stack)
                .or_default()
                .push(name.clone());
        }
        groups
    }

    pub fn to_json(&self) -> Value {
        let handovers: Vec<Value> = self
            .states
            .stack
            .handovers()
            .active
            .values()
            .map(|h| {
                let blocked: Vec<Value> = self
                    .blocked_evictions(h)
                    .into_iter()
                    .map(|(pod, why)| json!({"pod": pod, "refused": why}))
                    .collect();
                json!({"id": h.id, "node": h.node, "from": h.source_group, "to": h.target_group,
                       "step": h.step.as_str_name(), "stalled": h.stalled, "rollback": h.rollback.is_some(),
                       "evictions_refused": blocked})
            })
            .collect();
        let switches_held: Vec<Value> = self
            .states
            .stack
            .switch_holds()
            .iter()
            .map(|(node, claims)| json!({"node": node, "claims": claims}))
            .collect();
        let moves: Vec<Value> = self
            .states
            .claims
            .moves()
            .active
            .values()
            .map(|m| json!({"id": m.id, "workload": format!("{}/{}", m.workload.namespace, m.workload.name), "to": m.target_group, "rollback": m.compensates.is_some()}))
            .collect();
        json!({
            "last_sequence": self.last_sequence,
            "events": self.events,
            "nodes_by_group": self.nodes_by_group(),
            "held_groups": self.states.stack.held(),
                        "alerts": self.states.alerter.firing().iter().map(|((name, l), summary)| json!({"alert": name, "labels": labels(l), "summary": summary})).collect::<Vec<_>>(),
            "handovers_in_progress": handovers,
            "stack_switches_held": switches_held,
            "handovers_completed": self.states.stack.handovers().completed.len(),
            "moves_in_progress": moves,
            "moves_verified": self.states.claims.moves().verified.iter().map(|((ns, _, name), id)| json!({"workload": format!("{ns}/{name}"), "move": id.id})).collect::<Vec<_>>(),
            "rollbacks": self.rollbacks,
            "migrations": self.migrations_json(),
            "evidence": self.evidence.iter().map(|(id, c)| json!({"check": id, "migration": c.migration_id, "nodes": c.nodes, "workloads": c.workloads, "failed": c.failed})).collect::<Vec<_>>(),
            "undecodable_events": self.undecodable,
            "malformed_records": self.malformed,
        })
    }

    fn migrations_json(&self) -> Vec<Value> {
        let migrations = self.states.claims.migrations();
        let active = migrations.active.values().map(|m| (m, false));
        let ended = migrations.ended.values().map(|m| (m, true));
        active
            .chain(ended)
            .map(|(m, ended)| {
                let wave = m.wave.and_then(|w| m.plan.waves.get(w as usize));
                json!({
                    "id": m.plan.migration_id,
                    "from": m.plan.source_group,
                    "to": m.plan.target_group,
                    "class": m.plan.gpu_class,
                    "waves": m.plan.waves.len(),
                    "waves_started": m.next,
                    "wave_in_progress": m.wave.map(|w| w + 1),
                    "nodes_handed_over": m.handed_over.len(),
                    "nodes_in_wave": wave.map_or(0, |w| w.nodes.len()),
                    "workloads_moved": m.moved.len(),
                    "workloads_in_wave": wave.map_or(0, |w| w.workloads.len()),
                    "paused": m.paused,
                    "ended": ended,
                })
            })
            .collect()
    }

    /// The migrations' lines of the status table.
    fn migration_lines(&self) -> Vec<String> {
        let migrations = self.states.claims.migrations();
        let mut lines = Vec::new();
        for m in migrations.active.values() {
            let p = &m.plan;
            let at = match m.wave.and_then(|w| p.waves.get(w as usize).map(|x| (w, x))) {
                Some((w, wave)) => format!(
                    "wave {} of {}: {}/{} nodes handed over, {}/{} workloads moved",
                    w + 1,
                    p.waves.len(),
                    m.handed_over.len(),
                    wave.nodes.len(),
                    m.moved.len(),
                    wave.workloads.len()
                ),
                None => format!("{} of {} waves done", m.next, p.waves.len()),
            };
            let paused = m
                .paused
                .as_ref()
                .map_or(String::new(), |why| format!("; paused: {why}"));
            lines.push(format!(
                "migration {}: {} -> {} (class {}), {at}{paused}",
                p.migration_id, p.source_group, p.target_group, p.gpu_class
            ));
        }
        for m in migrations.ended.values() {
            lines.push(format!(
                "migration {}: ended after {} of {} waves",
                m.plan.migration_id,
                m.next,
                m.plan.waves.len()
            ));
        }
        for (id, c) in &self.evidence {
            lines.push(format!(
                "evidence {id}: {} node(s), {} workload(s), {}",
                c.nodes,
                c.workloads,
                if c.failed == 0 {
                    "all passed".to_string()
                } else {
                    format!(
                        "{} FAILED (`switchyard log show` has each record)",
                        c.failed
                    )
                }
            ));
        }
        lines
    }

    pub fn render_table(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        writeln!(
            out,
            "as of sequence {} ({} events)",
            self.last_sequence, self.events
        )
        .unwrap();
        writeln!(out).unwrap();
        writeln!(out, "{:<16} {:<14} {:>5}  NODES", "GROUP", "STACK", "COUNT").unwrap();
        for (group, stacks) in self.nodes_by_group() {
            for (stack, nodes) in stacks {
                writeln!(
                    out,
                    "{group:<16} {stack:<14} {:>5}  {}",
                    nodes.len(),
                    nodes.join(", ")
                )
                .unwrap();
            }
        }
        writeln!(out).unwrap();
        let held: Vec<&str> = self
            .states
            .stack
            .held()
            .iter()
            .map(String::as_str)
            .collect();
        writeln!(
            out,
            "held on DRA: {}",
            if held.is_empty() {
                "none".to_string()
            } else {
                held.join(", ")
            }
        )
        .unwrap();
        if self.states.alerter.firing().is_empty() {
            writeln!(out, "alerts: none firing").unwrap();
        }
        for (name, alert_labels) in self.states.alerter.firing().keys() {
            let labels = labels(alert_labels);
            writeln!(out, "alert firing: {name} {{{labels}}}").unwrap();
        }
        writeln!(
            out,
            "handovers: {} completed, {} in progress",
            self.states.stack.handovers().completed.len(),
            self.states.stack.handovers().active.len()
        )
        .unwrap();
        for h in self.states.stack.handovers().active.values() {
            let stalled = if h.stalled { " (stalled)" } else { "" };
            writeln!(
                out,
                "  {} {} {} -> {} at {}{stalled}",
                h.id,
                h.node,
                h.source_group,
                h.target_group,
                h.step.as_str_name()
            )
            .unwrap();
            // The drain's refusals, as soon as they are recorded: no need to
            // wait for the stall deadline to learn which budget keeps a pod.
            for (pod, why) in self.blocked_evictions(h) {
                writeln!(out, "    eviction of {pod} refused: {why}").unwrap();
            }
        }
        for (node, claims) in self.states.stack.switch_holds() {
            writeln!(
                out,
                "stack switch held: {node} stays on DRA while claims are allocated on it: {}; drain it first",
                claims.join(", ")
            )
            .unwrap();
        }
        writeln!(
            out,
            "application moves: {} verified, {} in progress",
            self.states.claims.moves().verified.len(),
            self.states.claims.moves().active.len()
        )
        .unwrap();
        for line in self.migration_lines() {
            writeln!(out, "{line}").unwrap();
        }
        for (id, done) in &self.rollbacks {
            writeln!(
                out,
                "rollback {id}: {}",
                if *done { "completed" } else { "in progress" }
            )
            .unwrap();
        }
        let newer = self.undecodable - self.malformed;
        if newer > 0 {
            writeln!(out, "{newer} events kept raw (written by a newer version)").unwrap();
        }
        if self.malformed > 0 {
            writeln!(
                out,
                "{} records passed over: no envelope of the log (published on its subjects by something other than Switchyard)",
                self.malformed
            )
            .unwrap();
        }
        out
    }
}

fn labels(labels: &BTreeMap<String, String>) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

#[derive(Args, Debug)]
pub struct StateArgs {
    #[command(flatten)]
    pub backend: Backend,
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table, env = "SWITCHYARD_OUTPUT")]
    pub output: Output,
}

#[derive(Args, Debug)]
pub struct StatusArgs {
    #[command(flatten)]
    pub state: StateArgs,
    /// Exit 1, naming each, while a handover, an application move, a
    /// rollback or a running migration is in flight (the state is printed
    /// first): the chart's pre-delete hook, so that `helm uninstall` never
    /// stops the services with a node half-switched.
    #[arg(long, env = "SWITCHYARD_REQUIRE_IDLE")]
    pub require_idle: bool,
}

#[derive(Args, Debug)]
pub struct ReplayArgs {
    #[command(flatten)]
    pub state: StateArgs,
    /// Fold the log up to and including this sequence.
    #[arg(long)]
    pub until: u64,
}

/// `switchyard status`: the state now, and with `--require-idle` exit 1
/// while something is in flight.
pub async fn current(args: StatusArgs) -> anyhow::Result<ExitCode> {
    let folded = status_of(&args.state, None).await?;
    if !args.require_idle {
        return Ok(ExitCode::SUCCESS);
    }
    let busy = folded.in_flight();
    if busy.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    for line in &busy {
        eprintln!("in flight: {line}");
    }
    eprintln!(
        "refused: {} process(es) in flight; let them finish (`switchyard status`), or roll them back, then try again",
        busy.len()
    );
    Ok(ExitCode::FAILURE)
}

/// `switchyard replay --until SEQ`.
pub async fn replay(args: ReplayArgs) -> anyhow::Result<ExitCode> {
    status_of(&args.state, Some(args.until)).await?;
    Ok(ExitCode::SUCCESS)
}

/// Prints the state as of `until` (everything when `None`); what was folded.
async fn status_of(args: &StateArgs, until: Option<u64>) -> anyhow::Result<Folded> {
    let log = open(&args.backend).await?;
    let last = log.last_sequence(None).await?;
    if let Some(until) = until
        && until > last
    {
        anyhow::bail!("--until {until}: the log ends at sequence {last}");
    }
    let folded = Folded::read(log.as_ref(), until).await?;
    let text = match args.output {
        Output::Json => format!("{}\n", folded.to_json()),
        Output::Table => folded.render_table(),
    };
    write_stdout(&text)?;
    Ok(folded)
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchyard_proto::v1::{
        EvictionBlocked, GpuSharing, GpuSpec, HandoverStarted, ModuleSettingsObserved,
        NodeCordoned, NodeGroupObserved, NodeObserved, PodObserved, PodPhase, PodRef,
        ResourceClaimObserved, StackAssigned, StackSwitchHeld, WorkloadRef, event,
    };

    #[test]
    fn status_shows_the_refused_evictions_at_once_and_the_held_switches() {
        let mut folded = Folded::default();
        let pod = PodRef {
            namespace: "apps".into(),
            name: "web-1".into(),
            owner: None,
        };
        for e in [
            event(Kind::ModuleSettingsObserved(ModuleSettingsObserved {
                dra_enabled: true,
                feature_gates_ready: true,
                ..Default::default()
            })),
            event(Kind::NodeGroupObserved(NodeGroupObserved {
                group: "gpu".into(),
                gpu: Some(GpuSpec {
                    sharing: GpuSharing::Exclusive as i32,
                    ..Default::default()
                }),
                ..Default::default()
            })),
            event(Kind::NodeObserved(NodeObserved {
                node: "w1".into(),
                labels: [("node.deckhouse.io/group".to_string(), "gpu".to_string())].into(),
                unschedulable: true,
                ..Default::default()
            })),
            event(Kind::PodObserved(PodObserved {
                namespace: "apps".into(),
                name: "web-1".into(),
                node: "w1".into(),
                owner: Some(WorkloadRef {
                    namespace: "apps".into(),
                    kind: "Deployment".into(),
                    name: "web".into(),
                }),
                phase: PodPhase::Running as i32,
                ..Default::default()
            })),
            event(Kind::HandoverStarted(HandoverStarted {
                handover_id: "h1".into(),
                node: "w1".into(),
                source_group: "gpu".into(),
                target_group: "gpu-dra".into(),
                ..Default::default()
            })),
            event(Kind::NodeCordoned(NodeCordoned {
                handover_id: "h1".into(),
                node: "w1".into(),
                was_unschedulable: false,
                to_evict: vec![pod],
            })),
            event(Kind::EvictionBlocked(EvictionBlocked {
                node: "w1".into(),
                namespace: "apps".into(),
                pod: "web-1".into(),
                reason: "Cannot evict pod as it would violate the pod's disruption budget.".into(),
                disruption_budgets: vec!["apps/web".into()],
            })),
            event(Kind::StackAssigned(StackAssigned {
                node: "n1".into(),
                group: "gpu-x".into(),
                stack: Stack::Dra as i32,
                ..Default::default()
            })),
            event(Kind::ResourceClaimObserved(ResourceClaimObserved {
                namespace: "ml".into(),
                name: "train-0-gpu".into(),
                node: "n1".into(),
                ..Default::default()
            })),
            event(Kind::StackSwitchHeld(StackSwitchHeld {
                node: "n1".into(),
                group: "gpu-x".into(),
                stack: Stack::DevicePlugin as i32,
                claims: vec!["ml/train-0-gpu".into()],
                reason: String::new(),
            })),
        ] {
            // One second in: long before the drain's stall deadline.
            folded.apply(&e, 1_000_000_000);
        }
        let table = folded.render_table();
        assert!(
            table.contains("eviction of apps/web-1 refused: Cannot evict pod as it would violate the pod's disruption budget. (PodDisruptionBudget apps/web)"),
            "{table}"
        );
        assert!(
            table.contains("stack switch held: n1 stays on DRA while claims are allocated on it: ml/train-0-gpu"),
            "{table}"
        );
        let json = folded.to_json();
        assert_eq!(
            json["handovers_in_progress"][0]["evictions_refused"][0]["pod"],
            "apps/web-1"
        );
        assert_eq!(
            json["stack_switches_held"][0]["claims"][0],
            "ml/train-0-gpu"
        );
        // What `status --require-idle` refuses on: the handover, by id and node.
        let busy = folded.in_flight();
        assert_eq!(busy.len(), 1, "{busy:?}");
        assert!(
            busy[0].starts_with("handover h1 of node w1 (gpu -> gpu-dra) at "),
            "{busy:?}"
        );
    }

    #[test]
    fn status_shows_the_migrations_where_they_are_and_the_evidence_checks() {
        use switchyard_proto::v1::{
            EvidenceChecked, MigrationPaused, MigrationStarted, PlannedWave, WaveStarted,
        };
        let web = WorkloadRef {
            namespace: "apps".into(),
            kind: "Deployment".into(),
            name: "web".into(),
        };
        let mut folded = Folded::default();
        for e in [
            event(Kind::MigrationStarted(MigrationStarted {
                migration_id: "mig-1".into(),
                source_group: "gpu".into(),
                target_group: "gpu-dra".into(),
                gpu_class: "a100".into(),
                max_unavailable: 1,
                waves: vec![
                    PlannedWave {
                        nodes: vec!["w1".into()],
                        workloads: vec![web.clone()],
                    },
                    PlannedWave {
                        nodes: vec!["w2".into()],
                        workloads: Vec::new(),
                    },
                ],
                ..Default::default()
            })),
            event(Kind::WaveStarted(WaveStarted {
                migration_id: "mig-1".into(),
                wave: 0,
                nodes: vec!["w1".into()],
                workloads: vec![web],
                target_group: "gpu-dra".into(),
            })),
            event(Kind::MigrationPaused(MigrationPaused {
                migration_id: "mig-1".into(),
                wave: 0,
                reason: "asked by the operator".into(),
                tripped: false,
            })),
            event(Kind::EvidenceChecked(EvidenceChecked {
                check_id: "ev-1".into(),
                nodes: 2,
                workloads: 1,
                failed: 1,
                ..Default::default()
            })),
        ] {
            folded.apply(&e, 1_000_000_000);
        }
        let table = folded.render_table();
        for line in [
            "migration mig-1: gpu -> gpu-dra (class a100), wave 1 of 2: 0/1 nodes handed over, 0/1 workloads moved; paused: asked by the operator",
            "evidence ev-1: 2 node(s), 1 workload(s), 1 FAILED",
        ] {
            assert!(table.contains(line), "{line:?} missing from\n{table}");
        }
        // Paused by the operator: at rest between steps, not in flight.
        assert_eq!(folded.in_flight(), Vec::<String>::new());
        let json = folded.to_json();
        assert_eq!(json["migrations"][0]["wave_in_progress"], 1);
        assert_eq!(json["evidence"][0]["failed"], 1);
    }
}

//! The stack-assigner core: which stack serves each node, and the upgrade hold.
//!
//! The rules (reference: "How the stacks are split across nodes"):
//! - a node of a group with `spec.gpu` is served by the device plugin, unless
//!   the group is held on DRA after the module upgrade;
//! - with `dra.enabled`, every other node is served by DRA, except control-plane
//!   nodes and nodes labelled `gpu.deckhouse.io/enabled=false` (and while the
//!   DRA feature gates are not ready);
//! - otherwise no stack manages the node: its cards sit idle.
//!
//! The upgrade hold (reference: "If DRA was enabled before the module upgrade"):
//! on the first run of this version in a cluster that was upgraded with
//! `dra.enabled` on, every group that has `spec.gpu` is held on DRA (the
//! alerter fires `D8GpuNodeGroupHeldOnDra` for it). Removing `spec.gpu` releases the group
//! (it stays on DRA, the alert clears); turning `dra.enabled` off releases all;
//! setting `spec.gpu` again after the release moves the group to the device plugin.
//!
//! Two guards ("drain first"): a node the rules move from DRA to the device
//! plugin while DRA claims are allocated on it keeps its stack
//! (`StackSwitchHeld`, naming the claims, and a Kubernetes Event on the Node)
//! until they are gone; and the last device-plugin node is not handed over
//! while `nvidia.com/gpu` workloads still need it, unless the command says
//! `force` (`HandoverRefused` names the workloads that would go Pending).
//!
//! Which pods the readiness condition counts as the node agent and the
//! vendor adapter comes from the service's flags, recorded in the log
//! (`ReadinessSelectorsConfigured`) when they differ from the last record, so
//! a replay decides the same whatever flags it runs with.

use crate::backend::dispatch::strategy;
use std::collections::{BTreeMap, BTreeSet};

use switchyard_proto::v1::{
    DomainEvent, ExclusivityLost, ExclusivityRestored, HandoverRefused, NodeGroupHeldOnDra,
    NodeGroupReleased, ReleaseReason, Stack, StackAssigned, StackReason, StackSwitchHeld,
    WorkloadRef, domain_event::Kind, event,
};

pub mod handover;

pub use handover::Handover;

use crate::backend::Backend;
use crate::cluster::{Cluster, ReadinessSelectors};
use crate::command::{StartHandover, wave_handover_id};
use crate::effects::Effect;
use crate::joined;
use crate::stack_rules::rule;
use handover::Handovers;

/// The stack serving a node and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assignment {
    pub group: String,
    pub stack: Stack,
    pub reason: StackReason,
}

/// What the stack-assigner knows: the cluster facts, the held groups, the
/// stack it last decided for each node, and the node handovers.
#[derive(Clone, Debug, PartialEq)]
pub struct StackAssigner {
    pub(crate) cluster: Cluster,
    pub(crate) held: BTreeSet<String>,
    /// Groups the first run's upgrade hold covers whose hold is not in the log
    /// yet, with the module version that took it: decided right after the
    /// first settings observation, or on a restart that finds it missing
    /// (the settings were recorded before this service started, or it stopped
    /// before recording its decisions).
    pub(crate) holds_due: BTreeMap<String, String>,
    pub(crate) assignments: BTreeMap<String, Assignment>,
    pub(crate) handovers: Handovers,
    /// Handovers a migration's wave asks for (`WaveStarted`, decided by the
    /// claim-allocator) that are not started or refused yet, by handover id,
    /// with the workloads the wave moves once its nodes are handed over.
    pub(crate) waves_due: BTreeMap<String, (StartHandover, Vec<WorkloadRef>)>,
    /// Workloads asking for `nvidia.com/gpu` with at least one replica: what
    /// the last device-plugin node serves. Their namespace, kind and name
    /// [`joined`](crate::joined): one allocation each, as tens of thousands are held.
    pub(crate) device_plugin_workloads: BTreeSet<Box<str>>,
    /// Nodes whose switch to the device plugin is held, with the claims
    /// allocated on them as last recorded (`StackSwitchHeld`).
    pub(crate) switch_holds: BTreeMap<String, Vec<String>>,
    /// The readiness selectors this service was started with (its flags);
    /// recorded when they differ from the log's. Not folded.
    pub(crate) configured: Option<ReadinessSelectors>,
    /// The backend this service was started with (its flags); recorded when
    /// it differs from the log's. Not folded.
    pub(crate) configured_backend: Option<Backend>,
    /// nvidia-operator: DRA nodes whose exclusivity gate failed
    /// (`ExclusivityLost`), with whether Switchyard cordoned them and what
    /// was seen.
    pub(crate) exclusivity_lost: BTreeMap<String, (bool, String)>,
    /// Nodes Switchyard cordoned for a lost gate that holds again, until
    /// they read schedulable.
    pub(crate) uncordon_due: BTreeSet<String>,
}

impl Default for StackAssigner {
    fn default() -> Self {
        StackAssigner {
            // This core never asks for a workload's pods.
            cluster: Cluster::without_owner_index(),
            held: BTreeSet::new(),
            holds_due: BTreeMap::new(),
            assignments: BTreeMap::new(),
            handovers: Handovers::default(),
            waves_due: BTreeMap::new(),
            device_plugin_workloads: BTreeSet::new(),
            switch_holds: BTreeMap::new(),
            configured: None,
            configured_backend: None,
            exclusivity_lost: BTreeMap::new(),
            uncordon_due: BTreeSet::new(),
        }
    }
}

/// An input of the stack-assigner.
#[derive(Clone, Copy, Debug)]
pub enum Input<'a> {
    /// A fact, already in the log.
    Fact(&'a DomainEvent),
    /// Time passed (deadlines).
    Tick,
    /// An operator asks for a node handover.
    StartHandover(&'a StartHandover),
    /// A node rollback planned by `rollback::plan_node_rollback`.
    Rollback(&'a DomainEvent),
}

/// Most step decisions one input can cascade into for one node (a node that
/// is already cordoned and empty moves through two steps at once).
const MAX_CASCADE: usize = 8;

impl StackAssigner {
    // Read-only views: what the alerter, `status`, `/metrics`, doctor and
    // the checks read. The state itself is the core's own.

    /// The cluster as this core has folded it.
    pub fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    /// The node groups held on DRA.
    pub fn held(&self) -> &BTreeSet<String> {
        &self.held
    }

    /// The stack last decided for each node, by node.
    pub fn assignments(&self) -> &BTreeMap<String, Assignment> {
        &self.assignments
    }

    /// The node handovers, active and completed.
    pub fn handovers(&self) -> &Handovers {
        &self.handovers
    }

    /// Nodes whose switch to the device plugin is held, with the claims
    /// allocated on them.
    pub fn switch_holds(&self) -> &BTreeMap<String, Vec<String>> {
        &self.switch_holds
    }

    /// nvidia-operator: DRA nodes whose exclusivity gate failed, with
    /// whether Switchyard cordoned them and what was seen.
    pub fn exclusivity_lost(&self) -> &BTreeMap<String, (bool, String)> {
        &self.exclusivity_lost
    }

    /// What the log decides: this state without the configuration the
    /// service was started with (its flags, which a replay does not have).
    pub fn decided(mut self) -> Self {
        self.configured = None;
        self.configured_backend = None;
        self
    }

    /// Folds any event of the log: facts and this core's own decisions.
    /// `at` is the event's recorded time.
    pub fn apply(&mut self, event: &DomainEvent, at: i64) {
        self.apply_own(event, at);
        self.track_holds_due(event);
        self.track_waves_due(event);
        self.track_device_plugin_workloads(event);
        if Self::needs(event) {
            self.cluster.apply(event);
        }
    }

    /// [`Self::apply`] for an event the caller owns (a replay): facts are moved in.
    pub fn apply_owned(&mut self, event: DomainEvent, at: i64) {
        self.apply_own(&event, at);
        self.track_holds_due(&event);
        self.track_waves_due(&event);
        self.track_device_plugin_workloads(&event);
        if Self::needs(&event) {
            self.cluster.apply_owned(event);
        }
    }

    /// Keeps [`Self::waves_due`]: a wave's handovers are due until each is
    /// started or refused, or the migration is aborted.
    fn track_waves_due(&mut self, event: &DomainEvent) {
        match &event.kind {
            Some(Kind::WaveStarted(wave)) => {
                for node in &wave.nodes {
                    let id = wave_handover_id(&wave.migration_id, wave.wave, node);
                    let start = StartHandover {
                        handover_id: id.clone(),
                        node: node.clone(),
                        target_group: wave.target_group.clone(),
                        force: false,
                    };
                    self.waves_due.insert(id, (start, wave.workloads.clone()));
                }
            }
            Some(Kind::HandoverStarted(started)) => {
                self.waves_due.remove(&started.handover_id);
            }
            Some(Kind::HandoverRefused(refused)) => {
                self.waves_due.retain(|_, (h, _)| h.node != refused.node);
            }
            Some(Kind::MigrationAborted(aborted)) => {
                let prefix = format!("{}/", aborted.migration_id);
                self.waves_due.retain(|id, _| !id.starts_with(&prefix));
            }
            _ => {}
        }
    }

    /// Starts the handovers migrations' waves ask for. The last device-plugin
    /// node goes only if the workloads it leaves without one are all moved by
    /// the wave right after (the reference's order: the node first).
    fn start_waves_due(&mut self, now: i64, out: &mut Vec<DomainEvent>) -> Vec<String> {
        let due: Vec<(StartHandover, Vec<WorkloadRef>)> =
            self.waves_due.values().cloned().collect();
        let mut nodes = Vec::new();
        for (mut cmd, moved) in due {
            cmd.force = self
                .would_go_pending(&cmd.node, &cmd.target_group)
                .iter()
                .all(|w| moved.contains(w));
            let decisions = self.handovers.start(&self.cluster, &self.held, &cmd);
            self.fold(decisions, now, out);
            nodes.push(cmd.node);
        }
        nodes
    }

    /// A started service with these readiness selectors (its flags).
    pub fn with_selectors(selectors: ReadinessSelectors) -> Self {
        StackAssigner {
            configured: Some(selectors),
            ..StackAssigner::default()
        }
    }

    /// The same service on `backend` (its `--backend` flags).
    pub fn on_backend(self, backend: Backend) -> Self {
        StackAssigner {
            configured_backend: Some(backend),
            ..self
        }
    }

    /// Keeps [`Self::device_plugin_workloads`]: only the workloads that ask
    /// for `nvidia.com/gpu` and have replicas.
    fn track_device_plugin_workloads(&mut self, event: &DomainEvent) {
        if let Some(Kind::WorkloadObserved(w)) = &event.kind
            && let Some(workload) = &w.workload
        {
            let key = joined::join(&[&workload.namespace, &workload.kind, &workload.name]);
            let asks = w
                .placement
                .as_ref()
                .is_some_and(crate::placement::requests_nvidia_gpu);
            if asks && w.replicas > 0 {
                self.device_plugin_workloads.insert(key);
            } else {
                self.device_plugin_workloads.remove(&key);
            }
        }
        if let Some(Kind::WorkloadRemoved(w)) = &event.kind
            && let Some(workload) = &w.workload
        {
            self.device_plugin_workloads.remove(&*joined::join(&[
                &workload.namespace,
                &workload.kind,
                &workload.name,
            ]));
        }
    }

    /// The `nvidia.com/gpu` workloads that would go Pending if `node` left
    /// the device plugin for `target_group`: all of them when it is the last
    /// device-plugin node (others being handed away from it not counted).
    pub fn would_go_pending(&self, node: &str, target_group: &str) -> Vec<WorkloadRef> {
        if self.stack_of(node) != Some(Stack::DevicePlugin) {
            return Vec::new();
        }
        let leaves = |name: &str, group: &str| {
            let Some(facts) = self.cluster.nodes.get(name) else {
                return true;
            };
            let moved =
                handover::stack_in_group(&self.cluster, facts, group, self.held.contains(group));
            moved.0 != Stack::DevicePlugin
        };
        if !leaves(node, target_group) {
            return Vec::new();
        }
        let others = self.assignments.iter().any(|(name, a)| {
            name != node
                && a.stack == Stack::DevicePlugin
                && self
                    .handovers
                    .active
                    .get(name)
                    .is_none_or(|h| !leaves(name, &h.target_group))
        });
        if others {
            return Vec::new();
        }
        self.device_plugin_workloads
            .iter()
            .map(|key| {
                let mut parts = joined::split(key);
                let mut part = || parts.next().unwrap_or_default().into_owned();
                WorkloadRef {
                    namespace: part(),
                    kind: part(),
                    name: part(),
                }
            })
            .collect()
    }

    /// Keeps [`Self::holds_due`]; called before the cluster folds `event`.
    /// The first settings observation of an upgraded cluster with DRA on makes
    /// every group with spec.gpu due; a recorded hold, a group that loses
    /// spec.gpu or is deleted, or DRA turned off settles it (a release would
    /// have followed the hold at once).
    fn track_holds_due(&mut self, event: &DomainEvent) {
        match &event.kind {
            Some(Kind::ModuleSettingsObserved(settings)) => {
                let first = self.cluster.module.observations == 0;
                let upgraded = !settings.previous_module_version.is_empty();
                if first && upgraded && settings.dra_enabled {
                    for (group, spec) in &self.cluster.groups {
                        if spec.gpu.is_some() && !self.held.contains(group) {
                            self.holds_due
                                .insert(group.clone(), settings.module_version.clone());
                        }
                    }
                }
                if !settings.dra_enabled {
                    self.holds_due.clear();
                }
            }
            Some(Kind::NodeGroupObserved(fact)) if fact.gpu.is_none() => {
                self.holds_due.remove(&fact.group);
            }
            Some(Kind::NodeGroupRemoved(fact)) => {
                self.holds_due.remove(&fact.group);
            }
            Some(Kind::NodeGroupHeldOnDra(decision)) => {
                self.holds_due.remove(&decision.group);
            }
            _ => {}
        }
    }

    /// The releases of the groups of `held` the facts release — DRA turned
    /// off, the group deleted, or its spec.gpu removed — as decisions, taken
    /// out of `held`.
    fn due_releases(&self, held: &mut BTreeSet<String>) -> Vec<DomainEvent> {
        let released: Vec<(String, ReleaseReason)> = held
            .iter()
            .filter_map(|group| {
                let reason = if !self.cluster.module.dra_enabled {
                    ReleaseReason::DraDisabled
                } else {
                    match self.cluster.groups.get(group) {
                        None => ReleaseReason::GroupDeleted,
                        Some(spec) if spec.gpu.is_none() => ReleaseReason::SpecGpuRemoved,
                        Some(_) => return None,
                    }
                };
                Some((group.clone(), reason))
            })
            .collect();
        released
            .into_iter()
            .map(|(group, reason)| {
                held.remove(&group);
                event(Kind::NodeGroupReleased(NodeGroupReleased {
                    group,
                    reason: reason as i32,
                }))
            })
            .collect()
    }

    /// The holds due, as decisions, added to `held`.
    fn due_holds(&self, held: &mut BTreeSet<String>) -> Vec<DomainEvent> {
        // The upgrade hold is the Deckhouse module's (its NodeGroups' spec.gpu).
        if !strategy(&self.cluster.backend).holds_upgrades() {
            return Vec::new();
        }
        self.holds_due
            .iter()
            .filter(|(group, _)| held.insert((*group).clone()))
            .map(|(group, module_version)| {
                event(Kind::NodeGroupHeldOnDra(NodeGroupHeldOnDra {
                    group: group.clone(),
                    module_version: module_version.clone(),
                }))
            })
            .collect()
    }

    /// The facts this core keeps: not workloads, quotas or GPU classes, which
    /// only the claim-allocator reads.
    fn needs(event: &DomainEvent) -> bool {
        !matches!(
            event.kind,
            Some(
                Kind::WorkloadObserved(_)
                    | Kind::WorkloadRemoved(_)
                    | Kind::ResourceQuotaObserved(_)
                    | Kind::GpuClassObserved(_)
            )
        )
    }

    /// The part of a fold that concerns this core's own decisions.
    fn apply_own(&mut self, event: &DomainEvent, at: i64) {
        self.handovers.apply(event, at);
        let Some(kind) = &event.kind else { return };
        match kind {
            Kind::NodeRemoved(fact) => {
                self.assignments.remove(&fact.node);
                self.switch_holds.remove(&fact.node);
                self.exclusivity_lost.remove(&fact.node);
                self.uncordon_due.remove(&fact.node);
            }
            Kind::StackSwitchHeld(decision) => {
                self.switch_holds
                    .insert(decision.node.clone(), decision.claims.clone());
            }
            Kind::ExclusivityLost(decision) => {
                // Lost again before the uncordon took: the cordon stays ours.
                self.uncordon_due.remove(&decision.node);
                self.exclusivity_lost.insert(
                    decision.node.clone(),
                    (decision.cordoned_by_switchyard, decision.evidence.clone()),
                );
            }
            Kind::ExclusivityRestored(decision) => {
                self.exclusivity_lost.remove(&decision.node);
                if decision.uncordon {
                    self.uncordon_due.insert(decision.node.clone());
                }
            }
            Kind::NodeObserved(fact) if !fact.unschedulable => {
                self.uncordon_due.remove(&fact.node);
            }
            Kind::StackAssigned(decision) => {
                self.switch_holds.remove(&decision.node);
                let assignment = Assignment {
                    group: decision.group.clone(),
                    stack: decision.stack(),
                    reason: decision.reason(),
                };
                match self.assignments.get_mut(&decision.node) {
                    Some(known) => *known = assignment,
                    None => {
                        self.assignments.insert(decision.node.clone(), assignment);
                    }
                }
            }
            Kind::NodeGroupHeldOnDra(decision) => {
                self.held.insert(decision.group.clone());
            }
            Kind::NodeGroupReleased(decision) => {
                self.held.remove(&decision.group);
            }
            _ => {}
        }
    }

    /// The stack and hold decisions implied by `fact`, which has just been applied.
    pub fn decide(&self, fact: &DomainEvent) -> Vec<DomainEvent> {
        let Some(kind) = &fact.kind else {
            return Vec::new();
        };
        let mut decisions = Vec::new();
        let mut held = self.held.clone();
        // Only the settings and the groups take or release holds.
        if matches!(
            kind,
            Kind::ModuleSettingsObserved(_)
                | Kind::NodeGroupObserved(_)
                | Kind::NodeGroupRemoved(_)
        ) {
            decisions.extend(self.due_holds(&mut held));
            decisions.extend(self.due_releases(&mut held));
        }
        let affected: Vec<&String> = match kind {
            Kind::ModuleSettingsObserved(_) => self.cluster.nodes.keys().collect(),
            Kind::NodeGroupObserved(fact) => self
                .cluster
                .members
                .get(&fact.group)
                .into_iter()
                .flatten()
                .collect(),
            Kind::NodeGroupRemoved(fact) => self
                .cluster
                .members
                .get(&fact.group)
                .into_iter()
                .flatten()
                .collect(),
            Kind::NodeObserved(fact) => self
                .cluster
                .nodes
                .get_key_value(&fact.node)
                .map(|(k, _)| k)
                .into_iter()
                .collect(),
            // A held switch goes ahead once the node's claims are gone.
            Kind::ResourceClaimObserved(_) | Kind::ResourceClaimRemoved(_) => {
                self.switch_holds.keys().collect()
            }
            _ => Vec::new(),
        };
        decisions.extend(
            affected
                .into_iter()
                .filter_map(|name| self.assignment_decision(name, &held)),
        );
        decisions
    }

    /// `StackAssigned` for `node` if the rules give another stack, reason or
    /// group than decided so far. Nothing before the module settings are
    /// known: until then whether DRA is on, and which groups the upgrade holds
    /// on it, is not known either, and a guess could move a held node to the
    /// device plugin with its claims.
    fn assignment_decision(&self, name: &str, held: &BTreeSet<String>) -> Option<DomainEvent> {
        if self.cluster.module.observations == 0 {
            return None;
        }
        let node = self.cluster.nodes.get(name)?;
        let group = node.group().unwrap_or_default();
        let (stack, reason) = rule(node, &self.cluster, held.contains(group));
        let previous = self.assignments.get(name);
        let unchanged =
            previous.is_some_and(|p| p.stack == stack && p.reason == reason && p.group == group);
        if unchanged {
            return None;
        }
        // Drain first: DRA claims allocated on the node keep it on DRA.
        let claims = self.cluster.claims_on(name);
        if stack == Stack::DevicePlugin
            && previous.is_some_and(|p| p.stack == Stack::Dra)
            && !claims.is_empty()
        {
            if self.switch_holds.get(name) == Some(&claims) {
                return None;
            }
            return Some(event(Kind::StackSwitchHeld(StackSwitchHeld {
                node: name.to_string(),
                group: group.to_string(),
                stack: stack as i32,
                reason: format!(
                    "node {name}: group {group} moves it to the device plugin, but DRA claims are allocated on it: {}; drain it first — the stack switches once they are gone",
                    claims.join(", ")
                ),
                claims,
            })));
        }
        Some({
            event(Kind::StackAssigned(StackAssigned {
                node: name.to_string(),
                group: group.to_string(),
                stack: stack as i32,
                previous_stack: previous.map_or(Stack::Unspecified, |p| p.stack) as i32,
                reason: reason as i32,
            }))
        })
    }

    /// What the service does with each input: fold a fact, decide, fold the
    /// decisions, and follow handovers as far as the facts allow. Returns the
    /// decisions, to be appended after the input (all recorded at `now`).
    pub fn handle(&mut self, input: Input<'_>, now: i64) -> Vec<DomainEvent> {
        let mut out = Vec::new();
        // A core that was not caught up (one started on an empty log, in
        // process) records its configuration before its first decision.
        self.record_configuration(now, &mut out);
        let nodes: Vec<String> = match input {
            Input::Fact(fact) => {
                // A pod's fact moves on only the handover of the node it was
                // on before the fact, or is on after it.
                let was_on = self.pod_node(fact);
                self.apply(fact, now);
                let decisions = self.decide(fact);
                self.fold(decisions, now, &mut out);
                let gate = self.exclusivity_decisions(fact, was_on.as_deref());
                self.fold(gate, now, &mut out);
                let mut nodes = self.handovers_touched_by(fact, was_on);
                if matches!(fact.kind, Some(Kind::WaveStarted(_))) {
                    nodes.extend(self.start_waves_due(now, &mut out));
                }
                nodes
            }
            Input::Tick => self.handovers.active.keys().cloned().collect(),
            Input::StartHandover(cmd) => {
                let mut decisions = self.handovers.start(&self.cluster, &self.held, cmd);
                let started = matches!(
                    decisions.first().and_then(|d| d.kind.as_ref()),
                    Some(Kind::HandoverStarted(_))
                );
                let pending = self.would_go_pending(&cmd.node, &cmd.target_group);
                if started && !cmd.force && !pending.is_empty() {
                    let names: Vec<String> = pending
                        .iter()
                        .map(|w| format!("{}/{}/{}", w.namespace, w.kind, w.name))
                        .collect();
                    decisions = vec![event(Kind::HandoverRefused(HandoverRefused {
                        node: cmd.node.clone(),
                        target_group: cmd.target_group.clone(),
                        reason: format!(
                            "node {} is the last device-plugin node and nvidia.com/gpu workloads still need it: {} would go Pending; move them first, or hand it over with force",
                            cmd.node,
                            names.join(", ")
                        ),
                        would_go_pending: pending,
                    }))];
                }
                self.fold(decisions, now, &mut out);
                vec![cmd.node.clone()]
            }
            Input::Rollback(started) => {
                let Some(Kind::RollbackStarted(r)) = &started.kind else {
                    return out;
                };
                let Some(back) = &r.node_restore else {
                    return out;
                };
                if let Some(h) = self.handovers.active.get(&back.node) {
                    out.push(event(Kind::HandoverRefused(HandoverRefused {
                        node: back.node.clone(),
                        target_group: back.target_group.clone(),
                        reason: format!(
                            "node {} is being handed over ({}, step {}); roll it back once that is done",
                            back.node,
                            h.id,
                            h.step.as_str_name()
                        ),
                        would_go_pending: Vec::new(),
                    })));
                    return out;
                }
                self.fold(vec![started.clone()], now, &mut out);
                vec![back.node.clone()]
            }
        };
        for node in nodes {
            for _ in 0..MAX_CASCADE {
                let decisions = self
                    .handovers
                    .decide_node(&self.cluster, &self.held, &node, now);
                if decisions.is_empty() {
                    break;
                }
                self.fold(decisions, now, &mut out);
            }
        }
        out
    }

    /// After a rebuild from the log: the decisions the log shows due but not
    /// recorded — facts recorded before this service started, or decisions a
    /// crash kept from being recorded: the upgrade holds due, a node whose
    /// decided stack is not what the rules give for the facts in the log, and
    /// the handovers' next steps. Empty when the log was complete.
    /// The readiness selectors and the backend this process was started
    /// with, recorded (and folded) where the log says otherwise.
    fn record_configuration(&mut self, now: i64, out: &mut Vec<DomainEvent>) {
        if let Some(wanted) = &self.configured
            && *wanted != self.cluster.selectors
        {
            let recorded = event(Kind::ReadinessSelectorsConfigured(wanted.to_event()));
            self.fold(vec![recorded], now, out);
        }
        if let Some(wanted) = &self.configured_backend
            && *wanted != self.cluster.backend
        {
            let recorded = event(Kind::BackendConfigured(wanted.to_event()));
            self.fold(vec![recorded], now, out);
        }
    }

    pub fn catch_up(&mut self, now: i64) -> Vec<DomainEvent> {
        let mut out = Vec::new();
        self.record_configuration(now, &mut out);
        let mut held = self.held.clone();
        let mut holds = self.due_holds(&mut held);
        holds.extend(self.due_releases(&mut held));
        self.fold(holds, now, &mut out);
        let decisions: Vec<DomainEvent> = self
            .cluster
            .nodes
            .keys()
            .filter_map(|name| self.assignment_decision(name, &self.held))
            .collect();
        self.fold(decisions, now, &mut out);
        let rollbacks = self.handovers.rollbacks_due();
        self.fold(rollbacks, now, &mut out);
        let nodes: Vec<String> = self.cluster.nodes.keys().cloned().collect();
        let gates = nodes
            .iter()
            .filter_map(|n| self.exclusivity_decision(n))
            .collect();
        self.fold(gates, now, &mut out);
        self.start_waves_due(now, &mut out);
        out.extend(self.handle(Input::Tick, now));
        out
    }

    /// [`Self::handle`] for a fact.
    pub fn handle_fact(&mut self, fact: &DomainEvent, now: i64) -> Vec<DomainEvent> {
        self.handle(Input::Fact(fact), now)
    }

    fn fold(&mut self, decisions: Vec<DomainEvent>, now: i64, out: &mut Vec<DomainEvent>) {
        for decision in decisions {
            self.apply(&decision, now);
            out.push(decision);
        }
    }

    /// The node the pod of a pod fact is on now, as folded so far.
    /// nvidia-operator: the exclusivity gate's decisions on the nodes `fact`
    /// touches (`was_on`: where the pod of a pod fact was before it).
    fn exclusivity_decisions(&self, fact: &DomainEvent, was_on: Option<&str>) -> Vec<DomainEvent> {
        if !strategy(&self.cluster.backend).gates_exclusivity() {
            return Vec::new();
        }
        let node = match &fact.kind {
            Some(Kind::NodeObserved(f)) => Some(f.node.as_str()),
            Some(Kind::PodObserved(f)) => Some(f.node.as_str()),
            Some(Kind::PodRemoved(_)) => was_on,
            _ => None,
        };
        node.and_then(|n| self.exclusivity_decision(n))
            .into_iter()
            .collect()
    }

    /// `ExclusivityLost` for `name` when the gate fails and was not known to,
    /// `ExclusivityRestored` when it holds again.
    fn exclusivity_decision(&self, name: &str) -> Option<DomainEvent> {
        let strategy = strategy(&self.cluster.backend);
        if !strategy.gates_exclusivity() {
            return None;
        }
        let node = self.cluster.nodes.get(name)?;
        let stack = self.assignments.get(name).map(|a| a.stack);
        let evidence = strategy.exclusivity_lost(name, stack, node, &self.cluster);
        match (evidence, self.exclusivity_lost.get(name)) {
            (Some(evidence), None) => Some(event(Kind::ExclusivityLost(ExclusivityLost {
                node: name.to_string(),
                evidence,
                // Schedulable, or still cordoned by Switchyard for the gate
                // lost before (its uncordon not seen yet).
                cordoned_by_switchyard: !node.unschedulable || self.uncordon_due.contains(name),
            }))),
            (None, Some((cordoned, _))) => {
                Some(event(Kind::ExclusivityRestored(ExclusivityRestored {
                    node: name.to_string(),
                    uncordon: *cordoned,
                })))
            }
            _ => None,
        }
    }

    fn pod_node(&self, fact: &DomainEvent) -> Option<String> {
        let key = match &fact.kind {
            Some(Kind::PodObserved(f)) => (f.namespace.clone(), f.name.clone()),
            Some(Kind::PodRemoved(f)) => (f.namespace.clone(), f.name.clone()),
            _ => return None,
        };
        self.cluster.pods.get(&key).map(|p| p.node.to_string())
    }

    /// Active handovers a fact may move on. A step reads its node, the
    /// node's pods and PhysicalGPUs, and the groups and module settings: a
    /// fact on one node or pod touches that node's handover only (`was_on`:
    /// where the pod of a pod fact was before it).
    fn handovers_touched_by(&self, fact: &DomainEvent, was_on: Option<String>) -> Vec<String> {
        let node = match &fact.kind {
            Some(Kind::NodeObserved(f)) => f.node.clone(),
            Some(Kind::NodeRemoved(f)) => f.node.clone(),
            Some(Kind::PhysicalGpuObserved(f)) => f.node.clone(),
            Some(Kind::PhysicalGpuRemoved(f)) => f.node.clone(),
            Some(Kind::PodObserved(f)) => {
                let mut nodes: Vec<String> = was_on
                    .into_iter()
                    .chain([f.node.clone()])
                    .filter(|n| self.handovers.active.contains_key(n))
                    .collect();
                nodes.dedup();
                return nodes;
            }
            Some(Kind::PodRemoved(_)) => {
                return was_on
                    .filter(|n| self.handovers.active.contains_key(n))
                    .into_iter()
                    .collect();
            }
            // nvidia-operator: the DRA driver's slices are a readiness gate.
            Some(Kind::ResourceSliceObserved(f)) => f.node.clone(),
            Some(Kind::ResourceSliceRemoved(f)) => f.node.clone(),
            // A claim released lets the device plugin back (a removed
            // claim names no node: every handover looks again).
            Some(
                Kind::NodeGroupObserved(_)
                | Kind::ModuleSettingsObserved(_)
                | Kind::ResourceClaimObserved(_)
                | Kind::ResourceClaimRemoved(_),
            ) => {
                return self.handovers.active.keys().cloned().collect();
            }
            _ => return Vec::new(),
        };
        if self.handovers.active.contains_key(&node) {
            vec![node]
        } else {
            Vec::new()
        }
    }

    /// What the edge should be doing: the gpu-stack label of every node as
    /// decided, and the steps of the handovers in progress.
    pub fn effects(&self) -> Vec<Effect> {
        // Both maps are sorted by node name: one pass over the nodes, no
        // lookups (this runs after every record).
        let strategy = strategy(&self.cluster.backend);
        let mut nodes = self.cluster.nodes.iter().peekable();
        let mut effects: Vec<Effect> = Vec::new();
        for (name, assignment) in &self.assignments {
            while nodes.next_if(|(n, _)| *n < name).is_some() {}
            let node = nodes.peek().filter(|(n, _)| *n == name).map(|(_, n)| *n);
            effects.extend(strategy.stack_effects(name, assignment.stack, node, &self.cluster));
        }
        effects.extend(self.switch_holds.iter().map(|(node, held)| {
            Effect::NodeEvent {
                node: node.clone(),
                reason: "StackSwitchHeld".into(),
                message: format!(
                    "Switchyard holds the switch to the device plugin while DRA claims are allocated on the node: {}. Drain the node; the stack switches once they are gone.",
                    held.join(", ")
                ),
            }
        }));
        if strategy.gates_exclusivity() {
            effects.extend(self.exclusivity_effects());
        }
        effects.extend(self.handovers.effects(&self.cluster.backend));
        effects
    }

    /// nvidia-operator: a node whose exclusivity gate failed is cordoned and
    /// says why in an Event; once it holds again, the node Switchyard
    /// cordoned is uncordoned.
    fn exclusivity_effects(&self) -> Vec<Effect> {
        let mut effects = Vec::new();
        for (name, (_, evidence)) in &self.exclusivity_lost {
            if self
                .cluster
                .nodes
                .get(name)
                .is_some_and(|n| !n.unschedulable)
            {
                effects.push(Effect::Cordon { node: name.clone() });
            }
            effects.push(Effect::NodeEvent {
                node: name.clone(),
                reason: "ExclusivityLost".into(),
                message: format!(
                    "{evidence}: the exclusivity gate failed; Switchyard cordoned the node (no new DRA work) and writes the device plugin's label back to false"
                ),
            });
        }
        // A node in a handover is the handover's to uncordon.
        for name in &self.uncordon_due {
            if !self.handovers.active.contains_key(name)
                && self
                    .cluster
                    .nodes
                    .get(name)
                    .is_some_and(|n| n.unschedulable)
            {
                effects.push(Effect::Uncordon { node: name.clone() });
            }
        }
        effects
    }

    /// Nodes whose decided stack is not what the rules give now (always empty
    /// after `handle`; a runtime check of invariant 2).
    pub fn rule_violations(&self) -> Vec<String> {
        let mut wrong = Vec::new();
        if self.cluster.module.observations == 0 {
            return wrong;
        }
        for (name, node) in &self.cluster.nodes {
            let group = node.group().unwrap_or_default();
            let expected = rule(node, &self.cluster, self.held.contains(group));
            match self.assignments.get(name) {
                Some(a) if (a.stack, a.reason) == expected => {}
                // Held while DRA claims are allocated on it ("drain first").
                Some(_) if self.switch_holds.contains_key(name) => {}
                other => wrong.push(format!(
                    "node {name}: decided {other:?}, rules say {expected:?}"
                )),
            }
        }
        wrong
    }

    /// The stack serving `node`, if it has been decided.
    pub fn stack_of(&self, node: &str) -> Option<Stack> {
        self.assignments.get(node).map(|a| a.stack)
    }
}

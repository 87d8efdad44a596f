//! The migration's state as Prometheus series, served by the alerter on
//! `/metrics` beside the services' own: nodes by group, stack and handover
//! step, what keeps a node off DRA, dual advertisement, held groups,
//! handovers and moves in progress, migrations and their waves, evidence,
//! the GPUs allocated to claims (one series per device, with the GPU's UUID),
//! claims left pending or unused, and the PhysicalGPUs' phases.
//!
//! The alerter folds the whole log into the stack-assigner's and the
//! claim-allocator's cores — the same state `switchyard status` shows — and
//! each scrape computes the series from that state as it is then: nothing
//! is counted on the side, so a restarted alerter serves the same series as
//! the one before it once it has read the log.
//!
//! Times ("since when") are the recording times of the records that made
//! them so, never the clock of the scrape.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use switchyard_core::backend::dispatch::strategy;

use futures::StreamExt;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use switchyard_core::claim_allocator::ClaimAllocator;
use switchyard_core::cluster::{Cluster, Node, ObjectKey};
use switchyard_core::stack_assigner::Handover;
use switchyard_core::stack_assigner::{Assignment, StackAssigner};
use switchyard_eventlog::{Decoded, EventLog, LogError};
use switchyard_proto::v1::{
    DomainEvent, GpuPhase, HandoverStep, PodPhase, Stack, StackReason, domain_event::Kind,
};

/// What the alerter folds for the series.
#[derive(Default)]
pub struct MigrationState {
    /// The last sequence folded.
    sequence: u64,
    /// The log's last sequence when the alerter started following it: the
    /// state is whole once it has folded that far.
    started_at_head: Option<u64>,
    pub(crate) stack: StackAssigner,
    pub(crate) claims: ClaimAllocator,
    /// Evidence check (and wave) -> its last summary.
    evidence: BTreeMap<String, switchyard_proto::v1::EvidenceChecked>,
    /// Move id -> when it started, while it is in progress.
    pub(crate) move_started: BTreeMap<String, i64>,
    /// Unallocated claims -> since when.
    pub(crate) pending_since: BTreeMap<ObjectKey, i64>,
    /// Allocated claims reserved for no pending or running pod -> since when.
    pub(crate) unused_since: BTreeMap<ObjectKey, i64>,
    /// (namespace, pod) -> the claims reserved for it.
    pod_claims: BTreeMap<ObjectKey, BTreeSet<String>>,
    /// Claim -> the pods it is reserved for, as last folded.
    claim_pods: BTreeMap<ObjectKey, Vec<String>>,
}

impl MigrationState {
    /// Whether everything the log held when the alerter started is folded.
    pub fn caught_up(&self) -> bool {
        self.started_at_head
            .is_some_and(|head| self.sequence >= head)
    }

    /// The state of a log the caller folded here in full, record by record
    /// with [`MigrationState::fold`]: whole, as if caught up.
    pub fn whole(mut self) -> Self {
        self.started_at_head = Some(self.sequence);
        self
    }

    /// Folds one record, recorded at `at` (Unix nanoseconds).
    pub fn fold(&mut self, event: &DomainEvent, at: i64) {
        self.stack.apply(event, at);
        self.claims.apply(event, at);
        match &event.kind {
            Some(Kind::EvidenceChecked(c)) => {
                let key = switchyard_core::claim_allocator::check_key(c);
                self.evidence.insert(key, c.clone());
            }
            Some(Kind::ApplicationMoveStarted(m)) => {
                self.move_started.insert(m.move_id.clone(), at);
            }
            Some(Kind::ResourceClaimObserved(c)) => {
                self.claim_changed(&c.namespace, &c.name, at);
            }
            Some(Kind::ResourceClaimRemoved(c)) => {
                self.claim_changed(&c.namespace, &c.name, at);
            }
            Some(Kind::PodObserved(p)) => self.pod_changed(&p.namespace, &p.name, at),
            Some(Kind::PodRemoved(p)) => self.pod_changed(&p.namespace, &p.name, at),
            _ => {}
        }
        // A move that ended: forget when it started.
        if self.move_started.len() > self.claims.moves().active.len() {
            let active: BTreeSet<&str> = self
                .claims
                .moves()
                .active
                .values()
                .map(|m| m.id.as_str())
                .collect();
            self.move_started
                .retain(|id, _| active.contains(id.as_str()));
        }
    }

    fn claim_changed(&mut self, namespace: &str, name: &str, at: i64) {
        let key = (namespace.to_string(), name.to_string());
        for pod in self.claim_pods.remove(&key).unwrap_or_default() {
            let pod = (namespace.to_string(), pod);
            if let Some(claims) = self.pod_claims.get_mut(&pod) {
                claims.remove(name);
                if claims.is_empty() {
                    self.pod_claims.remove(&pod);
                }
            }
        }
        if let Some(claim) = self.claims.cluster().claims.get(&key) {
            for pod in &claim.reserved_for {
                self.pod_claims
                    .entry((namespace.to_string(), pod.clone()))
                    .or_default()
                    .insert(name.to_string());
            }
            if !claim.reserved_for.is_empty() {
                self.claim_pods
                    .insert(key.clone(), claim.reserved_for.clone());
            }
        }
        self.reassess(key, at);
    }

    fn pod_changed(&mut self, namespace: &str, pod: &str, at: i64) {
        let key = (namespace.to_string(), pod.to_string());
        let Some(claims) = self.pod_claims.get(&key).cloned() else {
            return;
        };
        for claim in claims {
            self.reassess((namespace.to_string(), claim), at);
        }
    }

    /// Whether the claim is pending or unused now; a state it newly enters
    /// is dated `at`, one it stays in keeps its date.
    fn reassess(&mut self, key: ObjectKey, at: i64) {
        let cluster = self.claims.cluster();
        let (pending, unused) = match cluster.claims.get(&key) {
            None => (false, false),
            Some(claim) if claim.node.is_empty() => (true, false),
            Some(claim) => {
                let in_use = claim.reserved_for.iter().any(|pod| {
                    cluster
                        .pods
                        .get(&(key.0.clone(), pod.clone()))
                        .is_some_and(|p| matches!(p.phase, PodPhase::Pending | PodPhase::Running))
                });
                (false, !in_use)
            }
        };
        let mark = |map: &mut BTreeMap<ObjectKey, i64>, on: bool| {
            if on {
                map.entry(key.clone()).or_insert(at);
            } else {
                map.remove(&key);
            }
        };
        mark(&mut self.pending_since, pending);
        mark(&mut self.unused_since, unused);
    }
}

/// Follows the log into `state` from the record after the last it folded,
/// until the log fails.
pub async fn follow(
    log: Arc<dyn EventLog>,
    state: Arc<Mutex<MigrationState>>,
) -> Result<(), LogError> {
    let head = log.last_sequence(None).await?;
    let from = {
        let mut state = state.lock().unwrap_or_else(|e| e.into_inner());
        state.started_at_head.get_or_insert(head);
        state.sequence + 1
    };
    let mut records = log.follow(None, from).await?;
    while let Some(stored) = records.next().await {
        let stored = stored?;
        let mut state = state.lock().unwrap_or_else(|e| e.into_inner());
        if let Decoded::Event(event) = stored.decode() {
            state.fold(&event, stored.envelope.recorded_at_unix_nanos);
        }
        state.sequence = stored.sequence;
    }
    Err(LogError::Closed)
}

/// Serves [`MigrationState`] as series at each scrape.
#[derive(Clone, Debug, Default)]
pub struct StateCollector {
    state: Arc<Mutex<MigrationState>>,
}

impl std::fmt::Debug for MigrationState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MigrationState")
            .field("nodes", &self.stack.cluster().nodes.len())
            .finish_non_exhaustive()
    }
}

impl StateCollector {
    pub fn new(state: Arc<Mutex<MigrationState>>) -> Self {
        StateCollector { state }
    }
}

type Labels = Vec<(&'static str, String)>;

/// The `pod` of a device allocated to a claim reserved for no pod.
pub const UNRESERVED: &str = "(unreserved)";

/// One metric family being written: its series with their labels.
struct Series<'a> {
    encoder: prometheus_client::encoding::MetricEncoder<'a>,
}

fn family<'a>(
    encoder: &'a mut DescriptorEncoder,
    name: &'a str,
    help: &str,
    metric_type: MetricType,
) -> Result<Series<'a>, std::fmt::Error> {
    Ok(Series {
        encoder: encoder.encode_descriptor(name, help, None, metric_type)?,
    })
}

impl Series<'_> {
    fn gauge(&mut self, labels: &Labels, value: f64) -> Result<(), std::fmt::Error> {
        ConstGauge::new(value).encode(self.encoder.encode_family(labels)?)
    }

    fn count(&mut self, labels: &Labels, value: i64) -> Result<(), std::fmt::Error> {
        ConstGauge::new(value).encode(self.encoder.encode_family(labels)?)
    }
}

fn seconds(nanos: i64) -> f64 {
    nanos as f64 / 1e9
}

pub(crate) fn stack_name(stack: Option<Stack>) -> &'static str {
    match stack {
        Some(Stack::DevicePlugin) => "device-plugin",
        Some(Stack::Dra) => "dra",
        _ => "none",
    }
}

pub(crate) fn step_name(step: HandoverStep) -> &'static str {
    match step {
        HandoverStep::Cordon => "cordon",
        HandoverStep::Drain => "drain",
        HandoverStep::MoveGroup => "move_group",
        HandoverStep::WaitReady => "wait_ready",
        HandoverStep::Uncordon => "uncordon",
        HandoverStep::Unspecified => "none",
    }
}

/// Why the node is on its stack, as the stack-assigner decided.
pub(crate) fn reason_name(reason: StackReason) -> &'static str {
    match reason {
        StackReason::GroupHasSpecGpu => "group_has_spec_gpu",
        StackReason::DraEnabled => "dra_enabled",
        StackReason::HeldOnDra => "held_on_dra",
        StackReason::ControlPlane => "control_plane",
        StackReason::GpuDisabledLabel => "gpu_disabled_label",
        StackReason::NoSpecGpuDraDisabled => "no_spec_gpu_dra_disabled",
        StackReason::FeatureGatesNotReady => "feature_gates_not_ready",
        StackReason::PoolStack => "pool_stack",
        StackReason::OperatorDefault => "operator_default",
        StackReason::NoGpuPresent => "no_gpu_present",
        StackReason::Unspecified => "undecided",
    }
}

pub(crate) fn phase_name(phase: GpuPhase) -> &'static str {
    match phase {
        GpuPhase::Pending => "pending",
        GpuPhase::Ready => "ready",
        GpuPhase::Failed => "failed",
        GpuPhase::Unspecified => "unknown",
    }
}

/// A node with GPUs: cards counted, PhysicalGPUs, device-plugin resources
/// allocatable, or a group with spec.gpu.
pub(crate) fn is_gpu_node(cluster: &Cluster, name: &str, node: &Node) -> bool {
    node.gpu_count > 0
        || node.device_plugin_allocatable > 0
        || cluster.gpus.get(name).is_some_and(|g| !g.is_empty())
        || node.group().is_some_and(|g| cluster.has_spec_gpu(g))
        // A backend's own label (the operator's DRA node has no
        // nvidia.com/gpu capacity and no PhysicalGPU).
        || strategy(&cluster.backend).labelled_gpu_node(node)
}

/// One GPU node as the alerter shows it, in `/metrics` and in the module
/// status: what the stack-assigner decided for it, its handover in progress,
/// and — on DRA — which readiness conditions it still misses.
pub(crate) struct GpuNodeView<'a> {
    pub name: &'a str,
    pub node: &'a Node,
    pub assignment: Option<&'a Assignment>,
    pub handover: Option<&'a Handover>,
    /// On DRA only: the readiness conditions the node misses, as (name,
    /// what is seen) — the reference's (checked against the cards it had
    /// before its handover, never fewer than it has PhysicalGPUs now), or on
    /// the nvidia-operator backend the guide's gates.
    pub missing: Vec<(&'static str, String)>,
    /// Devices in the ResourceSlices published for the node.
    pub slice_devices: usize,
}

impl GpuNodeView<'_> {
    pub fn group(&self) -> &str {
        self.node.group().unwrap_or_default()
    }

    pub fn stack(&self) -> Option<Stack> {
        self.assignment.map(|a| a.stack)
    }

    /// The readiness conditions a DRA node misses, by name (none off DRA).
    pub fn readiness_missing(&self) -> Vec<&'static str> {
        self.missing.iter().map(|(name, _)| *name).collect()
    }
}

impl MigrationState {
    /// Every GPU node (see [`is_gpu_node`]), by name.
    pub(crate) fn gpu_nodes(&self) -> Vec<GpuNodeView<'_>> {
        let cluster = self.stack.cluster();
        let mut slice_devices: BTreeMap<&str, usize> = BTreeMap::new();
        for slice in cluster.slices.values() {
            *slice_devices.entry(slice.node.as_str()).or_default() += slice.devices.len();
        }
        cluster
            .nodes
            .iter()
            .filter(|(name, node)| is_gpu_node(cluster, name, node))
            .map(|(name, node)| {
                let assignment = self.stack.assignments().get(name.as_str());
                let handover = self.stack.handovers().active.get(name.as_str());
                let on_dra = assignment.map(|a| a.stack) == Some(Stack::Dra);
                let missing = if on_dra {
                    let cards = handover
                        .map_or(0, |h| h.cards_before)
                        .max(cluster.cards(name));
                    strategy(&cluster.backend).dra_missing(name, node, cluster, cards)
                } else {
                    Vec::new()
                };
                GpuNodeView {
                    name,
                    node,
                    assignment,
                    handover,
                    missing,
                    slice_devices: slice_devices.get(name.as_str()).copied().unwrap_or(0),
                }
            })
            .collect()
    }
}

fn flag(on: bool) -> String {
    if on { "true" } else { "false" }.to_string()
}

impl Collector for StateCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        // A state still rebuilding from the log shows finished processes as
        // open and counts from zero: no series until it is whole.
        if !state.caught_up() {
            return Ok(());
        }
        let s = &*state;
        gpu_node_series(s, &mut encoder)?;
        held_group_series(s, &mut encoder)?;
        handover_series(s, &mut encoder)?;
        move_series(s, &mut encoder)?;
        migration_series(s, &mut encoder)?;
        evidence_series(s, &mut encoder)?;
        allocated_gpu_series(s, &mut encoder)?;
        claim_series(s, &mut encoder)?;
        physical_gpu_series(s, &mut encoder)
    }
}

/// The GPU nodes: stack and handover step, the readiness conditions missing
/// on DRA, device-plugin GPUs and published devices.
fn gpu_node_series(
    s: &MigrationState,
    encoder: &mut DescriptorEncoder,
) -> Result<(), std::fmt::Error> {
    let gpu_nodes = s.gpu_nodes();
    let node_labels = |view: &GpuNodeView| -> Labels {
        vec![
            ("node", view.name.to_string()),
            ("node_group", view.group().to_string()),
            ("stack", stack_name(view.stack()).to_string()),
        ]
    };

    let mut f = family(
        encoder,
        "gpu_node",
        "1 per GPU node: its group, the stack it is on (dra, device-plugin, none), why, and the step of its handover in progress",
        MetricType::Gauge,
    )?;
    for view in &gpu_nodes {
        let step = view.handover.map_or("none", |h| step_name(h.step));
        let reason = view
            .assignment
            .map_or("undecided", |a| reason_name(a.reason));
        let mut labels = node_labels(view);
        labels.push(("handover_step", step.to_string()));
        labels.push(("stack_reason", reason.to_string()));
        f.count(&labels, 1)?;
    }

    let mut f = family(
        encoder,
        "gpu_node_dra_missing",
        "1 per readiness condition missing on a GPU node put on DRA",
        MetricType::Gauge,
    )?;
    for view in &gpu_nodes {
        for condition in view.readiness_missing() {
            f.count(
                &vec![
                    ("node", view.name.to_string()),
                    ("node_group", view.group().to_string()),
                    ("condition", condition.to_string()),
                ],
                1,
            )?;
        }
    }

    let mut f = family(
        encoder,
        "gpu_node_device_plugin_gpus",
        "The GPU node's allocatable device-plugin GPU resources (nvidia.com/gpu, time-slicing replicas, MIG), summed",
        MetricType::Gauge,
    )?;
    for view in &gpu_nodes {
        f.count(
            &node_labels(view),
            i64::from(view.node.device_plugin_allocatable),
        )?;
    }
    let mut f = family(
        encoder,
        "gpu_node_slice_devices",
        "Devices in the ResourceSlices published for the GPU node",
        MetricType::Gauge,
    )?;
    for view in &gpu_nodes {
        f.count(&node_labels(view), view.slice_devices as i64)?;
    }
    Ok(())
}

/// The node groups held on DRA.
fn held_group_series(
    s: &MigrationState,
    encoder: &mut DescriptorEncoder,
) -> Result<(), std::fmt::Error> {
    let mut f = family(
        encoder,
        "node_group_held_on_dra",
        "1 per node group held on DRA after the module upgrade",
        MetricType::Gauge,
    )?;
    for group in s.stack.held() {
        f.count(&vec![("node_group", group.clone())], 1)?;
    }
    Ok(())
}

/// The handovers in progress, by step, and those completed.
fn handover_series(
    s: &MigrationState,
    encoder: &mut DescriptorEncoder,
) -> Result<(), std::fmt::Error> {
    let handovers = s.stack.handovers();
    let mut f = family(
        encoder,
        "handover_step_started_timestamp_seconds",
        "Per handover in progress: when its current step began",
        MetricType::Gauge,
    )?;
    for h in handovers.active.values() {
        f.gauge(
            &vec![
                ("handover", h.id.clone()),
                ("node", h.node.clone()),
                ("source_group", h.source_group.clone()),
                ("target_group", h.target_group.clone()),
                ("step", step_name(h.step).to_string()),
                ("stalled", flag(h.stalled)),
                ("rollback", flag(h.rollback.is_some())),
            ],
            seconds(h.step_since),
        )?;
    }
    let f = encoder.encode_descriptor(
        "handovers_completed",
        "Handovers completed",
        None,
        MetricType::Counter,
    )?;
    ConstCounter::new(handovers.completed.len() as u64).encode(f)?;
    Ok(())
}

/// The application moves in progress, and those verified.
fn move_series(s: &MigrationState, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
    let mut f = family(
        encoder,
        "move_started_timestamp_seconds",
        "Per application move in progress: when it started",
        MetricType::Gauge,
    )?;
    for m in s.claims.moves().active.values() {
        let Some(started) = s.move_started.get(&m.id) else {
            continue;
        };
        f.gauge(
            &vec![
                ("move", m.id.clone()),
                ("namespace", m.workload.namespace.clone()),
                ("workload", m.workload.name.clone()),
                ("source_group", m.source_group.clone()),
                ("target_group", m.target_group.clone()),
                ("gpu_class", m.gpu_class.clone()),
                ("rollback", flag(m.compensates.is_some())),
            ],
            seconds(*started),
        )?;
    }
    let f = encoder.encode_descriptor(
        "moves_verified",
        "Workloads whose last move is verified",
        None,
        MetricType::Gauge,
    )?;
    ConstGauge::new(s.claims.moves().verified.len() as i64).encode(f)?;
    Ok(())
}

/// The migrations, and their waves planned and started.
fn migration_series(
    s: &MigrationState,
    encoder: &mut DescriptorEncoder,
) -> Result<(), std::fmt::Error> {
    let migrations = s.claims.migrations();
    let all = migrations
        .active
        .values()
        .map(|m| (m, false))
        .chain(migrations.ended.values().map(|m| (m, true)));
    let mut f = family(
        encoder,
        "migration",
        "1 per migration: running, paused or ended",
        MetricType::Gauge,
    )?;
    for (m, ended) in all.clone() {
        let state = match (ended, m.paused.is_some()) {
            (true, _) => "ended",
            (false, true) => "paused",
            (false, false) => "running",
        };
        f.count(
            &vec![
                ("migration", m.plan.migration_id.clone()),
                ("source_group", m.plan.source_group.clone()),
                ("target_group", m.plan.target_group.clone()),
                ("gpu_class", m.plan.gpu_class.clone()),
                ("state", state.to_string()),
            ],
            1,
        )?;
    }
    let mut f = family(
        encoder,
        "migration_waves",
        "A migration's waves: planned, and started",
        MetricType::Gauge,
    )?;
    for (m, _) in all {
        let id = &m.plan.migration_id;
        f.count(
            &vec![("migration", id.clone()), ("state", "planned".into())],
            m.plan.waves.len() as i64,
        )?;
        f.count(
            &vec![("migration", id.clone()), ("state", "started".into())],
            i64::from(m.next),
        )?;
    }
    Ok(())
}

/// The last evidence check of each kind: what it looked at, what failed.
fn evidence_series(
    s: &MigrationState,
    encoder: &mut DescriptorEncoder,
) -> Result<(), std::fmt::Error> {
    for (name, help, value) in [
        (
            "evidence_nodes",
            "Nodes the last evidence check looked at",
            (|c: &switchyard_proto::v1::EvidenceChecked| c.nodes) as fn(&_) -> u32,
        ),
        (
            "evidence_workloads",
            "Workloads the last evidence check looked at",
            |c| c.workloads,
        ),
        (
            "evidence_failed",
            "Nodes and workloads whose evidence failed in the last check",
            |c| c.failed,
        ),
    ] {
        let mut f = family(encoder, name, help, MetricType::Gauge)?;
        for (check, c) in &s.evidence {
            f.count(
                &vec![
                    ("check", check.clone()),
                    ("migration", c.migration_id.clone()),
                ],
                i64::from(value(c)),
            )?;
        }
    }
    Ok(())
}

/// The devices allocated to claims, one series per pod each is reserved
/// for, with the GPU's UUID.
fn allocated_gpu_series(
    s: &MigrationState,
    encoder: &mut DescriptorEncoder,
) -> Result<(), std::fmt::Error> {
    let cluster = s.claims.cluster();
    // (driver, node, device) -> the GPU's UUID.
    let mut uuids: BTreeMap<(&str, &str, &str), &str> = BTreeMap::new();
    for slice in cluster.slices.values() {
        for device in &slice.devices {
            uuids.insert(
                (
                    slice.driver.as_str(),
                    slice.node.as_str(),
                    device.name.as_str(),
                ),
                device.uuid.as_str(),
            );
        }
    }

    let mut f = family(
        encoder,
        "gpu_allocated",
        "1 per device allocated to a ResourceClaim, per pod it is reserved for",
        MetricType::Gauge,
    )?;
    for ((namespace, claim_name), claim) in &cluster.claims {
        if claim.node.is_empty() {
            continue;
        }
        // Prometheus drops an empty label, and the scrape would give the
        // series the alerter's own pod: a claim reserved for none says so.
        let pods: Vec<&str> = if claim.reserved_for.is_empty() {
            vec![UNRESERVED]
        } else {
            claim.reserved_for.iter().map(String::as_str).collect()
        };
        let mut classes = claim.device_classes.clone();
        classes.sort();
        classes.dedup();
        for device in &claim.devices {
            let mut parts = device.splitn(3, '/');
            let (driver, pool, name) = (
                parts.next().unwrap_or_default(),
                parts.next().unwrap_or_default(),
                parts.next().unwrap_or_default(),
            );
            let uuid = uuids
                .get(&(driver, claim.node.as_str(), name))
                .copied()
                .unwrap_or_default();
            for pod in &pods {
                f.count(
                    &vec![
                        ("namespace", namespace.clone()),
                        ("claim", claim_name.clone()),
                        ("pod", pod.to_string()),
                        ("device_class", classes.join(",")),
                        ("node", claim.node.clone()),
                        ("driver", driver.to_string()),
                        ("pool", pool.to_string()),
                        ("device", name.to_string()),
                        ("gpu_uuid", uuid.to_string()),
                    ],
                    1,
                )?;
            }
        }
    }
    Ok(())
}

/// The claims left pending, and those allocated but unused.
fn claim_series(
    s: &MigrationState,
    encoder: &mut DescriptorEncoder,
) -> Result<(), std::fmt::Error> {
    let cluster = s.claims.cluster();
    let mut f = family(
        encoder,
        "resource_claim_pending_since_timestamp_seconds",
        "Per unallocated ResourceClaim: since when",
        MetricType::Gauge,
    )?;
    for ((namespace, claim), since) in &s.pending_since {
        f.gauge(
            &vec![("namespace", namespace.clone()), ("claim", claim.clone())],
            seconds(*since),
        )?;
    }
    let mut f = family(
        encoder,
        "resource_claim_unused_since_timestamp_seconds",
        "Per allocated ResourceClaim reserved for no pending or running pod: since when",
        MetricType::Gauge,
    )?;
    for (key, since) in &s.unused_since {
        let node = cluster
            .claims
            .get(key)
            .map(|c| c.node.clone())
            .unwrap_or_default();
        f.gauge(
            &vec![
                ("namespace", key.0.clone()),
                ("claim", key.1.clone()),
                ("node", node),
            ],
            seconds(*since),
        )?;
    }
    Ok(())
}

/// The PhysicalGPUs, by phase.
fn physical_gpu_series(
    s: &MigrationState,
    encoder: &mut DescriptorEncoder,
) -> Result<(), std::fmt::Error> {
    let cluster = s.claims.cluster();
    let mut f = family(
        encoder,
        "physical_gpu",
        "1 per PhysicalGPU, by phase (pending, ready, failed)",
        MetricType::Gauge,
    )?;
    for (node, gpus) in &cluster.gpus {
        for gpu in gpus {
            f.count(
                &vec![
                    ("node", node.clone()),
                    ("gpu", gpu.name.to_string()),
                    ("uuid", gpu.uuid.to_string()),
                    ("product", gpu.product.to_string()),
                    ("phase", phase_name(gpu.phase).to_string()),
                ],
                1,
            )?;
        }
    }
    Ok(())
}

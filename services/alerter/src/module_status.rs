//! The gpu module's status, for `kubectl` users: the prerequisites as the
//! API server reports them (inventory reads its version, the six feature
//! gates from its `kubernetes_feature_enabled` metric, whether it serves
//! `resource.k8s.io/v1`), per GPU node why DRA is or is not deployed, and
//! each alert the alerter can tell from the log as a condition — with an
//! Event when it starts firing.
//!
//! Written on the `gpu` ModuleConfig's status where the ModuleConfig CRD is
//! Switchyard's own (the chart's, annotated `gpu.deckhouse.io/installed-by`),
//! else on the cluster-scoped `GPUModuleStatus` named `gpu`:
//!
//! ```text
//! kubectl get moduleconfig gpu -o jsonpath='{.status.conditions}'
//! kubectl get gpumodulestatus gpu -o jsonpath='{.status.conditions}'
//! ```
//!
//! Everything is computed from the state folded from the log (see
//! [`crate::state_metrics`]) as it is at each pass, and only once that state
//! holds the whole log the alerter found at start. Which alerts there are,
//! and when each holds, is the alerter core's
//! ([`switchyard_core::alerter::rules`]); this module gathers the facts they
//! are decided on and says what fired.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as EventsV1Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, Client};
use serde_json::json;
use switchyard_api::{
    GPUModuleStatus, GPUModuleStatusSpec, INSTALLED_BY_ANNOTATION, ModuleConfig, ModuleStatus,
    NodeStackStatus,
};
use switchyard_core::alerter::rules::{self, AlertRule, DevicePluginOnDra, GpuNodeFacts};
use switchyard_core::names::REQUIRED_FEATURE_GATES;
use switchyard_proto::v1::{Stack, StackReason};

use crate::state_metrics::{GpuNodeView, MigrationState, reason_name, stack_name};

/// The object the status is written on, and its name.
pub const STATUS_NAME: &str = "gpu";

/// How often the status is written, and how long before a move or a claim
/// counts as stalled (the chart sets these from its alerts'
/// `prometheusRule.thresholds`).
#[derive(clap::Args, Clone, Debug)]
pub struct StatusArgs {
    /// How often the module status is written (when it changed).
    #[arg(long, env = "SWITCHYARD_STATUS_EVERY", default_value = "10s", value_parser = humantime::parse_duration)]
    pub status_every: Duration,
    /// An application move not verified after this is stalled.
    #[arg(long, env = "SWITCHYARD_MOVE_STALLED_AFTER", default_value = rules::APPLICATION_MOVE_AGE.default, value_parser = humantime::parse_duration)]
    pub move_stalled_after: Duration,
    /// A ResourceClaim unallocated this long is stuck pending.
    #[arg(long, env = "SWITCHYARD_CLAIM_PENDING_AFTER", default_value = rules::RESOURCE_CLAIM_PENDING_AGE.default, value_parser = humantime::parse_duration)]
    pub claim_pending_after: Duration,
    /// An allocated ResourceClaim reserved for no pod this long is unused.
    #[arg(long, env = "SWITCHYARD_CLAIM_UNUSED_AFTER", default_value = rules::RESOURCE_CLAIM_UNUSED_AGE.default, value_parser = humantime::parse_duration)]
    pub claim_unused_after: Duration,
    /// The `for:` of the rules whose condition the status checks as it is
    /// now: how long it must hold before the alert fires (until then the
    /// status shows it pending, and no Event is recorded). `ALERT=DURATION`,
    /// comma-separated; an alert not named fires at once.
    #[arg(long, env = "SWITCHYARD_ALERTS_FOR", value_delimiter = ',', value_parser = alert_for)]
    pub alerts_for: Vec<(String, Duration)>,
}

/// One `ALERT=DURATION` of `--alerts-for`.
fn alert_for(text: &str) -> Result<(String, Duration), String> {
    let (alert, delay) = text.split_once('=').ok_or_else(|| {
        format!("{text:?}: expected ALERT=DURATION, e.g. D8GpuNodeDraNotReady=15m")
    })?;
    if !rules::from_log().any(|rule| rule.name == alert) {
        let names: Vec<&str> = rules::from_log().map(|rule| rule.name).collect();
        return Err(format!(
            "{alert:?} is not an alert of the module status (expected one of {})",
            names.join(", ")
        ));
    }
    let delay = humantime::parse_duration(delay)
        .map_err(|err| format!("{alert}'s delay {delay:?}: {err}"))?;
    Ok((alert.to_string(), delay))
}

impl StatusArgs {
    /// How long `alert`'s condition must hold before it fires.
    fn delay(&self, alert: &str) -> Duration {
        self.alerts_for
            .iter()
            .rev()
            .find(|(a, _)| a == alert)
            .map_or(Duration::ZERO, |(_, d)| *d)
    }
}

/// Since when each alert's condition has held for each object (Unix
/// nanoseconds), as the status passes saw it: an alert fires once it held
/// for its delay, as Prometheus fires a rule after its `for:`.
#[derive(Debug, Default)]
pub struct Holding(BTreeMap<(&'static str, String), i64>);

/// An object an alert is about, as an Event names it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Regarding {
    pub kind: &'static str,
    pub api_version: &'static str,
    pub name: String,
}

impl Regarding {
    fn node(name: &str) -> Regarding {
        Regarding {
            kind: "Node",
            api_version: "v1",
            name: name.to_string(),
        }
    }
}

/// One object an alert fires for, and what to say of it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Firing {
    pub alert: &'static str,
    /// What it fires for: a node, group, handover, move, claim or GPU by
    /// name — one Event per alert and object while it keeps firing.
    pub object: String,
    /// `None`: the module status object itself.
    pub regarding: Option<Regarding>,
    pub message: String,
}

fn condition(type_: &str, on: Option<bool>, reason: &str, message: String) -> Condition {
    Condition {
        type_: type_.to_string(),
        status: match on {
            Some(true) => "True",
            Some(false) => "False",
            None => "Unknown",
        }
        .to_string(),
        reason: reason.to_string(),
        message,
        last_transition_time: Time(Default::default()),
        observed_generation: None,
    }
}

/// The status and the alerts firing, from `state` at `now` (Unix
/// nanoseconds, for the ages of moves and claims, and the alerts' delays:
/// `holding` is what the passes before this one saw).
pub fn compute(
    state: &MigrationState,
    now: i64,
    args: &StatusArgs,
    holding: &mut Holding,
) -> (ModuleStatus, Vec<Firing>) {
    let module = &state.stack.cluster().module;
    let mut conditions = Vec::new();
    let version = switchyard_core::names::kubernetes_minor(&module.kubernetes_version);
    let (min_major, min_minor) = switchyard_core::names::MIN_KUBERNETES;
    conditions.push(match version {
        Some(v) if v >= (min_major, min_minor) => condition(
            "KubernetesVersion",
            Some(true),
            "Supported",
            format!(
                "{} ({min_major}.{min_minor} or newer is needed)",
                module.kubernetes_version
            ),
        ),
        Some(_) => condition(
            "KubernetesVersion",
            Some(false),
            "TooOld",
            format!(
                "{}: {min_major}.{min_minor} or newer is needed",
                module.kubernetes_version
            ),
        ),
        None => condition(
            "KubernetesVersion",
            None,
            "Unknown",
            "the API server's version is not known yet".into(),
        ),
    });
    for gate in REQUIRED_FEATURE_GATES {
        let type_ = format!("FeatureGate{gate}");
        conditions.push(match module.gate(gate) {
            Some(true) if !module.feature_gates.contains_key(gate) => condition(&type_, Some(true), "Graduated", format!("{gate} is GA in {} and no longer a gate", module.kubernetes_version)),
            Some(true) => condition(&type_, Some(true), "Enabled", format!("{gate} is enabled on the API server (kubernetes_feature_enabled)")),
            Some(false) => condition(&type_, Some(false), "Disabled", format!("{gate} is disabled on the API server (kubernetes_feature_enabled); the platform must enable it: the module changes no control-plane or kubelet arguments")),
            None if !module.feature_gates_error.is_empty() => condition(&type_, None, "Unreadable", module.feature_gates_error.clone()),
            None => condition(&type_, None, "NotReported", format!("the API server's kubernetes_feature_enabled metric does not report {gate}")),
        });
    }
    conditions.push(condition(
        "DRAAPIServed",
        Some(module.dra_api_served),
        if module.dra_api_served {
            "Served"
        } else {
            "NotServed"
        },
        if module.dra_api_served {
            "the API server serves resource.k8s.io/v1".into()
        } else {
            "the API server does not serve resource.k8s.io/v1".into()
        },
    ));
    let missing = module.prerequisites_missing();
    conditions.push(if module.observations == 0 {
        condition(
            "FeatureGatesReady",
            None,
            "NotObserved",
            "inventory has not reported the module settings yet".into(),
        )
    } else if missing.is_empty() {
        condition(
            "FeatureGatesReady",
            Some(true),
            "PrerequisitesMet",
            "Kubernetes, the six feature gates and resource.k8s.io/v1 are ready for DRA".into(),
        )
    } else {
        condition(
            "FeatureGatesReady",
            Some(false),
            "PrerequisitesMissing",
            missing.join("; "),
        )
    });
    conditions.push(condition(
        "DRAEnabled",
        Some(module.dra_enabled),
        if module.dra_enabled {
            "Enabled"
        } else {
            "Disabled"
        },
        format!(
            "the ModuleConfig's settings.dra.enabled is {}",
            module.dra_enabled
        ),
    ));

    let views = state.gpu_nodes();
    let nodes = node_statuses(state, &views);
    let held = alerts(state, &views, &nodes, now, args);
    // Since when each held; those that held long enough fire.
    let mut since = BTreeMap::new();
    let (mut firing, mut pending) = (Vec::new(), Vec::new());
    for f in held {
        let key = (f.alert, f.object.clone());
        let from = holding.0.get(&key).copied().unwrap_or(now);
        since.insert(key, from);
        if rules::held_long_enough(from, now, nanos(args.delay(f.alert))) {
            firing.push(f);
        } else {
            pending.push(f);
        }
    }
    holding.0 = since;
    let messages = |of: &[&Firing]| {
        let mut message: Vec<&str> = of.iter().take(10).map(|f| f.message.as_str()).collect();
        let more = format!("and {} more", of.len().saturating_sub(10));
        if of.len() > 10 {
            message.push(&more);
        }
        message.join("; ")
    };
    // The alerts the status carries, in order: those the alerter can tell
    // from the log (the log's lag and records passed over are Prometheus's).
    for alert in rules::from_log().map(|rule| rule.name) {
        let of: Vec<&Firing> = firing.iter().filter(|f| f.alert == alert).collect();
        let waiting: Vec<&Firing> = pending.iter().filter(|f| f.alert == alert).collect();
        conditions.push(if !of.is_empty() {
            condition(alert, Some(true), "Firing", messages(&of))
        } else if !waiting.is_empty() {
            condition(
                alert,
                Some(false),
                "Pending",
                format!(
                    "fires once this holds for {}: {}",
                    humantime::format_duration(args.delay(alert)),
                    messages(&waiting)
                ),
            )
        } else {
            condition(alert, Some(false), "NotFiring", String::new())
        });
    }
    (ModuleStatus { conditions, nodes }, firing)
}

/// Per GPU node: its stack and why DRA is or is not deployed there.
fn node_statuses(state: &MigrationState, views: &[GpuNodeView]) -> Vec<NodeStackStatus> {
    let cluster = state.stack.cluster();
    let mut nodes = Vec::new();
    for view in views {
        let stack = view.stack();
        let reason = view
            .assignment
            .map_or(StackReason::Unspecified, |a| a.reason);
        let readiness_missing: Vec<&str> =
            view.missing.iter().map(|(_, seen)| seen.as_str()).collect();
        let dra_deployed = stack == Some(Stack::Dra) && readiness_missing.is_empty();
        let message = match reason {
            _ if !readiness_missing.is_empty() => format!(
                "on DRA, but DRA is not deployed yet: {}",
                readiness_missing.join("; ")
            ),
            StackReason::DraEnabled => {
                "DRA is deployed: dra.enabled and the group has no spec.gpu".to_string()
            }
            StackReason::HeldOnDra => "DRA is deployed: the group has spec.gpu but is held on DRA since the module upgrade (D8GpuNodeGroupHeldOnDra)".to_string(),
            StackReason::GroupHasSpecGpu => "DRA is not deployed: the group has spec.gpu, so the device plugin serves the node".to_string(),
            StackReason::ControlPlane => {
                "DRA is not deployed: control-plane nodes get no DRA".to_string()
            }
            StackReason::GpuDisabledLabel => {
                "DRA is not deployed: the node is labeled gpu.deckhouse.io/enabled=false"
                    .to_string()
            }
            StackReason::NoSpecGpuDraDisabled => "no stack manages the node: its group has no spec.gpu, and dra.enabled is off".to_string(),
            StackReason::FeatureGatesNotReady => format!(
                "DRA is not deployed: the feature gates are not ready ({})",
                cluster.module.prerequisites_missing().join("; ")
            ),
            StackReason::PoolStack if stack == Some(Stack::Dra) => "DRA is deployed: the node's pool is configured for DRA (NVIDIA's DRA driver serves it)".to_string(),
            StackReason::PoolStack => "DRA is not deployed: the node's pool is configured for the device plugin (the GPU Operator's)".to_string(),
            StackReason::OperatorDefault => "DRA is not deployed: the node is in no pool Switchyard drives, so the GPU Operator's default serves it, the device plugin".to_string(),
            StackReason::NoGpuPresent => "no stack: the node is not labeled nvidia.com/gpu.present=true, so the GPU Operator deploys nothing there".to_string(),
            StackReason::Unspecified => {
                "the stack-assigner has not decided the node's stack yet".to_string()
            }
        };
        let reason = if readiness_missing.is_empty() {
            reason_name(reason)
        } else {
            "readiness_missing"
        };
        nodes.push(NodeStackStatus {
            name: view.name.to_string(),
            node_group: view.group().to_string(),
            stack: stack_name(stack).to_string(),
            dra_deployed,
            reason: reason.to_string(),
            message,
        });
    }
    nodes
}

/// A duration in nanoseconds, as the log's times are.
fn nanos(duration: Duration) -> i64 {
    i64::try_from(duration.as_nanos()).unwrap_or(i64::MAX)
}

/// Every alert firing now, per object, as the alerter core's rules decide
/// on the state's facts; `nodes` are the statuses of `views`.
fn alerts(
    state: &MigrationState,
    views: &[GpuNodeView],
    nodes: &[NodeStackStatus],
    now: i64,
    args: &StatusArgs,
) -> Vec<Firing> {
    let mut firing = Firings::default();
    firing.held_groups(state);
    for (view, status) in views.iter().zip(nodes) {
        firing.node(state, view, status);
    }
    firing.stalled(state, now, args);
    firing.claims(state, now, args);
    firing.gpus(state);
    firing.0
}

/// The alerts firing, in the order found.
#[derive(Default)]
struct Firings(Vec<Firing>);

impl Firings {
    /// Fires `rule` for `object`.
    fn fire(
        &mut self,
        rule: &AlertRule,
        object: &str,
        regarding: Option<Regarding>,
        message: String,
    ) {
        self.0.push(Firing {
            alert: rule.name,
            object: object.to_string(),
            regarding,
            message,
        });
    }

    /// Group phase: every node group held on DRA since the module upgrade.
    fn held_groups(&mut self, state: &MigrationState) {
        for group in state.stack.held() {
            self.fire(
                &rules::NODE_GROUP_HELD_ON_DRA,
                group,
                Some(Regarding {
                    kind: "NodeGroup",
                    api_version: "deckhouse.io/v1",
                    name: group.clone(),
                }),
                format!(
                    "node group {group} has spec.gpu and is held on DRA after the module upgrade"
                ),
            );
        }
    }

    /// Node phase: the alerts of one GPU node, on its facts and its status.
    fn node(&mut self, state: &MigrationState, view: &GpuNodeView, status: &NodeStackStatus) {
        let name = view.name;
        let lost = state.stack.exclusivity_lost().get(name);
        let facts = GpuNodeFacts {
            stack: view.stack(),
            reason: view
                .assignment
                .map_or(StackReason::Unspecified, |a| a.reason),
            in_handover: view.handover.is_some(),
            readiness_missing: !view.missing.is_empty(),
            device_plugin_gpus: view.node.device_plugin_allocatable,
            slice_devices: view.slice_devices,
            exclusivity_lost: lost.is_some(),
        };
        if rules::node_served_by_no_stack(&facts) {
            self.fire(
                &rules::NODE_SERVED_BY_NO_STACK,
                name,
                Some(Regarding::node(name)),
                format!("node {name}: {}", status.message),
            );
        }
        if rules::node_dra_not_ready(&facts) {
            self.fire(
                &rules::NODE_DRA_NOT_READY,
                name,
                Some(Regarding::node(name)),
                format!("node {name}: {}", status.message),
            );
        }
        if rules::node_dual_advertisement(&facts) {
            self.fire(
                &rules::NODE_DUAL_ADVERTISEMENT,
                name,
                Some(Regarding::node(name)),
                format!(
                    "node {name} advertises {} device-plugin GPU resources and {} ResourceSlice devices at once: the exclusivity gate failed",
                    facts.device_plugin_gpus, facts.slice_devices
                ),
            );
        }
        let message = match rules::device_plugin_on_dra_node(&facts) {
            Some(DevicePluginOnDra::Advertising { gpus }) => Some(format!(
                "the device plugin advertises {gpus} GPU resources on DRA node {name}"
            )),
            // nvidia-operator: the guide's failed exclusivity gate, as the
            // stack-assigner recorded it (its pod or its label back before
            // any GPU is advertised).
            Some(DevicePluginOnDra::ExclusivityLost) => {
                lost.map(|(_, evidence)| format!("{evidence}: the exclusivity gate failed"))
            }
            None => None,
        };
        if let Some(message) = message {
            self.fire(
                &rules::DEVICE_PLUGIN_ON_DRA_NODE,
                name,
                Some(Regarding::node(name)),
                message,
            );
        }
    }

    /// Process phase: handovers stalled and application moves not verified in time.
    fn stalled(&mut self, state: &MigrationState, now: i64, args: &StatusArgs) {
        let handovers = &state.stack.handovers().active;
        for h in handovers.values().filter(|h| rules::handover_stalled(h)) {
            self.fire(
                &rules::HANDOVER_STALLED,
                &h.id,
                Some(Regarding::node(&h.node)),
                format!(
                    "handover {} of node {} to {} is stalled at step {}",
                    h.id,
                    h.node,
                    h.target_group,
                    crate::state_metrics::step_name(h.step)
                ),
            );
        }
        for m in state.claims.moves().active.values() {
            if let Some(started) = state.move_started.get(&m.id)
                && rules::older_than(*started, now, nanos(args.move_stalled_after))
            {
                self.fire(
                    &rules::APPLICATION_MOVE_STALLED,
                    &m.id,
                    None,
                    format!(
                        "move {} of {}/{} to {} not verified after {}",
                        m.id,
                        m.workload.namespace,
                        m.workload.name,
                        m.target_group,
                        humantime::format_duration(args.move_stalled_after)
                    ),
                );
            }
        }
    }

    /// Claim phase: ResourceClaims unallocated, or allocated but unused, for too long.
    fn claims(&mut self, state: &MigrationState, now: i64, args: &StatusArgs) {
        for ((namespace, claim), since) in &state.pending_since {
            if rules::older_than(*since, now, nanos(args.claim_pending_after)) {
                self.fire(
                    &rules::RESOURCE_CLAIM_PENDING,
                    &format!("{namespace}/{claim}"),
                    None,
                    format!(
                        "ResourceClaim {namespace}/{claim} is unallocated for more than {}",
                        humantime::format_duration(args.claim_pending_after)
                    ),
                );
            }
        }
        for ((namespace, claim), since) in &state.unused_since {
            if rules::older_than(*since, now, nanos(args.claim_unused_after)) {
                self.fire(
                    &rules::RESOURCE_CLAIM_UNUSED,
                    &format!("{namespace}/{claim}"),
                    None,
                    format!(
                        "ResourceClaim {namespace}/{claim} is allocated but reserved for no running pod for more than {}",
                        humantime::format_duration(args.claim_unused_after)
                    ),
                );
            }
        }
    }

    /// GPU phase: every PhysicalGPU that is Failed.
    fn gpus(&mut self, state: &MigrationState) {
        for (node, gpus) in &state.stack.cluster().gpus {
            for gpu in gpus.iter().filter(|g| rules::gpu_unhealthy(g.phase)) {
                self.fire(
                    &rules::GPU_UNHEALTHY,
                    &gpu.name,
                    Some(Regarding {
                        kind: "PhysicalGPU",
                        api_version: "gpu.deckhouse.io/v1alpha1",
                        name: gpu.name.to_string(),
                    }),
                    format!("GPU {} ({}) on node {node} is Failed", gpu.uuid, gpu.name),
                );
            }
        }
    }
}

/// The conditions of `status` with the transition times of `before` where
/// a condition's status did not change, `now` where it did.
pub fn with_transitions(mut status: ModuleStatus, before: &[Condition], now: Time) -> ModuleStatus {
    for condition in &mut status.conditions {
        condition.last_transition_time = before
            .iter()
            .find(|b| b.type_ == condition.type_ && b.status == condition.status)
            .map_or_else(|| now.clone(), |b| b.last_transition_time.clone());
    }
    status
}

/// Where the status goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// The `gpu` ModuleConfig: its CRD is Switchyard's.
    ModuleConfig,
    /// The `gpu` GPUModuleStatus: the ModuleConfig CRD is someone else's.
    GpuModuleStatus,
}

impl Target {
    /// The ModuleConfig CRD as the API server has it decides.
    pub fn of(crd: Option<&CustomResourceDefinition>) -> Target {
        let ours = crd
            .and_then(|c| c.metadata.annotations.as_ref())
            .and_then(|a| a.get(INSTALLED_BY_ANNOTATION))
            .is_some_and(|v| v == "switchyard");
        if ours {
            Target::ModuleConfig
        } else {
            Target::GpuModuleStatus
        }
    }

    async fn detect(client: &Client) -> Result<Target, kube::Error> {
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        Ok(Target::of(
            crds.get_opt("moduleconfigs.deckhouse.io").await?.as_ref(),
        ))
    }

    fn regarding(self) -> ObjectReference {
        let (api_version, kind) = match self {
            Target::ModuleConfig => ("deckhouse.io/v1alpha1", "ModuleConfig"),
            Target::GpuModuleStatus => ("gpu.deckhouse.io/v1alpha1", "GPUModuleStatus"),
        };
        ObjectReference {
            api_version: Some(api_version.into()),
            kind: Some(kind.into()),
            name: Some(STATUS_NAME.into()),
            ..ObjectReference::default()
        }
    }

    /// The status written now; `None` when the object is missing (a
    /// ModuleConfig nobody created yet; a GPUModuleStatus is created).
    async fn current(self, client: &Client) -> Result<Option<ModuleStatus>, kube::Error> {
        match self {
            Target::ModuleConfig => Ok(Api::<ModuleConfig>::all(client.clone())
                .get_opt(STATUS_NAME)
                .await?
                .map(|c| c.status.unwrap_or_default())),
            Target::GpuModuleStatus => {
                let api = Api::<GPUModuleStatus>::all(client.clone());
                if let Some(object) = api.get_opt(STATUS_NAME).await? {
                    return Ok(Some(object.status.unwrap_or_default()));
                }
                let object = GPUModuleStatus::new(STATUS_NAME, GPUModuleStatusSpec {});
                match api.create(&PostParams::default(), &object).await {
                    Ok(_) => Ok(Some(ModuleStatus::default())),
                    Err(kube::Error::Api(e)) if e.code == 409 => Ok(Some(ModuleStatus::default())),
                    Err(e) => Err(e),
                }
            }
        }
    }

    async fn write(self, client: &Client, status: &ModuleStatus) -> Result<(), kube::Error> {
        // A merge patch replaces the lists whole: what is written is all there is.
        let patch = Patch::Merge(json!({ "status": status }));
        let params = PatchParams::default();
        match self {
            Target::ModuleConfig => {
                Api::<ModuleConfig>::all(client.clone())
                    .patch_status(STATUS_NAME, &params, &patch)
                    .await?;
            }
            Target::GpuModuleStatus => {
                Api::<GPUModuleStatus>::all(client.clone())
                    .patch_status(STATUS_NAME, &params, &patch)
                    .await?;
            }
        }
        Ok(())
    }
}

/// How long a status unchanged since it was written is trusted to be on the
/// object before it is read again.
const RESYNC: Duration = Duration::from_secs(300);

/// Writes the status every `args.status_every` while it changes, and an
/// Event (Warning, reason the alert's name) when an alert starts firing for
/// an object, until the process ends.
pub async fn run(client: Client, state: Arc<Mutex<MigrationState>>, args: StatusArgs) {
    let target = loop {
        match Target::detect(&client).await {
            Ok(target) => break target,
            Err(err) => {
                tracing::warn!(error = %err, "reading the ModuleConfig CRD to choose where the module status goes");
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        }
    };
    tracing::info!(?target, "writing the module status");
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: REPORTING_CONTROLLER.into(),
            instance: None,
        },
    );
    // Announced with an Event: (alert, object), while it keeps firing. Those
    // an earlier run announced are read once, on the first pass.
    let mut announced: BTreeSet<(&'static str, String)> = BTreeSet::new();
    let mut read_earlier = false;
    let mut holding = Holding::default();
    // The status last computed and seen on the object, and when it was.
    let mut written: Option<(ModuleStatus, Instant)> = None;
    let mut every = tokio::time::interval(args.status_every);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let computed = {
            let state = state.lock().unwrap_or_else(|e| e.into_inner());
            state.caught_up().then(|| {
                compute(
                    &state,
                    switchyard_eventlog::now_nanos(),
                    &args,
                    &mut holding,
                )
            })
        };
        let Some((status, firing)) = computed else {
            continue;
        };
        // Unchanged since it was last seen written: read again only now and
        // then, in case someone else changed or removed it.
        let settled = written
            .as_ref()
            .is_some_and(|(last, at)| *last == status && at.elapsed() < RESYNC);
        if !settled {
            written = None;
            match target.current(&client).await {
                Ok(Some(current)) => {
                    // The API server keeps seconds.
                    let now = k8s_openapi::jiff::Timestamp::from_second(
                        k8s_openapi::jiff::Timestamp::now().as_second(),
                    )
                    .map_or_else(|_| Time(k8s_openapi::jiff::Timestamp::now()), Time);
                    let timed = with_transitions(status.clone(), &current.conditions, now);
                    let outcome = if timed == current {
                        Ok(())
                    } else {
                        target.write(&client, &timed).await
                    };
                    match outcome {
                        Ok(()) => written = Some((status, Instant::now())),
                        Err(err) => {
                            tracing::warn!(error = %err, ?target, "writing the module status");
                        }
                    }
                }
                Ok(None) => {
                    tracing::debug!(?target, "no gpu ModuleConfig: no module status to write");
                }
                Err(err) => tracing::warn!(error = %err, ?target, "reading the module status"),
            }
        }
        let mut first_pass = None;
        if !read_earlier {
            let events = announced_events(&client).await;
            let before = announced_before(&firing, &target.regarding(), &events);
            first_pass = Some(before.len());
            announced.extend(before);
            read_earlier = true;
        }
        let mut published = 0;
        let mut still = BTreeSet::new();
        for new in &firing {
            let key = (new.alert, new.object.clone());
            let fresh = !announced.contains(&key);
            still.insert(key);
            if !fresh {
                continue;
            }
            let (event, regarding) = event_of(new, &target.regarding());
            tracing::info!(
                alert = new.alert,
                object = new.object,
                "announcing the alert with an Event"
            );
            match recorder.publish(&event, &regarding).await {
                Ok(()) => published += 1,
                Err(err) => {
                    // Said again on the next pass.
                    tracing::warn!(error = %err, alert = new.alert, "recording the alert's Event");
                    still.remove(&(new.alert, new.object.clone()));
                }
            }
        }
        if let Some(before) = first_pass {
            tracing::info!(
                firing = firing.len(),
                announced = published,
                announced_before = before,
                "alerts announced on the first pass (those an earlier run announced are not announced again)"
            );
        }
        announced = still;
    }
}

/// The Event that announces `firing` and the object it is about (`target`,
/// the module status object, when it names none).
fn event_of(firing: &Firing, target: &ObjectReference) -> (Event, ObjectReference) {
    let regarding = firing.regarding.as_ref().map_or_else(
        || target.clone(),
        |r| ObjectReference {
            api_version: Some(r.api_version.into()),
            kind: Some(r.kind.into()),
            name: Some(r.name.clone()),
            ..ObjectReference::default()
        },
    );
    let event = Event {
        type_: EventType::Warning,
        reason: firing.alert.into(),
        note: Some(firing.message.chars().take(1000).collect()),
        action: "Alert".into(),
        secondary: None,
    };
    (event, regarding)
}

/// Who records the alerts' Events.
const REPORTING_CONTROLLER: &str = "switchyard-alerter";

/// The Events this controller recorded that the API server still keeps (in
/// `default`, where Events about cluster-scoped objects go); none if they
/// cannot be read, said in the log — the alerts are then announced again.
async fn announced_events(client: &Client) -> Vec<EventsV1Event> {
    let api: Api<EventsV1Event> = Api::namespaced(client.clone(), "default");
    let mut events = Vec::new();
    let mut params = ListParams::default().limit(500);
    loop {
        match api.list(&params).await {
            Ok(page) => {
                events.extend(
                    page.items.into_iter().filter(|e| {
                        e.reporting_controller.as_deref() == Some(REPORTING_CONTROLLER)
                    }),
                );
                match page.metadata.continue_ {
                    Some(next) if !next.is_empty() => params = params.continue_token(&next),
                    _ => return events,
                }
            }
            Err(err) => {
                tracing::warn!(error = %err, "listing the Events an earlier run recorded; the alerts firing are announced again");
                return Vec::new();
            }
        }
    }
}

/// The alerts of `firing` that one of `events` already announced: the same
/// reason, about the same object, saying the same.
fn announced_before(
    firing: &[Firing],
    target: &ObjectReference,
    events: &[EventsV1Event],
) -> BTreeSet<(&'static str, String)> {
    let said: BTreeSet<(&str, &str, &str, &str)> = events
        .iter()
        .filter(|e| e.reporting_controller.as_deref() == Some(REPORTING_CONTROLLER))
        .filter_map(|e| {
            let regarding = e.regarding.as_ref()?;
            Some((
                e.reason.as_deref()?,
                regarding.kind.as_deref()?,
                regarding.name.as_deref()?,
                e.note.as_deref().unwrap_or_default(),
            ))
        })
        .collect();
    firing
        .iter()
        .filter(|f| {
            let (event, regarding) = event_of(f, target);
            said.contains(&(
                event.reason.as_str(),
                regarding.kind.as_deref().unwrap_or_default(),
                regarding.name.as_deref().unwrap_or_default(),
                event.note.as_deref().unwrap_or_default(),
            ))
        })
        .map(|f| (f.alert, f.object.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use switchyard_proto::v1::{NodeObserved, domain_event::Kind, event};

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        status: StatusArgs,
    }

    fn args(flags: &[&str]) -> Result<StatusArgs, clap::Error> {
        Flags::try_parse_from(std::iter::once("alerter").chain(flags.iter().copied()))
            .map(|f| f.status)
    }

    /// A GPU node of a group without spec.gpu while DRA is off: no stack
    /// serves it (D8GpuNodeServedByNoStack holds).
    fn unserved() -> MigrationState {
        let mut state = MigrationState::default();
        let labels = [(switchyard_core::names::GROUP_LABEL, "gpu")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        state.fold(
            &event(Kind::NodeObserved(NodeObserved {
                node: "gpu-1".into(),
                labels,
                gpu_count: 8,
                ..Default::default()
            })),
            0,
        );
        state.whole()
    }

    fn served_by_no_stack(status: &ModuleStatus) -> &Condition {
        status
            .conditions
            .iter()
            .find(|c| c.type_ == "D8GpuNodeServedByNoStack")
            .expect("the alert's condition")
    }

    const MINUTE: i64 = 60_000_000_000;

    #[test]
    fn the_status_carries_the_core_s_alerts_and_its_flags_the_chart_s_defaults() {
        let (status, _) = compute(
            &MigrationState::default().whole(),
            MINUTE,
            &args(&[]).unwrap(),
            &mut Holding::default(),
        );
        let alerts: Vec<&str> = status
            .conditions
            .iter()
            .map(|c| c.type_.as_str())
            .filter(|t| t.starts_with("D8Gpu"))
            .collect();
        let core: Vec<&str> = rules::from_log().map(|r| r.name).collect();
        assert_eq!(alerts, core);
        // The chart's rule reads the stack-assigner's reason as the series
        // name it: the reasons the core keeps off on purpose, no others.
        let kept_off: Vec<&str> = rules::KEPT_OFF_ON_PURPOSE
            .iter()
            .map(|r| reason_name(*r))
            .collect();
        let matcher = format!("stack_reason!~\"{}\"", kept_off.join("|"));
        assert!(
            rules::NODE_SERVED_BY_NO_STACK.expr.contains(&matcher),
            "{matcher} in {}",
            rules::NODE_SERVED_BY_NO_STACK.expr
        );
        // The flags' defaults are the chart's thresholds'.
        let defaults = args(&[]).unwrap();
        for (flag, threshold) in [
            (defaults.move_stalled_after, rules::APPLICATION_MOVE_AGE),
            (
                defaults.claim_pending_after,
                rules::RESOURCE_CLAIM_PENDING_AGE,
            ),
            (
                defaults.claim_unused_after,
                rules::RESOURCE_CLAIM_UNUSED_AGE,
            ),
        ] {
            assert_eq!(
                Some(flag.as_secs()),
                rules::seconds(threshold.default),
                "{}",
                threshold.key
            );
        }
    }

    #[test]
    fn a_device_plugin_back_on_a_dra_node_of_the_nvidia_backend_fires_before_it_advertises() {
        use switchyard_core::backend::{Backend, NvidiaOperator};
        use switchyard_proto::v1::{ExclusivityLost, Stack};
        let backend = NvidiaOperator {
            pools: [("dra-pilot".to_string(), Stack::Dra)].into(),
            ..NvidiaOperator::default()
        };
        let mut state = MigrationState::default();
        let labels = [
            ("nvidia.com/gpu.present", "true"),
            ("gpu-scheduling.platform.example.com/pool", "dra-pilot"),
            ("nvidia.com/dra-kubelet-plugin", "true"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let evidence =
            "Device Plugin reappears on DRA node gpu-1: nvidia.com/gpu.deploy.device-plugin=true";
        for fact in [
            event(Kind::BackendConfigured(
                Backend::NvidiaOperator(Box::new(backend)).to_event(),
            )),
            event(Kind::NodeObserved(NodeObserved {
                node: "gpu-1".into(),
                labels,
                ..Default::default()
            })),
            event(Kind::ExclusivityLost(ExclusivityLost {
                node: "gpu-1".into(),
                evidence: evidence.into(),
                cordoned_by_switchyard: true,
            })),
        ] {
            state.fold(&fact, 0);
        }
        let state = state.whole();
        let args = args(&["--alerts-for", "D8GpuDevicePluginOnDraNode=0s"]).expect("valid flags");
        let (_, firing) = compute(&state, MINUTE, &args, &mut Holding::default());
        let fired: Vec<(&str, &str, &str)> = firing
            .iter()
            .map(|f| (f.alert, f.object.as_str(), f.message.as_str()))
            .collect();
        assert!(
            fired.contains(&(
                "D8GpuDevicePluginOnDraNode",
                "gpu-1",
                &format!("{evidence}: the exclusivity gate failed")
            )),
            "{fired:?}"
        );
    }

    #[test]
    fn an_alert_with_a_delay_is_pending_until_its_condition_held_that_long() {
        let state = unserved();
        let args = args(&[
            "--alerts-for",
            "D8GpuNodeServedByNoStack=15m,D8GpuUnhealthy=5m",
        ])
        .expect("valid flags");
        let mut holding = Holding::default();
        let (status, firing) = compute(&state, 10 * MINUTE, &args, &mut holding);
        let pending = served_by_no_stack(&status);
        assert_eq!(
            (pending.status.as_str(), pending.reason.as_str()),
            ("False", "Pending")
        );
        assert!(
            pending
                .message
                .starts_with("fires once this holds for 15m: node gpu-1"),
            "{}",
            pending.message
        );
        assert!(firing.is_empty(), "no Event before the delay: {firing:?}");

        let (status, firing) = compute(&state, 24 * MINUTE, &args, &mut holding);
        assert_eq!(served_by_no_stack(&status).reason, "Pending");
        assert!(firing.is_empty());

        let (status, firing) = compute(&state, 25 * MINUTE, &args, &mut holding);
        let fired = served_by_no_stack(&status);
        assert_eq!(
            (fired.status.as_str(), fired.reason.as_str()),
            ("True", "Firing")
        );
        assert_eq!(
            firing
                .iter()
                .map(|f| (f.alert, f.object.as_str()))
                .collect::<Vec<_>>(),
            vec![("D8GpuNodeServedByNoStack", "gpu-1")]
        );

        // Once it stops holding, the delay starts over.
        let (status, _) = compute(
            &MigrationState::default().whole(),
            26 * MINUTE,
            &args,
            &mut holding,
        );
        assert_eq!(served_by_no_stack(&status).reason, "NotFiring");
        let (status, firing) = compute(&state, 27 * MINUTE, &args, &mut holding);
        assert_eq!(served_by_no_stack(&status).reason, "Pending");
        assert!(firing.is_empty());
    }

    #[test]
    fn an_alert_without_a_delay_fires_at_once() {
        let mut holding = Holding::default();
        let (status, firing) = compute(&unserved(), MINUTE, &args(&[]).unwrap(), &mut holding);
        assert_eq!(served_by_no_stack(&status).reason, "Firing");
        assert_eq!(firing.len(), 1, "{firing:?}");
    }

    #[test]
    fn a_delay_for_an_unknown_alert_or_without_a_duration_is_refused_by_name() {
        let err = args(&["--alerts-for", "D8GpuNodeServedByNobody=15m"])
            .expect_err("an unknown alert refused")
            .to_string();
        assert!(
            err.contains("\"D8GpuNodeServedByNobody\" is not an alert of the module status"),
            "{err}"
        );
        // What the chart sets by default.
        let chart = args(&["--alerts-for", "D8GpuNodeServedByNoStack=15m,D8GpuNodeDraNotReady=15m,D8GpuNodeDualAdvertisement=5m,D8GpuDevicePluginOnDraNode=5m,D8GpuUnhealthy=5m"])
            .expect("the chart's delays");
        assert_eq!(
            chart.delay("D8GpuNodeDraNotReady"),
            Duration::from_secs(900)
        );
        assert_eq!(chart.delay("D8GpuResourceClaimPending"), Duration::ZERO);
        let err = args(&["--alerts-for", "D8GpuUnhealthy"])
            .expect_err("refused")
            .to_string();
        assert!(err.contains("expected ALERT=DURATION"), "{err}");
        let err = args(&["--alerts-for", "D8GpuUnhealthy=soon"])
            .expect_err("refused")
            .to_string();
        assert!(err.contains("D8GpuUnhealthy's delay \"soon\""), "{err}");
    }

    #[test]
    fn an_alert_an_earlier_run_announced_is_not_announced_again() {
        let target = ObjectReference {
            api_version: Some("gpu.deckhouse.io/v1alpha1".into()),
            kind: Some("GPUModuleStatus".into()),
            name: Some("gpu".into()),
            ..ObjectReference::default()
        };
        let on_node = Firing {
            alert: "D8GpuNodeServedByNoStack",
            object: "gpu-1".into(),
            regarding: Some(Regarding::node("gpu-1")),
            message: "node gpu-1: no stack".into(),
        };
        let on_status = Firing {
            alert: "D8GpuResourceClaimPending",
            object: "team-a/train".into(),
            regarding: None,
            message: "claim team-a/train pending for 20m".into(),
        };
        let recorded = |by: &str, f: &Firing| -> EventsV1Event {
            let (event, regarding) = event_of(f, &target);
            EventsV1Event {
                reporting_controller: Some(by.into()),
                reason: Some(event.reason),
                note: event.note,
                regarding: Some(regarding),
                ..EventsV1Event::default()
            }
        };
        let firing = [on_node.clone(), on_status.clone()];
        // Nothing recorded, or recorded by someone else: both announced.
        assert!(announced_before(&firing, &target, &[]).is_empty());
        assert!(
            announced_before(&firing, &target, &[recorded("someone-else", &on_node)]).is_empty()
        );
        // Recorded by the alerter: that one only.
        assert_eq!(
            announced_before(
                &firing,
                &target,
                &[recorded(REPORTING_CONTROLLER, &on_node)]
            ),
            BTreeSet::from([("D8GpuNodeServedByNoStack", "gpu-1".to_string())])
        );
        // What it says now differs (another object on the status, a new
        // count): announced again.
        let other = Firing {
            message: "claim team-a/train pending for 40m".into(),
            ..on_status.clone()
        };
        assert!(
            announced_before(&firing, &target, &[recorded(REPORTING_CONTROLLER, &other)])
                .is_empty()
        );
        assert_eq!(
            announced_before(
                &firing,
                &target,
                &[recorded(REPORTING_CONTROLLER, &on_status)]
            ),
            BTreeSet::from([("D8GpuResourceClaimPending", "team-a/train".to_string())])
        );
    }
}

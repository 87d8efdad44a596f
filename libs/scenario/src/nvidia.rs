//! The NVIDIA guide's migration (`../shared/reference/nvidia-dra-migration-guide.txt`)
//! on the simulated GPU Operator and DRA driver, with the services on the
//! `nvidia-operator` backend, stage by stage as the guide's table orders
//! them: the baseline register, a GPU class over the driver's attributes,
//! the pilot pool handed over node by node, the driver validated, the
//! guide's failed exclusivity gate (a device plugin put back on a DRA node)
//! caught, a pilot node rolled back in the guide's order, a native claim
//! pilot, the compatibility bridge (one unchanged `nvidia.com/gpu` manifest
//! on both pools), the application waves until the legacy pool is empty, the
//! final cutover and completion — each stage's exit evidence checked and
//! recorded as the guide's table asks, the invariants checked as it goes.

use std::collections::BTreeMap;

use switchyard_core::backend::operands;
use switchyard_core::backend::{Backend, NvidiaOperator, nvidia};
use switchyard_core::claim_allocator::Stage;
use switchyard_core::command::CheckEvidence;
use switchyard_core::names::{CLASS_RESOURCE_PREFIX, NVIDIA_GPU};
use switchyard_core::placement;
use switchyard_core::stack_assigner::StackAssigner;
use switchyard_core::{Core, ServiceName};
use switchyard_proto::v1::{
    NodeObserved, ResourceList, Stack, Toleration, Tolerations, WorkloadPlacement, WorkloadRef,
    domain_event::Kind,
};
use switchyard_runtime::{Command, Services};
use switchyard_sim::{SimConfig, Simulator};

use crate::{LogSink, Migration, Outcome, StepFailed, StepReport, Steps};

/// The pools of the guide: `legacy` on the device plugin, `dra-pilot` on DRA.
pub fn nvidia_backend() -> NvidiaOperator {
    NvidiaOperator {
        pools: BTreeMap::from([
            (LEGACY.to_string(), Stack::DevicePlugin),
            (PILOT.to_string(), Stack::Dra),
        ]),
        ..NvidiaOperator::default()
    }
}

/// One fresh core per service, the stack-assigner configured for `backend`
/// (it records the backend in the log; the others read it from there).
pub fn nvidia_cores(backend: &NvidiaOperator) -> Vec<Box<dyn Core>> {
    ServiceName::ALL
        .into_iter()
        .map(|service| match service {
            ServiceName::StackAssigner => Box::new(
                StackAssigner::default()
                    .on_backend(Backend::NvidiaOperator(Box::new(backend.clone()))),
            ) as Box<dyn Core>,
            other => other.core(),
        })
        .collect()
}

const LEGACY: &str = "legacy";
const PILOT: &str = "dra-pilot";

impl<S: Services, L: LogSink> Migration<S, L> {
    /// `switchyard evidence --stage <stage>`: Ok with the summary when every
    /// subject showed its evidence.
    pub async fn stage_evidence(&mut self, stage: Stage) -> Result<String, StepFailed> {
        let id = self.next_id(&format!("evidence-{}", stage.name()));
        let start = self.log.len();
        self.run_command(Command::CheckEvidence(CheckEvidence {
            check_id: id.clone(),
            migration_id: String::new(),
            wave: None,
            stage: Some(stage),
        }))
        .await?;
        let mut failures = Vec::new();
        for event in self.logged_since(start) {
            match &event.kind {
                Some(Kind::MigrationRefused(r)) => {
                    return Err(StepFailed::Refused(r.reason.clone()));
                }
                Some(Kind::EvidenceRecorded(r)) if r.check_id == id && !r.passed => {
                    let subject = r.workload.as_ref().map_or_else(
                        || format!("node {}", r.node),
                        |w| format!("{} {}/{}", w.kind, w.namespace, w.name),
                    );
                    for item in r.items.iter().filter(|i| !i.passed) {
                        failures.push(format!("{subject}: {}: {}", item.check, item.detail));
                    }
                }
                Some(Kind::EvidenceChecked(c)) if c.check_id == id && failures.is_empty() => {
                    return Ok(format!(
                        "{} node(s), {} workload(s) shown",
                        c.nodes, c.workloads
                    ));
                }
                _ => {}
            }
        }
        Err(StepFailed::NotReached(if failures.is_empty() {
            format!("evidence {id} was not recorded")
        } else {
            failures.join("; ")
        }))
    }

    /// The node as observed, from `from` in the log on: the first record
    /// where `pred` holds.
    fn observed(
        &self,
        from: usize,
        node: &str,
        pred: impl Fn(&NodeObserved) -> bool,
    ) -> Option<usize> {
        self.log[from..]
            .iter()
            .position(|l| matches!(&l.event.kind, Some(Kind::NodeObserved(n)) if n.node == node && pred(n)))
            .map(|i| from + i)
    }

    /// The rollback of `node` from `from` on, in the guide's order: frozen,
    /// the kubelet plugin's label removed, its slice withdrawn, the device
    /// plugin back, its GPUs allocatable, the pilot taint removed, uncordoned.
    fn rollback_order(
        &self,
        from: usize,
        node: &str,
        backend: &NvidiaOperator,
    ) -> Result<String, StepFailed> {
        let label = |n: &NodeObserved, key: &str| n.labels.get(key).cloned();
        let mode = backend.mode_label();
        let slice_gone = self.log[from..]
            .iter()
            .position(
                |l| matches!(&l.event.kind, Some(Kind::ResourceSliceRemoved(s)) if s.node == node),
            )
            .map(|i| from + i);
        let steps = [
            ("frozen", self.observed(from, node, |n| n.unschedulable)),
            (
                "plugin label removed",
                self.observed(from, node, |n| label(n, &backend.plugin_label).is_none()),
            ),
            ("slice withdrawn", slice_gone),
            (
                "device plugin on",
                self.observed(from, node, |n| {
                    label(n, nvidia::DEPLOY_DEVICE_PLUGIN).as_deref() == Some("true")
                }),
            ),
            (
                "nvidia.com/gpu allocatable",
                self.observed(from, node, |n| n.gpu_allocatable.values().sum::<u32>() > 0),
            ),
            (
                "pilot taint removed",
                self.observed(from, node, |n| {
                    label(n, nvidia::DEPLOY_DEVICE_PLUGIN).as_deref() == Some("true")
                        && !n.taints.iter().any(|t| t.key == mode)
                }),
            ),
        ];
        let mut last = 0;
        let mut order = Vec::new();
        for (name, at) in steps {
            let Some(at) = at else {
                return Err(StepFailed::NotReached(format!("{name}: not in the log")));
            };
            if at <= last {
                return Err(StepFailed::NotReached(format!(
                    "{name} (record {at}) came before the step ahead of it (record {last})"
                )));
            }
            last = at;
            order.push(name);
        }
        match self.observed(last, node, |n| !n.unschedulable) {
            Some(_) => order.push("uncordoned"),
            None => {
                return Err(StepFailed::NotReached(
                    "uncordoned: not in the log after the taint".into(),
                ));
            }
        }
        Ok(order.join(" → "))
    }
}

/// Runs the guide's migration on the simulator; `progress` hears about
/// every step as it ends.
pub async fn run_nvidia_guide<S: Services, L: LogSink>(
    config: SimConfig,
    backend: NvidiaOperator,
    services: S,
    sink: L,
    progress: impl FnMut(&StepReport),
) -> Outcome<S, L> {
    let sim = Simulator::nvidia_operator(config, backend.clone());
    let mut m = Migration::on(sim, services, sink).await;
    let mut steps = Steps::new(progress);
    let nodes: Vec<String> = m.sim.nodes_in_pool(LEGACY);
    let class = m.sim.config().card.class.clone();

    // Baseline: what each node offers and where the workloads run, before
    // anything changes.
    let result = m.stage_evidence(Stage::Baseline).await;
    steps.report(&m.sim, "baseline: register and node capacity", result);

    // A GPU class over the driver's attributes; the class-compiler
    // publishes its DeviceClass.
    let result = m.create_class(&class).await;
    steps.report(
        &m.sim,
        &format!("classes: GPU class {class} over {}", nvidia::DRIVER),
        result,
    );

    let pilot = guide_pilot_pool(&mut m, &mut steps, &nodes).await;
    guide_exclusivity_gate(&mut m, &mut steps, &pilot[0]).await;
    guide_rollback(&mut m, &mut steps, &pilot, &backend).await;
    let toleration = placement::toleration_for(&operands::pilot_taint(&backend));
    guide_native_claim_pilot(&mut m, &mut steps, &class, &toleration).await;
    guide_compatibility_bridge(&mut m, &mut steps, &toleration).await;
    guide_application_waves(&mut m, &mut steps, &class).await;

    // The final cutover: no legacy workload, no device-plugin pod anywhere.
    let result = m.stage_evidence(Stage::FinalCutover).await;
    steps.report(
        &m.sim,
        "final cutover: no legacy workloads or device-plugin pods",
        result,
    );
    guide_completion(&mut m, &mut steps, &class).await;

    steps.outcome(m).await
}

/// Pilot pool phase: hands half the nodes over with the stage's evidence; returns them.
async fn guide_pilot_pool<S: Services, L: LogSink>(
    m: &mut Migration<S, L>,
    steps: &mut Steps<impl FnMut(&StepReport)>,
    nodes: &[String],
) -> Vec<String> {
    // Pilot pool: half the nodes (one at least), handed over one by one.
    let pilot: Vec<String> = nodes[..nodes.len().div_ceil(2).min(nodes.len() - 1).max(1)].to_vec();
    for node in &pilot {
        let result = m.hand_over(node, PILOT).await;
        steps.report(&m.sim, &format!("pilot pool: hand over {node}"), result);
    }
    let result = m.stage_evidence(Stage::PilotPool).await;
    steps.report(
        &m.sim,
        "pilot pool: no dual advertisement, plug-in healthy",
        result,
    );
    let result = m.stage_evidence(Stage::DriverValidation).await;
    steps.report(&m.sim, "driver validation: slices as GFD labelled", result);
    pilot
}

/// Exclusivity gate phase: the device plugin put back on a DRA node, and caught.
async fn guide_exclusivity_gate<S: Services, L: LogSink>(
    m: &mut Migration<S, L>,
    steps: &mut Steps<impl FnMut(&StepReport)>,
    node: &str,
) {
    // The guide's failed exclusivity gate: the device plugin's label put
    // back on a DRA node. Switchyard records it, fences the node, writes the
    // label back before the pod starts, and lifts the fence.
    let node = node.to_string();
    let start = m.log.len();
    m.sim
        .set_node_label(&node, nvidia::DEPLOY_DEVICE_PLUGIN, Some("true"));
    m.pump().await;
    let lost = m
        .logged_since(start)
        .any(|e| matches!(&e.kind, Some(Kind::ExclusivityLost(l)) if l.node == node));
    let restored = m
        .logged_since(start)
        .any(|e| matches!(&e.kind, Some(Kind::ExclusivityRestored(r)) if r.node == node));
    let cordoned = m.observed(start, &node, |n| n.unschedulable).is_some();
    let serving = m.sim.operands_on(&node);
    steps.report(
        &m.sim,
        &format!("exclusivity gate: device plugin put back on {node}"),
        if lost
            && restored
            && cordoned
            && !serving.0
            && serving.1
            && m.sim.node_unschedulable(&node) == Some(false)
        {
            Ok("ExclusivityLost recorded, node cordoned, label written back, ExclusivityRestored, uncordoned".into())
        } else {
            Err(StepFailed::NotReached(format!(
                "lost: {lost}, cordoned: {cordoned}, restored: {restored}, device plugin / kubelet plugin / allocatable now: {serving:?}"
            )))
        },
    );
}

/// Rollback phase: a pilot node back to the device plugin, in the guide's order.
async fn guide_rollback<S: Services, L: LogSink>(
    m: &mut Migration<S, L>,
    steps: &mut Steps<impl FnMut(&StepReport)>,
    pilot: &[String],
    backend: &NvidiaOperator,
) {
    let node = pilot.last().cloned().unwrap_or_default();
    let start = m.log.len();
    let result = m.roll_back_node(&node).await;
    let result = result.and_then(|_| m.rollback_order(start, &node, backend));
    steps.report(
        &m.sim,
        &format!("rollback: {node} in the guide's order"),
        result,
    );
    if pilot.len() == 1 {
        // The pilot pool's only node: handed over again for what follows.
        let result = m.hand_over(&node, PILOT).await;
        steps.report(
            &m.sim,
            &format!("pilot pool: hand over {node} again"),
            result,
        );
    }
}

/// Native claim pilot phase: one pod with its own claim of the class, then deleted.
async fn guide_native_claim_pilot<S: Services, L: LogSink>(
    m: &mut Migration<S, L>,
    steps: &mut Steps<impl FnMut(&StepReport)>,
    class: &str,
    toleration: &Toleration,
) {
    // Native claim pilot: one pod with its own claim of the class, on the
    // pilot pool (it tolerates the pilot taint).
    let validation = WorkloadRef {
        namespace: "gpu-dra-pilot".into(),
        kind: "Deployment".into(),
        name: "cuda-validation".into(),
    };
    m.sim.add_workload(
        &validation,
        1,
        asking(&format!("{CLASS_RESOURCE_PREFIX}{class}"), toleration),
    );
    m.pump().await;
    let result = m.stage_evidence(Stage::NativeClaimPilot).await;
    steps.report(
        &m.sim,
        "native claim pilot: a claim of the class bound on a DRA node",
        result,
    );
    // The validation done, its pod and claim go.
    m.sim.delete_workload(&validation);
    m.pump().await;
}

/// Compatibility bridge phase: one unchanged nvidia.com/gpu manifest on both pools.
async fn guide_compatibility_bridge<S: Services, L: LogSink>(
    m: &mut Migration<S, L>,
    steps: &mut Steps<impl FnMut(&StepReport)>,
    toleration: &Toleration,
) {
    // Compatibility bridge: one unchanged nvidia.com/gpu manifest, a pod per
    // node — one more than the pilot pool has nodes — tolerating the pilot
    // taint: served by the device plugin on the legacy pool, through the
    // driver's class on the DRA pool. Then deleted.
    let bridge = WorkloadRef {
        namespace: "ml".into(),
        kind: "Deployment".into(),
        name: "bridge-check".into(),
    };
    let replicas = m.sim.nodes_in_pool(PILOT).len() as u32 + 1;
    m.sim
        .add_workload_one_per_node(&bridge, replicas, asking(NVIDIA_GPU, toleration));
    m.pump().await;
    let result = m.stage_evidence(Stage::CompatibilityBridge).await;
    steps.report(
        &m.sim,
        "compatibility bridge: one unchanged nvidia.com/gpu manifest on both pools",
        result,
    );
    m.sim.delete_workload(&bridge);
    m.pump().await;
}

/// Application waves phase: workloads moved to the DRA pool as nodes are handed over.
async fn guide_application_waves<S: Services, L: LogSink>(
    m: &mut Migration<S, L>,
    steps: &mut Steps<impl FnMut(&StepReport)>,
    class: &str,
) {
    // Application waves: move what fits on the DRA pool, hand the next
    // legacy node over, until the legacy pool is empty.
    let mut waiting: Vec<WorkloadRef> = m
        .sim
        .workloads()
        .into_iter()
        .filter(|w| {
            m.sim
                .workload_placement(w)
                .is_some_and(switchyard_core::placement::requests_nvidia_gpu)
        })
        .collect();
    loop {
        while let Some(i) = waiting
            .iter()
            .position(|w| m.sim.fits_on_class(w, PILOT, class))
        {
            let workload = waiting.remove(i);
            let result = m.move_application(&workload, PILOT, class).await;
            steps.report(
                &m.sim,
                &format!("application wave: move {}", workload.name),
                result,
            );
        }
        let Some(node) = m.sim.nodes_in_pool(LEGACY).first().cloned() else {
            break;
        };
        let result = m.hand_over(&node, PILOT).await;
        let failed = result.is_err();
        steps.report(
            &m.sim,
            &format!("application wave: hand over {node}"),
            result,
        );
        if failed {
            break;
        }
    }
    for workload in &waiting {
        steps.report(
            &m.sim,
            &format!("application wave: move {}", workload.name),
            Err(StepFailed::NotReached("no room on the DRA pool".into())),
        );
    }
    let result = m.stage_evidence(Stage::ApplicationWave).await;
    steps.report(&m.sim, "application waves: each move verified", result);
}

/// Completion phase: quotas translated, then the legacy pool retired after the trial.
async fn guide_completion<S: Services, L: LogSink>(
    m: &mut Migration<S, L>,
    steps: &mut Steps<impl FnMut(&StepReport)>,
    class: &str,
) {
    // Completion: the quotas, the chart-wide device plugin kept for the
    // trial period, then retired.
    let refusals = m.complete(LEGACY, class, false).await;
    let quota = m.sim.quota("ml", "gpu-quota").cloned().unwrap_or_default();
    let translated = !quota.contains_key("requests.nvidia.com/gpu")
        && quota.contains_key(&format!("requests.{CLASS_RESOURCE_PREFIX}{class}"));
    steps.report(
        &m.sim,
        "completion: quotas translated, the device plugin kept for the trial period",
        if translated && refusals.iter().any(|r| r.contains("trial period")) {
            Ok(refusals.join("; "))
        } else {
            Err(StepFailed::NotReached(format!(
                "quota: {quota:?}; refusals: {refusals:?}"
            )))
        },
    );
    let start = m.log.len();
    let refusals = m.complete(LEGACY, class, true).await;
    let next = m.logged_since(start).find_map(|e| match &e.kind {
        Some(Kind::SourceGroupRetired(r)) if r.group == LEGACY => Some(r.next_step.clone()),
        _ => None,
    });
    steps.report(
        &m.sim,
        "completion: after the trial period, the legacy pool retired",
        match next {
            Some(next) if refusals.is_empty() => Ok(next),
            _ => Err(StepFailed::NotReached(refusals.join("; "))),
        },
    );
}

/// A Deployment's placement asking for one `resource` in its container,
/// tolerating `toleration`, bound to no pool.
fn asking(resource: &str, toleration: &Toleration) -> WorkloadPlacement {
    WorkloadPlacement {
        container_limits: [(
            "main".to_string(),
            ResourceList {
                quantities: [(resource.to_string(), "1".to_string())].into(),
            },
        )]
        .into(),
        container_requests: BTreeMap::new(),
        node_selector: BTreeMap::new(),
        tolerations: Some(Tolerations {
            items: vec![toleration.clone()],
        }),
    }
}

//! The nvidia-operator backend against the simulated GPU Operator and DRA
//! driver: the stack-assigner moves nodes between pools by the labels those
//! watch, and at no moment does a node run the device plugin and the DRA
//! kubelet plugin at once, or advertise `nvidia.com/gpu` beside a
//! `gpu.nvidia.com` ResourceSlice.

use std::collections::{BTreeMap, BTreeSet};

use switchyard_core::backend::{Backend, NvidiaOperator};
use switchyard_core::command::StartHandover;
use switchyard_core::effects::Effect;
use switchyard_core::rollback::plan_node_rollback;
use switchyard_core::stack_assigner::{Input, StackAssigner};
use switchyard_proto::v1::{DomainEvent, NodeObserved, Stack, domain_event::Kind};
use switchyard_sim::{Card, SimConfig, Simulator};

const DP: &str = "nvidia.com/gpu.deploy.device-plugin";
const VALIDATOR: &str = "nvidia.com/gpu.deploy.operator-validator";
const PLUGIN: &str = "nvidia.com/dra-kubelet-plugin";
const MODE: &str = "gpu-scheduling.platform.example.com/mode";
const POOL: &str = "gpu-scheduling.platform.example.com/pool";

fn backend() -> NvidiaOperator {
    NvidiaOperator {
        pools: BTreeMap::from([
            ("legacy".to_string(), Stack::DevicePlugin),
            ("dra-pilot".to_string(), Stack::Dra),
        ]),
        ..NvidiaOperator::default()
    }
}

/// The stack-assigner and the simulated cluster, and every record in order.
struct World {
    core: StackAssigner,
    sim: Simulator,
    log: Vec<DomainEvent>,
    /// Slices of gpu.nvidia.com published, by node.
    slices: BTreeSet<String>,
}

impl World {
    fn new(seed: u64) -> World {
        let sim = Simulator::nvidia_operator(
            SimConfig {
                seed,
                gpu_nodes: 3,
                card: Card::h100(),
                ..SimConfig::default()
            },
            backend(),
        );
        let mut core =
            StackAssigner::default().on_backend(Backend::NvidiaOperator(Box::new(backend())));
        let log = core.catch_up(sim.now());
        World {
            core,
            sim,
            log,
            slices: BTreeSet::new(),
        }
    }

    /// Facts to the core, its effects to the simulator, the clock on when
    /// nothing else happens, until nothing is left to do; the invariant
    /// checked after every fact.
    fn settle(&mut self) {
        for _ in 0..100_000 {
            let mut facts = self.sim.take_facts();
            if facts.is_empty() {
                for effect in self.core.effects() {
                    self.sim.execute(&effect);
                }
                facts = self.sim.take_facts();
            }
            if facts.is_empty() {
                match self.sim.next_timer() {
                    Some(at) => {
                        self.sim.advance_to(at);
                        continue;
                    }
                    None => return,
                }
            }
            for fact in facts {
                match &fact.kind {
                    Some(Kind::ResourceSliceObserved(s)) => {
                        self.slices.insert(s.node.clone());
                    }
                    Some(Kind::ResourceSliceRemoved(s)) => {
                        self.slices.remove(&s.node);
                    }
                    _ => {}
                }
                let decided = self.core.handle_fact(&fact, self.sim.now());
                self.log.push(fact);
                self.log.extend(decided);
                self.check_exclusive();
            }
        }
        panic!("the world did not settle");
    }

    /// No node runs both plugins, or advertises device-plugin GPUs beside a
    /// DRA slice.
    fn check_exclusive(&self) {
        for node in ["gpu-0", "gpu-1", "gpu-2"] {
            let (device_plugin, kubelet_plugin, allocatable) = self.sim.operands_on(node);
            assert!(
                !(device_plugin && kubelet_plugin),
                "{node} runs both plugins at {}",
                self.sim.now()
            );
            assert!(
                !(allocatable > 0 && self.slices.contains(node)),
                "{node} advertises {allocatable} nvidia.com/gpu and a gpu.nvidia.com slice"
            );
        }
    }

    fn labels(&self, node: &str) -> BTreeMap<String, String> {
        self.core.cluster().nodes[node].labels.to_map()
    }
}

#[test]
fn a_node_moved_to_the_dra_pool_and_back_is_never_served_by_both_stacks() {
    let mut world = World::new(7);
    world.settle();
    // Before: the operator's device plugin everywhere, Switchyard's
    // ownership label written, nothing else changed.
    for node in ["gpu-0", "gpu-1", "gpu-2"] {
        let labels = world.labels(node);
        assert_eq!(labels.get(DP).map(String::as_str), Some("true"), "{node}");
        assert_eq!(
            labels.get(MODE).map(String::as_str),
            Some("legacy"),
            "{node}"
        );
        assert!(!labels.contains_key(PLUGIN), "{node}");
        assert_eq!(world.sim.operands_on(node), (true, false, 8), "{node}");
    }

    // The platform team puts gpu-1 into the DRA pilot pool.
    world.sim.set_pool("gpu-1", "dra-pilot");
    world.settle();
    let labels = world.labels("gpu-1");
    for (key, value) in [
        (DP, "false"),
        (VALIDATOR, "false"),
        (PLUGIN, "true"),
        (MODE, "dra"),
    ] {
        assert_eq!(
            labels.get(key).map(String::as_str),
            Some(value),
            "{key}: {labels:?}"
        );
    }
    assert_eq!(world.sim.operands_on("gpu-1"), (false, true, 0));
    assert!(world.slices.contains("gpu-1"));
    let node = &world.core.cluster().nodes["gpu-1"];
    assert!(
        node.taints
            .iter()
            .any(|t| t.key == MODE && t.value == "dra" && t.effect == "NoSchedule"),
        "the pilot taint: {:?}",
        node.taints
    );
    // The others are untouched.
    assert_eq!(world.sim.operands_on("gpu-0"), (true, false, 8));

    // And back to the legacy pool: DRA goes first, then the device plugin,
    // then the pilot taint.
    world.sim.set_pool("gpu-1", "legacy");
    world.settle();
    let labels = world.labels("gpu-1");
    for (key, value) in [(DP, "true"), (VALIDATOR, "true"), (MODE, "legacy")] {
        assert_eq!(
            labels.get(key).map(String::as_str),
            Some(value),
            "{key}: {labels:?}"
        );
    }
    assert!(!labels.contains_key(PLUGIN), "{labels:?}");
    assert_eq!(world.sim.operands_on("gpu-1"), (true, false, 8));
    assert!(!world.slices.contains("gpu-1"));
    assert!(world.core.cluster().nodes["gpu-1"].taints.is_empty());
}

#[test]
fn the_kubelet_plugin_waits_out_kubelets_grace_for_the_device_plugins_gpus() {
    let mut world = World::new(3);
    world.settle();
    let started = world.sim.now();
    world.sim.set_pool("gpu-2", "dra-pilot");
    world.settle();
    // The plugin label was written only after kubelet dropped the device
    // plugin's GPUs, five minutes after its pod stopped.
    let plugin_written = world
        .log
        .iter()
        .position(|e| {
            matches!(&e.kind, Some(Kind::NodeObserved(n))
                if n.node == "gpu-2" && n.labels.get(PLUGIN).map(String::as_str) == Some("true"))
        })
        .expect("the plugin label observed");
    let gpus_gone = world
        .log
        .iter()
        .position(|e| {
            matches!(&e.kind, Some(Kind::NodeObserved(n))
                if n.node == "gpu-2" && n.labels.get(DP).map(String::as_str) == Some("false")
                    && n.gpu_allocatable.is_empty())
        })
        .expect("the device plugin's GPUs gone");
    assert!(gpus_gone < plugin_written, "{gpus_gone} < {plugin_written}");
    assert!(world.sim.now() - started >= switchyard_sim::DEVICE_PLUGIN_GRACE);
}

#[test]
fn the_same_seed_gives_the_same_log() {
    let run = |seed| {
        let mut world = World::new(seed);
        world.settle();
        world.sim.set_pool("gpu-0", "dra-pilot");
        world.sim.set_pool("gpu-2", "dra-pilot");
        world.settle();
        world.sim.set_pool("gpu-0", "legacy");
        world.settle();
        world.log
    };
    assert_eq!(run(11), run(11));
}

#[test]
fn a_device_plugin_label_put_back_by_hand_on_a_dra_node_is_not_left_running_beside_the_plugin() {
    let mut world = World::new(5);
    world.settle();
    world.sim.set_pool("gpu-0", "dra-pilot");
    world.settle();
    assert_eq!(world.sim.operands_on("gpu-0"), (false, true, 0));
    // Someone sets the device plugin's label back to true (the guide's
    // "failed exclusivity gate"): the DaemonSet would start its pod.
    world.sim.set_node_label("gpu-0", DP, Some("true"));
    world.settle();
    // Switchyard writes it back to false before the pod starts; the plugin
    // stays; the check ran after every fact.
    assert_eq!(
        world.labels("gpu-0").get(DP).map(String::as_str),
        Some("false")
    );
    assert_eq!(world.sim.operands_on("gpu-0"), (false, true, 0));
    // The failed gate was recorded, the node cordoned meanwhile, and
    // uncordoned once the gate held again.
    let position = |pred: &dyn Fn(&Kind) -> bool| {
        world
            .log
            .iter()
            .position(|e| e.kind.as_ref().is_some_and(pred))
    };
    let lost = position(&|k| {
        matches!(k, Kind::ExclusivityLost(e) if e.node == "gpu-0"
            && e.evidence == "Device Plugin reappears on DRA node gpu-0: nvidia.com/gpu.deploy.device-plugin=true"
            && e.cordoned_by_switchyard)
    })
    .expect("ExclusivityLost recorded");
    let cordoned =
        position(&|k| matches!(k, Kind::NodeObserved(n) if n.node == "gpu-0" && n.unschedulable))
            .expect("the node cordoned");
    let restored =
        position(&|k| matches!(k, Kind::ExclusivityRestored(e) if e.node == "gpu-0" && e.uncordon))
            .expect("ExclusivityRestored recorded");
    assert!(
        lost < cordoned && lost < restored,
        "{lost} {cordoned} {restored}"
    );
    assert!(!world.core.cluster().nodes["gpu-0"].unschedulable);
    assert!(world.core.exclusivity_lost().is_empty());
}

#[test]
fn a_device_plugin_pod_on_a_dra_node_fences_the_node_while_it_runs() {
    let mut world = World::new(9);
    world.settle();
    world.sim.set_pool("gpu-1", "dra-pilot");
    world.settle();
    // The device plugin's pod is there again (its DaemonSet's selector was
    // changed by hand, say): the gate fails while it runs.
    world.sim.start_device_plugin_anyway("gpu-1");
    for fact in world.sim.take_facts() {
        let decided = world.core.handle_fact(&fact, world.sim.now());
        world.log.push(fact);
        world.log.extend(decided);
    }
    let (cordoned, evidence) = world
        .core
        .exclusivity_lost()
        .get("gpu-1")
        .expect("the gate failed")
        .clone();
    assert!(cordoned);
    // Recorded as first seen: the pod (its GPUs follow in the next fact).
    assert_eq!(
        evidence,
        "Device Plugin reappears on DRA node gpu-1: 1 device-plugin pod(s) on the node"
    );
    let effects = world.core.effects();
    assert!(
        effects.contains(&Effect::Cordon {
            node: "gpu-1".into()
        }),
        "{effects:?}"
    );
    assert!(
        effects
            .iter()
            .any(|e| matches!(e, Effect::NodeEvent { node, reason, .. } if node == "gpu-1" && reason == "ExclusivityLost")),
        "{effects:?}"
    );
}

impl World {
    /// `switchyard handover --node <node> --to <pool>`, then until settled.
    fn hand_over(&mut self, node: &str, pool: &str) -> Vec<DomainEvent> {
        let cmd = StartHandover {
            handover_id: format!("h-{node}-{pool}"),
            node: node.into(),
            target_group: pool.into(),
            force: false,
        };
        let decided = self.core.handle(Input::StartHandover(&cmd), self.sim.now());
        self.log.extend(decided.clone());
        self.settle();
        decided
    }

    /// `switchyard rollback node <node>`: planned from the log, then until settled.
    fn roll_back(&mut self, node: &str) {
        let log: Vec<(u64, DomainEvent)> = (1..).zip(self.log.iter().cloned()).collect();
        let planned = plan_node_rollback(&log, node, "rb-1").expect("a rollback planned");
        self.log.push(planned.clone());
        let decided = self.core.handle(Input::Rollback(&planned), self.sim.now());
        self.log.extend(decided);
        self.settle();
    }

    /// Where in the log the first record that `pred` holds for is.
    fn first(&self, what: &str, pred: impl Fn(&Kind) -> bool) -> usize {
        self.log
            .iter()
            .position(|e| e.kind.as_ref().is_some_and(&pred))
            .unwrap_or_else(|| panic!("{what}: not in the log"))
    }

    /// The node as observed, from `from` in the log on: the first record
    /// where `pred` holds.
    fn observed(&self, from: usize, node: &str, pred: impl Fn(&NodeObserved) -> bool) -> usize {
        from + self.log[from..]
            .iter()
            .position(
                |e| matches!(&e.kind, Some(Kind::NodeObserved(n)) if n.node == node && pred(n)),
            )
            .unwrap_or_else(|| panic!("{node}: no such observation after {from}"))
    }
}

fn label<'a>(n: &'a NodeObserved, key: &str) -> Option<&'a str> {
    n.labels.get(key).map(String::as_str)
}

#[test]
fn a_handover_to_the_dra_pool_moves_the_pool_label_after_the_drain_and_waits_for_the_guides_gates()
{
    let mut world = World::new(21);
    world.settle();
    let decided = world.hand_over("gpu-1", "dra-pilot");
    assert!(
        matches!(&decided[0].kind, Some(Kind::HandoverStarted(h)) if h.source_group == "legacy" && h.cards_before == 8),
        "{decided:?}"
    );
    let steps: Vec<&str> = world
        .log
        .iter()
        .filter_map(|e| e.kind.as_ref())
        .filter(|k| {
            matches!(
                k,
                Kind::HandoverStarted(_)
                    | Kind::NodeCordoned(_)
                    | Kind::NodeDrained(_)
                    | Kind::NodeGroupChanged(_)
                    | Kind::NodeReadinessObserved(_)
                    | Kind::NodeUncordoned(_)
                    | Kind::HandoverCompleted(_)
                    | Kind::HandoverStalled(_)
            )
        })
        .map(|k| k.type_name())
        .collect();
    assert_eq!(
        steps,
        [
            "HandoverStarted",
            "NodeCordoned",
            "NodeDrained",
            "NodeGroupChanged",
            "NodeReadinessObserved",
            "NodeUncordoned",
            "HandoverCompleted"
        ]
    );
    // The pool label moved only once the node was drained; the DRA stack
    // was decided only after it moved.
    let drained = world.first("drained", |k| matches!(k, Kind::NodeDrained(_)));
    let moved = world.observed(0, "gpu-1", |n| label(n, POOL) == Some("dra-pilot"));
    assert!(drained < moved, "{drained} < {moved}");
    let assigned = world.first(
        "DRA assigned",
        |k| matches!(k, Kind::StackAssigned(s) if s.node == "gpu-1" && s.stack() == Stack::Dra),
    );
    assert!(moved < assigned);
    // Ready on what the cluster showed: the kubelet plugin running, the
    // eight cards published, no device-plugin GPU left — and only after
    // the plugin's slice was observed.
    let ready = world.first("ready", |k| matches!(k, Kind::NodeReadinessObserved(_)));
    let Some(Kind::NodeReadinessObserved(r)) = &world.log[ready].kind else {
        unreachable!()
    };
    assert!(r.gpu_stack_dra && r.kubelet_plugin_running && !r.device_plugin_running);
    assert_eq!(
        (
            r.ready_physical_gpus,
            r.expected_physical_gpus,
            r.device_plugin_allocatable
        ),
        (8, 8, 0)
    );
    let published = world.first(
        "slice",
        |k| matches!(k, Kind::ResourceSliceObserved(s) if s.node == "gpu-1"),
    );
    assert!(published < ready);
    // After: served by DRA, uncordoned, the pilot taint on.
    let node = &world.core.cluster().nodes["gpu-1"];
    assert!(!node.unschedulable);
    assert_eq!(world.sim.operands_on("gpu-1"), (false, true, 0));
    assert!(node.taints.iter().any(|t| t.key == MODE));
    assert!(world.core.handovers().active.is_empty());
}

#[test]
fn a_handover_to_a_pool_not_configured_is_refused_naming_the_pools() {
    let mut world = World::new(1);
    world.settle();
    let decided = world.hand_over("gpu-0", "dra-prod");
    let Some(Kind::HandoverRefused(r)) = &decided[0].kind else {
        panic!("{decided:?}")
    };
    assert_eq!(
        r.reason,
        "pool dra-prod is not configured (pools: dra-pilot, legacy)"
    );
}

#[test]
fn a_rollback_runs_in_the_guides_order_and_the_device_plugin_only_once_dra_is_gone() {
    let mut world = World::new(4);
    world.settle();
    world.hand_over("gpu-2", "dra-pilot");
    let from = world.log.len();
    world.roll_back("gpu-2");
    let at = |pred: &dyn Fn(&NodeObserved) -> bool| world.observed(from, "gpu-2", pred);
    // The guide's rollback: freeze (cordon), DRA workloads removed while
    // the plugin runs, the plugin's label removed, its slices gone, the
    // device plugin and the validator back, nvidia.com/gpu allocatable,
    // the pilot taint removed, uncordon.
    let frozen = at(&|n| n.unschedulable);
    let plugin_off = at(&|n| label(n, PLUGIN).is_none());
    let slice_gone = from + world.log[from..]
        .iter()
        .position(
            |e| matches!(&e.kind, Some(Kind::ResourceSliceRemoved(s)) if s.name.contains("gpu-2")),
        )
        .expect("the slice withdrawn");
    let device_plugin_on = at(&|n| label(n, DP) == Some("true"));
    let allocatable = at(&|n| n.gpu_allocatable.get("nvidia.com/gpu") == Some(&8));
    let untainted = at(&|n| n.taints.is_empty() && label(n, DP) == Some("true"));
    let uncordoned = at(&|n| !n.unschedulable && n.taints.is_empty());
    assert!(
        frozen < plugin_off
            && plugin_off < slice_gone
            && slice_gone < device_plugin_on
            && device_plugin_on < allocatable
            && allocatable < untainted
            && untainted < uncordoned,
        "{frozen} {plugin_off} {slice_gone} {device_plugin_on} {allocatable} {untainted} {uncordoned}"
    );
    // Recorded as the rollback's compensations, and completed.
    let completed = world.first(
        "rollback completed",
        |k| matches!(k, Kind::RollbackCompleted(r) if r.rollback_id == "rb-1"),
    );
    assert!(completed > uncordoned);
    assert_eq!(world.sim.operands_on("gpu-2"), (true, false, 8));
    let labels = world.labels("gpu-2");
    assert_eq!(labels.get(POOL).map(String::as_str), Some("legacy"));
    assert_eq!(labels.get(MODE).map(String::as_str), Some("legacy"));
}

//! The migration's state as series: the reference migration's log folded
//! into the alerter's state and scraped, held against the services' own
//! states of the same log, checked by the real promtool; and the claims'
//! "since when" dated by the records that made them so.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use prometheus_client::registry::Registry;
use switchyard_alerter::state_metrics::{MigrationState, StateCollector};
use switchyard_proto::v1::{
    self, AllocatedDevice, DomainEvent, PodObserved, PodPhase, PodRemoved, ResourceClaimObserved,
    ResourceClaimRemoved, Stack, domain_event::Kind,
};
use switchyard_runtime::Local;
use switchyard_scenario::{Logged, States, run_reference};
use switchyard_sim::SimConfig;

/// One sample: its labels and value.
type Samples = BTreeMap<String, Vec<(BTreeMap<String, String>, f64)>>;

/// The OpenMetrics text the collector writes for `state`.
fn scrape(state: MigrationState) -> String {
    let mut registry = Registry::with_prefix("switchyard");
    registry.register_collector(Box::new(StateCollector::new(Arc::new(Mutex::new(state)))));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    text
}

/// The samples of `text` by series name.
fn samples(text: &str) -> Samples {
    let mut samples = Samples::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (series, value) = line.rsplit_once(' ').unwrap();
        let (name, labels) = match series.split_once('{') {
            Some((name, rest)) => (name, rest.trim_end_matches('}')),
            None => (series, ""),
        };
        let labels = labels
            .split("\",")
            .filter(|pair| !pair.is_empty())
            .map(|pair| {
                let (k, v) = pair.split_once("=\"").unwrap();
                (k.to_string(), v.trim_end_matches('"').to_string())
            })
            .collect();
        samples
            .entry(name.to_string())
            .or_default()
            .push((labels, value.parse().unwrap()));
    }
    samples
}

/// OpenMetrics text as the Prometheus text format that `promtool check
/// metrics` lints: there a counter's family carries its `_total` name, and
/// there is no `# EOF`.
fn as_prometheus_text(text: &str) -> String {
    let counters: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    text.lines()
        .filter(|l| *l != "# EOF")
        .map(|line| {
            for counter in &counters {
                for tag in ["# HELP ", "# TYPE "] {
                    if let Some(rest) = line.strip_prefix(&format!("{tag}{counter} ")) {
                        return format!("{tag}{counter}_total {rest}\n");
                    }
                }
            }
            format!("{line}\n")
        })
        .collect()
}

fn fold(log: &[Logged]) -> MigrationState {
    let mut state = MigrationState::default();
    for record in log {
        state.fold(&record.event, record.at);
    }
    state
}

fn label<'a>(labels: &'a BTreeMap<String, String>, key: &str) -> &'a str {
    labels.get(key).map_or("", String::as_str)
}

async fn reference_log() -> Vec<Logged> {
    let outcome = run_reference(SimConfig::default(), Local::default(), (), |_| {}).await;
    assert!(outcome.ok(), "the reference migration runs");
    outcome.migration.log.clone()
}

#[tokio::test]
async fn the_reference_migration_scraped_is_what_the_services_hold() {
    let log = reference_log().await;
    let states = States::replay(log.iter().map(|l| (&l.event, l.at)));
    let text = scrape(fold(&log).whole());
    let series = samples(&text);

    // Every GPU node, on the stack the stack-assigner gave it, no handover left.
    let nodes = &series["switchyard_gpu_node"];
    assert!(nodes.len() >= 2, "{text}");
    for (labels, value) in nodes {
        let node = label(labels, "node");
        let stack = match states.stack.stack_of(node) {
            Some(Stack::Dra) => "dra",
            Some(Stack::DevicePlugin) => "device-plugin",
            _ => "none",
        };
        assert_eq!(label(labels, "stack"), stack, "{node}");
        assert_eq!(label(labels, "handover_step"), "none", "{node}");
        let group = states.stack.cluster().nodes[node]
            .group()
            .unwrap_or_default();
        assert_eq!(label(labels, "node_group"), group, "{node}");
        assert_eq!(*value, 1.0);
    }
    assert!(
        nodes.iter().any(|(l, _)| label(l, "stack") == "dra")
            && nodes
                .iter()
                .any(|(l, _)| label(l, "stack") == "device-plugin"),
        "the reference leaves nodes on both stacks: {nodes:?}"
    );

    let completed = states.stack.handovers().completed.len() as f64;
    assert!(completed > 0.0);
    assert_eq!(
        series["switchyard_handovers_completed_total"][0].1,
        completed
    );
    assert!(!series.contains_key("switchyard_handover_step_started_timestamp_seconds"));

    // The GPUs allocated to claims, each device named with its card's UUID
    // from the node's ResourceSlices.
    let allocated = &series["switchyard_gpu_allocated"];
    let devices: usize = states
        .claims
        .cluster()
        .claims
        .values()
        .filter(|c| !c.node.is_empty())
        .map(|c| c.devices.len() * c.reserved_for.len().max(1))
        .sum();
    assert!(devices > 0, "the reference allocates claims");
    assert_eq!(allocated.len(), devices, "{allocated:?}");
    let uuids: Vec<&str> = states
        .claims
        .cluster()
        .slices
        .values()
        .flat_map(|s| s.devices.iter().map(|d| d.uuid.as_str()))
        .collect();
    for (labels, _) in allocated {
        let uuid = label(labels, "gpu_uuid");
        assert!(
            uuid.starts_with("GPU-") && uuids.contains(&uuid),
            "{labels:?}"
        );
        assert!(!label(labels, "device_class").is_empty(), "{labels:?}");
        assert!(!label(labels, "pod").is_empty(), "{labels:?}");
        let claim = &states.claims.cluster().claims[&(
            label(labels, "namespace").to_string(),
            label(labels, "claim").to_string(),
        )];
        assert_eq!(label(labels, "node"), claim.node);
    }

    let gpus: usize = states.claims.cluster().gpus.values().map(Vec::len).sum();
    assert!(gpus > 0);
    assert_eq!(series["switchyard_physical_gpu"].len(), gpus);

    // Folding the same log again scrapes the same text.
    assert_eq!(scrape(fold(&log).whole()), text);

    // And the real promtool's lint takes it (names, units, help).
    let promtool = switchyard_testkit::promtool_binary().expect("promtool");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("metrics.txt");
    std::fs::write(&file, as_prometheus_text(&text)).unwrap();
    let output = std::process::Command::new(&promtool)
        .args(["check", "metrics"])
        .stdin(std::fs::File::open(&file).unwrap())
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[tokio::test]
async fn nothing_is_served_until_the_state_holds_the_whole_log() {
    let log = reference_log().await;
    // Half the log folded and not yet whole: a restarted alerter rebuilding.
    let half = fold(&log[..log.len() / 2]);
    assert!(!half.caught_up());
    let text = scrape(half);
    assert!(
        !text.lines().any(|l| l.starts_with("switchyard_")),
        "{text}"
    );
    assert!(samples(&scrape(fold(&log).whole())).contains_key("switchyard_gpu_node"));
}

#[tokio::test]
async fn a_handover_in_progress_shows_its_step_and_since_when() {
    let log = reference_log().await;
    // The log up to the first node drained: its handover is at the next step.
    let drained = log
        .iter()
        .position(|l| matches!(l.event.kind, Some(Kind::NodeDrained(_))))
        .expect("a node is drained");
    let prefix = &log[..=drained];
    let states = States::replay(prefix.iter().map(|l| (&l.event, l.at)));
    let series = samples(&scrape(fold(prefix).whole()));
    let [handover] = &states.stack.handovers().active.values().collect::<Vec<_>>()[..] else {
        panic!("one handover in progress");
    };
    let [(labels, since)] = &series["switchyard_handover_step_started_timestamp_seconds"][..]
    else {
        panic!("one handover in progress")
    };
    assert_eq!(label(labels, "handover"), handover.id);
    assert_eq!(label(labels, "node"), handover.node);
    assert_eq!(label(labels, "step"), "move_group");
    assert_eq!(label(labels, "stalled"), "false");
    assert_eq!(*since, log[drained].at as f64 / 1e9);
    let node = series["switchyard_gpu_node"]
        .iter()
        .find(|(l, _)| label(l, "node") == handover.node)
        .expect("the node");
    assert_eq!(label(&node.0, "handover_step"), "move_group");
}

fn ev(kind: Kind) -> DomainEvent {
    v1::event(kind)
}

fn claim(reserved_for: &[&str], node: &str) -> DomainEvent {
    ev(Kind::ResourceClaimObserved(ResourceClaimObserved {
        namespace: "ml".into(),
        name: "train-gpu".into(),
        device_classes: vec!["a100.gpu.deckhouse.io".into()],
        node: node.into(),
        allocated: if node.is_empty() {
            vec![]
        } else {
            vec![AllocatedDevice {
                request: "gpu".into(),
                driver: "gpu.deckhouse.io".into(),
                pool: node.into(),
                device: "gpu-0".into(),
            }]
        },
        reserved_for: reserved_for.iter().map(|p| p.to_string()).collect(),
        owner_pod: String::new(),
    }))
}

fn pod(phase: PodPhase) -> DomainEvent {
    ev(Kind::PodObserved(PodObserved {
        namespace: "ml".into(),
        name: "train-0".into(),
        node: "gpu-0".into(),
        phase: phase as i32,
        ..Default::default()
    }))
}

const SECOND: i64 = 1_000_000_000;

#[test]
fn a_claim_is_pending_and_unused_since_the_records_that_made_it_so() {
    let since = |state: MigrationState, series: &str| -> Vec<(String, f64)> {
        samples(&scrape(state))
            .remove(series)
            .unwrap_or_default()
            .into_iter()
            .map(|(l, v)| {
                (
                    format!("{}/{}", label(&l, "namespace"), label(&l, "claim")),
                    v,
                )
            })
            .collect()
    };
    let pending = "switchyard_resource_claim_pending_since_timestamp_seconds";
    let unused = "switchyard_resource_claim_unused_since_timestamp_seconds";
    let mut events = vec![(claim(&[], ""), 100), (claim(&[], ""), 150)];
    let at = |events: &[(DomainEvent, i64)]| {
        let mut state = MigrationState::default();
        for (event, at) in events {
            state.fold(event, at * SECOND);
        }
        state.whole()
    };
    // Pending since it was first seen unallocated, not since it was seen again.
    assert_eq!(
        since(at(&events), pending),
        [("ml/train-gpu".into(), 100.0)]
    );
    assert_eq!(since(at(&events), unused), []);

    // Allocated and reserved for a running pod: neither.
    events.push((pod(PodPhase::Running), 200));
    events.push((claim(&["train-0"], "gpu-0"), 210));
    assert_eq!(since(at(&events), pending), []);
    assert_eq!(since(at(&events), unused), []);

    // The pod finished: unused since then, and still since then once the pod
    // is gone.
    events.push((pod(PodPhase::Succeeded), 300));
    assert_eq!(since(at(&events), unused), [("ml/train-gpu".into(), 300.0)]);
    events.push((
        ev(Kind::PodRemoved(PodRemoved {
            namespace: "ml".into(),
            name: "train-0".into(),
        })),
        400,
    ));
    assert_eq!(since(at(&events), unused), [("ml/train-gpu".into(), 300.0)]);

    // Allocated for no pod at all from the start: unused since then.
    let mut fresh = vec![(claim(&[], "gpu-0"), 500)];
    assert_eq!(since(at(&fresh), unused), [("ml/train-gpu".into(), 500.0)]);
    fresh.push((
        ev(Kind::ResourceClaimRemoved(ResourceClaimRemoved {
            namespace: "ml".into(),
            name: "train-gpu".into(),
        })),
        600,
    ));
    assert_eq!(since(at(&fresh), unused), []);
    assert_eq!(since(at(&fresh), pending), []);
}

/// On the nvidia-operator backend a DRA node misses the guide's gates, not
/// the reference's conditions (no gpu-setup-complete, no node agent there).
#[test]
fn on_the_nvidia_backend_a_dra_node_misses_the_guides_gates() {
    use switchyard_core::backend::{Backend, NvidiaOperator};
    let backend = Backend::NvidiaOperator(Box::new(NvidiaOperator {
        pools: [("dra-pilot".to_string(), Stack::Dra)].into(),
        ..NvidiaOperator::default()
    }));
    let labels: BTreeMap<String, String> = [
        ("nvidia.com/gpu.present", "true"),
        ("gpu-scheduling.platform.example.com/pool", "dra-pilot"),
        ("gpu-scheduling.platform.example.com/mode", "dra"),
        ("nvidia.com/gpu.deploy.device-plugin", "false"),
        ("nvidia.com/dra-kubelet-plugin", "true"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let mut events = vec![
        ev(Kind::BackendConfigured(backend.to_event())),
        ev(Kind::NodeObserved(v1::NodeObserved {
            node: "gpu-1".into(),
            labels,
            gpu_count: 8,
            ..Default::default()
        })),
        ev(Kind::StackAssigned(v1::StackAssigned {
            node: "gpu-1".into(),
            stack: Stack::Dra as i32,
            reason: v1::StackReason::PoolStack as i32,
            ..Default::default()
        })),
    ];
    let missing = |events: &[DomainEvent]| -> Vec<String> {
        let mut state = MigrationState::default();
        for event in events {
            state.fold(event, 0);
        }
        samples(&scrape(state.whole()))
            .remove("switchyard_gpu_node_dra_missing")
            .unwrap_or_default()
            .into_iter()
            .map(|(l, _)| format!("{} {}", label(&l, "node"), label(&l, "condition")))
            .collect()
    };
    assert_eq!(
        missing(&events),
        ["gpu-1 kubelet_plugin_running", "gpu-1 devices_published"]
    );
    events.push(ev(Kind::PodObserved(PodObserved {
        namespace: "nvidia-dra-driver-gpu".into(),
        name: "dra-driver-nvidia-gpu-kubelet-plugin-x".into(),
        node: "gpu-1".into(),
        owner: Some(v1::WorkloadRef {
            namespace: "nvidia-dra-driver-gpu".into(),
            kind: "DaemonSet".into(),
            name: "dra-driver-nvidia-gpu-kubelet-plugin".into(),
        }),
        phase: PodPhase::Running as i32,
        labels: [(
            "dra-driver-nvidia-gpu-component".to_string(),
            "kubelet-plugin".to_string(),
        )]
        .into(),
        ..Default::default()
    })));
    events.push(ev(Kind::ResourceSliceObserved(v1::ResourceSliceObserved {
        name: "gpu-1-gpu.nvidia.com".into(),
        driver: "gpu.nvidia.com".into(),
        node: "gpu-1".into(),
        pool: "gpu-1".into(),
        devices: 8,
        device_list: (0..8)
            .map(|i| v1::SliceDevice {
                name: format!("gpu-{i}"),
                r#type: "gpu".into(),
                uuid: format!("GPU-{i}"),
                ..Default::default()
            })
            .collect(),
    })));
    assert_eq!(missing(&events), Vec::<String>::new());
}

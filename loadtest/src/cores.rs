//! The decision cores at cluster scale: synthetic facts for N nodes × G GPUs and
//! W workloads, then the figures docs/benchmarks.md reports.

use std::collections::BTreeMap;
use std::time::Instant;

use serde_json::{Value, json};
use switchyard_core::claim_allocator::{self, ClaimAllocator};
use switchyard_core::command::StartHandover;
use switchyard_core::names::{
    GPU_SETUP_COMPLETE_LABEL, GPU_STACK_LABEL, GROUP_LABEL, MODULE_NAMESPACE, NODE_AGENT_APP,
    NODE_AGENT_POD_LABELS, NODE_ROLE_PREFIX, VENDOR_ADAPTER_APP,
};
use switchyard_core::stack_assigner::{Input, StackAssigner};
use switchyard_eventlog::embedded::{Durability, EmbeddedLog, EmbeddedOptions};
use switchyard_eventlog::{Decoded, EventLog, Expected, NewEvent, Subject};
use switchyard_proto::v1::{
    DomainEvent, GpuPhase, GpuSharing, GpuSpec, ModuleSettingsObserved, NodeGroupObserved,
    NodeObserved, NodeProvisioning, PhysicalGpuObserved, PodObserved, PodPhase, PodRemoved,
    ResourceList, WorkloadObserved, WorkloadPlacement, WorkloadRef, domain_event::Kind,
};

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, default_value_t = 10_000)]
    nodes: usize,
    #[arg(long, default_value_t = 8)]
    gpus_per_node: u32,
    #[arg(long, default_value_t = 50_000)]
    workloads: usize,
    /// Events in the log that is replayed.
    #[arg(long, default_value_t = 1_000_000)]
    replay_events: usize,
    /// Nodes handed over together in one wave.
    #[arg(long, default_value_t = 100)]
    wave: usize,
}

pub(crate) fn ev(kind: Kind) -> DomainEvent {
    DomainEvent { kind: Some(kind) }
}

const GROUPS: usize = 10;

fn group_of(i: usize) -> String {
    format!("gpu-{}", i % GROUPS)
}

pub(crate) fn node_fact(
    name: &str,
    group: &str,
    unschedulable: bool,
    extra: &[(&str, &str)],
    gpus: u32,
) -> DomainEvent {
    let mut labels: BTreeMap<String, String> = extra
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    labels.insert(GROUP_LABEL.into(), group.into());
    labels.insert(format!("{NODE_ROLE_PREFIX}{group}"), String::new());
    labels.insert(
        "nvidia.com/gpu.product".into(),
        "NVIDIA-A100-SXM4-40GB".into(),
    );
    ev(Kind::NodeObserved(NodeObserved {
        node: name.into(),
        labels,
        taints: Vec::new(),
        unschedulable,
        provisioning: NodeProvisioning::Manual as i32,
        gpu_count: gpus,
        ..Default::default()
    }))
}

/// Facts of the whole synthetic cluster: groups, module settings, nodes, GPUs,
/// workloads (one pod each).
fn cluster_facts(args: &Args) -> Vec<DomainEvent> {
    let mut facts = Vec::new();
    for g in 0..GROUPS {
        facts.push(ev(Kind::NodeGroupObserved(NodeGroupObserved {
            group: format!("gpu-{g}"),
            node_type: "Static".into(),
            gpu: (g % 2 == 0).then(|| GpuSpec {
                sharing: GpuSharing::Exclusive as i32,
                ..Default::default()
            }),
            ..Default::default()
        })));
    }
    facts.push(ev(Kind::NodeGroupObserved(NodeGroupObserved {
        group: "gpu-dra".into(),
        ..Default::default()
    })));
    facts.push(ev(Kind::ModuleSettingsObserved(ModuleSettingsObserved {
        dra_enabled: false,
        feature_gates_ready: true,
        module_version: "2.0.0".into(),
        previous_module_version: String::new(),
        ..Default::default()
    })));
    for i in 0..args.nodes {
        let name = format!("node-{i:05}");
        facts.push(node_fact(
            &name,
            &group_of(i),
            false,
            &[(GPU_STACK_LABEL, "device-plugin")],
            args.gpus_per_node,
        ));
        for g in 0..args.gpus_per_node {
            facts.push(ev(Kind::PhysicalGpuObserved(PhysicalGpuObserved {
                name: format!("{name}-gpu-{g}"),
                node: name.clone(),
                index: g,
                uuid: format!("GPU-{i:05}-{g}"),
                product: "NVIDIA-A100-SXM4-40GB".into(),
                device: "a100-sxm4-40gb".into(),
                memory_mib: 40_960,
                phase: GpuPhase::Ready as i32,
            })));
        }
    }
    for w in 0..args.workloads {
        let workload = WorkloadRef {
            namespace: format!("ns-{}", w % 100),
            kind: "Deployment".into(),
            name: format!("app-{w}"),
        };
        let placement = WorkloadPlacement {
            container_limits: [(
                "main".to_string(),
                ResourceList {
                    quantities: [("nvidia.com/gpu".to_string(), "1".to_string())].into(),
                },
            )]
            .into(),
            container_requests: BTreeMap::new(),
            node_selector: [(GROUP_LABEL.to_string(), group_of(w))].into(),
            tolerations: None,
        };
        facts.push(ev(Kind::WorkloadObserved(WorkloadObserved {
            workload: Some(workload.clone()),
            replicas: 1,
            placement: Some(placement),
            managed_by: String::new(),
            owner: None,
            restarted_at: String::new(),
        })));
        facts.push(ev(Kind::PodObserved(PodObserved {
            namespace: workload.namespace.clone(),
            name: format!("app-{w}-0"),
            node: format!("node-{:05}", w % args.nodes),
            owner: Some(workload),
            phase: PodPhase::Running as i32,
            app: format!("app-{w}"),
            ..Default::default()
        })));
    }
    facts
}

fn rss_kib() -> u64 {
    crate::rss_kib().unwrap_or(0)
}

fn percentile(sorted: &[u128], p: f64) -> u128 {
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

/// Runs the cores' benchmarks on synthetic facts and reports their figures.
pub async fn run(args: Args) -> anyhow::Result<Value> {
    let facts = cluster_facts(&args);
    let total_gpus = args.nodes as u64 * u64::from(args.gpus_per_node);
    let (projection_bytes_per_gpu, projection_rss_per_gpu, by_core) =
        projection_memory(&facts, total_gpus);
    let mut stack = StackAssigner::default();
    let mut claims = ClaimAllocator::default();
    let mut log: Vec<DomainEvent> = Vec::with_capacity(facts.len() * 2);
    let load_start = Instant::now();
    for fact in &facts {
        let d = stack.handle_fact(fact, 0);
        claims.apply(fact, 0);
        log.push(fact.clone());
        log.extend(d);
    }
    let load_s = load_start.elapsed().as_secs_f64();
    drop(facts);

    let (full_assignment_ms, reassigned) = full_assignment(&mut stack, &mut log);
    let latencies = decision_latencies(&args, &mut stack, &mut claims, &mut log);
    let waves_per_s = handover_waves(&args, &mut stack, &mut log)?;

    // 4. Replay: a log of `replay_events` events on disk, read, decoded and folded.
    let dir = tempfile::tempdir()?;
    let disk = EmbeddedLog::open(
        dir.path(),
        EmbeddedOptions {
            durability: Durability::NoSync,
            ..Default::default()
        },
    )?;
    write_replay_log(&disk, log, args.replay_events).await?;
    let start = Instant::now();
    let mut replayed = StackAssigner::default();
    let folded = switchyard_eventlog::replay(&disk, 1, |stored| {
        if let Decoded::Event(event) = stored.decode() {
            replayed.apply_owned(event, stored.envelope.recorded_at_unix_nanos);
        }
    })
    .await?;
    let replay_s = start.elapsed().as_secs_f64();

    Ok(json!({
        "benchmark": "cores",
        "nodes": args.nodes,
        "gpus": total_gpus,
        "workloads": args.workloads,
        "load_facts_s": load_s,
        "full_assignment_ms": full_assignment_ms,
        "full_assignment_decisions": reassigned,
        "decision_latency_ns": {"p50": percentile(&latencies, 0.5), "p99": percentile(&latencies, 0.99), "events": latencies.len()},
        "handover_waves_per_s": waves_per_s,
        "handover_wave_size": args.wave,
        "replay_events": folded,
        "replay_s": replay_s,
        "projection_bytes_per_gpu": projection_bytes_per_gpu,
        "projection_bytes_per_gpu_by_core": by_core,
        "projection_rss_bytes_per_gpu": projection_rss_per_gpu,
        "peak_rss_kib": crate::peak_rss_kib(),
    }))
}

/// Memory phase: the projections' bytes per GPU (live, RSS, and live by core).
fn projection_memory(facts: &[DomainEvent], total_gpus: u64) -> (u64, u64, Value) {
    // Memory of the projections alone: the two cores of one process that hold
    // cluster facts (stack-assigner, claim-allocator), without the log; and
    // each core's part (what its folds left allocated).
    crate::count_bytes(true);
    let live_before = crate::live_bytes();
    let rss_before = rss_kib();
    let mut stack = StackAssigner::default();
    let mut claims = ClaimAllocator::default();
    let (mut stack_bytes, mut claims_bytes) = (0isize, 0isize);
    for fact in facts {
        let before = crate::live_bytes();
        stack.handle_fact(fact, 0);
        let between = crate::live_bytes();
        claims.apply(fact, 0);
        stack_bytes += between - before;
        claims_bytes += crate::live_bytes() - between;
    }
    let live = (crate::live_bytes() - live_before).max(0) as u64;
    crate::count_bytes(false);
    let rss = rss_kib().saturating_sub(rss_before) * 1024;
    drop((stack, claims));
    let per_gpu = |bytes: isize| bytes.max(0) as u64 / total_gpus.max(1);
    (
        live / total_gpus.max(1),
        rss / total_gpus.max(1),
        json!({"stack_assigner": per_gpu(stack_bytes), "claim_allocator": per_gpu(claims_bytes)}),
    )
}

/// Step 1, full stack assignment: returns its time (ms) and its decisions.
fn full_assignment(stack: &mut StackAssigner, log: &mut Vec<DomainEvent>) -> (f64, usize) {
    // 1. Full stack assignment: DRA turned on, every node decided again.
    let flip = ev(Kind::ModuleSettingsObserved(ModuleSettingsObserved {
        dra_enabled: true,
        feature_gates_ready: true,
        module_version: "2.0.0".into(),
        previous_module_version: String::new(),
        ..Default::default()
    }));
    let start = Instant::now();
    let decisions = stack.handle_fact(&flip, 1);
    let full_assignment_ms = start.elapsed().as_secs_f64() * 1000.0;
    let reassigned = decisions.len();
    log.push(flip);
    log.extend(decisions);
    (full_assignment_ms, reassigned)
}

/// Step 2, decision latency per event: returns the latencies (ns), sorted.
fn decision_latencies(
    args: &Args,
    stack: &mut StackAssigner,
    claims: &mut ClaimAllocator,
    log: &mut Vec<DomainEvent>,
) -> Vec<u128> {
    // 2. Decision latency per event: node relabels, pod churn, GPU health.
    let mut latencies = Vec::with_capacity(20_000);
    for i in 0..20_000usize {
        let n = (i * 7919) % args.nodes;
        let name = format!("node-{n:05}");
        let fact = match i % 3 {
            0 => node_fact(&name, &group_of(n + i), false, &[], args.gpus_per_node),
            1 => ev(Kind::PodRemoved(PodRemoved {
                namespace: format!("ns-{}", n % 100),
                name: format!("gone-{i}"),
            })),
            _ => ev(Kind::PhysicalGpuObserved(PhysicalGpuObserved {
                name: format!("{name}-gpu-0"),
                node: name.clone(),
                device: "a100-sxm4-40gb".into(),
                phase: GpuPhase::Ready as i32,
                ..Default::default()
            })),
        };
        let start = Instant::now();
        let d = stack.handle_fact(&fact, 2);
        claims.handle(claim_allocator::Input::Fact(&fact), 0);
        latencies.push(start.elapsed().as_nanos());
        log.push(fact);
        log.extend(d);
    }
    latencies.sort_unstable();
    latencies
}

/// Step 3, handover waves: returns the waves per second.
fn handover_waves(
    args: &Args,
    stack: &mut StackAssigner,
    log: &mut Vec<DomainEvent>,
) -> anyhow::Result<f64> {
    // 3. Handover waves: `wave` nodes handed over together, step by step.
    let waves = 5usize;
    let start = Instant::now();
    for wave in 0..waves {
        let nodes: Vec<String> = (0..args.wave)
            .map(|k| format!("node-{:05}", wave * args.wave + k))
            .collect();
        for node in &nodes {
            let cmd = StartHandover {
                handover_id: format!("w{wave}-{node}"),
                node: node.clone(),
                target_group: "gpu-dra".into(),
                force: false,
            };
            log.extend(stack.handle(Input::StartHandover(&cmd), 3));
        }
        for node in &nodes {
            for fact in step_facts(stack, node, args.gpus_per_node) {
                log.extend(stack.handle_fact(&fact, 4));
                log.push(fact);
            }
        }
        let done = nodes
            .iter()
            .filter(|n| {
                stack
                    .handovers()
                    .completed
                    .contains_key(&format!("w{wave}-{n}"))
            })
            .count();
        anyhow::ensure!(
            done == nodes.len(),
            "wave {wave}: {done} of {} handovers completed",
            nodes.len()
        );
    }
    Ok(waves as f64 / start.elapsed().as_secs_f64())
}

/// Step 4 setup: `replay_events` events of `log` appended to `disk` in batches.
async fn write_replay_log(
    disk: &EmbeddedLog,
    log: Vec<DomainEvent>,
    replay_events: usize,
) -> anyhow::Result<()> {
    let subject = Subject::new("replay.bench")?;
    let mut batch = Vec::with_capacity(1000);
    for (written, event) in log.iter().cycle().take(replay_events).enumerate() {
        batch.push(NewEvent::new(
            format!("e{written}"),
            written as i64,
            event.clone(),
        ));
        if batch.len() == 1000 {
            disk.append(&subject, Expected::Any, std::mem::take(&mut batch))
                .await?;
        }
    }
    if !batch.is_empty() {
        disk.append(&subject, Expected::Any, batch).await?;
    }
    drop(log);
    Ok(())
}

fn group_of_node(node: &str) -> String {
    let i: usize = node.trim_start_matches("node-").parse().unwrap_or(0);
    group_of(i)
}

/// The facts a node produces while it is handed over, as the platform reports them.
fn step_facts(stack: &StackAssigner, node: &str, gpus: u32) -> Vec<DomainEvent> {
    let mut facts = vec![node_fact(node, &group_of_node(node), true, &[], gpus)];
    for key in stack
        .cluster()
        .pods_on(node)
        .map(|(k, _)| k.clone())
        .collect::<Vec<_>>()
    {
        facts.push(ev(Kind::PodRemoved(PodRemoved {
            namespace: key.0,
            name: key.1,
        })));
    }
    // Moved: preparation for DRA has started (gpu-setup-complete taken away).
    facts.push(node_fact(
        node,
        "gpu-dra",
        true,
        &[(GPU_STACK_LABEL, "dra")],
        gpus,
    ));
    for app in [NODE_AGENT_APP, VENDOR_ADAPTER_APP] {
        // The node agent as Switchyard's chart labels it.
        let labels = if app == NODE_AGENT_APP {
            NODE_AGENT_POD_LABELS
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        } else {
            [("app".to_string(), app.to_string())].into()
        };
        facts.push(ev(Kind::PodObserved(PodObserved {
            namespace: MODULE_NAMESPACE.into(),
            name: format!("{app}-{node}"),
            node: node.into(),
            owner: Some(WorkloadRef {
                namespace: MODULE_NAMESPACE.into(),
                kind: "DaemonSet".into(),
                name: app.into(),
            }),
            phase: PodPhase::Running as i32,
            app: app.into(),
            labels,
            ..Default::default()
        })));
    }
    facts.push(node_fact(
        node,
        "gpu-dra",
        true,
        &[(GPU_STACK_LABEL, "dra"), (GPU_SETUP_COMPLETE_LABEL, "")],
        gpus,
    ));
    facts.push(node_fact(
        node,
        "gpu-dra",
        false,
        &[(GPU_STACK_LABEL, "dra"), (GPU_SETUP_COMPLETE_LABEL, "")],
        gpus,
    ));
    facts
}

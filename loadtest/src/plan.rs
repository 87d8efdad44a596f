//! `switchyard plan` at cluster scale: the register and the waves computed
//! from a snapshot of N nodes × G A100 cards (PhysicalGPUs, device-plugin
//! allocatable) in the source group and W workloads on them — Deployments
//! and StatefulSets of 1 or 2 pods asking 1 or 2 GPUs, every third
//! Helm-managed, every fifth under a PodDisruptionBudget — packed onto the
//! nodes, the target group empty. Timed: `plan()` alone, from the snapshot
//! of k8s-openapi objects to the serde-serialisable plan (reading the slices
//! the source nodes would publish included: by node class, or with
//! `--every-node` every node's up front — the same plan, compare the
//! digests).

use std::time::Instant;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use switchyard_gpu::publish::Layout;
use switchyard_planner::{self as plan, PlanRequest, Reading, Snapshot};

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, default_value_t = 10_000)]
    nodes: usize,
    #[arg(long, default_value_t = 8)]
    gpus_per_node: u32,
    #[arg(long, default_value_t = 50_000)]
    workloads: usize,
    /// Nodes handed over at once (the command's default is 1).
    #[arg(long, default_value_t = 1)]
    max_unavailable: usize,
    /// Plans computed from the same snapshot (each must give the same bytes).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Read every handed-over node's slices up front, not by node class (the
    /// plan the classes must agree with: compare the digests).
    #[arg(long)]
    every_node: bool,
}

fn from_json<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).expect("a valid object")
}

fn snapshot(args: &Args) -> Snapshot {
    let mut s = Snapshot {
        node_groups: vec![
            from_json(json!({"apiVersion": "deckhouse.io/v1", "kind": "NodeGroup",
                "metadata": {"name": "gpu"}, "spec": {"nodeType": "Static", "gpu": {"sharing": "Exclusive"}}})),
            from_json(json!({"apiVersion": "deckhouse.io/v1", "kind": "NodeGroup",
                "metadata": {"name": "gpu-dra"}, "spec": {"nodeType": "Static"}})),
        ],
        gpu_classes: vec![from_json(
            json!({"apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "GPUClass",
            "metadata": {"name": "a100"},
            "spec": {"selector": {"matchLabels": {"gpu.deckhouse.io/device": "a100-sxm4-40gb"}}}}),
        )],
        device_classes: vec![from_json(
            json!({"metadata": {"name": "a100.gpu.deckhouse.io"},
            "spec": {"selectors": [{"cel": {"expression":
                "device.driver == \"gpu.deckhouse.io\" && device.attributes[\"gpu.deckhouse.io\"].type == \"gpu\" && device.attributes[\"gpu.deckhouse.io\"].device == \"a100-sxm4-40gb\""}}]}}),
        )],
        ..Default::default()
    };
    let g = args.gpus_per_node;
    for n in 0..args.nodes {
        let name = format!("gpu-{n:05}");
        s.nodes.push(from_json(json!({"metadata": {"name": name, "labels": {
                "node.deckhouse.io/group": "gpu", "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}},
            "status": {"allocatable": {"nvidia.com/gpu": g.to_string(), "cpu": "64"}}})));
        for i in 0..g {
            s.physical_gpus.push(from_json(json!({
                "apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "PhysicalGPU",
                "metadata": {"name": format!("{name}-gpu-{i}"), "labels": {"gpu.deckhouse.io/device": "a100-sxm4-40gb"}},
                "spec": {"node": name, "index": i, "uuid": format!("GPU-{n:08x}-{i:04x}"), "product": "NVIDIA A100-SXM4-40GB"},
                "status": {"phase": "Ready", "capabilities": {"architecture": "Ampere", "computeAPI": "CUDA",
                    "computeCapability": "8.0", "memoryMiB": 40960, "partitionSupport": ["MIG", "TimeSlicing"]}}})));
        }
    }
    // Pack the workloads' pods onto the nodes in order.
    let (mut node, mut used) = (0usize, 0u32);
    for w in 0..args.workloads {
        let gpus = if w % 4 == 3 { 2 } else { 1 };
        let replicas = if w % 10 == 9 { 2 } else { 1 };
        let kind = if w % 7 == 6 {
            "StatefulSet"
        } else {
            "Deployment"
        };
        let ns = format!("team-{}", w % 50);
        let name = format!("app-{w:05}");
        let mut meta = json!({"namespace": ns, "name": name});
        if w % 3 == 0 {
            meta["labels"] = json!({"app.kubernetes.io/managed-by": "Helm"});
            meta["annotations"] = json!({"meta.helm.sh/release-name": name});
        }
        let container = json!([{"name": "main", "image": "cuda",
            "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}}]);
        let spec = json!({"replicas": replicas, "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"nodeSelector": {"node.deckhouse.io/group": "gpu"}, "containers": container}}});
        if kind == "Deployment" {
            s.deployments
                .push(from_json(json!({"metadata": meta, "spec": spec})));
        } else {
            s.stateful_sets
                .push(from_json(json!({"metadata": meta, "spec": spec})));
        }
        if w % 5 == 0 {
            s.pod_disruption_budgets.push(from_json(
                json!({"metadata": {"namespace": ns, "name": name},
                "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": name}}}}),
            ));
        }
        for r in 0..replicas {
            if used + gpus > g {
                node += 1;
                used = 0;
            }
            if node >= args.nodes {
                break;
            }
            used += gpus;
            let (owner_kind, owner, pod_name, labels) = if kind == "Deployment" {
                (
                    "ReplicaSet",
                    format!("{name}-6b7f9"),
                    format!("{name}-6b7f9-{r}"),
                    json!({"app": name, "pod-template-hash": "6b7f9"}),
                )
            } else {
                (
                    "StatefulSet",
                    name.clone(),
                    format!("{name}-{r}"),
                    json!({"app": name}),
                )
            };
            s.pods.push(from_json(
                json!({"metadata": {"namespace": ns, "name": pod_name, "labels": labels,
                    "ownerReferences": [{"apiVersion": "apps/v1", "kind": owner_kind, "name": owner,
                        "uid": "u", "controller": true}]},
                "spec": {"nodeName": format!("gpu-{node:05}"), "containers": container},
                "status": {"phase": "Running"}}),
            ));
        }
    }
    s
}

pub async fn run(args: Args) -> anyhow::Result<Value> {
    let started = Instant::now();
    let snapshot = snapshot(&args);
    let built_s = started.elapsed().as_secs_f64();
    let request = PlanRequest {
        from: "gpu".into(),
        to: "gpu-dra".into(),
        class: None,
        max_unavailable: args.max_unavailable,
        layout: Layout::Static,
        namespace: None,
        backend: Default::default(),
    };
    let reading = if args.every_node {
        Reading::EveryNode
    } else {
        Reading::ByClass
    };
    let mut runs = Vec::new();
    let mut digests = Vec::new();
    let mut summary = json!({});
    for _ in 0..args.runs.max(1) {
        // Timed as the CLI runs it: the allocator's byte counter (atomics on
        // every allocation, shared by both threads) stays off.
        let t = Instant::now();
        let plan = plan::plan_reading(&snapshot, &request, reading)?;
        let plan_s = t.elapsed().as_secs_f64();
        let t = Instant::now();
        let bytes = serde_json::to_vec(&plan)?;
        let json_s = t.elapsed().as_secs_f64();
        digests.push(hex_digest(&bytes));
        runs.push(json!({"plan_s": plan_s, "json_s": json_s}));
        summary = json!({
            "register": plan.register.len(),
            "waves": plan.waves.len(),
            "moves": plan.waves.iter().map(|w| w.moves.len()).sum::<usize>(),
            "pods_placed": plan.waves.iter().flat_map(|w| &w.moves).map(|m| m.pods.len()).sum::<usize>(),
            "pending_in_waves": plan.waves.iter().map(|w| w.pending.len()).sum::<usize>(),
            "remaining": plan.remaining.len(),
            "blocked_nodes": plan.blocked.as_ref().map_or(0, |b| b.nodes.len()),
            "complete": plan.complete,
            "json_bytes": bytes.len(),
        });
    }
    // Then once more, counted: what the plan allocates, its peak above the
    // snapshot and what it keeps.
    crate::count_bytes(true);
    let before = crate::live_bytes();
    crate::reset_peak();
    let plan = plan::plan_reading(&snapshot, &request, reading)?;
    let (peak, allocated) = crate::peak_and_allocated_bytes();
    let kept = crate::live_bytes() - before;
    crate::count_bytes(false);
    digests.push(hex_digest(&serde_json::to_vec(&plan)?));
    drop(plan);
    let mib = |b: isize| (b as f64 / 1048576.0 * 10.0).round() / 10.0;
    let memory = json!({
        "plan_peak_mib": mib(peak - before),
        "plan_allocated_mib": mib(allocated),
        "plan_kept_mib": mib(kept),
    });
    let identical = digests.windows(2).all(|w| w[0] == w[1]);
    anyhow::ensure!(
        identical,
        "the same snapshot gave different plans: {digests:?}"
    );
    Ok(json!({
        "nodes": args.nodes,
        "gpus_per_node": args.gpus_per_node,
        "workloads": args.workloads,
        "pods": snapshot.pods.len(),
        "max_unavailable": args.max_unavailable,
        "reading": format!("{reading:?}"),
        "snapshot_build_s": built_s,
        "runs": runs,
        "memory": memory,
        "identical_bytes": identical,
        "digest": digests[0],
        "plan": summary,
        "peak_rss_kib": crate::peak_rss_kib(),
    }))
}

fn hex_digest(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

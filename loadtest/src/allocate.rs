//! Allocation throughput: ours against the Kubernetes structured allocator
//! (tools/alloc-oracle, Go, k8s.io/dynamic-resource-allocation v0.36.3) on
//! identical inputs, same machine, same run.
//!
//! The cluster: N nodes × 8 A100-SXM4-40GB cards published as partitionable
//! devices (per card: the whole card and its MIG profiles 1g.5gb ×7,
//! 2g.10gb ×3, 3g.20gb ×2, all drawing on the card's shared counters), as
//! NVIDIA's driver publishes them. The claims: whole cards, MIG slices by
//! profile, and cards picked by a memory selector, in a fixed mix.
//!
//! Both sides run the same loop (see `alloc-oracle bench`): each claim in
//! turn, one scheduler attempt per node starting at node `i mod N` until one
//! fits, on top of every allocation made before. Both print a digest of all
//! decisions; they must be equal, or the figures compare different work.

use std::io::Write;
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use switchyard_dra::alloc::{AllocatedState, Allocator, Inventory, Objects, claim_name};
use switchyard_dra::cel::Compiler;

#[derive(clap::Args)]
pub struct Args {
    #[arg(long, default_value_t = 500)]
    nodes: usize,
    #[arg(long, default_value_t = 5000)]
    claims: usize,
}

const DRIVER: &str = "gpu.deckhouse.io";
const PROFILES: &[(&str, &str, u32, usize)] = &[
    ("1g.5gb", "5Gi", 1, 7),
    ("2g.10gb", "10Gi", 2, 3),
    ("3g.20gb", "20Gi", 3, 2),
];

fn gpu_devices(card: usize) -> Vec<Value> {
    let counters = |memory: &str, slices: u32| json!([{"counterSet": format!("gpu-{card}"), "counters": {"memory": {"value": memory}, "slices": {"value": slices.to_string()}}}]);
    let attributes = |kind: &str| {
        json!({
            "type": {"string": kind},
            "productName": {"string": "NVIDIA A100-SXM4-40GB"},
            "architecture": {"string": "Ampere"},
            "index": {"int": card},
            "uuid": {"string": format!("GPU-{card:08}")},
            "driverVersion": {"version": "550.54.15"},
        })
    };
    let mut devices = vec![json!({
        "name": format!("gpu-{card}"),
        "attributes": attributes("gpu"),
        "capacity": {"memory": {"value": "40Gi"}, "multiprocessors": {"value": "108"}},
        "consumesCounters": counters("40Gi", 7),
    })];
    for (profile, memory, slices, count) in PROFILES {
        for i in 0..*count {
            let mut a = attributes("mig");
            a["profile"] = json!({"string": profile});
            a["parentUUID"] = json!({"string": format!("GPU-{card:08}")});
            devices.push(json!({
                "name": format!("gpu-{card}-mig-{}-{i}", profile.replace('.', "-")),
                "attributes": a,
                "capacity": {"memory": {"value": memory}},
                "consumesCounters": counters(memory, *slices),
            }));
        }
    }
    devices
}

fn objects(nodes: usize, claims: usize) -> Vec<Value> {
    let mut out = Vec::new();
    for n in 0..nodes {
        let node = format!("node-{n:04}");
        out.push(json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}}}));
        let pool = json!({"name": node, "generation": 1, "resourceSliceCount": 3});
        let sets: Vec<Value> = (0..8)
            .map(|c| json!({"name": format!("gpu-{c}"), "counters": {"memory": {"value": "40Gi"}, "slices": {"value": "7"}}}))
            .collect();
        out.push(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": format!("{node}-counters")},
            "spec": {"driver": DRIVER, "nodeName": node, "pool": pool, "sharedCounters": sets}}));
        // At most 64 devices per slice with counters: four cards a slice.
        for half in 0..2 {
            let devices: Vec<Value> = (half * 4..half * 4 + 4).flat_map(gpu_devices).collect();
            out.push(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": format!("{node}-gpus-{half}")},
                "spec": {"driver": DRIVER, "nodeName": node, "pool": pool, "devices": devices}}));
        }
    }
    let class = |name: &str, expr: &str| {
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": expr}}]}})
    };
    out.push(class("gpu", "device.driver == 'gpu.deckhouse.io' && device.attributes['gpu.deckhouse.io'].type == 'gpu'"));
    out.push(class("mig", "device.driver == 'gpu.deckhouse.io' && device.attributes['gpu.deckhouse.io'].type == 'mig'"));
    for c in 0..claims {
        let (class, selector, count) = match c % 10 {
            0..=2 => ("gpu", None, 1),
            3..=5 => (
                "mig",
                Some("device.attributes['gpu.deckhouse.io'].profile == '1g.5gb'"),
                1,
            ),
            6 | 7 => (
                "mig",
                Some("device.attributes['gpu.deckhouse.io'].profile == '3g.20gb'"),
                1,
            ),
            8 => (
                "mig",
                Some("device.capacity['gpu.deckhouse.io'].memory.compareTo(quantity('10Gi')) >= 0"),
                2,
            ),
            _ => (
                "gpu",
                Some("device.attributes['gpu.deckhouse.io'].productName.matches('^NVIDIA A100')"),
                1,
            ),
        };
        let mut exactly = json!({"deviceClassName": class, "count": count});
        if let Some(s) = selector {
            exactly["selectors"] = json!([{"cel": {"expression": s}}]);
        }
        out.push(json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": format!("claim-{c:05}"), "namespace": "bench", "uid": format!("uid-{c}")},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}));
    }
    out
}

/// The bench loop of `alloc-oracle bench`, on our allocator.
fn ours(objects: &Objects) -> anyhow::Result<Value> {
    let compiler = Arc::new(Compiler::default());
    let inventory = Arc::new(Inventory::new(&objects.classes, &objects.slices)?);
    let nodes: Vec<_> = objects.nodes.values().collect();
    let pending = objects.pending();
    let mut state = AllocatedState::default();
    let mut digest = Sha256::new();
    let (mut allocated, mut attempts) = (0, 0);
    let started = Instant::now();
    for (i, claim) in pending.iter().enumerate() {
        for k in 0..nodes.len() {
            let node = nodes[(i + k) % nodes.len()];
            let allocator = Allocator::with_inventory(
                inventory.clone(),
                std::mem::take(&mut state),
                compiler.clone(),
            );
            attempts += 1;
            let result = allocator.allocate(node, std::slice::from_ref(claim));
            state = allocator.into_state();
            let Some(results) = result.map_err(|e| anyhow::anyhow!("{e}"))? else {
                continue;
            };
            state.add(&results[0])?;
            allocated += 1;
            let node_name = node.metadata.name.as_deref().unwrap_or_default();
            for r in results[0]
                .devices
                .iter()
                .flat_map(|d| d.results.iter().flatten())
            {
                writeln!(
                    digest,
                    "{} {node_name} {}/{}/{}",
                    claim_name(claim),
                    r.driver,
                    r.pool,
                    r.device
                )?;
            }
            break;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(
        json!({"claims": pending.len(), "allocated": allocated, "attempts": attempts, "seconds": seconds,
        "digest": format!("{:x}", digest.finalize())}),
    )
}

pub async fn run(args: Args) -> anyhow::Result<Value> {
    let values = objects(args.nodes, args.claims);
    let file = tempfile::NamedTempFile::new()?;
    serde_json::to_writer(
        std::io::BufWriter::new(file.as_file()),
        &json!({"kind": "List", "items": values}),
    )?;
    let oracle = crate::oracle("alloc-oracle")?;
    let go = Command::new(&oracle)
        .arg("bench")
        .arg(file.path())
        .output()?;
    anyhow::ensure!(
        go.status.success(),
        "alloc-oracle bench: {}",
        String::from_utf8_lossy(&go.stderr)
    );
    let go: Value = serde_json::from_slice(&go.stdout)?;
    let objects = Objects::from_values(values)?;
    let rust = ours(&objects)?;
    anyhow::ensure!(
        rust["digest"] == go["digest"] && rust["allocated"] == go["allocated"],
        "the two allocators decided differently: ours {rust}, Kubernetes' {go}"
    );
    let per_second =
        |v: &Value| v["attempts"].as_f64().unwrap_or(0.0) / v["seconds"].as_f64().unwrap_or(1.0);
    Ok(json!({
        "nodes": args.nodes,
        "gpus": args.nodes * 8,
        "devices": args.nodes * 8 * 13,
        "claims": args.claims,
        "allocated": rust["allocated"],
        "attempts": rust["attempts"],
        "identical_decisions": true,
        "switchyard": {"seconds": rust["seconds"], "attempts_per_second": per_second(&rust),
            "claims_per_second": args.claims as f64 / rust["seconds"].as_f64().unwrap_or(1.0)},
        "kubernetes": {"seconds": go["seconds"], "attempts_per_second": per_second(&go),
            "claims_per_second": args.claims as f64 / go["seconds"].as_f64().unwrap_or(1.0)},
        "speedup": go["seconds"].as_f64().unwrap_or(0.0) / rust["seconds"].as_f64().unwrap_or(1.0),
    }))
}

//! The chart on real nodes (`switchyard_testkit::chart`: kubelet, containerd
//! and runc in a cluster network with kube-proxy and CoreDNS): the image's
//! size compressed and unpacked, each node's import of the image, a cold
//! `helm install` of the trial (bundled NATS, node agent over the fixture
//! machine) until every pod is Running and Ready, and each pod's processes'
//! memory from /proc once they are.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};
use switchyard_testkit::chart::{self, ChartCluster};

#[derive(clap::Args)]
pub struct Args {
    /// The folder of the `switchyard` and `switchyard-node-agent` binaries
    /// the image packs (default: the image and node-agent profiles' folders
    /// beside this binary's, as the image ships: `cargo build --profile
    /// image -p switchyard` and `cargo build --profile node-agent -p
    /// switchyard-node-agent`).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
}

/// The OCI layout's one layer: its size as stored (gzip) and unpacked.
fn layer_sizes(layout: &Path) -> anyhow::Result<(u64, u64)> {
    let blob = |digest: &str| {
        layout
            .join("blobs/sha256")
            .join(digest.trim_start_matches("sha256:"))
    };
    let index: Value = serde_json::from_slice(&std::fs::read(layout.join("index.json"))?)?;
    let manifest: Value = serde_json::from_slice(&std::fs::read(blob(
        index["manifests"][0]["digest"].as_str().unwrap_or_default(),
    ))?)?;
    let layer = &manifest["layers"][0];
    let compressed = layer["size"].as_u64().unwrap_or(0);
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "gzip -dc {} | wc -c",
            blob(layer["digest"].as_str().unwrap_or_default()).display()
        ))
        .output()?;
    let unpacked = String::from_utf8_lossy(&out.stdout).trim().parse()?;
    Ok((compressed, unpacked))
}

fn mib(bytes: u64) -> f64 {
    (bytes as f64 / (1024.0 * 1024.0) * 10.0).round() / 10.0
}

pub async fn run(args: Args) -> anyhow::Result<Value> {
    let out = tempfile::tempdir()?;
    let project = chart::project_image(args.bin_dir.as_deref(), out.path());
    let (compressed, unpacked) = layer_sizes(&out.path().join("oci"))?;

    let cluster = ChartCluster::start(&project, &chart::TRIAL_NODES).await;
    cluster.local_volume("worker-1", 1000).await;
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let values = chart::trial_values(&repo.join("deploy/fixtures/h100-8x.yaml"));
    let values: Vec<&str> = values.iter().map(String::as_str).collect();
    let started = std::time::Instant::now();
    cluster.install(&values);
    let helm_returned = started.elapsed();
    cluster.node_group("gpu", true).await;
    let ready = cluster
        .until_ready(Duration::from_secs(300))
        .await
        .map_err(|e| anyhow::anyhow!(e))?
        + helm_returned;
    let processes = cluster.pod_processes_memory().await;

    Ok(json!({
        "image": {
            "compressed_mb": (compressed as f64 / 1e6 * 10.0).round() / 10.0,
            "unpacked_mb": (unpacked as f64 / 1e6 * 10.0).round() / 10.0,
            "binaries": args.bin_dir.map_or("the image and node-agent profiles".into(), |d| d.display().to_string()),
        },
        "nodes": cluster.nodes.len(),
        "image_import_seconds": cluster.imports.iter()
            .map(|(node, took)| (node.clone(), json!(took.as_secs_f64())))
            .collect::<serde_json::Map<_, _>>(),
        "helm_install_returned_seconds": helm_returned.as_secs_f64(),
        "helm_install_to_every_pod_ready_seconds": ready.as_secs_f64(),
        // The pod's processes' resident and anonymous memory, from /proc.
        "pod_processes_resident_anonymous_mib": processes.iter()
            .map(|(pod, m)| (pod.clone(), json!([mib(m.resident), mib(m.anonymous)])))
            .collect::<serde_json::Map<_, _>>(),
    }))
}

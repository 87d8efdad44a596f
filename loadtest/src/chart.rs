//! The chart on real nodes (`switchyard_testkit::chart`: kubelet, containerd
//! and runc in a cluster network with kube-proxy and CoreDNS): the image's
//! size compressed and unpacked, each node's import of the image, a cold
//! `helm install` of the trial (bundled NATS, node agent over the fixture
//! machine) until every pod is Running and Ready, and each pod's processes'
//! memory from /proc once they are. Then a migration through the release:
//! N real GPU nodes of group `gpu` (one card per workload, the fixture's
//! eight per node) beside M kwok workers, `switchyard migrate --from gpu --to
//! gpu-dra --max-unavailable 1 --wait` typed on the host through a
//! port-forward to the release's NATS: its wall time, and Switchyard's own
//! share of it from the log (each decision's distance from the record it
//! followed; the rest is the cluster's: pods stopping and starting).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Taint;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use switchyard_eventlog::nats::{NatsLog, NatsOptions};
use switchyard_eventlog::{EventLog, ReadRequest};
use switchyard_testkit::chart::{self, ChartCluster, NodeSpec};
use switchyard_testkit::eventually;
use switchyard_testkit::kube::create_namespace;
use switchyard_testkit::kwok::{Kwok, kwok_node};
use switchyard_testkit::migration::{
    GROUP, STACK, beside_current_exe, events_in, prepare_nodes, set_module_config,
};
use switchyard_testkit::node::{BUSYBOX_IMAGE, GPU_DEVICE_NODES};
use switchyard_testkit::reference;

#[derive(clap::Args)]
pub struct Args {
    /// The folder of the `switchyard` and `switchyard-node-agent` binaries
    /// the image packs (default: the image and node-agent profiles' folders
    /// beside this binary's, as the image ships: `cargo build --profile
    /// image -p switchyard` and `cargo build --profile node-agent -p
    /// switchyard-node-agent`).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Real GPU nodes (kubelet, containerd, runc), in the source group.
    #[arg(long, default_value_t = 2)]
    gpu_nodes: usize,
    /// kwok nodes beside them, outside the migration.
    #[arg(long, default_value_t = 20)]
    kwok_nodes: usize,
    /// One-card Deployments on the device plugin, moved by the migration.
    #[arg(long, default_value_t = 8)]
    workloads: usize,
}

/// How long the set-up's and the migration's waits may take.
const WAIT: Duration = Duration::from_secs(300);

/// Not a GPU node: no stack, no node agent.
const NOT_GPU: (&str, &str) = ("gpu.deckhouse.io/enabled", "false");

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

    let gpu_names: Vec<String> = (1..=args.gpu_nodes).map(|i| format!("gpu-{i}")).collect();
    let gpu_labels = [(GROUP, "gpu"), (STACK, "device-plugin")];
    let worker_labels = [NOT_GPU];
    let nodes: Vec<NodeSpec> = gpu_names
        .iter()
        .map(|name| NodeSpec {
            name,
            labels: &gpu_labels,
        })
        .chain([NodeSpec {
            name: "worker-1",
            labels: &worker_labels,
        }])
        .collect();
    let cluster = ChartCluster::start(&project, &nodes).await;
    // The device nodes the agent's allocations name, as a GPU node has them.
    for gpu in &gpu_names {
        cluster.node(gpu).make_device_nodes(&GPU_DEVICE_NODES);
    }
    cluster.local_volume("worker-1", 1000).await;
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut values = chart::trial_values(&repo.join("deploy/fixtures/h100-8x.yaml"));
    // The services kept off the GPU nodes, which a handover drains.
    for service in [
        "inventory",
        "stackAssigner",
        "classCompiler",
        "claimAllocator",
        "alerter",
    ] {
        values.push("--set".into());
        values.push(format!(
            "{service}.nodeSelector.kubernetes\\.io/hostname=worker-1"
        ));
    }
    let values: Vec<&str> = values.iter().map(String::as_str).collect();
    let started = std::time::Instant::now();
    cluster.install(&values);
    let helm_returned = started.elapsed();
    cluster.node_group("gpu", true).await;
    let ready = cluster
        .until_ready(WAIT)
        .await
        .map_err(|e| anyhow::anyhow!(e))?
        + helm_returned;
    let processes = cluster.pod_processes_memory().await;
    let migration = migrate(&cluster, &args, &gpu_names).await?;

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
        "migration": migration,
    }))
}

/// The migration through the release (see the module's doc).
async fn migrate(
    cluster: &ChartCluster,
    args: &Args,
    gpu_nodes: &[String],
) -> anyhow::Result<Value> {
    let c = cluster.plane.client();
    let mut kwok = Kwok::start(&cluster.plane);
    for i in 0..args.kwok_nodes {
        let taint = Taint {
            key: "kwok.x-k8s.io/node".into(),
            value: Some("fake".into()),
            effect: "NoSchedule".into(),
            ..Default::default()
        };
        let node = kwok_node(
            &format!("kwok-{i}"),
            &[NOT_GPU],
            &[("cpu", "32"), ("memory", "256Gi"), ("pods", "110")],
            vec![taint],
        );
        kwok.create_node(&c, &node, WAIT).await;
    }
    // The guide's Steps 1 and 2: DRA on, the target group, the GPU class.
    cluster.node_group("gpu-dra", false).await;
    set_module_config(&c, true, None).await;
    let class = tempfile::NamedTempFile::new()?;
    std::fs::write(
        class.path(),
        "apiVersion: gpu.deckhouse.io/v1alpha1\nkind: GPUClass\nmetadata:\n  name: h100\nspec:\n  selector:\n    matchLabels:\n      gpu.deckhouse.io/device: h100-80gb-hbm3\n",
    )?;
    let applied = cluster
        .kubectl()
        .args(["apply", "-f"])
        .arg(class.path())
        .output()?;
    anyhow::ensure!(
        applied.status.success(),
        "apply the GPU class: {}",
        String::from_utf8_lossy(&applied.stderr)
    );
    let bashible = tokio::spawn(prepare_nodes(c.clone()));

    create_namespace(&c, "ml").await;
    let deployments: Api<Deployment> = Api::namespaced(c.clone(), "ml");
    let names: Vec<String> = (0..args.workloads).map(|i| format!("app-{i}")).collect();
    for name in &names {
        let deployment = json!({
            "metadata": {"name": name},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {
                        "nodeSelector": {GROUP: "gpu"},
                        "terminationGracePeriodSeconds": 1,
                        "containers": [{
                            "name": "main", "image": BUSYBOX_IMAGE, "command": ["sleep", "3600"],
                            "resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "50m"}},
                        }],
                    },
                },
            },
        });
        deployments
            .create(&PostParams::default(), &serde_json::from_value(deployment)?)
            .await?;
    }
    let apps: Vec<&str> = names.iter().map(String::as_str).collect();
    let within = |what: &'static str| move |e: String| anyhow::anyhow!("{what}: {e}");
    if let Err(e) = eventually("every workload running", WAIT, || async {
        reference::running_of(&c, &apps).await == apps.len()
    })
    .await
    {
        anyhow::bail!("the workloads: {e}\n{}", cluster.pods_where("ml").await);
    }

    let (mut forward, port) = cluster.port_forward_nats();
    let nats = format!("nats://127.0.0.1:{port}");
    let log = NatsLog::connect(&nats, NatsOptions::default()).await?;
    // The migration is planned on what inventory recorded: DRA on, the
    // workloads and the class.
    eventually(
        "inventory to record DRA, the workloads and the class",
        WAIT,
        || async { reference::recorded_for_migration(&events_in(&log).await, &names, names.len()) },
    )
    .await
    .map_err(within("inventory"))?;
    let first = log.last_sequence(None).await? + 1;

    // The CLI on the host: the image's binary, or the release build's.
    let cli = args.bin_dir.as_ref().map_or_else(
        || beside_current_exe("switchyard"),
        |d| d.join("switchyard"),
    );
    anyhow::ensure!(
        cli.is_file(),
        "{} is missing: cargo build --release -p switchyard",
        cli.display()
    );
    let started = std::time::Instant::now();
    let out = reference::cli_command(
        &cli,
        &nats,
        &cluster.plane.kubeconfig(),
        &[
            "migrate",
            "--from",
            "gpu",
            "--to",
            "gpu-dra",
            "--class",
            "h100",
            "--max-unavailable",
            "1",
            "--id",
            "loadtest",
            "--wait",
        ],
    )
    .output()?;
    let wall = started.elapsed();
    anyhow::ensure!(
        out.status.success(),
        "switchyard migrate: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let records = log.read(ReadRequest::default()).await?;
    let own = reference::decision_share(&records, first);
    let _ = forward.kill();
    let _ = forward.wait();
    bashible.abort();
    Ok(json!({
        "real_gpu_nodes": gpu_nodes.len(),
        "kwok_nodes": args.kwok_nodes,
        "workloads": args.workloads,
        "records": records.iter().filter(|r| r.sequence >= first).count(),
        "wall_seconds": round(wall.as_secs_f64()),
        "switchyard_seconds": round(own.as_secs_f64()),
        "switchyard_share": round(own.as_secs_f64() / wall.as_secs_f64()),
    }))
}

fn round(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

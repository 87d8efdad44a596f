//! The DRA kubelet plugin under kubelet's calls: NodePrepareResources and
//! NodeUnprepareResources latency through a tonic client on the plugin's unix
//! socket, each prepare writing a CDI spec and the fsynced checkpoint, with
//! the 8-GPU A100 fixture; and the process's memory while serving.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::resource::v1::ResourceClaim;
use serde_json::{Value, json};
use switchyard_gpu::{Fixture, GpuSource};
use switchyard_kubelet::dra::dra_plugin_client::DraPluginClient;
use switchyard_kubelet::dra::{Claim, NodePrepareResourcesRequest, NodeUnprepareResourcesRequest};
use switchyard_kubelet::plugin::{ClaimError, ClaimSource, Config, DraPlugin, serve};

#[derive(clap::Args)]
pub struct Args {
    /// Prepare/unprepare cycles.
    #[arg(long, default_value_t = 1000)]
    cycles: usize,
}

/// Claims answered from memory: one per card, allocated on `gpu-1`.
struct Claims;

#[async_trait::async_trait]
impl ClaimSource for Claims {
    async fn claim(&self, namespace: &str, name: &str) -> Result<ResourceClaim, ClaimError> {
        let card: usize =
            name.trim_start_matches("claim-")
                .parse()
                .map_err(|_| ClaimError::NotFound {
                    namespace: namespace.into(),
                    name: name.into(),
                })?;
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": namespace, "uid": format!("uid-{name}")},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "a100.gpu.deckhouse.io"}}]}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": "gpu.deckhouse.io", "pool": "gpu-1", "device": format!("gpu-{}", 4 + card % 4)}
            ]}}},
        }))
        .map_err(|source| ClaimError::Decode {
            namespace: namespace.into(),
            name: name.into(),
            source,
        })
    }
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

pub async fn run(args: Args) -> anyhow::Result<Value> {
    let dir = tempfile::tempdir()?;
    let machine = Fixture::load(Path::new("deploy/fixtures/a100-8x-mig.yaml"))?.machine()?;
    let rss_before = crate::rss_kib();
    let plugin = Arc::new(DraPlugin::new(
        Config {
            node: "gpu-1".into(),
            machine,
            cdi_dir: dir.path().join("cdi"),
            checkpoint: dir.path().join("plugin/checkpoint.json"),
            endpoint: dir.path().join("plugin/dra.sock"),
        },
        Arc::new(Claims),
    )?);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let registration = dir.path().join("registry/reg.sock");
    let served = tokio::spawn(async move {
        serve(plugin, &registration, async {
            let _ = stopped.await;
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))
    });
    let socket = dir.path().join("plugin/dra.sock");
    let started = Instant::now();
    while !socket.exists() {
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(10),
            "the plugin did not bind its socket"
        );
        tokio::task::yield_now().await;
    }
    let channel = switchyard_kubelet::connect(socket).await?;
    let mut client = DraPluginClient::new(channel);
    let (mut prepare, mut unprepare) = (Vec::new(), Vec::new());
    for i in 0..args.cycles {
        let claim = Claim {
            namespace: "ml".into(),
            uid: format!("uid-claim-{i}"),
            name: format!("claim-{i}"),
        };
        let t = Instant::now();
        let answer = client
            .node_prepare_resources(NodePrepareResourcesRequest {
                claims: vec![claim.clone()],
            })
            .await?
            .into_inner();
        prepare.push(t.elapsed());
        anyhow::ensure!(answer.claims[&claim.uid].error.is_empty(), "{answer:?}");
        let t = Instant::now();
        client
            .node_unprepare_resources(NodeUnprepareResourcesRequest {
                claims: vec![claim],
            })
            .await?;
        unprepare.push(t.elapsed());
    }
    let rss_serving = crate::rss_kib();
    stop.send(()).ok();
    served.await??;
    prepare.sort();
    unprepare.sort();
    Ok(json!({
        "cycles": args.cycles,
        "gpus": 8,
        "node_prepare_ms": {"p50": percentile(&prepare, 0.5), "p99": percentile(&prepare, 0.99), "max": percentile(&prepare, 1.0)},
        "node_unprepare_ms": {"p50": percentile(&unprepare, 0.5), "p99": percentile(&unprepare, 0.99)},
        "rss_kib": {"before_plugin": rss_before, "serving": rss_serving, "peak": crate::peak_rss_kib()},
        "note": "each prepare writes a CDI spec and the checkpoint with fsync (file and directory); the loadtest process holds the client too",
    }))
}

//! The node agent as a process: its memory with 8 GPUs while serving each
//! stack, and the time a switch takes — from the relabel to the old stack
//! gone and the new one served — on a real control plane with a fake kubelet.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use switchyard_testkit::kube::{ControlPlane, fake_node};
use switchyard_testkit::{KillOnDrop, eventually};

#[derive(clap::Args)]
pub struct Args {
    /// Switches measured (DRA → device plugin → DRA ...).
    #[arg(long, default_value_t = 10)]
    switches: usize,
}

fn rss_kib(pid: u32, field: &str) -> Option<u64> {
    crate::status_kib(&pid.to_string(), field)
}

pub async fn run(args: Args) -> anyhow::Result<Value> {
    let plane = ControlPlane::start().await;
    let client = plane.client();
    switchyard_testkit::kube::install_crds(
        &client,
        switchyard_api::crds().into_iter().map(|(_, c)| c).collect(),
    )
    .await;
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(
            &PostParams::default(),
            &fake_node(
                "gpu-1",
                &[("node.deckhouse.io/gpu-stack", "dra")],
                Vec::new(),
            ),
        )
        .await?;
    let dir = tempfile::tempdir()?;
    let kubelet = switchyard_kubelet::fake::Kubelet::default();
    kubelet.serve(dir.path())?;
    let registrations = kubelet.registered.clone();
    let binary = std::env::current_exe()?.with_file_name("switchyard-node-agent");
    anyhow::ensure!(
        binary.exists(),
        "{} is missing: cargo build --release -p switchyard-node-agent",
        binary.display()
    );
    let agent = KillOnDrop(
        Command::new(&binary)
            .args([
                "serve",
                "--gpu-source",
                "fixture:deploy/fixtures/a100-8x-mig.yaml",
                "--node",
                "gpu-1",
            ])
            .arg("--kubelet-dir")
            .arg(dir.path())
            .arg("--cdi-dir")
            .arg(dir.path().join("cdi"))
            .env("KUBECONFIG", plane.kubeconfig())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?,
    );
    let pid = agent.0.id();
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let registration = dir
        .path()
        .join("plugins_registry/gpu.deckhouse.io-reg.sock");
    let dra_served = |slices: Api<ResourceSlice>, registration: std::path::PathBuf| async move {
        let n = slices
            .list(&ListParams::default())
            .await
            .map(|l| l.items.len())
            .unwrap_or(0);
        n == 1 && registration.exists()
    };
    eventually("DRA served", Duration::from_secs(30), || {
        dra_served(slices.clone(), registration.clone())
    })
    .await
    .map_err(anyhow::Error::msg)?;
    let rss_dra = rss_kib(pid, "VmRSS:");
    let mut to_device_plugin = Vec::new();
    let mut to_dra = Vec::new();
    let mut rss_device_plugin = None;
    for i in 0..args.switches {
        let (label, target) = if i % 2 == 0 {
            ("device-plugin", &mut to_device_plugin)
        } else {
            ("dra", &mut to_dra)
        };
        let before = registrations.lock().unwrap().len();
        let started = Instant::now();
        nodes
            .patch(
                "gpu-1",
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"labels": {"node.deckhouse.io/gpu-stack": label}}}),
                ),
            )
            .await?;
        if label == "device-plugin" {
            let (slices, registration, registrations) =
                (slices.clone(), registration.clone(), registrations.clone());
            eventually(
                "the device plugin served, DRA withdrawn",
                Duration::from_secs(30),
                || {
                    let (slices, registration, registrations) =
                        (slices.clone(), registration.clone(), registrations.clone());
                    async move {
                        let none = slices
                            .list(&ListParams::default())
                            .await
                            .map(|l| l.items.is_empty())
                            .unwrap_or(false);
                        none && !registration.exists()
                            && registrations.lock().unwrap().len() > before
                    }
                },
            )
            .await
            .map_err(anyhow::Error::msg)?;
            rss_device_plugin = rss_kib(pid, "VmRSS:");
        } else {
            eventually("DRA served again", Duration::from_secs(30), || {
                dra_served(slices.clone(), registration.clone())
            })
            .await
            .map_err(anyhow::Error::msg)?;
        }
        target.push(started.elapsed());
    }
    let ms = |v: &mut Vec<Duration>| -> Value {
        v.sort();
        if v.is_empty() {
            return Value::Null;
        }
        json!({"p50": v[v.len() / 2].as_secs_f64() * 1e3, "max": v[v.len() - 1].as_secs_f64() * 1e3})
    };
    Ok(json!({
        "gpus": 8,
        "fixture": "deploy/fixtures/a100-8x-mig.yaml",
        "rss_kib": {"serving_dra": rss_dra, "serving_device_plugin": rss_device_plugin, "peak": rss_kib(pid, "VmHWM:")},
        "switch_ms": {"to_device_plugin": ms(&mut to_device_plugin), "to_dra": ms(&mut to_dra)},
        "note": "switch time: from the relabel's write to the old stack gone and the new one served, as observed (API list and socket polling with backoff from 10 ms)",
    }))
}

//! Pod start-up on real nodes (the test kit's `RealNode`: kubelet,
//! containerd, runc), all in one run: time from a pod's create to the
//! Running its watch shows, for a plain pod, a pod with a DRA claim served
//! by Switchyard's node agent, a pod asking `nvidia.com/gpu` from
//! Switchyard's device plugin, and the same from NVIDIA's device plugin
//! v0.17.4 on the same cards through the mock NVML. Rounds interleave the
//! four kinds, each pod deleted (and gone) before the next. Also kubelet's
//! own `dra_grpc_operations_duration_seconds` for prepare and unprepare,
//! and the resident memory of Switchyard's agent next to NVIDIA's plugin.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaimTemplate};
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use serde_json::{Value, json};
use switchyard_testkit::KillOnDrop;
use switchyard_testkit::kube::{Components, ControlPlane};
use switchyard_testkit::node::{BUSYBOX_IMAGE, NodeOptions, RealNode};

#[derive(clap::Args)]
pub struct Args {
    /// Pods of each kind, one at a time.
    #[arg(long, default_value_t = 20)]
    pods: usize,
    /// The node agent's binary (default: `switchyard-node-agent` beside
    /// this one).
    #[arg(long)]
    agent: Option<std::path::PathBuf>,
}

use switchyard_testkit::node::GPU_DEVICE_NODES as DEVICE_NODES;

const FIXTURE: &str = "deploy/fixtures/h100-8x.yaml";

/// The kinds measured: name, node, what the container asks for.
const KINDS: [&str; 4] = [
    "plain",
    "dra_claim_switchyard",
    "device_plugin_switchyard",
    "device_plugin_nvidia",
];

fn pod(name: &str, node: &str, kind: &str) -> Pod {
    let (resources, claims) = match kind {
        "dra_claim_switchyard" => (
            json!({"claims": [{"name": "gpu"}]}),
            json!([{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]),
        ),
        "device_plugin_switchyard" | "device_plugin_nvidia" => {
            (json!({"limits": {"nvidia.com/gpu": "1"}}), json!([]))
        }
        _ => (json!({}), json!([])),
    };
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": null,
            "nodeSelector": {"kubernetes.io/hostname": node},
            "hostNetwork": true,
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": claims,
            "containers": [{
                "name": "main",
                "image": BUSYBOX_IMAGE,
                "command": ["sleep", "3600"],
                "resources": resources
            }]
        }
    }))
    .expect("a pod")
}

fn summary(mut ms: Vec<f64>) -> Value {
    ms.sort_by(f64::total_cmp);
    let at = |q: f64| ms[((ms.len() as f64 - 1.0) * q).round() as usize];
    json!({
        "n": ms.len(),
        "mean_ms": ms.iter().sum::<f64>() / ms.len() as f64,
        "p50_ms": at(0.5),
        "p90_ms": at(0.9),
        "max_ms": at(1.0),
    })
}

/// `dra_grpc_operations_duration_seconds` of `method`: (count, sum).
fn grpc_seconds(metrics: &str, method: &str) -> (f64, f64) {
    let mut count = 0.0;
    let mut sum = 0.0;
    for line in metrics.lines().filter(|l| l.contains(method)) {
        let value = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0);
        if line.starts_with("dra_grpc_operations_duration_seconds_count") {
            count += value;
        } else if line.starts_with("dra_grpc_operations_duration_seconds_sum") {
            sum += value;
        }
    }
    (count, sum)
}

/// The resident memory of a process (KiB): all of it (VmRSS), its
/// anonymous pages (heap and stacks) and its file pages (the mapped binary
/// and libraries).
fn memory(pid: &str) -> Value {
    let kib = |field| crate::status_kib(pid, field).unwrap_or(0);
    json!({"rss": kib("VmRSS"), "anon": kib("RssAnon"), "file": kib("RssFile")})
}

/// [`memory`] of the process whose command name is `comm`.
fn memory_of(comm: &str) -> Value {
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let pid = entry.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let name = std::fs::read_to_string(entry.path().join("comm")).unwrap_or_default();
        if name.trim() == comm {
            return memory(&pid);
        }
    }
    Value::Null
}

pub async fn run(args: Args) -> anyhow::Result<Value> {
    let plane = ControlPlane::start_with(Components {
        scheduler: true,
        controller_manager: true,
        ..Components::default()
    })
    .await;
    let client = plane.client();
    switchyard_testkit::kube::install_crds(
        &client,
        switchyard_api::crds().into_iter().map(|(_, c)| c).collect(),
    )
    .await;
    let binary = match args.agent.clone() {
        Some(binary) => binary,
        None => std::env::current_exe()?.with_file_name("switchyard-node-agent"),
    };
    anyhow::ensure!(
        binary.exists(),
        "{} is missing: cargo build --release -p switchyard-node-agent",
        binary.display()
    );
    let stack = |s: &str| NodeOptions {
        labels: vec![("node.deckhouse.io/gpu-stack".into(), s.into())],
        ..NodeOptions::default()
    };
    let dra = RealNode::start_with(&plane, "bench-dra", stack("dra")).await;
    let dp = RealNode::start_with(&plane, "bench-dp", stack("device-plugin")).await;
    let nvidia = RealNode::start_with(&plane, "bench-nvidia", NodeOptions::default()).await;
    for node in [&dra, &dp, &nvidia] {
        node.make_device_nodes(&DEVICE_NODES);
    }
    let agent_dra = start_agent(&binary, &plane, &dra)?;
    let agent_dp = start_agent(&binary, &plane, &dp)?;
    let library = std::env::current_exe()?
        .parent()
        .expect("the binary's folder")
        .join("deps/libswitchyard_nvml_mock.so");
    let _nvidia_plugin = switchyard_testkit::nvidia::DevicePlugin::start(
        &client,
        &nvidia,
        &library,
        std::path::Path::new(FIXTURE),
    )
    .await;

    create_class_and_template(&client).await?;
    wait_offered(&client).await?;
    let mut times = time_pods(&args, &client).await?;
    let metrics = dra.kubelet_metrics().await.map_err(anyhow::Error::msg)?;
    let (prepares, prepare_s) = grpc_seconds(&metrics, "NodePrepareResources");
    let (unprepares, unprepare_s) = grpc_seconds(&metrics, "NodeUnprepareResources");
    let plain = summary(times.remove("plain").unwrap_or_default());
    let claim = summary(times.remove("dra_claim_switchyard").unwrap_or_default());
    let ours = summary(times.remove("device_plugin_switchyard").unwrap_or_default());
    let theirs = summary(times.remove("device_plugin_nvidia").unwrap_or_default());
    let ratio = |a: &Value, b: &Value| {
        a["mean_ms"].as_f64().unwrap_or(0.0) / b["mean_ms"].as_f64().unwrap_or(1.0)
    };
    let agent_memory = |agent: &KillOnDrop| memory(&agent.0.id().to_string());
    Ok(json!({
        "pods_per_kind": args.pods,
        "plain": plain,
        "dra_claim_switchyard": claim,
        "device_plugin_switchyard": ours,
        "device_plugin_nvidia": theirs,
        "claim_over_plain": ratio(&claim, &plain),
        "switchyard_over_nvidia_device_plugin": ratio(&ours, &theirs),
        "kubelet_dra_grpc": {
            "prepare": {"calls": prepares, "mean_ms": if prepares > 0.0 { prepare_s / prepares * 1000.0 } else { 0.0 }},
            "unprepare": {"calls": unprepares, "mean_ms": if unprepares > 0.0 { unprepare_s / unprepares * 1000.0 } else { 0.0 }},
        },
        "memory_kib": {
            "switchyard_agent_dra": agent_memory(&agent_dra),
            "switchyard_agent_device_plugin": agent_memory(&agent_dp),
            "nvidia_device_plugin": memory_of("nvidia-device-p"),
        },
    }))
}

/// Setup phase: a node agent serving `node` from the fixture.
fn start_agent(
    binary: &std::path::Path,
    plane: &ControlPlane,
    node: &RealNode,
) -> anyhow::Result<KillOnDrop> {
    Ok(KillOnDrop(
        std::process::Command::new(binary)
            .args(["serve", "--gpu-source", &format!("fixture:{FIXTURE}")])
            .args(["--node", node.name()])
            .arg("--kubelet-dir")
            .arg(node.kubelet_dir())
            .arg("--cdi-dir")
            .arg(node.cdi_dir())
            .env("KUBECONFIG", plane.kubeconfig())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()?,
    ))
}

/// Setup phase: the `gpu` DeviceClass and the `one-gpu` ResourceClaimTemplate.
async fn create_class_and_template(client: &kube::Client) -> anyhow::Result<()> {
    Api::<DeviceClass>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                "metadata": {"name": "gpu"},
                "spec": {"selectors": [{"cel": {"expression": "device.driver == \"gpu.deckhouse.io\""}}]}
            }))?,
        )
        .await?;
    Api::<ResourceClaimTemplate>::namespaced(client.clone(), "default")
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "one-gpu"},
                "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu"}}]}}}
            }))?,
        )
        .await?;
    Ok(())
}

/// Setup phase: waits for both device plugins' cards offered.
async fn wait_offered(client: &kube::Client) -> anyhow::Result<()> {
    // Every kind ready: slices published, both plugins' cards offered.
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    for node in ["bench-dp", "bench-nvidia"] {
        let offered = await_condition(
            nodes.clone(),
            node,
            |n: Option<&k8s_openapi::api::core::v1::Node>| {
                n.and_then(|n| {
                    n.status
                        .as_ref()?
                        .allocatable
                        .as_ref()?
                        .get("nvidia.com/gpu")
                        .cloned()
                })
                .is_some_and(|q| q.0 == "8")
            },
        );
        tokio::time::timeout(Duration::from_secs(120), offered).await??;
    }
    Ok(())
}

/// Measuring phase: each kind's pods timed from creation to Running (ms), by kind.
async fn time_pods(
    args: &Args,
    client: &kube::Client,
) -> anyhow::Result<std::collections::BTreeMap<&'static str, Vec<f64>>> {
    // One pod of each kind first, not measured: images and caches warm.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let mut times: std::collections::BTreeMap<&str, Vec<f64>> = Default::default();
    for round in 0..=args.pods {
        for kind in KINDS {
            let node = match kind {
                "plain" | "dra_claim_switchyard" => "bench-dra",
                "device_plugin_switchyard" => "bench-dp",
                _ => "bench-nvidia",
            };
            let name = format!("{}-{round}", kind.replace('_', "-"));
            let started = Instant::now();
            pods.create(&PostParams::default(), &pod(&name, node, kind))
                .await?;
            let running = await_condition(pods.clone(), &name, |p: Option<&Pod>| {
                p.and_then(|p| p.status.as_ref()?.phase.as_deref()) == Some("Running")
            });
            tokio::time::timeout(Duration::from_secs(120), running)
                .await
                .map_err(|_| anyhow::anyhow!("{name} not Running within 120 s"))??;
            let took = started.elapsed().as_secs_f64() * 1000.0;
            if round > 0 {
                times.entry(kind).or_default().push(took);
            }
            let uid = pods.get(&name).await?.metadata.uid.unwrap_or_default();
            pods.delete(&name, &DeleteParams::default().grace_period(0))
                .await?;
            let gone = await_condition(pods.clone(), &name, conditions::is_deleted(&uid));
            tokio::time::timeout(Duration::from_secs(120), gone).await??;
        }
    }
    Ok(times)
}

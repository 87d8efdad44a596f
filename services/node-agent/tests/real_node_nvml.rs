//! `switchyard-node-agent serve --gpu-source nvml` under a real kubelet,
//! its cards read through our mock `libnvidia-ml.so.1` (libs/nvml-mock) made
//! from a fixture: the PhysicalGPUs and the slices equal what the fixture
//! path publishes, and a card that falls off the bus (a fault written while
//! it runs) is a PhysicalGPU that is not Ready, a device kubelet no longer
//! offers, a `GpuHealthChanged` Event, and the chart's `D8GpuUnhealthy`
//! firing on what the agent's `/metrics` then shows (promtool).

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, ListParams, Patch, PatchParams};
use serde_json::json;
use switchyard_api::{GpuPhase, PhysicalGPU};
use switchyard_gpu::publish::{self, Layout};
use switchyard_nvml_mock::{FAULTS_ENV, MACHINE_ENV, SONAME};
use switchyard_testkit::node::{NodeOptions, RealNode};
use switchyard_testkit::{eventually, free_port, helm_binary, promtool_binary, scrape};

mod support;

use support::*;

const NODE: &str = "gpu-nvml-1";

fn repo() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The mock, built as this test's dev-dependency, linked as
/// `libnvidia-ml.so.1` into `dir`.
fn install_mock(dir: &Path) {
    let built = std::env::current_exe()
        .unwrap()
        .with_file_name("libswitchyard_nvml_mock.so");
    assert!(built.is_file(), "{} is missing", built.display());
    std::os::unix::fs::symlink(&built, dir.join(SONAME)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_nvml_path_on_a_real_node_publishes_what_the_fixture_does_and_a_lost_card_goes() {
    let plane = plane().await;
    let client = plane.client();
    let node = RealNode::start_with(
        &plane,
        NODE,
        NodeOptions {
            labels: vec![("node.deckhouse.io/gpu-stack".into(), "dra".into())],
            ..NodeOptions::default()
        },
    )
    .await;
    let lib = tempfile::tempdir().unwrap();
    install_mock(lib.path());
    let fixture = repo().join("deploy/fixtures/h100-8x.yaml");
    let faults = node.root().join("nvml-faults");
    std::fs::write(&faults, "").unwrap();
    let metrics = free_port();
    let metrics_listen = format!("127.0.0.1:{metrics}");
    let _agent = agent_on(
        &node,
        "nvml",
        &["--metrics-listen", &metrics_listen],
        &plane.kubeconfig(),
        &[
            ("LD_LIBRARY_PATH", lib.path().as_os_str()),
            (MACHINE_ENV, fixture.as_os_str()),
            (FAULTS_ENV, faults.as_os_str()),
        ],
    );
    let machine = switchyard_gpu::source(&format!("fixture:{}", fixture.display()))
        .unwrap()
        .machine()
        .unwrap();

    // DRA: the slices are the fixture path's.
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let published = || async {
        slices
            .list(&ListParams::default())
            .await
            .map(|l| {
                l.items
                    .into_iter()
                    .filter(|s| s.spec.node_name.as_deref() == Some(NODE))
                    .map(|s| serde_json::to_value(&s.spec.devices).unwrap())
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
    };
    let expected: Vec<serde_json::Value> =
        publish::resource_slices(NODE, &machine, Layout::Static, 1)
            .into_iter()
            .map(|s| serde_json::to_value(&s.spec.devices).unwrap())
            .collect();
    let same = eventually(
        "the slices of the NVML path",
        Duration::from_secs(30),
        || async { published().await == expected },
    )
    .await;
    if let Err(e) = same {
        panic!("{e}: {:?}\n{}", published().await, logs(&node));
    }

    // The PhysicalGPUs are the fixture path's.
    let reports: Api<PhysicalGPU> = Api::all(client.clone());
    let specs = || async {
        let mut listed = reports.list(&ListParams::default()).await.unwrap().items;
        listed.sort_by_key(|g| g.spec.index);
        listed
            .into_iter()
            .map(|g| serde_json::to_value(&g.spec).unwrap())
            .collect::<Vec<_>>()
    };
    let want: Vec<serde_json::Value> = publish::physical_gpus(NODE, &machine)
        .into_iter()
        .map(|g| serde_json::to_value(&g.spec).unwrap())
        .collect();
    assert_eq!(specs().await, want);

    // The device plugins over NVML: 8 cards offered to kubelet.
    let nodes: Api<Node> = Api::all(client.clone());
    let patch = json!({"metadata": {"labels": {"node.deckhouse.io/gpu-stack": "device-plugin"}}});
    nodes
        .patch(NODE, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    eventually(
        "nvidia.com/gpu: 8 over NVML",
        Duration::from_secs(60),
        || {
            let nodes = nodes.clone();
            async move { advertised(&nodes, NODE, "nvidia.com/gpu").await == (Some(8), Some(8)) }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(&node)));

    // Card 3 falls off the bus.
    let lost = machine.gpus[3].uuid.clone();
    std::fs::write(&faults, format!("lost {lost}\n")).unwrap();
    eventually(
        "kubelet no longer offers the lost card",
        Duration::from_secs(60),
        || {
            let nodes = nodes.clone();
            async move { advertised(&nodes, NODE, "nvidia.com/gpu").await == (Some(8), Some(7)) }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", logs(&node)));
    let name = publish::physical_gpu_name(NODE, 3);
    let failed = reports.get(&name).await.unwrap();
    assert_eq!(
        failed.status.and_then(|s| s.phase),
        Some(GpuPhase::Failed),
        "the lost card's PhysicalGPU"
    );
    for (i, gpu) in machine.gpus.iter().enumerate().filter(|(i, _)| *i != 3) {
        let report = reports
            .get(&publish::physical_gpu_name(NODE, i as u32))
            .await
            .unwrap();
        assert_eq!(
            report.status.and_then(|s| s.phase),
            Some(GpuPhase::Ready),
            "{} stays Ready",
            gpu.uuid
        );
    }
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    eventually(
        "a GpuHealthChanged Event on the card",
        Duration::from_secs(20),
        || {
            let (events, name) = (events.clone(), name.clone());
            async move {
                events.list(&ListParams::default()).await.is_ok_and(|l| {
                    l.items.iter().any(|e| {
                        e.reason.as_deref() == Some("GpuHealthChanged")
                            && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(&name)
                    })
                })
            }
        },
    )
    .await
    .unwrap();

    // The alert: the chart's rule, under promtool, fires on the agent's
    // gauges as scraped now (labelled as the chart's PodMonitor labels a
    // scrape), for the lost card alone, once its `for` (5m) has passed.
    let exposed = scrape(metrics).await.expect("the agent's /metrics");
    let gauges: Vec<&str> = exposed
        .lines()
        .filter(|l| l.starts_with("switchyard_node_agent_gpu_healthy{"))
        .collect();
    assert_eq!(gauges.len(), machine.gpus.len(), "{exposed}");
    let series: String = gauges
        .iter()
        .map(|line| {
            let (name_labels, value) = line.rsplit_once(' ').expect("a sample");
            let labels = name_labels
                .strip_prefix("switchyard_node_agent_gpu_healthy{")
                .and_then(|l| l.strip_suffix('}'))
                .expect("the gauge's labels");
            format!(
                "      - series: 'switchyard_node_agent_gpu_healthy{{namespace=\"switchyard-system\",pod=\"node-agent-x\",{labels}}}'\n        values: '{value}x10'\n"
            )
        })
        .collect();
    let firing = format!(
        "ALERTS{{alertname=\"D8GpuUnhealthy\",alertstate=\"firing\",severity=\"warning\",namespace=\"switchyard-system\",pod=\"node-agent-x\",index=\"3\",uuid=\"{lost}\"}}"
    );
    // Not yet at 4m; the lost card alone at 6m.
    unhealthy_alerts(&series, "4m", &[]);
    unhealthy_alerts(&series, "6m", &[&firing]);
}

/// Runs promtool's `test rules` on the chart's rules (`helm template` with
/// the PrometheusRule on) over `series` (promtool's `input_series`) and
/// asserts that `D8GpuUnhealthy`'s firing `ALERTS` at `at` are `expected`.
fn unhealthy_alerts(series: &str, at: &str, expected: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let helm = helm_binary().unwrap_or_else(|e| panic!("{e}"));
    let out = std::process::Command::new(helm)
        .args(["template", "switchyard"])
        .arg(repo().join("deploy/helm/switchyard"))
        .args([
            "--namespace",
            "switchyard-system",
            "--set",
            "nats.url=nats://nats.example:4222",
            "--set",
            "prometheusRule.enabled=true",
            "--show-only",
            "templates/prometheusrule.yaml",
        ])
        .output()
        .expect("run helm");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rule: serde_json::Value = serde_yaml_ng::from_slice(&out.stdout).expect("the rule");
    let groups = json!({"groups": rule["spec"]["groups"]});
    std::fs::write(
        dir.path().join("rules.yaml"),
        serde_yaml_ng::to_string(&groups).unwrap(),
    )
    .unwrap();
    let samples: String = if expected.is_empty() {
        " []\n".into()
    } else {
        expected
            .iter()
            .map(|labels| format!("\n          - labels: '{labels}'\n            value: 1"))
            .collect::<String>()
            + "\n"
    };
    let test = format!(
        "rule_files: [rules.yaml]\nevaluation_interval: 1m\ntests:\n  - interval: 1m\n    input_series:\n{series}    promql_expr_test:\n      - expr: ALERTS{{alertname=\"D8GpuUnhealthy\",alertstate=\"firing\"}}\n        eval_time: {at}\n        exp_samples:{samples}"
    );
    std::fs::write(dir.path().join("test.yaml"), &test).unwrap();
    let promtool = promtool_binary().unwrap_or_else(|e| panic!("{e}"));
    let out = std::process::Command::new(promtool)
        .args(["test", "rules", "test.yaml"])
        .current_dir(dir.path())
        .output()
        .expect("run promtool");
    assert!(
        out.status.success(),
        "D8GpuUnhealthy at {at}: {}{}\n{test}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

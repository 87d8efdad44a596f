//! The reference migration through the installed chart, typed as an
//! operator types it: `helm install` on real nodes (kubelet, containerd and
//! runc in a cluster network of the test's own), the CLI on the host
//! reaching the release's NATS through `kubectl port-forward`, Steps 3–5 and
//! completion (and the simulator's rollbacks) each one `switchyard` command,
//! and the cluster left as the simulator leaves it. The workloads' pods run
//! on the two real GPU nodes, whose node agents are the chart's DaemonSet
//! over a fixture machine, and print the card they were given from inside
//! their containers, on either stack; kwok nodes stand beside them.
//!
//! Life-cycle on the way: `helm upgrade` to a new image tag between the two
//! handovers (every service replaced, the migration resumed from the log,
//! nothing recorded twice); `helm rollback` to the installed revision once
//! the migration's commands are done (replaced again, resumed again);
//! `helm uninstall` refused by the pre-delete hook while a `switchyard
//! migrate` run's handover is held by a PodDisruptionBudget, naming it, and
//! let through once the migration is resumed and done;
//! the log's volume kept, so that the release installed again finds its log.
//!
//! Watched live: a real Prometheus (Kubernetes service discovery, the
//! chart's alert rules) sees `D8GpuNodeGroupHeldOnDra` fire for a group held
//! after the module upgrade and clear when the group is released, every
//! panel query of the chart's dashboards return data during the migration
//! (the panels of faults with their faults staged: claims pending and left
//! reserved, a record passed over, writes refused by an admission policy, a
//! `switchyard migrate` run),
//! and the node agents' series; a real Jaeger receives, over OTLP from the
//! pods, one trace per handover.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod, Taint};
use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use switchyard_eventlog::EventLog;
use switchyard_eventlog::nats::{NatsLog, NatsOptions};
use switchyard_proto::v1::domain_event::Kind;
use switchyard_system_tests::chart::{render, rendered_dashboards};
use switchyard_testkit::chart::{self, ChartCluster, NAMESPACE, NodeSpec, RELEASE};
use switchyard_testkit::jaeger::Jaeger;
use switchyard_testkit::kube::create_namespace;
use switchyard_testkit::kwok::{Kwok, kwok_node};
use switchyard_testkit::migration::{create_group, events_in, prepare_nodes, set_module_config};
use switchyard_testkit::node::{BUSYBOX_IMAGE, GPU_DEVICE_NODES};
use switchyard_testkit::prometheus::{self as prom, Prometheus};
use switchyard_testkit::reference::{self, cli_command};
use switchyard_testkit::{eventually, repo_root, run};

/// Real GPU nodes (the simulator's names; they join the group `gpu` once
/// the upgrade hold is recorded), and a worker for the services and the
/// log's volume.
const NODES: [NodeSpec<'static>; 3] = [
    NodeSpec {
        name: "gpu-0",
        labels: &[],
    },
    NodeSpec {
        name: "gpu-1",
        labels: &[],
    },
    NodeSpec {
        name: "worker-1",
        labels: &[NOT_GPU],
    },
];

/// kwok nodes beside them: workers outside the migration.
const KWOK_NODES: usize = 20;

/// Each workload container's CPU limit (the simulator's is 4 CPUs; a real
/// node here has the machine's two).
const CPU_LIMIT: &str = "50m";

/// Not a GPU node: no stack, no node agent (the reference's exception; with
/// a fixture machine an agent there would serve made-up cards).
const NOT_GPU: (&str, &str) = ("gpu.deckhouse.io/enabled", "false");

/// What each workload's container runs: the card it was given, from inside.
const PRINT_CARD: &str = "echo visible=$NVIDIA_VISIBLE_DEVICES; ls /dev | grep nvidia; sleep 3600";

const WAIT: Duration = Duration::from_secs(120);

/// Where the CLI sends its spans (`OTEL_EXPORTER_OTLP_ENDPOINT`), once set.
static OTLP: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// The CLI on the host, through the port-forward to the release's NATS,
/// sending its spans to the test's Jaeger.
fn cli(
    port: u16,
    kubeconfig: &Path,
    args: &[impl AsRef<std::ffi::OsStr>],
) -> (i32, String, String) {
    let mut command = cli_command(
        &switchyard_testkit::bins::binary("switchyard"),
        &format!("nats://127.0.0.1:{port}"),
        kubeconfig,
        args,
    );
    if let Some(endpoint) = OTLP.get() {
        command.env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint);
    }
    let out = command.output().expect("run switchyard");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn log_at(port: u16) -> NatsLog {
    NatsLog::connect(&format!("nats://127.0.0.1:{port}"), NatsOptions::default())
        .await
        .expect("open the release's log")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_migration_runs_through_the_installed_chart_on_real_nodes() {
    let (steps, mut expected) = reference::simulate(reference::reference_config()).await;
    let before = switchyard_sim::Simulator::new(reference::reference_config());

    let images = tempfile::tempdir().expect("image dir");
    let binary = switchyard_testkit::bins::binary("switchyard");
    switchyard_testkit::bins::binary("switchyard-node-agent");
    let project = chart::project_image(binary.parent(), images.path());
    let next = chart::project_image_tagged(binary.parent(), images.path(), "next");
    let cluster = ChartCluster::start(&project, &NODES).await;
    cluster.import_everywhere(&next);
    let c = cluster.plane.client();
    for gpu in ["gpu-0", "gpu-1"] {
        cluster.node(gpu).make_device_nodes(&GPU_DEVICE_NODES);
    }
    let mut kwok = Kwok::start(&cluster.plane);
    for i in 0..KWOK_NODES {
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
    cluster.local_volume("worker-1", 1000).await;
    let jaeger = Jaeger::start_on(cluster.network.host_ip()).await;
    OTLP.set(jaeger.otlp_endpoint()).expect("set once");

    // The release: the trial's values, the services kept off the GPU nodes
    // (a handover drains every pod of its node), spans to Jaeger.
    let mut values = chart::trial_values(&repo_root().join("deploy/fixtures/h100-8x.yaml"));
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
    values.push("--set".into());
    values.push(format!("tracing.otlpEndpoint={}", jaeger.otlp_endpoint()));
    let values: Vec<&str> = values.iter().map(String::as_str).collect();
    let installed = Instant::now();
    cluster.install(&values);
    let ready = cluster.until_ready(WAIT).await.unwrap_or_else(|e| {
        panic!(
            "{e}\n--- kubelet\n{}",
            cluster.node("worker-1").log_tail("kubelet")
        )
    });
    eprintln!(
        "every pod Ready {ready:?} after helm install returned ({:?} in all)",
        installed.elapsed()
    );
    let prometheus = Arc::new(
        Prometheus::start(
            &cluster.network,
            &prom::pod_monitor_config(
                NAMESPACE,
                &cluster.plane.kubeconfig(),
                Duration::from_secs(2),
            ),
            &chart_rules(),
        )
        .await,
    );
    let (mut forward, port) = cluster.port_forward_nats();
    let kubeconfig = cluster.plane.kubeconfig();
    let log = log_at(port).await;

    // A cluster upgraded with DRA on: its group with spec.gpu is held on DRA,
    // and Prometheus fires the alert.
    create_group(&c, "gpu-legacy", true).await;
    set_module_config(&c, true, Some("1.2.0")).await;
    eventually("gpu-legacy held on DRA", WAIT, || async {
        events_in(&log).await.iter().any(|(_, e)| {
            matches!(&e.kind, Some(Kind::NodeGroupHeldOnDra(h)) if h.group == "gpu-legacy")
        })
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    alert_is(&prometheus, true).await;
    // Steps 1 and 2 as the guide makes them: the source and target groups
    // (after the hold), the GPU class; the GPU nodes join `gpu`.
    create_group(&c, "gpu", true).await;
    create_group(&c, "gpu-dra", false).await;
    gpu_class(&cluster);
    reference::label_nodes_as_simulated(&c, &before).await;
    let bashible = tokio::spawn(prepare_nodes(c.clone()));
    let panels = PanelWatch::start(prometheus.clone());

    // The simulator's workloads on the device plugin, each printing its card.
    create_namespace(&c, "ml").await;
    let hard = before
        .quota("ml", "gpu-quota")
        .expect("the simulator's quota");
    reference::create_quota(&c, json!(hard)).await;
    let mut facts = switchyard_sim::Simulator::new(reference::reference_config()).take_facts();
    reference::with_cpu_limit(&mut facts, &mut expected, CPU_LIMIT);
    let container = json!({"image": BUSYBOX_IMAGE, "command": ["sh", "-c", PRINT_CARD]});
    let (names, pods) = reference::create_simulated_workloads(&c, &facts, &container).await;
    let apps: Vec<&str> = names.iter().map(String::as_str).collect();
    let running = eventually(
        "every workload running on the device plugin",
        WAIT,
        || async { reference::running_of(&c, &apps).await == pods },
    )
    .await;
    if let Err(e) = running {
        panic!("{e}\n{}", cluster.pods_where("ml").await);
    }

    // The commands are decided on what inventory recorded: the steps start
    // once the record holds DRA on with its feature gates ready, the
    // workloads with their running pods and the class's DeviceClass, as an
    // operator's would after `switchyard status`.
    eventually(
        "inventory to record DRA, the workloads, their pods and the class",
        WAIT,
        || async { reference::recorded_for_migration(&events_in(&log).await, &names, pods) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let first = log.last_sequence(None).await.expect("the log's end") + 1;

    // Each of the simulator's steps as the command an operator types; the
    // release upgraded before the second handover.
    let started = Instant::now();
    let mut timings = Vec::new();
    let mut handovers = 0;
    for (i, step) in steps.iter().enumerate() {
        let s = step.step.as_str();
        let Some(args) = reference::operator_command(s, &format!("step-{i}")) else {
            continue;
        };
        if s.starts_with("step 3: hand over ") {
            handovers += 1;
            if handovers == 2 {
                upgrade(&cluster).await;
            }
        }
        if s == "step 5: verify" {
            reference::evidence_facts_recorded(&c, &log)
                .await
                .unwrap_or_else(|e| panic!("{s}: {e}"));
        }
        let t0 = Instant::now();
        let (code, out, err) = cli(port, &kubeconfig, &args);
        assert_eq!(
            code,
            0,
            "{s}: {args:?}\n{out}\n{err}\n{}",
            cluster.pods_where("ml").await
        );
        if s.starts_with("completion") {
            eventually("complete's effects", WAIT, || {
                reference::completion_applied(&c, &names, &expected)
            })
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        }
        timings.push((s.to_string(), t0.elapsed()));
    }
    let migration = started.elapsed();

    // Rolled back to the installed revision: the services and agents are
    // replaced again and resume from the log.
    rollback(&cluster).await;

    // The simulator's end, nothing decided twice, no fact repeated.
    let settled = eventually("the simulator's end state", WAIT, || async {
        reference::cluster_end_state(&c, &names).await == expected
    })
    .await;
    let actual = reference::cluster_end_state(&c, &names).await;
    assert!(
        settled.is_ok(),
        "the cluster:\n{actual:#?}\nthe simulator:\n{expected:#?}"
    );
    let records = log
        .read(switchyard_eventlog::ReadRequest::default())
        .await
        .expect("read the log");
    let twice = reference::recorded_twice(&records);
    if !twice.is_empty() {
        // Each record of a subject recorded twice, decoded, for the diagnosis.
        let subjects: BTreeSet<&str> = twice
            .iter()
            .filter_map(|t| t.rsplit(" on ").next())
            .collect();
        let lines: Vec<String> = records
            .iter()
            .filter(|r| subjects.contains(r.envelope.subject.as_str()))
            .map(|r| {
                let what = match r.decode() {
                    switchyard_eventlog::Decoded::Event(e) => format!("{:?}", e.kind),
                    other => format!("{other:?}"),
                };
                format!("{} {} {what}", r.sequence, r.envelope.actor)
            })
            .collect();
        panic!("recorded twice: {twice:?}\n{}", lines.join("\n"));
    }
    assert_eq!(reference::facts_repeated(&records), Vec::<String>::new());
    let share = reference::decision_share(&records, first);
    eprintln!(
        "migration on {} real GPU nodes and {KWOK_NODES} kwok nodes: {migration:?}; Switchyard's decisions {share:?} of it",
        2
    );
    for (step, took) in &timings {
        eprintln!("  {took:>12.3?}  {step}");
    }

    // Every workload's pods see a card from inside, on either stack.
    cards_seen(&cluster, &c).await;

    // The hold released by removing spec.gpu: the alert clears.
    run(cluster.kubectl().args([
        "patch",
        "nodegroup",
        "gpu-legacy",
        "--type",
        "json",
        "-p",
        r#"[{"op":"remove","path":"/spec/gpu"}]"#,
    ]));
    alert_is(&prometheus, false).await;
    // The node agents' series, one agent per real GPU node.
    let agents = prometheus
        .query("count by (pod) (switchyard_node_agent_stack)")
        .await
        .expect("ask Prometheus");
    assert_eq!(agents.len(), 2, "the node agents' series: {agents:?}");
    // One trace per handover, with the pods' spans: the stack-assigner's
    // decisions and the node agent's switch.
    traces_per_handover(&jaeger, handovers).await;

    // The panels of faults, each fault staged; then a migration of what the
    // rollbacks left, through faults of its own, during which uninstall is
    // refused (every dashboard panel has had data by then), then let through.
    faults_feed_their_panels(&cluster, &log, &panels).await;
    let completed = uninstall_waits_for_the_migration(&cluster, port, &kubeconfig, &panels).await;
    let _ = forward.kill();
    let _ = forward.wait();

    // The log's volume is kept: installed again, the release has its log.
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(c.clone(), NAMESPACE);
    let kept = claims
        .list(&ListParams::default())
        .await
        .expect("list claims");
    assert_eq!(
        kept.items.len(),
        1,
        "the log's claim kept: {:?}",
        kept.items
    );
    drop(log);
    cluster.install(&values);
    cluster
        .until_ready(WAIT)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let (mut forward, port) = cluster.port_forward_nats();
    let (code, out, err) = cli(port, &kubeconfig, &["status", "-o", "json"]);
    let _ = forward.kill();
    let _ = forward.wait();
    assert_eq!(code, 0, "{out}{err}");
    let status: serde_json::Value = serde_json::from_str(&out).expect("status JSON");
    assert_eq!(status["handovers_completed"], completed, "{out}");
    bashible.abort();
}

/// The GPU class `h100` (Step 2), with kubectl as the guide applies it.
fn gpu_class(cluster: &ChartCluster) {
    let file = tempfile::NamedTempFile::new().expect("manifest");
    std::fs::write(
        file.path(),
        "apiVersion: gpu.deckhouse.io/v1alpha1\nkind: GPUClass\nmetadata:\n  name: h100\nspec:\n  selector:\n    matchLabels:\n      gpu.deckhouse.io/device: h100-80gb-hbm3\n",
    )
    .expect("write the manifest");
    run(cluster.kubectl().args(["apply", "-f"]).arg(file.path()));
}

/// `helm upgrade` to the image tag `next`, as an operator rolls it out.
async fn upgrade(cluster: &ChartCluster) {
    rolled(
        cluster,
        cluster
            .helm()
            .args(["upgrade", RELEASE])
            .arg(repo_root().join("deploy/helm/switchyard"))
            .args(["-n", NAMESPACE, "--reuse-values", "--set", "image.tag=next"]),
        "next",
    )
    .await;
}

/// `helm rollback` to the installed revision (the image tag of the install).
async fn rollback(cluster: &ChartCluster) {
    rolled(
        cluster,
        cluster
            .helm()
            .args(["rollback", RELEASE, "1", "-n", NAMESPACE]),
        chart::IMAGE_TAG,
    )
    .await;
}

/// Runs `helm` and waits until every service's pod and both GPU nodes'
/// agents are replaced by ones of the image tagged `tag`, Ready (a service
/// once caught up with the log), the old ones gone.
async fn rolled(cluster: &ChartCluster, helm: &mut std::process::Command, tag: &str) {
    run(helm);
    let image = format!("localhost/switchyard:{tag}");
    let pods: Api<Pod> = Api::namespaced(cluster.plane.client(), NAMESPACE);
    let selector = "app.kubernetes.io/component in (inventory,stack-assigner,class-compiler,claim-allocator,alerter,node-agent)";
    let replaced = eventually(
        &format!("every service and agent on {image}, Ready"),
        WAIT,
        || async {
            let list = pods
                .list(&ListParams::default().labels(selector))
                .await
                .map(|l| l.items)
                .unwrap_or_default();
            // Two of each service (a leader and a standby), an agent per GPU node.
            list.len() == 5 * 2 + 2
                && list.iter().all(|p| {
                    let running = p
                        .spec
                        .as_ref()
                        .map(|s| s.containers[0].image.clone())
                        .unwrap_or_default();
                    running.as_deref() == Some(image.as_str()) && ready(p)
                })
        },
    )
    .await;
    if let Err(e) = replaced {
        panic!("{e}: {:?}", chart::not_ready(&pods).await);
    }
}

/// Ready, and not on its way out.
fn ready(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_none() && chart::pod_ready(pod)
}

/// Every running pod of `ml` printed a card it was given (`visible=GPU-...`)
/// and saw the driver's control device, from inside its container.
async fn cards_seen(cluster: &ChartCluster, c: &Client) {
    let pods = Api::<Pod>::namespaced(c.clone(), "ml")
        .list(&ListParams::default())
        .await
        .expect("list pods")
        .items;
    let running: Vec<&Pod> = pods
        .iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .collect();
    assert!(!running.is_empty(), "no pod of ml runs");
    let mut stacks = std::collections::BTreeSet::new();
    for pod in running {
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        let container = &pod.spec.as_ref().unwrap().containers[0].name;
        // Its own claims, or the claim the scheduler made for its
        // nvidia.com/gpu (the class's extended resource name on DRA).
        let claims = pod
            .spec
            .as_ref()
            .and_then(|s| s.resource_claims.as_ref())
            .is_some_and(|c| !c.is_empty())
            || pod
                .status
                .as_ref()
                .and_then(|s| s.extended_resource_claim_status.as_ref())
                .is_some();
        stacks.insert(if claims { "dra" } else { "device-plugin" });
        let printed = eventually("the pod's card printed", WAIT, || async {
            cluster
                .node(&node)
                .container_log("ml", &pod.name_any(), container)
                .is_some_and(|l| l.contains("visible=GPU-") && l.lines().any(|l| l == "nvidiactl"))
        })
        .await;
        assert!(
            printed.is_ok(),
            "{} on {node} (claims: {claims}): {:?}",
            pod.name_any(),
            cluster
                .node(&node)
                .container_log("ml", &pod.name_any(), container)
        );
    }
    assert_eq!(
        stacks.into_iter().collect::<Vec<_>>(),
        ["device-plugin", "dra"],
        "pods on both stacks at the end"
    );
}

/// The chart's alert rules as Prometheus loads them: the groups of the
/// PrometheusRule the chart renders (what Prometheus Operator hands over).
fn chart_rules() -> String {
    let docs = render(&["nats.bundled.enabled=true", "prometheusRule.enabled=true"]);
    let rule = docs
        .iter()
        .find(|d| d["kind"] == "PrometheusRule")
        .expect("the chart's PrometheusRule");
    serde_yaml_ng::to_string(&json!({"groups": rule["spec"]["groups"]})).expect("YAML")
}

/// Waits until Prometheus has `D8GpuNodeGroupHeldOnDra` for `gpu-legacy`
/// firing (`firing`) or not at all.
async fn alert_is(prometheus: &Prometheus, firing: bool) {
    let what = if firing { "firing" } else { "cleared" };
    let waited = eventually(
        &format!("D8GpuNodeGroupHeldOnDra {what} in Prometheus"),
        WAIT,
        || async {
            prometheus.alerts().await.is_ok_and(|alerts| {
                prom::firing(
                    &alerts,
                    "D8GpuNodeGroupHeldOnDra",
                    "node_group",
                    "gpu-legacy",
                ) == firing
            })
        },
    )
    .await;
    if let Err(e) = waited {
        let alerts = prometheus.alerts().await;
        let targets = prometheus.targets().await;
        panic!(
            "{e}\nalerts: {alerts:?}\ntargets: {targets:?}\n{}",
            prometheus.output()
        );
    }
}

/// The namespace of the claims staged for the panels of faults.
const STAGED: &str = "staged";

/// The panels of faults that the reference's commands on a healthy cluster
/// do not cause, each fed by its fault staged here: a claim no pod asks for
/// (pending), a claim left reserved by a pod that went while
/// kube-controller-manager stood still (allocated, used by no pod), a record
/// on the log's subjects that is no envelope (passed over). The claims go
/// again once the controllers are back.
async fn faults_feed_their_panels(cluster: &ChartCluster, log: &NatsLog, panels: &PanelWatch) {
    let c = cluster.plane.client();
    create_namespace(&c, STAGED).await;
    let claims: Api<ResourceClaim> = Api::namespaced(c.clone(), STAGED);
    for name in ["asked-by-none", "left-reserved"] {
        let claim = json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": STAGED},
            "spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": "h100.gpu.deckhouse.io"}}
            ]}}
        });
        claims
            .create(
                &PostParams::default(),
                &serde_json::from_value(claim).unwrap(),
            )
            .await
            .expect("create the claim");
    }
    panels.until_seen(PENDING_CLAIMS).await;

    // A pod of the second claim, placed as the moved workloads' pods are
    // (their node selector and tolerations), running on a DRA node.
    let moved = Api::<Pod>::namespaced(c.clone(), "ml")
        .list(&ListParams::default())
        .await
        .expect("list pods")
        .items
        .into_iter()
        .find(|p| {
            p.status
                .as_ref()
                .is_some_and(|s| s.extended_resource_claim_status.is_some())
                || p.spec
                    .as_ref()
                    .and_then(|s| s.resource_claims.as_ref())
                    .is_some_and(|c| !c.is_empty())
        })
        .expect("a workload's pod on DRA");
    let placed = moved.spec.expect("its spec");
    let pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "claim-user", "namespace": STAGED},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": placed.node_selector,
            "tolerations": placed.tolerations,
            "affinity": placed.affinity,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "left-reserved"}],
            "containers": [{
                "name": "main", "image": BUSYBOX_IMAGE, "command": ["sleep", "3600"],
                "resources": {"claims": [{"name": "gpu"}], "limits": {"cpu": CPU_LIMIT}}
            }]
        }
    });
    let pods: Api<Pod> = Api::namespaced(c.clone(), STAGED);
    pods.create(
        &PostParams::default(),
        &serde_json::from_value(pod).unwrap(),
    )
    .await
    .expect("create the claim's pod");
    let running = eventually("the claim's pod running", WAIT, || async {
        pods.get("claim-user")
            .await
            .is_ok_and(|p| p.status.and_then(|s| s.phase).as_deref() == Some("Running"))
    })
    .await;
    if let Err(e) = running {
        panic!("{e}\n{}", cluster.pods_where("ml").await);
    }
    cluster.plane.pause_controller_manager();
    pods.delete("claim-user", &DeleteParams::default().grace_period(0))
        .await
        .expect("delete the claim's pod");
    panels.until_seen(UNUSED_CLAIMS).await;
    cluster.plane.resume_controller_manager();
    for name in ["asked-by-none", "left-reserved"] {
        claims
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete the claim");
    }
    eventually("the staged claims gone", WAIT, || async {
        claims
            .list(&ListParams::default())
            .await
            .is_ok_and(|l| l.items.is_empty())
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));

    log.client()
        .publish("switchyard.log.junk", "not a proto".into())
        .await
        .expect("publish");
    log.client().flush().await.expect("flush");
    panels.until_seen(PASSED_OVER).await;
}

/// A migration of what the reference's rollbacks left on the device plugin,
/// with two faults in its first wave: its node's writes refused for a while
/// by an admission policy (the failed writes' panel), then its drain held by
/// a PodDisruptionBudget (the circuit breaker pauses the migration).
/// Meanwhile `helm uninstall` is refused by the pre-delete hook, whose log
/// names the handover, and every dashboard panel has had data. Once the
/// budget goes and the migration is resumed and done, the uninstall goes
/// through. The handovers completed (`status -o json`) when it went.
async fn uninstall_waits_for_the_migration(
    cluster: &ChartCluster,
    port: u16,
    kubeconfig: &Path,
    panels: &PanelWatch,
) -> serde_json::Value {
    let c = cluster.plane.client();
    // A device-plugin node with a workload's pod on it.
    let pods = Api::<Pod>::namespaced(c.clone(), "ml")
        .list(&ListParams::default())
        .await
        .expect("list pods")
        .items;
    let nodes: Api<Node> = Api::all(c.clone());
    let mut held = None;
    for pod in &pods {
        let Some(node) = pod.spec.as_ref().and_then(|s| s.node_name.clone()) else {
            continue;
        };
        let stack = nodes.get(&node).await.ok().and_then(|n| {
            n.labels()
                .get(switchyard_testkit::migration::STACK)
                .cloned()
        });
        if stack.as_deref() == Some("device-plugin") {
            held = Some((node, pod.spec.as_ref().and_then(|s| s.tolerations.clone())));
            break;
        }
    }
    let (node, tolerations) = held.expect("a device-plugin node running a workload");
    // A database beside the workload, no GPU, under a budget that lets
    // none of its pods go: the node's drain is refused.
    let db = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "db", "namespace": STAGED},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "db"}},
            "template": {
                "metadata": {"labels": {"app": "db"}},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "tolerations": tolerations,
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{
                        "name": "main", "image": BUSYBOX_IMAGE, "command": ["sleep", "3600"],
                        "resources": {"limits": {"cpu": CPU_LIMIT}}
                    }]
                }
            }
        }
    });
    Api::<Deployment>::namespaced(c.clone(), STAGED)
        .create(&PostParams::default(), &serde_json::from_value(db).unwrap())
        .await
        .expect("create the database");
    let staged: Api<Pod> = Api::namespaced(c.clone(), STAGED);
    let running = eventually("the database running", WAIT, || async {
        staged
            .list(&ListParams::default().labels("app=db"))
            .await
            .is_ok_and(|l| l.items.iter().any(ready))
    })
    .await;
    if let Err(e) = running {
        panic!("{e}\n{}", cluster.pods_where("ml").await);
    }
    let budget = json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": {"name": "db", "namespace": STAGED},
        "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "db"}}}
    });
    let budgets: Api<k8s_openapi::api::policy::v1::PodDisruptionBudget> =
        Api::namespaced(c.clone(), STAGED);
    budgets
        .create(
            &PostParams::default(),
            &serde_json::from_value(budget).unwrap(),
        )
        .await
        .expect("create the budget");

    // The stack-assigner's node writes refused, as a policy a cluster's
    // admins add can: in force once a dry run as its account is refused.
    let account = Api::<Deployment>::namespaced(c.clone(), NAMESPACE)
        .get(&format!("{RELEASE}-stack-assigner"))
        .await
        .expect("the stack-assigner's Deployment")
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|s| s.service_account_name)
        .expect("its service account");
    let user = format!("system:serviceaccount:{NAMESPACE}:{account}");
    let policy = tempfile::NamedTempFile::new().expect("manifest");
    std::fs::write(policy.path(), refuse_node_writes(&user)).expect("write the manifest");
    run(cluster.kubectl().args(["apply", "-f"]).arg(policy.path()));
    eventually("the policy in force", WAIT, || async {
        let out = cluster
            .kubectl()
            .args([
                "label",
                "node",
                &node,
                "staged=1",
                "--dry-run=server",
                "--as",
                &user,
            ])
            .output()
            .expect("run kubectl");
        String::from_utf8_lossy(&out.stderr).contains(REFUSED_BY_POLICY)
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));

    let (code, out, err) = cli(
        port,
        kubeconfig,
        &[
            "migrate", "--from", "gpu", "--to", "gpu-dra", "--class", "h100", "--id", "last",
        ],
    );
    assert_eq!(code, 0, "{out}{err}");
    for panel in [FAILED_WRITES, MIGRATIONS, WAVES] {
        panels.until_seen(panel).await;
    }
    run(cluster.kubectl().args(["delete", "-f"]).arg(policy.path()));
    eventually("the drain refused by the budget", WAIT, || async {
        let (_, out, _) = cli(port, kubeconfig, &["status"]);
        out.contains(&format!("eviction of {STAGED}/db-")) && out.contains("refused")
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", cli(port, kubeconfig, &["status"]).1));

    let refused = cluster
        .helm()
        .args([
            "uninstall",
            RELEASE,
            "-n",
            NAMESPACE,
            "--wait",
            "--timeout",
            "2m",
        ])
        .output()
        .expect("run helm");
    assert!(
        !refused.status.success(),
        "helm uninstall went through a handover"
    );
    let guard = Api::<Pod>::namespaced(c.clone(), NAMESPACE)
        .list(&ListParams::default().labels("app.kubernetes.io/component=uninstall-guard"))
        .await
        .expect("list the guard's pods")
        .items;
    let said: String = guard
        .iter()
        .filter_map(|p| {
            let node = p.spec.as_ref()?.node_name.clone()?;
            cluster
                .node(&node)
                .container_log(NAMESPACE, &p.name_any(), "guard")
        })
        .collect();
    assert!(
        said.contains(&format!("of node {node} (gpu -> gpu-dra)")),
        "the guard's log: {said}\nhelm: {}",
        String::from_utf8_lossy(&refused.stderr)
    );
    // Nothing was deleted: the services still run.
    let deployments: Api<Deployment> = Api::namespaced(c.clone(), NAMESPACE);
    assert_eq!(
        deployments
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        5
    );
    let blind = panels.blind().await;
    assert!(
        blind.is_empty(),
        "dashboard queries that never had data: {blind:#?}"
    );

    budgets
        .delete("db", &Default::default())
        .await
        .expect("delete the budget");
    let (code, out, err) = cli(
        port,
        kubeconfig,
        &["migrate", "resume", "--id", "last", "--wait"],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("migration last done"), "{out}");
    let (code, out, err) = cli(port, kubeconfig, &["status", "-o", "json"]);
    assert_eq!(code, 0, "{out}{err}");
    let status: serde_json::Value = serde_json::from_str(&out).expect("status JSON");
    cluster.uninstall(&[]).await;
    status["handovers_completed"].clone()
}

/// What the admission policy of [`refuse_node_writes`] answers.
const REFUSED_BY_POLICY: &str = "node writes refused by the test's admission policy";

/// A ValidatingAdmissionPolicy and its binding refusing `user`'s updates of
/// Nodes (patches included).
fn refuse_node_writes(user: &str) -> String {
    format!(
        r#"apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicy
metadata:
  name: staged-refuse-node-writes
spec:
  failurePolicy: Fail
  matchConstraints:
    resourceRules:
    - apiGroups: [""]
      apiVersions: ["v1"]
      operations: ["UPDATE"]
      resources: ["nodes"]
  matchConditions:
  - name: the-account
    expression: 'request.userInfo.username == "{user}"'
  validations:
  - expression: "false"
    message: "{REFUSED_BY_POLICY}"
    reason: Forbidden
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingAdmissionPolicyBinding
metadata:
  name: staged-refuse-node-writes
spec:
  policyName: staged-refuse-node-writes
  validationActions: [Deny]
"#
    )
}

/// The panels that only a fault or a `switchyard migrate` run feeds; the
/// test stages each.
const PENDING_CLAIMS: &str = "switchyard-gpu-allocation.json: panel \"Pending claims\"";
const UNUSED_CLAIMS: &str = "switchyard-gpu-allocation.json: panel \"Unused claims\"";
const MIGRATIONS: &str = "switchyard-migration.json: panel \"Migrations\"";
const WAVES: &str = "switchyard-migration.json: panel \"Waves\"";
const PASSED_OVER: &str = "switchyard-migration.json: panel \"Records passed over\"";
const FAILED_WRITES: &str = "switchyard-migration.json: panel \"Effects failed by reason\"";

/// Every query of the chart's dashboards (each panel's, each variable's
/// selector), asked of Prometheus every two seconds: those that have
/// returned data.
struct PanelWatch {
    queries: Vec<(String, String)>,
    prometheus: Arc<Prometheus>,
    seen: Arc<Mutex<BTreeSet<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl PanelWatch {
    fn start(prometheus: Arc<Prometheus>) -> PanelWatch {
        use switchyard_system_tests::dashboards::{concrete, queries, variables};
        let mut all = Vec::new();
        let dashboards =
            rendered_dashboards(&["nats.bundled.enabled=true", "dashboards.enabled=true"]);
        for (file, dashboard) in &dashboards {
            let defined: BTreeSet<String> = variables(dashboard)
                .filter_map(|v| v["name"].as_str().map(str::to_string))
                .collect();
            for q in queries(file, dashboard) {
                let expr = concrete(&q.place, &q.expr, &defined);
                all.push((q.place, expr));
            }
        }
        assert!(all.len() > 20, "the dashboards' queries: {all:?}");
        let seen = Arc::new(Mutex::new(BTreeSet::new()));
        let task = tokio::spawn({
            let (queries, seen, prometheus) = (all.clone(), seen.clone(), prometheus.clone());
            async move {
                let mut every = tokio::time::interval(Duration::from_secs(2));
                loop {
                    every.tick().await;
                    for (place, expr) in &queries {
                        if seen.lock().unwrap().contains(place) {
                            continue;
                        }
                        if prometheus.query(expr).await.is_ok_and(|r| !r.is_empty()) {
                            seen.lock().unwrap().insert(place.clone());
                        }
                    }
                }
            }
        });
        PanelWatch {
            queries: all,
            prometheus,
            seen,
            task,
        }
    }

    /// Waits until every query of `panel` (`FILE: panel "TITLE"`) has
    /// returned data.
    async fn until_seen(&self, panel: &str) {
        let of_panel: Vec<&String> = self
            .queries
            .iter()
            .map(|(place, _)| place)
            .filter(|place| place.starts_with(panel))
            .collect();
        assert!(!of_panel.is_empty(), "no dashboard panel {panel}");
        eventually(&format!("data in {panel}"), WAIT, || async {
            let seen = self.seen.lock().unwrap();
            of_panel.iter().all(|place| seen.contains(*place))
        })
        .await
        .unwrap_or_else(|e| {
            panic!(
                "{e}: {:#?}",
                self.queries
                    .iter()
                    .filter(|(p, _)| p.starts_with(panel))
                    .collect::<Vec<_>>()
            )
        });
    }

    /// The queries that have never returned data (each asked once more),
    /// with their PromQL.
    async fn blind(&self) -> Vec<String> {
        let mut blind = Vec::new();
        for (place, expr) in &self.queries {
            if self.seen.lock().unwrap().contains(place) {
                continue;
            }
            if !self
                .prometheus
                .query(expr)
                .await
                .is_ok_and(|r| !r.is_empty())
            {
                blind.push(format!("{place}: {expr}"));
            }
        }
        blind
    }
}

impl Drop for PanelWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Jaeger holds one trace per handover typed: `handovers` traces of the
/// CLI's `send StartHandover` in which the stack-assigner decided the
/// handover's start and end and the node agent (a pod) switched its stack.
async fn traces_per_handover(jaeger: &Jaeger, handovers: usize) {
    let complete = |trace: &switchyard_testkit::jaeger::Trace| {
        trace
            .named("stack-assigner", "decide HandoverStarted")
            .count()
            == 1
            && trace
                .named("stack-assigner", "decide HandoverCompleted")
                .count()
                == 1
            && trace.named("node-agent", "switch to dra").count() > 0
    };
    let found = Mutex::new(Vec::new());
    let arrived = eventually("a complete trace per handover", WAIT, || async {
        let Ok(roots) = jaeger.traces("switchyard", "send StartHandover").await else {
            return false;
        };
        let mut traces = Vec::new();
        for root in &roots {
            if let Some(id) = root["traceID"].as_str()
                && let Ok(trace) = jaeger.trace(id).await
            {
                traces.push(trace);
            }
        }
        let done = traces.iter().filter(|t| complete(t)).count() == handovers;
        *found.lock().unwrap() = traces;
        done
    })
    .await;
    let traces = found.into_inner().unwrap();
    assert!(
        arrived.is_ok(),
        "{arrived:?}: {} traces, services {:?}",
        traces.len(),
        traces.iter().map(|t| t.services()).collect::<Vec<_>>()
    );
}

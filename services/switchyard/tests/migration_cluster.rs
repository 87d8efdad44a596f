//! The reference migration on a real cluster: etcd, kube-apiserver,
//! kube-scheduler and kube-controller-manager, kwok giving the kubelet-less
//! GPU nodes and their pods a lifecycle, JetStream, Switchyard's services as
//! their own processes and a node agent per GPU node on a fixture GPU
//! source — driven only by the commands a platform engineer types:
//! `switchyard handover`, `move` (and `--dry-run -o patch`), `rollback app`
//! and `complete`, each with `--wait`.

mod support;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{Node, Pod, ResourceQuota};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use support::*;
use switchyard_proto::v1::domain_event::Kind;
use switchyard_testkit::reference::{self, cli_at, create_quota, pods_of, running_of, running_on};

/// The `switchyard` CLI under test.
fn switchyard() -> &'static std::path::Path {
    std::path::Path::new(env!("CARGO_BIN_EXE_switchyard"))
}

/// Runs `switchyard` as the operator `ops@example.com`.
fn cli(world: &World, args: &[&str]) -> (i32, String, String) {
    cli_at(
        switchyard(),
        &world.nats.url(),
        &world.plane.kubeconfig(),
        args,
    )
}

/// [`reference::run`] with the binaries cargo built for this test, and its
/// report printed.
async fn reference_scenario_on_kwok(
    faults: Option<u64>,
    toxics: &[Toxic<'_>],
    flow_shares: Option<u32>,
) -> reference::Report {
    reference_scenario_on_servers(faults, toxics, flow_shares, 1).await
}

/// [`reference_scenario_on_kwok`] with the log on `nats_servers` servers.
async fn reference_scenario_on_servers(
    faults: Option<u64>,
    toxics: &[Toxic<'_>],
    flow_shares: Option<u32>,
    nats_servers: usize,
) -> reference::Report {
    reference_scenario_with(faults, toxics, flow_shares, nats_servers, 1).await
}

/// [`reference_scenario_on_servers`] with `replicas` of each elected service.
async fn reference_scenario_with(
    faults: Option<u64>,
    toxics: &[Toxic<'_>],
    flow_shares: Option<u32>,
    nats_servers: usize,
    replicas: usize,
) -> reference::Report {
    let report = reference::run(reference::Options {
        faults,
        toxics,
        flow_shares,
        binary: switchyard_testkit::bins::binary,
        cli: switchyard(),
        nats_servers,
        replicas,
    })
    .await;
    if let Some((changes, conflicts)) = report.changes {
        println!(
            "through toxiproxy: {changes} changes made under the services, {conflicts} lines of their logs naming a 409"
        );
    }
    if let Some(rejected) = report.rejected {
        println!("API Priority and Fairness rejected {rejected} of the services' requests (429)");
    }
    if let Some(seed) = faults {
        println!("{} faults survived (seed {seed:#x}):", report.struck.len());
        for line in &report.struck {
            println!("  {line}");
        }
    }
    report
}

/// The shared migration cluster on these nodes, 8 cards each.
async fn cluster(nodes: &[&str]) -> MigrationCluster {
    cluster_upgraded_from(nodes, None).await
}

/// [`cluster`] after an upgrade of the module from `previous_version`, if given.
async fn cluster_upgraded_from(nodes: &[&str], previous_version: Option<&str>) -> MigrationCluster {
    cluster_with(nodes, previous_version, &[], None).await
}

/// [`cluster_upgraded_from`], the services reaching the API server through
/// toxiproxy with `toxics`, and on their own accounts in a priority level
/// `flow_shares` wide if given.
async fn cluster_with(
    nodes: &[&str],
    previous_version: Option<&str>,
    toxics: &[Toxic<'_>],
    flow_shares: Option<u32>,
) -> MigrationCluster {
    let nodes: Vec<String> = nodes.iter().map(|n| n.to_string()).collect();
    MigrationCluster::start(ClusterOptions {
        nodes: &nodes,
        gpus_per_node: 8,
        binary: switchyard_testkit::bins::binary,
        service_env: Vec::new(),
        agent_env: Vec::new(),
        previous_version,
        toxics,
        flow_shares,
        nats_servers: 1,
        replicas: 1,
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_migration_runs_on_a_real_cluster_from_the_commands() {
    let cluster = cluster(&["gpu-0", "gpu-1"]).await;
    let world = &cluster.world;
    let c = world.client.clone();

    // An application on the device plugin, and its quota.
    let train: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "train", "labels": {"team": "ml"}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "train"}},
            "template": {
                "metadata": {"labels": {"app": "train"}},
                "spec": {
                    "nodeSelector": {GROUP: "gpu"},
                    "containers": [{
                        "name": "main", "image": "registry.example.com/train:1",
                        "env": [{"name": "EPOCHS", "value": "3"}],
                        "resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "2"}},
                    }],
                },
            },
        },
    }))
    .unwrap();
    let deployments: Api<Deployment> = Api::namespaced(c.clone(), "ml");
    deployments
        .create(&PostParams::default(), &train)
        .await
        .expect("create train");
    create_quota(&c, json!({"requests.nvidia.com/gpu": "4"})).await;
    world
        .until("train running on the device plugin", || async {
            running_on(&pods_of(&c, "train").await).len() == 1
        })
        .await;
    let original = deployments.get("train").await.unwrap();

    // Step 4 before Step 3 is refused with the reference's reason.
    let (code, out, err) = cli(
        world,
        &[
            "move",
            "--workload",
            "ml/Deployment/train",
            "--class",
            "h100",
        ],
    );
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(
        out.contains("hand over a node before moving the application"),
        "{out}"
    );

    // Step 3: hand gpu-0 over; --wait prints each step until it is done.
    let (code, out, err) = cli(
        world,
        &[
            "handover", "--node", "gpu-0", "--to", "gpu-dra", "--id", "h-gpu-0", "--wait",
        ],
    );
    assert_eq!(code, 0, "{out}\n{err}\n{}", world.output());
    for step in [
        "handover h-gpu-0 of node gpu-0 started: gpu -> gpu-dra",
        "node gpu-0 cordoned",
        "node gpu-0 drained",
        "node gpu-0 moved from group gpu to gpu-dra",
        "node gpu-0 uncordoned",
        "handover h-gpu-0 done: node gpu-0 serves group gpu-dra",
    ] {
        assert!(out.contains(step), "{step:?} missing from\n{out}");
    }
    // The node agent publishes gpu-0's cards as DRA devices.
    let slices: Api<ResourceSlice> = Api::all(c.clone());
    world
        .until("gpu-0's ResourceSlices", || async {
            slices.list(&ListParams::default()).await.is_ok_and(|l| {
                l.items
                    .iter()
                    .any(|s| s.spec.node_name.as_deref() == Some("gpu-0"))
            })
        })
        .await;

    // Step 4, dry run: the change as a merge patch, nothing written.
    let (code, out, err) = cli(
        world,
        &[
            "move",
            "--workload",
            "ml/Deployment/train",
            "--class",
            "h100",
            "--dry-run",
            "-o",
            "patch",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let patch: serde_json::Value = serde_json::from_str(out.trim()).expect("a JSON patch");
    assert_eq!(
        patch["spec"]["template"]["spec"]["nodeSelector"],
        json!({GROUP: null})
    );
    assert_eq!(
        patch["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"],
        json!({"cpu": "2", "gpu.deckhouse.io/h100": "1"})
    );
    assert_eq!(
        deployments.get("train").await.unwrap().spec,
        original.spec,
        "a dry run changes nothing"
    );

    // Step 4 and Step 5: moved, restarted, verified on gpu-dra with its claim.
    let (code, out, err) = cli(
        world,
        &[
            "move",
            "--workload",
            "ml/Deployment/train",
            "--class",
            "h100",
            "--id",
            "m-train",
            "--wait",
        ],
    );
    assert_eq!(code, 0, "{out}\n{err}\n{}", world.output());
    assert!(
        out.contains(
            "move m-train done: Deployment ml/train runs on gpu-0 with 1 claim(s) allocated"
        ),
        "{out}"
    );
    let moved = deployments.get("train").await.unwrap();
    let spec = moved.spec.as_ref().unwrap().template.spec.as_ref().unwrap();
    assert_eq!(
        spec.node_selector, None,
        "the binding to the source group is gone"
    );
    let limits = spec.containers[0]
        .resources
        .as_ref()
        .unwrap()
        .limits
        .clone()
        .unwrap();
    assert_eq!(
        limits.keys().collect::<Vec<_>>(),
        ["cpu", "gpu.deckhouse.io/h100"],
        "nvidia.com/gpu replaced, the rest kept"
    );
    assert_eq!(
        spec.containers[0].env,
        train
            .spec
            .as_ref()
            .unwrap()
            .template
            .spec
            .as_ref()
            .unwrap()
            .containers[0]
            .env
    );
    let pods = pods_of(&c, "train").await;
    assert_eq!(running_on(&pods), ["gpu-0"]);
    let running = pods
        .iter()
        .find(|p| p.metadata.deletion_timestamp.is_none())
        .unwrap();
    let claim_name = running
        .status
        .as_ref()
        .and_then(|s| s.extended_resource_claim_status.as_ref())
        .map(|s| s.resource_claim_name.clone())
        .expect("the scheduler made the pod's claim");
    let claim = Api::<ResourceClaim>::namespaced(c.clone(), "ml")
        .get(&claim_name)
        .await
        .expect("the claim");
    let allocation = claim.status.and_then(|s| s.allocation).expect("allocated");
    assert_eq!(
        allocation.devices.unwrap().results.unwrap()[0].driver,
        "gpu.deckhouse.io"
    );

    // The exit evidence, checked on the cluster now and recorded: gpu-0
    // publishes its cards and no longer advertises nvidia.com/gpu (the node
    // agent's device plugin stopped), gpu-1 still serves the device plugin,
    // train runs on gpu-0 with its claim.
    let (code, out, err) = cli(world, &["evidence", "--id", "ev-1"]);
    assert_eq!(code, 0, "{out}\n{err}\n{}", world.output());
    for line in [
        "evidence of node gpu-0: passed",
        "ok     no dual advertisement: 8 devices in 1 ResourceSlices, no device-plugin resource allocatable",
        "ok     slices match the PhysicalGPUs: 8 cards published with the PhysicalGPUs' UUIDs",
        "evidence of node gpu-1: passed",
        "ok     no dual advertisement: device-plugin stack: 8 device-plugin GPU resources allocatable, no GPU ResourceSlice",
        "evidence of Deployment ml/train: passed",
        "ok     pods on the target group: 1 pods running in group gpu-dra on gpu-0",
        "ok     claims allocated and reserved: 1 claims allocated on their pods' nodes and reserved for them",
        "evidence ev-1: 2 node(s), 1 workload(s), 0 failed",
    ] {
        assert!(out.contains(line), "{line:?} missing from\n{out}");
    }
    // The same id again: the check as recorded then, not a new one.
    let (code, again, err) = cli(world, &["evidence", "--id", "ev-1"]);
    assert_eq!(code, 0, "{again}\n{err}");
    assert!(err.contains("ev-1 was started already"), "{err}");
    assert_eq!(
        again, out,
        "the recorded check, printed as when it was made"
    );
    let (code, _, err) = cli(world, &["evidence", "--wave", "1"]);
    assert_eq!(code, 2, "--wave needs --migration: {err}");
    assert!(err.contains("--migration"), "{err}");

    // The application's rollback: the manifest as it was, byte for byte, and
    // its pod back on the device plugin.
    let (code, out, err) = cli(
        world,
        &[
            "rollback",
            "app",
            "--workload",
            "ml/Deployment/train",
            "--wait",
        ],
    );
    assert_eq!(code, 0, "{out}\n{err}\n{}", world.output());
    assert!(out.contains("done"), "{out}");
    let restored = deployments.get("train").await.unwrap();
    let pod_spec =
        |d: &Deployment| serde_json::to_string(&d.spec.as_ref().unwrap().template.spec).unwrap();
    assert_eq!(pod_spec(&restored), pod_spec(&original));
    world
        .until("train back on gpu-1", || async {
            running_on(&pods_of(&c, "train").await) == ["gpu-1"]
        })
        .await;

    // Completion is refused while device-plugin nodes and workloads remain.
    let (code, out, err) = cli(world, &["complete", "--from", "gpu", "--class", "h100"]);
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(out.contains("completion of group gpu refused"), "{out}");

    // Move it again, hand over the last node, then complete.
    let (code, out, err) = cli(
        world,
        &[
            "move",
            "--workload",
            "ml/Deployment/train",
            "--class",
            "h100",
            "--wait",
        ],
    );
    assert_eq!(code, 0, "{out}\n{err}\n{}", world.output());
    let (code, out, err) = cli(
        world,
        &["handover", "--node", "gpu-1", "--to", "gpu-dra", "--wait"],
    );
    assert_eq!(code, 0, "{out}\n{err}\n{}", world.output());
    let (code, out, err) = cli(world, &["complete", "--from", "gpu", "--class", "h100"]);
    assert_eq!(code, 0, "{out}\n{err}\n{}", world.output());
    let quotas: Api<ResourceQuota> = Api::namespaced(c.clone(), "ml");
    world
        .until("the quota translated with the same value", || async {
            let hard = quotas
                .get("gpu-quota")
                .await
                .ok()
                .and_then(|q| q.spec)
                .and_then(|s| s.hard)
                .unwrap_or_default();
            hard.get("requests.gpu.deckhouse.io/h100")
                .map(|q| q.0.as_str())
                == Some("4")
                && !hard.contains_key("requests.nvidia.com/gpu")
        })
        .await;
    let nodes: Api<Node> = Api::all(c.clone());
    world
        .until("leftover device-plugin labels cleared", || async {
            let mut clear = true;
            for n in ["gpu-0", "gpu-1"] {
                clear &= nodes.get(n).await.is_ok_and(|node| {
                    let labels = node.labels();
                    !labels.contains_key("node.deckhouse.io/device-gpu.config")
                        && !labels.keys().any(|k| k.starts_with("nvidia.com/"))
                });
            }
            clear
        })
        .await;
    // The source group keeps spec.gpu for the trial period.
    let group = Api::<switchyard_api::NodeGroup>::all(c.clone())
        .get("gpu")
        .await
        .unwrap();
    assert!(group.spec.gpu.is_some(), "kept until --trial-over");
}

/// `switchyard migrate` over three waves of one node: the circuit breaker
/// stops it at a PodDisruptionBudget that refuses the drain of gpu-0, and
/// `migrate resume` (once the budget is lifted) runs it to the end — every
/// node on the target group, every workload moved there with its claims.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_runs_the_waves_and_stops_at_a_disruption_budget() {
    let nodes = ["gpu-0", "gpu-1", "gpu-2"];
    let mut cluster = cluster(&nodes).await;
    let world = &cluster.world;
    let c = world.client.clone();
    for (name, replicas) in [("web", 2), ("batch", 1)] {
        create_gpu_deployment(&c, name, replicas).await;
    }
    // A database on gpu-0 that needs no GPU, and a budget that allows it no
    // disruption: the drain of gpu-0 waits for it.
    let db: Pod = serde_json::from_value(json!({
        "metadata": {"name": "db-0", "labels": {"app": "db"}},
        "spec": {"nodeName": "gpu-0", "containers": [{"name": "main", "image": "registry.example.com/db:1"}]},
    }))
    .unwrap();
    Api::<Pod>::namespaced(c.clone(), "ml")
        .create(&PostParams::default(), &db)
        .await
        .expect("create db-0");
    world
        .until("4 pods running", || async {
            running_of(&c, &["web", "db", "batch"]).await == 4
        })
        .await;
    let pdb: k8s_openapi::api::policy::v1::PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "db"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "db"}}},
    }))
    .unwrap();
    let pdbs: Api<k8s_openapi::api::policy::v1::PodDisruptionBudget> =
        Api::namespaced(c.clone(), "ml");
    pdbs.create(&PostParams::default(), &pdb)
        .await
        .expect("pdb");
    world
        .until("the budget counted", || async {
            pdbs.get("db")
                .await
                .ok()
                .and_then(|p| p.status)
                .is_some_and(|s| s.current_healthy == Some(1) && s.disruptions_allowed == Some(0))
        })
        .await;
    let db_node = "gpu-0";

    // The plan, then the migration; the breaker stops it at db's budget.
    let (code, out, err) = cli(
        world,
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
            "mig-1",
            "--wait",
        ],
    );
    assert_eq!(code, 1, "{out}\n{err}\n{}", world.output());
    assert!(
        out.contains(
            "migration mig-1 started: gpu -> gpu-dra, class h100, 3 wave(s) of at most 1 node(s)"
        ),
        "{out}"
    );
    assert!(
        out.contains(
            "by the circuit breaker: the eviction of pod ml/db-0 from node gpu-0 was refused"
        ) && out.contains("refused by PodDisruptionBudget ml/db"),
        "{out}\n{err}"
    );
    // A stack-assigner killed and started again meets the same refusal and
    // does not record it again.
    assert_eq!(refusals_of(world, "db-0").await, 1);
    cluster.world.stop("stack-assigner");
    cluster.world.serve("stack-assigner");
    let world = &cluster.world;
    let log_path = world
        .services
        .iter()
        .find(|s| s.name() == "stack-assigner")
        .expect("the stack-assigner")
        .log_path()
        .to_path_buf();
    let restarts_before = std::fs::read_to_string(&log_path)
        .unwrap_or_default()
        .matches("still refused, as recorded before")
        .count();
    world
        .until(
            "the restarted stack-assigner to meet the refusal again",
            || async {
                std::fs::read_to_string(&log_path)
                    .unwrap_or_default()
                    .matches("still refused, as recorded before")
                    .count()
                    > restarts_before
                    && std::fs::read_to_string(&log_path)
                        .unwrap_or_default()
                        .matches("rebuilt from the log")
                        .count()
                        >= 2
            },
        )
        .await;
    assert_eq!(
        refusals_of(world, "db-0").await,
        1,
        "the refusal recorded once across the restart"
    );
    // Lifting the budget lets the drain finish; resuming runs the rest.
    pdbs.delete("db", &DeleteParams::default())
        .await
        .expect("delete the pdb");
    let (code, out, err) = cli(world, &["migrate", "resume", "--id", "mig-1", "--wait"]);
    if code != 0 {
        let events = world.events().await;
        let tail: Vec<String> = events
            .iter()
            .rev()
            .take(40)
            .map(|(who, e)| format!("{who}: {}", serde_json::to_string(e).unwrap()))
            .collect();
        let agent = std::fs::read_to_string(world.dir.path().join("node-agent-gpu-0.log"))
            .unwrap_or_default();
        let agent: Vec<&str> = agent.lines().rev().take(30).collect();
        panic!(
            "resume: exit {code}\n{out}\n{err}\n{}\n--- the log, newest first ---\n{}\n--- gpu-0's node agent, newest first ---\n{}",
            world.output(),
            tail.join("\n"),
            agent.join("\n")
        );
    }
    assert!(out.contains("migration mig-1 done: 3 wave(s)"), "{out}");
    let node_api: Api<Node> = Api::all(c.clone());
    for node in nodes {
        let n = node_api.get(node).await.unwrap();
        assert_eq!(
            n.labels().get(GROUP).map(String::as_str),
            Some("gpu-dra"),
            "{node}"
        );
        assert_eq!(
            n.labels().get(STACK).map(String::as_str),
            Some("dra"),
            "{node}"
        );
    }
    for app in ["web", "batch"] {
        let d = Api::<Deployment>::namespaced(c.clone(), "ml")
            .get(app)
            .await
            .unwrap();
        let spec = d.spec.unwrap().template.spec.unwrap();
        let limits = spec.containers[0]
            .resources
            .clone()
            .unwrap()
            .limits
            .unwrap();
        assert!(
            limits.contains_key("gpu.deckhouse.io/h100"),
            "{app}: {limits:?}"
        );
        assert!(spec.node_selector.is_none(), "{app}");
    }
    // Each wave was done with its evidence: checked, all passed, before
    // WaveCompleted; and the operator's check of every wave now passes too.
    let events = world.events().await;
    let mut waves_done = 0;
    for (i, (_, e)) in events.iter().enumerate() {
        if let Some(switchyard_proto::v1::domain_event::Kind::WaveCompleted(w)) = &e.kind {
            waves_done += 1;
            let checked = events[..i].iter().rev().find_map(|(_, e)| match &e.kind {
                Some(switchyard_proto::v1::domain_event::Kind::EvidenceChecked(c))
                    if c.migration_id == "mig-1" && c.wave == w.wave =>
                {
                    Some(c.clone())
                }
                _ => None,
            });
            let checked =
                checked.unwrap_or_else(|| panic!("wave {} done without evidence", w.wave + 1));
            assert_eq!(
                (checked.nodes, checked.failed),
                (1, 0),
                "wave {}",
                w.wave + 1
            );
        }
    }
    assert_eq!(waves_done, 3);
    let (code, out, err) = cli(world, &["evidence", "--migration", "mig-1", "-o", "json"]);
    assert_eq!(code, 0, "{out}\n{err}\n{}", world.output());
    let records: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("a JSON event per line"))
        .filter_map(|e| e.get("evidence_recorded").cloned())
        .collect();
    let subjects: Vec<String> = records
        .iter()
        .map(|r| {
            assert_eq!(r["passed"], json!(true), "{r}");
            r["workload"]["name"]
                .as_str()
                .or(r["node"].as_str())
                .unwrap()
                .to_string()
        })
        .collect();
    let mut sorted = subjects.clone();
    sorted.sort();
    assert_eq!(sorted, ["batch", "gpu-0", "gpu-1", "gpu-2", "web"], "{out}");

    // Every step of the migration carries its id as correlation id.
    let records = world
        .log()
        .await
        .read(switchyard_eventlog::ReadRequest::default())
        .await
        .unwrap();
    let db_handed_over = records.iter().any(|r| {
        matches!(r.decode(), switchyard_eventlog::Decoded::Event(e) if matches!(&e.kind,
            Some(switchyard_proto::v1::domain_event::Kind::HandoverCompleted(h))
                if h.node == db_node && h.handover_id.starts_with("mig-1/wave-")))
    });
    assert!(
        db_handed_over,
        "the drain the budget held finished in its wave"
    );
    for record in records.iter().filter(|r| {
        matches!(
            r.envelope.event_type.as_str(),
            "WaveStarted"
                | "HandoverCompleted"
                | "ApplicationMoveVerified"
                | "EvidenceRecorded"
                | "WaveCompleted"
                | "MigrationCompleted"
        )
    }) {
        assert_eq!(
            record.envelope.correlation_id, "mig-1",
            "{}",
            record.envelope.event_type
        );
    }
}

/// How many eviction refusals of `pod` the log holds.
async fn refusals_of(world: &World, pod: &str) -> usize {
    count(
        &world.events().await,
        |k| matches!(k, Kind::EvictionBlocked(b) if b.pod == pod),
    )
}

/// A DaemonSet, a CronJob and a Job on the device plugin, asking for one card
/// each on the group `gpu`.
async fn create_other_kinds(client: &Client) {
    let template = |app: &str, restart: &str| {
        json!({
            "metadata": {"labels": {"app": app}},
            "spec": {
                "nodeSelector": {GROUP: "gpu"},
                "restartPolicy": restart,
                "containers": [{
                    "name": "main", "image": "registry.example.com/gpu-tool:1",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }],
            },
        })
    };
    let ds: DaemonSet = serde_json::from_value(json!({
        "metadata": {"name": "exporter"},
        "spec": {"selector": {"matchLabels": {"app": "exporter"}}, "template": template("exporter", "Always")},
    }))
    .unwrap();
    Api::<DaemonSet>::namespaced(client.clone(), "ml")
        .create(&PostParams::default(), &ds)
        .await
        .expect("create the DaemonSet");
    let cron: CronJob = serde_json::from_value(json!({
        "metadata": {"name": "nightly"},
        "spec": {
            "schedule": "* * * * *",
            "jobTemplate": {"spec": {"template": template("nightly", "Never")}},
        },
    }))
    .unwrap();
    Api::<CronJob>::namespaced(client.clone(), "ml")
        .create(&PostParams::default(), &cron)
        .await
        .expect("create the CronJob");
    let job: Job = serde_json::from_value(json!({
        "metadata": {"name": "once"},
        "spec": {"template": template("once", "Never")},
    }))
    .unwrap();
    Api::<Job>::namespaced(client.clone(), "ml")
        .create(&PostParams::default(), &job)
        .await
        .expect("create the Job");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemonset_and_a_cronjob_move_and_a_job_is_refused_with_its_manifest_to_recreate() {
    let cluster = cluster(&["gpu-0", "gpu-1"]).await;
    let world = &cluster.world;
    let c = world.client.clone();
    create_other_kinds(&c).await;
    world
        .until("the exporter on both device-plugin nodes", || async {
            running_on(&pods_of(&c, "exporter").await).len() == 2
        })
        .await;
    let (code, out, err) = cli(
        world,
        &["handover", "--node", "gpu-0", "--to", "gpu-dra", "--wait"],
    );
    assert_eq!(code, 0, "{out}\n{err}\n{}", world.output());

    // A Job's template cannot change: refused with the reason, and the dry
    // run prints a manifest the API server takes once the old Job is gone.
    let (code, out, _) = cli(
        world,
        &["move", "--workload", "ml/Job/once", "--class", "h100"],
    );
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("spec.template) cannot be changed"), "{out}");
    let (code, out, err) = cli(
        world,
        &[
            "move",
            "--workload",
            "ml/Job/once",
            "--class",
            "h100",
            "--dry-run",
            "-o",
            "yaml",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let recreated: Job = serde_yaml_ng::from_str(&out).expect("the Job as YAML");
    let spec = recreated.spec.as_ref().unwrap();
    assert_eq!(spec.selector, None, "the generated selector is dropped");
    let limits = spec.template.spec.as_ref().unwrap().containers[0]
        .resources
        .as_ref()
        .unwrap()
        .limits
        .clone()
        .unwrap();
    assert_eq!(limits.keys().collect::<Vec<_>>(), ["gpu.deckhouse.io/h100"]);
    let jobs: Api<Job> = Api::namespaced(c.clone(), "ml");
    jobs.delete("once", &DeleteParams::background())
        .await
        .expect("delete the old Job");
    world
        .until("the old Job gone", || async {
            jobs.get_opt("once").await.is_ok_and(|j| j.is_none())
        })
        .await;
    jobs.create(&PostParams::default(), &recreated)
        .await
        .expect("the printed manifest is accepted");

    // The DaemonSet: bound to gpu-dra, restarted, verified on gpu-0 alone.
    let (code, out, err) = cli(
        world,
        &[
            "move",
            "--workload",
            "ml/DaemonSet/exporter",
            "--class",
            "h100",
            "--to",
            "gpu-dra",
            "--id",
            "m-exporter",
            "--wait",
        ],
    );
    assert_eq!(code, 0, "{out}\n{err}\n{}", world.output());
    assert!(
        out.contains(
            "move m-exporter done: DaemonSet ml/exporter runs on gpu-0 with 1 claim(s) allocated"
        ),
        "{out}"
    );
    let ds = Api::<DaemonSet>::namespaced(c.clone(), "ml")
        .get("exporter")
        .await
        .unwrap();
    let spec = ds.spec.unwrap().template.spec.unwrap();
    assert_eq!(
        spec.node_selector,
        Some([(GROUP.to_string(), "gpu-dra".to_string())].into())
    );

    // The CronJob: its template edited, no restart; verified on the next run.
    let (code, out, err) = cli(
        world,
        &[
            "move",
            "--workload",
            "ml/CronJob/nightly",
            "--class",
            "h100",
            "--id",
            "m-nightly",
            "--wait",
        ],
    );
    assert_eq!(code, 0, "{out}\n{err}\n{}", world.output());
    assert!(
        out.contains("move m-nightly done: CronJob ml/nightly runs on gpu-0"),
        "{out}"
    );
    let cron = Api::<CronJob>::namespaced(c.clone(), "ml")
        .get("nightly")
        .await
        .unwrap();
    let template = cron.spec.job_template.spec.unwrap().template;
    assert!(
        template
            .metadata
            .and_then(|m| m.annotations)
            .is_none_or(|a| !a.contains_key("kubectl.kubernetes.io/restartedAt")),
        "a CronJob is not restarted"
    );
    assert_eq!(template.spec.unwrap().node_selector, None);

    // Evidence for both, checked now and recorded.
    let (code, out, err) = cli(world, &["evidence", "--id", "ev-kinds"]);
    assert_eq!(code, 0, "{out}\n{err}\n{}", world.output());
    for line in [
        "evidence of DaemonSet ml/exporter: passed",
        "ok     pods on the target group: 1 pods running in group gpu-dra on gpu-0",
        "evidence of CronJob ml/nightly: passed",
        "ok     pods on the target group: 1 pods running or completed in group gpu-dra on gpu-0",
    ] {
        assert!(out.contains(line), "{line:?} missing from\n{out}");
    }
}

fn allocatable_gpus(node: &Node) -> Option<String> {
    node.status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .and_then(|a| a.get("nvidia.com/gpu"))
        .map(|q| q.0.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upgrade_hold_keeps_a_group_on_dra_and_its_release_waits_for_the_claims() {
    // "If DRA was enabled before the module upgrade": group gpu has spec.gpu.
    let cluster = cluster_upgraded_from(&["gpu-0", "gpu-1"], Some("1.9.0")).await;
    let world = &cluster.world;
    let c = world.client.clone();
    let held_on_dra = map(&[
        (GROUP, "gpu"),
        ("node-role.kubernetes.io/gpu", ""),
        ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),
        ("node.deckhouse.io/device-gpu.config", "exclusive"),
        (STACK, "dra"),
        (SETUP, "true"),
    ]);
    for node in ["gpu-0", "gpu-1"] {
        world.labels_become(node, &held_on_dra).await;
    }
    world
        .until("the alerter to raise D8GpuNodeGroupHeldOnDra", || async {
            world.events().await.iter().any(|(_, e)| {
                matches!(&e.kind, Some(Kind::AlertRaised(a)) if a.alert_name == "D8GpuNodeGroupHeldOnDra")
            })
        })
        .await;
    let (code, out, err) = cli(world, &["status"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("held on DRA: gpu"), "{out}");

    // A DRA workload, its card allocated through the class on one node.
    let infer: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "infer"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "infer"}},
            "template": {
                "metadata": {"labels": {"app": "infer"}},
                "spec": {
                    "nodeSelector": {GROUP: "gpu"},
                    "containers": [{
                        "name": "main", "image": "registry.example.com/infer:1",
                        "resources": {"limits": {"gpu.deckhouse.io/h100": "1"}},
                    }],
                },
            },
        },
    }))
    .unwrap();
    let deployments: Api<Deployment> = Api::namespaced(c.clone(), "ml");
    deployments
        .create(&PostParams::default(), &infer)
        .await
        .expect("create infer");
    world
        .until("infer running with its claim", || async {
            running_on(&pods_of(&c, "infer").await).len() == 1
        })
        .await;
    let busy = running_on(&pods_of(&c, "infer").await).remove(0);
    let free = if busy == "gpu-0" { "gpu-1" } else { "gpu-0" };

    // Released: spec.gpu removed, the group stays on DRA, the alert clears.
    let groups: Api<switchyard_api::NodeGroup> = Api::all(c.clone());
    let set_spec_gpu = |gpu: serde_json::Value| {
        let groups = groups.clone();
        async move {
            groups
                .patch(
                    "gpu",
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Merge(json!({"spec": {"gpu": gpu}})),
                )
                .await
                .expect("patch the group's spec.gpu");
        }
    };
    set_spec_gpu(serde_json::Value::Null).await;
    world
        .until("the hold released and its alert cleared", || async {
            let events = world.events().await;
            count(&events, |k| matches!(k, Kind::NodeGroupReleased(_))) == 1
                && count(&events, |k| matches!(k, Kind::AlertCleared(_))) == 1
        })
        .await;
    for node in ["gpu-0", "gpu-1"] {
        assert_eq!(world.labels(node).await, held_on_dra, "{node} stays on DRA");
    }

    // spec.gpu set again: the free node goes to the device plugin; the busy
    // one holds infer's claim, so its switch waits, with the reason shown.
    set_spec_gpu(json!({"sharing": "Exclusive"})).await;
    let mut on_device_plugin = held_on_dra.clone();
    on_device_plugin.insert(STACK.to_string(), "device-plugin".to_string());
    world.labels_become(free, &on_device_plugin).await;
    let nodes: Api<Node> = Api::all(c.clone());
    world
        .until(
            "nvidia.com/gpu allocatable again on the free node",
            || async {
                nodes
                    .get(free)
                    .await
                    .is_ok_and(|n| allocatable_gpus(&n).as_deref() == Some("8"))
            },
        )
        .await;
    world
        .until("the busy node's switch held for its claim", || async {
            world.events().await.iter().any(|(_, e)| {
                matches!(&e.kind, Some(Kind::StackSwitchHeld(h)) if h.node == busy && h.claims.len() == 1)
            })
        })
        .await;
    let (_, out, _) = cli(world, &["status"]);
    assert!(
        out.contains(&format!(
            "stack switch held: {busy} stays on DRA while claims are allocated on it: ml/infer-"
        )),
        "{out}"
    );
    assert_eq!(world.labels(&busy).await, held_on_dra);
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(c.clone(), "default");
    world
        .until("a StackSwitchHeld Event on the busy node", || async {
            events.list(&ListParams::default()).await.is_ok_and(|l| {
                l.items.iter().any(|e| {
                    e.reason.as_deref() == Some("StackSwitchHeld")
                        && e.involved_object.name.as_deref() == Some(busy.as_str())
                })
            })
        })
        .await;

    // Drained (the operator removes the workload): the busy node switches too.
    deployments
        .delete("infer", &DeleteParams::default())
        .await
        .expect("delete infer");
    world.labels_become(&busy, &on_device_plugin).await;
    world
        .until(
            "nvidia.com/gpu allocatable again on the busy node",
            || async {
                nodes
                    .get(&busy)
                    .await
                    .is_ok_and(|n| allocatable_gpus(&n).as_deref() == Some("8"))
            },
        )
        .await;
    let slices: Api<ResourceSlice> = Api::all(c.clone());
    world
        .until("no ResourceSlice left", || async {
            slices
                .list(&ListParams::default())
                .await
                .is_ok_and(|l| l.items.is_empty())
        })
        .await;
}

/// `migrate --pause-after-wave` stops after the first wave (gpu-0 handed
/// over, web moved onto it); `migrate abort` ends the migration and rolls
/// that wave back on the cluster: web's template as it was, byte for byte,
/// its pod on the device plugin again, gpu-0 back in `gpu` serving it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_abort_rolls_the_current_wave_back_on_the_cluster() {
    let cluster = cluster(&["gpu-0", "gpu-1"]).await;
    let world = &cluster.world;
    let c = world.client.clone();
    create_gpu_deployment(&c, "web", 1).await;
    world
        .until("web running on the device plugin", || async {
            running_on(&pods_of(&c, "web").await).len() == 1
        })
        .await;
    let deployments: Api<Deployment> = Api::namespaced(c.clone(), "ml");
    let original = deployments.get("web").await.unwrap();
    let node_api: Api<Node> = Api::all(c.clone());
    let labels_before = node_api.get("gpu-0").await.unwrap().labels().clone();

    let (code, out, err) = cli(
        world,
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
            "--pause-after-wave",
            "--id",
            "mig-a",
            "--wait",
        ],
    );
    assert!(
        out.contains("migration mig-a started"),
        "{out}\n{err}\n{}",
        world.output()
    );
    assert_eq!(code, 0, "a pause asked for is not a failure: {out}\n{err}");
    assert!(out.contains("migration mig-a paused"), "{out}");
    let first = world
        .events()
        .await
        .iter()
        .find_map(|(_, e)| match &e.kind {
            Some(Kind::WaveCompleted(w)) if w.migration_id == "mig-a" => Some(w.wave),
            _ => None,
        });
    assert_eq!(first, Some(0), "the first wave done before the pause");
    let handed: Vec<String> = world
        .events()
        .await
        .iter()
        .filter_map(|(_, e)| match &e.kind {
            Some(Kind::HandoverCompleted(h)) => Some(h.node.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(handed.len(), 1, "one node a wave: {handed:?}");
    let moved = &handed[0];
    let spec = deployments.get("web").await.unwrap().spec.unwrap();
    assert!(
        spec.template.spec.unwrap().containers[0]
            .resources
            .as_ref()
            .unwrap()
            .limits
            .as_ref()
            .unwrap()
            .contains_key("gpu.deckhouse.io/h100"),
        "web moved in the first wave"
    );

    let (code, out, err) = cli(
        world,
        &[
            "migrate",
            "abort",
            "--id",
            "mig-a",
            "--reason",
            "trial failed",
            "--wait",
        ],
    );
    assert_eq!(code, 0, "{out}\n{err}\n{}", world.output());
    assert!(out.contains("migration mig-a aborted"), "{out}");
    world
        .until("the wave's node back on the device plugin", || async {
            node_api.get(moved).await.is_ok_and(|n| {
                n.labels().get(GROUP).map(String::as_str) == Some("gpu")
                    && n.labels().get(STACK).map(String::as_str) == Some("device-plugin")
                    && n.spec.as_ref().and_then(|s| s.unschedulable) != Some(true)
            })
        })
        .await;
    world
        .until("web running on the device plugin again", || async {
            let pods = pods_of(&c, "web").await;
            let on = running_on(&pods);
            on.len() == 1
                && pods.iter().all(|p| {
                    p.spec.as_ref().unwrap().containers[0]
                        .resources
                        .as_ref()
                        .and_then(|r| r.limits.as_ref())
                        .is_some_and(|l| l.contains_key("nvidia.com/gpu"))
                })
        })
        .await;
    let restored = deployments.get("web").await.unwrap();
    assert_eq!(
        serde_json::to_value(&restored.spec.as_ref().unwrap().template.spec).unwrap(),
        serde_json::to_value(&original.spec.as_ref().unwrap().template.spec).unwrap(),
        "the pod template as it was"
    );
    let labels_now = node_api.get("gpu-0").await.unwrap().labels().clone();
    if moved == "gpu-0" {
        assert_eq!(labels_now, labels_before, "gpu-0's labels as they were");
    }
    let (code, out, _) = cli(world, &["status"]);
    assert_eq!(code, 0);
    assert!(out.contains("mig-a"), "{out}");
}

/// Scenario-level parity: the simulator's reference migration (Steps 1–5,
/// completion, a node's and an application's rollback) on two nodes of eight
/// H100s, driven on kwok with the commands its steps name, ends in the same
/// cluster — every GPU node's labels, taints, cordon and group, every
/// workload's pod template and pods, the quota and the groups' spec.gpu.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_scenario_ends_on_kwok_as_in_the_simulator() {
    let report = reference_scenario_on_kwok(None, &[], None).await;
    assert!(report.struck.is_empty());
}

/// The same scenario with a fault in every step: each step's command runs
/// while, at a point picked by the seed (after so many more records of the
/// log), one of the faults strikes — a service or a node agent killed with
/// SIGKILL and started again, the operator's waiting `switchyard` killed and
/// the command typed again, nats-server killed with SIGKILL and started
/// again, the API server killed and started again, etcd paused past a
/// watch's patience, or a record that is no envelope published on the log's
/// subjects. The migration still ends in the simulator's cluster, with
/// nothing recorded twice. Two runs' seeds start the list of faults at the
/// 4th and the 11th of its 11, so that between them every fault strikes
/// (`SWITCHYARD_FAULT_SEED=N[,N...]` runs others; `switchyard-loadtest soak`
/// runs many). A third, 0x5eed202d, kills inventory during a handover (which
/// once left it waiting at readiness) and restarts nats-server during
/// completion just before a node's rollback (which once let a stale label
/// removal undo the rollback's restore).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_scenario_survives_a_fault_in_every_step() {
    let seeds: Vec<u64> = match std::env::var("SWITCHYARD_FAULT_SEED") {
        Ok(seeds) => seeds
            .split(',')
            .map(|s| {
                s.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("SWITCHYARD_FAULT_SEED: {s:?} is not a number"))
            })
            .collect(),
        Err(_) => vec![0x5eed_2026, 0x5eed_202b, 0x5eed_202d],
    };
    let default = std::env::var("SWITCHYARD_FAULT_SEED").is_err();
    let mut struck = std::collections::BTreeSet::new();
    for seed in seeds {
        let report = reference_scenario_on_kwok(Some(seed), &[], None).await;
        struck.extend(report.struck.iter().map(|s| s.fault));
    }
    if default {
        assert_eq!(struck.len(), 11, "every fault struck: {struck:?}");
    }
}

/// The reference scenario with its log on a JetStream cluster of three
/// nats-servers, the stream with a copy on each (R3) and every service
/// requiring three, and a fault of the cluster in every step: the server
/// leading the stream killed with SIGKILL (started again once another
/// leads), a server's routes to the others cut for 5 s through toxiproxy,
/// a server killed and started again with its store wiped. The migration
/// ends as the simulator's, nothing recorded twice, no record stored
/// twice, and once healed every server's own store holds every record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_scenario_survives_its_nats_cluster_losing_servers() {
    let report = reference_scenario_on_servers(Some(0x5eed_c105), &[], None, 3).await;
    let struck: std::collections::BTreeSet<&str> = report.struck.iter().map(|s| s.fault).collect();
    assert_eq!(
        struck,
        [
            "cut a nats-server off",
            "kill the stream's leader",
            "wipe a nats-server's store"
        ]
        .into(),
        "every fault of the cluster struck"
    );
}

/// The reference scenario with two replicas of every service, elected by a
/// Lease (6 s here), one leading and one standing by: in each step the
/// leader of the service taking the step's command fails — killed with
/// SIGKILL, cut off from the API server, or cut off from NATS (each replica
/// reaches both through a proxy of its own) — while the command runs. Each
/// time the standby begins a term in the log and takes over, a leader cut
/// off steps down and stops on its own, and the failed one comes back as a
/// standby. The stack-assigner's leader meets each of the three in a
/// node's handover (two handovers and the node's rollback); the migration
/// ends as the simulator's, nothing recorded twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_scenario_survives_its_leaders_failing_over() {
    let report = reference_scenario_with(Some(0x5eed_1ead), &[], None, 1, 2).await;
    let handovers: std::collections::BTreeSet<&str> = report
        .struck
        .iter()
        .filter(|s| s.step.starts_with("step 3: hand over") || s.step.starts_with("rollback: node"))
        .map(|s| s.fault)
        .collect();
    assert_eq!(
        handovers,
        [
            "cut the leader off NATS",
            "cut the leader off the API server",
            "kill the leader"
        ]
        .into(),
        "every fault of a leader struck in a node's handover: {:#?}",
        report.struck
    );
    for fault in [
        "kill the leader",
        "cut the leader off the API server",
        "cut the leader off NATS",
    ] {
        let took: Vec<String> = report
            .struck
            .iter()
            .filter(|s| s.fault == fault)
            .filter_map(|s| s.failover)
            .map(|d| format!("{:.1} s", d.as_secs_f64()))
            .collect();
        println!("failover after \"{fault}\": {}", took.join(", "));
    }
}

/// The reference scenario with every service's API-server traffic through
/// toxiproxy — 40 ± 20 ms each way, a fifth of the connections reset after
/// 0.5 s, a tenth stalled for 2 s and then closed — while another client
/// keeps changing the nodes and Deployments under the services (their
/// writes conditioned on what they read meet 409 Conflict): the migration
/// completes and ends as the simulator's, nothing recorded twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_scenario_completes_through_toxiproxy_and_conflicts() {
    const TOXICS: [Toxic<'static>; 4] = [
        Toxic {
            kind: "latency",
            attributes: &["latency=40", "jitter=20"],
            toxicity: 1.0,
            upstream: false,
        },
        Toxic {
            kind: "latency",
            attributes: &["latency=40", "jitter=20"],
            toxicity: 1.0,
            upstream: true,
        },
        Toxic {
            kind: "reset_peer",
            attributes: &["timeout=500"],
            toxicity: 0.2,
            upstream: true,
        },
        Toxic {
            kind: "timeout",
            attributes: &["timeout=2000"],
            toxicity: 0.1,
            upstream: false,
        },
    ];
    reference_scenario_on_kwok(None, &TOXICS, None).await;
}

/// The reference scenario with the services on their own ServiceAccounts,
/// with the chart's RBAC, in a priority level of API Priority and Fairness
/// one concurrency share wide (3 seats of the server's 600) that rejects
/// what it cannot seat: the API server answers them 429 Too Many Requests,
/// and the migration still completes and ends as the simulator's, nothing
/// recorded twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_scenario_completes_on_the_charts_accounts_through_429s() {
    reference_scenario_on_kwok(None, &[], Some(1)).await;
}

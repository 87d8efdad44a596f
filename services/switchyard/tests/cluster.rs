//! inventory and stack-assigner as real processes (their own binaries) against
//! a real control plane (etcd, kube-apiserver, and where needed
//! kube-controller-manager) and a real nats-server with JetStream.

mod support;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use switchyard_api::NodeGroup;
use switchyard_eventlog::ReadRequest;
use switchyard_proto::v1::domain_event::Kind;
use switchyard_testkit::kube::{Components, create_namespace};

use support::*;
/// The reference's stack rules on real Node objects: spec.gpu groups get the
/// device plugin, DRA goes to every other node once dra.enabled is on except
/// control-plane nodes and nodes with gpu.deckhouse.io/enabled=false — and no
/// label but gpu-stack is ever touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stack_labels_follow_the_rules_on_real_nodes() {
    let mut world = World::start(Components::default()).await;
    let c = world.client.clone();
    create_group(&c, "master", false).await;
    create_group(&c, "gpu", true).await;
    create_group(&c, "gpu-dra", false).await;
    let nodes: [(&str, &[(&str, &str)]); 5] = [
        (
            "master-0",
            &[
                (GROUP, "master"),
                ("node-role.kubernetes.io/control-plane", ""),
            ],
        ),
        (
            "gpu-1",
            &[(GROUP, "gpu"), ("node-role.kubernetes.io/gpu", "")],
        ),
        ("dra-1", &[(GROUP, "gpu-dra")]),
        (
            "dra-off",
            &[(GROUP, "gpu-dra"), ("gpu.deckhouse.io/enabled", "false")],
        ),
        ("loose-1", &[]),
    ];
    for (name, labels) in nodes {
        create_node(&c, name, labels, Vec::new()).await;
    }
    set_module_config(&c, false, None).await;
    world.serve("inventory");
    world.serve("stack-assigner");

    let with = |labels: &[(&str, &str)], stack: Option<&str>| {
        let mut m = map(labels);
        if let Some(s) = stack {
            m.insert(STACK.into(), s.into());
        }
        m
    };
    // DRA off: only the spec.gpu group has a stack.
    world
        .labels_become("gpu-1", &with(nodes[1].1, Some("device-plugin")))
        .await;
    for (name, labels) in [nodes[0], nodes[2], nodes[3], nodes[4]] {
        assert_eq!(
            world.labels(name).await,
            map(labels),
            "{name}\n{}",
            world.output()
        );
    }

    // DRA on.
    set_module_config(&c, true, None).await;
    world
        .labels_become("dra-1", &with(nodes[2].1, Some("dra")))
        .await;
    world
        .labels_become("loose-1", &with(nodes[4].1, Some("dra")))
        .await;
    assert_eq!(
        world.labels("gpu-1").await,
        with(nodes[1].1, Some("device-plugin"))
    );
    assert_eq!(
        world.labels("master-0").await,
        map(nodes[0].1),
        "control plane: no DRA"
    );
    assert_eq!(
        world.labels("dra-off").await,
        map(nodes[3].1),
        "opted out: no DRA"
    );

    // DRA off again: the DRA labels go, the device plugin stays.
    set_module_config(&c, false, None).await;
    world.labels_become("dra-1", &map(nodes[2].1)).await;
    world.labels_become("loose-1", &map(nodes[4].1)).await;
    assert_eq!(
        world.labels("gpu-1").await,
        with(nodes[1].1, Some("device-plugin"))
    );

    // Every decision is in the log once per change, and inventory never
    // reported an object again without a change.
    let events = world.events().await;
    let assigned = count(
        &events,
        |k| matches!(k, Kind::StackAssigned(s) if s.node == "dra-1"),
    );
    assert_eq!(assigned, 3, "dra-1: none, dra, none");
    let mut last = BTreeMap::new();
    for (actor, event) in &events {
        if actor == "inventory" {
            let subject = switchyard_core::subjects::subject_of(event);
            let bytes = prost::Message::encode_to_vec(event);
            assert_ne!(
                last.insert(subject, bytes.clone()),
                Some(bytes),
                "inventory reported an unchanged object again: {event:?}"
            );
        }
    }
    let settings = count(&events, |k| matches!(k, Kind::ModuleSettingsObserved(_)));
    assert_eq!(settings, 3, "off, on, off");
}

/// The upgrade hold: a cluster upgraded with dra.enabled keeps its spec.gpu
/// group on DRA, even when the stack-assigner starts after inventory recorded
/// the upgrade (it finds the hold due in the log); a restarted stack-assigner
/// rebuilds the hold from the log (it does not hold again, nor forget), and
/// inventory restarted does not report the cluster again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upgrade_hold_survives_restarts() {
    let mut world = World::start(Components::default()).await;
    let c = world.client.clone();
    create_group(&c, "gpu-legacy", true).await;
    create_node(&c, "legacy-1", &[(GROUP, "gpu-legacy")], Vec::new()).await;
    set_module_config(&c, true, Some("1.9.0")).await;
    world.serve("inventory");
    world
        .until("inventory to record the upgrade", || async {
            count(&world.events().await, |k| {
                matches!(k, Kind::ModuleSettingsObserved(_))
            }) == 1
        })
        .await;
    world.serve("stack-assigner");
    world
        .labels_become("legacy-1", &map(&[(GROUP, "gpu-legacy"), (STACK, "dra")]))
        .await;
    world
        .until("inventory to report the label", || async {
            world.events().await.iter().any(|(_, e)| matches!(&e.kind,
                Some(Kind::NodeObserved(n)) if n.node == "legacy-1" && n.labels.get(STACK).map(String::as_str) == Some("dra")))
        })
        .await;

    // Restart both; meanwhile a node joins the held group.
    world.stop("stack-assigner");
    world.stop("inventory");
    let before = world.events().await.len();
    create_node(&c, "legacy-2", &[(GROUP, "gpu-legacy")], Vec::new()).await;
    world.serve("inventory");
    world.serve("stack-assigner");
    world
        .labels_become("legacy-2", &map(&[(GROUP, "gpu-legacy"), (STACK, "dra")]))
        .await;
    let events = world.events().await;
    let holds = count(&events, |k| matches!(k, Kind::NodeGroupHeldOnDra(_)));
    assert_eq!(holds, 1, "held once, on the first run\n{}", world.output());
    // After the restart inventory reported only the new node (as it joined
    // and once labelled), nothing it had reported before.
    let reported: Vec<String> = events[before..]
        .iter()
        .filter(|(actor, _)| actor == "inventory")
        .map(|(_, e)| switchyard_core::subjects::subject_of(e))
        .collect();
    assert_eq!(
        reported,
        ["node.legacy-2", "node.legacy-2"],
        "{}",
        world.output()
    );
    // legacy-1 never left DRA: no other stack was ever decided for it.
    let stacks: Vec<i32> = events
        .iter()
        .filter_map(|(_, e)| match &e.kind {
            Some(Kind::StackAssigned(a)) if a.node == "legacy-1" => Some(a.stack),
            _ => None,
        })
        .collect();
    assert_eq!(stacks, [switchyard_proto::v1::Stack::Dra as i32]);

    // The alerter raises D8GpuNodeGroupHeldOnDra, and its /metrics says it
    // fires — again after a restart, rebuilt from the log.
    let port = switchyard_testkit::free_port();
    let listen = format!("127.0.0.1:{port}");
    let alerter_env = [("SWITCHYARD_METRICS_LISTEN", listen.as_str())];
    const FIRING: &str =
        r#"switchyard_alert_firing{alert="D8GpuNodeGroupHeldOnDra",node_group="gpu-legacy"} 1"#;
    // With the state it folded from the log: the group held, its node on
    // DRA with no handover, and how far behind the log the alerter is.
    const HELD: &str = r#"switchyard_node_group_held_on_dra{node_group="gpu-legacy"} 1"#;
    const NODE: &str = r#"switchyard_gpu_node{node="legacy-1",node_group="gpu-legacy",stack="dra",handover_step="none",stack_reason="held_on_dra"} 1"#;
    let firing = || async {
        switchyard_testkit::scrape(port).await.is_ok_and(|text| {
            [FIRING, HELD, NODE]
                .iter()
                .all(|line| text.lines().any(|l| l == *line))
                && text
                    .lines()
                    .any(|l| l.starts_with(r#"switchyard_log_lag_records{service="alerter"} "#))
        })
    };
    for run in ["first", "restarted"] {
        world.stop("alerter");
        world.serve_with_env("alerter", &alerter_env);
        world
            .until(
                &format!("the {run} alerter's /metrics to show the hold firing, the group held and its node"),
                firing,
            )
            .await;
    }

    // The module status (the alerter wrote it on the gpu ModuleConfig,
    // whose CRD is Switchyard's here): the prerequisites as this API server
    // has them, and the hold.
    world
        .until(
            "the module status to show the prerequisites and the hold",
            || async {
                let conditions = module_conditions(&c).await;
                conditions
                    .get("FeatureGatesReady")
                    .is_some_and(|s| s.0 == "True")
                    && conditions
                        .get("D8GpuNodeGroupHeldOnDra")
                        .is_some_and(|s| s.0 == "True" && s.2.contains("gpu-legacy"))
            },
        )
        .await;

    // Removing spec.gpu releases the group; its nodes stay on DRA.
    Api::<NodeGroup>::all(c.clone())
        .patch(
            "gpu-legacy",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"gpu": null}})),
        )
        .await
        .expect("remove spec.gpu");
    world
        .until("the group released", || async {
            count(&world.events().await, |k| {
                matches!(k, Kind::NodeGroupReleased(_))
            }) == 1
        })
        .await;
    assert_eq!(
        world.labels("legacy-1").await,
        map(&[(GROUP, "gpu-legacy"), (STACK, "dra")])
    );
    // The alert clears, and its series goes, as does the hold's.
    world
        .until("the alerter's /metrics to drop the hold", || async {
            switchyard_testkit::scrape(port).await.is_ok_and(|text| {
                text.contains("# EOF")
                    && !text.lines().any(|l| {
                        (l.starts_with("switchyard_alert_firing{")
                            || l.starts_with("switchyard_node_group_held_on_dra{"))
                            && l.contains("gpu-legacy")
                    })
            })
        })
        .await;
}

/// Plays the kubelet and node preparation for nodes that have none: a pod
/// marked for deletion goes away; a node whose gpu-stack label is set gets
/// gpu-setup-complete and, for DRA, running node-agent and vendor-adapter pods.
async fn play_the_node(client: Client, node: String) {
    let pods: Api<Pod> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    let agents: Api<Pod> = Api::namespaced(client.clone(), "d8-nvidia-gpu");
    loop {
        if let Ok(list) = pods
            .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
            .await
        {
            for pod in list {
                if pod.metadata.deletion_timestamp.is_some() {
                    let api: Api<Pod> = Api::namespaced(client.clone(), &pod.namespace().unwrap());
                    let _ = api
                        .delete(&pod.name_any(), &DeleteParams::default().grace_period(0))
                        .await;
                }
            }
        }
        // nvidia.com/gpu is advertised by the node agent's device plugin
        // (support::node_agent plays kubelet's device manager).
        if let Ok(n) = nodes.get(&node).await {
            let labels = n.labels();
            if labels.get(STACK).map(String::as_str) == Some("dra") {
                for app in ["gpu-node-agent", "nvidia-dra-adapter"] {
                    let name = format!("{app}-{node}");
                    if agents.get_opt(&name).await.ok().flatten().is_none() {
                        let _ =
                            run_pod(&client, "d8-nvidia-gpu", &name, &node, &[("app", app)]).await;
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A pod bound to `node` and reported Running and Ready (there is no kubelet).
async fn run_pod(
    client: &Client,
    namespace: &str,
    name: &str,
    node: &str,
    labels: &[(&str, &str)],
) -> kube::Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": map(labels)},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "registry.example.com/app:1"}]},
    }))
    .expect("pod");
    api.create(&PostParams::default(), &pod).await?;
    let status = json!({"status": {
        "phase": "Running",
        "conditions": [{"type": "Ready", "status": "True"}],
    }});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await?;
    Ok(())
}

/// A node handover on real objects: cordon, drain through the Eviction API
/// (one pod held by a PodDisruptionBudget, reported, then released), move to
/// gpu-dra, wait until ready, uncordon; then its rollback, after which the
/// Node's labels and taints are byte-identical to before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handover_evicts_reports_the_pdb_and_rolls_back_byte_identical() {
    let mut world = World::start(Components {
        controller_manager: true,
        ..Components::default()
    })
    .await;
    let c = world.client.clone();
    for ns in ["apps", "d8-nvidia-gpu"] {
        create_namespace(&c, ns).await;
    }
    create_group(&c, "gpu", true).await;
    create_group(&c, "gpu-dra", false).await;
    let taint = Taint {
        key: "dedicated".into(),
        value: Some("gpu".into()),
        effect: "NoSchedule".into(),
        ..Taint::default()
    };
    create_node(
        &c,
        "gpu-1",
        &[
            (GROUP, "gpu"),
            ("node-role.kubernetes.io/gpu", ""),
            ("nvidia.com/gpu.product", "A100"),
            (SETUP, "true"),
        ],
        vec![taint],
    )
    .await;
    set_module_config(&c, true, None).await;
    // Its eight cards, which DRA must publish before the node counts ready.
    let _agent = node_agent(&world, "gpu-1");
    run_pod(&c, "apps", "web-1", "gpu-1", &[("app", "web")])
        .await
        .expect("web-1");
    run_pod(&c, "apps", "db-1", "gpu-1", &[("app", "db")])
        .await
        .expect("db-1");
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "db"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "db"}}},
    }))
    .unwrap();
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(c.clone(), "apps");
    pdbs.create(&PostParams::default(), &pdb)
        .await
        .expect("pdb");
    // The disruption controller has counted db-1 healthy: no disruption allowed.
    world
        .until("the PDB to be observed", || async {
            pdbs.get("db")
                .await
                .ok()
                .and_then(|p| p.status)
                .is_some_and(|s| {
                    s.observed_generation.is_some()
                        && s.current_healthy == Some(1)
                        && s.disruptions_allowed == Some(0)
                })
        })
        .await;
    let player = tokio::spawn(play_the_node(c.clone(), "gpu-1".into()));
    let bashible = tokio::spawn(prepare_nodes(c.clone()));
    world.serve("inventory");
    // Deckhouse's node agent and vendor adapter pods make the node ready.
    world.serve_with_env(
        "stack-assigner",
        &[
            ("SWITCHYARD_NODE_AGENT_SELECTOR", "app=gpu-node-agent"),
            (
                "SWITCHYARD_VENDOR_ADAPTER_SELECTOR",
                "app=nvidia-dra-adapter",
            ),
        ],
    );
    world
        .until("gpu-1 on the device plugin", || async {
            world.labels("gpu-1").await.get(STACK).map(String::as_str) == Some("device-plugin")
        })
        .await;
    let nodes: Api<Node> = Api::all(c.clone());
    let before = nodes.get("gpu-1").await.expect("node");
    let before_json = (
        serde_json::to_vec(&before.metadata.labels).unwrap(),
        serde_json::to_vec(&before.spec.as_ref().unwrap().taints).unwrap(),
        before.spec.as_ref().unwrap().unschedulable,
    );

    let nats_url = world.nats.url();
    let cli = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
            .args(args)
            .env("SWITCHYARD_NATS_URL", &nats_url)
            .env("SWITCHYARD_ACTOR", "ops@example.com")
            .output()
            .expect("run switchyard");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (ok, out, err) = cli(&[
        "handover", "--node", "gpu-1", "--to", "gpu-dra", "--id", "h1",
    ]);
    assert!(
        ok && out.contains("handover h1 of node gpu-1 started: gpu -> gpu-dra"),
        "{out}\n{err}\n{}",
        world.output()
    );
    // The operator's decision is recorded as theirs; every step of the
    // handover carries its correlation id (the handover's own, none given).
    let log = world.log().await;
    let records = log
        .read(ReadRequest::default())
        .await
        .expect("read the log");
    let started = records
        .iter()
        .find(|s| s.envelope.event_type == "HandoverStarted")
        .expect("HandoverStarted recorded");
    assert_eq!(started.envelope.actor, "ops@example.com");
    assert_eq!(started.envelope.correlation_id, "h1");

    // web-1 is evicted; db-1 is refused and the refusal recorded with its budget.
    world
        .until("the PDB refusal in the log", || async {
            world.events().await.iter().any(|(_, e)| matches!(&e.kind,
                Some(Kind::EvictionBlocked(b)) if b.pod == "db-1" && b.disruption_budgets == ["apps/db"]))
        })
        .await;
    let pods: Api<Pod> = Api::namespaced(c.clone(), "apps");
    world
        .until("web-1 evicted", || async {
            pods.get_opt("web-1").await.ok().flatten().is_none()
        })
        .await;
    assert!(
        pods.get_opt("db-1").await.unwrap().is_some(),
        "db-1 is held by its budget"
    );
    assert!(
        nodes
            .get("gpu-1")
            .await
            .unwrap()
            .spec
            .unwrap()
            .unschedulable
            == Some(true),
        "cordoned"
    );

    // The operator lifts the budget: the drain finishes and the handover completes.
    pdbs.delete("db", &DeleteParams::default())
        .await
        .expect("delete pdb");
    world
        .until("the handover completed", || async {
            world.events().await.iter().any(|(_, e)| matches!(&e.kind, Some(Kind::HandoverCompleted(h)) if h.handover_id == "h1"))
        })
        .await;
    let records = log
        .read(ReadRequest::default())
        .await
        .expect("read the log");
    let completed = records
        .iter()
        .find(|s| s.envelope.event_type == "HandoverCompleted")
        .expect("HandoverCompleted recorded");
    assert_eq!(
        (
            completed.envelope.actor.as_str(),
            completed.envelope.correlation_id.as_str()
        ),
        ("stack-assigner", "h1"),
        "a later step: decided by the service, correlated with the handover"
    );
    let moved = nodes.get("gpu-1").await.unwrap();
    assert_eq!(
        moved.labels().get(GROUP).map(String::as_str),
        Some("gpu-dra")
    );
    assert!(!moved.labels().contains_key("node-role.kubernetes.io/gpu"));
    assert_eq!(moved.labels().get(STACK).map(String::as_str), Some("dra"));
    assert_ne!(
        moved.spec.as_ref().unwrap().unschedulable,
        Some(true),
        "uncordoned"
    );

    // The same command again — as an operator whose `--wait` was cut short
    // types it — after the stack-assigner's restart: nothing decided again,
    // the handover followed from its first record to its end.
    world.stop("stack-assigner");
    world.serve("stack-assigner");
    let started_records = |records: &[switchyard_eventlog::StoredEvent], kind: &str| {
        records
            .iter()
            .filter(|s| s.envelope.event_type == kind)
            .count()
    };
    let (ok, out, err) = cli(&[
        "handover", "--node", "gpu-1", "--to", "gpu-dra", "--id", "h1", "--wait",
    ]);
    assert!(
        ok && err.contains("h1 was started already")
            && out.contains("handover h1 of node gpu-1 started: gpu -> gpu-dra")
            && out.contains("handover h1 done: node gpu-1 serves group gpu-dra"),
        "{out}\n{err}\n{}",
        world.output()
    );
    // The same id for another node is refused, naming what it started.
    let (ok, out, err) = cli(&[
        "handover", "--node", "gpu-2", "--to", "gpu-dra", "--id", "h1",
    ]);
    assert!(
        !ok && err.contains("h1 was started for node gpu-1 to group gpu-dra; this command asks for node gpu-2 to group gpu-dra"),
        "{out}\n{err}"
    );
    let records = log
        .read(ReadRequest::default())
        .await
        .expect("read the log");
    assert_eq!(started_records(&records, "HandoverStarted"), 1);
    assert_eq!(started_records(&records, "HandoverRefused"), 0);

    // Roll it back.
    let (ok, out, err) = cli(&["rollback", "node", "--node", "gpu-1", "--id", "r1"]);
    assert!(
        ok && out.contains("rollback r1") && out.contains("started: 3 step(s) to undo"),
        "{out}\n{err}\n{}",
        world.output()
    );
    world
        .until("the rollback completed", || async {
            world
                .events()
                .await
                .iter()
                .any(|(_, e)| matches!(&e.kind, Some(Kind::RollbackCompleted(_))))
        })
        .await;
    world
        .until("gpu-1 back on the device plugin", || async {
            world.labels("gpu-1").await.get(STACK).map(String::as_str) == Some("device-plugin")
        })
        .await;
    // Typed again, the rollback is followed, not planned anew (the log has
    // nothing left to roll back); for another node, the id is refused.
    let (ok, out, err) = cli(&[
        "rollback", "node", "--node", "gpu-1", "--id", "r1", "--wait",
    ]);
    assert!(
        ok && err.contains("r1 was started already") && out.contains("rollback r1"),
        "{out}\n{err}\n{}",
        world.output()
    );
    let (ok, _, err) = cli(&["rollback", "node", "--node", "gpu-2", "--id", "r1"]);
    assert!(
        !ok && err.contains("rollback r1 was of node gpu-1; this asks for node gpu-2"),
        "{err}"
    );
    let records = log
        .read(ReadRequest::default())
        .await
        .expect("read the log");
    assert_eq!(started_records(&records, "RollbackStarted"), 1);
    player.abort();
    bashible.abort();
    let after = nodes.get("gpu-1").await.expect("node");
    let after_json = (
        serde_json::to_vec(&after.metadata.labels).unwrap(),
        serde_json::to_vec(&after.spec.as_ref().unwrap().taints).unwrap(),
        after.spec.as_ref().unwrap().unschedulable,
    );
    assert_eq!(
        String::from_utf8_lossy(&after_json.0),
        String::from_utf8_lossy(&before_json.0),
        "labels"
    );
    assert_eq!(
        after_json, before_json,
        "labels, taints and cordon state byte-identical"
    );
}

/// Every service as its own binary, as the chart runs them, on one control
/// plane and one log: each reports SERVING once rebuilt from the log; the
/// class-compiler publishes a GPU class's DeviceClass and status, the
/// alerter records the held group's alert, the stack-assigner labels the
/// held group's node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_service_runs_as_its_own_binary() {
    let mut world = World::start(Components::default()).await;
    let c = world.client.clone();
    create_group(&c, "gpu-legacy", true).await;
    create_node(&c, "legacy-1", &[(GROUP, "gpu-legacy")], Vec::new()).await;
    set_module_config(&c, true, Some("1.9.0")).await;
    let gpu: switchyard_api::PhysicalGPU = serde_json::from_value(json!({
        "apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "PhysicalGPU",
        "metadata": {"name": "legacy-1-gpu-0", "labels": {"gpu.deckhouse.io/device": "a100-sxm4-40gb"}},
        "spec": {"index": 0, "node": "legacy-1", "product": "NVIDIA A100-SXM4-40GB",
                 "uuid": "GPU-cf261528-9a74-5b94-b58c-c3e27bfa74bd"},
    }))
    .expect("PhysicalGPU");
    Api::<switchyard_api::PhysicalGPU>::all(c.clone())
        .create(&PostParams::default(), &gpu)
        .await
        .expect("create the PhysicalGPU");
    let class: switchyard_api::GPUClass = serde_json::from_value(json!({
        "apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "GPUClass", "metadata": {"name": "a100"},
        "spec": {"selector": {"matchLabels": {"gpu.deckhouse.io/device": "a100-sxm4-40gb"}}},
    }))
    .expect("GPUClass");
    let classes = Api::<switchyard_api::GPUClass>::all(c.clone());
    classes
        .create(&PostParams::default(), &class)
        .await
        .expect("create the GPUClass");

    let mut ports = Vec::new();
    for name in [
        "inventory",
        "stack-assigner",
        "class-compiler",
        "claim-allocator",
        "alerter",
    ] {
        ports.push((name, world.serve_with_health(name)));
    }
    for (name, port) in &ports {
        world
            .until(&format!("{name} to report SERVING"), || {
                switchyard_testkit::health::serving(*port)
            })
            .await;
    }
    world
        .labels_become("legacy-1", &map(&[(GROUP, "gpu-legacy"), (STACK, "dra")]))
        .await;
    let device_classes = Api::<k8s_openapi::api::resource::v1::DeviceClass>::all(c.clone());
    world
        .until(
            "the class-compiler to publish a100's DeviceClass",
            || async {
                device_classes
                    .get_opt("a100.gpu.deckhouse.io")
                    .await
                    .ok()
                    .flatten()
                    .is_some_and(|d| {
                        d.metadata
                            .managed_fields
                            .iter()
                            .flatten()
                            .any(|m| m.manager.as_deref() == Some("switchyard-class-compiler"))
                    })
            },
        )
        .await;
    world
        .until("GPUClass a100 Ready", || async {
            classes
                .get("a100")
                .await
                .ok()
                .and_then(|g| g.status)
                .is_some_and(|s| {
                    s.conditions
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.status == "True")
                })
        })
        .await;
    world
        .until("the alerter to raise D8GpuNodeGroupHeldOnDra", || async {
            world.events().await.iter().any(|(actor, e)| {
                actor == "alerter"
                    && matches!(&e.kind, Some(Kind::AlertRaised(a)) if a.alert_name == "D8GpuNodeGroupHeldOnDra")
            })
        })
        .await;
}

/// On the chart's secured bus (its authorization rendered by `helm
/// template`, the keys made by `switchyard keys chart`), inventory and
/// stack-assigner run with exactly their NATS permissions, sign their records
/// and check the others' against the keyring.
/// - A record appended with the stack-assigner's stolen key — a correct hash
///   chain, "inventory" as its actor, DRA turned off — is passed over by the
///   stack-assigner (no label stripped) and named by `switchyard log verify
///   --keyring`, while every record the services wrote verifies.
/// - An operator's command, signed with their key, is recorded as theirs
///   whatever it says of itself; one claiming another actor, or unsigned, is
///   refused; the CLI takes only the service's own signed answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_secured_bus_a_forged_record_is_passed_over_and_commands_are_the_signers() {
    let release = secured::Release::render();
    let mut world = World::start_secured(Components::default(), release.bus()).await;
    let c = world.client.clone();
    create_group(&c, "gpu-dra", false).await;
    create_node(&c, "dra-1", &[(GROUP, "gpu-dra")], Vec::new()).await;
    set_module_config(&c, true, None).await;

    let ring = release.keyring();
    let metrics_port = switchyard_testkit::free_port();
    let metrics_listen = format!("127.0.0.1:{metrics_port}");
    for service in ["inventory", "stack-assigner"] {
        let seed = release.seed(service);
        let mut env = vec![
            ("SWITCHYARD_NATS_NKEY", seed.to_str().unwrap()),
            ("SWITCHYARD_SIGNING_KEY", seed.to_str().unwrap()),
            ("SWITCHYARD_KEYRING", ring.to_str().unwrap()),
        ];
        if service == "stack-assigner" {
            env.push(("SWITCHYARD_METRICS_LISTEN", &metrics_listen));
        }
        world.serve_with_env(service, &env);
    }
    let dra = map(&[(GROUP, "gpu-dra"), (STACK, "dra")]);
    world.labels_become("dra-1", &dra).await;

    // The forgery: the module's settings with DRA off, as "inventory",
    // appended with the stack-assigner's key (which may append records).
    let settings = world
        .events()
        .await
        .into_iter()
        .rev()
        .find_map(|(_, e)| match e.kind {
            Some(Kind::ModuleSettingsObserved(s)) => Some(s),
            _ => None,
        })
        .expect("inventory reported the settings");
    let forged = switchyard_proto::v1::DomainEvent {
        kind: Some(Kind::ModuleSettingsObserved(
            switchyard_proto::v1::ModuleSettingsObserved {
                dra_enabled: false,
                ..settings
            },
        )),
    };
    let stolen = release.args(&world.nats.url(), "stack-assigner");
    let thief = stolen
        .log(stolen.client("thief").await.unwrap())
        .await
        .unwrap();
    let forged_at = switchyard_eventlog::append_attributed(
        thief.as_ref(),
        "inventory",
        "inventory",
        &[switchyard_eventlog::Attributed::fact(&forged)],
        switchyard_eventlog::now_nanos(),
    )
    .await
    .expect("append the forgery")[0];
    // A node that joins after it: once the stack-assigner has labelled it,
    // it has read past the forgery.
    create_node(&c, "dra-2", &[(GROUP, "gpu-dra")], Vec::new()).await;
    world.labels_become("dra-2", &dra).await;
    assert_eq!(
        world.labels("dra-1").await,
        dra,
        "the forgery turned nothing off\n{}",
        world.output()
    );
    let assigner_log =
        std::fs::read_to_string(world.dir.path().join("stack-assigner.log")).unwrap();
    assert!(
        assigner_log.contains("passed over a record its signature does not vouch for"),
        "{assigner_log}"
    );
    // ...and counted on its /metrics, by why.
    let metrics = switchyard_testkit::scrape(metrics_port)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", world.output()));
    assert!(
        metrics.lines().any(|l| l
            == r#"switchyard_log_records_passed_over_total{service="stack-assigner",reason="unauthenticated"} 1"#),
        "{metrics}"
    );
    // The stack labels it wrote, counted by effect.
    assert!(
        metrics.lines().any(|l| l.starts_with(
            r#"switchyard_effects_issued_total{service="stack-assigner",effect="SetStackLabel",attempt="first"} "#
        )),
        "{metrics}"
    );

    // Commands: as the operator, signed; the answer checked against the keyring.
    let operator = release.seed(secured::OPERATOR);
    let cli = |args: &[&str], signed: bool| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_switchyard"));
        command
            .args(args)
            .env("SWITCHYARD_NATS_URL", world.nats.url())
            .env("SWITCHYARD_NATS_NKEY", &operator)
            .env("SWITCHYARD_KEYRING", &ring);
        if signed {
            command.env("SWITCHYARD_SIGNING_KEY", &operator);
        }
        let out = command.output().expect("run switchyard");
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let handover = [
        "handover", "--node", "dra-1", "--to", "gpu-dra", "--id", "h1",
    ];
    let mut unsigned = handover.to_vec();
    unsigned.extend(["--actor", secured::OPERATOR]);
    let (_, err) = cli(&unsigned, false);
    assert!(err.contains("refused: the command is not signed"), "{err}");
    let mut as_mallory = handover.to_vec();
    as_mallory.extend(["--actor", "mallory"]);
    let (_, err) = cli(&as_mallory, true);
    assert!(
        err.contains(
            "refused: actor: \"mallory\" is not the signer's identity \"ops@example.com\""
        ),
        "{err}"
    );
    // dra-1 is in gpu-dra already: refused by the stack-assigner's rules,
    // and the refusal is recorded as the operator's.
    let (out, err) = cli(&handover, true);
    assert!(!err.contains("forged"), "{out}{err}");
    let log = world.log().await;
    let records = log
        .read(ReadRequest::default())
        .await
        .expect("read the log");
    let decided = records
        .iter()
        .find(|s| s.envelope.event_type.starts_with("Handover"))
        .unwrap_or_else(|| panic!("the handover's decision is recorded\n{out}{err}"));
    assert_eq!(decided.envelope.actor, secured::OPERATOR, "{out}{err}");
    // The commands it answered (the signed one; the refused ones too), timed.
    let metrics = switchyard_testkit::scrape(metrics_port)
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", world.output()));
    let answered: u64 = metrics
        .lines()
        .find_map(|l| {
            l.strip_prefix(r#"switchyard_command_seconds_count{service="stack-assigner"} "#)
        })
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no command count in\n{metrics}"));
    assert!(answered >= 1, "{metrics}");

    let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args([
            "log",
            "verify",
            "--nats-url",
            &world.nats.url(),
            "--nats-nkey",
        ])
        .arg(&operator)
        .arg("--keyring")
        .arg(&ring)
        .output()
        .expect("run switchyard log verify");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let problems: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("problem:"))
        .collect();
    assert_eq!(
        problems,
        [format!(
            "problem: sequence {forged_at} (sequence {forged_at}): ModuleSettingsObserved on cluster.module by \"inventory\": claims to be written by inventory but is signed by stack-assigner"
        )
        .as_str()],
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "authorship: {} of {} records signed by the author they name",
            records.len() - 1,
            records.len()
        )),
        "{stdout}"
    );
}

/// The conditions of the gpu ModuleConfig's status, by type: (status,
/// reason, message).
async fn module_conditions(c: &Client) -> BTreeMap<String, (String, String, String)> {
    Api::<switchyard_api::ModuleConfig>::all(c.clone())
        .get_opt("gpu")
        .await
        .ok()
        .flatten()
        .and_then(|config| config.status)
        .map(|status| {
            status
                .conditions
                .into_iter()
                .map(|c| (c.type_, (c.status, c.reason, c.message)))
                .collect()
        })
        .unwrap_or_default()
}

/// The module status on a real API server with one of the six feature gates
/// turned off: read from the API server's own metric, not assumed — its
/// condition False, the others True, the prerequisites not ready and why,
/// the GPU node on no stack for that reason, and the alert that says so as
/// a condition and as an Event on the node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_module_status_shows_a_feature_gate_turned_off_and_why_dra_is_not_deployed() {
    let mut world = World::start(Components {
        apiserver_feature_gates: "DRAConsumableCapacity=false",
        ..Components::default()
    })
    .await;
    let c = world.client.clone();
    create_group(&c, "gpu-dra", false).await;
    create_node(&c, "gpu-1", &[(GROUP, "gpu-dra")], Vec::new()).await;
    Api::<Node>::all(c.clone())
        .patch(
            "gpu-1",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"annotations": {"gpu.deckhouse.io/physical-gpus": "8"}}}),
            ),
        )
        .await
        .expect("count the node's cards");
    set_module_config(&c, true, None).await;
    world.serve("inventory");
    world.serve("stack-assigner");
    world.serve_with_env("alerter", &[("SWITCHYARD_STATUS_EVERY", "1s")]);

    let expected = |conditions: &BTreeMap<String, (String, String, String)>| {
        let is = |type_: &str, status: &str| conditions.get(type_).is_some_and(|c| c.0 == status);
        is("FeatureGateDRAConsumableCapacity", "False")
            && [
                "DynamicResourceAllocation",
                "DRAResourceClaimDeviceStatus",
                "DRADeviceBindingConditions",
                "DRAPartitionableDevices",
                "DRAExtendedResource",
            ]
            .iter()
            .all(|gate| is(&format!("FeatureGate{gate}"), "True"))
            && is("KubernetesVersion", "True")
            && is("DRAAPIServed", "True")
            && is("FeatureGatesReady", "False")
            && is("DRAEnabled", "True")
            && is("D8GpuNodeServedByNoStack", "True")
            && is("D8GpuNodeGroupHeldOnDra", "False")
    };
    world
        .until("the module status to show the gate off", || async {
            expected(&module_conditions(&c).await)
        })
        .await;
    let conditions = module_conditions(&c).await;
    let (_, reason, message) = &conditions["FeatureGatesReady"];
    assert_eq!(reason, "PrerequisitesMissing");
    assert_eq!(message, "feature gate DRAConsumableCapacity is disabled");
    let (_, reason, _) = &conditions["FeatureGateDRAConsumableCapacity"];
    assert_eq!(reason, "Disabled");
    assert!(
        conditions["KubernetesVersion"].2.starts_with("v1.36."),
        "{conditions:?}"
    );
    assert!(
        conditions["D8GpuNodeServedByNoStack"]
            .2
            .contains("node gpu-1"),
        "{conditions:?}"
    );

    // Per node: on no stack, and why.
    let status = Api::<switchyard_api::ModuleConfig>::all(c.clone())
        .get("gpu")
        .await
        .unwrap()
        .status
        .unwrap();
    let [node] = &status.nodes[..] else {
        panic!("one GPU node: {:?}", status.nodes)
    };
    assert_eq!(
        (
            node.name.as_str(),
            node.node_group.as_str(),
            node.stack.as_str(),
            node.dra_deployed,
            node.reason.as_str()
        ),
        ("gpu-1", "gpu-dra", "none", false, "feature_gates_not_ready")
    );
    assert!(
        node.message
            .contains("feature gate DRAConsumableCapacity is disabled"),
        "{}",
        node.message
    );
    // The stack-assigner decided on the same fact: no gpu-stack label.
    assert_eq!(world.labels("gpu-1").await, map(&[(GROUP, "gpu-dra")]));

    // And kubectl users see the alert as an Event on the node.
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(c.clone(), "default");
    let recorded = || async {
        events.list(&ListParams::default()).await.map(|list| {
            list.items
                .iter()
                .filter(|e| {
                    e.reason.as_deref() == Some("D8GpuNodeServedByNoStack")
                        && e.type_.as_deref() == Some("Warning")
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("gpu-1")
                })
                .count()
        })
    };
    world
        .until("the alerter to record the alert on the node", || async {
            recorded().await.is_ok_and(|n| n > 0)
        })
        .await;

    // A restarted alerter does not announce it again: once is what it said.
    world.stop("alerter");
    world.serve_with_env("alerter", &[("SWITCHYARD_STATUS_EVERY", "1s")]);
    let first_passes = |log: &str| -> Vec<String> {
        log.lines()
            .filter(|l| l.contains("alerts announced on the first pass"))
            .map(str::to_string)
            .collect()
    };
    world
        .until("the restarted alerter's first pass", || async {
            first_passes(&world.service_log("alerter")).len() == 2
        })
        .await;
    let passes = first_passes(&world.service_log("alerter"));
    assert!(
        passes[1].contains("announced=0 announced_before=1"),
        "{passes:?}"
    );
    assert_eq!(
        recorded().await.unwrap(),
        1,
        "the alert's Events after a restart"
    );
}

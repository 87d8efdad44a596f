//! The simulator and the Kubernetes edge carry out the same effects: one run
//! of node and workload effects through both ends in the same node labels,
//! taints and cordon state, and the same pod templates — so the simulator the
//! scenario tests run on cannot drift from what Switchyard does to a cluster.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Node, ResourceQuota, Taint as KTaint};
use kube::api::{Api, PostParams};
use serde_json::json;
use switchyard_claim_allocator::ClaimAllocatorEdge;
use switchyard_core::ServiceName;
use switchyard_core::effects::Effect;
use switchyard_kube::facts;
use switchyard_kube::write::Writer;
use switchyard_proto::v1::{
    DomainEvent, NodeObserved, ResourceList, Taint, WorkloadObserved, WorkloadPlacement,
    domain_event::Kind,
};
use switchyard_sim::{SimConfig, Simulator};
use switchyard_stack_assigner::StackAssignerEdge;
use switchyard_testkit::kube::{ControlPlane, fake_node};

fn node_state(fact: &NodeObserved) -> (BTreeMap<String, String>, Vec<Taint>, bool) {
    (fact.labels.clone(), fact.taints.clone(), fact.unschedulable)
}

fn observed_node(event: DomainEvent) -> NodeObserved {
    match event.kind {
        Some(Kind::NodeObserved(n)) => n,
        other => panic!("expected NodeObserved, got {other:?}"),
    }
}

/// A Deployment with the simulator's pod template.
fn deployment(workload: &WorkloadObserved) -> Deployment {
    let w = workload.workload.as_ref().unwrap();
    let placement = workload.placement.clone().unwrap_or_default();
    let containers: Vec<_> = placement
        .container_limits
        .iter()
        .map(|(name, limits)| {
            let requests = placement
                .container_requests
                .get(name)
                .map(|r| r.quantities.clone())
                .unwrap_or_default();
            json!({"name": name, "image": "registry.example.com/train:1",
                   "resources": {"limits": limits.quantities, "requests": requests}})
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": w.name, "namespace": w.namespace},
        "spec": {
            "replicas": workload.replicas,
            "selector": {"matchLabels": {"app": w.name}},
            "template": {
                "metadata": {"labels": {"app": w.name}},
                "spec": {"containers": containers, "nodeSelector": placement.node_selector},
            },
        },
    }))
    .expect("deployment")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_simulator_and_the_edge_write_the_same_objects() {
    let mut sim = Simulator::new(SimConfig {
        // Workloads fill all nodes but one: two nodes for one workload.
        gpu_nodes: 2,
        workloads: 1,
        legacy_nodes: 0,
        upgraded_with_dra: false,
        ..SimConfig::default()
    });
    let initial = sim.take_facts();
    let node = initial
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::NodeObserved(n))
                if n.labels.get("node.deckhouse.io/group").map(String::as_str) == Some("gpu") =>
            {
                Some(n.clone())
            }
            _ => None,
        })
        .next_back()
        .expect("a node of the group gpu");
    let workload = initial
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::WorkloadObserved(w)) => Some(w.clone()),
            _ => None,
        })
        .next_back()
        .expect("a workload");

    // The same objects in a real API server.
    let plane = ControlPlane::start().await;
    let client = plane.client();
    let labels: Vec<(&str, &str)> = node
        .labels
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let taints = node
        .taints
        .iter()
        .map(|t| KTaint {
            key: t.key.clone(),
            value: (!t.value.is_empty()).then(|| t.value.clone()),
            effect: t.effect.clone(),
            ..KTaint::default()
        })
        .collect();
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(
            &PostParams::default(),
            &fake_node(&node.node, &labels, taints),
        )
        .await
        .expect("node");
    let w = workload.workload.clone().unwrap();
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": w.namespace}})).unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .expect("namespace");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &w.namespace);
    deployments
        .create(&PostParams::default(), &deployment(&workload))
        .await
        .expect("deployment");
    let quotas: Api<ResourceQuota> = Api::namespaced(client.clone(), &w.namespace);
    let hard = sim
        .quota(&w.namespace, "gpu-quota")
        .expect("the simulator's quota")
        .clone();
    let quota: ResourceQuota = serde_json::from_value(json!({
        "metadata": {"name": "gpu-quota"}, "spec": {"hard": hard},
    }))
    .unwrap();
    quotas
        .create(&PostParams::default(), &quota)
        .await
        .expect("quota");
    let real_node = || async { observed_node(facts::node(&nodes.get(&node.node).await.unwrap())) };
    assert_eq!(
        node_state(&real_node().await),
        node_state(&node),
        "the same start"
    );

    let name = node.node.clone();
    let extra_taint = Taint {
        key: "switchyard.io/parity".into(),
        value: String::new(),
        effect: "NoExecute".into(),
    };
    let mut restore_taints = node.taints.clone();
    restore_taints.push(extra_taint);
    let dra_placement = WorkloadPlacement {
        container_limits: workload
            .placement
            .as_ref()
            .unwrap()
            .container_limits
            .keys()
            .map(|c| {
                (
                    c.clone(),
                    ResourceList {
                        quantities: [("gpu.deckhouse.io/a100".to_string(), "2".to_string())].into(),
                    },
                )
            })
            .collect(),
        container_requests: BTreeMap::new(),
        node_selector: [("node.deckhouse.io/group".to_string(), "gpu-dra".to_string())].into(),
        tolerations: None,
    };
    let nvidia_labels: Vec<String> = node
        .labels
        .keys()
        .filter(|k| k.starts_with("nvidia.com/"))
        .cloned()
        .collect();
    assert!(
        !nvidia_labels.is_empty(),
        "the node has GPU feature discovery's labels"
    );
    let effects = vec![
        Effect::SetStackLabel {
            node: name.clone(),
            stack: Some("device-plugin".into()),
        },
        Effect::Cordon { node: name.clone() },
        Effect::Cordon { node: name.clone() },
        Effect::MoveToGroup {
            node: name.clone(),
            group: "gpu-dra".into(),
            from_group: "gpu".into(),
        },
        Effect::SetStackLabel {
            node: name.clone(),
            stack: Some("dra".into()),
        },
        Effect::Uncordon { node: name.clone() },
        Effect::RemoveNodeLabels {
            node: name.clone(),
            labels: nvidia_labels.clone(),
            group: "gpu-dra".into(),
        },
        Effect::RestoreNode {
            node: name.clone(),
            labels: node.labels.clone(),
            taints: restore_taints,
        },
        Effect::RestoreNode {
            node: name.clone(),
            labels: node.labels.clone(),
            taints: node.taints.clone(),
        },
        // Decided on facts from before the restore: the node is in gpu again
        // and keeps its labels.
        Effect::RemoveNodeLabels {
            node: name.clone(),
            labels: nvidia_labels.clone(),
            group: "gpu-dra".into(),
        },
        Effect::SetStackLabel {
            node: name.clone(),
            stack: None,
        },
        Effect::SetPlacement {
            workload: w.clone(),
            placement: dra_placement,
        },
        Effect::SetPlacement {
            workload: w.clone(),
            placement: workload.placement.clone().unwrap(),
        },
        Effect::SetQuota {
            namespace: w.namespace.clone(),
            name: "gpu-quota".into(),
            hard: [
                (
                    "requests.gpu.deckhouse.io/a100".to_string(),
                    "64".to_string(),
                ),
                ("pods".to_string(), "100".to_string()),
            ]
            .into(),
        },
    ];
    // Each effect through its owner's writers.
    let writer = |service| Writer::new(plane.config(), service).unwrap();
    let stack = StackAssignerEdge::new(writer(ServiceName::StackAssigner));
    let claims = ClaimAllocatorEdge::new(writer(ServiceName::ClaimAllocator));
    for effect in &effects {
        sim.write(effect);
        let executed = match effect.owner() {
            ServiceName::StackAssigner => stack.execute_one(effect).await,
            ServiceName::ClaimAllocator => claims.execute_one(effect).await,
            other => panic!("{effect:?} is {other}'s"),
        };
        executed.unwrap_or_else(|e| panic!("{effect:?}: {e}"));
        assert_eq!(
            node_state(&real_node().await),
            node_state(&sim.node_fact(&name).unwrap()),
            "after {effect:?}"
        );
        let real = facts::deployment(&deployments.get(&w.name).await.unwrap());
        let Some(Kind::WorkloadObserved(real)) = real.kind else {
            unreachable!()
        };
        assert_eq!(
            real.placement.as_ref(),
            sim.workload_placement(&w),
            "after {effect:?}"
        );
        let real = facts::resource_quota(&quotas.get("gpu-quota").await.unwrap());
        let Some(Kind::ResourceQuotaObserved(real)) = real.kind else {
            unreachable!()
        };
        assert_eq!(
            Some(&real.hard),
            sim.quota(&w.namespace, "gpu-quota"),
            "after {effect:?}"
        );
    }
    // The stale removal was refused by both: the labels are the node's again.
    let real = real_node().await;
    for label in &nvidia_labels {
        assert_eq!(
            real.labels.get(label),
            node.labels.get(label),
            "{label} after the rollback's restore"
        );
    }
}

//! The writers against a real API server (etcd, kube-apiserver,
//! kube-controller-manager for the disruption controller).

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use switchyard_class_compiler::ClassCompilerEdge;
use switchyard_core::ServiceName;
use switchyard_core::effects::Effect;
use switchyard_kube::write::{Owned, Writer};
use switchyard_stack_assigner::StackAssignerEdge;
use switchyard_testkit::eventually;
use switchyard_testkit::kube::{Components, ControlPlane, create_namespace, fake_node};

async fn run_pod(client: &Client, name: &str, node: &str, app: &str) {
    let api: Api<Pod> = Api::namespaced(client.clone(), "apps");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {"nodeName": node, "containers": [{"name": "main", "image": "registry.example.com/app:1"}]},
    }))
    .unwrap();
    api.create(&PostParams::default(), &pod).await.expect("pod");
    let status = json!({"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .expect("pod status");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_evicts_and_reports_the_budget_that_blocks() {
    let plane = ControlPlane::start_with(Components {
        controller_manager: true,
        ..Components::default()
    })
    .await;
    let client = plane.client();
    create_namespace(&client, "apps").await;
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &fake_node("w1", &[], Vec::new()))
        .await
        .unwrap();
    run_pod(&client, "web-1", "w1", "web").await;
    run_pod(&client, "db-1", "w1", "db").await;
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), "apps");
    let pdb: PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "db"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "db"}}},
    }))
    .unwrap();
    pdbs.create(&PostParams::default(), &pdb).await.unwrap();
    eventually("the budget observed", Duration::from_secs(60), || async {
        pdbs.get("db")
            .await
            .ok()
            .and_then(|p| p.status)
            .is_some_and(|s| s.current_healthy == Some(1) && s.disruptions_allowed == Some(0))
    })
    .await
    .unwrap();

    let edge =
        StackAssignerEdge::new(Writer::new(plane.config(), ServiceName::StackAssigner).unwrap());
    let outcome = tokio::time::timeout(
        Duration::from_secs(30),
        edge.execute_one(&Effect::Drain { node: "w1".into() }),
    )
    .await
    .expect("the drain answers")
    .expect("the drain runs");
    assert_eq!(outcome.evicted, ["apps/web-1"]);
    assert_eq!(outcome.blocked.len(), 1, "{outcome:?}");
    let blocked = &outcome.blocked[0];
    assert_eq!(
        (blocked.pod.as_str(), blocked.node.as_str()),
        ("db-1", "w1")
    );
    assert_eq!(blocked.disruption_budgets, ["apps/db"]);
    assert!(
        blocked.reason.contains("disruption budget"),
        "{}",
        blocked.reason
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), "apps");
    assert!(
        pods.get("web-1")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_some(),
        "web-1 is being deleted"
    );
    assert!(
        pods.get("db-1")
            .await
            .unwrap()
            .metadata
            .deletion_timestamp
            .is_none()
    );
}

/// Cordon and stack label are applied by one field manager: each apply
/// carries what the service owns already, so neither undoes the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn applies_of_one_manager_keep_each_others_fields() {
    let plane = ControlPlane::start().await;
    let client = plane.client();
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(
            &PostParams::default(),
            &fake_node("w1", &[("node.deckhouse.io/group", "gpu")], Vec::new()),
        )
        .await
        .unwrap();
    let edge =
        StackAssignerEdge::new(Writer::new(plane.config(), ServiceName::StackAssigner).unwrap());
    let label = |stack: Option<&str>| Effect::SetStackLabel {
        node: "w1".into(),
        stack: stack.map(str::to_string),
    };
    edge.execute_one(&label(Some("device-plugin")))
        .await
        .unwrap();
    edge.execute_one(&Effect::Cordon { node: "w1".into() })
        .await
        .unwrap();
    let node = nodes.get("w1").await.unwrap();
    assert_eq!(
        node.labels()["node.deckhouse.io/gpu-stack"],
        "device-plugin"
    );
    assert_eq!(node.spec.as_ref().unwrap().unschedulable, Some(true));
    let owned = Owned::of(&node, edge.field_manager());
    assert_eq!(owned.unschedulable, Some(true));
    assert_eq!(owned.labels.len(), 1);

    edge.execute_one(&label(None)).await.unwrap();
    let node = nodes.get("w1").await.unwrap();
    assert!(!node.labels().contains_key("node.deckhouse.io/gpu-stack"));
    assert_eq!(
        node.spec.as_ref().unwrap().unschedulable,
        Some(true),
        "still cordoned"
    );
    edge.execute_one(&Effect::Uncordon { node: "w1".into() })
        .await
        .unwrap();
    let node = nodes.get("w1").await.unwrap();
    assert_ne!(node.spec.as_ref().unwrap().unschedulable, Some(true));
    assert_eq!(node.labels().len(), 1, "only the group label is left");

    // A label another manager set is taken over only after a re-read shows
    // it still differs; the group move removes the role label it does not own.
    nodes
        .patch(
            "w1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"node-role.kubernetes.io/gpu": ""}}})),
        )
        .await
        .unwrap();
    edge.execute_one(&Effect::MoveToGroup {
        node: "w1".into(),
        group: "gpu-dra".into(),
        from_group: "gpu".into(),
    })
    .await
    .unwrap();
    let node = nodes.get("w1").await.unwrap();
    assert_eq!(node.labels()["node.deckhouse.io/group"], "gpu-dra");
    assert!(!node.labels().contains_key("node-role.kubernetes.io/gpu"));
}

/// class-compiler's effect: the DeviceClasses of a GPU class by Server-Side
/// Apply, and the class's status listing them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn publishing_a_class_applies_its_device_classes_and_status() {
    use k8s_openapi::api::resource::v1::DeviceClass;
    use switchyard_api::GPUClass;
    use switchyard_proto::v1::CompiledVariant;
    let plane = ControlPlane::start().await;
    let client = plane.client();
    switchyard_testkit::kube::install_crds(
        &client,
        switchyard_api::crds().into_iter().map(|(_, c)| c).collect(),
    )
    .await;
    let classes: Api<GPUClass> = Api::all(client.clone());
    let class: GPUClass = serde_json::from_value(json!({
        "apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "GPUClass",
        "metadata": {"name": "a100"},
        "spec": {"selector": {"matchLabels": {"gpu.deckhouse.io/device": "a100-sxm4-40gb"}}},
    }))
    .unwrap();
    classes
        .create(&PostParams::default(), &class)
        .await
        .unwrap();
    let variant = CompiledVariant {
        variant: "whole".into(),
        device_class: "a100.gpu.deckhouse.io".into(),
        extended_resource_name: "gpu.deckhouse.io/a100".into(),
        cel_selector: "device.attributes['gpu.deckhouse.io'].device == 'a100-sxm4-40gb'".into(),
    };
    let edge =
        ClassCompilerEdge::new(Writer::new(plane.config(), ServiceName::ClassCompiler).unwrap());
    let effect = Effect::PublishDeviceClasses {
        gpu_class: "a100".into(),
        variants: vec![variant.clone()],
        refused: None,
        namespaces: Vec::new(),
    };
    edge.execute_one(&effect).await.unwrap();
    edge.execute_one(&effect).await.unwrap();
    let device_class = Api::<DeviceClass>::all(client.clone())
        .get("a100.gpu.deckhouse.io")
        .await
        .unwrap();
    let selectors = device_class.spec.selectors.unwrap_or_default();
    assert_eq!(
        selectors[0].cel.as_ref().unwrap().expression,
        variant.cel_selector
    );
    let status = classes.get("a100").await.unwrap().status.expect("status");
    assert_eq!(status.device_class_names, ["a100.gpu.deckhouse.io"]);
    assert_eq!(
        status.variants[0].extended_resource_name,
        "gpu.deckhouse.io/a100"
    );
    // The inventory fact of the class carries what was published.
    let fact = switchyard_kube::facts::gpu_class(&classes.get("a100").await.unwrap());
    let Some(switchyard_proto::v1::domain_event::Kind::GpuClassObserved(fact)) = fact.kind else {
        unreachable!()
    };
    assert_eq!(fact.device_class_names, ["a100.gpu.deckhouse.io"]);
    assert!(fact.refused_condition.is_empty());
    let status = classes.get("a100").await.unwrap().status.unwrap();
    assert_eq!(status.conditions[0].type_, "Ready");
    assert_eq!(status.conditions[0].status, "True");

    // A refused spec: the condition says why; the DeviceClass is left alone.
    let why = "spec.partitions.migProfiles[0]: \"9g.99gb\" is not a MIG profile";
    edge.execute_one(&Effect::PublishDeviceClasses {
        gpu_class: "a100".into(),
        variants: vec![variant.clone()],
        refused: Some(why.into()),
        namespaces: Vec::new(),
    })
    .await
    .unwrap();
    let class = classes.get("a100").await.unwrap();
    let ready = &class.status.as_ref().unwrap().conditions[0];
    assert_eq!(
        (ready.status.as_str(), ready.reason.as_str()),
        ("False", "InvalidSpec")
    );
    assert_eq!(ready.message, why);
    let fact = switchyard_kube::facts::gpu_class(&class);
    let Some(switchyard_proto::v1::domain_event::Kind::GpuClassObserved(fact)) = fact.kind else {
        unreachable!()
    };
    assert_eq!(fact.refused_condition, why);
    assert!(
        Api::<DeviceClass>::all(client.clone())
            .get_opt("a100.gpu.deckhouse.io")
            .await
            .unwrap()
            .is_some()
    );
}

/// A class restricted to namespaces: the admission policy the class-compiler
/// writes refuses its claims and pods elsewhere; lifting the restriction
/// removes the policy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restricted_class_is_refused_outside_its_namespaces() {
    use k8s_openapi::api::resource::v1::ResourceClaim;
    use switchyard_proto::v1::CompiledVariant;
    let plane = ControlPlane::start().await;
    let client = plane.client();
    for ns in ["team-a", "team-b"] {
        create_namespace(&client, ns).await;
    }
    let variant = CompiledVariant {
        variant: "whole".into(),
        device_class: "a100.gpu.deckhouse.io".into(),
        extended_resource_name: "gpu.deckhouse.io/a100".into(),
        cel_selector: "device.driver == 'gpu.deckhouse.io'".into(),
    };
    let edge =
        ClassCompilerEdge::new(Writer::new(plane.config(), ServiceName::ClassCompiler).unwrap());
    // The class object must exist for its status; create it first.
    switchyard_testkit::kube::install_crds(
        &client,
        switchyard_api::crds().into_iter().map(|(_, c)| c).collect(),
    )
    .await;
    let class: switchyard_api::GPUClass = serde_json::from_value(json!({
        "apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "GPUClass",
        "metadata": {"name": "a100"},
        "spec": {"selector": {"matchLabels": {"gpu.deckhouse.io/device": "a100-sxm4-40gb"}}, "namespaces": ["team-a"]},
    }))
    .unwrap();
    Api::<switchyard_api::GPUClass>::all(client.clone())
        .create(&PostParams::default(), &class)
        .await
        .unwrap();
    let publish = |namespaces: Vec<String>| Effect::PublishDeviceClasses {
        gpu_class: "a100".into(),
        variants: vec![variant.clone()],
        refused: None,
        namespaces,
    };
    edge.execute_one(&publish(vec!["team-a".into()]))
        .await
        .unwrap();

    let claim = |name: &str| -> ResourceClaim {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "a100.gpu.deckhouse.io"}}]}},
        }))
        .unwrap()
    };
    let claims = |ns: &str| Api::<ResourceClaim>::namespaced(client.clone(), ns);
    // The policy takes a moment to be enforced: retry until refused.
    let mut attempt = 0;
    eventually("the restriction enforced", Duration::from_secs(30), || {
        attempt += 1;
        let name = format!("c{attempt}");
        let api = claims("team-b");
        async move {
            match api.create(&PostParams::default(), &claim(&name)).await {
                Err(kube::Error::Api(s)) => {
                    assert!(
                        s.message
                            .contains("GPU class a100 may only be used in the namespaces team-a"),
                        "{}",
                        s.message
                    );
                    true
                }
                Err(other) => panic!("{other}"),
                Ok(_) => false,
            }
        }
    })
    .await
    .unwrap();
    claims("team-a")
        .create(&PostParams::default(), &claim("allowed"))
        .await
        .expect("the allowed namespace may use the class");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "train"},
        "spec": {"containers": [{"name": "main", "image": "registry.example.com/train:1",
            "resources": {"limits": {"gpu.deckhouse.io/a100": "1"}}}]},
    }))
    .unwrap();
    let refused = Api::<Pod>::namespaced(client.clone(), "team-b")
        .create(&PostParams::default(), &pod)
        .await
        .unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("may only be used in the namespaces team-a"),
        "{refused}"
    );

    // Lifted: the policy goes, team-b may claim the class.
    edge.execute_one(&publish(Vec::new())).await.unwrap();
    let mut attempt = 0;
    eventually("the restriction lifted", Duration::from_secs(30), || {
        attempt += 1;
        let name = format!("d{attempt}");
        let api = claims("team-b");
        async move {
            api.create(&PostParams::default(), &claim(&name))
                .await
                .is_ok()
        }
    })
    .await
    .unwrap();

    // Retired (deleted, no claim left): its DeviceClass goes, and a restriction with it.
    edge.execute_one(&publish(vec!["team-a".into()]))
        .await
        .unwrap();
    let retire = Effect::RetireDeviceClasses {
        gpu_class: "a100".into(),
        device_classes: vec!["a100.gpu.deckhouse.io".into()],
    };
    edge.execute_one(&retire).await.unwrap();
    let device_classes: Api<k8s_openapi::api::resource::v1::DeviceClass> = Api::all(client.clone());
    assert!(
        device_classes
            .get_opt("a100.gpu.deckhouse.io")
            .await
            .unwrap()
            .is_none()
    );
    let policies: Api<k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy> =
        Api::all(client.clone());
    assert!(
        policies
            .get_opt("switchyard-gpuclass-a100")
            .await
            .unwrap()
            .is_none()
    );
    // Retiring again finds nothing to delete, and is fine.
    edge.execute_one(&retire).await.unwrap();
}

/// A held stack switch becomes a Warning Event on the Node, recorded once:
/// issued again (by this process or after a restart) it finds it there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_switch_is_an_event_on_the_node() {
    use k8s_openapi::api::core::v1::Event;
    use kube::api::ListParams;
    let plane = ControlPlane::start().await;
    let client = plane.client();
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(
            &PostParams::default(),
            &fake_node("n1", &[("node.deckhouse.io/group", "gpu-x")], Vec::new()),
        )
        .await
        .unwrap();
    let effect = Effect::NodeEvent {
        node: "n1".into(),
        reason: "StackSwitchHeld".into(),
        message: "DRA claims are allocated on the node: ml/train-0-gpu".into(),
    };
    let writer = || Writer::new(plane.config(), ServiceName::StackAssigner).unwrap();
    let edge = StackAssignerEdge::new(writer());
    edge.execute_one(&effect).await.expect("recorded");
    edge.execute_one(&effect).await.expect("again: nothing");
    StackAssignerEdge::new(writer())
        .execute_one(&effect)
        .await
        .expect("after a restart: found");
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let listed = events
        .list(&ListParams::default().fields("involvedObject.name=n1"))
        .await
        .unwrap();
    assert_eq!(listed.items.len(), 1, "{listed:?}");
    let event = &listed.items[0];
    assert_eq!(event.reason.as_deref(), Some("StackSwitchHeld"));
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(event.involved_object.kind.as_deref(), Some("Node"));
    assert!(event.message.as_deref().unwrap().contains("ml/train-0-gpu"));
}

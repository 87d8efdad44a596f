//! The control-plane harness against the real kube-apiserver and etcd.

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::DeviceClass;
use kube::api::{Api, ObjectMeta, PostParams};
use switchyard_testkit::kube::ControlPlane;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_stores_nodes_and_dra_objects_and_enforces_rbac() {
    let plane = ControlPlane::start().await;
    eprintln!("etcd + kube-apiserver ready in {:?}", plane.startup);
    let client = plane.client();

    // A kubelet-less node, as scheduler_perf makes them.
    let nodes: Api<Node> = Api::all(client.clone());
    let node = Node {
        metadata: ObjectMeta {
            name: Some("gpu-0".into()),
            labels: Some([("node.deckhouse.io/group".to_string(), "gpu".to_string())].into()),
            ..Default::default()
        },
        ..Default::default()
    };
    nodes
        .create(&PostParams::default(), &node)
        .await
        .expect("create node");
    let stored = nodes.get("gpu-0").await.expect("get node");
    assert_eq!(
        stored.metadata.labels.unwrap()["node.deckhouse.io/group"],
        "gpu"
    );

    // resource.k8s.io/v1 is served.
    let classes: Api<DeviceClass> = Api::all(client.clone());
    let class = DeviceClass {
        metadata: ObjectMeta {
            name: Some("a100.gpu.deckhouse.io".into()),
            ..Default::default()
        },
        spec: Default::default(),
    };
    classes
        .create(&PostParams::default(), &class)
        .await
        .expect("create DeviceClass");
    assert_eq!(
        classes.list(&Default::default()).await.unwrap().items.len(),
        1
    );

    // RBAC is on: a user with no bindings is refused.
    let nobody: Api<Node> = Api::all(plane.impersonating("nobody", &["system:authenticated"]));
    let err = nobody
        .list(&Default::default())
        .await
        .expect_err("no rights");
    assert!(err.to_string().contains("forbidden"), "{err}");
}

mod with_scheduler_and_controllers {
    use std::time::Duration;

    use k8s_openapi::api::core::v1::{
        Container, Node, NodeCondition, NodeStatus, Pod, PodResourceClaim, PodSpec,
        ResourceRequirements, ServiceAccount,
    };
    use k8s_openapi::api::resource::v1::{
        DeviceClaim, DeviceClass, DeviceRequest, ExactDeviceRequest, ResourceClaim,
        ResourceClaimSpec, ResourceClaimTemplate, ResourceClaimTemplateSpec,
    };
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use kube::api::{Api, ObjectMeta, PostParams};
    use switchyard_testkit::kube::{Components, ControlPlane};

    fn meta(name: &str) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        }
    }

    /// Waits for `check`, failing with the components' logs.
    async fn eventually<F, Fut>(what: &str, plane: &ControlPlane, check: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        if let Err(err) = switchyard_testkit::eventually(what, Duration::from_secs(60), check).await
        {
            panic!(
                "{err}\n--- kube-scheduler\n{}\n--- kube-controller-manager\n{}",
                plane.log_tail("kube-scheduler"),
                plane.log_tail("kube-controller-manager")
            );
        }
    }

    /// Creates a pod once the namespace's default ServiceAccount is visible to
    /// admission (its informer catches up a moment after the account exists).
    async fn create_pod(plane: &ControlPlane, pods: &Api<Pod>, pod: &Pod) {
        eventually("pod admission", plane, || {
            let (pods, pod) = (pods.clone(), pod.clone());
            async move {
                match pods.create(&PostParams::default(), &pod).await {
                    Ok(_) => true,
                    Err(err) if err.to_string().contains("serviceaccount") => false,
                    Err(err) => panic!("create pod: {err}"),
                }
            }
        })
        .await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_scheduler_binds_pods_and_the_resourceclaim_controller_makes_claims() {
        let plane = ControlPlane::start_with(Components {
            scheduler: true,
            controller_manager: true,
            ..Components::default()
        })
        .await;
        eprintln!(
            "control plane with scheduler and controller manager ready in {:?}",
            plane.startup
        );
        let client = plane.client();

        // A kubelet-less node with room for pods.
        let capacity: std::collections::BTreeMap<String, Quantity> =
            [("cpu", "8"), ("memory", "32Gi"), ("pods", "110")]
                .iter()
                .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                .collect();
        let node = Node {
            metadata: meta("worker-0"),
            status: Some(NodeStatus {
                capacity: Some(capacity.clone()),
                allocatable: Some(capacity),
                conditions: Some(vec![NodeCondition {
                    type_: "Ready".into(),
                    status: "True".into(),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let nodes = Api::<Node>::all(client.clone());
        nodes
            .create(&PostParams::default(), &node)
            .await
            .expect("node");
        // A node's status is not taken from a create: set it as a kubelet would.
        let status = serde_json::json!({ "status": node.status });
        nodes
            .patch_status(
                "worker-0",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&status),
            )
            .await
            .expect("node status");
        let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
        let _ = accounts
            .create(
                &PostParams::default(),
                &ServiceAccount {
                    metadata: meta("default"),
                    ..Default::default()
                },
            )
            .await;

        let container = |claims: bool| Container {
            name: "main".into(),
            image: Some("registry.invalid/pause:1".into()),
            resources: claims.then(|| ResourceRequirements {
                claims: Some(vec![k8s_openapi::api::core::v1::ResourceClaim {
                    name: "gpu".into(),
                    request: None,
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        let plain = Pod {
            metadata: meta("plain"),
            spec: Some(PodSpec {
                containers: vec![container(false)],
                automount_service_account_token: Some(false),
                ..Default::default()
            }),
            ..Default::default()
        };
        create_pod(&plane, &pods, &plain).await;
        eventually("the scheduler binding the pod", &plane, || {
            let pods = pods.clone();
            async move {
                pods.get("plain")
                    .await
                    .ok()
                    .and_then(|p| p.spec?.node_name)
                    .as_deref()
                    == Some("worker-0")
            }
        })
        .await;

        // A pod asking for a device through a claim template: the controller makes its claim.
        let class = DeviceClass {
            metadata: meta("a100.gpu.deckhouse.io"),
            spec: Default::default(),
        };
        Api::<DeviceClass>::all(client.clone())
            .create(&PostParams::default(), &class)
            .await
            .expect("class");
        let template = ResourceClaimTemplate {
            metadata: meta("gpu-template"),
            spec: ResourceClaimTemplateSpec {
                metadata: None,
                spec: ResourceClaimSpec {
                    devices: Some(DeviceClaim {
                        requests: Some(vec![DeviceRequest {
                            name: "gpu".into(),
                            exactly: Some(ExactDeviceRequest {
                                device_class_name: "a100.gpu.deckhouse.io".into(),
                                ..Default::default()
                            }),
                            ..Default::default()
                        }]),
                        ..Default::default()
                    }),
                },
            },
        };
        Api::<ResourceClaimTemplate>::namespaced(client.clone(), "default")
            .create(&PostParams::default(), &template)
            .await
            .expect("template");
        let with_claim = Pod {
            metadata: meta("trainer"),
            spec: Some(PodSpec {
                containers: vec![container(true)],
                automount_service_account_token: Some(false),
                resource_claims: Some(vec![PodResourceClaim {
                    name: "gpu".into(),
                    resource_claim_template_name: Some("gpu-template".into()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        };
        create_pod(&plane, &pods, &with_claim).await;
        let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
        eventually(
            "the resourceclaim controller creating the claim",
            &plane,
            || {
                let claims = claims.clone();
                async move {
                    claims.list(&Default::default()).await.is_ok_and(|list| {
                        list.items.iter().any(|c| {
                            c.metadata
                                .name
                                .as_deref()
                                .is_some_and(|n| n.starts_with("trainer-gpu"))
                        })
                    })
                }
            },
        )
        .await;
    }
}

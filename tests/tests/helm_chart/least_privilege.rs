//! Least privilege on the real API server: each ServiceAccount's calls are allowed or refused as documented.

use std::cell::RefCell;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Secret, ServiceAccount};
use k8s_openapi::api::events::v1::Event as EventsV1Event;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, EvictParams, GroupVersionKind, ListParams,
    Patch, PatchParams, PostParams,
};
use serde_json::{Value, json};
use switchyard_testkit::eventually;
use switchyard_testkit::kube::ControlPlane;

use crate::support::{NAMESPACE, NATS_URL, RELEASE, apply, kind, prepare_cluster, render};

const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";
/// How long RBAC bindings and admission policies may take to reach the API
/// server's caches.
const PROPAGATION: Duration = Duration::from_secs(20);

/// `Err` with HTTP 403, returning the server's message; anything else panics.
#[track_caller]
fn refused<T: std::fmt::Debug>(result: Result<T, kube::Error>, what: &str) -> String {
    match result {
        Err(kube::Error::Api(status)) if status.code == 403 => status.message.clone(),
        other => panic!("{what}: expected 403 Forbidden, got {other:?}"),
    }
}

#[track_caller]
fn allowed<T>(result: Result<T, kube::Error>, what: &str) -> T {
    result.unwrap_or_else(|err| panic!("{what}: expected to be allowed, got {err}"))
}

/// Retries `op` until it succeeds: RBAC bindings reach the authorizer's cache
/// a moment after they are stored.
async fn allowed_once_propagated<T, F, Fut>(what: &str, mut op: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let outcome = RefCell::new(None);
    let last_error = RefCell::new(String::new());
    let waited = eventually(what, PROPAGATION, || {
        let attempt = op();
        let (outcome, last_error) = (&outcome, &last_error);
        async move {
            match attempt.await {
                Ok(value) => {
                    *outcome.borrow_mut() = Some(value);
                    true
                }
                Err(err) => {
                    *last_error.borrow_mut() = err.to_string();
                    false
                }
            }
        }
    })
    .await;
    if let Err(timeout) = waited {
        panic!("{timeout}; last error: {}", last_error.borrow());
    }
    outcome.into_inner().unwrap()
}

fn service_account(component: &str) -> String {
    format!("system:serviceaccount:{NAMESPACE}:{RELEASE}-{component}")
}

const SERVICE_ACCOUNT_GROUPS: [&str; 3] = [
    "system:serviceaccounts",
    "system:serviceaccounts:switchyard-system",
    "system:authenticated",
];

fn physical_gpus(client: &kube::Client) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("gpu.deckhouse.io", "v1alpha1", "PhysicalGPU"),
        "physicalgpus",
    );
    Api::all_with(client.clone(), &resource)
}

fn gpu_classes(client: &kube::Client) -> Api<DynamicObject> {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("gpu.deckhouse.io", "v1alpha1", "GPUClass"),
        "gpuclasses",
    );
    Api::all_with(client.clone(), &resource)
}

fn physical_gpu(node: &str, index: u32) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "gpu.deckhouse.io/v1alpha1",
        "kind": "PhysicalGPU",
        "metadata": {"name": format!("{node}-{index}")},
        "spec": {
            "node": node,
            "index": index,
            "uuid": format!("GPU-{index:08x}-0000-0000-0000-00000000000{}", node.len() % 10),
            "product": "NVIDIA A100-SXM4-40GB",
        },
    }))
    .unwrap()
}

fn resource_slice(node: &str) -> ResourceSlice {
    serde_json::from_value(json!({
        "metadata": {"name": format!("{node}-gpu.deckhouse.io")},
        "spec": {
            "driver": "gpu.deckhouse.io",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [],
        },
    }))
    .unwrap()
}

fn label_patch(key: &str, value: &str) -> Patch<Value> {
    Patch::Merge(json!({"metadata": {"labels": {key: value}}}))
}

async fn create<K>(api: &Api<K>, object: Value)
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + serde::Serialize,
{
    let object: K = serde_json::from_value(object).expect("fixture");
    api.create(&PostParams::default(), &object)
        .await
        .expect("create a fixture as admin");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn least_privilege_per_service_account() {
    let started = Instant::now();
    let docs = render(&[NATS_URL]);
    let plane = ControlPlane::start().await;
    let admin = plane.client();
    let access_kinds = [
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ];
    let access: Vec<Value> = docs
        .into_iter()
        .filter(|doc| access_kinds.contains(&kind(doc)))
        .collect();
    assert_eq!(
        access.len(),
        36,
        "6 ServiceAccounts, 6 + 6 cluster roles and bindings, 2 Roles (the node agent's and the alerter's Events) and their bindings, 5 Roles (each elected service's Lease) and their bindings, the node agent's and the admin-access policies and their bindings"
    );
    let discovery = prepare_cluster(&admin, &access).await;
    for doc in &access {
        apply(&admin, &discovery, doc, false)
            .await
            .unwrap_or_else(|err| panic!("apply {err}"));
    }

    // The cluster the services would see: two GPU nodes, an application.
    let nodes: Api<Node> = Api::all(admin.clone());
    for node in ["gpu-node-1", "gpu-node-2"] {
        create(&nodes, json!({"metadata": {"name": node}})).await;
    }
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    create(&namespaces, json!({"metadata": {"name": "apps"}})).await;
    // No controller manager here to make the namespace's default ServiceAccount.
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), "apps");
    create(&accounts, json!({"metadata": {"name": "default"}})).await;
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), "apps");
    create(
        &deployments,
        json!({
            "metadata": {"name": "trainer"},
            "spec": {
                "selector": {"matchLabels": {"app": "trainer"}},
                "template": {
                    "metadata": {"labels": {"app": "trainer"}},
                    "spec": {"containers": [{"name": "trainer", "image": "trainer:1"}]},
                },
            },
        }),
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "apps");
    create(
        &pods,
        json!({
            "metadata": {"name": "trainer-0"},
            "spec": {"containers": [{"name": "trainer", "image": "trainer:1"}]},
        }),
    )
    .await;
    physical_gpus(&admin)
        .create(&PostParams::default(), &physical_gpu("gpu-node-2", 0))
        .await
        .expect("a PhysicalGPU of gpu-node-2");
    gpu_classes(&admin)
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "gpu.deckhouse.io/v1alpha1",
                "kind": "GPUClass",
                "metadata": {"name": "a100"},
                "spec": {"selector": {"matchLabels": {"gpu.deckhouse.io/device": "a100"}}},
            }))
            .unwrap(),
        )
        .await
        .expect("a GPUClass");

    let as_service =
        |component: &str| plane.impersonating(&service_account(component), &SERVICE_ACCOUNT_GROUPS);

    // inventory reads the cluster and writes nothing.
    {
        let client = as_service("inventory");
        let nodes: &Api<Node> = &Api::all(client.clone());
        let listed = allowed_once_propagated("inventory to list nodes", || async move {
            nodes.list(&ListParams::default()).await
        })
        .await;
        assert_eq!(listed.items.len(), 2);
        allowed(
            physical_gpus(&client).list(&ListParams::default()).await,
            "inventory lists PhysicalGPUs",
        );
        allowed(
            Api::<Deployment>::all(client.clone())
                .list(&ListParams::default())
                .await,
            "inventory lists Deployments",
        );
        allowed(
            Api::<ResourceSlice>::all(client.clone())
                .list(&ListParams::default())
                .await,
            "inventory lists ResourceSlices",
        );
        refused(
            nodes
                .patch(
                    "gpu-node-1",
                    &PatchParams::default(),
                    &label_patch("x", "y"),
                )
                .await,
            "inventory patches a node",
        );
        refused(
            physical_gpus(&client)
                .create(&PostParams::default(), &physical_gpu("gpu-node-1", 0))
                .await,
            "inventory creates a PhysicalGPU",
        );
        refused(
            Api::<Pod>::namespaced(client.clone(), "apps")
                .delete("trainer-0", &DeleteParams::default())
                .await,
            "inventory deletes a pod",
        );
        refused(
            Api::<Secret>::all(client.clone())
                .list(&ListParams::default())
                .await,
            "inventory lists secrets",
        );
        // ...and the API server's /metrics, for the feature gates.
        let metrics = allowed(
            client
                .request_text(http::Request::get("/metrics").body(Vec::new()).unwrap())
                .await,
            "inventory reads the API server's /metrics",
        );
        assert!(
            metrics.contains("kubernetes_feature_enabled{"),
            "the feature gates' metric"
        );
    }

    // stack-assigner labels and cordons nodes and drains them by eviction only.
    {
        let client = as_service("stack-assigner");
        let nodes: &Api<Node> = &Api::all(client.clone());
        let apply_label = &json!({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "gpu-node-1", "labels": {"node.deckhouse.io/gpu-stack": "dra"}},
        });
        allowed_once_propagated(
            "stack-assigner to label a node (server-side apply)",
            || async move {
                nodes
                    .patch(
                        "gpu-node-1",
                        &PatchParams::apply("switchyard-stack-assigner"),
                        &Patch::Apply(apply_label),
                    )
                    .await
            },
        )
        .await;
        allowed(
            nodes
                .patch(
                    "gpu-node-1",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"unschedulable": true}})),
                )
                .await,
            "stack-assigner cordons a node (merge patch)",
        );
        let node = Api::<Node>::all(admin.clone())
            .get("gpu-node-1")
            .await
            .unwrap();
        assert_eq!(
            node.metadata.labels.unwrap()["node.deckhouse.io/gpu-stack"],
            "dra"
        );
        assert_eq!(node.spec.unwrap().unschedulable, Some(true));
        let pods: Api<Pod> = Api::namespaced(client.clone(), "apps");
        refused(
            pods.delete("trainer-0", &DeleteParams::default()).await,
            "stack-assigner deletes a pod",
        );
        refused(
            pods.patch("trainer-0", &PatchParams::default(), &label_patch("x", "y"))
                .await,
            "stack-assigner patches a pod",
        );
        refused(
            nodes.delete("gpu-node-2", &DeleteParams::default()).await,
            "stack-assigner deletes a node",
        );
        refused(
            Api::<Deployment>::namespaced(client.clone(), "apps")
                .patch("trainer", &PatchParams::default(), &label_patch("x", "y"))
                .await,
            "stack-assigner patches a Deployment",
        );
        allowed(
            pods.evict("trainer-0", &EvictParams::default()).await,
            "stack-assigner evicts a pod",
        );
        let gone = Api::<Pod>::namespaced(admin.clone(), "apps")
            .get_opt("trainer-0")
            .await
            .unwrap();
        assert!(gone.is_none(), "the evicted pod is still there: {gone:?}");
    }

    // class-compiler turns GPUClasses into DeviceClasses; nodes are not its business.
    {
        let client = as_service("class-compiler");
        let device_classes: &Api<DeviceClass> = &Api::all(client.clone());
        let class: &DeviceClass = &serde_json::from_value(json!({
            "metadata": {"name": "a100-whole.gpu.deckhouse.io"},
            "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.deckhouse.io'"}}]},
        }))
        .unwrap();
        allowed_once_propagated("class-compiler to create a DeviceClass", || async move {
            device_classes.create(&PostParams::default(), class).await
        })
        .await;
        allowed(
            device_classes
                .delete("a100-whole.gpu.deckhouse.io", &DeleteParams::default())
                .await,
            "class-compiler deletes a DeviceClass",
        );
        allowed(
            gpu_classes(&client)
                .patch_status(
                    "a100",
                    &PatchParams::default(),
                    &Patch::Merge(
                        json!({"status": {"deviceClassNames": ["a100-whole.gpu.deckhouse.io"]}}),
                    ),
                )
                .await,
            "class-compiler writes a GPUClass's status",
        );
        refused(
            gpu_classes(&client)
                .patch("a100", &PatchParams::default(), &label_patch("x", "y"))
                .await,
            "class-compiler patches a GPUClass's spec",
        );
        refused(
            Api::<Node>::all(client.clone())
                .patch(
                    "gpu-node-1",
                    &PatchParams::default(),
                    &label_patch("x", "y"),
                )
                .await,
            "class-compiler patches a node",
        );
        refused(
            Api::<Node>::all(client.clone())
                .list(&ListParams::default())
                .await,
            "class-compiler lists nodes",
        );
    }

    // claim-allocator rewrites workloads and quotas and clears leftover node
    // labels (completion); it neither lists nor deletes nodes.
    {
        let client = as_service("claim-allocator");
        let deployments: &Api<Deployment> = &Api::namespaced(client.clone(), "apps");
        allowed_once_propagated("claim-allocator to patch a Deployment", || async move {
            let moved = json!({"metadata": {"annotations": {"gpu.deckhouse.io/moved": "true"}}});
            deployments
                .patch("trainer", &PatchParams::default(), &Patch::Merge(moved))
                .await
        })
        .await;
        allowed(
            Api::<ResourceClaim>::all(client.clone())
                .list(&ListParams::default())
                .await,
            "claim-allocator lists ResourceClaims",
        );
        allowed(
            Api::<Node>::all(client.clone())
                .patch(
                    "gpu-node-1",
                    &PatchParams::default(),
                    &label_patch("x", "y"),
                )
                .await,
            "claim-allocator patches a node's labels",
        );
        refused(
            Api::<Node>::all(client.clone())
                .list(&ListParams::default())
                .await,
            "claim-allocator lists nodes",
        );
        refused(
            Api::<Node>::all(client.clone())
                .delete("gpu-node-1", &DeleteParams::default())
                .await,
            "claim-allocator deletes a node",
        );
        refused(
            deployments
                .delete("trainer", &DeleteParams::default())
                .await,
            "claim-allocator deletes a Deployment",
        );
        refused(
            Api::<ResourceClaim>::namespaced(client.clone(), "apps")
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(json!({"metadata": {"name": "c"}, "spec": {}}))
                        .unwrap(),
                )
                .await,
            "claim-allocator creates a ResourceClaim",
        );
    }

    // node-agent writes its own node's PhysicalGPUs and ResourceSlices, no one else's.
    {
        let on_node_1 = plane.impersonating_with_extra(
            &service_account("node-agent"),
            &SERVICE_ACCOUNT_GROUPS,
            &[(NODE_NAME_EXTRA, &["gpu-node-1"])],
        );
        let gpus = &physical_gpus(&on_node_1);
        // RBAC and the admission policy both reach their caches a moment after
        // they are stored: wait until the policy refuses another node's GPU
        // (dry run: nothing is stored while it is not yet active).
        let last = RefCell::new(String::new());
        let active = eventually(
            "the node-agent admission policy to refuse another node's PhysicalGPU",
            PROPAGATION,
            || {
                let last = &last;
                async move {
                    let dry_run = PostParams {
                        dry_run: true,
                        ..Default::default()
                    };
                    let outcome = gpus.create(&dry_run, &physical_gpu("gpu-node-2", 7)).await;
                    *last.borrow_mut() = format!("{outcome:?}");
                    matches!(outcome, Err(kube::Error::Api(status))
                        if status.message.contains("may write only its own node"))
                }
            },
        )
        .await;
        if let Err(timeout) = active {
            panic!("{timeout}; last answer: {}", last.borrow());
        }

        allowed_once_propagated(
            "node-agent to create its node's PhysicalGPU",
            || async move {
                gpus.create(&PostParams::default(), &physical_gpu("gpu-node-1", 0))
                    .await
            },
        )
        .await;
        let message = refused(
            gpus.create(&PostParams::default(), &physical_gpu("gpu-node-2", 1))
                .await,
            "node-agent of gpu-node-1 creates a PhysicalGPU of gpu-node-2",
        );
        assert!(
            message.contains("ValidatingAdmissionPolicy")
                && message.contains("'gpu-node-2'")
                && message.contains("node gpu-node-1"),
            "{message}"
        );
        let message = refused(
            gpus.delete("gpu-node-2-0", &DeleteParams::default()).await,
            "node-agent of gpu-node-1 deletes a PhysicalGPU of gpu-node-2",
        );
        assert!(message.contains("'gpu-node-2'"), "{message}");
        let message = refused(
            gpus.patch(
                "gpu-node-1-0",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"node": "gpu-node-2"}})),
            )
            .await,
            "node-agent of gpu-node-1 moves its PhysicalGPU to gpu-node-2",
        );
        assert!(message.contains("'gpu-node-2'"), "{message}");
        allowed(
            gpus.patch_status(
                "gpu-node-1-0",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": "Ready"}})),
            )
            .await,
            "node-agent writes its PhysicalGPU's status",
        );

        let slices: Api<ResourceSlice> = Api::all(on_node_1.clone());
        allowed(
            slices
                .create(&PostParams::default(), &resource_slice("gpu-node-1"))
                .await,
            "node-agent publishes its node's ResourceSlice",
        );
        let message = refused(
            slices
                .create(&PostParams::default(), &resource_slice("gpu-node-2"))
                .await,
            "node-agent of gpu-node-1 publishes a ResourceSlice of gpu-node-2",
        );
        assert!(message.contains("'gpu-node-2'"), "{message}");
        allowed(
            gpus.delete("gpu-node-1-0", &DeleteParams::default()).await,
            "node-agent deletes its node's PhysicalGPU",
        );
        allowed(
            Api::<Node>::all(on_node_1.clone()).get("gpu-node-1").await,
            "node-agent reads its node",
        );
        refused(
            Api::<Node>::all(on_node_1.clone())
                .patch(
                    "gpu-node-1",
                    &PatchParams::default(),
                    &label_patch("x", "y"),
                )
                .await,
            "node-agent patches its node",
        );

        // Events about its PhysicalGPUs and its node, in `default` only.
        let agent_event = |namespace: &str| -> EventsV1Event {
            serde_json::from_value(json!({
                "metadata": {"name": "gpu-node-1.gpuhealthchanged", "namespace": namespace},
                "eventTime": "2026-11-30T00:00:00.000000Z",
                "reportingController": "switchyard-node-agent",
                "reportingInstance": "gpu-node-1",
                "action": "Taint",
                "reason": "GpuHealthChanged",
                "type": "Warning",
                "regarding": {"apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "PhysicalGPU", "name": "gpu-node-1-0"},
            }))
            .unwrap()
        };
        allowed_once_propagated("node-agent to record an Event in default", || async {
            Api::<EventsV1Event>::namespaced(on_node_1.clone(), "default")
                .create(&PostParams::default(), &agent_event("default"))
                .await
        })
        .await;
        refused(
            Api::<EventsV1Event>::namespaced(on_node_1.clone(), NAMESPACE)
                .create(&PostParams::default(), &agent_event(NAMESPACE))
                .await,
            "node-agent records an Event outside default",
        );
        refused(
            Api::<EventsV1Event>::namespaced(on_node_1.clone(), "default")
                .list(&ListParams::default())
                .await,
            "node-agent lists Events",
        );

        // A token bound to no node (not from a pod) writes nothing.
        let unbound = plane.impersonating(&service_account("node-agent"), &SERVICE_ACCOUNT_GROUPS);
        let message = refused(
            physical_gpus(&unbound)
                .create(&PostParams::default(), &physical_gpu("gpu-node-1", 3))
                .await,
            "node-agent without a node name creates a PhysicalGPU",
        );
        assert!(message.contains("carries no node name"), "{message}");
    }

    // alerter writes the module status (and only its status) and records
    // Events in `default`; it reads nothing else of the cluster.
    {
        let client = as_service("alerter");
        let configs: Api<DynamicObject> = Api::all_with(
            client.clone(),
            &ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("deckhouse.io", "v1alpha1", "ModuleConfig"),
                "moduleconfigs",
            ),
        );
        let admin_configs: Api<DynamicObject> = Api::all_with(
            admin.clone(),
            &ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("deckhouse.io", "v1alpha1", "ModuleConfig"),
                "moduleconfigs",
            ),
        );
        create(
            &admin_configs,
            json!({"apiVersion": "deckhouse.io/v1alpha1", "kind": "ModuleConfig", "metadata": {"name": "gpu"}, "spec": {}}),
        )
        .await;
        let status = Patch::Merge(json!({"status": {"conditions": [{
            "type": "FeatureGatesReady", "status": "True", "reason": "PrerequisitesMet",
            "message": "ready", "lastTransitionTime": "2026-12-03T00:00:00Z",
        }]}}));
        let configs = &configs;
        let status = &status;
        allowed_once_propagated("alerter to write the module status", || async move {
            configs
                .patch_status("gpu", &PatchParams::default(), status)
                .await
        })
        .await;
        refused(
            configs
                .patch(
                    "gpu",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"enabled": false}})),
                )
                .await,
            "alerter patches the ModuleConfig's spec",
        );
        // Another module's ModuleConfig is none of its business.
        create(
            &admin_configs,
            json!({"apiVersion": "deckhouse.io/v1alpha1", "kind": "ModuleConfig", "metadata": {"name": "cni-cilium"}, "spec": {}}),
        )
        .await;
        refused(
            configs
                .patch_status("cni-cilium", &PatchParams::default(), status)
                .await,
            "alerter writes another module's status",
        );
        refused(
            configs.get("cni-cilium").await,
            "alerter reads another module's ModuleConfig",
        );
        allowed(
            Api::<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>::all(client.clone())
                .get("moduleconfigs.deckhouse.io")
                .await,
            "alerter reads the ModuleConfig CRD",
        );
        refused(
            Api::<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>::all(client.clone())
                .get("physicalgpus.gpu.deckhouse.io")
                .await,
            "alerter reads another CRD",
        );
        let own: Api<DynamicObject> = Api::all_with(
            client.clone(),
            &ApiResource::from_gvk_with_plural(
                &GroupVersionKind::gvk("gpu.deckhouse.io", "v1alpha1", "GPUModuleStatus"),
                "gpumodulestatuses",
            ),
        );
        allowed(
            own.create(
                &PostParams::default(),
                &serde_json::from_value(json!({
                    "apiVersion": "gpu.deckhouse.io/v1alpha1",
                    "kind": "GPUModuleStatus",
                    "metadata": {"name": "gpu"},
                    "spec": {},
                }))
                .unwrap(),
            )
            .await,
            "alerter creates its GPUModuleStatus",
        );
        allowed(
            own.patch_status("gpu", &PatchParams::default(), status)
                .await,
            "alerter writes its GPUModuleStatus's status",
        );
        refused(
            own.delete("gpu", &DeleteParams::default()).await,
            "alerter deletes its GPUModuleStatus",
        );
        let event = |namespace: &str| -> EventsV1Event {
            serde_json::from_value(json!({
                "metadata": {"name": "gpu-node-1.d8gpunodedualadvertisement", "namespace": namespace},
                "eventTime": "2026-12-03T00:00:00.000000Z",
                "reportingController": "switchyard-alerter",
                "reportingInstance": "switchyard-alerter",
                "action": "Alert",
                "reason": "D8GpuNodeDualAdvertisement",
                "note": "node gpu-node-1 advertises through both stacks",
                "type": "Warning",
                "regarding": {"apiVersion": "v1", "kind": "Node", "name": "gpu-node-1"},
            }))
            .unwrap()
        };
        let in_default: &Api<EventsV1Event> = &Api::namespaced(client.clone(), "default");
        let event = &event;
        allowed_once_propagated("alerter to record an Event in default", || async move {
            in_default
                .create(&PostParams::default(), &event("default"))
                .await
        })
        .await;
        refused(
            Api::<EventsV1Event>::namespaced(client.clone(), "apps")
                .create(&PostParams::default(), &event("apps"))
                .await,
            "alerter records an Event outside default",
        );
        // It lists them there (what it announced before a restart), only there.
        allowed(
            in_default.list(&ListParams::default()).await,
            "alerter lists the Events in default",
        );
        refused(
            Api::<EventsV1Event>::namespaced(client.clone(), "apps")
                .list(&ListParams::default())
                .await,
            "alerter lists Events outside default",
        );
        refused(
            Api::<Node>::all(client.clone())
                .list(&ListParams::default())
                .await,
            "alerter lists nodes",
        );
        refused(
            Api::<Pod>::namespaced(client.clone(), NAMESPACE)
                .list(&ListParams::default())
                .await,
            "alerter lists pods",
        );
        refused(
            client
                .request_text(http::Request::get("/metrics").body(Vec::new()).unwrap())
                .await,
            "alerter reads the API server's /metrics",
        );
    }
    // Each elected service creates, reads and applies its own Lease in the
    // release's namespace (kube-lease-manager's calls), and no other's.
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    if namespaces
        .get_opt(NAMESPACE)
        .await
        .expect("read the namespace")
        .is_none()
    {
        create(&namespaces, json!({"metadata": {"name": NAMESPACE}})).await;
    }
    let services = [
        "inventory",
        "stack-assigner",
        "class-compiler",
        "claim-allocator",
        "alerter",
    ];
    for service in services {
        let client = as_service(service);
        let leases: &Api<Lease> = &Api::namespaced(client.clone(), NAMESPACE);
        let own = format!("{RELEASE}-{service}");
        let lease = json!({"metadata": {"name": own}, "spec": {"holderIdentity": format!("{service}-0"), "leaseDurationSeconds": 15}});
        let lease: Lease = serde_json::from_value(lease).expect("a Lease");
        allowed_once_propagated(&format!("{service} to create its Lease"), || {
            let lease = lease.clone();
            async move { leases.create(&PostParams::default(), &lease).await }
        })
        .await;
        allowed(
            leases.get(&own).await,
            &format!("{service} reads its Lease"),
        );
        allowed(
            leases
                .patch(
                    &own,
                    &PatchParams::apply("kube-lease-manager").force(),
                    &Patch::Apply(json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "spec": {"holderIdentity": format!("{service}-1")}})),
                )
                .await,
            &format!("{service} applies its Lease"),
        );
        let other = format!(
            "{RELEASE}-{}",
            services
                .iter()
                .find(|s| **s != service)
                .expect("another service")
        );
        refused(
            leases.get(&other).await,
            &format!("{service} reads {other}"),
        );
        refused(
            Api::<Lease>::namespaced(client.clone(), "default")
                .list(&ListParams::default())
                .await,
            &format!("{service} lists Leases elsewhere"),
        );
    }

    eprintln!(
        "least privilege checked in {:?} (control plane ready in {:?})",
        started.elapsed(),
        plane.startup
    );
}

//! kwok on the real control plane: nodes get heartbeats, pods the real
//! scheduler binds go Running, deleted pods go away, DaemonSets place their
//! pods, and DRA claims (extended resources and claim templates) are allocated
//! by kube-scheduler for pods that then run. Nothing here writes a node's or a
//! pod's status: kwok does.

use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use kube::api::{Api, DeleteParams, EvictParams, ListParams, PostParams};
use serde_json::json;
use switchyard_testkit::kube::{Components, ControlPlane, create_namespace};
use switchyard_testkit::kwok::{Kwok, MANAGED_ANNOTATION, kwok_node};

const NS: &str = "apps";

/// A control plane with kube-scheduler, kube-controller-manager and kwok.
struct Cluster {
    kwok: Kwok,
    client: kube::Client,
    plane: ControlPlane,
}

impl Cluster {
    async fn start() -> Cluster {
        let plane = ControlPlane::start_with(Components {
            scheduler: true,
            controller_manager: true,
            ..Components::default()
        })
        .await;
        let kwok = Kwok::start(&plane);
        let client = plane.client();
        create_namespace(&client, NS).await;
        eprintln!("control plane ready in {:?}", plane.startup);
        Cluster {
            kwok,
            client,
            plane,
        }
    }

    /// A kwok node with 8 `nvidia.com/gpu`, room for pods, and `taints`; Ready.
    async fn node(&mut self, name: &str, taints: Vec<Taint>) -> Node {
        let node = kwok_node(
            name,
            &[("node.deckhouse.io/group", "gpu")],
            &[
                ("cpu", "32"),
                ("memory", "256Gi"),
                ("pods", "110"),
                ("nvidia.com/gpu", "8"),
            ],
            taints,
        );
        self.kwok
            .create_node(&self.client, &node, Duration::from_secs(30))
            .await
    }

    /// Waits for `check`, failing with kwok's and the components' logs.
    async fn eventually<F, Fut>(&self, what: &str, check: F)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        if let Err(err) = switchyard_testkit::eventually(what, Duration::from_secs(30), check).await
        {
            panic!(
                "{err}\n--- kwok\n{}\n--- kube-scheduler\n{}\n--- kube-controller-manager\n{}",
                self.kwok.log_tail(),
                self.plane.log_tail("kube-scheduler"),
                self.plane.log_tail("kube-controller-manager")
            );
        }
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), NS)
    }

    /// The pods labelled `app=<app>`, as listed now.
    async fn pods_of(&self, app: &str) -> Vec<Pod> {
        self.pods()
            .list(&ListParams::default().labels(&format!("app={app}")))
            .await
            .unwrap_or_else(|err| panic!("list the pods of {app}: {err}"))
            .items
    }

    /// Creates `object`, given as JSON the way a manifest says it, through `api`.
    async fn create<K>(&self, api: Api<K>, object: serde_json::Value) -> K
    where
        K: kube::Resource<DynamicType = ()>
            + Clone
            + k8s_openapi::serde::de::DeserializeOwned
            + k8s_openapi::serde::Serialize
            + std::fmt::Debug,
    {
        let object: K = serde_json::from_value(object)
            .unwrap_or_else(|err| panic!("a valid {}: {err}", K::kind(&())));
        api.create(&PostParams::default(), &object)
            .await
            .unwrap_or_else(|err| panic!("create {} {:?}: {err}", K::kind(&()), object.meta().name))
    }

    /// The API of a namespaced kind in `NS`.
    fn ns<K>(&self) -> Api<K>
    where
        K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
    {
        Api::namespaced(self.client.clone(), NS)
    }

    /// The API of a cluster-scoped kind.
    fn all<K>(&self) -> Api<K>
    where
        K: kube::Resource<DynamicType = (), Scope = k8s_openapi::ClusterResourceScope>,
    {
        Api::all(self.client.clone())
    }
}

fn running(pod: &Pod) -> bool {
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

fn node_of(pod: &Pod) -> Option<&str> {
    pod.spec.as_ref()?.node_name.as_deref()
}

/// A pod template's spec: one container, `resources` its limits.
fn pod_spec(resources: serde_json::Value) -> serde_json::Value {
    json!({
        "automountServiceAccountToken": false,
        "terminationGracePeriodSeconds": 30,
        "containers": [{
            "name": "main",
            "image": "registry.invalid/pause:1",
            "resources": { "limits": resources },
        }],
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kwok_node_turns_ready_keeps_its_capacity_and_renews_its_lease() {
    let mut cluster = Cluster::start().await;
    let node = cluster.node("gpu-0", vec![]).await;

    let status = node.status.expect("status");
    assert_eq!(
        status.allocatable.expect("allocatable")["nvidia.com/gpu"].0,
        "8"
    );
    assert_eq!(status.capacity.expect("capacity")["cpu"].0, "32");
    assert_eq!(
        node.metadata.annotations.expect("annotations")[MANAGED_ANNOTATION.0],
        MANAGED_ANNOTATION.1
    );

    // The heartbeat: kwok renews the node's Lease, as kubelet does.
    let leases: Api<Lease> = Api::namespaced(cluster.client.clone(), "kube-node-lease");
    let renewed = |leases: Api<Lease>| async move {
        leases
            .get_opt("gpu-0")
            .await
            .expect("get the Lease of gpu-0")
            .and_then(|lease| lease.spec?.renew_time)
    };
    cluster
        .eventually("kwok creating the Lease of gpu-0", || {
            let leases = leases.clone();
            async move { renewed(leases).await.is_some() }
        })
        .await;
    let first = renewed(leases.clone()).await.expect("renewTime");
    cluster
        .eventually("the Lease of gpu-0 to be renewed", || {
            let (leases, first) = (leases.clone(), first.clone());
            async move { renewed(leases).await.is_some_and(|t| t > first) }
        })
        .await;
    let lease = leases.get("gpu-0").await.expect("lease");
    assert_eq!(
        lease.metadata.owner_references.expect("owner")[0].name,
        "gpu-0",
        "the Lease belongs to its Node"
    );

    // A node without the annotation is not kwok's: nothing makes it Ready.
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    let mut bare = kwok_node("bare-0", &[], &[("cpu", "4"), ("pods", "10")], vec![]);
    bare.metadata.annotations = None;
    nodes
        .create(&PostParams::default(), &bare)
        .await
        .expect("create bare-0");
    // gpu-0 is renewed again while bare-0 still has no conditions and no Lease:
    // kwok has had its chance at bare-0.
    let second = renewed(leases.clone()).await.expect("renewTime");
    cluster
        .eventually("the Lease of gpu-0 to be renewed again", || {
            let (leases, second) = (leases.clone(), second.clone());
            async move { renewed(leases).await.is_some_and(|t| t > second) }
        })
        .await;
    let bare = nodes.get("bare-0").await.expect("get bare-0");
    assert!(
        bare.status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .is_empty(),
        "kwok left bare-0 alone"
    );
    assert!(leases.get_opt("bare-0").await.expect("get").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployment_and_daemonset_pods_run_and_an_evicted_pod_is_replaced() {
    let mut cluster = Cluster::start().await;
    let gpu_taint = Taint {
        key: "nvidia.com/gpu".into(),
        value: Some("present".into()),
        effect: "NoSchedule".into(),
        ..Default::default()
    };
    cluster.node("gpu-0", vec![gpu_taint.clone()]).await;
    cluster.node("gpu-1", vec![gpu_taint]).await;

    // A Deployment asking for a device-plugin GPU: kube-scheduler binds its
    // pod, kwok runs it.
    cluster
        .create(
            cluster.ns::<Deployment>(),
            json!({
                "metadata": { "name": "trainer", "namespace": NS },
                "spec": {
                    "replicas": 1,
                    "selector": { "matchLabels": { "app": "trainer" } },
                    "template": {
                        "metadata": { "labels": { "app": "trainer" } },
                        "spec": spec_with(
                            pod_spec(json!({ "nvidia.com/gpu": "1" })),
                            "tolerations",
                            json!([{ "key": "nvidia.com/gpu", "operator": "Exists" }]),
                        ),
                    },
                },
            }),
        )
        .await;
    // A DaemonSet tolerating the GPU taint: a pod on each kwok node, Running.
    cluster
        .create(cluster.ns::<DaemonSet>(), json!({
            "metadata": { "name": "node-agent", "namespace": NS },
            "spec": {
                "selector": { "matchLabels": { "app": "node-agent" } },
                "template": {
                    "metadata": { "labels": { "app": "node-agent" } },
                    "spec": spec_with(pod_spec(json!({ "cpu": "100m" })), "tolerations", json!([{ "operator": "Exists" }])),
                },
            },
        }))
        .await;

    cluster
        .eventually("the trainer pod to run on a kwok node", || async {
            let pods = cluster.pods_of("trainer").await;
            pods.len() == 1
                && running(&pods[0])
                && node_of(&pods[0]).is_some_and(|n| n.starts_with("gpu-"))
        })
        .await;
    cluster
        .eventually("a Running node-agent pod on gpu-0 and on gpu-1", || async {
            let pods = cluster.pods_of("node-agent").await;
            let mut nodes: Vec<&str> = pods
                .iter()
                .filter(|p| running(p))
                .filter_map(node_of)
                .collect();
            nodes.sort();
            nodes == ["gpu-0", "gpu-1"]
        })
        .await;
    let ds: Api<DaemonSet> = Api::namespaced(cluster.client.clone(), NS);
    cluster
        .eventually("the DaemonSet to count 2 ready pods", || async {
            ds.get("node-agent")
                .await
                .ok()
                .and_then(|d| d.status)
                .is_some_and(|s| s.desired_number_scheduled == 2 && s.number_ready == 2)
        })
        .await;

    // An Eviction: the pod goes away (kwok finishes its deletion) and the
    // Deployment's replacement is scheduled and runs.
    let evicted = cluster.pods_of("trainer").await.remove(0);
    let evicted_name = evicted.metadata.name.clone().expect("name");
    cluster
        .pods()
        .evict(&evicted_name, &EvictParams::default())
        .await
        .unwrap_or_else(|err| panic!("evict {evicted_name}: {err}"));
    cluster
        .eventually(
            &format!("the evicted pod {evicted_name} to be gone"),
            || async {
                cluster
                    .pods()
                    .get_opt(&evicted_name)
                    .await
                    .expect("get the evicted pod")
                    .is_none()
            },
        )
        .await;
    cluster
        .eventually("the trainer's replacement pod to run", || async {
            let pods = cluster.pods_of("trainer").await;
            pods.len() == 1 && running(&pods[0]) && pods[0].metadata.name != evicted.metadata.name
        })
        .await;

    // A plain delete of a DaemonSet pod: gone, and the DaemonSet puts a new one on its node.
    let deleted = cluster
        .pods_of("node-agent")
        .await
        .into_iter()
        .find(|p| node_of(p) == Some("gpu-0"))
        .expect("the node-agent pod on gpu-0");
    let deleted_uid = deleted.metadata.uid.clone();
    cluster
        .pods()
        .delete(
            deleted.metadata.name.as_deref().expect("name"),
            &DeleteParams::default(),
        )
        .await
        .expect("delete the node-agent pod on gpu-0");
    cluster
        .eventually("a new Running node-agent pod on gpu-0", || async {
            let pods = cluster.pods_of("node-agent").await;
            let on_gpu_0: Vec<&Pod> = pods
                .iter()
                .filter(|p| node_of(p) == Some("gpu-0"))
                .collect();
            on_gpu_0.len() == 1 && running(on_gpu_0[0]) && on_gpu_0[0].metadata.uid != deleted_uid
        })
        .await;
}

/// `spec` with `key` set to `value`.
fn spec_with(
    mut spec: serde_json::Value,
    key: &str,
    value: serde_json::Value,
) -> serde_json::Value {
    spec[key] = value;
    spec
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dra_extended_resource_and_claim_template_pods_get_allocated_claims_and_run() {
    let mut cluster = Cluster::start().await;
    cluster.node("dra-0", vec![]).await;

    // The node's devices, as the node agent publishes them, and a class that
    // serves them as the extended resource gpu.deckhouse.io/a100 (KEP-5004).
    cluster
        .create(
            cluster.all::<ResourceSlice>(),
            json!({
                "metadata": { "name": "dra-0-gpu.deckhouse.io" },
                "spec": {
                    "driver": "gpu.deckhouse.io",
                    "nodeName": "dra-0",
                    "pool": { "name": "dra-0", "generation": 1, "resourceSliceCount": 1 },
                    "devices": (0..4).map(|i| json!({
                        "name": format!("gpu-{i}"),
                        "attributes": { "device": { "string": "a100-sxm4-40gb" } },
                    })).collect::<Vec<_>>(),
                },
            }),
        )
        .await;
    cluster
        .create(cluster.all::<DeviceClass>(), json!({
            "metadata": { "name": "a100.gpu.deckhouse.io" },
            "spec": {
                "selectors": [{ "cel": { "expression": "device.driver == 'gpu.deckhouse.io' && device.attributes['gpu.deckhouse.io'].device == 'a100-sxm4-40gb'" } }],
                "extendedResourceName": "gpu.deckhouse.io/a100",
            },
        }))
        .await;
    cluster
        .create(
            cluster.ns::<ResourceClaimTemplate>(),
            json!({
                "metadata": { "name": "one-a100", "namespace": NS },
                "spec": { "spec": { "devices": { "requests": [{
                    "name": "gpu",
                    "exactly": { "deviceClassName": "a100.gpu.deckhouse.io" },
                }] } } },
            }),
        )
        .await;

    // The migrated application's shape: the extended resource in its limits.
    cluster
        .create(
            cluster.ns::<Pod>(),
            json!({
                "metadata": { "name": "extended", "namespace": NS },
                "spec": pod_spec(json!({ "gpu.deckhouse.io/a100": "1" })),
            }),
        )
        .await;
    // And the DRA-native shape: a claim from a template.
    cluster
        .create(cluster.ns::<Pod>(), json!({
            "metadata": { "name": "templated", "namespace": NS },
            "spec": spec_with(
                spec_with(pod_spec(json!({})), "resourceClaims", json!([{ "name": "gpu", "resourceClaimTemplateName": "one-a100" }])),
                "containers",
                json!([{ "name": "main", "image": "registry.invalid/pause:1", "resources": { "claims": [{ "name": "gpu" }] } }]),
            ),
        }))
        .await;

    let pods = cluster.pods();
    for name in ["extended", "templated"] {
        cluster
            .eventually(&format!("pod {name} to run on dra-0"), || async {
                pods.get(name)
                    .await
                    .is_ok_and(|p| running(&p) && node_of(&p) == Some("dra-0"))
            })
            .await;
    }

    // Each pod's claim is allocated a device of dra-0's pool.
    let claims: Api<ResourceClaim> = Api::namespaced(cluster.client.clone(), NS);
    let extended = pods.get("extended").await.expect("get pod extended");
    let extended_claim = extended
        .status
        .as_ref()
        .and_then(|s| s.extended_resource_claim_status.as_ref())
        .map(|s| s.resource_claim_name.clone())
        .unwrap_or_else(|| {
            panic!(
                "pod extended has no extendedResourceClaimStatus: {:?}",
                extended.status
            )
        });
    let templated = pods.get("templated").await.expect("get pod templated");
    let templated_claim = templated
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref())
        .and_then(|s| s.first()?.resource_claim_name.clone())
        .unwrap_or_else(|| {
            panic!(
                "pod templated has no resourceClaimStatuses: {:?}",
                templated.status
            )
        });
    let mut devices = Vec::new();
    for claim_name in [&extended_claim, &templated_claim] {
        let claim = claims
            .get(claim_name)
            .await
            .unwrap_or_else(|err| panic!("get claim {claim_name}: {err}"));
        let results = claim
            .status
            .and_then(|s| s.allocation)
            .and_then(|a| a.devices)
            .and_then(|d| d.results)
            .unwrap_or_default();
        assert_eq!(results.len(), 1, "claim {claim_name} allocates one device");
        assert_eq!(results[0].driver, "gpu.deckhouse.io");
        assert_eq!(results[0].pool, "dra-0");
        devices.push(results[0].device.clone());
    }
    assert_ne!(
        devices[0], devices[1],
        "two claims, two devices: {devices:?}"
    );

    // Deleting the pod ends its claim too: kwok finishes the pod's deletion and
    // the controller manager removes the claim the scheduler made for it.
    pods.delete("extended", &DeleteParams::default())
        .await
        .expect("delete pod extended");
    cluster
        .eventually(
            &format!("pod extended and its claim {extended_claim} to be gone"),
            || async {
                pods.get_opt("extended")
                    .await
                    .expect("get pod extended")
                    .is_none()
                    && claims
                        .get_opt(&extended_claim)
                        .await
                        .expect("get the claim")
                        .is_none()
            },
        )
        .await;
}

//! The Helm chart (`deploy/helm/switchyard`) on a real API server: every object
//! it renders passes the server's validation (server-side apply, dry run), its
//! schema refuses typos, and each service's ServiceAccount can do what the
//! service needs and is refused the rest — by RBAC, and for the node agent by
//! the chart's admission policy that keeps it to its own node.
//!
//! helm comes from `scripts/install-helm.sh`, the control plane from
//! `scripts/control-plane.sh`; a missing one fails the test saying so.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Event, Namespace, Node, Pod, Secret, ServiceAccount};
use k8s_openapi::api::events::v1::Event as EventsV1Event;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, EvictParams, GroupVersionKind, ListParams,
    Patch, PatchParams, PostParams,
};
use kube::discovery::{Discovery, Scope};
use serde::Deserialize;
use serde_json::{Value, json};
use switchyard_testkit::kube::ControlPlane;
use switchyard_testkit::{eventually, helm_binary};

const NAMESPACE: &str = "switchyard-system";
const RELEASE: &str = "switchyard";
const NATS_URL: &str = "nats.url=nats://nats.example:4222";
const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";
/// How long RBAC bindings and admission policies may take to reach the API
/// server's caches.
const PROPAGATION: Duration = Duration::from_secs(20);

fn chart_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/helm/switchyard")
}

struct HelmRun {
    ok: bool,
    stdout: String,
    stderr: String,
}

fn helm(args: &[&str]) -> HelmRun {
    let binary = helm_binary().unwrap_or_else(|err| panic!("{err}"));
    let out = Command::new(&binary)
        .args(args)
        .output()
        .unwrap_or_else(|err| panic!("run {}: {err}", binary.display()));
    HelmRun {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `helm template` of the chart as release `switchyard` in `switchyard-system`.
fn template(sets: &[&str]) -> HelmRun {
    let chart = chart_dir();
    let mut args = vec![
        "template",
        RELEASE,
        chart.to_str().unwrap(),
        "--namespace",
        NAMESPACE,
    ];
    for set in sets {
        args.extend(["--set", set]);
    }
    helm(&args)
}

fn yaml_documents(text: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).expect("rendered YAML"))
        .filter(|doc| !doc.is_null())
        .collect()
}

/// The chart's objects for `sets`; panics with helm's error when it fails.
fn render(sets: &[&str]) -> Vec<Value> {
    let run = template(sets);
    assert!(run.ok, "helm template {sets:?} failed:\n{}", run.stderr);
    yaml_documents(&run.stdout)
}

fn chart_crds() -> Vec<Value> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(chart_dir().join("crds"))
        .expect("the chart's crds/")
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no CRDs in the chart's crds/");
    files
        .iter()
        .flat_map(|file| yaml_documents(&std::fs::read_to_string(file).unwrap()))
        .collect()
}

fn kind(doc: &Value) -> &str {
    doc["kind"].as_str().unwrap_or_default()
}

fn name(doc: &Value) -> &str {
    doc["metadata"]["name"].as_str().unwrap_or_default()
}

fn of_kind<'a>(docs: &'a [Value], wanted: &str) -> Vec<&'a Value> {
    docs.iter().filter(|doc| kind(doc) == wanted).collect()
}

fn strings(value: &Value) -> Vec<&str> {
    value
        .as_array()
        .map(|items| items.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn group_version_kind(doc: &Value) -> GroupVersionKind {
    let api_version = doc["apiVersion"].as_str().unwrap();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    GroupVersionKind::gvk(group, version, kind(doc))
}

/// Server-side apply of one rendered object, resolved through discovery.
async fn apply(
    client: &kube::Client,
    discovery: &Discovery,
    doc: &Value,
    dry_run: bool,
) -> Result<DynamicObject, String> {
    let gvk = group_version_kind(doc);
    let (resource, capabilities) = discovery
        .resolve_gvk(&gvk)
        .ok_or_else(|| format!("the API server does not serve {gvk:?}"))?;
    let api: Api<DynamicObject> = match capabilities.scope {
        Scope::Namespaced => {
            let namespace = doc["metadata"]["namespace"].as_str().unwrap_or(NAMESPACE);
            Api::namespaced_with(client.clone(), namespace, &resource)
        }
        Scope::Cluster => Api::all_with(client.clone(), &resource),
    };
    let mut params = PatchParams::apply("switchyard-test").force();
    if dry_run {
        params = params.dry_run();
    }
    api.patch(name(doc), &params, &Patch::Apply(doc))
        .await
        .map_err(|err| format!("{} {}: {err}", kind(doc), name(doc)))
}

/// Creates the release namespace and the chart's CRDs, waits until the CRDs
/// and every kind in `docs` are served, and returns discovery as it is then.
async fn prepare_cluster(client: &kube::Client, docs: &[Value]) -> Discovery {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NAMESPACE}})).unwrap(),
        )
        .await
        .expect("create the release namespace");
    let crds = chart_crds();
    let definitions: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in &crds {
        let definition: CustomResourceDefinition =
            serde_json::from_value(crd.clone()).expect("a CRD");
        definitions
            .patch(
                name(crd),
                &PatchParams::apply("switchyard-test"),
                &Patch::Apply(&definition),
            )
            .await
            .unwrap_or_else(|err| panic!("apply the chart's CRD {}: {err}", name(crd)));
    }
    for crd in &crds {
        let definitions = &definitions;
        eventually(
            &format!("CRD {} to be established", name(crd)),
            Duration::from_secs(30),
            || async move {
                let got = definitions.get(name(crd)).await.unwrap();
                let conditions = got.status.and_then(|s| s.conditions).unwrap_or_default();
                conditions
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            },
        )
        .await
        .unwrap();
    }
    // Right after start-up, and after new CRDs, discovery can lag behind what
    // the server serves.
    let wanted: Vec<GroupVersionKind> = docs.iter().map(group_version_kind).collect();
    let discovered = RefCell::new(None);
    let missing = RefCell::new(Vec::new());
    eventually(
        "discovery to list every kind the test applies",
        Duration::from_secs(30),
        || async {
            let Ok(discovery) = Discovery::new(client.clone()).run().await else {
                return false;
            };
            *missing.borrow_mut() = wanted
                .iter()
                .filter(|gvk| discovery.resolve_gvk(gvk).is_none())
                .cloned()
                .collect();
            let complete = missing.borrow().is_empty();
            *discovered.borrow_mut() = Some(discovery);
            complete
        },
    )
    .await
    .unwrap_or_else(|err| panic!("{err}; not served: {:?}", missing.borrow()));
    discovered.into_inner().unwrap()
}

/// Every Deployment and DaemonSet in `docs`: (component, pod spec).
fn workloads(docs: &[Value]) -> Vec<(String, &Value)> {
    docs.iter()
        .filter(|doc| matches!(kind(doc), "Deployment" | "DaemonSet"))
        .map(|doc| {
            let component = doc["metadata"]["labels"]["app.kubernetes.io/component"]
                .as_str()
                .unwrap()
                .to_string();
            (component, &doc["spec"]["template"]["spec"])
        })
        .collect()
}

/// The value following `flag` in a container's command.
fn flag<'a>(command: &[&'a str], flag: &str) -> Option<&'a str> {
    let at = command.iter().position(|arg| *arg == flag)?;
    command.get(at + 1).copied()
}

/// Every permission each service's role grants, as `group/resource verbs...`
/// (core group empty): exactly these, nothing else.
const PERMISSIONS: [(&str, &[&str]); 6] = [
    (
        "inventory",
        &[
            "/nodes get list watch",
            "/pods get list watch",
            "/resourcequotas get list watch",
            "apps/deployments get list watch",
            "apps/statefulsets get list watch",
            "deckhouse.io/nodegroups get list watch",
            "deckhouse.io/moduleconfigs get list watch",
            "gpu.deckhouse.io/gpuclasses get list watch",
            "gpu.deckhouse.io/physicalgpus get list watch",
            "resource.k8s.io/resourceslices get list watch",
            "resource.k8s.io/deviceclasses get list watch",
            "resource.k8s.io/resourceclaims get list watch",
        ],
    ),
    (
        "stack-assigner",
        &[
            "/nodes get list watch patch",
            "/pods get list watch",
            "/pods/eviction create",
            "policy/poddisruptionbudgets get list watch",
            "deckhouse.io/nodegroups get list watch",
            "deckhouse.io/moduleconfigs get list watch",
        ],
    ),
    (
        "class-compiler",
        &[
            "gpu.deckhouse.io/gpuclasses get list watch",
            "gpu.deckhouse.io/physicalgpus get list watch",
            "gpu.deckhouse.io/gpuclasses/status patch update",
            "resource.k8s.io/deviceclasses get list watch create patch delete",
            "admissionregistration.k8s.io/validatingadmissionpolicies get create patch delete",
            "admissionregistration.k8s.io/validatingadmissionpolicybindings get create patch delete",
        ],
    ),
    (
        "claim-allocator",
        &[
            "apps/deployments get list watch patch",
            "apps/statefulsets get list watch patch",
            "/pods get list watch",
            "/resourcequotas get list watch patch",
            "deckhouse.io/nodegroups get list watch patch",
            "resource.k8s.io/resourceclaims get list watch",
            "resource.k8s.io/resourceslices get list watch",
            "resource.k8s.io/deviceclasses get list watch",
            "resource.k8s.io/resourceclaims/status patch update",
        ],
    ),
    (
        "node-agent",
        &[
            "/nodes get list watch",
            "gpu.deckhouse.io/physicalgpus get list watch create patch update delete",
            "gpu.deckhouse.io/physicalgpus/status get list watch create patch update delete",
            "resource.k8s.io/resourceslices get list watch create patch update delete",
            "resource.k8s.io/resourceclaims get list watch",
        ],
    ),
    ("alerter", &["/events create patch"]),
];

/// (group/resource, verb) pairs of a role's rules.
fn granted(role: &Value) -> BTreeSet<(String, String)> {
    let mut pairs = BTreeSet::new();
    for rule in role["rules"].as_array().unwrap() {
        assert!(
            rule.get("resourceNames").is_none() && rule.get("nonResourceURLs").is_none(),
            "{rule}"
        );
        for group in strings(&rule["apiGroups"]) {
            for resource in strings(&rule["resources"]) {
                for verb in strings(&rule["verbs"]) {
                    pairs.insert((format!("{group}/{resource}"), verb.to_string()));
                }
            }
        }
    }
    pairs
}

#[test]
fn each_role_grants_exactly_the_documented_permissions() {
    let docs = render(&[NATS_URL]);
    for (component, permissions) in PERMISSIONS {
        let role_name = format!("{RELEASE}-{component}");
        let kind_wanted = if component == "alerter" {
            "Role"
        } else {
            "ClusterRole"
        };
        let role = docs
            .iter()
            .find(|doc| kind(doc) == kind_wanted && name(doc) == role_name)
            .unwrap_or_else(|| panic!("no {kind_wanted} {role_name}"));
        let expected: BTreeSet<(String, String)> = permissions
            .iter()
            .flat_map(|line| {
                let mut words = line.split(' ');
                let resource = words.next().unwrap();
                words.map(move |verb| (resource.to_string(), verb.to_string()))
            })
            .collect();
        assert_eq!(granted(role), expected, "{kind_wanted} {role_name}");
        let binding_kind = format!("{kind_wanted}Binding");
        let binding = docs
            .iter()
            .find(|doc| kind(doc) == binding_kind && name(doc) == role_name)
            .unwrap_or_else(|| panic!("no {binding_kind} {role_name}"));
        assert_eq!(binding["roleRef"]["name"], role_name.as_str());
        assert_eq!(
            binding["subjects"],
            json!([{"kind": "ServiceAccount", "name": role_name, "namespace": NAMESPACE}])
        );
    }
    // The node agent's Events about cluster-scoped objects live in `default`.
    let events_role = format!("{RELEASE}-node-agent-events");
    let role = docs
        .iter()
        .find(|doc| kind(doc) == "Role" && name(doc) == events_role)
        .unwrap_or_else(|| panic!("no Role {events_role}"));
    assert_eq!(role["metadata"]["namespace"], "default");
    assert_eq!(
        granted(role),
        BTreeSet::from([
            ("events.k8s.io/events".to_string(), "create".to_string()),
            ("events.k8s.io/events".to_string(), "patch".to_string()),
        ])
    );
    let binding = docs
        .iter()
        .find(|doc| kind(doc) == "RoleBinding" && name(doc) == events_role)
        .unwrap_or_else(|| panic!("no RoleBinding {events_role}"));
    assert_eq!(binding["roleRef"]["name"], events_role.as_str());
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": format!("{RELEASE}-node-agent"), "namespace": NAMESPACE}])
    );
    // No role or binding besides these.
    let roles = docs
        .iter()
        .filter(|doc| kind(doc).ends_with("Role") || kind(doc).ends_with("RoleBinding"))
        .count();
    assert_eq!(roles, 2 * PERMISSIONS.len() + 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chart_renders_and_passes_server_side_dry_run() {
    let chart = chart_dir();
    let lint = helm(&[
        "lint",
        chart.to_str().unwrap(),
        "--strict",
        "--set",
        NATS_URL,
    ]);
    assert!(lint.ok, "helm lint failed:\n{}{}", lint.stdout, lint.stderr);

    // The schema refuses a misspelt key instead of ignoring it.
    let typo = template(&[NATS_URL, "nats.urll=nats://x:4222"]);
    assert!(!typo.ok, "a misspelt key rendered:\n{}", typo.stdout);
    assert!(
        typo.stderr.contains("schema") && typo.stderr.contains("urll"),
        "{}",
        typo.stderr
    );
    let typo = template(&[NATS_URL, "inventroy.resources.limits.memory=1Gi"]);
    assert!(
        !typo.ok && typo.stderr.contains("inventroy"),
        "a misspelt top-level key was not refused:\n{}",
        typo.stderr
    );
    // Without a bundled server, the NATS URL is required.
    let missing = template(&[]);
    assert!(
        !missing.ok,
        "rendered without nats.url:\n{}",
        missing.stdout
    );
    assert!(
        missing.stderr.contains("nats.url is required"),
        "{}",
        missing.stderr
    );

    // The node agent's DaemonSet is off by default (its binary is not built
    // yet); the variants turn it on so that it is checked too.
    let default = render(&[NATS_URL]);
    assert_eq!(
        of_kind(&default, "DaemonSet").len(),
        0,
        "node agent off by default"
    );
    assert_eq!(of_kind(&default, "Deployment").len(), 5);
    const AGENT: &str = "nodeAgent.enabled=true";
    let variants: [(&str, Vec<&str>); 3] = [
        ("external NATS", vec![NATS_URL, AGENT]),
        ("bundled NATS", vec!["nats.bundled.enabled=true", AGENT]),
        (
            "NATS credentials",
            vec![NATS_URL, "nats.credentialsSecret.name=nats-creds", AGENT],
        ),
    ];
    let rendered: Vec<(&str, Vec<Value>)> = variants
        .iter()
        .map(|(variant, sets)| (*variant, render(sets)))
        .collect();

    for (variant, docs) in &rendered {
        let count = |wanted: &str| of_kind(docs, wanted).len();
        assert_eq!(count("Deployment"), 5, "{variant}");
        assert_eq!(count("DaemonSet"), 1, "{variant}");
        assert_eq!(count("ServiceAccount"), 6, "{variant}");
        assert_eq!(count("ClusterRole"), 5, "{variant}");
        assert_eq!(count("ClusterRoleBinding"), 5, "{variant}");
        assert_eq!(count("Role"), 2, "{variant}");
        assert_eq!(count("RoleBinding"), 2, "{variant}");
        assert_eq!(count("ValidatingAdmissionPolicy"), 1, "{variant}");
        assert_eq!(count("ValidatingAdmissionPolicyBinding"), 1, "{variant}");
        let bundled = *variant == "bundled NATS";
        assert_eq!(count("StatefulSet"), usize::from(bundled), "{variant}");
        for deployment in of_kind(docs, "Deployment") {
            assert_eq!(deployment["spec"]["replicas"], 1, "{}", name(deployment));
            assert_eq!(deployment["spec"]["strategy"]["type"], "Recreate");
        }

        let mut components: Vec<String> = Vec::new();
        for (component, pod) in workloads(docs) {
            let container = &pod["containers"][0];
            let command = strings(&container["command"]);
            assert_eq!(
                command[..3],
                ["switchyard", "serve", component.as_str()],
                "{variant}"
            );
            assert_eq!(flag(&command, "--nats-url"), Some("$(SWITCHYARD_NATS_URL)"));
            assert_eq!(flag(&command, "--stream"), Some("SWITCHYARD_LOG"));
            assert_eq!(flag(&command, "--health-listen"), Some("0.0.0.0:8086"));
            let url = container["env"]
                .as_array()
                .unwrap()
                .iter()
                .find(|env| env["name"] == "SWITCHYARD_NATS_URL")
                .map(|env| env["value"].as_str().unwrap())
                .unwrap();
            let expected_url = if bundled {
                "nats://switchyard-nats.switchyard-system.svc:4222"
            } else {
                "nats://nats.example:4222"
            };
            assert_eq!(url, expected_url, "{variant} {component}");
            for probe in ["startupProbe", "livenessProbe", "readinessProbe"] {
                assert_eq!(
                    container[probe]["grpc"]["port"], 8086,
                    "{variant} {component} {probe}"
                );
            }
            let security = &container["securityContext"];
            assert_eq!(security["readOnlyRootFilesystem"], true);
            assert_eq!(security["allowPrivilegeEscalation"], false);
            assert_eq!(security["privileged"], false);
            assert_eq!(strings(&security["capabilities"]["drop"]), ["ALL"]);
            assert_eq!(
                pod["securityContext"]["seccompProfile"]["type"],
                "RuntimeDefault"
            );
            let node_agent = component == "node-agent";
            assert_eq!(
                pod["securityContext"]["runAsNonRoot"], !node_agent,
                "{component}: only the node agent runs as root"
            );
            assert_eq!(
                flag(&command, "--node-name").is_some(),
                node_agent,
                "{component}"
            );
            let with_credentials = *variant == "NATS credentials";
            assert_eq!(
                flag(&command, "--nats-creds"),
                with_credentials.then_some("/etc/switchyard/nats/nats.creds"),
                "{variant} {component}"
            );
            let secret_volume = pod["volumes"]
                .as_array()
                .unwrap()
                .iter()
                .any(|volume| volume["secret"]["secretName"] == "nats-creds");
            assert_eq!(secret_volume, with_credentials, "{variant} {component}");
            components.push(component);
        }
        components.sort();
        assert_eq!(
            components,
            [
                "alerter",
                "claim-allocator",
                "class-compiler",
                "inventory",
                "node-agent",
                "stack-assigner"
            ]
        );
    }

    let node_agent = rendered[0]
        .1
        .iter()
        .find(|doc| kind(doc) == "DaemonSet")
        .unwrap();
    let pod = &node_agent["spec"]["template"]["spec"];
    let host_paths: Vec<&str> = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|volume| volume["hostPath"]["path"].as_str())
        .collect();
    assert_eq!(
        host_paths,
        [
            "/var/lib/kubelet/plugins_registry",
            "/var/lib/kubelet/plugins/gpu.deckhouse.io",
            "/var/lib/kubelet/device-plugins",
            "/var/run/cdi",
            "/var/lib/kubelet/pod-resources"
        ]
    );
    let term = &pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        [0]["matchExpressions"][0];
    assert_eq!(term["key"], "node.deckhouse.io/gpu-stack");
    assert_eq!(term["operator"], "Exists");

    // The API server validates every object: schemas, pod specs, RBAC rules,
    // the admission policy's CEL.
    let plane = ControlPlane::start().await;
    let client = plane.client();
    let all: Vec<Value> = rendered.iter().flat_map(|(_, docs)| docs.clone()).collect();
    let discovery = prepare_cluster(&client, &all).await;
    let mut failures = Vec::new();
    let mut applied = 0;
    for (variant, docs) in &rendered {
        for doc in docs {
            match apply(&client, &discovery, doc, true).await {
                Ok(_) => applied += 1,
                Err(err) => failures.push(format!("{variant}: {err}")),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "the API server refused rendered objects:\n{}",
        failures.join("\n")
    );
    // A dry run stores nothing.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), NAMESPACE);
    assert!(
        deployments
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
    eprintln!(
        "{applied} rendered objects passed server-side dry run (control plane ready in {:?})",
        plane.startup
    );
}

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
        22,
        "6 ServiceAccounts, 5 + 5 cluster roles and bindings, 2 Roles and their bindings, the policy and its binding"
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

    // claim-allocator rewrites workloads and quotas, never nodes.
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
        refused(
            Api::<Node>::all(client.clone())
                .patch(
                    "gpu-node-1",
                    &PatchParams::default(),
                    &label_patch("x", "y"),
                )
                .await,
            "claim-allocator patches a node",
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

    // alerter records Events in its own namespace and nothing else.
    {
        let client = as_service("alerter");
        let events: &Api<Event> = &Api::namespaced(client.clone(), NAMESPACE);
        let event = &|namespace: &str| -> Event {
            serde_json::from_value(json!({
                "metadata": {"name": "d8-gpu-node-group-held-on-dra", "namespace": namespace},
                "involvedObject": {
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "namespace": namespace,
                    "name": "switchyard-alerter",
                },
                "reason": "D8GpuNodeGroupHeldOnDra",
                "message": "node group gpu-legacy is held on DRA",
                "type": "Warning",
            }))
            .unwrap()
        };
        allowed_once_propagated("alerter to create an Event", || async move {
            events
                .create(&PostParams::default(), &event(NAMESPACE))
                .await
        })
        .await;
        refused(
            Api::<Event>::namespaced(client.clone(), "apps")
                .create(&PostParams::default(), &event("apps"))
                .await,
            "alerter creates an Event in another namespace",
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
    }
    eprintln!(
        "least privilege checked in {:?} (control plane ready in {:?})",
        started.elapsed(),
        plane.startup
    );
}

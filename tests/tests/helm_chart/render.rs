//! The chart rendered: `helm lint`, the schema, the rendered variants, and a server-side dry run of every object.

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, ListParams};
use serde_json::Value;
use switchyard_testkit::kube::ControlPlane;

use crate::support::{
    NAMESPACE, NATS_URL, apply, chart_dir, helm, kind, name, prepare_cluster, render, strings,
    template,
};

fn of_kind<'a>(docs: &'a [Value], wanted: &str) -> Vec<&'a Value> {
    docs.iter().filter(|doc| kind(doc) == wanted).collect()
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

/// A secured release: every identity's public key (made by `switchyard keys
/// new`), the seeds in Secret `sy-keys`, TLS with a CA the chart makes.
const SECURED: [&str; 10] = [
    "security.enabled=true",
    "security.seedsSecret=sy-keys",
    "security.services.inventory={UALVKTOS7NKVQFWCM7PQJIN2HNKT5CT7ZP7DLVJ7BUQKFRDQX6IIRABJ}",
    "security.services.stack-assigner={UDWBTCYQWERVUVYV4QLHXYNWQ5J3VLKNKETPGU64IFG7AC24AGUTD26M}",
    "security.services.class-compiler={UA6NTLGMA4USFWEFY6NET5XZW7YZHWDZYJU7K26PNGX66RVN2LOD77RF}",
    "security.services.claim-allocator={UC7RTRQHFBZUJSC7LYR3RMUIBEDTOBJ7IME4UONVLJYVZJV35AG7X2MQ}",
    "security.services.alerter={UDD34QA4UQIGSFTFOOZAWFI53SNVEJTR4O7K3YHSDSULWZIV4D2HHDIB}",
    "security.logInit={UBARN6UU6KYAWHIPHSYBA7JOT6ODCV76F7Y7GCUVG6IJ3ZKMPMXOMEIW}",
    "security.tls.enabled=true",
    "security.tls.secretName=",
];

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
    // Security on without its keys: the error says what is missing.
    let keyless = template(&["nats.bundled.enabled=true", "security.enabled=true"]);
    assert!(!keyless.ok, "rendered without keys:\n{}", keyless.stdout);
    assert!(
        keyless
            .stderr
            .contains("security.services.inventory: expected the service's public key"),
        "{}",
        keyless.stderr
    );
    let mut secured = vec!["nats.bundled.enabled=true", AGENT];
    secured.extend(SECURED);
    let variants: [(&str, Vec<&str>); 4] = [
        ("external NATS", vec![NATS_URL, AGENT]),
        ("bundled NATS", vec!["nats.bundled.enabled=true", AGENT]),
        (
            "NATS credentials",
            vec![NATS_URL, "nats.credentialsSecret.name=nats-creds", AGENT],
        ),
        ("secured bundled NATS", secured),
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
        assert_eq!(count("ClusterRole"), 6, "{variant}");
        assert_eq!(count("ClusterRoleBinding"), 6, "{variant}");
        // The Events' two, and each elected service's Lease.
        assert_eq!(count("Role"), 2 + 5, "{variant}");
        assert_eq!(count("RoleBinding"), 2 + 5, "{variant}");
        // The node agent's own-node policy and the DRA admin-access policy.
        assert_eq!(count("ValidatingAdmissionPolicy"), 2, "{variant}");
        assert_eq!(count("ValidatingAdmissionPolicyBinding"), 2, "{variant}");
        let bundled = variant.ends_with("bundled NATS");
        let secure = variant.starts_with("secured");
        assert_eq!(count("StatefulSet"), usize::from(bundled), "{variant}");
        // The keyring, and the server's generated CA and certificate.
        assert_eq!(count("Secret"), usize::from(secure), "{variant}");
        let auth = of_kind(docs, "ConfigMap")
            .into_iter()
            .find_map(|map| map["data"]["auth.conf"].as_str());
        assert_eq!(auth.is_some(), secure, "{variant}");
        if let Some(auth) = auth {
            // One user per key, each with its own inboxes only.
            assert_eq!(auth.matches("{nkey: ").count(), 6, "{auth}");
            assert!(!auth.contains("STREAM.UPDATE") && !auth.contains("STREAM.DELETE"));
        }
        for deployment in of_kind(docs, "Deployment") {
            assert_eq!(deployment["spec"]["replicas"], 2, "{}", name(deployment));
            assert_eq!(deployment["spec"]["strategy"]["type"], "RollingUpdate");
        }

        let mut components: Vec<String> = Vec::new();
        for (component, pod) in workloads(docs) {
            let container = &pod["containers"][0];
            let command = strings(&container["command"]);
            let node_agent = component == "node-agent";
            // Each service runs its own binary; the node agent's is `serve`d.
            let binary = format!("switchyard-{component}");
            assert_eq!(command[0], binary, "{variant}");
            assert_eq!(command.get(1) == Some(&"serve"), node_agent, "{variant}");
            assert_eq!(flag(&command, "--health-listen"), Some("0.0.0.0:8086"));
            let url = container["env"]
                .as_array()
                .unwrap()
                .iter()
                .find(|env| env["name"] == "SWITCHYARD_NATS_URL")
                .map(|env| env["value"].as_str().unwrap());
            if node_agent {
                // It talks to kubelet and the API server, not to the log.
                assert_eq!(flag(&command, "--nats-url"), None, "{variant}");
                assert_eq!(url, None, "{variant}");
            } else {
                assert_eq!(flag(&command, "--nats-url"), Some("$(SWITCHYARD_NATS_URL)"));
                assert_eq!(flag(&command, "--stream"), Some("SWITCHYARD_LOG"));
                let expected_url = if bundled {
                    "nats://switchyard-nats.switchyard-system.svc:4222"
                } else {
                    "nats://nats.example:4222"
                };
                assert_eq!(url, Some(expected_url), "{variant} {component}");
            }
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
            assert_eq!(
                pod["securityContext"]["runAsNonRoot"], !node_agent,
                "{component}: only the node agent runs as root"
            );
            assert_eq!(
                flag(&command, "--node-name").is_some(),
                node_agent,
                "{component}"
            );
            let with_credentials = *variant == "NATS credentials" && !node_agent;
            assert_eq!(
                flag(&command, "--nats-creds"),
                with_credentials.then_some("/etc/switchyard/nats/nats.creds"),
                "{variant} {component}"
            );
            let signed = secure && !node_agent;
            let key = signed.then_some("/etc/switchyard/keys/seed");
            assert_eq!(flag(&command, "--nats-nkey"), key, "{variant} {component}");
            assert_eq!(
                flag(&command, "--signing-key"),
                key,
                "{variant} {component}"
            );
            assert_eq!(
                flag(&command, "--keyring"),
                signed.then_some("/etc/switchyard/keyring/keyring.yaml"),
                "{variant} {component}"
            );
            assert_eq!(
                flag(&command, "--nats-tls-ca"),
                signed.then_some("/etc/switchyard/tls/ca.crt"),
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
    // Upgrades surge: the new agent serves beside the old one, on sockets
    // named after its pod UID.
    assert_eq!(
        node_agent["spec"]["updateStrategy"]["rollingUpdate"],
        serde_json::json!({"maxSurge": 1, "maxUnavailable": 0})
    );
    let env = pod["containers"][0]["env"].as_array().unwrap();
    assert!(
        env.iter()
            .any(|e| e["name"] == "POD_UID"
                && e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"),
        "{env:?}"
    );

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

/// The stack-assigner's readiness selectors come from the chart: by default
/// its --node-agent-selector selects exactly the node-agent DaemonSet's pods
/// and there is no vendor adapter; values override both.
#[test]
fn the_readiness_selectors_select_the_charts_node_agent_pods() {
    use switchyard_core::cluster::{Pod, PodSelector};
    let docs = render(&[NATS_URL, "nodeAgent.enabled=true"]);
    let command = |docs: &[Value]| -> Vec<String> {
        let (_, spec) = workloads(docs)
            .into_iter()
            .find(|(c, _)| c == "stack-assigner")
            .expect("the stack-assigner");
        strings(&spec["containers"][0]["command"])
            .into_iter()
            .map(str::to_string)
            .collect()
    };
    let args = command(&docs);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let agent = PodSelector::parse(flag(&args, "--node-agent-selector").expect("the flag"))
        .expect("a selector");
    assert_eq!(flag(&args, "--vendor-adapter-selector"), Some(""));
    let daemon_set = of_kind(&docs, "DaemonSet")[0];
    let labels = daemon_set["spec"]["template"]["metadata"]["labels"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.as_str().into(), v.as_str().unwrap().into()))
        .collect();
    let pod = Pod {
        owner_kind: "DaemonSet".into(),
        labels,
        ..Pod::default()
    };
    assert!(
        agent.selects(&pod),
        "{agent:?} does not select the node agent's pods"
    );
    // Other components' pods are not the node agent.
    let mut other = pod.clone();
    for (k, v) in other.labels.iter_mut() {
        if &**k == "app.kubernetes.io/component" {
            *v = "stack-assigner".into();
        }
    }
    assert!(!agent.selects(&other));
    let docs = render(&[
        NATS_URL,
        "stackAssigner.readiness.nodeAgentSelector=app=gpu-node-agent",
        "stackAssigner.readiness.vendorAdapterSelector=app=nvidia-dra-adapter",
    ]);
    let args = command(&docs);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_eq!(
        flag(&args, "--node-agent-selector"),
        Some("app=gpu-node-agent")
    );
    assert_eq!(
        flag(&args, "--vendor-adapter-selector"),
        Some("app=nvidia-dra-adapter")
    );
}

#[test]
fn uninstall_is_guarded_and_the_log_claim_outlives_the_release() {
    let guards = |docs: &[Value]| -> Vec<Value> {
        of_kind(docs, "Job")
            .into_iter()
            .filter(|job| job["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete")
            .cloned()
            .collect()
    };
    let bundled = render(&["nats.bundled.enabled=true"]);
    let guard = guards(&bundled);
    assert_eq!(guard.len(), 1, "one pre-delete guard: {guard:?}");
    let command = strings(&guard[0]["spec"]["template"]["spec"]["containers"][0]["command"]);
    assert_eq!(&command[..3], ["switchyard", "status", "--require-idle"]);
    assert_eq!(
        flag(&command, "--nats-url"),
        Some("nats://switchyard-nats.switchyard-system.svc:4222")
    );
    assert_eq!(guard[0]["spec"]["backoffLimit"], 0);
    // Kept when it fails: its log names what is in flight.
    assert_eq!(
        guard[0]["metadata"]["annotations"]["helm.sh/hook-delete-policy"],
        "before-hook-creation,hook-succeeded"
    );
    let nats = of_kind(&bundled, "StatefulSet");
    assert_eq!(
        nats[0]["spec"]["persistentVolumeClaimRetentionPolicy"]["whenDeleted"],
        "Retain"
    );

    let off = render(&["nats.bundled.enabled=true", "uninstallGuard.enabled=false"]);
    assert!(guards(&off).is_empty());
    let dropped = render(&[
        "nats.bundled.enabled=true",
        "nats.bundled.storage.keepOnUninstall=false",
    ]);
    assert_eq!(
        of_kind(&dropped, "StatefulSet")[0]["spec"]["persistentVolumeClaimRetentionPolicy"]["whenDeleted"],
        "Delete"
    );
    let mut secured = vec!["nats.bundled.enabled=true"];
    secured.extend(SECURED);
    assert!(
        guards(&render(&secured)).is_empty(),
        "no reader identity yet: no guard with security on"
    );
    let refused = template(&[
        "nats.bundled.enabled=true",
        "uninstallGuard.timeoutSeconds=1",
    ]);
    assert!(
        !refused.ok && refused.stderr.contains("timeoutSeconds"),
        "{}",
        refused.stderr
    );
}

/// `nats.bundled.replicas: 3`: three servers started together, one per node
/// where the nodes allow, each its own name and routed to all three by their
/// stable names, found before they are Ready, at most one down at a time, and
/// the log's stream created with the copies asked for. More copies of the
/// stream than servers is refused, naming both values; a cluster of two is
/// not one the schema takes.
#[test]
fn a_bundled_cluster_is_three_servers_routed_to_each_other() {
    let docs = render(&[
        "nats.bundled.enabled=true",
        "nats.bundled.replicas=3",
        "nats.streamReplicas=3",
    ]);
    let nats: Vec<&Value> = docs
        .iter()
        .filter(|d| name(d) == "switchyard-nats")
        .collect();
    let of = |k: &str| {
        *nats
            .iter()
            .find(|d| kind(d) == k)
            .unwrap_or_else(|| panic!("no {k} of NATS"))
    };
    let set = of("StatefulSet");
    assert_eq!(set["spec"]["replicas"], 3);
    assert_eq!(set["spec"]["podManagementPolicy"], "Parallel");
    let pod = &set["spec"]["template"]["spec"];
    assert_eq!(
        pod["topologySpreadConstraints"][0]["topologyKey"],
        "kubernetes.io/hostname"
    );
    let container = &pod["containers"][0];
    assert_eq!(container["env"][0]["name"], "POD_NAME");
    assert_eq!(
        container["env"][0]["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.name"
    );
    assert!(
        container["ports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == "cluster" && p["containerPort"] == 6222)
    );
    let config = of("ConfigMap")["data"]["nats.conf"].as_str().unwrap();
    assert!(config.contains("server_name: $POD_NAME"), "{config}");
    for i in 0..3 {
        let route = format!("nats://switchyard-nats-{i}.switchyard-nats.{NAMESPACE}.svc:6222");
        assert!(config.contains(&route), "{route} in:\n{config}");
    }
    assert!(config.contains("sync_interval: always"), "{config}");
    let service = of("Service");
    assert_eq!(service["spec"]["publishNotReadyAddresses"], true);
    assert_eq!(of("PodDisruptionBudget")["spec"]["maxUnavailable"], 1);
    let init = docs
        .iter()
        .find(|d| kind(d) == "Job" && name(d).ends_with("log-init"))
        .expect("the log-init Job");
    let command = strings(&init["spec"]["template"]["spec"]["containers"][0]["command"]);
    assert_eq!(flag(&command, "--stream-replicas"), Some("3"));

    // One server, as before: no routes, no budget.
    let single = render(&["nats.bundled.enabled=true"]);
    assert!(
        !single
            .iter()
            .any(|d| kind(d) == "PodDisruptionBudget" && name(d) == "switchyard-nats")
    );

    let refused = template(&["nats.bundled.enabled=true", "nats.streamReplicas=3"]);
    assert!(!refused.ok, "three copies on one server rendered");
    assert!(
        refused.stderr.contains(
            "nats.streamReplicas=3: the stream cannot have more copies than there are servers, and nats.bundled.replicas is 1"
        ),
        "{}",
        refused.stderr
    );
    let two = template(&["nats.bundled.enabled=true", "nats.bundled.replicas=2"]);
    assert!(!two.ok);
    assert!(
        two.stderr.contains("/nats/bundled/replicas") && two.stderr.contains("1, 3, 5"),
        "{}",
        two.stderr
    );
}

/// The value of the environment variable `name` of a pod's first container.
fn env<'a>(pod: &'a Value, name: &str) -> Option<&'a Value> {
    pod["containers"][0]["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)
}

/// By default each service runs as two replicas elected by a Lease of its
/// own: rolled one pod at a time, kept on different nodes where they can
/// be, a PodDisruptionBudget keeping one, each replica's identity its pod's
/// name, and a Role that lets its account create Leases and read and apply
/// its own only. `ha.replicas=1` is the single unelected writer as before;
/// HA without the Lease's permission, or a margin that leaves the leader no
/// time to renew, is refused, naming the values.
#[test]
fn services_run_elected_with_a_standby_by_default() {
    let docs = render(&[NATS_URL]);
    let services = [
        "inventory",
        "stack-assigner",
        "class-compiler",
        "claim-allocator",
        "alerter",
    ];
    for component in services {
        let full = format!("switchyard-{component}");
        let deployment = docs
            .iter()
            .find(|d| kind(d) == "Deployment" && name(d) == full)
            .unwrap_or_else(|| panic!("no Deployment {full}"));
        assert_eq!(deployment["spec"]["replicas"], 2);
        assert_eq!(
            deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"],
            0
        );
        let pod = &deployment["spec"]["template"]["spec"];
        let labels = &deployment["spec"]["selector"]["matchLabels"];
        let spread = &pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
            [0]["podAffinityTerm"];
        assert_eq!(spread["topologyKey"], "kubernetes.io/hostname");
        assert_eq!(&spread["labelSelector"]["matchLabels"], labels);
        assert_eq!(
            env(pod, "SWITCHYARD_LEASE_NAMESPACE").unwrap()["value"],
            NAMESPACE
        );
        assert_eq!(
            env(pod, "SWITCHYARD_LEASE_NAME").unwrap()["value"],
            full.as_str()
        );
        assert_eq!(
            env(pod, "SWITCHYARD_IDENTITY").unwrap()["valueFrom"]["fieldRef"]["fieldPath"],
            "metadata.name"
        );
        assert_eq!(
            env(pod, "SWITCHYARD_LEASE_DURATION").unwrap()["value"],
            "15s"
        );
        let budget = docs
            .iter()
            .find(|d| kind(d) == "PodDisruptionBudget" && name(d) == full)
            .unwrap_or_else(|| panic!("no PodDisruptionBudget {full}"));
        assert_eq!(budget["spec"]["minAvailable"], 1);
        assert_eq!(&budget["spec"]["selector"]["matchLabels"], labels);
        let lease = format!("{full}-lease");
        let role = docs
            .iter()
            .find(|d| kind(d) == "Role" && name(d) == lease)
            .unwrap_or_else(|| panic!("no Role {lease}"));
        assert_eq!(role["metadata"]["namespace"], NAMESPACE);
        let rules: Vec<(Vec<&str>, Vec<&str>, Vec<&str>)> = role["rules"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                (
                    strings(&r["resources"]),
                    strings(&r["resourceNames"]),
                    strings(&r["verbs"]),
                )
            })
            .collect();
        assert_eq!(
            rules,
            [
                (vec!["leases"], vec![], vec!["create"]),
                (vec!["leases"], vec![full.as_str()], vec!["get", "patch"]),
            ]
        );
        let binding = docs
            .iter()
            .find(|d| kind(d) == "RoleBinding" && name(d) == lease)
            .unwrap_or_else(|| panic!("no RoleBinding {lease}"));
        assert_eq!(binding["subjects"][0]["name"], full.as_str());
    }
    // The node agent runs once per node, unelected.
    let with_agent = render(&[NATS_URL, "nodeAgent.enabled=true"]);
    let agent = with_agent
        .iter()
        .find(|d| kind(d) == "DaemonSet")
        .expect("the node agent");
    assert!(
        env(
            &agent["spec"]["template"]["spec"],
            "SWITCHYARD_LEASE_NAMESPACE"
        )
        .is_none()
    );

    let single = render(&[NATS_URL, "ha.replicas=1", "ha.leaseRbac=false"]);
    for deployment in of_kind(&single, "Deployment") {
        assert_eq!(deployment["spec"]["replicas"], 1);
        assert_eq!(deployment["spec"]["strategy"]["type"], "Recreate");
        assert!(
            env(
                &deployment["spec"]["template"]["spec"],
                "SWITCHYARD_LEASE_NAMESPACE"
            )
            .is_none()
        );
    }
    assert!(!single.iter().any(|d| kind(d) == "PodDisruptionBudget"));
    assert!(!single.iter().any(|d| name(d).ends_with("-lease")));

    let refused = template(&[NATS_URL, "ha.leaseRbac=false"]);
    assert!(!refused.ok, "HA without the Lease's permission rendered");
    assert!(
        refused
            .stderr
            .contains("ha.replicas=2 needs ha.leaseRbac: the replicas are elected by a Lease"),
        "{}",
        refused.stderr
    );
    let no_time = template(&[NATS_URL, "ha.leaseDuration=10s", "ha.leaseMargin=10s"]);
    assert!(!no_time.ok);
    assert!(
        no_time.stderr.contains("ha.leaseDuration=10s, ha.leaseMargin=10s: expected a duration over 2s and a margin of at least 2s below it"),
        "{}",
        no_time.stderr
    );
}

//! The chart on real nodes, installed as docs/getting-started.md's Install
//! says: the project's image and the bundled NATS's image loaded into each
//! node's containerd, `helm install` with the bundled NATS and the node
//! agent over a fixture machine, every pod Running and Ready, `helm test`
//! passing, and `switchyard status` on the host reaching the release's NATS
//! through `kubectl port-forward` as a user would.
//!
//! The nodes are real kubelets with containerd and runc in a cluster network
//! of the test's own (kube-proxy and CoreDNS from their Go modules), so the
//! pods use in-cluster config through the `kubernetes` Service and find the
//! NATS server by its Service's name. The cluster has no volume provisioner:
//! the NATS server's claim binds a local PersistentVolume the test makes, as
//! on a cluster without a default StorageClass.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, PersistentVolume, Pod};
use kube::api::{
    Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use serde_json::json;
use switchyard_testkit::kube::{Components, ControlPlane};
use switchyard_testkit::network::{self, ClusterNetwork};
use switchyard_testkit::node::{NodeOptions, RealNode};

const NAMESPACE: &str = "switchyard-system";
const RELEASE: &str = "switchyard";
/// Every pod Running and Ready within this, from `helm install` (the bound
/// the README's Install section states).
const READY_WITHIN: Duration = Duration::from_secs(180);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf()
}

fn run(command: &mut Command) -> Output {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("run {command:?}: {e}"));
    assert!(
        out.status.success(),
        "{command:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The project's image from this test's `switchyard` binary
/// (`scripts/build-image.sh --no-build`), as a docker-archive.
fn project_image(out: &Path) -> PathBuf {
    let binary = switchyard_testkit::bins::binary("switchyard");
    let bin_dir = binary.parent().expect("the profile's folder");
    let profile = if bin_dir.ends_with("release") {
        "release"
    } else {
        "dev"
    };
    run(Command::new(repo().join("scripts/build-image.sh"))
        .args(["--profile", profile, "--no-build", "--tag", "test"])
        .arg("--bin-dir")
        .arg(bin_dir)
        .arg("--out")
        .arg(out));
    out.join("switchyard-test.tar")
}

/// The bundled NATS's image (`scripts/build-nats-image.sh`).
fn nats_image() -> PathBuf {
    let out = run(&mut Command::new(
        repo().join("scripts/build-nats-image.sh"),
    ));
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

fn kubectl() -> PathBuf {
    network::binaries_dir()
        .unwrap_or_else(|e| panic!("{e}"))
        .join("kubectl")
}

/// `kubectl port-forward` to the release's NATS Service on a free local
/// port; returns the process and the port once it forwards.
fn port_forward(kubeconfig: &Path) -> (Child, u16) {
    let mut child = Command::new(kubectl())
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(["-n", NAMESPACE, "port-forward"])
        .arg(format!("svc/{RELEASE}-nats"))
        .arg(":4222")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start kubectl port-forward");
    let mut line = String::new();
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    stdout.read_line(&mut line).expect("read kubectl");
    // It says "Handling connection" for each: keep its stdout open.
    std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
    // Forwarding from 127.0.0.1:PORT -> 4222
    let port = line
        .split("127.0.0.1:")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("kubectl port-forward said {line:?}"));
    (child, port)
}

/// Pods of the release that are not yet Running and Ready (finished hook
/// pods aside), with what they wait on.
async fn not_ready(pods: &Api<Pod>) -> Vec<String> {
    let list = pods.list(&ListParams::default()).await.expect("list pods");
    if list.items.is_empty() {
        return vec!["no pod yet".into()];
    }
    list.items
        .iter()
        .filter_map(|p| {
            let name = p.metadata.name.clone().unwrap_or_default();
            let status = p.status.clone().unwrap_or_default();
            let phase = status.phase.clone().unwrap_or_default();
            if phase == "Succeeded" {
                return None;
            }
            let ready = status
                .conditions
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            (phase != "Running" || !ready).then(|| format!("{name}: {phase}, ready {ready}"))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_install_on_real_nodes_runs_every_pod_ready_and_helm_test_passes() {
    let images = tempfile::tempdir().expect("image dir");
    let project = project_image(images.path());
    let nats = nats_image();

    let network = ClusterNetwork::new();
    let plane = ControlPlane::start_with(Components {
        scheduler: true,
        controller_manager: true,
        bind_address: Some(network.host_ip()),
        ..Components::default()
    })
    .await;
    network.start_kube_proxy(&plane);
    let options = |labels: &[(&str, &str)]| NodeOptions {
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        images: vec![ClusterNetwork::dns_image(), project.clone(), nats.clone()],
        network: Some(network.attach()),
    };
    // A GPU node of group `gpu` (spec.gpu: the device plugin's), and a worker.
    let gpu = RealNode::start_with(
        &plane,
        "gpu-1",
        options(&[
            ("node.deckhouse.io/group", "gpu"),
            ("node.deckhouse.io/gpu-stack", "device-plugin"),
        ]),
    )
    .await;
    let worker = RealNode::start_with(&plane, "worker-1", options(&[])).await;
    let client = plane.client();
    network.deploy_dns(&client).await;

    // The NATS server's volume: a local directory of worker-1, its user's.
    let data = worker.path("/var/lib/switchyard-nats");
    std::fs::create_dir_all(&data).expect("the volume's directory");
    run(Command::new("chown").arg("1000:1000").arg(&data));
    let volume: PersistentVolume = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": "nats-data"},
        "spec": {
            "capacity": {"storage": "10Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "local": {"path": "/var/lib/switchyard-nats"},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": ["worker-1"]}]}]}}
        }
    }))
    .unwrap();
    Api::<PersistentVolume>::all(client.clone())
        .create(&PostParams::default(), &volume)
        .await
        .expect("create the volume");

    // The chart's CRDs come with it; the group's NodeGroup after them.
    let kubeconfig = plane.kubeconfig();
    let helm = switchyard_testkit::helm_binary().unwrap_or_else(|e| panic!("{e}"));
    let fixture = repo().join("deploy/fixtures/h100-8x.yaml");
    let installed = Instant::now();
    let install = run(Command::new(&helm)
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(["install", RELEASE])
        .arg(repo().join("deploy/helm/switchyard"))
        .args(["-n", NAMESPACE, "--create-namespace"])
        .args(["--set", "nats.bundled.enabled=true"])
        .args(["--set", "nats.bundled.image.repository=localhost/nats"])
        .args(["--set", "nats.bundled.image.tag=2.15.2"])
        .args(["--set", "image.tag=test"])
        .args(["--set", "nodeAgent.enabled=true"])
        .args(["--set", "nodeAgent.gpuSource=fixture"])
        .arg("--set-file")
        .arg(format!("nodeAgent.fixture={}", fixture.display())));
    // NOTES: how to check it, and how to load the image where pulls fail.
    let notes = String::from_utf8_lossy(&install.stdout);
    for line in [
        "helm test switchyard -n switchyard-system",
        "ctr -n k8s.io images import switchyard-test.tar",
        "port-forward svc/switchyard-nats :4222",
    ] {
        assert!(notes.contains(line), "{line} in\n{notes}");
    }
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk("deckhouse.io", "v1", "NodeGroup"));
    let mut group = DynamicObject::new("gpu", &ar);
    group.data = json!({"spec": {"nodeType": "Static", "gpu": {"sharing": "Exclusive"}}});
    Api::<DynamicObject>::all_with(client.clone(), &ar)
        .patch(
            "gpu",
            &PatchParams::apply("switchyard-test").force(),
            &Patch::Apply(&group),
        )
        .await
        .expect("apply NodeGroup gpu");

    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let waiting = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let ready = switchyard_testkit::eventually(
        "every pod of the release Running and Ready",
        READY_WITHIN,
        || {
            let pods = pods.clone();
            let waiting = waiting.clone();
            async move {
                let left = not_ready(&pods).await;
                let done = left.is_empty();
                *waiting.lock().unwrap() = left;
                done
            }
        },
    )
    .await;
    let took = installed.elapsed();
    if let Err(e) = ready {
        let logs = [&gpu, &worker]
            .iter()
            .map(|n| n.log_tail("kubelet"))
            .collect::<Vec<_>>()
            .join("\n---\n");
        panic!("{e}: {:#?}\n--- kubelets\n{logs}", waiting.lock().unwrap());
    }
    eprintln!("helm install: every pod Ready after {took:?}");
    // The node agent runs on the GPU node only.
    let agents = pods
        .list(&ListParams::default().labels("app.kubernetes.io/component=node-agent"))
        .await
        .unwrap();
    let on: Vec<_> = agents
        .items
        .iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    assert_eq!(on, ["gpu-1"]);
    // Its cards, published from the fixture.
    let nodes: Api<Node> = Api::all(client.clone());
    switchyard_testkit::eventually("gpu-1's nvidia.com/gpu", Duration::from_secs(60), || {
        let nodes = nodes.clone();
        async move {
            nodes.get("gpu-1").await.ok().is_some_and(|n| {
                n.status
                    .and_then(|s| s.allocatable)
                    .and_then(|a| a.get("nvidia.com/gpu").cloned())
                    .is_some_and(|q| q.0 == "8")
            })
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));

    // `helm test`: `switchyard status` from the image, in the cluster.
    run(Command::new(&helm)
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(["test", RELEASE, "-n", NAMESPACE, "--timeout", "2m"]));

    // The CLI on the host, through a port-forward.
    let (mut forward, port) = port_forward(&kubeconfig);
    let status = Command::new(switchyard_testkit::bins::binary("switchyard"))
        .args(["status", "--nats-url", &format!("nats://127.0.0.1:{port}")])
        .output()
        .expect("switchyard status");
    let _ = forward.kill();
    let _ = forward.wait();
    let printed = String::from_utf8_lossy(&status.stdout);
    assert!(
        status.status.success(),
        "{printed}{}",
        String::from_utf8_lossy(&status.stderr)
    );
    assert!(printed.contains("gpu-1"), "{printed}");

    run(Command::new(&helm)
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(["uninstall", RELEASE, "-n", NAMESPACE, "--wait"]));

    // Bad input: an image no node has, and a NATS server that is not there.
    missing_image_is_named(&helm, &kubeconfig, &client).await;
    unreachable_nats_is_named(&helm, &kubeconfig, &client, [&gpu, &worker]).await;
    drop(gpu);
    drop(worker);
    drop(plane);
    drop(network);
}

/// `helm install` that does not finish (its post-install hook cannot), with
/// `sets`; helm's output.
fn install_failing(helm: &Path, kubeconfig: &Path, sets: &[&str]) -> Output {
    let mut command = Command::new(helm);
    command
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(["install", RELEASE])
        .arg(repo().join("deploy/helm/switchyard"))
        .args(["-n", NAMESPACE, "--timeout", "20s"]);
    for set in sets {
        command.args(["--set", set]);
    }
    let out = command.output().expect("helm install");
    assert!(
        !out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    out
}

fn uninstall(helm: &Path, kubeconfig: &Path) {
    run(Command::new(helm)
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(["uninstall", RELEASE, "-n", NAMESPACE, "--wait"]));
}

/// With `image.tag=missing` (no node has it, no registry serves it) the
/// pods' Events name the image they cannot pull.
async fn missing_image_is_named(helm: &Path, kubeconfig: &Path, client: &kube::Client) {
    use k8s_openapi::api::core::v1::Event;
    install_failing(
        helm,
        kubeconfig,
        &["nats.url=nats://nats.example:4222", "image.tag=missing"],
    );
    let events: Api<Event> = Api::namespaced(client.clone(), NAMESPACE);
    switchyard_testkit::eventually(
        "an Event naming the missing image",
        Duration::from_secs(60),
        || {
            let events = events.clone();
            async move {
                events.list(&ListParams::default()).await.is_ok_and(|l| {
                    l.items.iter().any(|e| {
                        e.reason.as_deref() == Some("Failed")
                            && e.message
                                .as_deref()
                                .is_some_and(|m| m.contains("localhost/switchyard:missing"))
                    })
                })
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    uninstall(helm, kubeconfig);
}

/// With a NATS URL nothing answers, the services run but are not Ready,
/// and their logs name the URL.
async fn unreachable_nats_is_named(
    helm: &Path,
    kubeconfig: &Path,
    client: &kube::Client,
    nodes: [&RealNode; 2],
) {
    const URL: &str = "nats://nats-gone.switchyard-system.svc:4222";
    install_failing(
        helm,
        kubeconfig,
        &[&format!("nats.url={URL}"), "image.tag=test"],
    );
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let selector = "app.kubernetes.io/component=class-compiler";
    let named = |pod: &Pod| {
        let name = pod.metadata.name.clone().unwrap_or_default();
        nodes.iter().any(|n| {
            n.container_log(NAMESPACE, &name, "class-compiler")
                .is_some_and(|log| log.contains(&format!("NATS at {URL}")))
        })
    };
    switchyard_testkit::eventually(
        "the class-compiler's log naming the NATS URL",
        Duration::from_secs(60),
        || {
            let pods = pods.clone();
            async move {
                pods.list(&ListParams::default().labels(selector))
                    .await
                    .is_ok_and(|l| l.items.iter().any(named))
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    let compilers = pods
        .list(&ListParams::default().labels(selector))
        .await
        .unwrap();
    let ready = compilers.items.iter().any(|p| {
        p.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
    });
    assert!(!ready, "the class-compiler is not Ready without its log");
    uninstall(helm, kubeconfig);
}

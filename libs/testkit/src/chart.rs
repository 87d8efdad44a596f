//! The chart on real nodes: a [`ChartCluster`] is a control plane with its
//! scheduler and controller manager, a [`ClusterNetwork`] with kube-proxy
//! and CoreDNS, and real nodes that have imported the project's image and
//! the bundled NATS server's image, ready for `helm install` of
//! `deploy/helm/switchyard` as docs/getting-started.md's Install says.
//! The cluster has no volume provisioner: [`ChartCluster::local_volume`]
//! makes the PersistentVolume the bundled server's claim binds.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, PersistentVolume, Pod};
use kube::ResourceExt;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;

use crate::kube::ControlPlane;
use crate::network::{self, ClusterNetwork};
use crate::node::{NodeOptions, RealNode};

pub const NAMESPACE: &str = "switchyard-system";
pub const RELEASE: &str = "switchyard";
/// The tag [`project_image`] gives the image.
pub const IMAGE_TAG: &str = "test";

/// The project's image `localhost/switchyard:test` packed by
/// `scripts/build-image.sh --no-build` into `out`: from the `switchyard` and
/// `switchyard-node-agent` binaries in `bin_dir`, or with `None` from the
/// image and node-agent profiles' folders (as the image ships). The
/// docker-archive's path.
pub fn project_image(bin_dir: Option<&Path>, out: &Path) -> PathBuf {
    project_image_tagged(bin_dir, out, IMAGE_TAG)
}

/// [`project_image`] tagged `localhost/switchyard:TAG`.
pub fn project_image_tagged(bin_dir: Option<&Path>, out: &Path, tag: &str) -> PathBuf {
    let mut command = Command::new(crate::repo_root().join("scripts/build-image.sh"));
    command.args(["--no-build", "--tag", tag]);
    if let Some(bin_dir) = bin_dir {
        let profile = match bin_dir.file_name().and_then(|n| n.to_str()) {
            Some("release") => "release",
            _ => "dev",
        };
        command
            .args(["--profile", profile])
            .arg("--bin-dir")
            .arg(bin_dir);
    }
    crate::run(command.arg("--out").arg(out));
    out.join(format!("switchyard-{tag}.tar"))
}

/// The bundled NATS server's image (`scripts/build-nats-image.sh`).
pub fn nats_image() -> PathBuf {
    let out = crate::run(&mut Command::new(
        crate::repo_root().join("scripts/build-nats-image.sh"),
    ));
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// The `helm install` arguments of the trial on nodes without GPUs, as the
/// Install section gives them: the bundled NATS from the image
/// `scripts/build-nats-image.sh` packs, the project's image [`IMAGE_TAG`],
/// and the node agent over the fixture machine `fixture`.
pub fn trial_values(fixture: &Path) -> Vec<String> {
    [
        "nats.bundled.enabled=true",
        "nats.bundled.image.repository=localhost/nats",
        "nats.bundled.image.tag=2.15.2",
        "image.tag=test",
        "nodeAgent.enabled=true",
        "nodeAgent.gpuSource=fixture",
    ]
    .iter()
    .flat_map(|set| ["--set".to_string(), set.to_string()])
    .chain([
        "--set-file".to_string(),
        format!("nodeAgent.fixture={}", fixture.display()),
    ])
    .collect()
}

/// A node to start: its name and labels.
#[derive(Clone, Copy, Debug)]
pub struct NodeSpec<'a> {
    pub name: &'a str,
    pub labels: &'a [(&'a str, &'a str)],
}

/// The trial's nodes: a GPU node of group `gpu` (whose NodeGroup has
/// `spec.gpu`, so the device plugin's: the node agent runs there), and a
/// worker.
pub const TRIAL_NODES: [NodeSpec<'static>; 2] = [
    NodeSpec {
        name: "gpu-1",
        labels: &[
            ("node.deckhouse.io/group", "gpu"),
            ("node.deckhouse.io/gpu-stack", "device-plugin"),
        ],
    },
    NodeSpec {
        name: "worker-1",
        labels: &[],
    },
];

/// The cluster, its network and its nodes. Dropped in that order's reverse.
pub struct ChartCluster {
    // Field order is drop order: nodes before the plane, the plane before
    // the network whose address it listens on.
    pub nodes: Vec<RealNode>,
    pub plane: ControlPlane,
    pub network: ClusterNetwork,
    /// How long each node took to import the images, by node.
    pub imports: BTreeMap<String, Duration>,
}

impl ChartCluster {
    /// The pods of `namespace`, where they are (why not scheduled); the GPU
    /// nodes' group, stack and cards; the node agents, ready or not, with
    /// their logs' tails; the cluster's warnings: for a failure's message.
    pub async fn pods_where(&self, namespace: &str) -> String {
        let cluster = self;
        let c = &cluster.plane.client();
        let pods = Api::<Pod>::namespaced(c.clone(), namespace)
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        let mut lines: Vec<String> = pods
            .iter()
            .map(|p| {
                let status = p.status.as_ref();
                let unscheduled = status
                    .and_then(|s| s.conditions.as_ref())
                    .and_then(|c| {
                        c.iter()
                            .find(|c| c.type_ == "PodScheduled" && c.status == "False")
                    })
                    .and_then(|c| c.message.clone())
                    .unwrap_or_default();
                format!(
                    "{} on {:?}: {:?} {unscheduled}",
                    p.name_any(),
                    p.spec.as_ref().and_then(|s| s.node_name.clone()),
                    status.and_then(|s| s.phase.clone()),
                )
            })
            .collect();
        for node in Api::<Node>::all(c.clone())
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default()
            .iter()
            .filter(|n| n.name_any().starts_with("gpu-"))
        {
            let labels = node.labels();
            let gpus = node
                .status
                .as_ref()
                .and_then(|s| s.allocatable.as_ref())
                .and_then(|a| a.get("nvidia.com/gpu"))
                .map(|q| q.0.clone());
            lines.push(format!(
            "node {}: group {:?}, stack {:?}, setup {:?}, nvidia.com/gpu {gpus:?}, unschedulable {:?}",
            node.name_any(),
            labels.get("node.deckhouse.io/group"),
            labels.get(crate::migration::STACK),
            labels.get(crate::migration::SETUP),
            node.spec.as_ref().and_then(|s| s.unschedulable),
        ));
        }
        let agents = Api::<Pod>::namespaced(c.clone(), NAMESPACE)
            .list(&ListParams::default().labels("app.kubernetes.io/component=node-agent"))
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        for agent in agents {
            let node = agent.spec.as_ref().and_then(|s| s.node_name.clone());
            lines.push(format!(
                "agent {} on {node:?}: {:?}, ready {}",
                agent.name_any(),
                agent.status.as_ref().and_then(|s| s.phase.clone()),
                agent.metadata.deletion_timestamp.is_none() && pod_ready(&agent)
            ));
            if let Some(log) = node.filter(|n| n.starts_with("gpu-")).and_then(|n| {
                cluster
                    .node(&n)
                    .container_log(NAMESPACE, &agent.name_any(), "node-agent")
            }) {
                let tail: Vec<&str> = log.lines().rev().take(25).collect();
                lines.extend(tail.into_iter().rev().map(|l| format!("    {l}")));
            }
        }
        let events = Api::<k8s_openapi::api::events::v1::Event>::all(c.clone())
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .unwrap_or_default();
        for e in events
            .iter()
            .filter(|e| e.type_.as_deref() == Some("Warning"))
        {
            lines.push(format!(
                "event {:?} on {:?}: {:?}",
                e.reason,
                e.regarding.as_ref().and_then(|r| r.name.clone()),
                e.note
            ));
        }
        lines.join("\n")
    }

    /// The plane, the network with kube-proxy, `nodes` with CoreDNS's, the
    /// project's (`project`) and NATS's images imported, and CoreDNS Ready.
    pub async fn start(project: &Path, nodes: &[NodeSpec<'_>]) -> ChartCluster {
        let nats = nats_image();
        let network = ClusterNetwork::new();
        let plane = network.start_plane().await;
        let mut started = Vec::new();
        let mut imports = BTreeMap::new();
        for spec in nodes {
            let node = RealNode::start_with(
                &plane,
                spec.name,
                NodeOptions {
                    labels: spec
                        .labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                    images: vec![ClusterNetwork::dns_image()],
                    network: Some(network.attach()),
                },
            )
            .await;
            let t0 = Instant::now();
            node.import(project);
            node.import(&nats);
            imports.insert(spec.name.to_string(), t0.elapsed());
            started.push(node);
        }
        network.deploy_dns(&plane.client()).await;
        ChartCluster {
            nodes: started,
            plane,
            network,
            imports,
        }
    }

    /// `archive` imported on every node.
    pub fn import_everywhere(&self, archive: &Path) {
        for node in &self.nodes {
            node.import(archive);
        }
    }

    /// The node named `name`.
    pub fn node(&self, name: &str) -> &RealNode {
        self.nodes
            .iter()
            .find(|n| n.name() == name)
            .unwrap_or_else(|| panic!("no node {name}"))
    }

    /// A local PersistentVolume of 10 GiB on `node`, a directory owned by
    /// `uid` (the bundled NATS server's user is 1000): what the server's
    /// claim binds on a cluster without a default StorageClass.
    pub async fn local_volume(&self, node: &str, uid: u32) {
        let inside = "/var/lib/switchyard-volume";
        let data = self.node(node).path(inside);
        std::fs::create_dir_all(&data).expect("the volume's directory");
        crate::run(Command::new("chown").arg(format!("{uid}:{uid}")).arg(&data));
        let volume: PersistentVolume = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": format!("local-{node}")},
            "spec": {
                "capacity": {"storage": "10Gi"},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Retain",
                "local": {"path": inside},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": [node]}]}]}}
            }
        }))
        .unwrap();
        Api::<PersistentVolume>::all(self.plane.client())
            .create(&PostParams::default(), &volume)
            .await
            .expect("create the volume");
    }

    /// The NodeGroup `name` (the chart's CRD must be in), with `spec.gpu`
    /// when `gpu` (its nodes are the device plugin's).
    pub async fn node_group(&self, name: &str, gpu: bool) {
        use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
        let ar = ApiResource::from_gvk(&GroupVersionKind::gvk("deckhouse.io", "v1", "NodeGroup"));
        let mut group = DynamicObject::new(name, &ar);
        group.data = if gpu {
            json!({"spec": {"nodeType": "Static", "gpu": {"sharing": "Exclusive"}}})
        } else {
            json!({"spec": {"nodeType": "Static"}})
        };
        Api::<DynamicObject>::all_with(self.plane.client(), &ar)
            .patch(
                name,
                &PatchParams::apply("switchyard-testkit").force(),
                &Patch::Apply(&group),
            )
            .await
            .unwrap_or_else(|e| panic!("apply NodeGroup {name}: {e}"));
    }

    /// `helm` with the plane's kubeconfig.
    pub fn helm(&self) -> Command {
        let helm = crate::helm_binary().unwrap_or_else(|e| panic!("{e}"));
        let mut command = Command::new(helm);
        command.arg(format!(
            "--kubeconfig={}",
            self.plane.kubeconfig().display()
        ));
        command
    }

    /// `helm install` of the chart as [`RELEASE`] in [`NAMESPACE`] with
    /// `args` (`--set ...`); helm's output, which must be a success.
    pub fn install(&self, args: &[&str]) -> Output {
        crate::run(
            self.helm()
                .args(["install", RELEASE])
                .arg(crate::repo_root().join("deploy/helm/switchyard"))
                .args(["-n", NAMESPACE, "--create-namespace"])
                .args(args),
        )
    }

    /// `helm uninstall` of [`RELEASE`] with `args` (`--no-hooks` for a
    /// release whose pre-delete guard cannot run: one that never reached its
    /// image or its NATS), then until its pods are gone (helm waits for its
    /// objects, not for their pods).
    pub async fn uninstall(&self, args: &[&str]) {
        crate::run(
            self.helm()
                .args(["uninstall", RELEASE, "-n", NAMESPACE, "--wait"])
                .args(args),
        );
        let pods: Api<Pod> = Api::namespaced(self.plane.client(), NAMESPACE);
        crate::eventually("the release's pods gone", Duration::from_secs(120), || {
            let pods = pods.clone();
            async move {
                pods.list(&ListParams::default())
                    .await
                    .is_ok_and(|l| l.items.is_empty())
            }
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    }

    /// `kubectl` with the plane's kubeconfig.
    pub fn kubectl(&self) -> Command {
        let kubectl = network::binaries_dir()
            .unwrap_or_else(|e| panic!("{e}"))
            .join("kubectl");
        let mut command = Command::new(kubectl);
        command.arg(format!(
            "--kubeconfig={}",
            self.plane.kubeconfig().display()
        ));
        command
    }

    /// Waits until every pod of [`NAMESPACE`] is Running and Ready (pods
    /// that finished aside), `within`; how long it took, or what still
    /// waits.
    pub async fn until_ready(&self, within: Duration) -> Result<Duration, String> {
        let pods: Api<Pod> = Api::namespaced(self.plane.client(), NAMESPACE);
        let started = Instant::now();
        let waiting = std::sync::Mutex::new(Vec::new());
        crate::eventually("every pod Running and Ready", within, || async {
            let left = not_ready(&pods).await;
            let done = left.is_empty();
            *waiting.lock().unwrap() = left;
            done
        })
        .await
        .map(|()| started.elapsed())
        .map_err(|e| format!("{e}: {:#?}", waiting.lock().unwrap()))
    }

    /// `kubectl port-forward` to the release's bundled NATS on a free local
    /// port, as a user reaches it: the process (kill it when done) and the
    /// port.
    pub fn port_forward_nats(&self) -> (Child, u16) {
        let mut child = self
            .kubectl()
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
}

/// A pod's processes' memory from `/proc`: resident (code included, however
/// many pods share its pages) and anonymous, bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessMemory {
    pub resident: u64,
    pub anonymous: u64,
}

impl ChartCluster {
    /// Each running pod's processes' memory in [`NAMESPACE`], by pod name:
    /// the processes whose memory cgroup is the pod's (`pod<uid>`), summed.
    /// Each process's own resident set counts, shared code included
    /// (a memory cgroup charges a shared page to one pod only).
    pub async fn pod_processes_memory(&self) -> BTreeMap<String, ProcessMemory> {
        let pods: Api<Pod> = Api::namespaced(self.plane.client(), NAMESPACE);
        let uids: Vec<(String, String)> = pods
            .list(&ListParams::default())
            .await
            .expect("list pods")
            .items
            .into_iter()
            .filter_map(|p| Some((format!("pod{}", p.metadata.uid?), p.metadata.name?)))
            .collect();
        let mut memory = BTreeMap::new();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let dir = entry.path();
            let Ok(cgroups) = std::fs::read_to_string(dir.join("cgroup")) else {
                continue;
            };
            let Some(line) = cgroups.lines().find(|l| l.contains(":memory:")) else {
                continue;
            };
            let Some((_, name)) = uids.iter().find(|(uid, _)| line.contains(uid.as_str())) else {
                continue;
            };
            let status = std::fs::read_to_string(dir.join("status")).unwrap_or_default();
            let kib = |key: &str| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(key))
                    .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
                    .unwrap_or(0)
                    * 1024
            };
            let total: &mut ProcessMemory = memory.entry(name.clone()).or_default();
            total.resident += kib("VmRSS:");
            total.anonymous += kib("RssAnon:");
        }
        memory
    }
}

/// Whether `pod`'s Ready condition is True.
pub fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Pods that are not yet Running and Ready (finished ones aside), with
/// their phase; "no pod yet" before the first.
pub async fn not_ready(pods: &Api<Pod>) -> Vec<String> {
    let list = pods.list(&ListParams::default()).await.expect("list pods");
    if list.items.is_empty() {
        return vec!["no pod yet".into()];
    }
    list.items
        .iter()
        .filter_map(|p| {
            let name = p.metadata.name.clone().unwrap_or_default();
            let phase = p
                .status
                .as_ref()
                .and_then(|s| s.phase.clone())
                .unwrap_or_default();
            if phase == "Succeeded" {
                return None;
            }
            let ready = pod_ready(p);
            (phase != "Running" || !ready).then(|| format!("{name}: {phase}, ready {ready}"))
        })
        .collect()
}

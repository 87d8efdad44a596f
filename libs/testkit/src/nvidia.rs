//! NVIDIA's device plugin v0.17.4 and GPU Feature Discovery (GFD, the same
//! image) on [`RealNode`]s, over the mock NVML: the image
//! `scripts/install-nvidia-device-plugin.sh` builds from the Go module, run
//! as DaemonSet pods, with switchyard's mock `libnvidia-ml.so.1` mounted
//! where their loader finds it and the fixture and fault file beside it.
//! The stack Switchyard hands nodes to and from, on the same cards the node
//! agent reads, and the labels GPU Feature Discovery gives them.
//!
//! A runner's mock files are in a temporary directory of the host's: a node
//! binds only its own `/var/lib`, `/var/log` and `/run`, so a pod's hostPath
//! there names the same files on every node (one DaemonSet serves them all).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::apps::v1::DaemonSet;
use kube::api::{Api, PostParams};
use serde_json::json;

use crate::node::RealNode;

pub const PLUGIN_IMAGE: &str = "localhost/nvidia-device-plugin:v0.17.4";
/// The namespace and pod label of a device plugin pinned to one node
/// ([`PluginDaemonSet::pinned`]).
pub const PLUGIN_NAMESPACE: &str = "kube-system";
pub const PLUGIN_LABEL: (&str, &str) = ("app", "nvidia-device-plugin");
pub const PLUGIN_CONTAINER: &str = "nvidia-device-plugin-ctr";
/// The GPU Operator's device-plugin DaemonSet: its namespace, its name, its
/// pods' label and the deploy label it selects nodes by.
pub const OPERATOR_NAMESPACE: &str = "gpu-operator";
pub const OPERATOR_PLUGIN_DAEMONSET: &str = "nvidia-device-plugin-daemonset";
pub const OPERATOR_PLUGIN_LABEL: (&str, &str) = ("app", "nvidia-device-plugin-daemonset");
pub const DEPLOY_DEVICE_PLUGIN: &str = "nvidia.com/gpu.deploy.device-plugin";
/// GPU Feature Discovery's pods (`gpu-feature-discovery-<node>`), as
/// NVIDIA's chart labels them.
pub const GFD_NAMESPACE: &str = "kube-system";
pub const GFD_LABEL: (&str, &str) = ("app.kubernetes.io/name", "gpu-feature-discovery");
pub const GFD_CONTAINER: &str = "gpu-feature-discovery";
/// The mock's soname and its environment (as `switchyard_nvml_mock` names them).
const SONAME: &str = "libnvidia-ml.so.1";
const MACHINE_ENV: &str = "SWITCHYARD_NVML_MOCK_MACHINE";
const FAULTS_ENV: &str = "SWITCHYARD_NVML_MOCK_FAULTS";
/// Where the containers find the fixture and the fault file.
const MOCK_MACHINE: &str = "/etc/switchyard-nvml-mock/machine.yaml";
const MOCK_FAULTS: &str = "/etc/switchyard-nvml-mock/faults";
/// Where GFD writes its labels in its container (its default output, which
/// NFD's worker reads as a local feature source), and the node's directory
/// mounted there. NVIDIA's chart mounts the host's
/// `/etc/kubernetes/node-feature-discovery/features.d`; a test node's `/etc`
/// is the host's, so the node's own `/var/lib` holds it instead.
const FEATURES_D: &str = "/etc/kubernetes/node-feature-discovery/features.d";
const NODE_FEATURES_D: &str = "/var/lib/node-feature-discovery/features.d";
/// GFD's file in `features.d`.
const GFD_FILE: &str = "gfd";

/// The plugin's image archive, built (or found in the cache) by
/// `scripts/install-nvidia-device-plugin.sh`.
pub fn plugin_archive() -> PathBuf {
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/install-nvidia-device-plugin.sh");
    let out = std::process::Command::new(&script)
        .stderr(std::process::Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "scripts/install-nvidia-device-plugin.sh failed (it needs Go, gcc, umoci and skopeo)"
    );
    let dir = String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("nvidia device plugin image in "))
        .map(PathBuf::from)
        .expect("scripts/install-nvidia-device-plugin.sh names its directory");
    let archive = dir.join("nvidia-device-plugin.tar");
    assert!(archive.is_file(), "{} is missing", archive.display());
    archive
}

/// Imports the image into `node` unless the node has it (the device plugin
/// and GFD share it).
fn import_image(node: &RealNode) {
    if node.crictl(&["inspecti", "-q", PLUGIN_IMAGE]).is_err() {
        node.import(&plugin_archive());
    }
}

/// The mock NVML's files as a pod mounts them: a copy of the mock library
/// (so that a rebuild does not change it under a pod), a copy of the
/// fixture, a fault file and a PCI device directory per card of the fixture
/// as sysfs shows it (what GFD reads beside NVML); removed when dropped.
struct MockFiles {
    dir: tempfile::TempDir,
}

impl MockFiles {
    fn new(library: &Path, fixture: &Path) -> MockFiles {
        assert!(
            library.is_file(),
            "{} is missing: cargo builds switchyard-nvml-mock's cdylib",
            library.display()
        );
        let dir = tempfile::tempdir().expect("the mock's files");
        for bound in ["/var/lib", "/var/log", "/run", "/var/run"] {
            assert!(
                !dir.path().starts_with(bound),
                "{} is under {bound}, which a node binds to its own: set TMPDIR elsewhere",
                dir.path().display()
            );
        }
        let cards = switchyard_gpu::Fixture::load(fixture)
            .and_then(|f| switchyard_gpu::GpuSource::machine(&f))
            .unwrap_or_else(|e| panic!("the fixture {}: {e}", fixture.display()))
            .gpus;
        for card in &cards {
            write_pci_device(&dir.path().join("pci-devices"), &card.pci_bus_id);
        }
        std::fs::copy(library, dir.path().join(SONAME)).expect("copy the mock NVML");
        std::fs::copy(fixture, dir.path().join("machine.yaml")).expect("copy the fixture");
        std::fs::write(dir.path().join("faults"), "").expect("the fault file");
        MockFiles { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The volumes of the library, the fixture and the fault file, and
    /// where a container mounts them (read-only).
    fn volumes(&self) -> (Vec<serde_json::Value>, Vec<serde_json::Value>) {
        let mounts = vec![
            json!({"name": "nvml", "mountPath": format!("/usr/lib/x86_64-linux-gnu/{SONAME}"), "readOnly": true}),
            json!({"name": "machine", "mountPath": MOCK_MACHINE, "readOnly": true}),
            json!({"name": "faults", "mountPath": MOCK_FAULTS, "readOnly": true}),
        ];
        let volumes = vec![
            json!({"name": "nvml", "hostPath": {"path": self.path(SONAME), "type": "File"}}),
            json!({"name": "machine", "hostPath": {"path": self.path("machine.yaml"), "type": "File"}}),
            json!({"name": "faults", "hostPath": {"path": self.path("faults"), "type": "File"}}),
        ];
        (mounts, volumes)
    }

    /// Appends a fault line (`xid <uuid> <n>`, `ecc <uuid>`, `lost <uuid>`);
    /// each process that loaded the mock reads what was appended.
    fn inject(&self, line: &str) {
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(self.path("faults"))
            .expect("the fault file");
        writeln!(file, "{line}").expect("write a fault");
    }
}

/// A card's directory in a fake `/sys/bus/pci/devices`: an NVIDIA 3D
/// controller (the class GFD's `gpu.mode` label reads) with a 256-byte
/// configuration space without capabilities (no vGPU), on no NUMA node, its
/// BARs unassigned. The device id is an H100 SXM5's; GFD names the product
/// from NVML. sysfs names it by NVML's bus id with a 4-digit domain.
fn write_pci_device(root: &Path, nvml_bus_id: &str) {
    let (domain, rest) = nvml_bus_id
        .split_once(':')
        .unwrap_or_else(|| panic!("pciBusId {nvml_bus_id:?} has no domain"));
    let domain = u32::from_str_radix(domain, 16)
        .unwrap_or_else(|e| panic!("pciBusId {nvml_bus_id:?}: domain: {e}"));
    let dir = root.join(format!("{domain:04x}:{}", rest.to_ascii_lowercase()));
    std::fs::create_dir_all(&dir).expect("a PCI device directory");
    for (file, text) in [
        ("vendor", "0x10de\n"),
        ("device", "0x2330\n"),
        ("class", "0x030200\n"),
        ("numa_node", "-1\n"),
        (
            "resource",
            "0x0000000000000000 0x0000000000000000 0x0000000000000000\n",
        ),
    ] {
        std::fs::write(dir.join(file), text).expect("a PCI device file");
    }
    std::fs::write(dir.join("config"), [0u8; 256]).expect("a PCI configuration space");
}

/// The mock's environment in a container.
fn mock_env() -> serde_json::Value {
    json!([
        {"name": MACHINE_ENV, "value": MOCK_MACHINE},
        {"name": FAULTS_ENV, "value": MOCK_FAULTS}
    ])
}

/// How the device plugin's DaemonSet is rendered: its namespace and name,
/// its pods' labels (its selector too) and the node labels it selects.
#[derive(Clone, Debug)]
pub struct PluginDaemonSet {
    pub namespace: String,
    pub name: String,
    pub pod_labels: BTreeMap<String, String>,
    pub node_selector: BTreeMap<String, String>,
}

impl PluginDaemonSet {
    /// Pinned to one node: `nvidia-device-plugin-<node>` in kube-system,
    /// pods labelled [`PLUGIN_LABEL`] and `node=<node>`.
    pub fn pinned(node: &str) -> PluginDaemonSet {
        let (key, value) = PLUGIN_LABEL;
        PluginDaemonSet {
            namespace: PLUGIN_NAMESPACE.into(),
            name: format!("nvidia-device-plugin-{node}"),
            pod_labels: [(key, value), ("node", node)]
                .into_iter()
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
            node_selector: [("kubernetes.io/hostname".into(), node.into())].into(),
        }
    }

    /// As the GPU Operator renders it: [`OPERATOR_PLUGIN_DAEMONSET`] in
    /// [`OPERATOR_NAMESPACE`] (which must exist), pods labelled
    /// [`OPERATOR_PLUGIN_LABEL`], on the nodes whose
    /// `nvidia.com/gpu.deploy.device-plugin` reads `true`.
    pub fn gpu_operator() -> PluginDaemonSet {
        let (key, value) = OPERATOR_PLUGIN_LABEL;
        PluginDaemonSet {
            namespace: OPERATOR_NAMESPACE.into(),
            name: OPERATOR_PLUGIN_DAEMONSET.into(),
            pod_labels: [(key.into(), value.into())].into(),
            node_selector: [(DEPLOY_DEVICE_PLUGIN.into(), "true".into())].into(),
        }
    }
}

/// NVIDIA's device plugin's DaemonSet, and the files its pods mount (kept
/// until dropped, after the nodes' pods if declared before the nodes).
pub struct DevicePlugin {
    files: MockFiles,
}

impl DevicePlugin {
    /// Imports the plugin's image into `node` and creates its DaemonSet
    /// pinned to the node ([`PluginDaemonSet::pinned`]), on a copy of the
    /// mock `library` (so that a rebuild does not change it under the pod)
    /// and of the `fixture`, with an empty fault file. NVML discovery
    /// without platform detection, NVIDIA_VISIBLE_DEVICES as the device
    /// list, a failed NVML init fatal.
    pub async fn start(
        client: &kube::Client,
        node: &RealNode,
        library: &Path,
        fixture: &Path,
    ) -> DevicePlugin {
        let daemon_set = PluginDaemonSet::pinned(node.name());
        DevicePlugin::start_as(client, &[node], library, fixture, &daemon_set).await
    }

    /// [`DevicePlugin::start`] with the image imported into each of `nodes`
    /// and the DaemonSet rendered as `daemon_set` says: its pods run on
    /// whichever nodes it selects, as its selector comes to match them, all
    /// on the same mock files.
    pub async fn start_as(
        client: &kube::Client,
        nodes: &[&RealNode],
        library: &Path,
        fixture: &Path,
        daemon_set: &PluginDaemonSet,
    ) -> DevicePlugin {
        for node in nodes {
            import_image(node);
        }
        let files = MockFiles::new(library, fixture);
        let (mut mounts, mut volumes) = files.volumes();
        mounts.push(
            json!({"name": "device-plugins", "mountPath": "/var/lib/kubelet/device-plugins"}),
        );
        volumes.push(json!(
            {"name": "device-plugins", "hostPath": {"path": "/var/lib/kubelet/device-plugins", "type": "Directory"}}
        ));
        let ds: DaemonSet = serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": daemon_set.name, "namespace": daemon_set.namespace},
            "spec": {
                "selector": {"matchLabels": daemon_set.pod_labels},
                "template": {
                    "metadata": {"labels": daemon_set.pod_labels},
                    "spec": {
                        "hostNetwork": true,
                        "terminationGracePeriodSeconds": 1,
                        "nodeSelector": daemon_set.node_selector,
                        "tolerations": [{"operator": "Exists"}],
                        "containers": [{
                            "name": PLUGIN_CONTAINER,
                            "image": PLUGIN_IMAGE,
                            "imagePullPolicy": "Never",
                            "args": [
                                "--device-discovery-strategy=nvml",
                                "--device-list-strategy=envvar",
                                "--fail-on-init-error=true"
                            ],
                            "env": mock_env(),
                            "volumeMounts": mounts
                        }],
                        "volumes": volumes
                    }
                }
            }
        }))
        .expect("the plugin's DaemonSet");
        Api::<DaemonSet>::namespaced(client.clone(), &daemon_set.namespace)
            .create(&PostParams::default(), &ds)
            .await
            .unwrap_or_else(|e| {
                panic!(
                    "create the plugin's DaemonSet {}/{}: {e}",
                    daemon_set.namespace, daemon_set.name
                )
            });
        DevicePlugin { files }
    }

    /// Appends a fault line (`xid <uuid> <n>`, `ecc <uuid>`, `lost <uuid>`);
    /// the plugin's NVML reads what was appended (on every node it runs on).
    pub fn inject(&self, line: &str) {
        self.files.inject(line);
    }
}

/// GPU Feature Discovery on one node: its DaemonSet
/// `gpu-feature-discovery-<node>` in kube-system pinned to the node, the
/// files its pod mounts (kept until the last clone is dropped) and where
/// its labels are written on the node.
#[derive(Clone)]
pub struct FeatureDiscovery {
    node: String,
    /// GFD's file, as the host reaches it.
    output: PathBuf,
    _files: Arc<MockFiles>,
}

impl FeatureDiscovery {
    /// Imports the image into `node` and creates GFD's DaemonSet pinned to
    /// the node, on a copy of the mock `library` and of the `fixture`, with
    /// an empty fault file and the fixture's cards as
    /// `/sys/bus/pci/devices`: NVML discovery, no MIG strategy, no
    /// timestamp label, no machine type file, a failed NVML init fatal, its
    /// labels written again every minute. GFD writes `key=value` lines for
    /// NFD's worker to read; it never labels the Node itself.
    pub async fn start(
        client: &kube::Client,
        node: &RealNode,
        library: &Path,
        fixture: &Path,
    ) -> FeatureDiscovery {
        import_image(node);
        let files = MockFiles::new(library, fixture);
        let (mut mounts, mut volumes) = files.volumes();
        mounts.extend([
            json!({"name": "pci-devices", "mountPath": "/sys/bus/pci/devices", "readOnly": true}),
            json!({"name": "output-dir", "mountPath": FEATURES_D}),
        ]);
        volumes.extend([
            json!({"name": "pci-devices", "hostPath": {"path": files.path("pci-devices"), "type": "Directory"}}),
            json!({"name": "output-dir", "hostPath": {"path": NODE_FEATURES_D, "type": "DirectoryOrCreate"}}),
        ]);
        let mut env = mock_env();
        env.as_array_mut().expect("env").push(
            json!({"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}),
        );
        let (key, value) = GFD_LABEL;
        let ds: DaemonSet = serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": format!("gpu-feature-discovery-{}", node.name()), "namespace": GFD_NAMESPACE},
            "spec": {
                "selector": {"matchLabels": {key: value, "node": node.name()}},
                "template": {
                    "metadata": {"labels": {key: value, "node": node.name()}},
                    "spec": {
                        "hostNetwork": true,
                        "terminationGracePeriodSeconds": 1,
                        "nodeSelector": {"kubernetes.io/hostname": node.name()},
                        "tolerations": [{"operator": "Exists"}],
                        "containers": [{
                            "name": GFD_CONTAINER,
                            "image": PLUGIN_IMAGE,
                            "imagePullPolicy": "Never",
                            "command": ["/usr/bin/gpu-feature-discovery"],
                            "args": [
                                "--device-discovery-strategy=nvml",
                                "--fail-on-init-error=true",
                                "--mig-strategy=none",
                                "--no-timestamp",
                                "--machine-type-file=",
                                "--sleep-interval=60s"
                            ],
                            "env": env,
                            "volumeMounts": mounts
                        }],
                        "volumes": volumes
                    }
                }
            }
        }))
        .expect("GFD's DaemonSet");
        Api::<DaemonSet>::namespaced(client.clone(), GFD_NAMESPACE)
            .create(&PostParams::default(), &ds)
            .await
            .expect("create GFD's DaemonSet");
        FeatureDiscovery {
            node: node.name().to_string(),
            output: node.path(&format!("{NODE_FEATURES_D}/{GFD_FILE}")),
            _files: Arc::new(files),
        }
    }

    /// The node GFD runs on.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// GFD's labels as written on the node (its `features.d/gfd`), once it
    /// has written them.
    pub fn labels(&self) -> Option<BTreeMap<String, String>> {
        let text = std::fs::read_to_string(&self.output).ok()?;
        let labels: BTreeMap<String, String> = text
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect();
        (!labels.is_empty()).then_some(labels)
    }
}

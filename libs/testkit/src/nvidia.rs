//! NVIDIA's device plugin v0.17.4 on a [`RealNode`], over the mock NVML:
//! the image `scripts/install-nvidia-device-plugin.sh` builds from the Go
//! module, run as a DaemonSet pod pinned to the node, with switchyard's mock
//! `libnvidia-ml.so.1` mounted where the plugin's loader finds it and the
//! fixture and fault file beside it. The stack Switchyard hands nodes to
//! and from, on the same cards the node agent reads.

use std::io::Write;
use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::DaemonSet;
use kube::api::{Api, PostParams};
use serde_json::json;

use crate::node::RealNode;

pub const PLUGIN_IMAGE: &str = "localhost/nvidia-device-plugin:v0.17.4";
pub const PLUGIN_NAMESPACE: &str = "kube-system";
pub const PLUGIN_LABEL: (&str, &str) = ("app", "nvidia-device-plugin");
pub const PLUGIN_CONTAINER: &str = "nvidia-device-plugin-ctr";
/// The mock's soname and its environment (as `switchyard_nvml_mock` names them).
const SONAME: &str = "libnvidia-ml.so.1";
const MACHINE_ENV: &str = "SWITCHYARD_NVML_MOCK_MACHINE";
const FAULTS_ENV: &str = "SWITCHYARD_NVML_MOCK_FAULTS";
/// Where the plugin's container finds the fixture and the fault file.
const MOCK_MACHINE: &str = "/etc/switchyard-nvml-mock/machine.yaml";
const MOCK_FAULTS: &str = "/etc/switchyard-nvml-mock/faults";

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

/// NVIDIA's device plugin running on one node, and the files its pod mounts
/// (kept until dropped, after the node's pods).
pub struct DevicePlugin {
    dir: tempfile::TempDir,
}

impl DevicePlugin {
    /// Imports the plugin's image into `node` and creates its DaemonSet
    /// (`nvidia-device-plugin-<node>` in kube-system, pinned to the node),
    /// on a copy of the mock `library` (so that a rebuild does not change
    /// it under the pod) and of the `fixture`, with an empty fault file.
    /// NVML discovery without platform detection, NVIDIA_VISIBLE_DEVICES as
    /// the device list, a failed NVML init fatal.
    pub async fn start(
        client: &kube::Client,
        node: &RealNode,
        library: &Path,
        fixture: &Path,
    ) -> DevicePlugin {
        assert!(
            library.is_file(),
            "{} is missing: cargo builds switchyard-nvml-mock's cdylib",
            library.display()
        );
        node.import(&plugin_archive());
        let dir = tempfile::tempdir().expect("the plugin's files");
        let (lib, machine, faults) = (
            dir.path().join(SONAME),
            dir.path().join("machine.yaml"),
            dir.path().join("faults"),
        );
        std::fs::copy(library, &lib).expect("copy the mock NVML");
        std::fs::copy(fixture, &machine).expect("copy the fixture");
        std::fs::write(&faults, "").expect("the fault file");
        let (key, value) = PLUGIN_LABEL;
        let ds: DaemonSet = serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": format!("nvidia-device-plugin-{}", node.name()), "namespace": PLUGIN_NAMESPACE},
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
                            "name": PLUGIN_CONTAINER,
                            "image": PLUGIN_IMAGE,
                            "imagePullPolicy": "Never",
                            "args": [
                                "--device-discovery-strategy=nvml",
                                "--device-list-strategy=envvar",
                                "--fail-on-init-error=true"
                            ],
                            "env": [
                                {"name": MACHINE_ENV, "value": MOCK_MACHINE},
                                {"name": FAULTS_ENV, "value": MOCK_FAULTS}
                            ],
                            "volumeMounts": [
                                {"name": "device-plugins", "mountPath": "/var/lib/kubelet/device-plugins"},
                                {"name": "nvml", "mountPath": format!("/usr/lib/x86_64-linux-gnu/{SONAME}"), "readOnly": true},
                                {"name": "machine", "mountPath": MOCK_MACHINE, "readOnly": true},
                                {"name": "faults", "mountPath": MOCK_FAULTS, "readOnly": true}
                            ]
                        }],
                        "volumes": [
                            {"name": "device-plugins", "hostPath": {"path": "/var/lib/kubelet/device-plugins", "type": "Directory"}},
                            {"name": "nvml", "hostPath": {"path": lib, "type": "File"}},
                            {"name": "machine", "hostPath": {"path": machine, "type": "File"}},
                            {"name": "faults", "hostPath": {"path": faults, "type": "File"}}
                        ]
                    }
                }
            }
        }))
        .expect("the plugin's DaemonSet");
        Api::<DaemonSet>::namespaced(client.clone(), PLUGIN_NAMESPACE)
            .create(&PostParams::default(), &ds)
            .await
            .expect("create the plugin's DaemonSet");
        DevicePlugin { dir }
    }

    /// Appends a fault line (`xid <uuid> <n>`, `ecc <uuid>`, `lost <uuid>`);
    /// the plugin's NVML reads what was appended.
    pub fn inject(&self, line: &str) {
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(self.dir.path().join("faults"))
            .expect("the fault file");
        writeln!(file, "{line}").expect("write a fault");
    }
}

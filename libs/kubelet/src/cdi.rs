//! Container Device Interface specs (CDI 0.6.0, the version containerd and
//! CRI-O read), written atomically: a temporary file in the same directory,
//! fsynced, renamed over the target, the directory fsynced.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The CDI version written.
pub const VERSION: &str = "0.6.0";
/// The vendor/class of the devices, as in `gpu.deckhouse.io/gpu=<name>`.
pub const KIND: &str = "gpu.deckhouse.io/gpu";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Spec {
    pub cdi_version: String,
    pub kind: String,
    pub devices: Vec<Device>,
    #[serde(default, skip_serializing_if = "ContainerEdits::is_empty")]
    pub container_edits: ContainerEdits,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    pub name: String,
    pub container_edits: ContainerEdits,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerEdits {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
}

impl ContainerEdits {
    pub fn is_empty(&self) -> bool {
        self.env.is_empty() && self.device_nodes.is_empty()
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceNode {
    pub path: String,
}

/// The fully qualified CDI name of a device: `gpu.deckhouse.io/gpu=<name>`.
pub fn qualified(name: &str) -> String {
    format!("{KIND}={name}")
}

/// Writes `bytes` to `path` atomically and durably.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp: PathBuf = dir.join(format!(
        ".{}.tmp",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("spec")
    ));
    {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}

/// Removes `path` if it exists, durably.
pub fn remove(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    }
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// The device nodes every GPU container needs besides its cards'.
pub const CONTROL_NODES: [&str; 3] = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"];

/// Where the device-plugin stack's spec goes in the CDI directory.
pub const DEVICE_PLUGIN_SPEC: &str = "gpu.deckhouse.io-device-plugin.json";

/// The spec behind the CDI names the device plugins' Allocate returns
/// (`gpu.deckhouse.io/gpu=<card or MIG UUID>`): each card and MIG device by
/// its UUID with its card's device node, and the control nodes for all.
/// `NVIDIA_VISIBLE_DEVICES` comes with Allocate's answer, which knows every
/// device of the container.
pub fn device_plugin_spec(machine: &switchyard_gpu::Machine) -> Spec {
    let mut devices = Vec::new();
    for gpu in &machine.gpus {
        let node = DeviceNode {
            path: format!("/dev/nvidia{}", gpu.index),
        };
        for uuid in std::iter::once(&gpu.uuid).chain(gpu.mig_devices.iter().map(|m| &m.uuid)) {
            devices.push(Device {
                name: uuid.clone(),
                container_edits: ContainerEdits {
                    env: Vec::new(),
                    device_nodes: vec![node.clone()],
                },
            });
        }
    }
    Spec {
        cdi_version: VERSION.into(),
        kind: KIND.into(),
        devices,
        container_edits: ContainerEdits {
            env: Vec::new(),
            device_nodes: CONTROL_NODES
                .iter()
                .map(|p| DeviceNode {
                    path: p.to_string(),
                })
                .collect(),
        },
    }
}

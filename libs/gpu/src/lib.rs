//! GPUs as the node agent sees them.
//!
//! - [`Machine`]: what a node has — cards with their identity, capabilities,
//!   MIG mode and MIG devices, and the driver versions.
//! - [`GpuSource`]: where a machine comes from — [`nvml::Nvml`] on a node with
//!   NVIDIA's driver (through `nvml-wrapper`; NVML calls are blocking, callers
//!   on an async runtime run them with `spawn_blocking`), or [`Fixture`], a YAML
//!   description of a machine for everywhere else (`deploy/fixtures/`).
//! - [`publish`]: the ResourceSlices and PhysicalGPU reports a node publishes.

#![forbid(unsafe_code)]

pub mod nvml;
pub mod publish;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// A node's GPUs and driver.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Machine {
    /// The kernel driver's version, e.g. `550.54.15`.
    pub driver_version: String,
    /// The CUDA version the driver supports, e.g. `12.4`.
    pub cuda_driver_version: String,
    pub gpus: Vec<Gpu>,
}

/// One card.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Gpu {
    /// NVML's index on the node.
    pub index: u32,
    /// `GPU-` and a UUID.
    pub uuid: String,
    /// e.g. `NVIDIA A100-SXM4-40GB`.
    pub product_name: String,
    /// e.g. `Tesla`, `NVIDIA`.
    pub brand: String,
    /// e.g. `Ampere`, `Hopper`.
    pub architecture: String,
    /// e.g. `8.0`.
    pub compute_capability: String,
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    /// e.g. `00000000:07:00.0`.
    pub pci_bus_id: String,
    /// Whether the card can be partitioned (MIG capable).
    #[serde(default)]
    pub mig_capable: bool,
    /// Whether MIG mode is on; then the card is used through `mig_devices`.
    #[serde(default)]
    pub mig_enabled: bool,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig_devices: Vec<MigDevice>,
    /// False once NVML reported the card lost or a critical XID.
    #[serde(default = "healthy")]
    pub healthy: bool,
}

fn healthy() -> bool {
    true
}

/// A MIG device (a GPU instance with its compute instance).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MigDevice {
    /// Its index among the card's MIG devices.
    pub index: u32,
    /// `MIG-` and a UUID.
    pub uuid: String,
    /// e.g. `1g.5gb`, `3g.20gb`.
    pub profile: String,
    pub multiprocessors: u32,
    pub copy_engines: u32,
    pub decoders: u32,
    pub encoders: u32,
    pub jpeg_engines: u32,
    pub ofa_engines: u32,
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
}

/// Why a machine could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error(
        "NVML is not available on this machine ({0}); is NVIDIA's driver installed (libnvidia-ml.so.1)? To run without a GPU, use --gpu-source fixture:FILE (examples in deploy/fixtures/)"
    )]
    NvmlMissing(String),
    #[error("NVML: {call}: {message}")]
    Nvml { call: String, message: String },
    #[error("fixture {path}: {message}")]
    Fixture { path: PathBuf, message: String },
}

/// A card turning unhealthy (NVML: a critical XID error, the GPU lost) or
/// healthy again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthChange {
    /// The card's UUID (a MIG device's event names its parent card).
    pub uuid: String,
    pub healthy: bool,
    /// e.g. `XID 79`.
    pub reason: String,
}

impl HealthChange {
    /// The no-op change a watch sends now and then to ask whether it is
    /// still wanted (the sink answers false to stop it).
    pub fn probe() -> HealthChange {
        HealthChange {
            uuid: String::new(),
            healthy: true,
            reason: String::new(),
        }
    }

    pub fn is_probe(&self) -> bool {
        self.uuid.is_empty() && self.healthy
    }
}

/// Where the node's GPUs are read from.
pub trait GpuSource: Send + Sync {
    /// The machine as it is now.
    fn machine(&self) -> Result<Machine, SourceError>;

    /// Blocks, passing health changes to `sink` until it returns false or the
    /// source has nothing more to say (a fixture never changes). Run it off
    /// the async runtime.
    fn watch_health(&self, sink: &mut dyn FnMut(HealthChange) -> bool) -> Result<(), SourceError> {
        let _ = sink;
        Ok(())
    }
}

impl Machine {
    /// Applies a health change to the card it names (or whose MIG device it
    /// names); false if no card matches.
    pub fn apply(&mut self, change: &HealthChange) -> bool {
        for gpu in &mut self.gpus {
            if gpu.uuid == change.uuid || gpu.mig_devices.iter().any(|m| m.uuid == change.uuid) {
                gpu.healthy = change.healthy;
                return true;
            }
        }
        false
    }
}

/// A machine described in a YAML file. Loaded from a file, it is watched:
/// a card whose `healthy` changes in the file is reported as a health change,
/// as NVML reports an XID error — the way to exercise the health path with no
/// GPU.
#[derive(Clone, Debug)]
pub struct Fixture {
    machine: Machine,
    path: Option<PathBuf>,
    /// Whose cards these are, when the file is shared by several nodes
    /// ([`Fixture::load_on`]): their UUIDs made the node's own.
    node: Option<String>,
}

/// How often a fixture file is read again for health changes.
const FIXTURE_POLL: std::time::Duration = std::time::Duration::from_secs(1);

impl Fixture {
    /// Reads and checks a fixture: indexes unique, UUIDs shaped as NVML
    /// gives them, MIG devices only on MIG-enabled cards.
    pub fn load(path: &Path) -> Result<Fixture, SourceError> {
        let bad = |message: String| SourceError::Fixture {
            path: path.to_path_buf(),
            message,
        };
        let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        let machine: Machine = serde_yaml_ng::from_str(&text).map_err(|e| bad(e.to_string()))?;
        check(&machine).map_err(bad)?;
        Ok(Fixture {
            machine,
            path: Some(path.to_path_buf()),
            node: None,
        })
    }

    /// [`Fixture::load`] of a machine shared by several nodes (the chart's
    /// `nodeAgent.fixture`), as node `node`'s: every card's and MIG
    /// device's UUID made the node's own, as real cards' are — its first
    /// eight hex digits are the node name's FNV-1a hash — so that no two
    /// nodes publish the same card. The same node gets the same UUIDs.
    pub fn load_on(path: &Path, node: &str) -> Result<Fixture, SourceError> {
        let mut fixture = Fixture::load(path)?;
        own_uuids(&mut fixture.machine, node);
        fixture.node = Some(node.to_string());
        Ok(fixture)
    }

    pub fn new(machine: Machine) -> Result<Fixture, String> {
        check(&machine)?;
        Ok(Fixture {
            machine,
            path: None,
            node: None,
        })
    }
}

/// `machine`'s UUIDs as node `node`'s ([`Fixture::load_on`]).
fn own_uuids(machine: &mut Machine, node: &str) {
    let hash = node.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    let own = |uuid: &mut String, prefix: &str| {
        // PREFIX + 8 hex digits + the rest: the 8 digits replaced.
        if let Some(rest) = uuid.strip_prefix(prefix).and_then(|r| r.get(8..)) {
            *uuid = format!("{prefix}{hash:08x}{rest}");
        }
    };
    for gpu in &mut machine.gpus {
        own(&mut gpu.uuid, "GPU-");
        for mig in &mut gpu.mig_devices {
            own(&mut mig.uuid, "MIG-");
        }
    }
}

impl GpuSource for Fixture {
    fn machine(&self) -> Result<Machine, SourceError> {
        Ok(self.machine.clone())
    }

    /// Reads the file again every second; a card whose `healthy` differs from
    /// the last reading is a change. A file that does not load (an edit in
    /// progress, a mistake) is reported once and skipped; the last good
    /// reading stands.
    fn watch_health(&self, sink: &mut dyn FnMut(HealthChange) -> bool) -> Result<(), SourceError> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let mut health: std::collections::BTreeMap<String, bool> = self
            .machine
            .gpus
            .iter()
            .map(|gpu| (gpu.uuid.clone(), gpu.healthy))
            .collect();
        let mut last_error = None;
        loop {
            std::thread::sleep(FIXTURE_POLL);
            if !sink(HealthChange::probe()) {
                return Ok(());
            }
            let loaded = match &self.node {
                Some(node) => Fixture::load_on(path, node),
                None => Fixture::load(path),
            };
            let fixture = match loaded {
                Ok(fixture) => fixture,
                Err(e) => {
                    let message = e.to_string();
                    if last_error.as_ref() != Some(&message) {
                        tracing::warn!(error = %message, "the fixture does not load; its last reading stands");
                        last_error = Some(message);
                    }
                    continue;
                }
            };
            last_error = None;
            for gpu in fixture.machine.gpus {
                let Some(was) = health.get_mut(&gpu.uuid) else {
                    continue;
                };
                if *was != gpu.healthy {
                    *was = gpu.healthy;
                    let change = HealthChange {
                        reason: format!("{}: healthy: {}", path.display(), gpu.healthy),
                        uuid: gpu.uuid,
                        healthy: gpu.healthy,
                    };
                    if !sink(change) {
                        return Ok(());
                    }
                }
            }
        }
    }
}

fn check(machine: &Machine) -> Result<(), String> {
    let mut indexes = std::collections::BTreeSet::new();
    for (i, gpu) in machine.gpus.iter().enumerate() {
        if !indexes.insert(gpu.index) {
            return Err(format!("gpus[{i}].index: {} appears twice", gpu.index));
        }
        if !gpu.uuid.starts_with("GPU-") {
            return Err(format!(
                "gpus[{i}].uuid: {:?} does not start with GPU-",
                gpu.uuid
            ));
        }
        if !gpu.mig_enabled && !gpu.mig_devices.is_empty() {
            return Err(format!(
                "gpus[{i}].migDevices: MIG devices on a card whose migEnabled is false"
            ));
        }
        if gpu.mig_enabled && !gpu.mig_capable {
            return Err(format!("gpus[{i}].migEnabled: the card is not migCapable"));
        }
        for (j, mig) in gpu.mig_devices.iter().enumerate() {
            if !mig.uuid.starts_with("MIG-") {
                return Err(format!(
                    "gpus[{i}].migDevices[{j}].uuid: {:?} does not start with MIG-",
                    mig.uuid
                ));
            }
            if publish::profile_parts(&mig.profile).is_none() {
                return Err(format!(
                    "gpus[{i}].migDevices[{j}].profile: {:?} is not a MIG profile such as 1g.5gb",
                    mig.profile
                ));
            }
        }
    }
    Ok(())
}

/// A source named on the command line: `nvml` or `fixture:FILE`.
pub fn source(spec: &str) -> Result<Box<dyn GpuSource>, SourceError> {
    source_on(spec, None)
}

/// A source named on the command line on node `node`: `nvml`,
/// `fixture:FILE`, or `fixture-per-node:FILE`, a fixture machine shared by
/// several nodes whose UUIDs are made each node's own
/// ([`Fixture::load_on`]; it needs the node).
pub fn source_on(spec: &str, node: Option<&str>) -> Result<Box<dyn GpuSource>, SourceError> {
    match (spec.split_once(':'), node) {
        (None, _) if spec == "nvml" => Ok(Box::new(nvml::Nvml::init()?)),
        (Some(("fixture", path)), _) => Ok(Box::new(Fixture::load(Path::new(path))?)),
        (Some(("fixture-per-node", path)), Some(node)) => {
            Ok(Box::new(Fixture::load_on(Path::new(path), node)?))
        }
        (Some(("fixture-per-node", path)), None) => Err(SourceError::Fixture {
            path: PathBuf::from(path),
            message: "fixture-per-node: needs the node's name (--node-name)".into(),
        }),
        _ => Err(SourceError::Fixture {
            path: PathBuf::from(spec),
            message: "expected --gpu-source nvml, fixture:FILE or fixture-per-node:FILE".into(),
        }),
    }
}

/// The PhysicalGPU `gpu.deckhouse.io/device` label of a product:
/// `NVIDIA A100-SXM4-40GB` → `a100-sxm4-40gb`.
pub fn device_label(product_name: &str) -> String {
    let name = product_name.strip_prefix("NVIDIA ").unwrap_or(product_name);
    name.to_ascii_lowercase()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect::<String>()
        .split('-')
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join("-")
}

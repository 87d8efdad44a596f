//! What a node publishes about its GPUs: PhysicalGPU reports, and for the DRA
//! stack the ResourceSlices of one pool named after the node.
//!
//! Devices are named as DNS labels (`gpu-0`, `gpu-0-mig-1g-5gb-0`) and carry
//! the attributes and capacities NVIDIA's DRA driver publishes under its
//! names (`type`, `uuid`, `productName`, `brand`, `architecture`,
//! `cudaComputeCapability`, `driverVersion`, `cudaDriverVersion`, `index`,
//! `pcieBusID`, `memory`; MIG devices also `profile`, `parentUUID`,
//! `parentIndex` and their engines), plus `device`, the PhysicalGPU
//! `gpu.deckhouse.io/device` label, so that class selectors work. An
//! unhealthy card's devices carry the `gpu.deckhouse.io/unhealthy` taint.
//!
//! Slices respect the API server's limits: at most 128 devices a slice, 64
//! when devices consume counters or carry taints.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Counter, CounterSet, Device,
    DeviceAttribute, DeviceCapacity, DeviceCounterConsumption, DeviceTaint, ResourcePool,
    ResourceSlice, ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use switchyard_api::{Capabilities, GpuPhase, PhysicalGPU, PhysicalGPUSpec, PhysicalGPUStatus};

use crate::{Gpu, Machine, MigDevice, device_label};

/// The DRA driver's name, which is also the attributes' domain.
pub const DRIVER: &str = "gpu.deckhouse.io";
/// The taint an unhealthy card's devices carry.
pub const UNHEALTHY_TAINT: &str = "gpu.deckhouse.io/unhealthy";
/// The API server's limits on a slice.
pub const MAX_DEVICES: usize = 128;
pub const MAX_DEVICES_WITH_COUNTERS_OR_TAINTS: usize = 64;

/// How a node's cards are published, from its group's configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// As configured on the card: whole cards, and the MIG devices of cards
    /// with MIG mode on.
    Static,
    /// Every MIG-capable card as the whole card plus every MIG profile
    /// placement, all drawing on the card's counters (partitionable devices):
    /// the scheduler picks the partition.
    Partitionable,
    /// Whole cards shared by up to `replicas` consumers each (consumable
    /// capacity: a request takes 1/replicas of the card's memory by default).
    Shared { replicas: u32 },
}

/// A [`Layout`] as a flag names it: `static`, `partitionable` or `shared:N`.
pub fn parse_layout(s: &str) -> Result<Layout, String> {
    match s.split_once(':') {
        None if s == "static" => Ok(Layout::Static),
        None if s == "partitionable" => Ok(Layout::Partitionable),
        Some(("shared", n)) => match n.parse::<u32>() {
            Ok(replicas) if replicas >= 2 => Ok(Layout::Shared { replicas }),
            _ => Err(format!("shared:{n}: expected shared:N with N >= 2")),
        },
        _ => Err(format!("{s:?}: expected static, partitionable or shared:N")),
    }
}

/// MIG profiles by product: (profile, compute slices, memory slices, how many fit).
fn profiles(product: &str) -> &'static [(&'static str, u32, u32, u32)] {
    const A100_40: &[(&str, u32, u32, u32)] = &[
        ("1g.5gb", 1, 1, 7),
        ("2g.10gb", 2, 2, 3),
        ("3g.20gb", 3, 4, 2),
        ("4g.20gb", 4, 4, 1),
        ("7g.40gb", 7, 8, 1),
    ];
    const EIGHTY: &[(&str, u32, u32, u32)] = &[
        ("1g.10gb", 1, 1, 7),
        ("1g.20gb", 1, 2, 4),
        ("2g.20gb", 2, 2, 3),
        ("3g.40gb", 3, 4, 2),
        ("4g.40gb", 4, 4, 1),
        ("7g.80gb", 7, 8, 1),
    ];
    let p = product.to_ascii_lowercase();
    if p.contains("a100") && p.contains("40gb") {
        A100_40
    } else if (p.contains("a100") || p.contains("h100")) && p.contains("80gb") {
        EIGHTY
    } else {
        &[]
    }
}

/// `3g.20gb` → (3, 20).
pub fn profile_parts(profile: &str) -> Option<(u32, u32)> {
    let (g, mem) = profile.split_once("g.")?;
    let mem = mem.strip_suffix("gb")?;
    let mem = mem.split('+').next()?;
    Some((g.parse().ok()?, mem.parse().ok()?))
}

fn string(v: impl Into<String>) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(v.into()),
        ..Default::default()
    }
}

fn int(v: i64) -> DeviceAttribute {
    DeviceAttribute {
        int: Some(v),
        ..Default::default()
    }
}

/// A version attribute in semver form: `8.0` → `8.0.0`; leading zeros, which
/// NVIDIA's driver versions have (`535.161.08`) and semver forbids, dropped.
fn version(v: &str) -> DeviceAttribute {
    let mut parts: Vec<String> = v
        .split('.')
        .map(|p| {
            p.parse::<u64>()
                .map_or_else(|_| p.to_string(), |n| n.to_string())
        })
        .collect();
    while parts.len() < 3 {
        parts.push("0".into());
    }
    DeviceAttribute {
        version: Some(parts.join(".")),
        ..Default::default()
    }
}

fn mebibytes(mib: u64) -> Quantity {
    Quantity(if mib.is_multiple_of(1024) {
        format!("{}Gi", mib / 1024)
    } else {
        format!("{mib}Mi")
    })
}

fn capacity(q: Quantity) -> DeviceCapacity {
    DeviceCapacity {
        value: q,
        request_policy: None,
    }
}

fn card_attributes(machine: &Machine, gpu: &Gpu, kind: &str) -> BTreeMap<String, DeviceAttribute> {
    BTreeMap::from([
        ("type".to_string(), string(kind)),
        ("uuid".into(), string(&gpu.uuid)),
        ("productName".into(), string(&gpu.product_name)),
        ("brand".into(), string(&gpu.brand)),
        ("architecture".into(), string(&gpu.architecture)),
        (
            "cudaComputeCapability".into(),
            version(&gpu.compute_capability),
        ),
        ("driverVersion".into(), version(&machine.driver_version)),
        (
            "cudaDriverVersion".into(),
            version(&machine.cuda_driver_version),
        ),
        ("index".into(), int(i64::from(gpu.index))),
        (
            "pcieBusID".into(),
            string(gpu.pci_bus_id.to_ascii_lowercase()),
        ),
        ("device".into(), string(device_label(&gpu.product_name))),
    ])
}

fn taints(gpu: &Gpu) -> Option<Vec<DeviceTaint>> {
    (!gpu.healthy).then(|| {
        vec![DeviceTaint {
            key: UNHEALTHY_TAINT.into(),
            value: Some("true".into()),
            effect: "NoSchedule".into(),
            time_added: None,
        }]
    })
}

fn whole(machine: &Machine, gpu: &Gpu) -> Device {
    Device {
        name: format!("gpu-{}", gpu.index),
        attributes: Some(card_attributes(machine, gpu, "gpu")),
        capacity: Some(BTreeMap::from([(
            "memory".to_string(),
            capacity(mebibytes(gpu.memory_mib)),
        )])),
        taints: taints(gpu),
        ..Default::default()
    }
}

/// A MIG device's name in the slices: `gpu-1-mig-3g-20gb-0`.
pub fn mig_name(card: u32, profile: &str, index: u32) -> String {
    format!(
        "gpu-{card}-mig-{}-{index}",
        profile.replace(['.', '+'], "-")
    )
}

fn mig(machine: &Machine, gpu: &Gpu, m: &MigDevice) -> Device {
    let mut attributes = card_attributes(machine, gpu, "mig");
    attributes.insert("uuid".into(), string(&m.uuid));
    attributes.insert("profile".into(), string(&m.profile));
    attributes.insert("parentUUID".into(), string(&gpu.uuid));
    attributes.insert("parentIndex".into(), int(i64::from(gpu.index)));
    attributes.insert("index".into(), int(i64::from(m.index)));
    let engines = [
        ("multiprocessors", m.multiprocessors),
        ("copyEngines", m.copy_engines),
        ("decoders", m.decoders),
        ("encoders", m.encoders),
        ("jpegEngines", m.jpeg_engines),
        ("ofaEngines", m.ofa_engines),
    ];
    let mut caps: BTreeMap<String, DeviceCapacity> = engines
        .iter()
        .map(|(k, v)| (k.to_string(), capacity(Quantity(v.to_string()))))
        .collect();
    caps.insert("memory".into(), capacity(mebibytes(m.memory_mib)));
    Device {
        name: mig_name(gpu.index, &m.profile, m.index),
        attributes: Some(attributes),
        capacity: Some(caps),
        taints: taints(gpu),
        ..Default::default()
    }
}

/// The ResourceSlices of `node` for `machine`, as one pool named after the
/// node at `generation`.
pub fn resource_slices(
    node: &str,
    machine: &Machine,
    layout: Layout,
    generation: i64,
) -> Vec<ResourceSlice> {
    let mut devices = Vec::new();
    let mut counter_sets = Vec::new();
    for gpu in &machine.gpus {
        match layout {
            Layout::Static if gpu.mig_enabled => {
                devices.extend(gpu.mig_devices.iter().map(|m| mig(machine, gpu, m)));
            }
            Layout::Static => devices.push(whole(machine, gpu)),
            Layout::Shared { replicas } => devices.push(shared(machine, gpu, replicas)),
            Layout::Partitionable => {
                partitionable(machine, gpu, &mut devices, &mut counter_sets);
            }
        }
    }
    into_slices(node, devices, counter_sets, generation)
}

/// Shared layout: the whole card, allocated many times, each a share of its memory.
fn shared(machine: &Machine, gpu: &Gpu, replicas: u32) -> Device {
    let mut device = whole(machine, gpu);
    let share = gpu.memory_mib / u64::from(replicas.max(1));
    device.allow_multiple_allocations = Some(true);
    device.capacity = Some(BTreeMap::from([(
        "memory".to_string(),
        DeviceCapacity {
            value: mebibytes(gpu.memory_mib),
            request_policy: Some(CapacityRequestPolicy {
                default: Some(mebibytes(share)),
                valid_range: Some(CapacityRequestPolicyRange {
                    min: mebibytes(share),
                    // The API server wants max = min + k × step.
                    max: Some(mebibytes(share * u64::from(replicas.max(1)))),
                    step: Some(mebibytes(share)),
                }),
                valid_values: None,
            }),
        },
    )]));
    device
}

/// Partitionable layout: the whole card and its MIG devices, with their counters.
fn partitionable(
    machine: &Machine,
    gpu: &Gpu,
    devices: &mut Vec<Device>,
    counter_sets: &mut Vec<CounterSet>,
) {
    let catalogue = profiles(&gpu.product_name);
    if !gpu.mig_capable || catalogue.is_empty() {
        devices.push(whole(machine, gpu));
        return;
    }
    let set = format!("gpu-{}-counters", gpu.index);
    let counters = |compute: u32, memory: u32| {
        Some(vec![DeviceCounterConsumption {
            counter_set: set.clone(),
            counters: BTreeMap::from([
                (
                    "compute-slices".to_string(),
                    Counter {
                        value: Quantity(compute.to_string()),
                    },
                ),
                (
                    "memory-slices".to_string(),
                    Counter {
                        value: Quantity(memory.to_string()),
                    },
                ),
            ]),
        }])
    };
    counter_sets.push(CounterSet {
        name: set.clone(),
        counters: BTreeMap::from([
            (
                "compute-slices".to_string(),
                Counter {
                    value: Quantity("7".into()),
                },
            ),
            (
                "memory-slices".to_string(),
                Counter {
                    value: Quantity("8".into()),
                },
            ),
        ]),
    });
    let mut card = whole(machine, gpu);
    card.consumes_counters = counters(7, 8);
    devices.push(card);
    for (profile, compute, memory, count) in catalogue {
        let (_, gb) = profile_parts(profile).unwrap_or_default();
        for i in 0..*count {
            let mut attributes = card_attributes(machine, gpu, "mig");
            attributes.insert("profile".into(), string(*profile));
            attributes.insert("parentUUID".into(), string(&gpu.uuid));
            attributes.insert("parentIndex".into(), int(i64::from(gpu.index)));
            devices.push(Device {
                name: mig_name(gpu.index, profile, i),
                attributes: Some(attributes),
                capacity: Some(BTreeMap::from([(
                    "memory".to_string(),
                    capacity(Quantity(format!("{gb}Gi"))),
                )])),
                consumes_counters: counters(*compute, *memory),
                taints: taints(gpu),
                ..Default::default()
            });
        }
    }
}

/// Slicing phase: the devices and counter sets as the slices of one pool.
fn into_slices(
    node: &str,
    devices: Vec<Device>,
    counter_sets: Vec<CounterSet>,
    generation: i64,
) -> Vec<ResourceSlice> {
    let limited = !counter_sets.is_empty() || devices.iter().any(|d| d.taints.is_some());
    let per_slice = if limited {
        MAX_DEVICES_WITH_COUNTERS_OR_TAINTS
    } else {
        MAX_DEVICES
    };
    // The devices moved into slices of at most `per_slice` (one, maybe
    // empty, at least).
    let mut chunks: Vec<Vec<Device>> = Vec::new();
    let mut rest = devices;
    while rest.len() > per_slice {
        let tail = rest.split_off(per_slice);
        chunks.push(std::mem::replace(&mut rest, tail));
    }
    chunks.push(rest);
    let count = (chunks.len() + usize::from(!counter_sets.is_empty())) as i64;
    let pool = ResourcePool {
        name: node.to_string(),
        generation,
        resource_slice_count: count,
    };
    let slice = |name: String, spec: ResourceSliceSpec| ResourceSlice {
        metadata: ObjectMeta {
            name: Some(name),
            ..Default::default()
        },
        spec,
    };
    let mut out = Vec::new();
    if !counter_sets.is_empty() {
        out.push(slice(
            format!("{node}-{DRIVER}-counters"),
            ResourceSliceSpec {
                driver: DRIVER.into(),
                node_name: Some(node.into()),
                pool: pool.clone(),
                shared_counters: Some(counter_sets),
                ..Default::default()
            },
        ));
    }
    for (i, chunk) in chunks.into_iter().enumerate() {
        out.push(slice(
            format!("{node}-{DRIVER}-{i}"),
            ResourceSliceSpec {
                driver: DRIVER.into(),
                node_name: Some(node.into()),
                pool: pool.clone(),
                devices: Some(chunk),
                ..Default::default()
            },
        ));
    }
    out
}

/// The PhysicalGPU reports of `node`: one per card, named `<node>-gpu-<index>`,
/// labelled with the card's device label.
/// The name of a card's PhysicalGPU: `<node>-gpu-<index>`.
pub fn physical_gpu_name(node: &str, index: u32) -> String {
    format!("{node}-gpu-{index}")
}

pub fn physical_gpus(node: &str, machine: &Machine) -> Vec<PhysicalGPU> {
    machine
        .gpus
        .iter()
        .map(|gpu| {
            let mut report = PhysicalGPU::new(
                &physical_gpu_name(node, gpu.index),
                PhysicalGPUSpec {
                    node: node.to_string(),
                    index: gpu.index,
                    uuid: gpu.uuid.clone(),
                    product: gpu.product_name.clone(),
                },
            );
            report.metadata.labels = Some(BTreeMap::from([(
                "gpu.deckhouse.io/device".to_string(),
                device_label(&gpu.product_name),
            )]));
            let mut partition_support = vec!["TimeSlicing".to_string()];
            if gpu.mig_capable {
                partition_support.insert(0, "MIG".into());
            }
            report.status = Some(PhysicalGPUStatus {
                phase: Some(if gpu.healthy {
                    GpuPhase::Ready
                } else {
                    GpuPhase::Failed
                }),
                capabilities: Some(Capabilities {
                    architecture: gpu.architecture.clone(),
                    compute_api: "CUDA".into(),
                    compute_capability: gpu.compute_capability.clone(),
                    memory_mib: gpu.memory_mib,
                    partition_support,
                }),
            });
            report
        })
        .collect()
}

/// The machine a node's PhysicalGPU reports describe — the inverse of
/// [`physical_gpus`], so that what a node would publish can be predicted
/// from the cluster (a migration plan) before its agent publishes it. What
/// the reports do not carry is left neutral: the driver versions
/// (`driver_version`, `cuda_driver_version` as given), the brand (`NVIDIA`),
/// the PCI bus id (empty) and MIG mode (off: the cards' MIG layout is the
/// agent's to find; MIG-capable cards still partition with
/// [`Layout::Partitionable`]). Cards are ordered by index; a `Failed` card is
/// unhealthy.
pub fn machine_from_physical_gpus<'a>(
    reports: impl IntoIterator<Item = &'a PhysicalGPU>,
    driver_version: &str,
    cuda_driver_version: &str,
) -> Machine {
    let mut gpus: Vec<Gpu> = reports
        .into_iter()
        .map(|report| {
            let status = report.status.as_ref();
            let capabilities = status.and_then(|s| s.capabilities.as_ref());
            Gpu {
                index: report.spec.index,
                uuid: report.spec.uuid.clone(),
                product_name: report.spec.product.clone(),
                brand: "NVIDIA".into(),
                architecture: capabilities
                    .map(|c| c.architecture.clone())
                    .unwrap_or_default(),
                compute_capability: capabilities
                    .map(|c| c.compute_capability.clone())
                    .unwrap_or_default(),
                memory_mib: capabilities.map_or(0, |c| c.memory_mib),
                pci_bus_id: String::new(),
                mig_capable: capabilities
                    .is_some_and(|c| c.partition_support.iter().any(|p| p == "MIG")),
                mig_enabled: false,
                mig_devices: Vec::new(),
                healthy: status.and_then(|s| s.phase) != Some(GpuPhase::Failed),
            }
        })
        .collect();
    gpus.sort_by_key(|g| g.index);
    Machine {
        driver_version: driver_version.to_string(),
        cuda_driver_version: cuda_driver_version.to_string(),
        gpus,
    }
}

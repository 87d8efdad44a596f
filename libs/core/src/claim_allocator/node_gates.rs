//! The node gates both backends' exit evidence is made of: the check names,
//! no dual advertisement, and the published slices against the node agent's
//! PhysicalGPUs. Each backend's strategy assembles a node's evidence from
//! them ([`crate::backend`]); [`super::evidence`] asks the strategy.

use std::collections::BTreeMap;

use switchyard_proto::v1::{EvidenceItem, PodPhase};

use crate::cluster::{Cluster, Node, Slice};
use crate::names::GPU_DRIVER;

/// The DRA drivers whose slices publish GPUs: Switchyard's node agent's and
/// the NVIDIA DRA driver's.
pub const GPU_DRIVERS: [&str; 2] = [GPU_DRIVER, "gpu.nvidia.com"];

pub const NO_DUAL_ADVERTISEMENT: &str = "no dual advertisement";
pub const PLUGIN_HEALTHY: &str = "DRA plug-in healthy";
pub const SLICES_MATCH: &str = "slices match the PhysicalGPUs";
/// nvidia-operator backend: the driver's devices against what GPU Feature
/// Discovery labelled on the node.
pub const SLICES_MATCH_GFD: &str = "slices match GPU Feature Discovery's labels";
pub const PODS_ON_TARGET: &str = "pods on the target group";
pub const CLAIMS_RESERVED: &str = "claims allocated and reserved";
pub const RESTART_AND_CLEANUP: &str = "restart and cleanup";

pub fn item(check: &str, result: Result<String, String>) -> EvidenceItem {
    let (passed, detail) = match result {
        Ok(detail) => (true, detail),
        Err(detail) => (false, detail),
    };
    EvidenceItem {
        check: check.to_string(),
        passed,
        detail,
    }
}

pub fn gpu_slices<'a>(cluster: &'a Cluster) -> impl Iterator<Item = (&'a String, &'a Slice)> + 'a {
    cluster
        .slices
        .iter()
        .filter(|(_, s)| GPU_DRIVERS.contains(&s.driver.as_str()))
}

/// No dual advertisement on `node` (`dra`: on the DRA stack).
pub fn dual_advertisement(
    cluster: &Cluster,
    node: &str,
    facts: &Node,
    dra: bool,
) -> Result<String, String> {
    let on_node: Vec<&Slice> = gpu_slices(cluster)
        .filter(|(_, s)| s.node == node)
        .map(|(_, s)| s)
        .collect();
    let published: usize = on_node.iter().map(|s| s.devices.len()).sum();
    let allocatable = facts.device_plugin_allocatable;
    let stack = if dra { "dra" } else { "device-plugin" };
    // Pods holding device-plugin GPUs on a node that publishes its cards to
    // DRA: the same cards have two allocators.
    let holding: Vec<String> = if published > 0 {
        cluster
            .pods_on(node)
            .filter(|(_, p)| {
                p.device_plugin_gpus > 0
                    && !matches!(p.phase, PodPhase::Succeeded | PodPhase::Failed)
            })
            .map(|((ns, name), _)| format!("{ns}/{name}"))
            .collect()
    } else {
        Vec::new()
    };
    if !holding.is_empty() {
        Err(format!(
            "pods hold device-plugin GPUs on a node that publishes {published} devices in {} \
             ResourceSlices: {}",
            on_node.len(),
            holding.join(", ")
        ))
    } else if published > 0 && allocatable > 0 {
        Err(format!(
            "{allocatable} device-plugin GPU resources (nvidia.com/gpu, MIG, shared) are allocatable while {published} devices are published in {} ResourceSlices: both allocators advertise the node",
            on_node.len()
        ))
    } else if dra && published == 0 {
        Err(format!(
            "the node is on the dra stack but publishes no GPU ResourceSlice (device-plugin resources allocatable: {allocatable})"
        ))
    } else if dra {
        Ok(format!(
            "{published} devices in {} ResourceSlices, no device-plugin resource allocatable",
            on_node.len()
        ))
    } else {
        Ok(format!(
            "{stack} stack: {allocatable} device-plugin GPU resources allocatable, no GPU ResourceSlice"
        ))
    }
}

/// Every PhysicalGPU of `node` published once as a whole device, with its
/// product, memory and UUID, in a slice of `node`; no published card without
/// a PhysicalGPU.
pub fn slices_match(cluster: &Cluster, node: &str) -> Result<String, String> {
    let gpus = cluster
        .gpus
        .get(node)
        .map(Vec::as_slice)
        .unwrap_or_default();
    if gpus.is_empty() {
        return Err("no PhysicalGPU to compare the slices with".into());
    }
    // UUID -> (slice's node, device name, product, memory) of whole cards.
    let mut cards: BTreeMap<&str, Vec<(&str, &str, &str, u64)>> = BTreeMap::new();
    for (_, slice) in gpu_slices(cluster) {
        for d in &slice.devices {
            if d.r#type.is_empty() || d.r#type == "gpu" {
                cards.entry(d.uuid.as_str()).or_default().push((
                    slice.node.as_str(),
                    d.name.as_str(),
                    d.product.as_str(),
                    d.memory_mib,
                ));
            }
        }
    }
    let mut wrong = Vec::new();
    for gpu in gpus {
        let name = &*gpu.name;
        match cards.get(&*gpu.uuid).map(Vec::as_slice) {
            None | Some([]) => wrong.push(format!(
                "PhysicalGPU {name} ({}) is not published",
                gpu.uuid
            )),
            Some([(slice_node, device, product, memory)]) => {
                if *slice_node != node {
                    wrong.push(format!(
                        "PhysicalGPU {name} ({}) is published for node {slice_node:?} as {device}",
                        gpu.uuid
                    ));
                }
                if *product != &*gpu.product {
                    wrong.push(format!(
                        "{device}: product {product:?} in the slice, {:?} on PhysicalGPU {name}",
                        gpu.product
                    ));
                }
                if *memory != gpu.memory_mib {
                    wrong.push(format!(
                        "{device}: memory {memory} MiB in the slice, {} MiB on PhysicalGPU {name}",
                        gpu.memory_mib
                    ));
                }
            }
            Some(many) => wrong.push(format!(
                "PhysicalGPU {name} ({}) is published {} times: {}",
                gpu.uuid,
                many.len(),
                many.iter()
                    .map(|(n, d, ..)| format!("{d} on {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }
    for (uuid, published) in &cards {
        for (slice_node, device, ..) in published {
            if *slice_node == node && !gpus.iter().any(|g| &*g.uuid == *uuid) {
                wrong.push(format!(
                    "{device} ({uuid}) is published but no PhysicalGPU of the node has that UUID"
                ));
            }
        }
    }
    if wrong.is_empty() {
        let first = &gpus[0];
        Ok(format!(
            "{} cards published with the PhysicalGPUs' UUIDs ({}, {} MiB)",
            gpus.len(),
            first.product,
            first.memory_mib
        ))
    } else {
        Err(wrong.join("; "))
    }
}

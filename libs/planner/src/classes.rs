//! Classes of identical source nodes. Nodes whose cards are the same but for
//! their UUIDs publish the same devices under other names; when the
//! selectors in play read none of the attributes that differ, the allocator
//! decides the same on each of them from the same devices in use. The plan
//! then reads no member's slices up front: it asks the allocator about a
//! member only for a shape and devices in use its class has not seen (on
//! that member's own slices, read then), and an answer seen before is the
//! answer for every member.
//!
//! That holds only where a member's allocations depend on its own slices
//! alone, so a class is admitted when:
//! - every slice of the cluster names its node (none is gathered by a source
//!   node) and none uses a source node's name as its pool;
//! - every selector of the DeviceClasses the plan requests is evaluated by the
//!   fast path, which says what it reads;
//! - the class's devices are published for their node only, in one pool, and
//!   none is shared (consumable capacity and share IDs are per claim) or
//!   waits on binding conditions;
//! - publishing a member under another name with other UUIDs (in the reverse
//!   order) changes only names and attribute values no selector reads.

use std::collections::BTreeSet;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{AllocationResult, DeviceClass, ResourceSlice};
use serde_json::Value;
use switchyard_api::PhysicalGPU;
use switchyard_dra::alloc::{AllocatedState, DeviceId, Inventory};
use switchyard_dra::cel::Compiler;
use switchyard_gpu::Machine;
use switchyard_gpu::publish::{self, Layout};

use super::HashMap;

const DRIVER_VERSION_LABEL: &str = "nvidia.com/cuda.driver-version.full";
const CUDA_VERSION_LABEL: &str = "nvidia.com/cuda.runtime-version.full";

/// The machine a node's PhysicalGPUs describe, with its driver labels.
pub(super) fn machine(node: &Node, cards: &[&PhysicalGPU]) -> Machine {
    let labels = node.metadata.labels.as_ref();
    let label = |key: &str, default: &str| {
        labels
            .and_then(|l| l.get(key))
            .cloned()
            .unwrap_or_else(|| default.to_string())
    };
    publish::machine_from_physical_gpus(
        cards.iter().copied(),
        &label(DRIVER_VERSION_LABEL, "0.0.0"),
        &label(CUDA_VERSION_LABEL, "0.0"),
    )
}

/// What a handed-over node publishes.
pub(super) fn slices(name: &str, machine: &Machine, layout: Layout) -> Vec<ResourceSlice> {
    publish::resource_slices(name, machine, layout, 1)
}

/// Replaces the UUIDs of `machine`'s cards and MIG devices, the `i`th by
/// `uuid(i)`.
fn set_uuids(machine: &mut Machine, uuid: impl Fn(usize) -> String) {
    let mut i = 0;
    for gpu in &mut machine.gpus {
        gpu.uuid = uuid(i);
        i += 1;
        for mig in &mut gpu.mig_devices {
            mig.uuid = uuid(i);
            i += 1;
        }
    }
}

/// A device of a class: its driver and name (the same on every member).
type ClassDevice = (Arc<str>, Arc<str>);

/// Which devices of its class a member has allocated.
pub(super) type InUse = Vec<bool>;

pub(super) struct NodeClass {
    devices: Vec<ClassDevice>,
    position: HashMap<ClassDevice, u16>,
    /// The allocator's answers by shape, for a member with these devices in
    /// use: the devices it allocates, in its results' order, or none.
    answers: HashMap<usize, HashMap<InUse, Option<Vec<u16>>>>,
}

/// A handed-over node in a class, as the allocator names it.
pub(super) struct Member {
    pub class: usize,
    /// Its pool (the node's name).
    pub pool: Arc<str>,
    /// Its index among the source nodes.
    pub source: usize,
    /// The devices of its class it has allocated. They are kept here, not in
    /// the allocator's state, which holds them only while the allocator is
    /// asked about this node (no other node reads them). `None` when an
    /// existing claim holds a shared allocation or consumed capacity on one,
    /// which this does not say: the state then holds the node's devices.
    pub in_use: Option<InUse>,
}

pub(super) struct Classes {
    /// Each source node's class, where it is in one.
    pub of_source: Vec<Option<usize>>,
    pub classes: Vec<NodeClass>,
}

impl Classes {
    /// No classes: every node's slices are read up front (the plan as it is
    /// without this shortcut, which the tests compare it with).
    pub fn none(source: usize) -> Classes {
        Classes {
            of_source: vec![None; source],
            classes: Vec::new(),
        }
    }

    /// The classes of the source nodes `source` (by name), `machine(n)` the
    /// machine of the `n`th if it has cards.
    pub fn new(
        source: &[&str],
        machine: impl Fn(usize) -> Option<Machine>,
        layout: Layout,
        cluster_slices: &[&ResourceSlice],
        device_classes: &[DeviceClass],
        requested: &BTreeSet<&str>,
        compiler: &Compiler,
    ) -> Classes {
        let mut out = Classes::none(source.len());
        let pools: BTreeSet<&str> = source.iter().copied().collect();
        let cluster_apart = cluster_slices.iter().all(|s| {
            s.spec.node_name.as_deref().is_some_and(|n| !n.is_empty())
                && !pools.contains(s.spec.pool.name.as_str())
        });
        if !cluster_apart {
            return out;
        }
        let Some(reads) = reads(device_classes, requested, compiler) else {
            return out;
        };
        // Members by their machine without UUIDs.
        let mut by_key: HashMap<Machine, Option<usize>> = HashMap::default();
        for (n, name) in source.iter().enumerate() {
            let Some(mut key) = machine(n) else { continue };
            set_uuids(&mut key, |_| String::new());
            let class = match by_key.get(&key) {
                Some(class) => *class,
                None => {
                    // The first member: the class is probed with its cards.
                    let class = machine(n)
                        .and_then(|m| NodeClass::probe(name, &m, layout, device_classes, &reads))
                        .map(|class| {
                            out.classes.push(class);
                            out.classes.len() - 1
                        });
                    by_key.insert(key, class);
                    class
                }
            };
            out.of_source[n] = class;
        }
        out
    }

    /// Source node `n`, named `pool`, as a member of its class (if it is in
    /// one), with the devices the existing claims in `state` hold on it.
    pub fn member(&self, n: usize, pool: &str, state: &AllocatedState) -> Option<Member> {
        let class = self.of_source[n]?;
        let pool: Arc<str> = pool.into();
        let in_use = self.classes[class]
            .devices
            .iter()
            .map(|(driver, device)| {
                let id = DeviceId {
                    driver: driver.clone(),
                    pool: pool.clone(),
                    device: device.clone(),
                };
                let shared = state.capacity.contains_key(&id)
                    || (!state.shared.is_empty() && state.shared.iter().any(|(d, _)| *d == id));
                (!shared).then(|| state.devices.contains(&id))
            })
            .collect();
        Some(Member {
            class,
            pool,
            source: n,
            in_use,
        })
    }

    /// The device at `position` of `member`'s class, on `member`.
    pub fn id(&self, member: &Member, position: u16) -> DeviceId {
        let (driver, device) = &self.classes[member.class].devices[usize::from(position)];
        DeviceId {
            driver: driver.clone(),
            pool: member.pool.clone(),
            device: device.clone(),
        }
    }

    /// The name of the device at `position` of `class`.
    pub fn device_name(&self, class: usize, position: u16) -> &str {
        &self.classes[class].devices[usize::from(position)].1
    }

    /// The answer seen before for `shape` on a member of `class` with
    /// `in_use`: the devices allocated (their positions), or none.
    pub fn answer(&self, class: usize, shape: usize, in_use: &[bool]) -> Option<&Option<Vec<u16>>> {
        self.classes[class].answers.get(&shape)?.get(in_use)
    }

    /// Remembers what the allocator answered (an error is not an answer: it
    /// is asked again).
    pub fn remember(
        &mut self,
        class: usize,
        shape: usize,
        in_use: InUse,
        answer: Option<Vec<u16>>,
    ) {
        self.classes[class]
            .answers
            .entry(shape)
            .or_default()
            .insert(in_use, answer);
    }

    /// The positions of the devices `results` allocate on `member`; `None`
    /// unless every one is its class's, allocated exclusively, without admin
    /// access.
    pub fn positions(&self, member: &Member, results: &[AllocationResult]) -> Option<Vec<u16>> {
        let class = &self.classes[member.class];
        results
            .iter()
            .flat_map(|a| a.devices.iter().flat_map(|d| d.results.iter().flatten()))
            .map(|r| {
                let plain = r.share_id.is_none()
                    && r.admin_access.is_none()
                    && r.consumed_capacity.is_none()
                    && *r.pool == *member.pool;
                let key: ClassDevice = (r.driver.as_str().into(), r.device.as_str().into());
                class.position.get(&key).copied().filter(|_| plain)
            })
            .collect()
    }
}

/// What the selectors of the requested DeviceClasses read, if each says.
fn reads(
    device_classes: &[DeviceClass],
    requested: &BTreeSet<&str>,
    compiler: &Compiler,
) -> Option<BTreeSet<String>> {
    let mut names = BTreeSet::new();
    for class in device_classes {
        if !requested.contains(class.metadata.name.as_deref().unwrap_or_default()) {
            continue;
        }
        for selector in class.spec.selectors.iter().flatten() {
            let Some(cel) = &selector.cel else { continue };
            let compiled = compiler.compile(&cel.expression);
            names.extend(compiled.as_ref().as_ref().ok()?.reads()?);
        }
    }
    Some(names)
}

impl NodeClass {
    /// The class of the node `name` with `machine`, if one can be admitted.
    fn probe(
        name: &str,
        machine: &Machine,
        layout: Layout,
        device_classes: &[DeviceClass],
        reads: &BTreeSet<String>,
    ) -> Option<NodeClass> {
        let probe_name = format!("{name}-probe");
        let count = machine
            .gpus
            .iter()
            .map(|g| 1 + g.mig_devices.len())
            .sum::<usize>();
        let mut probe_machine = machine.clone();
        set_uuids(&mut probe_machine, |i| {
            format!("GPU-probe-{:08}", count - i)
        });
        let (a, b) = (
            slices(name, machine, layout),
            slices(&probe_name, &probe_machine, layout),
        );
        if !for_node_only(&a, name) || !for_node_only(&b, &probe_name) {
            return None;
        }
        // A member's slices must read as they would with every node's.
        Inventory::new(device_classes, &a).ok()?;
        // Slices are read sorted by name: the same order on both.
        let order = |s: &[ResourceSlice]| {
            let mut order: Vec<usize> = (0..s.len()).collect();
            order.sort_by(|&x, &y| s[x].metadata.name.cmp(&s[y].metadata.name));
            order
        };
        if order(&a) != order(&b) {
            return None;
        }
        let mut va = serde_json::to_value(&a).ok()?;
        let mut vb = serde_json::to_value(&b).ok()?;
        let (Value::Array(sa), Value::Array(sb)) = (&mut va, &mut vb) else {
            return None;
        };
        if sa.len() != sb.len() {
            return None;
        }
        for (x, y) in sa.iter_mut().zip(sb.iter_mut()) {
            for v in [&mut *x, &mut *y] {
                v["metadata"]["name"] = Value::Null;
                v["spec"]["nodeName"] = Value::Null;
                v["spec"]["pool"]["name"] = Value::Null;
            }
            let (Some(dx), Some(dy)) = (
                x["spec"]["devices"].as_array_mut(),
                y["spec"]["devices"].as_array_mut(),
            ) else {
                continue;
            };
            if dx.len() != dy.len() {
                return None;
            }
            for (p, q) in dx.iter_mut().zip(dy.iter_mut()) {
                let (Some(ap), Some(aq)) = (
                    p.get_mut("attributes").and_then(Value::as_object_mut),
                    q.get_mut("attributes").and_then(Value::as_object_mut),
                ) else {
                    continue;
                };
                let differ: Vec<String> = ap
                    .iter()
                    .filter(|(k, v)| aq.get(*k) != Some(*v))
                    .map(|(k, _)| k.clone())
                    .collect();
                for k in differ {
                    if reads.contains(&k) {
                        return None;
                    }
                    ap.remove(&k);
                    aq.remove(&k);
                }
            }
        }
        if va != vb {
            return None;
        }
        let devices: Vec<ClassDevice> = a
            .iter()
            .flat_map(|s| {
                let driver: Arc<str> = s.spec.driver.as_str().into();
                s.spec
                    .devices
                    .iter()
                    .flatten()
                    .map(move |d| (driver.clone(), d.name.as_str().into()))
            })
            .collect();
        let position: HashMap<ClassDevice, u16> = devices
            .iter()
            .enumerate()
            .map(|(i, d)| Some((d.clone(), u16::try_from(i).ok()?)))
            .collect::<Option<_>>()?;
        if position.len() != devices.len() {
            return None;
        }
        Some(NodeClass {
            devices,
            position,
            answers: HashMap::default(),
        })
    }
}

/// Whether `slices` are all for `node` by name, in one pool, with no device
/// shared, selecting nodes itself or waiting on binding conditions.
fn for_node_only(slices: &[ResourceSlice], node: &str) -> bool {
    let pools: BTreeSet<(&str, &str)> = slices
        .iter()
        .map(|s| (s.spec.driver.as_str(), s.spec.pool.name.as_str()))
        .collect();
    pools.len() <= 1
        && slices.iter().all(|s| {
            let spec = &s.spec;
            spec.node_name.as_deref() == Some(node)
                && spec.pool.name == node
                && spec.all_nodes.is_none_or(|a| !a)
                && spec.node_selector.is_none()
                && spec.per_device_node_selection.is_none_or(|p| !p)
                && spec.devices.iter().flatten().all(|d| {
                    d.allow_multiple_allocations.is_none_or(|m| !m)
                        && d.binding_conditions.is_none()
                        && d.binding_failure_conditions.is_none()
                        && d.binds_to_node.is_none_or(|b| !b)
                        && d.node_name.is_none()
                        && d.all_nodes.is_none()
                        && d.node_selector.is_none()
                })
        })
}

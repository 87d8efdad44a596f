//! The structured allocator: what the Kubernetes scheduler decides for a pod's
//! ResourceClaims on one node, with the semantics and the search order of
//! `k8s.io/dynamic-resource-allocation/structured` in the variant Kubernetes
//! 1.36 uses by default ("incubating": admin access, prioritized lists,
//! partitionable devices, device taints, binding conditions and consumable
//! capacity on; list-typed attributes off).
//!
//! Inputs are the `resource.k8s.io/v1` objects. They are read once into a
//! compact form ([`Allocator::new`]): quantities parsed exactly, device IDs
//! interned, selectors compiled once and cached by their text. Each
//! [`Allocator::allocate`] call then gathers the node's pools and searches
//! depth first exactly as Kubernetes does — pools sorted by driver and name
//! (pools with binding conditions last), slices by name, devices in slice
//! order — so the devices picked are the devices Kubernetes would pick.
//!
//! Two things differ on purpose and are invisible to the result's meaning:
//! share IDs are derived from the claim, request and device (UUID v5) instead
//! of drawn at random, so replays are byte-identical; and a failure is typed
//! ([`AllocateError`]) instead of a wrapped Go error.
//!
//! API defaults are applied as the API server would (`allocationMode:
//! ExactCount`, `count: 1`), so hand-written files behave like stored objects.

mod capacity;
mod case;
mod explain;
mod nodes;
mod pools;
mod search;

use std::borrow::Borrow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, OnceLock};

use k8s_openapi::api::core::v1::{Node, NodeSelector};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceClass, DeviceTaint, ResourceClaim, ResourceSlice,
};

use crate::cel::{self, Compiler, EvalError, PreparedDevice};
use crate::quantity::Quantity;

pub use case::{
    ClaimAllocation, NodeReport, Objects, Outcome, apply_defaults, is_allocated, outcome, report,
};
pub use explain::{Candidate, Explanation, RequestExplanation};
pub use nodes::{node_matches, selector_matches};

/// Kubernetes' limit on the devices of one claim (`AllocationResultsMaxSize`).
pub const ALLOCATION_RESULTS_MAX_SIZE: usize = 32;

/// An input object that cannot be used, named by object and field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{object}: {field}: {message}")]
pub struct InputError {
    pub object: String,
    pub field: String,
    pub message: String,
}

/// Why an allocation attempt produced no result.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AllocateError {
    /// The attempt is aborted for every node (Kubernetes returns a plain
    /// error): a CEL compile or runtime error, a missing class, a claim over
    /// the 32-device limit, a constraint an `All` request cannot meet...
    #[error("{0}")]
    Fatal(String),
    /// Only this node fails, with a reason (`ErrFailedAllocationOnNode`).
    #[error("{0}")]
    FailedOnNode(String),
}

/// A device's identity: driver, pool and device name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceId {
    pub driver: Arc<str>,
    pub pool: Arc<str>,
    pub device: Arc<str>,
}

impl std::fmt::Display for DeviceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.driver, self.pool, self.device)
    }
}

/// What existing allocations hold (the scheduler's `AllocatedState`).
#[derive(Clone, Debug, Default)]
pub struct AllocatedState {
    /// Devices allocated exclusively.
    pub devices: HashSet<DeviceId>,
    /// Devices allocated with a share ID (consumable capacity).
    pub shared: HashSet<(DeviceId, String)>,
    /// Capacity consumed on shared devices, summed per device.
    pub capacity: HashMap<DeviceId, BTreeMap<String, Quantity>>,
}

impl AllocatedState {
    /// The state the scheduler gathers from claims that have an allocation.
    pub fn from_claims<'a>(
        claims: impl IntoIterator<Item = &'a ResourceClaim>,
    ) -> Result<AllocatedState, InputError> {
        let mut state = AllocatedState::default();
        for claim in claims {
            if let Some(allocation) = claim.status.as_ref().and_then(|s| s.allocation.as_ref()) {
                state.add_checked(allocation, &claim_name(claim))?;
            }
        }
        Ok(state)
    }

    /// Adds one allocation (as the scheduler's tracker does when a claim's
    /// allocation is written); a consumed capacity that is not a quantity
    /// refuses the whole allocation, nothing of it added.
    pub fn add(&mut self, allocation: &AllocationResult) -> Result<(), InputError> {
        self.add_checked(allocation, "allocation")
    }

    fn add_checked(
        &mut self,
        allocation: &AllocationResult,
        object: &str,
    ) -> Result<(), InputError> {
        let results = allocation.devices.as_ref().and_then(|d| d.results.as_ref());
        // Read everything first: a bad quantity leaves the state as it was.
        let mut read = Vec::new();
        for (i, result) in results.into_iter().flatten().enumerate() {
            if result.admin_access == Some(true) {
                continue;
            }
            let id = DeviceId {
                driver: result.driver.as_str().into(),
                pool: result.pool.as_str().into(),
                device: result.device.as_str().into(),
            };
            let mut consumed = Vec::new();
            for (name, q) in result.consumed_capacity.iter().flatten() {
                let field =
                    format!("status.allocation.devices.results[{i}].consumedCapacity[{name}]");
                consumed.push((name.clone(), parse_quantity(object, &field, &q.0)?));
            }
            read.push((
                id,
                result.share_id.clone(),
                result.consumed_capacity.is_some(),
                consumed,
            ));
        }
        for (id, share, has_consumed, consumed) in read {
            let Some(share) = share else {
                self.devices.insert(id);
                continue;
            };
            self.shared.insert((id.clone(), share));
            if !has_consumed {
                continue;
            }
            let entry = self.capacity.entry(id).or_default();
            for (name, q) in consumed {
                let sum = entry.get(&name).map_or(q.clone(), |s| s.add(&q));
                entry.insert(name, sum);
            }
        }
        Ok(())
    }

    fn is_allocated(&self, id: &DeviceId) -> bool {
        self.devices.contains(id)
            || self.capacity.contains_key(id)
            || self.shared.iter().any(|(d, _)| d == id)
    }
}

/// `namespace/name`, or `name` for an object without a namespace.
pub fn claim_name(claim: &ResourceClaim) -> String {
    let name = claim.metadata.name.as_deref().unwrap_or_default();
    match claim.metadata.namespace.as_deref() {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name.to_string(),
    }
}

fn parse_quantity(object: &str, field: &str, text: &str) -> Result<Quantity, InputError> {
    Quantity::parse(text).map_err(|e| InputError {
        object: object.to_string(),
        field: field.to_string(),
        message: format!("{text:?} is not a quantity: {e}"),
    })
}

/// A request policy of a consumable capacity.
#[derive(Clone, Debug)]
pub(crate) struct Policy {
    pub default: Option<Quantity>,
    pub valid_values: Vec<Quantity>,
    pub range: Option<Range>,
}

#[derive(Clone, Debug)]
pub(crate) struct Range {
    pub min: Option<Quantity>,
    pub max: Option<Quantity>,
    pub step: Option<Quantity>,
}

#[derive(Clone, Debug)]
pub(crate) struct Capacity {
    pub value: Quantity,
    /// Boxed: most capacities have none, and a device's map of them is a
    /// whole B-tree node of these.
    pub policy: Option<Box<Policy>>,
}

/// A device, read once.
#[derive(Debug)]
pub(crate) struct Device {
    pub name: Arc<str>,
    /// The device as selectors see it (attributes keyed as published).
    pub cel: cel::Device,
    /// Why every selector on the device fails (an attribute without a
    /// single value, a version that does not parse), checked once.
    attribute_error: Option<EvalError>,
    prepared: OnceLock<Result<PreparedDevice, EvalError>>,
    pub capacity: BTreeMap<String, Capacity>,
    pub allow_multiple: Option<bool>,
    pub consumes: Vec<(String, BTreeMap<String, Quantity>)>,
    pub taints: Vec<DeviceTaint>,
    pub binding_conditions: Option<Vec<String>>,
    pub binding_failure_conditions: Option<Vec<String>>,
    pub binds_to_node: bool,
    pub node_name: Option<String>,
    pub all_nodes: bool,
    pub node_selector: Option<NodeSelector>,
}

/// A ResourceSlice, read once.
#[derive(Debug)]
pub(crate) struct Slice {
    pub name: String,
    pub driver: Arc<str>,
    pub pool: Arc<str>,
    pub generation: i64,
    pub slice_count: i64,
    pub node_name: Option<String>,
    pub all_nodes: bool,
    pub node_selector: Option<NodeSelector>,
    pub per_device_node_selection: bool,
    pub shared_counters: Vec<(String, BTreeMap<String, Quantity>)>,
    pub devices: Vec<Device>,
}

impl Slice {
    pub fn device_id(&self, index: usize) -> DeviceId {
        DeviceId {
            driver: self.driver.clone(),
            pool: self.pool.clone(),
            device: self.devices[index].name.clone(),
        }
    }
}

/// ResourceSlices and DeviceClasses read once; shared by the allocators of
/// many attempts (each with its own [`AllocatedState`]).
pub struct Inventory {
    classes: BTreeMap<String, DeviceClass>,
    slices: Vec<Slice>,
    /// Slices naming a node, by node; the others (and counter slices) apply
    /// to every node.
    slices_on_node: HashMap<String, Vec<usize>>,
    slices_shared: Vec<usize>,
    /// Pools gathered per node, with the labels they were gathered for
    /// (the inventory does not change; a node's labels may).
    gathered: std::sync::Mutex<HashMap<String, GatheredPools>>,
    /// Each pool's slices (any generation), in input order.
    by_pool: HashMap<(Arc<str>, Arc<str>), Vec<usize>>,
    /// Pools built from a set of slices (and whether slices for other nodes
    /// completed them).
    built: std::sync::Mutex<HashMap<(Vec<usize>, bool), BuiltPool>>,
}

type BuiltPool = Arc<pools::Pool>;
type GatheredPools = (BTreeMap<String, String>, Arc<Vec<Arc<pools::Pool>>>);

impl Inventory {
    /// Reads `classes` and `slices`; the slices one at a time, so that a
    /// caller can make each as it goes (`&[ResourceSlice]` works too).
    pub fn new<S: Borrow<ResourceSlice>>(
        classes: &[DeviceClass],
        slices: impl IntoIterator<Item = S>,
    ) -> Result<Inventory, InputError> {
        let slices = slices.into_iter();
        let mut read = Vec::with_capacity(slices.size_hint().0);
        for s in slices {
            read.push(read_slice(s.borrow())?);
        }
        let mut slices_on_node: HashMap<String, Vec<usize>> = HashMap::new();
        let mut slices_shared = Vec::new();
        let mut by_pool: HashMap<(Arc<str>, Arc<str>), Vec<usize>> = HashMap::new();
        for (i, s) in read.iter().enumerate() {
            by_pool
                .entry((s.driver.clone(), s.pool.clone()))
                .or_default()
                .push(i);
            match s.node_name.as_deref() {
                Some(node) if !node.is_empty() && s.shared_counters.is_empty() => {
                    slices_on_node.entry(node.to_string()).or_default().push(i)
                }
                _ => slices_shared.push(i),
            }
        }
        Ok(Inventory {
            classes: classes
                .iter()
                .map(|c| (c.metadata.name.clone().unwrap_or_default(), c.clone()))
                .collect(),
            slices: read,
            slices_on_node,
            slices_shared,
            gathered: Default::default(),
            by_pool,
            built: Default::default(),
        })
    }
}

/// Allocates claims on nodes against one snapshot of slices, classes and
/// existing allocations. Thread-safe; reuse it across nodes.
pub struct Allocator {
    state: AllocatedState,
    inventory: Arc<Inventory>,
    compiler: Arc<Compiler>,
    /// Counters left by existing allocations, per pool name (Kubernetes keys
    /// this cache by pool name alone, and so does this).
    available_counters: std::sync::Mutex<HashMap<Arc<str>, Arc<Counters>>>,
}

/// Counter sets: set name → counter name → value.
pub(crate) type Counters = BTreeMap<String, BTreeMap<String, Quantity>>;

impl std::ops::Deref for Allocator {
    type Target = Inventory;

    fn deref(&self) -> &Inventory {
        &self.inventory
    }
}

impl Allocator {
    pub fn new(
        state: AllocatedState,
        classes: &[DeviceClass],
        slices: &[ResourceSlice],
        compiler: Arc<Compiler>,
    ) -> Result<Allocator, InputError> {
        Ok(Allocator::with_inventory(
            Arc::new(Inventory::new(classes, slices)?),
            state,
            compiler,
        ))
    }

    /// An allocator over an inventory read before.
    pub fn with_inventory(
        inventory: Arc<Inventory>,
        state: AllocatedState,
        compiler: Arc<Compiler>,
    ) -> Allocator {
        Allocator {
            state,
            inventory,
            compiler,
            available_counters: Default::default(),
        }
    }

    /// Gives back the existing allocations (to extend them for the next attempt).
    pub fn into_state(self) -> AllocatedState {
        self.state
    }

    /// The existing allocations this allocator works on top of.
    pub fn state(&self) -> &AllocatedState {
        &self.state
    }

    /// Allocates `claims` together on `node`, in order, as the scheduler does
    /// for one pod. `Ok(None)`: they do not fit on this node.
    pub fn allocate(
        &self,
        node: &Node,
        claims: &[&ResourceClaim],
    ) -> Result<Option<Vec<AllocationResult>>, AllocateError> {
        search::Run::new(self, node, claims)?.allocate()
    }

    /// For each request of `claims` on `node`, every candidate device with the
    /// first reason it was passed over (or that it fits on its own).
    pub fn explain(
        &self,
        node: &Node,
        claims: &[&ResourceClaim],
    ) -> Result<Explanation, AllocateError> {
        explain::explain(self, node, claims)
    }

    fn matches(&self, selector: &str, device: &Device) -> Result<bool, SelectorFailure> {
        self.matches_compiled(&self.compiler.compile(selector), device)
    }

    pub(crate) fn compile(&self, selector: &str) -> Compiled {
        self.compiler.compile(selector)
    }

    pub(crate) fn matches_compiled(
        &self,
        compiled: &Compiled,
        device: &Device,
    ) -> Result<bool, SelectorFailure> {
        let selector = match compiled.as_ref() {
            Ok(s) => s,
            Err(e) => return Err(SelectorFailure::Compile(e.to_string())),
        };
        if let Some(err) = &device.attribute_error {
            return Err(SelectorFailure::Runtime(err.to_string()));
        }
        if selector.is_fast() {
            return self
                .compiler
                .matches_checked(selector, &device.cel)
                .map_err(|e| SelectorFailure::Runtime(e.to_string()));
        }
        let prepared = device
            .prepared
            .get_or_init(|| self.compiler.prepare(&device.cel));
        match prepared {
            Ok(p) => self.compiler.matches_prepared(selector, p),
            Err(e) => Err(e.clone()),
        }
        .map_err(|e| SelectorFailure::Runtime(e.to_string()))
    }
}

/// A selector compiled once (or its compile error).
pub(crate) type Compiled = Arc<Result<cel::Selector, cel::CompileError>>;

pub(crate) enum SelectorFailure {
    Compile(String),
    Runtime(String),
}

fn read_slice(s: &ResourceSlice) -> Result<Slice, InputError> {
    let object = format!(
        "ResourceSlice {}",
        s.metadata.name.as_deref().unwrap_or_default()
    );
    let spec = &s.spec;
    let q = |field: String, text: &str| parse_quantity(&object, &field, text);
    let mut shared_counters = Vec::new();
    for (i, set) in spec.shared_counters.iter().flatten().enumerate() {
        let mut counters = BTreeMap::new();
        for (name, c) in &set.counters {
            counters.insert(
                name.clone(),
                q(
                    format!("spec.sharedCounters[{i}].counters[{name}].value"),
                    &c.value.0,
                )?,
            );
        }
        shared_counters.push((set.name.clone(), counters));
    }
    let mut devices = Vec::new();
    for (i, d) in spec.devices.iter().flatten().enumerate() {
        let field = |rest: &str| format!("spec.devices[{i}].{rest}");
        let mut attributes = BTreeMap::new();
        for (name, a) in d.attributes.iter().flatten() {
            let value = if let Some(v) = a.int {
                cel::Attribute::Int(v)
            } else if let Some(v) = a.bool {
                cel::Attribute::Bool(v)
            } else if let Some(v) = &a.string {
                cel::Attribute::String(v.clone())
            } else if let Some(v) = &a.version {
                cel::Attribute::Version(v.clone())
            } else {
                // A list (list-typed attributes are an alpha feature, off in
                // 1.36) or nothing: every selector on the device fails.
                cel::Attribute::Unsupported
            };
            attributes.insert(name.clone(), value);
        }
        let mut capacity = BTreeMap::new();
        let mut cel_capacity = BTreeMap::new();
        for (name, c) in d.capacity.iter().flatten() {
            let value = q(field(&format!("capacity[{name}].value")), &c.value.0)?;
            let policy = match &c.request_policy {
                None => None,
                Some(p) => {
                    let pf = |rest: &str| field(&format!("capacity[{name}].requestPolicy.{rest}"));
                    let opt =
                        |v: &Option<k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
                         rest: &str| {
                            v.as_ref().map(|v| q(pf(rest), &v.0)).transpose()
                        };
                    Some(Box::new(Policy {
                        default: opt(&p.default, "default")?,
                        valid_values: p
                            .valid_values
                            .iter()
                            .flatten()
                            .enumerate()
                            .map(|(j, v)| q(pf(&format!("validValues[{j}]")), &v.0))
                            .collect::<Result<_, _>>()?,
                        range: match &p.valid_range {
                            None => None,
                            Some(r) => Some(Range {
                                min: Some(q(pf("validRange.min"), &r.min.0)?),
                                max: opt(&r.max, "validRange.max")?,
                                step: opt(&r.step, "validRange.step")?,
                            }),
                        },
                    }))
                }
            };
            cel_capacity.insert(name.clone(), value.clone());
            capacity.insert(name.clone(), Capacity { value, policy });
        }
        let mut consumes = Vec::new();
        for (j, c) in d.consumes_counters.iter().flatten().enumerate() {
            let mut counters = BTreeMap::new();
            for (name, v) in &c.counters {
                counters.insert(
                    name.clone(),
                    q(
                        field(&format!("consumesCounters[{j}].counters[{name}].value")),
                        &v.value.0,
                    )?,
                );
            }
            consumes.push((c.counter_set.clone(), counters));
        }
        let cel = cel::Device {
            driver: spec.driver.clone(),
            allow_multiple_allocations: d.allow_multiple_allocations.unwrap_or(false),
            attributes,
            capacity: cel_capacity,
        };
        devices.push(Device {
            name: d.name.as_str().into(),
            attribute_error: cel.attribute_error(),
            cel,
            prepared: OnceLock::new(),
            capacity,
            allow_multiple: d.allow_multiple_allocations,
            consumes,
            taints: d.taints.clone().unwrap_or_default(),
            binding_conditions: d.binding_conditions.clone(),
            binding_failure_conditions: d.binding_failure_conditions.clone(),
            binds_to_node: d.binds_to_node.unwrap_or(false),
            node_name: d.node_name.clone(),
            all_nodes: d.all_nodes.unwrap_or(false),
            node_selector: d.node_selector.clone(),
        });
    }
    Ok(Slice {
        name: s.metadata.name.clone().unwrap_or_default(),
        driver: spec.driver.as_str().into(),
        pool: spec.pool.name.as_str().into(),
        generation: spec.pool.generation,
        slice_count: spec.pool.resource_slice_count,
        node_name: spec.node_name.clone(),
        all_nodes: spec.all_nodes.unwrap_or(false),
        node_selector: spec.node_selector.clone(),
        per_device_node_selection: spec.per_device_node_selection.unwrap_or(false),
        shared_counters,
        devices,
    })
}

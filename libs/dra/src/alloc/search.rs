//! One allocation attempt: the depth-first search over claims, requests,
//! subrequests and devices, in Kubernetes' order, with every side effect of a
//! tentative pick (constraints, counters, shared capacity, the in-use set)
//! undone on backtracking.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationConfiguration, DeviceAllocationResult, DeviceClass,
    DeviceRequest, DeviceRequestAllocationResult, DeviceTaint, DeviceToleration, ResourceClaim,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as WireQuantity;

use super::capacity::{self, Amounts};
use super::nodes::node_matches;
use super::pools::{self, Pool};
use super::{
    ALLOCATION_RESULTS_MAX_SIZE, AllocateError, Allocator, Compiled, Counters, Device, DeviceId,
    SelectorFailure, claim_name, parse_quantity,
};

/// One request (or one subrequest of a `firstAvailable` list), read once.
pub(crate) struct RequestData<'a> {
    pub name: &'a str,
    /// The request a subrequest belongs to.
    pub parent: Option<&'a str>,
    pub class: &'a DeviceClass,
    pub all: bool,
    pub num_devices: usize,
    pub admin: bool,
    pub selectors: Vec<&'a str>,
    compiled: Vec<Compiled>,
    class_compiled: Vec<(usize, Compiled)>,
    pub tolerations: &'a [DeviceToleration],
    pub capacity: Option<Amounts>,
    /// For `All`: the devices, found up front.
    pub all_devices: Vec<Loc>,
}

impl RequestData<'_> {
    pub fn full_name(&self) -> String {
        match self.parent {
            Some(parent) => format!("{parent}/{}", self.name),
            None => self.name.to_string(),
        }
    }
}

/// A request's alternatives: one for a plain request, the subrequests in
/// order for `firstAvailable`.
pub(crate) struct Entry<'a> {
    pub alternatives: Vec<RequestData<'a>>,
    pub selected: usize,
}

/// Where a device is: pool (in gathering order), slice (index into the
/// allocator's slices) and device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Loc {
    pub pool: usize,
    pub slice: usize,
    pub device: usize,
}

#[derive(Clone, Copy, Default)]
struct Indices {
    claim: usize,
    request: usize,
    sub: usize,
    device: usize,
}

/// Where the scan for the next device of a request resumes.
#[derive(Clone, Copy, Default)]
struct Resume {
    pool: usize,
    slice_pos: usize,
    device: usize,
}

enum Stop {
    /// The claim would exceed 32 devices down this path.
    MaxSize,
    Fatal(String),
}

struct Picked {
    loc: Loc,
    id: DeviceId,
    request: String,
    parent: Option<String>,
    share_id: Option<String>,
    consumed: Option<Amounts>,
    admin: bool,
}

#[derive(Default)]
struct Undo {
    counters: bool,
    constraints: usize,
    marked: bool,
    capacity: Option<(Amounts, bool)>,
    result_len: Option<usize>,
}

/// A `matchAttribute` or `distinctAttribute` constraint of a claim.
pub(crate) struct Constraint {
    requests: Vec<String>,
    attribute: String,
    distinct: bool,
    /// matchAttribute: the first device's value; distinctAttribute: the
    /// values seen, keyed by request name as Kubernetes keys them.
    values: BTreeMap<String, crate::cel::Attribute>,
    count: usize,
}

impl Constraint {
    fn applies(&self, request: &str, sub: Option<&str>) -> bool {
        self.requests.is_empty()
            || self.requests.iter().any(|r| r == request)
            || sub.is_some_and(|s| self.requests.iter().any(|r| *r == format!("{request}/{s}")))
    }

    fn add(&mut self, request: &str, sub: Option<&str>, driver: &str, device: &Device) -> bool {
        if !self.applies(request, sub) {
            return true;
        }
        let Some(value) = lookup_attribute(device, driver, &self.attribute) else {
            return false;
        };
        if self.count == 0 {
            self.values.insert(request.to_string(), value.clone());
            self.count = 1;
            return true;
        }
        let same = |a: &crate::cel::Attribute, b: &crate::cel::Attribute| a == b;
        if self.distinct {
            if self.values.values().any(|seen| same(seen, value)) {
                return false;
            }
            self.values.insert(request.to_string(), value.clone());
        } else if !self
            .values
            .values()
            .next()
            .is_some_and(|first| same(first, value))
        {
            return false;
        }
        self.count += 1;
        true
    }

    fn remove(&mut self, request: &str, sub: Option<&str>) {
        if !self.applies(request, sub) {
            return;
        }
        if self.distinct {
            self.values.remove(request);
        }
        self.count -= 1;
        if !self.distinct && self.count == 0 {
            self.values.clear();
        }
    }
}

/// The attribute a constraint names: fully qualified, or under the driver's
/// domain when the device publishes it unqualified.
pub(crate) fn lookup_attribute<'d>(
    device: &'d Device,
    driver: &str,
    name: &str,
) -> Option<&'d crate::cel::Attribute> {
    if let Some(v) = device.cel.attributes.get(name) {
        return Some(v);
    }
    let (domain, short) = name.split_once('/')?;
    if domain != driver {
        return None;
    }
    device.cel.attributes.get(short)
}

pub(crate) struct Run<'a> {
    pub a: &'a Allocator,
    pub node: &'a Node,
    pub claims: &'a [&'a ResourceClaim],
    pub pools: Arc<Vec<Arc<Pool>>>,
    pub requests: Vec<Vec<Entry<'a>>>,
    constraints: Vec<Vec<Constraint>>,
    matches: RefCell<HashMap<(Loc, usize, usize, usize), bool>>,
    allocating: HashMap<DeviceId, Vec<usize>>,
    allocating_capacity: HashMap<DeviceId, Amounts>,
    consumed_counters: HashMap<Arc<str>, Counters>,
    results: Vec<Vec<Picked>>,
}

fn fatal(e: String) -> AllocateError {
    AllocateError::Fatal(e)
}

impl<'a> Run<'a> {
    /// Gathers the pools and reads and checks every request, as Kubernetes
    /// does before searching.
    pub fn new(
        a: &'a Allocator,
        node: &'a Node,
        claims: &'a [&'a ResourceClaim],
    ) -> Result<Run<'a>, AllocateError> {
        let pools =
            pools::gathered(a, node).map_err(|e| fatal(format!("gather pool information: {e}")))?;
        let mut run = Run {
            a,
            node,
            claims,
            pools,
            requests: Vec::with_capacity(claims.len()),
            constraints: Vec::with_capacity(claims.len()),
            matches: RefCell::default(),
            allocating: HashMap::new(),
            allocating_capacity: HashMap::new(),
            consumed_counters: HashMap::new(),
            results: claims.iter().map(|_| Vec::new()).collect(),
        };
        for (c, claim) in claims.iter().enumerate() {
            let name = claim_name(claim);
            let devices = claim.spec.devices.as_ref();
            let mut entries = Vec::new();
            let mut min_devices = 0usize;
            for (r, request) in devices
                .and_then(|d| d.requests.as_ref())
                .into_iter()
                .flatten()
                .enumerate()
            {
                let subs = request.first_available.as_deref().unwrap_or_default();
                let mut alternatives = Vec::new();
                if subs.is_empty() {
                    let data = run.read_request(c, r, 0, &name, request, None)?;
                    min_devices += data.num_devices;
                    alternatives.push(data);
                } else {
                    let mut min = usize::MAX;
                    for (s, _) in subs.iter().enumerate() {
                        let data = run.read_request(c, r, s, &name, request, Some(s))?;
                        min = min.min(data.num_devices);
                        alternatives.push(data);
                    }
                    min_devices += min;
                }
                entries.push(Entry {
                    alternatives,
                    selected: 0,
                });
            }
            run.requests.push(entries);
            if min_devices > ALLOCATION_RESULTS_MAX_SIZE {
                return Err(fatal(format!(
                    "claim {name}: number of requested devices {min_devices} exceeds the claim limit of {ALLOCATION_RESULTS_MAX_SIZE}"
                )));
            }
            let mut constraints = Vec::new();
            for (i, constraint) in devices
                .and_then(|d| d.constraints.as_ref())
                .into_iter()
                .flatten()
                .enumerate()
            {
                let (attribute, distinct) = match (
                    &constraint.match_attribute,
                    &constraint.distinct_attribute,
                ) {
                    (Some(m), _) => (m.clone(), false),
                    (None, Some(d)) => (d.clone(), true),
                    (None, None) => {
                        return Err(fatal(format!(
                            "claim {name}, constraint #{i}: empty constraint (unsupported constraint type?)"
                        )));
                    }
                };
                constraints.push(Constraint {
                    requests: constraint.requests.clone().unwrap_or_default(),
                    attribute,
                    distinct,
                    values: BTreeMap::new(),
                    count: 0,
                });
            }
            run.constraints.push(constraints);
        }
        Ok(run)
    }

    fn read_request(
        &self,
        c: usize,
        r: usize,
        s: usize,
        claim: &str,
        request: &'a DeviceRequest,
        sub: Option<usize>,
    ) -> Result<RequestData<'a>, AllocateError> {
        let field = |rest: &str| match sub {
            Some(s) => format!("spec.devices.requests[{r}].firstAvailable[{s}].{rest}"),
            None => format!("spec.devices.requests[{r}].exactly.{rest}"),
        };
        let (name, parent, class_name, mode, count, admin, selectors, tolerations, wire_capacity) =
            match sub {
                Some(s) => {
                    let q = &request.first_available.as_deref().unwrap_or_default()[s];
                    (
                        q.name.as_str(),
                        Some(request.name.as_str()),
                        q.device_class_name.as_str(),
                        q.allocation_mode.as_deref(),
                        q.count,
                        None,
                        q.selectors.as_deref().unwrap_or_default(),
                        q.tolerations.as_deref().unwrap_or_default(),
                        q.capacity.as_ref(),
                    )
                }
                None => {
                    let Some(q) = &request.exactly else {
                        return Err(fatal(format!(
                            "claim {claim}, request {}: neither exactly nor firstAvailable is set",
                            request.name
                        )));
                    };
                    (
                        request.name.as_str(),
                        None,
                        q.device_class_name.as_str(),
                        q.allocation_mode.as_deref(),
                        q.count,
                        q.admin_access,
                        q.selectors.as_deref().unwrap_or_default(),
                        q.tolerations.as_deref().unwrap_or_default(),
                        q.capacity.as_ref(),
                    )
                }
            };
        let mut cel = Vec::with_capacity(selectors.len());
        for (i, selector) in selectors.iter().enumerate() {
            let Some(expr) = &selector.cel else {
                return Err(fatal(format!(
                    "claim {claim}, request {name}, selector #{i}: CEL expression empty (unsupported selector type?)"
                )));
            };
            cel.push(expr.expression.as_str());
        }
        if class_name.is_empty() {
            return Err(fatal(format!(
                "claim {claim}, request {name}: missing device class name (unsupported request type?)"
            )));
        }
        let Some(class) = self.a.classes.get(class_name) else {
            return Err(fatal(format!(
                "claim {claim}, request {name}: could not retrieve device class {class_name}: deviceclass.resource.k8s.io \"{class_name}\" not found"
            )));
        };
        let capacity = match wire_capacity.and_then(|c| c.requests.as_ref()) {
            None => None,
            Some(requests) => Some(
                requests
                    .iter()
                    .map(|(n, q)| {
                        parse_quantity(claim, &field(&format!("capacity.requests[{n}]")), &q.0)
                            .map(|q| (n.clone(), q))
                    })
                    .collect::<Result<Amounts, _>>()
                    .map_err(|e| fatal(e.to_string()))?,
            ),
        };
        let mut data = RequestData {
            name,
            parent,
            class,
            all: false,
            num_devices: 0,
            admin: admin == Some(true),
            compiled: cel.iter().map(|e| self.a.compile(e)).collect(),
            class_compiled: class
                .spec
                .selectors
                .iter()
                .flatten()
                .enumerate()
                .filter_map(|(i, s)| s.cel.as_ref().map(|c| (i, self.a.compile(&c.expression))))
                .collect(),
            selectors: cel,
            tolerations,
            capacity,
            all_devices: Vec::new(),
        };
        // API defaulting: an unset mode is ExactCount, an unset count 1.
        match mode.unwrap_or("ExactCount") {
            "ExactCount" => {
                data.num_devices = usize::try_from(count.unwrap_or(1)).unwrap_or(0);
            }
            "All" => {
                data.all = true;
                for p in 0..self.pools.len() {
                    let pool = &self.pools[p];
                    if pool.incomplete {
                        return Err(fatal(format!(
                            "claim {claim}, request {name}: asks for all devices, but resource pool {} is currently being updated",
                            pool.id()
                        )));
                    }
                    if pool.invalid.is_some() {
                        return Err(fatal(format!(
                            "claim {claim}, request {name}: asks for all devices, but resource pool {} is currently invalid",
                            pool.id()
                        )));
                    }
                    for si in 0..pool.slices.len() {
                        let slice = self.pools[p].slices[si];
                        for d in 0..self.a.slices[slice].devices.len() {
                            let loc = Loc {
                                pool: p,
                                slice,
                                device: d,
                            };
                            if !self.selectable((c, r, s), &data, loc)? {
                                continue;
                            }
                            if self.capacity_fits(&data, loc).is_err() {
                                continue;
                            }
                            data.all_devices.push(loc);
                        }
                    }
                }
                data.num_devices = data.all_devices.len();
            }
            other => {
                return Err(fatal(format!(
                    "claim {claim}, request {name}: unsupported count mode {other}"
                )));
            }
        }
        Ok(data)
    }

    pub fn device(&self, loc: Loc) -> &'a Device {
        &self.a.slices[loc.slice].devices[loc.device]
    }

    pub fn device_id(&self, loc: Loc) -> DeviceId {
        self.a.slices[loc.slice].device_id(loc.device)
    }

    /// Class and request selectors, and per-device node selection; cached.
    pub fn selectable(
        &self,
        key: (usize, usize, usize),
        data: &RequestData<'a>,
        loc: Loc,
    ) -> Result<bool, AllocateError> {
        if let Some(&hit) = self.matches.borrow().get(&(loc, key.0, key.1, key.2)) {
            return Ok(hit);
        }
        let verdict = self.selectable_uncached(key.0, data, loc)?;
        self.matches
            .borrow_mut()
            .insert((loc, key.0, key.1, key.2), verdict);
        Ok(verdict)
    }

    fn selectable_uncached(
        &self,
        c: usize,
        data: &RequestData<'a>,
        loc: Loc,
    ) -> Result<bool, AllocateError> {
        let device = self.device(loc);
        let class_name = data.class.metadata.name.as_deref().unwrap_or_default();
        for (i, compiled) in &data.class_compiled {
            match self.a.matches_compiled(compiled, device) {
                Ok(true) => {}
                Ok(false) => return Ok(false),
                Err(SelectorFailure::Compile(e)) => {
                    return Err(fatal(format!(
                        "class {class_name}: selector #{i}: CEL compile error: {e}"
                    )));
                }
                Err(SelectorFailure::Runtime(e)) => {
                    return Err(fatal(format!(
                        "class {class_name}: selector #{i}: CEL runtime error: {e}"
                    )));
                }
            }
        }
        let claim = || claim_name(self.claims[c]);
        for (i, compiled) in data.compiled.iter().enumerate() {
            match self.a.matches_compiled(compiled, device) {
                Ok(true) => {}
                Ok(false) => return Ok(false),
                Err(SelectorFailure::Compile(e)) => {
                    return Err(fatal(format!(
                        "claim {}: selector #{i}: CEL compile error: {e}",
                        claim()
                    )));
                }
                Err(SelectorFailure::Runtime(e)) => {
                    return Err(fatal(format!(
                        "claim {}: selector #{i}: CEL runtime error: {e}",
                        claim()
                    )));
                }
            }
        }
        if self.a.slices[loc.slice].per_device_node_selection {
            return node_matches(
                self.node,
                device.node_name.as_deref(),
                device.all_nodes,
                device.node_selector.as_ref(),
            )
            .map_err(fatal);
        }
        Ok(true)
    }

    pub fn capacity_fits(&self, data: &RequestData<'a>, loc: Loc) -> Result<(), capacity::Misfit> {
        let id = self.device_id(loc);
        capacity::fits(
            self.a.state.capacity.get(&id),
            data.capacity.as_ref(),
            &self.device(loc).capacity,
            self.allocating_capacity.get(&id),
        )
    }

    fn in_use(&self, id: &DeviceId) -> bool {
        self.a.state.devices.contains(id) || self.allocating.get(id).is_some_and(|c| !c.is_empty())
    }

    fn allocating_for(&self, id: &DeviceId, claim: usize) -> bool {
        self.allocating.get(id).is_some_and(|c| c.contains(&claim))
    }

    pub fn allocate(mut self) -> Result<Option<Vec<AllocationResult>>, AllocateError> {
        match self.allocate_one(Indices::default(), false, Resume::default()) {
            Err(Stop::Fatal(e)) => Err(AllocateError::Fatal(e)),
            Err(Stop::MaxSize) => Err(AllocateError::Fatal("allocation max size exceeded".into())),
            Ok(false) => {
                if self.pools.iter().any(|p| p.invalid.is_some()) {
                    return Err(AllocateError::FailedOnNode(
                        "invalid resource pools were encountered".into(),
                    ));
                }
                Ok(None)
            }
            Ok(true) => self.results().map(Some),
        }
    }

    fn data(&self, r: Indices) -> &RequestData<'a> {
        &self.requests[r.claim][r.request].alternatives[r.sub]
    }

    fn allocate_one(
        &mut self,
        r: Indices,
        allocate_sub: bool,
        start: Resume,
    ) -> Result<bool, Stop> {
        if r.claim >= self.claims.len() {
            return Ok(true);
        }
        if r.request >= self.requests[r.claim].len() {
            return match self.allocate_one(
                Indices {
                    claim: r.claim + 1,
                    ..Indices::default()
                },
                false,
                Resume::default(),
            ) {
                Err(Stop::MaxSize) => Ok(false),
                other => other,
            };
        }
        let entry = &self.requests[r.claim][r.request];
        if !allocate_sub && entry.alternatives[0].parent.is_some() {
            let n = entry.alternatives.len();
            let mut all_exceeded = true;
            for sub in 0..n {
                match self.allocate_one(Indices { sub, ..r }, true, Resume::default()) {
                    Err(Stop::MaxSize) => continue,
                    Err(e) => return Err(e),
                    Ok(true) => {
                        self.requests[r.claim][r.request].selected = sub;
                        return Ok(true);
                    }
                    Ok(false) => all_exceeded = false,
                }
            }
            return if all_exceeded {
                Err(Stop::MaxSize)
            } else {
                Ok(false)
            };
        }
        let data = self.data(r);
        if data.all && data.all_devices.is_empty() {
            return Ok(false);
        }
        if r.device >= data.num_devices {
            return self.allocate_one(
                Indices {
                    claim: r.claim,
                    request: r.request + 1,
                    ..Indices::default()
                },
                false,
                Resume::default(),
            );
        }
        if self.results[r.claim].len() + data.num_devices - r.device > ALLOCATION_RESULTS_MAX_SIZE {
            return Err(Stop::MaxSize);
        }
        if data.all {
            let loc = data.all_devices[r.device];
            let Some(undo) = self.allocate_device(r, loc, true)? else {
                return Ok(false);
            };
            let done = self.allocate_one(
                Indices {
                    device: r.device + 1,
                    ..r
                },
                allocate_sub,
                Resume::default(),
            );
            if !matches!(done, Ok(true)) {
                self.rollback(r, loc, undo);
            }
            return done;
        }
        let admin = data.admin;
        let key = (r.claim, r.request, r.sub);
        for p in start.pool..self.pools.len() {
            let pool = &self.pools[p];
            if pool.incomplete || pool.invalid.is_some() {
                continue;
            }
            let slice_start = if p == start.pool { start.slice_pos } else { 0 };
            for slice_pos in slice_start..self.pools[p].slices.len() {
                let slice = self.pools[p].slices[slice_pos];
                let device_start = if p == start.pool && slice_pos == start.slice_pos {
                    start.device
                } else {
                    0
                };
                for d in device_start..self.a.slices[slice].devices.len() {
                    let loc = Loc {
                        pool: p,
                        slice,
                        device: d,
                    };
                    let id = self.device_id(loc);
                    if admin && self.allocating_for(&id, r.claim) {
                        continue;
                    }
                    if !admin && self.in_use(&id) {
                        continue;
                    }
                    let data = self.data(r);
                    let selectable = self
                        .selectable(key, data, loc)
                        .map_err(|e| Stop::Fatal(e.to_string()))?
                        && self.capacity_fits(data, loc).is_ok();
                    if !selectable {
                        continue;
                    }
                    let Some(undo) = self.allocate_device(r, loc, false)? else {
                        continue;
                    };
                    let next = Resume {
                        pool: p,
                        slice_pos,
                        device: d + 1,
                    };
                    match self.allocate_one(
                        Indices {
                            device: r.device + 1,
                            ..r
                        },
                        allocate_sub,
                        next,
                    ) {
                        Ok(true) => return Ok(true),
                        Ok(false) => self.rollback(r, loc, undo),
                        Err(e) => {
                            self.rollback(r, loc, undo);
                            return Err(e);
                        }
                    }
                }
            }
        }
        Ok(false)
    }

    /// Tentatively picks a device; `None` when it cannot be taken.
    fn allocate_device(&mut self, r: Indices, loc: Loc, must: bool) -> Result<Option<Undo>, Stop> {
        let device = self.device(loc);
        let id = self.device_id(loc);
        let data = self.data(r);
        let admin = data.admin;
        let multiple = device.allow_multiple == Some(true);
        if !multiple && admin && self.allocating_for(&id, r.claim) {
            return Ok(None);
        }
        if !admin && self.in_use(&id) {
            return Ok(None);
        }
        let skip_counters = multiple
            && (self.a.state.capacity.contains_key(&id)
                || self.allocating_capacity.contains_key(&id));
        let mut undo = Undo::default();
        if !skip_counters && !device.consumes.is_empty() {
            if !self.reserve_counters(loc) {
                return Ok(None);
            }
            undo.counters = true;
        }
        let data = self.data(r);
        let (base, sub) = match data.parent {
            None => (data.name, None),
            Some(parent) => (parent, Some(data.name)),
        };
        if taint_prevents(&device.taints, data.tolerations) {
            self.rollback(r, loc, undo);
            return Ok(None);
        }
        let driver = self.a.slices[loc.slice].driver.clone();
        for i in 0..self.constraints[r.claim].len() {
            if !self.constraints[r.claim][i].add(base, sub, &driver, device) {
                self.rollback(r, loc, undo);
                if must {
                    return Err(Stop::Fatal(format!(
                        "claim {}, request {}: cannot add device {id} because a claim constraint would not be satisfied",
                        claim_name(self.claims[r.claim]),
                        self.data(r).name
                    )));
                }
                return Ok(None);
            }
            undo.constraints += 1;
        }
        if !multiple {
            self.allocating.entry(id.clone()).or_default().push(r.claim);
            undo.marked = true;
        }
        let data = self.data(r);
        if self.capacity_fits(data, loc).is_err() {
            self.rollback(r, loc, undo);
            return Ok(None);
        }
        let mut share_id = None;
        let mut consumed = None;
        if multiple {
            let amounts = capacity::consumed_all(data.capacity.as_ref(), &device.capacity);
            share_id = Some(share_id_for(self.claims[r.claim], &data.full_name(), &id));
            let existed = self.allocating_capacity.contains_key(&id);
            let entry = self.allocating_capacity.entry(id.clone()).or_default();
            for (name, q) in &amounts {
                let sum = entry.get(name).map_or(q.clone(), |s| s.add(q));
                entry.insert(name.clone(), sum);
            }
            undo.capacity = Some((amounts.clone(), existed));
            if !amounts.is_empty() {
                consumed = Some(amounts);
            }
        }
        undo.result_len = Some(self.results[r.claim].len());
        let data = self.data(r);
        let picked = Picked {
            loc,
            id,
            request: data.name.to_string(),
            parent: data.parent.map(str::to_string),
            share_id,
            consumed,
            admin,
        };
        self.results[r.claim].push(picked);
        Ok(Some(undo))
    }

    fn rollback(&mut self, r: Indices, loc: Loc, undo: Undo) {
        if let Some(len) = undo.result_len {
            self.results[r.claim].truncate(len);
        }
        let id = self.device_id(loc);
        if let Some((amounts, existed)) = undo.capacity {
            if let Some(entry) = self.allocating_capacity.get_mut(&id) {
                for (name, q) in &amounts {
                    if let Some(v) = entry.get_mut(name) {
                        *v = v.sub(q);
                    }
                }
                if entry.values().all(|v| v.is_zero()) {
                    self.allocating_capacity.remove(&id);
                }
            }
            if existed {
                self.allocating_capacity.entry(id.clone()).or_default();
            }
        }
        if undo.marked
            && let Some(claims) = self.allocating.get_mut(&id)
        {
            claims.retain(|&c| c != r.claim);
        }
        let data = self.data(r);
        let (base, sub) = match data.parent {
            None => (data.name, None),
            Some(parent) => (parent, Some(data.name)),
        };
        for i in (0..undo.constraints).rev() {
            self.constraints[r.claim][i].remove(base, sub);
        }
        if undo.counters {
            self.release_counters(loc);
        }
    }

    /// Counters left in the device's pool after existing allocations.
    pub fn available_counters(&self, pool: &Pool) -> Arc<Counters> {
        let mut cache = self.a.available_counters.lock().expect("counters cache");
        cache
            .entry(pool.pool.clone())
            .or_insert_with(|| {
                let mut available = pool.counter_sets.clone();
                for &s in pool.slices.iter().chain(&pool.other_slices) {
                    let slice = &self.a.slices[s];
                    for (d, device) in slice.devices.iter().enumerate() {
                        if device.consumes.is_empty()
                            || !self.a.state.is_allocated(&slice.device_id(d))
                        {
                            continue;
                        }
                        for (set, counters) in &device.consumes {
                            let Some(set) = available.get_mut(set) else {
                                continue;
                            };
                            for (name, q) in counters {
                                if let Some(v) = set.get_mut(name) {
                                    *v = v.sub(q);
                                }
                            }
                        }
                    }
                }
                Arc::new(available)
            })
            .clone()
    }

    fn reserve_counters(&mut self, loc: Loc) -> bool {
        let available = self.available_counters(&self.pools[loc.pool]);
        let device = self.device(loc);
        let consumed = self
            .consumed_counters
            .entry(self.pools[loc.pool].pool.clone())
            .or_default();
        for (set, counters) in &device.consumes {
            let set = consumed.entry(set.clone()).or_default();
            for (name, q) in counters {
                let sum = set.get(name).map_or(q.clone(), |s| s.add(q));
                set.insert(name.clone(), sum);
            }
        }
        let zero = crate::Quantity::zero();
        let exhausted = available.iter().any(|(set, counters)| {
            counters.iter().any(|(name, left)| {
                let used = consumed.get(set).and_then(|s| s.get(name)).unwrap_or(&zero);
                left < used
            })
        });
        if exhausted {
            self.release_counters(loc);
            return false;
        }
        true
    }

    fn release_counters(&mut self, loc: Loc) {
        let device = self.device(loc);
        let Some(consumed) = self.consumed_counters.get_mut(&self.pools[loc.pool].pool) else {
            return;
        };
        for (set, counters) in &device.consumes {
            let set = consumed.entry(set.clone()).or_default();
            for (name, q) in counters {
                let left = set
                    .get(name)
                    .map_or_else(|| crate::Quantity::zero().sub(q), |s| s.sub(q));
                set.insert(name.clone(), left);
            }
        }
    }

    fn results(&self) -> Result<Vec<AllocationResult>, AllocateError> {
        let mut out = Vec::with_capacity(self.claims.len());
        for (c, claim) in self.claims.iter().enumerate() {
            let requests = claim
                .spec
                .devices
                .as_ref()
                .and_then(|d| d.requests.as_deref())
                .unwrap_or_default();
            let results: Vec<DeviceRequestAllocationResult> = self.results[c]
                .iter()
                .map(|p| {
                    let device = self.device(p.loc);
                    let tolerations = self.lookup_tolerations(requests, p);
                    DeviceRequestAllocationResult {
                        request: match &p.parent {
                            Some(parent) => format!("{parent}/{}", p.request),
                            None => p.request.clone(),
                        },
                        driver: p.id.driver.to_string(),
                        pool: p.id.pool.to_string(),
                        device: p.id.device.to_string(),
                        admin_access: p.admin.then_some(true),
                        tolerations: tolerations.filter(|t| !t.is_empty()).map(<[_]>::to_vec),
                        share_id: p.share_id.clone(),
                        consumed_capacity: p.consumed.as_ref().map(|m| {
                            m.iter()
                                .map(|(k, v)| (k.clone(), WireQuantity(v.canonical())))
                                .collect()
                        }),
                        binding_conditions: device
                            .binding_conditions
                            .clone()
                            .filter(|v| !v.is_empty()),
                        binding_failure_conditions: device
                            .binding_failure_conditions
                            .clone()
                            .filter(|v| !v.is_empty()),
                    }
                })
                .collect();

            let mut config: Vec<DeviceAllocationConfiguration> = Vec::new();
            let mut class_ranges: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
            for (r, entry) in self.requests[c].iter().enumerate() {
                let _ = r;
                let data = &entry.alternatives[entry.selected];
                let class = data.class.metadata.name.as_deref().unwrap_or_default();
                if let Some(&(start, end)) = class_ranges.get(class) {
                    for item in &mut config[start..end] {
                        item.requests
                            .get_or_insert_with(Vec::new)
                            .push(data.full_name());
                    }
                    continue;
                }
                let start = config.len();
                for item in data.class.spec.config.iter().flatten() {
                    config.push(DeviceAllocationConfiguration {
                        source: "FromClass".into(),
                        requests: Some(vec![data.full_name()]),
                        opaque: item.opaque.clone(),
                    });
                }
                class_ranges.insert(class, (start, config.len()));
            }
            let claim_configs = claim
                .spec
                .devices
                .as_ref()
                .and_then(|d| d.config.as_deref())
                .unwrap_or_default();
            for item in claim_configs {
                let named = item.requests.as_deref().unwrap_or_default();
                let copy = || DeviceAllocationConfiguration {
                    source: "FromClaim".into(),
                    requests: item.requests.clone().filter(|r| !r.is_empty()),
                    opaque: item.opaque.clone(),
                };
                if named.is_empty() {
                    config.push(copy());
                    continue;
                }
                for (r, request) in requests.iter().enumerate() {
                    if named.contains(&request.name) {
                        config.push(copy());
                        continue;
                    }
                    let entry = &self.requests[c][r];
                    let data = &entry.alternatives[entry.selected];
                    if data.parent.is_some() && named.contains(&data.full_name()) {
                        config.push(copy());
                    }
                }
            }
            let node_name = self.node.metadata.name.clone().unwrap_or_default();
            let node_selector = self
                .node_selector(&self.results[c], &node_name)
                .map_err(|e| {
                    fatal(format!(
                        "create NodeSelector for claim {}: {e}",
                        claim.metadata.name.as_deref().unwrap_or_default()
                    ))
                })?;
            out.push(AllocationResult {
                allocation_timestamp: None,
                devices: Some(DeviceAllocationResult {
                    config: (!config.is_empty()).then_some(config),
                    results: (!results.is_empty()).then_some(results),
                }),
                node_selector,
            });
        }
        Ok(out)
    }

    fn lookup_tolerations<'r>(
        &self,
        requests: &'r [DeviceRequest],
        p: &Picked,
    ) -> Option<&'r [DeviceToleration]> {
        let name = p.parent.as_deref().unwrap_or(&p.request);
        let request = requests.iter().find(|r| r.name == name)?;
        match &p.parent {
            None => request.exactly.as_ref()?.tolerations.as_deref(),
            Some(_) => request
                .first_available
                .iter()
                .flatten()
                .find(|s| s.name == p.request)?
                .tolerations
                .as_deref(),
        }
    }

    fn node_selector(&self, picked: &[Picked], node: &str) -> Result<Option<NodeSelector>, String> {
        let mut fields: Vec<NodeSelectorRequirement> = Vec::new();
        let mut expressions: Vec<NodeSelectorRequirement> = Vec::new();
        for p in picked {
            let slice = &self.a.slices[p.loc.slice];
            let device = self.device(p.loc);
            let (name, selector) = if slice.per_device_node_selection {
                (device.node_name.as_ref(), device.node_selector.as_ref())
            } else {
                (slice.node_name.as_ref(), slice.node_selector.as_ref())
            };
            if name.is_some() || device.binds_to_node {
                return Ok(Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_fields: Some(vec![NodeSelectorRequirement {
                            key: "metadata.name".into(),
                            operator: "In".into(),
                            values: Some(vec![node.to_string()]),
                        }]),
                        match_expressions: None,
                    }],
                }));
            }
            if let Some(selector) = selector {
                match selector.node_selector_terms.as_slice() {
                    [] => {}
                    [term] => {
                        add_new(
                            term.match_fields.as_deref().unwrap_or_default(),
                            &mut fields,
                        );
                        add_new(
                            term.match_expressions.as_deref().unwrap_or_default(),
                            &mut expressions,
                        );
                    }
                    terms => {
                        return Err(format!(
                            "unsupported ResourceSlice.NodeSelector with {} terms",
                            terms.len()
                        ));
                    }
                }
            }
        }
        if fields.is_empty() && expressions.is_empty() {
            return Ok(None);
        }
        Ok(Some(NodeSelector {
            node_selector_terms: vec![NodeSelectorTerm {
                match_fields: (!fields.is_empty()).then_some(fields),
                match_expressions: (!expressions.is_empty()).then_some(expressions),
            }],
        }))
    }
}

fn add_new(from: &[NodeSelectorRequirement], to: &mut Vec<NodeSelectorRequirement>) {
    for requirement in from {
        let values: std::collections::BTreeSet<&String> =
            requirement.values.iter().flatten().collect();
        let present = to.iter().any(|e| {
            e.key == requirement.key
                && e.operator == requirement.operator
                && e.values
                    .iter()
                    .flatten()
                    .collect::<std::collections::BTreeSet<_>>()
                    == values
        });
        if !present {
            to.push(requirement.clone());
        }
    }
}

/// Whether a `NoSchedule` or `NoExecute` taint is not tolerated.
pub(crate) fn taint_prevents(taints: &[DeviceTaint], tolerations: &[DeviceToleration]) -> bool {
    taints
        .iter()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .any(|t| !tolerations.iter().any(|tol| tolerates(tol, t)))
}

fn tolerates(toleration: &DeviceToleration, taint: &DeviceTaint) -> bool {
    if toleration
        .effect
        .as_deref()
        .is_some_and(|e| !e.is_empty() && e != taint.effect)
    {
        return false;
    }
    if toleration
        .key
        .as_deref()
        .is_some_and(|k| !k.is_empty() && k != taint.key)
    {
        return false;
    }
    match toleration.operator.as_deref().unwrap_or_default() {
        "" | "Equal" => {
            toleration.value.as_deref().unwrap_or_default()
                == taint.value.as_deref().unwrap_or_default()
        }
        "Exists" => true,
        _ => false,
    }
}

/// A share ID that names one claim's request on one device: a UUID v5, so
/// that the same inputs always give the same result.
fn share_id_for(claim: &ResourceClaim, request: &str, device: &DeviceId) -> String {
    let owner = claim
        .metadata
        .uid
        .clone()
        .unwrap_or_else(|| claim_name(claim));
    let name = format!("{owner}\u{0}{request}\u{0}{device}");
    uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, name.as_bytes()).to_string()
}

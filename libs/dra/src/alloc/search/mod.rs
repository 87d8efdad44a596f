//! One allocation attempt: the depth-first search over claims, requests,
//! subrequests and devices, in Kubernetes' order, with every side effect of a
//! tentative pick (constraints, counters, shared capacity, the in-use set)
//! undone on backtracking.

mod constraints;
mod counters;
mod requests;
mod results;
mod select;
mod taints;

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{AllocationResult, ResourceClaim};

use super::capacity::{self, Amounts};
use super::pools::Pool;
use super::{
    ALLOCATION_RESULTS_MAX_SIZE, AllocateError, Allocator, Counters, Device, DeviceId, claim_name,
};

use constraints::Constraint;
pub(crate) use constraints::lookup_attribute;
pub(crate) use requests::{Entry, RequestData};
pub(crate) use taints::taint_prevents;

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
    pub fn device(&self, loc: Loc) -> &'a Device {
        &self.a.slices[loc.slice].devices[loc.device]
    }

    pub fn device_id(&self, loc: Loc) -> DeviceId {
        self.a.slices[loc.slice].device_id(loc.device)
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

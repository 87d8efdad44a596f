//! Each claim's requests and constraints, read and checked once before the search.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{DeviceClass, DeviceRequest, DeviceToleration, ResourceClaim};

use super::constraints::Constraint;
use super::{Loc, Run, fatal};
use crate::alloc::capacity::Amounts;
use crate::alloc::pools;
use crate::alloc::{
    ALLOCATION_RESULTS_MAX_SIZE, AllocateError, Allocator, Compiled, claim_name, parse_quantity,
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
    pub(super) compiled: Vec<Compiled>,
    pub(super) class_compiled: Vec<(usize, Compiled)>,
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
        let cel = selector_expressions(claim, name, selectors)?;
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
                data.all_devices = self.all_devices((c, r, s), claim, &data)?;
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

    /// For an `All` request: every device it selects that fits; an error for a pool not ready.
    fn all_devices(
        &self,
        (c, r, s): (usize, usize, usize),
        claim: &str,
        data: &RequestData<'a>,
    ) -> Result<Vec<Loc>, AllocateError> {
        let name = data.name;
        let mut all_devices = Vec::new();
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
                    if !self.selectable((c, r, s), data, loc)? {
                        continue;
                    }
                    if self.capacity_fits(data, loc).is_err() {
                        continue;
                    }
                    all_devices.push(loc);
                }
            }
        }
        Ok(all_devices)
    }
}

/// A request's selectors as CEL expressions; an error for a selector without one.
fn selector_expressions<'a>(
    claim: &str,
    name: &str,
    selectors: &'a [k8s_openapi::api::resource::v1::DeviceSelector],
) -> Result<Vec<&'a str>, AllocateError> {
    let mut cel = Vec::with_capacity(selectors.len());
    for (i, selector) in selectors.iter().enumerate() {
        let Some(expr) = &selector.cel else {
            return Err(fatal(format!(
                "claim {claim}, request {name}, selector #{i}: CEL expression empty (unsupported selector type?)"
            )));
        };
        cel.push(expr.expression.as_str());
    }
    Ok(cel)
}

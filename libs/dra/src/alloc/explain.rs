//! Why claims do or do not fit a node: for every request (and subrequest),
//! every device of the node's pools with the first reason it was passed over,
//! checked in the order the allocator checks them.

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde::Serialize;

use super::capacity::Misfit;
use super::nodes::node_matches;
use super::search::{Loc, RequestData, Run, lookup_attribute, taint_prevents};
use super::{AllocateError, Allocator, SelectorFailure, claim_name};

/// The explanation for one node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Explanation {
    pub node: String,
    pub requests: Vec<RequestExplanation>,
}

/// One request (a subrequest is named `request/subrequest`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RequestExplanation {
    pub claim: String,
    pub request: String,
    pub class: String,
    /// `ExactCount` count, or the number of devices `All` found.
    pub wants: usize,
    pub candidates: Vec<Candidate>,
}

/// A device and why it was passed over; `reason: None` means it fits this
/// request on its own (the claim can still fail on count, constraints or
/// other requests).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Candidate {
    pub device: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

pub(crate) fn explain(
    a: &Allocator,
    node: &Node,
    claims: &[&ResourceClaim],
) -> Result<Explanation, AllocateError> {
    let run = Run::new(a, node, claims)?;
    let mut requests = Vec::new();
    for (c, entries) in run.requests.iter().enumerate() {
        for (r, entry) in entries.iter().enumerate() {
            for (s, data) in entry.alternatives.iter().enumerate() {
                requests.push(RequestExplanation {
                    claim: claim_name(claims[c]),
                    request: data.full_name(),
                    class: data.class.metadata.name.clone().unwrap_or_default(),
                    wants: data.num_devices,
                    candidates: candidates(a, &run, (c, r, s), data)?,
                });
            }
        }
    }
    Ok(Explanation {
        node: node.metadata.name.clone().unwrap_or_default(),
        requests,
    })
}

fn candidates(
    a: &Allocator,
    run: &Run<'_>,
    key: (usize, usize, usize),
    data: &RequestData<'_>,
) -> Result<Vec<Candidate>, AllocateError> {
    let mut out = Vec::new();
    for (p, pool) in run.pools.iter().enumerate() {
        if pool.incomplete {
            out.push(Candidate {
                device: format!("{}/*", pool.id()),
                reason: Some(
                    "pool incomplete: not all of its ResourceSlices are published yet".into(),
                ),
            });
            continue;
        }
        if let Some(reason) = &pool.invalid {
            out.push(Candidate {
                device: format!("{}/*", pool.id()),
                reason: Some(format!("pool invalid: {reason}")),
            });
            continue;
        }
        for &slice in &pool.slices {
            for d in 0..a.slices[slice].devices.len() {
                let loc = Loc {
                    pool: p,
                    slice,
                    device: d,
                };
                out.push(Candidate {
                    device: run.device_id(loc).to_string(),
                    reason: first_reason(a, run, key, data, loc)?,
                });
            }
        }
    }
    Ok(out)
}

fn first_reason(
    a: &Allocator,
    run: &Run<'_>,
    key: (usize, usize, usize),
    data: &RequestData<'_>,
    loc: Loc,
) -> Result<Option<String>, AllocateError> {
    let device = run.device(loc);
    let id = run.device_id(loc);
    if !data.admin && a.state.devices.contains(&id) {
        return Ok(Some("in use: allocated to another claim".into()));
    }
    let class = data.class.metadata.name.as_deref().unwrap_or_default();
    let class_selectors = data.class.spec.selectors.iter().flatten();
    let request_selectors = data.selectors.iter().map(|s| Some(*s));
    let all = class_selectors
        .map(|s| s.cel.as_ref().map(|c| c.expression.as_str()))
        .enumerate()
        .map(|(i, s)| (format!("class {class} selector #{i}"), s))
        .chain(
            request_selectors
                .enumerate()
                .map(|(i, s)| (format!("request selector #{i}"), s)),
        );
    for (what, expression) in all {
        let Some(expression) = expression else {
            continue;
        };
        match a.matches(expression, device) {
            Ok(true) => {}
            Ok(false) => return Ok(Some(format!("selector false: {what} ({expression})"))),
            Err(SelectorFailure::Compile(e) | SelectorFailure::Runtime(e)) => {
                return Ok(Some(format!("selector error: {what}: {e}")));
            }
        }
    }
    if a.slices[loc.slice].per_device_node_selection
        && !node_matches(
            run.node,
            device.node_name.as_deref(),
            device.all_nodes,
            device.node_selector.as_ref(),
        )
        .map_err(AllocateError::Fatal)?
    {
        return Ok(Some(
            "not available on this node (per-device node selection)".into(),
        ));
    }
    debug_assert!(run.selectable(key, data, loc).unwrap_or(false));
    match run.capacity_fits(data, loc) {
        Ok(()) => {}
        Err(Misfit::Undefined) => {
            return Ok(Some(
                "capacity: the request names a capacity the device does not have".into(),
            ));
        }
        Err(Misfit::Policy(name)) => {
            return Ok(Some(format!(
                "capacity: the request for {name} breaks the device's request policy"
            )));
        }
        Err(Misfit::Exhausted(name)) => {
            return Ok(Some(format!("capacity: not enough {name} left")));
        }
    }
    if !device.consumes.is_empty() {
        let available = run.available_counters(&run.pools[loc.pool]);
        for (set, counters) in &device.consumes {
            for (name, wanted) in counters {
                let left = available.get(set).and_then(|s| s.get(name));
                if left.is_some_and(|left| left < wanted) {
                    return Ok(Some(format!(
                        "counters exhausted: {set}/{name} has {} left, the device needs {}",
                        left.map(|q| q.canonical()).unwrap_or_default(),
                        wanted.canonical()
                    )));
                }
            }
        }
    }
    if let Some(t) = device
        .taints
        .iter()
        .find(|t| taint_prevents(std::slice::from_ref(*t), data.tolerations))
    {
        return Ok(Some(format!(
            "taint not tolerated: {}={}:{}",
            t.key,
            t.value.as_deref().unwrap_or_default(),
            t.effect
        )));
    }
    let constraints = run.claims[key.0]
        .spec
        .devices
        .as_ref()
        .and_then(|d| d.constraints.as_deref())
        .unwrap_or_default();
    let (request, sub) = match data.parent {
        Some(parent) => (parent, Some(data.name)),
        None => (data.name, None),
    };
    for c in constraints {
        let named = c.requests.as_deref().unwrap_or_default();
        let applies = named.is_empty()
            || named.iter().any(|n| n == request)
            || sub.is_some_and(|s| named.iter().any(|n| *n == format!("{request}/{s}")));
        let (kind, attribute) = match (&c.match_attribute, &c.distinct_attribute) {
            (Some(m), _) => ("matchAttribute", m),
            (None, Some(d)) => ("distinctAttribute", d),
            (None, None) => continue,
        };
        if applies && lookup_attribute(device, &a.slices[loc.slice].driver, attribute).is_none() {
            return Ok(Some(format!(
                "constraint: {kind} {attribute}: the device does not have it"
            )));
        }
    }
    Ok(None)
}

//! One allocation question as `switchyard dra allocate` and the reference
//! program read it: a mix of ResourceSlices, DeviceClasses, ResourceClaims
//! and Nodes, and a node name.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{AllocationResult, DeviceClass, ResourceClaim, ResourceSlice};
use serde::{Deserialize, Serialize};

use super::{AllocateError, AllocatedState, Allocator, InputError, RequestExplanation, claim_name};
use crate::cel::Compiler;
use crate::input::{StrictError, strict};

/// The objects of a case.
#[derive(Clone, Debug, Default)]
pub struct Objects {
    pub slices: Vec<ResourceSlice>,
    pub classes: Vec<DeviceClass>,
    /// In file order; those with `status.allocation` are allocated already.
    pub claims: Vec<ResourceClaim>,
    pub nodes: BTreeMap<String, Node>,
}

/// What an allocation attempt decided, in the CLI's and the reference
/// program's JSON shape.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    pub node: String,
    /// `allocated`, `unschedulable` or `error`.
    pub result: String,
    pub allocations: Vec<ClaimAllocation>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClaimAllocation {
    pub claim: String,
    pub allocation: AllocationResult,
}

impl Objects {
    /// Reads objects by `kind` (a `List` is flattened; other kinds are
    /// skipped) and applies the API defaults to claims' requests.
    pub fn from_values(values: Vec<serde_json::Value>) -> Result<Objects, InputError> {
        let mut objects = Objects::default();
        let mut queue: std::collections::VecDeque<_> = values.into();
        let mut index = 0;
        while let Some(value) = queue.pop_front() {
            index += 1;
            let kind = value
                .get("kind")
                .and_then(|k| k.as_str())
                .unwrap_or_default()
                .to_string();
            let name = value
                .pointer("/metadata/name")
                .and_then(|n| n.as_str())
                .unwrap_or_default()
                .to_string();
            let bad = |e: StrictError| InputError {
                object: format!("{kind} {name:?} (object #{index})"),
                field: match &e {
                    StrictError::Unknown(paths) => paths.join(", "),
                    StrictError::Invalid { path, .. } => path.clone(),
                },
                message: match e {
                    StrictError::Unknown(paths) if paths.len() > 1 => "unknown fields".into(),
                    StrictError::Unknown(_) => "unknown field".into(),
                    StrictError::Invalid { message, .. } => message,
                },
            };
            match kind.as_str() {
                "List" => {
                    if let Some(items) = value.get("items").and_then(|i| i.as_array()) {
                        for item in items.iter().rev() {
                            queue.push_front(item.clone());
                        }
                    }
                }
                "ResourceSlice" => objects.slices.push(strict(value).map_err(bad)?),
                "DeviceClass" => objects.classes.push(strict(value).map_err(bad)?),
                "ResourceClaim" => {
                    let mut claim: ResourceClaim = strict(value).map_err(bad)?;
                    apply_defaults(&mut claim);
                    objects.claims.push(claim);
                }
                "Node" => {
                    let node: Node = strict(value).map_err(bad)?;
                    objects.nodes.insert(name, node);
                }
                _ => {}
            }
        }
        Ok(objects)
    }

    /// The named node: as given, or a bare Node with only its name.
    pub fn node(&self, name: &str) -> Node {
        self.nodes.get(name).cloned().unwrap_or_else(|| Node {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(name.to_string()),
                ..Default::default()
            },
            ..Default::default()
        })
    }

    /// Claims without an allocation, in order.
    pub fn pending(&self) -> Vec<&ResourceClaim> {
        self.claims.iter().filter(|c| !is_allocated(c)).collect()
    }

    /// An allocator over these objects (existing allocations from the
    /// claims that have one).
    pub fn allocator(&self, compiler: Arc<Compiler>) -> Result<Allocator, InputError> {
        let state = AllocatedState::from_claims(self.claims.iter().filter(|c| is_allocated(c)))?;
        Allocator::new(state, &self.classes, &self.slices, compiler)
    }

    /// Allocates the pending claims together on `node`.
    pub fn allocate(&self, node: &str, compiler: Arc<Compiler>) -> Outcome {
        match self.allocator(compiler) {
            Ok(allocator) => outcome(&allocator, &self.node(node), &self.pending()),
            Err(e) => Outcome {
                node: node.to_string(),
                result: "error".into(),
                allocations: Vec::new(),
                error: Some(e.to_string()),
            },
        }
    }

    /// Why the pending claims do or do not fit `node` (`dra explain`).
    pub fn explain(&self, node: &str, compiler: Arc<Compiler>) -> Result<NodeReport, InputError> {
        let allocator = self.allocator(compiler)?;
        Ok(report(&allocator, &self.node(node), &self.pending()))
    }
}

/// What the allocator decides for `pending` (one pod's claims, allocated
/// together) on `node`, on top of the allocator's existing allocations.
pub fn outcome(allocator: &Allocator, node: &Node, pending: &[&ResourceClaim]) -> Outcome {
    let mut outcome = Outcome {
        node: node.metadata.name.clone().unwrap_or_default(),
        result: "error".into(),
        allocations: Vec::new(),
        error: None,
    };
    match allocator.allocate(node, pending) {
        Ok(Some(results)) => {
            outcome.result = "allocated".into();
            outcome.allocations = pending
                .iter()
                .zip(results)
                .map(|(c, allocation)| ClaimAllocation {
                    claim: claim_name(c),
                    allocation,
                })
                .collect();
        }
        Ok(None) => outcome.result = "unschedulable".into(),
        Err(AllocateError::FailedOnNode(e)) => {
            outcome.result = "unschedulable".into();
            outcome.error = Some(e);
        }
        Err(AllocateError::Fatal(e)) => outcome.error = Some(e),
    }
    outcome
}

/// Why claims do or do not fit one node: the allocator's verdict and, for
/// every request, every candidate device with the first reason it was passed
/// over — the engine of `dra explain` and `explain pod`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NodeReport {
    pub node: String,
    /// `allocated`, `unschedulable` or `error`.
    pub result: String,
    pub error: Option<String>,
    pub requests: Vec<RequestExplanation>,
}

impl NodeReport {
    pub fn allocated(&self) -> bool {
        self.result == "allocated"
    }
}

/// The [`NodeReport`] of `pending` on `node`.
pub fn report(allocator: &Allocator, node: &Node, pending: &[&ResourceClaim]) -> NodeReport {
    let outcome = outcome(allocator, node, pending);
    let (requests, explain_error) = match allocator.explain(node, pending) {
        Ok(explanation) => (explanation.requests, None),
        Err(e) => (Vec::new(), Some(e.to_string())),
    };
    NodeReport {
        node: outcome.node,
        result: outcome.result,
        error: outcome.error.or(explain_error),
        requests,
    }
}

/// Whether the claim has `status.allocation`.
pub fn is_allocated(claim: &ResourceClaim) -> bool {
    claim
        .status
        .as_ref()
        .is_some_and(|s| s.allocation.is_some())
}

/// The API server's defaults for requests: `allocationMode: ExactCount` and,
/// for it, `count: 1`.
pub fn apply_defaults(claim: &mut ResourceClaim) {
    let Some(devices) = claim.spec.devices.as_mut() else {
        return;
    };
    for request in devices.requests.iter_mut().flatten() {
        if let Some(exactly) = request.exactly.as_mut() {
            let mode = default_mode(&mut exactly.allocation_mode);
            if mode == "ExactCount" && exactly.count.unwrap_or(0) == 0 {
                exactly.count = Some(1);
            }
        }
        for sub in request.first_available.iter_mut().flatten() {
            let mode = default_mode(&mut sub.allocation_mode);
            if mode == "ExactCount" && sub.count.unwrap_or(0) == 0 {
                sub.count = Some(1);
            }
        }
    }
}

fn default_mode(mode: &mut Option<String>) -> String {
    if mode.as_deref().is_none_or(str::is_empty) {
        *mode = Some("ExactCount".into());
    }
    mode.clone().unwrap_or_default()
}

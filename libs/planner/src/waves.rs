//! The waves: nodes of the source group handed over in order, and the
//! workloads that then fit on the target group, placed by the
//! scheduler-exact allocator.
//!
//! Placement is first fit over the target group's nodes (its own nodes by
//! name, then the handed-over ones in the order they arrive). Allocations
//! only grow while the plan is computed — a workload that does not fit is
//! undone exactly — so a node that cannot take a pod of some shape (claims,
//! node selector, affinity, tolerations) cannot take it later either: each
//! shape keeps a cursor past the nodes known not to take it, and a queue of
//! workloads of one shape and size that failed is not tried again until new
//! nodes arrive. That keeps the allocator's attempts near one per pod.
//!
//! Handed-over nodes of one class (the same cards but for their UUIDs, see
//! [`super::classes`]) share the allocator's answers: the allocator is asked
//! once per class, shape and devices in use, not once per pod.

use std::borrow::Cow;
use std::cell::OnceCell;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use switchyard_core::backend::dispatch::strategy;

use k8s_openapi::api::core::v1::{Node, NodeSelector, NodeSpec, Taint, Toleration};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceClaim, DeviceClass, DeviceRequest, ExactDeviceRequest, ResourceClaim,
    ResourceClaimSpec, ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use switchyard_api::GPUClass;
use switchyard_core::names::{
    CLASS_RESOURCE_PREFIX, GPU_STACK_LABEL, NODE_ROLE_PREFIX, NVIDIA_GPU, STACK_DRA,
};
use switchyard_dra::Quantity;
use switchyard_dra::alloc::{
    AllocateError, AllocatedState, Allocator, DeviceId, Inventory, selector_matches,
};
use switchyard_dra::cel::Compiler;
use switchyard_gpu::publish::Layout;

use super::classes::{self, Classes, Member};
use super::register::{
    Built, Cards, NVIDIA_GPU_SHARED, NVIDIA_MIG_PREFIX, Workload, is_gpu_resource,
};
use super::{
    Blocked, Handover, HashMap, Mode, Move, Pending, Plan, PlanError, PlanRequest, PodPlacement,
    Snapshot, SourceCapacity, Wave, WorkloadRef,
};

/// How the plan reads the slices the handed-over nodes would publish. Both
/// give the same plan; the first is much faster on a large group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reading {
    /// By class where a class is admitted ([`super::classes`]), a node's own
    /// only when the allocator must be asked about that node.
    ByClass,
    /// Every node's, up front: the plan without classes, to compare with.
    EveryNode,
}

/// The DeviceClass and extended resource of each variant of the class.
struct Variants {
    class: String,
    by_variant: BTreeMap<String, (String, String)>,
    offers_shared: bool,
}

impl Variants {
    fn new(class: &GPUClass) -> Variants {
        let name = class.metadata.name.clone().unwrap_or_default();
        let by_variant: BTreeMap<String, (String, String)> = class
            .status
            .iter()
            .flat_map(|s| &s.variants)
            .map(|v| {
                (
                    v.name.clone(),
                    (v.device_class.clone(), v.extended_resource_name.clone()),
                )
            })
            .collect();
        let offers_shared = by_variant.contains_key("shared")
            || (by_variant.is_empty()
                && class
                    .spec
                    .sharing
                    .as_ref()
                    .is_some_and(|s| s.time_slicing_replicas >= 2));
        Variants {
            class: name,
            by_variant,
            offers_shared,
        }
    }

    /// The class compiler's names when the class has no status yet.
    fn get(&self, variant: &str) -> (String, String) {
        if let Some(v) = self.by_variant.get(variant) {
            return v.clone();
        }
        let suffix = match variant {
            "whole" => String::new(),
            "shared" => "-shared".into(),
            profile => format!("-mig-{profile}"),
        };
        (
            format!("{}{suffix}.gpu.deckhouse.io", self.class),
            format!("{CLASS_RESOURCE_PREFIX}{}{suffix}", self.class),
        )
    }

    /// What a device-plugin resource becomes: `nvidia.com/gpu` the whole card
    /// (placement.rs's rewrite) — the class's shares for a time-sliced
    /// workload when the class offers them —, `nvidia.com/gpu.shared` the
    /// shares, `nvidia.com/mig-<profile>` the profile.
    fn for_resource(&self, resource: &str, mode: Mode) -> (String, String) {
        if resource == NVIDIA_GPU_SHARED
            || (resource == NVIDIA_GPU && mode == Mode::TimeSliced && self.offers_shared)
        {
            return self.get("shared");
        }
        match resource.strip_prefix(NVIDIA_MIG_PREFIX) {
            Some(profile) => self.get(profile),
            None => self.get("whole"),
        }
    }
}

/// A workload's node selector as its shape has it: without the source
/// group's label, which the rewrite drops.
#[derive(Clone, Copy)]
struct SelectorKey<'a> {
    labels: Option<&'a BTreeMap<String, String>>,
    /// The group label and the source group.
    group_label: &'a str,
    from: &'a str,
}

impl<'a> SelectorKey<'a> {
    fn pairs(self) -> impl Iterator<Item = (&'a String, &'a String)> {
        let (label, from) = (self.group_label, self.from);
        self.labels
            .into_iter()
            .flatten()
            .filter(move |(k, v)| !(k.as_str() == label && v.as_str() == from))
    }
}

impl serde::Serialize for SelectorKey<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.pairs())
    }
}

/// Where a shape's first fit starts, and what the nodes before it said.
#[derive(Clone, Debug, Default)]
struct Cursor {
    next: usize,
    selector: u32,
    taints: u32,
    untolerated: Option<String>,
    alloc: u32,
    last_alloc: Option<usize>,
    last_alloc_message: Option<String>,
}

/// A workload's pods as the target group would see them after the rewrite.
struct Shape {
    requests: Vec<(String, String, u64)>,
    node_selector: BTreeMap<String, String>,
    affinity: Option<NodeSelector>,
    tolerations: Vec<Toleration>,
}

struct Target<'a> {
    nodes: Vec<TargetNode<'a>>,
    names: Vec<&'a str>,
    /// The class of each, for a handed-over node in one.
    members: Vec<Option<Member>>,
    /// The target group, and the label naming groups.
    to: String,
    group_label: String,
    /// The other labels a handover writes (`None`: removes): the source
    /// group's role label and the gpu-stack label, or on nvidia-operator the
    /// DRA operand labels.
    handed_labels: BTreeMap<String, Option<String>>,
    /// A taint the handover adds (nvidia-operator's pilot taint).
    handed_taint: Option<Taint>,
}

/// A node of the target group: one of its own, or a source node handed over
/// — read with its labels as the handover leaves them, the object itself
/// made only when the allocator or a node affinity must read it.
enum TargetNode<'a> {
    Own(&'a Node),
    HandedOver {
        node: &'a Node,
        made: OnceCell<Box<Node>>,
    },
}

impl Target<'_> {
    fn label(&self, at: usize, key: &str) -> Option<&str> {
        let node = match &self.nodes[at] {
            TargetNode::Own(node) => node,
            TargetNode::HandedOver { node, .. } => {
                if key == self.group_label {
                    return Some(&self.to);
                }
                if let Some(written) = self.handed_labels.get(key) {
                    return written.as_deref();
                }
                node
            }
        };
        let labels = node.metadata.labels.as_ref()?;
        labels.get(key).map(String::as_str)
    }

    fn taints(&self, at: usize) -> impl Iterator<Item = &Taint> {
        let (TargetNode::Own(node) | TargetNode::HandedOver { node, .. }) = &self.nodes[at];
        let added = match &self.nodes[at] {
            TargetNode::HandedOver { .. } => self.handed_taint.as_ref(),
            TargetNode::Own(_) => None,
        };
        node.spec
            .iter()
            .flat_map(|s| s.taints.iter().flatten())
            .filter(move |t| added.is_none_or(|a| a.key != t.key || a.effect != t.effect))
            .chain(added)
    }

    fn node(&self, at: usize) -> &Node {
        match &self.nodes[at] {
            TargetNode::Own(node) => node,
            TargetNode::HandedOver { node, made } => {
                made.get_or_init(|| Box::new(self.handed_over(node)))
            }
        }
    }
}

/// What the source nodes publish once handed over, to read a member's own
/// slices when the allocator must be asked about it.
struct Publication<'a> {
    layout: Layout,
    device_classes: &'a [DeviceClass],
    nodes: Vec<&'a Node>,
    cards: &'a Cards<'a>,
    /// Members' own inventories, by source node, read on first use.
    read: HashMap<usize, Arc<Inventory>>,
}

impl Publication<'_> {
    /// The slices source node `n` would publish (none without cards).
    fn slices(&self, n: usize) -> Vec<ResourceSlice> {
        let node = self.nodes[n];
        let name = node_name(node);
        match self.cards.get(name) {
            Some(cards) => classes::slices(name, &classes::machine(node, cards), self.layout),
            None => Vec::new(),
        }
    }

    fn own_inventory(&mut self, n: usize) -> Arc<Inventory> {
        if let Some(read) = self.read.get(&n) {
            return read.clone();
        }
        // Its class's first member's slices read (Classes::new).
        let inventory = Arc::new(
            Inventory::new(self.device_classes, self.slices(n))
                .expect("a member's slices read as its class's"),
        );
        self.read.insert(n, inventory.clone());
        inventory
    }
}

/// What one attempt placed.
enum Placed {
    /// The allocator's results, for the state.
    Results(Vec<AllocationResult>),
    /// Devices of a member's class (positions), allocated exclusively.
    Positions(Vec<u16>),
}

/// `'p`: what the planner reads while it runs; `'a`: the snapshot, which the
/// plan's names borrow.
struct Planner<'p, 'a> {
    request: &'p PlanRequest,
    inventory: Arc<Inventory>,
    compiler: Arc<Compiler>,
    state: AllocatedState,
    target: Target<'a>,
    classes: Classes,
    publication: Publication<'p>,
    shapes: Vec<Shape>,
    cursors: Vec<Cursor>,
    /// Shape index of each workload.
    shape_of: Vec<usize>,
    /// Permanent failures (a missing class, a selector that does not compile).
    fatal: HashMap<usize, String>,
}

/// Undo record of one allocation added to the state.
enum Undo {
    Device(DeviceId),
    Shared(DeviceId, String, Option<BTreeMap<String, Quantity>>),
    /// Devices a member (by target index) allocated, by position.
    Member(usize, Vec<u16>),
}

/// One scheduler attempt for `claim` on `node`, on top of `state`.
fn allocate(
    inventory: &Arc<Inventory>,
    compiler: &Arc<Compiler>,
    state: &mut AllocatedState,
    node: &Node,
    claim: &ResourceClaim,
) -> Result<Option<Vec<AllocationResult>>, AllocateError> {
    let allocator =
        Allocator::with_inventory(inventory.clone(), std::mem::take(state), compiler.clone());
    let result = allocator.allocate(node, &[claim]);
    *state = allocator.into_state();
    result
}

/// Puts the devices `member` holds into `state` (for the allocator to read
/// them); those it added, for [`release`].
fn hold(classes: &Classes, member: &Member, state: &mut AllocatedState) -> Vec<DeviceId> {
    let mut added = Vec::new();
    for (p, &used) in member.in_use.iter().flatten().enumerate() {
        let id = classes.id(member, p as u16);
        if used && state.devices.insert(id.clone()) {
            added.push(id);
        }
    }
    added
}

fn release(held: Vec<DeviceId>, state: &mut AllocatedState) {
    for id in held {
        state.devices.remove(&id);
    }
}

impl<'a> Planner<'_, 'a> {
    /// The inventory the allocator reads for target node `at`.
    fn inventory_at(&mut self, at: usize) -> Arc<Inventory> {
        match &self.target.members[at] {
            Some(m) => self.publication.own_inventory(m.source),
            None => self.inventory.clone(),
        }
    }

    /// One attempt for pod `pod` of `w` (shape `s`) on target node `at`;
    /// `claim` is made when the allocator is asked.
    fn allocate_at(
        &mut self,
        at: usize,
        s: usize,
        w: &Workload<'_>,
        pod: u32,
        claim: &mut Option<ResourceClaim>,
    ) -> Result<Option<Placed>, AllocateError> {
        let Some(member) = self.target.members[at]
            .as_ref()
            .filter(|m| m.in_use.is_some())
        else {
            let inventory = self.inventory_at(at);
            let claim = claim.get_or_insert_with(|| pod_claim(w, &self.shapes[s], pod));
            let result = allocate(
                &inventory,
                &self.compiler,
                &mut self.state,
                self.target.node(at),
                claim,
            )?;
            return Ok(result.map(Placed::Results));
        };
        let in_use = member.in_use.as_deref().unwrap_or_default();
        if let Some(answer) = self.classes.answer(member.class, s, in_use) {
            return Ok(answer.clone().map(Placed::Positions));
        }
        let (class, in_use) = (member.class, in_use.to_vec());
        let inventory = self.publication.own_inventory(member.source);
        let claim = claim.get_or_insert_with(|| pod_claim(w, &self.shapes[s], pod));
        let held = hold(&self.classes, member, &mut self.state);
        let result = allocate(
            &inventory,
            &self.compiler,
            &mut self.state,
            self.target.node(at),
            claim,
        );
        release(held, &mut self.state);
        let placed = match result? {
            None => {
                self.classes.remember(class, s, in_use, None);
                None
            }
            Some(results) => match self.classes.positions(member, &results) {
                Some(positions) => {
                    self.classes
                        .remember(class, s, in_use, Some(positions.clone()));
                    Some(Placed::Positions(positions))
                }
                // Not the class's plain devices: the state takes the node's
                // for good.
                None => {
                    hold(&self.classes, member, &mut self.state);
                    if let Some(m) = self.target.members[at].as_mut() {
                        m.in_use = None;
                    }
                    Some(Placed::Results(results))
                }
            },
        };
        Ok(placed)
    }

    /// Adds what an attempt on target node `at` placed to the state (or to
    /// the member's devices in use); the devices' names.
    fn take(&mut self, at: usize, placed: Placed, undo: &mut Vec<Undo>) -> Vec<String> {
        match placed {
            Placed::Results(results) => {
                let mut devices = Vec::new();
                for r in &results {
                    devices.extend(
                        r.devices
                            .iter()
                            .flat_map(|d| d.results.iter().flatten())
                            .map(|d| d.device.clone()),
                    );
                    self.add(r, undo);
                }
                devices
            }
            Placed::Positions(positions) => {
                let member = self.target.members[at]
                    .as_mut()
                    .expect("positions are a member's");
                let in_use = member
                    .in_use
                    .as_mut()
                    .expect("positions are counted by the member");
                let names = positions
                    .iter()
                    .map(|&p| {
                        in_use[usize::from(p)] = true;
                        self.classes.device_name(member.class, p).to_string()
                    })
                    .collect();
                undo.push(Undo::Member(at, positions));
                names
            }
        }
    }

    fn fits_node(&self, shape: &Shape, at: usize) -> Result<(), Option<String>> {
        let target = &self.target;
        let selected = shape
            .node_selector
            .iter()
            .all(|(k, v)| target.label(at, k) == Some(v.as_str()))
            && shape
                .affinity
                .as_ref()
                .is_none_or(|a| selector_matches(target.node(at), a).unwrap_or(false));
        if !selected {
            return Err(None);
        }
        for taint in target.taints(at) {
            if taint.effect != "NoSchedule" && taint.effect != "NoExecute" {
                continue;
            }
            if !shape.tolerations.iter().any(|t| tolerates(t, taint)) {
                let value = taint.value.as_deref().unwrap_or_default();
                return Err(Some(format!("{}={value}:{}", taint.key, taint.effect)));
            }
        }
        Ok(())
    }
}

/// The claim pod `pod` of `w` would have after the rewrite.
fn pod_claim(w: &Workload<'_>, shape: &Shape, pod: u32) -> ResourceClaim {
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some(format!(
                "{}-{}-{pod}-gpu",
                w.id.kind.to_ascii_lowercase(),
                w.id.name
            )),
            namespace: Some(w.id.namespace.to_string()),
            ..Default::default()
        },
        spec: ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(
                    shape
                        .requests
                        .iter()
                        .enumerate()
                        .map(|(i, (class, _, count))| DeviceRequest {
                            name: format!("gpu-{i}"),
                            exactly: Some(ExactDeviceRequest {
                                device_class_name: class.clone(),
                                count: Some(*count as i64),
                                allocation_mode: Some("ExactCount".into()),
                                ..Default::default()
                            }),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
        },
        status: None,
    }
}

impl<'a> Planner<'_, 'a> {
    fn add(&mut self, allocation: &AllocationResult, undo: &mut Vec<Undo>) {
        for r in allocation
            .devices
            .iter()
            .flat_map(|d| d.results.iter().flatten())
        {
            if r.admin_access == Some(true) {
                continue;
            }
            let id = DeviceId {
                driver: r.driver.as_str().into(),
                pool: r.pool.as_str().into(),
                device: r.device.as_str().into(),
            };
            match &r.share_id {
                None => undo.push(Undo::Device(id)),
                Some(share) => {
                    let before = self.state.capacity.get(&id).cloned();
                    undo.push(Undo::Shared(id, share.clone(), before));
                }
            }
        }
        // The allocator wrote it: its quantities parse.
        self.state
            .add(allocation)
            .expect("the allocator's own result is valid");
    }

    fn undo(&mut self, undo: Vec<Undo>) {
        for u in undo.into_iter().rev() {
            match u {
                Undo::Device(id) => {
                    self.state.devices.remove(&id);
                }
                Undo::Member(at, positions) => {
                    let member = self.target.members[at]
                        .as_mut()
                        .expect("positions are a member's");
                    for p in positions {
                        if let Some(in_use) = member.in_use.as_mut() {
                            in_use[usize::from(p)] = false;
                        } else {
                            // The state took the node's devices since.
                            self.state.devices.remove(&self.classes.id(member, p));
                        }
                    }
                }
                Undo::Shared(id, share, before) => {
                    self.state.shared.remove(&(id.clone(), share));
                    match before {
                        Some(b) => {
                            self.state.capacity.insert(id, b);
                        }
                        None => {
                            self.state.capacity.remove(&id);
                        }
                    }
                }
            }
        }
    }

    /// Places every pod of `w` on the target group, or undoes what it placed
    /// and says why (with `explain`, the allocator's reason).
    fn try_move(
        &mut self,
        w: &Workload<'a>,
        index: usize,
        explain: bool,
    ) -> Result<Move<'a>, String> {
        let s = self.shape_of[index];
        if let Some(reason) = self.fatal.get(&s) {
            return Err(reason.clone());
        }
        // What the first pod's scan learns holds on the committed state and
        // is kept; what later pods learn depends on this workload's own
        // tentative pods and goes with them.
        let mut saved = None;
        let mut undo = Vec::new();
        let mut pods = Vec::new();
        let mut failure = None;
        'pods: for pod in 0..w.replicas {
            let mut claim = None;
            loop {
                let at = self.cursors[s].next;
                if at >= self.target.nodes.len() {
                    failure = Some(if explain {
                        let claim = claim.get_or_insert_with(|| pod_claim(w, &self.shapes[s], pod));
                        self.reason(w, s, pod, claim)
                    } else {
                        String::new()
                    });
                    break 'pods;
                }
                if let Err(taint) = self.fits_node(&self.shapes[s], at) {
                    let c = &mut self.cursors[s];
                    match taint {
                        None => c.selector += 1,
                        Some(t) => {
                            c.taints += 1;
                            c.untolerated.get_or_insert(t);
                        }
                    }
                    c.next += 1;
                    continue;
                }
                match self.allocate_at(at, s, w, pod, &mut claim) {
                    Ok(Some(placed)) => {
                        let devices = self.take(at, placed, &mut undo);
                        if pod == 0 {
                            saved = Some(self.cursors[s].clone());
                        }
                        pods.push(PodPlacement {
                            node: self.target.names[at],
                            devices,
                        });
                        break;
                    }
                    result @ (Ok(None) | Err(AllocateError::FailedOnNode(_))) => {
                        let message = match result {
                            Err(AllocateError::FailedOnNode(m)) => Some(m),
                            _ => None,
                        };
                        let c = &mut self.cursors[s];
                        c.alloc += 1;
                        c.last_alloc = Some(at);
                        c.last_alloc_message = message;
                        c.next += 1;
                    }
                    Err(AllocateError::Fatal(m)) => {
                        self.fatal.insert(s, m.clone());
                        failure = Some(m);
                        break 'pods;
                    }
                }
            }
        }
        match failure {
            None => Ok(Move {
                workload: w.id,
                requests: self.shapes[s]
                    .requests
                    .iter()
                    .map(|(_, resource, n)| (resource.clone(), *n))
                    .collect(),
                pods,
            }),
            Some(reason) => {
                self.undo(undo);
                if let Some(saved) = saved {
                    self.cursors[s] = saved;
                }
                Err(reason)
            }
        }
    }

    /// Why pod `pod` of `w` fits no node of the target group, in the
    /// scheduler's manner: how many nodes failed on what.
    fn reason(&mut self, w: &Workload<'_>, s: usize, pod: u32, claim: &ResourceClaim) -> String {
        let to = &self.request.to;
        let n = self.target.nodes.len();
        if n == 0 {
            return format!(
                "no node in group {to} yet: hand a node over before moving the application"
            );
        }
        let c = self.cursors[s].clone();
        let mut parts = Vec::new();
        if c.alloc > 0 {
            let mut part = format!("{} cannot allocate its claim", c.alloc);
            if let Some(at) = c.last_alloc {
                let detail = match c.last_alloc_message {
                    Some(m) => m,
                    None => self.explain(at, claim),
                };
                part.push_str(&format!(" ({}: {detail})", self.target.names[at]));
            }
            parts.push(part);
        }
        if c.selector > 0 {
            parts.push(format!(
                "{} do not match its node selector or affinity",
                c.selector
            ));
        }
        if c.taints > 0 {
            parts.push(format!(
                "{} have a taint it does not tolerate ({})",
                c.taints,
                c.untolerated.as_deref().unwrap_or_default()
            ));
        }
        format!(
            "0/{n} nodes of group {to} can take pod {} of {}: {}",
            pod + 1,
            w.replicas,
            parts.join(", ")
        )
    }

    /// The allocator's explanation, counted: `wants 2 of a100.gpu.deckhouse.io: 7 in use, 1 fits`.
    fn explain(&mut self, at: usize, claim: &ResourceClaim) -> String {
        let inventory = self.inventory_at(at);
        let held = match &self.target.members[at] {
            Some(m) => hold(&self.classes, m, &mut self.state),
            None => Vec::new(),
        };
        let allocator = Allocator::with_inventory(
            inventory,
            std::mem::take(&mut self.state),
            self.compiler.clone(),
        );
        let explained = allocator.explain(self.target.node(at), &[claim]);
        self.state = allocator.into_state();
        release(held, &mut self.state);
        match explained {
            Err(e) => e.to_string(),
            Ok(explanation) => explanation
                .requests
                .iter()
                .map(|r| {
                    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
                    for c in &r.candidates {
                        *counts
                            .entry(c.reason.as_deref().unwrap_or("fits"))
                            .or_default() += 1;
                    }
                    let counts: Vec<String> =
                        counts.iter().map(|(why, n)| format!("{n} {why}")).collect();
                    let devices = if counts.is_empty() {
                        "no devices".to_string()
                    } else {
                        counts.join(", ")
                    };
                    format!("wants {} of {}: {devices}", r.wants, r.class)
                })
                .collect::<Vec<_>>()
                .join("; "),
        }
    }
}

/// Kubernetes' `Toleration.ToleratesTaint`.
fn tolerates(t: &Toleration, taint: &Taint) -> bool {
    if let Some(effect) = t.effect.as_deref().filter(|e| !e.is_empty())
        && effect != taint.effect
    {
        return false;
    }
    let key = t.key.as_deref().unwrap_or_default();
    if !key.is_empty() && key != taint.key {
        return false;
    }
    match t.operator.as_deref().unwrap_or("Equal") {
        "Exists" => true,
        "Equal" => {
            !key.is_empty()
                && t.value.as_deref().unwrap_or_default()
                    == taint.value.as_deref().unwrap_or_default()
        }
        _ => false,
    }
}

fn node_name(n: &Node) -> &str {
    n.metadata.name.as_deref().unwrap_or_default()
}

fn group_of<'n>(n: &'n Node, label: &str) -> Option<&'n str> {
    n.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(label))
        .map(String::as_str)
}

impl Target<'_> {
    /// A node as it is after its handover: in the target group, on DRA.
    /// Only what placement reads of it is kept: its name, labels and taints.
    fn handed_over(&self, node: &Node) -> Node {
        let mut labels = node.metadata.labels.clone().unwrap_or_default();
        labels.insert(self.group_label.clone(), self.to.clone());
        for (key, value) in &self.handed_labels {
            match value {
                Some(v) => labels.insert(key.clone(), v.clone()),
                None => labels.remove(key),
            };
        }
        let mut taints: Vec<Taint> = node
            .spec
            .iter()
            .flat_map(|s| s.taints.iter().flatten())
            .cloned()
            .collect();
        if let Some(added) = &self.handed_taint {
            taints.retain(|t| t.key != added.key || t.effect != added.effect);
            taints.push(added.clone());
        }
        Node {
            metadata: ObjectMeta {
                name: node.metadata.name.clone(),
                labels: Some(labels),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                taints: (!taints.is_empty()).then_some(taints),
                ..Default::default()
            }),
            status: None,
        }
    }
}

/// A node's device-plugin resources, from its allocatable (or, for
/// `nvidia.com/gpu`, its PhysicalGPUs when it lists none).
fn capacity(node: &Node, cards: usize) -> Result<BTreeMap<&str, u64>, PlanError> {
    let mut out = BTreeMap::new();
    let allocatable = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
    for (name, q) in allocatable.into_iter().flatten() {
        if !is_gpu_resource(name) {
            continue;
        }
        let n = Quantity::parse(&q.0)
            .ok()
            .and_then(|q| q.as_i64())
            .and_then(|n| u64::try_from(n).ok())
            .ok_or_else(|| PlanError::Invalid {
                object: format!("Node {}", node_name(node)),
                field: format!("status.allocatable[{name}]"),
                message: format!("{:?} is not a whole number of devices", q.0),
            })?;
        out.insert(name.as_str(), n);
    }
    if out.is_empty() && cards > 0 {
        out.insert(NVIDIA_GPU, cards as u64);
    }
    Ok(out)
}

fn add_demand<'a>(demand: &mut BTreeMap<&'a str, i128>, resource: &'a str, n: i128) {
    *demand.entry(resource).or_default() += n;
}

fn add_to<'a>(total: &mut BTreeMap<&'a str, i128>, add: &BTreeMap<&'a str, u64>, sign: i128) {
    for (r, n) in add {
        *total.entry(r).or_default() += sign * i128::from(*n);
    }
}

/// The nodes of the source and the target group, each sorted by name.
struct Groups<'a> {
    source: Vec<&'a Node>,
    target: Vec<&'a Node>,
    /// Each source node's index, by name.
    source_index: HashMap<&'a str, usize>,
}

impl<'a> Groups<'a> {
    fn of(snapshot: &'a Snapshot, group_label: &str, from: &str, to: &str) -> Groups<'a> {
        let in_group = |group: &str| {
            let mut nodes: Vec<&Node> = snapshot
                .nodes
                .iter()
                .filter(|n| group_of(n, group_label) == Some(group))
                .collect();
            nodes.sort_by(|a, b| node_name(a).cmp(node_name(b)));
            nodes
        };
        let source = in_group(from);
        let target = in_group(to);
        let source_index = source
            .iter()
            .enumerate()
            .map(|(i, n)| (node_name(n), i))
            .collect();
        Groups {
            source,
            target,
            source_index,
        }
    }
}

/// nvidia-operator: the pilot taint a handover puts on the node.
fn pilot_taint(request: &PlanRequest) -> Option<Taint> {
    strategy(&request.backend).pilot_taint().map(|taint| Taint {
        key: taint.key,
        value: Some(taint.value),
        effect: taint.effect,
        time_added: None,
    })
}

/// Shapes: the requests after the rewrite and the scheduling constraints,
/// keyed by their JSON; a template's, where a workload first has it. The
/// shapes, and the shape of each workload.
fn rewritten_shapes(
    built: &Built<'_>,
    variants: &Variants,
    group_label: &str,
    from: &str,
    pilot: Option<&Taint>,
) -> (Vec<Shape>, Vec<usize>) {
    let workloads = &built.workloads;
    let mut shape_keys: BTreeMap<String, usize> = BTreeMap::new();
    let mut shapes = Vec::new();
    let mut shape_of_template: Vec<Option<usize>> = vec![None; built.templates.len()];
    let mut shape_of = Vec::with_capacity(workloads.len());
    for w in workloads {
        if let Some(s) = shape_of_template[w.template] {
            shape_of.push(s);
            continue;
        }
        let t = &built.templates[w.template];
        let requests: Vec<(String, String, u64)> = t
            .requests
            .iter()
            .map(|&(r, n)| {
                let (class, resource) = variants.for_resource(r, t.mode);
                (class, resource, n)
            })
            .collect();
        let node_selector = SelectorKey {
            labels: t.node_selector,
            group_label,
            from,
        };
        // The move adds a toleration of the pilot taint (nvidia-operator).
        let mut tolerations = t.tolerations.to_vec();
        if let Some(taint) = pilot
            && !tolerations.iter().any(|t| tolerates(t, taint))
        {
            tolerations.push(Toleration {
                key: Some(taint.key.clone()),
                operator: Some("Equal".into()),
                value: taint.value.clone(),
                effect: Some(taint.effect.clone()),
                toleration_seconds: None,
            });
        }
        let key = serde_json::to_string(&(&requests, &node_selector, &t.affinity, &tolerations))
            .unwrap_or_default();
        let next = shapes.len();
        let s = *shape_keys.entry(key).or_insert(next);
        if s == next {
            shapes.push(Shape {
                requests,
                node_selector: node_selector
                    .pairs()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect(),
                affinity: t.affinity.cloned(),
                tolerations,
            });
        }
        shape_of_template[w.template] = Some(s);
        shape_of.push(s);
    }
    (shapes, shape_of)
}

/// The inventory the allocator reads, and the classes of the source nodes.
///
/// The slices: the cluster's, less any of the source nodes, plus what each
/// source node would publish once handed over. A node in a class is read
/// only if the allocator must be asked about it; the others are made one
/// node at a time as the inventory reads them (all of them at once would be
/// most of the plan's memory).
fn target_inventory(
    snapshot: &Snapshot,
    request: &PlanRequest,
    built: &Built<'_>,
    groups: &Groups<'_>,
    shapes: &[Shape],
    compiler: &Arc<Compiler>,
    reading: Reading,
) -> Result<(Classes, Arc<Inventory>), PlanError> {
    let source = &groups.source;
    let cluster: Vec<&ResourceSlice> = snapshot
        .resource_slices
        .iter()
        .filter(|s| {
            s.spec
                .node_name
                .as_deref()
                .is_none_or(|n| !groups.source_index.contains_key(n))
        })
        .collect();
    let machine = |n: usize| {
        let node = source[n];
        let cards = built.cards.get(node_name(node))?;
        Some(classes::machine(node, cards))
    };
    let classes = match reading {
        // nvidia-operator: no PhysicalGPUs to class the nodes by.
        _ if request.nvidia().is_some() => Classes::none(source.len()),
        Reading::EveryNode => Classes::none(source.len()),
        Reading::ByClass => {
            let names: Vec<&str> = source.iter().map(|n| node_name(n)).collect();
            let requested: BTreeSet<&str> = shapes
                .iter()
                .flat_map(|s: &Shape| s.requests.iter().map(|(class, _, _)| class.as_str()))
                .collect();
            Classes::new(
                &names,
                machine,
                request.layout,
                &cluster,
                &snapshot.device_classes,
                &requested,
                compiler,
            )
        }
    };
    let published = (0..source.len())
        .filter(|&n| classes.of_source[n].is_none())
        .flat_map(|n| {
            let name = node_name(source[n]);
            if request.nvidia().is_some() {
                return nvidia_slices(source[n], &snapshot.nodes, &snapshot.resource_slices);
            }
            machine(n).map_or_else(Vec::new, |m| classes::slices(name, &m, request.layout))
        });
    let slices = cluster
        .iter()
        .map(|s| Cow::Borrowed(*s))
        .chain(published.map(Cow::<ResourceSlice>::Owned));
    let inventory = Arc::new(Inventory::new(&snapshot.device_classes, slices)?);
    Ok((classes, inventory))
}

impl<'a> Target<'a> {
    /// The target group before the first wave: its own `nodes`, with room
    /// for the `handed` source nodes, and what a handover writes on each.
    fn new(
        nodes: Vec<&'a Node>,
        handed: usize,
        request: &PlanRequest,
        pilot: Option<Taint>,
    ) -> Target<'a> {
        let from = request.from.as_str();
        let mut target = Target {
            names: nodes.iter().map(|n| node_name(n)).collect(),
            members: nodes.iter().map(|_| None).collect(),
            nodes: nodes.into_iter().map(TargetNode::Own).collect(),
            to: request.to.clone(),
            group_label: request.group_label().to_string(),
            handed_labels: match request.nvidia() {
                Some(b) => b
                    .operand_labels(switchyard_proto::v1::Stack::Dra)
                    .into_iter()
                    .map(|(k, v)| (k, v.map(str::to_string)))
                    .collect(),
                None => BTreeMap::from([
                    (GPU_STACK_LABEL.to_string(), Some(STACK_DRA.to_string())),
                    (format!("{NODE_ROLE_PREFIX}{from}"), None),
                ]),
            },
            handed_taint: pilot,
        };
        target.nodes.reserve(handed);
        target.names.reserve(handed);
        target.members.reserve(handed);
        target
    }
}

/// What each pod of `w` requests of the device plugin.
fn pod_requests<'p, 'a>(built: &'p Built<'a>, w: &Workload<'_>) -> &'p [(&'a str, u64)] {
    built.templates[w.template].requests.as_slice()
}

/// The source group as the waves hand it over: capacity per node (less what
/// DaemonSets hold, which goes with the node), what the workloads not moved
/// need, and what each node runs of them.
struct SourceGroup<'p, 'a> {
    built: &'p Built<'a>,
    from: &'p str,
    /// Its nodes, sorted by name.
    nodes: Vec<&'a Node>,
    /// Each node's device-plugin resources, less what DaemonSets hold.
    cap: Vec<BTreeMap<&'a str, u64>>,
    /// What the nodes still in the group offer, per resource.
    available: BTreeMap<&'a str, i128>,
    /// What the workloads not moved need, per resource.
    demand: BTreeMap<&'a str, i128>,
    /// Each node's pods of the workloads not moved, per workload.
    on_node: Vec<BTreeMap<usize, u32>>,
    /// Each node's GPUs in use.
    usage: Vec<u64>,
    /// The source nodes each workload's pods run on (one entry a pod).
    pods_on: Vec<Vec<usize>>,
    /// The nodes still in the group, fewest GPUs in use first.
    order: BTreeSet<(u64, usize)>,
    in_source: Vec<bool>,
    /// The plan's workloads not moved yet, by shape and replicas.
    queues: BTreeMap<(usize, u32), BTreeSet<usize>>,
    moved: Vec<bool>,
    /// Queues that failed, with the number of target nodes then: not tried
    /// again until that grows.
    exhausted: HashMap<(usize, u32), usize>,
    /// Why the last wave could hand over no node.
    blocked_reason: Option<String>,
}

impl<'p, 'a> SourceGroup<'p, 'a> {
    /// The source group before the first wave, and the DaemonSets on it
    /// (which follow their nodes). `shape_of`: each workload's shape.
    fn read(
        built: &'p Built<'a>,
        from: &'p str,
        nodes: Vec<&'a Node>,
        source_index: &HashMap<&'a str, usize>,
        shape_of: &[usize],
    ) -> Result<(Self, Vec<WorkloadRef<'a>>), PlanError> {
        let workloads = &built.workloads;
        let mut cap: Vec<BTreeMap<&str, u64>> = Vec::with_capacity(nodes.len());
        for &node in &nodes {
            let cards = built.cards.get(node_name(node)).map_or(0, Vec::len);
            cap.push(capacity(node, cards)?);
        }
        let mut follow_nodes = Vec::new();
        let mut demand: BTreeMap<&str, i128> = BTreeMap::new();
        let mut on_node: Vec<BTreeMap<usize, u32>> = vec![BTreeMap::new(); nodes.len()];
        let mut usage: Vec<u64> = vec![0; nodes.len()];
        let mut queues: BTreeMap<(usize, u32), BTreeSet<usize>> = BTreeMap::new();
        let mut pods_on: Vec<Vec<usize>> = vec![Vec::new(); workloads.len()];
        for (i, w) in workloads.iter().enumerate() {
            if !w.on_source {
                continue;
            }
            let requests = pod_requests(built, w);
            let per_pod: u64 = requests.iter().map(|(_, k)| k).sum();
            if w.id.kind == "DaemonSet" {
                if w.in_plan {
                    follow_nodes.push(w.id);
                }
                for node in &w.pod_nodes {
                    if let Some(&n) = source_index.get(node) {
                        for (r, k) in requests {
                            if let Some(c) = cap[n].get_mut(*r) {
                                *c = c.saturating_sub(*k);
                            }
                        }
                    }
                }
                continue;
            }
            for (r, k) in requests {
                add_demand(&mut demand, r, i128::from(*k) * i128::from(w.replicas));
            }
            for node in &w.pod_nodes {
                if let Some(&n) = source_index.get(node) {
                    *on_node[n].entry(i).or_default() += 1;
                    usage[n] += per_pod;
                    pods_on[i].push(n);
                }
            }
            if w.in_plan {
                queues
                    .entry((shape_of[i], w.replicas))
                    .or_default()
                    .insert(i);
            }
        }
        let mut available: BTreeMap<&str, i128> = BTreeMap::new();
        for c in &cap {
            add_to(&mut available, c, 1);
        }
        let group = SourceGroup {
            built,
            from,
            order: (0..nodes.len()).map(|n| (usage[n], n)).collect(),
            in_source: vec![true; nodes.len()],
            nodes,
            cap,
            available,
            demand,
            on_node,
            usage,
            pods_on,
            queues,
            moved: vec![false; workloads.len()],
            exhausted: HashMap::default(),
            blocked_reason: None,
        };
        Ok((group, follow_nodes))
    }

    /// The waves, until one hands over no node and moves no workload.
    fn plan_waves(
        &mut self,
        planner: &mut Planner<'_, 'a>,
        max_unavailable: usize,
    ) -> Vec<Wave<'a>> {
        let mut waves = Vec::new();
        loop {
            let (chosen, waits) = self.choose_nodes(max_unavailable);
            let (handovers, due) = self.hand_over(&chosen, waits, planner);
            let (moves, pending) = self.move_workloads(&due, planner);
            // Evicted pods of workloads not moved run elsewhere in the group;
            // the capacity check kept room for them.
            for &n in &chosen {
                self.on_node[n].clear();
            }
            if chosen.is_empty() && moves.is_empty() {
                break;
            }
            waves.push(self.wave(waves.len() + 1, handovers, moves, pending));
        }
        waves
    }

    /// A wave's nodes: fewest GPUs in use first; the source group must keep
    /// room for every workload not moved; a wave evicts no more pods of a
    /// budget than it allows. With each node, the budgets its drain alone
    /// exceeds, which it waits for.
    fn choose_nodes(&mut self, max_unavailable: usize) -> (Vec<usize>, Vec<Vec<String>>) {
        let built = self.built;
        let mut chosen: Vec<usize> = Vec::new();
        let mut budget_use: BTreeMap<usize, u32> = BTreeMap::new();
        let mut waits: Vec<Vec<String>> = Vec::new();
        for &(_, n) in self.order.iter() {
            if chosen.len() == max_unavailable {
                break;
            }
            if let Some(reason) = self.shortfall(n) {
                self.blocked_reason = Some(reason);
                break;
            }
            let mut evicts: BTreeMap<usize, u32> = BTreeMap::new();
            for (&w, &pods) in &self.on_node[n] {
                for &b in &built.workloads[w].budgets {
                    *evicts.entry(b).or_default() += pods;
                }
            }
            let over: Vec<usize> = evicts
                .iter()
                .filter(|(b, k)| {
                    budget_use.get(b).copied().unwrap_or(0) + **k > built.budgets[**b].1
                })
                .map(|(b, _)| *b)
                .collect();
            if !over.is_empty() && !chosen.is_empty() {
                break;
            }
            for (b, k) in evicts {
                *budget_use.entry(b).or_default() += k;
            }
            waits.push(over.iter().map(|b| built.budgets[*b].0.clone()).collect());
            add_to(&mut self.available, &self.cap[n], -1);
            chosen.push(n);
        }
        if !chosen.is_empty() {
            self.blocked_reason = None;
        }
        (chosen, waits)
    }

    /// Why handing over node `n` would leave the group short of what the
    /// workloads not moved need, if it would.
    fn shortfall(&self, n: usize) -> Option<String> {
        let (available, demand, from) = (&self.available, &self.demand, self.from);
        let (r, k) = self.cap[n].iter().find(|(r, k)| {
            **k > 0
                && available.get(*r).copied().unwrap_or(0) - i128::from(**k)
                    < demand.get(*r).copied().unwrap_or(0)
        })?;
        let left = available.get(r).copied().unwrap_or(0) - i128::from(*k);
        Some(format!(
            "handing over {} would leave {left} {r} in group {from} for {} needed by the workloads not moved",
            node_name(self.nodes[n]),
            demand.get(r).copied().unwrap_or(0)
        ))
    }

    /// Hands a wave's nodes over: out of the source group, onto the
    /// target group as the handover leaves them. With the handovers, the
    /// plan's workloads their drains evict, due to move now.
    fn hand_over(
        &mut self,
        chosen: &[usize],
        waits: Vec<Vec<String>>,
        planner: &mut Planner<'_, 'a>,
    ) -> (Vec<Handover<'a>>, BTreeSet<usize>) {
        let built = self.built;
        let workloads = &built.workloads;
        let mut handovers = Vec::new();
        let mut due: BTreeSet<usize> = BTreeSet::new();
        for (&n, waits) in chosen.iter().zip(waits) {
            self.order.remove(&(self.usage[n], n));
            self.in_source[n] = false;
            let evicts: Vec<usize> = self.on_node[n].keys().copied().collect();
            let mut budgets: BTreeSet<&str> = BTreeSet::new();
            for &w in &evicts {
                budgets.extend(
                    workloads[w]
                        .budgets
                        .iter()
                        .map(|b| built.budgets[*b].0.as_str()),
                );
                if workloads[w].in_plan {
                    due.insert(w);
                }
            }
            let node = self.nodes[n];
            handovers.push(Handover {
                node: node_name(node),
                capacity: self.cap[n].iter().map(|(r, k)| (*r, *k)).collect(),
                evicts: evicts.iter().map(|w| workloads[*w].id).collect(),
                budgets: budgets.into_iter().map(str::to_string).collect(),
                budget_waits: waits,
            });
            planner.target.nodes.push(TargetNode::HandedOver {
                node,
                made: OnceCell::new(),
            });
            planner.target.names.push(node_name(node));
            let member = planner.classes.member(n, node_name(node), &planner.state);
            planner.target.members.push(member);
        }
        (handovers, due)
    }

    /// A wave's moves: the evicted workloads first (those that do not fit yet
    /// are pending, with why), then the queues.
    fn move_workloads(
        &mut self,
        due: &BTreeSet<usize>,
        planner: &mut Planner<'_, 'a>,
    ) -> (Vec<Move<'a>>, Vec<Pending<'a>>) {
        let built = self.built;
        let workloads = &built.workloads;
        let mut moves = Vec::new();
        let mut pending = Vec::new();
        let count = planner.target.nodes.len();
        for &i in due {
            if self.moved[i] {
                continue;
            }
            let q = (planner.shape_of[i], workloads[i].replicas);
            let result = planner.try_move(&workloads[i], i, true);
            match result {
                Ok(m) => {
                    moves.push(m);
                    self.record_move(i, planner.shape_of[i]);
                }
                Err(reason) => {
                    self.exhausted.insert(q, count);
                    pending.push(Pending {
                        workload: workloads[i].id,
                        reason,
                    });
                }
            }
        }
        let keys: Vec<(usize, u32)> = self.queues.keys().copied().collect();
        for q in keys {
            if self.exhausted.get(&q) == Some(&count) {
                continue;
            }
            while let Some(&i) = self.queues[&q].first() {
                match planner.try_move(&workloads[i], i, false) {
                    Ok(m) => {
                        moves.push(m);
                        self.record_move(i, planner.shape_of[i]);
                    }
                    Err(_) => {
                        self.exhausted.insert(q, count);
                        break;
                    }
                }
            }
        }
        (moves, pending)
    }

    /// Workload `i` (of shape `shape`) moved: the source group no longer
    /// keeps room for it, and its pods leave the nodes still in the group.
    fn record_move(&mut self, i: usize, shape: usize) {
        let built = self.built;
        let w = &built.workloads[i];
        self.moved[i] = true;
        if let Some(q) = self.queues.get_mut(&(shape, w.replicas)) {
            q.remove(&i);
        }
        for (r, k) in pod_requests(built, w) {
            add_demand(
                &mut self.demand,
                r,
                -i128::from(*k) * i128::from(w.replicas),
            );
        }
        let per_pod: u64 = pod_requests(built, w).iter().map(|(_, k)| k).sum();
        for &n in &self.pods_on[i] {
            if self.in_source[n] {
                self.order.remove(&(self.usage[n], n));
                self.usage[n] -= per_pod;
                self.order.insert((self.usage[n], n));
                self.on_node[n].remove(&i);
            }
        }
    }

    /// The wave's record: its moves in workload order, and the source group
    /// after it.
    fn wave(
        &self,
        number: usize,
        handovers: Vec<Handover<'a>>,
        mut moves: Vec<Move<'a>>,
        pending: Vec<Pending<'a>>,
    ) -> Wave<'a> {
        moves.sort_by(|a, b| a.workload.cmp(&b.workload));
        let keys: BTreeSet<&'a str> = self
            .available
            .keys()
            .chain(self.demand.keys())
            .copied()
            .collect();
        Wave {
            number,
            handovers,
            moves,
            pending,
            source_after: keys
                .into_iter()
                .map(|r| {
                    let get =
                        |m: &BTreeMap<&str, i128>| m.get(r).copied().unwrap_or(0).max(0) as u64;
                    (
                        r,
                        SourceCapacity {
                            available: get(&self.available),
                            needed: get(&self.demand),
                        },
                    )
                })
                .collect(),
        }
    }

    /// The nodes no wave handed over, and why.
    fn blocked(&mut self) -> Option<Blocked<'a>> {
        let mut left: Vec<&'a str> = self
            .order
            .iter()
            .map(|&(_, n)| node_name(self.nodes[n]))
            .collect();
        left.sort();
        let reason = self.blocked_reason.take();
        (!left.is_empty()).then(|| Blocked {
            nodes: left,
            reason: reason.unwrap_or_else(|| "no node can be handed over".into()),
        })
    }

    /// The plan's workloads no wave moved, and why.
    fn remaining(&self, planner: &mut Planner<'_, 'a>) -> Vec<Pending<'a>> {
        let mut remaining = Vec::new();
        let mut reasons: HashMap<(usize, u32), String> = HashMap::default();
        for (i, w) in self.built.workloads.iter().enumerate() {
            if !w.in_plan || self.moved[i] || w.id.kind == "DaemonSet" {
                continue;
            }
            let q = (planner.shape_of[i], w.replicas);
            let reason = match reasons.get(&q) {
                Some(r) => r.clone(),
                None => {
                    // Every queue was tried after the last handover, so this
                    // fails again, now with the reason.
                    let r = planner.try_move(w, i, true).err().unwrap_or_default();
                    reasons.insert(q, r.clone());
                    r
                }
            };
            remaining.push(Pending {
                workload: w.id,
                reason,
            });
        }
        remaining
    }
}

pub(crate) fn plan<'a>(
    snapshot: &'a Snapshot,
    request: &PlanRequest,
    class: &GPUClass,
    built: &Built<'a>,
    reading: Reading,
) -> Result<Plan<'a>, PlanError> {
    let from = request.from.as_str();
    let to = request.to.as_str();
    let max_unavailable = request.max_unavailable.max(1);
    let variants = Variants::new(class);
    let group_label = request.group_label();
    let pilot = pilot_taint(request);
    let groups = Groups::of(snapshot, group_label, from, to);
    let (shapes, shape_of) = rewritten_shapes(built, &variants, group_label, from, pilot.as_ref());
    let compiler = Arc::new(Compiler::default());
    let (classes, inventory) = target_inventory(
        snapshot, request, built, &groups, &shapes, &compiler, reading,
    )?;
    let state = AllocatedState::from_claims(&snapshot.resource_claims)?;

    let handed = groups.source.len();
    let mut planner = Planner {
        request,
        inventory,
        compiler,
        state,
        target: Target::new(groups.target, handed, request, pilot),
        classes,
        publication: Publication {
            layout: request.layout,
            device_classes: &snapshot.device_classes,
            nodes: groups.source.clone(),
            cards: &built.cards,
            read: HashMap::default(),
        },
        cursors: vec![Cursor::default(); shapes.len()],
        shapes,
        shape_of,
        fatal: HashMap::default(),
    };
    let (mut source, follow_nodes) = SourceGroup::read(
        built,
        from,
        groups.source,
        &groups.source_index,
        &planner.shape_of,
    )?;
    let waves = source.plan_waves(&mut planner, max_unavailable);
    let blocked = source.blocked();
    let remaining = source.remaining(&mut planner);
    Ok(Plan {
        from: from.to_string(),
        to: to.to_string(),
        class: variants.class.clone(),
        max_unavailable,
        // Built::entries, made beside the waves.
        register: Vec::new(),
        complete: blocked.is_none() && remaining.is_empty(),
        blocked,
        remaining,
        waves,
        follow_nodes,
    })
}

/// nvidia-operator: the `gpu.nvidia.com` slices `node` would publish once
/// handed over — those of a node that publishes already (the pilot pool)
/// with the same GPU Feature Discovery product, count and memory, renamed
/// to `node`, its cards' UUIDs unknown until then. None without such a node:
/// what the driver would publish for a product no node publishes yet is not
/// known, and the moves that need it stay pending.
fn nvidia_slices(node: &Node, nodes: &[Node], slices: &[ResourceSlice]) -> Vec<ResourceSlice> {
    use switchyard_core::backend::nvidia;
    let gfd = |n: &Node| {
        let labels = n.metadata.labels.as_ref();
        [
            nvidia::GFD_PRODUCT,
            nvidia::GFD_COUNT,
            nvidia::GFD_MEMORY_MIB,
        ]
        .map(|k| labels.and_then(|l| l.get(k)).cloned())
    };
    let wanted = gfd(node);
    if wanted[0].is_none() {
        return Vec::new();
    }
    let name = node_name(node);
    let publishing = |n: &&Node| {
        node_name(n) != name
            && gfd(n) == wanted
            && slices.iter().any(|s| {
                s.spec.driver == nvidia::DRIVER && s.spec.node_name.as_deref() == Some(node_name(n))
            })
    };
    let Some(sibling) = nodes.iter().filter(publishing).min_by_key(|n| node_name(n)) else {
        return Vec::new();
    };
    let sibling = node_name(sibling);
    slices
        .iter()
        .filter(|s| s.spec.driver == nvidia::DRIVER && s.spec.node_name.as_deref() == Some(sibling))
        .map(|s| {
            let mut s = s.clone();
            s.metadata = ObjectMeta {
                name: s
                    .metadata
                    .name
                    .as_ref()
                    .map(|n| n.replacen(sibling, name, 1)),
                ..Default::default()
            };
            s.spec.node_name = Some(name.to_string());
            s.spec.pool.name = name.to_string();
            for device in s.spec.devices.iter_mut().flatten() {
                if let Some(uuid) = device.attributes.as_mut().and_then(|a| a.get_mut("uuid")) {
                    uuid.string = Some(format!("unknown-until-{name}-publishes"));
                }
            }
            s
        })
        .collect()
}

//! Effects: Switchyard's effects carried out, and the platform's answer to them (node preparation on the simulated clock).

use switchyard_core::cluster::{ObjectKey, WorkloadKey, workload_key};
use switchyard_core::effects::Effect;
use switchyard_core::names::{
    GPU_SETUP_COMPLETE_LABEL, GPU_STACK_LABEL, GROUP_LABEL, MODULE_NAMESPACE, NODE_ROLE_PREFIX,
    NVIDIA_GPU, PREPARATION_LABELS, STACK_DEVICE_PLUGIN, STACK_DRA, VENDOR_ADAPTER_APP,
};
use switchyard_proto::v1::{
    GpuPhase, NodeObserved, NodeProvisioning, ResourceQuotaObserved, WorkloadRef,
    domain_event::Kind,
};

use crate::{DEVICE_PLUGIN_APP, SimNode, Simulator, Timer, ev};

/// Whether a write took the node to another group.
fn regrouped(n: &SimNode, before: &SimNode) -> bool {
    n.labels.get(GROUP_LABEL) != before.labels.get(GROUP_LABEL)
}

/// A node effect as Switchyard's writers carry it out (see `switchyard-kube`'s edge).
fn write_node(n: &mut SimNode, effect: &Effect) {
    match effect {
        Effect::Cordon { .. } => n.unschedulable = true,
        Effect::Uncordon { .. } => n.unschedulable = false,
        Effect::MoveToGroup {
            group, from_group, ..
        } => {
            if n.labels.get(GROUP_LABEL) != Some(group) {
                n.labels.remove(GPU_SETUP_COMPLETE_LABEL);
            }
            n.labels.insert(GROUP_LABEL.into(), group.clone());
            n.labels.remove(&format!("{NODE_ROLE_PREFIX}{from_group}"));
        }
        Effect::RestoreNode { labels, taints, .. } => {
            let kept: Vec<(String, String)> = PREPARATION_LABELS
                .iter()
                .filter_map(|k| n.labels.get(*k).map(|v| (k.to_string(), v.clone())))
                .collect();
            let regrouped = n.labels.get(GROUP_LABEL) != labels.get(GROUP_LABEL);
            n.labels = labels
                .iter()
                .filter(|(k, _)| !PREPARATION_LABELS.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            n.labels.extend(kept);
            if regrouped {
                n.labels.remove(GPU_SETUP_COMPLETE_LABEL);
            }
            n.taints = taints.clone();
        }
        // Only while the node is still in the group the removal was decided in.
        Effect::RemoveNodeLabels { labels, group, .. }
            if n.labels.get(GROUP_LABEL).map_or("", String::as_str) == group =>
        {
            for label in labels {
                n.labels.remove(label);
            }
        }
        Effect::SetStackLabel { stack, .. } => {
            match stack {
                Some(stack) => n.labels.insert(GPU_STACK_LABEL.into(), stack.clone()),
                None => n.labels.remove(GPU_STACK_LABEL),
            };
        }
        Effect::SetOperandLabels { labels, .. } => {
            for (key, value) in labels {
                match value {
                    Some(value) => n.labels.insert(key.clone(), value.clone()),
                    None => n.labels.remove(key),
                };
            }
        }
        Effect::SetNodeTaint { taint, present, .. } => {
            n.taints
                .retain(|t| !(t.key == taint.key && t.effect == taint.effect));
            if *present {
                n.taints.push(taint.clone());
            }
        }
        _ => {}
    }
}

impl Simulator {
    /// Carries out one effect. Effects are idempotent: repeating one changes
    /// nothing. The part Switchyard's writers do is [`Simulator::write`] — the
    /// Kubernetes edge does the same, which a parity test on a real API server
    /// checks; the platform's answer to it (node-manager's role label, node
    /// preparation after a stack change, controllers replacing evicted pods)
    /// follows here.
    pub fn execute(&mut self, effect: &Effect) {
        match effect {
            Effect::Cordon { node }
            | Effect::Uncordon { node }
            | Effect::MoveToGroup { node, .. }
            | Effect::RestoreNode { node, .. }
            | Effect::RemoveNodeLabels { node, .. }
            | Effect::SetStackLabel { node, .. }
            | Effect::SetOperandLabels { node, .. }
            | Effect::SetNodeTaint { node, .. } => {
                let Some(before) = self.nodes.get(node).cloned() else {
                    return;
                };
                self.write(effect);
                let restacked = self.react(effect, &before);
                if self.nodes[node] != before {
                    self.report_node(node);
                }
                if restacked {
                    self.prepare(node);
                }
                self.reconcile_operands(node);
            }
            Effect::Drain { node } => {
                for owner in self.evict(node) {
                    // The Deployment controller replaces the evicted pod.
                    self.create_pod(&owner);
                }
            }
            other => self.execute_other(other),
        }
        self.schedule();
    }

    /// What Switchyard's writers do, and nothing more: a node effect changes
    /// the node's labels, taints or `spec.unschedulable` only, with no report
    /// and no platform reaction; a drain removes the pods. Other effects are
    /// executed as by [`Self::execute`].
    pub fn write(&mut self, effect: &Effect) {
        match effect {
            Effect::Drain { node } => {
                self.evict(node);
            }
            Effect::Cordon { node }
            | Effect::Uncordon { node }
            | Effect::MoveToGroup { node, .. }
            | Effect::RestoreNode { node, .. }
            | Effect::RemoveNodeLabels { node, .. }
            | Effect::SetStackLabel { node, .. }
            | Effect::SetOperandLabels { node, .. }
            | Effect::SetNodeTaint { node, .. } => {
                if let Some(n) = self.nodes.get_mut(node) {
                    write_node(n, effect);
                }
            }
            other => self.execute_other(other),
        }
    }

    /// The platform's answer to a node write, in the same update: node-manager
    /// labels a moved node with its new group's role; a new group or a new
    /// stack label starts node preparation, which first takes
    /// gpu-setup-complete away. Returns whether preparation starts.
    fn react(&mut self, effect: &Effect, before: &SimNode) -> bool {
        let stack = |n: &SimNode| n.labels.get(GPU_STACK_LABEL).cloned();
        match effect {
            Effect::MoveToGroup { node, group, .. } => {
                let Some(n) = self.nodes.get_mut(node) else {
                    return false;
                };
                n.labels
                    .insert(format!("{NODE_ROLE_PREFIX}{group}"), String::new());
                // The next bashible run prepares the node for its new group.
                regrouped(n, before)
            }
            Effect::RestoreNode { node, .. } => {
                self.nodes.get(node).is_some_and(|n| regrouped(n, before))
            }
            Effect::SetStackLabel { node, .. } => {
                let n = self.nodes.get_mut(node).expect("written");
                if stack(n) == stack(before) {
                    return false;
                }
                // Preparation starts over: the label goes, and with the
                // device plugin stopping its resources are no longer allocatable.
                n.labels.remove(GPU_SETUP_COMPLETE_LABEL);
                n.allocatable = 0;
                true
            }
            _ => false,
        }
    }

    /// A node as inventory would report it.
    pub fn node_fact(&self, node: &str) -> Option<NodeObserved> {
        let n = self.nodes.get(node)?;
        Some(NodeObserved {
            node: node.into(),
            labels: n.labels.clone(),
            taints: n.taints.clone(),
            unschedulable: n.unschedulable,
            provisioning: NodeProvisioning::Manual as i32,
            gpu_count: n.gpus,
            gpu_allocatable: (n.allocatable > 0)
                .then(|| (NVIDIA_GPU.to_string(), n.allocatable))
                .into_iter()
                .collect(),
        })
    }

    /// Effects on workloads, quotas, groups and classes.
    fn execute_other(&mut self, effect: &Effect) {
        match effect {
            Effect::SetPlacement {
                workload,
                placement,
            } => {
                let key = workload_key(workload);
                if let Some(w) = self.workloads.get_mut(&key) {
                    // Tolerations not recorded (an old record) are left as
                    // they are, as the edge's patch leaves them.
                    let mut wanted = placement.clone();
                    if wanted.tolerations.is_none() {
                        wanted.tolerations = w.placement.tolerations.clone();
                    }
                    if w.placement != wanted {
                        w.placement = wanted;
                        self.report_workload(workload);
                    }
                }
            }
            Effect::RestartWorkload {
                workload,
                restarted_at,
            } => {
                let key = workload_key(workload);
                let Some(w) = self.workloads.get_mut(&key) else {
                    return;
                };
                if w.restarted_at == *restarted_at {
                    return;
                }
                w.restarted_at = restarted_at.clone();
                let replicas = w.replicas;
                self.report_workload(workload);
                for pod in self.pods_of(&key) {
                    self.remove_pod(&pod);
                }
                for _ in 0..replicas {
                    self.create_pod(workload);
                }
            }
            Effect::SetQuota {
                namespace,
                name,
                hard,
            } => {
                let key = (namespace.clone(), name.clone());
                if self.quotas.get(&key) != Some(hard) {
                    self.quotas.insert(key, hard.clone());
                    self.out
                        .push(ev(Kind::ResourceQuotaObserved(ResourceQuotaObserved {
                            namespace: namespace.clone(),
                            name: name.clone(),
                            hard: hard.clone(),
                        })));
                }
            }
            Effect::PublishDeviceClasses {
                gpu_class,
                variants,
                ..
            } => {
                let names: Vec<String> = variants.iter().map(|v| v.device_class.clone()).collect();
                if self.classes.get(gpu_class) != Some(&names) {
                    self.classes.insert(gpu_class.clone(), names.clone());
                    let mut class = self.class_specs.get(gpu_class).cloned().unwrap_or_default();
                    class.name = gpu_class.clone();
                    class.device_class_names = names;
                    self.out.push(ev(Kind::GpuClassObserved(class)));
                }
            }
            Effect::RemoveSpecGpu { group }
                if self.groups.get(group).is_some_and(Option::is_some) =>
            {
                self.set_group(group, None);
            }
            _ => {}
        }
    }

    /// The pods of the workload `key`, by name.
    pub(crate) fn pods_of(&self, key: &WorkloadKey) -> Vec<ObjectKey> {
        self.pods
            .iter()
            .filter(|(_, p)| workload_key(&p.owner) == *key)
            .map(|(k, _)| k.clone())
            .collect()
    }

    pub(crate) fn edit_node(&mut self, node: &str, edit: impl FnOnce(&mut SimNode)) {
        let Some(n) = self.nodes.get_mut(node) else {
            return;
        };
        let before = n.clone();
        edit(n);
        if *n != before {
            self.report_node(node);
        }
    }

    /// Evicts every pod of the node but DaemonSet pods; returns their owners.
    fn evict(&mut self, node: &str) -> Vec<WorkloadRef> {
        let evict: Vec<(ObjectKey, WorkloadRef)> = self
            .pods
            .iter()
            .filter(|(_, p)| p.node == node && p.owner.kind != "DaemonSet")
            .map(|(k, p)| (k.clone(), p.owner.clone()))
            .collect();
        evict
            .into_iter()
            .map(|(pod, owner)| {
                self.remove_pod(&pod);
                owner
            })
            .collect()
    }

    /// The stack label changed: node preparation starts over for the new stack.
    fn prepare(&mut self, node: &str) {
        let jitter = (self.random() % (self.config.prep_delay as u64 / 2).max(1)) as i64;
        let n = self.nodes.get_mut(node).expect("present");
        n.generation += 1;
        let generation = n.generation;
        // Reconfiguration: the GPUs are re-discovered, the stacks' pods restart.
        let gpus: Vec<String> = self
            .gpus
            .iter()
            .filter(|(_, (n, _))| n == node)
            .map(|(k, _)| k.clone())
            .collect();
        for gpu in gpus {
            self.set_gpu(&gpu, node, GpuPhase::Pending);
        }
        for app in [DEVICE_PLUGIN_APP, VENDOR_ADAPTER_APP] {
            self.remove_pod(&(MODULE_NAMESPACE.to_string(), format!("{app}-{node}")));
        }
        self.add_timer(
            self.now + self.config.prep_delay + jitter,
            Timer::PrepareNode {
                node: node.into(),
                generation,
            },
        );
    }

    pub(crate) fn add_timer(&mut self, at: i64, timer: Timer) {
        self.timer_seq += 1;
        self.timers.insert((at, self.timer_seq), timer);
    }

    pub(crate) fn fire(&mut self, timer: Timer) {
        match timer {
            Timer::PrepareNode { node, generation } => {
                let Some(n) = self.nodes.get(&node) else {
                    return;
                };
                if n.generation != generation {
                    return;
                }
                let stack = n.labels.get(GPU_STACK_LABEL).cloned();
                let gpus: Vec<String> = self
                    .gpus
                    .iter()
                    .filter(|(_, (n, _))| *n == node)
                    .map(|(k, _)| k.clone())
                    .collect();
                for gpu in gpus {
                    self.set_gpu(&gpu, &node, GpuPhase::Ready);
                }
                match stack.as_deref() {
                    Some(STACK_DRA) => self.start_daemon(&node, VENDOR_ADAPTER_APP),
                    Some(STACK_DEVICE_PLUGIN) => self.start_daemon(&node, DEVICE_PLUGIN_APP),
                    _ => {}
                }
                if stack.is_some() {
                    let serving = stack.as_deref() == Some(STACK_DEVICE_PLUGIN);
                    self.edit_node(&node, |n| {
                        n.labels
                            .insert(GPU_SETUP_COMPLETE_LABEL.into(), "true".into());
                        if serving {
                            n.allocatable = n.gpus;
                        }
                    });
                }
                self.schedule();
            }
            Timer::StartOperand { node, operand } => {
                self.operand_due(&node, operand);
                self.schedule();
            }
            Timer::DevicePluginGone { node } => self.device_plugin_gone(&node),
        }
    }
}

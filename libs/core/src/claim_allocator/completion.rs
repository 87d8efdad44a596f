//! Completion (reference, "Completion"): once the source group has no nodes and
//! no application requests `nvidia.com/gpu` any more, ResourceQuota limits on
//! `requests.nvidia.com/gpu` become limits on DRA devices with the same values,
//! the leftover device-plugin labels are cleared, and — only after the trial
//! period on DRA, since a rollback needs Device Plugin nodes — the source group
//! loses its spec.gpu section.

use crate::backend::dispatch::strategy;
use std::collections::{BTreeMap, BTreeSet};

use switchyard_proto::v1::{
    CompletionRefused, DomainEvent, LeftoverLabelsCleared, ResourceQuotaTranslated,
    SourceGroupRetired, domain_event::Kind, event,
};

use super::{evidence, stages};
use crate::backend::nvidia;
use crate::backend::strategy::CompletionSource;
use crate::cluster::{Cluster, ObjectKey};
use crate::command::Complete;
use crate::effects::Effect;
use crate::names::{
    CLASS_RESOURCE_PREFIX, DEVICE_GPU_CONFIG_LABEL, NVIDIA_GPU, NVIDIA_LABEL_PREFIX,
};

/// The quota name of device-plugin GPUs.
pub const NVIDIA_GPU_QUOTA: &str = "requests.nvidia.com/gpu";

/// What completion has done and what the edge must keep true.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Completion {
    pub quotas: BTreeMap<ObjectKey, BTreeMap<String, String>>,
    pub cleared_labels: BTreeMap<String, Vec<String>>,
    pub retired: Option<String>,
}

/// The quota a `requests.nvidia.com/gpu` limit becomes: the class's extended
/// resource and its DeviceClass's device count, with the same value.
pub fn translate_quota(
    hard: &BTreeMap<String, String>,
    class: &str,
    device_class: &str,
) -> BTreeMap<String, String> {
    let mut after = hard.clone();
    if let Some(value) = after.remove(NVIDIA_GPU_QUOTA) {
        after.insert(
            format!("requests.{CLASS_RESOURCE_PREFIX}{class}"),
            value.clone(),
        );
        after.insert(
            format!("{device_class}.deviceclass.resource.k8s.io/devices"),
            value,
        );
    }
    after
}

/// Device-plugin leftovers on a node: the gpu config label and NFD's nvidia.com/* labels.
pub fn leftover_labels<'a>(
    labels: impl Iterator<Item = (&'a String, &'a String)>,
) -> BTreeMap<String, String> {
    labels
        .filter(|(k, _)| {
            k.as_str() == DEVICE_GPU_CONFIG_LABEL || k.starts_with(NVIDIA_LABEL_PREFIX)
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

impl Completion {
    pub fn apply(&mut self, event: &DomainEvent) {
        match &event.kind {
            Some(Kind::ResourceQuotaTranslated(e)) => {
                self.quotas
                    .insert((e.namespace.clone(), e.name.clone()), e.hard_after.clone());
            }
            Some(Kind::LeftoverLabelsCleared(e)) => {
                self.cleared_labels
                    .insert(e.node.clone(), e.removed.keys().cloned().collect());
            }
            Some(Kind::SourceGroupRetired(e)) => self.retired = Some(e.group.clone()),
            _ => {}
        }
    }

    /// The completion steps, or why they cannot be taken yet.
    pub fn complete(&self, cluster: &Cluster, cmd: &Complete) -> Vec<DomainEvent> {
        let refuse = |reason: String| refusal(cmd, reason);
        let device_plugin_pool =
            match strategy(&cluster.backend).completion_source(&cmd.source_group) {
                CompletionSource::Group => false,
                CompletionSource::DevicePluginPool => true,
                CompletionSource::DraPool => return abandon(cluster, cmd),
                CompletionSource::Refused(reason) => return refuse(reason),
            };
        if let Some(nodes) = remaining(cluster, &cmd.source_group) {
            return refuse(format!(
                "hand over the remaining nodes first: {} still in group {}: {}",
                nodes.len(),
                cmd.source_group,
                nodes.join(", ")
            ));
        }
        let waiting: Vec<String> = cluster
            .workloads
            .iter()
            .filter(|(_, w)| w.placement.requests_nvidia_gpu())
            // A Job follows its CronJob's template, or has finished and needs
            // nothing more.
            .filter(|((_, kind, _), w)| kind != "Job" || (w.cron_job().is_none() && w.replicas > 0))
            .map(|((ns, kind, name), _)| format!("{kind} {ns}/{name}"))
            .collect();
        if !waiting.is_empty() {
            return refuse(format!(
                "move the remaining applications first: {} still request {NVIDIA_GPU}: {}",
                waiting.len(),
                waiting.join(", ")
            ));
        }
        if cmd.gpu_class.is_empty() {
            return refuse(format!(
                "no GPU class named: the quotas on {NVIDIA_GPU_QUOTA} become the devices of a GPU class; name the one the applications moved to"
            ));
        }
        let Some(device_class) = cluster
            .gpu_classes
            .get(&cmd.gpu_class)
            .and_then(|d| d.first())
        else {
            return refuse(format!(
                "GPU class {} does not exist or has no DeviceClass yet",
                cmd.gpu_class
            ));
        };
        let mut decisions = Vec::new();
        for ((namespace, name), hard) in &cluster.quotas {
            if hard.contains_key(NVIDIA_GPU_QUOTA) {
                decisions.push(event(Kind::ResourceQuotaTranslated(
                    ResourceQuotaTranslated {
                        namespace: namespace.clone(),
                        name: name.clone(),
                        hard_before: hard.clone(),
                        hard_after: translate_quota(hard, &cmd.gpu_class, device_class),
                    },
                )));
            }
        }
        if device_plugin_pool {
            // The operator's nvidia.com/* labels are its operands' switches
            // and GPU Feature Discovery's facts: none is a leftover here.
            decisions.extend(final_cutover(cluster, cmd));
            return decisions;
        }
        for (node, facts) in &cluster.nodes {
            let removed = leftover_labels(facts.labels.iter());
            if !removed.is_empty() {
                decisions.push(event(Kind::LeftoverLabelsCleared(LeftoverLabelsCleared {
                    node: node.clone(),
                    removed,
                })));
            }
        }
        let group = cluster.groups.get(&cmd.source_group);
        match group.and_then(|g| g.gpu.clone()) {
            Some(gpu) if cmd.trial_period_over => {
                decisions.push(event(Kind::SourceGroupRetired(SourceGroupRetired {
                    group: cmd.source_group.clone(),
                    gpu_before: Some(gpu),
                    deleted: false,
                    next_step: String::new(),
                })));
            }
            Some(_) => decisions.extend(refusal(
                cmd,
                format!(
                    "group {} keeps its spec.gpu: a rollback needs Device Plugin nodes; retire it once the trial period on DRA is over",
                    cmd.source_group
                ),
            )),
            None => {}
        }
        decisions
    }

    /// What the edge should keep true after completion.
    pub fn effects(&self, cluster: &Cluster) -> Vec<Effect> {
        let mut effects = Vec::new();
        for ((namespace, name), hard) in &self.quotas {
            if cluster.quotas.get(&(namespace.clone(), name.clone())) != Some(hard) {
                effects.push(Effect::SetQuota {
                    namespace: namespace.clone(),
                    name: name.clone(),
                    hard: hard.clone(),
                });
            }
        }
        for (node, labels) in &self.cleared_labels {
            // A node rolled back into a group with spec.gpu gets its labels back
            // from its before-image; completion does not fight the rollback.
            let group = cluster.nodes.get(node).and_then(|n| n.group());
            if group.is_some_and(|g| cluster.has_spec_gpu(g)) {
                continue;
            }
            let present: Vec<String> = labels
                .iter()
                .filter(|l| {
                    cluster
                        .nodes
                        .get(node)
                        .is_some_and(|n| n.labels.contains_key(l))
                })
                .cloned()
                .collect();
            if !present.is_empty() {
                // Facts can trail the node: the write holds only while the
                // node is where this view has it.
                effects.push(Effect::RemoveNodeLabels {
                    node: node.clone(),
                    labels: present,
                    group: group.unwrap_or_default().to_string(),
                });
            }
        }
        if let Some(group) = &self.retired
            && cluster.has_spec_gpu(group)
        {
            effects.push(Effect::RemoveSpecGpu {
                group: group.clone(),
            });
        }
        effects
    }
}

fn refusal(cmd: &Complete, reason: String) -> Vec<DomainEvent> {
    vec![event(Kind::CompletionRefused(CompletionRefused {
        source_group: cmd.source_group.clone(),
        reason,
    }))]
}

/// The nodes still in `group`, if any.
fn remaining<'a>(cluster: &'a Cluster, group: &str) -> Option<Vec<&'a str>> {
    cluster
        .members
        .get(group)
        .filter(|m| !m.is_empty())
        .map(|m| m.iter().map(String::as_str).collect())
}

/// The guide's final cutover on the `nvidia-operator` backend, once the
/// legacy pool is empty and no application asks for `nvidia.com/gpu`: the
/// chart-wide device plugin may go (`devicePlugin.enabled=false`) only after
/// the trial period, and only while no GPU node is left to it — a GPU node
/// in no DRA pool would lose its GPUs.
fn final_cutover(cluster: &Cluster, cmd: &Complete) -> Vec<DomainEvent> {
    if !cmd.trial_period_over {
        return refusal(
            cmd,
            format!(
                "pool {} is empty, but keep the GPU Operator's device plugin enabled chart-wide (devicePlugin.enabled) for the trial period on DRA: a rollback needs it; run again with the trial period over for the final cutover",
                cmd.source_group
            ),
        );
    }
    let serving: Vec<String> = evidence::gpu_nodes(cluster)
        .iter()
        .filter_map(|n| {
            let item = stages::no_device_plugin(cluster, n);
            (!item.passed).then(|| format!("node {n}: {}", item.detail))
        })
        .collect();
    if !serving.is_empty() {
        return refusal(
            cmd,
            format!(
                "final cutover: the device plugin still serves {} node(s) — hand them to a DRA pool first: {}",
                serving.len(),
                serving.join("; ")
            ),
        );
    }
    vec![event(Kind::SourceGroupRetired(SourceGroupRetired {
        group: cmd.source_group.clone(),
        gpu_before: None,
        deleted: false,
        next_step: "no device-plugin pod or resource is left: switch the device plugin off chart-wide (helm upgrade gpu-operator nvidia/gpu-operator -n gpu-operator --reuse-values --set devicePlugin.enabled=false); a rollback after this re-enables it first".into(),
    }))]
}

/// An abandoned migration, completed: every node of DRA pool
/// `cmd.source_group` rolled back. "Uninstall DRA only after the last DRA
/// node is clear": no node anywhere still serving DRA, publishing the
/// driver's devices or holding a claim on them.
fn abandon(cluster: &Cluster, cmd: &Complete) -> Vec<DomainEvent> {
    if let Some(nodes) = remaining(cluster, &cmd.source_group) {
        return refusal(
            cmd,
            format!(
                "roll back the remaining nodes first (switchyard rollback node): {} still in DRA pool {}: {}",
                nodes.len(),
                cmd.source_group,
                nodes.join(", ")
            ),
        );
    }
    let mut in_use = Vec::new();
    let serving: Vec<&str> = cluster
        .nodes
        .keys()
        .filter(|n| stages::serves_dra(cluster, n))
        .map(String::as_str)
        .collect();
    if !serving.is_empty() {
        in_use.push(format!("nodes still serving DRA: {}", serving.join(", ")));
    }
    let publishing: BTreeSet<&str> = cluster
        .slices
        .values()
        .filter(|s| s.driver == nvidia::DRIVER)
        .map(|s| {
            if s.node.is_empty() {
                "(no node)"
            } else {
                s.node.as_str()
            }
        })
        .collect();
    if !publishing.is_empty() {
        in_use.push(format!(
            "{} devices still published for: {}",
            nvidia::DRIVER,
            publishing.into_iter().collect::<Vec<_>>().join(", ")
        ));
    }
    let prefix = format!("{}/", nvidia::DRIVER);
    let claims: Vec<String> = cluster
        .claims
        .iter()
        .filter(|(_, c)| c.devices.iter().any(|d| d.starts_with(&prefix)))
        .map(|((ns, name), c)| format!("{ns}/{name} on {}", c.node))
        .collect();
    if !claims.is_empty() {
        in_use.push(format!(
            "claims still allocated {} devices: {}",
            nvidia::DRIVER,
            claims.join(", ")
        ));
    }
    if !in_use.is_empty() {
        return refusal(
            cmd,
            format!(
                "uninstall DRA only after the last DRA node is clear: {}",
                in_use.join("; ")
            ),
        );
    }
    vec![event(Kind::SourceGroupRetired(SourceGroupRetired {
        group: cmd.source_group.clone(),
        gpu_before: None,
        deleted: false,
        next_step: format!(
            "the last DRA node is clear: uninstall the DRA driver (helm uninstall nvidia-dra-driver-gpu -n nvidia-dra-driver-gpu, as installed) and delete the GPUClasses and bridge DeviceClasses no longer needed (kubectl get gpuclass,deviceclass); pool {} can leave SWITCHYARD_NVIDIA_POOLS",
            cmd.source_group
        ),
    }))]
}

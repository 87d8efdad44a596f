//! Completion (reference, "Completion"): once the source group has no nodes and
//! no application requests `nvidia.com/gpu` any more, ResourceQuota limits on
//! `requests.nvidia.com/gpu` become limits on DRA devices with the same values,
//! the leftover device-plugin labels are cleared, and — only after the trial
//! period on DRA, since a rollback needs Device Plugin nodes — the source group
//! loses its spec.gpu section.

use std::collections::BTreeMap;

use switchyard_proto::v1::{
    CompletionRefused, DomainEvent, LeftoverLabelsCleared, ResourceQuotaTranslated,
    SourceGroupRetired, domain_event::Kind, event,
};

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
        let refuse = |reason: String| {
            vec![event(Kind::CompletionRefused(CompletionRefused {
                source_group: cmd.source_group.clone(),
                reason,
            }))]
        };
        if let Some(nodes) = cluster
            .members
            .get(&cmd.source_group)
            .filter(|m| !m.is_empty())
        {
            let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
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
            .filter(|((_, kind, _), w)| kind != "Job" || (w.cron_job.is_none() && w.replicas > 0))
            .map(|((ns, kind, name), _)| format!("{kind} {ns}/{name}"))
            .collect();
        if !waiting.is_empty() {
            return refuse(format!(
                "move the remaining applications first: {} still request {NVIDIA_GPU}: {}",
                waiting.len(),
                waiting.join(", ")
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
                })));
            }
            Some(_) => decisions.push(event(Kind::CompletionRefused(CompletionRefused {
                source_group: cmd.source_group.clone(),
                reason: format!(
                    "group {} keeps its spec.gpu: a rollback needs Device Plugin nodes; retire it once the trial period on DRA is over",
                    cmd.source_group
                ),
            }))),
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

//! The stack-assigner's writers: the node's `gpu-stack` label and
//! `spec.unschedulable` (Server-Side Apply, owned), the handover's group move
//! and a rollback's restore (read-decide-write), drains through the Eviction
//! API with the PodDisruptionBudgets that refuse them, and the Events on a
//! Node that say why its stack switch is held.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;
use kube::api::{Api, EvictParams, ListParams, PostParams};
use serde_json::{Value, json};
use switchyard_core::ServiceName;
use switchyard_core::backend::{DeployLabel, nvidia};
use switchyard_core::effects::{Effect, Outcome};
use switchyard_core::names::{
    GPU_SETUP_COMPLETE_LABEL, GPU_STACK_LABEL, GROUP_LABEL, NODE_ROLE_PREFIX, PREPARATION_LABELS,
    TRACEPARENT_ANNOTATION,
};
use switchyard_kube::write::{Edge, EdgeError, Writer, Writes, label_diff, not_owned, selects};
use switchyard_proto::v1::{EvictionBlocked, NodeGroupWritten, Taint};

use crate::SERVICE;

/// The stack-assigner's writers (field manager `switchyard-stack-assigner`), as the
/// runtime's executor.
pub type StackAssignerEdge = Edge<StackAssignerWrites>;

/// How the stack-assigner writes each effect it owns.
#[derive(Clone)]
pub struct StackAssignerWrites {
    writer: Writer,
    /// Events this process recorded: an effect issued again records nothing.
    recorded: Arc<Mutex<BTreeSet<String>>>,
}

/// Namespace of the Events about Nodes (cluster-scoped objects).
const NODE_EVENT_NAMESPACE: &str = "default";

impl Writes for StackAssignerWrites {
    const SERVICE: ServiceName = SERVICE;

    fn new(writer: Writer) -> Self {
        StackAssignerWrites {
            writer,
            recorded: Arc::default(),
        }
    }

    fn writer(&self) -> &Writer {
        &self.writer
    }

    async fn write(&self, effect: &Effect) -> Result<Outcome, EdgeError> {
        match effect {
            Effect::Cordon { node } => self.apply_unschedulable(node, true).await,
            Effect::Uncordon { node } => self.apply_unschedulable(node, false).await,
            Effect::SetStackLabel {
                node,
                stack: Some(stack),
            } => self.apply_stack_label(node, stack).await,
            Effect::SetStackLabel { node, stack: None } => self.remove_stack_label(node).await,
            Effect::MoveToGroup {
                node,
                group,
                from_group,
            } => self.move_to_group(node, group, from_group).await,
            Effect::RestoreNode {
                node,
                labels,
                taints,
            } => self.restore_node(node, labels, taints).await,
            Effect::SetOperandLabels {
                node,
                labels,
                unless_paused,
            } => self.set_operand_labels(node, labels, *unless_paused).await,
            Effect::SetNodeTaint {
                node,
                taint,
                present,
            } => self.set_node_taint(node, taint, *present).await,
            Effect::Drain { node } => self.drain(node).await,
            Effect::NodeEvent {
                node,
                reason,
                message,
            } => self.node_event(node, reason, message).await,
            other => not_owned::<Self>(other),
        }
    }
}

/// A write that takes the node from `before`'s group into `after`'s also
/// takes `gpu-setup-complete` away; what it does, if the group changes.
fn regroup(
    node: &str,
    before: &BTreeMap<String, String>,
    after: &mut BTreeMap<String, String>,
) -> Option<NodeGroupWritten> {
    let from = before.get(GROUP_LABEL).cloned().unwrap_or_default();
    let to = after.get(GROUP_LABEL).cloned().unwrap_or_default();
    if from == to {
        return None;
    }
    let removed = after.remove(GPU_SETUP_COMPLETE_LABEL).is_some();
    Some(NodeGroupWritten {
        node: node.to_string(),
        from_group: from,
        to_group: to,
        labels_removed: removed
            .then(|| GPU_SETUP_COMPLETE_LABEL.to_string())
            .into_iter()
            .collect(),
    })
}

impl StackAssignerWrites {
    async fn apply_unschedulable(&self, node: &str, on: bool) -> Result<Outcome, EdgeError> {
        self.writer
            .apply_node(
                node,
                |owned| owned.unschedulable = Some(on),
                |n| {
                    n.spec
                        .as_ref()
                        .and_then(|s| s.unschedulable)
                        .unwrap_or(false)
                        == on
                },
            )
            .await
    }

    /// The stack label, with the trace it is written in (the node agent's
    /// switch continues it).
    async fn apply_stack_label(&self, node: &str, stack: &str) -> Result<Outcome, EdgeError> {
        let trace = switchyard_eventlog::trace::current();
        self.writer
            .apply_node(
                node,
                |owned| {
                    owned
                        .labels
                        .insert(GPU_STACK_LABEL.to_string(), stack.to_string());
                    if let Some(trace) = &trace {
                        owned.annotations.insert(
                            TRACEPARENT_ANNOTATION.to_string(),
                            trace.traceparent.clone(),
                        );
                    }
                },
                |n| n.labels().get(GPU_STACK_LABEL).map(String::as_str) == Some(stack),
            )
            .await
    }

    /// No stack: give the label up (Server-Side Apply without it), and
    /// remove it outright if another manager keeps it.
    async fn remove_stack_label(&self, node: &str) -> Result<Outcome, EdgeError> {
        self.writer
            .apply_node(
                node,
                |owned| {
                    owned.labels.remove(GPU_STACK_LABEL);
                },
                |n| !n.labels().contains_key(GPU_STACK_LABEL),
            )
            .await?;
        self.writer
            .edit_node_labels(node, |labels| {
                labels.remove(GPU_STACK_LABEL);
                Ok(())
            })
            .await
    }

    /// A handover's move: the group label set, the old group's role label
    /// and, if the group changes with this write, `gpu-setup-complete`
    /// removed in the same guarded patch — a preparation label left from the
    /// old group can then never pass for the new group's, whatever inventory
    /// sees of the writes that follow (it may see none of them in between).
    async fn move_to_group(
        &self,
        node: &str,
        group: &str,
        from_group: &str,
    ) -> Result<Outcome, EdgeError> {
        let current = self.writer.read_node(node).await?;
        let before = current.labels().clone();
        let mut after = before.clone();
        after.insert(GROUP_LABEL.to_string(), group.to_string());
        after.remove(&format!("{NODE_ROLE_PREFIX}{from_group}"));
        let written = regroup(node, &before, &mut after);
        if after == before {
            return Ok(Outcome::default());
        }
        let patch = json!({"metadata": {
            "resourceVersion": current.resource_version(),
            "labels": label_diff(&before, &after),
        }});
        let nodes = self.writer.nodes();
        let outcome = self
            .writer
            .merge_patch(
                &nodes,
                node,
                &patch,
                format!("move node {node} to group {group}"),
            )
            .await?;
        Ok(Outcome {
            group_written: written,
            ..outcome
        })
    }

    /// A rollback: the node's labels become `labels` (the preparation labels
    /// stay as node preparation left them, but `gpu-setup-complete` goes if
    /// the group changes, as with a move) and its taints `taints`.
    async fn restore_node(
        &self,
        node: &str,
        labels: &BTreeMap<String, String>,
        taints: &[Taint],
    ) -> Result<Outcome, EdgeError> {
        let nodes = self.writer.nodes();
        let current = self.writer.read_node(node).await?;
        let before = current.labels().clone();
        let mut after: BTreeMap<String, String> = labels
            .iter()
            .filter(|(k, _)| !PREPARATION_LABELS.contains(&k.as_str()))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for label in PREPARATION_LABELS {
            if let Some(v) = before.get(label) {
                after.insert(label.to_string(), v.clone());
            }
        }
        let written = regroup(node, &before, &mut after);
        let taints: Vec<Value> = taints
            .iter()
            .map(|t| {
                let mut taint = json!({"key": t.key, "effect": t.effect});
                if !t.value.is_empty() {
                    taint["value"] = json!(t.value);
                }
                taint
            })
            .collect();
        let have_taints = serde_json::to_value(
            current
                .spec
                .as_ref()
                .and_then(|s| s.taints.clone())
                .unwrap_or_default(),
        )
        .unwrap_or_default();
        if after == before && have_taints == json!(taints) {
            return Ok(Outcome::default());
        }
        let patch = json!({
            "metadata": {
                "resourceVersion": current.resource_version(),
                "labels": label_diff(&before, &after),
            },
            "spec": {"taints": if taints.is_empty() { Value::Null } else { json!(taints) }},
        });
        let outcome = self
            .writer
            .merge_patch(&nodes, node, &patch, format!("restore node {node}"))
            .await?;
        Ok(Outcome {
            group_written: written,
            ..outcome
        })
    }

    /// nvidia-operator backend: the labels the GPU Operator and the DRA
    /// kubelet plugin's DaemonSet watch, in one merge patch guarded by the
    /// node's resourceVersion (they own these keys too: a Server-Side Apply
    /// would take them over or conflict). While the driver manager has paused
    /// an operand (`…paused-for-driver-upgrade`), nothing is written and the
    /// write fails, to be issued again once the pause ends.
    async fn set_operand_labels(
        &self,
        node: &str,
        labels: &BTreeMap<String, Option<String>>,
        unless_paused: bool,
    ) -> Result<Outcome, EdgeError> {
        self.writer
            .edit_node_labels(node, |current| {
                if unless_paused
                    && let Some((key, value)) = current.iter().find(|(k, v)| {
                        k.starts_with(nvidia::DEPLOY_PREFIX) && DeployLabel::read(Some(v)).paused()
                    })
                {
                    return Err(EdgeError::Paused(format!(
                        "node {node}: {key}={value}: the driver manager paused the GPU Operator's operands for a driver upgrade; the labels are written once it restores them"
                    )));
                }
                for (key, value) in labels {
                    match value {
                        Some(value) => current.insert(key.clone(), value.clone()),
                        None => current.remove(key),
                    };
                }
                Ok(())
            })
            .await
    }

    /// nvidia-operator backend: the pilot taint added or removed, the
    /// node's other taints kept, guarded by its resourceVersion.
    async fn set_node_taint(
        &self,
        node: &str,
        taint: &Taint,
        present: bool,
    ) -> Result<Outcome, EdgeError> {
        let current = self.writer.read_node(node).await?;
        let mut taints = current
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default();
        let before = taints.len();
        let same =
            |t: &k8s_openapi::api::core::v1::Taint| t.key == taint.key && t.effect == taint.effect;
        let had = taints.iter().any(same);
        if had == present {
            return Ok(Outcome::default());
        }
        taints.retain(|t| !same(t));
        if present {
            taints.push(k8s_openapi::api::core::v1::Taint {
                key: taint.key.clone(),
                value: (!taint.value.is_empty()).then(|| taint.value.clone()),
                effect: taint.effect.clone(),
                time_added: None,
            });
        }
        debug_assert_ne!(before, taints.len());
        let patch = json!({
            "metadata": {"resourceVersion": current.resource_version()},
            "spec": {"taints": taints},
        });
        let nodes = self.writer.nodes();
        let what = if present { "add" } else { "remove" };
        self.writer
            .merge_patch(
                &nodes,
                node,
                &patch,
                format!("{what} taint {} on node {node}", taint.key),
            )
            .await
    }

    /// Evicts every pod of the node but DaemonSet and mirror pods, through the
    /// Eviction API; reports the pods it refused (a PodDisruptionBudget) with
    /// the budgets that cover them.
    async fn drain(&self, node: &str) -> Result<Outcome, EdgeError> {
        let pods: Api<Pod> = Api::all(self.writer.client());
        let on_node = pods
            .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
            .await
            .map_err(EdgeError::api(format!("list the pods of node {node}")))?;
        let mut outcome = Outcome::default();
        for pod in on_node {
            let daemon = pod
                .owner_references()
                .iter()
                .any(|o| o.kind == "DaemonSet" && o.controller == Some(true));
            let mirror = pod
                .annotations()
                .contains_key("kubernetes.io/config.mirror");
            if daemon || mirror || pod.metadata.deletion_timestamp.is_some() {
                continue;
            }
            let namespace = pod.namespace().unwrap_or_default();
            let name = pod.name_any();
            let api: Api<Pod> = Api::namespaced(self.writer.client(), &namespace);
            match api.evict(&name, &EvictParams::default()).await {
                Ok(_) => outcome.evicted.push(format!("{namespace}/{name}")),
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(kube::Error::Api(status)) if status.code == 429 => {
                    let budgets = self.budgets_covering(&pod).await?;
                    outcome.blocked.push(EvictionBlocked {
                        node: node.to_string(),
                        namespace,
                        pod: name,
                        reason: status.message,
                        disruption_budgets: budgets,
                    });
                }
                Err(err) => {
                    return Err(EdgeError::api(format!("evict pod {namespace}/{name}"))(err));
                }
            }
        }
        Ok(outcome)
    }

    /// A Warning Event on the Node. Its name comes from the node, reason and
    /// message, so recording it again (after a restart) finds it there.
    async fn node_event(
        &self,
        node: &str,
        reason: &str,
        message: &str,
    ) -> Result<Outcome, EdgeError> {
        let hash = blake3::hash(format!("{node}\0{reason}\0{message}").as_bytes()).to_hex();
        let name = format!("{node}.{}.{}", reason.to_ascii_lowercase(), &hash[..16]);
        if self.recorded.lock().expect("not poisoned").contains(&name) {
            return Ok(Outcome::default());
        }
        let current = self.writer.read_node(node).await?;
        let now = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
        let event: Event = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": NODE_EVENT_NAMESPACE},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": current.metadata.uid},
            "reason": reason,
            "message": message,
            "type": "Warning",
            "source": {"component": self.writer.field_manager()},
            "reportingComponent": self.writer.field_manager(),
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }))
        .map_err(|e| EdgeError::Invalid(format!("event {name}: {e}")))?;
        let events: Api<Event> = Api::namespaced(self.writer.client(), NODE_EVENT_NAMESPACE);
        match events.create(&PostParams::default(), &event).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(err) => {
                return Err(EdgeError::api(format!(
                    "record event {reason} on node {node}"
                ))(err));
            }
        }
        self.recorded.lock().expect("not poisoned").insert(name);
        Ok(Outcome::default())
    }

    async fn budgets_covering(&self, pod: &Pod) -> Result<Vec<String>, EdgeError> {
        let namespace = pod.namespace().unwrap_or_default();
        let pdbs: Api<PodDisruptionBudget> = Api::namespaced(self.writer.client(), &namespace);
        let list = pdbs
            .list(&ListParams::default())
            .await
            .map_err(EdgeError::api(format!(
                "list the PodDisruptionBudgets of namespace {namespace}"
            )))?;
        Ok(list
            .into_iter()
            .filter(|pdb| {
                pdb.spec
                    .as_ref()
                    .and_then(|s| s.selector.as_ref())
                    .is_some_and(|sel| selects(sel, pod.labels()))
            })
            .map(|pdb| format!("{namespace}/{}", pdb.name_any()))
            .collect())
    }
}

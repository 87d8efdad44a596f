//! The writers: the cores' [`Effect`]s executed against the API server.
//!
//! Every write carries the service's field manager. A field the service owns
//! (the `gpu-stack` label, `spec.unschedulable`, a DeviceClass, a GPUClass's
//! status) is written with Server-Side Apply. Server-Side Apply cannot take
//! away a field another manager owns, so changes to what others own (the
//! group label, role labels, a rollback's restore, a workload's template) are
//! read-decide-write: read the object, compute the change from what is there
//! now, write it with the read `resourceVersion` as precondition. A conflict
//! (409) — from either route — re-reads and decides again; an apply conflict
//! is forced only after the re-read shows the field still is not what the
//! effect asks for. 409, 429 and 5xx are retried with exponential backoff per
//! object; other errors are returned to the host, which issues the effect
//! again later (effects are idempotent).

use std::collections::BTreeMap;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Node, Pod, PodSpec, ResourceQuota};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::DeviceClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, EvictParams, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use switchyard_api::{GPUClass, NodeGroup};
use switchyard_core::effects::Effect;
use switchyard_core::names::{GPU_STACK_LABEL, GROUP_LABEL, NODE_ROLE_PREFIX, PREPARATION_LABELS};
use switchyard_proto::v1::{EvictionBlocked, Taint, WorkloadPlacement, WorkloadRef};

/// The `kubectl rollout restart` annotation.
pub const RESTARTED_AT_ANNOTATION: &str = "kubectl.kubernetes.io/restartedAt";

#[derive(Debug, thiserror::Error)]
pub enum EdgeError {
    #[error("{what}: {source}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
    #[error("{0}")]
    Invalid(String),
}

impl EdgeError {
    fn api(what: impl Into<String>) -> impl FnOnce(kube::Error) -> EdgeError {
        let what = what.into();
        move |source| EdgeError::Api { what, source }
    }

    /// 409, 429 and 5xx: worth another try after a pause.
    fn retryable(&self) -> bool {
        matches!(self, EdgeError::Api { source: kube::Error::Api(status), .. }
            if status.code == 409 || status.code == 429 || status.code >= 500)
    }
}

/// What an effect led to, beyond "done".
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Outcome {
    /// Pods of a drained node the Eviction API refused to evict.
    pub blocked: Vec<EvictionBlocked>,
    /// Pods an eviction was accepted for.
    pub evicted: Vec<String>,
}

/// The writers of one service.
#[derive(Clone)]
pub struct Edge {
    client: Client,
    manager: String,
    backoff: ExponentialBuilder,
}

impl Edge {
    /// Writers acting as `service`: field manager `switchyard-<service>`.
    /// The client is built from `config` without kube's own retry of 429 and
    /// 503: an eviction refused by a PodDisruptionBudget is a 429 that must be
    /// reported at once, not retried for minutes; the edge backs off itself.
    pub fn new(mut config: kube::Config, service: &str) -> Result<Edge, EdgeError> {
        config.default_retry = false;
        let client = Client::try_from(config)
            .map_err(|e| EdgeError::Invalid(format!("build the Kubernetes client: {e}")))?;
        Ok(Edge {
            client,
            manager: format!("switchyard-{service}"),
            backoff: ExponentialBuilder::default()
                .with_min_delay(Duration::from_millis(50))
                .with_max_delay(Duration::from_secs(5))
                .with_max_times(8)
                .with_jitter(),
        })
    }

    pub fn field_manager(&self) -> &str {
        &self.manager
    }

    /// Executes one effect, retrying conflicts, throttling and server errors.
    pub async fn execute(&self, effect: &Effect) -> Result<Outcome, EdgeError> {
        (|| self.execute_once(effect))
            .retry(self.backoff)
            .when(EdgeError::retryable)
            .notify(|err, pause| tracing::debug!(%err, ?pause, "retrying"))
            .await
    }

    async fn execute_once(&self, effect: &Effect) -> Result<Outcome, EdgeError> {
        match effect {
            Effect::Cordon { node } => self.apply_unschedulable(node, true).await,
            Effect::Uncordon { node } => self.apply_unschedulable(node, false).await,
            Effect::SetStackLabel {
                node,
                stack: Some(stack),
            } => self.apply_stack_label(node, stack).await,
            Effect::SetStackLabel { node, stack: None } => self.remove_stack_label(node).await,
            Effect::RemoveNodeLabels { node, labels } => {
                self.edit_node_labels(node, |current| {
                    for label in labels {
                        current.remove(label);
                    }
                })
                .await
            }
            Effect::MoveToGroup {
                node,
                group,
                from_group,
            } => {
                self.edit_node_labels(node, |labels| {
                    labels.insert(GROUP_LABEL.to_string(), group.clone());
                    labels.remove(&format!("{NODE_ROLE_PREFIX}{from_group}"));
                })
                .await
            }
            Effect::RestoreNode {
                node,
                labels,
                taints,
            } => self.restore_node(node, labels, taints).await,
            Effect::Drain { node } => self.drain(node).await,
            Effect::SetPlacement {
                workload,
                placement,
            } => {
                self.edit_template(workload, |spec| set_placement(spec, placement))
                    .await
            }
            Effect::RestartWorkload {
                workload,
                restarted_at,
            } => self.restart(workload, restarted_at).await,
            Effect::RemoveSpecGpu { group } => self.remove_spec_gpu(group).await,
            Effect::SetQuota {
                namespace,
                name,
                hard,
            } => self.set_quota(namespace, name, hard).await,
            Effect::PublishDeviceClasses {
                gpu_class,
                variants,
                refused,
                namespaces,
            } => {
                self.restrict_namespaces(gpu_class, variants, namespaces)
                    .await?;
                self.publish_device_classes(gpu_class, variants, refused.as_deref())
                    .await
            }
            Effect::RetireDeviceClasses {
                gpu_class,
                device_classes,
            } => self.retire_device_classes(gpu_class, device_classes).await,
        }
    }

    fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    async fn read_node(&self, node: &str) -> Result<Node, EdgeError> {
        self.nodes()
            .get(node)
            .await
            .map_err(EdgeError::api(format!("read node {node}")))
    }

    /// Server-Side Apply of the node fields this service owns. An apply
    /// states everything its manager owns — a field left out is given up — so
    /// the apply carries the fields the service owns now (read from the
    /// node's managedFields) with `edit` made to them. On a conflict with
    /// another manager: re-read, and take the field over only if it still is
    /// not what the effect asks for.
    async fn apply_node(
        &self,
        node: &str,
        edit: impl Fn(&mut Owned),
        holds: impl Fn(&Node) -> bool,
    ) -> Result<Outcome, EdgeError> {
        let nodes = self.nodes();
        let current = self.read_node(node).await?;
        if holds(&current) {
            return Ok(Outcome::default());
        }
        let mut owned = Owned::of(&current, &self.manager);
        edit(&mut owned);
        let patch = owned.apply_config(node);
        let params = PatchParams::apply(&self.manager);
        match nodes.patch(node, &params, &Patch::Apply(&patch)).await {
            Ok(_) => Ok(Outcome::default()),
            Err(kube::Error::Api(status)) if status.code == 409 => {
                let current = self.read_node(node).await?;
                if holds(&current) {
                    return Ok(Outcome::default());
                }
                tracing::info!(node, conflict = %status.message, "taking the field over after a re-read");
                let mut owned = Owned::of(&current, &self.manager);
                edit(&mut owned);
                nodes
                    .patch(
                        node,
                        &params.force(),
                        &Patch::Apply(&owned.apply_config(node)),
                    )
                    .await
                    .map_err(EdgeError::api(format!("apply node {node}")))?;
                Ok(Outcome::default())
            }
            Err(err) => Err(EdgeError::api(format!("apply node {node}"))(err)),
        }
    }

    async fn apply_unschedulable(&self, node: &str, on: bool) -> Result<Outcome, EdgeError> {
        self.apply_node(
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

    async fn apply_stack_label(&self, node: &str, stack: &str) -> Result<Outcome, EdgeError> {
        self.apply_node(
            node,
            |owned| {
                owned
                    .labels
                    .insert(GPU_STACK_LABEL.to_string(), stack.to_string());
            },
            |n| n.labels().get(GPU_STACK_LABEL).map(String::as_str) == Some(stack),
        )
        .await
    }

    /// No stack: give the label up (Server-Side Apply without it), and
    /// remove it outright if another manager keeps it.
    async fn remove_stack_label(&self, node: &str) -> Result<Outcome, EdgeError> {
        self.apply_node(
            node,
            |owned| {
                owned.labels.remove(GPU_STACK_LABEL);
            },
            |n| !n.labels().contains_key(GPU_STACK_LABEL),
        )
        .await?;
        self.edit_node_labels(node, |labels| {
            labels.remove(GPU_STACK_LABEL);
        })
        .await
    }

    /// Read-decide-write of a node's labels: `edit` gets the labels as they
    /// are; the difference is written as a merge patch guarded by the read
    /// resourceVersion. Nothing is written when nothing changes.
    async fn edit_node_labels(
        &self,
        node: &str,
        edit: impl Fn(&mut BTreeMap<String, String>),
    ) -> Result<Outcome, EdgeError> {
        let nodes = self.nodes();
        let current = self.read_node(node).await?;
        let before = current.labels().clone();
        let mut after = before.clone();
        edit(&mut after);
        if after == before {
            return Ok(Outcome::default());
        }
        let patch = json!({"metadata": {
            "resourceVersion": current.resource_version(),
            "labels": label_diff(&before, &after),
        }});
        self.merge_patch(&nodes, node, &patch, format!("label node {node}"))
            .await
    }

    /// A rollback: the node's labels become `labels` (the preparation labels
    /// stay as node preparation left them) and its taints `taints`.
    async fn restore_node(
        &self,
        node: &str,
        labels: &BTreeMap<String, String>,
        taints: &[Taint],
    ) -> Result<Outcome, EdgeError> {
        let nodes = self.nodes();
        let current = self.read_node(node).await?;
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
        self.merge_patch(&nodes, node, &patch, format!("restore node {node}"))
            .await
    }

    /// A merge patch as this service (guarded when it carries a resourceVersion).
    async fn merge_patch<K>(
        &self,
        api: &Api<K>,
        name: &str,
        patch: &serde_json::Value,
        what: String,
    ) -> Result<Outcome, EdgeError>
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        api.patch(name, &self.merge_params(), &Patch::Merge(patch))
            .await
            .map_err(EdgeError::api(what))?;
        Ok(Outcome::default())
    }

    fn merge_params(&self) -> PatchParams {
        PatchParams {
            field_manager: Some(self.manager.clone()),
            ..PatchParams::default()
        }
    }

    /// Evicts every pod of the node but DaemonSet and mirror pods, through the
    /// Eviction API; reports the pods it refused (a PodDisruptionBudget) with
    /// the budgets that cover them.
    async fn drain(&self, node: &str) -> Result<Outcome, EdgeError> {
        let pods: Api<Pod> = Api::all(self.client.clone());
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
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
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

    async fn budgets_covering(&self, pod: &Pod) -> Result<Vec<String>, EdgeError> {
        let namespace = pod.namespace().unwrap_or_default();
        let pdbs: Api<PodDisruptionBudget> = Api::namespaced(self.client.clone(), &namespace);
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

    /// Read-decide-write of a workload's pod template: the changed containers
    /// and nodeSelector as a merge patch guarded by the read resourceVersion,
    /// so a concurrent change is a conflict, not lost.
    async fn edit_template(
        &self,
        workload: &WorkloadRef,
        edit: impl Fn(&mut PodSpec),
    ) -> Result<Outcome, EdgeError> {
        let what = format!("{} {}/{}", workload.kind, workload.namespace, workload.name);
        let (ns, name) = (workload.namespace.as_str(), workload.name.as_str());
        match workload.kind.as_str() {
            "Deployment" => {
                let api: Api<Deployment> = Api::namespaced(self.client.clone(), ns);
                self.patch_template(&api, name, &what, edit, |d| {
                    d.spec.as_ref().and_then(|s| s.template.spec.clone())
                })
                .await?;
            }
            "StatefulSet" => {
                let api: Api<StatefulSet> = Api::namespaced(self.client.clone(), ns);
                self.patch_template(&api, name, &what, edit, |d| {
                    d.spec.as_ref().and_then(|s| s.template.spec.clone())
                })
                .await?;
            }
            other => {
                return Err(EdgeError::Invalid(format!(
                    "{what}: workload kind {other:?} is not supported, expected Deployment or StatefulSet"
                )));
            }
        }
        Ok(Outcome::default())
    }

    async fn patch_template<K>(
        &self,
        api: &Api<K>,
        name: &str,
        what: &str,
        edit: impl Fn(&mut PodSpec),
        template: impl Fn(&K) -> Option<PodSpec>,
    ) -> Result<(), EdgeError>
    where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        let object = api
            .get(name)
            .await
            .map_err(EdgeError::api(format!("read {what}")))?;
        let before = template(&object)
            .ok_or_else(|| EdgeError::Invalid(format!("{what}: spec.template.spec is missing")))?;
        let mut after = before.clone();
        edit(&mut after);
        if after == before {
            return Ok(());
        }
        let selector = label_diff(
            &before.node_selector.unwrap_or_default(),
            &after.node_selector.unwrap_or_default(),
        );
        let patch = json!({
            "metadata": {"resourceVersion": object.resource_version()},
            "spec": {"template": {"spec": {"containers": after.containers, "nodeSelector": selector}}},
        });
        self.merge_patch(api, name, &patch, format!("write {what}"))
            .await
            .map(drop)
    }

    async fn restart(&self, workload: &WorkloadRef, at: &str) -> Result<Outcome, EdgeError> {
        let patch = json!({"spec": {"template": {"metadata": {"annotations": {RESTARTED_AT_ANNOTATION: at}}}}});
        let what = format!(
            "restart {} {}/{}",
            workload.kind, workload.namespace, workload.name
        );
        let params = self.merge_params();
        match workload.kind.as_str() {
            "Deployment" => Api::<Deployment>::namespaced(self.client.clone(), &workload.namespace)
                .patch(&workload.name, &params, &Patch::Merge(&patch))
                .await
                .map(drop),
            "StatefulSet" => Api::<StatefulSet>::namespaced(self.client.clone(), &workload.namespace)
                .patch(&workload.name, &params, &Patch::Merge(&patch))
                .await
                .map(drop),
            other => {
                return Err(EdgeError::Invalid(format!(
                    "{what}: workload kind {other:?} is not supported, expected Deployment or StatefulSet"
                )));
            }
        }
        .map_err(EdgeError::api(what))?;
        Ok(Outcome::default())
    }

    async fn remove_spec_gpu(&self, group: &str) -> Result<Outcome, EdgeError> {
        let api: Api<NodeGroup> = Api::all(self.client.clone());
        let current = api
            .get(group)
            .await
            .map_err(EdgeError::api(format!("read NodeGroup {group}")))?;
        if current.spec.gpu.is_none() {
            return Ok(Outcome::default());
        }
        let patch = json!({
            "metadata": {"resourceVersion": current.resource_version()},
            "spec": {"gpu": null},
        });
        self.merge_patch(
            &api,
            group,
            &patch,
            format!("remove spec.gpu of NodeGroup {group}"),
        )
        .await
    }

    async fn set_quota(
        &self,
        namespace: &str,
        name: &str,
        hard: &BTreeMap<String, String>,
    ) -> Result<Outcome, EdgeError> {
        let api: Api<ResourceQuota> = Api::namespaced(self.client.clone(), namespace);
        let what = format!("ResourceQuota {namespace}/{name}");
        let quota = api
            .get(name)
            .await
            .map_err(EdgeError::api(format!("read {what}")))?;
        let have: BTreeMap<String, String> = quota
            .spec
            .as_ref()
            .and_then(|s| s.hard.as_ref())
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.0.clone()))
            .collect();
        if have == *hard {
            return Ok(Outcome::default());
        }
        let patch = json!({
            "metadata": {"resourceVersion": quota.resource_version()},
            "spec": {"hard": label_diff(&have, hard)},
        });
        self.merge_patch(&api, name, &patch, format!("write {what}"))
            .await
    }

    /// The class's namespace restriction: a ValidatingAdmissionPolicy, bound
    /// to every namespace but the allowed ones, that refuses ResourceClaims,
    /// ResourceClaimTemplates and pods using the class's DeviceClasses or
    /// extended resources. No restriction: the policy and binding are removed.
    async fn restrict_namespaces(
        &self,
        gpu_class: &str,
        variants: &[switchyard_proto::v1::CompiledVariant],
        namespaces: &[String],
    ) -> Result<(), EdgeError> {
        use k8s_openapi::api::admissionregistration::v1::{
            ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
        };
        let name = format!("switchyard-gpuclass-{gpu_class}");
        let policies: Api<ValidatingAdmissionPolicy> = Api::all(self.client.clone());
        let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(self.client.clone());
        if namespaces.is_empty() {
            for result in [
                bindings.delete(&name, &Default::default()).await.map(drop),
                policies.delete(&name, &Default::default()).await.map(drop),
            ] {
                match result {
                    Ok(()) => {}
                    Err(kube::Error::Api(status)) if status.code == 404 => {}
                    Err(err) => {
                        return Err(EdgeError::api(format!(
                            "remove the restriction of GPUClass {gpu_class}"
                        ))(err));
                    }
                }
            }
            return Ok(());
        }
        let list = |items: Vec<&str>| {
            format!(
                "[{}]",
                items
                    .iter()
                    .map(|s| format!("{s:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        let classes = list(variants.iter().map(|v| v.device_class.as_str()).collect());
        let resources = list(
            variants
                .iter()
                .map(|v| v.extended_resource_name.as_str())
                .collect(),
        );
        let requests = |devices: &str| {
            format!(
                "!has({devices}) || !has({devices}.requests) || {devices}.requests.all(r,                  (!has(r.exactly) || !(r.exactly.deviceClassName in {classes})) &&                  (!has(r.firstAvailable) || r.firstAvailable.all(s, !(s.deviceClassName in {classes}))))"
            )
        };
        let containers = |field: &str| {
            format!(
                "!has(object.spec.{field}) || object.spec.{field}.all(c, !has(c.resources) ||                  {resources}.all(x, (!has(c.resources.limits) || !(x in c.resources.limits)) &&                  (!has(c.resources.requests) || !(x in c.resources.requests))))"
            )
        };
        let message = format!(
            "GPU class {gpu_class} may only be used in the namespaces {}",
            namespaces.join(", ")
        );
        let policy = json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": name, "labels": {"gpu.deckhouse.io/class": gpu_class}},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [
                    {"apiGroups": ["resource.k8s.io"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"],
                     "resources": ["resourceclaims", "resourceclaimtemplates"]},
                    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]},
                ]},
                "validations": [
                    {"expression": format!("request.resource.resource != 'resourceclaims' || {}", requests("object.spec.devices")), "message": message},
                    {"expression": format!("request.resource.resource != 'resourceclaimtemplates' || {}", requests("object.spec.spec.devices")), "message": message},
                    {"expression": format!("request.resource.resource != 'pods' || (({}) && ({}))", containers("containers"), containers("initContainers")), "message": message},
                ],
            },
        });
        let binding = json!({
            "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": name, "labels": {"gpu.deckhouse.io/class": gpu_class}},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {"namespaceSelector": {"matchExpressions": [
                    {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": namespaces},
                ]}},
            },
        });
        let params = PatchParams::apply(&self.manager);
        policies
            .patch(&name, &params, &Patch::Apply(&policy))
            .await
            .map_err(EdgeError::api(format!(
                "apply ValidatingAdmissionPolicy {name}"
            )))?;
        bindings
            .patch(&name, &params, &Patch::Apply(&binding))
            .await
            .map_err(EdgeError::api(format!(
                "apply ValidatingAdmissionPolicyBinding {name}"
            )))?;
        Ok(())
    }

    /// A deleted class's DeviceClasses and namespace restriction go.
    async fn retire_device_classes(
        &self,
        gpu_class: &str,
        device_classes: &[String],
    ) -> Result<Outcome, EdgeError> {
        let classes: Api<DeviceClass> = Api::all(self.client.clone());
        for name in device_classes {
            match classes.delete(name, &Default::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(err) => return Err(EdgeError::api(format!("delete DeviceClass {name}"))(err)),
            }
        }
        self.restrict_namespaces(gpu_class, &[], &[]).await?;
        Ok(Outcome::default())
    }

    /// The GPU class's DeviceClasses (Server-Side Apply, owned by this
    /// service) and its status.
    async fn publish_device_classes(
        &self,
        gpu_class: &str,
        variants: &[switchyard_proto::v1::CompiledVariant],
        refused: Option<&str>,
    ) -> Result<Outcome, EdgeError> {
        let classes: Api<DeviceClass> = Api::all(self.client.clone());
        let params = PatchParams::apply(&self.manager);
        let gpu_classes: Api<GPUClass> = Api::all(self.client.clone());
        let current = gpu_classes
            .get(gpu_class)
            .await
            .map_err(EdgeError::api(format!("read GPUClass {gpu_class}")))?;
        // A refused spec changes no DeviceClass: only the condition says why.
        for v in variants.iter().filter(|_| refused.is_none()) {
            let object = json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                "metadata": {"name": v.device_class, "labels": {"gpu.deckhouse.io/class": gpu_class}},
                "spec": {
                    "selectors": [{"cel": {"expression": v.cel_selector}}],
                    "extendedResourceName": v.extended_resource_name,
                },
            });
            classes
                .patch(&v.device_class, &params, &Patch::Apply(&object))
                .await
                .map_err(EdgeError::api(format!(
                    "apply DeviceClass {}",
                    v.device_class
                )))?;
        }
        let (ready, reason, message) = match refused {
            Some(why) => ("False", "InvalidSpec", why.to_string()),
            None => (
                "True",
                "Compiled",
                format!("compiled into {} DeviceClasses", variants.len()),
            ),
        };
        // The transition time moves only when the condition's status does.
        let since = current
            .status
            .as_ref()
            .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"))
            .filter(|c| c.status == ready)
            .map(|c| serde_json::to_value(&c.last_transition_time).unwrap_or_default())
            .unwrap_or_else(|| {
                json!(humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string())
            });
        let status = json!({
            "apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "GPUClass",
            "metadata": {"name": gpu_class},
            "status": {
                "deviceClassNames": variants.iter().map(|v| v.device_class.clone()).collect::<Vec<_>>(),
                "variants": variants.iter().map(|v| json!({
                    "name": v.variant,
                    "deviceClass": v.device_class,
                    "extendedResourceName": v.extended_resource_name,
                })).collect::<Vec<_>>(),
                "conditions": [{
                    "type": "Ready",
                    "status": ready,
                    "reason": reason,
                    "message": message,
                    "lastTransitionTime": since,
                    "observedGeneration": current.metadata.generation.unwrap_or(0),
                }],
            },
        });
        gpu_classes
            .patch_status(gpu_class, &params, &Patch::Apply(&status))
            .await
            .map_err(EdgeError::api(format!(
                "apply the status of GPUClass {gpu_class}"
            )))?;
        Ok(Outcome::default())
    }
}

/// The node fields a manager owns through Server-Side Apply, with their
/// current values: the labels and `spec.unschedulable`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Owned {
    pub labels: BTreeMap<String, String>,
    pub unschedulable: Option<bool>,
}

impl Owned {
    /// What `manager` owns of `node` by its applies (managedFields, operation Apply).
    pub fn of(node: &Node, manager: &str) -> Owned {
        let mut owned = Owned::default();
        let entries = node.metadata.managed_fields.iter().flatten();
        for entry in entries.filter(|e| {
            e.manager.as_deref() == Some(manager) && e.operation.as_deref() == Some("Apply")
        }) {
            let Some(fields) = entry.fields_v1.as_ref().map(|f| &f.0) else {
                continue;
            };
            if let Some(labels) = fields
                .get("f:metadata")
                .and_then(|m| m.get("f:labels"))
                .and_then(Value::as_object)
            {
                for key in labels.keys().filter_map(|k| k.strip_prefix("f:")) {
                    if let Some(value) = node.labels().get(key) {
                        owned.labels.insert(key.to_string(), value.clone());
                    }
                }
            }
            if fields
                .get("f:spec")
                .and_then(|s| s.get("f:unschedulable"))
                .is_some()
            {
                owned.unschedulable = Some(
                    node.spec
                        .as_ref()
                        .and_then(|s| s.unschedulable)
                        .unwrap_or(false),
                );
            }
        }
        owned
    }

    fn apply_config(&self, node: &str) -> Value {
        let mut config = json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node, "labels": self.labels},
        });
        if let Some(on) = self.unschedulable {
            config["spec"] = json!({"unschedulable": on});
        }
        config
    }
}

/// A merge-patch `labels` object turning `before` into `after`.
fn label_diff(before: &BTreeMap<String, String>, after: &BTreeMap<String, String>) -> Value {
    let mut diff = serde_json::Map::new();
    for key in before.keys().filter(|k| !after.contains_key(*k)) {
        diff.insert(key.clone(), Value::Null);
    }
    for (key, value) in after.iter().filter(|(k, v)| before.get(*k) != Some(v)) {
        diff.insert(key.clone(), json!(value));
    }
    Value::Object(diff)
}

fn set_placement(spec: &mut PodSpec, placement: &WorkloadPlacement) {
    let to_map = |list: Option<&switchyard_proto::v1::ResourceList>| {
        let map: BTreeMap<String, Quantity> = list
            .into_iter()
            .flat_map(|l| l.quantities.iter())
            .map(|(k, v)| (k.clone(), Quantity(v.clone())))
            .collect();
        (!map.is_empty()).then_some(map)
    };
    for container in &mut spec.containers {
        let resources = container.resources.get_or_insert_with(Default::default);
        resources.limits = to_map(placement.container_limits.get(&container.name));
        resources.requests = to_map(placement.container_requests.get(&container.name));
    }
    spec.node_selector =
        (!placement.node_selector.is_empty()).then(|| placement.node_selector.clone());
}

/// Whether a label selector selects `labels` (matchLabels and matchExpressions).
pub fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let by_labels = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let by_expressions = selector.match_expressions.iter().flatten().all(|e| {
        let values = e.values.as_deref().unwrap_or_default();
        match e.operator.as_str() {
            "In" => labels.get(&e.key).is_some_and(|v| values.contains(v)),
            "NotIn" => labels.get(&e.key).is_none_or(|v| !values.contains(v)),
            "Exists" => labels.contains_key(&e.key),
            "DoesNotExist" => !labels.contains_key(&e.key),
            _ => false,
        }
    });
    by_labels && by_expressions
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    #[test]
    fn a_label_diff_nulls_what_goes_and_sets_what_changes() {
        let before = BTreeMap::from([
            ("a".to_string(), "1".to_string()),
            ("b".to_string(), "2".to_string()),
        ]);
        let after = BTreeMap::from([
            ("b".to_string(), "3".to_string()),
            ("c".to_string(), "4".to_string()),
        ]);
        assert_eq!(
            label_diff(&before, &after),
            json!({"a": null, "b": "3", "c": "4"})
        );
        assert_eq!(label_diff(&before, &before), json!({}));
    }

    #[test]
    fn selectors_match_labels_and_expressions() {
        let labels = BTreeMap::from([("app".to_string(), "train".to_string())]);
        let mut selector = LabelSelector {
            match_labels: Some(labels.clone()),
            ..LabelSelector::default()
        };
        assert!(selects(&selector, &labels));
        selector.match_expressions = Some(vec![LabelSelectorRequirement {
            key: "tier".into(),
            operator: "Exists".into(),
            values: None,
        }]);
        assert!(!selects(&selector, &labels));
        assert!(!selects(
            &LabelSelector {
                match_labels: Some(BTreeMap::from([("app".to_string(), "x".to_string())])),
                ..LabelSelector::default()
            },
            &labels
        ));
    }
}

//! The claim-allocator's writers: a moved workload's pod template
//! (read-decide-write of its containers' resources and node selector) and
//! its restart, and completion's quotas, leftover labels and the source
//! group's `spec.gpu`.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::CronJob;
use k8s_openapi::api::core::v1::{PodSpec, ResourceQuota};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::ResourceExt;
use kube::api::{Api, Patch};
use serde_json::json;
use switchyard_api::NodeGroup;
use switchyard_core::ServiceName;
use switchyard_core::effects::{Effect, Outcome};
use switchyard_core::names::GROUP_LABEL;
use switchyard_kube::write::{Edge, EdgeError, Writer, Writes, label_diff, not_owned};
use switchyard_proto::v1::{WorkloadPlacement, WorkloadRef};

use crate::SERVICE;

/// The kinds a move edits in place (a Job's template is immutable).
pub const MOVED_KINDS: [&str; 4] = ["Deployment", "StatefulSet", "DaemonSet", "CronJob"];

/// Where a kind keeps its pod template.
pub fn template_path(kind: &str) -> &'static str {
    match kind {
        "CronJob" => "spec.jobTemplate.spec.template",
        _ => "spec.template",
    }
}

/// A merge patch setting the pod template's spec of a `kind`.
pub fn template_patch(kind: &str, pod_spec: serde_json::Value) -> serde_json::Value {
    match kind {
        "CronJob" => json!({"spec": {"jobTemplate": {"spec": {"template": {"spec": pod_spec}}}}}),
        _ => json!({"spec": {"template": {"spec": pod_spec}}}),
    }
}

pub use switchyard_core::names::RESTARTED_AT_ANNOTATION;

/// The claim-allocator's writers (field manager `switchyard-claim-allocator`), as the
/// runtime's executor.
pub type ClaimAllocatorEdge = Edge<ClaimAllocatorWrites>;

/// How the claim-allocator writes each effect it owns.
#[derive(Clone)]
pub struct ClaimAllocatorWrites {
    writer: Writer,
}

impl Writes for ClaimAllocatorWrites {
    const SERVICE: ServiceName = SERVICE;

    fn new(writer: Writer) -> Self {
        ClaimAllocatorWrites { writer }
    }

    fn writer(&self) -> &Writer {
        &self.writer
    }

    async fn write(&self, effect: &Effect) -> Result<Outcome, EdgeError> {
        match effect {
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
            Effect::RemoveNodeLabels {
                node,
                labels,
                group,
            } => {
                // Guarded by the resourceVersion read: a node that left
                // `group` meanwhile (a rollback's restore) keeps its labels.
                self.writer
                    .edit_node_labels(node, |current| {
                        if current.get(GROUP_LABEL).map_or("", String::as_str) != group {
                            tracing::info!(node, group, now = ?current.get(GROUP_LABEL), "the node left the group its leftover labels were to be cleared in: left as it is");
                            return Ok(());
                        }
                        for label in labels {
                            current.remove(label);
                        }
                        Ok(())
                    })
                    .await
            }
            other => not_owned::<Self>(other),
        }
    }
}

impl ClaimAllocatorWrites {
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
        let client = || self.writer.client();
        match workload.kind.as_str() {
            "Deployment" => {
                let api: Api<Deployment> = Api::namespaced(client(), ns);
                self.patch_template(&api, name, &what, edit, |d| {
                    d.spec.as_ref().and_then(|s| s.template.spec.clone())
                })
                .await?;
            }
            "StatefulSet" => {
                let api: Api<StatefulSet> = Api::namespaced(client(), ns);
                self.patch_template(&api, name, &what, edit, |s| {
                    s.spec.as_ref().and_then(|s| s.template.spec.clone())
                })
                .await?;
            }
            "DaemonSet" => {
                let api: Api<DaemonSet> = Api::namespaced(client(), ns);
                self.patch_template(&api, name, &what, edit, |d| {
                    d.spec.as_ref().and_then(|s| s.template.spec.clone())
                })
                .await?;
            }
            "CronJob" => {
                let api: Api<CronJob> = Api::namespaced(client(), ns);
                self.patch_template(&api, name, &what, edit, |c| {
                    c.spec
                        .job_template
                        .spec
                        .as_ref()
                        .and_then(|s| s.template.spec.clone())
                })
                .await?;
            }
            other => {
                return Err(EdgeError::Invalid(format!(
                    "{what}: workload kind {other:?} is not supported, expected {}",
                    MOVED_KINDS.join(", ")
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
        K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    {
        let object = api
            .get(name)
            .await
            .map_err(EdgeError::api(format!("read {what}")))?;
        let kind = K::kind(&());
        let before = template(&object).ok_or_else(|| {
            EdgeError::Invalid(format!("{what}: {}.spec is missing", template_path(&kind)))
        })?;
        let Some(pod_spec) = spec_patch(&before, edit) else {
            return Ok(());
        };
        let mut patch = template_patch(&kind, pod_spec);
        patch["metadata"] = json!({"resourceVersion": object.resource_version()});
        self.writer
            .merge_patch(api, name, &patch, format!("write {what}"))
            .await
            .map(drop)
    }

    async fn restart(&self, workload: &WorkloadRef, at: &str) -> Result<Outcome, EdgeError> {
        let patch = json!({"spec": {"template": {"metadata": {"annotations": {RESTARTED_AT_ANNOTATION: at}}}}});
        let what = format!(
            "restart {} {}/{}",
            workload.kind, workload.namespace, workload.name
        );
        let params = self.writer.merge_params();
        let (client, ns) = (self.writer.client(), workload.namespace.as_str());
        match workload.kind.as_str() {
            "Deployment" => Api::<Deployment>::namespaced(client, ns)
                .patch(&workload.name, &params, &Patch::Merge(&patch))
                .await
                .map(drop),
            "StatefulSet" => Api::<StatefulSet>::namespaced(client, ns)
                .patch(&workload.name, &params, &Patch::Merge(&patch))
                .await
                .map(drop),
            "DaemonSet" => Api::<DaemonSet>::namespaced(client, ns)
                .patch(&workload.name, &params, &Patch::Merge(&patch))
                .await
                .map(drop),
            other => {
                return Err(EdgeError::Invalid(format!(
                    "{what}: workload kind {other:?} is not restarted (a CronJob's next run \
                     takes the new template), expected Deployment, StatefulSet or DaemonSet"
                )));
            }
        }
        .map_err(EdgeError::api(what))?;
        Ok(Outcome::default())
    }

    async fn remove_spec_gpu(&self, group: &str) -> Result<Outcome, EdgeError> {
        let api: Api<NodeGroup> = Api::all(self.writer.client());
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
        self.writer
            .merge_patch(
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
        let api: Api<ResourceQuota> = Api::namespaced(self.writer.client(), namespace);
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
        self.writer
            .merge_patch(&api, name, &patch, format!("write {what}"))
            .await
    }
}

/// The merge patch of a pod spec that `edit` makes: its containers (a list
/// is replaced whole) and the node selector's changed keys; `None` when the
/// edit changes nothing.
pub fn spec_patch(before: &PodSpec, edit: impl Fn(&mut PodSpec)) -> Option<serde_json::Value> {
    let mut after = before.clone();
    edit(&mut after);
    if after == *before {
        return None;
    }
    let selector = label_diff(
        &before.node_selector.clone().unwrap_or_default(),
        &after.node_selector.clone().unwrap_or_default(),
    );
    let mut patch = json!({"containers": after.containers, "nodeSelector": selector});
    // A list: replaced whole, and only when the edit changed it.
    if after.tolerations != before.tolerations {
        patch["tolerations"] = json!(after.tolerations);
    }
    Some(patch)
}

/// Writes `placement` into a pod spec: each container's limits and requests,
/// and the node selector; nothing else.
pub fn set_placement(spec: &mut PodSpec, placement: &WorkloadPlacement) {
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
    // Tolerations not recorded (an old record): left as they are.
    if let Some(tolerations) = &placement.tolerations {
        spec.tolerations = (!tolerations.items.is_empty()).then(|| {
            tolerations
                .items
                .iter()
                .map(|t| {
                    let text = |s: &str| (!s.is_empty()).then(|| s.to_string());
                    k8s_openapi::api::core::v1::Toleration {
                        key: text(&t.key),
                        operator: text(&t.operator),
                        value: text(&t.value),
                        effect: text(&t.effect),
                        toleration_seconds: t.toleration_seconds,
                    }
                })
                .collect()
        });
    }
}

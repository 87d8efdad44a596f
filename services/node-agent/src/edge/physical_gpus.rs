//! The node's PhysicalGPU reports, written by Server-Side Apply under the
//! agent's field manager.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::{Resource, ResourceExt};
use switchyard_gpu::publish;

/// Why the node's PhysicalGPUs could not be reported (logged; the agent
/// serves without them).
#[derive(Debug, thiserror::Error)]
pub(super) enum ReportError {
    #[error("encode PhysicalGPU {name}: {source}")]
    Encode {
        name: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("apply PhysicalGPU {name}: {source}")]
    Apply {
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("apply the status of PhysicalGPU {name}: {source}")]
    ApplyStatus {
        name: String,
        #[source]
        source: kube::Error,
    },
}

/// Applies the node's PhysicalGPU reports (spec and labels, then status) by
/// Server-Side Apply under the agent's field manager; returns references to
/// them (with their UIDs, for events), keyed by card UUID.
pub(super) async fn report(
    client: &kube::Client,
    node: &str,
    machine: &switchyard_gpu::Machine,
) -> Result<BTreeMap<String, ObjectReference>, ReportError> {
    let api: kube::Api<switchyard_api::PhysicalGPU> = kube::Api::all(client.clone());
    let params = kube::api::PatchParams::apply(super::FIELD_MANAGER).force();
    let mut reported = BTreeMap::new();
    for gpu in publish::physical_gpus(node, machine) {
        let name = gpu.name_any();
        let mut object = serde_json::to_value(&gpu).map_err(|source| ReportError::Encode {
            name: name.clone(),
            source,
        })?;
        object["apiVersion"] = "gpu.deckhouse.io/v1alpha1".into();
        object["kind"] = "PhysicalGPU".into();
        let status = object.as_object_mut().and_then(|o| o.remove("status"));
        let applied = api
            .patch(&name, &params, &kube::api::Patch::Apply(&object))
            .await
            .map_err(|source| ReportError::Apply {
                name: name.clone(),
                source,
            })?;
        if let Some(status) = status {
            let patch = serde_json::json!({"apiVersion": "gpu.deckhouse.io/v1alpha1", "kind": "PhysicalGPU", "status": status});
            api.patch_status(&name, &params, &kube::api::Patch::Apply(&patch))
                .await
                .map_err(|source| ReportError::ApplyStatus {
                    name: name.clone(),
                    source,
                })?;
        }
        reported.insert(gpu.spec.uuid.clone(), applied.object_ref(&()));
    }
    Ok(reported)
}

//! Kubernetes API types of Switchyard.
//!
//! `GPUClass` and `PhysicalGPU` (`gpu.deckhouse.io/v1alpha1`, cluster-scoped)
//! are Switchyard's own. `NodeGroup` (`deckhouse.io/v1`) and `ModuleConfig`
//! (`deckhouse.io/v1alpha1`) are Deckhouse's: the subsets here are what
//! Switchyard reads, installed only in clusters without Deckhouse. The
//! structural schemas carry the validation, so the API server rejects bad
//! objects with a message that names the field.

#![forbid(unsafe_code)]

pub mod rbac;

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Which cards a class offers and on what terms (reference, "Step 2").
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[kube(
    group = "gpu.deckhouse.io",
    version = "v1alpha1",
    kind = "GPUClass",
    plural = "gpuclasses",
    status = "GPUClassStatus",
    printcolumn = r#"{"name":"DeviceClasses","type":"string","jsonPath":".status.deviceClassNames"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct GPUClassSpec {
    /// PhysicalGPUs the class offers, by their labels, e.g.
    /// `gpu.deckhouse.io/device: a100-sxm4-40gb`.
    pub selector: LabelSelector,
    /// Allocation variants besides the whole card.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitions: Option<Partitions>,
    /// Sharing of a whole card between consumers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sharing: Option<Sharing>,
    /// Also publish the whole card as `nvidia.com/gpu`, so that manifests
    /// not yet moved to the class's resource are served by DRA (at most one
    /// class in the cluster may do this).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub legacy_bridge: Option<bool>,
    /// Only these namespaces may use the class (empty: all). Enforced by a
    /// ValidatingAdmissionPolicy the class-compiler writes: tenants request
    /// the class by name and never write CEL.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(regex(pattern = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")))]
    pub namespaces: Vec<String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Partitions {
    /// Offer the whole card (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub whole: Option<bool>,
    /// MIG profiles offered, e.g. `1g.5gb`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(inner(regex(pattern = r"^[1-7]g\.[0-9]+gb(\+me)?$")))]
    pub mig_profiles: Vec<String>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Sharing {
    /// Consumers per card with time-slicing.
    #[schemars(range(min = 2, max = 64))]
    pub time_slicing_replicas: u32,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GPUClassStatus {
    /// The DeviceClasses compiled from the class, one per variant.
    #[serde(default)]
    pub device_class_names: Vec<String>,
    #[serde(default)]
    pub variants: Vec<Variant>,
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Variant {
    /// `whole`, a MIG profile, or `shared`.
    pub name: String,
    pub device_class: String,
    /// What applications request, e.g. `gpu.deckhouse.io/a100`.
    pub extended_resource_name: String,
}

/// One card in one node, as its node agent found it.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[kube(
    group = "gpu.deckhouse.io",
    version = "v1alpha1",
    kind = "PhysicalGPU",
    plural = "physicalgpus",
    status = "PhysicalGPUStatus",
    printcolumn = r#"{"name":"Node","type":"string","jsonPath":".spec.node"}"#,
    printcolumn = r#"{"name":"Product","type":"string","jsonPath":".spec.product"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct PhysicalGPUSpec {
    #[schemars(length(min = 1, max = 253))]
    pub node: String,
    /// The card's index (NVML minor number) on its node.
    pub index: u32,
    #[schemars(regex(pattern = r"^GPU-[0-9a-fA-F-]+$"))]
    pub uuid: String,
    /// e.g. `NVIDIA A100-SXM4-40GB`.
    pub product: String,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PhysicalGPUStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<GpuPhase>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<Capabilities>,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum GpuPhase {
    Pending,
    Ready,
    Failed,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Capabilities {
    /// e.g. `Ampere`.
    pub architecture: String,
    /// e.g. `CUDA`.
    #[serde(rename = "computeAPI")]
    pub compute_api: String,
    /// e.g. `8.0`.
    pub compute_capability: String,
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    /// `MIG`, `TimeSlicing`, ...
    #[serde(default)]
    pub partition_support: Vec<String>,
}

/// The part of a Deckhouse NodeGroup Switchyard reads.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[kube(
    group = "deckhouse.io",
    version = "v1",
    kind = "NodeGroup",
    plural = "nodegroups"
)]
#[serde(rename_all = "camelCase")]
pub struct NodeGroupSpec {
    pub node_type: NodeType,
    /// Present: the group's nodes are served by the device plugin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<NodeGroupGpu>,
    /// What every node of the group carries (labels, annotations, taints):
    /// Step 1 copies it from the source group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_template: Option<NodeTemplate>,
    /// The group's kubelet settings (`maxPods`, `containerLogMaxSize`, ...),
    /// kept as written: Switchyard only compares them between groups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form_object")]
    pub kubelet: Option<BTreeMap<String, serde_json::Value>>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeTemplate {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taints: Vec<NodeTemplateTaint>,
}

/// A taint of a group's node template (a Node taint without `timeAdded`).
#[derive(
    Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq, PartialOrd, Ord,
)]
#[serde(rename_all = "camelCase")]
pub struct NodeTemplateTaint {
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    pub effect: String,
}

/// An object whose fields the API server keeps as given.
fn free_form_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true
    })
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum NodeType {
    CloudEphemeral,
    CloudPermanent,
    CloudStatic,
    #[default]
    Static,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeGroupGpu {
    #[serde(default)]
    pub sharing: GpuSharing,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_slicing: Option<TimeSlicing>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<Mig>,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
pub enum GpuSharing {
    #[default]
    Exclusive,
    TimeSlicing,
    #[serde(rename = "MIG")]
    Mig,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TimeSlicing {
    #[schemars(range(min = 2, max = 64))]
    pub partition_count: u32,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Mig {
    /// A named partition layout, e.g. `all-1g.5gb`.
    pub parted_config: String,
}

/// The part of the gpu module's ModuleConfig Switchyard reads.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[kube(
    group = "deckhouse.io",
    version = "v1alpha1",
    kind = "ModuleConfig",
    plural = "moduleconfigs",
    status = "ModuleStatus"
)]
#[serde(rename_all = "camelCase")]
pub struct ModuleConfigSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings: Option<ModuleSettings>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ModuleSettings {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dra: Option<DraSettings>,
}

#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DraSettings {
    pub enabled: bool,
}

/// The gpu module's status, as Switchyard writes it: on the `gpu`
/// ModuleConfig where the chart installed that CRD, else on the
/// `GPUModuleStatus` named `gpu`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ModuleStatus {
    /// `KubernetesVersion`, one `FeatureGate<Name>` per gate the module
    /// needs, `DRAAPIServed`, `FeatureGatesReady` (all of those),
    /// `DRAEnabled`, and one per alert (`True` while it fires).
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// Per GPU node: its stack, and why DRA is or is not deployed on it
    /// (written whole each time, `[]` too, so a merge patch clears it).
    #[serde(default)]
    pub nodes: Vec<NodeStackStatus>,
}

/// Why a node is on its stack, and whether DRA is deployed there.
#[derive(Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct NodeStackStatus {
    pub name: String,
    /// Empty for a node in no group.
    #[serde(default)]
    pub node_group: String,
    /// `dra`, `device-plugin` or `none`.
    pub stack: String,
    /// Whether DRA is deployed: the node is on DRA and every readiness
    /// condition holds.
    pub dra_deployed: bool,
    /// Why, in a word: `dra_enabled`, `group_has_spec_gpu`, `held_on_dra`,
    /// `control_plane`, `gpu_disabled_label`, `no_spec_gpu_dra_disabled`,
    /// `feature_gates_not_ready`, `readiness_missing`, `undecided`; on the
    /// nvidia-operator backend `pool_stack`, `operator_default`,
    /// `no_gpu_present`.
    pub reason: String,
    /// The same in the reference's words, with what is missing.
    pub message: String,
}

/// Where Switchyard writes the gpu module's status in a cluster whose
/// ModuleConfig CRD is not its own (Deckhouse's): cluster-scoped, one
/// object named `gpu`, only a status.
#[derive(CustomResource, Clone, Debug, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[kube(
    group = "gpu.deckhouse.io",
    version = "v1alpha1",
    kind = "GPUModuleStatus",
    plural = "gpumodulestatuses",
    status = "ModuleStatus",
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"FeatureGatesReady\")].status"}"#
)]
pub struct GPUModuleStatusSpec {}

/// The annotation on a CRD that Switchyard's chart installed: the
/// ModuleConfig CRD carrying it is Switchyard's own, whose status it writes.
pub const INSTALLED_BY_ANNOTATION: &str = "gpu.deckhouse.io/installed-by";

/// Every CRD, with the file name it has in the Helm chart's `crds/`.
pub fn crds() -> Vec<(&'static str, CustomResourceDefinition)> {
    vec![
        ("gpuclasses.gpu.deckhouse.io.yaml", GPUClass::crd()),
        ("physicalgpus.gpu.deckhouse.io.yaml", PhysicalGPU::crd()),
        ("nodegroups.deckhouse.io.yaml", NodeGroup::crd()),
        ("moduleconfigs.deckhouse.io.yaml", ModuleConfig::crd()),
        (
            "gpumodulestatuses.gpu.deckhouse.io.yaml",
            GPUModuleStatus::crd(),
        ),
    ]
    .into_iter()
    .map(|(file, mut crd)| {
        crd.metadata
            .annotations
            .get_or_insert_default()
            .insert(INSTALLED_BY_ANNOTATION.into(), "switchyard".into());
        (file, with_kubernetes_formats(crd))
    })
    .collect()
}

/// The integer formats Kubernetes knows (`int32`, `int64`) in place of the
/// Rust types' (`uint32`, `uint64`, ...), which the API server stores but
/// warns about (`unrecognized format "uint32"`) on every apply. The
/// schemas' `minimum` keeps unsigned fields at 0 and above.
pub fn with_kubernetes_formats(crd: CustomResourceDefinition) -> CustomResourceDefinition {
    fn walk(value: &mut serde_json::Value) {
        match value {
            serde_json::Value::Object(map) => {
                if let Some(serde_json::Value::String(format)) = map.get_mut("format") {
                    let known = match format.as_str() {
                        "int8" | "int16" | "uint8" | "uint16" => Some("int32"),
                        "uint32" | "uint64" | "uint" | "int" => Some("int64"),
                        _ => None,
                    };
                    if let Some(known) = known {
                        *format = known.to_string();
                    }
                }
                map.values_mut().for_each(walk);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(walk),
            _ => {}
        }
    }
    let mut value = serde_json::to_value(&crd).expect("a CRD serializes");
    walk(&mut value);
    serde_json::from_value(value).expect("a CRD with other formats is a CRD")
}

/// A CRD as the chart stores it.
pub fn to_yaml(crd: &CustomResourceDefinition) -> String {
    format!(
        "# Generated by `switchyard crdgen` from the Rust types in libs/api; do not edit.\n{}",
        serde_yaml_ng::to_string(crd).expect("a CRD serializes")
    )
}

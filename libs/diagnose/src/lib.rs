//! The common-mistakes doctor: the reference's "Common mistakes" table, the
//! NVIDIA guide's troubleshooting list and Step 1's warning, diagnosed as pure
//! functions over a snapshot of the cluster's objects. The CLI
//! (`switchyard doctor`) fetches the snapshot; nothing here does I/O.
//!
//! Each [`Finding`] names its row (a stable kebab-case id), its severity, the
//! observation in the reference's words, the objects, the cause and a fix to
//! type.

mod access;
mod dra;
mod facts;
mod nvidia;
pub mod pod;
mod stack;
mod workloads;

use std::collections::BTreeSet;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;
use switchyard_api::{GPUClass, ModuleConfig, NodeGroup, PhysicalGPU};
use switchyard_core::backend::dispatch::strategy;
use switchyard_core::cluster::{self, Cluster};
use switchyard_core::events::{Stack, StackReason};
use switchyard_core::{names, stack_rules};

pub use access::ADMIN_ACCESS_LABEL;
pub use pod::{NodeFit, PodExplanation, explain_pod};

/// The name of the GPU module's ModuleConfig.
pub const MODULE_CONFIG: &str = "gpu";

/// What the doctor reads: the cluster's objects as the API server holds them.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub nodes: Vec<Node>,
    pub node_groups: Vec<NodeGroup>,
    /// The `gpu` ModuleConfig, if it exists.
    pub module_config: Option<ModuleConfig>,
    /// Whether the API server serves `resource.k8s.io/v1`; the stack rules
    /// take it as the DRA feature gates ready (the snapshot reads neither
    /// the API server's version nor its gates).
    pub dra_api_served: bool,
    pub physical_gpus: Vec<PhysicalGPU>,
    pub gpu_classes: Vec<GPUClass>,
    pub device_classes: Vec<DeviceClass>,
    pub slices: Vec<ResourceSlice>,
    pub claims: Vec<ResourceClaim>,
    pub claim_templates: Vec<ResourceClaimTemplate>,
    pub pods: Vec<Pod>,
    pub deployments: Vec<Deployment>,
    pub stateful_sets: Vec<StatefulSet>,
    pub namespaces: Vec<Namespace>,
    pub service_accounts: Vec<ServiceAccount>,
    pub cluster_roles: Vec<ClusterRole>,
    pub cluster_role_bindings: Vec<ClusterRoleBinding>,
    pub roles: Vec<Role>,
    pub role_bindings: Vec<RoleBinding>,
    pub admission_policies: Vec<ValidatingAdmissionPolicy>,
    pub admission_policy_bindings: Vec<ValidatingAdmissionPolicyBinding>,
    /// The GPU Operator's ClusterPolicies (`nvidia.com/v1`), as JSON; none
    /// where the operator is not installed.
    pub cluster_policies: Vec<serde_json::Value>,
    /// The GPU Operator's GPUClusters (`nvidia.com/v1alpha1`, its DRA
    /// mode), as JSON.
    pub gpu_clusters: Vec<serde_json::Value>,
    pub daemon_sets: Vec<DaemonSet>,
}

/// How much a finding asks of the operator: a warning is a mistake to fix
/// (`switchyard doctor` exits 1); information is for review.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Severity {
    Warning,
    Info,
}

/// A row of the tables the doctor checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Row {
    NoStackManagesNode,
    DraNotDeployed,
    HeldOnDra,
    PodStaysOnOldNodes,
    PodPending,
    NoResourceClaim,
    NoCardVisible,
    NoResourceSlices,
    ClaimSelectorMatchesNoDevice,
    DevicePluginOnDraNode,
    TargetGroupDiffers,
    AdminAccessOutsideAdminNamespace,
    AdminAccessNamespace,
    TenantWritesDraInventory,
    NodeAgentSlicesUnconfined,
    EvictionLabelMissing,
    KubeletPluginUnscoped,
    NvidiaBackendDetected,
    #[serde(rename = "gpucluster-present")]
    GpuClusterPresent,
    BridgeClasses,
    ValidatorOffNeeded,
    DraUninstallUnsafe,
}

impl Row {
    pub const ALL: [Row; 22] = [
        Row::NoStackManagesNode,
        Row::DraNotDeployed,
        Row::HeldOnDra,
        Row::PodStaysOnOldNodes,
        Row::PodPending,
        Row::NoResourceClaim,
        Row::NoCardVisible,
        Row::NoResourceSlices,
        Row::ClaimSelectorMatchesNoDevice,
        Row::DevicePluginOnDraNode,
        Row::TargetGroupDiffers,
        Row::AdminAccessOutsideAdminNamespace,
        Row::AdminAccessNamespace,
        Row::TenantWritesDraInventory,
        Row::NodeAgentSlicesUnconfined,
        Row::EvictionLabelMissing,
        Row::KubeletPluginUnscoped,
        Row::NvidiaBackendDetected,
        Row::GpuClusterPresent,
        Row::BridgeClasses,
        Row::ValidatorOffNeeded,
        Row::DraUninstallUnsafe,
    ];

    /// The stable id, as in JSON.
    pub fn id(self) -> &'static str {
        match self {
            Row::NoStackManagesNode => "no-stack-manages-node",
            Row::DraNotDeployed => "dra-not-deployed",
            Row::HeldOnDra => "held-on-dra",
            Row::PodStaysOnOldNodes => "pod-stays-on-old-nodes",
            Row::PodPending => "pod-pending",
            Row::NoResourceClaim => "no-resource-claim",
            Row::NoCardVisible => "no-card-visible",
            Row::NoResourceSlices => "no-resource-slices",
            Row::ClaimSelectorMatchesNoDevice => "claim-selector-matches-no-device",
            Row::DevicePluginOnDraNode => "device-plugin-on-dra-node",
            Row::TargetGroupDiffers => "target-group-differs",
            Row::AdminAccessOutsideAdminNamespace => "admin-access-outside-admin-namespace",
            Row::AdminAccessNamespace => "admin-access-namespace",
            Row::TenantWritesDraInventory => "tenant-writes-dra-inventory",
            Row::NodeAgentSlicesUnconfined => "node-agent-slices-unconfined",
            Row::EvictionLabelMissing => "eviction-label-missing",
            Row::KubeletPluginUnscoped => "kubelet-plugin-unscoped",
            Row::NvidiaBackendDetected => "nvidia-backend-detected",
            Row::GpuClusterPresent => "gpucluster-present",
            Row::BridgeClasses => "bridge-classes",
            Row::ValidatorOffNeeded => "validator-off-needed",
            Row::DraUninstallUnsafe => "dra-uninstall-unsafe",
        }
    }

    /// The observation, in the words of the reference it comes from.
    pub fn observation(self) -> &'static str {
        match self {
            Row::NoStackManagesNode => "No stack manages the node",
            Row::DraNotDeployed => "DRA is not deployed on the group's nodes",
            Row::HeldOnDra => "D8GpuNodeGroupHeldOnDra is firing",
            Row::PodStaysOnOldNodes => "The Pod stays on the old nodes",
            Row::PodPending => "The Pod is Pending",
            Row::NoResourceClaim => "No ResourceClaim was created",
            Row::NoCardVisible => "The Pod runs but the application sees no card",
            Row::NoResourceSlices => "DeviceClasses Exist but No ResourceSlices Appear",
            Row::ClaimSelectorMatchesNoDevice => "ResourceClaim Remains Pending",
            Row::DevicePluginOnDraNode => "Device Plugin Reappears on a DRA Node",
            Row::TargetGroupDiffers => {
                "The target group's taints, labels or kubelet settings differ from the source group's"
            }
            Row::AdminAccessOutsideAdminNamespace => {
                "A claim asks for DRA admin access outside an admin namespace"
            }
            Row::AdminAccessNamespace => "A namespace grants DRA admin access to every device",
            Row::TenantWritesDraInventory => "A tenant may write DeviceClasses or ResourceSlices",
            Row::NodeAgentSlicesUnconfined => {
                "The node agent may write every node's ResourceSlices"
            }
            Row::EvictionLabelMissing => {
                "The GPU Operator's driver manager does not evict the DRA kubelet plugin"
            }
            Row::KubeletPluginUnscoped => "The DRA kubelet plugin runs outside the DRA pool",
            Row::NvidiaBackendDetected => "The NVIDIA GPU Operator serves the GPUs",
            Row::GpuClusterPresent => "The GPU Operator's DRA mode (GPUCluster) is configured",
            Row::BridgeClasses => "More than one DeviceClass maps nvidia.com/gpu",
            Row::ValidatorOffNeeded => {
                "The operator validator is on where the device plugin is off"
            }
            Row::DraUninstallUnsafe => "DRA was uninstalled before the last DRA node was clear",
        }
    }

    pub fn severity(self) -> Severity {
        match self {
            Row::AdminAccessNamespace | Row::NvidiaBackendDetected => Severity::Info,
            _ => Severity::Warning,
        }
    }
}

/// One diagnosis.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub row: Row,
    pub severity: Severity,
    pub observation: &'static str,
    /// `Kind/name` or `Kind/namespace/name`.
    pub objects: Vec<String>,
    pub cause: String,
    /// A command to type.
    pub fix: String,
}

impl Finding {
    fn new(row: Row, objects: Vec<String>, cause: String, fix: String) -> Finding {
        Finding {
            row,
            severity: row.severity(),
            observation: row.observation(),
            objects,
            cause,
            fix,
        }
    }
}

/// Every finding in the snapshot, ordered by row, then by objects.
pub fn diagnose(s: &Snapshot) -> Vec<Finding> {
    let view = View::new(s);
    let mut out = Vec::new();
    out.extend(stack::no_stack(&view));
    out.extend(stack::dra_not_deployed(&view));
    out.extend(stack::held_on_dra(&view));
    out.extend(workloads::stays_on_old_nodes(&view));
    out.extend(dra::pod_pending(&view));
    out.extend(workloads::no_resource_claim(&view));
    out.extend(workloads::no_card_visible(&view));
    out.extend(dra::no_resource_slices(&view));
    out.extend(dra::claim_selector_matches_no_device(&view));
    out.extend(dra::device_plugin_on_dra_node(&view));
    out.extend(stack::target_group_differs(&view));
    out.extend(access::admin_access_outside_admin_namespace(&view));
    out.extend(access::admin_access_namespaces(&view));
    out.extend(access::tenant_writes_dra_inventory(&view));
    out.extend(access::node_agent_slices_unconfined(&view));
    out.extend(nvidia::eviction_label_missing(&view));
    out.extend(nvidia::kubelet_plugin_unscoped(&view));
    out.extend(nvidia::nvidia_backend_detected(&view));
    out.extend(nvidia::gpucluster_present(&view));
    out.extend(nvidia::bridge_classes(&view));
    out.extend(nvidia::validator_off_needed(&view));
    out.extend(nvidia::dra_uninstall_unsafe(&view));
    out.sort_by(|a, b| (a.row, &a.objects).cmp(&(b.row, &b.objects)));
    out
}

/// The snapshot with what several rows ask of it.
pub(crate) struct View<'a> {
    pub s: &'a Snapshot,
    /// The module is not switched off (`spec.enabled: false`).
    pub module_enabled: bool,
    /// Groups with spec.gpu.
    pub spec_gpu: BTreeSet<String>,
    /// The snapshot as the cores' facts ([`facts::cluster`]).
    pub facts: Cluster,
    /// Groups held on DRA by the upgrade hold, as far as the objects show:
    /// a group with spec.gpu a node of which DRA serves (`gpu-stack=dra`),
    /// where the backend holds upgrades and `dra.enabled` is on (turning it
    /// off releases every hold).
    pub held: BTreeSet<String>,
}

impl<'a> View<'a> {
    fn new(s: &'a Snapshot) -> View<'a> {
        let config = s.module_config.as_ref();
        let mut view = View {
            s,
            module_enabled: config.is_some_and(|c| c.spec.enabled != Some(false)),
            spec_gpu: s
                .node_groups
                .iter()
                .filter(|g| g.spec.gpu.is_some())
                .map(|g| name_of(&g.metadata).to_string())
                .collect(),
            facts: facts::cluster(s),
            held: BTreeSet::new(),
        };
        if view.facts.module.dra_enabled && strategy(&view.facts.backend).holds_upgrades() {
            view.held = view
                .spec_gpu
                .iter()
                .filter(|g| {
                    view.nodes_of(g).any(|n| {
                        label(&n.metadata, names::GPU_STACK_LABEL) == Some(names::STACK_DRA)
                    })
                })
                .cloned()
                .collect();
        }
        view
    }

    /// The node as the cores see it.
    pub fn fact(&self, node: &Node) -> Option<&cluster::Node> {
        self.facts.nodes.get(name_of(&node.metadata))
    }

    /// Which stack serves the node, and why: the core's stack rules on the
    /// facts, with its group's hold as [`View::held`] reads it. The hold
    /// reaches a node as the stack-assigner relabels it, so a node of a held
    /// group still labelled `gpu-stack=device-plugin` is read as the device
    /// plugin's (what the cluster shows now; it is the one to hand over).
    /// The rules assume the module runs; with it off no stack is deployed.
    pub fn stack_of(&self, node: &Node) -> Option<(Stack, StackReason)> {
        let fact = self.fact(node)?;
        let relabelled =
            label(&node.metadata, names::GPU_STACK_LABEL) != Some(names::STACK_DEVICE_PLUGIN);
        let held = relabelled && fact.group().is_some_and(|g| self.held.contains(g));
        Some(stack_rules::rule(fact, &self.facts, held))
    }

    /// The node's group (its `node.deckhouse.io/group` label).
    pub fn group_of(&self, node: &'a Node) -> Option<&'a str> {
        label(&node.metadata, names::GROUP_LABEL)
    }

    pub fn nodes_of<'b>(&'b self, group: &'b str) -> impl Iterator<Item = &'a Node> + 'b {
        self.s
            .nodes
            .iter()
            .filter(move |n| label(&n.metadata, names::GROUP_LABEL) == Some(group))
    }

    /// A GPU node: it has PhysicalGPUs, advertises `nvidia.com/gpu`, carries
    /// NFD's NVIDIA labels, publishes ResourceSlices or a gpu-stack label.
    pub fn is_gpu_node(&self, node: &Node) -> bool {
        let name = name_of(&node.metadata);
        self.s.physical_gpus.iter().any(|g| g.spec.node == name)
            || advertised_gpus(node) > 0
            || node.metadata.labels.iter().flatten().any(|(k, v)| {
                let nfd = matches!(
                    k.as_str(),
                    "nvidia.com/gpu.present" | "feature.node.kubernetes.io/pci-10de.present"
                );
                (nfd && v == "true") || k == names::GPU_STACK_LABEL
            })
            || !self.slices_on(name).is_empty()
    }

    pub fn slices_on(&self, node: &str) -> Vec<&'a ResourceSlice> {
        self.s
            .slices
            .iter()
            .filter(|s| s.spec.node_name.as_deref() == Some(node))
            .collect()
    }

    /// DeviceClasses publishing a class resource (`gpu.deckhouse.io/<class>`).
    pub fn class_resources(&self) -> BTreeSet<String> {
        self.s
            .device_classes
            .iter()
            .filter_map(|c| c.spec.extended_resource_name.clone())
            .filter(|r| r.starts_with(names::CLASS_RESOURCE_PREFIX))
            .collect()
    }
}

/// `nvidia.com/gpu` (and `nvidia.com/mig-*`) the node's device plugin advertises.
pub(crate) fn advertised_gpus(node: &Node) -> i64 {
    node.status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref().or(s.capacity.as_ref()))
        .into_iter()
        .flatten()
        .filter(|(k, _)| *k == names::NVIDIA_GPU || k.starts_with("nvidia.com/mig-"))
        .filter_map(|(_, q)| switchyard_dra::Quantity::parse(&q.0).ok()?.as_i64())
        .sum()
}

pub(crate) fn name_of(meta: &ObjectMeta) -> &str {
    meta.name.as_deref().unwrap_or_default()
}

pub(crate) fn namespace_of(meta: &ObjectMeta) -> &str {
    meta.namespace.as_deref().unwrap_or("default")
}

pub(crate) fn label<'m>(meta: &'m ObjectMeta, key: &str) -> Option<&'m str> {
    meta.labels.as_ref()?.get(key).map(String::as_str)
}

/// Quotes a word for a shell if it needs it.
pub(crate) fn sh(word: &str) -> String {
    if !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,@".contains(c))
    {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

//! Names from the reference documents, verbatim.

/// The node's group.
pub const GROUP_LABEL: &str = "node.deckhouse.io/group";
/// Which stack serves the node: `device-plugin` or `dra`.
pub const GPU_STACK_LABEL: &str = "node.deckhouse.io/gpu-stack";
/// Set once the node's GPU preparation finished.
pub const GPU_SETUP_COMPLETE_LABEL: &str = "node.deckhouse.io/gpu-setup-complete";
/// `false` keeps DRA off the node.
pub const GPU_ENABLED_LABEL: &str = "gpu.deckhouse.io/enabled";
/// The card model label of PhysicalGPU objects, e.g. `a100-sxm4-40gb`.
pub const GPU_DEVICE_LABEL: &str = "gpu.deckhouse.io/device";
/// Device-plugin configuration label, cleared on completion.
pub const DEVICE_GPU_CONFIG_LABEL: &str = "node.deckhouse.io/device-gpu.config";
/// Control-plane nodes carry this role label.
pub const CONTROL_PLANE_LABEL: &str = "node-role.kubernetes.io/control-plane";
/// Prefix of the per-group role label `node-role.kubernetes.io/<group>`.
pub const NODE_ROLE_PREFIX: &str = "node-role.kubernetes.io/";

/// Values of the gpu-stack label.
pub const STACK_DEVICE_PLUGIN: &str = "device-plugin";
pub const STACK_DRA: &str = "dra";

/// Fires for each group with spec.gpu held on DRA after the module upgrade.
pub const ALERT_HELD_ON_DRA: &str = "D8GpuNodeGroupHeldOnDra";
/// Label of the alert that names the group.
pub const ALERT_LABEL_NODE_GROUP: &str = "node_group";

/// Namespace of the GPU module's pods.
pub const MODULE_NAMESPACE: &str = "d8-nvidia-gpu";
/// `app` label of Deckhouse's gpu-node-agent pods.
pub const NODE_AGENT_APP: &str = "gpu-node-agent";
/// `app` label of Deckhouse's vendor adapter pods (the NVIDIA DRA kubelet plugin).
pub const VENDOR_ADAPTER_APP: &str = "nvidia-dra-adapter";
/// The node agent's pods as Switchyard's chart labels them
/// (deploy/helm/switchyard, `switchyard.selectorLabels` of the node-agent
/// DaemonSet): the default `--node-agent-selector`.
pub const NODE_AGENT_SELECTOR: &str =
    "app.kubernetes.io/name=switchyard,app.kubernetes.io/component=node-agent";
/// The default `--vendor-adapter-selector`: none, Switchyard's node agent is
/// the kubelet plugin of both stacks.
pub const VENDOR_ADAPTER_SELECTOR: &str = "";
/// The labels of the chart's node agent pods that [`NODE_AGENT_SELECTOR`] selects.
pub const NODE_AGENT_POD_LABELS: [(&str, &str); 2] = [
    ("app.kubernetes.io/name", "switchyard"),
    ("app.kubernetes.io/component", "node-agent"),
];
/// Prefix of the device plugin's MIG resources, e.g. `nvidia.com/mig-1g.5gb`.
pub const NVIDIA_MIG_PREFIX: &str = "nvidia.com/mig-";
/// The device plugin's time-slicing resource with `renameByDefault`.
pub const NVIDIA_GPU_SHARED: &str = "nvidia.com/gpu.shared";

/// The device-plugin resource name.
pub const NVIDIA_GPU: &str = "nvidia.com/gpu";
/// The W3C traceparent of the span that last set a node's `gpu-stack`
/// label: the node agent's switch continues that trace.
pub const TRACEPARENT_ANNOTATION: &str = "switchyard.io/traceparent";
/// The pod-template annotation `kubectl rollout restart` sets; a move's
/// restart sets it to the move's id.
pub const RESTARTED_AT_ANNOTATION: &str = "kubectl.kubernetes.io/restartedAt";
/// Prefix of a GPU class's extended resource: `gpu.deckhouse.io/<class>`.
pub const CLASS_RESOURCE_PREFIX: &str = "gpu.deckhouse.io/";
/// Prefix of the NFD / GPU feature discovery labels cleared on completion.
pub const NVIDIA_LABEL_PREFIX: &str = "nvidia.com/";

/// Labels that node preparation sets after a group change; a rollback leaves
/// them to it instead of writing them back.
pub const PREPARATION_LABELS: [&str; 2] = [GPU_STACK_LABEL, GPU_SETUP_COMPLETE_LABEL];

/// The feature gates the module needs (reference, "Prerequisites"), as the
/// API server names them in its `kubernetes_feature_enabled` metric.
pub const REQUIRED_FEATURE_GATES: [&str; 6] = [
    "DynamicResourceAllocation",
    "DRAResourceClaimDeviceStatus",
    "DRADeviceBindingConditions",
    "DRAConsumableCapacity",
    "DRAPartitionableDevices",
    "DRAExtendedResource",
];

/// Required gates and the release they went GA in: a gate is locked on from
/// then and, some releases later, removed — the API server then no longer
/// reports it, and it is on.
pub const FEATURE_GATES_GA: [(&str, (u32, u32)); 1] = [("DynamicResourceAllocation", (1, 34))];

/// The oldest Kubernetes the module runs on (reference, "Prerequisites").
pub const MIN_KUBERNETES: (u32, u32) = (1, 34);

/// `major.minor` of a Kubernetes version string (`v1.36.3`, `v1.34.2-eks-1`).
pub fn kubernetes_minor(version: &str) -> Option<(u32, u32)> {
    let mut parts = version.trim_start_matches('v').split('.');
    let major = parts.next()?.parse().ok()?;
    let minor: String = parts
        .next()?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    Some((major, minor.parse().ok()?))
}

/// The GPU driver that publishes the cards and their partitions (the node
/// agent's DRA driver).
pub const GPU_DRIVER: &str = "gpu.deckhouse.io";

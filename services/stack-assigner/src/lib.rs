//! stack-assigner: which stack serves each node, the upgrade hold, node handovers and their rollback.
//!
//! The decisions are the pure core `switchyard_core::stack_assigner`; this crate
//! is the service around it — its writers ([`edge`]), its flags and its
//! process, hosted by `switchyard_runtime`.

#![forbid(unsafe_code)]

pub mod edge;

use std::collections::BTreeMap;
use switchyard_api::rbac::Permission;

use switchyard_core::ServiceName;
use switchyard_core::backend::{Backend, NvidiaOperator, nvidia, parse_pools};
use switchyard_core::cluster::{PodSelector, ReadinessSelectors};
use switchyard_core::names::{NODE_AGENT_SELECTOR, VENDOR_ADAPTER_SELECTOR};
use switchyard_core::selector::valid_key;
use switchyard_core::stack_assigner::StackAssigner;
use switchyard_kube::write::EdgeError;
use switchyard_proto::v1::Stack;
use switchyard_runtime::host::{self, ServeError, ServiceArgs};

pub use edge::StackAssignerEdge;

pub const SERVICE: ServiceName = ServiceName::StackAssigner;

/// What the stack-assigner may do: label and cordon nodes (Server-Side Apply
/// and read-decide-write patches), drain them through evictions, read the
/// budgets that refuse one; it watches what its rules read.
pub const PERMISSIONS: &[Permission] = &[
    Permission::new("", "nodes", &["get", "list", "watch", "patch"]),
    Permission::read("", "pods"),
    Permission::new("", "pods/eviction", &["create"]),
    Permission::read("policy", "poddisruptionbudgets"),
    Permission::read("deckhouse.io", "nodegroups"),
    Permission::read("deckhouse.io", "moduleconfigs"),
    Permission::new("", "events", &["create"]),
];

/// The flags of `switchyard-stack-assigner` (and `switchyard serve stack-assigner`).
#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    #[command(flatten)]
    pub service: ServiceArgs,
    #[command(flatten)]
    pub readiness: ReadinessArgs,
    #[command(flatten)]
    pub backend: BackendArgs,
}

/// Which backend serves the GPUs, and how the `nvidia-operator` backend
/// writes a node's stack (the book, docs/gpu-operator.md).
#[derive(clap::Args, Clone, Debug)]
pub struct BackendArgs {
    /// `deckhouse`: Switchyard's node agent serves both stacks (the
    /// gpu-stack label). `nvidia-operator`: NVIDIA's GPU Operator and DRA
    /// driver do, driven by the labels they watch.
    #[arg(long, env = "SWITCHYARD_BACKEND", default_value = "deckhouse", value_parser = ["deckhouse", "nvidia-operator"])]
    pub backend: String,
    /// The domain of the ownership label `<domain>/mode` and of the pilot
    /// taint `<domain>/mode=dra:NoSchedule`.
    #[arg(long, env = "SWITCHYARD_NVIDIA_DOMAIN", default_value = nvidia::DEFAULT_DOMAIN, value_parser = domain)]
    pub nvidia_domain: String,
    /// The label the DRA kubelet plugin's DaemonSet selects (the DRA chart's
    /// `kubeletPlugin.nodeSelector`).
    #[arg(long, env = "SWITCHYARD_NVIDIA_PLUGIN_LABEL", default_value = nvidia::DRA_KUBELET_PLUGIN, value_parser = label_key)]
    pub nvidia_plugin_label: String,
    /// The node label naming a node's pool; empty: `<domain>/pool`.
    #[arg(long, env = "SWITCHYARD_NVIDIA_POOL_LABEL", default_value = "", value_parser = optional_label_key)]
    pub nvidia_pool_label: String,
    /// Each pool's stack: `legacy=device-plugin,dra-pilot=dra`. A GPU node
    /// in no pool named keeps the operator's default, the device plugin.
    #[arg(long, env = "SWITCHYARD_NVIDIA_POOLS", default_value = "", value_parser = parse_pools)]
    pub nvidia_pools: BTreeMap<String, Stack>,
    /// Taint DRA nodes `<domain>/mode=dra:NoSchedule`, so that unchanged
    /// `nvidia.com/gpu` pods do not land there through the DRA driver's own
    /// extended-resource class.
    #[arg(long, env = "SWITCHYARD_NVIDIA_PILOT_TAINT", default_value_t = true, action = clap::ArgAction::Set)]
    pub nvidia_pilot_taint: bool,
    /// Set `nvidia.com/gpu.deploy.operator-validator=false` on DRA nodes
    /// (the validator crashloops there otherwise: gpu-operator#2550).
    #[arg(long, env = "SWITCHYARD_NVIDIA_DISABLE_VALIDATOR_ON_DRA", default_value_t = true, action = clap::ArgAction::Set)]
    pub nvidia_disable_validator_on_dra: bool,
    /// The GPU Operator's device-plugin pods.
    #[arg(long, env = "SWITCHYARD_NVIDIA_DEVICE_PLUGIN_PODS", default_value = "app=nvidia-device-plugin-daemonset", value_parser = required_selector)]
    pub nvidia_device_plugin_pods: PodSelector,
    /// The DRA driver's kubelet-plugin pods (older charts:
    /// `nvidia-dra-driver-gpu-component=kubelet-plugin`).
    #[arg(long, env = "SWITCHYARD_NVIDIA_KUBELET_PLUGIN_PODS", default_value = "dra-driver-nvidia-gpu-component=kubelet-plugin", value_parser = required_selector)]
    pub nvidia_kubelet_plugin_pods: PodSelector,
}

impl BackendArgs {
    pub fn backend(&self) -> Backend {
        if self.backend != "nvidia-operator" {
            return Backend::Deckhouse;
        }
        let pool_label = if self.nvidia_pool_label.is_empty() {
            format!("{}/pool", self.nvidia_domain)
        } else {
            self.nvidia_pool_label.clone()
        };
        Backend::NvidiaOperator(Box::new(NvidiaOperator {
            domain: self.nvidia_domain.clone(),
            plugin_label: self.nvidia_plugin_label.clone(),
            pilot_taint: self.nvidia_pilot_taint,
            disable_validator_on_dra: self.nvidia_disable_validator_on_dra,
            pool_label,
            pools: self.nvidia_pools.clone(),
            device_plugin_pods: self.nvidia_device_plugin_pods.clone(),
            kubelet_plugin_pods: self.nvidia_kubelet_plugin_pods.clone(),
        }))
    }
}

/// A DNS subdomain, as a label key's prefix must be.
fn domain(text: &str) -> Result<String, String> {
    let ok = !text.is_empty()
        && text.len() <= 253
        && text.split('.').all(|part| {
            !part.is_empty()
                && part
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !part.starts_with('-')
                && !part.ends_with('-')
        });
    if ok {
        Ok(text.to_string())
    } else {
        Err("expected a DNS subdomain such as gpu-scheduling.example.com (lower-case letters, digits, '-' and '.')".into())
    }
}

fn label_key(text: &str) -> Result<String, String> {
    if valid_key(text) && text.matches('/').count() <= 1 {
        Ok(text.to_string())
    } else {
        Err("expected a label key such as nvidia.com/dra-kubelet-plugin".into())
    }
}

fn optional_label_key(text: &str) -> Result<String, String> {
    if text.is_empty() {
        Ok(String::new())
    } else {
        label_key(text)
    }
}

fn required_selector(text: &str) -> Result<PodSelector, String> {
    let parsed = PodSelector::parse(text).map_err(|e| e.to_string())?;
    if parsed.selector.is_none() {
        return Err("must not be empty: the readiness gates need these pods".into());
    }
    Ok(parsed)
}

/// Which pods are "the gpu-node-agent and vendor adapter Pods" of a node's
/// readiness, in label-selector syntax. The defaults are the pods of
/// Switchyard's own chart; for Deckhouse's, `app=gpu-node-agent` and
/// `app=nvidia-dra-adapter`.
#[derive(clap::Args, Clone, Debug)]
pub struct ReadinessArgs {
    /// The node agent's pods (as deploy/helm/switchyard labels its DaemonSet's).
    #[arg(long, env = "SWITCHYARD_NODE_AGENT_SELECTOR", default_value = NODE_AGENT_SELECTOR, value_parser = node_agent_selector)]
    pub node_agent_selector: PodSelector,
    /// The vendor adapter's pods; empty: the deployment has none (Switchyard's
    /// node agent is the kubelet plugin of both stacks).
    #[arg(long, env = "SWITCHYARD_VENDOR_ADAPTER_SELECTOR", default_value = VENDOR_ADAPTER_SELECTOR, value_parser = PodSelector::parse)]
    pub vendor_adapter_selector: PodSelector,
}

fn node_agent_selector(text: &str) -> Result<PodSelector, String> {
    let parsed = PodSelector::parse(text).map_err(|e| e.to_string())?;
    if parsed.selector.is_none() {
        return Err("must not be empty: readiness needs the node agent's pod (e.g. app.kubernetes.io/component=node-agent)".into());
    }
    Ok(parsed)
}

impl ReadinessArgs {
    pub fn selectors(&self) -> ReadinessSelectors {
        ReadinessSelectors {
            node_agent: self.node_agent_selector.clone(),
            vendor_adapter: self.vendor_adapter_selector.clone(),
        }
    }
}

/// `switchyard-stack-assigner` as a process: its flags, logs and traces, and
/// [`run`]. Its own binary and the image's multi-call `switchyard` call it.
pub fn main() -> std::process::ExitCode {
    switchyard_runtime::service_main(
        "switchyard-stack-assigner",
        "Switchyard's stack-assigner",
        run,
    )
}

/// Runs the service against the cluster (in-cluster config or KUBECONFIG)
/// and the JetStream log until the log fails. The readiness selectors are
/// recorded in the log when they differ from the last record.
pub async fn run(args: Args) -> Result<(), ServeError<EdgeError>> {
    let edge = StackAssignerEdge::infer(args.service.host.parallel);
    let core = StackAssigner::with_selectors(args.readiness.selectors())
        .on_backend(args.backend.backend());
    host::serve_core(Box::new(core), &args.service, edge).await
}

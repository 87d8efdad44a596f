//! `switchyard doctor` and `switchyard explain pod`: the common-mistakes
//! doctor and the Pending-pod explanation on the live cluster. This module
//! only reads the cluster (kube-rs, list and get); the diagnosis is the pure
//! `switchyard_diagnose` over the snapshot it fetches.

use std::fmt::Write as _;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice,
};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use switchyard_api::{GPUClass, ModuleConfig, NodeGroup, PhysicalGPU};
use switchyard_diagnose::{self as doctor, Finding, PodExplanation, Severity, Snapshot};

use crate::kube_args::KubeArgs;
use crate::output::{Format, write_stdout, write_structured};

#[derive(Args, Debug)]
pub struct DoctorArgs {
    #[command(flatten)]
    pub kube: KubeArgs,
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Table, env = "SWITCHYARD_OUTPUT")]
    pub output: Format,
}

#[derive(Subcommand, Debug)]
pub enum ExplainCommand {
    /// Why a Pending pod does not fit, per node and device: the node's own
    /// filters (cordon, node selector, affinity, taints against the pod's
    /// tolerations) and the DRA allocator's reason for every device, over
    /// the pod's ResourceClaims or the claim the scheduler would make for its
    /// extended resource. Exit 0 if some node fits, 1 if none, 2 on error.
    Pod(ExplainPodArgs),
}

#[derive(Args, Debug)]
pub struct ExplainPodArgs {
    /// The pod, as NAMESPACE/NAME (or NAME with -n).
    pub pod: String,
    /// The pod's namespace, if not in POD.
    #[arg(short = 'n', long, env = "SWITCHYARD_NAMESPACE")]
    pub namespace: Option<String>,
    #[command(flatten)]
    pub kube: KubeArgs,
    #[arg(short = 'o', long, value_enum, default_value_t = Format::Table, env = "SWITCHYARD_OUTPUT")]
    pub output: Format,
}

/// Every object of a kind; a kind the API server does not serve (its CRD
/// not installed, resource.k8s.io off) is none.
async fn list<K>(client: &Client) -> anyhow::Result<Vec<K>>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
    K::Scope: ScopeAll,
{
    let api: Api<K> = Api::all(client.clone());
    match api.list(&ListParams::default()).await {
        Ok(list) => Ok(list.items),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(Vec::new()),
        Err(e) => Err(e).with_context(|| format!("list {}", K::plural(&()))),
    }
}

/// Namespaced and cluster kinds alike can be listed across the cluster.
trait ScopeAll {}
impl ScopeAll for k8s_openapi::NamespaceResourceScope {}
impl ScopeAll for k8s_openapi::ClusterResourceScope {}

/// The snapshot the doctor reads.
pub async fn snapshot(client: &Client) -> anyhow::Result<Snapshot> {
    let configs: Api<ModuleConfig> = Api::all(client.clone());
    let module_config = match configs.get_opt(doctor::MODULE_CONFIG).await {
        Ok(c) => c,
        Err(kube::Error::Api(status)) if status.code == 404 => None,
        Err(e) => return Err(e).context("get moduleconfig gpu"),
    };
    let dra_api_served = client
        .list_api_group_resources("resource.k8s.io/v1")
        .await
        .is_ok_and(|r| r.resources.iter().any(|r| r.name == "resourceslices"));
    let (nodes, node_groups, physical_gpus, gpu_classes) = tokio::try_join!(
        list::<Node>(client),
        list::<NodeGroup>(client),
        list::<PhysicalGPU>(client),
        list::<GPUClass>(client),
    )?;
    let (device_classes, slices, claims, claim_templates) = tokio::try_join!(
        list::<DeviceClass>(client),
        list::<ResourceSlice>(client),
        list::<ResourceClaim>(client),
        list::<ResourceClaimTemplate>(client),
    )?;
    let (pods, deployments, stateful_sets, daemon_sets) = tokio::try_join!(
        list::<Pod>(client),
        list::<Deployment>(client),
        list::<StatefulSet>(client),
        list::<DaemonSet>(client),
    )?;
    let cluster_policies =
        operator_objects(client, "v1", "ClusterPolicy", "clusterpolicies").await?;
    let gpu_clusters = operator_objects(client, "v1alpha1", "GPUCluster", "gpuclusters").await?;
    // Who may do what with devices: RBAC as stored, the admission policies.
    let (namespaces, service_accounts, cluster_roles, cluster_role_bindings) = tokio::try_join!(
        list::<Namespace>(client),
        list::<ServiceAccount>(client),
        list::<ClusterRole>(client),
        list::<ClusterRoleBinding>(client),
    )?;
    let (roles, role_bindings, admission_policies, admission_policy_bindings) = tokio::try_join!(
        list::<Role>(client),
        list::<RoleBinding>(client),
        list::<ValidatingAdmissionPolicy>(client),
        list::<ValidatingAdmissionPolicyBinding>(client),
    )?;
    Ok(Snapshot {
        nodes,
        node_groups,
        module_config,
        dra_api_served,
        physical_gpus,
        gpu_classes,
        device_classes,
        slices,
        claims: claims
            .into_iter()
            .map(|mut c| {
                switchyard_dra::alloc::apply_defaults(&mut c);
                c
            })
            .collect(),
        claim_templates,
        pods,
        deployments,
        stateful_sets,
        namespaces,
        service_accounts,
        cluster_roles,
        cluster_role_bindings,
        roles,
        role_bindings,
        admission_policies,
        admission_policy_bindings,
        cluster_policies,
        gpu_clusters,
        daemon_sets,
    })
}

/// The GPU Operator's cluster-scoped objects of `kind` (`nvidia.com/<version>`:
/// ClusterPolicy, GPUCluster), as JSON; none where its CRD is not installed.
async fn operator_objects(
    client: &Client,
    version: &str,
    kind: &str,
    plural: &str,
) -> anyhow::Result<Vec<serde_json::Value>> {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("nvidia.com", version, kind),
        plural,
    );
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    match api.list(&ListParams::default()).await {
        Ok(list) => list
            .items
            .into_iter()
            .map(|p| serde_json::to_value(p).with_context(|| format!("a {kind} as JSON")))
            .collect(),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(Vec::new()),
        Err(e) => Err(e).with_context(|| format!("list {plural}.nvidia.com")),
    }
}

#[derive(serde::Serialize)]
struct Report<'a> {
    findings: &'a [Finding],
}

pub async fn doctor(args: DoctorArgs) -> anyhow::Result<ExitCode> {
    let client = args.kube.client().await?;
    let snapshot = snapshot(&client).await?;
    let findings = doctor::diagnose(&snapshot);
    if !write_structured(
        args.output,
        &Report {
            findings: &findings,
        },
    )? {
        write_stdout(&findings_table(&findings))?;
    }
    // Information (who holds admin access) is for review, not a mistake.
    let mistakes = findings.iter().any(|f| f.severity == Severity::Warning);
    Ok(ExitCode::from(u8::from(mistakes)))
}

fn findings_table(findings: &[Finding]) -> String {
    let mut out = String::new();
    if findings.is_empty() {
        out.push_str("no common mistakes found\n");
        return out;
    }
    for f in findings {
        let info = if f.severity == Severity::Info {
            "(info) "
        } else {
            ""
        };
        let _ = writeln!(out, "[{}] {info}{}", f.row.id(), f.observation);
        let _ = writeln!(out, "  objects: {}", f.objects.join(", "));
        let _ = writeln!(out, "  cause:   {}", f.cause);
        let _ = writeln!(out, "  fix:     {}", f.fix);
        out.push('\n');
    }
    let info = findings
        .iter()
        .filter(|f| f.severity == Severity::Info)
        .count();
    let _ = write!(
        out,
        "{} finding{}",
        findings.len(),
        if findings.len() == 1 { "" } else { "s" }
    );
    if info > 0 {
        let _ = write!(out, " ({info} informational)");
    }
    out.push('\n');
    out
}

pub async fn explain(command: ExplainCommand) -> anyhow::Result<ExitCode> {
    let ExplainCommand::Pod(args) = command;
    let (namespace, name) = match (args.pod.split_once('/'), args.namespace.as_deref()) {
        (Some((ns, name)), _) => (ns.to_string(), name.to_string()),
        (None, Some(ns)) => (ns.to_string(), args.pod.clone()),
        (None, None) => ("default".to_string(), args.pod.clone()),
    };
    anyhow::ensure!(
        !namespace.is_empty() && !name.is_empty(),
        "pod {:?}: expected NAMESPACE/NAME",
        args.pod
    );
    let client = args.kube.client().await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let pod = pods
        .get_opt(&name)
        .await
        .with_context(|| format!("get pod {namespace}/{name}"))?
        .with_context(|| format!("pod {namespace}/{name} not found"))?;
    let snapshot = snapshot(&client).await?;
    let explanation = doctor::explain_pod(&snapshot, &pod)
        .with_context(|| format!("explain pod {namespace}/{name}"))?;
    if !write_structured(args.output, &explanation)? {
        write_stdout(&explanation_table(&explanation))?;
    }
    Ok(ExitCode::from(if explanation.fits.is_empty() {
        1
    } else {
        0
    }))
}

fn explanation_table(e: &PodExplanation) -> String {
    let mut out = String::new();
    let phase = if e.phase.is_empty() {
        "no phase"
    } else {
        &e.phase
    };
    let _ = write!(out, "pod {} ({phase}", e.pod);
    if let Some(node) = &e.bound_to {
        let _ = write!(out, ", bound to {node}");
    }
    out.push_str(")\n");
    if e.claims.is_empty() {
        out.push_str("claims: none\n");
    } else {
        out.push_str("claims:\n");
        for c in &e.claims {
            let _ = writeln!(out, "  {c}");
        }
    }
    for p in &e.problems {
        let _ = writeln!(out, "problem: {p}");
    }
    for n in &e.nodes {
        let verdict = if n.fits { "fits" } else { "does not fit" };
        let _ = writeln!(out, "node {}: {verdict}", n.node);
        for r in &n.reasons {
            let _ = writeln!(out, "  {r}");
        }
        if let Some(devices) = &n.devices {
            out.push_str(&crate::dra_cmd::report_table(devices, "  "));
        }
    }
    if e.fits.is_empty() {
        out.push_str("fits: no node\n");
    } else {
        let _ = writeln!(out, "fits: {}", e.fits.join(", "));
    }
    out
}

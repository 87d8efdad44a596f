//! `switchyard plan`: the migration-wave register and the proposed waves,
//! from the live cluster (read only). The planning is
//! `switchyard_planner`, a pure function of the snapshot this
//! module lists.

use std::fmt::Write as _;
use std::process::ExitCode;
use switchyard_core::backend::dispatch::strategy;

use anyhow::Context;
use clap::Args;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::{Api, ListParams};
use switchyard_api::{GPUClass, NodeGroup, PhysicalGPU};
use switchyard_core::backend::Backend;
use switchyard_gpu::publish::{Layout, parse_layout};
use switchyard_planner::{self as plan, Plan, PlanRequest, Snapshot};

use crate::kube_args::{KubeArgs, NamespaceArgs};
use crate::output::{Format, write_stdout, write_structured};

#[derive(Args, Debug)]
pub struct PlanArgs {
    /// The source node group (device plugin).
    #[arg(long, env = "SWITCHYARD_PLAN_FROM")]
    pub from: String,
    /// The target node group (DRA).
    #[arg(long, env = "SWITCHYARD_PLAN_TO")]
    pub to: String,
    /// The GPUClass moved workloads request; default: the only one.
    #[arg(long, env = "SWITCHYARD_CLASS")]
    pub class: Option<String>,
    /// Nodes handed over at once, at most.
    #[arg(long, env = "SWITCHYARD_MAX_UNAVAILABLE", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_unavailable: u32,
    /// How handed-over nodes publish their cards (the node agent's --layout):
    /// static, partitionable or shared:N.
    #[arg(long, env = "SWITCHYARD_LAYOUT", default_value = "static", value_parser = parse_layout)]
    pub layout: Layout,
    #[command(flatten)]
    pub kube: KubeArgs,
    #[command(flatten)]
    pub namespaces: NamespaceArgs,
    /// Which backend serves the GPUs: the stack-assigner's flags (and the
    /// chart's environment); on `nvidia-operator` the groups are its pools.
    #[command(flatten)]
    pub backend: switchyard_stack_assigner::BackendArgs,
    #[arg(short = 'o', long, env = "SWITCHYARD_OUTPUT", value_enum, default_value_t = Format::Table)]
    pub output: Format,
}

/// Every object of a kind, page by page.
async fn list<K>(client: &kube::Client, what: &str) -> anyhow::Result<Vec<K>>
where
    K: kube::Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let api: Api<K> = Api::all(client.clone());
    let mut out = Vec::new();
    let mut params = ListParams::default().limit(500);
    loop {
        let page = api
            .list(&params)
            .await
            .with_context(|| format!("list {what}"))?;
        out.extend(page.items);
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => params = params.continue_token(&token),
            _ => return Ok(out),
        }
    }
}

/// The snapshot the plan is computed from, every kind listed at once; on
/// the `nvidia-operator` backend no NodeGroups (there may be no such kind)
/// and no PhysicalGPUs (no node agent makes them).
pub async fn snapshot(client: &kube::Client, backend: &Backend) -> anyhow::Result<Snapshot> {
    let c = client;
    let deckhouse = strategy(backend).uses_node_groups();
    let node_groups = async {
        match deckhouse {
            true => list::<NodeGroup>(c, "NodeGroups").await,
            false => Ok(Vec::new()),
        }
    };
    let physical_gpus = async {
        match deckhouse {
            true => list::<PhysicalGPU>(c, "PhysicalGPUs").await,
            false => Ok(Vec::new()),
        }
    };
    let (nodes, node_groups, physical_gpus, gpu_classes, device_classes, resource_slices) = tokio::try_join!(
        list::<Node>(c, "Nodes"),
        node_groups,
        physical_gpus,
        list::<GPUClass>(c, "GPUClasses"),
        list::<DeviceClass>(c, "DeviceClasses"),
        list::<ResourceSlice>(c, "ResourceSlices"),
    )?;
    let (resource_claims, pods, deployments, replica_sets, stateful_sets) = tokio::try_join!(
        list::<ResourceClaim>(c, "ResourceClaims"),
        list::<Pod>(c, "Pods"),
        list::<Deployment>(c, "Deployments"),
        list::<ReplicaSet>(c, "ReplicaSets"),
        list::<StatefulSet>(c, "StatefulSets"),
    )?;
    let (daemon_sets, jobs, cron_jobs, pod_disruption_budgets) = tokio::try_join!(
        list::<DaemonSet>(c, "DaemonSets"),
        list::<Job>(c, "Jobs"),
        list::<CronJob>(c, "CronJobs"),
        list::<PodDisruptionBudget>(c, "PodDisruptionBudgets"),
    )?;
    Ok(Snapshot {
        nodes,
        node_groups,
        physical_gpus,
        gpu_classes,
        device_classes,
        resource_slices,
        resource_claims,
        pods,
        deployments,
        replica_sets,
        stateful_sets,
        daemon_sets,
        jobs,
        cron_jobs,
        pod_disruption_budgets,
    })
}

/// Prints the plan; exit 0 when it hands over every node and moves every
/// workload, 1 when something stays (blocked nodes, workloads not moved).
pub async fn run(args: PlanArgs) -> anyhow::Result<ExitCode> {
    let client = args.kube.client().await?;
    let backend = args.backend.backend();
    let snapshot = snapshot(&client, &backend).await?;
    let request = PlanRequest {
        from: args.from,
        to: args.to,
        class: args.class,
        max_unavailable: args.max_unavailable as usize,
        layout: args.layout,
        namespace: args.namespaces.only().map(str::to_string),
        backend,
    };
    let plan = plan::plan(&snapshot, &request)?;
    if !write_structured(args.output, &plan)? {
        write_stdout(&table(&plan))?;
    }
    Ok(if plan.complete {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn join<T: std::fmt::Display>(items: impl IntoIterator<Item = T>) -> String {
    let text: Vec<String> = items.into_iter().map(|i| i.to_string()).collect();
    if text.is_empty() {
        "-".into()
    } else {
        text.join(",")
    }
}

fn table(plan: &Plan) -> String {
    let mut rows = vec![
        [
            "NAMESPACE",
            "KIND",
            "NAME",
            "REPLICAS",
            "GPUS/POD",
            "TOTAL",
            "MODE",
            "GROUPS",
            "GPU",
            "PDB",
            "MANAGED-BY",
            "PLAN",
        ]
        .map(String::from),
    ];
    for e in &plan.register {
        rows.push([
            e.namespace.to_string(),
            e.kind.to_string(),
            e.name.to_string(),
            e.replicas.to_string(),
            join(e.gpus_per_pod.iter().map(|(r, n)| format!("{r}={n}"))),
            e.gpus_total.to_string(),
            serde_json::to_value(e.mode)
                .ok()
                .and_then(|v| v.as_str().map(String::from))
                .unwrap_or_default(),
            join(&e.groups),
            join(e.gpu_models.iter().map(|m| match m.memory_mib {
                Some(mib) => format!("{} ({mib} MiB)", m.product),
                None => m.product.to_string(),
            })),
            join(e.pod_disruption_budgets.iter().map(|b| &b.name)),
            join(
                e.managed_by
                    .iter()
                    .map(|m| format!("{}:{}", m.kind, m.name)),
            ),
            if e.in_plan { "yes" } else { "no" }.into(),
        ]);
    }
    let mut widths = [0usize; 12];
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in &rows {
        let line: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
    }
    let _ = writeln!(
        out,
        "\nplan: {} -> {}, class {}, at most {} node(s) a wave",
        plan.from, plan.to, plan.class, plan.max_unavailable
    );
    for wave in &plan.waves {
        let _ = writeln!(out, "\nwave {}", wave.number);
        for h in &wave.handovers {
            let _ = writeln!(
                out,
                "  hand over {} ({}); evicts {}; budgets {}",
                h.node,
                join(h.capacity.iter().map(|(r, n)| format!("{r}={n}"))),
                join(&h.evicts),
                join(&h.budgets)
            );
        }
        for m in &wave.moves {
            let _ = writeln!(
                out,
                "  move {} ({}) -> {}",
                m.workload,
                join(m.requests.iter().map(|(r, n)| format!("{r}={n}"))),
                join(m.pods.iter().map(|p| &p.node))
            );
        }
        for p in &wave.pending {
            let _ = writeln!(out, "  pending {}: {}", p.workload, p.reason);
        }
    }
    if let Some(b) = &plan.blocked {
        let _ = writeln!(out, "\nblocked {}: {}", join(&b.nodes), b.reason);
    }
    for p in &plan.remaining {
        let _ = writeln!(out, "not moved {}: {}", p.workload, p.reason);
    }
    if !plan.follow_nodes.is_empty() {
        let _ = writeln!(
            out,
            "DaemonSets (follow their nodes): {}",
            join(&plan.follow_nodes)
        );
    }
    let _ = writeln!(
        out,
        "\n{}",
        if plan.complete {
            "complete: every node handed over, every workload moved"
        } else {
            "incomplete"
        }
    );
    out
}

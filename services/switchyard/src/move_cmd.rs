//! `switchyard move`: Step 4 of the reference — a workload's `nvidia.com/gpu`
//! request becomes its class's extended resource and the binding to the
//! source group goes — as a command to the running claim-allocator, or with
//! `--dry-run` the change printed for a manifest that lives elsewhere (Git).

use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Args;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::PodSpec;
use kube::Api;
use serde_json::json;
use switchyard_claim_allocator::edge::{set_placement, spec_patch};
use switchyard_core::ServiceName;
use switchyard_core::names::GROUP_LABEL;
use switchyard_core::placement::rewrite;
use switchyard_proto::v1::{MoveApplicationCommand, WorkloadRef, service_command};

use crate::kube_args::KubeArgs;
use crate::operator::OperatorArgs;
use crate::output::{Format, write_stdout};

#[derive(Args, Debug)]
pub struct MoveArgs {
    /// The workload to move: NAMESPACE/KIND/NAME (Deployment or StatefulSet).
    #[arg(long, value_parser = parse_workload)]
    pub workload: WorkloadRef,
    /// The GPU class to request (`gpu.deckhouse.io/<class>`).
    #[arg(long)]
    pub class: String,
    /// The group its pods must run on once moved; default: the one group
    /// without spec.gpu that has ready nodes.
    #[arg(long)]
    pub to: Option<String>,
    /// Id of the move; default: a new one.
    #[arg(long)]
    pub id: Option<String>,
    /// Edit the manifest in place even if a Helm release, a GitOps controller
    /// or an operator keeps it (change it at its source too).
    #[arg(long)]
    pub allow_managed: bool,
    /// Change nothing: print the change for the live object — `-o patch` a
    /// merge patch (`kubectl patch --type merge -p`), `-o yaml|json` the
    /// whole manifest as it would be, `-o table` what changes.
    #[arg(long)]
    pub dry_run: bool,
    #[command(flatten)]
    pub kube: KubeArgs,
    #[command(flatten)]
    pub operator: OperatorArgs,
}

/// Reads `NAMESPACE/KIND/NAME`.
pub fn parse_workload(text: &str) -> Result<WorkloadRef, String> {
    let parts: Vec<&str> = text.split('/').collect();
    let [namespace, kind, name] = parts.as_slice() else {
        return Err(format!(
            "{text:?}: expected NAMESPACE/KIND/NAME, e.g. ml/Deployment/train"
        ));
    };
    if namespace.is_empty() || kind.is_empty() || name.is_empty() {
        return Err(format!(
            "{text:?}: namespace, kind and name must all be given"
        ));
    }
    let kind = match kind.to_ascii_lowercase().as_str() {
        "deployment" | "deployments" | "deploy" => "Deployment",
        "statefulset" | "statefulsets" | "sts" => "StatefulSet",
        other => {
            return Err(format!(
                "{text:?}: kind {other:?} is not moved in place; expected Deployment or StatefulSet"
            ));
        }
    };
    Ok(WorkloadRef {
        namespace: namespace.to_string(),
        kind: kind.to_string(),
        name: name.to_string(),
    })
}

pub async fn move_workload(args: MoveArgs) -> anyhow::Result<ExitCode> {
    if args.dry_run {
        return dry_run(&args).await;
    }
    let command = service_command::Command::MoveApplication(MoveApplicationCommand {
        move_id: args
            .id
            .unwrap_or_else(|| format!("move-{}", uuid::Uuid::new_v4())),
        workload: Some(args.workload),
        target_group: args.to.unwrap_or_default(),
        gpu_class: args.class,
        allow_managed: args.allow_managed,
    });
    args.operator
        .run(ServiceName::ClaimAllocator, command)
        .await
}

/// The live object, its pod spec, and where that spec sits in it.
async fn live(
    client: kube::Client,
    w: &WorkloadRef,
) -> anyhow::Result<(serde_json::Value, PodSpec)> {
    let what = format!("{} {}/{}", w.kind, w.namespace, w.name);
    let (object, spec) = match w.kind.as_str() {
        "Deployment" => {
            let d = Api::<Deployment>::namespaced(client, &w.namespace)
                .get(&w.name)
                .await
                .with_context(|| format!("read {what}"))?;
            let spec = d.spec.as_ref().and_then(|s| s.template.spec.clone());
            (serde_json::to_value(&d)?, spec)
        }
        "StatefulSet" => {
            let s = Api::<StatefulSet>::namespaced(client, &w.namespace)
                .get(&w.name)
                .await
                .with_context(|| format!("read {what}"))?;
            let spec = s.spec.as_ref().and_then(|s| s.template.spec.clone());
            (serde_json::to_value(&s)?, spec)
        }
        other => bail!("{what}: kind {other} is not supported"),
    };
    let spec = spec.with_context(|| format!("{what}: spec.template.spec is missing"))?;
    Ok((object, spec))
}

async fn dry_run(args: &MoveArgs) -> anyhow::Result<ExitCode> {
    let w = &args.workload;
    let what = format!("{} {}/{}", w.kind, w.namespace, w.name);
    let (mut object, spec) = live(args.kube.client().await?, w).await?;
    let placement = switchyard_kube::facts::placement(Some(&spec));
    if !switchyard_core::placement::requests_nvidia_gpu(&placement) {
        eprintln!(
            "{what} requests no {}: there is nothing to move",
            switchyard_core::names::NVIDIA_GPU
        );
        return Ok(ExitCode::from(1));
    }
    let source = placement
        .node_selector
        .get(GROUP_LABEL)
        .cloned()
        .unwrap_or_default();
    let after = rewrite(&placement, &source, &args.class);
    let Some(pod_spec) = spec_patch(&spec, |s| set_placement(s, &after)) else {
        write_stdout(&format!("{what}: nothing to change\n"))?;
        return Ok(ExitCode::SUCCESS);
    };
    let patch = json!({"spec": {"template": {"spec": pod_spec}}});
    match args.operator.output {
        Format::Patch => write_stdout(&format!("{}\n", serde_json::to_string(&patch)?))?,
        Format::Table => {
            let mut text = format!("{what} (dry run: nothing is changed)\n");
            for (container, limits) in &placement.container_limits {
                let new = after.container_limits.get(container);
                text.push_str(&format!(
                    "  container {container} limits: {:?} -> {:?}\n",
                    limits.quantities,
                    new.map(|l| &l.quantities)
                ));
            }
            if placement.node_selector != after.node_selector {
                text.push_str(&format!(
                    "  nodeSelector: {:?} -> {:?}\n",
                    placement.node_selector, after.node_selector
                ));
            }
            text.push_str(&format!(
                "apply with: kubectl -n {} patch {} {} --type merge -p '{}'\n",
                w.namespace,
                w.kind.to_ascii_lowercase(),
                w.name,
                serde_json::to_string(&patch)?
            ));
            write_stdout(&text)?;
        }
        format => {
            json_patch::merge(&mut object, &patch);
            // The manifest as it would be kept in Git: no server-side fields.
            if let Some(meta) = object.get_mut("metadata").and_then(|m| m.as_object_mut()) {
                for field in [
                    "managedFields",
                    "resourceVersion",
                    "uid",
                    "generation",
                    "creationTimestamp",
                ] {
                    meta.remove(field);
                }
            }
            if let Some(o) = object.as_object_mut() {
                o.remove("status");
            }
            crate::output::write_structured(format, &object)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

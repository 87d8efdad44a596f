//! `switchyard move`: Step 4 of the reference — a workload's `nvidia.com/gpu`
//! request becomes its class's extended resource and the binding to the
//! source group goes — as a command to the running claim-allocator, or with
//! `--dry-run` the change printed for a manifest that lives elsewhere (Git).

use std::process::ExitCode;
use switchyard_core::backend::dispatch::strategy;

use anyhow::{Context, bail};
use clap::Args;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::{CronJob, Job};
use k8s_openapi::api::core::v1::PodSpec;
use kube::Api;
use switchyard_claim_allocator::edge::{set_placement, spec_patch, template_patch, template_path};
use switchyard_core::ServiceName;
use switchyard_core::placement::rewrite;
use switchyard_proto::v1::{MoveApplicationCommand, WorkloadRef, service_command};

use crate::kube_args::KubeArgs;
use crate::operator::OperatorArgs;
use crate::output::{Format, write_stdout};

#[derive(Args, Debug)]
// A dry run reads the cluster only: no NATS server is needed for it.
#[command(mut_arg("nats_url", |a| a.required(false).default_value("")))]
pub struct MoveArgs {
    /// The workload to move: NAMESPACE/KIND/NAME — a Deployment, StatefulSet
    /// or DaemonSet (restarted), a CronJob (its next run takes the change); a
    /// Job's template is immutable: `--dry-run -o yaml` prints it to recreate.
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
    /// Which backend serves the GPUs, for `--dry-run` (the running
    /// claim-allocator reads it from the log): the stack-assigner's flags
    /// and the chart's environment. On `nvidia-operator` the binding dropped
    /// is the pool label and the pilot taint is tolerated.
    #[command(flatten)]
    pub backend: switchyard_stack_assigner::BackendArgs,
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
        "daemonset" | "daemonsets" | "ds" => "DaemonSet",
        "cronjob" | "cronjobs" | "cj" => "CronJob",
        "job" | "jobs" => "Job",
        other => {
            return Err(format!(
                "{text:?}: kind {other:?} has no pod template Switchyard moves; expected \
                 Deployment, StatefulSet, DaemonSet, CronJob or Job"
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
    if args.operator.nats.nats_url.is_empty() {
        bail!(
            "--nats-url (or SWITCHYARD_NATS_URL): the NATS server of the running claim-allocator is needed to move; only --dry-run goes without"
        );
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
        "DaemonSet" => {
            let d = Api::<DaemonSet>::namespaced(client, &w.namespace)
                .get(&w.name)
                .await
                .with_context(|| format!("read {what}"))?;
            let spec = d.spec.as_ref().and_then(|s| s.template.spec.clone());
            (serde_json::to_value(&d)?, spec)
        }
        "CronJob" => {
            let c = Api::<CronJob>::namespaced(client, &w.namespace)
                .get(&w.name)
                .await
                .with_context(|| format!("read {what}"))?;
            let spec = c.spec.job_template.spec.as_ref();
            let spec = spec.and_then(|s| s.template.spec.clone());
            (serde_json::to_value(&c)?, spec)
        }
        "Job" => {
            let j = Api::<Job>::namespaced(client, &w.namespace)
                .get(&w.name)
                .await
                .with_context(|| format!("read {what}"))?;
            let spec = j.spec.as_ref().and_then(|s| s.template.spec.clone());
            (serde_json::to_value(&j)?, spec)
        }
        other => bail!("{what}: kind {other} is not supported"),
    };
    let spec =
        spec.with_context(|| format!("{what}: {}.spec is missing", template_path(&w.kind)))?;
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
    let backend = args.backend.backend();
    let group_label = backend.group_label();
    let pilot_taint = strategy(&backend).pilot_taint();
    let source = placement
        .node_selector
        .get(group_label)
        .cloned()
        .unwrap_or_default();
    let mut after = rewrite(
        &placement,
        group_label,
        &source,
        &args.class,
        pilot_taint.as_ref(),
    );
    if w.kind == "DaemonSet" {
        // Its pods run wherever its selector matches: bound to the target group.
        let Some(to) = &args.to else {
            bail!("{what}: a DaemonSet is bound to the group it moves to: name it with --to GROUP");
        };
        after
            .node_selector
            .insert(group_label.to_string(), to.clone());
    }
    let Some(pod_spec) = spec_patch(&spec, |s| set_placement(s, &after)) else {
        write_stdout(&format!("{what}: nothing to change\n"))?;
        return Ok(ExitCode::SUCCESS);
    };
    let patch = template_patch(&w.kind, pod_spec);
    let job = w.kind == "Job";
    if job && matches!(args.operator.output, Format::Patch | Format::Table) {
        bail!(
            "{what}: a Job's pod template cannot be changed in place; `-o yaml` prints the \
             manifest to delete the Job and create it again"
        );
    }
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
            if placement.tolerations != after.tolerations {
                let added = after.tolerations.iter().flat_map(|t| &t.items).filter(|t| {
                    !placement
                        .tolerations
                        .iter()
                        .flat_map(|l| &l.items)
                        .any(|b| b == *t)
                });
                for t in added {
                    text.push_str(&format!(
                        "  toleration added: {}={}:{}\n",
                        t.key, t.value, t.effect
                    ));
                }
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
            if job {
                without_generated_selector(&mut object);
            }
            crate::output::write_structured(format, &object)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// A Job as it can be created again: the selector and the labels its
/// controller generated for the old one's uid are dropped (the API server
/// refuses a new Job that carries them without `manualSelector`).
fn without_generated_selector(job: &mut serde_json::Value) {
    if let Some(spec) = job.get_mut("spec").and_then(|s| s.as_object_mut()) {
        spec.remove("selector");
    }
    for path in ["/metadata/labels", "/spec/template/metadata/labels"] {
        if let Some(labels) = job.pointer_mut(path).and_then(|l| l.as_object_mut()) {
            for generated in [
                "controller-uid",
                "job-name",
                "batch.kubernetes.io/controller-uid",
                "batch.kubernetes.io/job-name",
            ] {
                labels.remove(generated);
            }
        }
    }
}

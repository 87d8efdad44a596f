//! Shared helpers: helm runs, rendered documents, and the cluster the chart is applied to.

use std::cell::RefCell;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::discovery::{Discovery, Scope};
use serde_json::Value;
use switchyard_testkit::eventually;

pub(crate) use switchyard_system_tests::chart::{
    NAMESPACE, RELEASE, chart_dir, helm, render, template, yaml_documents,
};
pub(crate) const NATS_URL: &str = "nats.url=nats://nats.example:4222";

fn chart_crds() -> Vec<Value> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(chart_dir().join("crds"))
        .expect("the chart's crds/")
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no CRDs in the chart's crds/");
    files
        .iter()
        .flat_map(|file| yaml_documents(&std::fs::read_to_string(file).unwrap()))
        .collect()
}

pub(crate) fn kind(doc: &Value) -> &str {
    doc["kind"].as_str().unwrap_or_default()
}

pub(crate) fn name(doc: &Value) -> &str {
    doc["metadata"]["name"].as_str().unwrap_or_default()
}

pub(crate) fn strings(value: &Value) -> Vec<&str> {
    value
        .as_array()
        .map(|items| items.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

fn group_version_kind(doc: &Value) -> GroupVersionKind {
    let api_version = doc["apiVersion"].as_str().unwrap();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    GroupVersionKind::gvk(group, version, kind(doc))
}

/// Server-side apply of one rendered object, resolved through discovery.
pub(crate) async fn apply(
    client: &kube::Client,
    discovery: &Discovery,
    doc: &Value,
    dry_run: bool,
) -> Result<DynamicObject, String> {
    let gvk = group_version_kind(doc);
    let (resource, capabilities) = discovery
        .resolve_gvk(&gvk)
        .ok_or_else(|| format!("the API server does not serve {gvk:?}"))?;
    let api: Api<DynamicObject> = match capabilities.scope {
        Scope::Namespaced => {
            let namespace = doc["metadata"]["namespace"].as_str().unwrap_or(NAMESPACE);
            Api::namespaced_with(client.clone(), namespace, &resource)
        }
        Scope::Cluster => Api::all_with(client.clone(), &resource),
    };
    let mut params = PatchParams::apply("switchyard-test").force();
    if dry_run {
        params = params.dry_run();
    }
    api.patch(name(doc), &params, &Patch::Apply(doc))
        .await
        .map_err(|err| format!("{} {}: {err}", kind(doc), name(doc)))
}

/// Creates the release namespace and the chart's CRDs, waits until the CRDs
/// and every kind in `docs` are served, and returns discovery as it is then.
pub(crate) async fn prepare_cluster(client: &kube::Client, docs: &[Value]) -> Discovery {
    // With its `default` ServiceAccount, as the controller manager (not
    // run here) makes it: the chart's test pod runs as it.
    switchyard_testkit::kube::create_namespace(client, NAMESPACE).await;
    let crds = chart_crds();
    let definitions: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in &crds {
        let definition: CustomResourceDefinition =
            serde_json::from_value(crd.clone()).expect("a CRD");
        definitions
            .patch(
                name(crd),
                &PatchParams::apply("switchyard-test"),
                &Patch::Apply(&definition),
            )
            .await
            .unwrap_or_else(|err| panic!("apply the chart's CRD {}: {err}", name(crd)));
    }
    for crd in &crds {
        let definitions = &definitions;
        eventually(
            &format!("CRD {} to be established", name(crd)),
            Duration::from_secs(30),
            || async move {
                let got = definitions.get(name(crd)).await.unwrap();
                let conditions = got.status.and_then(|s| s.conditions).unwrap_or_default();
                conditions
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            },
        )
        .await
        .unwrap();
    }
    // Right after start-up, and after new CRDs, discovery can lag behind what
    // the server serves.
    let wanted: Vec<GroupVersionKind> = docs.iter().map(group_version_kind).collect();
    let discovered = RefCell::new(None);
    let missing = RefCell::new(Vec::new());
    eventually(
        "discovery to list every kind the test applies",
        Duration::from_secs(30),
        || async {
            let Ok(discovery) = Discovery::new(client.clone()).run().await else {
                return false;
            };
            *missing.borrow_mut() = wanted
                .iter()
                .filter(|gvk| discovery.resolve_gvk(gvk).is_none())
                .cloned()
                .collect();
            let complete = missing.borrow().is_empty();
            *discovered.borrow_mut() = Some(discovery);
            complete
        },
    )
    .await
    .unwrap_or_else(|err| panic!("{err}; not served: {:?}", missing.borrow()));
    discovered.into_inner().unwrap()
}

//! The chart as helm renders it: `helm` runs and the documents of `helm
//! template`, shared by the chart's render tests and the tests that install
//! it on real nodes.

use std::path::PathBuf;
use std::process::Command;

use serde::Deserialize;
use serde_json::Value;
pub use switchyard_testkit::chart::{NAMESPACE, RELEASE};
use switchyard_testkit::helm_binary;

/// The chart's directory, `deploy/helm/switchyard`.
pub fn chart_dir() -> PathBuf {
    switchyard_testkit::repo_root().join("deploy/helm/switchyard")
}

/// What a `helm` run said.
pub struct HelmRun {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

/// `helm args`.
pub fn helm(args: &[&str]) -> HelmRun {
    let binary = helm_binary().unwrap_or_else(|err| panic!("{err}"));
    let out = Command::new(&binary)
        .args(args)
        .output()
        .unwrap_or_else(|err| panic!("run {}: {err}", binary.display()));
    HelmRun {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `helm template` of the chart as release [`RELEASE`] in [`NAMESPACE`],
/// with `--set` each of `sets`.
pub fn template(sets: &[&str]) -> HelmRun {
    let chart = chart_dir();
    let mut args = vec![
        "template",
        RELEASE,
        chart.to_str().expect("a UTF-8 path"),
        "--namespace",
        NAMESPACE,
    ];
    for set in sets {
        args.extend(["--set", set]);
    }
    helm(&args)
}

/// The YAML documents of `text` as JSON values, empty ones left out.
pub fn yaml_documents(text: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).expect("rendered YAML"))
        .filter(|doc| !doc.is_null())
        .collect()
}

/// The chart's objects for `sets`; panics with helm's error when it fails.
pub fn render(sets: &[&str]) -> Vec<Value> {
    let run = template(sets);
    assert!(run.ok, "helm template {sets:?} failed:\n{}", run.stderr);
    yaml_documents(&run.stdout)
}

/// The dashboards' ConfigMaps among `docs`: those carrying the sidecar's label.
pub fn dashboard_maps(docs: &[Value]) -> Vec<&Value> {
    docs.iter()
        .filter(|doc| doc["kind"] == "ConfigMap")
        .filter(|doc| doc["metadata"]["labels"].get("grafana_dashboard").is_some())
        .collect()
}

/// The dashboards the chart renders for `sets` (which turn them on): (file
/// name, dashboard).
pub fn rendered_dashboards(sets: &[&str]) -> Vec<(String, Value)> {
    let docs = render(sets);
    dashboard_maps(&docs)
        .into_iter()
        .flat_map(|map| map["data"].as_object().expect("the ConfigMap's data"))
        .map(|(file, text)| {
            let text = text.as_str().expect("a dashboard as text");
            let dashboard = serde_json::from_str(text)
                .unwrap_or_else(|err| panic!("{file} is not JSON: {err}"));
            (file.clone(), dashboard)
        })
        .collect()
}

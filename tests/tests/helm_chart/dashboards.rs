//! The chart's Grafana dashboards (`dashboards.enabled`): off by default; when
//! on, a ConfigMap per file of the chart's `dashboards/`, labelled for
//! Grafana's dashboard sidecar. Every panel's query is PromQL — promql-parser
//! reads it, and promtool (`scripts/install-promtool.sh`) accepts it as a
//! recording rule — and selects only series that the book's "Metrics and
//! alerts" tables list; the template variables' `label_values` too.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use promql_parser::parser::{self, Expr};
use promql_parser::util::{ExprVisitor, walk_expr};
use serde_json::{Value, json};
use switchyard_testkit::promtool_binary;

use crate::support::{NAMESPACE, NATS_URL, chart_dir, name, render};
use switchyard_system_tests::chart::{dashboard_maps, rendered_dashboards};
use switchyard_system_tests::dashboards::{Query, concrete, panels, queries, variables};

/// Each dashboard of the chart, and series it is about: it must query them.
const DASHBOARDS: [(&str, &[&str]); 3] = [
    (
        "switchyard-migration.json",
        &[
            "switchyard_gpu_node",
            "switchyard_handover_step_started_timestamp_seconds",
            "switchyard_handovers_completed_total",
            "switchyard_move_started_timestamp_seconds",
            "switchyard_migration_waves",
            "switchyard_node_group_held_on_dra",
            "switchyard_alert_firing",
            "switchyard_log_lag_records",
            "switchyard_effects_failed_total",
            "switchyard_evidence_failed",
        ],
    ),
    (
        "switchyard-gpu-allocation.json",
        &[
            "switchyard_gpu_allocated",
            "switchyard_resource_claim_pending_since_timestamp_seconds",
            "switchyard_resource_claim_unused_since_timestamp_seconds",
            "switchyard_physical_gpu",
            "switchyard_gpu_node_device_plugin_gpus",
            "switchyard_gpu_node_slice_devices",
        ],
    ),
    (
        "switchyard-node-agents.json",
        &[
            "switchyard_node_agent_stack",
            "switchyard_node_agent_prepared_claims",
            "switchyard_node_agent_claim_seconds_bucket",
            "switchyard_node_agent_claim_errors_total",
            "switchyard_node_agent_gpu_healthy",
        ],
    ),
];

/// The series names the book's "Metrics and alerts" tables list
/// (`docs/operations/metrics-and-alerts.md`): the backticked name in each
/// row's first cell; a histogram's `_bucket`, `_sum` and `_count` too.
fn exposed_series() -> BTreeSet<String> {
    let section = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/operations/metrics-and-alerts.md"),
    )
    .expect("docs/operations/metrics-and-alerts.md");
    let mut names = BTreeSet::new();
    for row in section.lines().filter(|line| line.starts_with("| `")) {
        let mut cells = row.split('|').skip(1);
        let (series, what) = (cells.next().unwrap(), cells.next().unwrap_or_default());
        for name in series.split('`').skip(1).step_by(2) {
            let name = name.split('{').next().unwrap().trim().to_string();
            if what.trim_start().starts_with("histogram") {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{suffix}"));
                }
            }
            names.insert(name);
        }
    }
    assert!(
        names.contains("switchyard_gpu_node") && names.len() > 25,
        "the book's metric tables read as {names:?}"
    );
    names
}

/// The metric names `expr` selects; an error names a selector without one.
fn selected_series(expr: &Expr) -> Result<BTreeSet<String>, String> {
    struct Selectors(BTreeSet<String>);
    impl ExprVisitor for Selectors {
        type Error = String;
        fn pre_visit(&mut self, expr: &Expr) -> Result<bool, String> {
            let selector = match expr {
                Expr::VectorSelector(selector) => selector,
                Expr::MatrixSelector(matrix) => &matrix.vs,
                _ => return Ok(true),
            };
            let name = selector.name.clone();
            let name = name.ok_or_else(|| format!("{selector} selects no metric by name"))?;
            self.0.insert(name);
            Ok(true)
        }
    }
    let mut selectors = Selectors(BTreeSet::new());
    walk_expr(&mut selectors, expr)?;
    Ok(selectors.0)
}

/// `promtool check rules` on `rules`, which hold `count` rules.
fn promtool_check_rules(rules: &Value, count: usize) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let file = dir.path().join("dashboards.yaml");
    std::fs::write(&file, serde_yaml_ng::to_string(rules).expect("YAML")).unwrap();
    let promtool = promtool_binary().unwrap_or_else(|err| panic!("{err}"));
    let out = Command::new(&promtool)
        .args(["check", "rules"])
        .arg(&file)
        .output()
        .unwrap_or_else(|err| panic!("run {}: {err}", promtool.display()));
    assert!(
        out.status.success(),
        "promtool check rules refused the dashboards' queries:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains(&format!("SUCCESS: {count} rules found")),
        "promtool checked other than the {count} queries: {stdout}"
    );
}

#[test]
fn the_dashboards_are_config_maps_for_grafanas_sidecar() {
    assert!(
        dashboard_maps(&render(&[NATS_URL])).is_empty(),
        "dashboards rendered while off"
    );
    let mut files: Vec<String> = std::fs::read_dir(chart_dir().join("dashboards"))
        .expect("the chart's dashboards/")
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    let mut listed: Vec<String> = DASHBOARDS
        .iter()
        .map(|(file, _)| file.to_string())
        .collect();
    listed.sort();
    assert_eq!(
        files, listed,
        "the chart's dashboards/ and this test's list"
    );

    let docs = render(&[
        NATS_URL,
        "dashboards.enabled=true",
        "dashboards.namespace=monitoring",
        "dashboards.annotations.grafana_folder=Switchyard",
    ]);
    let maps = dashboard_maps(&docs);
    assert_eq!(maps.len(), DASHBOARDS.len(), "one ConfigMap per dashboard");
    let (mut uids, mut titles) = (BTreeSet::new(), BTreeSet::new());
    for map in maps {
        let labels = &map["metadata"]["labels"];
        assert_eq!(labels["grafana_dashboard"], "1", "{}", name(map));
        assert_eq!(labels["app.kubernetes.io/part-of"], "switchyard");
        assert_eq!(map["metadata"]["namespace"], "monitoring");
        assert_eq!(
            map["metadata"]["annotations"]["grafana_folder"],
            "Switchyard"
        );
        assert!(name(map).len() <= 63, "{}", name(map));
        let data = map["data"].as_object().expect("data");
        let [(file, text)] = &data.iter().collect::<Vec<_>>()[..] else {
            panic!("{}: one dashboard per ConfigMap: {data:?}", name(map))
        };
        let rendered: Value = serde_json::from_str(text.as_str().unwrap())
            .unwrap_or_else(|err| panic!("{file} as rendered: {err}"));
        let source = std::fs::read_to_string(chart_dir().join("dashboards").join(file)).unwrap();
        let source: Value =
            serde_json::from_str(&source).unwrap_or_else(|err| panic!("dashboards/{file}: {err}"));
        assert_eq!(rendered, source, "{file} rendered as it is in the chart");

        let uid = rendered["uid"].as_str().unwrap_or_default();
        assert!(
            !uid.is_empty() && uid.len() <= 40 && uids.insert(uid.to_string()),
            "{file}: a stable uid of its own, at most 40 characters: {uid:?}"
        );
        let title = rendered["title"].as_str().unwrap_or_default();
        assert!(
            !title.is_empty() && titles.insert(title.to_string()),
            "{file}: title {title:?}"
        );
        assert!(
            rendered["schemaVersion"].as_u64().is_some(),
            "{file}: schemaVersion"
        );

        // The queries go to the Prometheus chosen in the dashboard's
        // `datasource` variable, not to a data source of the author's Grafana.
        let datasource = variables(&rendered)
            .find(|v| v["name"] == "datasource")
            .unwrap_or_else(|| panic!("{file}: no datasource variable"));
        assert_eq!(datasource["type"], "datasource", "{file}");
        assert_eq!(datasource["query"], "prometheus", "{file}");
        let chosen = json!({"type": "prometheus", "uid": "${datasource}"});
        for variable in variables(&rendered).filter(|v| v["type"] == "query") {
            assert_eq!(
                variable["datasource"], chosen,
                "{file}: {}",
                variable["name"]
            );
        }
        let mut ids = BTreeSet::new();
        for panel in panels(&rendered) {
            let title = &panel["title"];
            let id = panel["id"].as_u64();
            assert!(
                id.is_some_and(|id| ids.insert(id)),
                "{file}: panel {title} id {id:?}"
            );
            if panel["type"] == "row" {
                continue;
            }
            assert_eq!(panel["datasource"], chosen, "{file}: panel {title}");
            let targets = panel["targets"].as_array();
            assert!(
                targets.is_some_and(|t| !t.is_empty()),
                "{file}: panel {title}: no query"
            );
            for target in targets.unwrap() {
                assert_eq!(target["datasource"], chosen, "{file}: panel {title}");
            }
        }
    }

    let docs = render(&[NATS_URL, "dashboards.enabled=true"]);
    for map in dashboard_maps(&docs) {
        assert_eq!(
            map["metadata"]["namespace"], NAMESPACE,
            "the release's by default"
        );
        assert!(map["metadata"].get("annotations").is_none(), "{map}");
    }
}

#[test]
fn every_dashboard_query_is_promql_over_series_the_services_expose() {
    let exposed = exposed_series();
    let dashboards = rendered_dashboards(&[NATS_URL, "dashboards.enabled=true"]);
    assert_eq!(dashboards.len(), DASHBOARDS.len());
    let (mut groups, mut count) = (Vec::new(), 0);
    for (file, dashboard) in &dashboards {
        let defined: BTreeSet<String> = variables(dashboard)
            .filter_map(|v| v["name"].as_str().map(String::from))
            .collect();
        let mut used = BTreeSet::new();
        let mut rules = Vec::new();
        for (n, query) in queries(file, dashboard).into_iter().enumerate() {
            let Query { place, expr } = query;
            let concrete = concrete(&place, &expr, &defined);
            let parsed = parser::parse(&concrete)
                .unwrap_or_else(|err| panic!("{place}: not PromQL: {err}\n  {concrete}"));
            let series = selected_series(&parsed).unwrap_or_else(|err| panic!("{place}: {err}"));
            for name in &series {
                assert!(
                    name.starts_with("switchyard_") && exposed.contains(name),
                    "{place}: {name} is no series of the book's \"Metrics and alerts\": {expr}"
                );
            }
            used.extend(series);
            let uid = dashboard["uid"].as_str().unwrap().replace('-', "_");
            rules.push(json!({"record": format!("dashboard:{uid}:query_{n}"), "expr": concrete}));
        }
        let (_, about) = DASHBOARDS
            .iter()
            .find(|(name, _)| name == file)
            .unwrap_or_else(|| panic!("{file} is not in this test's list"));
        for series in *about {
            assert!(
                used.contains(*series),
                "{file} does not show {series}: {used:?}"
            );
        }
        count += rules.len();
        groups.push(json!({"name": file, "rules": rules}));
    }
    // The reference parser: what Prometheus itself would refuse.
    promtool_check_rules(&json!({"groups": groups}), count);
}

//! The chart's alert rules (`prometheusRule.enabled`), checked by promtool
//! (`scripts/install-promtool.sh`): `check rules` accepts them, and under
//! `test rules` each alert fires on what it is for and stays quiet otherwise.

use std::process::Command;

use serde_json::{Value, json};
use switchyard_testkit::promtool_binary;

use crate::support::{NATS_URL, kind, render};

const RUNBOOKS: &str = "https://runbooks.example/switchyard.md";

/// Two groups of series, a sample a minute. In the first, the stack-assigner passes
/// over a record that is no envelope at minute 11; the claim-allocator met
/// two forged records while it rebuilt, before the window, and none since
/// (its counter stays at 2): only the first is news.
const TESTS: &str = r#"
rule_files: [rules.yaml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - series: 'switchyard_log_records_passed_over_total{namespace="switchyard-system",pod="sa-0",service="stack-assigner",reason="malformed"}'
        values: '0x10 1x30'
      - series: 'switchyard_log_records_passed_over_total{namespace="switchyard-system",pod="ca-0",service="claim-allocator",reason="unauthenticated"}'
        values: '2x40'
    alert_rule_test:
      - eval_time: 10m
        alertname: D8GpuMigrationLogRecordPassedOver
        exp_alerts: []
      - eval_time: 12m
        alertname: D8GpuMigrationLogRecordPassedOver
        exp_alerts:
          - exp_labels:
              severity: warning
              namespace: switchyard-system
              pod: sa-0
              service: stack-assigner
              reason: malformed
            exp_annotations:
              summary: stack-assigner passed over records of the migration log (malformed)
              description: 'stack-assigner (switchyard-system/sa-0) passed over 1 record(s) of the migration log in the last 15 minutes as malformed: something other than Switchyard''s services published on the log''s subjects, a record is signed by another key than its author''s, or a service runs an older build than the log''s writers. Run switchyard log verify to name them.'
              runbook_url: https://runbooks.example/switchyard.md#d8gpumigrationlogrecordpassedover
      - eval_time: 27m
        alertname: D8GpuMigrationLogRecordPassedOver
        exp_alerts: []
  # The alerter raises the hold on gpu-legacy at minute 5 and clears it at
  # minute 20 (its series goes); another alert of the alerter's is not this one.
  - interval: 1m
    input_series:
      - series: 'switchyard_alert_firing{namespace="switchyard-system",pod="al-0",alert="D8GpuNodeGroupHeldOnDra",node_group="gpu-legacy"}'
        values: '_x4 1x15'
      - series: 'switchyard_alert_firing{namespace="switchyard-system",pod="al-0",alert="SomethingElse",node_group="gpu"}'
        values: '1x30'
    alert_rule_test:
      - eval_time: 3m
        alertname: D8GpuNodeGroupHeldOnDra
        exp_alerts: []
      - eval_time: 10m
        alertname: D8GpuNodeGroupHeldOnDra
        exp_alerts:
          - exp_labels:
              severity: warning
              node_group: gpu-legacy
            exp_annotations:
              summary: Node group gpu-legacy has spec.gpu and is held on DRA after the module upgrade
              description: 'The module found spec.gpu on node group gpu-legacy when the new version first ran with dra.enabled, and keeps the group on DRA so that its running claims are not moved to the device plugin. Removing spec.gpu releases it: the group stays on DRA and the alert clears. To move the group to the device plugin, drain its nodes, remove spec.gpu, wait for this alert to clear, then set spec.gpu again.'
              runbook_url: https://runbooks.example/switchyard.md#d8gpunodegroupheldondra
      - eval_time: 27m
        alertname: D8GpuNodeGroupHeldOnDra
        exp_alerts: []
"#;

/// Every alerting rule of the rendered PrometheusRule.
fn alerts(rule: &Value) -> Vec<&Value> {
    rule["spec"]["groups"]
        .as_array()
        .expect("the rule's groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("a group's rules"))
        .filter(|r| r.get("alert").is_some())
        .collect()
}

fn promtool(dir: &std::path::Path, args: &[&str]) {
    let promtool = promtool_binary().unwrap_or_else(|e| panic!("{e}"));
    let out = Command::new(&promtool)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", promtool.display()));
    assert!(
        out.status.success(),
        "promtool {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_alerts_fire_on_what_they_are_for_and_only_then() {
    // Off by default: the PrometheusRule CRD is the Prometheus Operator's.
    assert!(
        render(&[NATS_URL])
            .iter()
            .all(|doc| kind(doc) != "PrometheusRule")
    );
    let docs = render(&[
        NATS_URL,
        "prometheusRule.enabled=true",
        "prometheusRule.labels.release=kube-prometheus-stack",
        &format!("prometheusRule.runbookBaseUrl={RUNBOOKS}"),
    ]);
    let rules: Vec<&Value> = docs
        .iter()
        .filter(|doc| kind(doc) == "PrometheusRule")
        .collect();
    let [rule] = rules[..] else {
        panic!("one PrometheusRule: {rules:?}")
    };
    assert_eq!(
        rule["metadata"]["labels"]["release"], "kube-prometheus-stack",
        "the release label a Prometheus Operator selects rules by"
    );
    let alerts = alerts(rule);
    assert!(!alerts.is_empty());
    for alert in &alerts {
        let name = alert["alert"].as_str().unwrap();
        assert_eq!(
            alert["annotations"]["runbook_url"],
            format!("{RUNBOOKS}#{}", name.to_lowercase()),
            "{name}'s runbook"
        );
        let runbooks = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/runbooks.md"),
        )
        .expect("docs/runbooks.md");
        assert!(
            runbooks.contains(&format!("\n## {name}\n")),
            "docs/runbooks.md has no section for {name}"
        );
    }

    let dir = tempfile::tempdir().expect("a temporary directory");
    let groups = json!({"groups": rule["spec"]["groups"]});
    std::fs::write(
        dir.path().join("rules.yaml"),
        serde_yaml_ng::to_string(&groups).expect("the rules as YAML"),
    )
    .expect("write the rules");
    std::fs::write(dir.path().join("test.yaml"), TESTS).expect("write the tests");
    promtool(dir.path(), &["check", "rules", "rules.yaml"]);
    promtool(dir.path(), &["test", "rules", "test.yaml"]);
}

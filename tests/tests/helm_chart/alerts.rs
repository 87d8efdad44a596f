//! The chart's alert rules (`prometheusRule.enabled`), checked by promtool
//! (`scripts/install-promtool.sh`): `check rules` accepts them, and under
//! `test rules` each alert fires on what it is for and stays quiet otherwise
//! (before its `for`, on healthy or other series, once it clears). Every
//! alert has a runbook in docs/runbooks.md, and its thresholds come from
//! `prometheusRule.thresholds`. The alerts are the alerter core's
//! (`switchyard_core::alerter::rules`): the rule, the alerter's delays and
//! docs/operations/metrics-and-alerts.md are checked against its table.

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;

use promql_parser::parser;
use serde_json::{Value, json};
use switchyard_core::alerter::rules::{self, RULES, Severity, THRESHOLDS, Threshold};
use switchyard_testkit::promtool_binary;

use crate::monitoring::container_env;
use crate::support::{NATS_URL, chart_dir, kind, render, template};

const RUNBOOKS: &str = "https://runbooks.example/switchyard.md";

/// The stack-assigner passes over a record that is no envelope at minute 11;
/// the claim-allocator met two forged records while it rebuilt, before the
/// window, and none since (its counter stays at 2): only the first is news.
const RECORD_PASSED_OVER: &str = r#"
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
"#;

/// The stack-assigner reads up to minute 10, then nothing while 3 records
/// wait (from minute 11) until it reads again at minute 40. The
/// claim-allocator reads all along but is 1500 behind from minute 11 to 31.
/// The alerter is caught up and reads nothing; the class-compiler is 5
/// behind but reading.
const LOG_LAGGING: &str = r#"
  - interval: 1m
    input_series:
      - series: 'switchyard_log_sequence{namespace="switchyard-system",pod="sa-0",service="stack-assigner"}'
        values: '100+5x10 150x29 151+1x20'
      - series: 'switchyard_log_lag_records{namespace="switchyard-system",pod="sa-0",service="stack-assigner"}'
        values: '0x10 3x29 0x20'
      - series: 'switchyard_log_sequence{namespace="switchyard-system",pod="ca-0",service="claim-allocator"}'
        values: '0+100x60'
      - series: 'switchyard_log_lag_records{namespace="switchyard-system",pod="ca-0",service="claim-allocator"}'
        values: '0x10 1500x20 0x30'
      - series: 'switchyard_log_sequence{namespace="switchyard-system",pod="al-0",service="alerter"}'
        values: '150x60'
      - series: 'switchyard_log_lag_records{namespace="switchyard-system",pod="al-0",service="alerter"}'
        values: '0x60'
      - series: 'switchyard_log_sequence{namespace="switchyard-system",pod="cc-0",service="class-compiler"}'
        values: '0+10x60'
      - series: 'switchyard_log_lag_records{namespace="switchyard-system",pod="cc-0",service="class-compiler"}'
        values: '5x60'
    alert_rule_test:
      - eval_time: 15m
        alertname: D8GpuMigrationLogLagging
        exp_alerts: []
      - eval_time: 16m
        alertname: D8GpuMigrationLogLagging
        exp_alerts:
          - exp_labels:
              severity: warning
              namespace: switchyard-system
              pod: ca-0
              service: claim-allocator
            exp_annotations:
              summary: claim-allocator is 1500 record(s) behind the migration log
              description: 'claim-allocator (switchyard-system/ca-0) has not read 1500 record(s) appended to the migration log: it read none in the last 10m, or it is more than 1000 behind, for 5m. Until it catches up it decides on an old state of the migration. A service that reads nothing is stuck or cut off from NATS: read its log lines, then restart it. One that reads but stays behind is slower than the log''s writers.'
              runbook_url: https://runbooks.example/switchyard.md#d8gpumigrationloglagging
      - eval_time: 26m
        alertname: D8GpuMigrationLogLagging
        exp_alerts:
          - exp_labels:
              severity: warning
              namespace: switchyard-system
              pod: ca-0
              service: claim-allocator
            exp_annotations:
              summary: claim-allocator is 1500 record(s) behind the migration log
              description: 'claim-allocator (switchyard-system/ca-0) has not read 1500 record(s) appended to the migration log: it read none in the last 10m, or it is more than 1000 behind, for 5m. Until it catches up it decides on an old state of the migration. A service that reads nothing is stuck or cut off from NATS: read its log lines, then restart it. One that reads but stays behind is slower than the log''s writers.'
              runbook_url: https://runbooks.example/switchyard.md#d8gpumigrationloglagging
          - exp_labels:
              severity: warning
              namespace: switchyard-system
              pod: sa-0
              service: stack-assigner
            exp_annotations:
              summary: stack-assigner is 3 record(s) behind the migration log
              description: 'stack-assigner (switchyard-system/sa-0) has not read 3 record(s) appended to the migration log: it read none in the last 10m, or it is more than 1000 behind, for 5m. Until it catches up it decides on an old state of the migration. A service that reads nothing is stuck or cut off from NATS: read its log lines, then restart it. One that reads but stays behind is slower than the log''s writers.'
              runbook_url: https://runbooks.example/switchyard.md#d8gpumigrationloglagging
      - eval_time: 45m
        alertname: D8GpuMigrationLogLagging
        exp_alerts: []
"#;

/// The alerter raises the hold on gpu-legacy at minute 5 and clears it at
/// minute 20 (its series goes); another alert of the alerter's is not this one.
const HELD_ON_DRA: &str = r#"
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

/// gpu-3's drain step (begun at 1 min) is recorded stalled at minute 31 and
/// ends at minute 52. gpu-4's rollback waits for readiness from minute 10,
/// never recorded stalled: it is older than an hour from minute 70.
const HANDOVER_STALLED: &str = r#"
  - interval: 1m
    input_series:
      - series: 'switchyard_handover_step_started_timestamp_seconds{namespace="switchyard-system",pod="al-0",handover="h-gpu-3",node="gpu-3",source_group="gpu",target_group="gpu-dra",step="drain",stalled="false",rollback="false"}'
        values: '60x30 stale'
      - series: 'switchyard_handover_step_started_timestamp_seconds{namespace="switchyard-system",pod="al-0",handover="h-gpu-3",node="gpu-3",source_group="gpu",target_group="gpu-dra",step="drain",stalled="true",rollback="false"}'
        values: '_x31 60x20 stale'
      - series: 'switchyard_handover_step_started_timestamp_seconds{namespace="switchyard-system",pod="al-0",handover="rb-gpu-4",node="gpu-4",source_group="gpu-dra",target_group="gpu",step="wait_ready",stalled="false",rollback="true"}'
        values: '600x90'
    alert_rule_test:
      - eval_time: 30m
        alertname: D8GpuHandoverStalled
        exp_alerts: []
      - eval_time: 31m
        alertname: D8GpuHandoverStalled
        exp_alerts:
          - exp_labels:
              severity: warning
              handover: h-gpu-3
              node: gpu-3
              source_group: gpu
              target_group: gpu-dra
              step: drain
              rollback: 'false'
            exp_annotations:
              summary: The handover of node gpu-3 to gpu-dra is stuck at step drain
              description: 'Handover h-gpu-3 of node gpu-3 from group gpu to gpu-dra began step drain 30m 0s ago: the stack-assigner recorded it stalled, or the step is older than 1h. The node is out of service until the handover ends. switchyard status names what it waits for (evictions a PodDisruptionBudget refuses, readiness conditions missing); fix that and the handover goes on, or roll the node back with switchyard rollback node.'
              runbook_url: https://runbooks.example/switchyard.md#d8gpuhandoverstalled
      - eval_time: 70m
        alertname: D8GpuHandoverStalled
        exp_alerts: []
      - eval_time: 71m
        alertname: D8GpuHandoverStalled
        exp_alerts:
          - exp_labels:
              severity: warning
              handover: rb-gpu-4
              node: gpu-4
              source_group: gpu-dra
              target_group: gpu
              step: wait_ready
              rollback: 'true'
            exp_annotations:
              summary: The handover of node gpu-4 to gpu is stuck at step wait_ready
              description: 'Handover rb-gpu-4 (a rollback) of node gpu-4 from group gpu-dra to gpu began step wait_ready 1h 1m 0s ago: the stack-assigner recorded it stalled, or the step is older than 1h. The node is out of service until the handover ends. switchyard status names what it waits for (evictions a PodDisruptionBudget refuses, readiness conditions missing); fix that and the handover goes on, or roll the node back with switchyard rollback node.'
              runbook_url: https://runbooks.example/switchyard.md#d8gpuhandoverstalled
"#;

/// ml/train's move starts at minute 2 and is verified at minute 80; ml/infer's
/// starts at minute 30. The series carry the workload's namespace (the
/// PodMonitor honors it) and the alerter's pod.
const MOVE_STALLED: &str = r#"
  - interval: 1m
    input_series:
      - series: 'switchyard_move_started_timestamp_seconds{namespace="ml",pod="al-0",move="m-train",workload="train",source_group="gpu",target_group="gpu-dra",gpu_class="a100",rollback="false"}'
        values: '120x80 stale'
      - series: 'switchyard_move_started_timestamp_seconds{namespace="ml",pod="al-0",move="m-infer",workload="infer",source_group="gpu",target_group="gpu-dra",gpu_class="a100",rollback="false"}'
        values: '1800x90'
    alert_rule_test:
      - eval_time: 62m
        alertname: D8GpuApplicationMoveStalled
        exp_alerts: []
      - eval_time: 63m
        alertname: D8GpuApplicationMoveStalled
        exp_alerts:
          - exp_labels:
              severity: warning
              move: m-train
              namespace: ml
              workload: train
              source_group: gpu
              target_group: gpu-dra
              gpu_class: a100
              rollback: 'false'
            exp_annotations:
              summary: The move of ml/train to gpu-dra has not finished
              description: 'Move m-train of workload ml/train from group gpu to gpu-dra (class a100) started 1h 1m 0s ago, more than 1h, and is not verified: its pods do not run on the target group with their claims allocated. Pods Pending for want of free devices there need the next node handed over; switchyard explain pod says why a pod does not fit. switchyard rollback app restores the workload.'
              runbook_url: https://runbooks.example/switchyard.md#d8gpuapplicationmovestalled
      - eval_time: 85m
        alertname: D8GpuApplicationMoveStalled
        exp_alerts: []
"#;

/// gpu-3 (group gpu-new) is on no stack until it gets DRA at minute 31;
/// gpu-6 (no group) stays on none; gpu-4 passes through none in its
/// handover; gpu-5 is on DRA; gpu-7 is opted out and gpu-8 a control-plane
/// node, on none on purpose.
const SERVED_BY_NO_STACK: &str = r#"
  - interval: 1m
    input_series:
      - series: 'switchyard_gpu_node{namespace="switchyard-system",pod="al-0",node="gpu-3",node_group="gpu-new",stack="none",handover_step="none",stack_reason="no_spec_gpu_dra_disabled"}'
        values: '1x30 stale'
      - series: 'switchyard_gpu_node{namespace="switchyard-system",pod="al-0",node="gpu-3",node_group="gpu-new",stack="dra",handover_step="none",stack_reason="dra_enabled"}'
        values: '_x31 1x20'
      - series: 'switchyard_gpu_node{namespace="switchyard-system",pod="al-0",node="gpu-6",node_group="",stack="none",handover_step="none",stack_reason="feature_gates_not_ready"}'
        values: '_x10 1x40'
      - series: 'switchyard_gpu_node{namespace="switchyard-system",pod="al-0",node="gpu-4",node_group="gpu-dra",stack="none",handover_step="move_group",stack_reason="no_spec_gpu_dra_disabled"}'
        values: '1x50'
      - series: 'switchyard_gpu_node{namespace="switchyard-system",pod="al-0",node="gpu-5",node_group="gpu-dra",stack="dra",handover_step="none",stack_reason="dra_enabled"}'
        values: '1x50'
      - series: 'switchyard_gpu_node{namespace="switchyard-system",pod="al-0",node="gpu-7",node_group="gpu-new",stack="none",handover_step="none",stack_reason="gpu_disabled_label"}'
        values: '1x50'
      - series: 'switchyard_gpu_node{namespace="switchyard-system",pod="al-0",node="gpu-8",node_group="master",stack="none",handover_step="none",stack_reason="control_plane"}'
        values: '1x50'
      - series: 'switchyard_gpu_node{namespace="switchyard-system",pod="al-0",node="gpu-9",node_group="",stack="none",handover_step="none",stack_reason="no_gpu_present"}'
        values: '1x50'
    alert_rule_test:
      - eval_time: 14m
        alertname: D8GpuNodeServedByNoStack
        exp_alerts: []
      - eval_time: 16m
        alertname: D8GpuNodeServedByNoStack
        exp_alerts:
          - exp_labels:
              severity: warning
              node: gpu-3
              node_group: gpu-new
              stack_reason: no_spec_gpu_dra_disabled
            exp_annotations:
              summary: 'No GPU stack serves node gpu-3: its cards sit idle'
              description: 'Node gpu-3 (group gpu-new) has GPUs, and neither the device plugin nor DRA has served it for 15m, outside a handover: no workload can use its cards. Why (no_spec_gpu_dra_disabled): no_spec_gpu_dra_disabled — its group has no spec.gpu while dra.enabled is off; feature_gates_not_ready — the feature gates DRA needs are not ready (see the module status). Give the group spec.gpu, turn dra.enabled on, or hand the node over to a group a stack serves; switchyard doctor names the cause. Nodes kept off on purpose (control plane, gpu.deckhouse.io/enabled=false) do not fire.'
              runbook_url: https://runbooks.example/switchyard.md#d8gpunodeservedbynostack
      - eval_time: 40m
        alertname: D8GpuNodeServedByNoStack
        exp_alerts:
          - exp_labels:
              severity: warning
              node: gpu-6
              stack_reason: feature_gates_not_ready
            exp_annotations:
              summary: 'No GPU stack serves node gpu-6: its cards sit idle'
              description: 'Node gpu-6 (in no node group) has GPUs, and neither the device plugin nor DRA has served it for 15m, outside a handover: no workload can use its cards. Why (feature_gates_not_ready): no_spec_gpu_dra_disabled — its group has no spec.gpu while dra.enabled is off; feature_gates_not_ready — the feature gates DRA needs are not ready (see the module status). Give the group spec.gpu, turn dra.enabled on, or hand the node over to a group a stack serves; switchyard doctor names the cause. Nodes kept off on purpose (control plane, gpu.deckhouse.io/enabled=false) do not fire.'
              runbook_url: https://runbooks.example/switchyard.md#d8gpunodeservedbynostack
"#;

/// gpu-3 lacks Ready PhysicalGPUs until minute 40, outside a handover. gpu-4
/// lacks gpu-setup-complete all along, but waits for it in a handover until
/// its handover ends at minute 30.
const DRA_NOT_READY: &str = r#"
  - interval: 1m
    input_series:
      - series: 'switchyard_gpu_node_dra_missing{namespace="switchyard-system",pod="al-0",node="gpu-3",node_group="gpu-dra",condition="physical_gpus_ready"}'
        values: '1x40 stale'
      - series: 'switchyard_gpu_node{namespace="switchyard-system",pod="al-0",node="gpu-3",node_group="gpu-dra",stack="dra",handover_step="none"}'
        values: '1x60'
      - series: 'switchyard_gpu_node_dra_missing{namespace="switchyard-system",pod="al-0",node="gpu-4",node_group="gpu-dra",condition="gpu_setup_complete"}'
        values: '1x60'
      - series: 'switchyard_gpu_node{namespace="switchyard-system",pod="al-0",node="gpu-4",node_group="gpu-dra",stack="dra",handover_step="wait_ready"}'
        values: '1x30 stale'
      - series: 'switchyard_gpu_node{namespace="switchyard-system",pod="al-0",node="gpu-4",node_group="gpu-dra",stack="dra",handover_step="none"}'
        values: '_x31 1x30'
    alert_rule_test:
      - eval_time: 14m
        alertname: D8GpuNodeDraNotReady
        exp_alerts: []
      - eval_time: 16m
        alertname: D8GpuNodeDraNotReady
        exp_alerts:
          - exp_labels:
              severity: warning
              node: gpu-3
              node_group: gpu-dra
              condition: physical_gpus_ready
            exp_annotations:
              summary: 'DRA is not ready on node gpu-3: physical_gpus_ready'
              description: 'Node gpu-3 (group gpu-dra) is put on DRA, but for 15m not every card has a PhysicalGPU in the Ready phase. DRA workloads are not scheduled to its cards until it is ready. switchyard doctor names the cause (the opt-out label, feature gates not ready); the module status has the reason.'
              runbook_url: https://runbooks.example/switchyard.md#d8gpunodedranotready
      - eval_time: 45m
        alertname: D8GpuNodeDraNotReady
        exp_alerts: []
      - eval_time: 47m
        alertname: D8GpuNodeDraNotReady
        exp_alerts:
          - exp_labels:
              severity: warning
              node: gpu-4
              node_group: gpu-dra
              condition: gpu_setup_complete
            exp_annotations:
              summary: 'DRA is not ready on node gpu-4: gpu_setup_complete'
              description: 'Node gpu-4 (group gpu-dra) is put on DRA, but for 15m the node.deckhouse.io/gpu-setup-complete label is missing: node preparation has not finished. DRA workloads are not scheduled to its cards until it is ready. switchyard doctor names the cause (the opt-out label, feature gates not ready); the module status has the reason.'
              runbook_url: https://runbooks.example/switchyard.md#d8gpunodedranotready
"#;

/// gpu-1, a device-plugin node, also publishes 8 devices in ResourceSlices
/// from minute 11 to 31. gpu-2 is a DRA node with slices and no device-plugin
/// GPUs.
const DUAL_ADVERTISEMENT: &str = r#"
  - interval: 1m
    input_series:
      - series: 'switchyard_gpu_node_device_plugin_gpus{namespace="switchyard-system",pod="al-0",node="gpu-1",node_group="gpu",stack="device-plugin"}'
        values: '8x60'
      - series: 'switchyard_gpu_node_slice_devices{namespace="switchyard-system",pod="al-0",node="gpu-1",node_group="gpu",stack="device-plugin"}'
        values: '0x10 8x20 0x30'
      - series: 'switchyard_gpu_node_device_plugin_gpus{namespace="switchyard-system",pod="al-0",node="gpu-2",node_group="gpu-dra",stack="dra"}'
        values: '0x60'
      - series: 'switchyard_gpu_node_slice_devices{namespace="switchyard-system",pod="al-0",node="gpu-2",node_group="gpu-dra",stack="dra"}'
        values: '8x60'
    alert_rule_test:
      - eval_time: 10m
        alertname: D8GpuNodeDualAdvertisement
        exp_alerts: []
      - eval_time: 15m
        alertname: D8GpuNodeDualAdvertisement
        exp_alerts: []
      - eval_time: 17m
        alertname: D8GpuNodeDualAdvertisement
        exp_alerts:
          - exp_labels:
              severity: critical
              node: gpu-1
              node_group: gpu
              stack: device-plugin
            exp_annotations:
              summary: Node gpu-1 advertises its GPUs through both the device plugin and DRA
              description: 'Node gpu-1 (group gpu, on device-plugin) has had 8 device-plugin GPU resource(s) allocatable and devices in ResourceSlices for 5m: a failed exclusivity gate. The device plugin and the DRA driver can allocate the same card twice. Stop scheduling new GPU workloads on the node (cordon it) until one allocator owns its cards, then remove the other stack''s plugin from the node.'
              runbook_url: https://runbooks.example/switchyard.md#d8gpunodedualadvertisement
      - eval_time: 40m
        alertname: D8GpuNodeDualAdvertisement
        exp_alerts: []
"#;

/// The device plugin advertises 4 GPUs on gpu-2, a DRA node, from minute 11
/// to 31; gpu-1 is a device-plugin node.
const DEVICE_PLUGIN_ON_DRA_NODE: &str = r#"
  - interval: 1m
    input_series:
      - series: 'switchyard_gpu_node_device_plugin_gpus{namespace="switchyard-system",pod="al-0",node="gpu-2",node_group="gpu-dra",stack="dra"}'
        values: '0x10 4x20 0x30'
      - series: 'switchyard_gpu_node_device_plugin_gpus{namespace="switchyard-system",pod="al-0",node="gpu-1",node_group="gpu",stack="device-plugin"}'
        values: '8x60'
    alert_rule_test:
      - eval_time: 15m
        alertname: D8GpuDevicePluginOnDraNode
        exp_alerts: []
      - eval_time: 17m
        alertname: D8GpuDevicePluginOnDraNode
        exp_alerts:
          - exp_labels:
              severity: critical
              node: gpu-2
              node_group: gpu-dra
            exp_annotations:
              summary: The device plugin advertises GPUs on DRA node gpu-2
              description: 'Node gpu-2 (group gpu-dra) is on DRA, yet 4 device-plugin GPU resource(s) have been allocatable on it for 5m: the device plugin reappeared. Treat it as a failed exclusivity gate: stop scheduling new DRA workloads on the node until the allocation owner is unambiguous, and find what runs the device plugin there (its DaemonSet''s node selector, the node''s labels).'
              runbook_url: https://runbooks.example/switchyard.md#d8gpudevicepluginondranode
      - eval_time: 40m
        alertname: D8GpuDevicePluginOnDraNode
        exp_alerts: []
"#;

/// GPU-aaa's PhysicalGPU on gpu-3 is Failed from minute 11 to 31. The node
/// agent on gpu-4 reports GPU-bbb (a Ready PhysicalGPU) unhealthy from
/// minute 21 to 41, and the one on gpu-5 GPU-ccc (no PhysicalGPU) from
/// minute 31; GPU-ddd stays healthy.
const UNHEALTHY: &str = r#"
  - interval: 1m
    input_series:
      - series: 'switchyard_physical_gpu{namespace="switchyard-system",pod="al-0",node="gpu-3",gpu="gpu-3-0",uuid="GPU-aaa",product="a100",phase="ready"}'
        values: '1x10 stale _x20 1x30'
      - series: 'switchyard_physical_gpu{namespace="switchyard-system",pod="al-0",node="gpu-3",gpu="gpu-3-0",uuid="GPU-aaa",product="a100",phase="failed"}'
        values: '_x11 1x20 stale'
      - series: 'switchyard_physical_gpu{namespace="switchyard-system",pod="al-0",node="gpu-4",gpu="gpu-4-1",uuid="GPU-bbb",product="a100",phase="ready"}'
        values: '1x70'
      - series: 'switchyard_node_agent_gpu_healthy{namespace="switchyard-system",pod="na-gpu-4",uuid="GPU-bbb",index="1"}'
        values: '1x20 0x20 1x20'
      - series: 'switchyard_node_agent_gpu_healthy{namespace="switchyard-system",pod="na-gpu-4",uuid="GPU-ddd",index="0"}'
        values: '1x70'
      - series: 'switchyard_node_agent_gpu_healthy{namespace="switchyard-system",pod="na-gpu-5",uuid="GPU-ccc",index="0"}'
        values: '1x30 0x30'
    alert_rule_test:
      - eval_time: 15m
        alertname: D8GpuUnhealthy
        exp_alerts: []
      - eval_time: 16m
        alertname: D8GpuUnhealthy
        exp_alerts:
          - exp_labels:
              severity: warning
              node: gpu-3
              gpu: gpu-3-0
              uuid: GPU-aaa
            exp_annotations:
              summary: GPU GPU-aaa on node gpu-3 is unhealthy
              description: 'PhysicalGPU gpu-3-0 on node gpu-3 (GPU-aaa) has been in the Failed phase or reported unhealthy by the node agent for 5m. The device plugin no longer lists it and its DRA device is tainted, so no new workload gets it; what runs on it may fail. Look at the card on the node (nvidia-smi -q, Xid errors in the kernel log), then drain the node to reset or replace it.'
              runbook_url: https://runbooks.example/switchyard.md#d8gpuunhealthy
      - eval_time: 36m
        alertname: D8GpuUnhealthy
        exp_alerts:
          - exp_labels:
              severity: warning
              node: gpu-4
              gpu: gpu-4-1
              uuid: GPU-bbb
            exp_annotations:
              summary: GPU GPU-bbb on node gpu-4 is unhealthy
              description: 'PhysicalGPU gpu-4-1 on node gpu-4 (GPU-bbb) has been in the Failed phase or reported unhealthy by the node agent for 5m. The device plugin no longer lists it and its DRA device is tainted, so no new workload gets it; what runs on it may fail. Look at the card on the node (nvidia-smi -q, Xid errors in the kernel log), then drain the node to reset or replace it.'
              runbook_url: https://runbooks.example/switchyard.md#d8gpuunhealthy
          - exp_labels:
              severity: warning
              namespace: switchyard-system
              pod: na-gpu-5
              uuid: GPU-ccc
              index: '0'
            exp_annotations:
              summary: GPU GPU-ccc is unhealthy
              description: 'GPU 0 of the node of node agent switchyard-system/na-gpu-5 (GPU-ccc) has been in the Failed phase or reported unhealthy by the node agent for 5m. The device plugin no longer lists it and its DRA device is tainted, so no new workload gets it; what runs on it may fail. Look at the card on the node (nvidia-smi -q, Xid errors in the kernel log), then drain the node to reset or replace it.'
              runbook_url: https://runbooks.example/switchyard.md#d8gpuunhealthy
      - eval_time: 55m
        alertname: D8GpuUnhealthy
        exp_alerts:
          - exp_labels:
              severity: warning
              namespace: switchyard-system
              pod: na-gpu-5
              uuid: GPU-ccc
              index: '0'
            exp_annotations:
              summary: GPU GPU-ccc is unhealthy
              description: 'GPU 0 of the node of node agent switchyard-system/na-gpu-5 (GPU-ccc) has been in the Failed phase or reported unhealthy by the node agent for 5m. The device plugin no longer lists it and its DRA device is tainted, so no new workload gets it; what runs on it may fail. Look at the card on the node (nvidia-smi -q, Xid errors in the kernel log), then drain the node to reset or replace it.'
              runbook_url: https://runbooks.example/switchyard.md#d8gpuunhealthy
  # Before any card has been unhealthy for 5m, and on healthy cards alone.
  - interval: 1m
    input_series:
      - series: 'switchyard_physical_gpu{namespace="switchyard-system",pod="al-0",node="gpu-4",gpu="gpu-4-1",uuid="GPU-bbb",product="a100",phase="ready"}'
        values: '1x30'
      - series: 'switchyard_node_agent_gpu_healthy{namespace="switchyard-system",pod="na-gpu-4",uuid="GPU-bbb",index="1"}'
        values: '1x10 0x3 1x16'
    alert_rule_test:
      - eval_time: 20m
        alertname: D8GpuUnhealthy
        exp_alerts: []
"#;

/// ml/train-gpu is unallocated from minute 5 until minute 40; ml/infer-gpu
/// from minute 40.
const CLAIM_PENDING: &str = r#"
  - interval: 1m
    input_series:
      - series: 'switchyard_resource_claim_pending_since_timestamp_seconds{namespace="ml",pod="al-0",claim="train-gpu"}'
        values: '300x40 stale'
      - series: 'switchyard_resource_claim_pending_since_timestamp_seconds{namespace="ml",pod="al-0",claim="infer-gpu"}'
        values: '_x40 2400x20'
    alert_rule_test:
      - eval_time: 20m
        alertname: D8GpuResourceClaimPending
        exp_alerts: []
      - eval_time: 21m
        alertname: D8GpuResourceClaimPending
        exp_alerts:
          - exp_labels:
              severity: warning
              namespace: ml
              claim: train-gpu
            exp_annotations:
              summary: ResourceClaim ml/train-gpu has no device allocated
              description: 'ResourceClaim ml/train-gpu has been unallocated for 16m 0s, more than 15m, so the pods that use it stay Pending. There are no free devices of the requested kind in the target group (hand over the next node), or the class''s selector matches no published device. switchyard explain pod names why its pod fits no node and device.'
              runbook_url: https://runbooks.example/switchyard.md#d8gpuresourceclaimpending
      - eval_time: 45m
        alertname: D8GpuResourceClaimPending
        exp_alerts: []
"#;

/// ml/train-gpu, allocated on gpu-3, is reserved for no pod from minute 10
/// until minute 50; ml/other on gpu-4 from minute 50.
const CLAIM_UNUSED: &str = r#"
  - interval: 1m
    input_series:
      - series: 'switchyard_resource_claim_unused_since_timestamp_seconds{namespace="ml",pod="al-0",claim="train-gpu",node="gpu-3"}'
        values: '600x50 stale'
      - series: 'switchyard_resource_claim_unused_since_timestamp_seconds{namespace="ml",pod="al-0",claim="other",node="gpu-4"}'
        values: '_x50 3000x30'
    alert_rule_test:
      - eval_time: 40m
        alertname: D8GpuResourceClaimUnused
        exp_alerts: []
      - eval_time: 41m
        alertname: D8GpuResourceClaimUnused
        exp_alerts:
          - exp_labels:
              severity: warning
              namespace: ml
              claim: train-gpu
              node: gpu-3
            exp_annotations:
              summary: ResourceClaim ml/train-gpu holds devices on gpu-3 that no pod uses
              description: 'ResourceClaim ml/train-gpu is allocated on node gpu-3 and has been reserved for no pending or running pod for 31m 0s, more than 30m: its devices are held and nobody uses them. A claim outlived the pods it was made for, or was created by hand. Delete it if nothing will use it again.'
              runbook_url: https://runbooks.example/switchyard.md#d8gpuresourceclaimunused
      - eval_time: 70m
        alertname: D8GpuResourceClaimUnused
        exp_alerts: []
"#;

/// D8GpuHandoverStalled with `handoverStepAge=2h`: gpu-3's drain step
/// begins at minute 1 and is never recorded stalled.
const HANDOVER_STALLED_AFTER_TWO_HOURS: &str = r#"
  - interval: 1m
    input_series:
      - series: 'switchyard_handover_step_started_timestamp_seconds{namespace="switchyard-system",pod="al-0",handover="h-gpu-3",node="gpu-3",source_group="gpu",target_group="gpu-dra",step="drain",stalled="false",rollback="false"}'
        values: '60x130'
    alert_rule_test:
      - eval_time: 90m
        alertname: D8GpuHandoverStalled
        exp_alerts: []
      - eval_time: 122m
        alertname: D8GpuHandoverStalled
        exp_alerts:
          - exp_labels:
              severity: warning
              handover: h-gpu-3
              node: gpu-3
              source_group: gpu
              target_group: gpu-dra
              step: drain
              rollback: 'false'
            exp_annotations:
              summary: The handover of node gpu-3 to gpu-dra is stuck at step drain
              description: 'Handover h-gpu-3 of node gpu-3 from group gpu to gpu-dra began step drain 2h 1m 0s ago: the stack-assigner recorded it stalled, or the step is older than 2h. The node is out of service until the handover ends. switchyard status names what it waits for (evictions a PodDisruptionBudget refuses, readiness conditions missing); fix that and the handover goes on, or roll the node back with switchyard rollback node.'
              runbook_url: https://runbooks.example/switchyard.md#d8gpuhandoverstalled
"#;

/// Every alert's promtool cases.
const CASES: [&str; 12] = [
    RECORD_PASSED_OVER,
    LOG_LAGGING,
    HELD_ON_DRA,
    HANDOVER_STALLED,
    MOVE_STALLED,
    SERVED_BY_NO_STACK,
    DRA_NOT_READY,
    DUAL_ADVERTISEMENT,
    DEVICE_PLUGIN_ON_DRA_NODE,
    UNHEALTHY,
    CLAIM_PENDING,
    CLAIM_UNUSED,
];

/// promtool's test file for `cases`, against rules.yaml, a sample a minute.
fn test_file(cases: &str) -> String {
    format!("rule_files: [rules.yaml]\nevaluation_interval: 1m\ntests:{cases}")
}

/// The one PrometheusRule rendered with the alerts on and `sets`.
fn rendered_rule(sets: &[&str]) -> Value {
    let base = [
        NATS_URL,
        "prometheusRule.enabled=true",
        "prometheusRule.labels.release=kube-prometheus-stack",
    ];
    let runbooks = format!("prometheusRule.runbookBaseUrl={RUNBOOKS}");
    let mut all: Vec<&str> = base.to_vec();
    all.push(&runbooks);
    all.extend(sets);
    let docs = render(&all);
    let rules: Vec<&Value> = docs
        .iter()
        .filter(|doc| kind(doc) == "PrometheusRule")
        .collect();
    let [rule] = rules[..] else {
        panic!("one PrometheusRule: {rules:?}")
    };
    rule.clone()
}

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

/// The alerting rule named `name`.
fn alert<'a>(rule: &'a Value, name: &str) -> &'a Value {
    alerts(rule)
        .into_iter()
        .find(|a| a["alert"] == name)
        .unwrap_or_else(|| panic!("no alert {name} in the rule"))
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

/// `promtool check rules` on `rule`'s groups, then `promtool test rules` with
/// `cases` against them.
fn check_and_test(rule: &Value, cases: &str) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let groups = json!({"groups": rule["spec"]["groups"]});
    std::fs::write(
        dir.path().join("rules.yaml"),
        serde_yaml_ng::to_string(&groups).expect("the rules as YAML"),
    )
    .expect("write the rules");
    std::fs::write(dir.path().join("test.yaml"), test_file(cases)).expect("write the tests");
    promtool(dir.path(), &["check", "rules", "rules.yaml"]);
    promtool(dir.path(), &["test", "rules", "test.yaml"]);
}

/// The chart's rule, as rendered with the default thresholds, under `cases`.
fn promtool_test(cases: &str) {
    check_and_test(&rendered_rule(&[]), cases);
}

#[test]
fn every_alert_has_a_runbook_and_cases_where_it_fires_and_where_it_does_not() {
    // Off by default: the PrometheusRule CRD is the Prometheus Operator's.
    assert!(
        render(&[NATS_URL])
            .iter()
            .all(|doc| kind(doc) != "PrometheusRule")
    );
    let rule = rendered_rule(&[]);
    assert_eq!(
        rule["metadata"]["labels"]["release"], "kube-prometheus-stack",
        "the release label a Prometheus Operator selects rules by"
    );
    let runbooks = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/runbooks.md"),
    )
    .expect("docs/runbooks.md");
    let alerts = alerts(&rule);
    assert!(!alerts.is_empty());
    // What the cases expect, per alert name: firing, and quiet.
    let (mut firing, mut quiet) = (BTreeSet::new(), BTreeSet::new());
    for cases in CASES {
        let file: Value = serde_yaml_ng::from_str(&test_file(cases)).expect("promtool's test file");
        for test in file["tests"].as_array().expect("tests") {
            for case in test["alert_rule_test"].as_array().expect("alert_rule_test") {
                let name = case["alertname"].as_str().unwrap().to_owned();
                let expected = case["exp_alerts"].as_array().expect("exp_alerts");
                if expected.is_empty() {
                    quiet.insert(name);
                } else {
                    firing.insert(name);
                }
            }
        }
    }
    for alert in &alerts {
        let name = alert["alert"].as_str().unwrap();
        assert_eq!(
            alert["annotations"]["runbook_url"],
            format!("{RUNBOOKS}#{}", name.to_lowercase()),
            "{name}'s runbook"
        );
        assert!(
            runbooks.contains(&format!("\n## {name}\n")),
            "docs/runbooks.md has no section for {name}"
        );
        for annotation in ["summary", "description"] {
            assert!(
                alert["annotations"][annotation]
                    .as_str()
                    .is_some_and(|text| !text.is_empty()),
                "{name} has no {annotation}"
            );
        }
        assert!(
            ["warning", "critical"].contains(&alert["labels"]["severity"].as_str().unwrap_or("")),
            "{name}'s severity"
        );
        assert!(firing.contains(name), "no promtool case where {name} fires");
        assert!(
            quiet.contains(name),
            "no promtool case where {name} is quiet"
        );
    }
}

#[test]
fn a_record_passed_over_fires_once_and_a_rebuild_does_not() {
    promtool_test(RECORD_PASSED_OVER);
}

#[test]
fn a_service_behind_the_log_fires_when_it_reads_nothing_or_stays_far_behind() {
    promtool_test(LOG_LAGGING);
}

#[test]
fn a_held_group_fires_while_the_alerter_raises_it() {
    promtool_test(HELD_ON_DRA);
}

#[test]
fn a_handover_fires_when_recorded_stalled_or_its_step_is_too_old() {
    promtool_test(HANDOVER_STALLED);
}

#[test]
fn an_application_move_fires_when_it_is_not_verified_in_time() {
    promtool_test(MOVE_STALLED);
}

#[test]
fn a_node_served_by_no_stack_fires_outside_a_handover() {
    promtool_test(SERVED_BY_NO_STACK);
}

#[test]
fn a_node_on_dra_fires_per_missing_condition_outside_a_handover() {
    promtool_test(DRA_NOT_READY);
}

#[test]
fn a_node_advertising_through_both_stacks_fires() {
    promtool_test(DUAL_ADVERTISEMENT);
}

#[test]
fn the_device_plugin_on_a_dra_node_fires() {
    promtool_test(DEVICE_PLUGIN_ON_DRA_NODE);
}

#[test]
fn an_unhealthy_or_failed_gpu_fires() {
    promtool_test(UNHEALTHY);
}

#[test]
fn a_claim_left_pending_fires() {
    promtool_test(CLAIM_PENDING);
}

#[test]
fn a_claim_reserved_for_no_pod_fires() {
    promtool_test(CLAIM_UNUSED);
}

#[test]
fn the_thresholds_come_from_values() {
    let defaults = rendered_rule(&[]);
    let rule = rendered_rule(&[
        "prometheusRule.thresholds.nodeServedByNoStackFor=2h",
        "prometheusRule.thresholds.nodeDraNotReadyFor=25m",
        "prometheusRule.thresholds.dualAdvertisementFor=90s",
        "prometheusRule.thresholds.devicePluginOnDraNodeFor=3m",
        "prometheusRule.thresholds.handoverStepAge=2h",
        "prometheusRule.thresholds.applicationMoveAge=1d",
        "prometheusRule.thresholds.resourceClaimPendingAge=45m",
        "prometheusRule.thresholds.resourceClaimUnusedAge=6h",
        "prometheusRule.thresholds.gpuUnhealthyFor=10m",
        "prometheusRule.thresholds.logNotAdvancingWindow=20m",
        "prometheusRule.thresholds.logLagRecords=250",
        "prometheusRule.thresholds.logLaggingFor=7m",
    ]);
    let expr = |rule: &Value, name: &str| alert(rule, name)["expr"].as_str().unwrap().to_owned();
    let held_for = |rule: &Value, name: &str| alert(rule, name)["for"].clone();
    // Each `for`, the default and as set.
    for (name, default, set) in [
        ("D8GpuNodeServedByNoStack", "15m", "2h"),
        ("D8GpuNodeDraNotReady", "15m", "25m"),
        ("D8GpuNodeDualAdvertisement", "5m", "90s"),
        ("D8GpuDevicePluginOnDraNode", "5m", "3m"),
        ("D8GpuUnhealthy", "5m", "10m"),
        ("D8GpuMigrationLogLagging", "5m", "7m"),
    ] {
        assert_eq!(held_for(&defaults, name), default, "{name}'s default for");
        assert_eq!(held_for(&rule, name), set, "{name}'s for as set");
        let description = alert(&rule, name)["annotations"]["description"]
            .as_str()
            .unwrap();
        assert!(
            description.contains(&format!(" {set}")),
            "{name}'s description names its for {set}: {description}"
        );
    }
    // Each age, in seconds against time(): the default and as set.
    for (name, default, set, set_as) in [
        ("D8GpuHandoverStalled", "> 3600", "> 7200", "2h"),
        ("D8GpuApplicationMoveStalled", "> 3600", "> 86400", "1d"),
        ("D8GpuResourceClaimPending", "> 900", "> 2700", "45m"),
        ("D8GpuResourceClaimUnused", "> 1800", "> 21600", "6h"),
    ] {
        assert!(
            expr(&defaults, name).contains(default),
            "{name} by default: {}",
            expr(&defaults, name)
        );
        assert!(
            expr(&rule, name).contains(set) && !expr(&rule, name).contains(default),
            "{name} as set: {}",
            expr(&rule, name)
        );
        let description = alert(&rule, name)["annotations"]["description"]
            .as_str()
            .unwrap();
        assert!(
            description.contains(&format!("older than {set_as}"))
                || description.contains(&format!("more than {set_as}")),
            "{name}'s description names its age {set_as}: {description}"
        );
    }
    // The lagging service: its window and how far behind.
    let lagging = expr(&defaults, "D8GpuMigrationLogLagging");
    assert!(
        lagging.contains("> 1000") && lagging.contains("[10m]"),
        "{lagging}"
    );
    let lagging = expr(&rule, "D8GpuMigrationLogLagging");
    assert!(
        lagging.contains("> 250") && lagging.contains("[20m]") && !lagging.contains("> 1000"),
        "{lagging}"
    );
    // promtool evaluates the rule as set: gpu-3's drain step, begun at
    // minute 1, is quiet at minute 90 (older than the default hour) and
    // fires past two hours.
    check_and_test(&rule, HANDOVER_STALLED_AFTER_TWO_HOURS);
}

/// PromQL as the rule has it, whitespace aside (a `|` block keeps its
/// line breaks and indentation).
fn promql(expr: &str) -> String {
    expr.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The rendered rule holds exactly the alerter core's alerts, each in its
/// group with its severity, summary, PromQL and `for:` — the thresholds'
/// defaults and values set in their place.
fn assert_rule_is_the_core_s(rule: &Value, threshold: impl Fn(&Threshold) -> String) {
    let mut in_chart = BTreeMap::new();
    for group in rule["spec"]["groups"]
        .as_array()
        .expect("the rule's groups")
    {
        let name = group["name"].as_str().expect("a group's name");
        for alert in group["rules"].as_array().expect("a group's rules") {
            let alert_name = alert["alert"].as_str().expect("only alerting rules");
            assert!(
                in_chart.insert(alert_name, (name, alert)).is_none(),
                "{alert_name} twice in the rule"
            );
        }
    }
    let core: BTreeSet<&str> = RULES.iter().map(|r| r.name).collect();
    assert_eq!(
        in_chart.keys().copied().collect::<BTreeSet<_>>(),
        core,
        "the chart's alerts are the alerter core's"
    );
    for core in RULES {
        let (group, alert) = in_chart[core.name];
        let name = core.name;
        assert_eq!(group, core.group, "{name}'s group");
        assert_eq!(
            alert["labels"]["severity"],
            core.severity.as_str(),
            "{name}'s severity"
        );
        assert_eq!(
            alert["annotations"]["summary"], core.summary,
            "{name}'s summary"
        );
        let expr = core.expr_with(&threshold).unwrap_or_else(|e| panic!("{e}"));
        parser::parse(&expr).unwrap_or_else(|e| panic!("{name}'s PromQL: {e}: {expr}"));
        assert_eq!(
            promql(alert["expr"].as_str().expect("an expr")),
            promql(&expr),
            "{name}'s expr"
        );
        assert_eq!(
            alert.get("for").and_then(Value::as_str).map(str::to_string),
            core.for_.as_ref().map(&threshold),
            "{name}'s for"
        );
    }
}

#[test]
fn the_rule_the_alerter_s_delays_and_the_docs_are_the_alerter_core_s_alerts() {
    assert_rule_is_the_core_s(&rendered_rule(&[]), |t| t.default.to_string());
    // Every threshold set to another value than its default.
    let set = |t: &Threshold| match t.key {
        "logLagRecords" => "250".to_string(),
        _ => format!("{}s", rules::seconds(t.default).expect("a duration") + 17),
    };
    let sets: Vec<String> = THRESHOLDS
        .iter()
        .map(|t| format!("prometheusRule.thresholds.{}={}", t.key, set(t)))
        .collect();
    let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
    assert_rule_is_the_core_s(&rendered_rule(&sets), set);

    // The chart's values hold the core's thresholds and defaults.
    let values: Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(chart_dir().join("values.yaml")).expect("the chart's values"),
    )
    .expect("values.yaml");
    let in_values: BTreeMap<String, String> = values["prometheusRule"]["thresholds"]
        .as_object()
        .expect("prometheusRule.thresholds")
        .iter()
        .map(|(k, v)| {
            let v = v.as_str().map_or_else(|| v.to_string(), str::to_string);
            (k.clone(), v)
        })
        .collect();
    let core: BTreeMap<String, String> = THRESHOLDS
        .iter()
        .map(|t| (t.key.to_string(), t.default.to_string()))
        .collect();
    assert_eq!(in_values, core, "prometheusRule.thresholds");

    // The module status waits each alert's for: the alerts of the log with
    // one, as the chart gives them to the alerter.
    let delays: Vec<String> = rules::from_log()
        .filter_map(|r| r.for_.map(|t| format!("{}={}", r.name, t.default)))
        .collect();
    let alerter = container_env(&render(&[NATS_URL]))
        .into_iter()
        .find(|(container, _)| container == "alerter")
        .map(|(_, env)| env)
        .expect("the alerter's container");
    assert!(
        alerter.contains(&("SWITCHYARD_ALERTS_FOR".to_string(), delays.join(","))),
        "{alerter:?}"
    );

    // The operator's table names every alert, the critical ones so.
    let docs = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../docs/operations/metrics-and-alerts.md"),
    )
    .expect("docs/operations/metrics-and-alerts.md");
    let table = docs
        .split_once("| alert | fires when |")
        .expect("the alerts' table")
        .1;
    let mut documented = BTreeMap::new();
    for row in table.lines().skip(2).take_while(|l| l.starts_with('|')) {
        let cell = row.split('|').nth(1).unwrap_or_default();
        let critical = cell.contains("(critical)");
        for name in cell.split('`').skip(1).step_by(2) {
            documented.insert(name.to_string(), critical);
        }
    }
    let core: BTreeMap<String, bool> = RULES
        .iter()
        .map(|r| (r.name.to_string(), r.severity == Severity::Critical))
        .collect();
    assert_eq!(
        documented, core,
        "the alerts docs/operations/metrics-and-alerts.md lists"
    );
}

#[test]
fn the_schema_refuses_thresholds_that_are_not_what_prometheus_reads() {
    for set in [
        "prometheusRule.thresholds.handoverStepAge=soon",
        "prometheusRule.thresholds.handoverStepAge=1h30m",
        "prometheusRule.thresholds.nodeServedByNoStackFor=0m",
        "prometheusRule.thresholds.gpuUnhealthyFor=5",
        "prometheusRule.thresholds.logLagRecords=0",
        "prometheusRule.thresholds.logLagRecords=many",
        "prometheusRule.thresholds.handoverStepAgee=1h",
    ] {
        let run = template(&[NATS_URL, "prometheusRule.enabled=true", set]);
        assert!(!run.ok, "helm template accepted {set}");
        assert!(
            run.stderr.contains("schema"),
            "{set} refused, but not by the schema: {}",
            run.stderr
        );
    }
}

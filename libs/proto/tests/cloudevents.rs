//! The CloudEvent type of every event kind, and the JSON Schemas of the
//! events' `data` held against what pbjson writes.

use std::collections::{BTreeMap, BTreeSet};

use prost::Message as _;
use prost_types::FileDescriptorSet;
use serde_json::{Value, json};
use switchyard_proto::schema::{DESCRIPTOR, event_schema, json_schema};
use switchyard_proto::v1::{self, EVENT_TYPES, domain_event::Kind};

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn mk_workload(name: &str) -> v1::WorkloadRef {
    v1::WorkloadRef {
        namespace: "ml".into(),
        kind: "Deployment".into(),
        name: name.into(),
    }
}

fn mk_taint(key: &str) -> v1::Taint {
    v1::Taint {
        key: key.into(),
        value: "true".into(),
        effect: "NoSchedule".into(),
    }
}

fn mk_placement(gpu: &str) -> v1::WorkloadPlacement {
    let limits = v1::ResourceList {
        quantities: labels(&[(gpu, "1")]),
    };
    v1::WorkloadPlacement {
        container_limits: [("trainer".to_string(), limits.clone())].into(),
        container_requests: [("trainer".to_string(), limits)].into(),
        node_selector: labels(&[("node.deckhouse.io/group", "gpu-a")]),
        tolerations: None,
    }
}

fn validator(schema: &Value) -> jsonschema::Validator {
    jsonschema::validator_for(schema).expect("the schema compiles")
}

/// The schema of the kind's CloudEvent `data` and the kind's message as
/// pbjson writes it.
fn schema_and_data(kind: Kind) -> (Value, Value) {
    let schema = event_schema(kind.cloudevent_type()).expect("every kind has a schema");
    let event = serde_json::to_value(v1::event(kind)).expect("pbjson writes the event");
    // DomainEvent's JSON is {"<oneof case>": <message>}.
    let data = event
        .as_object()
        .and_then(|cases| cases.values().next())
        .cloned()
        .expect("the event has its case");
    (schema, data)
}

fn assert_valid(schema: &Value, data: &Value) {
    let errors: Vec<String> = validator(schema)
        .iter_errors(data)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(
        errors.is_empty(),
        "{data} does not match {}: {errors:#?}",
        schema["title"]
    );
}

#[test]
fn event_types_list_every_case_of_the_domain_event_oneof_once() {
    let set = FileDescriptorSet::decode(DESCRIPTOR).unwrap();
    let domain_event = set
        .file
        .iter()
        .filter(|f| f.package() == "switchyard.v1")
        .flat_map(|f| &f.message_type)
        .find(|m| m.name() == "DomainEvent")
        .expect("DomainEvent is defined");
    let kind = domain_event
        .oneof_decl
        .iter()
        .position(|o| o.name() == "kind")
        .expect("DomainEvent has the oneof kind");
    let cases: Vec<&str> = domain_event
        .field
        .iter()
        .filter(|f| f.oneof_index == Some(kind as i32))
        .map(|f| f.type_name().trim_start_matches('.'))
        .collect();

    assert_eq!(cases.len(), EVENT_TYPES.len(), "one entry per case");
    for message in &cases {
        let entries: Vec<_> = EVENT_TYPES
            .iter()
            .filter(|(_, _, m)| m == message)
            .collect();
        assert_eq!(entries.len(), 1, "{message}: {entries:?}");
        let (type_name, _, _) = entries[0];
        assert_eq!(format!("switchyard.v1.{type_name}"), *message);
    }
}

#[test]
fn cloudevent_types_are_three_lower_snake_tokens_under_io_switchyard_and_distinct() {
    let mut seen = BTreeSet::new();
    for (type_name, cloudevent_type, _) in EVENT_TYPES {
        let tokens: Vec<&str> = cloudevent_type.split('.').collect();
        assert_eq!(tokens.len(), 4, "{cloudevent_type}");
        assert_eq!(tokens[..2], ["io", "switchyard"], "{cloudevent_type}");
        for token in &tokens[2..] {
            let well_formed = !token.is_empty()
                && token
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
            assert!(well_formed, "{type_name}: {cloudevent_type}");
        }
        assert!(seen.insert(*cloudevent_type), "{cloudevent_type} twice");
    }
    let type_names: BTreeSet<_> = EVENT_TYPES.iter().map(|(t, _, _)| t).collect();
    assert_eq!(type_names.len(), EVENT_TYPES.len());
}

#[test]
fn kinds_name_their_cloudevent_type() {
    let cases = [
        (
            Kind::HandoverStarted(Default::default()),
            "io.switchyard.handover.started",
        ),
        (
            Kind::HandoverCompleted(Default::default()),
            "io.switchyard.handover.completed",
        ),
        (
            Kind::NodeObserved(Default::default()),
            "io.switchyard.node.observed",
        ),
        (
            Kind::NodeGroupHeldOnDra(Default::default()),
            "io.switchyard.node_group.held_on_dra",
        ),
        (
            Kind::ApplicationMoveStarted(Default::default()),
            "io.switchyard.application_move.started",
        ),
        (
            Kind::MigrationStarted(Default::default()),
            "io.switchyard.migration.started",
        ),
        (
            Kind::WaveCompleted(Default::default()),
            "io.switchyard.wave.completed",
        ),
        (
            Kind::AlertRaised(Default::default()),
            "io.switchyard.alert.raised",
        ),
        // A node's move to another group is the node's event.
        (
            Kind::NodeGroupChanged(Default::default()),
            "io.switchyard.node.group_changed",
        ),
    ];
    for (kind, cloudevent_type) in cases {
        assert_eq!(kind.cloudevent_type(), cloudevent_type);
        let entry = EVENT_TYPES.iter().find(|(t, _, _)| *t == kind.type_name());
        assert_eq!(entry.map(|(_, ty, _)| *ty), Some(cloudevent_type));
    }
}

/// The schemas published with the docs are the ones the protos give now:
/// `switchyard log schemas --out docs/integrations/schemas` writes them.
#[test]
fn the_schemas_in_the_docs_are_the_protos_schemas() {
    let dir =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/integrations/schemas");
    let regenerate = "run `switchyard log schemas --out docs/integrations/schemas`";
    let mut expected = BTreeSet::new();
    for (_, cloudevent_type, _) in EVENT_TYPES {
        let file = format!("{cloudevent_type}.json");
        let written = std::fs::read_to_string(dir.join(&file))
            .unwrap_or_else(|e| panic!("docs/integrations/schemas/{file}: {e}: {regenerate}"));
        let schema = event_schema(cloudevent_type).expect("a schema per type");
        assert_eq!(
            written,
            serde_json::to_string_pretty(&schema).unwrap() + "\n",
            "docs/integrations/schemas/{file} differs from the protos: {regenerate}"
        );
        expected.insert(file);
    }
    let present: BTreeSet<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(
        present, expected,
        "docs/integrations/schemas holds a file of no event type: {regenerate}"
    );
}

#[test]
fn every_event_type_has_a_schema_of_its_message() {
    for (type_name, cloudevent_type, message) in EVENT_TYPES {
        let schema = event_schema(cloudevent_type).unwrap_or_else(|| panic!("{message}"));
        assert_eq!(
            schema["$schema"],
            "https://json-schema.org/draft/2020-12/schema"
        );
        assert_eq!(
            schema["$id"],
            format!("https://switchyard.io/schemas/events/{cloudevent_type}.json")
        );
        assert_eq!(schema["title"], *type_name);
        assert_eq!(schema["additionalProperties"], false);
        assert_eq!(schema.get("required"), None, "proto3 omits defaults");
        // The message with every field at its default is written as {}.
        assert!(validator(&schema).is_valid(&json!({})), "{message}");
    }
    assert_eq!(event_schema("io.switchyard.handover.finished"), None);
    assert_eq!(json_schema("switchyard.v1.NoSuchEvent"), None);
}

#[test]
fn events_as_pbjson_writes_them_match_their_schemas() {
    let handover_started = v1::HandoverStarted {
        handover_id: "h-1".into(),
        node: "worker-1".into(),
        source_group: "gpu-a".into(),
        target_group: "gpu-dra".into(),
        labels_before: labels(&[("node.deckhouse.io/group", "gpu-a")]),
        taints_before: vec![mk_taint("dedicated")],
        was_unschedulable: true,
        cards_before: 8,
    };
    let group_changed = v1::NodeGroupChanged {
        handover_id: "h-1".into(),
        node: "worker-1".into(),
        from_group: "gpu-a".into(),
        to_group: "gpu-dra".into(),
        labels_before: labels(&[("node.deckhouse.io/group", "gpu-a")]),
        taints_before: vec![mk_taint("dedicated")],
        labels_after: labels(&[("node.deckhouse.io/group", "gpu-dra")]),
        taints_after: vec![],
    };
    let kinds = vec![
        Kind::HandoverCompleted(v1::HandoverCompleted {
            handover_id: "h-1".into(),
            node: "worker-1".into(),
            target_group: "gpu-dra".into(),
        }),
        Kind::NodeObserved(v1::NodeObserved {
            node: "worker-1".into(),
            labels: labels(&[("kubernetes.io/hostname", "worker-1"), ("gpu", "a100")]),
            taints: vec![mk_taint("dedicated"), mk_taint("gpu")],
            unschedulable: true,
            provisioning: v1::NodeProvisioning::StaticInstance as i32,
            gpu_count: 8,
            gpu_allocatable: [
                ("nvidia.com/gpu".to_string(), 8),
                ("nvidia.com/mig-1g.5gb".into(), u32::MAX),
            ]
            .into(),
        }),
        Kind::RollbackStarted(v1::RollbackStarted {
            rollback_id: "r-1".into(),
            target: Some(v1::rollback_started::Target::Node("worker-1".into())),
            through_sequence: u64::MAX,
            plan: vec![42, 41, 40],
            node_restore: Some(Box::new(handover_started)),
            workload_restore: Some(Box::new(v1::WorkloadRewritten {
                move_id: "m-1".into(),
                workload: Some(mk_workload("train")),
                before: Some(mk_placement("nvidia.com/gpu")),
                after: Some(mk_placement("gpu.deckhouse.io/a100")),
            })),
            undone_group_change: Some(Box::new(group_changed.clone())),
        }),
        Kind::AlertRaised(v1::AlertRaised {
            alert_name: "D8GpuNodeGroupHeldOnDra".into(),
            labels: labels(&[("node_group", "gpu-a"), ("severity_level", "4")]),
            summary: "NodeGroup gpu-a is held on DRA.".into(),
        }),
        Kind::HandoverStalled(v1::HandoverStalled {
            handover_id: "h-1".into(),
            node: "worker-1".into(),
            step: v1::HandoverStep::Drain as i32,
            reason: "eviction blocked".into(),
            deadline_unix_nanos: -1,
        }),
        Kind::GpuClassObserved(v1::GpuClassObserved {
            name: "a100".into(),
            device_class_names: vec!["a100-whole".into()],
            selector: Some(v1::LabelSelector {
                match_labels: labels(&[("gpu.deckhouse.io/device", "a100-sxm4-40gb")]),
                match_expressions: vec![v1::LabelSelectorRequirement {
                    key: "gpu.deckhouse.io/mig".into(),
                    operator: "DoesNotExist".into(),
                    values: vec![],
                }],
            }),
            // A proto3 `optional` is written when set, even to its default.
            whole: Some(false),
            generation: i64::MAX,
            ..Default::default()
        }),
        Kind::MigrationStarted(v1::MigrationStarted {
            migration_id: "mig-1".into(),
            waves: vec![v1::PlannedWave {
                nodes: vec!["worker-1".into()],
                workloads: vec![mk_workload("train")],
            }],
            pending_limit_seconds: 600,
            ..Default::default()
        }),
        // Reaches DomainEvent again through its compensation.
        Kind::StepCompensated(Box::new(v1::StepCompensated {
            rollback_id: "r-1".into(),
            compensated_sequence: 41,
            compensation: Some(Box::new(v1::event(Kind::NodeGroupChanged(group_changed)))),
        })),
    ];
    for kind in kinds {
        let (schema, data) = schema_and_data(kind);
        assert_valid(&schema, &data);
    }
}

#[test]
fn sixty_four_bit_integers_are_decimal_strings_and_enums_their_names() {
    let (schema, data) = schema_and_data(Kind::HandoverStalled(v1::HandoverStalled {
        step: v1::HandoverStep::Drain as i32,
        deadline_unix_nanos: -1_700_000_000_000_000_000,
        ..Default::default()
    }));
    assert_eq!(
        data,
        json!({ "step": "HANDOVER_STEP_DRAIN", "deadline_unix_nanos": "-1700000000000000000" })
    );
    let properties = &schema["properties"];
    assert_eq!(properties["deadline_unix_nanos"]["type"], "string");
    assert_eq!(properties["deadline_unix_nanos"]["pattern"], "^-?[0-9]+$");
    assert_eq!(
        properties["step"]["enum"],
        json!([
            "HANDOVER_STEP_UNSPECIFIED",
            "HANDOVER_STEP_CORDON",
            "HANDOVER_STEP_DRAIN",
            "HANDOVER_STEP_MOVE_GROUP",
            "HANDOVER_STEP_WAIT_READY",
            "HANDOVER_STEP_UNCORDON",
        ])
    );
    assert_valid(&schema, &data);
}

#[test]
fn bytes_are_base64_and_unsigned_64_bit_integers_unsigned_strings() {
    let envelope = v1::Envelope {
        sequence: u64::MAX,
        recorded_at_unix_nanos: 1_700_000_000_000_000_000,
        payload: prost::bytes::Bytes::from_static(&[0xfb, 0xff, 0x00, 0x01]),
        prev_hash: vec![0xff; 32],
        ..Default::default()
    };
    let data = serde_json::to_value(&envelope).unwrap();
    assert_eq!(data["payload"], "+/8AAQ==");
    assert_eq!(data["sequence"], "18446744073709551615");

    let schema = json_schema("switchyard.v1.Envelope").unwrap();
    assert_eq!(schema["properties"]["payload"]["contentEncoding"], "base64");
    assert_valid(&schema, &data);
    let validator = validator(&schema);
    assert!(!validator.is_valid(&json!({ "sequence": "-1" })));
    assert!(!validator.is_valid(&json!({ "payload": "not base64!" })));
}

#[test]
fn schemas_refuse_what_pbjson_never_writes() {
    let schema = event_schema("io.switchyard.node.observed").unwrap();
    let validator = validator(&schema);
    let refused = [
        json!({ "nodeName": "worker-1" }),
        // camelCase is what pbjson reads, not what it writes.
        json!({ "gpuCount": 8 }),
        json!({ "unschedulable": "true" }),
        json!({ "gpu_count": -1 }),
        json!({ "gpu_count": 4_294_967_296_u64 }),
        json!({ "gpu_count": "8" }),
        json!({ "provisioning": 2 }),
        json!({ "provisioning": "NODE_PROVISIONING_HANDMADE" }),
        json!({ "labels": { "gpu": 1 } }),
        json!({ "gpu_allocatable": { "nvidia.com/gpu": "8" } }),
        json!({ "taints": { "key": "gpu" } }),
        // Nested messages are closed too.
        json!({ "taints": [{ "key": "gpu", "operator": "Exists" }] }),
    ];
    for data in refused {
        assert!(!validator.is_valid(&data), "accepted {data}");
    }

    let stalled = validator_for_type("io.switchyard.handover.stalled");
    assert!(!stalled.is_valid(&json!({ "deadline_unix_nanos": 5 })));
    assert!(!stalled.is_valid(&json!({ "deadline_unix_nanos": "5e3" })));
}

fn validator_for_type(cloudevent_type: &str) -> jsonschema::Validator {
    validator(&event_schema(cloudevent_type).unwrap())
}

#[test]
fn nested_messages_are_defined_once_under_their_full_names() {
    let schema = event_schema("io.switchyard.rollback.started").unwrap();
    assert_eq!(
        schema["properties"]["node_restore"]["$ref"],
        "#/$defs/switchyard.v1.HandoverStarted"
    );
    let defs: BTreeSet<&str> = schema["$defs"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    let expected = BTreeSet::from([
        "switchyard.v1.HandoverStarted",
        "switchyard.v1.NodeGroupChanged",
        "switchyard.v1.ResourceList",
        "switchyard.v1.Taint",
        "switchyard.v1.Toleration",
        "switchyard.v1.Tolerations",
        "switchyard.v1.WorkloadPlacement",
        "switchyard.v1.WorkloadRef",
        "switchyard.v1.WorkloadRewritten",
    ]);
    assert_eq!(defs, expected, "map entries are objects, not definitions");
    assert_eq!(
        schema["$defs"]["switchyard.v1.WorkloadPlacement"]["properties"]["container_limits"],
        json!({
            "type": "object",
            "additionalProperties": { "$ref": "#/$defs/switchyard.v1.ResourceList" },
            "description": "Container name -> (resource name -> quantity) of resources.limits.",
        })
    );
    // The oneof's members are plain properties, noted once.
    assert_eq!(schema["properties"]["node"]["type"], "string");
    assert_eq!(
        schema["$comment"],
        "At most one of `node`, `workload` is present (oneof `target`)."
    );
}

#[test]
fn descriptions_are_the_proto_comments() {
    let schema = event_schema("io.switchyard.handover.stalled").unwrap();
    assert_eq!(
        schema["properties"]["deadline_unix_nanos"]["description"],
        "The deadline that passed, as recorded time (Unix nanoseconds)."
    );
    assert_eq!(schema["properties"]["node"].get("description"), None);

    let schema = event_schema("io.switchyard.node_group.held_on_dra").unwrap();
    assert_eq!(
        schema["description"],
        "The group had spec.gpu when this version first ran with dra.enabled, so it is \
         kept on DRA (alert D8GpuNodeGroupHeldOnDra)."
    );

    // Paragraphs stay apart.
    let schema = json_schema("switchyard.v1.DomainEvent").unwrap();
    let description = schema["description"].as_str().unwrap();
    assert!(
        description.ends_with("pure function of the log.\n\nField numbers are never reused; a new event is a new oneof case."),
        "{description}"
    );
}

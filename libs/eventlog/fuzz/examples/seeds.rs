//! Writes the fuzz targets' seed inputs (committed under `seeds/`): records
//! appended by the embedded log itself — unsigned, signed, a raw payload of a
//! newer writer, a batch of two with a trace context — as each target reads
//! them.
//!
//! Run: `cd libs/eventlog/fuzz && cargo +nightly run --example seeds -- seeds [DEMO_LOG_DIR]`
//! (the `replay` seeds are windows of `switchyard demo --nodes 3 --workloads 3 --data-dir DEMO_LOG_DIR`;
//! the envelope target's keyring holds the signer it prints).

// Built with the targets' RUSTFLAGS (to reuse their build), the example is
// instrumented too and needs the runtime this crate links.
use libfuzzer_sys as _;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use switchyard_eventlog::embedded::{Durability, EmbeddedLog, EmbeddedOptions};
use switchyard_eventlog::{EventLog, NewEvent, Payload, ReadRequest, Subject, TraceContext};
use switchyard_proto::v1::domain_event::Kind;
use switchyard_proto::v1::{NodeObserved, NodeRemoved};

/// As in `fuzz_targets/segment.rs` and `fuzz_targets/replay.rs`.
const SEPARATOR: &[u8] = b"\xffFRAME";
const EVENT_SEPARATOR: &[u8] = b"\xffEVENT";
/// Events per `replay` seed.
const WINDOW: usize = 50;

fn main() {
    let out = std::env::args().nth(1).expect("usage: seeds DIR");
    let out = Path::new(&out);
    // A fixed key, so the envelope target's keyring knows the seeds' signer.
    let key = nkeys::KeyPair::new_from_raw(nkeys::KeyPairType::User, [7; 32]).unwrap();
    println!("signer {}", key.public_key());

    let dir = std::env::temp_dir().join(format!("switchyard-seeds-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let records = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(async {
            let unsigned = EmbeddedLog::open(
                &dir,
                EmbeddedOptions {
                    durability: Durability::NoSync,
                    ..EmbeddedOptions::default()
                },
            )
            .unwrap();
            let node = Subject::new("node.n1").unwrap();
            let observed = Kind::NodeObserved(NodeObserved {
                node: "n1".into(),
                labels: BTreeMap::from([("node.deckhouse.io/group".into(), "gpu".into())])
                    .into_iter()
                    .collect(),
                gpu_count: 8,
                ..NodeObserved::default()
            });
            let event = NewEvent::new("n1-observed", 1_700_000_000_000_000_000, observed.into())
                .with_actor("inventory");
            unsigned
                .append(&node, switchyard_eventlog::Expected::Empty, vec![event])
                .await
                .unwrap();
            let newer = NewEvent {
                payload: Payload::Raw {
                    event_type: "NodeRetired".into(),
                    schema_version: 9,
                    bytes: bytes::Bytes::from_static(b"\x0a\x02n1"),
                },
                ..NewEvent::new("n1-retired", 1_700_000_000_000_000_001, Default::default())
            };
            unsigned
                .append(&node, switchyard_eventlog::Expected::Any, vec![newer])
                .await
                .unwrap();
            unsigned.close();

            let signed = EmbeddedLog::open(
                &dir,
                EmbeddedOptions {
                    durability: Durability::NoSync,
                    signer: Some(Arc::new(key)),
                    ..EmbeddedOptions::default()
                },
            )
            .unwrap();
            let removed = |id: &str| {
                let mut event = NewEvent::new(
                    id,
                    1_700_000_000_000_000_002,
                    Kind::NodeRemoved(NodeRemoved { node: "n1".into() }).into(),
                )
                .with_actor("inventory")
                .with_correlation("migration-1")
                .with_causation("n1-observed");
                event.trace = Some(TraceContext {
                    traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
                    tracestate: "vendor=1".into(),
                });
                event
            };
            signed
                .append_batch(
                    vec![
                        (node.clone(), removed("n1-removed")),
                        (Subject::new("node.n2").unwrap(), removed("n2-removed")),
                    ],
                    &[],
                )
                .await
                .unwrap();
            let records = signed.read(ReadRequest::default()).await.unwrap();
            signed.close();
            records
        });

    let envelope = out.join("envelope");
    let segment = out.join("segment");
    std::fs::create_dir_all(&envelope).unwrap();
    std::fs::create_dir_all(&segment).unwrap();
    let mut structured = vec![2u8];
    for (i, record) in records.iter().enumerate() {
        std::fs::write(
            envelope.join(format!("record-{}", record.sequence)),
            &record.raw,
        )
        .unwrap();
        if i > 0 {
            structured.extend_from_slice(SEPARATOR);
        }
        // Each record its own batch but the last two, appended together.
        let ends_batch = record.sequence != 3;
        structured.push(ends_batch as u8);
        structured.extend_from_slice(&record.raw);
    }
    std::fs::write(segment.join("structured"), &structured).unwrap();
    let file = std::fs::read(dir.join(format!("{:020}.seg", 1))).unwrap();
    std::fs::write(segment.join("raw"), [&[0u8][..], &file].concat()).unwrap();
    std::fs::write(
        segment.join("after-header"),
        [&[1u8][..], &file[24..]].concat(),
    )
    .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    println!("{} records", records.len());

    // A demo's log (`switchyard demo --data-dir DIR`), if given, in windows.
    let Some(demo) = std::env::args().nth(2) else {
        return;
    };
    let replay = out.join("replay");
    std::fs::create_dir_all(&replay).unwrap();
    let log = EmbeddedLog::open_read_only(&demo).unwrap();
    let records = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(log.read(ReadRequest::default()))
        .unwrap();
    let events: Vec<Vec<u8>> = records
        .iter()
        .filter_map(|r| match r.decode() {
            switchyard_eventlog::Decoded::Event(event) => {
                Some(prost::Message::encode_to_vec(&event))
            }
            _ => None,
        })
        .collect();
    for (i, window) in events.chunks(WINDOW).enumerate() {
        std::fs::write(
            replay.join(format!("demo-{i}")),
            window.join(EVENT_SEPARATOR),
        )
        .unwrap();
    }
    println!("{} demo events", events.len());
}

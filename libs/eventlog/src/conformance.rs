//! The conformance suite every [`EventLog`] backend must pass.
//!
//! Each case takes a fresh, empty log. A backend's tests instantiate the whole
//! suite with [`conformance_suite!`](crate::conformance_suite), giving an async
//! expression that returns `(impl EventLog, guard)`; the guard keeps whatever the
//! log lives on (a temp dir, a nats-server) alive for the test.

use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use prost::Message;
use switchyard_proto::v1::{
    DomainEvent, NodeCordoned, NodeGroupChanged, NodeRemoved, Taint, TraceContext,
    domain_event::Kind,
};

use crate::{
    Decoded, EventLog, Expected, LogError, NewEvent, Payload, ReadRequest, Subject, UnknownReason,
};

/// Instantiates every conformance case as a `#[tokio::test]`.
#[macro_export]
macro_rules! conformance_suite {
    ($make:expr) => {
        $crate::conformance_suite!(@cases $make;
            append_and_read_back, read_by_subject_from_and_limit, expected_sequence_conflicts,
            racing_writers_one_wins_each_sequence, retried_append_is_stored_once,
            reused_ids_are_never_stored_twice,
            last_sequence_per_subject, follow_sees_existing_then_new, unknown_events_are_kept,
            oversize_is_refused_with_the_limit, bad_input_is_refused_whole, verify_accepts_a_healthy_log,
            one_batch_across_subjects_is_stored_whole, events_appended_each_are_stored_once_in_order);
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn a_deposed_leaders_records_are_fenced() {
            let (log, _guard) = $make.await;
            $crate::conformance::a_deposed_leaders_records_are_fenced(std::sync::Arc::new(log))
                .await;
        }
    };
    (@cases $make:expr; $($case:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let (log, _guard) = $make.await;
                $crate::conformance::$case(&log).await;
            }
        )*
    };
}

fn subject(name: &str) -> Subject {
    Subject::new(name).expect("valid subject")
}

fn cordon(id: &str, node: &str, at: i64) -> NewEvent {
    let event = Kind::NodeCordoned(NodeCordoned {
        handover_id: "h1".into(),
        node: node.into(),
        was_unschedulable: false,
        to_evict: Vec::new(),
    });
    NewEvent::new(id, at, event.into())
        .with_actor("stack-assigner")
        .with_correlation("migration-1")
        .with_causation("cmd-1")
}

fn removed(id: &str) -> NewEvent {
    NewEvent::new(
        id,
        1,
        Kind::NodeRemoved(NodeRemoved { node: id.into() }).into(),
    )
}

async fn read_all(log: &dyn EventLog) -> Vec<crate::StoredEvent> {
    log.read(ReadRequest::default()).await.expect("read")
}

pub async fn append_and_read_back(log: &dyn EventLog) {
    let node = subject("node.worker-1");
    let group = subject("group.gpu");
    let mut first = cordon("e1", "worker-1", 1_000);
    first.trace = Some(TraceContext {
        traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
        tracestate: "vendor=1".into(),
    });
    let moved = Kind::NodeGroupChanged(NodeGroupChanged {
        handover_id: "h1".into(),
        node: "worker-1".into(),
        from_group: "gpu".into(),
        to_group: "gpu-dra".into(),
        labels_before: [("node.deckhouse.io/group".to_string(), "gpu".to_string())].into(),
        taints_before: vec![Taint {
            key: "dedicated".into(),
            value: "gpu".into(),
            effect: "NoSchedule".into(),
        }],
        ..Default::default()
    });
    let batch = vec![
        first.clone(),
        cordon("e2", "worker-1", 2_000),
        NewEvent::new("e3", 3_000, moved.into()),
    ];
    let ack = log
        .append(&node, Expected::Empty, batch.clone())
        .await
        .expect("append batch");
    assert_eq!(ack.sequences, vec![1, 2, 3]);
    assert_eq!(ack.duplicates, 0);
    let ack = log
        .append(&group, Expected::Empty, vec![removed("e4"), removed("e5")])
        .await
        .expect("append");
    assert_eq!(ack.sequences, vec![4, 5]);
    let ack = log
        .append(
            &node,
            Expected::Sequence(3),
            vec![cordon("e6", "worker-1", 6_000)],
        )
        .await
        .expect("append");
    assert_eq!(ack.sequences, vec![6]);

    let events = read_all(log).await;
    assert_eq!(
        events.iter().map(|e| e.sequence).collect::<Vec<_>>(),
        vec![1, 2, 3, 4, 5, 6]
    );
    let ids: Vec<&str> = events.iter().map(|e| e.envelope.id.as_str()).collect();
    assert_eq!(ids, ["e1", "e2", "e3", "e4", "e5", "e6"]);

    let e1 = &events[0].envelope;
    assert_eq!(e1.sequence, 1);
    assert_eq!(e1.subject, "node.worker-1");
    assert_eq!(e1.recorded_at_unix_nanos, 1_000);
    assert_eq!(
        (
            e1.actor.as_str(),
            e1.correlation_id.as_str(),
            e1.causation_id.as_str()
        ),
        ("stack-assigner", "migration-1", "cmd-1")
    );
    assert_eq!(e1.trace, first.trace);
    assert_eq!(e1.schema_version, switchyard_proto::v1::SCHEMA_VERSION);
    assert_eq!(e1.event_type, "NodeCordoned");
    for (stored, sent) in events[..3].iter().zip(&batch) {
        let Payload::Domain(sent) = &sent.payload else {
            unreachable!()
        };
        assert_eq!(stored.decode(), Decoded::Event(sent.clone()));
    }

    // Each record links to the previous record of its own subject.
    assert!(events[0].envelope.prev_hash.is_empty());
    assert_eq!(events[1].envelope.prev_hash, events[0].hash());
    assert_eq!(events[2].envelope.prev_hash, events[1].hash());
    assert!(events[3].envelope.prev_hash.is_empty());
    assert_eq!(events[4].envelope.prev_hash, events[3].hash());
    assert_eq!(events[5].envelope.prev_hash, events[2].hash());
}

pub async fn read_by_subject_from_and_limit(log: &dyn EventLog) {
    let (a, b) = (subject("app.a"), subject("app.b"));
    for i in 0..10 {
        let target = if i % 2 == 0 { &a } else { &b };
        log.append(target, Expected::Any, vec![removed(&format!("r{i}"))])
            .await
            .expect("append");
    }
    let only_b = log
        .read(ReadRequest {
            subject: Some(b.clone()),
            ..Default::default()
        })
        .await
        .expect("read");
    assert_eq!(
        only_b.iter().map(|e| e.sequence).collect::<Vec<_>>(),
        vec![2, 4, 6, 8, 10]
    );
    assert!(only_b.iter().all(|e| e.envelope.subject == "app.b"));

    let page = log
        .read(ReadRequest {
            subject: None,
            from: 4,
            limit: Some(3),
        })
        .await
        .expect("read");
    assert_eq!(
        page.iter().map(|e| e.sequence).collect::<Vec<_>>(),
        vec![4, 5, 6]
    );

    let tail = log
        .read(ReadRequest {
            subject: Some(a.clone()),
            from: 6,
            limit: None,
        })
        .await
        .expect("read");
    assert_eq!(
        tail.iter().map(|e| e.sequence).collect::<Vec<_>>(),
        vec![7, 9]
    );

    let past_end = log
        .read(ReadRequest {
            subject: None,
            from: 11,
            limit: None,
        })
        .await
        .expect("read");
    assert!(past_end.is_empty());
    let unknown = log
        .read(ReadRequest {
            subject: Some(subject("app.none")),
            ..Default::default()
        })
        .await
        .expect("read");
    assert!(unknown.is_empty());
}

pub async fn expected_sequence_conflicts(log: &dyn EventLog) {
    let s = subject("node.n1");
    log.append(&s, Expected::Empty, vec![removed("c1")])
        .await
        .expect("first append");
    let err = log
        .append(&s, Expected::Empty, vec![removed("c2")])
        .await
        .unwrap_err();
    assert!(
        matches!(&err, LogError::Conflict { subject, expected: 0, actual } if subject == "node.n1" && actual == "1"),
        "{err}"
    );
    let err = log
        .append(&s, Expected::Sequence(7), vec![removed("c3")])
        .await
        .unwrap_err();
    assert!(
        matches!(err, LogError::Conflict { expected: 7, .. }),
        "{err}"
    );
    assert_eq!(
        read_all(log).await.len(),
        1,
        "a refused append writes nothing"
    );
    log.append(&s, Expected::Sequence(1), vec![removed("c4")])
        .await
        .expect("append at the right sequence");
    assert_eq!(log.last_sequence(Some(&s)).await.unwrap(), 2);
}

pub async fn racing_writers_one_wins_each_sequence(log: &dyn EventLog) {
    let s = subject("race.subject");
    let rounds = 20;
    let mut expected = Expected::Empty;
    for round in 0..rounds {
        let attempt = |writer: &str| {
            let s = s.clone();
            let event = removed(&format!("race-{round}-{writer}"));
            async move { log.append(&s, expected, vec![event]).await }
        };
        let (left, right) = tokio::join!(attempt("left"), attempt("right"));
        let (won, lost) = match (left, right) {
            (Ok(ack), Err(err)) | (Err(err), Ok(ack)) => (ack, err),
            (left, right) => {
                panic!("round {round}: expected exactly one winner, got {left:?} and {right:?}")
            }
        };
        assert!(
            matches!(lost, LogError::Conflict { .. }),
            "the loser gets Conflict, got {lost}"
        );
        expected = Expected::Sequence(won.last_sequence());
    }
    let events = read_all(log).await;
    assert_eq!(events.len(), rounds);
    assert!(log.verify().await.unwrap().is_ok());
}

/// Batches that reuse stored ids in other ways than a plain retry are refused
/// whole (or, where the backend can tell, acknowledged as the earlier append) —
/// never stored twice, never acknowledged with sequences that are not theirs.
pub async fn reused_ids_are_never_stored_twice(log: &dyn EventLog) {
    let s = subject("node.reuse");
    let other = subject("node.other");
    log.append(&s, Expected::Empty, vec![removed("k1")])
        .await
        .expect("append");
    // A new id in front of the subject's last one.
    let refused = log
        .append(&s, Expected::Empty, vec![removed("k0"), removed("k1")])
        .await;
    assert!(
        refused.is_err(),
        "[k0, k1] must not be acknowledged: {refused:?}"
    );
    let refused = log
        .append(&s, Expected::Any, vec![removed("k2"), removed("k1")])
        .await;
    assert!(
        refused.is_err(),
        "[k2, k1] must not be acknowledged: {refused:?}"
    );
    // A longer batch than the whole subject, ending in its last id.
    let refused = log
        .append(
            &s,
            Expected::Sequence(7),
            vec![removed("ka"), removed("kb"), removed("k1")],
        )
        .await;
    assert!(refused.is_err(), "{refused:?}");

    // A batch retried after another writer appended to the subject.
    let first = log
        .append(&s, Expected::Any, vec![removed("x1"), removed("x2")])
        .await
        .expect("append");
    log.append(&other, Expected::Any, vec![removed("elsewhere")])
        .await
        .expect("append");
    log.append(&s, Expected::Any, vec![removed("y1")])
        .await
        .expect("append");
    match log
        .append(&s, Expected::Any, vec![removed("x1"), removed("x2")])
        .await
    {
        Ok(ack) => assert_eq!((ack.sequences, ack.duplicates), (first.sequences, 2)),
        Err(err) => assert!(
            matches!(err, LogError::InvalidBatch { .. })
                && err.to_string().contains("already stored"),
            "a refused retry says why: {err}"
        ),
    }
    let ids: Vec<String> = read_all(log)
        .await
        .into_iter()
        .map(|e| e.envelope.id)
        .collect();
    assert_eq!(ids, ["k1", "x1", "x2", "elsewhere", "y1"]);
    assert!(log.verify().await.unwrap().is_ok());
}

pub async fn retried_append_is_stored_once(log: &dyn EventLog) {
    let s = subject("node.retry");
    let first = log
        .append(&s, Expected::Empty, vec![removed("d1")])
        .await
        .expect("append");
    // The writer never saw the ack and retries with the same id and expectation.
    let retry = log
        .append(&s, Expected::Empty, vec![removed("d1")])
        .await
        .expect("retry");
    assert_eq!(retry.sequences, first.sequences);
    assert_eq!(retry.duplicates, 1);

    let batch = vec![removed("d2"), removed("d3"), removed("d4")];
    let first = log
        .append(&s, Expected::Sequence(1), batch.clone())
        .await
        .expect("append batch");
    let retry = log
        .append(&s, Expected::Sequence(1), batch)
        .await
        .expect("retry batch");
    assert_eq!(retry.sequences, first.sequences);
    assert_eq!(retry.duplicates, 3);
    let ids: Vec<String> = read_all(log)
        .await
        .into_iter()
        .map(|e| e.envelope.id)
        .collect();
    assert_eq!(ids, ["d1", "d2", "d3", "d4"]);
}

pub async fn last_sequence_per_subject(log: &dyn EventLog) {
    let (a, b) = (subject("s.a"), subject("s.b"));
    assert_eq!(log.last_sequence(None).await.unwrap(), 0);
    assert_eq!(log.last_sequence(Some(&a)).await.unwrap(), 0);
    log.append(&a, Expected::Any, vec![removed("l1"), removed("l2")])
        .await
        .unwrap();
    log.append(&b, Expected::Any, vec![removed("l3")])
        .await
        .unwrap();
    assert_eq!(log.last_sequence(Some(&a)).await.unwrap(), 2);
    assert_eq!(log.last_sequence(Some(&b)).await.unwrap(), 3);
    assert_eq!(log.last_sequence(None).await.unwrap(), 3);
}

type Follow = futures::stream::BoxStream<'static, Result<crate::StoredEvent, LogError>>;

async fn next_id(stream: &mut Follow) -> String {
    tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("an event within 10 s")
        .expect("stream open")
        .expect("no error")
        .envelope
        .id
}

pub async fn follow_sees_existing_then_new(log: &dyn EventLog) {
    let (a, b) = (subject("f.a"), subject("f.b"));
    log.append(&a, Expected::Any, vec![removed("f1")])
        .await
        .unwrap();
    log.append(&b, Expected::Any, vec![removed("f2")])
        .await
        .unwrap();
    let mut all = log.follow(None, 1).await.expect("follow");
    let mut only_a = log.follow(Some(a.clone()), 1).await.expect("follow");
    assert_eq!(next_id(&mut all).await, "f1");
    assert_eq!(next_id(&mut all).await, "f2");
    assert_eq!(next_id(&mut only_a).await, "f1");
    log.append(&b, Expected::Any, vec![removed("f3")])
        .await
        .unwrap();
    log.append(&a, Expected::Any, vec![removed("f4"), removed("f5")])
        .await
        .unwrap();
    assert_eq!(next_id(&mut all).await, "f3");
    assert_eq!(next_id(&mut all).await, "f4");
    assert_eq!(next_id(&mut all).await, "f5");
    assert_eq!(next_id(&mut only_a).await, "f4");
    assert_eq!(next_id(&mut only_a).await, "f5");
}

pub async fn unknown_events_are_kept(log: &dyn EventLog) {
    let s = subject("future.events");
    // A newer writer's event type: a DomainEvent oneof case this build lacks (field 999).
    let mut unknown_case = Vec::new();
    prost::encoding::encode_key(
        999,
        prost::encoding::WireType::LengthDelimited,
        &mut unknown_case,
    );
    prost::encoding::encode_varint(2, &mut unknown_case);
    unknown_case.extend_from_slice(&[8, 1]);
    let newer = NewEvent {
        payload: Payload::Raw {
            event_type: "NodeCordoned".into(),
            schema_version: 9,
            bytes: Bytes::from(
                DomainEvent::from(Kind::NodeRemoved(NodeRemoved { node: "x".into() }))
                    .encode_to_vec(),
            ),
        },
        ..removed("u1")
    };
    let unknown = NewEvent {
        payload: Payload::Raw {
            event_type: "GpuTeleported".into(),
            schema_version: 1,
            bytes: Bytes::from(unknown_case.clone()),
        },
        ..removed("u2")
    };
    log.append(&s, Expected::Empty, vec![newer, unknown])
        .await
        .expect("raw events are accepted");
    let events = read_all(log).await;
    assert_eq!(events.len(), 2);
    match events[0].decode() {
        Decoded::Unknown {
            event_type,
            schema_version: 9,
            reason: UnknownReason::UnsupportedSchema { .. },
            ..
        } => {
            assert_eq!(event_type, "NodeCordoned")
        }
        other => panic!("newer schema must stay raw, got {other:?}"),
    }
    match events[1].decode() {
        Decoded::Unknown {
            event_type,
            reason: UnknownReason::UnknownType,
            raw,
            ..
        } => {
            assert_eq!(event_type, "GpuTeleported");
            assert_eq!(&raw[..], &unknown_case[..], "raw bytes are kept as written");
        }
        other => panic!("unknown type must stay raw, got {other:?}"),
    }
    let report = log.verify().await.unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
    let reported: Vec<(u64, &str)> = report
        .undecodable
        .iter()
        .map(|u| (u.sequence, u.event_type.as_str()))
        .collect();
    assert_eq!(reported, vec![(1, "NodeCordoned"), (2, "GpuTeleported")]);
}

pub async fn oversize_is_refused_with_the_limit(log: &dyn EventLog) {
    let s = subject("big.one");
    let big = NewEvent {
        payload: Payload::Raw {
            event_type: "Big".into(),
            schema_version: 1,
            bytes: Bytes::from(vec![7u8; crate::MAX_RECORD_BYTES]),
        },
        ..removed("big-1")
    };
    let err = log
        .append(&s, Expected::Any, vec![removed("small-1"), big])
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            LogError::Oversize {
                limit: crate::MAX_RECORD_BYTES,
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("big-1")
            && err
                .to_string()
                .contains(&crate::MAX_RECORD_BYTES.to_string())
    );
    assert!(
        read_all(log).await.is_empty(),
        "nothing of the batch is stored"
    );
}

pub async fn bad_input_is_refused_whole(log: &dyn EventLog) {
    let s = subject("bad.input");
    let err = log.append(&s, Expected::Any, vec![]).await.unwrap_err();
    assert!(err.to_string().contains("at least one event"), "{err}");
    let err = log
        .append(
            &s,
            Expected::Any,
            vec![removed("ok-1"), removed("has space")],
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, LogError::InvalidEvent { field: "id", .. }),
        "{err}"
    );
    assert!(
        err.to_string().contains("has space"),
        "the error names the event: {err}"
    );
    let err = log
        .append(&s, Expected::Any, vec![removed("twice"), removed("twice")])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("twice"), "{err}");
    let mut bad_trace = removed("trace-1");
    bad_trace.trace = Some(TraceContext {
        traceparent: "not-a-traceparent".into(),
        tracestate: String::new(),
    });
    let err = log
        .append(&s, Expected::Any, vec![bad_trace])
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            LogError::InvalidEvent {
                field: "trace.traceparent",
                ..
            }
        ),
        "{err}"
    );
    let empty = NewEvent::new("empty-1", 0, DomainEvent::default());
    let err = log
        .append(&s, Expected::Any, vec![empty])
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            LogError::InvalidEvent {
                field: "payload",
                ..
            }
        ),
        "{err}"
    );
    let mut long_state = removed("trace-2");
    long_state.trace = Some(TraceContext {
        traceparent: String::new(),
        tracestate: "k=".to_string() + &"v".repeat(600),
    });
    let err = log
        .append(&s, Expected::Any, vec![long_state])
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            LogError::InvalidEvent {
                field: "trace.tracestate",
                ..
            }
        ),
        "{err}"
    );
    let too_many: Vec<NewEvent> = (0..=crate::MAX_BATCH_EVENTS)
        .map(|i| removed(&format!("m{i}")))
        .collect();
    let err = log.append(&s, Expected::Any, too_many).await.unwrap_err();
    assert!(err.to_string().contains("at most 1000"), "{err}");
    assert!(
        read_all(log).await.is_empty(),
        "nothing of a refused batch is stored"
    );
}

pub async fn verify_accepts_a_healthy_log(log: &dyn EventLog) {
    const SUBJECTS: [&str; 3] = ["v.a", "v.b", "v.c"];
    for round in 0..30 {
        let s = subject(SUBJECTS[round % 3]);
        let batch = (0..1 + round % 4)
            .map(|i| removed(&format!("v{round}-{i}")))
            .collect();
        log.append(&s, Expected::Any, batch).await.unwrap();
    }
    let report = log.verify().await.unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
    assert_eq!(report.records, log.last_sequence(None).await.unwrap());
    assert_eq!(report.subjects, 3);
    assert!(report.undecodable.is_empty());
}

/// One batch across subjects: stored whole and in its order, each subject's
/// chain continued; a failed check on any one subject stores none of it; a
/// retry is acknowledged as the earlier append.
pub async fn one_batch_across_subjects_is_stored_whole(log: &dyn EventLog) {
    let (a, b, c) = (subject("x.a"), subject("x.b"), subject("x.c"));
    log.append(&c, Expected::Empty, vec![removed("c0")])
        .await
        .expect("append");
    let batch = vec![
        (a.clone(), removed("a1")),
        (b.clone(), removed("b1")),
        (a.clone(), removed("a2")),
        (c.clone(), removed("c1")),
    ];
    let checks = [
        (a.clone(), Expected::Empty),
        (c.clone(), Expected::Sequence(1)),
    ];
    let ack = log
        .append_batch(batch.clone(), &checks)
        .await
        .expect("append across subjects");
    assert_eq!(
        (ack.sequences.as_slice(), ack.duplicates),
        ([2, 3, 4, 5].as_slice(), 0)
    );
    for (s, last) in [(&a, 4), (&b, 3), (&c, 5)] {
        assert_eq!(log.last_sequence(Some(s)).await.unwrap(), last, "{s}");
    }

    // One stale check refuses the whole batch, naming its subject.
    let err = log
        .append_batch(
            vec![(a.clone(), removed("a3")), (b.clone(), removed("b2"))],
            &[
                (a.clone(), Expected::Sequence(4)),
                (b.clone(), Expected::Sequence(2)),
            ],
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, LogError::Conflict { subject, expected: 2, actual } if subject == "x.b" && actual == "3"),
        "{err}"
    );
    assert_eq!(
        read_all(log).await.len(),
        5,
        "a refused batch writes nothing"
    );

    // The writer never saw the ack and retries with the same ids and checks.
    let retry = log.append_batch(batch, &checks).await.expect("retry");
    assert_eq!((retry.sequences, retry.duplicates), (ack.sequences, 4));

    // Unchecked subjects chain on whatever is there.
    let ack = log
        .append_batch(
            vec![(b.clone(), removed("b2")), (a.clone(), removed("a3"))],
            &[],
        )
        .await
        .expect("append without checks");
    assert_eq!(ack.sequences, [6, 7]);

    // Checks must name the batch's subjects, each once.
    let err = log
        .append_batch(
            vec![(a.clone(), removed("a4"))],
            &[(subject("x.z"), Expected::Empty)],
        )
        .await
        .unwrap_err();
    assert!(
        matches!(err, LogError::InvalidBatch { .. }) && err.to_string().contains("x.z"),
        "{err}"
    );
    let err = log
        .append_batch(
            vec![(a.clone(), removed("a4"))],
            &[
                (a.clone(), Expected::Any),
                (a.clone(), Expected::Sequence(7)),
            ],
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("x.a has two"), "{err}");

    let stored: Vec<(String, String)> = read_all(log)
        .await
        .into_iter()
        .map(|e| (e.envelope.subject, e.envelope.id))
        .collect();
    let expected: Vec<(String, String)> = [
        ("x.c", "c0"),
        ("x.a", "a1"),
        ("x.b", "b1"),
        ("x.a", "a2"),
        ("x.c", "c1"),
        ("x.b", "b2"),
        ("x.a", "a3"),
    ]
    .iter()
    .map(|(s, id)| (s.to_string(), id.to_string()))
    .collect();
    assert_eq!(stored, expected);
    let report = log.verify().await.unwrap();
    assert!(
        report.is_ok(),
        "every subject's chain holds: {:?}",
        report.problems
    );
    assert_eq!(report.subjects, 3);
}

/// `append_each`: every event stored once, at the sequence its ack gives,
/// each subject's events in order, chains intact also when writers race on
/// the same subjects; a retry is acknowledged as the earlier append.
pub async fn events_appended_each_are_stored_once_in_order(log: &dyn EventLog) {
    let (a, b, c) = (subject("f.a"), subject("f.b"), subject("f.c"));
    log.append(&c, Expected::Empty, vec![removed("c0")])
        .await
        .expect("append");
    let events = vec![
        (a.clone(), removed("a1")),
        (b.clone(), removed("b1")),
        (a.clone(), removed("a2")),
        (c.clone(), removed("c1")),
        (a.clone(), removed("a3")),
    ];
    let ack = log.append_each(events.clone()).await.expect("append each");
    assert_eq!(ack.duplicates, 0);
    let where_stored =
        |stored: &[crate::StoredEvent]| -> std::collections::BTreeMap<String, (u64, String)> {
            stored
                .iter()
                .map(|e| {
                    (
                        e.envelope.id.clone(),
                        (e.sequence, e.envelope.subject.clone()),
                    )
                })
                .collect()
        };
    let stored = where_stored(&read_all(log).await);
    assert_eq!(stored.len(), 6);
    for ((s, event), seq) in events.iter().zip(&ack.sequences) {
        assert_eq!(stored[&event.id], (*seq, s.to_string()), "{}", event.id);
    }
    let seq = |id: &str| stored[id].0;
    assert!(seq("c0") < seq("c1") && seq("a1") < seq("a2") && seq("a2") < seq("a3"));

    // The writer never saw the ack and retries with the same ids.
    let retry = log.append_each(events).await.expect("retry");
    assert_eq!((retry.sequences, retry.duplicates), (ack.sequences, 5));
    assert_eq!(read_all(log).await.len(), 6, "a retry stores nothing");

    // Two writers on the same subjects at once: all stored, each writer's
    // events of a subject in its order.
    let racing = |writer: &str| -> Vec<(Subject, NewEvent)> {
        (0..12)
            .map(|k| {
                let s = if k % 3 == 0 { b.clone() } else { a.clone() };
                (s, removed(&format!("{writer}-{k:02}")))
            })
            .collect()
    };
    let (left, right) = tokio::join!(
        log.append_each(racing("left")),
        log.append_each(racing("right"))
    );
    left.expect("left writer");
    right.expect("right writer");
    let all = read_all(log).await;
    assert_eq!(all.len(), 30);
    for writer in ["left", "right"] {
        for s in [&a, &b] {
            let ids: Vec<&str> = all
                .iter()
                .filter(|e| e.envelope.subject == s.as_str() && e.envelope.id.starts_with(writer))
                .map(|e| e.envelope.id.as_str())
                .collect();
            let mut sorted = ids.clone();
            sorted.sort();
            assert_eq!(ids, sorted, "{writer}'s events on {s} in order");
        }
    }
    let report = log.verify().await.unwrap();
    assert!(report.is_ok(), "every chain holds: {:?}", report.problems);
    assert_eq!(report.subjects, 3);

    // Bad input is refused whole.
    let err = log.append_each(Vec::new()).await.unwrap_err();
    assert!(matches!(err, LogError::InvalidBatch { .. }), "{err}");
    let err = log
        .append_each(vec![(a.clone(), removed("z1")), (b.clone(), removed("z1"))])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("appears twice"), "{err}");
    assert_eq!(
        read_all(log).await.len(),
        30,
        "a refused append writes nothing"
    );
}

/// The ids of `records`, in order.
fn ids(records: &[crate::StoredEvent]) -> Vec<&str> {
    records.iter().map(|r| r.envelope.id.as_str()).collect()
}

/// Two replicas of a service lead one after the other: what the first
/// appends after the second began its term is stored (nothing is deleted)
/// but fenced — no read or follow behind the fence hands it out, whether
/// started before or after, of the whole log or of the record's subject —
/// while what it appended before, and what writers without a term append,
/// is read as ever.
pub async fn a_deposed_leaders_records_are_fenced(log: std::sync::Arc<dyn EventLog>) {
    use crate::fence::Fenced;
    let node = subject("node.n1");
    let first = Fenced::new(log.clone());
    let second = Fenced::new(log.clone());
    let early = Fenced::new(log.clone());
    let t1 = first
        .begin_term("stack-assigner", "pod-a", 1)
        .await
        .expect("first term");
    assert_eq!(first.term(), Some(t1));
    first
        .append(&node, Expected::Any, vec![cordon("before", "n1", 2)])
        .await
        .expect("append in the first term");
    let mut whole = early.follow(None, 1).await.expect("follow");
    let mut of_node = early.follow(Some(node.clone()), 1).await.expect("follow");
    let t2 = second
        .begin_term("stack-assigner", "pod-b", 3)
        .await
        .expect("second term");
    assert!(t2 > t1);
    let deposed = first
        .append(&node, Expected::Any, vec![cordon("deposed", "n1", 4)])
        .await
        .expect("a deposed leader's append is stored");
    second
        .append(&node, Expected::Any, vec![cordon("leader", "n1", 5)])
        .await
        .expect("append in the second term");
    // Written without a term (an operator's tool, a node agent): never fenced.
    let plain = Fenced::new(log.clone());
    plain
        .append(&node, Expected::Any, vec![removed("plain")])
        .await
        .expect("append without a term");

    let stored = read_all(log.as_ref()).await;
    let kept = stored
        .iter()
        .find(|r| r.envelope.id == "deposed")
        .expect("the deposed leader's record is stored");
    assert_eq!(kept.sequence, deposed.last_sequence());
    assert_eq!(
        kept.envelope
            .term
            .as_ref()
            .map(|t| (t.service.as_str(), t.sequence)),
        Some(("stack-assigner", t1)),
        "the record carries its writer's term"
    );

    let reader = Fenced::new(log.clone());
    let all = read_all(&reader).await;
    let terms: Vec<&str> = all
        .iter()
        .filter(|r| r.envelope.event_type == "LeaderTermStarted")
        .map(|r| r.envelope.subject.as_str())
        .collect();
    assert_eq!(terms, ["cluster.leaders", "cluster.leaders"]);
    let records: Vec<&str> = ids(&all)
        .into_iter()
        .filter(|id| !id.contains("-term-"))
        .collect();
    assert_eq!(records, ["before", "leader", "plain"]);
    let by_subject = Fenced::new(log.clone())
        .read(ReadRequest {
            subject: Some(node.clone()),
            from: 0,
            limit: None,
        })
        .await
        .expect("read");
    assert_eq!(ids(&by_subject), ["before", "leader", "plain"]);
    // A page cut by the limit is filled from past the fenced record.
    let page = Fenced::new(log.clone())
        .read(ReadRequest {
            subject: Some(node.clone()),
            from: 0,
            limit: Some(2),
        })
        .await
        .expect("read");
    assert_eq!(ids(&page), ["before", "leader"]);

    let mut followed = Vec::new();
    while followed.len() < 5 {
        followed.push(next_id(&mut whole).await);
    }
    let followed: Vec<&str> = followed
        .iter()
        .map(String::as_str)
        .filter(|id| !id.contains("-term-"))
        .collect();
    assert_eq!(followed, ["before", "leader", "plain"]);
    for id in ["before", "leader", "plain"] {
        assert_eq!(next_id(&mut of_node).await, id);
    }
    let mut late = Fenced::new(log.clone())
        .follow(Some(node.clone()), 1)
        .await
        .expect("follow");
    for id in ["before", "leader", "plain"] {
        assert_eq!(next_id(&mut late).await, id);
    }
}

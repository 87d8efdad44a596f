//! The JetStream backend through a nats-server crash: the server is killed with
//! SIGKILL while writers append, stays down until appends have timed out and
//! been retried, and comes back on the same port and store. The
//! client reconnects, appends caught in the outage are retried with the same ids,
//! and afterwards every acknowledged event is in the stream exactly once —
//! for atomic batches and for events appended one by one (`append_each`).
//! A follower started before the crash outlives its consumer (which the
//! server forgot) and passes on every record once, in order.
//!
//! A record some other client published on the log's subjects, bytes that
//! are no envelope, is passed over by readers and followers and named by
//! `verify`; it stops nobody.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use switchyard_eventlog::nats::{NatsLog, NatsOptions};
use switchyard_eventlog::{
    Decoded, EventLog, Expected, NewEvent, ReadRequest, Subject, UnknownReason,
};
use switchyard_proto::v1::{NodeRemoved, domain_event::Kind};
use switchyard_testkit::nats::{NatsOptions as ServerOptions, NatsServer};
use tokio::sync::mpsc;

const WRITERS: usize = 4;
/// Appends each writer makes after the restart before it stops.
const APPENDS_AFTER_RESTART: usize = 50;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_killed_mid_stream_loses_nothing_and_stores_retries_once() {
    let server = tokio::task::spawn_blocking(|| {
        NatsServer::start_with(ServerOptions {
            sync_always: true,
            ..ServerOptions::default()
        })
    })
    .await
    .unwrap();
    let options = NatsOptions {
        ack_timeout: Duration::from_secs(2),
        ..NatsOptions::default()
    };
    let log = Arc::new(
        NatsLog::connect(&server.url(), options)
            .await
            .expect("connect"),
    );

    // Follows from the start, through the crash.
    let mut follower = log.follow(None, 1).await.expect("follow");
    let (acks, mut acked_rx) = mpsc::unbounded_channel::<(String, u64)>();
    let restarted = Arc::new(AtomicBool::new(false));
    let mut writers = Vec::new();
    for writer in 0..WRITERS {
        let log = log.clone();
        let acks = acks.clone();
        let restarted = restarted.clone();
        writers.push(tokio::spawn(async move {
            let subject = Subject::new(format!("restart.writer-{writer}")).unwrap();
            let side = Subject::new(format!("restart.writer-{writer}-side")).unwrap();
            let mut expected = Expected::Empty;
            // Writers never pause, so the kill always catches appends in flight.
            let mut after_restart = 0;
            for n in 0.. {
                if restarted.load(Ordering::SeqCst) {
                    after_restart += 1;
                    if after_restart > APPENDS_AFTER_RESTART {
                        break;
                    }
                }
                // Batches of one to three events, every other one on the
                // writer's second subject: one atomic batch across both, or
                // (odd writers) the events one by one.
                let batch: Vec<(Subject, NewEvent)> = (0..1 + n % 3)
                    .map(|i| {
                        let id = format!("w{writer}-{n}-{i}");
                        let on = if i % 2 == 0 { &subject } else { &side };
                        let event = NewEvent::new(
                            id.clone(),
                            n as i64,
                            Kind::NodeRemoved(NodeRemoved { node: id }).into(),
                        );
                        (on.clone(), event)
                    })
                    .collect();
                let ids: Vec<String> = batch.iter().map(|(_, e)| e.id.clone()).collect();
                let ack = if writer % 2 == 1 {
                    // Half the writers append their events one by one.
                    log.append_each(batch).await
                } else {
                    log.append_batch(batch, &[(subject.clone(), expected)])
                        .await
                }
                .expect("append survives the restart");
                let last_on_subject = ack.sequences.iter().step_by(2).next_back();
                expected = Expected::Sequence(*last_on_subject.expect("one event on it"));
                for (id, seq) in ids.into_iter().zip(ack.sequences) {
                    acks.send((id, seq)).unwrap();
                }
            }
        }));
    }
    drop(acks);

    let mut acked = BTreeMap::new();
    while acked.len() < 200 {
        let (id, seq) = acked_rx.recv().await.expect("writers running");
        assert!(acked.insert(id, seq).is_none());
    }
    // Down long enough that appends time out and are retried: wait for the
    // first retry (a condition with a deadline), then bring the server back.
    let mut server = server;
    server.kill();
    switchyard_testkit::eventually(
        "an append retried while the server is down",
        Duration::from_secs(30),
        || std::future::ready(log.retried_publishes() > 0),
    )
    .await
    .unwrap();
    let server = tokio::task::spawn_blocking(move || {
        server.restart();
        server
    })
    .await
    .unwrap();
    restarted.store(true, Ordering::SeqCst);
    while let Some((id, seq)) = acked_rx.recv().await {
        assert!(
            acked.insert(id.clone(), seq).is_none(),
            "{id} acknowledged twice"
        );
    }
    for writer in writers {
        writer.await.unwrap();
    }

    let events = log
        .read(ReadRequest::default())
        .await
        .expect("read after restart");
    let mut stored = BTreeMap::new();
    for event in &events {
        assert!(
            stored
                .insert(event.envelope.id.clone(), event.sequence)
                .is_none(),
            "event {} stored twice",
            event.envelope.id
        );
    }
    assert_eq!(
        stored, acked,
        "exactly the acknowledged events, at their acknowledged sequences"
    );
    let report = log.verify().await.unwrap();
    assert!(report.is_ok(), "{:?}", report.problems);
    assert!(
        log.retried_publishes() > 0,
        "the restart should have interrupted some appends"
    );
    let mut followed = Vec::new();
    while followed.len() < events.len() {
        let event = tokio::time::timeout(Duration::from_secs(30), follower.next())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "the follower stopped after {} of {} records",
                    followed.len(),
                    events.len()
                )
            })
            .expect("the follow stream does not end")
            .expect("the follower outlives the server's restart");
        followed.push((event.sequence, event.envelope.id));
    }
    let stored_in_order: Vec<(u64, String)> = events
        .iter()
        .map(|e| (e.sequence, e.envelope.id.clone()))
        .collect();
    assert_eq!(
        followed, stored_in_order,
        "every record followed once, in order, across the restart"
    );
    drop(server);
}

/// An event on `node.<id>`'s kind, named `id`.
fn node_event(id: &str) -> NewEvent {
    NewEvent::new(
        id,
        1,
        Kind::NodeRemoved(NodeRemoved { node: id.into() }).into(),
    )
}

/// A log on `server` holding one record, "before" on `node.n1`, and a
/// follower from its start.
async fn one_record_followed(
    server: &NatsServer,
) -> (
    NatsLog,
    Subject,
    futures::stream::BoxStream<
        'static,
        Result<switchyard_eventlog::StoredEvent, switchyard_eventlog::LogError>,
    >,
) {
    let log = NatsLog::connect(&server.url(), NatsOptions::default())
        .await
        .expect("connect");
    let subject = Subject::new("node.n1").unwrap();
    log.append(&subject, Expected::Any, vec![node_event("before")])
        .await
        .unwrap();
    let follower = log.follow(None, 1).await.expect("follow");
    (log, subject, follower)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_that_is_no_envelope_is_passed_over_and_named() {
    let server = tokio::task::spawn_blocking(NatsServer::start)
        .await
        .unwrap();
    let (log, subject, mut follower) = one_record_followed(&server).await;
    // Eleven bytes on the log's subjects from a client that is no writer.
    let js = async_nats::jetstream::new(log.client().clone());
    let ack = js
        .publish("switchyard.log.junk", "not a proto".into())
        .await
        .expect("publish")
        .await
        .expect("stored");
    let junk = ack.sequence;
    log.append(&subject, Expected::Any, vec![node_event("after")])
        .await
        .expect("the log still takes appends");

    let mut seen = Vec::new();
    while seen.len() < 3 {
        let event = tokio::time::timeout(Duration::from_secs(30), follower.next())
            .await
            .expect("the follower goes on past the record")
            .expect("the follow stream does not end")
            .expect("a record that is no envelope is no error");
        seen.push(event);
    }
    let read = log.read(ReadRequest::default()).await.expect("read");
    for events in [&seen, &read] {
        let described: Vec<(u64, String, bool)> = events
            .iter()
            .map(|e| {
                let malformed = matches!(
                    e.decode(),
                    Decoded::Unknown {
                        reason: UnknownReason::Malformed(_),
                        ..
                    }
                );
                (e.sequence, e.envelope.subject.clone(), malformed)
            })
            .collect();
        assert_eq!(
            described,
            vec![
                (1, "node.n1".to_string(), false),
                (junk, "junk".to_string(), true),
                (junk + 1, "node.n1".to_string(), false),
            ]
        );
    }
    assert_eq!(seen[1].raw.as_ref(), b"not a proto", "kept as stored");
    let report = log.verify().await.unwrap();
    assert_eq!(report.records, 3);
    let named: Vec<(Option<u64>, &str)> = report
        .problems
        .iter()
        .map(|p| (p.sequence, p.what.as_str()))
        .collect();
    assert_eq!(named.len(), 1, "{named:?}");
    assert_eq!(named[0].0, Some(junk));
    assert!(
        named[0].1.contains("does not decode as an Envelope"),
        "{named:?}"
    );
}

/// A follower that is waiting for the next record when the server is killed
/// and started again passes on the first record appended after its return
/// within seconds: it sees the client reconnected to a new server and makes
/// its consumer again there, rather than waiting out the consumer's missed
/// heartbeats and retries (15 s and more, while a service decides on a
/// stale view).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_follower_resumes_at_once_after_a_server_restart() {
    let mut server = tokio::task::spawn_blocking(NatsServer::start)
        .await
        .unwrap();
    let (log, subject, mut follower) = one_record_followed(&server).await;
    let first = follower.next().await.unwrap().unwrap();
    assert_eq!(first.envelope.id, "before");

    let server_before = log.client().server_info().server_id;
    server = tokio::task::spawn_blocking(move || {
        server.kill();
        server.restart();
        server
    })
    .await
    .unwrap();
    // The append waits for the client's reconnection and is retried.
    log.append(&subject, Expected::Any, vec![node_event("after")])
        .await
        .expect("append after the restart");
    assert_ne!(
        log.client().server_info().server_id,
        server_before,
        "a restarted nats-server has a new id"
    );
    let appended = std::time::Instant::now();
    let next = tokio::time::timeout(Duration::from_secs(5), follower.next())
        .await
        .expect("the follower passes on a record appended after the restart within 5 s")
        .unwrap()
        .unwrap();
    assert_eq!(next.envelope.id, "after");
    eprintln!(
        "followed the first record after the restart {:?} after it was appended",
        appended.elapsed()
    );
    drop(server);
}

/// A publish no server answers is retried only while the stream exists (on
/// a cluster, between leaders); the log's stream deleted under a writer is
/// refused at once, naming the subject, not retried for `retry_for`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_to_a_deleted_stream_is_refused_not_retried() {
    let server = tokio::task::spawn_blocking(NatsServer::start)
        .await
        .expect("start nats-server");
    let options = NatsOptions {
        // Long enough that a retried append would outlast the test's wait.
        retry_for: Duration::from_secs(3600),
        ..NatsOptions::default()
    };
    let log = NatsLog::connect(&server.url(), options.clone())
        .await
        .unwrap();
    let subject = Subject::new("node.n1").unwrap();
    log.append(&subject, Expected::Any, vec![node_event("before")])
        .await
        .unwrap();
    async_nats::jetstream::new(log.client().clone())
        .delete_stream(&options.stream)
        .await
        .unwrap();

    let refused = tokio::time::timeout(
        Duration::from_secs(60),
        log.append_each(vec![(subject.clone(), node_event("after"))]),
    )
    .await
    .expect("refused, not retried for an hour");
    let err = refused.expect_err("no stream to append to").to_string();
    assert!(err.contains("node.n1"), "{err}");
    assert!(err.contains("no stream found"), "{err}");
    assert_eq!(log.retried_publishes(), 0);
}

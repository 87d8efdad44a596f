//! The JetStream backend through a nats-server crash: the server is killed with
//! SIGKILL while writers append, stays down until appends have timed out and
//! been retried, and comes back on the same port and store. The
//! client reconnects, appends caught in the outage are retried with the same ids,
//! and afterwards every acknowledged event is in the stream exactly once —
//! for atomic batches and for events appended one by one (`append_each`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use switchyard_eventlog::nats::{NatsLog, NatsOptions};
use switchyard_eventlog::{EventLog, Expected, NewEvent, ReadRequest, Subject};
use switchyard_proto::v1::{NodeRemoved, domain_event::Kind};
use switchyard_testkit::nats::{NatsOptions as ServerOptions, NatsServer};
use tokio::sync::mpsc;

const WRITERS: usize = 4;
/// Appends each writer makes after the restart before it stops.
const APPENDS_AFTER_RESTART: usize = 50;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_killed_mid_stream_loses_nothing_and_stores_retries_once() {
    let server =
        tokio::task::spawn_blocking(|| NatsServer::start_with(ServerOptions { sync_always: true }))
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
    drop(server);
}

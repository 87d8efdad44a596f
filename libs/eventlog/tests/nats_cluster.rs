//! The JetStream backend on a cluster of three nats-servers (loopback, each
//! route through a proxy of its own), the stream at R3, writers appending
//! all along, through three faults in turn: the stream's leader killed with
//! SIGKILL (and started again), a server cut off from the other two (and
//! joined again), and a server's store wiped (it rejoins with nothing). After
//! each, appends go on. Once the cluster has healed, every server's own
//! store holds the whole stream, and the log holds exactly the acknowledged
//! records, each once, at its acknowledged sequence.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use switchyard_eventlog::nats::{NatsLog, NatsOptions};
use switchyard_eventlog::{EventLog, Expected, NewEvent, ReadRequest, Subject};
use switchyard_proto::v1::{NodeRemoved, domain_event::Kind};
use switchyard_testkit::eventually;
use switchyard_testkit::nats::{NatsCluster, NatsOptions as ServerOptions};
use tokio::sync::mpsc;

const WRITERS: usize = 3;
/// Appends acknowledged after a fault before the next one strikes.
const BETWEEN_FAULTS: usize = 60;
const WAIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_appends_outlive_a_leader_killed_a_server_cut_off_and_a_store_wiped() {
    let cluster = tokio::task::spawn_blocking(|| {
        NatsCluster::start(
            3,
            ServerOptions {
                sync_always: true,
                ..ServerOptions::default()
            },
        )
    })
    .await
    .unwrap();
    cluster.until_formed(WAIT).await.unwrap();
    let options = NatsOptions {
        create: true,
        replicas: 3,
        ack_timeout: Duration::from_secs(2),
        ..NatsOptions::default()
    };
    let log = Arc::new(
        NatsLog::connect(&cluster.url(), options)
            .await
            .expect("create the stream at R3"),
    );

    let (acks, mut acked_rx) = mpsc::unbounded_channel::<(String, u64)>();
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicUsize::new(0));
    let mut writers = Vec::new();
    for writer in 0..WRITERS {
        let (log, acks, stop, count) = (log.clone(), acks.clone(), stop.clone(), count.clone());
        writers.push(tokio::spawn(async move {
            let subject = Subject::new(format!("cluster.writer-{writer}")).unwrap();
            let mut expected = Expected::Empty;
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                let id = format!("w{writer}-{n}");
                let event = NewEvent::new(
                    id.clone(),
                    n as i64,
                    Kind::NodeRemoved(NodeRemoved { node: id.clone() }).into(),
                );
                // The writer's own subject, each append checked against its
                // last: a retry of an append the old leader stored is
                // recognised by its id, never stored twice.
                let ack = log
                    .append(&subject, expected, vec![event])
                    .await
                    .unwrap_or_else(|e| panic!("{id}: {e}"));
                expected = Expected::Sequence(ack.last_sequence());
                acks.send((id, ack.last_sequence())).unwrap();
                count.fetch_add(1, Ordering::SeqCst);
                n += 1;
            }
        }));
    }
    drop(acks);
    let appends_go_on = |what: String| {
        let count = count.clone();
        let from = count.load(Ordering::SeqCst);
        async move {
            eventually(&what, WAIT, || {
                std::future::ready(count.load(Ordering::SeqCst) >= from + BETWEEN_FAULTS)
            })
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        }
    };
    appends_go_on("appends before the faults".into()).await;

    // The stream's leader killed; a new one is elected and appends go on.
    let leader = stream_leader(&cluster).await;
    let mut cluster = cluster;
    cluster.servers[leader].kill();
    // A reader started meanwhile (a command typed) opens the log: what the
    // stream's info request meets between leaders is tried again.
    NatsLog::connect(
        &cluster.url(),
        NatsOptions {
            create: false,
            replicas: 3,
            ..NatsOptions::default()
        },
    )
    .await
    .expect("the log opened while its stream's leader is down");
    appends_go_on(format!("appends after n{leader}, the leader, was killed")).await;
    let mut cluster = tokio::task::spawn_blocking(move || {
        cluster.servers[leader].restart();
        cluster
    })
    .await
    .unwrap();

    // A server the writers are not connected to, cut off from the others.
    let connected = connected_to(&log);
    let cut = (0..3).find(|&i| i != connected).unwrap();
    cluster.cut_off(cut);
    let alone = eventually(&format!("n{cut} to have no route"), WAIT, || async {
        cluster.routed_to(cut).await.is_ok_and(|r| r.is_empty())
    })
    .await;
    assert!(
        alone.is_ok(),
        "n{cut} routed to {:?}",
        cluster.routed_to(cut).await
    );
    appends_go_on(format!("appends while n{cut} is cut off")).await;
    cluster.rejoin(cut);
    let others: std::collections::BTreeSet<String> = (0..3)
        .filter(|&i| i != cut)
        .map(|i| format!("n{i}"))
        .collect();
    eventually(
        &format!("n{cut} routed to the others again"),
        WAIT,
        || async { cluster.routed_to(cut).await.is_ok_and(|r| r == others) },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}"));

    // A server's store wiped: it rejoins with nothing and catches up.
    let connected = connected_to(&log);
    let wiped = (0..3).rev().find(|&i| i != connected).unwrap();
    let cluster = tokio::task::spawn_blocking(move || {
        cluster.wipe(wiped);
        cluster
    })
    .await
    .unwrap();
    appends_go_on(format!("appends after n{wiped}'s store was wiped")).await;

    stop.store(true, Ordering::SeqCst);
    for writer in writers {
        writer.await.unwrap();
    }
    let mut acked = BTreeMap::new();
    while let Some((id, seq)) = acked_rx.recv().await {
        assert!(
            acked.insert(id.clone(), seq).is_none(),
            "{id} acknowledged twice"
        );
    }

    // Healed: each server's own store holds every record.
    let head = log.last_sequence(None).await.expect("the log's head");
    let stored = |i: usize| cluster.stream_state(i, "SWITCHYARD_LOG");
    for i in 0..3 {
        let held = eventually(&format!("n{i} to hold the whole stream"), WAIT, || async {
            stored(i).await == Some((head, head))
        })
        .await;
        assert!(
            held.is_ok(),
            "n{i} holds (last sequence, records) {:?}, the log's head is {head}",
            stored(i).await
        );
    }
    let events = log.read(ReadRequest::default()).await.expect("read");
    let mut found = BTreeMap::new();
    for event in &events {
        assert!(
            found
                .insert(event.envelope.id.clone(), event.sequence)
                .is_none(),
            "{} stored twice",
            event.envelope.id
        );
    }
    assert_eq!(
        found, acked,
        "exactly the acknowledged records, at their acknowledged sequences"
    );
    let report = log.verify().await.expect("verify");
    assert!(report.is_ok(), "{:?}", report.problems);
}

/// The server (`nN`) leading the stream, as the cluster reports it.
async fn stream_leader(cluster: &NatsCluster) -> usize {
    let leader = std::cell::Cell::new(None);
    eventually("the stream to have a leader", WAIT, || async {
        leader.set(cluster.stream_leader("SWITCHYARD_LOG").await);
        leader.get().is_some()
    })
    .await
    .unwrap_or_else(|e| panic!("{e}"));
    leader.get().unwrap()
}

/// The server (`nN`) the log's client is connected to.
fn connected_to(log: &NatsLog) -> usize {
    let name = log.client().server_info().server_name;
    name.strip_prefix('n')
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("connected to {name:?}, no server of the cluster"))
}

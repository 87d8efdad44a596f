//! The JetStream backend's knowledge of subject heads: a writer that follows
//! the log chains its next append to what it has seen, without asking the
//! server first; one that does not asks, and still chains right.

use futures::StreamExt;
use switchyard_eventlog::nats::{NatsLog, NatsOptions};
use switchyard_eventlog::{EventLog, Expected, NewEvent, Subject};
use switchyard_proto::v1::{NodeRemoved, domain_event::Kind};
use switchyard_testkit::nats::NatsServer;

fn removed(id: &str) -> NewEvent {
    NewEvent::new(
        id,
        1,
        Kind::NodeRemoved(NodeRemoved { node: id.into() }).into(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_appends_where_others_wrote_without_reading_heads() {
    let server = tokio::task::spawn_blocking(NatsServer::start)
        .await
        .expect("start nats-server");
    let url = server.url();
    let connect = || NatsLog::connect(&url, NatsOptions::default());
    let (follower, bystander, other) = (
        connect().await.unwrap(),
        connect().await.unwrap(),
        connect().await.unwrap(),
    );
    let (s, t) = (
        Subject::new("node.n1").unwrap(),
        Subject::new("node.n2").unwrap(),
    );
    follower
        .append(&s, Expected::Empty, vec![removed("e1")])
        .await
        .unwrap();
    bystander
        .append(&t, Expected::Empty, vec![removed("e2")])
        .await
        .unwrap();
    let mut follow = follower.follow(None, 1).await.unwrap();

    // Another writer moves both subjects on: both caches are now behind.
    other
        .append_batch(
            vec![(s.clone(), removed("e3")), (t.clone(), removed("e4"))],
            &[],
        )
        .await
        .unwrap();
    loop {
        let seen = follow.next().await.expect("follow runs").unwrap();
        if seen.envelope.id == "e4" {
            break;
        }
    }

    let before = follower.head_reads();
    let ack = follower
        .append_batch(
            vec![(s.clone(), removed("e5")), (t.clone(), removed("e6"))],
            &[
                (s.clone(), Expected::Sequence(3)),
                (t.clone(), Expected::Sequence(4)),
            ],
        )
        .await
        .expect("the follower's heads are current");
    assert_eq!(ack.sequences, [5, 6]);
    assert_eq!(
        follower.head_reads(),
        before,
        "the follower read no head from the server"
    );

    let before = bystander.head_reads();
    bystander
        .append_batch(
            vec![(t.clone(), removed("e7")), (s.clone(), removed("e8"))],
            &[],
        )
        .await
        .expect("a stale cache is corrected, not refused");
    assert!(
        bystander.head_reads() > before,
        "a writer that did not follow had to read the heads"
    );
    let report = follower.verify().await.unwrap();
    assert!(report.is_ok(), "every chain holds: {:?}", report.problems);
    assert_eq!(report.records, 8);
}

//! The two backends are interchangeable: random workloads (appends with right,
//! stale and no expectations, lost-ack retries) give the same outcomes and
//! byte-identical records on the embedded log and on JetStream.

use std::sync::atomic::{AtomicUsize, Ordering};

use proptest::prelude::*;
use switchyard_eventlog::embedded::{EmbeddedLog, EmbeddedOptions};
use switchyard_eventlog::nats::{NatsLog, NatsOptions};
use switchyard_eventlog::{EventLog, ReadRequest};
use switchyard_system_tests::{Outcome, op, run_ops};
use switchyard_testkit::nats::NatsServer;

#[test]
fn embedded_and_jetstream_agree_on_every_outcome_and_byte() {
    let server = NatsServer::start();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let case = AtomicUsize::new(0);
    let (retried, refused) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let config = ProptestConfig {
        cases: 48,
        ..ProptestConfig::default()
    };
    proptest!(config, |(ops in proptest::collection::vec(op(), 1..40))| {
        runtime.block_on(async {
            let n = case.fetch_add(1, Ordering::Relaxed);
            let dir = tempfile::tempdir().unwrap();
            let embedded = EmbeddedLog::open(dir.path(), EmbeddedOptions::default()).unwrap();
            let options = NatsOptions {
                stream: format!("PARITY_{n}"),
                subject_prefix: format!("parity{n}"),
                ..NatsOptions::default()
            };
            let nats = NatsLog::connect(&server.url(), options).await.unwrap();

            let on_embedded = run_ops(&embedded, &ops).await;
            let on_nats = run_ops(&nats, &ops).await;
            prop_assert_eq!(&on_embedded, &on_nats);
            for outcome in &on_embedded {
                match outcome {
                    Outcome::Stored(ack) if ack.duplicates > 0 => retried.fetch_add(1, Ordering::Relaxed),
                    Outcome::Refused(_) => refused.fetch_add(1, Ordering::Relaxed),
                    Outcome::Stored(_) => 0,
                };
            }

            let a = embedded.read(ReadRequest::default()).await.unwrap();
            let b = nats.read(ReadRequest::default()).await.unwrap();
            prop_assert_eq!(a.len(), b.len());
            for (x, y) in a.iter().zip(&b) {
                prop_assert_eq!(x.sequence, y.sequence);
                prop_assert_eq!(&x.raw, &y.raw, "record {} differs", x.sequence);
            }
            prop_assert!(embedded.verify().await.unwrap().is_ok());
            prop_assert!(nats.verify().await.unwrap().is_ok());
            Ok(())
        })?;
    });
    // The workloads did exercise the interesting paths.
    assert!(
        retried.load(Ordering::Relaxed) > 0,
        "no lost-ack retry was generated"
    );
    assert!(
        refused.load(Ordering::Relaxed) > 0,
        "no stale expectation was generated"
    );
}

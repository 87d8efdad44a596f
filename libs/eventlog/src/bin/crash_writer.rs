//! Appends to an embedded log until killed, printing every acknowledged event.
//!
//! Used by the crash test (`tests/crash.rs`), which kills this process with
//! SIGKILL at arbitrary points and checks that every event printed here — every
//! acknowledged event — is in the log exactly once afterwards.
//!
//! `eventlog-crash-writer DIR RUN WRITERS SEGMENT_BYTES`: WRITERS tasks append
//! batches of 1 to 4 events with ids `RUN-<writer>-<n>-<i>` (group commit,
//! segments of SEGMENT_BYTES); each acknowledged event is printed as
//! `ack <id> <sequence>`.

use std::io::Write;

use switchyard_eventlog::embedded::{EmbeddedLog, EmbeddedOptions};
use switchyard_eventlog::{EventLog, Expected, NewEvent, Subject};
use switchyard_proto::v1::{NodeRemoved, domain_event::Kind};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, dir, run, writers, segment_bytes] = args.as_slice() else {
        eprintln!("usage: eventlog-crash-writer DIR RUN WRITERS SEGMENT_BYTES");
        std::process::exit(2);
    };
    let writers: usize = writers.parse().expect("WRITERS is a number");
    let options = EmbeddedOptions {
        segment_bytes: segment_bytes.parse().expect("SEGMENT_BYTES is a number"),
        ..EmbeddedOptions::default()
    };
    let log = std::sync::Arc::new(EmbeddedLog::open(dir, options).expect("open log"));
    let mut tasks = Vec::new();
    for writer in 0..writers {
        let log = log.clone();
        let run = run.clone();
        tasks.push(tokio::spawn(async move {
            let subject = Subject::new(format!("crash.writer-{writer}")).unwrap();
            let mut expected = Expected::Sequence(log.last_sequence(Some(&subject)).await.unwrap());
            for n in 0u64.. {
                let batch = 1 + (n % 4) as usize;
                let events: Vec<NewEvent> = (0..batch)
                    .map(|i| {
                        let id = format!("{run}-{writer}-{n}-{i}");
                        let event = Kind::NodeRemoved(NodeRemoved { node: id.clone() }).into();
                        NewEvent::new(id, n as i64, event).with_actor("crash-writer")
                    })
                    .collect();
                let ids: Vec<String> = events.iter().map(|e| e.id.clone()).collect();
                let ack = log
                    .append(&subject, expected, events)
                    .await
                    .expect("append");
                expected = Expected::Sequence(ack.last_sequence());
                let mut out = std::io::stdout().lock();
                for (id, seq) in ids.iter().zip(&ack.sequences) {
                    writeln!(out, "ack {id} {seq}").unwrap();
                }
                out.flush().unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

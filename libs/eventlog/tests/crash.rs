//! Crash safety of the embedded log: a writer process is killed with SIGKILL at
//! arbitrary points, many times over one directory. After every kill, each event
//! the writer saw acknowledged is in the log exactly once, at the acknowledged
//! sequence, and the whole log verifies.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use switchyard_eventlog::embedded::{EmbeddedLog, EmbeddedOptions, verify_dir};
use switchyard_eventlog::{EventLog, ReadRequest};

/// splitmix64: a fixed, seeded sequence of kill points, so a failure reproduces.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_never_loses_or_duplicates_an_acknowledged_event() {
    let dir = tempfile::tempdir().unwrap();
    let mut seed = 0x5EED_u64;
    let mut acked: BTreeMap<String, u64> = BTreeMap::new();
    let iterations = 30;
    let mut torn_tails = 0;
    for run in 0..iterations {
        let kill_after = 1 + (splitmix(&mut seed) % 2500) as usize;
        let writers = 1 + (splitmix(&mut seed) % 8) as usize;
        let mut child = Command::new(env!("CARGO_BIN_EXE_eventlog-crash-writer"))
            .args([
                dir.path().to_str().unwrap(),
                &format!("r{run}"),
                &writers.to_string(),
                "262144",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the crash writer");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let mut parts = line.split(' ');
                if let (Some("ack"), Some(id), Some(seq)) =
                    (parts.next(), parts.next(), parts.next())
                    && tx
                        .send((id.to_string(), seq.parse::<u64>().unwrap()))
                        .is_err()
                {
                    break;
                }
            }
        });
        // Wait for `kill_after` acknowledgements (condition with a deadline), then kill.
        let mut seen = 0;
        while seen < kill_after {
            let (id, seq) = rx
                .recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|_| panic!("run {run}: writer stalled after {seen} acks"));
            assert!(
                acked.insert(id.clone(), seq).is_none(),
                "id {id} acknowledged twice"
            );
            seen += 1;
        }
        child.kill().expect("SIGKILL the writer");
        child.wait().unwrap();
        // Acks printed before the kill landed still count.
        reader.join().unwrap();
        while let Ok((id, seq)) = rx.try_recv() {
            assert!(
                acked.insert(id.clone(), seq).is_none(),
                "id {id} acknowledged twice"
            );
        }

        let log = EmbeddedLog::open(dir.path(), EmbeddedOptions::default())
            .expect("reopen after SIGKILL");
        torn_tails += log.open_report().torn_tail.is_some() as u32;
        let events = log.read(ReadRequest::default()).await.unwrap();
        let mut stored: BTreeMap<&str, u64> = BTreeMap::new();
        for event in &events {
            assert!(
                stored
                    .insert(event.envelope.id.as_str(), event.sequence)
                    .is_none(),
                "run {run}: event {} stored twice",
                event.envelope.id
            );
        }
        for (id, seq) in &acked {
            assert_eq!(
                stored.get(id.as_str()),
                Some(seq),
                "run {run}: acknowledged event {id} lost or moved"
            );
        }
        // Batches are whole: the writer appends `1 + n % 4` events as batch n.
        for id in stored.keys() {
            let mut parts = id.rsplitn(3, '-');
            let (_, n, prefix) = (parts.next(), parts.next().unwrap(), parts.next().unwrap());
            let size = 1 + n.parse::<usize>().unwrap() % 4;
            for i in 0..size {
                let member = format!("{prefix}-{n}-{i}");
                assert!(
                    stored.contains_key(member.as_str()),
                    "run {run}: batch of {id} is missing {member}"
                );
            }
        }
        let report = log.verify().await.unwrap();
        assert!(report.is_ok(), "run {run}: {:?}", report.problems);
        assert_eq!(report.records, events.len() as u64);
        drop(log);
        assert!(verify_dir(dir.path()).unwrap().is_ok());
    }
    let segments = std::fs::read_dir(dir.path())
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "seg")
        })
        .count();
    eprintln!(
        "{iterations} kills, {} acknowledged events kept, {torn_tails} torn tails repaired, {segments} segments",
        acked.len()
    );
    assert!(segments > 1, "the test should cross segment boundaries");
}

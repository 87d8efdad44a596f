//! A fixture file is watched: a card whose `healthy` changes in the file is
//! a health change, as NVML's XID events are; a file that does not load is
//! skipped, its last good reading standing.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use switchyard_gpu::HealthChange;

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../deploy/fixtures/h100-8x.yaml"
);
const CARD_1: &str = "GPU-3ef55733-cf85-53bf-be69-2146f74a0ed8";

fn write(path: &std::path::Path, text: &str) {
    let partial = path.with_extension("partial");
    std::fs::write(&partial, text).unwrap();
    std::fs::rename(partial, path).unwrap();
}

#[test]
fn edits_to_the_fixture_are_health_changes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("machine.yaml");
    let original = std::fs::read_to_string(FIXTURE).unwrap();
    write(&path, &original);
    let source = switchyard_gpu::source(&format!("fixture:{}", path.display())).unwrap();
    let (tx, rx) = mpsc::channel::<HealthChange>();
    let stop = Arc::new(AtomicBool::new(false));
    let watching = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            source.watch_health(&mut |change| {
                if stop.load(Ordering::SeqCst) {
                    return false;
                }
                tx.send(change).is_ok()
            })
        })
    };
    let next_change = || loop {
        let change = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("a change within 10 s");
        if !change.is_probe() {
            return change;
        }
    };
    // Probes come while nothing changes.
    assert!(rx.recv_timeout(Duration::from_secs(10)).unwrap().is_probe());

    // A broken file is skipped; the next good one is compared with the last good one.
    write(&path, "gpus: [");
    assert!(rx.recv_timeout(Duration::from_secs(10)).unwrap().is_probe());
    let unhealthy = original.replace("- index: 1\n", "- index: 1\n  healthy: false\n");
    assert_ne!(unhealthy, original);
    write(&path, &unhealthy);
    let change = next_change();
    assert_eq!((change.uuid.as_str(), change.healthy), (CARD_1, false));
    assert!(
        change.reason.contains("healthy: false"),
        "{}",
        change.reason
    );

    write(&path, &original);
    let change = next_change();
    assert_eq!((change.uuid.as_str(), change.healthy), (CARD_1, true));

    // Nothing else changed: only probes follow, until the sink says stop.
    assert!(rx.recv_timeout(Duration::from_secs(10)).unwrap().is_probe());
    stop.store(true, Ordering::SeqCst);
    watching.join().unwrap().unwrap();
}

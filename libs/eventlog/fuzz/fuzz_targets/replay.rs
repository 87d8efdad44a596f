//! Any records, as domain events, replayed into every service's core: the
//! rebuild of a (re)started service (every record folded, then caught up)
//! and a running one (deciding on each record as it arrives, then on time
//! passing) never panic, whatever the records say — a record on the log
//! may have been written by anyone who could publish there.
//!
//! The input is events (`DomainEvent` protobuf bytes) separated by
//! [`SEPARATOR`]; each is recorded a second after the one before.
//!
//! Run: `scripts/fuzz.sh` (all targets), or
//! `cd libs/eventlog/fuzz && cargo +nightly fuzz run replay -- -max_total_time=60`

#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use switchyard_core::Input;
use switchyard_core::cores;
use switchyard_core::events::DomainEvent;

/// Separates the events of an input (as `examples/seeds.rs` writes them).
const SEPARATOR: &[u8] = b"\xffEVENT";
const START: i64 = 1_700_000_000_000_000_000;
const SECOND: i64 = 1_000_000_000;

fn split<'a>(data: &'a [u8], separator: &'a [u8]) -> impl Iterator<Item = &'a [u8]> {
    let mut rest = Some(data);
    std::iter::from_fn(move || {
        let current = rest?;
        match current
            .windows(separator.len())
            .position(|w| w == separator)
        {
            Some(at) => {
                rest = Some(&current[at + separator.len()..]);
                Some(&current[..at])
            }
            None => {
                rest = None;
                Some(current)
            }
        }
    })
}

fuzz_target!(|data: &[u8]| {
    let events: Vec<DomainEvent> = split(data, SEPARATOR)
        .filter_map(|bytes| DomainEvent::decode(bytes).ok())
        .filter(|event| event.kind.is_some())
        .collect();
    let end = START + SECOND * (events.len() as i64 + 1);

    let mut rebuilt = cores::all();
    for (i, event) in events.iter().enumerate() {
        for core in &mut rebuilt {
            core.fold(event, START + SECOND * i as i64);
        }
    }
    for core in &mut rebuilt {
        let _ = core.catch_up(end);
        let _ = core.effects();
        let _ = core.violations();
    }

    let mut running = cores::all();
    for (i, event) in events.iter().enumerate() {
        for core in &mut running {
            let _ = core.decide(Input::Record(event), START + SECOND * i as i64);
        }
    }
    for core in &mut running {
        let _ = core.decide(Input::Tick, end + 3600 * SECOND);
        let _ = core.effects();
        let _ = core.violations();
    }
});

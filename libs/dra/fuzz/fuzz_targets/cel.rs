//! Any text as a DRA selector, compiled and evaluated against a device: the
//! compiler and both evaluators never panic nor overflow a 2 MiB stack (a
//! tokio worker's); the native fast path and the interpreter agree on every
//! result; a fast selector's outcome does not change with an attribute or
//! capacity it does not read.
//!
//! The first byte chooses the device, the rest is the expression.
//!
//! Run: `scripts/fuzz.sh` (all targets), or
//! `cd libs/dra/fuzz && cargo +nightly fuzz run cel -- -max_total_time=60 -max_len=12000`

#![no_main]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use libfuzzer_sys::fuzz_target;
use switchyard_dra::Quantity;
use switchyard_dra::cel::{Attribute, Compiler, Device};

/// A tokio worker's stack: services evaluate selectors there.
const STACK: usize = 2 << 20;

/// Compilers cache every selector they compile; a fresh one now and then
/// keeps a long run's memory flat.
const COMPILES_PER_COMPILER: usize = 4096;

static COMPILER: Mutex<Option<(usize, Arc<Compiler>)>> = Mutex::new(None);

fn compiler() -> Arc<Compiler> {
    let mut slot = COMPILER.lock().expect("compiler");
    match slot.as_mut() {
        Some((compiles, compiler)) if *compiles < COMPILES_PER_COMPILER => {
            *compiles += 1;
            compiler.clone()
        }
        _ => {
            let compiler = Arc::new(Compiler::default());
            *slot = Some((1, compiler.clone()));
            compiler
        }
    }
}

fn device(choice: u8) -> Device {
    let q = |s: &str| Quantity::parse(s).expect("a quantity");
    match choice % 4 {
        0 => Device {
            driver: "gpu.deckhouse.io".into(),
            allow_multiple_allocations: false,
            attributes: BTreeMap::from([
                ("model".into(), Attribute::String("a100-sxm4-40gb".into())),
                ("index".into(), Attribute::Int(3)),
                ("mig".into(), Attribute::Bool(true)),
                (
                    "driverVersion".into(),
                    Attribute::Version("550.54.15".into()),
                ),
                (
                    "gpu.deckhouse.io/uuid".into(),
                    Attribute::String("GPU-0a1b".into()),
                ),
                ("other.io/rack".into(), Attribute::Int(7)),
            ]),
            capacity: BTreeMap::from([
                ("memory".into(), q("40Gi")),
                ("multiprocessors".into(), q("108")),
            ]),
        },
        1 => Device {
            driver: "gpu.deckhouse.io".into(),
            allow_multiple_allocations: true,
            attributes: BTreeMap::from([
                ("model".into(), Attribute::String("h100-sxm5-80gb".into())),
                ("index".into(), Attribute::Int(i64::MIN)),
                ("mig".into(), Attribute::Bool(false)),
                (
                    "driverVersion".into(),
                    Attribute::Version("1.10.0-rc.1+build.5".into()),
                ),
            ]),
            capacity: BTreeMap::from([
                ("memory".into(), q("80Gi")),
                ("gpu.deckhouse.io/cores".into(), q("1500m")),
                ("huge".into(), q("9223372036854775807k")),
            ]),
        },
        // A device whose attributes cannot all be values: every selector fails.
        2 => Device {
            driver: "gpu.deckhouse.io".into(),
            attributes: BTreeMap::from([
                ("model".into(), Attribute::String("a100".into())),
                ("nvlinkPeers".into(), Attribute::Unsupported),
            ]),
            ..Device::default()
        },
        _ => Device {
            driver: "example.com".into(),
            ..Device::default()
        },
    }
}

fn check(compiler: &Compiler, choice: u8, expression: &str) {
    let device = device(choice);
    let compiled = compiler.compile(expression);
    let Ok(selector) = compiled.as_ref() else {
        return;
    };
    let _ = selector.max_cost();
    let result = compiler.matches(selector, &device);
    let interpreted = compiler.matches_interpreted(selector, &device);
    if selector.is_fast() {
        // Errors may be worded differently (which side of `&&` names it).
        assert_eq!(
            result.as_ref().ok(),
            interpreted.as_ref().ok(),
            "fast path {result:?}, interpreter {interpreted:?}"
        );
    }
    if let Ok(prepared) = compiler.prepare(&device) {
        let again = compiler.matches_prepared(selector, &prepared);
        assert_eq!(again.as_ref().ok(), result.as_ref().ok());
    }
    if let Some(reads) = selector.reads() {
        let mut more = device.clone();
        for name in ["fuzz.example/unread", "unread"] {
            if !reads.contains(name) {
                more.attributes.insert(name.into(), Attribute::Int(1));
                more.capacity.insert(name.into(), Quantity::zero());
            }
        }
        assert_eq!(
            compiler.matches(selector, &more),
            result,
            "a fast selector reads only {reads:?}"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&choice, rest)) = data.split_first() else {
        return;
    };
    let Ok(expression) = std::str::from_utf8(rest) else {
        return;
    };
    let compiler = compiler();
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .stack_size(STACK)
            .spawn_scoped(scope, || check(&compiler, choice, expression))
            .expect("a thread")
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic));
    });
});

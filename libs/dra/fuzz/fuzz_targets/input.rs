//! Any text as a file given to `switchyard dra allocate` / `dra explain`:
//! reading it (bounds, YAML or JSON documents, strict objects) and then
//! allocating and explaining on its nodes never panics; text within the
//! bounds is never refused as too large or too deep; the allocator decides
//! the same twice, and `explain` reaches the verdict `allocate` reaches.
//!
//! Run: `scripts/fuzz.sh` (all targets), or
//! `cd libs/dra/fuzz && cargo +nightly fuzz run input -- -max_total_time=60`

#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use switchyard_dra::alloc::Objects;
use switchyard_dra::cel::Compiler;
use switchyard_dra::input::{ReadError, check_bounds, documents};

fn compiler() -> Arc<Compiler> {
    static COMPILER: OnceLock<Arc<Compiler>> = OnceLock::new();
    COMPILER
        .get_or_init(|| Arc::new(Compiler::default()))
        .clone()
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let bounded = check_bounds("fuzz.yaml", text);
    let values = match documents("fuzz.yaml", text) {
        Ok(values) => values,
        Err(ReadError::Syntax { .. }) => return,
        Err(err) => {
            assert!(bounded.is_err(), "refused only by the bounds: {err}");
            return;
        }
    };
    assert!(bounded.is_ok());
    let Ok(objects) = Objects::from_values(values) else {
        return;
    };
    // Every node the file names, and one it does not; at most a few.
    let mut nodes: Vec<String> = objects.nodes.keys().take(2).cloned().collect();
    nodes.push("gpu-1".into());
    for node in &nodes {
        let outcome = objects.allocate(node, compiler());
        assert!(
            ["allocated", "unschedulable", "error"].contains(&outcome.result.as_str()),
            "{outcome:?}"
        );
        assert_eq!(objects.allocate(node, compiler()), outcome, "deterministic");
        if let Ok(report) = objects.explain(node, compiler()) {
            assert_eq!(report.result, outcome.result);
        }
    }
});

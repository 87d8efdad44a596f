//! Running the reference programs of tools/ (built by scripts/build-oracles.sh).

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

/// Feeds `input` to the oracle `name` and returns what it printed.
#[allow(dead_code)]
pub fn run_oracle(name: &str, input: String) -> String {
    run_oracle_with(name, &[], input)
}

/// [`run_oracle`] with arguments.
pub fn run_oracle_with(name: &str, args: &[&str], input: String) -> String {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let binary = switchyard_testkit::oracle(&repo, name).unwrap_or_else(|e| panic!("{e}"));
    let mut child = Command::new(&binary)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {name}: {e}"));
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let output = child.wait_with_output().expect("the oracle's answers");
    writer.join().unwrap().unwrap();
    String::from_utf8(output.stdout).unwrap()
}

/// A seeded generator of test cases (splitmix64): the same seed, the same cases.
pub trait Random {
    fn state(&mut self) -> &mut u64;

    fn next(&mut self) -> u64 {
        let state = self.state();
        *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[(self.next() % items.len() as u64) as usize]
    }
}

/// Drops what JSON encoders may or may not write (nulls, empty lists and
/// maps) and the share IDs Kubernetes draws at random (Switchyard derives
/// them), so that two encodings of one decision compare equal.
#[allow(dead_code)]
pub fn normalize(v: &serde_json::Value) -> serde_json::Value {
    use serde_json::{Value, json};
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter_map(|(k, v)| {
                    let v = if k == "shareID" && v.is_string() {
                        json!("<share>")
                    } else {
                        normalize(v)
                    };
                    let empty = v.is_null()
                        || v.as_array().is_some_and(|a| a.is_empty())
                        || v.as_object().is_some_and(|o| o.is_empty());
                    (!empty).then(|| (k.clone(), v))
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(normalize).collect()),
        other => other.clone(),
    }
}

//! `switchyard demo`, `status` and `replay` run as a user would.

use std::process::{Command, Output};

fn switchyard(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(args)
        .output()
        .expect("run switchyard")
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).unwrap()
}

fn json(output: &Output) -> serde_json::Value {
    serde_json::from_str(stdout(output).trim())
        .unwrap_or_else(|e| panic!("{e}: {}", stdout(output)))
}

#[test]
fn demo_runs_the_reference_migration_and_every_invariant_holds() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("log");
    let out = switchyard(&["demo", "--data-dir", data.to_str().unwrap(), "-o", "json"]);
    assert!(
        out.status.success(),
        "{}\n{}",
        stdout(&out),
        String::from_utf8_lossy(&out.stderr)
    );
    let summary = json(&out);
    assert_eq!(summary["ok"], true);
    let steps: Vec<String> = summary["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["step"].as_str().unwrap().to_string())
        .collect();
    for expected in [
        "step 1",
        "step 2",
        "step 3",
        "step 4",
        "step 5",
        "completion",
        "hold: remove spec.gpu",
        "rollback: node",
        "rollback: application",
    ] {
        assert!(
            steps.iter().any(|s| s.starts_with(expected)),
            "missing {expected}: {steps:?}"
        );
    }
    let invariants = summary["invariants"].as_array().unwrap();
    assert!(invariants.len() >= 9);
    assert!(invariants.iter().all(|i| i["ok"] == true), "{invariants:?}");
    assert_eq!(
        summary["final_state"]["nodes_by_group"]["gpu-dra"]["dra"]
            .as_array()
            .unwrap()
            .len(),
        3
    );

    // status and replay read the same log.
    let status = json(&switchyard(&[
        "status",
        "--data-dir",
        data.to_str().unwrap(),
        "-o",
        "json",
    ]));
    assert_eq!(status["last_sequence"], summary["events"]);
    assert_eq!(status["held_groups"].as_array().unwrap().len(), 0);
    let early = json(&switchyard(&[
        "replay",
        "--data-dir",
        data.to_str().unwrap(),
        "--until",
        "40",
        "-o",
        "json",
    ]));
    assert_eq!(early["last_sequence"], 40);
    assert_eq!(
        early["held_groups"][0], "gpu-legacy",
        "early in the log the legacy group is held"
    );
    assert_eq!(early["alerts"][0]["alert"], "D8GpuNodeGroupHeldOnDra");
    let out = switchyard(&[
        "replay",
        "--data-dir",
        data.to_str().unwrap(),
        "--until",
        "999999",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("the log ends at sequence"));

    // A second run refuses to write over the log.
    let out = switchyard(&["demo", "--data-dir", data.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("already holds a migration log"));
}

#[test]
fn the_same_seed_writes_a_byte_identical_log() {
    let dir = tempfile::tempdir().unwrap();
    let show = |name: &str, seed: &str| {
        let data = dir.path().join(name);
        let data = data.to_str().unwrap();
        let out = switchyard(&[
            "demo",
            "--seed",
            seed,
            "--nodes",
            "3",
            "--workloads",
            "4",
            "--data-dir",
            data,
        ]);
        assert!(out.status.success(), "{}", stdout(&out));
        stdout(&switchyard(&[
            "log",
            "show",
            "--data-dir",
            data,
            "-o",
            "json",
        ]))
    };
    let (a, b) = (show("a", "42"), show("b", "42"));
    assert!(a.lines().count() > 100);
    assert_eq!(a, b);
    assert_ne!(a, show("c", "43"));
}

#[test]
fn demo_flags_are_checked() {
    for (flag, value, expected) in [
        ("--nodes", "1", "--nodes 1"),
        ("--gpus-per-node", "0", "--gpus-per-node 0"),
        ("--workloads", "0", "--workloads 0"),
    ] {
        let out = switchyard(&["demo", flag, value]);
        assert_eq!(out.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&out.stderr).contains(expected));
    }
}

#[test]
fn demo_runs_the_nvidia_guides_migration_on_the_simulated_gpu_operator() {
    let dir = tempfile::tempdir().unwrap();
    let run = |name: &str| {
        let data = dir.path().join(name);
        let out = switchyard(&[
            "demo",
            "--backend",
            "nvidia-operator",
            "--nodes",
            "3",
            "--data-dir",
            data.to_str().unwrap(),
            "-o",
            "json",
        ]);
        assert!(
            out.status.success(),
            "{}\n{}",
            stdout(&out),
            String::from_utf8_lossy(&out.stderr)
        );
        let log = stdout(&switchyard(&[
            "log",
            "show",
            "--data-dir",
            data.to_str().unwrap(),
            "-o",
            "json",
        ]));
        (json(&out), log)
    };
    let (summary, log) = run("a");
    assert_eq!(summary["ok"], true);
    assert_eq!(summary["backend"], "nvidia-operator");
    let steps: Vec<(String, bool)> = summary["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["step"].as_str().unwrap().to_string(), s["ok"] == true))
        .collect();
    let names: Vec<&str> = steps.iter().map(|(s, _)| s.as_str()).collect();
    assert_eq!(
        names,
        [
            "baseline: register and node capacity",
            "classes: GPU class h100 over gpu.nvidia.com",
            "pilot pool: hand over gpu-0",
            "pilot pool: hand over gpu-1",
            "pilot pool: no dual advertisement, plug-in healthy",
            "driver validation: slices as GFD labelled",
            "exclusivity gate: device plugin put back on gpu-0",
            "rollback: gpu-1 in the guide's order",
            "native claim pilot: a claim of the class bound on a DRA node",
            "compatibility bridge: one unchanged nvidia.com/gpu manifest on both pools",
            "application wave: move train-0",
            "application wave: move train-1",
            "application wave: move train-2",
            "application wave: move train-3",
            "application wave: hand over gpu-1",
            "application wave: hand over gpu-2",
            "application waves: each move verified",
            "final cutover: no legacy workloads or device-plugin pods",
            "completion: quotas translated, the device plugin kept for the trial period",
            "completion: after the trial period, the legacy pool retired",
        ]
    );
    assert!(steps.iter().all(|(_, ok)| *ok), "{steps:?}");
    let detail = |step: &str| {
        summary["steps"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["step"] == step)
            .and_then(|s| s["detail"].as_str())
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(
        detail("rollback: gpu-1 in the guide's order"),
        "frozen → plugin label removed → slice withdrawn → device plugin on → nvidia.com/gpu allocatable → pilot taint removed → uncordoned"
    );
    assert_eq!(
        detail("baseline: register and node capacity"),
        "3 node(s), 4 workload(s) shown"
    );
    assert!(
        detail("completion: after the trial period, the legacy pool retired")
            .contains("devicePlugin.enabled=false")
    );
    let invariants = summary["invariants"].as_array().unwrap();
    assert!(invariants.iter().all(|i| i["ok"] == true), "{invariants:?}");
    assert_eq!(
        summary["final_state"]["nodes_by_group"]["dra-pilot"]["dra"],
        serde_json::json!(["gpu-0", "gpu-1", "gpu-2"])
    );
    // The log records the backend, and the same seed writes the same log.
    assert!(
        log.contains("backend_configured"),
        "{}",
        &log[..500.min(log.len())]
    );
    assert_eq!(log, run("b").1);
}

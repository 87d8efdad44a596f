//! `switchyard dra eval` on the example ResourceSlice: the answer and the exit code.

use std::process::Command;

fn eval(args: &[&str]) -> (i32, String, String) {
    let slice = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/examples/resourceslice-a100.yaml"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .args(["dra", "eval", "-f", slice])
        .args(args)
        .output()
        .expect("run switchyard");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
        String::from_utf8_lossy(&out.stderr).trim().to_string(),
    )
}

#[test]
fn a_selector_is_true_false_or_an_error() {
    let (code, out, _) = eval(&[
        "--expr",
        "device.capacity['gpu.deckhouse.io'].memory.isGreaterThan(quantity('32Gi'))",
    ]);
    assert_eq!((code, out.as_str()), (0, "true"));
    let (code, out, _) = eval(&[
        "--expr",
        "device.attributes['gpu.deckhouse.io'].model == 'h100-sxm5-80gb'",
        "--device",
        "gpu-0",
    ]);
    assert_eq!((code, out.as_str()), (1, "false"));
    let (code, out, _) = eval(&[
        "--expr",
        "device.attributes['gpu.deckhouse.io'].memory == 1",
        "-o",
        "json",
    ]);
    assert_eq!(code, 2);
    assert_eq!(out, r#"{"device":"gpu-0","error":"no such key: memory"}"#);
    let (code, _, err) = eval(&["--expr", "size(device.attributes['gpu.deckhouse.io'])"]);
    assert_eq!(code, 2);
    assert!(err.contains("must evaluate to bool"), "{err}");
    let (code, _, err) = eval(&["--expr", "true", "--device", "gpu-9"]);
    assert_eq!(code, 2);
    assert!(err.contains("no device named \"gpu-9\""), "{err}");
}

const MIG_EXAMPLE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../deploy/examples/dra-a100-mig.yaml"
);

fn dra(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard"))
        .arg("dra")
        .args(args)
        .output()
        .expect("run switchyard");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
        String::from_utf8_lossy(&out.stderr).trim().to_string(),
    )
}

#[test]
fn allocate_picks_the_free_mig_slice_and_explain_says_why_the_card_does_not_fit() {
    let (code, out, err) = dra(&["allocate", "-f", MIG_EXAMPLE, "--node", "gpu-1"]);
    assert_eq!(code, 0, "{out}\n{err}");
    let outcome: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(outcome["result"], "allocated");
    assert_eq!(outcome["allocations"][0]["claim"], "ml/train");
    let result = &outcome["allocations"][0]["allocation"]["devices"]["results"][0];
    assert_eq!(
        result["request"], "gpu/mig",
        "the whole card (first choice) does not fit"
    );
    assert_eq!(result["device"], "gpu-0-mig-3g-20gb-1");
    assert_eq!(
        outcome["allocations"][0]["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"]
            [0]["values"][0],
        "gpu-1"
    );

    let (code, out, _) = dra(&[
        "allocate",
        "-f",
        MIG_EXAMPLE,
        "--node",
        "gpu-2",
        "-o",
        "yaml",
    ]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("result: unschedulable"), "{out}");

    let (code, out, _) = dra(&["explain", "-f", MIG_EXAMPLE, "--node", "gpu-1"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("gpu.deckhouse.io/gpu-1/gpu-0: counters exhausted: gpu-0-counters/memory has 20Gi left, the device needs 40Gi"), "{out}");
    assert!(
        out.contains("gpu.deckhouse.io/gpu-1/gpu-0-mig-3g-20gb-0: in use"),
        "{out}"
    );
    assert!(
        out.contains("gpu.deckhouse.io/gpu-1/gpu-0-mig-3g-20gb-1: fits on its own"),
        "{out}"
    );
}

#[test]
fn a_bad_quantity_is_named_by_object_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(MIG_EXAMPLE).unwrap().replacen(
        "memory: {value: 20Gi}",
        "memory: {value: 20 Gi}",
        1,
    );
    let file = dir.path().join("bad.yaml");
    std::fs::write(&file, text).unwrap();
    let (code, out, _) = dra(&["allocate", "-f", file.to_str().unwrap(), "--node", "gpu-1"]);
    assert_eq!(code, 2, "{out}");
    let outcome: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(outcome["result"], "error");
    let error = outcome["error"].as_str().unwrap();
    assert!(
        error.starts_with("ResourceSlice gpu-1-gpus: spec.devices[1].capacity[memory].value: \"20 Gi\" is not a quantity"),
        "{error}"
    );
}

/// Strict field validation, as the API server's: a field the object does not
/// have (a constraint one level too high, a misspelt `allocationMode`) is
/// refused, named by object and path, rather than allocated as if it were
/// not there.
#[test]
fn unknown_and_misplaced_fields_are_refused_by_path() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(MIG_EXAMPLE).unwrap().replacen(
        "metadata: {name: train, namespace: ml}\nspec:\n",
        "metadata: {name: train, namespace: ml}\nspec:\n  constraints: [{requests: [gpu], matchAttribute: gpu.deckhouse.io/index}]\n",
        1,
    );
    let file = dir.path().join("misplaced.yaml");
    std::fs::write(&file, text).unwrap();
    for command in ["allocate", "explain"] {
        let (code, out, err) = dra(&[command, "-f", file.to_str().unwrap(), "--node", "gpu-1"]);
        assert_eq!(code, 2, "{command}: {out}\n{err}");
        assert!(
            err.contains("ResourceClaim \"train\" (object #7): spec.constraints: unknown field"),
            "{command}: {err}"
        );
    }
    let text = std::fs::read_to_string(MIG_EXAMPLE).unwrap().replacen(
        "exactly: {deviceClassName: a100-mig-3g.20gb.gpu.deckhouse.io}",
        "exactly: {deviceClassName: a100-mig-3g.20gb.gpu.deckhouse.io, alocationMode: All}",
        1,
    );
    std::fs::write(&file, text).unwrap();
    let (code, out, err) = dra(&["allocate", "-f", file.to_str().unwrap(), "--node", "gpu-1"]);
    assert_eq!(code, 2, "{out}\n{err}");
    assert!(
        err.contains("spec.devices.requests[0].exactly.alocationMode: unknown field"),
        "{err}"
    );
}

/// Deeply nested flow collections are refused before the YAML parser sees
/// them (it takes time growing with the square of the depth).
#[test]
fn deeply_nested_input_is_refused_before_parsing() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("deep.yaml");
    std::fs::write(
        &file,
        format!(
            "kind: ResourceClaim\nspec: {}{}\n",
            "[".repeat(200_000),
            "]".repeat(200_000)
        ),
    )
    .unwrap();
    for command in [
        vec!["allocate", "-f", file.to_str().unwrap(), "--node", "n"],
        vec![
            "eval",
            "-f",
            file.to_str().unwrap(),
            "--expr",
            "device.driver == 'x'",
        ],
    ] {
        let (code, out, err) = dra(&command);
        assert_eq!(code, 2, "{command:?}: {out}\n{err}");
        assert!(
            err.contains("deep.yaml: line 2: collections nested 64 levels deep, the most accepted"),
            "{command:?}: {err}"
        );
    }
}

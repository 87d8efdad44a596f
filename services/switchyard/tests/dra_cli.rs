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

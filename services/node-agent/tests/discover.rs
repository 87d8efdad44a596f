//! `switchyard-node-agent discover`, the binary: what it prints for a fixture
//! (read back by the allocator, which finds the MIG devices in it), and what
//! it says where NVML is missing.

use std::process::Command;
use std::sync::Arc;

use switchyard_dra::alloc::Objects;
use switchyard_dra::cel::Compiler;

fn agent(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_switchyard-node-agent"))
        .args(args)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .output()
        .expect("run switchyard-node-agent");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[test]
fn a_fixture_is_discovered_and_its_devices_can_be_allocated() {
    let (code, out, err) = agent(&[
        "discover",
        "--gpu-source",
        "fixture:deploy/fixtures/a100-8x-mig.yaml",
        "--node",
        "gpu-1",
        "-o",
        "json",
    ]);
    assert_eq!(code, 0, "{err}");
    let list: serde_json::Value = serde_json::from_str(&out).unwrap();
    let items = list["items"].as_array().unwrap();
    let kinds: Vec<&str> = items.iter().map(|i| i["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds.iter().filter(|k| **k == "PhysicalGPU").count(), 8);
    assert_eq!(kinds.iter().filter(|k| **k == "ResourceSlice").count(), 1);
    let report = &items[0];
    assert_eq!(report["metadata"]["name"], "gpu-1-gpu-0");
    assert_eq!(
        report["metadata"]["labels"]["gpu.deckhouse.io/device"],
        "a100-sxm4-40gb"
    );
    assert_eq!(
        report["status"]["capabilities"]["partitionSupport"],
        serde_json::json!(["MIG", "TimeSlicing"])
    );
    let slice = &items[8];
    let devices = slice["spec"]["devices"].as_array().unwrap();
    // Four whole cards and the MIG devices of the four MIG-mode cards.
    assert_eq!(devices.len(), 4 + 7 + 2 + 3 + 4);
    let mig = devices
        .iter()
        .find(|d| d["name"] == "gpu-1-mig-3g-20gb-0")
        .expect("a 3g.20gb device");
    assert_eq!(mig["attributes"]["profile"]["string"], "3g.20gb");
    assert_eq!(mig["attributes"]["driverVersion"]["version"], "550.54.15");
    assert_eq!(mig["capacity"]["memory"]["value"], "19968Mi");
    assert_eq!(mig["capacity"]["multiprocessors"]["value"], "42");

    // What the agent prints is what `dra allocate` reads.
    let mut values = items.clone();
    values.push(serde_json::json!({"kind": "DeviceClass", "metadata": {"name": "a100-mig-1g.5gb.gpu.deckhouse.io"},
        "spec": {"selectors": [{"cel": {"expression": "device.attributes['gpu.deckhouse.io'].type == 'mig' && device.attributes['gpu.deckhouse.io'].profile == '1g.5gb'"}}]}}));
    values.push(serde_json::json!({"kind": "ResourceClaim", "metadata": {"name": "nb", "namespace": "ml"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "a100-mig-1g.5gb.gpu.deckhouse.io", "count": 9}}]}}}));
    let outcome = Objects::from_values(values)
        .unwrap()
        .allocate("gpu-1", Arc::new(Compiler::default()));
    assert_eq!(outcome.result, "allocated", "{outcome:?}");
    let results = outcome.allocations[0]
        .allocation
        .devices
        .as_ref()
        .unwrap()
        .results
        .clone()
        .unwrap();
    assert_eq!(results.len(), 9, "seven on card 0, two on card 3");
    assert_eq!(results[8].device, "gpu-3-mig-1g-5gb-3");
}

#[test]
fn without_nvml_the_agent_says_how_to_use_a_fixture() {
    let (code, out, err) = agent(&["discover", "--gpu-source", "nvml", "--node", "n1"]);
    let nvml_present = [
        "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
        "/usr/lib64/libnvidia-ml.so.1",
        "/usr/lib/libnvidia-ml.so.1",
    ]
    .iter()
    .any(|p| std::path::Path::new(p).exists());
    if nvml_present {
        // On a GPU machine: the real inventory (tests/gpu/run.sh checks it in depth).
        assert_eq!(code, 0, "{err}");
        assert!(out.contains("kind: PhysicalGPU"), "{out}");
    } else {
        assert_eq!(code, 2, "{out}");
        assert!(
            err.contains("NVML is not available on this machine"),
            "{err}"
        );
        assert!(err.contains("--gpu-source fixture:FILE"), "{err}");
    }
    let (code, _, err) = agent(&[
        "discover",
        "--gpu-source",
        "fixture:deploy/fixtures/mixed.yaml",
        "--layout",
        "shared:1",
        "--node",
        "n1",
    ]);
    assert_eq!(code, 2);
    assert!(err.contains("expected shared:N with N >= 2"), "{err}");
}

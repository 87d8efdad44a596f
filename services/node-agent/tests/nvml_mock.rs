//! `switchyard-node-agent discover --gpu-source nvml` on the mock NVML
//! (switchyard-nvml-mock's `libnvidia-ml.so.1`, first on `LD_LIBRARY_PATH`)
//! prints what `--gpu-source fixture:FILE` prints for the same fixture: the
//! agent's NVML path end to end, with no GPU.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::Duration;

use switchyard_nvml_mock::{MACHINE_ENV, SONAME};

const DEADLINE: Duration = Duration::from_secs(60);

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The mock, built with this test as its dev-dependency, linked as
/// `libnvidia-ml.so.1` into `dir`.
fn install_mock(dir: &Path) {
    let built = std::env::current_exe()
        .unwrap()
        .with_file_name("libswitchyard_nvml_mock.so");
    assert!(
        built.is_file(),
        "{} is missing: cargo builds it as this test's dev-dependency",
        built.display()
    );
    std::os::unix::fs::symlink(&built, dir.join(SONAME)).unwrap();
}

/// `discover` of `source` on node gpu-1 as JSON, `env` added; its exit
/// status, stdout and stderr (kept in files: the output outgrows a pipe).
fn discover(source: &str, env: &[(&str, OsString)], dir: &Path) -> (ExitStatus, String, String) {
    let (out, err) = (dir.join("stdout"), dir.join("stderr"));
    let mut command = Command::new(env!("CARGO_BIN_EXE_switchyard-node-agent"));
    command
        .args(["discover", "--gpu-source", source, "--node", "gpu-1"])
        .args(["--layout", "static", "-o", "json"])
        .current_dir(repo())
        .env_remove(MACHINE_ENV)
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap());
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command.spawn().unwrap();
    let status =
        switchyard_testkit::wait_for("discover to exit", DEADLINE, || child.try_wait().unwrap())
            .unwrap_or_else(|e| {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{e}");
            });
    (
        status,
        std::fs::read_to_string(out).unwrap(),
        std::fs::read_to_string(err).unwrap(),
    )
}

#[test]
fn discover_through_the_mock_nvml_prints_what_the_fixture_prints() {
    let mock = tempfile::tempdir().unwrap();
    install_mock(mock.path());
    let mut library_path = OsString::from(mock.path());
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
        library_path.push(":");
        library_path.push(old);
    }
    for name in ["h100-8x.yaml", "a100-8x-mig.yaml", "mixed.yaml"] {
        let work = tempfile::tempdir().unwrap();
        let path = repo().join("deploy/fixtures").join(name);
        let nvml = discover(
            "nvml",
            &[
                (MACHINE_ENV, path.clone().into()),
                ("LD_LIBRARY_PATH", library_path.clone()),
            ],
            work.path(),
        );
        assert!(nvml.0.success(), "{name}: {}", nvml.2);

        // `discover` reads the machine once; NVML tells an unhealthy card
        // only to a health watch, so the cards read healthy here (mixed.yaml
        // has one that is not): compare with the fixture's cards all healthy.
        let text = std::fs::read_to_string(&path).unwrap();
        let healthy = work.path().join(name);
        std::fs::write(&healthy, text.replace("healthy: false", "healthy: true")).unwrap();
        let fixture = discover(&format!("fixture:{}", healthy.display()), &[], work.path());
        assert!(fixture.0.success(), "{name}: {}", fixture.2);

        let nvml: serde_json::Value = serde_json::from_str(&nvml.1).unwrap();
        let fixture: serde_json::Value = serde_json::from_str(&fixture.1).unwrap();
        assert_eq!(nvml, fixture, "{name}");
        assert!(
            nvml["items"]
                .as_array()
                .is_some_and(|items| items.len() > 1),
            "{name}: {nvml:#}"
        );
    }
}

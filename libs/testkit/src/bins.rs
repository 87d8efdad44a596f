//! The workspace's service binaries for process tests: `switchyard-<name>`,
//! built (if not up to date) into the target directory the running test was
//! built in, once per test process, with the same profile.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

/// Paths already built by this process, by package.
static BUILT: Mutex<BTreeMap<String, PathBuf>> = Mutex::new(BTreeMap::new());

/// The binary `package` ships under the package's own name (e.g.
/// `switchyard-stack-assigner`), built up to date; panics, with cargo's
/// output, if it does not build.
pub fn binary(package: &str) -> PathBuf {
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(path) = built.get(package) {
        return path.clone();
    }
    // The test runs from <target>/<profile>/deps/<test>-<hash>.
    let exe = std::env::current_exe().expect("the test's own path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("the test runs from <target>/<profile>/deps");
    let target_dir = profile_dir.parent().expect("<target>/<profile>");
    let release = profile_dir.file_name().is_some_and(|p| p == "release");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = Command::new(cargo);
    build
        .args([
            "build",
            "--quiet",
            "--locked",
            "--package",
            package,
            "--bin",
            package,
        ])
        .arg("--target-dir")
        .arg(target_dir)
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if release {
        build.arg("--release");
    }
    let out = build
        .output()
        .unwrap_or_else(|e| panic!("run cargo to build {package}: {e}"));
    assert!(
        out.status.success(),
        "cargo build --package {package} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let path = profile_dir.join(format!("{package}{}", std::env::consts::EXE_SUFFIX));
    assert!(path.is_file(), "{} was not built", path.display());
    built.insert(package.to_string(), path.clone());
    path
}

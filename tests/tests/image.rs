//! The image `scripts/build-image.sh` builds (the chart's default,
//! `localhost/switchyard`): packed from this test's binaries, its config read
//! back from the OCI layout (entrypoint, the non-root user, labels), its
//! docker-archive tagged with the name, and its root filesystem unpacked by
//! umoci and run from: the multi-call `switchyard` with a link to it under
//! each service's name, and the node agent's own binary; every name answers
//! `--version` as itself, as the image's
//! user 65532 with nothing but the image's files (chroot), and a service
//! started by its name there follows the log of a real nats-server, serves
//! its metrics and logs JSON lines that name it. The Dockerfile builds the
//! same binary and links.
//!
//! umoci and skopeo come from `scripts/install-image-tools.sh` (Debian's
//! packages), the control plane from `scripts/control-plane.sh`; chroot needs
//! root (CI's user), or an unprivileged user namespace (`unshare -r`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use switchyard_testkit::kube::ControlPlane;
use switchyard_testkit::nats::NatsServer;
use switchyard_testkit::{repo_root, run};

/// The names the image answers to: the multi-call binary, the services'
/// links to it in `scripts/build-image.sh`'s order, and the node agent.
const NAMES: [&str; 7] = [
    "switchyard",
    "switchyard-inventory",
    "switchyard-stack-assigner",
    "switchyard-class-compiler",
    "switchyard-claim-allocator",
    "switchyard-alerter",
    "switchyard-node-agent",
];

fn root() -> bool {
    let out = run(Command::new("id").arg("-u"));
    String::from_utf8_lossy(&out.stdout).trim() == "0"
}

/// `args` run inside `rootfs` as the image's user (or, without root, as
/// root of a user namespace).
fn in_image(root: bool, rootfs: &Path, args: &[&str]) -> Command {
    let mut command = if root {
        let mut c = Command::new("chroot");
        c.arg("--userspec=65532:65532");
        c
    } else {
        let mut c = Command::new("unshare");
        c.args(["-r", "chroot"]);
        c
    };
    command.arg(rootfs).args(args);
    command
}

fn blob(layout: &Path, digest: &str) -> Value {
    let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
    let path = layout.join("blobs/sha256").join(hex);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&bytes).expect("a JSON blob")
}

fn strings(value: &Value) -> Vec<&str> {
    value
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_runs_every_binary_as_its_non_root_user() {
    // This test's binaries, up to date, in its profile's folder.
    let binary = switchyard_testkit::bins::binary("switchyard");
    switchyard_testkit::bins::binary("switchyard-node-agent");
    let bin_dir = binary.parent().expect("the profile's folder");
    let profile = if bin_dir.ends_with("release") {
        "release"
    } else {
        "dev"
    };
    let out = tempfile::tempdir().expect("temp dir");
    run(Command::new(repo_root().join("scripts/build-image.sh"))
        .args(["--profile", profile, "--no-build", "--tag", "test"])
        .arg("--bin-dir")
        .arg(bin_dir)
        .arg("--out")
        .arg(out.path()));

    // The config, as a runtime reads it: index -> manifest -> config.
    let layout = out.path().join("oci");
    let index: Value = serde_json::from_slice(
        &std::fs::read(layout.join("index.json")).expect("the layout's index"),
    )
    .expect("index.json");
    let manifests = index["manifests"].as_array().expect("manifests");
    assert_eq!(manifests.len(), 1, "{index}");
    assert_eq!(
        manifests[0]["annotations"]["org.opencontainers.image.ref.name"],
        "test"
    );
    let manifest = blob(&layout, manifests[0]["digest"].as_str().unwrap());
    assert_eq!(manifest["layers"].as_array().map(Vec::len), Some(1));
    let config = blob(&layout, manifest["config"]["digest"].as_str().unwrap());
    assert_eq!(config["os"], "linux");
    assert_eq!(config["architecture"], "amd64");
    let run_config = &config["config"];
    assert_eq!(run_config["User"], "65532:65532", "{config}");
    assert_eq!(
        strings(&run_config["Entrypoint"]),
        ["/usr/local/bin/switchyard"]
    );
    assert!(
        strings(&run_config["Env"]).contains(&"PATH=/usr/local/bin:/usr/bin:/bin"),
        "{config}"
    );
    let labels = &run_config["Labels"];
    assert_eq!(labels["org.opencontainers.image.title"], "switchyard");
    assert_eq!(
        labels["org.opencontainers.image.version"],
        env!("CARGO_PKG_VERSION")
    );
    let revision = run(Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(repo_root()));
    assert_eq!(
        labels["org.opencontainers.image.revision"],
        String::from_utf8_lossy(&revision.stdout).trim()
    );

    // The docker-archive carries the chart's image name.
    let archive = out.path().join("switchyard-test.tar");
    let listed = run(Command::new("tar")
        .arg("-xOf")
        .arg(&archive)
        .arg("manifest.json"));
    let listed: Value = serde_json::from_slice(&listed.stdout).expect("manifest.json");
    assert_eq!(
        strings(&listed[0]["RepoTags"]),
        ["localhost/switchyard:test"]
    );

    // The root filesystem, and every binary run from it alone.
    let bundle = out.path().join("bundle");
    let root = root();
    let mut unpack = Command::new("umoci");
    unpack.arg("unpack");
    if !root {
        unpack.arg("--rootless");
    }
    run(unpack
        .arg("--image")
        .arg(format!("{}:test", layout.display()))
        .arg(&bundle)
        .stdout(Stdio::null()));
    let rootfs = bundle.join("rootfs");
    let bin = rootfs.join("usr/local/bin");
    let mut files: Vec<String> = std::fs::read_dir(&bin)
        .expect("/usr/local/bin")
        .map(|e| {
            e.expect("an entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    files.sort();
    let mut names = NAMES.map(String::from).to_vec();
    names.sort();
    assert_eq!(files, names);
    for own in ["switchyard", "switchyard-node-agent"] {
        assert!(bin.join(own).symlink_metadata().unwrap().is_file(), "{own}");
    }
    for service in &NAMES[1..6] {
        assert_eq!(
            std::fs::read_link(bin.join(service)).ok(),
            Some(PathBuf::from("switchyard")),
            "{service} is a link to the one binary"
        );
    }
    for b in NAMES {
        let out = run(&mut in_image(
            root,
            &rootfs,
            &[&format!("/usr/local/bin/{b}"), "--version"],
        ));
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            format!("{b} {}", env!("CARGO_PKG_VERSION"))
        );
    }

    // A service from the image on a real nats-server and API server: the
    // log made by the image's `switchyard log init`, then the class-compiler
    // following it with its metrics served.
    let nats = tokio::task::spawn_blocking(NatsServer::start)
        .await
        .unwrap();
    let plane = ControlPlane::start().await;
    let kubeconfig = rootfs.join("tmp/kubeconfig");
    std::fs::copy(plane.kubeconfig(), &kubeconfig).expect("kubeconfig");
    // Readable by the image's user.
    std::fs::set_permissions(
        &kubeconfig,
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .expect("kubeconfig's mode");
    run(&mut in_image(
        root,
        &rootfs,
        &[
            "/usr/local/bin/switchyard",
            "log",
            "init",
            "--nats-url",
            &nats.url(),
        ],
    ));
    let port = switchyard_testkit::free_port();
    let listen = format!("127.0.0.1:{port}");
    let log = out.path().join("class-compiler.log");
    let mut service = in_image(
        root,
        &rootfs,
        &[
            "/usr/local/bin/switchyard-class-compiler",
            "--nats-url",
            &nats.url(),
            "--metrics-listen",
            &listen,
        ],
    )
    .env("KUBECONFIG", "/tmp/kubeconfig")
    .env("RUST_LOG", "info")
    .env_remove("SWITCHYARD_LOG_LEVEL")
    .env_remove("SWITCHYARD_LOG_FORMAT")
    .stdout(Stdio::null())
    .stderr(std::fs::File::create(&log).expect("service log"))
    .spawn()
    .expect("start the class-compiler from the image");
    let serving = switchyard_testkit::eventually(
        "the class-compiler's metrics",
        Duration::from_secs(60),
        || async {
            switchyard_testkit::scrape(port)
                .await
                .is_ok_and(|body| body.contains("switchyard_log_sequence"))
        },
    )
    .await;
    let _ = service.kill();
    let _ = service.wait();
    let logged = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(serving.is_ok(), "{serving:?}\n{logged}");
    // A container's log: a JSON object per line naming the service, no
    // colour codes.
    assert!(!logged.contains('\u{1b}'), "{logged}");
    let lines: Vec<Value> = logged
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(
        lines.iter().any(|l| l["message"] == "rebuilt from the log"),
        "{logged}"
    );
    for line in &lines {
        assert_eq!(line["service"], "class-compiler", "{line}");
    }
}

/// The Dockerfile builds and strips the same two binaries with the same
/// profiles, links the same names to the multi-call one, and runs it as the
/// same user with the same entrypoint.
#[test]
fn the_dockerfile_builds_the_same_image() {
    let dockerfile = std::fs::read_to_string(repo_root().join("Dockerfile")).expect("Dockerfile");
    assert!(
        dockerfile.contains(
            "cargo build --release --locked --profile image -p switchyard --bin switchyard"
        ) || dockerfile
            .contains("cargo build --locked --profile image -p switchyard --bin switchyard"),
        "the Dockerfile builds the multi-call binary with the image profile"
    );
    assert!(
        dockerfile.contains(
            "cargo build --locked --profile node-agent -p switchyard-node-agent --bin switchyard-node-agent"
        ),
        "the Dockerfile builds the node agent with its profile"
    );
    for service in &NAMES[1..6] {
        assert!(
            dockerfile.contains(&format!("ln -s switchyard /out/{service}")),
            "the Dockerfile does not link {service}"
        );
    }
    assert!(dockerfile.contains("USER 65532:65532"));
    assert!(dockerfile.contains(r#"ENTRYPOINT ["/usr/local/bin/switchyard"]"#));
    assert!(dockerfile.contains(&format!(
        "org.opencontainers.image.version=\"{}\"",
        env!("CARGO_PKG_VERSION")
    )));
    let script = std::fs::read_to_string(repo_root().join("scripts/build-image.sh"))
        .expect("build-image.sh");
    let listed: Vec<&str> = script
        .split("SERVICES=(")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .expect("the script's SERVICES")
        .split_whitespace()
        .collect();
    assert_eq!(listed, NAMES[1..6]);
    assert!(
        script.contains("profile=image\n"),
        "the script's default profile"
    );
}

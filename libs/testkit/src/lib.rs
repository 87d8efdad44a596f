//! Real servers for tests, started on free loopback ports in temp dirs and
//! stopped when dropped — even when the test panics.
//!
//! Nothing here skips: a missing server binary is a test failure that says how
//! to install it.

#![forbid(unsafe_code)]

pub mod bins;
#[cfg(feature = "kube")]
pub mod chart;
#[cfg(feature = "grpc")]
pub mod health;
pub mod jaeger;
#[cfg(feature = "kube")]
pub mod kube;
#[cfg(feature = "kube")]
pub mod kwok;
#[cfg(feature = "migration")]
pub mod migration;
pub mod nats;
#[cfg(feature = "kube")]
pub mod network;
#[cfg(feature = "kube")]
pub mod node;
#[cfg(feature = "kube")]
pub mod nvidia;
#[cfg(feature = "kube")]
pub mod prometheus;
#[cfg(feature = "reference")]
pub mod reference;
pub mod toxiproxy;

use std::time::{Duration, Instant};

/// Polls `condition` until it holds or `timeout` passes; the error names `what`.
/// For conditions that have no event to wait on (a file appearing, a process
/// becoming ready); not a sleep used as synchronisation.
pub fn wait_for<T>(
    what: &str,
    timeout: Duration,
    mut condition: impl FnMut() -> Option<T>,
) -> Result<T, String> {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(2);
    loop {
        if let Some(value) = condition() {
            return Ok(value);
        }
        if Instant::now() >= deadline {
            return Err(format!("timed out after {timeout:?} waiting for {what}"));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// Polls an async `condition` until it holds or `timeout` passes; the error
/// names `what`. For conditions with no event to wait on (a CRD becoming
/// established, a retry counter moving); not a sleep used as synchronisation.
pub async fn eventually<F, Fut>(
    what: &str,
    timeout: Duration,
    mut condition: F,
) -> Result<(), String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(10);
    while !condition().await {
        if Instant::now() >= deadline {
            return Err(format!("timed out after {timeout:?} waiting for {what}"));
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(200));
    }
    Ok(())
}

/// The helm version the chart is tested with (built by `scripts/install-helm.sh`).
pub const HELM_VERSION: &str = "3.22.0";

const HELM_INSTALL_HINT: &str = "build it with `scripts/install-helm.sh` (helm v3.22.0 into ~/.cache/switchyard/helm/v3.22.0) or set SWITCHYARD_HELM to a helm v3 binary";

/// Finds helm: `$SWITCHYARD_HELM`, else the pinned build in the cache. Not
/// `helm` on `PATH`: the chart's tests depend on helm 3's schema checks, and a
/// stray helm of another major version would fail them for the wrong reason.
pub fn helm_binary() -> Result<std::path::PathBuf, String> {
    if let Some(path) = std::env::var_os("SWITCHYARD_HELM") {
        let path = std::path::PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!(
                "SWITCHYARD_HELM={} is not a file; {HELM_INSTALL_HINT}",
                path.display()
            ))
        };
    }
    let cached = cache_dir().join(format!("helm/v{HELM_VERSION}/helm"));
    if cached.is_file() {
        Ok(cached)
    } else {
        Err(format!(
            "{} is missing; {HELM_INSTALL_HINT}",
            cached.display()
        ))
    }
}

/// Where [`free_port`] looks: below Linux's ephemeral range (32768 and
/// up by default), which the kernel hands to every outgoing connection and
/// to every `bind(0)` — a port taken from there can be another socket's
/// before the server asked for it binds it.
const TEST_PORTS: std::ops::Range<u16> = 20_000..32_000;

/// A loopback port free when asked, outside the kernel's ephemeral range
/// and never handed out twice by this process, so that nothing else takes
/// it before the server it is for binds it (a server that still finds it
/// taken says so).
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    // Where this process looks next: a start of its own (by its pid), so
    // that test processes running side by side look in different places.
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let span = TEST_PORTS.end - TEST_PORTS.start;
    let _ = NEXT.compare_exchange(
        0,
        (std::process::id() % u32::from(span)) as u16 + 1,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    for _ in 0..span {
        let offset = NEXT.fetch_add(1, Ordering::Relaxed) % span;
        let port = TEST_PORTS.start + offset;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {TEST_PORTS:?}")
}

/// The body of `GET /metrics` on a loopback port (HTTP/1.0: the server
/// closes the connection after the answer); an error if the server does
/// not answer 200.
pub async fn scrape(port: u16) -> Result<String, String> {
    http_get(port, "/metrics").await
}

/// The body of `GET path` on a loopback port, over HTTP/1.0 (the server
/// closes the connection after the answer); an error naming the status if
/// the server does not answer 200.
pub async fn http_get(port: u16, path: &str) -> Result<String, String> {
    http_get_at("127.0.0.1", port, path).await
}

/// [`http_get`] of `host:port`.
pub async fn http_get_at(host: &str, port: u16, path: &str) -> Result<String, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect((host, port))
        .await
        .map_err(|e| format!("connect to {host}:{port}: {e}"))?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes())
        .await
        .map_err(|e| format!("ask {host}:{port}{path}: {e}"))?;
    let mut answer = Vec::new();
    stream
        .read_to_end(&mut answer)
        .await
        .map_err(|e| format!("read {host}:{port}{path}: {e}"))?;
    let answer = String::from_utf8_lossy(&answer);
    let (head, body) = answer
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("not an HTTP answer: {answer:?}"))?;
    if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
        return Err(format!("{path} answered {head:?}"));
    }
    Ok(body.to_string())
}

/// `value` percent-encoded for a URL's query (RFC 3986's unreserved
/// characters kept).
pub fn url_encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The Prometheus Go module version promtool is built from (Prometheus
/// 3.16.0; `scripts/install-promtool.sh`).
pub const PROMTOOL_VERSION: &str = "0.316.0";

/// A tool an install script put in the cache: `$<variable>` if set, else
/// `<cache>/<in_cache>`; an error naming the script when it is missing.
fn cached_tool(variable: &str, in_cache: &str, script: &str) -> Result<std::path::PathBuf, String> {
    let path = match std::env::var_os(variable) {
        Some(path) => std::path::PathBuf::from(path),
        None => cache_dir().join(in_cache),
    };
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!(
            "{} is missing; install it with `scripts/{script}` (into ~/.cache/switchyard/{in_cache}) or set {variable}",
            path.display()
        ))
    }
}

/// Finds promtool: `$SWITCHYARD_PROMTOOL`, else the pinned build in the cache.
pub fn promtool_binary() -> Result<std::path::PathBuf, String> {
    cached_tool(
        "SWITCHYARD_PROMTOOL",
        &format!("promtool/v{PROMTOOL_VERSION}/promtool"),
        "install-promtool.sh",
    )
}

/// Finds the Prometheus server (the module promtool is built from):
/// `$SWITCHYARD_PROMETHEUS`, else the pinned build in the cache.
pub fn prometheus_binary() -> Result<std::path::PathBuf, String> {
    cached_tool(
        "SWITCHYARD_PROMETHEUS",
        &format!("prometheus/v{PROMTOOL_VERSION}/prometheus"),
        "install-prometheus.sh",
    )
}

/// The Jaeger Go module version the jaeger binary (Jaeger v2) is built from
/// (`scripts/install-jaeger.sh`); the tests run it with
/// `tests/fixtures/jaeger.yaml`.
pub const JAEGER_VERSION: &str = "1.75.0";

/// Finds jaeger: `$SWITCHYARD_JAEGER`, else the pinned build in the cache.
pub fn jaeger_binary() -> Result<std::path::PathBuf, String> {
    cached_tool(
        "SWITCHYARD_JAEGER",
        &format!("jaeger/v{JAEGER_VERSION}/jaeger"),
        "install-jaeger.sh",
    )
}

/// The natscli Go module version the `nats` CLI is built from
/// (`scripts/install-natscli.sh`).
pub const NATSCLI_VERSION: &str = "0.5.0";

/// Finds the stock `nats` CLI: `$SWITCHYARD_NATSCLI`, else the pinned build
/// in the cache.
pub fn natscli_binary() -> Result<std::path::PathBuf, String> {
    cached_tool(
        "SWITCHYARD_NATSCLI",
        &format!("natscli/v{NATSCLI_VERSION}/nats"),
        "install-natscli.sh",
    )
}

/// The nats-py version the Python example is run with
/// (`scripts/install-nats-py.sh`).
pub const NATS_PY_VERSION: &str = "2.16.0";

/// Finds the Python of the virtual environment with nats-py:
/// `$SWITCHYARD_NATS_PY`, else the one in the cache.
pub fn nats_py_python() -> Result<std::path::PathBuf, String> {
    cached_tool(
        "SWITCHYARD_NATS_PY",
        &format!("python/nats-py-{NATS_PY_VERSION}/bin/python"),
        "install-nats-py.sh",
    )
}

/// The path of a reference program of `tools/` (`name`), built and cached by
/// `scripts/build-oracles.sh` of the repository at `repo`.
pub fn oracle(repo: &std::path::Path, name: &str) -> Result<String, String> {
    let script = repo.join("scripts/build-oracles.sh");
    let built = std::process::Command::new(&script)
        .output()
        .map_err(|e| format!("run {}: {e}", script.display()))?;
    if !built.status.success() {
        return Err(format!(
            "scripts/build-oracles.sh failed (it needs Go and the module proxy):\n{}",
            String::from_utf8_lossy(&built.stderr)
        ));
    }
    String::from_utf8_lossy(&built.stdout)
        .lines()
        .find(|l| l.ends_with(&format!("/{name}")))
        .map(str::to_string)
        .ok_or_else(|| format!("scripts/build-oracles.sh built no {name}"))
}

/// A child process killed (and reaped) when dropped.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The cache directory scripts install pinned tools into (`scripts/install-*.sh`):
/// `$SWITCHYARD_CACHE`, else `$HOME/.cache/switchyard`.
/// The repository's root (the test kit is libs/testkit).
pub fn repo_root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("repository root")
        .to_path_buf()
}

/// Runs `command` to its end; panics with its output unless it succeeds.
pub fn run(command: &mut std::process::Command) -> std::process::Output {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("run {command:?}: {e}"));
    assert!(
        out.status.success(),
        "{command:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

pub fn cache_dir() -> std::path::PathBuf {
    if let Some(dir) = std::env::var_os("SWITCHYARD_CACHE") {
        return dir.into();
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    std::path::PathBuf::from(home).join(".cache/switchyard")
}

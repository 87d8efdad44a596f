//! toxiproxy v2.5.0 (built by `scripts/install-toxiproxy.sh`) on loopback: a
//! TCP proxy in front of a server whose connections get latency, resets and
//! timeouts ("toxics"), set with its own CLI.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The version the tests use.
pub const VERSION: &str = "2.5.0";

fn binary(name: &str) -> PathBuf {
    let path = crate::cache_dir().join(format!("toxiproxy/v{VERSION}/{name}"));
    assert!(
        path.is_file(),
        "{} is missing: build it with `scripts/install-toxiproxy.sh`",
        path.display()
    );
    path
}

/// A running toxiproxy-server, killed when dropped.
pub struct Toxiproxy {
    child: Child,
    api: String,
    dir: tempfile::TempDir,
}

impl Toxiproxy {
    /// Starts the server on a free loopback port; waits until it answers.
    pub fn start() -> Toxiproxy {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = crate::free_port();
        let log = std::fs::File::create(dir.path().join("toxiproxy.log")).expect("log file");
        let child = Command::new(binary("toxiproxy-server"))
            .args(["-host", "127.0.0.1", "-port", &port.to_string()])
            .stdout(Stdio::from(log.try_clone().expect("log file")))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start toxiproxy-server");
        let server = Toxiproxy {
            child,
            api: format!("127.0.0.1:{port}"),
            dir,
        };
        crate::wait_for(
            "toxiproxy-server to answer",
            Duration::from_secs(20),
            || server.try_cli(&["list"]).ok(),
        )
        .unwrap_or_else(|e| panic!("{e}; its log:\n{}", server.log()));
        server
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("toxiproxy.log")).unwrap_or_default()
    }

    fn try_cli(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new(binary("toxiproxy-cli"))
            .args(["--host", &format!("http://{}", self.api)])
            .args(args)
            .output()
            .map_err(|e| e.to_string())?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() && !stdout.contains("Failed") {
            Ok(stdout)
        } else {
            Err(format!("{stdout}{}", String::from_utf8_lossy(&out.stderr)))
        }
    }

    /// Runs `toxiproxy-cli` against this server; panics with its output if
    /// it fails.
    pub fn cli(&self, args: &[&str]) -> String {
        self.try_cli(args)
            .unwrap_or_else(|e| panic!("toxiproxy-cli {args:?}: {e}"))
    }

    /// A proxy named `name` to `upstream` (host:port) on a free loopback
    /// port; returns the address it listens on.
    pub fn proxy(&self, name: &str, upstream: &str) -> String {
        let listen = format!("127.0.0.1:{}", crate::free_port());
        self.cli(&["create", "--listen", &listen, "--upstream", upstream, name]);
        listen
    }

    /// Stops proxy `name` (its connections closed, new ones refused), or
    /// starts it again.
    pub fn set_enabled(&self, name: &str, enabled: bool) {
        // `list` prints a line per proxy: name, listen, upstream,
        // `enabled` or `disabled`, toxics; `toggle` flips it.
        let listed = self.cli(&["list"]);
        let disabled = listed
            .lines()
            .map(|line| line.split_whitespace().collect::<Vec<_>>())
            .find(|fields| fields.first() == Some(&name))
            .unwrap_or_else(|| panic!("no proxy {name} in:\n{listed}"))
            .contains(&"disabled");
        if disabled == enabled {
            self.cli(&["toggle", name]);
        }
    }

    /// Adds a toxic to proxy `name`: its type, its attributes
    /// (`latency=50`), the share of connections it strikes and the direction.
    pub fn toxic(
        &self,
        name: &str,
        kind: &str,
        attributes: &[&str],
        toxicity: f32,
        upstream: bool,
    ) {
        let toxic = format!("{kind}_{}", if upstream { "up" } else { "down" });
        let toxicity = toxicity.to_string();
        let mut args = vec!["toxic", "add", "--type", kind, "--toxicName", &toxic];
        args.extend(["--toxicity", &toxicity]);
        if upstream {
            args.push("--upstream");
        } else {
            args.push("--downstream");
        }
        for attribute in attributes {
            args.extend(["--attribute", attribute]);
        }
        args.push(name);
        self.cli(&args);
    }
}

impl Drop for Toxiproxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

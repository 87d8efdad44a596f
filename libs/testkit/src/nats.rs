//! A real `nats-server -js` for tests.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{cache_dir, wait_for};

/// The nats-server version the project is tested against (installed by
/// `scripts/install-nats-server.sh`).
pub const PINNED_VERSION: &str = "2.15.2";

const INSTALL_HINT: &str = "install it with `scripts/install-nats-server.sh` (nats-server v2.15.2 into ~/.cache/switchyard/bin) or set SWITCHYARD_NATS_SERVER to a nats-server binary";

/// Finds the server binary: `$SWITCHYARD_NATS_SERVER`, the pinned binary in the
/// cache, then `nats-server` on `PATH`.
pub fn server_binary() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("SWITCHYARD_NATS_SERVER") {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!(
                "SWITCHYARD_NATS_SERVER={} is not a file; {INSTALL_HINT}",
                path.display()
            ))
        };
    }
    let cached = cache_dir().join("bin/nats-server");
    if cached.is_file() {
        return Ok(cached);
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|dir| dir.join("nats-server"))
        .find(|candidate| candidate.is_file())
        .ok_or_else(|| format!("nats-server not found; {INSTALL_HINT}"))
}

#[derive(Clone, Debug, Default)]
pub struct NatsOptions {
    /// `jetstream.sync_interval: always`: fsync before every ack.
    pub sync_always: bool,
    /// More of the server's configuration, as is (e.g. the chart's
    /// `authorization` block).
    pub extra: String,
}

/// A running nats-server with JetStream, its store in a temp dir.
pub struct NatsServer {
    binary: PathBuf,
    dir: tempfile::TempDir,
    options: NatsOptions,
    port: u16,
    child: Option<Child>,
}

impl NatsServer {
    /// Starts a server on a free loopback port. Panics with install instructions
    /// if the binary is missing, and with the server's log if it does not start.
    pub fn start() -> NatsServer {
        Self::start_with(NatsOptions::default())
    }

    pub fn start_with(options: NatsOptions) -> NatsServer {
        let binary = server_binary().unwrap_or_else(|err| panic!("{err}"));
        let dir = tempfile::Builder::new()
            .prefix("switchyard-nats-")
            .tempdir()
            .expect("temp dir");
        let mut server = NatsServer {
            binary,
            dir,
            options,
            port: 0,
            child: None,
        };
        server.spawn().unwrap_or_else(|err| panic!("{err}"));
        server
    }

    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The server's own `--version` line, e.g. `nats-server: v2.15.2`.
    pub fn version(&self) -> String {
        std::process::Command::new(&self.binary)
            .arg("--version")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .unwrap_or_default()
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn store_dir(&self) -> PathBuf {
        self.dir.path().join("store")
    }

    /// Kills the server with SIGKILL (no clean shutdown) and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port with the same store.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn().unwrap_or_else(|err| panic!("{err}"));
    }

    fn spawn(&mut self) -> Result<(), String> {
        let ports_dir = self.dir.path().join("ports");
        let _ = std::fs::remove_dir_all(&ports_dir);
        std::fs::create_dir_all(&ports_dir).map_err(|e| e.to_string())?;
        let config = self.dir.path().join("nats.conf");
        let port = if self.port == 0 {
            "-1".to_string()
        } else {
            self.port.to_string()
        };
        let sync = if self.options.sync_always {
            "\n  sync_interval: always"
        } else {
            ""
        };
        std::fs::write(
            &config,
            format!(
                "listen: \"127.0.0.1:{port}\"\nports_file_dir: \"{}\"\njetstream {{\n  store_dir: \"{}\"{sync}\n}}\n{}\n",
                ports_dir.display(),
                self.store_dir().display(),
                self.options.extra,
            ),
        )
        .map_err(|e| e.to_string())?;
        let log_path = self.dir.path().join("server.log");
        let log = File::options()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| e.to_string())?;
        let child = Command::new(&self.binary)
            .arg("-c")
            .arg(&config)
            .stdout(Stdio::from(log.try_clone().map_err(|e| e.to_string())?))
            .stderr(Stdio::from(log))
            .spawn()
            .map_err(|e| format!("start {}: {e}", self.binary.display()))?;
        let pid = child.id();
        self.child = Some(child);
        let ports_file = ports_dir.join(format!("{}_{pid}.ports", self.binary_name()));
        let url = wait_for("nats-server to listen", Duration::from_secs(20), || {
            client_url(&ports_file)
        })
        .map_err(|err| format!("{err}; server log:\n{}", read_log(&log_path)))?;
        self.port = url
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| format!("unexpected client URL {url} in {}", ports_file.display()))?;
        Ok(())
    }

    fn binary_name(&self) -> String {
        self.binary
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }
}

fn client_url(ports_file: &Path) -> Option<String> {
    let text = std::fs::read_to_string(ports_file).ok()?;
    let ports: serde_json::Value = serde_json::from_str(&text).ok()?;
    ports["nats"]
        .as_array()?
        .first()?
        .as_str()
        .map(str::to_string)
}

fn read_log(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| format!("(no log: {e})"))
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A JetStream cluster of nats-servers on loopback (`n0`, `n1`, ...). Each
/// server's route to each other server goes through a toxiproxy proxy of its
/// own (one per ordered pair), so that a server can be cut off from the
/// others and joined again. The servers advertise a route address nothing
/// listens on, so that none learns another's own address by gossip and
/// routes around the proxies. Each serves its monitoring endpoints (`/jsz`:
/// what its own store holds).
pub struct NatsCluster {
    pub servers: Vec<NatsServer>,
    /// Each server's monitoring port.
    monitoring: Vec<u16>,
    /// The pairs `(from, to)` whose route proxy is off.
    cut: std::collections::BTreeSet<(usize, usize)>,
    proxies: crate::toxiproxy::Toxiproxy,
}

/// The route proxy from server `from` to server `to`.
fn route_proxy(from: usize, to: usize) -> String {
    format!("route-n{from}-n{to}")
}

impl NatsCluster {
    /// Starts `size` servers with `options` (each also `extra`), routed to
    /// each other through their proxies. Returns once every server listens;
    /// [`NatsCluster::until_formed`] waits for JetStream's meta leader.
    pub fn start(size: usize, options: NatsOptions) -> NatsCluster {
        let proxies = crate::toxiproxy::Toxiproxy::start();
        let route_ports: Vec<u16> = (0..size).map(|_| crate::free_port()).collect();
        let monitoring: Vec<u16> = (0..size).map(|_| crate::free_port()).collect();
        let servers = (0..size)
            .map(|i| {
                let routes: Vec<String> = (0..size)
                    .filter(|&j| j != i)
                    .map(|j| {
                        let listen = proxies
                            .proxy(&route_proxy(i, j), &format!("127.0.0.1:{}", route_ports[j]));
                        format!("\"nats-route://{listen}\"")
                    })
                    .collect();
                NatsServer::start_with(NatsOptions {
                    extra: format!(
                        "server_name: n{i}\nhttp: \"127.0.0.1:{}\"\ncluster {{\n  name: switchyard\n  listen: \"127.0.0.1:{}\"\n  advertise: \"127.0.0.1:1\"\n  routes: [{}]\n}}\n{}",
                        monitoring[i],
                        route_ports[i],
                        routes.join(", "),
                        options.extra
                    ),
                    ..options.clone()
                })
            })
            .collect();
        NatsCluster {
            servers,
            monitoring,
            cut: Default::default(),
            proxies,
        }
    }

    /// Every server's client URL, comma-separated (what `--nats-url` takes).
    pub fn url(&self) -> String {
        self.servers
            .iter()
            .map(NatsServer::url)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Waits until every server sees JetStream's meta leader (the cluster can
    /// create streams).
    pub async fn until_formed(&self, within: Duration) -> Result<(), String> {
        crate::eventually("the JetStream cluster to form", within, || async {
            let mut formed = true;
            for i in 0..self.servers.len() {
                formed &= self.jsz(i).await.is_ok_and(|j| {
                    j["meta_cluster"]["leader"]
                        .as_str()
                        .is_some_and(|l| !l.is_empty())
                });
            }
            formed
        })
        .await
    }

    /// Server `i`'s `/jsz` with its streams and their replicas: what its own
    /// store holds (`account_details[].stream_detail[].state`).
    pub async fn jsz(&self, i: usize) -> Result<serde_json::Value, String> {
        let body = crate::http_get(self.monitoring[i], "/jsz?accounts=true&streams=true").await?;
        serde_json::from_str(&body).map_err(|e| format!("n{i}'s /jsz: {e}"))
    }

    /// The servers (`nN`) server `i` has a route to now (`/routez`).
    pub async fn routed_to(&self, i: usize) -> Result<std::collections::BTreeSet<String>, String> {
        let body = crate::http_get(self.monitoring[i], "/routez").await?;
        let routez: serde_json::Value =
            serde_json::from_str(&body).map_err(|e| format!("n{i}'s /routez: {e}"))?;
        Ok(routez["routes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["remote_name"].as_str().map(str::to_string))
            .collect())
    }

    /// Cuts server `k` off from the others: every route proxy from or to it
    /// off (their connections closed).
    pub fn cut_off(&mut self, k: usize) {
        self.set_routes(k, false);
    }

    /// Joins server `k` to the others again.
    pub fn rejoin(&mut self, k: usize) {
        self.set_routes(k, true);
    }

    fn set_routes(&mut self, k: usize, on: bool) {
        for j in (0..self.servers.len()).filter(|&j| j != k) {
            for pair in [(k, j), (j, k)] {
                // `toggle` flips a proxy: only those in the other state.
                if self.cut.contains(&pair) == on {
                    self.proxies.cli(&["toggle", &route_proxy(pair.0, pair.1)]);
                    if on {
                        self.cut.remove(&pair);
                    } else {
                        self.cut.insert(pair);
                    }
                }
            }
        }
    }

    /// The server (`k` of `nk`) leading `stream` now, as the first server
    /// that answers says; `None` while it has none (or no server answers).
    pub async fn stream_leader(&self, stream: &str) -> Option<usize> {
        for i in 0..self.servers.len() {
            let Some(detail) = self.stream_detail(i, stream).await else {
                continue;
            };
            if let Some(n) = detail["cluster"]["leader"]
                .as_str()
                .and_then(|n| n.strip_prefix('n')?.parse().ok())
            {
                return Some(n);
            }
        }
        None
    }

    /// What server `i`'s own store holds of `stream`: its last sequence and
    /// its number of records (`None`: no copy, or the server does not answer).
    pub async fn stream_state(&self, i: usize, stream: &str) -> Option<(u64, u64)> {
        let detail = self.stream_detail(i, stream).await?;
        Some((
            detail["state"]["last_seq"].as_u64()?,
            detail["state"]["messages"].as_u64()?,
        ))
    }

    /// What each server says of `stream`'s copies (its leader, each
    /// replica current or not, how far behind), one line a server: for a
    /// failure's message.
    pub async fn stream_views(&self, stream: &str) -> String {
        let mut lines = Vec::new();
        for i in 0..self.servers.len() {
            let view = match self.stream_detail(i, stream).await {
                Some(detail) => format!("{} state {}", detail["cluster"], detail["state"]),
                None => "no copy, or no answer".into(),
            };
            lines.push(format!("n{i}: {view}"));
        }
        lines.join("\n")
    }

    /// `stream`'s entry in server `i`'s `/jsz`.
    async fn stream_detail(&self, i: usize, stream: &str) -> Option<serde_json::Value> {
        let jsz = self.jsz(i).await.ok()?;
        jsz["account_details"]
            .as_array()?
            .iter()
            .flat_map(|a| a["stream_detail"].as_array().cloned().unwrap_or_default())
            .find(|s| s["name"] == stream)
    }

    /// Kills server `k` (SIGKILL), wipes its store, and starts it again on
    /// the same ports: it rejoins with nothing and catches up from the others.
    pub fn wipe(&mut self, k: usize) {
        let server = &mut self.servers[k];
        server.kill();
        let _ = std::fs::remove_dir_all(server.store_dir());
        server.restart();
    }
}

/// Where a test's log lives: one nats-server, or a JetStream cluster whose
/// servers each hold a copy of the stream.
pub enum Bus {
    Server(NatsServer),
    Cluster(NatsCluster),
}

impl Bus {
    /// Starts `servers` servers (one: no cluster) with `options`; a cluster is
    /// returned formed (able to create streams).
    pub async fn start(servers: usize, options: NatsOptions) -> Bus {
        if servers == 1 {
            let server = tokio::task::spawn_blocking(move || NatsServer::start_with(options))
                .await
                .expect("start nats-server");
            return Bus::Server(server);
        }
        let cluster = tokio::task::spawn_blocking(move || NatsCluster::start(servers, options))
            .await
            .expect("start the nats-servers");
        cluster
            .until_formed(Duration::from_secs(60))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        Bus::Cluster(cluster)
    }

    /// The URL clients are given: the cluster's servers comma-separated.
    pub fn url(&self) -> String {
        match self {
            Bus::Server(server) => server.url(),
            Bus::Cluster(cluster) => cluster.url(),
        }
    }

    /// How many copies of a stream the bus can hold: one per server.
    pub fn replicas(&self) -> usize {
        match self {
            Bus::Server(_) => 1,
            Bus::Cluster(cluster) => cluster.servers.len(),
        }
    }

    /// The one server, where the bus is one.
    pub fn server_mut(&mut self) -> Option<&mut NatsServer> {
        match self {
            Bus::Server(server) => Some(server),
            Bus::Cluster(_) => None,
        }
    }

    /// The cluster, where the bus is one.
    pub fn cluster_mut(&mut self) -> Option<&mut NatsCluster> {
        match self {
            Bus::Server(_) => None,
            Bus::Cluster(cluster) => Some(cluster),
        }
    }

    pub fn cluster(&self) -> Option<&NatsCluster> {
        match self {
            Bus::Server(_) => None,
            Bus::Cluster(cluster) => Some(cluster),
        }
    }
}

//! Real nodes beside a [`ControlPlane`]: containerd with runc and kubelet,
//! built by `scripts/install-node-runtime.sh`, registered to the plane and
//! Ready within seconds. kwok nodes ([`crate::kwok`]) stay for scale.
//!
//! Each node lives in a mount namespace of its own, over a directory of its
//! own (`root`): there its `/var/lib` (kubelet's root with the hard-coded
//! `device-plugins/kubelet.sock`, containerd's root, CNI's IPAM state), its
//! `/var/log` (`pods/`, `containers/`) and its `/run` (containerd's state and
//! socket, `/run/cdi`) are that directory's `var-lib`, `var-log` and `run`, and
//! its `/dev` is the host's with an overlay on top, where a test makes the
//! device nodes a CDI spec names ([`RealNode::make_device_nodes`]) without
//! touching the host's `/dev`. Since those directories are ordinary
//! directories of the host too, a test reaches the node's sockets and files
//! from outside through [`RealNode::path`]: a node agent runs as a plain
//! process with `--kubelet-dir` pointing into the node.
//!
//! Pods get a network through the CNI bridge plugin on a bridge of the node's
//! own (no gateway, no masquerade), deleted with the node. kubelet's cgroups go
//! under a cgroup root of the node's own in each v1 hierarchy. When the last
//! node of the process stops, the sysctls kubelet raises at start are put back.
//! Dropping a node stops kubelet, removes every pod sandbox through CRI (so
//! CNI removes the pods' interfaces), stops containerd and any shim left, and
//! removes the bridge, the cgroups and the directory: nothing stays on the
//! host. A missing binary is a test failure naming the install script.
//! kubelet serves on loopback only, and answers anonymous requests (its
//! metrics, for the benchmarks).

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;

use crate::kube::ControlPlane;
use crate::kwok::node_is_ready;
use crate::network::Attachment;

pub const KUBELET_VERSION: &str = "1.36.3";
pub const CONTAINERD_VERSION: &str = "2.4.2";
pub const RUNC_VERSION: &str = "1.5.3";
pub const CNI_VERSION: &str = "1.10.0";
pub const CRICTL_VERSION: &str = "1.37.0";

/// The sandbox image and the busybox image every node has imported.
pub const PAUSE_IMAGE: &str = "localhost/pause:switchyard";
pub const BUSYBOX_IMAGE: &str = "localhost/busybox:switchyard";

const RUNTIME_HINT: &str = "build them with `scripts/install-node-runtime.sh` (kubelet, containerd, runc, the CNI plugins and crictl into ~/.cache/switchyard/node-runtime) or set SWITCHYARD_NODE_RUNTIME to a directory holding them";
const IMAGES_HINT: &str = "build them with `scripts/build-node-images.sh`";

/// The device nodes NVIDIA's driver makes for an 8-card machine, which CDI
/// specs name (make them with [`RealNode::make_device_nodes`]).
pub const GPU_DEVICE_NODES: [&str; 11] = [
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia0",
    "/dev/nvidia1",
    "/dev/nvidia2",
    "/dev/nvidia3",
    "/dev/nvidia4",
    "/dev/nvidia5",
    "/dev/nvidia6",
    "/dev/nvidia7",
];

/// The sysctls kubelet sets at start (kernel defaults it insists on).
const KUBELET_SYSCTLS: [&str; 3] = [
    "kernel/panic",
    "kernel/panic_on_oops",
    "vm/overcommit_memory",
];

/// Where the node runtime is: `$SWITCHYARD_NODE_RUNTIME`, else the pinned
/// build in the cache.
pub fn runtime_dir() -> Result<PathBuf, String> {
    let dir = match std::env::var_os("SWITCHYARD_NODE_RUNTIME") {
        Some(dir) => PathBuf::from(dir),
        None => crate::cache_dir().join(format!(
            "node-runtime/k8s-v{KUBELET_VERSION}-containerd-v{CONTAINERD_VERSION}-runc-v{RUNC_VERSION}-cni-v{CNI_VERSION}-crictl-v{CRICTL_VERSION}"
        )),
    };
    for b in [
        "kubelet",
        "containerd",
        "containerd-shim-runc-v2",
        "ctr",
        "runc",
        "crictl",
        "cni/bridge",
        "cni/host-local",
        "cni/loopback",
    ] {
        if !dir.join(b).is_file() {
            return Err(format!(
                "{} is missing; {RUNTIME_HINT}",
                dir.join(b).display()
            ));
        }
    }
    Ok(dir)
}

/// The image archives every node imports (pause, busybox), as
/// `scripts/build-node-images.sh` prints their directory.
fn images_dir(repo: &Path) -> Result<PathBuf, String> {
    let out = Command::new(repo.join("scripts/build-node-images.sh"))
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("run scripts/build-node-images.sh: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "scripts/build-node-images.sh failed; {IMAGES_HINT}"
        ));
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("node images in "))
        .map(PathBuf::from)
        .ok_or_else(|| "scripts/build-node-images.sh named no directory".to_string())
}

/// The repository root (for the scripts), from this crate's manifest dir.
/// The host's values of [`KUBELET_SYSCTLS`] while nodes run, and how many run.
static SYSCTLS: Mutex<(usize, Vec<(String, String)>)> = Mutex::new((0, Vec::new()));

fn sysctls_hold() {
    let mut held = SYSCTLS.lock().unwrap_or_else(|e| e.into_inner());
    if held.0 == 0 {
        held.1 = KUBELET_SYSCTLS
            .iter()
            .map(|k| {
                let v = std::fs::read_to_string(Path::new("/proc/sys").join(k))
                    .unwrap_or_else(|e| panic!("read /proc/sys/{k}: {e}"));
                (k.to_string(), v.trim().to_string())
            })
            .collect();
    }
    held.0 += 1;
}

fn sysctls_release() {
    let mut held = SYSCTLS.lock().unwrap_or_else(|e| e.into_inner());
    held.0 -= 1;
    if held.0 == 0 {
        for (k, v) in &held.1 {
            let _ = std::fs::write(Path::new("/proc/sys").join(k), v);
        }
    }
}

/// The cgroup v1 hierarchies (real directories under /sys/fs/cgroup), and
/// with `unified` the hybrid mode's v2 one too (kubelet makes its cgroups
/// there as well; it is not prepared beforehand).
fn cgroup_hierarchies(unified: bool) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir("/sys/fs/cgroup") else {
        return Vec::new();
    };
    let mut dirs: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .filter(|p| unified || p.file_name().is_some_and(|n| n != "unified"))
        .collect();
    dirs.sort();
    dirs
}

/// Removes a cgroup directory tree, children first.
fn remove_cgroup(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// A real node: containerd and kubelet in the node's mount namespace,
/// registered as `name`.
pub struct RealNode {
    name: String,
    /// The node's directory (removed last).
    dir: Option<tempfile::TempDir>,
    runtime: PathBuf,
    /// Holds the mount namespace open.
    holder: Child,
    containerd: Option<Child>,
    kubelet: Option<Child>,
    kubeconfig: PathBuf,
    bridge: String,
    cgroup_root: String,
    kubelet_port: u16,
    /// The cluster network the node joined, if any (its bridge is the
    /// network's; kubelet serves on the network's node address).
    network: Option<Attachment>,
}

/// How a [`RealNode`] starts.
#[derive(Clone, Debug, Default)]
pub struct NodeOptions {
    /// Node labels kubelet registers with (`--node-labels`; kubelet refuses
    /// most of the `kubernetes.io` namespace, such as `node-role.kubernetes.io`).
    pub labels: Vec<(String, String)>,
    /// Extra images (docker-archives) to import before kubelet starts.
    pub images: Vec<PathBuf>,
    /// A [`ClusterNetwork`](crate::network::ClusterNetwork) to join
    /// (`network.attach()`): kubelet and containerd run in its namespace,
    /// pods get an address of its pods' network and reach Services and
    /// CoreDNS. Without one, pods get a bridge of the node's own that leads
    /// nowhere.
    pub network: Option<Attachment>,
}

impl RealNode {
    /// Starts a node `name` (a DNS label, unique among the process's nodes)
    /// against `plane`, and waits until its Node is Ready. Panics with the
    /// node's logs if it is not Ready within 60 s.
    pub async fn start(plane: &ControlPlane, name: &str) -> RealNode {
        RealNode::start_with(plane, name, NodeOptions::default()).await
    }

    /// [`RealNode::start`] with labels and extra images.
    pub async fn start_with(plane: &ControlPlane, name: &str, options: NodeOptions) -> RealNode {
        let runtime = runtime_dir().unwrap_or_else(|e| panic!("{e}"));
        let images = images_dir(&crate::repo_root()).unwrap_or_else(|e| panic!("{e}"));
        let dir = tempfile::Builder::new()
            .prefix(&format!("switchyard-node-{name}-"))
            .tempdir()
            .expect("node directory");
        let root = dir.path().to_path_buf();
        for d in [
            "var-lib/kubelet",
            "var-log",
            "run/cdi",
            "dev-upper",
            "dev-work",
            "etc/cni/net.d",
            "etc/cdi",
        ] {
            std::fs::create_dir_all(root.join(d)).expect("node directories");
        }
        // A short, unique bridge name (15 bytes at most).
        let tag = short_tag(&format!("{}:{name}", root.display()));
        let bridge = match &options.network {
            Some(network) => network.bridge.to_string(),
            None => format!("sy{tag}"),
        };
        let cgroup_root = format!("switchyard-{name}-{tag}");
        sysctls_hold();
        // From here on, Drop undoes what was made.
        let mut node = RealNode {
            name: name.to_string(),
            dir: Some(dir),
            runtime: runtime.clone(),
            holder: Self::hold_namespace(&root, options.network.as_ref()),
            containerd: None,
            kubelet: None,
            kubeconfig: plane.kubeconfig(),
            bridge,
            cgroup_root,
            kubelet_port: crate::free_port(),
            network: options.network.clone(),
        };
        node.make_cgroups();
        node.write_configs(&options);
        node.start_containerd();
        for image in [images.join("pause.tar"), images.join("busybox.tar")]
            .into_iter()
            .chain(options.images.iter().cloned())
        {
            node.import(&image);
        }
        node.start_kubelet();
        node.wait_ready(plane).await;
        node
    }

    /// Starts the process holding the node's mount namespace, with its
    /// mounts made; returns once they are.
    fn hold_namespace(root: &Path, network: Option<&Attachment>) -> Child {
        let r = root.display();
        let script = format!(
            "set -e
mount --bind {r}/var-lib /var/lib
mount --bind {r}/var-log /var/log
mount --bind {r}/run /run
mount -t overlay overlay -o lowerdir=/dev,upperdir={r}/dev-upper,workdir={r}/dev-work /dev
mount -t devpts -o newinstance,ptmxmode=0666 devpts /dev/pts 2>/dev/null || true
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
echo mounted
exec sleep infinity"
        );
        // In the cluster network's namespace, if there is one.
        let mut command = match network {
            Some(network) => {
                let mut c = Command::new("nsenter");
                c.arg(format!("--net={}", network.netns.display()))
                    .args(["--", "unshare"]);
                c
            }
            None => Command::new("unshare"),
        };
        let mut child = command
            .args([
                "--mount",
                "--propagation",
                "private",
                "--",
                "sh",
                "-c",
                &script,
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("unshare a mount namespace for the node");
        use std::io::BufRead;
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("read the namespace holder");
        assert_eq!(line.trim(), "mounted", "the node's mounts failed");
        child
    }

    fn make_cgroups(&self) {
        for h in cgroup_hierarchies(false) {
            let dir = h.join(&self.cgroup_root);
            std::fs::create_dir_all(&dir)
                .unwrap_or_else(|e| panic!("create the cgroup {}: {e}", dir.display()));
            // A new cpuset has no CPUs and no memory nodes until given its parent's.
            for f in ["cpuset.cpus", "cpuset.mems"] {
                if let Ok(v) = std::fs::read_to_string(h.join(f)) {
                    std::fs::write(dir.join(f), v.trim())
                        .unwrap_or_else(|e| panic!("write {}: {e}", dir.join(f).display()));
                }
            }
        }
    }

    fn write_configs(&self, options: &NodeOptions) {
        let root = self.root();
        let runtime = self.runtime.display();
        let containerd = format!(
            r#"version = 3
root = "/var/lib/containerd"
state = "/run/containerd"

[grpc]
  address = "/run/containerd/containerd.sock"

[ttrpc]
  address = "/run/containerd/containerd.sock.ttrpc"

[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "{PAUSE_IMAGE}"

[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  cdi_spec_dirs = ["/etc/cdi", "/run/cdi"]

[plugins."io.containerd.cri.v1.runtime".cni]
  bin_dirs = ["{runtime}/cni"]
  conf_dir = "{etc}/cni/net.d"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
  BinaryName = "{runtime}/runc"
  SystemdCgroup = false

[plugins."io.containerd.nri.v1.nri"]
  disable = true
"#,
            etc = root.join("etc").display(),
        );
        std::fs::write(root.join("containerd.toml"), containerd).expect("containerd config");
        let plugin = match &self.network {
            Some(network) => network.cni_plugin(),
            None => serde_json::json!({
                "type": "bridge",
                "bridge": self.bridge,
                "isGateway": false,
                "ipMasq": false,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24"}]]}
            }),
        };
        let cni = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": format!("switchyard-{}", self.name),
            "plugins": [plugin]
        });
        std::fs::write(
            root.join("etc/cni/net.d/10-switchyard.conflist"),
            serde_json::to_vec_pretty(&cni).expect("CNI config"),
        )
        .expect("write the CNI config");
        let kubelet = format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /{cgroup_root}
address: {address}
port: {port}
readOnlyPort: 0
healthzPort: 0
authentication:
  anonymous: {{enabled: true}}
  webhook: {{enabled: false}}
authorization:
  mode: AlwaysAllow
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
failSwapOn: false
resolvConf: \"\"
nodeStatusUpdateFrequency: 1s
nodeStatusReportFrequency: 1s
syncFrequency: 5s
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {{}}
serializeImagePulls: false
",
            cgroup_root = self.cgroup_root,
            port = self.kubelet_port,
            address = self.kubelet_address(),
        );
        let kubelet = match &self.network {
            Some(_) => format!(
                "{kubelet}clusterDNS: [{}]\nclusterDomain: {}\n",
                crate::network::DNS_SERVICE_IP,
                crate::network::CLUSTER_DOMAIN
            ),
            None => kubelet,
        };
        std::fs::write(root.join("kubelet.yaml"), kubelet).expect("kubelet config");
        let labels = options
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        std::fs::write(root.join("node-labels"), labels).expect("labels");
    }

    /// Where kubelet serves: loopback, or the cluster network's node address.
    fn kubelet_address(&self) -> std::net::Ipv4Addr {
        self.network
            .as_ref()
            .map_or(std::net::Ipv4Addr::LOCALHOST, |n| n.node_ip)
    }

    /// A command run inside the node's mount namespace (and network
    /// namespace: the host's, or its cluster network's).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--mount=/proc/{}/ns/mnt", self.holder.id()))
            .arg(format!("--net=/proc/{}/ns/net", self.holder.id()))
            .arg("--")
            .arg(program)
            .env(
                "PATH",
                format!(
                    "{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                    self.runtime.display()
                ),
            );
        c
    }

    fn spawn_logged(&self, program: &Path, args: &[String], log: &str) -> Child {
        let out = File::options()
            .create(true)
            .append(true)
            .open(self.root().join(log))
            .expect("node log");
        let err = out.try_clone().expect("log handle");
        self.command(program)
            .args(args)
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", program.display()))
    }

    fn start_containerd(&mut self) {
        let config = self.root().join("containerd.toml");
        self.containerd = Some(self.spawn_logged(
            &self.runtime.join("containerd"),
            &[format!("--config={}", config.display())],
            "containerd.log",
        ));
        let socket = self.containerd_socket();
        crate::wait_for("containerd's socket", Duration::from_secs(30), || {
            socket.exists().then_some(())
        })
        .unwrap_or_else(|e| panic!("{e}\n--- containerd.log\n{}", self.log_tail("containerd")));
    }

    /// containerd's socket, as the host reaches it.
    pub fn containerd_socket(&self) -> PathBuf {
        self.root().join("run/containerd/containerd.sock")
    }

    /// Imports a docker-archive into containerd's `k8s.io` namespace.
    pub fn import(&self, archive: &Path) {
        let out = Command::new(self.runtime.join("ctr"))
            .arg(format!("--address={}", self.containerd_socket().display()))
            .args(["--namespace=k8s.io", "images", "import"])
            .arg(archive)
            .output()
            .expect("run ctr");
        assert!(
            out.status.success(),
            "ctr images import {}: {}",
            archive.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Starts kubelet (again, after [`Self::stop_kubelet`]).
    pub fn start_kubelet(&mut self) {
        assert!(
            self.kubelet.is_none(),
            "kubelet already runs on {}",
            self.name
        );
        let root = self.root();
        let labels = std::fs::read_to_string(root.join("node-labels")).unwrap_or_default();
        let mut args = vec![
            format!("--config={}", root.join("kubelet.yaml").display()),
            format!("--kubeconfig={}", self.kubeconfig.display()),
            format!("--hostname-override={}", self.name),
            "--v=2".to_string(),
        ];
        if !labels.is_empty() {
            args.push(format!("--node-labels={labels}"));
        }
        if self.network.is_some() {
            args.push(format!("--node-ip={}", self.kubelet_address()));
        }
        self.kubelet = Some(self.spawn_logged(&self.runtime.join("kubelet"), &args, "kubelet.log"));
    }

    /// Stops kubelet (SIGTERM, then waits); containerd and the pods run on.
    pub fn stop_kubelet(&mut self) {
        if let Some(mut kubelet) = self.kubelet.take() {
            terminate(&mut kubelet);
        }
    }

    /// Waits until the Node is Ready; panics with kubelet's log if kubelet
    /// exits first or the Node is not Ready within 60 s.
    pub async fn wait_ready(&mut self, plane: &ControlPlane) {
        let nodes: kube::Api<Node> = kube::Api::all(plane.client());
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let exited = self
                .kubelet
                .as_mut()
                .and_then(|k| k.try_wait().ok().flatten());
            if let Some(status) = exited {
                panic!(
                    "kubelet of {} exited ({status})\n--- kubelet.log\n{}",
                    self.name,
                    self.log_tail("kubelet")
                );
            }
            let ready = nodes.get_opt(&self.name).await.ok().flatten();
            if ready.is_some_and(|n| node_is_ready(&n)) {
                return;
            }
            if std::time::Instant::now() >= deadline {
                panic!(
                    "Node {} not Ready within 60 s\n--- kubelet.log\n{}\n--- containerd.log\n{}",
                    self.name,
                    self.log_tail("kubelet"),
                    self.log_tail("containerd")
                );
            }
            // No event to wait on for a process that may exit: a short poll.
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// kubelet's own metrics (`/metrics` on its loopback port, read
    /// anonymously: the test node allows it), in Prometheus' text format.
    pub async fn kubelet_metrics(&self) -> Result<String, String> {
        self.kubelet_get("/metrics").await
    }

    /// A path of kubelet's API (`/metrics`, `/stats/summary`), read
    /// anonymously as the test node allows.
    pub async fn kubelet_get(&self, path: &str) -> Result<String, String> {
        let url: http::Uri = format!("https://{}:{}", self.kubelet_address(), self.kubelet_port)
            .parse()
            .map_err(|e| format!("{e}"))?;
        let mut config = kube::Config::new(url);
        config.accept_invalid_certs = true;
        let client = kube::Client::try_from(config).map_err(|e| e.to_string())?;
        let request = http::Request::get(path)
            .body(Vec::new())
            .map_err(|e| e.to_string())?;
        client
            .request_text(request)
            .await
            .map_err(|e| e.to_string())
    }

    /// The node's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The node's directory as the host sees it.
    pub fn root(&self) -> &Path {
        self.dir.as_ref().expect("node directory").path()
    }

    /// A path of the node (`/var/lib/kubelet`, `/run/cdi`, `/var/log/pods`)
    /// as the host reaches it.
    pub fn path(&self, inside: &str) -> PathBuf {
        let root = self.root();
        for (prefix, dir) in [
            ("/var/lib", "var-lib"),
            ("/var/log", "var-log"),
            ("/run", "run"),
            ("/var/run", "run"),
        ] {
            if let Some(rest) = inside.strip_prefix(prefix)
                && (rest.is_empty() || rest.starts_with('/'))
            {
                return root.join(dir).join(rest.trim_start_matches('/'));
            }
        }
        panic!("{inside} is not a node path reachable from the host (/var/lib, /var/log, /run)");
    }

    /// Kubelet's root directory as the host reaches it (a node agent's `--kubelet-dir`).
    pub fn kubelet_dir(&self) -> PathBuf {
        self.path("/var/lib/kubelet")
    }

    /// The node's CDI directory (`/run/cdi`) as the host reaches it.
    pub fn cdi_dir(&self) -> PathBuf {
        self.path("/run/cdi")
    }

    /// Makes character device nodes (1:3, like /dev/null) at `paths` (under
    /// `/dev`) in the node's own `/dev`, as a GPU driver would; the host's
    /// `/dev` is untouched.
    pub fn make_device_nodes(&self, paths: &[&str]) {
        for p in paths {
            assert!(p.starts_with("/dev/"), "{p} is not under /dev");
            let out = self
                .command("sh")
                .args(["-c", &format!("[ -e {p} ] || mknod -m 0666 {p} c 1 3")])
                .output()
                .expect("run mknod in the node");
            assert!(
                out.status.success(),
                "mknod {p}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    /// The last lines of a node log (`kubelet`, `containerd`).
    pub fn log_tail(&self, component: &str) -> String {
        crate::kube::tail(&self.root().join(format!("{component}.log")))
    }

    /// What a container printed, from the log kubelet keeps under
    /// `/var/log/pods` (the CRI log format's message part).
    pub fn container_log(&self, namespace: &str, pod: &str, container: &str) -> Option<String> {
        let pods = self.path("/var/log/pods");
        let prefix = format!("{namespace}_{pod}_");
        let dir = std::fs::read_dir(&pods)
            .ok()?
            .flatten()
            .find(|e| e.file_name().to_string_lossy().starts_with(&prefix))?
            .path()
            .join(container);
        let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
            .ok()?
            .flatten()
            .map(|e| e.path())
            .collect();
        files.sort();
        let text = std::fs::read_to_string(files.last()?).ok()?;
        // "<time> <stream> <F|P> <message>"
        Some(
            text.lines()
                .filter_map(|l| l.splitn(4, ' ').nth(3))
                .collect::<Vec<_>>()
                .join("\n"),
        )
    }

    /// `crictl` against the node's containerd, its output.
    pub fn crictl(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new(self.runtime.join("crictl"))
            .arg(format!(
                "--runtime-endpoint=unix://{}",
                self.containerd_socket().display()
            ))
            .args(args)
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// The processes in the node's mount namespace, the holder aside.
    fn processes(&self) -> Vec<i32> {
        let ns = |pid: &str| {
            std::fs::metadata(format!("/proc/{pid}/ns/mnt"))
                .map(|m| m.ino())
                .ok()
        };
        let Some(own) = ns(&self.holder.id().to_string()) else {
            return Vec::new();
        };
        std::fs::read_dir("/proc")
            .map(|d| {
                d.flatten()
                    .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
                    .filter(|pid| {
                        *pid as u32 != self.holder.id() && ns(&pid.to_string()) == Some(own)
                    })
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// A short hex tag of `s` (for names with length limits).
fn short_tag(s: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    s.hash(&mut h);
    format!("{:012x}", h.finish() & 0xffff_ffff_ffff)
}

/// SIGTERM, then SIGKILL after 10 s; reaped either way.
fn terminate(child: &mut Child) {
    let _ = Command::new("kill").arg(child.id().to_string()).status();
    let gone = crate::wait_for("the process to exit", Duration::from_secs(10), || {
        matches!(child.try_wait(), Ok(Some(_))).then_some(())
    });
    if gone.is_err() {
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        self.stop_kubelet();
        if self.containerd.is_some() {
            // Every sandbox stopped and removed through CRI: containers
            // killed, CNI DEL run (the pods' veths go), netns unmounted.
            let _ = self.crictl(&["rmp", "--all", "--force"]);
        }
        if let Some(mut containerd) = self.containerd.take() {
            terminate(&mut containerd);
        }
        // Shims and anything else still in the namespace.
        for _ in 0..3 {
            let left = self.processes();
            if left.is_empty() {
                break;
            }
            for pid in left {
                let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            }
            let _ = crate::wait_for(
                "the node's processes to exit",
                Duration::from_secs(5),
                || self.processes().is_empty().then_some(()),
            );
        }
        let _ = self.holder.kill();
        let _ = self.holder.wait();
        for h in cgroup_hierarchies(true) {
            remove_cgroup(&h.join(&self.cgroup_root));
        }
        // A cluster network's bridge is the network's, in its namespace.
        if self.network.is_none() && Path::new("/sys/class/net").join(&self.bridge).exists() {
            let _ = Command::new("ip")
                .args(["link", "del", &self.bridge])
                .status();
        }
        sysctls_release();
        // The namespace is gone with its holder: its mounts with it.
        self.dir.take();
    }
}

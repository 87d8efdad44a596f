//! A cluster network for real nodes: pods that reach the API server and each
//! other through Services, and find them by name.
//!
//! [`ClusterNetwork`] is a network namespace of the test's own. In it:
//! - a bridge, `cbr0`, the pods' network 10.244.0.0/16 with its gateway
//!   10.244.0.1; each node attached to it gets a /24 of its own;
//! - the nodes' address ([`ClusterNetwork::node_ip`]), one end of a veth
//!   pair whose other end, in the host's namespace, is the control plane's
//!   address ([`ClusterNetwork::host_ip`]; start the plane with
//!   `Components { bind_address: Some(network.host_ip()), .. }`): a /30 of
//!   10.243.0.0/16 that only this network uses;
//! - forwarding, and a masquerade of the pods' traffic out of the namespace,
//!   so that the host's side answers the node's address;
//! - kube-proxy ([`ClusterNetwork::start_kube_proxy`], iptables mode, built
//!   from k8s.io/kubernetes by `scripts/install-cluster-network.sh`), which
//!   all the nodes share since they share the namespace: ClusterIPs, and
//!   NodePorts on the nodes' address only;
//! - CoreDNS as a Deployment behind the `kube-dns` Service at 10.96.0.10
//!   ([`ClusterNetwork::deploy_dns`], the image built by the same script).
//!
//! Nodes join with [`NodeOptions::network`](crate::node::NodeOptions):
//! their kubelet and containerd run in the namespace, the pods' veths hang
//! on its bridge, kubelet serves on the nodes' address and tells pods to ask
//! 10.96.0.10 for names. Nothing of it is on the host but the veth's host end;
//! dropping the network (after its nodes) stops kube-proxy, ends the
//! namespace — its bridge, routes and iptables rules with it — and deletes
//! the veth, and checks that the host end is gone.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use crate::kube::ControlPlane;

pub const KUBE_PROXY_VERSION: &str = "1.36.3";
pub const COREDNS_VERSION: &str = "1.15.0";
/// CoreDNS's image, as `scripts/install-cluster-network.sh` packs it.
pub const COREDNS_IMAGE: &str = "localhost/coredns:v1.15.0";
/// The `kube-dns` Service's address, in the API server's Service range.
pub const DNS_SERVICE_IP: &str = "10.96.0.10";
pub const CLUSTER_DOMAIN: &str = "cluster.local";
/// The pods' network and its gateway, inside the namespace.
pub const POD_NETWORK: &str = "10.244.0.0/16";
const POD_GATEWAY: &str = "10.244.0.1";
const BRIDGE: &str = "cbr0";

const BUILD_HINT: &str = "build them with `scripts/install-cluster-network.sh` (kube-proxy v1.36.3 and CoreDNS v1.15.0 with its image into ~/.cache/switchyard/cluster-network)";

/// Where kube-proxy, CoreDNS and CoreDNS's image archive are.
pub fn binaries_dir() -> Result<PathBuf, String> {
    let dir = crate::cache_dir().join(format!(
        "cluster-network/k8s-v{KUBE_PROXY_VERSION}-coredns-v{COREDNS_VERSION}"
    ));
    for b in ["kube-proxy", "coredns", "coredns.tar"] {
        if !dir.join(b).is_file() {
            return Err(format!(
                "{} is missing; {BUILD_HINT}",
                dir.join(b).display()
            ));
        }
    }
    Ok(dir)
}

/// A network namespace with the pods' bridge, joined to the host by a veth
/// pair; kube-proxy and CoreDNS once started.
pub struct ClusterNetwork {
    /// Holds the namespace open.
    holder: Child,
    /// The veth's end in the host's namespace.
    link: String,
    host_ip: Ipv4Addr,
    node_ip: Ipv4Addr,
    /// The third octet of the next node's pod range.
    next_range: AtomicU8,
    kube_proxy: Mutex<Option<Child>>,
    dir: tempfile::TempDir,
}

/// What a node needs to join a [`ClusterNetwork`]: its namespace, the
/// nodes' address and the node's own pod range.
#[derive(Clone, Debug)]
pub struct Attachment {
    pub(crate) netns: PathBuf,
    pub(crate) node_ip: Ipv4Addr,
    pub(crate) bridge: &'static str,
    /// The node's pods' first and last address.
    pub(crate) range: (Ipv4Addr, Ipv4Addr),
}

impl Attachment {
    /// The bridge CNI configuration's plugin for the node's pods.
    pub(crate) fn cni_plugin(&self) -> serde_json::Value {
        serde_json::json!({
            "type": "bridge",
            "bridge": self.bridge,
            "isGateway": true,
            "isDefaultGateway": true,
            "ipMasq": false,
            "hairpinMode": true,
            "ipam": {"type": "host-local", "ranges": [[{
                "subnet": POD_NETWORK,
                "rangeStart": self.range.0.to_string(),
                "rangeEnd": self.range.1.to_string(),
                "gateway": POD_GATEWAY,
            }]]}
        })
    }
}

/// The /30 links of this process's networks, so that two networks of one
/// test process never share one; the process id keeps processes apart.
static LINKS: AtomicU8 = AtomicU8::new(0);

fn run(command: &mut Command) -> Result<(), String> {
    let out = command
        .output()
        .map_err(|e| format!("run {command:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{command:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Whether the host has `ip` on one of its interfaces.
fn address_in_use(ip: Ipv4Addr) -> bool {
    Command::new("ip")
        .args(["-o", "-4", "addr", "show"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains(&format!("inet {ip}/")))
        .unwrap_or(false)
}

impl ClusterNetwork {
    /// Makes the namespace, its bridge and the veth pair. Panics, naming the
    /// step, if one fails.
    pub fn new() -> ClusterNetwork {
        let dir = tempfile::Builder::new()
            .prefix("switchyard-network-")
            .tempdir()
            .expect("the network's directory");
        let mut holder = Command::new("unshare")
            .args(["--net", "--", "sh", "-c", "echo ready; exec sleep infinity"])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("unshare a network namespace");
        {
            use std::io::BufRead;
            let mut line = String::new();
            std::io::BufReader::new(holder.stdout.take().expect("stdout"))
                .read_line(&mut line)
                .expect("read the namespace holder");
            assert_eq!(line.trim(), "ready", "the network namespace");
        }
        // A /30 no other network of this host uses.
        let pid = std::process::id();
        let (host_ip, node_ip) = loop {
            let n = LINKS.fetch_add(1, Ordering::Relaxed);
            let host_ip = Ipv4Addr::new(10, 243, (pid % 251) as u8, (n % 64) * 4 + 1);
            if !address_in_use(host_ip) {
                break (host_ip, Ipv4Addr::from(u32::from(host_ip) + 1));
            }
            assert!(n < 64, "no free /30 in 10.243.{}.0/24", pid % 251);
        };
        let link = format!("syn{}", u32::from(host_ip) & 0xffff);
        let network = ClusterNetwork {
            holder,
            link,
            host_ip,
            node_ip,
            next_range: AtomicU8::new(1),
            kube_proxy: Mutex::new(None),
            dir,
        };
        network
            .wire()
            .unwrap_or_else(|e| panic!("the cluster network: {e}"));
        network
    }

    /// The veth pair, the addresses, routes, forwarding and the bridge.
    fn wire(&self) -> Result<(), String> {
        let netns = self.netns();
        run(Command::new("ip")
            .args([
                "link", "add", &self.link, "type", "veth", "peer", "name", "eth0", "netns",
            ])
            .arg(self.holder.id().to_string()))?;
        run(Command::new("ip").args([
            "addr",
            "add",
            &format!("{}/30", self.host_ip),
            "dev",
            &self.link,
        ]))?;
        run(Command::new("ip").args(["link", "set", &self.link, "up"]))?;
        let script = format!(
            "set -e
ip link set lo up
ip addr add {node_ip}/30 dev eth0
ip link set eth0 up
ip route add default via {host_ip}
echo 1 > /proc/sys/net/ipv4/ip_forward
ip link add {BRIDGE} type bridge
ip addr add {POD_GATEWAY}/16 dev {BRIDGE}
ip link set {BRIDGE} up
iptables -t nat -A POSTROUTING -s {POD_NETWORK} -o eth0 -j MASQUERADE",
            node_ip = self.node_ip,
            host_ip = self.host_ip,
        );
        run(Command::new("nsenter")
            .arg(format!("--net={}", netns.display()))
            .args(["--", "sh", "-c", &script]))
    }

    /// The namespace, as `nsenter --net=` takes it.
    pub fn netns(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/ns/net", self.holder.id()))
    }

    /// The control plane's address: the veth's host end.
    pub fn host_ip(&self) -> Ipv4Addr {
        self.host_ip
    }

    /// The nodes' address (their kubelets, and NodePorts), reachable from
    /// the host.
    pub fn node_ip(&self) -> Ipv4Addr {
        self.node_ip
    }

    /// A new node's way into the network, with a /24 of the pods' network
    /// of its own (10.244.1.0/24 for the first node, and so on).
    pub fn attach(&self) -> Attachment {
        let n = self.next_range.fetch_add(1, Ordering::Relaxed);
        assert!(n < 255, "at most 254 nodes on one network");
        Attachment {
            netns: self.netns(),
            node_ip: self.node_ip,
            bridge: BRIDGE,
            range: (Ipv4Addr::new(10, 244, n, 2), Ipv4Addr::new(10, 244, n, 254)),
        }
    }

    /// A command run in the namespace.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net={}", self.netns().display()))
            .arg("--")
            .arg(program);
        c
    }

    /// A control plane for the network's nodes: the API server on the
    /// host's address ([`Self::host_ip`]), the scheduler and the controller
    /// manager; and kube-proxy started against it.
    pub async fn start_plane(&self) -> ControlPlane {
        let plane = ControlPlane::start_with(crate::kube::Components {
            scheduler: true,
            controller_manager: true,
            bind_address: Some(self.host_ip),
            ..Default::default()
        })
        .await;
        self.start_kube_proxy(&plane);
        plane
    }

    /// Starts kube-proxy in the namespace against `plane` (iptables mode,
    /// masquerading what it proxies, NodePorts on the nodes' address; it
    /// leaves the conntrack sysctls alone) and waits until it has written
    /// the `kubernetes` Service's rules.
    pub fn start_kube_proxy(&self, plane: &ControlPlane) {
        let bin = binaries_dir().unwrap_or_else(|e| panic!("{e}"));
        let config = self.dir.path().join("kube-proxy.yaml");
        std::fs::write(
            &config,
            format!(
                "apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: {kubeconfig}
mode: iptables
clusterCIDR: {POD_NETWORK}
hostnameOverride: switchyard-network
bindAddress: {node_ip}
nodePortAddresses: [\"{node_ip}/32\"]
iptables:
  masqueradeAll: true
  syncPeriod: 5s
  minSyncPeriod: 0s
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
  udpTimeout: 0s
  udpStreamTimeout: 0s
",
                kubeconfig = plane.kubeconfig().display(),
                node_ip = self.node_ip,
            ),
        )
        .expect("kube-proxy's config");
        let log = std::fs::File::create(self.dir.path().join("kube-proxy.log")).expect("log");
        let child = self
            .command(bin.join("kube-proxy"))
            .arg(format!("--config={}", config.display()))
            .arg("--v=2")
            .stdout(Stdio::from(log.try_clone().expect("log")))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start kube-proxy");
        *self.kube_proxy.lock().unwrap() = Some(child);
        crate::wait_for(
            "kube-proxy's rules for 10.96.0.1",
            Duration::from_secs(60),
            || {
                let out = self
                    .command("iptables-save")
                    .args(["-t", "nat"])
                    .output()
                    .ok()?;
                String::from_utf8_lossy(&out.stdout)
                    .contains("default/kubernetes:https")
                    .then_some(())
            },
        )
        .unwrap_or_else(|e| panic!("{e}\n--- kube-proxy.log\n{}", self.log_tail("kube-proxy")));
    }

    /// The last lines of a log of the network's (`kube-proxy`).
    pub fn log_tail(&self, name: &str) -> String {
        crate::kube::tail(&self.dir.path().join(format!("{name}.log")))
    }

    /// CoreDNS's image archive, for the nodes to import
    /// ([`NodeOptions::images`](crate::node::NodeOptions)).
    pub fn dns_image() -> PathBuf {
        binaries_dir()
            .unwrap_or_else(|e| panic!("{e}"))
            .join("coredns.tar")
    }

    /// CoreDNS in `kube-system`: its ServiceAccount and read-only role, its
    /// Corefile (the `kubernetes` plugin for `cluster.local`, no forwarding:
    /// nothing leaves the machine), a one-replica Deployment on port 1053 as
    /// its non-root user, and the `kube-dns` Service at 10.96.0.10 port 53.
    /// Returns once its pod is Ready.
    pub async fn deploy_dns(&self, client: &kube::Client) {
        use k8s_openapi::api::apps::v1::Deployment;
        use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
        use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
        use kube::api::{Api, Patch, PatchParams};
        let apply = PatchParams::apply("switchyard-testkit").force();
        let ns = "kube-system";
        macro_rules! put {
            ($kind:ty, $api:expr, $value:expr) => {{
                let object: $kind = serde_json::from_value($value).expect(stringify!($kind));
                let name = object.metadata.name.clone().unwrap_or_default();
                $api.patch(&name, &apply, &Patch::Apply(&object))
                    .await
                    .unwrap_or_else(|e| panic!("apply {} {name}: {e}", stringify!($kind)));
            }};
        }
        let meta = serde_json::json!({"name": "coredns", "namespace": ns, "labels": {"k8s-app": "kube-dns"}});
        put!(
            ServiceAccount,
            Api::<ServiceAccount>::namespaced(client.clone(), ns),
            serde_json::json!({
            "apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta})
        );
        put!(
            ClusterRole,
            Api::<ClusterRole>::all(client.clone()),
            serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
            "metadata": {"name": "switchyard-testkit:coredns"},
            "rules": [
                {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"], "verbs": ["list", "watch"]},
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]}
            ]})
        );
        put!(
            ClusterRoleBinding,
            Api::<ClusterRoleBinding>::all(client.clone()),
            serde_json::json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
            "metadata": {"name": "switchyard-testkit:coredns"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "switchyard-testkit:coredns"},
            "subjects": [{"kind": "ServiceAccount", "name": "coredns", "namespace": ns}]})
        );
        let corefile = format!(
            ".:1053 {{\n    errors\n    health :8080\n    ready :8181\n    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{\n        pods insecure\n        fallthrough in-addr.arpa ip6.arpa\n        ttl 5\n    }}\n    cache 5\n    loop\n    reload\n}}\n"
        );
        put!(
            ConfigMap,
            Api::<ConfigMap>::namespaced(client.clone(), ns),
            serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
            "data": {"Corefile": corefile}})
        );
        put!(
            Deployment,
            Api::<Deployment>::namespaced(client.clone(), ns),
            serde_json::json!({
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta,
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"k8s-app": "kube-dns"}},
                "template": {
                    "metadata": {"labels": {"k8s-app": "kube-dns"}},
                    "spec": {
                        "serviceAccountName": "coredns",
                        "dnsPolicy": "Default",
                        "securityContext": {"runAsUser": 65532, "runAsNonRoot": true},
                        "containers": [{
                            "name": "coredns",
                            "image": COREDNS_IMAGE,
                            "imagePullPolicy": "Never",
                            "args": ["-conf", "/etc/coredns/Corefile"],
                            "ports": [
                                {"name": "dns", "containerPort": 1053, "protocol": "UDP"},
                                {"name": "dns-tcp", "containerPort": 1053, "protocol": "TCP"}
                            ],
                            "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns", "readOnly": true}],
                            "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181}, "periodSeconds": 1},
                            "livenessProbe": {"httpGet": {"path": "/health", "port": 8080}, "periodSeconds": 10}
                        }],
                        "volumes": [{"name": "config", "configMap": {"name": "coredns"}}]
                    }
                }
            }})
        );
        put!(
            Service,
            Api::<Service>::namespaced(client.clone(), ns),
            serde_json::json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": "kube-dns", "namespace": ns, "labels": {"k8s-app": "kube-dns"}},
            "spec": {
                "clusterIP": DNS_SERVICE_IP,
                "selector": {"k8s-app": "kube-dns"},
                "ports": [
                    {"name": "dns", "port": 53, "targetPort": 1053, "protocol": "UDP"},
                    {"name": "dns-tcp", "port": 53, "targetPort": 1053, "protocol": "TCP"}
                ]
            }})
        );
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
        crate::eventually("CoreDNS Ready", Duration::from_secs(120), || async {
            deployments
                .get("coredns")
                .await
                .ok()
                .and_then(|d| d.status?.ready_replicas)
                .is_some_and(|n| n >= 1)
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    }
}

impl Default for ClusterNetwork {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for ClusterNetwork {
    fn drop(&mut self) {
        if let Some(mut proxy) = self.kube_proxy.lock().unwrap().take() {
            let _ = proxy.kill();
            let _ = proxy.wait();
        }
        // The namespace ends with its last process: its bridge, routes and
        // iptables rules with it. Deleting the veth's host end deletes both.
        let _ = self.holder.kill();
        let _ = self.holder.wait();
        let _ = Command::new("ip")
            .args(["link", "del", &self.link])
            .status();
        let gone = crate::wait_for("the veth's host end to go", Duration::from_secs(10), || {
            (!std::path::Path::new("/sys/class/net")
                .join(&self.link)
                .exists())
            .then_some(())
        });
        if let Err(e) = gone
            && !std::thread::panicking()
        {
            panic!("{e}");
        }
    }
}

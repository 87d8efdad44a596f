//! A real Kubernetes control plane for tests: etcd and kube-apiserver (RBAC on,
//! a static admin token, a self-signed serving certificate made per run), on
//! free loopback ports in a temp dir, stopped when dropped. Nodes are API
//! objects without kubelets, as scheduler_perf and kwok do; `crate::kwok`
//! gives them (and their pods) a lifecycle.
//!
//! The binaries come from `scripts/control-plane.sh` (official Go modules,
//! cached by version). A missing binary is a test failure that says how to
//! build it — never a skip.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::cache_dir;

pub const KUBERNETES_VERSION: &str = "1.36.3";
pub const ETCD_VERSION: &str = "3.6.16";

const BUILD_HINT: &str = "build them with `scripts/control-plane.sh` (kube-apiserver, kube-scheduler, kube-controller-manager v1.36.3 and etcd v3.6.16 into ~/.cache/switchyard/control-plane) or set SWITCHYARD_CONTROL_PLANE to a directory holding them";

const ADMIN_TOKEN: &str = "switchyard-test-admin-token";

/// Where the control-plane binaries are.
pub fn binaries_dir() -> Result<PathBuf, String> {
    let dir = match std::env::var_os("SWITCHYARD_CONTROL_PLANE") {
        Some(dir) => PathBuf::from(dir),
        None => cache_dir().join(format!(
            "control-plane/k8s-v{KUBERNETES_VERSION}-etcd-v{ETCD_VERSION}"
        )),
    };
    for binary in ["etcd", "kube-apiserver"] {
        if !dir.join(binary).is_file() {
            return Err(format!(
                "{} is missing; {BUILD_HINT}",
                dir.join(binary).display()
            ));
        }
    }
    Ok(dir)
}

pub(crate) fn spawn(binary: &Path, args: &[String], log: &Path) -> Result<Child, String> {
    let out = File::create(log).map_err(|e| e.to_string())?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    Command::new(binary)
        .args(args)
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        .spawn()
        .map_err(|e| format!("start {}: {e}", binary.display()))
}

/// Sends `signal` (`-STOP`, `-CONT`) to `child`.
fn signal(child: &Child, signal: &str) {
    let pid = child.id();
    let status = Command::new("kill")
        .args([signal, &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {signal} {pid}");
}

pub(crate) fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// Components to run besides etcd and kube-apiserver.
#[derive(Clone, Copy, Debug, Default)]
pub struct Components {
    pub scheduler: bool,
    /// kube-controller-manager with its default controllers (the resourceclaim
    /// controller among them) but no node lifecycle: nodes have no kubelets.
    pub controller_manager: bool,
    /// API Priority and Fairness on, as in a real cluster (off otherwise:
    /// the harness's clients are `system:masters`, which it exempts anyway).
    pub flow_control: bool,
    /// The API server's `--feature-gates` (e.g. `DRAConsumableCapacity=false`),
    /// empty for its defaults.
    pub apiserver_feature_gates: &'static str,
    /// Where the API server listens and what it advertises (the `kubernetes`
    /// Service's endpoint): loopback by default; a [`ClusterNetwork`]'s host
    /// address for real nodes whose pods reach it through a Service.
    ///
    /// [`ClusterNetwork`]: crate::network::ClusterNetwork
    pub bind_address: Option<std::net::Ipv4Addr>,
}

/// etcd and kube-apiserver (and on request kube-scheduler and
/// kube-controller-manager), running.
pub struct ControlPlane {
    dir: tempfile::TempDir,
    etcd: Option<Child>,
    apiserver: Option<Child>,
    others: Vec<Child>,
    /// kube-controller-manager's place in `others`, when it runs.
    controller_manager: Option<usize>,
    apiserver_port: u16,
    /// The address it listens on.
    address: std::net::Ipv4Addr,
    /// How the API server was started, to start it again.
    apiserver_command: (PathBuf, Vec<String>),
    /// How long etcd and the API server took to become ready.
    pub startup: Duration,
}

impl ControlPlane {
    /// Starts etcd and kube-apiserver and waits until the API answers.
    pub async fn start() -> ControlPlane {
        Self::start_with(Components::default()).await
    }

    /// Starts etcd, kube-apiserver and `components`; waits until the API answers.
    pub async fn start_with(components: Components) -> ControlPlane {
        // A port picked free can be taken before etcd or the API server binds
        // it (by another process's outgoing connection): then start again on
        // new ports.
        let mut attempt = 1;
        loop {
            match Self::try_start(components).await {
                Ok(plane) => return plane,
                Err(e) if attempt < 3 && e.contains("address already in use") => attempt += 1,
                Err(e) => panic!("{e}"),
            }
        }
    }

    async fn try_start(components: Components) -> Result<ControlPlane, String> {
        let started = Instant::now();
        let bin = binaries_dir().unwrap_or_else(|err| panic!("{err}"));
        let dir = tempfile::Builder::new()
            .prefix("switchyard-kube-")
            .tempdir()
            .expect("temp dir");
        let path = |name: &str| dir.path().join(name);

        let (client_port, peer_port) = (crate::free_port(), crate::free_port());
        let etcd_args = vec![
            format!("--data-dir={}", path("etcd").display()),
            format!("--listen-client-urls=http://127.0.0.1:{client_port}"),
            format!("--advertise-client-urls=http://127.0.0.1:{client_port}"),
            format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"),
            format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"),
            format!("--initial-cluster=default=http://127.0.0.1:{peer_port}"),
            // Test data: durability is not what is under test here.
            "--unsafe-no-fsync=true".into(),
            "--log-level=warn".into(),
        ];
        let etcd = spawn(&bin.join("etcd"), &etcd_args, &path("etcd.log"))
            .unwrap_or_else(|e| panic!("{e}"));

        // The service-account signing key, made for this run.
        let key = rcgen::KeyPair::generate().expect("generate a key");
        std::fs::write(path("sa.key"), key.serialize_pem()).expect("write key");
        std::fs::write(path("sa.pub"), key.public_key_pem()).expect("write public key");
        std::fs::write(
            path("tokens.csv"),
            format!("{ADMIN_TOKEN},admin,admin,\"system:masters\"\n"),
        )
        .expect("tokens");

        let apiserver_port = crate::free_port();
        let address = components
            .bind_address
            .unwrap_or(std::net::Ipv4Addr::LOCALHOST);
        let apiserver_args = vec![
            format!("--etcd-servers=http://127.0.0.1:{client_port}"),
            format!("--secure-port={apiserver_port}"),
            format!("--bind-address={address}"),
            format!("--advertise-address={address}"),
            format!("--cert-dir={}", path("certs").display()),
            "--authorization-mode=RBAC".into(),
            format!("--token-auth-file={}", path("tokens.csv").display()),
            "--service-account-issuer=https://kubernetes.default.svc".into(),
            format!("--service-account-key-file={}", path("sa.pub").display()),
            format!(
                "--service-account-signing-key-file={}",
                path("sa.key").display()
            ),
            "--service-cluster-ip-range=10.96.0.0/16".into(),
            // DRA's 1.36 features are on by default (pkg/features/kube_features.go
            // of k8s.io/kubernetes v1.36.3): DRAExtendedResource, DRAConsumableCapacity,
            // DRAPartitionableDevices, DRADeviceBindingConditions beta since 1.36,
            // DRAResourceClaimDeviceStatus since 1.33 — so no --feature-gates here,
            // on the scheduler or on the controller manager.
            "--runtime-config=resource.k8s.io/v1=true".into(),
            format!("--enable-priority-and-fairness={}", components.flow_control),
            // Nodes here have no kubelet and no node-lifecycle controller to lift
            // the not-ready taint this plugin puts on every new node.
            "--disable-admission-plugins=TaintNodesByCondition".into(),
        ];
        let mut apiserver_args = apiserver_args;
        if components.bind_address.is_some() {
            // Real nodes of a cluster network serve on their InternalIP, and
            // their names resolve nowhere (logs, exec, port-forward).
            apiserver_args.push("--kubelet-preferred-address-types=InternalIP".into());
        }
        if !components.apiserver_feature_gates.is_empty() {
            apiserver_args.push(format!(
                "--feature-gates={}",
                components.apiserver_feature_gates
            ));
        }
        let apiserver = spawn(
            &bin.join("kube-apiserver"),
            &apiserver_args,
            &path("kube-apiserver.log"),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let mut plane = ControlPlane {
            dir,
            etcd: Some(etcd),
            apiserver: Some(apiserver),
            others: Vec::new(),
            controller_manager: None,
            apiserver_port,
            address,
            apiserver_command: (bin.join("kube-apiserver"), apiserver_args),
            startup: Duration::ZERO,
        };
        plane.until_ready().await?;
        plane.start_components(&bin, components);
        plane.startup = started.elapsed();
        Ok(plane)
    }

    /// Waits until the API answers (90 s at most).
    async fn until_ready(&mut self) -> Result<(), String> {
        let client = self.client();
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if client.apiserver_version().await.is_ok() {
                return Ok(());
            }
            if Instant::now() >= deadline || self.exited() {
                return Err(format!(
                    "kube-apiserver exited or did not become ready within 90 s\n--- kube-apiserver.log\n{}\n--- etcd.log\n{}",
                    tail(&self.dir.path().join("kube-apiserver.log")),
                    tail(&self.dir.path().join("etcd.log"))
                ));
            }
            // Polling a condition with a deadline: the API has no readiness
            // event to wait on. Often, so a restart's downtime is not overstated.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Kills kube-apiserver (SIGKILL) and starts it again on the same port,
    /// etcd and certificates; returns once the API answers again. Watches
    /// and clients see it go away and come back, as in an API server's
    /// rollout or crash.
    pub async fn restart_apiserver(&mut self) {
        if let Some(mut child) = self.apiserver.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let (binary, args) = &self.apiserver_command;
        let log = self.dir.path().join("kube-apiserver.log");
        let _ = std::fs::rename(&log, self.dir.path().join("kube-apiserver.log.1"));
        self.apiserver = Some(spawn(binary, args, &log).unwrap_or_else(|e| panic!("{e}")));
        self.until_ready().await.unwrap_or_else(|e| panic!("{e}"));
    }

    /// Stops etcd (SIGSTOP) until [`Self::resume_etcd`]: the API server
    /// stays up but can neither read nor write, and its watches go quiet.
    pub fn pause_etcd(&self) {
        self.signal_etcd("-STOP");
    }

    pub fn resume_etcd(&self) {
        self.signal_etcd("-CONT");
    }

    /// Stops kube-controller-manager (SIGSTOP) until
    /// [`Self::resume_controller_manager`]: no controller acts meanwhile (a
    /// ResourceClaim stays allocated and reserved for a pod that is gone).
    pub fn pause_controller_manager(&self) {
        signal(self.controller_manager_process(), "-STOP");
    }

    pub fn resume_controller_manager(&self) {
        signal(self.controller_manager_process(), "-CONT");
    }

    fn controller_manager_process(&self) -> &Child {
        let at = self
            .controller_manager
            .expect("kube-controller-manager runs");
        &self.others[at]
    }

    fn signal_etcd(&self, signal_name: &str) {
        signal(self.etcd.as_ref().expect("etcd runs"), signal_name);
    }

    /// A kubeconfig file with the admin token and the self-signed server, for
    /// the other components and for processes under test (`KUBECONFIG`).
    pub fn kubeconfig(&self) -> PathBuf {
        self.kubeconfig_via("admin.kubeconfig", &self.url())
    }

    /// An admin kubeconfig `name` (in the plane's directory) whose server is
    /// `server`, e.g. a proxy in front of the API server.
    pub fn kubeconfig_via(&self, name: &str, server: &str) -> PathBuf {
        self.kubeconfig_as(name, server, ADMIN_TOKEN)
    }

    /// A kubeconfig `name` (in the plane's directory) whose server is
    /// `server` and whose user is the bearer of `token` (a ServiceAccount's,
    /// say).
    pub fn kubeconfig_as(&self, name: &str, server: &str, token: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        let config = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: {server}\n    insecure-skip-tls-verify: true\nusers:\n- name: user\n  user:\n    token: {token}\ncontexts:\n- name: local\n  context:\n    cluster: local\n    user: user\ncurrent-context: local\n"
        );
        // Written once and whole (a rename), as processes read it meanwhile:
        // rewriting it in place let a starting process read an empty file.
        if std::fs::read_to_string(&path).is_ok_and(|c| c == config) {
            return path;
        }
        let partial = tempfile::NamedTempFile::new_in(self.dir.path()).expect("kubeconfig file");
        std::fs::write(partial.path(), config).expect("write kubeconfig");
        partial.persist(&path).expect("put the kubeconfig in place");
        path
    }

    fn start_components(&mut self, bin: &Path, components: Components) {
        if !components.scheduler && !components.controller_manager {
            return;
        }
        let kubeconfig = self.kubeconfig();
        let common = vec![
            format!("--kubeconfig={}", kubeconfig.display()),
            "--leader-elect=false".to_string(),
            "--secure-port=0".to_string(),
        ];
        if components.scheduler {
            let log = self.dir.path().join("kube-scheduler.log");
            let child =
                spawn(&bin.join("kube-scheduler"), &common, &log).unwrap_or_else(|e| panic!("{e}"));
            self.others.push(child);
        }
        if components.controller_manager {
            let mut args = common.clone();
            args.push("--controllers=*,-node-lifecycle-controller,-node-ipam-controller,-node-route-controller,-cloud-node-lifecycle-controller,-service-lb-controller".into());
            args.push(format!(
                "--service-account-private-key-file={}",
                self.dir.path().join("sa.key").display()
            ));
            // kube-root-ca.crt, which pods' in-cluster config trusts.
            args.push(format!("--root-ca-file={}", self.ca_file().display()));
            let log = self.dir.path().join("kube-controller-manager.log");
            let child = spawn(&bin.join("kube-controller-manager"), &args, &log)
                .unwrap_or_else(|e| panic!("{e}"));
            self.controller_manager = Some(self.others.len());
            self.others.push(child);
        }
    }

    /// The plane's directory: its components' logs, its kubeconfig, and the
    /// logs of processes started beside it (kwok).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The last lines of a component's log, for failure messages.
    pub fn log_tail(&self, component: &str) -> String {
        tail(&self.dir.path().join(format!("{component}.log")))
    }

    fn exited(&mut self) -> bool {
        [self.etcd.as_mut(), self.apiserver.as_mut()]
            .into_iter()
            .flatten()
            .any(|child| matches!(child.try_wait(), Ok(Some(_))))
    }

    pub fn url(&self) -> String {
        format!("https://{}:{}", self.address, self.apiserver_port)
    }

    /// The CA bundle of the API server's self-signed serving certificate
    /// (valid for its address, `kubernetes.default.svc` and the Service's
    /// 10.96.0.1): what pods get as `ca.crt` through `kube-root-ca.crt`.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("certs/apiserver.crt")
    }

    /// A client with cluster-admin rights (system:masters).
    pub fn client(&self) -> kube::Client {
        self.client_as(None)
    }

    /// A client acting as `user` (with `groups`), through impersonation by the admin.
    pub fn impersonating(&self, user: &str, groups: &[&str]) -> kube::Client {
        self.client_as(Some(Impersonation {
            user,
            groups,
            extra: &[],
        }))
    }

    /// A client acting as `user` with `groups` and user `extra` values, e.g.
    /// `("authentication.kubernetes.io/node-name", &["gpu-0"])`, which bound
    /// service-account tokens of a pod carry since Kubernetes 1.32.
    pub fn impersonating_with_extra(
        &self,
        user: &str,
        groups: &[&str],
        extra: &[(&str, &[&str])],
    ) -> kube::Client {
        self.client_as(Some(Impersonation {
            user,
            groups,
            extra,
        }))
    }

    /// The admin client's configuration, for components that build their own client.
    pub fn config(&self) -> kube::Config {
        let mut config = kube::Config::new(self.url().parse().expect("url"));
        config.accept_invalid_certs = true;
        config.auth_info.token = Some(secrecy::SecretString::from(ADMIN_TOKEN.to_string()));
        config
    }

    fn client_as(&self, who: Option<Impersonation>) -> kube::Client {
        let mut config = kube::Config::new(self.url().parse().expect("url"));
        // The serving certificate is self-signed per run.
        config.accept_invalid_certs = true;
        config.auth_info.token = Some(secrecy::SecretString::from(ADMIN_TOKEN.to_string()));
        if let Some(Impersonation {
            user,
            groups,
            extra,
        }) = who
        {
            config.auth_info.impersonate = Some(user.to_string());
            config.auth_info.impersonate_groups =
                Some(groups.iter().map(|g| g.to_string()).collect());
            if !extra.is_empty() {
                config.auth_info.impersonate_user_extra = Some(
                    extra
                        .iter()
                        .map(|(key, values)| {
                            (
                                key.to_string(),
                                values.iter().map(|v| v.to_string()).collect(),
                            )
                        })
                        .collect(),
                );
            }
        }
        kube::Client::try_from(config).expect("kube client")
    }
}

/// Who an impersonating client acts as.
struct Impersonation<'a> {
    user: &'a str,
    groups: &'a [&'a str],
    extra: &'a [(&'a str, &'a [&'a str])],
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        let others = std::mem::take(&mut self.others);
        for child in others.into_iter().chain(
            [self.apiserver.take(), self.etcd.take()]
                .into_iter()
                .flatten(),
        ) {
            let mut child = child;
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Creates `definitions` and waits until each is established.
pub async fn install_crds(
    client: &kube::Client,
    definitions: Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>,
) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let api: kube::Api<CustomResourceDefinition> = kube::Api::all(client.clone());
    for crd in &definitions {
        api.create(&kube::api::PostParams::default(), crd)
            .await
            .unwrap_or_else(|err| panic!("create CRD {:?}: {err}", crd.metadata.name));
    }
    for crd in definitions {
        let name = crd.metadata.name.unwrap_or_default();
        let api = &api;
        crate::eventually(
            &format!("CRD {name} to be established"),
            std::time::Duration::from_secs(30),
            || async {
                api.get(&name).await.is_ok_and(|got| {
                    got.status
                        .and_then(|s| s.conditions)
                        .unwrap_or_default()
                        .iter()
                        .any(|c| c.type_ == "Established" && c.status == "True")
                })
            },
        )
        .await
        .unwrap_or_else(|err| panic!("{err}"));
    }
}

/// A kubelet-less Node the way scheduler_perf makes them: Ready, with
/// capacity, labels and taints as given.
pub fn fake_node(
    name: &str,
    labels: &[(&str, &str)],
    taints: Vec<k8s_openapi::api::core::v1::Taint>,
) -> k8s_openapi::api::core::v1::Node {
    use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeSpec, NodeStatus};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let capacity: std::collections::BTreeMap<String, Quantity> =
        [("cpu", "32"), ("memory", "256Gi"), ("pods", "110")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
            .collect();
    Node {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            taints: (!taints.is_empty()).then_some(taints),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            allocatable: Some(capacity.clone()),
            capacity: Some(capacity),
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    }
}

/// Creates a namespace with its `default` ServiceAccount (which pods need and
/// which only kube-controller-manager would otherwise create).
pub async fn create_namespace(client: &kube::Client, name: &str) {
    use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
    let meta = |name: &str| kube::api::ObjectMeta {
        name: Some(name.to_string()),
        ..Default::default()
    };
    let namespaces: kube::Api<Namespace> = kube::Api::all(client.clone());
    namespaces
        .create(
            &kube::api::PostParams::default(),
            &Namespace {
                metadata: meta(name),
                ..Default::default()
            },
        )
        .await
        .unwrap_or_else(|err| panic!("create namespace {name}: {err}"));
    let accounts: kube::Api<ServiceAccount> = kube::Api::namespaced(client.clone(), name);
    match accounts
        .create(
            &kube::api::PostParams::default(),
            &ServiceAccount {
                metadata: meta("default"),
                ..Default::default()
            },
        )
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(err) => panic!("create the default ServiceAccount of {name}: {err}"),
    }
}

//! A real Prometheus server (`scripts/install-prometheus.sh`: the module
//! promtool comes from, with Kubernetes service discovery) in a cluster
//! network: it finds a release's pods through the API server, scrapes their
//! `metrics` port, evaluates rule files, and answers queries over its HTTP
//! API, read here as Grafana and Alertmanager would read it.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use crate::network::ClusterNetwork;
use crate::{KillOnDrop, eventually, free_port, http_get_at, url_encode};

/// A running Prometheus, killed when dropped.
pub struct Prometheus {
    _process: KillOnDrop,
    host: Ipv4Addr,
    port: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

/// The scrape configuration of `namespace`'s pods as the chart's PodMonitor
/// has Prometheus Operator make it: Kubernetes service discovery of pods
/// through `kubeconfig`, the container port named `metrics`, the series'
/// own labels honoured, `namespace`, `pod` and `container` from the pod.
/// Scraped and evaluated every `every`.
pub fn pod_monitor_config(namespace: &str, kubeconfig: &Path, every: Duration) -> String {
    let every = format!("{}s", every.as_secs().max(1));
    format!(
        r#"global:
  scrape_interval: {every}
  evaluation_interval: {every}
rule_files: [rules.yaml]
scrape_configs:
  - job_name: {namespace}/pods
    honor_labels: true
    kubernetes_sd_configs:
      - role: pod
        kubeconfig_file: {kubeconfig}
        namespaces:
          names: [{namespace}]
    relabel_configs:
      - source_labels: [__meta_kubernetes_pod_container_port_name]
        regex: metrics
        action: keep
      - source_labels: [__meta_kubernetes_pod_phase]
        regex: Running
        action: keep
      - source_labels: [__meta_kubernetes_namespace]
        target_label: namespace
      - source_labels: [__meta_kubernetes_pod_name]
        target_label: pod
      - source_labels: [__meta_kubernetes_pod_container_name]
        target_label: container
"#,
        kubeconfig = kubeconfig.display()
    )
}

impl Prometheus {
    /// Starts Prometheus in `network`'s namespace, listening on its nodes'
    /// address, with `config` (whose `rule_files` is `rules.yaml`) and the
    /// rule file `rules`; waits (up to 60 s) until it is ready.
    pub async fn start(network: &ClusterNetwork, config: &str, rules: &str) -> Prometheus {
        let binary = crate::prometheus_binary().unwrap_or_else(|e| panic!("{e}"));
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("prometheus.yml"), config).expect("write the config");
        std::fs::write(dir.path().join("rules.yaml"), rules).expect("write the rules");
        let log = dir.path().join("prometheus.log");
        let host = network.node_ip();
        let port = free_port();
        let process = network
            .command(&binary)
            .arg(format!(
                "--config.file={}",
                dir.path().join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={host}:{port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("prometheus log"))
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", binary.display()));
        let prometheus = Prometheus {
            _process: KillOnDrop(process),
            host,
            port,
            log,
            _dir: dir,
        };
        let ready = eventually("Prometheus ready", Duration::from_secs(60), || async {
            prometheus.get("/-/ready").await.is_ok()
        })
        .await;
        if let Err(why) = ready {
            panic!("{why}\n{}", prometheus.output());
        }
        prometheus
    }

    /// Prometheus's own log.
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    async fn get(&self, path: &str) -> Result<String, String> {
        http_get_at(&self.host.to_string(), self.port, path).await
    }

    /// `data` of an API answer whose `status` is `success`.
    async fn api(&self, path: &str) -> Result<Value, String> {
        let body = self.get(path).await?;
        let answer: Value =
            serde_json::from_str(&body).map_err(|e| format!("{path}: not JSON: {e}: {body}"))?;
        if answer["status"] != "success" {
            return Err(format!("{path}: {answer}"));
        }
        Ok(answer["data"].clone())
    }

    /// The instant vector (or scalar) `expr` evaluates to now: its samples.
    pub async fn query(&self, expr: &str) -> Result<Vec<Value>, String> {
        let data = self
            .api(&format!("/api/v1/query?query={}", url_encode(expr)))
            .await?;
        Ok(match data["resultType"].as_str() {
            Some("scalar") | Some("string") => vec![data["result"].clone()],
            _ => data["result"].as_array().cloned().unwrap_or_default(),
        })
    }

    /// The alerts pending or firing now, each with `labels` and `state`.
    pub async fn alerts(&self) -> Result<Vec<Value>, String> {
        let data = self.api("/api/v1/alerts").await?;
        Ok(data["alerts"].as_array().cloned().unwrap_or_default())
    }

    /// The active scrape targets, each with `labels` and `health`.
    pub async fn targets(&self) -> Result<Vec<Value>, String> {
        let data = self.api("/api/v1/targets?state=active").await?;
        Ok(data["activeTargets"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }
}

/// Whether the alert `name` with label `label` = `value` is firing among
/// `alerts`.
pub fn firing(alerts: &[Value], name: &str, label: &str, value: &str) -> bool {
    alerts.iter().any(|a| {
        a["state"] == "firing" && a["labels"]["alertname"] == name && a["labels"][label] == value
    })
}

//! Jaeger v2 (`cmd/jaeger` of github.com/jaegertracing/jaeger, built by
//! `scripts/install-jaeger.sh`) as the tests' OTLP receiver: spans in over
//! OTLP/gRPC, kept in memory, read back through its query API — all on
//! loopback ports, with the configuration of `tests/fixtures/jaeger.yaml`.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::{KillOnDrop, eventually, free_port, http_get, jaeger_binary};

/// The configuration Jaeger runs with (its ports from the environment).
const CONFIG: &str = include_str!("../../../tests/fixtures/jaeger.yaml");

/// A running Jaeger, killed when dropped.
pub struct Jaeger {
    _process: KillOnDrop,
    otlp_host: std::net::Ipv4Addr,
    otlp_grpc: u16,
    query: u16,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Jaeger {
    /// Starts Jaeger and waits (up to 60 s) until its traces pipeline is
    /// healthy.
    pub async fn start() -> Jaeger {
        Jaeger::start_on(std::net::Ipv4Addr::LOCALHOST).await
    }

    /// [`Jaeger::start`] with its OTLP receivers on `otlp_host` (an address
    /// a cluster network's pods reach, its host end); the query API stays
    /// on loopback.
    pub async fn start_on(otlp_host: std::net::Ipv4Addr) -> Jaeger {
        let binary = jaeger_binary().unwrap_or_else(|e| panic!("{e}"));
        let dir = tempfile::tempdir().expect("temp dir");
        let config = dir.path().join("jaeger.yaml");
        std::fs::write(&config, CONFIG).expect("write jaeger.yaml");
        let log = dir.path().join("jaeger.log");
        let [otlp_grpc, otlp_http, query, query_grpc, health] = [(); 5].map(|()| free_port());
        let process = Command::new(&binary)
            .arg(format!("--config=file:{}", config.display()))
            .env("JAEGER_OTLP_HOST", otlp_host.to_string())
            .env("JAEGER_OTLP_GRPC_PORT", otlp_grpc.to_string())
            .env("JAEGER_OTLP_HTTP_PORT", otlp_http.to_string())
            .env("JAEGER_QUERY_HTTP_PORT", query.to_string())
            .env("JAEGER_QUERY_GRPC_PORT", query_grpc.to_string())
            .env("JAEGER_HEALTH_PORT", health.to_string())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("jaeger log"))
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", binary.display()));
        let jaeger = Jaeger {
            _process: KillOnDrop(process),
            otlp_host,
            otlp_grpc,
            query,
            log,
            _dir: dir,
        };
        if let Err(why) = eventually(
            "Jaeger's traces pipeline healthy",
            Duration::from_secs(60),
            || async { http_get(health, "/status?pipeline=traces").await.is_ok() },
        )
        .await
        {
            panic!("{why}\n{}", jaeger.output());
        }
        jaeger
    }

    /// Where to send spans: the value of `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub fn otlp_endpoint(&self) -> String {
        format!("http://{}:{}", self.otlp_host, self.otlp_grpc)
    }

    /// Jaeger's own log.
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The traces with a span of `service` named `operation`, as the query
    /// API answers them (`data`: traces, each with `spans` and `processes`).
    pub async fn traces(&self, service: &str, operation: &str) -> Result<Vec<Value>, String> {
        let path = format!(
            "/api/traces?service={}&operation={}&limit=20&lookback=1h",
            crate::url_encode(service),
            crate::url_encode(operation)
        );
        let answer: Value = serde_json::from_str(&http_get(self.query, &path).await?)
            .map_err(|e| format!("{path}: not JSON: {e}"))?;
        Ok(answer["data"].as_array().cloned().unwrap_or_default())
    }

    /// One trace by id, or an error (Jaeger answers 404 for one it has not).
    pub async fn trace(&self, id: &str) -> Result<Trace, String> {
        let path = format!("/api/traces/{id}");
        let answer: Value = serde_json::from_str(&http_get(self.query, &path).await?)
            .map_err(|e| format!("{path}: not JSON: {e}"))?;
        let trace = answer["data"]
            .as_array()
            .and_then(|traces| traces.first())
            .ok_or_else(|| format!("{path}: no trace in {answer}"))?;
        Ok(Trace::from_query(trace))
    }
}

/// A span as Jaeger keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Span {
    pub id: String,
    /// The span it is a child of (`CHILD_OF`), none for the trace's root.
    pub parent: Option<String>,
    pub service: String,
    pub name: String,
}

/// A trace's spans.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    pub spans: Vec<Span>,
}

impl Trace {
    /// The spans of one trace of the query API's answer.
    pub fn from_query(trace: &Value) -> Trace {
        let processes = &trace["processes"];
        let spans = trace["spans"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|span| Span {
                id: span["spanID"].as_str().unwrap_or_default().to_string(),
                parent: span["references"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|r| r["refType"] == "CHILD_OF")
                    .and_then(|r| r["spanID"].as_str())
                    .map(str::to_string),
                service: processes[span["processID"].as_str().unwrap_or_default()]["serviceName"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                name: span["operationName"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            })
            .collect();
        Trace { spans }
    }

    /// The services with a span in the trace.
    pub fn services(&self) -> std::collections::BTreeSet<&str> {
        self.spans.iter().map(|s| s.service.as_str()).collect()
    }

    /// The spans of `service` whose name starts with `prefix`.
    pub fn named<'a>(
        &'a self,
        service: &'a str,
        prefix: &'a str,
    ) -> impl Iterator<Item = &'a Span> {
        self.spans
            .iter()
            .filter(move |s| s.service == service && s.name.starts_with(prefix))
    }

    /// Spans whose parent is not in the trace (a broken chain) — the root
    /// has none.
    pub fn orphans(&self) -> Vec<&Span> {
        let ids: std::collections::BTreeSet<&str> =
            self.spans.iter().map(|s| s.id.as_str()).collect();
        self.spans
            .iter()
            .filter(|s| s.parent.as_deref().is_some_and(|p| !ids.contains(p)))
            .collect()
    }
}

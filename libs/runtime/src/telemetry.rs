//! Traces: Switchyard's spans (a record handled, a decision, an effect, a
//! command, a node agent's stack switch) become OpenTelemetry spans, so
//! their trace ids reach records, NATS headers, node annotations and log
//! lines whether or not anything collects them. They are exported over
//! OTLP/gRPC when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//! `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, and never otherwise.
//! `OTEL_SDK_DISABLED=true` turns the export off; `OTEL_SERVICE_NAME` and
//! `OTEL_RESOURCE_ATTRIBUTES` name the process as the specification says;
//! `OTEL_EXPORTER_OTLP_PROTOCOL`, when set, must be `grpc`, and the endpoint
//! a plain `http://` URL (no TLS: a collector in the cluster forwards).
//! `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG` choose the traces
//! recorded ([`trace::Sampler`]): a trace not recorded makes no spans, in
//! this process or the ones it continues in, and costs next to nothing.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::SpanExporter;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::runtime::Tokio;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::{Sampler as SdkSampler, SdkTracerProvider};
use switchyard_eventlog::trace;
use tracing::Subscriber;
use tracing_subscriber::Layer;
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::registry::LookupSpan;

/// The crates whose spans are traced: Switchyard's own (`switchyard_*`),
/// never the clients' — the exporter's own gRPC calls among them.
const TRACED: &str = "switchyard";

/// Where spans go, from the environment: the OTLP/gRPC endpoint, or why
/// none is used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Export {
    None,
    Otlp { endpoint: String },
    Refused(String),
}

/// The export the variables ask for (`var` reads one).
pub fn export_from(var: impl Fn(&str) -> Option<String>) -> Export {
    let set = |name: &str| var(name).filter(|v| !v.trim().is_empty());
    if set("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
        return Export::None;
    }
    let Some(endpoint) =
        set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").or_else(|| set("OTEL_EXPORTER_OTLP_ENDPOINT"))
    else {
        return Export::None;
    };
    for name in [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ] {
        if let Some(protocol) = set(name) {
            if protocol.trim() != "grpc" {
                return Export::Refused(format!(
                    "{name}={protocol:?}: expected grpc (Switchyard exports OTLP over gRPC); no traces are exported"
                ));
            }
            break;
        }
    }
    if !endpoint.starts_with("http://") {
        return Export::Refused(format!(
            "OTLP endpoint {endpoint:?}: expected an http:// URL, e.g. http://otel-collector:4317 (TLS is not built in: send to a collector in the cluster); no traces are exported"
        ));
    }
    Export::Otlp { endpoint }
}

/// The process's tracer: its spans' ids, and their export if asked for.
/// Keep it for the process's life and [`Telemetry::flush`] it before exit.
#[must_use = "spans are exported until the Telemetry is flushed and dropped"]
pub struct Telemetry {
    provider: SdkTracerProvider,
}

impl Telemetry {
    /// The tracer of `service`, exporting as `export` says. Export needs a
    /// Tokio runtime (the batches are sent from a task of it); outside one,
    /// or when the exporter cannot be built, spans are only kept local and
    /// the reason is returned for the log.
    /// The traces recorded are those `OTEL_TRACES_SAMPLER` chooses, for the
    /// whole process.
    pub fn new(service: &'static str, export: &Export) -> (Telemetry, Option<String>) {
        let mut resource = Resource::builder();
        if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
            resource = resource.with_service_name(service);
        }
        // The sampler decides before a span is made (`trace::span_in`): the
        // SDK records every span it is given, and keeps to its parent's flag.
        let mut builder = SdkTracerProvider::builder()
            .with_resource(resource.build())
            .with_sampler(SdkSampler::ParentBased(Box::new(SdkSampler::AlwaysOn)));
        let mut problems = Vec::new();
        let sampler = trace::Sampler::from_env(|name| std::env::var(name).ok()).unwrap_or_else(
            |(why, default)| {
                problems.push(why);
                default
            },
        );
        trace::sample_with(Some(sampler));
        match export {
            Export::None => {}
            Export::Refused(why) => problems.push(why.clone()),
            Export::Otlp { endpoint } => match exporter(endpoint) {
                Ok(exporter) => {
                    builder = builder
                        .with_span_processor(BatchSpanProcessor::builder(exporter, Tokio).build());
                }
                Err(why) => problems.push(why),
            },
        }
        (
            Telemetry {
                provider: builder.build(),
            },
            (!problems.is_empty()).then(|| problems.join("; ")),
        )
    }

    /// The layer that turns Switchyard's spans into this tracer's.
    pub fn layer<S>(&self, service: &'static str) -> impl Layer<S> + use<S>
    where
        S: Subscriber + for<'a> LookupSpan<'a>,
    {
        tracing_opentelemetry::layer()
            .with_tracer(self.provider.tracer(service))
            .with_location(false)
            .with_threads(false)
            // No busy/idle times on every span: two clock reads per enter
            // and exit on the hot path, for attributes nobody reads here.
            .with_tracked_inactivity(false)
            // Nothing here reads OpenTelemetry's current context (the ids go
            // through the spans): no context attached on every span entered.
            .with_context_activation(false)
            .with_filter(Targets::new().with_target(TRACED, LevelFilter::INFO))
    }

    /// Sends what is still batched (before the process exits).
    pub async fn flush(&self) {
        let provider = self.provider.clone();
        // The SDK waits for its batch task on this thread: off the runtime's.
        let flushed = tokio::task::spawn_blocking(move || provider.force_flush()).await;
        if let Ok(Err(err)) = flushed {
            tracing::warn!(%err, "spans could not all be exported");
        }
    }
}

fn exporter(endpoint: &str) -> Result<SpanExporter, String> {
    use opentelemetry_otlp::WithExportConfig;
    if tokio::runtime::Handle::try_current().is_err() {
        return Err(
            "traces are exported from a Tokio runtime, and none runs yet: no traces are exported"
                .into(),
        );
    }
    SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()
        .map_err(|err| {
            format!(
                "the OTLP exporter to {endpoint} could not be built ({err}); no traces are exported"
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn export(vars: &[(&str, &str)]) -> Export {
        let vars: BTreeMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        export_from(|name| vars.get(name).cloned())
    }

    #[test]
    fn nothing_is_exported_unless_an_endpoint_is_set() {
        assert_eq!(export(&[]), Export::None);
        assert_eq!(
            export(&[("OTEL_EXPORTER_OTLP_ENDPOINT", " ")]),
            Export::None
        );
        assert_eq!(
            export(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
                ("OTEL_SDK_DISABLED", "true")
            ]),
            Export::None
        );
    }

    #[test]
    fn the_traces_endpoint_wins_over_the_general_one() {
        assert_eq!(
            export(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4317"),
                ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://b:4317")
            ]),
            Export::Otlp {
                endpoint: "http://b:4317".into()
            }
        );
    }

    #[test]
    fn a_protocol_other_than_grpc_or_an_endpoint_that_is_no_url_is_refused_by_name() {
        let Export::Refused(why) = export(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4318"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
        ]) else {
            panic!("http/protobuf accepted");
        };
        assert!(
            why.contains("OTEL_EXPORTER_OTLP_PROTOCOL=\"http/protobuf\": expected grpc"),
            "{why}"
        );
        let Export::Refused(why) = export(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4317")])
        else {
            panic!("no scheme accepted");
        };
        assert!(why.contains("expected an http:// URL"), "{why}");
        assert_eq!(
            export(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://a:4317"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
            ]),
            Export::Otlp {
                endpoint: "http://a:4317".into()
            }
        );
    }
}

//! The logs every binary writes: which variable sets the level, which format
//! a container gets, a JSON line's fields, and a warning said once.

use std::io::Write;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use switchyard_runtime::logging::{
    JsonLines, LogFormat, SaidOnce, TraceIds, filter_directives, log_format,
};
use tracing_subscriber::fmt::format::JsonFields;
use tracing_subscriber::prelude::*;

#[test]
fn rust_log_sets_the_level_and_switchyard_log_level_is_its_alias() {
    assert_eq!(
        filter_directives(Some("debug"), Some("warn"), "info"),
        "debug"
    );
    assert_eq!(filter_directives(None, Some("warn"), "info"), "warn");
    assert_eq!(filter_directives(Some(""), Some("warn"), "info"), "warn");
    assert_eq!(filter_directives(None, None, "info"), "info");
}

#[test]
fn a_container_gets_json_and_a_terminal_text() {
    assert_eq!(log_format(None, false), Ok(LogFormat::Json));
    assert_eq!(log_format(None, true), Ok(LogFormat::Text));
    assert_eq!(log_format(Some("text"), false), Ok(LogFormat::Text));
    assert_eq!(log_format(Some("json"), true), Ok(LogFormat::Json));
    let err = log_format(Some("yaml"), false).unwrap_err();
    assert!(
        err.contains("SWITCHYARD_LOG_FORMAT")
            && err.contains("yaml")
            && err.contains("json or text"),
        "{err}"
    );
}

/// What a writer was given, shared with the test.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn lines(&self) -> Vec<Value> {
        let bytes = self.0.lock().unwrap().clone();
        let text = String::from_utf8(bytes).expect("UTF-8");
        assert!(!text.contains('\u{1b}'), "no escape codes: {text:?}");
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
            .collect()
    }
}

fn json_subscriber(out: &Captured) -> impl tracing::Subscriber + Send + Sync {
    let out = out.clone();
    tracing_subscriber::registry()
        .with(SaidOnce::default())
        .with(
            tracing_subscriber::fmt::layer()
                .fmt_fields(JsonFields::new())
                .event_format(JsonLines {
                    service: "stack-assigner",
                })
                .with_writer(move || out.clone())
                .with_ansi(false),
        )
}

#[test]
fn a_json_line_names_the_service_and_carries_its_spans_fields() {
    let out = Captured::default();
    tracing::subscriber::with_default(json_subscriber(&out), || {
        let span = tracing::info_span!("handover", node = "gpu-1", handover_id = "h-1");
        let _entered = span.enter();
        tracing::info!(step = 3, evicted = true, "node drained");
    });
    let lines = out.lines();
    assert_eq!(lines.len(), 1, "{lines:?}");
    let line = &lines[0];
    assert_eq!(line["service"], "stack-assigner");
    assert_eq!(line["level"], "INFO");
    assert_eq!(line["target"], "logging");
    assert_eq!(line["message"], "node drained");
    assert_eq!(line["node"], "gpu-1");
    assert_eq!(line["handover_id"], "h-1");
    assert_eq!(line["step"], 3);
    assert_eq!(line["evicted"], true);
    assert!(
        line["timestamp"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{line}"
    );
}

#[test]
fn a_warning_repeated_word_for_word_is_said_once() {
    let out = Captured::default();
    tracing::subscriber::with_default(json_subscriber(&out), || {
        for _ in 0..11 {
            tracing::warn!("Server cert bypassed");
        }
        for node in ["gpu-0", "gpu-1", "gpu-0"] {
            tracing::warn!(node, "eviction refused");
        }
        for _ in 0..3 {
            tracing::info!("following the log again");
        }
    });
    let said: Vec<String> = out
        .lines()
        .iter()
        .map(|l| format!("{} {}", l["message"], l["node"]))
        .collect();
    assert_eq!(
        said,
        [
            "\"Server cert bypassed\" null",
            "\"eviction refused\" \"gpu-0\"",
            "\"eviction refused\" \"gpu-1\"",
            "\"following the log again\" null",
            "\"following the log again\" null",
            "\"following the log again\" null",
        ]
    );
}

#[test]
fn a_line_in_a_traced_span_carries_the_trace_that_the_next_process_continues() {
    use switchyard_eventlog::trace;
    use switchyard_runtime::telemetry::{Export, Telemetry};

    let (telemetry, problem) = Telemetry::new("stack-assigner", &Export::None);
    assert_eq!(problem, None);
    let out = Captured::default();
    let writer = out.clone();
    let subscriber = tracing_subscriber::registry()
        .with(telemetry.layer("stack-assigner"))
        .with(TraceIds::default())
        .with(
            tracing_subscriber::fmt::layer()
                .fmt_fields(JsonFields::new())
                .event_format(JsonLines {
                    service: "stack-assigner",
                })
                .with_writer(move || writer.clone())
                .with_ansi(false),
        );
    let (decided, continued) = tracing::subscriber::with_default(subscriber, || {
        let decision = tracing::info_span!(target: "switchyard_runtime::host", "decision");
        let decided = trace::of_span(&decision).expect("Switchyard's spans are traced");
        decision.in_scope(|| tracing::info!(target: "switchyard_runtime::host", "decided"));
        // What another process does with the record's context.
        let record = tracing::info_span!(target: "switchyard_runtime::host", "record");
        trace::continue_in(&record, Some(&decided));
        let continued = trace::of_span(&record).expect("continued");
        // A client's own spans (the exporter's gRPC calls among them) are not.
        let other = tracing::info_span!(target: "tonic::transport", "call");
        assert_eq!(trace::of_span(&other), None);
        (decided, continued)
    });
    let id = |traceparent: &str| traceparent.split('-').nth(1).unwrap().to_string();
    let span_id = |traceparent: &str| traceparent.split('-').nth(2).unwrap().to_string();
    assert_eq!(id(&continued.traceparent), id(&decided.traceparent));
    assert_ne!(
        span_id(&continued.traceparent),
        span_id(&decided.traceparent)
    );
    let lines = out.lines();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["trace_id"], id(&decided.traceparent));
    assert_eq!(lines[0]["span_id"], span_id(&decided.traceparent));

    // The ids a host keeps between records, written as a record's text and
    // read back: the same trace, span and flags.
    let ids = trace::from_w3c(&decided).expect("a readable context");
    assert_eq!(ids.trace_id().to_string(), id(&decided.traceparent));
    assert_eq!(ids.span_id().to_string(), span_id(&decided.traceparent));
    assert!(ids.is_sampled());
    assert_eq!(trace::to_w3c(&ids), decided);
    assert_eq!(
        trace::from_w3c(&switchyard_proto::v1::TraceContext {
            traceparent: "00-not-a-trace".into(),
            tracestate: String::new(),
        }),
        None
    );

    // Through a NATS message's headers and back.
    let mut headers = async_nats::HeaderMap::new();
    trace::insert_headers(&mut headers, Some(&decided));
    assert_eq!(trace::from_headers(Some(&headers)), Some(decided));
    assert_eq!(trace::from_headers(None), None);
}

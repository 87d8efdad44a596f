//! The W3C trace context between processes: written into a record's
//! envelope (and its NATS headers) or a command's request when it is made,
//! and continued by whoever handles it, so one handover is one trace across
//! the services, the CLI and the node agent.
//!
//! The context is that of a `tracing` span, as the OpenTelemetry layer the
//! runtime installs keeps it; without that layer there is none, and nothing
//! is written.

use async_nats::HeaderMap;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
pub use opentelemetry::trace::SpanContext;
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use switchyard_proto::v1::TraceContext;
use tracing_opentelemetry::OpenTelemetrySpanExt;

const TRACEPARENT: &str = "traceparent";
const TRACESTATE: &str = "tracestate";

/// The trace context of the current span.
pub fn current() -> Option<TraceContext> {
    of_span(&tracing::Span::current())
}

/// The trace context of `span`, if it belongs to a trace.
pub fn of_span(span: &tracing::Span) -> Option<TraceContext> {
    context_of(span).map(|context| to_w3c(&context))
}

/// Makes `span` continue the trace `trace` names: its parent becomes the
/// span that wrote it. Nothing changes without a readable context.
pub fn continue_in(span: &tracing::Span, trace: Option<&TraceContext>) {
    follow(span, trace.and_then(from_w3c).as_ref());
}

/// The ids of `span` (trace, span, flags), if it belongs to a trace: what a
/// process keeps between records, as it is, and writes as text only into
/// the records it appends ([`to_w3c`]).
pub fn context_of(span: &tracing::Span) -> Option<SpanContext> {
    let context = span.context();
    let span = context.span();
    let ids = span.span_context();
    ids.is_valid().then(|| ids.clone())
}

/// Makes `span` a child of the span `parent` names (written by another
/// process, or by this one earlier). Nothing changes without one.
pub fn follow(span: &tracing::Span, parent: Option<&SpanContext>) {
    let Some(parent) = parent.filter(|p| p.is_valid()) else {
        return;
    };
    // Refused only once the span has started: ours are new.
    let _ = span.set_parent(opentelemetry::Context::new().with_remote_span_context(parent.clone()));
}

/// `context` as W3C text (`traceparent`, `tracestate`), as records and NATS
/// headers carry it.
pub fn to_w3c(context: &SpanContext) -> TraceContext {
    let mut trace = TraceContext::default();
    TraceContextPropagator::new().inject_context(
        &opentelemetry::Context::new().with_remote_span_context(context.clone()),
        &mut W3c(&mut trace),
    );
    trace
}

/// The ids W3C text names, if it is readable.
pub fn from_w3c(trace: &TraceContext) -> Option<SpanContext> {
    if trace.traceparent.is_empty() {
        return None;
    }
    let context = TraceContextPropagator::new().extract(&W3cText(trace));
    let span = context.span();
    let ids = span.span_context();
    ids.is_valid().then(|| ids.clone())
}

/// A [`TraceContext`] written by the propagator.
struct W3c<'a>(&'a mut TraceContext);

impl Injector for W3c<'_> {
    fn set(&mut self, key: &str, value: String) {
        match key {
            TRACEPARENT => self.0.traceparent = value,
            TRACESTATE => self.0.tracestate = value,
            _ => {}
        }
    }
}

/// A [`TraceContext`] read by the propagator.
struct W3cText<'a>(&'a TraceContext);

impl Extractor for W3cText<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            TRACEPARENT => Some(&self.0.traceparent),
            TRACESTATE => Some(&self.0.tracestate),
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        vec![TRACEPARENT, TRACESTATE]
    }
}

/// The trace context a NATS message carries in its `traceparent` and
/// `tracestate` headers.
pub fn from_headers(headers: Option<&HeaderMap>) -> Option<TraceContext> {
    let headers = headers?;
    let traceparent = headers.get(TRACEPARENT)?.as_str().to_string();
    let tracestate = headers
        .get(TRACESTATE)
        .map(|v| v.as_str().to_string())
        .unwrap_or_default();
    Some(TraceContext {
        traceparent,
        tracestate,
    })
}

/// Adds `trace` to a NATS message's headers (W3C names, as the record's).
pub fn insert_headers(headers: &mut HeaderMap, trace: Option<&TraceContext>) {
    let Some(trace) = trace else {
        return;
    };
    if !trace.traceparent.is_empty() {
        headers.insert(TRACEPARENT, trace.traceparent.as_str());
    }
    if !trace.tracestate.is_empty() {
        headers.insert(TRACESTATE, trace.tracestate.as_str());
    }
}

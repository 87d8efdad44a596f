//! The W3C trace context between processes: written into a record's
//! envelope (and its NATS headers) or a command's request when it is made,
//! and continued by whoever handles it, so one handover is one trace across
//! the services, the CLI and the node agent.
//!
//! The context is that of a `tracing` span, as the OpenTelemetry layer the
//! runtime installs keeps it; without that layer there is none, and nothing
//! is written.

use std::collections::HashMap;

use async_nats::HeaderMap;
use opentelemetry::propagation::TextMapPropagator;
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
    let context = span.context();
    if !context.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&context, &mut carrier);
    Some(TraceContext {
        traceparent: carrier.remove(TRACEPARENT)?,
        tracestate: carrier.remove(TRACESTATE).unwrap_or_default(),
    })
}

/// Makes `span` continue the trace `trace` names: its parent becomes the
/// span that wrote it. Nothing changes without a readable context.
pub fn continue_in(span: &tracing::Span, trace: Option<&TraceContext>) {
    let Some(trace) = trace.filter(|t| !t.traceparent.is_empty()) else {
        return;
    };
    let carrier = HashMap::from([
        (TRACEPARENT.to_string(), trace.traceparent.clone()),
        (TRACESTATE.to_string(), trace.tracestate.clone()),
    ]);
    let context = TraceContextPropagator::new().extract(&carrier);
    if context.span().span_context().is_valid() {
        // Refused only once the span has started: ours are new.
        let _ = span.set_parent(context);
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

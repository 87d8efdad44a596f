//! The W3C trace context between processes: written into a record's
//! envelope (and its NATS headers) or a command's request when it is made,
//! and continued by whoever handles it, so one handover is one trace across
//! the services, the CLI and the node agent.
//!
//! The context is that of a `tracing` span, as the OpenTelemetry layer the
//! runtime installs keeps it; without that layer there is none, and nothing
//! is written.
//!
//! Which traces get spans is decided once, where a trace starts, by the
//! process's [`Sampler`] (`OTEL_TRACES_SAMPLER`): a trace not sampled makes
//! no spans anywhere — what they cost is the price of tracing — but its ids
//! are still written and continued, flagged not sampled, so the processes
//! after agree ([`span_in`]).

use async_nats::HeaderMap;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
pub use opentelemetry::trace::SpanContext;
use opentelemetry::trace::{TraceContextExt, TraceFlags, TraceId, TraceState};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{IdGenerator, RandomIdGenerator};
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use switchyard_proto::v1::TraceContext;
use tracing_opentelemetry::OpenTelemetrySpanExt;

const TRACEPARENT: &str = "traceparent";
const TRACESTATE: &str = "tracestate";

/// The trace context of the current work: its span's, or that of the trace
/// not sampled it is [`carrying`].
pub fn current() -> Option<TraceContext> {
    of_span(&tracing::Span::current()).or_else(|| CARRIED.try_with(Clone::clone).ok().flatten())
}

tokio::task_local! {
    static CARRIED: Option<TraceContext>;
}

/// Runs `work` as part of the trace `trace` names, for [`current`] to give
/// when no span of that trace is made (it is not sampled).
pub async fn carrying<F: Future>(trace: Option<TraceContext>, work: F) -> F::Output {
    match trace {
        Some(trace) => CARRIED.scope(Some(trace), work).await,
        None => work.await,
    }
}

/// Which traces are recorded, as `OTEL_TRACES_SAMPLER` (and
/// `OTEL_TRACES_SAMPLER_ARG`) name them: `always_on`, `always_off`,
/// `traceidratio`, and each as `parentbased_…` (the default is
/// `parentbased_always_on`, every trace). A parent-based sampler records a
/// trace continued from another process as that process decided; the
/// others decide for each span.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sampler {
    /// Whether a span with a parent follows the parent's decision.
    pub parent_based: bool,
    /// The share of traces recorded, by trace id (0 none, 1 all).
    pub ratio: f64,
}

impl Default for Sampler {
    fn default() -> Self {
        Sampler {
            parent_based: true,
            ratio: 1.0,
        }
    }
}

impl Sampler {
    /// The sampler the variables name (`var` reads one), or why they name
    /// none, with the default to use instead.
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Result<Sampler, (String, Sampler)> {
        let set = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        let Some(name) = set("OTEL_TRACES_SAMPLER") else {
            return Ok(Sampler::default());
        };
        let name = name.trim();
        let (parent_based, root) = match name.strip_prefix("parentbased_") {
            Some(root) => (true, root),
            None => (false, name),
        };
        let ratio = match root {
            "always_on" => 1.0,
            "always_off" => 0.0,
            "traceidratio" => {
                let arg = set("OTEL_TRACES_SAMPLER_ARG");
                match arg.as_deref().map(|a| a.trim().parse::<f64>()) {
                    Some(Ok(ratio)) if (0.0..=1.0).contains(&ratio) => ratio,
                    None => 1.0,
                    Some(_) => {
                        return Err((
                            format!(
                                "OTEL_TRACES_SAMPLER_ARG={:?}: expected the share of traces to record, a number from 0 to 1, e.g. 0.1; recording every trace",
                                arg.unwrap_or_default()
                            ),
                            Sampler::default(),
                        ));
                    }
                }
            }
            _ => {
                return Err((
                    format!(
                        "OTEL_TRACES_SAMPLER={name:?}: expected always_on, always_off, traceidratio, parentbased_always_on, parentbased_always_off or parentbased_traceidratio; recording every trace"
                    ),
                    Sampler::default(),
                ));
            }
        };
        Ok(Sampler {
            parent_based,
            ratio,
        })
    }

    /// Whether a trace with this id is recorded, as OpenTelemetry's
    /// TraceIdRatioBased decides it (on the id's low 64 bits), so that every
    /// process decides alike.
    pub fn records(&self, trace: TraceId) -> bool {
        if self.ratio >= 1.0 {
            return true;
        }
        if self.ratio <= 0.0 {
            return false;
        }
        let low = u64::from_be_bytes(trace.to_bytes()[8..].try_into().unwrap_or_default());
        (low >> 1) < (self.ratio * (1u64 << 63) as f64) as u64
    }
}

/// The process's sampler: unset (every span made, none flagged) until
/// [`sample_with`]; packed so that the hot path reads two atomics.
static MODE: AtomicU8 = AtomicU8::new(UNSET);
static RATIO: AtomicU64 = AtomicU64::new(0);
const UNSET: u8 = 0;
const PER_SPAN: u8 = 1;
const PARENT_BASED: u8 = 2;

/// Makes `sampler` decide which traces this process records ([`span_in`]);
/// `None` makes every span again, as without a tracer.
pub fn sample_with(sampler: Option<Sampler>) {
    match sampler {
        None => MODE.store(UNSET, Ordering::Release),
        Some(sampler) => {
            RATIO.store(sampler.ratio.to_bits(), Ordering::Release);
            let mode = if sampler.parent_based {
                PARENT_BASED
            } else {
                PER_SPAN
            };
            MODE.store(mode, Ordering::Release);
        }
    }
}

/// A span and the trace context it carries on.
#[derive(Debug)]
pub struct Traced {
    /// The span to do the work in: [`tracing::Span::none`] when the trace
    /// is not recorded.
    pub span: tracing::Span,
    /// The trace to write into what the work appends or writes: the span's,
    /// or the trace not recorded, with its ids.
    pub context: Option<SpanContext>,
}

/// The span `make` makes, as a child of `parent` (or a new trace's root), if
/// the sampler records that trace; otherwise no span, and the trace's ids
/// (a new trace's, drawn here) to carry on, flagged not sampled.
pub fn span_in(parent: Option<&SpanContext>, make: impl FnOnce() -> tracing::Span) -> Traced {
    let parent = parent.filter(|p| p.is_valid());
    let mode = MODE.load(Ordering::Acquire);
    let sampler = Sampler {
        parent_based: mode == PARENT_BASED,
        ratio: f64::from_bits(RATIO.load(Ordering::Acquire)),
    };
    let recorded = match (mode, parent) {
        (UNSET, _) => true,
        (PARENT_BASED, Some(parent)) => parent.is_sampled(),
        (_, Some(parent)) => sampler.records(parent.trace_id()),
        (_, None) if sampler.ratio >= 1.0 => true,
        (_, None) => {
            let ids = RandomIdGenerator::default();
            let trace = ids.new_trace_id();
            if !sampler.records(trace) {
                return Traced {
                    span: tracing::Span::none(),
                    context: Some(SpanContext::new(
                        trace,
                        ids.new_span_id(),
                        TraceFlags::default(),
                        false,
                        TraceState::default(),
                    )),
                };
            }
            true
        }
    };
    if !recorded {
        let parent = parent.expect("only a span with a parent goes unrecorded here");
        return Traced {
            span: tracing::Span::none(),
            context: Some(SpanContext::new(
                parent.trace_id(),
                parent.span_id(),
                TraceFlags::default(),
                parent.is_remote(),
                parent.trace_state().clone(),
            )),
        };
    }
    let span = make();
    follow(&span, parent);
    let context = context_of(&span);
    Traced { span, context }
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn sampler(vars: &[(&str, &str)]) -> Result<Sampler, (String, Sampler)> {
        let vars: BTreeMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Sampler::from_env(|name| vars.get(name).cloned())
    }

    #[test]
    fn the_samplers_are_named_as_opentelemetry_names_them() {
        let on = Sampler::default();
        assert_eq!(sampler(&[]), Ok(on));
        assert_eq!(
            sampler(&[("OTEL_TRACES_SAMPLER", "parentbased_always_on")]),
            Ok(on)
        );
        assert_eq!(
            sampler(&[("OTEL_TRACES_SAMPLER", "always_off")]),
            Ok(Sampler {
                parent_based: false,
                ratio: 0.0
            })
        );
        assert_eq!(
            sampler(&[
                ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", "0.25")
            ]),
            Ok(Sampler {
                parent_based: true,
                ratio: 0.25
            })
        );
        // No argument: every trace, as the specification says.
        assert_eq!(
            sampler(&[("OTEL_TRACES_SAMPLER", "traceidratio")]),
            Ok(Sampler {
                parent_based: false,
                ratio: 1.0
            })
        );
    }

    #[test]
    fn an_unknown_sampler_or_a_ratio_out_of_range_is_refused_by_name() {
        let Err((why, default)) = sampler(&[("OTEL_TRACES_SAMPLER", "jaeger_remote")]) else {
            panic!("jaeger_remote accepted");
        };
        assert!(
            why.starts_with("OTEL_TRACES_SAMPLER=\"jaeger_remote\": expected always_on"),
            "{why}"
        );
        assert_eq!(default, Sampler::default());
        for arg in ["1.5", "-0.1", "a tenth"] {
            let Err((why, _)) = sampler(&[
                ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", arg),
            ]) else {
                panic!("{arg} accepted");
            };
            assert!(
                why.contains(&format!("OTEL_TRACES_SAMPLER_ARG={arg:?}: expected the share of traces to record, a number from 0 to 1")),
                "{why}"
            );
        }
    }

    #[test]
    fn a_ratio_records_by_the_ids_low_bits_so_that_every_process_decides_alike() {
        let half = Sampler {
            parent_based: false,
            ratio: 0.5,
        };
        let id = |low: u64| {
            TraceId::from_bytes([[0u8; 8], low.to_be_bytes()].concat().try_into().unwrap())
        };
        assert!(half.records(id(0)));
        assert!(half.records(id((1 << 63) - 1)));
        assert!(!half.records(id(1 << 63)));
        assert!(!half.records(id(u64::MAX)));
        let none = Sampler { ratio: 0.0, ..half };
        assert!(!none.records(id(0)));
        let all = Sampler { ratio: 1.0, ..half };
        assert!(all.records(id(u64::MAX)));
    }
}

//! The sampler (`OTEL_TRACES_SAMPLER`) decides where a trace starts whether
//! its spans are made; a trace not recorded is still carried on, flagged, so
//! the processes after make none either. Its own test binary: the sampler is
//! the process's.

use switchyard_eventlog::trace::{self, Sampler, SpanContext, Traced};
use switchyard_runtime::telemetry::{Export, Telemetry};
use tracing_subscriber::prelude::*;

fn span(parent: Option<&SpanContext>) -> Traced {
    trace::span_in(
        parent,
        || tracing::info_span!(target: "switchyard_runtime::host", "decision"),
    )
}

/// One test: the sampler is the process's.
#[tokio::test]
async fn a_trace_not_recorded_makes_no_spans_and_is_carried_on_flagged() {
    let (telemetry, problem) = Telemetry::new("stack-assigner", &Export::None);
    assert_eq!(problem, None);
    let _default = tracing_subscriber::registry()
        .with(telemetry.layer("stack-assigner"))
        .set_default();
    {
        // Every trace (the default): a root span, its child in its trace.
        trace::sample_with(Some(Sampler::default()));
        let root = span(None);
        assert!(!root.span.is_none());
        let recorded = root.context.expect("a recorded root has ids");
        assert!(recorded.is_sampled());
        let child = span(Some(&recorded));
        assert!(!child.span.is_none());
        let child_ids = child.context.unwrap();
        assert_eq!(child_ids.trace_id(), recorded.trace_id());
        assert_ne!(child_ids.span_id(), recorded.span_id());

        // None recorded: no span, but ids to carry on, not sampled.
        trace::sample_with(Some(Sampler {
            parent_based: true,
            ratio: 0.0,
        }));
        let root = span(None);
        assert!(root.span.is_none());
        let unrecorded = root.context.expect("ids are carried on without a span");
        assert!(unrecorded.is_valid() && !unrecorded.is_sampled());
        let text = trace::to_w3c(&unrecorded);
        assert!(text.traceparent.ends_with("-00"), "{}", text.traceparent);
        // Where it is continued (another process reads the text): no span
        // either, the same trace still.
        let continued = span(trace::from_w3c(&text).as_ref());
        assert!(continued.span.is_none());
        assert_eq!(continued.context.unwrap().trace_id(), unrecorded.trace_id());
        // A trace recorded where it started is recorded here, parent-based.
        let child = span(Some(&recorded));
        assert!(!child.span.is_none());
        assert_eq!(child.context.unwrap().trace_id(), recorded.trace_id());

        // Not parent-based: every span decides by the trace id, alike for
        // every span of one trace.
        trace::sample_with(Some(Sampler {
            parent_based: false,
            ratio: 1.0,
        }));
        assert!(!span(Some(&unrecorded)).span.is_none());

        // A share: about that share of new traces recorded.
        trace::sample_with(Some(Sampler {
            parent_based: true,
            ratio: 0.5,
        }));
        let recorded = (0..2_000).filter(|_| !span(None).span.is_none()).count();
        assert!(
            (800..1_200).contains(&recorded),
            "{recorded} of 2000 recorded at 0.5"
        );
    }

    // What is written carrying a trace not recorded (an effect's write, in
    // no span) names it.
    trace::sample_with(Some(Sampler {
        parent_based: true,
        ratio: 0.0,
    }));
    let unrecorded = span(None).context.map(|c| trace::to_w3c(&c));
    assert!(unrecorded.is_some());
    assert_eq!(trace::current(), None);
    let inside = trace::carrying(unrecorded.clone(), async { trace::current() }).await;
    assert_eq!(inside, unrecorded);
    assert_eq!(
        trace::carrying(None, async { trace::current() }).await,
        None
    );
}

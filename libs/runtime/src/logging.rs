//! Logs, the same for every binary: filtered by `RUST_LOG` (or its alias
//! `SWITCHYARD_LOG_LEVEL`; `info` when neither is set), one JSON object per
//! line when stderr is not a terminal (a container's log) and text on a
//! terminal — `SWITCHYARD_LOG_FORMAT=json|text` chooses either way — never
//! colour codes off a terminal. Each JSON line carries `timestamp`, `level`,
//! `service`, `target`, `message`, the fields of the spans it happened in
//! (`node`, `handover_id`, ...) and its own. A warning repeated word for word
//! is said once: again only after [`REPEAT_WINDOW`] (a client made per
//! request that warns each time, a retry loop during an outage). A line
//! logged inside a traced span also has its `trace_id` and `span_id`.

use std::collections::HashMap;
use std::fmt;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io::IsTerminal;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use opentelemetry::trace::TraceContextExt;
use serde_json::{Map, Value};
use tracing::dispatcher::WeakDispatch;
use tracing::field::{Field, Visit};
use tracing::span::Id;
use tracing::{Dispatch, Event, Level, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::prelude::*;
use tracing_subscriber::registry::LookupSpan;

use crate::telemetry::Telemetry;

/// How long a repeated warning stays quiet.
pub const REPEAT_WINDOW: Duration = Duration::from_secs(600);
/// Distinct warnings remembered; past it, those said longer than
/// [`REPEAT_WINDOW`] ago are forgotten (all of them, if none is).
const REMEMBERED: usize = 4096;

/// How lines are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Json,
    Text,
}

/// The filter: `RUST_LOG`, else `SWITCHYARD_LOG_LEVEL`, else `default`.
pub fn filter_directives(
    rust_log: Option<&str>,
    switchyard_log_level: Option<&str>,
    default: &str,
) -> String {
    [rust_log, switchyard_log_level]
        .into_iter()
        .flatten()
        .find(|s| !s.trim().is_empty())
        .unwrap_or(default)
        .to_string()
}

/// The format: `SWITCHYARD_LOG_FORMAT` if set, else text on a terminal and
/// JSON otherwise; an unknown value is an error naming it.
pub fn log_format(setting: Option<&str>, terminal: bool) -> Result<LogFormat, String> {
    match setting.map(str::trim) {
        None | Some("") => Ok(if terminal {
            LogFormat::Text
        } else {
            LogFormat::Json
        }),
        Some("json") => Ok(LogFormat::Json),
        Some("text") => Ok(LogFormat::Text),
        Some(other) => Err(format!(
            "SWITCHYARD_LOG_FORMAT={other:?}: expected json or text"
        )),
    }
}

/// Logs of `service` to stderr as described above; `default` is the level
/// when no variable sets one (`info` for services, `warn` for commands). A
/// bad filter or format is said on stderr and the default used. Spans are
/// traced too ([`crate::telemetry`]): the [`Telemetry`] returned exports
/// them while it lives, and must be flushed before the process exits.
pub fn init_tracing(service: &'static str, default: &str) -> Telemetry {
    let var = |name| std::env::var(name).ok();
    let directives = filter_directives(
        var("RUST_LOG").as_deref(),
        var("SWITCHYARD_LOG_LEVEL").as_deref(),
        default,
    );
    let filter = EnvFilter::try_new(&directives).unwrap_or_else(|err| {
        eprintln!("RUST_LOG={directives:?} is not a log filter ({err}); logging at {default}");
        EnvFilter::new(default)
    });
    let terminal = std::io::stderr().is_terminal();
    let format =
        log_format(var("SWITCHYARD_LOG_FORMAT").as_deref(), terminal).unwrap_or_else(|err| {
            eprintln!("{err}; logging as JSON");
            LogFormat::Json
        });
    let export = crate::telemetry::export_from(|name| std::env::var(name).ok());
    let (telemetry, problem) = Telemetry::new(service, &export);
    // The tracer sees Switchyard's spans whatever the log level; the log
    // lines go through the filter.
    let registry = tracing_subscriber::registry()
        .with(telemetry.layer(service))
        .with(TraceIds::default())
        .with(SaidOnce::default());
    match format {
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .fmt_fields(JsonFields::new())
                    .event_format(JsonLines { service })
                    .with_writer(std::io::stderr)
                    .with_ansi(false)
                    .with_filter(filter),
            )
            .init(),
        LogFormat::Text => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_ansi(terminal)
                    .with_filter(filter),
            )
            .init(),
    }
    match (problem, export) {
        (Some(problem), _) => tracing::warn!("{problem}"),
        (None, crate::telemetry::Export::Otlp { endpoint }) => {
            tracing::info!(endpoint, "exporting traces over OTLP/gRPC")
        }
        (None, _) => {}
    }
    telemetry
}

/// One JSON object per event.
pub struct JsonLines {
    pub service: &'static str,
}

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let mut line = Map::new();
        let mut timestamp = String::new();
        SystemTime.format_time(&mut Writer::new(&mut timestamp))?;
        line.insert("timestamp".into(), timestamp.into());
        line.insert("level".into(), meta.level().as_str().into());
        line.insert("service".into(), self.service.into());
        line.insert("target".into(), meta.target().into());
        // The spans' fields, outermost first; the event's own win.
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let extensions = span.extensions();
                if let Some(fields) = extensions.get::<FormattedFields<N>>()
                    && let Ok(Value::Object(fields)) = serde_json::from_str(&fields.fields)
                {
                    line.extend(fields);
                }
            }
        }
        event.record(&mut Fields(&mut line));
        // The trace the event happened in, to find its spans by.
        if let Some(scope) = ctx.event_scope()
            && let Some(ids) = scope
                .into_iter()
                .find_map(|span| span.extensions().get::<Ids>().copied())
        {
            line.insert("trace_id".into(), ids.trace_id.to_string().into());
            line.insert("span_id".into(), ids.span_id.to_string().into());
        }
        writeln!(writer, "{}", Value::Object(line))
    }
}

/// Keeps the trace and span id the OpenTelemetry layer gave each span, when
/// it is entered, for the JSON lines logged in it.
#[derive(Default)]
pub struct TraceIds {
    dispatch: OnceLock<WeakDispatch>,
}

/// A span's ids, as [`TraceIds`] kept them (as numbers: written out only
/// when a line is logged in the span).
#[derive(Clone, Copy)]
struct Ids {
    trace_id: opentelemetry::trace::TraceId,
    span_id: opentelemetry::trace::SpanId,
}

impl<S> Layer<S> for TraceIds
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_register_dispatch(&self, subscriber: &Dispatch) {
        let _ = self.dispatch.set(subscriber.downgrade());
    }

    fn on_enter(&self, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else {
            return;
        };
        if span.extensions().get::<Ids>().is_some() {
            return;
        }
        let Some(dispatch) = self.dispatch.get().and_then(WeakDispatch::upgrade) else {
            return;
        };
        let Some(context) = tracing_opentelemetry::get_otel_context(id, &dispatch) else {
            return;
        };
        let otel = context.span();
        let ids = otel.span_context();
        if ids.is_valid() {
            span.extensions_mut().insert(Ids {
                trace_id: ids.trace_id(),
                span_id: ids.span_id(),
            });
        }
    }
}

/// An event's fields as JSON values.
struct Fields<'a>(&'a mut Map<String, Value>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.0.insert(field.name().into(), value.to_string().into());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().into(), format!("{value:?}").into());
    }
}

/// Quiets a warning (or error) that repeats word for word within
/// [`REPEAT_WINDOW`]: the same place in the code, the same fields.
#[derive(Default)]
pub struct SaidOnce {
    said: Mutex<HashMap<u64, Instant>>,
}

impl<S: Subscriber> Layer<S> for SaidOnce {
    fn event_enabled(&self, event: &Event<'_>, _ctx: Context<'_, S>) -> bool {
        if *event.metadata().level() > Level::WARN {
            return true;
        }
        let mut hasher = DefaultHasher::new();
        event.metadata().callsite().hash(&mut hasher);
        event.record(&mut Hashed(&mut hasher));
        let key = hasher.finish();
        let now = Instant::now();
        let mut said = self.said.lock().unwrap_or_else(|e| e.into_inner());
        if said
            .get(&key)
            .is_some_and(|at| now.duration_since(*at) < REPEAT_WINDOW)
        {
            return false;
        }
        if said.len() >= REMEMBERED {
            said.retain(|_, at| now.duration_since(*at) < REPEAT_WINDOW);
            if said.len() >= REMEMBERED {
                said.clear();
            }
        }
        said.insert(key, now);
        true
    }
}

/// An event's fields into a hasher.
struct Hashed<'a>(&'a mut DefaultHasher);

impl Visit for Hashed<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        field.name().hash(self.0);
        format!("{value:?}").hash(self.0);
    }
}

//! `/rosout` for the node's `tracing` events. Code logs once, with `tracing`; `vlm_node`
//! installs [`layer`] beside its stderr formatter, and every WARN and ERROR event is handed
//! to rcutils under the node's logger name, from where rcl publishes it on `/rosout`. The
//! spans around an event lead its text (`ask{request_id=req-3}: ask failed: ...`).
//!
//! Two hazards of r2r's logger are handled here, once:
//! - it builds `CString`s and unwraps them, so a NUL byte would panic in whatever thread
//!   logged; a warning can quote model or request text, so NULs become U+FFFD first;
//! - rcutils logging is not guarded against concurrent callers, so one mutex serialises every
//!   call into it.

use std::borrow::Cow;
use std::cell::Cell;
use std::fmt::{self, Write as _};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record as SpanRecord};
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::LookupSpan;

/// The logger events go to. rcl publishes on `/rosout` only for a node's logger, so
/// nothing is forwarded before `RosoutTarget::attach` names it.
#[derive(Debug, Clone, Default)]
pub struct RosoutTarget(Arc<OnceLock<String>>);

impl RosoutTarget {
    /// Names the node's logger (`r2r::Node::logger`, remapping applied). Later calls are
    /// ignored: one process runs one node.
    pub(crate) fn attach(&self, logger: &str) {
        let _ = self.0.set(without_nul(logger).into_owned());
    }

    fn logger(&self) -> Option<&str> {
        self.0.get().map(String::as_str)
    }
}

/// One event as it is forwarded: every string is free of NUL bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record<'a> {
    pub logger: &'a str,
    pub level: Level,
    pub text: &'a str,
    pub file: &'a str,
    pub line: u32,
}

type Sink = Box<dyn Fn(&Record<'_>) + Send + Sync>;

/// The layer itself; [`layer`] wraps it in the filter it needs.
pub(crate) struct RosoutLayer {
    target: RosoutTarget,
    /// The one lock around rcutils: whoever calls the sink holds it.
    sink: Mutex<Sink>,
}

/// The layer, filtered to WARN and above for events. Spans down to INFO are let through too,
/// so the request span's fields can lead an event's text; the filter is the layer's own, so
/// `RUST_LOG` (the stderr formatter's filter) neither hides warnings from `/rosout` nor
/// enables TRACE callsites through it.
pub fn layer<S>(target: RosoutTarget) -> impl Layer<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    RosoutLayer::new(target).with_filter(filter_fn(wanted))
}

fn wanted(m: &Metadata<'_>) -> bool {
    if m.is_span() {
        *m.level() <= Level::INFO
    } else {
        *m.level() <= Level::WARN
    }
}

impl RosoutLayer {
    /// Forwards to rcutils through r2r.
    pub(crate) fn new(target: RosoutTarget) -> Self {
        Self::with_sink(target, Box::new(to_rcutils))
    }

    fn with_sink(target: RosoutTarget, sink: Sink) -> Self {
        Self {
            target,
            sink: Mutex::new(sink),
        }
    }

    fn forward(&self, record: &Record<'_>) {
        let Some(_busy) = Forwarding::enter() else {
            return;
        };
        // A panic in an earlier call leaves nothing half-done behind this lock.
        let sink = self.sink.lock().unwrap_or_else(PoisonError::into_inner);
        sink(record);
    }
}

thread_local!(static FORWARDING: Cell<bool> = const { Cell::new(false) });

/// Marks this thread as inside the sink. r2r can log from inside a call (it reports a failed
/// rcutils initialisation through `log`, which tracing-log turns into an event): forwarding
/// that one too would wait on the lock this thread already holds.
struct Forwarding;

impl Forwarding {
    fn enter() -> Option<Self> {
        (!FORWARDING.with(|f| f.replace(true))).then_some(Self)
    }
}

impl Drop for Forwarding {
    fn drop(&mut self) {
        FORWARDING.with(|f| f.set(false));
    }
}

/// The event's file and line are passed on, not this module's (which the `r2r::log_*!`
/// macros would record).
fn to_rcutils(r: &Record<'_>) {
    let severity = match r.level {
        Level::ERROR => r2r::LogSeverity::Error,
        Level::WARN => r2r::LogSeverity::Warn,
        Level::INFO => r2r::LogSeverity::Info,
        _ => r2r::LogSeverity::Debug,
    };
    r2r::log(r.text, r.logger, r.file, r.line, severity);
}

/// `text` with every U+0000 replaced by U+FFFD, borrowed when there is none.
pub(crate) fn without_nul(text: &str) -> Cow<'_, str> {
    if text.contains('\0') {
        Cow::Owned(text.replace('\0', "\u{FFFD}"))
    } else {
        Cow::Borrowed(text)
    }
}

/// A span's fields as `name=value`, kept in its extensions for the events inside it.
struct SpanFields(String);

impl<S> Layer<S> for RosoutLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut text = Text::default();
        attrs.record(&mut text);
        span.extensions_mut().insert(SpanFields(text.fields));
    }

    fn on_record(&self, id: &Id, values: &SpanRecord<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut ext = span.extensions_mut();
        if let Some(SpanFields(fields)) = ext.get_mut::<SpanFields>() {
            let mut text = Text {
                fields: std::mem::take(fields),
                ..Text::default()
            };
            values.record(&mut text);
            *fields = text.fields;
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let Some(logger) = self.target.logger() else {
            return;
        };
        let mut text = String::new();
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope.from_root() {
                text.push_str(span.name());
                if let Some(SpanFields(f)) = span.extensions().get::<SpanFields>() {
                    if !f.is_empty() {
                        let _ = write!(text, "{{{}}}", f.trim_start());
                    }
                }
                text.push_str(": ");
            }
        }
        let mut fields = Text::default();
        event.record(&mut fields);
        text.push_str(&fields.message);
        text.push_str(&fields.fields);
        let meta = event.metadata();
        self.forward(&Record {
            logger,
            level: *meta.level(),
            text: &without_nul(&text),
            file: &without_nul(meta.file().unwrap_or("")),
            line: meta.line().unwrap_or(0),
        });
    }
}

/// An event's message, then its other fields as ` name=value`.
#[derive(Default)]
struct Text {
    message: String,
    fields: String,
}

impl Text {
    fn push(&mut self, field: &Field, value: fmt::Arguments<'_>) {
        // Writing to a String cannot fail.
        let _ = if field.name() == "message" {
            self.message.write_fmt(value)
        } else {
            write!(self.fields, " {}={value}", field.name())
        };
    }
}

impl Visit for Text {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.push(field, format_args!("{value}"));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.push(field, format_args!("{value:?}"));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::Registry;

    use super::*;

    /// A subscriber whose rosout layer records into `seen` instead of rcutils.
    fn capture(target: &RosoutTarget, seen: Arc<Mutex<Vec<(Level, String)>>>) -> impl Subscriber {
        let sink: Sink = Box::new(move |r| {
            assert!(!r.text.contains('\0') && !r.file.contains('\0'));
            seen.lock().unwrap().push((r.level, r.text.to_owned()));
        });
        Registry::default()
            .with(RosoutLayer::with_sink(target.clone(), sink).with_filter(filter_fn(wanted)))
    }

    #[test]
    fn nul_bytes_become_replacement_characters() {
        assert_eq!(without_nul("a\0b\0"), "a\u{FFFD}b\u{FFFD}");
        assert!(matches!(
            without_nul("no nul, 长 🍎"),
            Cow::Borrowed("no nul, 长 🍎")
        ));
        let target = RosoutTarget::default();
        let seen = Arc::new(Mutex::new(Vec::new()));
        tracing::subscriber::with_default(capture(&target, seen.clone()), || {
            tracing::warn!("before the node exists");
            target.attach("vlm_node");
            let _span = tracing::info_span!("ask", request_id = "req\0-1").entered();
            tracing::warn!(quote = "x\0y", "the model said {:?}", "a\0b");
            tracing::info!("not forwarded");
            tracing::error!(code = "backend_error", "ask failed: \0");
        });
        let seen = seen.lock().unwrap();
        assert_eq!(
            *seen,
            vec![
                (
                    Level::WARN,
                    "ask{request_id=req\u{FFFD}-1}: the model said \"a\\0b\" quote=x\u{FFFD}y"
                        .to_owned()
                ),
                (
                    Level::ERROR,
                    "ask{request_id=req\u{FFFD}-1}: ask failed: \u{FFFD} code=backend_error"
                        .to_owned()
                ),
            ]
        );
    }

    #[test]
    fn rcutils_gets_a_nul_free_message() {
        // Unsanitised, r2r's CString::new(..).unwrap() would panic inside this warn!.
        let target = RosoutTarget::default();
        target.attach("bpu_vlm_rosout_test");
        let subscriber = Registry::default().with(layer(target));
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!(reply = "bad\0reply", "model text with a NUL: {}", "a\0b");
        });
    }

    #[test]
    fn calls_into_the_sink_never_overlap() {
        let target = RosoutTarget::default();
        target.attach("vlm_node");
        let inside = Arc::new(AtomicBool::new(false));
        let calls = Arc::new(Mutex::new(0usize));
        let sink: Sink = {
            let (inside, calls) = (inside.clone(), calls.clone());
            Box::new(move |_| {
                assert!(!inside.swap(true, Ordering::SeqCst), "two calls at once");
                std::thread::yield_now();
                *calls.lock().unwrap() += 1;
                inside.store(false, Ordering::SeqCst);
            })
        };
        let dispatch = tracing::Dispatch::new(
            Registry::default()
                .with(RosoutLayer::with_sink(target, sink).with_filter(filter_fn(wanted))),
        );
        std::thread::scope(|s| {
            for t in 0..4 {
                let dispatch = dispatch.clone();
                s.spawn(move || {
                    tracing::dispatcher::with_default(&dispatch, || {
                        for i in 0..200 {
                            tracing::warn!(thread = t, i, "concurrent warning");
                        }
                    });
                });
            }
        });
        assert_eq!(*calls.lock().unwrap(), 800);
    }
}

//! `/rosout` for the node's `tracing` events. Code logs once, with `tracing`; `vlm_node`
//! installs [`layer`] beside its stderr formatter, and every event at the parameter
//! `rosout_level` or above (default INFO, so `rqt_console` shows "ready") goes to `/rosout`
//! under the node's logger name (remapped: `r2.vlm_front`). The spans around an event lead
//! its text (`ask{request_id=req-3}: ask failed: ...`).
//!
//! WARN and ERROR are handed to rcutils, from where rcl publishes them on `/rosout` (and also
//! prints them in its console format and writes its log file). INFO and DEBUG are published
//! by the node's own `/rosout` publisher (`rcl_interfaces/msg/Log`, rcl's `/rosout` QoS):
//! through rcutils every INFO line would be printed on stderr a second time.
//!
//! Two hazards of r2r's logger are handled here, once:
//! - it builds `CString`s and unwraps them, so a NUL byte would panic in whatever thread
//!   logged; a warning can quote model or request text, so NULs become U+FFFD first;
//! - rcutils logging is not guarded against concurrent callers, so one mutex serialises every
//!   call into it.

use std::borrow::Cow;
use std::cell::Cell;
use std::fmt::{self, Write as _};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use r2r::rcl_interfaces::msg::Log;
use r2r::QosProfile;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record as SpanRecord};
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::filter::{dynamic_filter_fn, LevelFilter};
use tracing_subscriber::layer::{Context, Layer};
use tracing_subscriber::registry::LookupSpan;

/// The logger events go to, and the least level forwarded (INFO until
/// [`RosoutTarget::set_level`]). rcl publishes on `/rosout` only for a node's logger, so
/// nothing is forwarded before `RosoutTarget::attach` names it.
#[derive(Clone, Default)]
pub struct RosoutTarget(Arc<Target>);

#[derive(Default)]
struct Target {
    logger: OnceLock<String>,
    /// The node's own `/rosout` publisher, for INFO and DEBUG.
    publisher: OnceLock<Mutex<r2r::Publisher<Log>>>,
    /// The least level forwarded, as its index in [`LEVELS`].
    level: AtomicU8,
}

impl fmt::Debug for RosoutTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RosoutTarget")
            .field("logger", &self.0.logger.get())
            .field("level", &self.0.level)
            .finish_non_exhaustive()
    }
}

/// rcl's QoS of `/rosout` publishers: late subscribers get the last lines of 10 s.
fn rosout_qos() -> QosProfile {
    QosProfile::default()
        .keep_last(1000)
        .reliable()
        .transient_local()
        .lifespan(Duration::from_secs(10))
}

/// The levels [`Target::level`] can hold; index 0, the default, is INFO.
const LEVELS: [Level; 4] = [Level::INFO, Level::DEBUG, Level::WARN, Level::ERROR];

impl RosoutTarget {
    /// Names the node's logger (`r2r::Node::logger`, remapping applied) and creates its own
    /// `/rosout` publisher. Later calls are ignored: one process runs one node.
    pub(crate) fn attach_node(&self, node: &mut r2r::Node) -> r2r::Result<()> {
        let publisher = node.create_publisher::<Log>("/rosout", rosout_qos())?;
        let _ = self.0.publisher.set(Mutex::new(publisher));
        self.attach(node.logger());
        Ok(())
    }

    /// Names the logger events go to.
    fn attach(&self, logger: &str) {
        let _ = self.0.logger.set(without_nul(logger).into_owned());
    }

    /// Publishes an INFO or DEBUG record on the node's `/rosout` publisher, if there is one.
    fn publish(&self, r: &Record<'_>) {
        let Some(publisher) = self.0.publisher.get() else {
            return;
        };
        let since_epoch = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let msg = Log {
            stamp: r2r::builtin_interfaces::msg::Time {
                sec: i32::try_from(since_epoch.as_secs()).unwrap_or(i32::MAX),
                nanosec: since_epoch.subsec_nanos(),
            },
            // rcl_interfaces/msg/Log: DEBUG = 10, INFO = 20.
            level: if r.level == Level::INFO { 20 } else { 10 },
            name: r.logger.to_owned(),
            msg: r.text.to_owned(),
            file: r.file.to_owned(),
            function: String::new(),
            line: r.line,
        };
        // After the node is gone there is nowhere to publish: the line is on stderr anyway.
        let _ = publisher
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .publish(&msg);
    }

    /// Events at `level` or above are forwarded from now on (the parameter `rosout_level`).
    pub(crate) fn set_level(&self, level: Level) {
        let i = LEVELS.iter().position(|l| *l == level).unwrap_or(0);
        self.0.level.store(i as u8, Ordering::Relaxed);
    }

    fn logger(&self) -> Option<&str> {
        self.0.logger.get().map(String::as_str)
    }

    /// Whether an event or span is forwarded (spans down to INFO, so the request span's
    /// fields can lead an event's text).
    fn wants(&self, m: &Metadata<'_>) -> bool {
        if m.is_span() {
            return *m.level() <= Level::INFO;
        }
        let least = LEVELS[usize::from(self.0.level.load(Ordering::Relaxed)).min(3)];
        *m.level() <= least
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

/// The layer, filtered to the target's level for events ([`RosoutTarget::wants`]). The
/// filter is the layer's own, so `RUST_LOG` (the stderr formatter's filter) neither hides
/// events from `/rosout` nor enables TRACE callsites through it; it is asked per event (the
/// level is set once the parameters are read).
pub fn layer<S>(target: RosoutTarget) -> impl Layer<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    let filter = filtered(&target);
    RosoutLayer::new(target).with_filter(filter)
}

fn filtered<S>(target: &RosoutTarget) -> impl tracing_subscriber::layer::Filter<S>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    let target = target.clone();
    dynamic_filter_fn(move |m, _| target.wants(m)).with_max_level_hint(LevelFilter::DEBUG)
}

impl RosoutLayer {
    /// Forwards WARN and ERROR to rcutils through r2r, the rest to the node's publisher.
    pub(crate) fn new(target: RosoutTarget) -> Self {
        let to = target.clone();
        let sink: Sink = Box::new(move |r| {
            if r.level <= Level::WARN {
                to_rcutils(r);
            } else {
                to.publish(r);
            }
        });
        Self::with_sink(target, sink)
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
            .with(RosoutLayer::with_sink(target.clone(), sink).with_filter(filtered(target)))
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
            target.set_level(Level::WARN);
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
    fn info_and_above_by_default_then_the_level_set() {
        let target = RosoutTarget::default();
        target.attach("r2.vlm_front");
        let seen = Arc::new(Mutex::new(Vec::new()));
        tracing::subscriber::with_default(capture(&target, seen.clone()), || {
            tracing::debug!("d1");
            tracing::info!("ready");
            tracing::warn!("w1");
            target.set_level(Level::ERROR);
            tracing::warn!("w2");
            tracing::error!("e2");
            target.set_level(Level::DEBUG);
            tracing::debug!("d3");
            tracing::trace!("t3");
        });
        let texts: Vec<(Level, String)> = seen.lock().unwrap().clone();
        assert_eq!(
            texts,
            [
                (Level::INFO, "ready"),
                (Level::WARN, "w1"),
                (Level::ERROR, "e2"),
                (Level::DEBUG, "d3")
            ]
            .map(|(l, t)| (l, t.to_owned()))
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
                .with(RosoutLayer::with_sink(target.clone(), sink).with_filter(filtered(&target))),
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

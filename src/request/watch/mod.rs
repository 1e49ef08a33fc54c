//! Standing questions: the `vlm/watch` action (`bpu_vlm_msgs/action/Watch`). A goal is
//! checked once ([`goal`]), then evaluated — an ask of its question on its camera, greedy,
//! under its schema, quiet (no Token, no Answer) — when it is accepted and again whenever
//! [`schedule`] says the camera's scene changed. Each evaluation goes through the ask path
//! ([`crate::request::ask::handle_with`]), so it starts from the camera's pre-filled frame
//! when that frame shows the scene, and it meets the same limits and checks. Asks and
//! detects come first: an evaluation is queued only while none is live, and one that is
//! queued meanwhile stops it at the next graph call ([`board`]); it is made again once they
//! are served. Each evaluation is the goal's feedback; an answer that differs from the
//! previous one (as JSON values) is also published on `vlm/events`.
//!
//! A goal ends with its result when its `until` value is answered, its `timeout_s` passes,
//! its client cancels it, an evaluation fails for a reason that would repeat (an invalid
//! question, a schema answer cut short, a failed engine), or the node deactivates or shuts
//! down. A camera that falls silent (`max_camera_silence_s`) gets one feedback saying so; the
//! goal waits for frames and goes on.

pub(crate) mod board;
pub(crate) mod goal;
pub(crate) mod schedule;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use camera_frame::CachedFrame;
use r2r::std_msgs::msg::Header;
use r2r::unique_identifier_msgs::msg::UUID;
use r2r::Publisher;

use crate::interface::ErrorCode;
use crate::msgs::action::Watch;
use crate::msgs::msg::WatchEvent;
use crate::msgs::srv::Ask;
use crate::request::ask::{handle_with, GoalHooks};
use crate::request::context::AskContext;
use crate::ros::params::time_limit;
use crate::serve::failure::Failure;
use goal::{reaches, same_answer, WatchSpec};
use schedule::{due, silent, Last, Timing};

/// How often a goal looks at its camera, its cancel flag and the node's state.
const TICK: Duration = Duration::from_millis(50);

/// The least wait before an evaluation the camera could not serve is tried again.
const RETRY_WAIT: Duration = Duration::from_secs(1);

/// The silence a goal waits for a first frame before it says the camera is silent, when
/// `max_camera_silence_s` is 0 (off).
const FIRST_FRAME_WAIT: Duration = Duration::from_secs(2);

/// Where a goal's messages go.
pub(crate) struct WatchOutputs {
    /// Behind a lock (as `events`): an r2r publisher may move between threads but not be
    /// shared, and the goal's task holds its outputs across awaits.
    pub feedback: Mutex<Publisher<Watch::FeedbackMessage>>,
    pub goal_id: UUID,
    /// `vlm/events`, shared by every goal.
    pub events: Arc<Mutex<Publisher<WatchEvent>>>,
}

/// A goal's state between evaluations.
#[derive(Default)]
struct Progress {
    evaluations: u32,
    /// The last answer and the header of its frame.
    answer: Option<(String, Header)>,
    /// The last evaluation's start and the camera's newest frame then.
    last: Option<(Instant, CachedFrame)>,
    /// A camera-silent notice went out and no frame came since.
    silent: bool,
}

/// How a goal ends.
enum Ending {
    Reached,
    Failed(Failure),
}

/// What one evaluation came to.
enum Evaluated {
    Answer(Box<Ask::Response>, Duration),
    /// Stopped for an ask or a detect, or no frame to be had: made again after this wait.
    Again(Duration),
    End(Ending),
}

/// Runs one goal to its result.
pub(crate) async fn run(
    goal: Watch::Goal,
    ctx: Arc<AskContext>,
    cancel: Arc<AtomicBool>,
    out: WatchOutputs,
) -> Watch::Result {
    let mut progress = Progress::default();
    let ending = watch(goal, &ctx, &cancel, &out, &mut progress).await;
    match &ending {
        Ending::Reached => tracing::info!(
            evaluations = progress.evaluations,
            "watch reached its until value"
        ),
        Ending::Failed(f) if f.code == ErrorCode::BackendError => {
            tracing::warn!(
                evaluations = progress.evaluations,
                "watch failed: {}",
                f.message
            )
        }
        Ending::Failed(f) => tracing::info!(
            evaluations = progress.evaluations,
            code = f.code.as_str(),
            "watch ended: {}",
            f.message
        ),
    }
    let (answer, header) = progress.answer.unwrap_or_default();
    let (success, error_code, error_message) = match ending {
        Ending::Reached => (true, String::new(), String::new()),
        Ending::Failed(f) => (false, f.code.as_str().to_owned(), f.message),
    };
    Watch::Result {
        success,
        error_code,
        error_message: ctx.nuls.safe(error_message),
        evaluations: progress.evaluations,
        answer,
        image_header: header,
    }
}

/// What ends a goal besides its answers: its cancel, its time limit, the node's state.
struct Stops<'a> {
    ctx: &'a AskContext,
    cancel: &'a AtomicBool,
    deadline: Option<Instant>,
    /// [`board::WatchBoard::ends`] when the goal started.
    ends: u64,
}

impl Stops<'_> {
    /// Why the goal must end now, if it must.
    fn reason(&self) -> Option<Failure> {
        stop_reason(self.ctx, self.cancel, self.deadline, self.ends)
    }
}

fn stop_reason(
    ctx: &AskContext,
    cancel: &AtomicBool,
    deadline: Option<Instant>,
    ends: u64,
) -> Option<Failure> {
    if cancel.load(Ordering::Acquire) {
        return Some(Failure::new(
            ErrorCode::Cancelled,
            "the watch was cancelled",
        ));
    }
    if ctx.closed() {
        return Some(Failure::new(
            ErrorCode::Cancelled,
            "the watch ended: the node is shutting down",
        ));
    }
    if let Some(why) = ctx.not_serving() {
        return Some(Failure::new(
            ErrorCode::Cancelled,
            format!("the watch ended: {why}"),
        ));
    }
    if ctx.watches.ends() != ends {
        return Some(Failure::new(
            ErrorCode::Cancelled,
            "the watch ended: the node was deactivated",
        ));
    }
    if deadline.is_some_and(|d| Instant::now() >= d) {
        return Some(Failure::new(
            ErrorCode::Timeout,
            "timeout_s passed before the watch's until value was answered",
        ));
    }
    None
}

async fn watch(
    goal: Watch::Goal,
    ctx: &Arc<AskContext>,
    cancel: &AtomicBool,
    out: &WatchOutputs,
    progress: &mut Progress,
) -> Ending {
    let started = Instant::now();
    let ends = ctx.watches.ends();
    // As an ask is refused: only an active node takes watches.
    if let Some(why) = ctx.not_serving() {
        return Ending::Failed(Failure::new(ErrorCode::NotReady, why));
    }
    let spec = match WatchSpec::check(goal, ctx).await {
        Ok(s) => s,
        Err(f) => return Ending::Failed(f),
    };
    let max = ctx.params.snapshot().max_watches;
    let Some(_slot) = ctx.watches.take_slot(max) else {
        return Ending::Failed(Failure::new(
            ErrorCode::Busy,
            format!("{max} watches are running (parameter max_watches); retry later"),
        ));
    };
    let stops = Stops {
        ctx,
        cancel,
        deadline: spec.timeout.and_then(|t| started.checked_add(t)),
        ends,
    };
    let Some(cameras) = ctx.cameras.clone() else {
        return Ending::Failed(Failure::new(ErrorCode::InvalidRequest, "no cameras"));
    };
    tracing::info!(camera = %spec.topic, "watch started");
    loop {
        if let Some(f) = stops.reason() {
            return Ending::Failed(f);
        }
        let now = Instant::now();
        let p = ctx.params.snapshot();
        let max_silence = time_limit(p.max_camera_silence_s).ok().flatten();
        let newest = cameras.latest(&spec.topic);
        let waited =
            now.saturating_duration_since(started) >= max_silence.unwrap_or(FIRST_FRAME_WAIT);
        if silent(newest.as_ref(), max_silence, now) {
            if !progress.silent && (newest.is_some() || waited) {
                progress.silent = true;
                send_silent(out, progress);
            }
            tokio::time::sleep(TICK).await;
            continue;
        }
        progress.silent = false;
        let Some(newest) = newest else { continue };
        let timing = Timing {
            min_interval: spec.min_interval,
            max_interval: spec.max_interval,
            settle: Duration::try_from_secs_f64(p.scene_settle_s).unwrap_or(Duration::MAX),
            threshold: cameras.scene_threshold(),
        };
        let last = progress.last.as_ref().map(|(started, frame)| Last {
            started: *started,
            frame,
        });
        let scene_since = cameras.stats(&spec.topic).and_then(|s| s.scene_since);
        // Asks and detects first: none may wait behind an evaluation queued now.
        if !due(&timing, last, &newest, scene_since, now) || !ctx.registry.is_empty() {
            tokio::time::sleep(TICK).await;
            continue;
        }
        match evaluate(&spec, ctx, &stops).await {
            Evaluated::Answer(resp, took) => {
                progress.last = Some((now, newest));
                if let Some(end) = answered(&spec, ctx, out, progress, &resp, took) {
                    return end;
                }
            }
            Evaluated::Again(wait) => tokio::time::sleep(wait).await,
            Evaluated::End(end) => return end,
        }
    }
}

/// Runs one evaluation, forwarding the goal's ends (its cancel, its deadline, the node's
/// stop) to it while it is queued or running; on one the goal ends at once (the worker
/// answers the stopped job to nobody).
async fn evaluate(spec: &WatchSpec, ctx: &Arc<AskContext>, stops: &Stops<'_>) -> Evaluated {
    let on_board = ctx.watches.register();
    let hooks = GoalHooks {
        cancel: Some(Arc::clone(&on_board.flag)),
        feedback: None,
        watch: true,
    };
    let t0 = Instant::now();
    let asked = handle_with(spec.ask(), Arc::clone(ctx), hooks);
    tokio::pin!(asked);
    let resp = loop {
        tokio::select! {
            r = &mut asked => break r,
            () = tokio::time::sleep(TICK) => {
                if let Some(f) = stops.reason() {
                    on_board.flag.store(true, Ordering::Release);
                    return Evaluated::End(Ending::Failed(f));
                }
            }
        }
    };
    let took = t0.elapsed();
    if resp.success {
        ctx.watches.evaluated();
        return Evaluated::Answer(Box::new(resp), took);
    }
    if let Some(f) = stops.reason() {
        return Evaluated::End(Ending::Failed(f));
    }
    let code = ErrorCode::parse(&resp.error_code);
    match code {
        // Stopped for an ask or a detect (nothing else stops an evaluation of a goal that
        // goes on): made again once they are served.
        Some(ErrorCode::Cancelled) => {
            ctx.watches.yielded();
            Evaluated::Again(TICK)
        }
        // The camera went silent or stale meanwhile: not retried at the camera's rate.
        Some(ErrorCode::NoImage | ErrorCode::StaleImage | ErrorCode::Busy) => {
            tracing::debug!(code = %resp.error_code, "watch evaluation not made: {}", resp.error_message);
            Evaluated::Again(spec.min_interval.max(RETRY_WAIT))
        }
        // Anything else would fail again (a timeout too: the next evaluation takes as long).
        _ => Evaluated::End(Ending::Failed(Failure::new(
            code.unwrap_or(ErrorCode::BackendError),
            format!("an evaluation failed: {}", resp.error_message),
        ))),
    }
}

/// Sends an evaluation's feedback and, when its answer changed, its event; `Some` when the
/// answer is the goal's `until`.
fn answered(
    spec: &WatchSpec,
    ctx: &AskContext,
    out: &WatchOutputs,
    progress: &mut Progress,
    resp: &Ask::Response,
    took: Duration,
) -> Option<Ending> {
    let previous = progress.answer.as_ref().map(|(a, _)| a.as_str());
    let changed = previous.is_none_or(|p| !same_answer(p, &resp.answer));
    let feedback = Watch::Feedback {
        evaluation: progress.evaluations,
        answer: resp.answer.clone(),
        changed,
        image_header: resp.image_header.clone(),
        scene_checked_stamp: resp.scene_checked_stamp.clone(),
        ttft_s: resp.ttft_s,
        evaluation_s: took.as_secs_f64(),
        camera_silent: false,
    };
    send_feedback(out, feedback);
    if changed {
        let event = WatchEvent {
            header: resp.image_header.clone(),
            goal_id: out.goal_id.clone(),
            question: ctx.nuls.safe(spec.question.clone()),
            previous_answer: previous.unwrap_or_default().to_owned(),
            answer: resp.answer.clone(),
        };
        let sent = out
            .events
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .publish(&event);
        match sent {
            Ok(()) => ctx.watches.event(),
            Err(e) => tracing::warn!(error = %e, "could not publish a watch event"),
        }
    }
    progress.evaluations = progress.evaluations.saturating_add(1);
    progress.answer = Some((resp.answer.clone(), resp.image_header.clone()));
    reaches(&resp.answer, spec.until.as_ref()).then_some(Ending::Reached)
}

fn send_silent(out: &WatchOutputs, progress: &Progress) {
    let header = progress
        .answer
        .as_ref()
        .map(|(_, h)| h.clone())
        .unwrap_or_default();
    send_feedback(
        out,
        Watch::Feedback {
            evaluation: progress.evaluations.saturating_sub(1),
            image_header: header,
            camera_silent: true,
            ..Watch::Feedback::default()
        },
    );
}

fn send_feedback(out: &WatchOutputs, feedback: Watch::Feedback) {
    let msg = Watch::FeedbackMessage {
        goal_id: out.goal_id.clone(),
        feedback,
    };
    let sent = out
        .feedback
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .publish(&msg);
    if let Err(e) = sent {
        tracing::warn!(error = %e, "could not send a watch goal's feedback");
    }
}

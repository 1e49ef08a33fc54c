//! The worker thread: the only thread that touches the model (BPU handles are not `Send`).
//! It opens and warms the model, then takes jobs in arrival order; for each it streams the
//! deltas ([`TokenSink`]), publishes the `Answer` and hands the response back to the waiting
//! `/ask` task, all read from one [`Outcome`].

use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use r2r::Publisher;
use vlm::assistant::{Assistant, BackendKind, ModelInfo};
use vlm::interrupt::Interrupt;
use vlm::stream::{Completion, Event, FinishReason};
use vlm_bpu::OpenError;

use crate::interface::ErrorCode;
use crate::job::{Job, JobPlan};
use crate::msgs::msg::{Answer, Token};
use crate::outcome::{Failure, Figures, Outcome};
use crate::sessions::Sessions;
use crate::token_sink::TokenSink;

/// How often an idle worker expires sessions.
const IDLE_TICK: Duration = Duration::from_secs(1);

/// Worker life cycle, as diagnostics report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerState {
    Loading,
    Ready,
    Busy,
    Failed(String),
}

impl WorkerState {
    pub fn as_str(&self) -> &str {
        match self {
            Self::Loading => "loading",
            Self::Ready => "ready",
            Self::Busy => "busy",
            Self::Failed(_) => "error",
        }
    }
}

/// Counters shared with diagnostics.
#[derive(Debug, Clone)]
pub struct WorkerStats {
    pub state: WorkerState,
    pub model: Option<ModelInfo>,
    pub served: u64,
    pub failed: u64,
    pub last_ttft_s: f64,
    pub last_tokens_per_s: f64,
    pub sessions: usize,
    pub session_bytes: usize,
    /// Decode-state snapshots taken since the model was opened ([`Assistant::snapshots`]).
    pub snapshots: u64,
    /// Simulator live buffers/tasks (`None` on the board or the CPU).
    pub sim_live: Option<(usize, usize)>,
}

impl Default for WorkerStats {
    fn default() -> Self {
        Self {
            state: WorkerState::Loading,
            model: None,
            served: 0,
            failed: 0,
            last_ttft_s: 0.0,
            last_tokens_per_s: 0.0,
            sessions: 0,
            session_bytes: 0,
            snapshots: 0,
            sim_live: None,
        }
    }
}

pub type SharedStats = Arc<Mutex<WorkerStats>>;

/// A panic elsewhere must not stop diagnostics, so a poisoned lock is used as it is.
pub fn update(stats: &SharedStats, f: impl FnOnce(&mut WorkerStats)) {
    let mut g = stats.lock().unwrap_or_else(|e| e.into_inner());
    f(&mut g);
}

/// Publishers the worker streams into.
pub struct Outputs {
    pub tokens: Publisher<Token>,
    pub answers: Publisher<Answer>,
}

/// Settings of the worker thread.
pub struct WorkerConfig {
    pub session_memory_bytes: usize,
    pub session_idle: Duration,
    pub warm_up_system: Option<String>,
    /// Raised at shutdown: loading and warm-up stop at the next step or graph call.
    pub interrupt: Interrupt,
}

/// Runs on the worker thread: `open` builds the assistant there, `ready` reports the outcome
/// of loading, then jobs are served until the channel closes.
pub fn run(
    open: impl FnOnce() -> Result<Assistant, OpenError>,
    config: WorkerConfig,
    jobs: Receiver<Job>,
    outputs: Outputs,
    stats: SharedStats,
    ready: tokio::sync::oneshot::Sender<Result<ModelInfo, String>>,
) {
    let loaded = open().and_then(|mut a| {
        a.warm_up(config.warm_up_system.clone(), &config.interrupt)?;
        Ok(a)
    });
    let mut assistant = match loaded {
        Ok(a) => a,
        // Stopped by shutdown: not a failure of the model, so diagnostics do not say ERROR.
        Err(e) if config.interrupt.is_raised() => {
            tracing::info!("loading stopped by shutdown: {e}");
            let _ = ready.send(Err(e.to_string()));
            return;
        }
        Err(e) => {
            let msg = format!("{e}");
            update(&stats, |s| s.state = WorkerState::Failed(msg.clone()));
            let _ = ready.send(Err(msg));
            return;
        }
    };
    let on_sim = assistant.info().backend == BackendKind::BpuSim;
    let sim_live = || {
        on_sim.then(|| {
            let live = vlm_bpu::sim::live_handles();
            (live.buffers, live.tasks)
        })
    };
    update(&stats, |s| {
        s.state = WorkerState::Ready;
        s.model = Some(assistant.info().clone());
        s.snapshots = assistant.snapshots();
        s.sim_live = sim_live();
    });
    let _ = ready.send(Ok(assistant.info().clone()));
    let mut sessions = Sessions::new(config.session_memory_bytes, config.session_idle);
    loop {
        let job = match jobs.recv_timeout(IDLE_TICK) {
            Ok(j) => j,
            Err(RecvTimeoutError::Timeout) => {
                sessions.expire(Instant::now());
                update(&stats, |s| {
                    s.sessions = sessions.len();
                    s.session_bytes = sessions.bytes();
                });
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => break,
        };
        update(&stats, |s| s.state = WorkerState::Busy);
        let ok = serve(&mut assistant, &mut sessions, job, &outputs, &stats);
        sessions.expire(Instant::now());
        update(&stats, |s| {
            s.state = WorkerState::Ready;
            if ok {
                s.served += 1;
            } else {
                s.failed += 1;
            }
            s.sessions = sessions.len();
            s.session_bytes = sessions.bytes();
            s.snapshots = assistant.snapshots();
            s.sim_live = sim_live();
        });
    }
    tracing::info!("worker thread: queue closed, releasing the model");
    drop(assistant);
}

/// Serves one job to its end; true when the answer completed.
fn serve(
    assistant: &mut Assistant,
    sessions: &mut Sessions,
    mut job: Job,
    outputs: &Outputs,
    stats: &SharedStats,
) -> bool {
    let _span = tracing::info_span!("ask", request_id = %job.id).entered();
    let origin = job.plan.images.origin();
    let mut sink = TokenSink::new(&outputs.tokens, &job.id, &origin.frame_id);
    let result = match stopped_in_queue(&job) {
        Some(failure) => Err(failure),
        None => generate(assistant, sessions, &mut job.plan, &mut sink),
    };
    let prompt = std::mem::take(&mut job.plan.turn.text);
    let outcome = Outcome::new(job.id.clone(), prompt, origin.clone(), result);
    sink.finish(outcome.finish_reason());
    record_timings(stats, &outcome);
    if let Err(e) = outputs.answers.publish(&outcome.answer()) {
        tracing::warn!(error = %e, "could not publish the Answer");
    }
    log(&outcome);
    // The place is free before the client hears: it may reuse the id at once.
    job.admission.release();
    // The client may have gone away; nothing to do then.
    let _ = job.respond.send(outcome.response());
    outcome.succeeded()
}

/// A job cancelled or past its deadline before its turn came is answered without starting.
fn stopped_in_queue(job: &Job) -> Option<Failure> {
    let (code, reason) = if job.is_cancelled() {
        (ErrorCode::Cancelled, FinishReason::Cancelled)
    } else if job.is_past_deadline(Instant::now()) {
        (ErrorCode::Timeout, FinishReason::Timeout)
    } else {
        return None;
    };
    Some(Failure::new(
        code,
        format!("{reason} before generation started (while queued)"),
    ))
}

/// Asks the assistant, continuing and then parking the job's session if it has one.
fn generate(
    assistant: &mut Assistant,
    sessions: &mut Sessions,
    plan: &mut JobPlan,
    sink: &mut TokenSink<'_>,
) -> Result<Completion, Failure> {
    plan.turn.images = plan.images.take_inputs()?;
    // Only a turn that may be continued pays for a state snapshot.
    plan.turn.keep = plan.session_id.is_some();
    let conversation = plan.session_id.as_deref().and_then(|s| sessions.get(s));
    if plan.session_id.is_some() && conversation.is_none() {
        tracing::info!(session = ?plan.session_id, "new session");
    }
    let mut on_event = |e: Event| {
        if let Event::Text { text, reasoning } = e {
            sink.delta(text, reasoning);
        }
    };
    let reply = assistant
        .ask(conversation, &plan.turn, &mut on_event)
        .map_err(|e| Failure::from_assistant(&e))?;
    if let (Some(sid), Some(conv)) = (&plan.session_id, reply.conversation) {
        tracing::debug!(
            session = %sid,
            bytes = conv.size_bytes(),
            turns = conv.turns(),
            "session parked"
        );
        sessions.put(sid.clone(), conv, Instant::now());
    }
    Ok(reply.completion)
}

fn record_timings(stats: &SharedStats, outcome: &Outcome) {
    if let Some(c) = outcome.completion() {
        let f = Figures::of(c);
        update(stats, |s| {
            s.last_ttft_s = f.ttft_s;
            s.last_tokens_per_s = f.decode_tokens_per_s;
        });
    }
}

fn log(outcome: &Outcome) {
    if let Some(f) = outcome.failure() {
        tracing::warn!(code = f.code.as_str(), "ask failed: {}", f.message);
        return;
    }
    let f = outcome.figures();
    tracing::info!(
        finish = outcome.finish_reason().as_str(),
        prompt_tokens = f.prompt_tokens,
        completion_tokens = f.completion_tokens,
        ttft_s = f.ttft_s,
        tok_s = f.decode_tokens_per_s,
        "ask answered"
    );
}

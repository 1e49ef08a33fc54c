//! The worker thread: the only thread that touches the model (BPU handles are not `Send`).
//! It opens and warms the model, then takes jobs in arrival order; for each it streams the
//! deltas ([`TokenSink`]), publishes the `Answer` and hands the response back to the waiting
//! `/ask` task, all read from one [`Outcome`].
//!
//! What a failure leaves usable:
//! - a request that fails (an unreadable image, context overflow, a BPU error) fails alone;
//! - a panic while serving a request (runtime, sampler, kernel assert, message conversion) is
//!   contained ([`contained`]): that request fails with `backend_error` ("internal error: …")
//!   and still gets its `last` Token, its Answer and its response; then the backend state is
//!   reset, or, when that fails too, the model is dropped and opened again;
//! - a lost backend (a BPU task timed out, so the runtime refuses further runs) or a model
//!   that cannot be reopened ends the engine: the worker is marked failed, raises a runtime
//!   failure ([`fatal`]) and answers every queued and later job with `backend_error` until
//!   the node closes the queue.

use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use r2r::Publisher;
use vlm::assistant::{Assistant, AssistantError, BackendKind, ModelInfo};
use vlm::interrupt::Interrupt;
use vlm::stream::{Event, FinishReason};
use vlm::structured::JsonSchemas;
use vlm_bpu::OpenError;

use crate::fatal;
use crate::interface::ErrorCode;
use crate::job::{Job, JobPlan};
use crate::msgs::msg::{Answer, Token};
use crate::outcome::{Failure, Generated, Outcome};
use crate::panics::{contained, Panic};
use crate::prefill::{Chosen, PrefillConfig, PrefillStats, Prefiller, RunEnd};
use crate::sessions::Sessions;
use crate::test_hooks::{self, Site};
use crate::token_sink::TokenSink;

/// How often an idle worker expires sessions.
const IDLE_TICK: Duration = Duration::from_secs(1);

/// Worker life cycle, as diagnostics report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerState {
    Loading,
    Ready,
    Busy,
    /// Reopening the model after an internal error.
    Recovering,
    /// The engine cannot serve (never loaded, lost, or not reopened); the reason.
    Failed(String),
}

impl WorkerState {
    pub fn as_str(&self) -> &str {
        match self {
            Self::Loading => "loading",
            Self::Ready => "ready",
            Self::Busy => "busy",
            Self::Recovering => "recovering",
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
    /// Requests failed by a contained panic (counted in `failed` too).
    pub internal_errors: u64,
    pub last_ttft_s: f64,
    pub last_tokens_per_s: f64,
    pub sessions: usize,
    pub session_bytes: usize,
    /// Decode-state snapshots taken since the model was opened ([`Assistant::snapshots`]).
    pub snapshots: u64,
    /// Images sent through the vision tower since the model was opened
    /// ([`Assistant::images_encoded`]); a frame a session already holds is not sent again.
    pub images_encoded: u64,
    /// Simulator live buffers/tasks (`None` on the board or the CPU).
    pub sim_live: Option<(usize, usize)>,
    /// Latest-frame pre-fill counters (`None` when it is off).
    pub prefill: Option<PrefillStats>,
}

impl Default for WorkerStats {
    fn default() -> Self {
        Self {
            state: WorkerState::Loading,
            model: None,
            served: 0,
            failed: 0,
            internal_errors: 0,
            last_ttft_s: 0.0,
            last_tokens_per_s: 0.0,
            sessions: 0,
            session_bytes: 0,
            snapshots: 0,
            images_encoded: 0,
            sim_live: None,
            prefill: None,
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
    /// Latest-frame pre-fill (`None` when `prefill_latest_frame` is off or there is no vision).
    pub prefill: Option<PrefillConfig>,
}

/// The share of `session_memory_mb` the cached system blocks may hold; the sessions get the
/// rest, so both together stay within it.
fn prefix_budget(session_memory: usize) -> usize {
    session_memory / 4
}

/// Why the model could not be loaded, and whether a restart could help.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadFailure {
    pub message: String,
    /// `true`: the backend was lost or the code panicked while loading (a fresh process may
    /// succeed); `false`: the model cannot be loaded as configured.
    pub runtime: bool,
}

/// A loaded model as the rest of the node sees it.
pub struct Loaded {
    pub info: ModelInfo,
    /// The model's JSON-schema compiler (`Send + Sync`), token table built: request handlers
    /// compile a request's `json_schema` with it before queueing. It stays valid when the
    /// worker reopens the same model after an internal error (same tokenizer, same
    /// vocabulary).
    pub schemas: Arc<JsonSchemas>,
}

/// What the worker reports when loading ends.
pub type Ready = Result<Loaded, LoadFailure>;

/// Runs on the worker thread: `open` builds the assistant there (again after an internal
/// error, when resetting the backend is not enough), `ready` reports the outcome of loading,
/// then jobs are served until the channel closes. A panic that escapes everything below
/// (outside any request) fails the engine and the node.
pub fn run(
    open: impl FnMut() -> Result<Assistant, OpenError>,
    config: WorkerConfig,
    jobs: Receiver<Job>,
    outputs: Outputs,
    stats: SharedStats,
    ready: tokio::sync::oneshot::Sender<Ready>,
) {
    let shared = stats.clone();
    if let Err(p) = contained(|| serve_all(open, config, jobs, outputs, stats, ready)) {
        let reason = format!("the worker thread panicked outside any request: {p}");
        update(&shared, |s| s.state = WorkerState::Failed(reason.clone()));
        fatal::raise(reason);
    }
}

fn serve_all(
    mut open: impl FnMut() -> Result<Assistant, OpenError>,
    config: WorkerConfig,
    jobs: Receiver<Job>,
    outputs: Outputs,
    stats: SharedStats,
    ready: tokio::sync::oneshot::Sender<Ready>,
) {
    let mut assistant = match load(&mut open, &config) {
        Ok(a) => a,
        // Stopped by shutdown: not a failure of the model, so diagnostics do not say ERROR.
        Err(f) if config.interrupt.is_raised() => {
            tracing::info!("loading stopped by shutdown: {}", f.message);
            let _ = ready.send(Err(f));
            return;
        }
        Err(f) => {
            let msg = format!("model failed to load: {}", f.message);
            update(&stats, |s| s.state = WorkerState::Failed(msg));
            let _ = ready.send(Err(f));
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
    let schemas = assistant.json_schemas();
    // Built now (about a second for the 248k Qwen3.5 vocabulary) rather than by the first
    // request with a schema. A tokenizer it cannot use leaves the node serving free text;
    // each schema request is then refused with the reason.
    if let Err(e) = schemas.prepare() {
        tracing::warn!("constrained decoding (json_schema) is not available: {e}");
    }
    let _ = ready.send(Ok(Loaded {
        info: assistant.info().clone(),
        schemas,
    }));
    let mut sessions = Sessions::new(
        config.session_memory_bytes - prefix_budget(config.session_memory_bytes),
        config.session_idle,
    );
    let mut prefiller = config
        .prefill
        .clone()
        .map(|c| Prefiller::new(c, Instant::now()));
    // A job that stopped a pre-fill: served next, before anything else is taken.
    let mut pending: Option<Job> = None;
    loop {
        let wait = prefiller
            .as_ref()
            .map_or(IDLE_TICK, |p| p.wait(Instant::now(), IDLE_TICK));
        let next = match pending.take() {
            Some(j) => Ok(j),
            None if wait.is_zero() => jobs.try_recv().map_err(|e| match e {
                TryRecvError::Empty => RecvTimeoutError::Timeout,
                TryRecvError::Disconnected => RecvTimeoutError::Disconnected,
            }),
            None => jobs.recv_timeout(wait),
        };
        let mut job = match next {
            Ok(j) => j,
            Err(RecvTimeoutError::Timeout) => {
                if let Some(p) = prefiller.as_mut() {
                    let end = p.run(&mut assistant, &jobs, &mut pending, &config.interrupt);
                    match end {
                        RunEnd::Fine => {}
                        RunEnd::Lost(reason) => {
                            drop(assistant);
                            let reason = format!("the BPU backend is lost: {reason}");
                            return serve_failed(reason, pending, &jobs, &outputs, &stats);
                        }
                        RunEnd::Panicked(panic) => {
                            tracing::error!("latest-frame pre-fill panicked: {panic}");
                            assistant = match recover(assistant, &mut open, &config, &stats) {
                                Ok(a) => a,
                                Err(_) if config.interrupt.is_raised() => return,
                                Err(reason) => {
                                    return serve_failed(reason, pending, &jobs, &outputs, &stats)
                                }
                            };
                            p.forget();
                        }
                    }
                    let ps = p.stats();
                    update(&stats, |s| {
                        s.prefill = Some(ps);
                        s.snapshots = assistant.snapshots();
                        s.sim_live = sim_live();
                    });
                }
                sessions.expire(Instant::now());
                update(&stats, |s| {
                    s.sessions = sessions.len();
                    s.session_bytes = sessions.bytes();
                });
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => break,
        };
        let fresh = job
            .plan
            .session_id
            .as_deref()
            .is_none_or(|s| sessions.get(s).is_none());
        let stopped = stopped_in_queue(&job);
        // Only a job that runs is a pre-fill camera ask (and may park a stopped pre-fill).
        let chosen = prefiller
            .as_mut()
            .filter(|_| stopped.is_none())
            .and_then(|p| p.choose(&mut job.plan, fresh, &mut assistant));
        update(&stats, |s| s.state = WorkerState::Busy);
        let mut lost = None;
        let served = serve(job, &outputs, &stats, |plan, sink| match stopped {
            Some(failure) => Err(failure),
            None => {
                let prefill = chosen.zip(prefiller.as_mut());
                generate(
                    &mut assistant,
                    &mut sessions,
                    plan,
                    sink,
                    &mut lost,
                    prefill,
                )
            }
        });
        sessions.expire(Instant::now());
        let snapshots = assistant.snapshots();
        let images_encoded = assistant.images_encoded();
        let prefill_stats = prefiller.as_ref().map(Prefiller::stats);
        update(&stats, |s| {
            s.prefill = prefill_stats;
            if served.ok {
                s.served += 1;
            } else {
                s.failed += 1;
            }
            if served.panic.is_some() {
                s.internal_errors += 1;
            }
            s.sessions = sessions.len();
            s.session_bytes = sessions.bytes();
            s.snapshots = snapshots;
            s.images_encoded = images_encoded;
        });
        if let Some(reason) = lost {
            // hbdnn keeps what the hung task may still write; dropping releases the rest.
            drop(assistant);
            let reason = format!("the BPU backend is lost: {reason}");
            return serve_failed(reason, None, &jobs, &outputs, &stats);
        }
        if served.panic.is_some() {
            assistant = match recover(assistant, &mut open, &config, &stats) {
                Ok(a) => a,
                // A reopen stopped by shutdown is no failure: the node is stopping anyway.
                Err(reason) if config.interrupt.is_raised() => {
                    tracing::info!("shutdown while reopening the model: {reason}");
                    return;
                }
                Err(reason) => return serve_failed(reason, None, &jobs, &outputs, &stats),
            };
            // What was pre-filled lived in the state the failure may have left half-made (or
            // in the model now reopened): pre-fills start over.
            if let Some(p) = prefiller.as_mut() {
                p.forget();
            }
        }
        update(&stats, |s| {
            s.state = WorkerState::Ready;
            s.sim_live = sim_live();
        });
    }
    tracing::info!("worker thread: queue closed, releasing the model");
    drop(assistant);
}

/// Opens and warms the model; a panic in either is a load failure, not a dead thread.
fn load(
    open: &mut impl FnMut() -> Result<Assistant, OpenError>,
    config: &WorkerConfig,
) -> Result<Assistant, LoadFailure> {
    let loaded = contained(|| {
        let mut a = open()?;
        a.warm_up(config.warm_up_system.clone(), &config.interrupt)?;
        a.set_prefix_budget(prefix_budget(config.session_memory_bytes));
        Ok::<_, OpenError>(a)
    });
    match loaded {
        Ok(Ok(a)) => Ok(a),
        Ok(Err(e)) => Err(LoadFailure {
            message: e.to_string(),
            runtime: matches!(&e, OpenError::Assistant(a) if backend_lost(a)),
        }),
        Err(p) => Err(LoadFailure {
            message: format!("internal error while loading: {p}"),
            runtime: true,
        }),
    }
}

fn backend_lost(e: &AssistantError) -> bool {
    matches!(e, AssistantError::Engine(e) if e.backend_is_lost())
}

/// After a contained panic nothing about the decode state can be trusted: it is reset (the
/// parked sessions and the cached system prefix are snapshots and stay valid). When the reset
/// fails or panics too, the model is dropped and opened again. `Err`: the engine cannot go on.
fn recover(
    mut assistant: Assistant,
    open: &mut impl FnMut() -> Result<Assistant, OpenError>,
    config: &WorkerConfig,
    stats: &SharedStats,
) -> Result<Assistant, String> {
    let reset = contained(|| {
        test_hooks::point(Site::Reset);
        assistant.reset_state()
    });
    match reset {
        Ok(Ok(())) => {
            tracing::info!("backend state reset after an internal error");
            return Ok(assistant);
        }
        Ok(Err(e)) if e.backend_is_lost() => return Err(format!("the BPU backend is lost: {e}")),
        Ok(Err(e)) => tracing::warn!("resetting the backend failed ({e}); reopening the model"),
        Err(p) => tracing::warn!("resetting the backend panicked ({p}); reopening the model"),
    }
    update(stats, |s| s.state = WorkerState::Recovering);
    // The old model goes first: its BPU memory and the engine lock are needed again.
    if let Err(p) = contained(move || drop(assistant)) {
        tracing::warn!("releasing the old model panicked: {p}");
    }
    let a = load(open, config).map_err(|f| {
        format!(
            "the model could not be reopened after an internal error: {}",
            f.message
        )
    })?;
    tracing::warn!("model reopened after an internal error");
    update(stats, |s| s.model = Some(a.info().clone()));
    Ok(a)
}

/// The engine is gone: marks the worker failed, raises the runtime failure, and answers
/// every queued and later job with `backend_error` until the node closes the queue — a job
/// the shutdown cancelled meanwhile too: the failure is why it was not served.
fn serve_failed(
    reason: String,
    pending: Option<Job>,
    jobs: &Receiver<Job>,
    outputs: &Outputs,
    stats: &SharedStats,
) {
    update(stats, |s| s.state = WorkerState::Failed(reason.clone()));
    fatal::raise(reason.clone());
    for job in pending
        .into_iter()
        .chain(std::iter::from_fn(|| jobs.recv().ok()))
    {
        let failure = Failure::new(
            ErrorCode::BackendError,
            format!("the engine has failed and the node is restarting: {reason}"),
        );
        serve(job, outputs, stats, |_, _| Err(failure));
        update(stats, |s| s.failed += 1);
    }
    tracing::info!("worker thread: queue closed after the engine failed");
}

/// How serving one job went.
struct Served {
    /// The answer completed.
    ok: bool,
    /// A panic was contained while serving it.
    panic: Option<Panic>,
}

/// Serves one job to its end: `generate` (contained) gives the result, from which the last
/// Token, the Answer and the response are sent — after a panic too, each exactly once.
fn serve(
    job: Job,
    outputs: &Outputs,
    stats: &SharedStats,
    generate: impl FnOnce(&mut JobPlan, &mut TokenSink<'_>) -> Result<Generated, Failure>,
) -> Served {
    let _span = tracing::info_span!("ask", request_id = %job.id).entered();
    let Job {
        id,
        mut plan,
        admission,
        respond,
        feedback,
    } = job;
    let origin = plan.images.origin();
    let mut sink =
        TokenSink::new(&outputs.tokens, &id, &origin.frame_id).with_feedback(feedback.as_ref());
    let mut answered = false;
    let run = contained(|| {
        let result = generate(&mut plan, &mut sink);
        let prompt = std::mem::take(&mut plan.turn.text);
        let outcome = Outcome::new(id.clone(), prompt, origin.clone(), result);
        send_messages(&outcome, &mut sink, &mut answered, outputs, stats);
        outcome
    });
    let (outcome, panic) = match run {
        Ok(outcome) => (outcome, None),
        Err(p) => {
            let failure = Failure::new(ErrorCode::BackendError, format!("internal error: {p}"));
            let prompt = std::mem::take(&mut plan.turn.text);
            let outcome = Outcome::new(id.clone(), prompt, origin.clone(), Err(failure));
            let sent =
                contained(|| send_messages(&outcome, &mut sink, &mut answered, outputs, stats));
            if let Err(p) = sent {
                tracing::error!("the messages of a failed request could not be sent: {p}");
            }
            (outcome, Some(p))
        }
    };
    log(&outcome);
    // The place is free before the client hears: it may reuse the id at once.
    admission.release();
    // The client may have gone away; nothing to do then.
    let _ = respond.send(outcome.response());
    Served {
        ok: outcome.succeeded(),
        panic,
    }
}

/// The last Token and the Answer of `outcome`; each goes out once however often this runs.
fn send_messages(
    outcome: &Outcome,
    sink: &mut TokenSink<'_>,
    answered: &mut bool,
    outputs: &Outputs,
    stats: &SharedStats,
) {
    sink.finish(outcome.finish_reason());
    record_timings(stats, outcome);
    if !*answered {
        if let Err(e) = outputs.answers.publish(&outcome.answer()) {
            tracing::warn!(error = %e, "could not publish the Answer");
        }
        *answered = true;
    }
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

/// Asks the assistant, continuing and then parking the job's session if it has one. A lost
/// backend is reported through `lost` besides failing the request.
fn generate(
    assistant: &mut Assistant,
    sessions: &mut Sessions,
    plan: &mut JobPlan,
    sink: &mut TokenSink<'_>,
    lost: &mut Option<String>,
    prefill: Option<(Chosen, &mut Prefiller)>,
) -> Result<Generated, Failure> {
    // Only a turn that may be continued pays for a state snapshot.
    plan.turn.keep = plan.session_id.is_some();
    let conversation = plan.session_id.as_deref().and_then(|s| sessions.get(s));
    // A completed pre-fill holds the frame's image: only its key is needed, and the frame is
    // not converted again on the way to the first token.
    let prefilled_frame =
        matches!(prefill, Some((Chosen::Completed(_), _))) && conversation.is_none();
    match plan.images.camera_key().filter(|_| prefilled_frame) {
        Some(key) => plan.turn.image_keys = vec![Some(key)],
        None => (plan.turn.images, plan.turn.image_keys) = plan.images.take_inputs()?,
    }
    if plan.session_id.is_some() && conversation.is_none() {
        tracing::info!(session = ?plan.session_id, "new session");
    }
    let mut first = true;
    let mut on_event = |e: Event| {
        if let Event::Text { text, reasoning } = e {
            if std::mem::take(&mut first) {
                test_hooks::point(Site::Serve);
            }
            sink.delta(text, reasoning);
        }
    };
    // Served from a pre-fill only as a fresh conversation; otherwise (or when the pre-fill
    // cannot go on) as without it, on the frame `choose` put in the plan.
    let prefilled = match prefill {
        Some((chosen, p)) if conversation.is_none() => {
            p.answer(chosen, assistant, &plan.turn, &mut on_event)
        }
        _ => None,
    };
    let reply = prefilled
        .unwrap_or_else(|| assistant.ask(conversation, &plan.turn, &mut on_event))
        .map_err(|e| {
            if backend_lost(&e) {
                *lost = Some(e.to_string());
            }
            Failure::from_assistant(&e)
        })?;
    let incomplete = reply.is_incomplete();
    // An unfinished JSON value fails its request, so like a cancelled answer it is not
    // parked: the session goes on from its previous turn.
    let conversation = reply.conversation.filter(|_| !incomplete);
    if let (Some(sid), Some(conv)) = (&plan.session_id, conversation) {
        tracing::debug!(
            session = %sid,
            bytes = conv.size_bytes(),
            turns = conv.turns(),
            "session parked"
        );
        sessions.put(sid.clone(), conv, Instant::now());
    }
    Ok(Generated {
        completion: reply.completion,
        incomplete,
    })
}

fn record_timings(stats: &SharedStats, outcome: &Outcome) {
    if outcome.completion().is_some() {
        let f = outcome.figures();
        let (ttft_s, tok_s) = (f.ttft_s, f.decode_tokens_per_s);
        update(stats, |s| {
            s.last_ttft_s = ttft_s;
            s.last_tokens_per_s = tok_s;
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

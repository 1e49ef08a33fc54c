//! The worker thread: the only thread that touches the model (BPU handles are not `Send`).
//! It opens and warms the model, then takes jobs in arrival order; for each it streams the
//! deltas ([`TokenSink`]), publishes the `Answer` and hands the response back to the waiting
//! `/ask` task ([`serve`]).
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

use std::ops::ControlFlow;
use std::sync::mpsc::{Receiver, RecvTimeoutError, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vlm::assistant::{Assistant, AssistantError, BackendKind, ModelInfo};
use vlm::interrupt::Interrupt;
use vlm::stream::Event;
use vlm::structured::JsonSchemas;
use vlm_bpu::OpenError;

use crate::interface::ErrorCode;
use crate::process::fatal;
use crate::process::panics::contained;
use crate::process::test_hooks::{self, Site};
use crate::serve::deliver::{serve, stopped_in_queue, Outputs, Served};
use crate::serve::detections;
use crate::serve::failure::Failure;
use crate::serve::job::{Job, JobPlan};
use crate::serve::outcome::Generated;
use crate::serve::priming::{Chosen, Primer, PrimingConfig, PrimingEnd};
use crate::serve::sessions::Sessions;
use crate::serve::stats::{update, SharedStats, WorkerState};
use crate::serve::token_sink::TokenSink;

/// How often an idle worker expires sessions.
const IDLE_TICK: Duration = Duration::from_secs(1);

/// Settings of the worker thread.
pub struct WorkerConfig {
    pub session_memory_bytes: usize,
    pub session_idle: Duration,
    pub warm_up_system: Option<String>,
    /// Raised at shutdown: loading and warm-up stop at the next step or graph call.
    pub interrupt: Interrupt,
    /// Frame priming (`None` when `prefill_latest_frame` is off or there is no vision).
    pub prefill: Option<PrimingConfig>,
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
    let Some(assistant) = start(&mut open, &config, &stats, ready) else {
        return;
    };
    let mut worker = Worker {
        on_sim: assistant.info().backend == BackendKind::BpuSim,
        sessions: Sessions::new(
            config.session_memory_bytes - prefix_budget(config.session_memory_bytes),
            config.session_idle,
        ),
        prefiller: config
            .prefill
            .clone()
            .map(|c| Primer::new(c, Instant::now())),
        pending: None,
        open: &mut open,
        config: &config,
        jobs: &jobs,
        outputs: &outputs,
        stats: &stats,
    };
    worker.serve_jobs(assistant);
}

/// Loads the model and reports how that went through `ready`; `None` when it did not load.
fn start(
    open: &mut impl FnMut() -> Result<Assistant, OpenError>,
    config: &WorkerConfig,
    stats: &SharedStats,
    ready: tokio::sync::oneshot::Sender<Ready>,
) -> Option<Assistant> {
    let assistant = match load(open, config) {
        Ok(a) => a,
        // Stopped by shutdown: not a failure of the model, so diagnostics do not say ERROR.
        Err(f) if config.interrupt.is_raised() => {
            tracing::info!("loading stopped by shutdown: {}", f.message);
            let _ = ready.send(Err(f));
            return None;
        }
        Err(f) => {
            let msg = format!("model failed to load: {}", f.message);
            update(stats, |s| s.state = WorkerState::Failed(msg));
            let _ = ready.send(Err(f));
            return None;
        }
    };
    let on_sim = assistant.info().backend == BackendKind::BpuSim;
    update(stats, |s| {
        s.state = WorkerState::Ready;
        s.model = Some(assistant.info().clone());
        s.snapshots = assistant.snapshots();
        s.sim_live = sim_live(on_sim);
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
    Some(assistant)
}

/// Simulator live buffers and tasks (`None` off the simulator).
fn sim_live(on_sim: bool) -> Option<vlm_bpu::sim::LiveHandles> {
    on_sim.then(vlm_bpu::sim::live_handles)
}

/// What the worker loop keeps between jobs, beside the model it hands from step to step.
struct Worker<'a, O> {
    open: &'a mut O,
    config: &'a WorkerConfig,
    jobs: &'a Receiver<Job>,
    outputs: &'a Outputs,
    stats: &'a SharedStats,
    on_sim: bool,
    sessions: Sessions,
    prefiller: Option<Primer>,
    /// A job that stopped a priming: served next, before anything else is taken.
    pending: Option<Job>,
}

impl<O: FnMut() -> Result<Assistant, OpenError>> Worker<'_, O> {
    /// Serves jobs until the queue closes or the engine cannot go on. Each step hands the
    /// model back, or `Break` once it is gone (released, or the worker stops).
    fn serve_jobs(&mut self, mut assistant: Assistant) {
        loop {
            let step = match self.next_job() {
                Ok(job) => self.serve_job(assistant, job),
                Err(RecvTimeoutError::Timeout) => self.idle(assistant),
                Err(RecvTimeoutError::Disconnected) => break,
            };
            assistant = match step {
                ControlFlow::Continue(a) => a,
                ControlFlow::Break(()) => return,
            };
        }
        tracing::info!("worker thread: queue closed, releasing the model");
        drop(assistant);
        // What the simulator still holds once the model is gone (a cleanup's proof).
        update(self.stats, |s| s.sim_live = sim_live(self.on_sim));
    }

    /// The next job: the one a priming parked, else the queue's, waiting no longer than the
    /// priming (or the idle tick) allows.
    fn next_job(&mut self) -> Result<Job, RecvTimeoutError> {
        let wait = self
            .prefiller
            .as_ref()
            .map_or(IDLE_TICK, |p| p.wait(Instant::now(), IDLE_TICK));
        match self.pending.take() {
            Some(j) => Ok(j),
            None if wait.is_zero() => self.jobs.try_recv().map_err(|e| match e {
                TryRecvError::Empty => RecvTimeoutError::Timeout,
                TryRecvError::Disconnected => RecvTimeoutError::Disconnected,
            }),
            None => self.jobs.recv_timeout(wait),
        }
    }

    /// No job came: priming the latest frame (if on), then expire idle sessions.
    fn idle(&mut self, mut assistant: Assistant) -> ControlFlow<(), Assistant> {
        if let Some(p) = self.prefiller.as_mut() {
            let end = p.run(
                &mut assistant,
                self.jobs,
                &mut self.pending,
                &self.config.interrupt,
            );
            match end {
                PrimingEnd::Fine => {}
                PrimingEnd::Lost(reason) => {
                    drop(assistant);
                    let reason = format!("the BPU backend is lost: {reason}");
                    let pending = self.pending.take();
                    let to = self.failed_outputs();
                    serve_failed(reason, pending, self.jobs, to);
                    return ControlFlow::Break(());
                }
                PrimingEnd::Panicked(panic) => {
                    tracing::error!("frame priming panicked: {panic}");
                    assistant = match recover(assistant, self.open, self.config, self.stats) {
                        Ok(a) => a,
                        Err(reason) if self.config.interrupt.is_raised() => {
                            self.stopped_by_shutdown(&reason);
                            return ControlFlow::Break(());
                        }
                        Err(reason) => {
                            let pending = self.pending.take();
                            let to = self.failed_outputs();
                            serve_failed(reason, pending, self.jobs, to);
                            return ControlFlow::Break(());
                        }
                    };
                    p.forget();
                }
            }
            let ps = p.stats();
            let sim = sim_live(self.on_sim);
            update(self.stats, |s| {
                s.prefill = Some(ps);
                s.snapshots = assistant.snapshots();
                s.sim_live = sim;
            });
        }
        self.sessions.expire(Instant::now());
        self.count_sessions();
        ControlFlow::Continue(assistant)
    }

    /// Serves `job` (from a priming when one fits), then counts it and, after a contained
    /// panic or a lost backend, recovers or ends the engine.
    fn serve_job(&mut self, mut assistant: Assistant, mut job: Job) -> ControlFlow<(), Assistant> {
        let session_turn = self.sessions.turn(job.plan.session_id.as_deref());
        let fresh = session_turn <= 1;
        let stopped = stopped_in_queue(&job);
        // Only a job that runs is a priming camera ask (and may park a stopped priming).
        let chosen = self
            .prefiller
            .as_mut()
            .filter(|_| stopped.is_none())
            .and_then(|p| p.choose(&mut job.plan, fresh, &mut assistant));
        update(self.stats, |s| s.state = WorkerState::Busy);
        let mut lost = None;
        let (sessions, prefiller) = (&mut self.sessions, &mut self.prefiller);
        let served = serve(
            job,
            session_turn,
            self.outputs,
            self.stats,
            |plan, sink| match stopped {
                Some(failure) => Err(failure),
                None => {
                    let prefill = chosen.zip(prefiller.as_mut());
                    generate(&mut assistant, sessions, plan, sink, &mut lost, prefill)
                }
            },
        );
        self.count(&served, &assistant);
        if let Some(reason) = lost {
            // hbdnn keeps what the hung task may still write; dropping releases the rest.
            drop(assistant);
            let reason = format!("the BPU backend is lost: {reason}");
            serve_failed(reason, None, self.jobs, self.failed_outputs());
            return ControlFlow::Break(());
        }
        if served.panic.is_some() {
            assistant = match self.after_panic(assistant) {
                ControlFlow::Continue(a) => a,
                ControlFlow::Break(()) => return ControlFlow::Break(()),
            };
        }
        let sim = sim_live(self.on_sim);
        update(self.stats, |s| {
            s.state = WorkerState::Ready;
            s.sim_live = sim;
        });
        ControlFlow::Continue(assistant)
    }

    /// The counters after a served job.
    fn count(&mut self, served: &Served, assistant: &Assistant) {
        self.sessions.expire(Instant::now());
        let snapshots = assistant.snapshots();
        let images_encoded = assistant.images_encoded();
        let prefill_stats = self.prefiller.as_ref().map(Primer::stats);
        self.count_sessions();
        update(self.stats, |s| {
            s.prefill = prefill_stats;
            if served.ok {
                s.served += 1;
            } else {
                s.failed += 1;
            }
            if served.panic.is_some() {
                s.internal_errors += 1;
            }
            s.snapshots = snapshots;
            s.images_encoded = images_encoded;
        });
    }

    /// The session counters as diagnostics report them.
    fn count_sessions(&self) {
        let s = &self.sessions;
        let (n, bytes, evicted, expired) = (s.len(), s.bytes(), s.evicted(), s.expired());
        update(self.stats, |s| {
            s.sessions = n;
            s.session_bytes = bytes;
            s.sessions_evicted = evicted;
            s.sessions_expired = expired;
        });
    }

    /// Where [`serve_failed`] answers the jobs left.
    fn failed_outputs(&self) -> FailedOutputs<'_> {
        FailedOutputs {
            outputs: self.outputs,
            stats: self.stats,
            sessions: &self.sessions,
        }
    }

    /// A reopen stopped by shutdown: no failure (the node is stopping anyway), and every
    /// parked and queued job is answered as cancelled, with its last Token and its Answer
    /// like any other cancelled request, until the node closes the queue.
    fn stopped_by_shutdown(&mut self, reason: &str) {
        tracing::info!("shutdown while reopening the model: {reason}");
        for job in self
            .pending
            .take()
            .into_iter()
            .chain(std::iter::from_fn(|| self.jobs.recv().ok()))
        {
            // The shutdown's cancel may not have reached this job yet: it is cancelled all
            // the same, as the node stops without serving it.
            let failure = stopped_in_queue(&job).unwrap_or_else(|| {
                Failure::new(
                    ErrorCode::Cancelled,
                    "cancelled before generation started (the node is shutting down)",
                )
            });
            let turn = self.sessions.turn(job.plan.session_id.as_deref());
            serve(job, turn, self.outputs, self.stats, |_, _| Err(failure));
            update(self.stats, |s| s.failed += 1);
        }
        tracing::info!("worker thread: queue closed while stopping");
    }

    /// After a contained panic: the model reset or reopened, or `Break` when it cannot be.
    fn after_panic(&mut self, assistant: Assistant) -> ControlFlow<(), Assistant> {
        let assistant = match recover(assistant, self.open, self.config, self.stats) {
            Ok(a) => a,
            // A reopen stopped by shutdown is no failure: the node is stopping anyway.
            Err(reason) if self.config.interrupt.is_raised() => {
                self.stopped_by_shutdown(&reason);
                return ControlFlow::Break(());
            }
            Err(reason) => {
                serve_failed(reason, None, self.jobs, self.failed_outputs());
                return ControlFlow::Break(());
            }
        };
        // What was primed lived in the state the failure may have left half-made (or
        // in the model now reopened): primings start over.
        if let Some(p) = self.prefiller.as_mut() {
            p.forget();
        }
        ControlFlow::Continue(assistant)
    }
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
fn serve_failed(reason: String, pending: Option<Job>, jobs: &Receiver<Job>, to: FailedOutputs<'_>) {
    let FailedOutputs {
        outputs,
        stats,
        sessions,
    } = to;
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
        let turn = sessions.turn(job.plan.session_id.as_deref());
        serve(job, turn, outputs, stats, |_, _| Err(failure));
        update(stats, |s| s.failed += 1);
    }
    tracing::info!("worker thread: queue closed after the engine failed");
}

/// What [`serve_failed`] answers with: the job's messages go to `outputs`, its counts to
/// `stats`, and its `session_turn` is read from `sessions` (the turn it would have been).
struct FailedOutputs<'a> {
    outputs: &'a Outputs,
    stats: &'a SharedStats,
    sessions: &'a Sessions,
}

/// Asks the assistant, continuing and then parking the job's session if it has one. A lost
/// backend is reported through `lost` besides failing the request.
fn generate(
    assistant: &mut Assistant,
    sessions: &mut Sessions,
    plan: &mut JobPlan,
    sink: &mut TokenSink<'_>,
    lost: &mut Option<String>,
    prefill: Option<(Chosen, &mut Primer)>,
) -> Result<Generated, Failure> {
    // Only a turn that may be continued pays for a state snapshot.
    plan.turn.keep = plan.session_id.is_some();
    let conversation = plan.session_id.as_deref().and_then(|s| sessions.get(s));
    // A completed priming holds the frame's image: only its key is needed, and the frame is
    // not converted again on the way to the first token.
    let prefilled_frame = matches!(prefill, Some((Chosen::Completed(_) | Chosen::Prime(_), _)))
        && conversation.is_none();
    match plan.images.camera_key().filter(|_| prefilled_frame) {
        Some(key) => plan.turn.image_keys = vec![Some(key)],
        None => {
            (plan.turn.images, plan.turn.image_keys) = plan.images.take_inputs(Some(&plan.turn))?
        }
    }
    // The id is a client's secret: it is not logged.
    if plan.session_id.is_some() && conversation.is_none() {
        tracing::info!("new session");
    }
    detections::share_scores(plan, assistant, sink.feedback());
    let mut first = true;
    let mut on_event = |e: Event| {
        if let Event::Text { text, reasoning } = e {
            if std::mem::take(&mut first) {
                test_hooks::point(Site::Serve);
            }
            sink.delta(text, reasoning);
        }
    };
    // Served from a priming only as a fresh conversation; otherwise (or when the priming
    // cannot go on) as without it, on the frame `choose` put in the plan.
    detections::fit(plan, assistant)?;
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
    detections::collect(plan, &reply, assistant);
    let incomplete = reply.is_incomplete();
    // An unfinished JSON value fails its request, so like a cancelled answer it is not
    // parked: the session goes on from its previous turn.
    let conversation = reply.conversation.filter(|_| !incomplete);
    if let (Some(sid), Some(conv)) = (&plan.session_id, conversation) {
        tracing::debug!(
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

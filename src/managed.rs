//! What each lifecycle step does to this node (`crate::ros::lifecycle` serves the protocol;
//! docs/lifecycle.md says what each state means):
//! - configure opens the model the parameters in force name on a fresh `vlm-worker` thread
//!   (libraries, graphs, cache sets, warm-up, calibration) and opens the ask queue;
//! - activate / deactivate start / stop serving: a deactivate answers the queued requests
//!   `cancelled`, lets the running one finish up to `deactivate_timeout_s`, then cancels it;
//!   frame priming runs only while active;
//! - cleanup, shutdown and error processing close the queue and end the worker thread, which
//!   releases every BPU buffer, task and model, and the engine's lock file.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use camera_frame::CameraCache;
use r2r::Publisher;
use vlm::interrupt::Interrupt;

use crate::model;
use crate::msgs::msg::{Answer, Token};
use crate::process::fatal;
use crate::request::context::AskContext;
use crate::ros::clock::RosClock;
use crate::ros::lifecycle::{Driver, Outcome, Step};
use crate::ros::param_server::LiveParams;
use crate::ros::params::Params;
use crate::ros::text::NulCount;
use crate::serve::deliver::Outputs;
use crate::serve::priming::PrimingConfig;
use crate::serve::stats::{update, SharedStats, WorkerState};
use crate::serve::worker::{self, LoadFailure, Ready, WorkerConfig};

/// Name of the thread that owns the model.
pub(crate) const WORKER_THREAD: &str = "vlm-worker";

/// How often a deactivate looks whether the running request has finished.
const DRAIN_POLL: Duration = Duration::from_millis(20);

/// What a worker thread publishes to (cloned for each configure).
pub(crate) struct WorkerOutputs {
    pub tokens: Publisher<Token>,
    pub answers: Publisher<Answer>,
    pub clock: RosClock,
    pub nuls: NulCount,
}

/// A running worker thread as the engine holds it.
struct WorkerThread {
    thread: JoinHandle<()>,
    /// How loading ended (taken by the configure that waits for it).
    ready: Option<tokio::sync::oneshot::Receiver<Ready>>,
}

/// The node's engine: the model's worker thread, opened and released on command.
pub(crate) struct Engine {
    pub live: LiveParams,
    pub cameras: Option<Arc<CameraCache>>,
    pub stats: SharedStats,
    pub ask_ctx: Arc<AskContext>,
    /// Behind a lock: a publisher is `Send`, not `Sync`.
    outputs: Mutex<WorkerOutputs>,
    /// Whether frame priming may run (lifecycle `active`).
    serving: Arc<AtomicBool>,
    worker: tokio::sync::Mutex<Option<WorkerThread>>,
    /// The loading worker's interrupt, raisable while a configure holds `worker`.
    interrupt: Mutex<Option<Interrupt>>,
    /// The last configure's failure (autostart turns it into the exit code).
    failure: Mutex<Option<LoadFailure>>,
    /// Raised once the node reached `finalized`: the process ends.
    finalized: tokio::sync::Notify,
}

impl Engine {
    pub(crate) fn new(
        live: LiveParams,
        cameras: Option<Arc<CameraCache>>,
        stats: SharedStats,
        ask_ctx: Arc<AskContext>,
        outputs: WorkerOutputs,
    ) -> Self {
        Self {
            live,
            cameras,
            stats,
            ask_ctx,
            outputs: Mutex::new(outputs),
            serving: Arc::new(AtomicBool::new(false)),
            worker: tokio::sync::Mutex::new(None),
            interrupt: Mutex::new(None),
            failure: Mutex::new(None),
            finalized: tokio::sync::Notify::new(),
        }
    }

    /// Why the last configure failed, if it did.
    pub(crate) fn take_failure(&self) -> Option<LoadFailure> {
        self.failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// Returns once the node reached `finalized` (a shutdown transition).
    pub(crate) async fn wait_finalized(&self) {
        self.finalized.notified().await;
    }

    /// Stops a loading model at its next step (shutdown).
    pub(crate) fn interrupt(&self) {
        if let Some(i) = self
            .interrupt
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            i.raise();
        }
    }

    /// Opens the model on a fresh worker thread and waits until it is loaded.
    async fn configure(&self) -> Outcome {
        let p = self.live.snapshot();
        let mut worker = self.worker.lock().await;
        let failed = |f: LoadFailure| {
            let outcome = if f.runtime {
                Outcome::Error
            } else {
                Outcome::Failure
            };
            tracing::error!("the model could not be loaded: {}", f.message);
            *self.failure.lock().unwrap_or_else(|e| e.into_inner()) = Some(f);
            outcome
        };
        if let Err(e) = p.require_model() {
            return failed(LoadFailure {
                message: e.to_string(),
                runtime: false,
            });
        }
        update(&self.stats, |s| s.state = WorkerState::Loading);
        let (jobs, thread, interrupt) = match self.start_worker(&p) {
            Ok(started) => started,
            Err(e) => {
                return failed(LoadFailure {
                    message: format!("could not start the {WORKER_THREAD} thread: {e}"),
                    runtime: true,
                })
            }
        };
        *self.interrupt.lock().unwrap_or_else(|e| e.into_inner()) = Some(interrupt);
        let w = worker.insert(thread);
        let ready = w.ready.take();
        let loaded = match ready {
            Some(r) => wait_loaded(r).await,
            None => Err(stopped_early()),
        };
        match loaded {
            Ok(l) => {
                self.ask_ctx.open(jobs, l.schemas);
                tracing::info!("model {} loaded on {}", l.info.name, l.info.backend);
                Outcome::Success
            }
            Err(f) => {
                drop(jobs);
                if release(worker.take(), &self.stats).await.is_err() {
                    tracing::error!("the {WORKER_THREAD} thread panicked");
                }
                failed(f)
            }
        }
    }

    /// Starts the `vlm-worker` thread, which opens the model there and serves the queue.
    fn start_worker(
        &self,
        p: &Arc<Params>,
    ) -> std::io::Result<(
        mpsc::Sender<crate::serve::job::Job>,
        WorkerThread,
        Interrupt,
    )> {
        let (job_tx, job_rx) = mpsc::channel();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let interrupt = Interrupt::new();
        let config = WorkerConfig {
            session_memory_bytes: p.session_memory_bytes,
            // Checked > 0 when the parameters were read.
            session_idle: p.session_idle().unwrap_or(Duration::from_secs(600)),
            warm_up_system: p.system_prompt.clone(),
            interrupt: interrupt.clone(),
            prefill: self
                .cameras
                .clone()
                .filter(|_| p.prefill_latest_frame)
                .map(|cameras| PrimingConfig {
                    cameras,
                    camera: p.prefill_camera.clone(),
                    duty: p.prefill_duty,
                    // Checked finite and >= 0; a value past Duration's range means no limit.
                    max_age: Duration::try_from_secs_f64(p.prefill_max_age_s)
                        .unwrap_or(Duration::MAX),
                    params: self.live.clone(),
                    ask_priority: p.bpu_priority,
                    serving: self.serving.clone(),
                    scene_check: p.scene_check,
                    settle: Duration::try_from_secs_f64(p.scene_settle_s).unwrap_or(Duration::MAX),
                }),
        };
        let outputs = {
            let o = self.outputs.lock().unwrap_or_else(|e| e.into_inner());
            Outputs {
                tokens: Box::new(o.tokens.clone()),
                answers: Box::new(o.answers.clone()),
                clock: o.clock.clone(),
                nuls: o.nuls.clone(),
            }
        };
        let stats = self.stats.clone();
        let p = p.clone();
        let open_interrupt = interrupt.clone();
        let thread = std::thread::Builder::new()
            .name(WORKER_THREAD.to_owned())
            .spawn(move || {
                let open = || model::open(&p, &open_interrupt);
                worker::run(open, config, job_rx, outputs, stats, ready_tx);
            })?;
        let thread = WorkerThread {
            thread,
            ready: Some(ready_rx),
        };
        Ok((job_tx, thread, interrupt))
    }

    /// Stops serving: queued requests are cancelled at once, the running one may finish
    /// within `deactivate_timeout_s`, then it is cancelled too; returns once none is live.
    async fn deactivate(&self) {
        self.serving.store(false, Ordering::Release);
        let registry = &self.ask_ctx.registry;
        // Watch evaluations are not let finish: their goals end (`crate::request::watch`).
        let watches = &self.ask_ctx.watches;
        watches.end_all();
        let queued = registry.cancel_waiting();
        if queued > 0 {
            tracing::info!(queued, "deactivate: queued requests cancelled");
        }
        let timeout = self.live.snapshot().deactivate_timeout();
        let until = Instant::now() + timeout;
        let live = || !registry.is_empty() || !watches.registry.is_empty();
        while live() && Instant::now() < until {
            tokio::time::sleep(DRAIN_POLL).await;
        }
        if live() {
            let n = registry.cancel_all() + watches.registry.cancel_all();
            tracing::info!(live = n, "deactivate: the running request is cancelled");
            while live() {
                tokio::time::sleep(DRAIN_POLL).await;
            }
        }
    }

    /// Closes the queue, cancels what is live and ends the worker thread: the model and
    /// every BPU buffer and task it held are released.
    pub(crate) async fn release(&self) -> Result<(), ()> {
        self.serving.store(false, Ordering::Release);
        self.interrupt();
        // The worker's lock first: a configure still finishing (past its last interruptible
        // step) opens the queue under it, and a queue closed before that would be open again
        // and the worker never see its end.
        let mut guard = self.worker.lock().await;
        self.ask_ctx.close();
        self.ask_ctx.watches.end_all();
        let live = self.ask_ctx.registry.cancel_all();
        if live > 0 {
            tracing::info!(live, "cancelled live requests");
        }
        let worker = guard.take();
        drop(guard);
        let joined = release(worker, &self.stats).await;
        *self.interrupt.lock().unwrap_or_else(|e| e.into_inner()) = None;
        joined
    }
}

fn stopped_early() -> LoadFailure {
    LoadFailure {
        message: "the worker thread stopped before the model was loaded".into(),
        runtime: true,
    }
}

/// How loading ended: the worker's report, or a runtime failure raised meanwhile.
async fn wait_loaded(ready: tokio::sync::oneshot::Receiver<Ready>) -> Ready {
    tokio::select! {
        r = ready => r.unwrap_or_else(|_| Err(stopped_early())),
        reason = fatal::wait() => Err(LoadFailure { message: reason, runtime: true }),
    }
}

/// Joins `worker` (its queue closed), on a blocking thread: it may still be finishing a graph
/// call. The model is released then; a failed worker keeps its state for diagnostics.
async fn release(worker: Option<WorkerThread>, stats: &SharedStats) -> Result<(), ()> {
    let Some(w) = worker else {
        return Ok(());
    };
    let joined = tokio::task::spawn_blocking(move || w.thread.join()).await;
    update(stats, |s| {
        if !matches!(s.state, WorkerState::Failed(_)) {
            s.state = WorkerState::Unloaded;
        }
    });
    match joined {
        Ok(Ok(())) => Ok(()),
        _ => Err(()),
    }
}

impl Driver for Engine {
    async fn run(&self, step: Step) -> Outcome {
        match step {
            Step::Configure => self.configure().await,
            Step::Activate => {
                self.serving.store(true, Ordering::Release);
                Outcome::Success
            }
            Step::Deactivate => {
                self.deactivate().await;
                Outcome::Success
            }
            Step::Cleanup | Step::Shutdown | Step::ErrorProcessing => match self.release().await {
                Ok(()) => Outcome::Success,
                Err(()) => {
                    tracing::error!("the {WORKER_THREAD} thread panicked");
                    Outcome::Error
                }
            },
        }
    }

    fn finalized(&self) {
        self.finalized.notify_one();
    }
}

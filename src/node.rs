//! Entity creation, the spin thread, the worker thread and orderly shutdown.
//!
//! Start-up order:
//! 1. node, parameters, publishers, camera subscriptions and `/vlm/cancel` are created on the
//!    caller's thread; one `ros-spin` thread then owns the `r2r::Node` (later node operations
//!    run on it through [`NodeOps`]);
//! 2. the `vlm-worker` thread opens the model and warms it up (diagnostics say `loading`);
//! 3. only then is `/ask` created, so a client that sees the service can be answered.
//!
//! Shutdown (SIGINT/SIGTERM) is a sequence of waits on events, never on time:
//! 1. loading and warm-up are interrupted (they stop at the next load step or graph call;
//!    a board's `hbDNNInitializeFromFiles` of several GB runs to its end first);
//! 2. the queue is closed and every live request cancelled: each running or queued one gets
//!    its `last` Token, its `Answer` and a `cancelled` response from the worker thread;
//! 3. the worker thread ends and has released the model (BPU handles);
//! 4. `/ask` takes no more requests, and every request it took has had its response sent;
//! 5. the spin thread drops the node (DDS entities finalised).

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use camera_frame::{CacheConfig, CameraCache};
use futures::StreamExt;
use r2r::QosProfile;
use vlm::interrupt::Interrupt;
use vlm_bpu::{open_assistant, ModelSource, OpenOptions};

use crate::ask::{self, AskContext};
use crate::ask_action::{self, AskActionServer};
use crate::ask_server::AskServer;
use crate::cameras::{self, CameraMsg};
use crate::diagnostics;
use crate::embedded;
use crate::fatal::{self, EXIT_CONFIG, EXIT_RUNTIME};
use crate::msgs::msg::{Answer, Token};
use crate::msgs::srv::{Ask, Cancel};
use crate::names::{ANSWERS_HISTORY_DEPTH, NODE_NAME, TOKENS_HISTORY_DEPTH};
use crate::param_server::{LiveParams, ParamServer};
use crate::params::{BackendChoice, Params};
use crate::prefill::PrefillConfig;
use crate::registry::Registry;
use crate::ros_names;
use crate::rosout::RosoutTarget;
use crate::test_hooks::{self, Site};
use crate::worker::{self, LoadFailure, Outputs, SharedStats, WorkerConfig, WorkerStats};

/// Name of the thread that owns the model.
const WORKER_THREAD: &str = "vlm-worker";

/// How long one `spin_once` may wait; bounds how fast the spin thread notices a stop or a
/// queued node operation. The wait set wakes on any event, so messages are not delayed.
const SPIN_PERIOD: Duration = Duration::from_millis(10);

/// After a runtime failure, how long the orderly shutdown may take beyond one graph call
/// (`bpu_timeout_s`) before the process exits regardless.
const FATAL_GRACE: Duration = Duration::from_secs(10);

/// Errors that stop the node from starting or shutting down cleanly.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("ROS 2 failed to {action}: {source}")]
    Ros {
        action: String,
        #[source]
        source: r2r::Error,
    },
    #[error(transparent)]
    Param(#[from] crate::params::ParamError),
    #[error("camera topics: {0}")]
    Cameras(#[from] camera_frame::CacheConfigError),
    #[error("could not start the {0} thread: {1}")]
    Thread(&'static str, #[source] std::io::Error),
    #[error("the {0} thread panicked")]
    Panicked(&'static str),
    #[error("the model could not be loaded: {0}")]
    Model(String),
    #[error("the ROS spin thread is gone")]
    SpinGone,
    /// A runtime failure ([`crate::fatal`]): the engine or a part of the node is gone.
    #[error("runtime failure: {0}")]
    Failed(String),
}

impl NodeError {
    /// The process exit code for this error ([`crate::fatal`]): a setting that cannot work
    /// exits with [`EXIT_CONFIG`], anything a restart may cure with [`EXIT_RUNTIME`].
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Ros { .. } | Self::Param(_) | Self::Cameras(_) | Self::Model(_) => EXIT_CONFIG,
            Self::Thread(..) | Self::Panicked(_) | Self::SpinGone | Self::Failed(_) => EXIT_RUNTIME,
        }
    }
}

fn ros<T>(action: impl FnOnce() -> String, result: r2r::Result<T>) -> Result<T, NodeError> {
    result.map_err(|source| NodeError::Ros {
        action: action(),
        source,
    })
}

/// QoS of `/vlm/tokens`: reliable with a deep history, so no delta of an answer is lost.
pub fn tokens_qos() -> QosProfile {
    QosProfile::default()
        .reliable()
        .keep_last(TOKENS_HISTORY_DEPTH)
}

/// QoS of `/vlm/answers`.
pub fn answers_qos() -> QosProfile {
    QosProfile::default()
        .reliable()
        .keep_last(ANSWERS_HISTORY_DEPTH)
}

type NodeOp = Box<dyn FnOnce(&mut r2r::Node) + Send>;

/// Runs operations on the spin thread, which owns the node.
#[derive(Clone)]
pub struct NodeOps {
    tx: mpsc::Sender<NodeOp>,
}

impl NodeOps {
    /// Runs `f` on the spin thread and returns its result (`None`: the node is gone).
    pub async fn call<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut r2r::Node) -> R + Send + 'static,
    ) -> Option<R> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let op: NodeOp = Box::new(move |node| {
            let _ = tx.send(f(node));
        });
        self.tx.send(op).ok()?;
        rx.await.ok()
    }
}

/// The one thread that owns and spins the `r2r::Node`.
pub struct SpinThread {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<()>,
}

impl SpinThread {
    /// Moves `node` into a new `ros-spin` thread.
    pub fn start(mut node: r2r::Node) -> Result<(Self, NodeOps), NodeError> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let (tx, rx) = mpsc::channel::<NodeOp>();
        let handle = std::thread::Builder::new()
            .name("ros-spin".to_owned())
            .spawn(move || {
                while !flag.load(Ordering::Acquire) {
                    node.spin_once(SPIN_PERIOD);
                    while let Ok(op) = rx.try_recv() {
                        op(&mut node);
                    }
                }
                // Dropping the node here finalises its entities on the thread that used them.
                drop(node);
            })
            .map_err(|e| NodeError::Thread("ros-spin", e))?;
        Ok((Self { stop, handle }, NodeOps { tx }))
    }

    /// Stops spinning, drops the node and waits for the thread.
    pub fn stop(self) -> Result<(), NodeError> {
        self.stop.store(true, Ordering::Release);
        self.handle
            .join()
            .map_err(|_| NodeError::Panicked("ros-spin"))
    }
}

/// The model the parameters ask for (the embedded one when `model_dir` is empty, which
/// [`Params::require_model`] allows only with `demo_model`).
fn model_source(p: &Params) -> Result<ModelSource, String> {
    match (&p.model_dir, p.backend) {
        (Some(d), BackendChoice::Cpu) => Ok(ModelSource::Hf(d.clone())),
        (Some(d), BackendChoice::Auto) => Ok(ModelSource::Package(d.clone())),
        (None, _) => {
            let root = embedded::cache_root(p.cache_dir.as_deref()).map_err(|e| e.to_string())?;
            let pkg = embedded::ensure_package(&root).map_err(|e| e.to_string())?;
            tracing::warn!(
                package = %pkg.display(),
                "demo_model: running the EMBEDDED TINY RANDOM MODEL on the BPU SIMULATOR \
                 (its answers are random tokens; set model_dir to a package or, with backend:=cpu, \
                 an HF checkpoint)"
            );
            Ok(ModelSource::Package(pkg))
        }
    }
}

/// Reads the node's parameters (defaults overridden by the command line / params file); the
/// parameter services list the effective values ([`ParamServer`]).
fn read_params(node: &mut r2r::Node) -> Result<Params, NodeError> {
    let given: HashMap<String, r2r::ParameterValue> = {
        let map = node.params.lock().unwrap_or_else(|e| e.into_inner());
        map.iter()
            .map(|(k, v)| (k.clone(), v.value.clone()))
            .collect()
    };
    let params = Params::from_values(&given)?;
    params.require_model()?;
    Ok(params)
}

/// Creates, runs and stops the node; returns when `shutdown` completes (or the model fails
/// to load). Warnings go to `/rosout` through `rosout` from the node's creation on.
pub async fn run(
    ctx: r2r::Context,
    shutdown: impl Future<Output = ()>,
    rosout: &RosoutTarget,
) -> Result<(), NodeError> {
    let mut node = ros(
        || format!("create node {NODE_NAME:?}"),
        r2r::Node::create(ctx, NODE_NAME, ""),
    )?;
    rosout.attach(node.logger());
    let namespace = ros(|| "read the node's namespace".to_owned(), node.namespace())?;
    diagnostics::set_node_name(&ros_names::full_name(&namespace, NODE_NAME));
    let params = read_params(&mut node)?;
    let sim_time = {
        let given = node.params.lock().unwrap_or_else(|e| e.into_inner());
        crate::clock::use_sim_time(given.get("use_sim_time").map(|p| &p.value))?
    };
    // Asks read a snapshot of these; `ros2 param set` replaces it.
    let live = LiveParams::new(params.clone());
    let server: Arc<Mutex<dyn r2r::RosParams + Send>> =
        Arc::new(Mutex::new(ParamServer::new(live.clone(), sim_time)));
    let (param_services, _events) = ros(
        || "create the parameter services".to_owned(),
        node.make_derived_parameter_handler(server),
    )?;
    // Subscribed before anything is published, so no stamp mixes the two clocks.
    let sim_clock = if sim_time {
        crate::clock::enable_sim_time();
        Some(ros(
            || format!("subscribe to {}", crate::clock::CLOCK_TOPIC),
            node.subscribe::<r2r::rosgraph_msgs::msg::Clock>(
                crate::clock::CLOCK_TOPIC,
                QosProfile::default().best_effort().keep_last(1),
            ),
        )?)
    } else {
        None
    };
    tracing::info!(sim_time, "stamps come from the node's ROS time");
    let diagnostics_period = params.diagnostics_period()?;
    let session_idle = params.session_idle()?;
    let action_result_timeout = params.action_result_timeout()?;
    tracing::info!(?params, "parameters");

    let tokens = ros(
        || format!("create publisher {}", params.tokens_topic),
        node.create_publisher::<Token>(&params.tokens_topic, tokens_qos()),
    )?;
    let answers = ros(
        || format!("create publisher {}", params.answers_topic),
        node.create_publisher::<Answer>(&params.answers_topic, answers_qos()),
    )?;
    let diag_pub = ros(
        || "create publisher /diagnostics".to_owned(),
        node.create_publisher::<r2r::diagnostic_msgs::msg::DiagnosticArray>(
            diagnostics::TOPIC,
            QosProfile::default(),
        ),
    )?;
    let cancels = ros(
        || format!("create service {}", params.cancel_service),
        node.create_service::<Cancel::Service>(
            &params.cancel_service,
            QosProfile::services_default(),
        ),
    )?;

    let mut tasks = vec![tokio::spawn(param_services)];
    if let Some(c) = sim_clock {
        tasks.push(tokio::spawn(crate::clock::follow(c)));
    }
    let cameras = if params.vision {
        // The cache lists each camera by its resolved name (what `image_source` reports); the
        // configured names stay valid for a request's `camera`.
        let resolved = |t: &str| ros_names::expand(t, &namespace, NODE_NAME);
        let configured = cameras::topics(&params);
        let cache = CameraCache::new(
            CacheConfig {
                topics: configured.iter().map(|t| resolved(t)).collect(),
                default_camera: params.default_camera().map(|t| resolved(&t)),
                warn_interval: Duration::from_secs(5),
            },
            Instant::now(),
        )?
        .with_aliases(configured.iter().map(|t| (t.clone(), resolved(t))))?;
        let cache = Arc::new(cache);
        let qos = cameras::camera_qos(params.camera_qos);
        for t in &params.image_topics {
            let s = ros(
                || format!("subscribe to {t}"),
                node.subscribe::<r2r::sensor_msgs::msg::Image>(t, qos.clone()),
            )?;
            tasks.push(tokio::spawn(cameras::drain(
                resolved(t),
                s.map(CameraMsg::Raw),
                cache.clone(),
            )));
        }
        for t in &params.compressed_image_topics {
            let s = ros(
                || format!("subscribe to {t}"),
                node.subscribe::<r2r::sensor_msgs::msg::CompressedImage>(t, qos.clone()),
            )?;
            tasks.push(tokio::spawn(cameras::drain(
                resolved(t),
                s.map(CameraMsg::Compressed),
                cache.clone(),
            )));
        }
        Some(cache)
    } else {
        None
    };

    let (spin, ops) = SpinThread::start(node)?;
    let registry = Arc::new(Registry::new(params.queue_depth));
    let stats: SharedStats = Arc::new(Mutex::new(WorkerStats::default()));
    tasks.push(tokio::spawn({
        let registry = registry.clone();
        let mut cancels = cancels;
        async move {
            while let Some(req) = cancels.next().await {
                test_hooks::point(Site::Cancel);
                let resp = ask::cancel(&req.message, &registry);
                if let Err(e) = req.respond(resp) {
                    tracing::warn!(error = %e, "could not send the cancel response");
                }
            }
        }
    }));
    let diag = diagnostics::Diagnostics {
        publisher: diag_pub,
        stats: stats.clone(),
        registry: registry.clone(),
        cameras: cameras.clone(),
        ops: ops.clone(),
        queue_depth: params.queue_depth,
        params: live.clone(),
    };
    tasks.push(tokio::spawn(diagnostics::run(
        diag.clone(),
        diagnostics_period,
    )));

    let (job_tx, job_rx) = mpsc::channel();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let interrupt = Interrupt::new();
    let worker_thread = {
        let p = params.clone();
        let stats = stats.clone();
        let outputs = Outputs { tokens, answers };
        let config = WorkerConfig {
            session_memory_bytes: p.session_memory_bytes,
            session_idle,
            warm_up_system: p.system_prompt.clone(),
            interrupt: interrupt.clone(),
            prefill: cameras
                .clone()
                .filter(|_| p.prefill_latest_frame)
                .map(|cameras| PrefillConfig {
                    cameras,
                    camera: p.prefill_camera.clone(),
                    duty: p.prefill_duty,
                    // Checked finite and >= 0; a value past Duration's range means no limit.
                    max_age: Duration::try_from_secs_f64(p.prefill_max_age_s)
                        .unwrap_or(Duration::MAX),
                    params: live.clone(),
                    ask_priority: p.bpu_priority,
                }),
        };
        let open_interrupt = interrupt.clone();
        std::thread::Builder::new()
            .name(WORKER_THREAD.to_owned())
            .spawn(move || {
                let open = || {
                    let source = model_source(&p).map_err(|reason| {
                        vlm::assistant::AssistantError::File {
                            path: p.cache_dir.clone().unwrap_or_default(),
                            reason,
                        }
                    })?;
                    let mut opts = OpenOptions {
                        vision: p.vision,
                        interrupt: open_interrupt.clone(),
                        ..OpenOptions::default()
                    };
                    opts.bpu.priority = p.bpu_priority;
                    opts.bpu.timeout = p.bpu_timeout;
                    opts.bpu.prefill_tail = p.prefill_tail;
                    opts.bpu.pool_check = p.bpu_pool_check;
                    opts.bpu.flush = p.bpu_flush;
                    opts.bpu.keep_set =
                        p.vision && p.prefill_latest_frame && p.prefill_keep_on_device;
                    // The calibrated tail decision is cached beside the embedded package.
                    opts.bpu.cache_dir = p.cache_dir.clone();
                    open_assistant(&source, &opts)
                };
                worker::run(open, config, job_rx, outputs, stats, ready_tx);
            })
            .map_err(|e| NodeError::Thread(WORKER_THREAD, e))?
    };

    tokio::pin!(shutdown);
    let loaded = tokio::select! {
        r = ready_rx => Some(r.unwrap_or_else(|_| Err(LoadFailure {
            message: "the worker thread stopped before the model was loaded".into(),
            runtime: true,
        }))),
        () = &mut shutdown => None,
        reason = fatal::wait() => Some(Err(LoadFailure { message: reason, runtime: true })),
    };
    let ask_ctx = Arc::new(AskContext {
        params: live,
        cameras,
        registry: registry.clone(),
        jobs: Mutex::new(Some(job_tx)),
        schemas: match &loaded {
            Some(Ok(l)) => Some(l.schemas.clone()),
            _ => None,
        },
        compiles: tokio::sync::Semaphore::new(crate::structured::COMPILES_AT_ONCE),
    });
    let mut result = Ok(());
    let mut ask_server = None;
    let mut action_server = None;
    match loaded {
        Some(Ok(worker::Loaded { info, .. })) => {
            let name = params.ask_service.clone();
            let asks = ops
                .call(move |n| {
                    n.create_service::<Ask::Service>(&name, QosProfile::services_default())
                })
                .await
                .ok_or(NodeError::SpinGone)?;
            let asks = ros(|| format!("create service {}", params.ask_service), asks)?;
            ask_server = Some(AskServer::start(asks, ask_ctx.clone()));
            // Created with /ask and for the same reason: a goal that finds the action can
            // be served.
            let name = params.action_name.clone();
            let action = ops
                .call(move |n| ask_action::Entities::create(n, &name))
                .await
                .ok_or(NodeError::SpinGone)?;
            let action = ros(|| format!("create action {}", params.action_name), action)?;
            action_server = Some(AskActionServer::start(
                action,
                ask_ctx.clone(),
                action_result_timeout,
            ));
            tracing::info!(
                tokens = %params.tokens_topic,
                "vlm_node ready: model {} on {}, service {}, action {}",
                info.name,
                info.backend,
                params.ask_service,
                params.action_name
            );
            tokio::select! {
                () = &mut shutdown => {}
                reason = fatal::wait() => result = Err(NodeError::Failed(reason)),
            }
        }
        Some(Err(e)) if e.runtime => result = Err(NodeError::Failed(e.message)),
        Some(Err(e)) => {
            tracing::error!("the model could not be loaded: {}", e.message);
            result = Err(NodeError::Model(e.message));
        }
        None => tracing::info!("shutdown requested while loading"),
    }

    if fatal::reason().is_some() {
        // A stuck driver call must not keep a failed node alive; the ERROR status goes out
        // before anything is torn down, even when the diagnostics task is what panicked.
        fatal::exit_after(params.bpu_timeout + FATAL_GRACE);
        let mut nuls = crate::health::NulWatch::default();
        if let Err(p) = crate::panics::contained(|| diagnostics::publish(&diag, &mut nuls)) {
            tracing::error!("the final diagnostics could not be published: {p}");
        }
    }
    tracing::info!("shutting down: cancelling live requests, releasing the model, finalising ROS");
    interrupt.raise();
    // Closing the queue first: nothing is admitted after the cancel below. The worker loop
    // ends once the (cancelled) jobs are answered.
    ask_ctx.close();
    let live = registry.cancel_all();
    if live > 0 {
        tracing::info!(live, "cancelled live requests");
    }
    // Joined on a blocking thread: the worker may still be finishing a graph call.
    let joined = tokio::task::spawn_blocking(move || worker_thread.join())
        .await
        .map_err(|_| NodeError::Panicked(WORKER_THREAD))
        .and_then(|r| r.map_err(|_| NodeError::Panicked(WORKER_THREAD)));
    // Every job is answered or dropped now, so each /ask task can send its response.
    if let Some(server) = ask_server {
        server.finish().await;
    }
    if let Some(server) = action_server {
        server.finish().await;
    }
    // Every final Token, Answer and response has been handed to DDS (publish and respond
    // return once the middleware has the sample); the node goes only after that.
    let spin_result = tokio::task::spawn_blocking(move || spin.stop())
        .await
        .map_err(|_| NodeError::Panicked("ros-spin"))
        .and_then(|r| r);
    for t in tasks {
        t.abort();
        let _ = t.await;
    }
    // A runtime failure raised at any point, shutdown included, decides the exit code.
    if let (Ok(()), Some(reason)) = (&result, fatal::reason()) {
        result = Err(NodeError::Failed(reason.to_owned()));
    }
    result?;
    joined?;
    spin_result?;
    tracing::info!("vlm_node stopped cleanly");
    Ok(())
}

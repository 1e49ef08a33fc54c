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
//! 1. loading and warm-up are interrupted (they stop at the next load step, cache buffer or
//!    graph call; a board's `hbDNNInitializeFromFiles` of several GB runs to its end first);
//! 2. the queue is closed and every live request cancelled: each running or queued one gets
//!    its `last` Token, its `Answer` and a `cancelled` response from the worker thread;
//! 3. the worker thread ends and has released the model (BPU handles);
//! 4. `/ask` takes no more requests, and every request it took has had its response sent;
//! 5. the spin thread drops the node (DDS entities finalised).

use std::collections::HashMap;
use std::future::Future;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use camera_frame::{CacheConfig, CameraCache};
use futures::StreamExt;
use r2r::diagnostic_msgs::msg::DiagnosticArray;
use r2r::{Publisher, QosProfile};
use vlm::interrupt::Interrupt;

use crate::diagnostics::{self, Diagnostics};
use crate::model;
use crate::msgs::msg::{Answer, Token};
use crate::msgs::srv::{Ask, Cancel};
use crate::process::fatal::{self, EXIT_CONFIG, EXIT_RUNTIME};
use crate::request::ask_action::{self, AskActionServer};
use crate::request::ask_server::AskServer;
use crate::request::context::AskContext;
use crate::request::servers::Services;
use crate::request::structured;
use crate::request::{ask, detect_action};
use crate::ros::cameras::{self, CameraMsg};
use crate::ros::clock::{self, RosClock, CLOCK_TOPIC};
use crate::ros::names::NODE_NAME;
use crate::ros::param_server::{LiveParams, ParamServer};
use crate::ros::params::Params;
use crate::ros::qos::{answers_qos, requests_qos, tokens_qos};
use crate::ros::remap::{NodeNames, RemapRules};
use crate::ros::rosout::RosoutTarget;
use crate::ros::spin::{Drains, NodeOps, SpinError, SpinThread};
use crate::ros::text::NulCount;
use crate::serve::deliver::Outputs;
use crate::serve::priming::PrimingConfig;
use crate::serve::registry::Registry;
use crate::serve::stats::{SharedStats, WorkerStats};
use crate::serve::worker::{self, LoadFailure, Ready, WorkerConfig};

/// Name of the thread that owns the model.
const WORKER_THREAD: &str = "vlm-worker";

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
    Param(#[from] crate::ros::params::ParamError),
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
    /// A runtime failure ([`crate::process::fatal`]): the engine or a part of the node is gone.
    #[error("runtime failure: {0}")]
    Failed(String),
}

impl From<SpinError> for NodeError {
    fn from(e: SpinError) -> Self {
        match e {
            SpinError::Start(e) => Self::Thread("ros-spin", e),
            SpinError::Panicked => Self::Panicked("ros-spin"),
        }
    }
}

impl NodeError {
    /// The process exit code for this error ([`crate::process::fatal`]): a setting that cannot work
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

/// Creates, runs and stops the node; returns when `shutdown` completes (or the model fails
/// to load). Logs go to `/rosout` through `rosout` from the node's creation on. The
/// steps, in order: start-up (entities on this thread, then the spin thread and the worker),
/// waiting for the model, serving until a stop, and the shutdown sequence of the module doc.
pub async fn run(
    ctx: r2r::Context,
    shutdown: impl Future<Output = ()>,
    rosout: &RosoutTarget,
) -> Result<(), NodeError> {
    let (mut node, node_names) = create_node(ctx, rosout)?;
    let params = read_params(&mut node)?;
    rosout.set_level(params.rosout_level);
    // Asks read a snapshot of these; `ros2 param set` replaces it.
    let live = LiveParams::new(params.clone());
    // The request streams the spin thread empties after each spin (`ros::spin`).
    let mut drains = Drains::default();
    let (mut tasks, clock, _param_events) = serve_parameters(&mut node, &mut drains, &live)?;
    let diagnostics_period = params.diagnostics_period()?;
    let session_idle = params.session_idle()?;
    let action_result_timeout = params.action_result_timeout()?;
    tracing::info!(?params, "parameters");
    let publishers = create_publishers(&mut node, &params)?;
    let registry = Arc::new(Registry::new(params.queue_depth));
    let cancels = drains.relay(ros(
        || format!("create service {}", params.cancel_service),
        node.create_service::<Cancel::Service>(&params.cancel_service, requests_qos()),
    )?);
    tasks.push(tokio::spawn(ask::serve_cancels(cancels, registry.clone())));
    let cameras = subscribe_cameras(&mut node, &params, &node_names, &mut tasks)?;

    let (spin, ops) = SpinThread::start_draining(node, drains)?;
    let stats: SharedStats = Arc::new(Mutex::new(WorkerStats::default()));
    let nuls = NulCount::default();
    let diag = Diagnostics {
        name: diagnostics::status_name(&node_names.full_name),
        board: crate::health::board(),
        clock: clock.clone(),
        nuls: nuls.clone(),
        publisher: publishers.diagnostics,
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
    let outputs = Outputs {
        tokens: Box::new(publishers.tokens),
        answers: Box::new(publishers.answers),
        clock: clock.clone(),
        nuls: nuls.clone(),
    };
    let worker = start_worker(
        &params,
        &live,
        cameras.clone(),
        session_idle,
        outputs,
        stats,
    )?;

    tokio::pin!(shutdown);
    let loaded = wait_loaded(worker.ready, &mut shutdown).await;
    let ask_ctx = Arc::new(AskContext {
        params: live,
        cameras,
        registry: registry.clone(),
        jobs: Mutex::new(Some(worker.jobs)),
        schemas: match &loaded {
            Some(Ok(l)) => Some(l.schemas.clone()),
            _ => None,
        },
        compiles: tokio::sync::Semaphore::new(structured::COMPILES_AT_ONCE),
        clock,
        nuls,
    });
    let (services, result) = serve_until_stopped(
        loaded,
        &params,
        &ops,
        &ask_ctx,
        action_result_timeout,
        &mut shutdown,
    )
    .await?;

    if fatal::reason().is_some() {
        last_word(&diag, params.bpu_timeout);
    }
    let stopped = Stopping {
        interrupt: worker.interrupt,
        ask_ctx,
        registry,
        worker_thread: worker.thread,
        services,
        spin,
        tasks,
    };
    stopped.stop(result).await
}

/// Creates the node and sends logs to `/rosout` from now on; returns it with its names
/// as rcl gave them (`--ros-args -r __node:=… -r __ns:=…` applied) and the remapping rules.
fn create_node(
    ctx: r2r::Context,
    rosout: &RosoutTarget,
) -> Result<(r2r::Node, NodeNames), NodeError> {
    let mut node = ros(
        || format!("create node {NODE_NAME:?}"),
        r2r::Node::create(ctx, NODE_NAME, ""),
    )?;
    ros(
        || "create publisher /rosout".into(),
        rosout.attach_node(&mut node),
    )?;
    let read = |what: &str, r| ros(|| format!("read the node's {what}"), r);
    let names = NodeNames {
        name: read("name", node.name())?,
        namespace: read("namespace", node.namespace())?,
        full_name: read("full name", node.fully_qualified_name())?,
        rules: RemapRules::from_args(std::env::args()),
    };
    Ok((node, names))
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

/// The parameter services over `live` (answered on the spin thread, through `drains`), and
/// the node's clock: under `use_sim_time`, `/clock` is followed from before anything is
/// published, so no stamp mixes the two clocks. Returns the tasks started, the clock, and
/// r2r's parameter event stream, which must outlive the node.
fn serve_parameters(
    node: &mut r2r::Node,
    drains: &mut Drains,
    live: &LiveParams,
) -> Result<(Vec<tokio::task::JoinHandle<()>>, RosClock, impl Sized), NodeError> {
    let sim_time = {
        let given = node.params.lock().unwrap_or_else(|e| e.into_inner());
        clock::use_sim_time(given.get("use_sim_time").map(|p| &p.value))?
    };
    let server: Arc<Mutex<dyn r2r::RosParams + Send>> =
        Arc::new(Mutex::new(ParamServer::new(live.clone(), sim_time)));
    let (param_services, events) = ros(
        || "create the parameter services".to_owned(),
        node.make_derived_parameter_handler(server),
    )?;
    // r2r's handler answers each request as it comes and awaits nothing else, so a poll
    // after each spin answers every request waiting.
    drains.run(param_services);
    let mut tasks = Vec::new();
    let clock = if sim_time {
        let clock = RosClock::simulated();
        let sim_clock = ros(
            || format!("subscribe to {}", CLOCK_TOPIC),
            node.subscribe::<r2r::rosgraph_msgs::msg::Clock>(
                CLOCK_TOPIC,
                QosProfile::default().best_effort().keep_last(1),
            ),
        )?;
        tasks.push(tokio::spawn(clock.clone().follow(sim_clock)));
        clock
    } else {
        RosClock::default()
    };
    tracing::info!(sim_time, "stamps come from the node's ROS time");
    Ok((tasks, clock, events))
}

/// The node's publishers.
struct Publishers {
    tokens: Publisher<Token>,
    answers: Publisher<Answer>,
    diagnostics: Publisher<DiagnosticArray>,
}

fn create_publishers(node: &mut r2r::Node, params: &Params) -> Result<Publishers, NodeError> {
    Ok(Publishers {
        tokens: ros(
            || format!("create publisher {}", params.tokens_topic),
            node.create_publisher::<Token>(&params.tokens_topic, tokens_qos()),
        )?,
        answers: ros(
            || format!("create publisher {}", params.answers_topic),
            node.create_publisher::<Answer>(&params.answers_topic, answers_qos()),
        )?,
        diagnostics: ros(
            || "create publisher /diagnostics".to_owned(),
            node.create_publisher::<DiagnosticArray>(diagnostics::TOPIC, QosProfile::default()),
        )?,
    })
}

/// The latest-frame cache and a subscription (with its draining task) per camera topic;
/// `None` without vision.
fn subscribe_cameras(
    node: &mut r2r::Node,
    params: &Params,
    names: &NodeNames,
    tasks: &mut Vec<tokio::task::JoinHandle<()>>,
) -> Result<Option<Arc<CameraCache>>, NodeError> {
    if !params.vision {
        return Ok(None);
    }
    // The cache lists each camera by its resolved name, remapping applied (what
    // `image_source` reports); the configured names stay valid for a request's `camera`.
    let resolved = |t: &str| names.resolve(t);
    let configured = cameras::topics(params);
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
    Ok(Some(cache))
}

/// The worker thread as the node holds it.
struct WorkerHandle {
    thread: JoinHandle<()>,
    /// The queue the ask path sends jobs into.
    jobs: mpsc::Sender<crate::serve::job::Job>,
    /// How loading ended.
    ready: tokio::sync::oneshot::Receiver<Ready>,
    /// Raised at shutdown: loading and warm-up stop at their next step.
    interrupt: Interrupt,
}

/// Starts the `vlm-worker` thread, which opens the model there and serves the queue.
fn start_worker(
    p: &Params,
    live: &LiveParams,
    cameras: Option<Arc<CameraCache>>,
    session_idle: Duration,
    outputs: Outputs,
    stats: SharedStats,
) -> Result<WorkerHandle, NodeError> {
    let (job_tx, job_rx) = mpsc::channel();
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let interrupt = Interrupt::new();
    let config = WorkerConfig {
        session_memory_bytes: p.session_memory_bytes,
        session_idle,
        warm_up_system: p.system_prompt.clone(),
        interrupt: interrupt.clone(),
        prefill: cameras
            .filter(|_| p.prefill_latest_frame)
            .map(|cameras| PrimingConfig {
                cameras,
                camera: p.prefill_camera.clone(),
                duty: p.prefill_duty,
                // Checked finite and >= 0; a value past Duration's range means no limit.
                max_age: Duration::try_from_secs_f64(p.prefill_max_age_s).unwrap_or(Duration::MAX),
                params: live.clone(),
                ask_priority: p.bpu_priority,
            }),
    };
    let p = p.clone();
    let open_interrupt = interrupt.clone();
    let thread = std::thread::Builder::new()
        .name(WORKER_THREAD.to_owned())
        .spawn(move || {
            let open = || model::open(&p, &open_interrupt);
            worker::run(open, config, job_rx, outputs, stats, ready_tx);
        })
        .map_err(|e| NodeError::Thread(WORKER_THREAD, e))?;
    Ok(WorkerHandle {
        thread,
        jobs: job_tx,
        ready: ready_rx,
        interrupt,
    })
}

/// How loading ended; `None` when a shutdown came first.
async fn wait_loaded(
    ready: tokio::sync::oneshot::Receiver<Ready>,
    shutdown: &mut (impl Future<Output = ()> + Unpin),
) -> Option<Ready> {
    tokio::select! {
        r = ready => Some(r.unwrap_or_else(|_| Err(LoadFailure {
            message: "the worker thread stopped before the model was loaded".into(),
            runtime: true,
        }))),
        () = shutdown => None,
        reason = fatal::wait() => Some(Err(LoadFailure { message: reason, runtime: true })),
    }
}

/// Once the model is loaded: creates `/ask` and the action (only now, so a client that sees
/// them can be answered) and serves until `shutdown` or a runtime failure. Otherwise says
/// why the node stops. `Err`: the servers could not be created, and the node stops at once.
async fn serve_until_stopped(
    loaded: Option<Ready>,
    params: &Params,
    ops: &NodeOps,
    ask_ctx: &Arc<AskContext>,
    action_result_timeout: Duration,
    shutdown: &mut (impl Future<Output = ()> + Unpin),
) -> Result<(Services, Result<(), NodeError>), NodeError> {
    let mut services = Services::default();
    let loaded = match loaded {
        Some(Ok(l)) => l,
        Some(Err(e)) if e.runtime => return Ok((services, Err(NodeError::Failed(e.message)))),
        Some(Err(e)) => {
            tracing::error!("the model could not be loaded: {}", e.message);
            return Ok((services, Err(NodeError::Model(e.message))));
        }
        None => {
            tracing::info!("shutdown requested while loading");
            return Ok((services, Ok(())));
        }
    };
    create_services(&mut services, params, ops, ask_ctx, action_result_timeout).await?;
    tracing::info!(
        tokens = %params.tokens_topic,
        "vlm_node ready: model {} on {}, service {}, action {}",
        loaded.info.name,
        loaded.info.backend,
        params.ask_service,
        params.action_name
    );
    let result = tokio::select! {
        () = shutdown => Ok(()),
        reason = fatal::wait() => Err(NodeError::Failed(reason)),
    };
    Ok((services, result))
}

async fn create_services(
    services: &mut Services,
    params: &Params,
    ops: &NodeOps,
    ask_ctx: &Arc<AskContext>,
    action_result_timeout: Duration,
) -> Result<(), NodeError> {
    let name = params.ask_service.clone();
    let asks = ops
        .call_draining(move |n, d| {
            n.create_service::<Ask::Service>(&name, requests_qos())
                .map(|s| d.relay(s))
        })
        .await
        .ok_or(NodeError::SpinGone)?;
    let asks = ros(|| format!("create service {}", params.ask_service), asks)?;
    services.ask = Some(AskServer::start(asks, ask_ctx.clone()));
    // Created with /ask and for the same reason: a goal that finds the action can be served.
    let name = params.action_name.clone();
    let action = ops
        .call_draining(move |n, d| ask_action::Entities::create(n, d, &name))
        .await
        .ok_or(NodeError::SpinGone)?;
    let action = ros(|| format!("create action {}", params.action_name), action)?;
    services.action = Some(AskActionServer::start(
        action,
        ask_ctx.clone(),
        action_result_timeout,
    ));
    let detect = detect_action::start(ops, ask_ctx, action_result_timeout).await;
    let (service, action) = ros(
        || "create /detect".into(),
        detect.ok_or(NodeError::SpinGone)?,
    )?;
    (services.detect, services.detect_action) = (Some(service), Some(action));
    Ok(())
}

/// After a runtime failure: a stuck driver call must not keep a failed node alive, and the
/// ERROR status goes out before anything is torn down, even when the diagnostics task is
/// what panicked.
fn last_word(diag: &Diagnostics, bpu_timeout: Duration) {
    fatal::exit_after(bpu_timeout + FATAL_GRACE);
    let mut nuls = crate::health::NulWatch::default();
    if let Err(p) = crate::process::panics::contained(|| diagnostics::publish(diag, &mut nuls)) {
        tracing::error!("the final diagnostics could not be published: {p}");
    }
}

/// What the shutdown sequence (the module doc's) stops, in its order.
struct Stopping {
    interrupt: Interrupt,
    ask_ctx: Arc<AskContext>,
    registry: Arc<Registry>,
    worker_thread: JoinHandle<()>,
    services: Services,
    spin: SpinThread,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Stopping {
    async fn stop(self, mut result: Result<(), NodeError>) -> Result<(), NodeError> {
        tracing::info!(
            "shutting down: cancelling live requests, releasing the model, finalising ROS"
        );
        self.interrupt.raise();
        // Closing the queue first: nothing is admitted after the cancel below. The worker
        // loop ends once the (cancelled) jobs are answered.
        self.ask_ctx.close();
        let live = self.registry.cancel_all();
        if live > 0 {
            tracing::info!(live, "cancelled live requests");
        }
        // Joined on a blocking thread: the worker may still be finishing a graph call.
        let worker_thread = self.worker_thread;
        let joined = tokio::task::spawn_blocking(move || worker_thread.join())
            .await
            .map_err(|_| NodeError::Panicked(WORKER_THREAD))
            .and_then(|r| r.map_err(|_| NodeError::Panicked(WORKER_THREAD)));
        // Every job is answered or dropped now, so each /ask task can send its response.
        self.services.finish().await;
        // Every final Token, Answer and response has been handed to DDS (publish and respond
        // return once the middleware has the sample); the node goes only after that.
        let spin = self.spin;
        let spin_result = tokio::task::spawn_blocking(move || spin.stop())
            .await
            .map_err(|_| NodeError::Panicked("ros-spin"))
            .and_then(|r| r.map_err(NodeError::from));
        for t in self.tasks {
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
}

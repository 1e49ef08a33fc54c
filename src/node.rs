//! Entity creation, the spin thread, the worker thread and orderly shutdown.
//!
//! Start-up order:
//! 1. node, parameters, publishers, camera subscriptions, `/vlm/cancel` and the lifecycle
//!    services are created on the caller's thread; one `ros-spin` thread then owns the
//!    `r2r::Node` (later node operations run on it through [`NodeOps`]);
//! 2. with `autostart`, the configure and activate transitions (`crate::managed`): the
//!    `vlm-worker` thread opens the model and warms it up (diagnostics say `loading`);
//! 3. only then is `/ask` created, so a client that sees the service can be answered (without
//!    `autostart` at once: asks get `not_ready` until a manager configures and activates).
//!
//! Shutdown (SIGINT/SIGTERM) is a sequence of waits on events, never on time:
//! 1. loading and warm-up are interrupted (they stop at the next load step, cache buffer or
//!    graph call; a board's `hbDNNInitializeFromFiles` of several GB runs to its end first);
//! 2. the queue is closed and every live request cancelled: each running or queued one gets
//!    its `last` Token, its `Answer` and a `cancelled` response from the worker thread;
//! 3. the worker thread ends and has released the model (BPU handles);
//! 4. `/ask` takes no more requests, and every request it took has had its response sent;
//! 5. the spin thread drops the node (DDS entities finalised).
//!
//! A lifecycle shutdown transition runs the same sequence once its response and its events are
//! out, and the process exits 0.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use camera_frame::{CacheConfig, CameraCache};
use futures::StreamExt;
use r2r::diagnostic_msgs::msg::DiagnosticArray;
use r2r::{Publisher, QosProfile};

use crate::diagnostics::{self, Diagnostics};
use crate::managed::{Engine, WorkerOutputs, WORKER_THREAD};
use crate::msgs::msg::{Answer, Token};
use crate::msgs::srv::{Ask, Cancel};
use crate::process::fatal::{self, EXIT_CONFIG, EXIT_RUNTIME};
use crate::request::ask_action::{self, AskActionServer};
use crate::request::ask_server::AskServer;
use crate::request::context::AskContext;
use crate::request::servers::Services;
use crate::request::structured;
use crate::request::watch::board::WatchBoard;
use crate::request::{ask, detect_action, watch_action};
use crate::ros::cameras::{self, CameraMsg};
use crate::ros::clock::{self, RosClock, CLOCK_TOPIC};
use crate::ros::lifecycle::{self, Lifecycle, Protocol};
use crate::ros::names::NODE_NAME;
use crate::ros::param_server::{LiveParams, ParamServer};
use crate::ros::params::Params;
use crate::ros::qos::{answers_qos, requests_qos, tokens_qos};
use crate::ros::remap::{NodeNames, RemapRules};
use crate::ros::rosout::RosoutTarget;
use crate::ros::spin::{Drains, NodeOps, SpinError, SpinThread};
use crate::ros::text::NulCount;
use crate::serve::registry::Registry;
use crate::serve::stats::{update, SharedStats, WorkerState, WorkerStats};

/// lifecycle_msgs/msg/Transition ids the autostart takes.
const CONFIGURE: u8 = 1;
const ACTIVATE: u8 = 3;

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
    let lifecycle = Lifecycle::default();
    let (mut tasks, clock, _param_events) =
        serve_parameters(&mut node, &mut drains, &live, &lifecycle)?;
    let diagnostics_period = params.diagnostics_period()?;
    // Checked here (a bad value stops the start); each configure reads it again.
    params.session_idle()?;
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
    let managed = ros(
        || "create the lifecycle services".to_owned(),
        lifecycle::Entities::create(&mut node, &mut drains),
    )?;

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
        lifecycle: lifecycle.clone(),
        watches: Arc::new(WatchBoard::default()),
    };
    tasks.push(tokio::spawn(diagnostics::run(
        diag.clone(),
        diagnostics_period,
    )));
    let ask_ctx = Arc::new(ask_context(&diag));
    if !params.autostart {
        update(&stats, |s| s.state = WorkerState::Unloaded);
    }
    let outputs = WorkerOutputs {
        tokens: publishers.tokens,
        answers: publishers.answers,
        clock,
        nuls,
    };
    let engine = Arc::new(Engine::new(live, cameras, stats, ask_ctx.clone(), outputs));
    let protocol = Protocol::new(lifecycle, engine.clone(), &managed);
    tasks.extend(protocol.serve(managed));

    tokio::pin!(shutdown);
    let (services, result) = serve_until_stopped(
        &protocol,
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
        engine,
        services,
        spin,
        tasks,
    };
    stopped.stop(result).await
}

/// What every ask shares, over the parameters, cameras, admission and counters diagnostics
/// read.
fn ask_context(d: &Diagnostics) -> AskContext {
    AskContext {
        params: d.params.clone(),
        cameras: d.cameras.clone(),
        registry: d.registry.clone(),
        jobs: Mutex::new(None),
        schemas: Mutex::new(None),
        lifecycle: d.lifecycle.clone(),
        compiles: tokio::sync::Semaphore::new(structured::COMPILES_AT_ONCE),
        clock: d.clock.clone(),
        nuls: d.nuls.clone(),
        watches: d.watches.clone(),
    }
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
    // Without autostart the model is named before a configure, which checks it then.
    if params.autostart {
        params.require_model()?;
    }
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
    lifecycle: &Lifecycle,
) -> Result<(Vec<tokio::task::JoinHandle<()>>, RosClock, impl Sized), NodeError> {
    let sim_time = {
        let given = node.params.lock().unwrap_or_else(|e| e.into_inner());
        clock::use_sim_time(given.get("use_sim_time").map(|p| &p.value))?
    };
    let server: Arc<Mutex<dyn r2r::RosParams + Send>> = Arc::new(Mutex::new(
        ParamServer::new(live.clone(), sim_time).with_lifecycle(lifecycle.clone()),
    ));
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
    .with_aliases(configured.iter().map(|t| (t.clone(), resolved(t))))?
    .with_scene_threshold(params.scene_change_threshold);
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

/// With `autostart`, configures and activates (as a manager would; a failure stops the node
/// as before there were lifecycle states); then creates `/ask` and the action (only once the
/// model is loaded, so a client that sees them can be answered, or at once without
/// `autostart`, so an ask is answered `not_ready`) and serves until `shutdown`, a runtime
/// failure or the `finalized` state. `Err`: the servers could not be created.
async fn serve_until_stopped(
    protocol: &Protocol<Engine>,
    params: &Params,
    ops: &NodeOps,
    ask_ctx: &Arc<AskContext>,
    action_result_timeout: Duration,
    shutdown: &mut (impl Future<Output = ()> + Unpin),
) -> Result<(Services, Result<(), NodeError>), NodeError> {
    let mut services = Services::default();
    let engine = protocol.driver();
    if params.autostart {
        let configured = tokio::select! {
            ok = protocol.change(CONFIGURE, "") => ok,
            () = &mut *shutdown => {
                tracing::info!("shutdown requested while loading");
                return Ok((services, Ok(())));
            }
        };
        if !configured {
            let stop = match engine.take_failure() {
                Some(f) if !f.runtime => NodeError::Model(f.message),
                Some(f) => NodeError::Failed(f.message),
                None => NodeError::Failed("the model could not be loaded".into()),
            };
            return Ok((services, Err(stop)));
        }
        protocol.change(ACTIVATE, "").await;
    }
    create_services(&mut services, params, ops, ask_ctx, action_result_timeout).await?;
    let model = engine
        .stats
        .lock()
        .map(|s| s.model.clone())
        .unwrap_or_default();
    match model.filter(|_| params.autostart) {
        Some(m) => tracing::info!(
            tokens = %params.tokens_topic,
            "vlm_node ready: model {} on {}, service {}, action {}",
            m.name,
            m.backend,
            params.ask_service,
            params.action_name
        ),
        None => tracing::info!(
            "vlm_node unconfigured (autostart false): waiting for a lifecycle manager (~/change_state)"
        ),
    }
    let result = tokio::select! {
        () = shutdown => Ok(()),
        reason = fatal::wait() => Err(NodeError::Failed(reason)),
        () = engine.wait_finalized() => {
            tracing::info!("lifecycle state finalized: the node stops");
            Ok(())
        }
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
    let watch = watch_action::start(ops, ask_ctx, action_result_timeout).await;
    let watch = ros(
        || "create vlm/watch".into(),
        watch.ok_or(NodeError::SpinGone)?,
    )?;
    services.watch_action = Some(watch);
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
    engine: Arc<Engine>,
    services: Services,
    spin: SpinThread,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Stopping {
    async fn stop(self, mut result: Result<(), NodeError>) -> Result<(), NodeError> {
        tracing::info!(
            "shutting down: cancelling live requests, releasing the model, finalising ROS"
        );
        // Loading stops, the queue closes (nothing is admitted after the cancel), every live
        // request is cancelled and the worker ends once the (cancelled) jobs are answered.
        let joined = self
            .engine
            .release()
            .await
            .map_err(|()| NodeError::Panicked(WORKER_THREAD));
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

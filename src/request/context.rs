//! What every ask shares: the parameters in force, the cameras, admission, the worker's
//! queue, the schema compiler and its permits, the clock and the NUL count. Planning
//! ([`crate::request::plan`]) reads it, the ask path (`request::ask`) queues through it.

use std::sync::mpsc::Sender;
use std::sync::Arc;

use camera_frame::CameraCache;
use vlm::structured::JsonSchemas;

use crate::request::structured;
use crate::request::watch::board::WatchBoard;
use crate::ros::clock::RosClock;
use crate::ros::lifecycle::{Lifecycle, StateId};
use crate::ros::param_server::LiveParams;
use crate::ros::params::Params;
use crate::ros::text::NulCount;
use crate::serve::job::Job;
use crate::serve::registry::Registry;

/// Everything an ask handler needs, shared by all requests.
pub struct AskContext {
    /// The parameters in force; each ask takes a snapshot (`ros2 param set` replaces them).
    pub(crate) params: LiveParams,
    /// `None` when the node runs without vision.
    pub(crate) cameras: Option<Arc<CameraCache>>,
    pub(crate) registry: Arc<Registry>,
    /// The worker's queue; `None` once the node is shutting down.
    pub(crate) jobs: std::sync::Mutex<Option<Sender<Job>>>,
    /// The served model's JSON-schema compiler: a request's `json_schema` is compiled (or
    /// refused) here, before queueing. Replaced at each configure (the package may change).
    pub(crate) schemas: std::sync::Mutex<Option<Arc<JsonSchemas>>>,
    /// The node's lifecycle state: only an active node takes asks.
    pub(crate) lifecycle: Lifecycle,
    /// Permits to compile a schema ([`structured::COMPILES_AT_ONCE`]).
    pub(crate) compiles: tokio::sync::Semaphore,
    /// Stamps what the ask path publishes itself (an action goal's acceptance).
    pub(crate) clock: RosClock,
    /// Counts the NULs replaced in refusals.
    pub(crate) nuls: NulCount,
    /// The watch goals' slots, counters and evaluations (`crate::request::watch`).
    pub(crate) watches: Arc<WatchBoard>,
}

impl AskContext {
    /// A context over `params` with its own registry (`queue_depth` places) and no queue
    /// yet (asks are refused `not_ready` at admission): what planning needs, as the node
    /// builds it once the model is loaded.
    pub fn new(
        params: Params,
        cameras: Option<Arc<CameraCache>>,
        schemas: Option<Arc<JsonSchemas>>,
    ) -> Self {
        let registry = Arc::new(Registry::new(params.queue_depth));
        Self {
            params: LiveParams::new(params),
            cameras,
            registry,
            jobs: std::sync::Mutex::new(None),
            schemas: std::sync::Mutex::new(schemas),
            lifecycle: Lifecycle::active(),
            compiles: tokio::sync::Semaphore::new(structured::COMPILES_AT_ONCE),
            clock: RosClock::default(),
            nuls: NulCount::default(),
            watches: Arc::new(WatchBoard::default()),
        }
    }

    /// The schema compiler of the model served now (`None` before a model is loaded).
    pub(crate) fn schemas(&self) -> Option<Arc<JsonSchemas>> {
        self.schemas
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The model's queue and schema compiler once it is loaded (a configure).
    pub(crate) fn open(&self, jobs: Sender<Job>, schemas: Arc<JsonSchemas>) {
        *self.schemas.lock().unwrap_or_else(|e| e.into_inner()) = Some(schemas);
        *self.jobs.lock().unwrap_or_else(|e| e.into_inner()) = Some(jobs);
    }

    /// Why an ask is refused `not_ready` in the node's lifecycle state; `None` when active.
    pub(crate) fn not_serving(&self) -> Option<String> {
        match self.lifecycle.state() {
            StateId::ACTIVE => None,
            StateId::INACTIVE | StateId::ACTIVATING | StateId::DEACTIVATING => {
                Some("node is inactive".into())
            }
            StateId::UNCONFIGURED | StateId::CONFIGURING | StateId::CLEANING_UP => {
                Some("node is unconfigured".into())
            }
            other => Some(format!("node is {}", other.label())),
        }
    }

    /// Whether the queue is closed (the node is shutting down or cleaning up).
    pub(crate) fn closed(&self) -> bool {
        self.jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_none()
    }

    /// Closes the queue: later asks are refused, the worker ends after the queued ones.
    /// A lock poisoned by a panicking ask task still holds a consistent `Option`, so it is
    /// used as it is: skipping the close would leave the worker waiting for jobs forever.
    pub(crate) fn close(&self) {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner()).take();
    }
}

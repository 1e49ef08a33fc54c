//! What the worker reports to diagnostics: its life cycle and counters, behind one lock.

use std::sync::{Arc, Mutex};

use vlm::assistant::ModelInfo;

use crate::serve::priming::PrimingStats;

/// Worker life cycle, as diagnostics report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WorkerState {
    Loading,
    Ready,
    Busy,
    /// Reopening the model after an internal error.
    Recovering,
    /// The engine cannot serve (never loaded, lost, or not reopened); the reason.
    Failed(String),
    /// No model: the node is unconfigured (or cleaned up) and waits for a configure.
    Unloaded,
}

impl WorkerState {
    pub(crate) fn as_str(&self) -> &str {
        match self {
            Self::Loading => "loading",
            Self::Ready => "ready",
            Self::Busy => "busy",
            Self::Recovering => "recovering",
            Self::Failed(_) => "error",
            Self::Unloaded => "unloaded",
        }
    }
}

/// Counters shared with diagnostics.
#[derive(Debug, Clone)]
pub(crate) struct WorkerStats {
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
    /// Sessions dropped because `session_memory_mb` was full, since start.
    pub sessions_evicted: u64,
    /// Sessions dropped after `session_idle_s` without use, since start.
    pub sessions_expired: u64,
    /// Decode-state snapshots taken since the model was opened ([`vlm::assistant::Assistant::snapshots`]).
    pub snapshots: u64,
    /// Images sent through the vision tower since the model was opened
    /// ([`vlm::assistant::Assistant::images_encoded`]); a frame a session already holds is not sent again.
    pub images_encoded: u64,
    /// Simulator live buffers, tasks and pool bytes (`None` on the board or the CPU).
    pub sim_live: Option<vlm_bpu::sim::LiveHandles>,
    /// Frame priming counters (`None` when it is off).
    pub prefill: Option<PrimingStats>,
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
            sessions_evicted: 0,
            sessions_expired: 0,
            snapshots: 0,
            images_encoded: 0,
            sim_live: None,
            prefill: None,
        }
    }
}

pub(crate) type SharedStats = Arc<Mutex<WorkerStats>>;

/// A panic elsewhere must not stop diagnostics, so a poisoned lock is used as it is.
pub(crate) fn update(stats: &SharedStats, f: impl FnOnce(&mut WorkerStats)) {
    let mut g = stats.lock().unwrap_or_else(|e| e.into_inner());
    f(&mut g);
}

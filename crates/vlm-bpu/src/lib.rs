//! The BPU backend: a BLLM package run through `hbdnn` over the board libraries or the
//! simulator (the package's `.hbm` files decide which; an explicit choice that contradicts
//! them is an error). Implements the engine's [`Backend`] seam with the contract's decode
//! loop: I/O by index, two cache sets a run alternates between (a third one, where the pool allows,
//! holds a pinned or stashed state), the right-aligned window mask written into
//! every head plane, M-RoPE cos/sin per row, CLEAN after CPU writes and INVALIDATE before CPU
//! reads (of the bytes concerned, or of whole buffers when the runtime refuses a flush of part
//! of one: [`flush`], probed at open), S16 logits dequantised by the output scale, and the
//! §10.2 state snapshots.
//!
//! Before anything is loaded: one engine per board ([`lock`]), the BPU march of sim containers,
//! and the ION pool ([`pool`]: the `.hbm` sizes, then the cache sets before any buffer, as
//! [`BpuOptions::pool_check`] says). Where a board may report otherwise than the simulator the
//! checks are as tolerant as BLLM ([`contract`]: cache outputs that fit, prefill caches
//! compared by `stride[0] × dim[0]`; `tower`: any rank ≥ 2,
//! the graph `visual` else the only one; [`EmbedTable`]: a longer table); per-axis
//! quantisation on a tensor the runtime reads or writes is refused, never read as `scale[0]`.
//! A prompt tail shorter than a chunk is stepped row by row, or run as one padded chunk when
//! the package sets `prefill_pads` ([`BpuOptions::prefill_tail`]; docs/package-contract.md §4.4, unconfirmed
//! on a board): where the pads go is calibrated once per package at open and cached
//! ([`tail`]). [`check`] lists every contract violation of a package for `vlm check`;
//! [`report`] adds what a board user needs to see for `vlm check --report`; [`probe`] runs a
//! package step by step (libraries, loads, flushes, one call of each graph) for `vlm probe`.
//!
//! [`source`] chooses the backend for a model source (packages here, HF checkpoints on
//! `vlm`'s CPU backend); [`sim`] is what front ends may use of the simulator.
//!
//! Must not depend on the CPU model's weights (`qwen35` is used only for its rope tables and
//! window mask), ROS or an async runtime. Handles are `Rc`-based: one thread owns a backend.
#![forbid(unsafe_code)]

mod calibrate;
pub mod check;
pub mod contract;
mod embed;
mod error;
pub mod flush;
mod held;
pub mod lock;
mod logits;
mod open;
pub mod pad_marking;
pub mod pool;
pub mod probe;
pub mod report;
pub mod sim;
pub mod source;
mod state;
mod step;
pub mod tail;
pub mod tail_cache;
mod tower;

use std::path::PathBuf;
use std::time::Duration;

use bpu_sim::Implementation;
use hbdnn::{DeviceBuffer, PackedModel, Sched};

use vlm::chat::Pos3;
use vlm::engine::{Backend, BackendInfo, Device, EngineError, StateBlob, StateShape};
use vlm::interrupt::Interrupt;
use vlm::package::ModelConfig;
use vlm::vision::PixelValues;

use contract::DecodeShape;
pub use embed::EmbedTable;
pub use error::BpuError;
pub use flush::{FlushDecision, FlushOption};
/// Device memory the process holds (buffers and loaded `.hbm` files), for diagnostics.
pub use hbdnn::device_bytes_held;
pub use lock::EngineLock;
use logits::LogitsAt;
pub use pool::PoolCheck;
pub use source::{open_assistant, ModelSource, OpenError, OpenOptions};
use step::Io;
pub use tail::{PadMarking, PadMask, PadRope, PrefillTail, TailDecision, TailMode};
use tower::Tower;

/// How to open a package.
#[derive(Debug, Clone)]
pub struct BpuOptions {
    /// Insist on an implementation; `None` = whatever the `.hbm` files are.
    pub implementation: Option<Implementation>,
    /// Board library folder (`None` = the default search).
    pub lib_dir: Option<PathBuf>,
    /// `false`: text only, `visual.hbm` is never opened.
    pub no_vision: bool,
    /// BPU task priority (0 lowest ..= 255).
    pub priority: u8,
    /// Engine lock file. Board packages always lock (this path, else `VLM_BPU_LOCK`, else
    /// [`lock::default_lock_path`]); simulator packages lock only when a path is given here
    /// or in `VLM_BPU_LOCK` (each simulator instance is its own "board", and tests run many).
    pub lock_path: Option<PathBuf>,
    /// How a prompt tail of at least `prefill_min_tail` rows runs when the package sets
    /// `prefill_pads` (docs/package-contract.md §4.4, inferred, unconfirmed on a board): [`PrefillTail::Auto`]
    /// (default) calibrates the pad layout and marking ([`PadMarking`]) at open (cached per
    /// package) and steps when it cannot; `Stepped` is correct with every package;
    /// `PadsFirst` / `PadsLast` force a layout with the default marking. Shorter tails, and
    /// every tail of a package without `prefill_pads`, are stepped.
    pub prefill_tail: PrefillTail,
    /// Where the calibrated tail decision is cached (`None`: [`tail_cache::cache_dir`]).
    pub cache_dir: Option<PathBuf>,
    /// Never use the prefill graph: every row runs through the decode graph (the model zoo's
    /// parity gate compares with and without it). A separate prefill `.hbm` is not loaded.
    pub no_prefill_graph: bool,
    /// Longest wait for one graph call. A call that takes longer fails the request and
    /// wedges the runtime (the task may still be running; see `hbdnn::Runtime::is_wedged`).
    pub timeout: Duration,
    /// Asked before each step of opening and before each cache buffer allocated or cleared;
    /// raised, [`BpuBackend::open`] stops with [`BpuError::Interrupted`] (a call in progress,
    /// such as a board's graph load, runs to its end).
    pub interrupt: Interrupt,
    /// The ION pool preflight ([`PoolCheck`]; parses `strict`, `warn`, `off`): `Strict`
    /// refuses a pool identified and too small, and one that cannot be identified; `Warn`
    /// (the default) only warns in both cases; `Off` checks nothing.
    pub pool_check: PoolCheck,
    /// Allocate a third decode cache set so that one state can be kept on the device
    /// ([`vlm::engine::Device::pin`]: the primed frame that asks start from without a copy). One
    /// more set of device memory; when it cannot be had the backend opens without it.
    pub keep_set: bool,
    /// Whether CLEAN and INVALIDATE name ranges inside an allocation ([`FlushOption`]; parses
    /// `auto`, `range`, `whole`): `Auto` (default) probes the runtime at open.
    pub flush: FlushOption,
}

/// Default of [`BpuOptions::timeout`]: the longest graph call of the 4B package is ~0.74 s.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

impl Default for BpuOptions {
    fn default() -> Self {
        Self {
            implementation: None,
            lib_dir: None,
            no_vision: false,
            priority: 0,
            lock_path: None,
            prefill_tail: PrefillTail::Auto,
            cache_dir: None,
            no_prefill_graph: false,
            timeout: DEFAULT_TIMEOUT,
            interrupt: Interrupt::new(),
            pool_check: PoolCheck::default(),
            keep_set: false,
            flush: FlushOption::Auto,
        }
    }
}

/// A graph-call time limit from seconds (a parameter or a flag): finite, above zero, and at
/// most what hbUCP's millisecond `int` can hold.
pub fn timeout_from_secs(secs: f64) -> Result<Duration, String> {
    const MAX_S: f64 = i32::MAX as f64 / 1000.0;
    if secs.is_finite() && secs > 0.0 && secs <= MAX_S {
        Ok(Duration::from_secs_f64(secs))
    } else {
        Err(format!(
            "{secs} must be a number of seconds above 0 and at most {MAX_S:.0}"
        ))
    }
}

/// A BLLM package on the BPU (board or simulator) with one decode state.
pub struct BpuBackend {
    cfg: ModelConfig,
    implementation: Implementation,
    info: BackendInfo,
    shape: DecodeShape,
    embed: EmbedTable,
    decode: Io,
    prefill: Option<Io>,
    tower: Option<Tower>,
    /// The decode cache sets: a run reads `sets[current]` and writes another one, never the
    /// kept one. Two (ping-pong), or three with [`BpuOptions::keep_set`].
    sets: Vec<Vec<DeviceBuffer>>,
    current: usize,
    /// Per set: how many window rows (right-aligned) may be non-zero in it.
    held: Vec<usize>,
    /// A state pinned in its set ([`Device::pin`]).
    pinned: Option<held::Pinned>,
    /// A state stashed in its set until the set is needed ([`Device::stash`]).
    stashed: Option<held::Stashed>,
    /// The memory of the last stashed state's host copy, for the next one.
    stash_spare: Option<StateBlob>,
    consumed: usize,
    max_pos: Option<u32>,
    /// Raw decode-logits buffer image (§10.2): the decode output, or a prefill's last row
    /// copied to its start.
    /// Stale while the decode graph's logits buffer itself is the image (after a decode
    /// step; copied here only when a prefill or a snapshot needs it).
    logit_image: Vec<u8>,
    image_in_decode_buffer: bool,
    /// Where [`Backend::last_logits`] reads from.
    logits_at: LogitsAt,
    /// Dequantised last-row logits when they are not read in place.
    logits: Vec<f32>,
    /// `Some(P)`: the decode mask buffer holds the mask for `P` consumed slots, so the next
    /// step only unmasks one column per plane instead of rewriting `heads × CL` floats.
    decode_mask_for: Option<usize>,
    axes: Vec<usize>,
    state_shape: StateShape,
    /// Scheduling of every graph run (priority, core mask, timeout).
    sched: Sched,
    /// How prompt tails run, and why ([`BpuOptions::prefill_tail`]).
    tail: TailDecision,
    /// hbDNN, hbUCP and SoC versions and where the libraries come from.
    runtime: RuntimeInfo,
    /// Range or whole-allocation flushes: what the probe found and what is used.
    flush: FlushDecision,
    /// Wall time spent inside graph runs (submit to done), for host-overhead accounting.
    graph_time: std::time::Duration,
    _packed: Vec<PackedModel>,
    /// Dropped last: the board stays locked until every buffer and handle is released.
    _lock: Option<EngineLock>,
}

impl BpuBackend {
    /// The parsed manifest.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// Which implementation runs the graphs.
    pub fn implementation(&self) -> Implementation {
        self.implementation
    }

    /// Whether a stashed state ([`Device::stash`]) is still in its cache set (not copied out).
    pub fn stash_on_device(&self) -> bool {
        self.stashed.as_ref().and_then(held::Stashed::set).is_some()
    }

    /// Total wall time spent inside text-graph runs since open: everything else a step costs
    /// is host overhead.
    pub fn graph_time(&self) -> std::time::Duration {
        self.graph_time
    }

    /// Sets the BPU task priority (0 lowest ..= 255).
    pub fn set_priority(&mut self, priority: u8) {
        <Self as Device>::set_priority(self, priority);
    }

    /// How prompt tails run (stepped or padded, which layout) and how that was decided.
    pub fn tail_decision(&self) -> &TailDecision {
        &self.tail
    }

    /// Whether the runtime accepts range flushes (the probe at open) and what the buffers use.
    pub fn flush(&self) -> FlushDecision {
        self.flush
    }

    /// The runtime that runs the graphs: library source and versions.
    pub fn runtime_info(&self) -> &RuntimeInfo {
        &self.runtime
    }
}

/// The hbDNN runtime as a report shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RuntimeInfo {
    /// `board libraries in DIR` or the in-process simulator's name.
    pub source: String,
    /// The library files (board only).
    pub libraries: Vec<PathBuf>,
    pub dnn_version: String,
    pub ucp_version: String,
    pub soc: String,
    /// Optional entry points the library lacks (their fallbacks are in use).
    pub missing_entry_points: Vec<&'static str>,
    /// Every board runtime library file mapped in this process (`/proc/self/maps`), by
    /// library: what really runs, whatever `LD_LIBRARY_PATH` did. Empty under the simulator.
    pub mapped_libraries: Vec<MappedLibraryEntry>,
}

/// One mapped board library file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MappedLibraryEntry {
    /// `libdnn`, `libhbucp`, `libhbrt4`, `libhbtl`, …
    pub library: String,
    pub path: PathBuf,
}

/// The mapped libraries grouped by library (stable order), for reports.
fn mapped_entries(libs: &[hbdnn::MappedLibrary]) -> Vec<MappedLibraryEntry> {
    let mut v: Vec<MappedLibraryEntry> = libs
        .iter()
        .map(|l| MappedLibraryEntry {
            library: l.library.clone(),
            path: l.path.clone(),
        })
        .collect();
    v.sort_by(|a, b| a.library.cmp(&b.library));
    v
}

impl RuntimeInfo {
    pub(crate) fn of(rt: &hbdnn::Runtime) -> Self {
        let v = rt.versions();
        let libraries = match rt.source() {
            hbdnn::TableSource::Board { lib_dir } => [hbdnn::LIBDNN, hbdnn::LIBHBUCP]
                .iter()
                .map(|l| lib_dir.join(l))
                .collect(),
            hbdnn::TableSource::InProcess { .. } => Vec::new(),
        };
        Self {
            source: rt.source().to_string(),
            libraries,
            dnn_version: v.dnn,
            ucp_version: v.ucp,
            soc: v.soc,
            missing_entry_points: rt.missing_entry_points(),
            mapped_libraries: mapped_entries(&rt.mapped_libraries()),
        }
    }

    /// The versions a cached calibration depends on.
    pub(crate) fn versions(&self) -> String {
        format!("hbDNN {}; hbUCP {}", self.dnn_version, self.ucp_version)
    }
}

impl Backend for BpuBackend {
    fn info(&self) -> &BackendInfo {
        &self.info
    }

    fn embed(&self, ids: &[u32], out: &mut Vec<f32>) -> Result<(), EngineError> {
        self.embed.rows(ids, out)
    }

    fn encode_image(&mut self, pixels: &PixelValues) -> Result<Vec<f32>, EngineError> {
        let tower = self.tower.as_mut().ok_or(EngineError::NoVision)?;
        tower.encode(pixels, &self.sched)
    }

    fn run_rows(&mut self, rows: &[f32], positions: &[Pos3]) -> Result<(), EngineError> {
        self.run_chunk(rows, positions, None)
    }

    fn step_interruptible(
        &mut self,
        rows: &[f32],
        positions: &[Pos3],
        interrupt: &mut dyn FnMut() -> bool,
    ) -> Result<bool, EngineError> {
        self.step_rows(rows, positions, interrupt)
    }

    fn pads_tail(&self, rows: usize) -> bool {
        self.pad_tail_marking(rows).is_some()
    }

    fn consumed(&self) -> usize {
        self.consumed
    }

    fn max_pos(&self) -> Option<u32> {
        self.max_pos
    }

    fn last_logits(&self) -> Option<&[f32]> {
        self.read_logits()
    }

    fn reset(&mut self) -> Result<(), EngineError> {
        self.clear_state()
    }

    fn snapshot(&mut self) -> Result<StateBlob, EngineError> {
        self.save_state(None)
    }

    fn snapshot_reusing(&mut self, spare: StateBlob) -> Result<StateBlob, EngineError> {
        self.save_state(Some(spare))
    }

    fn restore(&mut self, blob: &StateBlob) -> Result<(), EngineError> {
        self.load_state(blob)
    }

    fn device(&mut self) -> Option<&mut dyn Device> {
        Some(self)
    }
}

impl Device for BpuBackend {
    fn pin(&mut self) -> Option<u64> {
        self.pin_current()
    }

    fn switch_to_pinned(&mut self, id: u64) -> bool {
        self.resume_pinned(id)
    }

    fn stash(&mut self) -> Option<u64> {
        self.stash_current()
    }

    fn take_stash(&mut self, id: u64) -> Result<bool, EngineError> {
        self.unstash(id)
    }

    fn drop_stash(&mut self) {
        self.forget_stash()
    }

    fn set_priority(&mut self, priority: u8) {
        self.sched.priority = priority;
    }
}

//! The BPU backend: a BLLM package run through `hbdnn` over the board libraries or the
//! simulator (the package's `.hbm` files decide which; an explicit choice that contradicts
//! them is an error). Implements the engine's [`Backend`] seam with the contract's decode
//! loop: I/O by index, ping-pong cache sets A/B, the right-aligned window mask written into
//! every head plane, M-RoPE cos/sin per row, CLEAN after CPU writes and INVALIDATE before CPU
//! reads, S16 logits dequantised by the output scale, and the §10.2 state snapshots.
//!
//! Before anything is loaded: one engine per board ([`lock`]), the BPU march of sim containers,
//! and the ION pool ([`pool`]: the `.hbm` sizes, then the two cache sets before any buffer).
//! A prompt tail is stepped row by row unless the package sets `prefill_pads` and the caller
//! asks for [`BpuOptions::pad_tail`] (contract §4.4, unconfirmed on a board). [`check`] lists
//! every contract violation of a package for `vlm check`.
//!
//! [`source`] chooses the backend for a model source (packages here, HF checkpoints on
//! `vlm`'s CPU backend); [`sim`] is what front ends may use of the simulator.
//!
//! Must not depend on the CPU model's weights (`qwen35` is used only for its rope tables and
//! window mask), ROS or an async runtime. Handles are `Rc`-based: one thread owns a backend.
#![forbid(unsafe_code)]

pub mod check;
pub mod contract;
mod embed;
pub mod lock;
pub mod source;
pub mod pool;
pub mod sim;

use std::path::{Path, PathBuf};

use bpu_sim::{DetectError, Implementation};
use hbdnn::{DType, DeviceBuffer, Graph, PackedModel, Runtime, Sched, TensorSpec};

use vlm::chat::Pos3;
use vlm::engine::{
    check_rows, Backend, BackendInfo, CacheLayout, EngineError, StateBlob, StateShape, VisionSpec,
};
use vlm::package::{LoadOptions, ModelConfig, PackageError};
use vlm::vision::{Geometry, PixelValues};

use contract::{DecodeShape, FIXED_IN};
pub use embed::EmbedTable;
pub use lock::EngineLock;
pub use source::{open_assistant, ModelSource, OpenError, OpenOptions};

/// Failures opening a package on the BPU; each names the file and the reason.
#[derive(Debug, thiserror::Error)]
pub enum BpuError {
    #[error(transparent)]
    Package(#[from] PackageError),
    #[error(transparent)]
    Detect(#[from] DetectError),
    #[error("{}: {source}", path.display())]
    Hbdnn {
        path: PathBuf,
        #[source]
        source: hbdnn::Error,
    },
    #[error("simulator function table: {0}")]
    SimTable(#[from] bpu_sim::SimTableError),
    #[error("{}: graph contract mismatch: {reason}", path.display())]
    Contract { path: PathBuf, reason: String },
    #[error("{}: {reason}", path.display())]
    Embed { path: PathBuf, reason: String },
    #[error("{}: {reason}", path.display())]
    Config { path: PathBuf, reason: String },
    /// Another BPU engine (this process or another) holds the engine lock.
    #[error("{}: another BPU engine is running on this board (the engine lock is held); stop it first — two can take the board down", path.display())]
    Busy { path: PathBuf },
    #[error("{}: {reason}", path.display())]
    Lock { path: PathBuf, reason: String },
    /// The ION pool cannot hold what the package needs; nothing was loaded or allocated.
    #[error("{}: {what} need {needed} bytes but the ION pool has {available} bytes free ({source_desc}); fix: {fix}", path.display())]
    Pool {
        path: PathBuf,
        what: String,
        needed: u64,
        available: u64,
        source_desc: String,
        fix: String,
    },
    /// A graph compiled for another BPU architecture.
    #[error("{}: compiled for another BPU: {detail}", path.display())]
    March { path: PathBuf, detail: String },
}

/// How to open a package.
#[derive(Debug, Clone, Default)]
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
    /// Run a prompt tail of at least `prefill_min_tail` rows as one padded prefill chunk when
    /// the package sets `prefill_pads` (contract §4.4, inferred, unconfirmed on a board).
    /// Default `false`: the tail is stepped row by row, correct with every package.
    pub pad_tail: bool,
}

/// Where the last row's logits live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LogitsAt {
    /// Empty state.
    Nowhere,
    /// `BpuBackend::logits` (S16 dequantised, or after a prefill / restore).
    Vec,
    /// F32 logits read in place from the decode graph's output buffer (no copy per step).
    DecodeBuffer,
}

/// The vision tower graph and its buffers.
struct Tower {
    graph: Graph,
    input: DeviceBuffer,
    output: DeviceBuffer,
    spec: VisionSpec,
}

/// Fixed inputs (x, cos, sin, mask) and the logits output of one text graph.
struct Io {
    graph: Graph,
    fixed: Vec<DeviceBuffer>,
    logits: DeviceBuffer,
    rows: usize,
}

impl Io {
    fn new(graph: Graph, rows: usize, path: &Path) -> Result<Self, BpuError> {
        let hb = |source| BpuError::Hbdnn {
            path: path.to_owned(),
            source,
        };
        let fixed = (0..FIXED_IN)
            .map(|i| graph.alloc_input(i))
            .collect::<Result<Vec<_>, _>>()
            .map_err(hb)?;
        let logits = graph.alloc_output(0).map_err(hb)?;
        Ok(Self {
            graph,
            fixed,
            logits,
            rows,
        })
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
    /// Cache sets A and B; `sets[phase]` holds the current state.
    sets: [Vec<DeviceBuffer>; 2],
    phase: usize,
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
    sched: Sched,
    /// `Some(min rows)` when tails are padded (package `prefill_pads` and [`BpuOptions::pad_tail`]).
    pad_min_tail: Option<usize>,
    /// Wall time spent inside graph runs (submit to done), for host-overhead accounting.
    graph_time: std::time::Duration,
    _packed: Vec<PackedModel>,
    /// Dropped last: the board stays locked until every buffer and handle is released.
    _lock: Option<EngineLock>,
}

/// Any device failure fails the request; the state (the input cache set) is left untouched.
fn device(what: &str, e: hbdnn::Error) -> EngineError {
    EngineError::Bpu {
        what: what.to_owned(),
        timeout: e.is_timeout(),
        source: Box::new(e),
    }
}

/// A load failure, with the ION advice for an exhausted pool and the march explanation for an
/// incompatible graph.
fn load_error(path: &Path, source: hbdnn::Error) -> BpuError {
    match source.status() {
        Some(hbdnn::Status::MemAllocFail) => BpuError::Pool {
            path: path.to_owned(),
            what: "the load".into(),
            needed: std::fs::metadata(path).map_or(0, |m| m.len()),
            available: 0,
            source_desc: format!("the runtime refused the allocation: {source}"),
            fix: pool::ION_FIX.to_owned(),
        },
        Some(hbdnn::Status::ModelIncompatible) => BpuError::March {
            path: path.to_owned(),
            detail: format!(
                "the runtime refused it ({source}); the published packages are compiled for `nash-m` (S100/S100P) and must be recompiled for another BPU"
            ),
        },
        _ => BpuError::Hbdnn {
            path: path.to_owned(),
            source,
        },
    }
}

/// Sim containers name the march they were compiled for; refuse those the simulated platform
/// would refuse, naming the file, before anything is loaded.
fn check_sim_march(files: &[PathBuf]) -> Result<(), BpuError> {
    let platform = bpu_sim::Sim::current().platform_march();
    for f in files {
        let c = bpu_sim::Container::read(f).map_err(|e| BpuError::Config {
            path: f.clone(),
            reason: e.to_string(),
        })?;
        if let Some(m) = c.header.march.as_deref() {
            if m != platform {
                return Err(BpuError::March {
                    path: f.clone(),
                    detail: format!("model march `{m}`, platform march `{platform}`"),
                });
            }
        }
    }
    Ok(())
}

impl BpuBackend {
    /// Opens the package in `dir`. For simulator packages the calling thread's simulator
    /// instance ([`bpu_sim::Sim::current`], or one `install`ed before) runs the graphs.
    pub fn open(dir: &Path, opts: &BpuOptions) -> Result<Self, BpuError> {
        let cfg = ModelConfig::load(
            dir,
            LoadOptions {
                vision: !opts.no_vision,
            },
        )?;
        let mut files = vec![cfg.hbm.clone()];
        files.extend(cfg.existing_hbm_prefill().map(Path::to_owned));
        files.extend(cfg.visual.clone());
        let implementation = bpu_sim::inspect_package(&files, opts.implementation)?;
        let lock_path = opts.lock_path.clone().or_else(lock::env_lock_path);
        let engine_lock = match (implementation, lock_path) {
            (_, Some(p)) => Some(EngineLock::acquire(&p)?),
            (Implementation::Board, None) => Some(EngineLock::acquire(&lock::default_lock_path())?),
            (Implementation::Sim, None) => None,
        };
        if implementation == Implementation::Sim {
            check_sim_march(&files)?;
        }
        let pool_reading = match implementation {
            Implementation::Sim => pool::sim_pool(),
            Implementation::Board => pool::board_pool(),
        };
        let mut hbm_bytes = 0u64;
        for f in &files {
            let len = std::fs::metadata(f)
                .map_err(|e| BpuError::Config {
                    path: f.clone(),
                    reason: format!("cannot stat: {e}"),
                })?
                .len();
            hbm_bytes += match implementation {
                // The board loader asks for slightly more than the file (S600: +1.3 MB on
                // 2.46 GB); the simulator takes the file size exactly.
                Implementation::Board => pool::with_load_margin(len),
                Implementation::Sim => len,
            };
        }
        pool::check("the .hbm files", hbm_bytes, &pool_reading, &cfg.hbm)?;
        let runtime = match implementation {
            Implementation::Sim => Runtime::new(bpu_sim::table()?),
            Implementation::Board => {
                Runtime::board(opts.lib_dir.as_deref()).map_err(|source| BpuError::Hbdnn {
                    path: opts
                        .lib_dir
                        .clone()
                        .unwrap_or_else(|| PathBuf::from("board libraries")),
                    source,
                })?
            }
        };
        tracing::info!(package = %dir.display(), %implementation, "opening BPU package");
        let load = |p: &Path| runtime.load(&[p]).map_err(|source| load_error(p, source));
        let contract = |path: &Path, reason: String| BpuError::Contract {
            path: path.to_owned(),
            reason,
        };
        let main = load(&cfg.hbm)?;
        if !main.has_graph(&cfg.graph) {
            return Err(contract(
                &cfg.hbm,
                format!("no graph `{}` (has {:?})", cfg.graph, main.graph_names()),
            ));
        }
        let dec_graph = main.graph(&cfg.graph).map_err(|source| BpuError::Hbdnn {
            path: cfg.hbm.clone(),
            source,
        })?;
        let shape = contract::check_decode(&dec_graph).map_err(|r| contract(&cfg.hbm, r))?;
        let mut packed = vec![];
        let pre_name = cfg.prefill_graph();
        let pre_src = match cfg.existing_hbm_prefill() {
            Some(p) => {
                let m = load(p)?;
                packed.push(m);
                Some(p.to_owned())
            }
            None => None,
        };
        let pre_holder = match (&pre_src, packed.first()) {
            (Some(p), Some(m)) if m.has_graph(&pre_name) => Some((p.clone(), m)),
            _ if main.has_graph(&pre_name) => Some((cfg.hbm.clone(), &main)),
            _ => None,
        };
        let mut prefill = None;
        match pre_holder {
            Some((path, m)) => {
                let g = m.graph(&pre_name).map_err(|source| BpuError::Hbdnn {
                    path: path.clone(),
                    source,
                })?;
                match contract::check_prefill(&g, &dec_graph, &shape) {
                    Ok(n) => {
                        tracing::info!(file = %path.display(), graph = %pre_name, chunk = n, "prefill graph");
                        prefill = Some((g, n, path));
                    }
                    Err(reason) => tracing::warn!(
                        file = %path.display(), graph = %pre_name, %reason,
                        "prefill graph not compatible with the decode graph: stepping every row"
                    ),
                }
            }
            None => tracing::info!(graph = %pre_name, "no prefill graph: stepping every row"),
        }
        let embed_path = cfg.embed.clone().ok_or_else(|| BpuError::Config {
            path: cfg.manifest.clone(),
            reason: "the package names no `embed` table".into(),
        })?;
        let embed = EmbedTable::open(&embed_path, shape.vocab, shape.hidden)?;
        let tower_model = match &cfg.visual {
            Some(p) => Some((p.clone(), load(p)?)),
            None => None,
        };
        if !cfg.mrope_interleaved && !cfg.mrope_section.is_empty() {
            return Err(BpuError::Config {
                path: cfg.manifest.clone(),
                reason: "only interleaved M-RoPE (`mrope_interleaved: true`) is supported".into(),
            });
        }
        let section: Vec<usize> = cfg.mrope_section.iter().map(|&s| s as usize).collect();
        let axes = qwen35::config::mrope_axes(shape.rot / 2, &section);
        // Second preflight, before any buffer exists: two cache sets plus the graphs' I/O.
        let io_bytes = |g: &Graph| -> u64 {
            g.inputs()[..FIXED_IN.min(g.inputs().len())]
                .iter()
                .chain(g.outputs().first())
                .map(|s| s.byte_size as u64)
                .sum()
        };
        let cache_set: u64 = dec_graph.inputs()[FIXED_IN..]
            .iter()
            .map(|s| s.byte_size as u64)
            .sum();
        let mut buffers = 2 * cache_set + io_bytes(&dec_graph);
        if let Some((g, _, _)) = &prefill {
            buffers += io_bytes(g);
        }
        let after_load = match implementation {
            Implementation::Sim => pool::sim_pool(),
            Implementation::Board => pool::PoolReading {
                available: pool_reading.available.map(|a| a.saturating_sub(hbm_bytes)),
                ..pool_reading.clone()
            },
        };
        pool::check(
            "two cache sets and the graph I/O buffers",
            buffers,
            &after_load,
            &cfg.hbm,
        )?;
        let prefill = match prefill {
            Some((g, n, path)) => Some(Io::new(g, n, &path)?),
            None => None,
        };
        let tower = match tower_model {
            Some((p, m)) => {
                let t = Self::open_tower(&cfg, &p, &m, shape.hidden)?;
                packed.push(m);
                Some(t)
            }
            None => None,
        };
        let decode = Io::new(dec_graph, 1, &cfg.hbm)?;
        let alloc_set = || {
            (0..shape.n_cache)
                .map(|c| decode.graph.alloc_input(FIXED_IN + c))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|source| BpuError::Hbdnn {
                    path: cfg.hbm.clone(),
                    source,
                })
        };
        let sets = [alloc_set()?, alloc_set()?];
        let caches = decode.graph.inputs()[FIXED_IN..]
            .iter()
            .map(|s| CacheLayout {
                bytes: s.byte_size,
                window_row_bytes: contract::window_row_bytes(s, shape.context),
            })
            .collect();
        let logit_bytes = decode.graph.outputs()[0].byte_size;
        let state_shape = StateShape {
            vocab: shape.vocab,
            context: shape.context,
            logit_bytes,
            caches,
        };
        let info = BackendInfo {
            hidden: shape.hidden,
            vocab: shape.vocab,
            context: shape.context,
            prefill_chunk: prefill.as_ref().map_or(0, |p| p.rows),
            mask_heads: shape.mask_heads,
            vision: tower.as_ref().map(|t| t.spec),
        };
        packed.push(main);
        let cores = cfg.bpu_cores;
        let pad_min_tail = match (opts.pad_tail, cfg.prefill_pads, info.prefill_chunk) {
            (true, true, n) if n >= 2 => {
                let min = cfg.prefill_min_tail.map_or(n, |m| m as usize).max(2);
                tracing::info!(min_tail = min, chunk = n, "padded prefill tail enabled");
                Some(min)
            }
            (true, _, _) => {
                tracing::info!(
                    "pad_tail requested but the package has no padded prefill: stepping the tail"
                );
                None
            }
            _ => None,
        };
        let mut me = Self {
            implementation,
            info,
            shape,
            embed,
            decode,
            prefill,
            tower,
            sets,
            phase: 0,
            consumed: 0,
            max_pos: None,
            logit_image: vec![0; logit_bytes],
            image_in_decode_buffer: false,
            logits_at: LogitsAt::Nowhere,
            logits: Vec::new(),
            decode_mask_for: None,
            axes,
            state_shape,
            sched: Sched {
                priority: opts.priority,
                core_mask: Sched::cores(cores),
                timeout_ms: 0,
            },
            cfg,
            pad_min_tail,
            graph_time: std::time::Duration::ZERO,
            _packed: packed,
            _lock: engine_lock,
        };
        me.reset().map_err(|e| BpuError::Config {
            path: me.cfg.hbm.clone(),
            reason: e.to_string(),
        })?;
        Ok(me)
    }

    fn open_tower(
        cfg: &ModelConfig,
        path: &Path,
        m: &PackedModel,
        hidden: usize,
    ) -> Result<Tower, BpuError> {
        let contract = |reason: String| BpuError::Contract {
            path: path.to_owned(),
            reason,
        };
        let name = m
            .graph_names()
            .first()
            .cloned()
            .ok_or_else(|| contract("no graph in the file".into()))?;
        let hb = |source| BpuError::Hbdnn {
            path: path.to_owned(),
            source,
        };
        let graph = m.graph(&name).map_err(hb)?;
        let (i, o) = (graph.inputs(), graph.outputs());
        if i.len() != 1 || o.len() != 1 || i[0].rank() != 2 || o[0].rank() != 2 {
            return Err(contract(format!(
                "tower `{name}` must have one 2-D input and one 2-D output"
            )));
        }
        if o[0].last_dim() != hidden || !matches!(o[0].dtype, DType::F32 | DType::S16) {
            return Err(contract(format!(
                "tower output {:?} {:?} is not [n, {hidden}] F32/S16",
                o[0].shape, o[0].dtype
            )));
        }
        let v = &cfg.vision;
        let geometry = Geometry::from_tower_input(
            i[0].shape[0],
            i[0].shape[1],
            v.patch as usize,
            v.merge as usize,
            v.temporal as usize,
        )
        .map_err(|e| contract(format!("tower input {:?}: {e}", i[0].shape)))?;
        let input = graph.alloc_input(0).map_err(hb)?;
        let output = graph.alloc_output(0).map_err(hb)?;
        Ok(Tower {
            spec: VisionSpec {
                geometry,
                mean: v.mean,
                std: v.std,
            },
            graph,
            input,
            output,
        })
    }

    /// The parsed manifest.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// Which implementation runs the graphs.
    pub fn implementation(&self) -> Implementation {
        self.implementation
    }

    /// Scheduling of every graph run (priority, core mask, timeout).
    pub fn sched(&self) -> Sched {
        self.sched
    }

    /// Total wall time spent inside text-graph runs since open: everything else a step costs
    /// is host overhead.
    pub fn graph_time(&self) -> std::time::Duration {
        self.graph_time
    }

    /// Sets the BPU task priority (0 lowest ..= 255).
    pub fn set_priority(&mut self, priority: u8) {
        self.sched.priority = priority;
    }

    /// The logits dtype of the decode graph (F32 or S16) and its dequantisation scale.
    pub fn logits_format(&self) -> (DType, f32) {
        let s = &self.decode.graph.outputs()[0];
        (s.dtype, s.scale0())
    }

    fn write(buf: &mut DeviceBuffer, spec: &TensorSpec, data: &[f32]) -> Result<(), EngineError> {
        buf.write_tensor(spec, data)
            .map_err(|e| device("input write", e))?;
        buf.clean().map_err(|e| device("CLEAN", e))
    }

    /// Dequantises one raw logits row into `out` (reused between steps).
    fn dequantise_into(dtype: DType, scale: f32, vocab: usize, raw: &[u8], out: &mut Vec<f32>) {
        out.clear();
        match dtype {
            DType::S16 => out.extend(
                raw.chunks_exact(2)
                    .take(vocab)
                    .map(|b| f32::from(i16::from_le_bytes([b[0], b[1]])) * scale),
            ),
            _ => out.extend(
                raw.chunks_exact(4)
                    .take(vocab)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            ),
        }
    }

    /// Sets the last logits from the raw row at the start of the decode-logits image.
    fn logits_from_image(&mut self) {
        let (dtype, scale) = self.logits_format();
        let len = self.row_bytes();
        Self::dequantise_into(
            dtype,
            scale,
            self.shape.vocab,
            &self.logit_image[..len],
            &mut self.logits,
        );
        self.logits_at = LogitsAt::Vec;
    }

    /// Copies the decode output buffer into the decode-logits image when it stands for it.
    fn materialise_image(&mut self) {
        if self.image_in_decode_buffer {
            let full = self.decode.logits.as_bytes();
            let k = full.len().min(self.logit_image.len());
            self.logit_image[..k].copy_from_slice(&full[..k]);
            self.image_in_decode_buffer = false;
        }
    }

    /// The decode mask for `P = consumed`: when the buffer holds the mask for `P - 1`, only
    /// column `CL - P - 1` of each plane opens (contract §3.3); otherwise the whole mask is
    /// written.
    fn write_decode_mask(&mut self) -> Result<(), EngineError> {
        let p = self.consumed;
        let cl = self.shape.context;
        let spec = &self.decode.graph.inputs()[3];
        if p >= 1 && p < cl && self.decode_mask_for == Some(p - 1) && spec.strides.len() == 2 {
            let col = cl - p - 1;
            let (s0, s1) = (spec.strides[0], spec.strides[1]);
            let buf = &mut self.decode.fixed[3];
            for h in 0..self.shape.mask_heads {
                let at = h * s0 + col * s1;
                let bytes = buf.as_mut_bytes();
                bytes[at..at + 4].copy_from_slice(&0f32.to_le_bytes());
                buf.clean_range(at, 4).map_err(|e| device("CLEAN", e))?;
            }
        } else {
            let mask = qwen35::window_mask(p, 1, cl, self.shape.mask_heads);
            let spec = spec.clone();
            Self::write(&mut self.decode.fixed[3], &spec, &mask)?;
        }
        self.decode_mask_for = Some(p);
        Ok(())
    }

    fn row_bytes(&self) -> usize {
        let esz = if self.shape.logits == DType::S16 {
            2
        } else {
            4
        };
        self.shape.vocab * esz
    }
}

impl BpuBackend {
    /// Whether a tail of `t` rows goes through the prefill graph padded to `N`: padding
    /// enabled, `prefill_min_tail <= t < N`, and `N` free slots (the graph shifts every window
    /// by `N` before the host takes the pad rows back out).
    fn pad_tail_fits(&self, t: usize) -> bool {
        let n = self.info.prefill_chunk;
        self.pad_min_tail
            .is_some_and(|min| t >= min && t < n && self.context_left() >= n)
    }

    /// Runs `positions.len()` rows through the decode graph (1 row) or the prefill graph
    /// (`N` rows, or fewer padded to `pad_to = Some(N)`: pad rows are zero with cos 1 / sin 0
    /// and a fully masked mask row, contract §4.4).
    fn run_chunk(
        &mut self,
        rows: &[f32],
        positions: &[Pos3],
        pad_to: Option<usize>,
    ) -> Result<(), EngineError> {
        let n = positions.len();
        let h = self.shape.hidden;
        if rows.len() != n * h {
            return Err(EngineError::Shape {
                what: "rows [n, hidden]",
                expected: n * h,
                found: rows.len(),
            });
        }
        let chunk = self.info.prefill_chunk;
        let padded = pad_to.is_some_and(|p| p == chunk && chunk >= 2 && n >= 1 && n < chunk);
        if !(padded || n == 1 || (chunk >= 2 && n == chunk)) {
            return Err(EngineError::RowCount { rows: n, chunk });
        }
        // Rows the graph runs: the real ones, then pads up to N.
        let g_rows = if padded { chunk } else { n };
        let left = self.context_left();
        if g_rows > left {
            return Err(EngineError::ContextOverflow {
                needed: g_rows,
                left,
            });
        }
        let rope: Vec<qwen35::Pos3> = positions.iter().map(|&p| p.into()).collect();
        let (mut cos, mut sin) =
            qwen35::rope_tables(&rope, self.shape.rot, self.cfg.rope_theta, &self.axes);
        let cl = self.shape.context;
        let mut mask = if g_rows == 1 {
            self.write_decode_mask()?;
            Vec::new()
        } else {
            qwen35::window_mask(self.consumed, g_rows, cl, self.shape.mask_heads)
        };
        let mut x_pad = Vec::new();
        let rows = if padded {
            let pads = g_rows - n;
            cos.resize(g_rows * self.shape.rot, 1.0);
            sin.resize(g_rows * self.shape.rot, 0.0);
            for plane in mask.chunks_exact_mut(g_rows * cl) {
                plane[n * cl..].fill(qwen35::MASK_NEG);
            }
            x_pad.reserve(g_rows * h);
            x_pad.extend_from_slice(rows);
            x_pad.resize(x_pad.len() + pads * h, 0.0);
            x_pad.as_slice()
        } else {
            rows
        };
        let io = if g_rows == 1 {
            &mut self.decode
        } else {
            self.prefill
                .as_mut()
                .ok_or(EngineError::RowCount { rows: n, chunk })?
        };
        let specs = io.graph.inputs()[..FIXED_IN].to_vec();
        for (i, data) in [rows, &cos, &sin, &mask].into_iter().enumerate() {
            // The decode mask is already in place (`write_decode_mask`).
            if i == 3 && g_rows == 1 {
                continue;
            }
            Self::write(&mut io.fixed[i], &specs[i], data)?;
        }
        let (a, b) = self.sets.split_at_mut(1);
        let (cur, next) = if self.phase == 0 {
            (&a[0], &mut b[0])
        } else {
            (&b[0], &mut a[0])
        };
        let mut inputs: Vec<&DeviceBuffer> = io.fixed.iter().collect();
        inputs.extend(cur.iter());
        let mut outputs: Vec<&mut DeviceBuffer> = vec![&mut io.logits];
        outputs.extend(next.iter_mut());
        let what = if g_rows == 1 {
            "decode run"
        } else {
            "prefill run"
        };
        let t0 = std::time::Instant::now();
        let ran = io.graph.run(&inputs, &mut outputs, &self.sched);
        self.graph_time += t0.elapsed();
        ran.map_err(|e| device(what, e))?;
        io.logits
            .invalidate()
            .map_err(|e| device("INVALIDATE", e))?;
        // Last row of the logits output, copied to the start of the decode-logits image.
        let out = &io.graph.outputs()[0];
        // All-row logits of a padded chunk: the last real row's (pad rows follow it).
        let last = if out.rows() >= g_rows {
            n - 1
        } else {
            out.rows().saturating_sub(1)
        };
        let off = out.row_offset(last);
        let len = self.shape.vocab
            * if self.shape.logits == DType::S16 {
                2
            } else {
                4
            };
        if io.logits.as_bytes().len() < off + len {
            return Err(EngineError::Shape {
                what: "logits row inside the output buffer",
                expected: off + len,
                found: io.logits.size(),
            });
        }
        if padded {
            Self::unpad_windows(next, &self.state_shape, g_rows - n, self.consumed + g_rows)?;
        }
        self.phase ^= 1;
        self.consumed += n;
        let top = positions.iter().map(Pos3::max).max().unwrap_or(0);
        self.max_pos = Some(self.max_pos.map_or(top, |m| m.max(top)));
        if g_rows == 1 {
            // The decode output is the image itself; F32 logits are read in place.
            self.image_in_decode_buffer = true;
            let raw = &self.decode.logits.as_bytes()[..len];
            if self.shape.logits == DType::F32 && bytemuck::try_cast_slice::<u8, f32>(raw).is_ok() {
                self.logits_at = LogitsAt::DecodeBuffer;
            } else {
                let (dtype, scale) = self.logits_format();
                Self::dequantise_into(dtype, scale, self.shape.vocab, raw, &mut self.logits);
                self.logits_at = LogitsAt::Vec;
            }
        } else {
            // A prefill chunk: its last row replaces the first row of the decode image.
            self.materialise_image();
            let io = self
                .prefill
                .as_ref()
                .ok_or(EngineError::RowCount { rows: n, chunk })?;
            self.logit_image[..len].copy_from_slice(&io.logits.as_bytes()[off..off + len]);
            self.logits_from_image();
        }
        Ok(())
    }

    /// After a padded chunk the window-indexed K/V caches end with `pads` zero rows; move the
    /// real rows back to the right end and zero the front (contract §4.4): `P` grows by the
    /// real rows only. Only the last `filled` rows (`P` before the chunk + `N`) can be
    /// non-zero — the window is right-aligned and starts zeroed — so only they move, and the
    /// cost follows the conversation, not the window size.
    fn unpad_windows(
        set: &mut [DeviceBuffer],
        shape: &StateShape,
        pads: usize,
        filled: usize,
    ) -> Result<(), EngineError> {
        let first = shape.context - filled.min(shape.context);
        for (buf, layout) in set.iter_mut().zip(&shape.caches) {
            let Some(row) = layout.window_row_bytes else {
                continue;
            };
            let (start, end) = (first * row, shape.context * row);
            buf.invalidate_range(start, end - start)
                .map_err(|e| device("INVALIDATE", e))?;
            let bytes = buf.as_mut_bytes();
            let shift = pads * row;
            bytes.copy_within(start..end - shift, start + shift);
            bytes[start..start + shift].fill(0);
            buf.clean_range(start, end - start)
                .map_err(|e| device("CLEAN", e))?;
        }
        Ok(())
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
        let t = self.tower.as_mut().ok_or(EngineError::NoVision)?;
        let ispec = &t.graph.inputs()[0];
        if pixels.rows != ispec.shape[0] || pixels.row_len != ispec.shape[1] {
            return Err(EngineError::Shape {
                what: "tower input [n_patch, row_len]",
                expected: ispec.shape[0] * ispec.shape[1],
                found: pixels.rows * pixels.row_len,
            });
        }
        t.input
            .write_tensor(ispec, &pixels.data)
            .map_err(|e| device("tower input write", e))?;
        t.input.clean().map_err(|e| device("CLEAN", e))?;
        t.graph
            .run(&[&t.input], &mut [&mut t.output], &self.sched)
            .map_err(|e| device("vision tower run", e))?;
        t.output.invalidate().map_err(|e| device("INVALIDATE", e))?;
        let ospec = &t.graph.outputs()[0];
        match ospec.dtype {
            DType::S16 => {
                let s = ospec.scale0();
                let q = t
                    .output
                    .read_tensor::<i16>(ospec)
                    .map_err(|e| device("tower output read", e))?;
                Ok(q.into_iter().map(|v| f32::from(v) * s).collect())
            }
            _ => t
                .output
                .read_tensor::<f32>(ospec)
                .map_err(|e| device("tower output read", e)),
        }
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
        let h = self.info.hidden;
        let n = check_rows(h, rows, positions, self.context_left())?;
        let chunk = self.info.prefill_chunk;
        let mut i = 0;
        while i < n {
            if interrupt() {
                return Ok(false);
            }
            let rest = n - i;
            let (take, padded) = if chunk >= 2 && rest >= chunk {
                (chunk, false)
            } else if self.pad_tail_fits(rest) {
                (rest, true)
            } else {
                (1, false)
            };
            let (r, p) = (&rows[i * h..(i + take) * h], &positions[i..i + take]);
            if padded {
                self.run_chunk(r, p, Some(chunk))?;
            } else {
                self.run_chunk(r, p, None)?;
            }
            i += take;
        }
        Ok(true)
    }

    fn consumed(&self) -> usize {
        self.consumed
    }

    fn max_pos(&self) -> Option<u32> {
        self.max_pos
    }

    fn last_logits(&self) -> Option<&[f32]> {
        match self.logits_at {
            LogitsAt::Nowhere => None,
            LogitsAt::Vec => Some(&self.logits),
            LogitsAt::DecodeBuffer => {
                let len = self.shape.vocab * 4;
                bytemuck::try_cast_slice(&self.decode.logits.as_bytes()[..len]).ok()
            }
        }
    }

    fn reset(&mut self) -> Result<(), EngineError> {
        for set in &mut self.sets {
            for buf in set.iter_mut() {
                buf.as_mut_bytes().fill(0);
                buf.clean().map_err(|e| device("CLEAN", e))?;
            }
        }
        self.phase = 0;
        self.consumed = 0;
        self.max_pos = None;
        self.logits_at = LogitsAt::Nowhere;
        self.logits.clear();
        self.image_in_decode_buffer = false;
        self.logit_image.fill(0);
        Ok(())
    }

    fn snapshot(&mut self) -> Result<StateBlob, EngineError> {
        self.materialise_image();
        let set = &mut self.sets[self.phase];
        for buf in set.iter_mut() {
            buf.invalidate().map_err(|e| device("INVALIDATE", e))?;
        }
        let caches: Vec<&[u8]> = set.iter().map(DeviceBuffer::as_bytes).collect();
        let blob = StateBlob::build(
            &self.state_shape,
            self.consumed,
            self.max_pos,
            &caches,
            &self.logit_image,
        )?;
        tracing::debug!(
            bytes = blob.size_bytes(),
            consumed = self.consumed,
            "BPU state snapshot"
        );
        Ok(blob)
    }

    fn restore(&mut self, blob: &StateBlob) -> Result<(), EngineError> {
        let view = blob.view(&self.state_shape)?;
        if view.consumed > self.shape.context {
            return Err(EngineError::State {
                reason: format!(
                    "P {} exceeds the window {}",
                    view.consumed, self.shape.context
                ),
            });
        }
        let set = &mut self.sets[self.phase];
        for (buf, (range, data)) in set.iter_mut().zip(&view.caches) {
            let bytes = buf.as_mut_bytes();
            bytes.fill(0);
            bytes[range.clone()].copy_from_slice(data);
            buf.clean().map_err(|e| device("CLEAN", e))?;
        }
        self.consumed = view.consumed;
        self.max_pos = view.max_pos;
        self.logit_image.copy_from_slice(view.logits);
        self.image_in_decode_buffer = false;
        if view.consumed > 0 {
            self.logits_from_image();
        } else {
            self.logits_at = LogitsAt::Nowhere;
        }
        tracing::debug!(
            bytes = blob.size_bytes(),
            consumed = view.consumed,
            "BPU state restored"
        );
        Ok(())
    }
}

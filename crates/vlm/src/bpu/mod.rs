//! The BPU backend: a BLLM package run through `hbdnn` over the board libraries or the
//! simulator (the package's `.hbm` files decide which; an explicit choice that contradicts
//! them is an error). Implements the engine's [`Backend`] seam with the contract's decode
//! loop: I/O by index, ping-pong cache sets A/B, the right-aligned window mask written into
//! every head plane, M-RoPE cos/sin per row, CLEAN after CPU writes and INVALIDATE before CPU
//! reads, S16 logits dequantised by the output scale, and the §10.2 state snapshots.
//!
//! Must not depend on the CPU model's weights (`qwen35` is used only for its rope tables and
//! window mask), ROS or an async runtime. Handles are `Rc`-based: one thread owns a backend.
#![forbid(unsafe_code)]

pub mod contract;
mod embed;

use std::path::{Path, PathBuf};

use bpu_sim::{DetectError, Implementation};
use hbdnn::{DType, DeviceBuffer, Graph, PackedModel, Runtime, Sched, TensorSpec};

use crate::chat::Pos3;
use crate::engine::{
    Backend, BackendInfo, CacheLayout, EngineError, StateBlob, StateShape, VisionSpec,
};
use crate::package::{LoadOptions, ModelConfig, PackageError};
use crate::vision::{Geometry, PixelValues};

use contract::{DecodeShape, FIXED_IN};
pub use embed::EmbedTable;

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
    logit_image: Vec<u8>,
    logits: Option<Vec<f32>>,
    axes: Vec<usize>,
    state_shape: StateShape,
    sched: Sched,
    _packed: Vec<PackedModel>,
}

fn to_rope(p: &Pos3) -> qwen35::Pos3 {
    qwen35::Pos3 {
        t: i64::from(p.t),
        h: i64::from(p.h),
        w: i64::from(p.w),
    }
}

/// Any device failure fails the request; the state (the input cache set) is left untouched.
fn device(what: &str, e: hbdnn::Error) -> EngineError {
    EngineError::Bpu {
        what: what.to_owned(),
        source: e,
    }
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
        let load = |p: &Path| {
            runtime.load(&[p]).map_err(|source| BpuError::Hbdnn {
                path: p.to_owned(),
                source,
            })
        };
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
                        prefill = Some(Io::new(g, n, &path)?);
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
        let tower = match &cfg.visual {
            Some(p) => {
                let m = load(p)?;
                let t = Self::open_tower(&cfg, p, &m, shape.hidden)?;
                packed.push(m);
                Some(t)
            }
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
            logits: None,
            axes,
            state_shape,
            sched: Sched {
                priority: opts.priority,
                core_mask: Sched::cores(cores),
                timeout_ms: 0,
            },
            cfg,
            _packed: packed,
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

    /// Dequantises one raw logits row.
    fn dequantise(&self, raw: &[u8]) -> Vec<f32> {
        let (dtype, scale) = self.logits_format();
        match dtype {
            DType::S16 => raw
                .chunks_exact(2)
                .take(self.shape.vocab)
                .map(|b| f32::from(i16::from_le_bytes([b[0], b[1]])) * scale)
                .collect(),
            _ => raw
                .chunks_exact(4)
                .take(self.shape.vocab)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        }
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
        if !(n == 1 || (chunk >= 2 && n == chunk)) {
            return Err(EngineError::RowCount { rows: n, chunk });
        }
        let left = self.context_left();
        if n > left {
            return Err(EngineError::ContextOverflow { needed: n, left });
        }
        let rope: Vec<qwen35::Pos3> = positions.iter().map(to_rope).collect();
        let (cos, sin) =
            qwen35::rope_tables(&rope, self.shape.rot, self.cfg.rope_theta, &self.axes);
        let mask = qwen35::window_mask(self.consumed, n, self.shape.context, self.shape.mask_heads);
        let io = if n == 1 {
            &mut self.decode
        } else {
            self.prefill
                .as_mut()
                .ok_or(EngineError::RowCount { rows: n, chunk })?
        };
        let specs = io.graph.inputs()[..FIXED_IN].to_vec();
        for (i, data) in [rows, &cos, &sin, &mask].into_iter().enumerate() {
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
        let what = if n == 1 { "decode run" } else { "prefill run" };
        io.graph
            .run(&inputs, &mut outputs, &self.sched)
            .map_err(|e| device(what, e))?;
        io.logits
            .invalidate()
            .map_err(|e| device("INVALIDATE", e))?;
        // Last row of the logits output, copied to the start of the decode-logits image.
        let out = &io.graph.outputs()[0];
        let last = out.rows().saturating_sub(1);
        let off = out.row_offset(last);
        let len = self.shape.vocab
            * if self.shape.logits == DType::S16 {
                2
            } else {
                4
            };
        let src = io
            .logits
            .as_bytes()
            .get(off..off + len)
            .ok_or(EngineError::Shape {
                what: "logits row inside the output buffer",
                expected: off + len,
                found: io.logits.size(),
            })?;
        if n == 1 {
            let full = io.logits.as_bytes();
            let k = full.len().min(self.logit_image.len());
            self.logit_image[..k].copy_from_slice(&full[..k]);
        }
        self.logit_image[..len].copy_from_slice(src);
        self.phase ^= 1;
        self.consumed += n;
        let top = positions.iter().map(Pos3::max).max().unwrap_or(0);
        self.max_pos = Some(self.max_pos.map_or(top, |m| m.max(top)));
        let l = self.dequantise(&self.logit_image[..len]);
        self.logits = Some(l);
        Ok(())
    }

    fn consumed(&self) -> usize {
        self.consumed
    }

    fn max_pos(&self) -> Option<u32> {
        self.max_pos
    }

    fn last_logits(&self) -> Option<&[f32]> {
        self.logits.as_deref()
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
        self.logits = None;
        self.logit_image.fill(0);
        Ok(())
    }

    fn snapshot(&mut self) -> Result<StateBlob, EngineError> {
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
        let len = self.row_bytes();
        self.logits = (view.consumed > 0).then(|| self.dequantise(&self.logit_image[..len]));
        tracing::debug!(
            bytes = blob.size_bytes(),
            consumed = view.consumed,
            "BPU state restored"
        );
        Ok(())
    }
}

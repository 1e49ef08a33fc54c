//! `CpuBackend`: `qwen35` on HF weights with the BPU graphs' semantics — caller-made cos/sin,
//! the additive window mask on `mask_heads` planes and a fixed right-aligned K/V window of CL
//! rows ([`qwen35::TextModel::forward_window`]) — so both backends share one scheduler and
//! give the same numbers.

use std::path::Path;
use std::sync::Arc;

use qwen35::{window_mask, ImageGrid, KvLayout, LayerState, LogitRows, Qwen35Model, SequenceState};

use crate::chat::Pos3;
use crate::vision::{Geometry, PixelValues};

use super::backend::{Backend, BackendInfo, VisionSpec};
use super::error::EngineError;
use super::state::{CacheLayout, StateBlob, StateShape};

/// Default window when the config allows more (the published ctx4k package).
pub const DEFAULT_CONTEXT: usize = 4096;
/// Default prefill chunk (the published builds' `N`).
pub const DEFAULT_PREFILL_CHUNK: usize = 32;
/// Default image bucket side in pixels (the published package).
pub const DEFAULT_IMAGE_SIDE: usize = 320;
/// Qwen3.5 processor normalisation (`image_mean` = `image_std` = 0.5).
const QWEN35_MEAN_STD: f32 = 0.5;

/// Settings of a [`CpuBackend`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuOptions {
    /// Window capacity CL; `None` = min([`DEFAULT_CONTEXT`], `max_position_embeddings`).
    pub context: Option<usize>,
    /// Prefill chunk N (0 = step every row).
    pub prefill_chunk: usize,
    /// Mask planes: 1 or the attention head count.
    pub mask_heads: usize,
    /// Square image bucket side in pixels.
    pub image_side: usize,
}

impl Default for CpuOptions {
    fn default() -> Self {
        Self {
            context: None,
            prefill_chunk: DEFAULT_PREFILL_CHUNK,
            mask_heads: 1,
            image_side: DEFAULT_IMAGE_SIDE,
        }
    }
}

/// Qwen3.5 on the CPU behind the [`Backend`] seam. The model is shared (`Arc`), the decode
/// state is this backend's own.
pub struct CpuBackend {
    model: Arc<Qwen35Model>,
    info: BackendInfo,
    shape: StateShape,
    state: SequenceState,
    max_pos: Option<u32>,
    logits: Option<Vec<f32>>,
}

impl std::fmt::Debug for CpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuBackend")
            .field("info", &self.info)
            .field("consumed", &self.state.consumed)
            .field("max_pos", &self.max_pos)
            .finish_non_exhaustive()
    }
}

impl CpuBackend {
    /// Loads an HF checkpoint folder (`config.json` + `*.safetensors`, f32/bf16/f16).
    pub fn load(dir: &Path, opts: CpuOptions) -> Result<Self, EngineError> {
        Self::new(Arc::new(Qwen35Model::load(dir)?), opts)
    }

    /// Wraps an already loaded model (several backends may share one).
    pub fn new(model: Arc<Qwen35Model>, opts: CpuOptions) -> Result<Self, EngineError> {
        let tc = &model.config.text;
        let bad = |reason: String| EngineError::Config { reason };
        let context = opts
            .context
            .unwrap_or_else(|| DEFAULT_CONTEXT.min(tc.max_position_embeddings));
        if context == 0 {
            return Err(bad("context (CL) must be at least 1".into()));
        }
        if opts.prefill_chunk == 1 || opts.prefill_chunk > context {
            return Err(bad(format!(
                "prefill chunk {} must be 0 or in 2..={context}",
                opts.prefill_chunk
            )));
        }
        if opts.mask_heads != 1 && opts.mask_heads != tc.num_attention_heads {
            return Err(bad(format!(
                "mask_heads {} must be 1 or {}",
                opts.mask_heads, tc.num_attention_heads
            )));
        }
        let vision = match &model.config.vision {
            Some(vc) if model.vision.is_some() => Some(VisionSpec {
                geometry: Geometry::new(
                    opts.image_side,
                    vc.patch_size,
                    vc.spatial_merge_size,
                    vc.temporal_patch_size,
                )?,
                mean: [QWEN35_MEAN_STD; 3],
                std: [QWEN35_MEAN_STD; 3],
            }),
            _ => None,
        };
        let state = model.text.new_window_state(context);
        let kv_row = tc.num_key_value_heads * tc.head_dim * 4;
        let caches = state
            .layers
            .iter()
            .flat_map(|l| {
                let (a, b, window) = match l {
                    LayerState::Linear(g) => (g.recurrent.len() * 4, g.conv.len() * 4, None),
                    LayerState::Full(kv) => (kv.k.len() * 4, kv.v.len() * 4, Some(kv_row)),
                };
                [
                    CacheLayout {
                        bytes: a,
                        window_row_bytes: window,
                    },
                    CacheLayout {
                        bytes: b,
                        window_row_bytes: window,
                    },
                ]
            })
            .collect();
        let info = BackendInfo {
            hidden: tc.hidden_size,
            vocab: tc.vocab_size,
            context,
            prefill_chunk: opts.prefill_chunk,
            mask_heads: opts.mask_heads,
            vision,
        };
        let shape = StateShape {
            vocab: tc.vocab_size,
            context,
            logit_bytes: tc.vocab_size * 4,
            caches,
        };
        tracing::info!(
            context,
            chunk = opts.prefill_chunk,
            mask_heads = opts.mask_heads,
            "CPU backend ready"
        );
        Ok(Self {
            model,
            info,
            shape,
            state,
            max_pos: None,
            logits: None,
        })
    }

    pub fn model(&self) -> &Arc<Qwen35Model> {
        &self.model
    }
}

impl Backend for CpuBackend {
    fn info(&self) -> &BackendInfo {
        &self.info
    }

    fn embed(&self, ids: &[u32], out: &mut Vec<f32>) -> Result<(), EngineError> {
        // Row by row from the table as stored (bf16 stays bf16: no widened copy of it).
        let rows = self.model.text.embed(ids).map_err(|e| match e {
            qwen35::Error::TokenId { id, .. } => EngineError::TokenId {
                id,
                vocab: self.info.vocab,
            },
            other => EngineError::Cpu(other),
        })?;
        out.extend_from_slice(&rows);
        Ok(())
    }

    fn encode_image(&mut self, pixels: &PixelValues) -> Result<Vec<f32>, EngineError> {
        let (Some(spec), Some(tower)) = (&self.info.vision, &self.model.vision) else {
            return Err(EngineError::NoVision);
        };
        let g = &spec.geometry;
        if pixels.rows != g.n_patch() || pixels.row_len != g.row_len() {
            return Err(EngineError::Shape {
                what: "pixel values [n_patch, row_len]",
                expected: g.n_patch() * g.row_len(),
                found: pixels.rows * pixels.row_len,
            });
        }
        let grid = ImageGrid {
            t: 1,
            h: g.grid(),
            w: g.grid(),
        };
        Ok(tower.forward(&pixels.data, &[grid])?)
    }

    fn run_rows(&mut self, rows: &[f32], positions: &[Pos3]) -> Result<(), EngineError> {
        let n = positions.len();
        let chunk = self.info.prefill_chunk;
        if n != 1 && (n != chunk || chunk == 0) {
            return Err(EngineError::RowCount { rows: n, chunk });
        }
        let left = self.context_left();
        if n > left {
            return Err(EngineError::ContextOverflow { needed: n, left });
        }
        let cl = self.info.context;
        let pos: Vec<qwen35::Pos3> = positions.iter().map(|&p| p.into()).collect();
        let (cos, sin) = self.model.text.rope_tables(&pos);
        let mask = window_mask(self.state.consumed, n, cl, self.info.mask_heads);
        let logits = self.model.text.forward_window(
            rows,
            &cos,
            &sin,
            &mask,
            self.info.mask_heads,
            &mut self.state,
            LogitRows::Last,
        )?;
        let top = positions.iter().map(Pos3::max).max();
        self.max_pos = self.max_pos.max(top);
        self.logits = Some(logits);
        Ok(())
    }

    fn consumed(&self) -> usize {
        self.state.consumed
    }

    fn max_pos(&self) -> Option<u32> {
        self.max_pos
    }

    fn last_logits(&self) -> Option<&[f32]> {
        self.logits.as_deref()
    }

    fn reset(&mut self) -> Result<(), EngineError> {
        self.state = self.model.text.new_window_state(self.info.context);
        self.max_pos = None;
        self.logits = None;
        Ok(())
    }

    fn snapshot(&mut self) -> Result<StateBlob, EngineError> {
        let caches: Vec<Vec<u8>> = self
            .state
            .buffers()
            .into_iter()
            .map(qwen35::f32_to_le_bytes)
            .collect();
        let refs: Vec<&[u8]> = caches.iter().map(Vec::as_slice).collect();
        let logits = match &self.logits {
            Some(l) => qwen35::f32_to_le_bytes(l),
            None => vec![0; self.shape.logit_bytes],
        };
        let blob = StateBlob::build(
            &self.shape,
            self.state.consumed,
            self.max_pos,
            &refs,
            &logits,
        )?;
        tracing::debug!(
            bytes = blob.size_bytes(),
            consumed = self.state.consumed,
            "snapshot"
        );
        Ok(blob)
    }

    fn restore(&mut self, blob: &StateBlob) -> Result<(), EngineError> {
        let view = blob.view(&self.shape)?;
        let mut state = self.model.text.new_window_state(self.info.context);
        for (buf, (range, data)) in state.buffers_mut().into_iter().zip(&view.caches) {
            let floats = &mut buf[range.start / 4..range.end / 4];
            qwen35::f32_from_le_bytes(floats, data)?;
        }
        state.consumed = view.consumed;
        debug_assert_eq!(
            state.layout,
            KvLayout::Window {
                capacity: self.info.context
            }
        );
        let logits = if view.consumed == 0 {
            None
        } else {
            let mut l = vec![0.0; self.info.vocab];
            qwen35::f32_from_le_bytes(&mut l, view.logits)?;
            Some(l)
        };
        self.state = state;
        self.max_pos = view.max_pos;
        self.logits = logits;
        Ok(())
    }
}

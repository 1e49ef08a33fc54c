//! The Qwen3.5 text decoder: embedding, hybrid GDN / gated-attention layers, final norm, head.

use crate::config::{LayerType, TextConfig};
use crate::error::{check_len, Error, Result};
use crate::gdn::{GatedDeltaNet, GdnState};
use crate::layers::{KvState, KvWrite, Linear, Mlp, Qwen35Attention};
use crate::ops::rms_norm_1p;
use crate::rope::{rope_tables, Pos3};
use std::sync::OnceLock;

use crate::weights::{WeightData, WeightStore};

/// Which rows' logits a forward returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitRows {
    /// `[vocab]` of the last row.
    Last,
    /// `[n, vocab]`.
    All,
}

/// State of one layer: GDN buffers or the attention K/V rows.
#[derive(Debug, Clone, PartialEq)]
pub enum LayerState {
    Linear(GdnState),
    Full(KvState),
}

/// How the attention K/V rows are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvLayout {
    /// Rows appended as they come (CPU path); `rows` = tokens so far.
    Growing,
    /// Fixed window of `capacity` rows, right-aligned (docs/package-contract.md §3.5).
    Window { capacity: usize },
}

/// Per-sequence state, owned by the caller. Buffers (see [`SequenceState::buffers`]), per
/// layer in layer order:
/// - GDN layer: recurrent `[linear_num_value_heads, linear_key_head_dim, linear_value_head_dim]`,
///   conv `[linear_conv_dim, linear_conv_kernel_dim - 1]`;
/// - attention layer: K `[rows, num_key_value_heads, head_dim]`, V the same, with `rows` =
///   the window capacity CL in [`KvLayout::Window`] (row CL-1 = newest).
#[derive(Debug, Clone, PartialEq)]
pub struct SequenceState {
    pub layers: Vec<LayerState>,
    pub layout: KvLayout,
    /// Rows fed so far (window occupancy before clamping to the capacity).
    pub consumed: usize,
}

impl SequenceState {
    /// The state's buffers in the documented order (2 per layer).
    pub fn buffers(&self) -> Vec<&[f32]> {
        let mut out = Vec::with_capacity(self.layers.len() * 2);
        for l in &self.layers {
            match l {
                LayerState::Linear(g) => {
                    out.push(g.recurrent.as_slice());
                    out.push(g.conv.as_slice());
                }
                LayerState::Full(kv) => {
                    out.push(kv.k.as_slice());
                    out.push(kv.v.as_slice());
                }
            }
        }
        out
    }

    /// Mutable buffers in the same order as [`SequenceState::buffers`].
    pub fn buffers_mut(&mut self) -> Vec<&mut [f32]> {
        let mut out = Vec::with_capacity(self.layers.len() * 2);
        for l in &mut self.layers {
            match l {
                LayerState::Linear(g) => {
                    out.push(g.recurrent.as_mut_slice());
                    out.push(g.conv.as_mut_slice());
                }
                LayerState::Full(kv) => {
                    out.push(kv.k.as_mut_slice());
                    out.push(kv.v.as_mut_slice());
                }
            }
        }
        out
    }
}

/// Little-endian bytes of an f32 buffer (state ↔ device buffers).
pub fn f32_to_le_bytes(src: &[f32]) -> Vec<u8> {
    src.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// Fills `dst` from little-endian f32 bytes; the length must match exactly.
pub fn f32_from_le_bytes(dst: &mut [f32], bytes: &[u8]) -> Result<()> {
    check_len("state bytes", dst.len() * 4, bytes.len())?;
    for (d, c) in dst.iter_mut().zip(bytes.chunks_exact(4)) {
        *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
    }
    Ok(())
}

enum Mixer {
    Linear(GatedDeltaNet),
    Full(Qwen35Attention),
}

/// One pre-norm decoder layer.
pub struct DecoderLayer {
    input_layernorm: Vec<f32>,
    post_attention_layernorm: Vec<f32>,
    mixer: Mixer,
    mlp: Mlp,
}

/// The text model (`model.language_model.*` + head). `&self` everywhere: state is explicit.
pub struct TextModel {
    cfg: TextConfig,
    /// `[vocab, hidden]`, also the tied head; bf16 checkpoints keep it bf16.
    embed_tokens: WeightData,
    /// f32 copy made on the first [`TextModel::embed_table`] call of a bf16 model.
    embed_f32: OnceLock<Vec<f32>>,
    layers: Vec<DecoderLayer>,
    norm: Vec<f32>,
    lm_head: Option<Linear>,
    axes: Vec<usize>,
}

impl TextModel {
    /// Loads from a checkpoint; `prefix` is `model.language_model.` for VLM checkpoints.
    pub fn new(cfg: &TextConfig, ws: &WeightStore, prefix: &str) -> Result<Self> {
        let h = cfg.hidden_size;
        let embed_tokens = ws.get_matrix(
            &format!("{prefix}embed_tokens.weight"),
            &[cfg.vocab_size, h],
        )?;
        let mut layers = Vec::with_capacity(cfg.num_layers());
        for (i, lt) in cfg.layer_types.iter().enumerate() {
            let p = format!("{prefix}layers.{i}.");
            let mixer = match lt {
                LayerType::LinearAttention => {
                    Mixer::Linear(GatedDeltaNet::new(cfg, ws, &format!("{p}linear_attn."))?)
                }
                LayerType::FullAttention => {
                    Mixer::Full(Qwen35Attention::new(cfg, ws, &format!("{p}self_attn."))?)
                }
            };
            layers.push(DecoderLayer {
                input_layernorm: ws.get_f32(&format!("{p}input_layernorm.weight"), &[h])?,
                post_attention_layernorm: ws
                    .get_f32(&format!("{p}post_attention_layernorm.weight"), &[h])?,
                mixer,
                mlp: Mlp::new(ws, &format!("{p}mlp."), h, cfg.intermediate_size)?,
            });
        }
        let norm = ws.get_f32(&format!("{prefix}norm.weight"), &[h])?;
        let lm_head = if cfg.tie_word_embeddings {
            None
        } else {
            Some(Linear::new(ws, "lm_head.weight", cfg.vocab_size, h)?)
        };
        Ok(Self {
            axes: cfg.mrope_axes(),
            cfg: cfg.clone(),
            embed_tokens,
            embed_f32: OnceLock::new(),
            layers,
            norm,
            lm_head,
        })
    }

    pub fn config(&self) -> &TextConfig {
        &self.cfg
    }

    /// Embedding rows `[ids.len(), hidden]`.
    pub fn embed(&self, ids: &[u32]) -> Result<Vec<f32>> {
        let h = self.cfg.hidden_size;
        let mut out = Vec::with_capacity(ids.len() * h);
        for &id in ids {
            let i = id as usize;
            if i >= self.cfg.vocab_size {
                return Err(Error::TokenId {
                    id,
                    vocab: self.cfg.vocab_size,
                });
            }
            self.embed_tokens.extend_f32(i * h..(i + 1) * h, &mut out);
        }
        Ok(out)
    }

    /// The embedding table `[vocab, hidden]` (f32). For a bf16 checkpoint the first call
    /// makes an f32 copy (twice the table's bf16 size, kept for the model's life); prefer
    /// [`TextModel::embed`], which widens only the requested rows.
    pub fn embed_table(&self) -> &[f32] {
        match &self.embed_tokens {
            WeightData::F32(t) => t,
            WeightData::Bf16(_) => self.embed_f32.get_or_init(|| {
                tracing::warn!("embed_table: widening the bf16 embedding table to f32");
                let mut t = Vec::with_capacity(self.embed_tokens.len());
                self.embed_tokens
                    .extend_f32(0..self.embed_tokens.len(), &mut t);
                t
            }),
        }
    }

    /// The embedding table in its stored precision (f32, or bf16 from a bf16 checkpoint).
    pub fn embed_weight(&self) -> &WeightData {
        &self.embed_tokens
    }

    /// Bytes of weight matrices and vectors held by the text model (bf16 counted at 2 bytes).
    pub fn weight_bytes(&self) -> usize {
        let lin = |l: &Linear| l.weight().size_bytes();
        let mut total = self.embed_tokens.size_bytes() + 4 * self.norm.len();
        total += self.lm_head.as_ref().map_or(0, lin);
        for l in &self.layers {
            total += 4 * (l.input_layernorm.len() + l.post_attention_layernorm.len());
            total += l.mlp.weight_bytes();
            total += match &l.mixer {
                Mixer::Linear(g) => g.weight_bytes(),
                Mixer::Full(a) => a.weight_bytes(),
            };
        }
        total
    }

    fn new_layers(&self, kv_rows: usize) -> Vec<LayerState> {
        let row = self.cfg.num_key_value_heads * self.cfg.head_dim;
        self.cfg
            .layer_types
            .iter()
            .map(|lt| match lt {
                LayerType::LinearAttention => LayerState::Linear(GdnState::zeros(&self.cfg)),
                LayerType::FullAttention => LayerState::Full(KvState {
                    k: vec![0.0; kv_rows * row],
                    v: vec![0.0; kv_rows * row],
                }),
            })
            .collect()
    }

    /// Empty state for the CPU path (K/V grow with the sequence).
    pub fn new_state(&self) -> SequenceState {
        SequenceState {
            layers: self.new_layers(0),
            layout: KvLayout::Growing,
            consumed: 0,
        }
    }

    /// Zeroed state with fixed K/V windows of `capacity` rows (BPU graph semantics).
    pub fn new_window_state(&self, capacity: usize) -> SequenceState {
        SequenceState {
            layers: self.new_layers(capacity),
            layout: KvLayout::Window { capacity },
            consumed: 0,
        }
    }

    /// Shapes of the buffers of a window state of `capacity` rows, in the order of
    /// [`SequenceState::buffers`]: GDN `[Hv, dk, dv]`, `[conv_dim, kernel-1]`; attention
    /// `[capacity, kv_heads, head_dim]` twice.
    pub fn state_buffer_shapes(&self, capacity: usize) -> Vec<Vec<usize>> {
        let c = &self.cfg;
        let mut out = Vec::with_capacity(2 * c.num_layers());
        for lt in &c.layer_types {
            match lt {
                LayerType::LinearAttention => {
                    out.push(vec![
                        c.linear_num_value_heads,
                        c.linear_key_head_dim,
                        c.linear_value_head_dim,
                    ]);
                    out.push(vec![c.linear_conv_dim(), c.linear_conv_kernel_dim - 1]);
                }
                LayerType::FullAttention => {
                    out.push(vec![capacity, c.num_key_value_heads, c.head_dim]);
                    out.push(vec![capacity, c.num_key_value_heads, c.head_dim]);
                }
            }
        }
        out
    }

    /// cos/sin tables `[n, rotary_dim]` for positions (interleaved M-RoPE of this config).
    pub fn rope_tables(&self, positions: &[Pos3]) -> (Vec<f32>, Vec<f32>) {
        rope_tables(
            positions,
            self.cfg.rotary_dim,
            self.cfg.rope_theta,
            &self.axes,
        )
    }

    /// CPU path: feeds `n = positions.len()` embedding rows `x [n, hidden]` at `positions`
    /// into a [`KvLayout::Growing`] state and returns logits. `n = 1` is the one-row step
    /// (recurrent GDN), `n > 1` the N-row step (chunked GDN).
    pub fn forward(
        &self,
        x: &[f32],
        positions: &[Pos3],
        state: &mut SequenceState,
        rows: LogitRows,
    ) -> Result<Vec<f32>> {
        if state.layout != KvLayout::Growing {
            return Err(Error::State {
                reason: "forward needs a growing state (use forward_window for a window state)"
                    .into(),
            });
        }
        let n = positions.len();
        let (cos, sin) = self.rope_tables(positions);
        self.run(x, n, &cos, &sin, state, KvWrite::Append, rows, None)
    }

    /// BPU-graph semantics: `n` rows `x [n, hidden]` with caller-made `cos`/`sin`
    /// `[n, rotary_dim]` and additive `mask [mask_heads, n, CL]` (mask_heads 1 or
    /// `num_attention_heads`), on a [`KvLayout::Window`] state: each K/V window shifts toward
    /// the front by `n` rows and the new rows are written at `CL-n..CL`.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_window(
        &self,
        x: &[f32],
        cos: &[f32],
        sin: &[f32],
        mask: &[f32],
        mask_heads: usize,
        state: &mut SequenceState,
        rows: LogitRows,
    ) -> Result<Vec<f32>> {
        let KvLayout::Window { capacity } = state.layout else {
            return Err(Error::State {
                reason: "forward_window needs a window state".into(),
            });
        };
        let h = self.cfg.hidden_size;
        if !x.len().is_multiple_of(h) || x.is_empty() {
            return Err(Error::InputShape {
                what: "x rows",
                expected: h,
                found: x.len(),
            });
        }
        let n = x.len() / h;
        if n > capacity {
            return Err(Error::State {
                reason: format!("{n} rows exceed the window capacity {capacity}"),
            });
        }
        if mask_heads != 1 && mask_heads != self.cfg.num_attention_heads {
            return Err(Error::State {
                reason: format!(
                    "mask_heads {mask_heads} must be 1 or {}",
                    self.cfg.num_attention_heads
                ),
            });
        }
        check_len(
            "mask [mask_heads, n, CL]",
            mask_heads * n * capacity,
            mask.len(),
        )?;
        self.run(
            x,
            n,
            cos,
            sin,
            state,
            KvWrite::Window {
                capacity,
                mask,
                mask_heads,
            },
            rows,
            None,
        )
    }

    /// Like [`TextModel::forward`], also returning the residual stream after the embedding and
    /// after each layer (`[layers+1][n, hidden]`), for layer-by-layer comparisons.
    pub fn forward_hidden(
        &self,
        x: &[f32],
        positions: &[Pos3],
        state: &mut SequenceState,
    ) -> Result<(Vec<f32>, Vec<Vec<f32>>)> {
        let n = positions.len();
        let (cos, sin) = self.rope_tables(positions);
        let mut hidden = Vec::new();
        let logits = self.run(
            x,
            n,
            &cos,
            &sin,
            state,
            KvWrite::Append,
            LogitRows::All,
            Some(&mut hidden),
        )?;
        Ok((logits, hidden))
    }

    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        x: &[f32],
        n: usize,
        cos: &[f32],
        sin: &[f32],
        state: &mut SequenceState,
        write: KvWrite<'_>,
        rows: LogitRows,
        mut capture: Option<&mut Vec<Vec<f32>>>,
    ) -> Result<Vec<f32>> {
        let h = self.cfg.hidden_size;
        let rot = self.cfg.rotary_dim;
        if n == 0 {
            return Err(Error::InputShape {
                what: "rows",
                expected: 1,
                found: 0,
            });
        }
        check_len("x [n, hidden]", n * h, x.len())?;
        check_len("cos [n, rot]", n * rot, cos.len())?;
        check_len("sin [n, rot]", n * rot, sin.len())?;
        if state.layers.len() != self.layers.len() {
            return Err(Error::State {
                reason: format!(
                    "{} layer states for {} layers",
                    state.layers.len(),
                    self.layers.len()
                ),
            });
        }
        let mut xs = x.to_vec();
        if let Some(c) = capture.as_deref_mut() {
            c.push(xs.clone());
        }
        for (i, (layer, st)) in self.layers.iter().zip(state.layers.iter_mut()).enumerate() {
            let mut hn = xs.clone();
            rms_norm_1p(&mut hn, &layer.input_layernorm, self.cfg.rms_norm_eps);
            let mixed = match (&layer.mixer, st) {
                (Mixer::Linear(g), LayerState::Linear(s)) => g.forward(&hn, n, s),
                (Mixer::Full(a), LayerState::Full(kv)) => {
                    let row = self.cfg.num_key_value_heads * self.cfg.head_dim;
                    if let KvWrite::Window { capacity, .. } = write {
                        check_len("K window", capacity * row, kv.k.len())?;
                        check_len("V window", capacity * row, kv.v.len())?;
                    }
                    a.forward(&hn, n, cos, sin, rot, kv, write)
                }
                _ => {
                    return Err(Error::State {
                        reason: format!("layer {i}: state kind does not match the layer type"),
                    })
                }
            };
            xs.iter_mut().zip(&mixed).for_each(|(a, b)| *a += b);
            let mut hn = xs.clone();
            rms_norm_1p(
                &mut hn,
                &layer.post_attention_layernorm,
                self.cfg.rms_norm_eps,
            );
            let m = layer.mlp.forward(&hn, n);
            xs.iter_mut().zip(&m).for_each(|(a, b)| *a += b);
            if let Some(c) = capture.as_deref_mut() {
                c.push(xs.clone());
            }
        }
        state.consumed += n;
        let (hid, m) = match rows {
            LogitRows::Last => (xs[(n - 1) * h..].to_vec(), 1),
            LogitRows::All => (xs, n),
        };
        Ok(self.logits(hid, m))
    }

    /// Final norm + head for `m` rows of residual stream.
    fn logits(&self, mut hid: Vec<f32>, m: usize) -> Vec<f32> {
        rms_norm_1p(&mut hid, &self.norm, self.cfg.rms_norm_eps);
        match &self.lm_head {
            Some(head) => head.forward(&hid, m),
            None => crate::kernels::linear_any(
                &hid,
                m,
                self.cfg.hidden_size,
                &self.embed_tokens,
                self.cfg.vocab_size,
            ),
        }
    }
}

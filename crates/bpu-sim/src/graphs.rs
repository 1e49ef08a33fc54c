//! Contract graphs computed with `crates/qwen35`: the text graphs (`qwen35` decode and
//! `qwen35_prefill`, docs/package-contract.md §3/§4) and the vision tower (`visual`, §6), plus their I/O specs.

use std::sync::Arc;

use hbdnn_sys as sys;
use qwen35::{
    Config, ImageGrid, LayerType, LogitRows, TextConfig, TextModel, VisionConfig, VisionTower,
    WeightStore,
};

use crate::container::{
    Container, GraphDesc, GraphKind, LogitsType, PadLayout, TensorDesc, TextParams, VisualParams,
};
use crate::kernels::{read_f32, write_f32, Kernel};
use crate::pads::ChunkView;

/// Extra bytes added to the row pitch of multi-row tensors, so that a reader assuming tight
/// rows reads garbage (boards pad rows; docs/package-contract.md §3.3).
pub const ROW_PAD: usize = 32;

/// A tensor of `shape`: multi-row tensors get an explicitly padded row pitch, unless the graph
/// has `dynamic` strides (then every stride is `-1` and the runtime picks the layout).
fn tensor(shape: &[usize], dtype: i32, scale: Vec<f32>, dynamic: bool) -> TensorDesc {
    let esz = crate::container::elem_size(dtype).unwrap_or(4);
    let rank = shape.len();
    let multi_row = !dynamic && rank >= 2 && shape[rank - 2] > 1;
    let strides = if multi_row {
        // Explicit padded strides: last = element, rows = aligned + pad, outer = dense over rows.
        let mut s = vec![0i64; rank];
        s[rank - 1] = esz as i64;
        s[rank - 2] = ((shape[rank - 1] * esz).div_ceil(32) * 32 + ROW_PAD) as i64;
        for d in (0..rank - 2).rev() {
            s[d] = s[d + 1] * shape[d + 1] as i64;
        }
        s
    } else {
        vec![-1; rank]
    };
    TensorDesc {
        shape: shape.iter().map(|&d| d as i32).collect(),
        dtype,
        strides,
        scale,
    }
}

/// Cache tensors in [`qwen35::SequenceState::buffers`] order (2 per layer). Reported with -1
/// strides, so the runtime resolves them (conv rows of 3 floats get padded to 32 bytes).
pub fn cache_descs(cfg: &TextConfig, window: usize) -> Vec<TensorDesc> {
    let f32t = sys::HB_DNN_TENSOR_TYPE_F32;
    let dense = |shape: &[usize]| TensorDesc {
        shape: shape.iter().map(|&d| d as i32).collect(),
        dtype: f32t,
        strides: vec![-1; shape.len()],
        scale: vec![],
    };
    let mut out = Vec::new();
    for lt in &cfg.layer_types {
        match lt {
            LayerType::LinearAttention => {
                out.push(dense(&[
                    cfg.linear_num_value_heads,
                    cfg.linear_key_head_dim,
                    cfg.linear_value_head_dim,
                ]));
                out.push(dense(&[
                    cfg.linear_conv_dim(),
                    cfg.linear_conv_kernel_dim - 1,
                ]));
            }
            LayerType::FullAttention => {
                let kv = [window, cfg.num_key_value_heads, cfg.head_dim];
                out.push(dense(&kv));
                out.push(dense(&kv));
            }
        }
    }
    out
}

/// The cache outputs of [`TextParams::cache_out_strides`]: every K/V window `[CL, 1, D]` (one
/// K/V head) gets an explicit window pitch of two rows on both sides, and the output reports
/// its size-1 head dim with the whole pitch as stride — other strides than the input's, the
/// same bytes. `caches` are the inputs, changed in place; returns the outputs.
fn differing_cache_outputs(caches: &mut [TensorDesc]) -> Vec<TensorDesc> {
    let mut outs = caches.to_vec();
    for (i, o) in caches.iter_mut().zip(&mut outs) {
        if let [_, 1, d] = i.shape[..] {
            let row = i64::from(d) * 4;
            let pitch = 2 * ((row + 31) / 32 * 32);
            i.strides = vec![pitch, row, 4];
            o.strides = vec![pitch, pitch, 4];
        }
    }
    outs
}

/// The text graph's I/O (docs/package-contract.md §3.1 / §4.2).
pub fn text_graph_desc(name: &str, cfg: &TextConfig, p: &TextParams) -> GraphDesc {
    let f32t = sys::HB_DNN_TENSOR_TYPE_F32;
    let n = p.rows;
    let mask_shape: Vec<usize> = if n == 1 {
        vec![p.mask_heads, p.window]
    } else {
        vec![p.mask_heads, n, p.window]
    };
    let dy = p.dynamic_strides;
    let mut inputs = vec![
        tensor(&[n, cfg.hidden_size], f32t, vec![], dy),
        tensor(&[n, cfg.rotary_dim], f32t, vec![], dy),
        tensor(&[n, cfg.rotary_dim], f32t, vec![], dy),
        tensor(&mask_shape, f32t, vec![], dy),
    ];
    let mut caches = cache_descs(cfg, p.window);
    let cache_outs = if p.cache_out_strides {
        differing_cache_outputs(&mut caches)
    } else {
        caches.clone()
    };
    inputs.extend(caches);
    let logit_rows = if n > 1 && p.logits_all_rows { n } else { 1 };
    let logits = match p.logits {
        LogitsType::F32 => tensor(&[logit_rows, cfg.vocab_size], f32t, vec![], dy),
        LogitsType::S16 => tensor(
            &[logit_rows, cfg.vocab_size],
            sys::HB_DNN_TENSOR_TYPE_S16,
            if p.logits_per_axis {
                per_axis_scales(p.logits_scale, cfg.vocab_size)
            } else {
                vec![p.logits_scale]
            },
            dy,
        ),
    };
    let mut outputs = vec![logits];
    outputs.extend(cache_outs);
    GraphDesc {
        name: name.to_owned(),
        kind: GraphKind::Qwen35Text(p.clone()),
        inputs,
        outputs,
        compile_cores: 1,
    }
}

/// Per-axis scales along a tensor's last axis: `scale` × 1, 1.25, 1.5, 1.75, repeating.
pub fn per_axis_scales(scale: f32, len: usize) -> Vec<f32> {
    (0..len)
        .map(|c| scale * (1.0 + (c % 4) as f32 * 0.25))
        .collect()
}

/// The vision graph's I/O (docs/package-contract.md §6): `[n_patch, C·T·P·P]` f32 → `[n_token, out_hidden]`,
/// each with `p.rank - 2` leading 1s.
pub fn visual_graph_desc(name: &str, cfg: &VisionConfig, p: &VisualParams) -> GraphDesc {
    let grid = p.image_size / cfg.patch_size;
    let m = cfg.spatial_merge_size;
    let dy = p.dynamic_strides;
    let shape = |rows: usize, len: usize| {
        let mut s = vec![1; p.rank.saturating_sub(2)];
        s.extend([rows, len]);
        s
    };
    let out_shape = shape(grid * grid / (m * m), cfg.out_hidden_size);
    let out = match p.output {
        LogitsType::F32 => tensor(&out_shape, sys::HB_DNN_TENSOR_TYPE_F32, vec![], dy),
        LogitsType::S16 => tensor(
            &out_shape,
            sys::HB_DNN_TENSOR_TYPE_S16,
            vec![p.output_scale],
            dy,
        ),
    };
    GraphDesc {
        name: name.to_owned(),
        kind: GraphKind::Visual(p.clone()),
        inputs: vec![tensor(
            &shape(grid * grid, cfg.patch_len()),
            sys::HB_DNN_TENSOR_TYPE_F32,
            vec![],
            dy,
        )],
        outputs: vec![out],
        compile_cores: 1,
    }
}

/// Weights of one container, loaded once and shared by its graphs.
pub(crate) struct Loaded {
    config: Config,
    ws: WeightStore,
}

impl Loaded {
    pub(crate) fn new(c: &Container) -> Result<Self, String> {
        let cfg = c.header.config.as_ref().ok_or("container has no config")?;
        let config = Config::from_json_str(&cfg.to_string()).map_err(|e| format!("config: {e}"))?;
        let ws = store_from_bytes(&c.payload)?;
        Ok(Self { config, ws })
    }
}

/// `WeightStore` opens files only; the payload is written to a private temporary file that
/// is unlinked right after mapping (the map stays valid).
fn store_from_bytes(payload: &[u8]) -> Result<WeightStore, String> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let path = std::env::temp_dir().join(format!(
        "bpu-sim-{}-{}.safetensors",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::write(&path, payload).map_err(|e| format!("{}: {e}", path.display()))?;
    let ws =
        WeightStore::open_files(std::slice::from_ref(&path)).map_err(|e| format!("weights: {e}"));
    let _ = std::fs::remove_file(&path);
    ws
}

pub(crate) fn build(
    desc: &GraphDesc,
    kind: &GraphKind,
    loaded: &mut Option<Arc<Loaded>>,
    c: &Container,
) -> Result<Box<dyn Kernel>, String> {
    let l = match loaded {
        Some(l) => l.clone(),
        None => {
            let l = Arc::new(Loaded::new(c)?);
            *loaded = Some(l.clone());
            l
        }
    };
    match kind {
        GraphKind::Qwen35Text(p) => {
            let prefix = if l.ws.contains("model.language_model.embed_tokens.weight") {
                "model.language_model."
            } else {
                "model."
            };
            let model = TextModel::new(&l.config.text, &l.ws, prefix)
                .map_err(|e| format!("text model: {e}"))?;
            let expect = text_graph_desc(&desc.name, &l.config.text, p);
            if expect.inputs != desc.inputs || expect.outputs != desc.outputs {
                return Err("graph I/O does not match the model config".into());
            }
            Ok(Box::new(TextGraph {
                model,
                p: p.clone(),
                desc: desc.clone(),
            }))
        }
        GraphKind::Visual(p) => {
            let vc = l
                .config
                .vision
                .as_ref()
                .ok_or("config has no vision tower")?;
            let tower = VisionTower::new(vc, &l.ws, "model.visual.")
                .map_err(|e| format!("vision tower: {e}"))?;
            if p.image_size % (vc.patch_size * vc.spatial_merge_size) != 0 {
                return Err(format!(
                    "image size {} not a multiple of patch × merge",
                    p.image_size
                ));
            }
            Ok(Box::new(VisualGraph {
                tower,
                grid: p.image_size / vc.patch_size,
                p: p.clone(),
                desc: desc.clone(),
            }))
        }
        GraphKind::Affine { .. } => Err("affine graphs are built elsewhere".into()),
    }
}

/// A fixed LM-shaped logits output for a graph without weights: most logits uniform in
/// [-2, 2), one in a thousand raised by 12 (a few clear candidates, as a language model
/// gives), every row the same. Deterministic (splitmix64), so runs are reproducible.
pub(crate) fn synthetic_logits(t: &TensorDesc, kind: LogitsType, scale: f32) -> Vec<u8> {
    let rank = t.shape.len();
    let vocab = t.shape[rank - 1] as usize;
    let rows: usize = t.shape[..rank - 1].iter().map(|&d| d as usize).product();
    let mut state = 0x5eed_0f10_9175_u64;
    let mut next = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        ((z ^ (z >> 31)) >> 40) as f32 / (1u64 << 24) as f32
    };
    let row: Vec<f32> = (0..vocab)
        .map(|_| {
            let (u, v) = (next(), next() * 4.0 - 2.0);
            if u < 0.001 {
                v + 12.0
            } else {
                v
            }
        })
        .collect();
    let data: Vec<f32> = (0..rows).flat_map(|_| row.iter().copied()).collect();
    let mut bytes = vec![0u8; crate::container::byte_size(t)];
    write_out(t, &mut bytes, &data, kind, scale);
    bytes
}

fn write_out(t: &TensorDesc, bytes: &mut [u8], data: &[f32], kind: LogitsType, scale: f32) {
    match kind {
        LogitsType::F32 => write_f32(t, bytes, data),
        LogitsType::S16 => {
            let strides = crate::container::resolved_strides(t);
            let rank = t.shape.len();
            let last = t.shape[rank - 1] as usize;
            // Per-axis scales run along the last axis; else the one scale.
            let scale_at = |c: usize| match t.scale.len() {
                n if n > 1 => t.scale[c % n],
                _ => scale,
            };
            for (r, row) in data.chunks(last).enumerate() {
                let base = r * if rank >= 2 { strides[rank - 2] } else { 0 };
                for (c, v) in row.iter().enumerate() {
                    let q = (v / scale_at(c))
                        .round()
                        .clamp(i16::MIN as f32, i16::MAX as f32) as i16;
                    let at = base + c * 2;
                    bytes[at..at + 2].copy_from_slice(&q.to_le_bytes());
                }
            }
        }
    }
}

struct TextGraph {
    model: TextModel,
    p: TextParams,
    desc: GraphDesc,
}

impl Kernel for TextGraph {
    fn run(&self, inputs: &[&[u8]], outputs: &mut [&mut [u8]]) -> Result<(), String> {
        let d = &self.desc;
        let x = read_f32(&d.inputs[0], inputs[0]);
        let cos = read_f32(&d.inputs[1], inputs[1]);
        let sin = read_f32(&d.inputs[2], inputs[2]);
        let mask = read_f32(&d.inputs[3], inputs[3]);
        let mut state = self.model.new_window_state(self.p.window);
        for (c, buf) in state.buffers_mut().into_iter().enumerate() {
            let v = read_f32(&d.inputs[4 + c], inputs[4 + c]);
            buf.copy_from_slice(&v);
        }
        let rows = if self.p.rows > 1 && self.p.logits_all_rows {
            LogitRows::All
        } else {
            LogitRows::Last
        };
        let n = self.p.rows;
        let real = if self.p.pads {
            real_rows(&cos, &sin, &mask, &self.p)?
        } else {
            n
        };
        let logits = if real == n {
            self.model
                .forward_window(&x, &cos, &sin, &mask, self.p.mask_heads, &mut state, rows)
                .map_err(|e| e.to_string())?
        } else {
            self.padded(&x, &cos, &sin, &mask, real, &mut state, rows)?
        };
        write_out(
            &d.outputs[0],
            outputs[0],
            &logits,
            self.p.logits,
            self.p.logits_scale,
        );
        for (c, buf) in state.buffers().into_iter().enumerate() {
            write_f32(&d.outputs[1 + c], outputs[1 + c], buf);
        }
        Ok(())
    }
}

/// The real rows of a padded chunk: the rows of plane 0 that do not carry the graph's pad
/// marking, counted wherever they are (a graph compiled for one layout takes its own rows as
/// the pads; one compiled for another marking finds no pad and runs all `N` rows).
fn real_rows(cos: &[f32], sin: &[f32], mask: &[f32], p: &TextParams) -> Result<usize, String> {
    let view = ChunkView {
        cos,
        sin,
        mask,
        n: p.rows,
        window: p.window,
    };
    let t = p.rows - view.pads(p.pad_rope, p.pad_mask);
    if t == 0 {
        return Err("a chunk of pad rows only".into());
    }
    Ok(t)
}

impl TextGraph {
    /// Runs an N-row chunk with `t` real rows as a graph compiled for
    /// [`TextParams::pad_layout`] would: the rows its layout names as real (the last `t` for
    /// `first`, the first `t` for `last`) advance the state, the others are pads whatever the
    /// runtime put there. The K/V windows come out as an N-row shift lays them out, the pad
    /// rows zero (`first`: between the old and the new rows; `last`: at the window end), and
    /// a real row attends to whatever columns the runtime's mask opens, pad columns included.
    #[allow(clippy::too_many_arguments)]
    fn padded(
        &self,
        x: &[f32],
        cos: &[f32],
        sin: &[f32],
        mask: &[f32],
        t: usize,
        state: &mut qwen35::SequenceState,
        rows: LogitRows,
    ) -> Result<Vec<f32>, String> {
        let cfg = self.model.config();
        let (n, cl, mh) = (self.p.rows, self.p.window, self.p.mask_heads);
        let pad = n - t;
        let first = self.p.pad_layout == PadLayout::First;
        // The first physical real row.
        let r0 = if first { pad } else { 0 };
        let kv_row = cfg.num_key_value_heads * cfg.head_dim;
        // The t-row run appends to the window, so it runs on `[old shifted by pad | pad zero
        // rows]` and leaves `[old shifted by N | pad zeros | t new]`: the pads-first layout.
        for w in kv_windows(state) {
            let len = w.len();
            w.copy_within(pad * kv_row.., 0);
            w[len - pad * kv_row..].fill(0.0);
        }
        // Mask columns of the runtime's N-shifted window → columns of that run: the same for
        // pads first; pads last puts its new rows at [CL−N, CL−N+t) and its pads after them.
        let col = |c: usize| match c {
            _ if first || c < cl - n => c,
            _ if c < cl - pad => c + pad,
            _ => c - t,
        };
        let mut m = vec![qwen35::MASK_NEG; mh * t * cl];
        for h in 0..mh {
            for j in 0..t {
                let src = &mask[(h * n + r0 + j) * cl..(h * n + r0 + j + 1) * cl];
                let dst = &mut m[(h * t + j) * cl..(h * t + j + 1) * cl];
                for (c, &v) in src.iter().enumerate() {
                    dst[col(c)] = v;
                }
            }
        }
        let h = cfg.hidden_size;
        let rot = cfg.rotary_dim;
        let out = self
            .model
            .forward_window(
                &x[r0 * h..(r0 + t) * h],
                &cos[r0 * rot..(r0 + t) * rot],
                &sin[r0 * rot..(r0 + t) * rot],
                &m,
                mh,
                state,
                rows,
            )
            .map_err(|e| e.to_string())?;
        if !first {
            // [old | pad zeros | t new] → [old | t new | pad zeros]
            for w in kv_windows(state) {
                let len = w.len();
                w.copy_within(len - t * kv_row.., len - n * kv_row);
                w[len - pad * kv_row..].fill(0.0);
            }
        }
        Ok(match rows {
            LogitRows::Last => out,
            LogitRows::All => {
                let v = cfg.vocab_size;
                let mut all = vec![0.0; n * v];
                all[r0 * v..(r0 + t) * v].copy_from_slice(&out);
                all
            }
        })
    }
}

/// The K and V windows of every full-attention layer.
fn kv_windows(state: &mut qwen35::SequenceState) -> impl Iterator<Item = &mut Vec<f32>> {
    state.layers.iter_mut().flat_map(|l| match l {
        qwen35::LayerState::Full(kv) => vec![&mut kv.k, &mut kv.v],
        _ => Vec::new(),
    })
}

struct VisualGraph {
    tower: VisionTower,
    grid: usize,
    p: VisualParams,
    desc: GraphDesc,
}

impl Kernel for VisualGraph {
    fn run(&self, inputs: &[&[u8]], outputs: &mut [&mut [u8]]) -> Result<(), String> {
        let px = read_f32(&self.desc.inputs[0], inputs[0]);
        let g = ImageGrid {
            t: 1,
            h: self.grid,
            w: self.grid,
        };
        let rows = self.tower.forward(&px, &[g]).map_err(|e| e.to_string())?;
        write_out(
            &self.desc.outputs[0],
            outputs[0],
            &rows,
            self.p.output,
            self.p.output_scale,
        );
        Ok(())
    }
}

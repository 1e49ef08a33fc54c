//! Building blocks shared by the decoder and the vision tower: Linear, SwiGLU MLP, gated
//! full attention with partial rotary over a K/V buffer.

use rayon::prelude::*;

use crate::config::TextConfig;
use crate::error::Result;
use crate::kernels::{gemm_into, linear_any, MatRef};
use crate::ops::{apply_rotary, rms_norm_1p, sigmoid, silu, softmax};
use crate::weights::{WeightData, WeightStore};

/// A PyTorch Linear: weight `[out, in]` (f32, or bf16 from a bf16 checkpoint), optional
/// bias `[out]` (f32).
pub struct Linear {
    w: WeightData,
    b: Option<Vec<f32>>,
    out: usize,
    inp: usize,
}

impl Linear {
    pub fn new(ws: &WeightStore, name: &str, out: usize, inp: usize) -> Result<Self> {
        Ok(Self {
            w: ws.get_matrix(name, &[out, inp])?,
            b: None,
            out,
            inp,
        })
    }

    pub fn with_bias(ws: &WeightStore, prefix: &str, out: usize, inp: usize) -> Result<Self> {
        Ok(Self {
            w: ws.get_matrix(&format!("{prefix}.weight"), &[out, inp])?,
            b: Some(ws.get_f32(&format!("{prefix}.bias"), &[out])?),
            out,
            inp,
        })
    }

    pub fn from_parts(w: Vec<f32>, b: Option<Vec<f32>>, out: usize, inp: usize) -> Self {
        Self {
            w: WeightData::F32(w),
            b,
            out,
            inp,
        }
    }

    /// The weight in its stored precision.
    pub fn weight(&self) -> &WeightData {
        &self.w
    }

    pub fn out_dim(&self) -> usize {
        self.out
    }

    /// `x [n, in]` → `[n, out]`.
    pub fn forward(&self, x: &[f32], n: usize) -> Vec<f32> {
        let mut y = linear_any(x, n, self.inp, &self.w, self.out);
        if let Some(b) = &self.b {
            for row in y.chunks_exact_mut(self.out) {
                row.iter_mut().zip(b).for_each(|(v, bi)| *v += bi);
            }
        }
        y
    }
}

/// SwiGLU MLP `down(silu(gate(x)) * up(x))`.
pub struct Mlp {
    gate_proj: Linear,
    up_proj: Linear,
    down_proj: Linear,
}

impl Mlp {
    pub fn new(ws: &WeightStore, p: &str, hidden: usize, inter: usize) -> Result<Self> {
        Ok(Self {
            gate_proj: Linear::new(ws, &format!("{p}gate_proj.weight"), inter, hidden)?,
            up_proj: Linear::new(ws, &format!("{p}up_proj.weight"), inter, hidden)?,
            down_proj: Linear::new(ws, &format!("{p}down_proj.weight"), hidden, inter)?,
        })
    }

    /// Bytes of the three projections.
    pub fn weight_bytes(&self) -> usize {
        [&self.gate_proj, &self.up_proj, &self.down_proj]
            .iter()
            .map(|l| l.weight().size_bytes())
            .sum()
    }

    pub fn forward(&self, x: &[f32], n: usize) -> Vec<f32> {
        let mut g = self.gate_proj.forward(x, n);
        let u = self.up_proj.forward(x, n);
        g.iter_mut().zip(&u).for_each(|(a, b)| *a = silu(*a) * b);
        self.down_proj.forward(&g, n)
    }
}

/// Which K/V columns each query row may see.
#[derive(Clone, Copy)]
pub enum AttnMask<'a> {
    /// The `n` queries are the last `n` of the `len` K/V rows; row `j` sees columns `..= len-n+j`.
    CausalTail,
    /// Additive `[heads, n, len]` (heads 1 = shared by every query head).
    Additive { data: &'a [f32], heads: usize },
    /// Every column visible (bidirectional).
    None,
}

/// Scaled-dot-product attention with grouped K/V heads.
/// `q [n, nh, hd]`, `k`/`v` `[len, nkv, hd]` → `[n, nh·hd]`.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &[f32],
    n: usize,
    nh: usize,
    k: &[f32],
    v: &[f32],
    len: usize,
    nkv: usize,
    hd: usize,
    scale: f32,
    mask: AttnMask<'_>,
) -> Vec<f32> {
    let group = nh / nkv;
    let heads: Vec<Vec<f32>> = (0..nh)
        .into_par_iter()
        .map(|h| {
            let kvh = h / group;
            let qh = MatRef {
                data: &q[h * hd..],
                rows: n,
                cols: hd,
                rs: nh * hd,
                cs: 1,
            };
            let kt = MatRef {
                data: &k[kvh * hd..],
                rows: hd,
                cols: len,
                rs: 1,
                cs: nkv * hd,
            };
            let mut s = vec![0.0f32; n * len];
            gemm_into(&mut s, len, qh, kt, false);
            for (j, row) in s.chunks_exact_mut(len).enumerate() {
                row.iter_mut().for_each(|x| *x *= scale);
                match mask {
                    AttnMask::CausalTail => {
                        let hi = len - n + j + 1;
                        row[hi..].fill(f32::NEG_INFINITY);
                    }
                    AttnMask::Additive { data, heads } => {
                        let plane = if heads == 1 { 0 } else { h };
                        let m = &data[(plane * n + j) * len..(plane * n + j + 1) * len];
                        row.iter_mut().zip(m).for_each(|(x, mi)| *x += mi);
                    }
                    AttnMask::None => {}
                }
                softmax(row);
            }
            let vh = MatRef {
                data: &v[kvh * hd..],
                rows: len,
                cols: hd,
                rs: nkv * hd,
                cs: 1,
            };
            let mut o = vec![0.0f32; n * hd];
            gemm_into(&mut o, hd, MatRef::rows(&s, n, len), vh, false);
            o
        })
        .collect();
    let mut out = vec![0.0f32; n * nh * hd];
    for (h, oh) in heads.iter().enumerate() {
        for j in 0..n {
            out[(j * nh + h) * hd..(j * nh + h + 1) * hd]
                .copy_from_slice(&oh[j * hd..(j + 1) * hd]);
        }
    }
    out
}

/// K/V rows of one attention layer: `k`, `v` are `[rows, kv_heads, head_dim]`.
#[derive(Debug, Clone, PartialEq)]
pub struct KvState {
    pub k: Vec<f32>,
    pub v: Vec<f32>,
}

/// How new K/V rows enter a layer's buffers.
#[derive(Clone, Copy)]
pub(crate) enum KvWrite<'a> {
    /// Append rows; causal attention over all rows so far.
    Append,
    /// Fixed window of `capacity` rows: shift toward the front by `n`, write at the end,
    /// attend with the caller's additive mask.
    Window {
        capacity: usize,
        mask: &'a [f32],
        mask_heads: usize,
    },
}

/// Gated full attention (`…layers.N.self_attn.*`).
pub struct Qwen35Attention {
    q_proj: Linear,
    k_proj: Linear,
    v_proj: Linear,
    o_proj: Linear,
    q_norm: Vec<f32>,
    k_norm: Vec<f32>,
    nh: usize,
    nkv: usize,
    hd: usize,
    eps: f32,
}

impl Qwen35Attention {
    pub fn new(cfg: &TextConfig, ws: &WeightStore, p: &str) -> Result<Self> {
        let (h, nh, nkv, hd) = (
            cfg.hidden_size,
            cfg.num_attention_heads,
            cfg.num_key_value_heads,
            cfg.head_dim,
        );
        Ok(Self {
            q_proj: Linear::new(ws, &format!("{p}q_proj.weight"), 2 * nh * hd, h)?,
            k_proj: Linear::new(ws, &format!("{p}k_proj.weight"), nkv * hd, h)?,
            v_proj: Linear::new(ws, &format!("{p}v_proj.weight"), nkv * hd, h)?,
            o_proj: Linear::new(ws, &format!("{p}o_proj.weight"), h, nh * hd)?,
            q_norm: ws.get_f32(&format!("{p}q_norm.weight"), &[hd])?,
            k_norm: ws.get_f32(&format!("{p}k_norm.weight"), &[hd])?,
            nh,
            nkv,
            hd,
            eps: cfg.rms_norm_eps,
        })
    }

    /// Bytes of the projections and norms.
    pub fn weight_bytes(&self) -> usize {
        [&self.q_proj, &self.k_proj, &self.v_proj, &self.o_proj]
            .iter()
            .map(|l| l.weight().size_bytes())
            .sum::<usize>()
            + 4 * (self.q_norm.len() + self.k_norm.len())
    }

    /// `x [n, hidden]` with per-row `cos`/`sin` `[n, rot]` → `[n, hidden]`, updating `kv`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn forward(
        &self,
        x: &[f32],
        n: usize,
        cos: &[f32],
        sin: &[f32],
        rot: usize,
        kv: &mut KvState,
        write: KvWrite<'_>,
    ) -> Vec<f32> {
        let (nh, nkv, hd) = (self.nh, self.nkv, self.hd);
        let qg = self.q_proj.forward(x, n);
        // per head: first hd = query, next hd = gate
        let mut q = vec![0.0f32; n * nh * hd];
        let mut gate = vec![0.0f32; n * nh * hd];
        for t in 0..n {
            for h in 0..nh {
                let src = &qg[(t * nh + h) * 2 * hd..(t * nh + h + 1) * 2 * hd];
                q[(t * nh + h) * hd..(t * nh + h + 1) * hd].copy_from_slice(&src[..hd]);
                gate[(t * nh + h) * hd..(t * nh + h + 1) * hd].copy_from_slice(&src[hd..]);
            }
        }
        let mut k = self.k_proj.forward(x, n);
        let v = self.v_proj.forward(x, n);
        rms_norm_1p(&mut q, &self.q_norm, self.eps);
        rms_norm_1p(&mut k, &self.k_norm, self.eps);
        for t in 0..n {
            let (c, s) = (&cos[t * rot..(t + 1) * rot], &sin[t * rot..(t + 1) * rot]);
            apply_rotary(&mut q[t * nh * hd..(t + 1) * nh * hd], hd, c, s);
            apply_rotary(&mut k[t * nkv * hd..(t + 1) * nkv * hd], hd, c, s);
        }
        let row = nkv * hd;
        let scale = 1.0 / (hd as f32).sqrt();
        let mut o = match write {
            KvWrite::Append => {
                kv.k.extend_from_slice(&k);
                kv.v.extend_from_slice(&v);
                let len = kv.k.len() / row;
                attention(
                    &q,
                    n,
                    nh,
                    &kv.k,
                    &kv.v,
                    len,
                    nkv,
                    hd,
                    scale,
                    AttnMask::CausalTail,
                )
            }
            KvWrite::Window {
                capacity,
                mask,
                mask_heads,
            } => {
                kv.k.copy_within(n * row..capacity * row, 0);
                kv.v.copy_within(n * row..capacity * row, 0);
                kv.k[(capacity - n) * row..].copy_from_slice(&k);
                kv.v[(capacity - n) * row..].copy_from_slice(&v);
                attention(
                    &q,
                    n,
                    nh,
                    &kv.k,
                    &kv.v,
                    capacity,
                    nkv,
                    hd,
                    scale,
                    AttnMask::Additive {
                        data: mask,
                        heads: mask_heads,
                    },
                )
            }
        };
        o.iter_mut().zip(&gate).for_each(|(a, g)| *a *= sigmoid(*g));
        self.o_proj.forward(&o, n)
    }
}

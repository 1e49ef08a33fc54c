//! Gated DeltaNet mixer: causal depthwise conv, the delta rule in its recurrent one-token
//! form and its chunked (WY / UT-transform) form, gated RMSNorm.

use rayon::prelude::*;

use crate::config::TextConfig;
use crate::error::Result;
use crate::kernels::{gemm_into, MatRef};
use crate::layers::Linear;
use crate::ops::{gated_rms_norm, l2_norm, sigmoid, silu, softplus};
use crate::weights::WeightStore;

/// Rows per chunk of the chunked delta rule (HF `torch_chunk_gated_delta_rule` uses 64).
pub const GDN_CHUNK: usize = 64;

/// Per-sequence state of one GDN layer (plain f32 buffers):
/// - `recurrent`: `[value_heads, key_head_dim, value_head_dim]` (S_h with S_h[i, j] at
///   `(h·dk + i)·dv + j`; HF layout),
/// - `conv`: `[conv_dim, kernel - 1]` — the last `kernel-1` pre-conv inputs per channel, oldest first.
#[derive(Debug, Clone, PartialEq)]
pub struct GdnState {
    pub recurrent: Vec<f32>,
    pub conv: Vec<f32>,
}

impl GdnState {
    pub fn zeros(cfg: &TextConfig) -> Self {
        Self {
            recurrent: vec![
                0.0;
                cfg.linear_num_value_heads
                    * cfg.linear_key_head_dim
                    * cfg.linear_value_head_dim
            ],
            conv: vec![0.0; cfg.linear_conv_dim() * (cfg.linear_conv_kernel_dim - 1)],
        }
    }
}

/// Inputs of the delta rule for one value head over `n` rows.
pub struct HeadInputs<'a> {
    /// `[n, dk]` normalised and scaled queries.
    pub q: &'a [f32],
    /// `[n, dk]` normalised keys.
    pub k: &'a [f32],
    /// `[n, dv]`.
    pub v: &'a [f32],
    pub beta: &'a [f32],
    /// Log decay per row (≤ 0).
    pub g: &'a [f32],
}

/// Recurrent delta rule, one row at a time: `S ← e^g S; u = β(v − Sᵀk); S ← S + k uᵀ; o = Sᵀq`.
/// `s` is `[dk, dv]`; returns `[n, dv]`.
pub fn delta_rule_recurrent(inp: &HeadInputs<'_>, s: &mut [f32], dk: usize, dv: usize) -> Vec<f32> {
    let n = inp.beta.len();
    let mut out = vec![0.0f32; n * dv];
    let mut u = vec![0.0f32; dv];
    for t in 0..n {
        let decay = inp.g[t].exp();
        s.iter_mut().for_each(|x| *x *= decay);
        let k = &inp.k[t * dk..(t + 1) * dk];
        let q = &inp.q[t * dk..(t + 1) * dk];
        u.copy_from_slice(&inp.v[t * dv..(t + 1) * dv]);
        for (i, ki) in k.iter().enumerate() {
            for (uj, sij) in u.iter_mut().zip(&s[i * dv..(i + 1) * dv]) {
                *uj -= ki * sij;
            }
        }
        u.iter_mut().for_each(|x| *x *= inp.beta[t]);
        let o = &mut out[t * dv..(t + 1) * dv];
        for i in 0..dk {
            let row = &mut s[i * dv..(i + 1) * dv];
            for (sij, uj) in row.iter_mut().zip(&u) {
                *sij += k[i] * uj;
            }
            for (oj, sij) in o.iter_mut().zip(row.iter()) {
                *oj += q[i] * sij;
            }
        }
    }
    out
}

/// Chunked delta rule (mathematically equal to [`delta_rule_recurrent`]); chunks of `chunk` rows.
pub fn delta_rule_chunked(
    inp: &HeadInputs<'_>,
    s: &mut [f32],
    dk: usize,
    dv: usize,
    chunk: usize,
) -> Vec<f32> {
    let n = inp.beta.len();
    let mut out = vec![0.0f32; n * dv];
    let mut start = 0;
    while start < n {
        let c = chunk.min(n - start);
        let ch = Chunk {
            q: &inp.q[start * dk..(start + c) * dk],
            k: &inp.k[start * dk..(start + c) * dk],
            v: &inp.v[start * dv..(start + c) * dv],
            beta: &inp.beta[start..start + c],
            gamma: cumulative_decay(&inp.g[start..start + c]),
            c,
            dk,
            dv,
        };
        ch.step(s, &mut out[start * dv..(start + c) * dv]);
        start += c;
    }
    out
}

/// Cumulative log decay inside a chunk.
fn cumulative_decay(g: &[f32]) -> Vec<f32> {
    g.iter()
        .scan(0.0f32, |acc, g| {
            *acc += g;
            Some(*acc)
        })
        .collect()
}

/// `c` rows of one head's inputs, with `gamma` the cumulative log decay.
struct Chunk<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    beta: &'a [f32],
    gamma: Vec<f32>,
    c: usize,
    dk: usize,
    dv: usize,
}

impl Chunk<'_> {
    /// Writes the chunk's output rows `o` (`[c, dv]`) and advances the state `s` past it.
    fn step(&self, s: &mut [f32], o: &mut [f32]) {
        let (c, dk, dv) = (self.c, self.dk, self.dv);
        let (q, k) = (self.q, self.k);
        let mut kk = vec![0.0f32; c * c];
        gemm_into(
            &mut kk,
            c,
            MatRef::rows(k, c, dk),
            MatRef::transposed(k, dk, c),
            false,
        );
        let mut qk = vec![0.0f32; c * c];
        gemm_into(
            &mut qk,
            c,
            MatRef::rows(q, c, dk),
            MatRef::transposed(k, dk, c),
            false,
        );
        let (uu, ww) = self.solve_uw(&kk);
        // V' = U − W S₀
        let mut vp = uu;
        let mut ws = vec![0.0f32; c * dv];
        gemm_into(
            &mut ws,
            dv,
            MatRef::rows(&ww, c, dk),
            MatRef::rows(s, dk, dv),
            false,
        );
        vp.iter_mut().zip(&ws).for_each(|(x, y)| *x -= y);
        self.output(s, &mut qk, &vp, o);
        self.advance_state(s, &vp);
    }

    /// A[t, j] = β_t (k_t·k_j) e^{γ_t−γ_j}, j < t; solves (I + A) [U | W] = [βV | βΓK] by
    /// forward substitution → `(U [c, dv], W [c, dk])`.
    fn solve_uw(&self, kk: &[f32]) -> (Vec<f32>, Vec<f32>) {
        let (c, dk, dv) = (self.c, self.dk, self.dv);
        let (k, v, beta, gamma) = (self.k, self.v, self.beta, &self.gamma);
        let mut a = vec![0.0f32; c * c];
        for t in 0..c {
            for j in 0..t {
                a[t * c + j] = beta[t] * kk[t * c + j] * (gamma[t] - gamma[j]).exp();
            }
        }
        let mut uu = vec![0.0f32; c * dv];
        let mut ww = vec![0.0f32; c * dk];
        for t in 0..c {
            let gt = gamma[t].exp();
            for d in 0..dv {
                uu[t * dv + d] = beta[t] * v[t * dv + d];
            }
            for d in 0..dk {
                ww[t * dk + d] = beta[t] * gt * k[t * dk + d];
            }
            for j in 0..t {
                let atj = a[t * c + j];
                if atj == 0.0 {
                    continue;
                }
                let (done, cur) = uu.split_at_mut(t * dv);
                for (x, y) in cur[..dv].iter_mut().zip(&done[j * dv..(j + 1) * dv]) {
                    *x -= atj * y;
                }
                let (done, cur) = ww.split_at_mut(t * dk);
                for (x, y) in cur[..dk].iter_mut().zip(&done[j * dk..(j + 1) * dk]) {
                    *x -= atj * y;
                }
            }
        }
        (uu, ww)
    }

    /// O = diag(Γ) Q S₀ + (QKᵀ ⊙ M) V', with `qk` masked and decayed in place.
    fn output(&self, s: &[f32], qk: &mut [f32], vp: &[f32], o: &mut [f32]) {
        let (c, dk, dv) = (self.c, self.dk, self.dv);
        let gamma = &self.gamma;
        gemm_into(
            o,
            dv,
            MatRef::rows(self.q, c, dk),
            MatRef::rows(s, dk, dv),
            false,
        );
        for t in 0..c {
            let gt = gamma[t].exp();
            o[t * dv..(t + 1) * dv].iter_mut().for_each(|x| *x *= gt);
            for j in 0..c {
                qk[t * c + j] = if j <= t {
                    qk[t * c + j] * (gamma[t] - gamma[j]).exp()
                } else {
                    0.0
                };
            }
        }
        gemm_into(o, dv, MatRef::rows(qk, c, c), MatRef::rows(vp, c, dv), true);
    }

    /// S_C = Γ_C S₀ + Σ_j e^{γ_C−γ_j} k_j ⊗ V'_j
    fn advance_state(&self, s: &mut [f32], vp: &[f32]) {
        let (c, dk, dv) = (self.c, self.dk, self.dv);
        let gamma = &self.gamma;
        let gl = gamma[c - 1];
        let gc = gl.exp();
        s.iter_mut().for_each(|x| *x *= gc);
        let mut kd = self.k.to_vec();
        for t in 0..c {
            let f = (gl - gamma[t]).exp();
            kd[t * dk..(t + 1) * dk].iter_mut().for_each(|x| *x *= f);
        }
        gemm_into(
            s,
            dv,
            MatRef::transposed(&kd, dk, c),
            MatRef::rows(vp, c, dv),
            true,
        );
    }
}

/// Causal depthwise conv over time + SiLU. `x` is `[n, ch]`, `w` `[ch, kernel]`, `state`
/// `[ch, kernel-1]` (updated to the last `kernel-1` inputs). Returns `[n, ch]`.
pub fn causal_conv_silu(
    x: &[f32],
    n: usize,
    ch: usize,
    w: &[f32],
    kernel: usize,
    state: &mut [f32],
) -> Vec<f32> {
    let past = kernel - 1;
    // Token-major, so every access is a contiguous row of `ch` channels (a channel-major loop
    // strides through `x` by `ch` and misses the cache on every read): tap `i` of output row
    // `t` reads row `t + i` of [history; x]. Taps are added in the same order as the
    // per-channel dot product, so the result is bit-identical to it.
    let mut wt = vec![0.0f32; kernel * ch];
    for c in 0..ch {
        for i in 0..kernel {
            wt[i * ch + c] = w[c * kernel + i];
        }
    }
    let mut hist = vec![0.0f32; past * ch];
    for c in 0..ch {
        for j in 0..past {
            hist[j * ch + c] = state[c * past + j];
        }
    }
    let row = |s: usize| -> &[f32] {
        if s < past {
            &hist[s * ch..(s + 1) * ch]
        } else {
            &x[(s - past) * ch..(s - past + 1) * ch]
        }
    };
    let mut out = vec![0.0f32; n * ch];
    let rows_per_task = (CONV_TASK_ELEMS / ch.max(1)).max(1);
    out.par_chunks_mut(rows_per_task * ch.max(1))
        .enumerate()
        .for_each(|(task, block)| {
            for (r, o) in block.chunks_mut(ch.max(1)).enumerate() {
                let t = task * rows_per_task + r;
                for i in 0..kernel {
                    let taps = &wt[i * ch..(i + 1) * ch];
                    for ((o, &a), &b) in o.iter_mut().zip(taps).zip(row(t + i)) {
                        *o += a * b;
                    }
                }
                o.iter_mut().for_each(|v| *v = silu(*v));
            }
        });
    for j in 0..past {
        let r = row(n + j);
        for c in 0..ch {
            state[c * past + j] = r[c];
        }
    }
    out
}

/// Output elements of the causal conv per rayon task (enough to amortise a task).
const CONV_TASK_ELEMS: usize = 1 << 15;

/// The GDN mixer of one layer (`…layers.N.linear_attn.*`).
pub struct GatedDeltaNet {
    in_proj_qkv: Linear,
    in_proj_z: Linear,
    in_proj_b: Linear,
    in_proj_a: Linear,
    conv1d: Vec<f32>,
    dt_bias: Vec<f32>,
    a_log: Vec<f32>,
    norm: Vec<f32>,
    out_proj: Linear,
    hk: usize,
    hv: usize,
    dk: usize,
    dv: usize,
    kernel: usize,
    eps: f32,
}

impl GatedDeltaNet {
    pub fn new(cfg: &TextConfig, ws: &WeightStore, p: &str) -> Result<Self> {
        let h = cfg.hidden_size;
        let (hk, hv) = (cfg.linear_num_key_heads, cfg.linear_num_value_heads);
        let (dk, dv) = (cfg.linear_key_head_dim, cfg.linear_value_head_dim);
        let conv_dim = cfg.linear_conv_dim();
        let kernel = cfg.linear_conv_kernel_dim;
        Ok(Self {
            in_proj_qkv: Linear::new(ws, &format!("{p}in_proj_qkv.weight"), conv_dim, h)?,
            in_proj_z: Linear::new(ws, &format!("{p}in_proj_z.weight"), hv * dv, h)?,
            in_proj_b: Linear::new(ws, &format!("{p}in_proj_b.weight"), hv, h)?,
            in_proj_a: Linear::new(ws, &format!("{p}in_proj_a.weight"), hv, h)?,
            conv1d: ws.get_f32(&format!("{p}conv1d.weight"), &[conv_dim, 1, kernel])?,
            dt_bias: ws.get_f32(&format!("{p}dt_bias"), &[hv])?,
            a_log: ws.get_f32(&format!("{p}A_log"), &[hv])?,
            norm: ws.get_f32(&format!("{p}norm.weight"), &[dv])?,
            out_proj: Linear::new(ws, &format!("{p}out_proj.weight"), h, hv * dv)?,
            hk,
            hv,
            dk,
            dv,
            kernel,
            eps: cfg.rms_norm_eps,
        })
    }

    /// Bytes of the layer's weights (bf16 matrices at 2 bytes).
    pub fn weight_bytes(&self) -> usize {
        [
            &self.in_proj_qkv,
            &self.in_proj_z,
            &self.in_proj_b,
            &self.in_proj_a,
            &self.out_proj,
        ]
        .iter()
        .map(|l| l.weight().size_bytes())
        .sum::<usize>()
            + 4 * (self.conv1d.len() + self.dt_bias.len() + self.a_log.len() + self.norm.len())
    }

    /// `x [n, hidden]` → `[n, hidden]`, advancing `state`. One row uses the recurrent form,
    /// more rows the chunked form.
    pub fn forward(&self, x: &[f32], n: usize, state: &mut GdnState) -> Vec<f32> {
        let (hk, hv, dk, dv) = (self.hk, self.hv, self.dk, self.dv);
        let key_dim = hk * dk;
        let conv_dim = 2 * key_dim + hv * dv;
        let mixed = self.in_proj_qkv.forward(x, n);
        let z = self.in_proj_z.forward(x, n);
        let b = self.in_proj_b.forward(x, n);
        let a = self.in_proj_a.forward(x, n);
        let conv = causal_conv_silu(
            &mixed,
            n,
            conv_dim,
            &self.conv1d,
            self.kernel,
            &mut state.conv,
        );
        // split → per-head contiguous [head][n][d] buffers
        let scale = 1.0 / (dk as f32).sqrt();
        let mut q = vec![0.0f32; hk * n * dk];
        let mut k = vec![0.0f32; hk * n * dk];
        let mut v = vec![0.0f32; hv * n * dv];
        for t in 0..n {
            let row = &conv[t * conv_dim..(t + 1) * conv_dim];
            for h in 0..hk {
                q[(h * n + t) * dk..(h * n + t + 1) * dk]
                    .copy_from_slice(&row[h * dk..(h + 1) * dk]);
                k[(h * n + t) * dk..(h * n + t + 1) * dk]
                    .copy_from_slice(&row[key_dim + h * dk..key_dim + (h + 1) * dk]);
            }
            for h in 0..hv {
                v[(h * n + t) * dv..(h * n + t + 1) * dv]
                    .copy_from_slice(&row[2 * key_dim + h * dv..2 * key_dim + (h + 1) * dv]);
            }
        }
        l2_norm(&mut q, dk);
        q.iter_mut().for_each(|x| *x *= scale);
        l2_norm(&mut k, dk);
        // beta and g per head: [hv][n]
        let mut beta = vec![0.0f32; hv * n];
        let mut g = vec![0.0f32; hv * n];
        for t in 0..n {
            for h in 0..hv {
                beta[h * n + t] = sigmoid(b[t * hv + h]);
                g[h * n + t] = -self.a_log[h].exp() * softplus(a[t * hv + h] + self.dt_bias[h]);
            }
        }
        let ratio = hv / hk;
        let outs: Vec<Vec<f32>> = state
            .recurrent
            .par_chunks_mut(dk * dv)
            .enumerate()
            .map(|(h, s)| {
                let kh = h / ratio;
                let inp = HeadInputs {
                    q: &q[kh * n * dk..(kh + 1) * n * dk],
                    k: &k[kh * n * dk..(kh + 1) * n * dk],
                    v: &v[h * n * dv..(h + 1) * n * dv],
                    beta: &beta[h * n..(h + 1) * n],
                    g: &g[h * n..(h + 1) * n],
                };
                if n == 1 {
                    delta_rule_recurrent(&inp, s, dk, dv)
                } else {
                    delta_rule_chunked(&inp, s, dk, dv, GDN_CHUNK)
                }
            })
            .collect();
        let mut o = vec![0.0f32; n * hv * dv];
        for (h, oh) in outs.iter().enumerate() {
            for t in 0..n {
                o[(t * hv + h) * dv..(t * hv + h + 1) * dv]
                    .copy_from_slice(&oh[t * dv..(t + 1) * dv]);
            }
        }
        gated_rms_norm(&mut o, &z, &self.norm, self.eps);
        self.out_proj.forward(&o, n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    const TOL: f32 = 1e-4;

    type Inputs = (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>);

    fn random_inputs(n: usize, dk: usize, dv: usize, seed: u64) -> Inputs {
        let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut unit = |len: usize, d: usize| {
            let mut x: Vec<f32> = (0..len).map(|_| r.random_range(-1.0f32..1.0)).collect();
            l2_norm(&mut x, d);
            x
        };
        let q = unit(n * dk, dk);
        let k = unit(n * dk, dk);
        let v: Vec<f32> = (0..n * dv)
            .map(|i| ((i * 7 % 13) as f32 - 6.0) / 6.0)
            .collect();
        let beta: Vec<f32> = (0..n)
            .map(|i| 0.2 + 0.6 * ((i * 5 % 7) as f32 / 7.0))
            .collect();
        let g: Vec<f32> = (0..n)
            .map(|i| -0.05 - 2.0 * ((i * 3 % 11) as f32 / 11.0))
            .collect();
        (q, k, v, beta, g)
    }

    #[test]
    fn chunked_equals_recurrent_across_chunk_boundaries() {
        let (dk, dv) = (8, 6);
        for &(n, chunk) in &[(1usize, 4usize), (7, 4), (16, 16), (37, 16), (70, 64)] {
            let (q, k, v, beta, g) = random_inputs(n, dk, dv, n as u64);
            let inp = HeadInputs {
                q: &q,
                k: &k,
                v: &v,
                beta: &beta,
                g: &g,
            };
            let mut s0: Vec<f32> = (0..dk * dv).map(|i| (i as f32 * 0.1).sin()).collect();
            let mut s1 = s0.clone();
            let a = delta_rule_recurrent(&inp, &mut s0, dk, dv);
            let b = delta_rule_chunked(&inp, &mut s1, dk, dv, chunk);
            let d = a
                .iter()
                .zip(&b)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f32::max);
            let ds = s0
                .iter()
                .zip(&s1)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f32::max);
            assert!(
                d < TOL && ds < TOL,
                "n={n} chunk={chunk}: out {d}, state {ds}"
            );
        }
    }

    #[test]
    fn one_delta_step_by_hand() {
        // dk = dv = 1: S = e^g S0 + β(v − e^g S0 k) k; o = S q
        let (s0, g, beta, k, v, q) = (0.5f32, -0.3f32, 0.7f32, 1.0f32, 2.0f32, 0.25f32);
        let mut s = vec![s0];
        let o = delta_rule_recurrent(
            &HeadInputs {
                q: &[q],
                k: &[k],
                v: &[v],
                beta: &[beta],
                g: &[g],
            },
            &mut s,
            1,
            1,
        );
        let sd = g.exp() * s0;
        let want = sd + beta * (v - sd * k) * k;
        assert!((s[0] - want).abs() < 1e-6);
        assert!((o[0] - want * q).abs() < 1e-6);
    }

    /// The token-major conv against the definition (per channel, a dot product over
    /// [state; x]) on shapes with more rows than fit one rayon task and fewer rows than taps.
    #[test]
    fn conv_matches_the_per_channel_definition() {
        let mut r = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        for &(n, ch, kernel) in &[
            (1usize, 5usize, 4usize),
            (2, 7, 4),
            (300, 130, 4),
            (9, 3, 1),
        ] {
            let x: Vec<f32> = (0..n * ch).map(|_| r.random_range(-2.0f32..2.0)).collect();
            let w: Vec<f32> = (0..ch * kernel)
                .map(|_| r.random_range(-1.0f32..1.0))
                .collect();
            let past = kernel - 1;
            let state0: Vec<f32> = (0..ch * past)
                .map(|_| r.random_range(-1.0f32..1.0))
                .collect();
            let mut state = state0.clone();
            let got = causal_conv_silu(&x, n, ch, &w, kernel, &mut state);
            for c in 0..ch {
                let seq: Vec<f32> = state0[c * past..(c + 1) * past]
                    .iter()
                    .copied()
                    .chain((0..n).map(|t| x[t * ch + c]))
                    .collect();
                for t in 0..n {
                    let mut acc = 0.0f32;
                    for i in 0..kernel {
                        acc += w[c * kernel + i] * seq[t + i];
                    }
                    assert_eq!(
                        got[t * ch + c].to_bits(),
                        silu(acc).to_bits(),
                        "n={n} c={c} t={t}"
                    );
                }
                assert_eq!(&state[c * past..(c + 1) * past], &seq[n..n + past]);
            }
        }
    }

    #[test]
    fn conv_state_carries_across_calls() {
        let (ch, kernel, n) = (3, 4, 6);
        let x: Vec<f32> = (0..n * ch).map(|i| (i as f32 * 0.3).cos()).collect();
        let w: Vec<f32> = (0..ch * kernel).map(|i| (i as f32 * 0.7).sin()).collect();
        let mut s_all = vec![0.0; ch * (kernel - 1)];
        let all = causal_conv_silu(&x, n, ch, &w, kernel, &mut s_all);
        let mut s = vec![0.0; ch * (kernel - 1)];
        let mut parts = causal_conv_silu(&x[..2 * ch], 2, ch, &w, kernel, &mut s);
        for t in 2..n {
            parts.extend(causal_conv_silu(
                &x[t * ch..(t + 1) * ch],
                1,
                ch,
                &w,
                kernel,
                &mut s,
            ));
        }
        assert_eq!(s, s_all);
        for (a, b) in all.iter().zip(&parts) {
            assert!((a - b).abs() < 1e-6);
        }
        // first output of channel 0 sees only x_0 (zero left padding)
        assert!((all[0] - silu(w[kernel - 1] * x[0])).abs() < 1e-6);
    }
}

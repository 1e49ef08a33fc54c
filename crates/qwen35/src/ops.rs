//! Element-wise and per-row operations, written once in f32 over contiguous rows.

/// Zero-centred RMSNorm used by Qwen3.5: `x / sqrt(mean(x²) + eps) * (1 + w)` per row of `w.len()`.
pub fn rms_norm_1p(x: &mut [f32], w: &[f32], eps: f32) {
    for row in x.chunks_exact_mut(w.len()) {
        let ms = row.iter().map(|v| v * v).sum::<f32>() / w.len() as f32;
        let r = 1.0 / (ms + eps).sqrt();
        for (v, wi) in row.iter_mut().zip(w) {
            *v = *v * r * (1.0 + wi);
        }
    }
}

/// GDN output norm: `(o / sqrt(mean(o²) + eps)) * w * silu(z)` per row (plain weight, norm first).
pub fn gated_rms_norm(o: &mut [f32], z: &[f32], w: &[f32], eps: f32) {
    for (row, zr) in o.chunks_exact_mut(w.len()).zip(z.chunks_exact(w.len())) {
        let ms = row.iter().map(|v| v * v).sum::<f32>() / w.len() as f32;
        let r = 1.0 / (ms + eps).sqrt();
        for ((v, wi), zi) in row.iter_mut().zip(w).zip(zr) {
            *v = *v * r * wi * silu(*zi);
        }
    }
}

/// `x / sqrt(Σx² + 1e-6)` per row of `d` (eps inside the sqrt of the sum, as HF `l2norm`).
pub fn l2_norm(x: &mut [f32], d: usize) {
    for row in x.chunks_exact_mut(d) {
        let s = row.iter().map(|v| v * v).sum::<f32>();
        let r = 1.0 / (s + 1e-6).sqrt();
        row.iter_mut().for_each(|v| *v *= r);
    }
}

/// LayerNorm with bias per row of `w.len()`.
pub fn layer_norm(x: &mut [f32], w: &[f32], b: &[f32], eps: f32) {
    let d = w.len() as f32;
    for row in x.chunks_exact_mut(w.len()) {
        let mean = row.iter().sum::<f32>() / d;
        let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / d;
        let r = 1.0 / (var + eps).sqrt();
        for ((v, wi), bi) in row.iter_mut().zip(w).zip(b) {
            *v = (*v - mean) * r * wi + bi;
        }
    }
}

pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `log(1 + e^x)` with PyTorch's linear branch above 20.
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// `gelu_pytorch_tanh`.
pub fn gelu_tanh(x: f32) -> f32 {
    const C: f32 = 0.797_884_6; // sqrt(2/pi)
    0.5 * x * (1.0 + (C * (x + 0.044_715 * x * x * x)).tanh())
}

/// Exact (erf) GELU, as nn.GELU() in the vision merger.
pub fn gelu_erf(x: f32) -> f32 {
    0.5 * x * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// Rotate-half rotary on the first `cos.len()` dims of each `head_dim`-wide head in `x`
/// (`x_rot = x*cos + rotate_half(x)*sin`, `rotate_half([a, b]) = [-b, a]`); other dims pass.
pub fn apply_rotary(x: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32]) {
    let rot = cos.len();
    let half = rot / 2;
    for head in x.chunks_exact_mut(head_dim) {
        for i in 0..half {
            let (a, b) = (head[i], head[i + half]);
            head[i] = a * cos[i] - b * sin[i];
            head[i + half] = b * cos[i + half] + a * sin[i + half];
        }
    }
}

/// In-place softmax of a row (max-subtracted, f32).
pub fn softmax(row: &mut [f32]) {
    let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut s = 0.0f32;
    for v in row.iter_mut() {
        *v = (*v - m).exp();
        s += *v;
    }
    let r = 1.0 / s;
    row.iter_mut().for_each(|v| *v *= r);
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOL: f32 = 1e-6;

    #[test]
    fn rms_norm_1p_uses_offset_weight() {
        let mut x = vec![3.0, 4.0];
        rms_norm_1p(&mut x, &[0.0, 1.0], 0.0);
        let r = (12.5f32).sqrt();
        assert!((x[0] - 3.0 / r).abs() < TOL);
        assert!((x[1] - 2.0 * 4.0 / r).abs() < TOL);
    }

    #[test]
    fn gated_norm_is_plain_weight_then_silu_gate() {
        let mut o = vec![1.0, -1.0];
        gated_rms_norm(&mut o, &[0.0, 2.0], &[2.0, 3.0], 0.0);
        assert!(o[0].abs() < TOL); // silu(0) = 0
        assert!((o[1] - (-3.0 * silu(2.0))).abs() < TOL);
    }

    #[test]
    fn l2norm_eps_inside_sum() {
        let mut x = vec![0.0, 0.0];
        l2_norm(&mut x, 2);
        assert_eq!(x, vec![0.0, 0.0]);
        let mut y = vec![1e-4f32, 0.0];
        l2_norm(&mut y, 2);
        let want = 1e-4 / (1e-8f32 + 1e-6).sqrt();
        assert!((y[0] - want).abs() < 1e-6);
    }

    #[test]
    fn activations_match_closed_forms() {
        assert!((softplus(0.0) - 2f32.ln()).abs() < TOL);
        assert_eq!(softplus(30.0), 30.0);
        assert!((gelu_erf(1.0) - 0.841_344_8).abs() < 1e-6);
        assert!((gelu_tanh(1.0) - 0.841_192).abs() < 1e-6);
        assert!((sigmoid(0.0) - 0.5).abs() < TOL);
    }

    #[test]
    fn rotary_rotates_pairs_and_passes_tail() {
        // one head of 6 dims, rot 4: pairs (0,2), (1,3); dims 4,5 untouched
        let ang = [0.3f32, 1.1];
        let cos = [ang[0].cos(), ang[1].cos(), ang[0].cos(), ang[1].cos()];
        let sin = [ang[0].sin(), ang[1].sin(), ang[0].sin(), ang[1].sin()];
        let mut x = vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        apply_rotary(&mut x, 6, &cos, &sin);
        let want0 = 1.0 * cos[0] - 3.0 * sin[0];
        let want2 = 3.0 * cos[0] + 1.0 * sin[0];
        assert!((x[0] - want0).abs() < TOL && (x[2] - want2).abs() < TOL);
        assert!((x[1] - (2.0 * cos[1] - 4.0 * sin[1])).abs() < TOL);
        assert_eq!(&x[4..], &[5.0, 6.0]);
        // norm of each pair preserved
        assert!(((x[0] * x[0] + x[2] * x[2]) - 10.0).abs() < 1e-5);
    }
}

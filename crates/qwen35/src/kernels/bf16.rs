//! bf16 weights × f32 activations, the crate's one SIMD module (docs/conventions.md allows
//! `unsafe` here, only for the intrinsics, each block with a `// SAFETY:` note).
//!
//! Why a hand-written kernel: no GEMM crate multiplies bf16 by f32, and widening a whole
//! checkpoint to f32 doubles its memory and the bytes a decode step streams
//! (gemm 0.19, for one, is f32/f64/c32/c64/f16). Two shapes, both exact f32 arithmetic on
//! the widened bf16 values:
//! - decode GEMV (`n = 1`): reads bf16 rows straight from memory (the bandwidth-bound case),
//!   with the instruction set picked at run time ([`Isa::detect`]): AVX-512F or AVX2+FMA on
//!   x86_64, NEON on aarch64, a portable scalar loop elsewhere. On the dev VM the AVX-512 loop
//!   (8 rows in flight) streams weights ~1.5x faster than the AVX2 one (4 rows), close to the
//!   machine's read bandwidth (BENCHMARKS.md);
//! - prefill GEMM (`n > 1`): widens a tile of weight rows into a small f32 scratch and hands it
//!   to the `gemm` crate, so only the conversion is ours.
#![allow(unsafe_code)]

use std::sync::OnceLock;

use half::bf16;
use rayon::prelude::*;

use super::{gemm_into_with, MatRef};

/// Instruction set of the GEMV inner loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// Portable loop (any target).
    Scalar,
    /// x86_64 AVX2 + FMA, 8 lanes.
    Avx2Fma,
    /// x86_64 AVX-512F, 16 lanes.
    Avx512,
    /// aarch64 Advanced SIMD, 4 lanes × 2.
    Neon,
}

impl Isa {
    /// Whether this CPU can run the path (checked at run time).
    pub fn is_supported(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2Fma => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => std::arch::is_x86_feature_detected!("avx512f"),
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// Every path this CPU supports (tests run each against the reference).
    pub fn supported() -> Vec<Isa> {
        [Isa::Scalar, Isa::Avx2Fma, Isa::Avx512, Isa::Neon]
            .into_iter()
            .filter(|i| i.is_supported())
            .collect()
    }

    /// Parses a path name as in `QWEN35_BF16_ISA` (`scalar`, `avx2`, `avx512`, `neon`).
    pub fn from_name(name: &str) -> Option<Isa> {
        match name {
            "scalar" => Some(Isa::Scalar),
            "avx2" => Some(Isa::Avx2Fma),
            "avx512" => Some(Isa::Avx512),
            "neon" => Some(Isa::Neon),
            _ => None,
        }
    }

    /// The path's name, as [`Isa::from_name`] and `QWEN35_BF16_ISA` take it.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2Fma => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Neon => "neon",
        }
    }

    /// The path used by [`gemv`], chosen once per process: the fastest supported one, or the
    /// one named by the environment variable `QWEN35_BF16_ISA` if this CPU supports it (for
    /// measurements and debugging; anything else is logged and ignored).
    pub fn detect() -> Isa {
        static BEST: OnceLock<Isa> = OnceLock::new();
        *BEST.get_or_init(|| {
            let best = [Isa::Avx512, Isa::Avx2Fma, Isa::Neon]
                .into_iter()
                .find(|i| i.is_supported())
                .unwrap_or(Isa::Scalar);
            let chosen = match std::env::var("QWEN35_BF16_ISA") {
                Ok(v) => match Isa::from_name(&v) {
                    Some(i) if i.is_supported() => i,
                    _ => {
                        tracing::warn!(QWEN35_BF16_ISA = %v, ?best, "unsupported bf16 path ignored");
                        best
                    }
                },
                Err(_) => best,
            };
            tracing::debug!(?chosen, "bf16 GEMV path");
            chosen
        })
    }
}

/// Widens bf16 to f32 exactly (the shift is the definition of bf16; `half`'s `to_f32` adds a
/// NaN branch that slows vector loops).
#[inline(always)]
pub fn widen(b: bf16) -> f32 {
    f32::from_bits(u32::from(b.to_bits()) << 16)
}

/// `Σ_{from ≤ j < k} w[r·k + j] · x[j]`: the columns of row `r` a vector loop leaves over.
#[inline]
fn row_tail(w: &[bf16], k: usize, x: &[f32], r: usize, from: usize) -> f32 {
    (from..k).map(|j| widen(w[r * k + j]) * x[j]).sum()
}

/// Rows of output handled by one rayon task in the GEMV (enough work to amortise a task).
const GEMV_ROWS_PER_TASK: usize = 64;

/// `out[r] = Σ_j w[r·k + j] · x[j]` for `r < out.len()` on the given path, single-threaded.
///
/// Panics if `w` is shorter than `out.len()·k`, `x.len() != k`, or `isa` is not supported
/// (all caller bugs, never data-dependent).
pub fn gemv_rows_with(isa: Isa, w: &[bf16], k: usize, x: &[f32], out: &mut [f32]) {
    assert_eq!(
        x.len(),
        k,
        "bf16 GEMV: x length differs from the row length"
    );
    assert!(
        w.len() >= out.len() * k,
        "bf16 GEMV: weight slice too short"
    );
    assert!(isa.is_supported(), "bf16 GEMV: {isa:?} not supported here");
    match isa {
        Isa::Scalar => gemv_scalar(w, k, x, out),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `is_supported` above confirmed AVX2 and FMA at run time; the slice bounds
        // the kernel relies on were asserted above.
        Isa::Avx2Fma => unsafe { x86::gemv(w, k, x, out) },
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `is_supported` above confirmed AVX-512F at run time; bounds asserted above.
        Isa::Avx512 => unsafe { x86::gemv512(w, k, x, out) },
        #[cfg(target_arch = "aarch64")]
        // SAFETY: `is_supported` above confirmed NEON at run time; bounds asserted above.
        Isa::Neon => unsafe { arm::gemv(w, k, x, out) },
        #[allow(unreachable_patterns)]
        _ => gemv_scalar(w, k, x, out),
    }
}

/// Portable reference path (also the fallback).
fn gemv_scalar(w: &[bf16], k: usize, x: &[f32], out: &mut [f32]) {
    for (r, o) in out.iter_mut().enumerate() {
        let row = &w[r * k..(r + 1) * k];
        *o = row.iter().zip(x).map(|(a, b)| widen(*a) * b).sum();
    }
}

/// Decode GEMV `y[m] = W[m, k] · x[k]`, rows split over the rayon pool.
pub fn gemv(w: &[bf16], k: usize, x: &[f32], m: usize) -> Vec<f32> {
    let isa = Isa::detect();
    let mut out = vec![0.0f32; m];
    assert!(w.len() >= m * k, "bf16 GEMV: weight slice too short");
    out.par_chunks_mut(GEMV_ROWS_PER_TASK)
        .enumerate()
        .for_each(|(i, o)| {
            let r0 = i * GEMV_ROWS_PER_TASK;
            gemv_rows_with(isa, &w[r0 * k..(r0 + o.len()) * k], k, x, o);
        });
    out
}

/// f32 elements of a widened weight tile (1 MiB: fits a 2 MiB L2 while gemm runs, and
/// amortises gemm's per-call packing of `x` over more output columns than smaller tiles).
const TILE_ELEMS: usize = 1 << 18;

/// `x[n, k] · Wᵀ` with `W` row-major bf16 `[m, k]` (a PyTorch Linear weight) → `[n, m]`.
/// `n = 1` takes the GEMV; larger `n` widens `W` tile by tile into f32 for `gemm`.
pub fn linear(x: &[f32], n: usize, k: usize, w: &[bf16], m: usize) -> Vec<f32> {
    assert_eq!(x.len(), n * k, "bf16 linear: x is not [n, k]");
    assert!(w.len() >= m * k, "bf16 linear: weight slice too short");
    if n == 1 {
        return gemv(w, k, x, m);
    }
    let mut out = vec![0.0f32; n * m];
    if m == 0 || n == 0 {
        return out;
    }
    let tile = (TILE_ELEMS / k.max(1)).clamp(8, 512).min(m);
    // one [n, tile] block per task, gathered afterwards (tasks cannot share `out` columns)
    let blocks: Vec<(usize, Vec<f32>)> = (0..m.div_ceil(tile))
        .into_par_iter()
        .map_init(Vec::new, |scratch: &mut Vec<f32>, ti| {
            let r0 = ti * tile;
            let rows = tile.min(m - r0);
            scratch.clear();
            scratch.extend(w[r0 * k..(r0 + rows) * k].iter().map(|b| widen(*b)));
            let mut y = vec![0.0f32; n * rows];
            gemm_into_with(
                &mut y,
                rows,
                MatRef::rows(x, n, k),
                MatRef::transposed(scratch, k, rows),
                false,
                false,
            );
            (r0, y)
        })
        .collect();
    for (r0, y) in blocks {
        let rows = y.len() / n;
        for t in 0..n {
            out[t * m + r0..t * m + r0 + rows].copy_from_slice(&y[t * rows..(t + 1) * rows]);
        }
    }
    out
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use half::bf16;
    use std::arch::x86_64::*;

    /// See [`super::gemv_rows_with`]; four rows per pass so each x vector is loaded once per
    /// four rows. The body is one `unsafe` block (raw-pointer loads).
    ///
    /// # Safety
    /// AVX2 and FMA must be available; `x.len() == k` and `w.len() >= out.len() * k`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn gemv(w: &[bf16], k: usize, x: &[f32], out: &mut [f32]) {
        let rows = out.len();
        let k8 = k - k % 8;
        let (wp, xp) = (w.as_ptr(), x.as_ptr());
        let tail = |r: usize| super::row_tail(w, k, x, r, k8);
        // SAFETY: AVX2+FMA are available (caller contract). Every load reads 8 elements at
        // column j with j + 8 <= k8 <= k = x.len(), in row r' < rows, so the weight load ends at
        // r'·k + j + 8 <= rows·k <= w.len(); `loadu` accepts any alignment; stores go to a
        // local array of 8 f32.
        unsafe {
            // 8 bf16 widened to f32 lanes (bf16 is the high half of an f32)
            let load8 = |p: *const bf16| -> __m256 {
                let raw = _mm_loadu_si128(p.cast::<__m128i>());
                _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(raw)))
            };
            let hsum = |v: __m256| -> f32 {
                let mut lanes = [0.0f32; 8];
                _mm256_storeu_ps(lanes.as_mut_ptr(), v);
                lanes.iter().sum()
            };
            let mut r = 0;
            while r + 4 <= rows {
                let mut acc = [_mm256_setzero_ps(); 4];
                let mut j = 0;
                while j < k8 {
                    let xv = _mm256_loadu_ps(xp.add(j));
                    for (i, a) in acc.iter_mut().enumerate() {
                        *a = _mm256_fmadd_ps(load8(wp.add((r + i) * k + j)), xv, *a);
                    }
                    j += 8;
                }
                for (i, a) in acc.iter().enumerate() {
                    out[r + i] = hsum(*a) + tail(r + i);
                }
                r += 4;
            }
            while r < rows {
                let mut a = _mm256_setzero_ps();
                let mut j = 0;
                while j < k8 {
                    a = _mm256_fmadd_ps(load8(wp.add(r * k + j)), _mm256_loadu_ps(xp.add(j)), a);
                    j += 8;
                }
                out[r] = hsum(a) + tail(r);
                r += 1;
            }
        }
    }

    /// The AVX-512F path: 16 columns per step and eight rows per pass (more loads in flight
    /// than the AVX2 loop, which is what raises the streamed bandwidth), then one row at a
    /// time for the rest.
    ///
    /// # Safety
    /// AVX-512F must be available; `x.len() == k` and `w.len() >= out.len() * k`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn gemv512(w: &[bf16], k: usize, x: &[f32], out: &mut [f32]) {
        const ROWS: usize = 8;
        let rows = out.len();
        let k16 = k - k % 16;
        let (wp, xp) = (w.as_ptr(), x.as_ptr());
        let tail = |r: usize| super::row_tail(w, k, x, r, k16);
        // SAFETY: AVX-512F is available (caller contract). Every load reads 16 elements at
        // column j with j + 16 <= k16 <= k = x.len(), in row r' < rows, so the weight load
        // ends at r'·k + j + 16 <= rows·k <= w.len(); `loadu` accepts any alignment.
        unsafe {
            let mut r = 0;
            while r + ROWS <= rows {
                let mut acc = [_mm512_setzero_ps(); ROWS];
                let mut j = 0;
                while j < k16 {
                    let xv = _mm512_loadu_ps(xp.add(j));
                    for (i, a) in acc.iter_mut().enumerate() {
                        let raw = _mm256_loadu_si256(wp.add((r + i) * k + j).cast::<__m256i>());
                        let wv = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(
                            _mm512_cvtepu16_epi32(raw),
                        ));
                        *a = _mm512_fmadd_ps(wv, xv, *a);
                    }
                    j += 16;
                }
                for (i, a) in acc.iter().enumerate() {
                    out[r + i] = _mm512_reduce_add_ps(*a) + tail(r + i);
                }
                r += ROWS;
            }
            while r < rows {
                let mut a = _mm512_setzero_ps();
                let mut j = 0;
                while j < k16 {
                    let raw = _mm256_loadu_si256(wp.add(r * k + j).cast::<__m256i>());
                    let wv =
                        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(raw)));
                    a = _mm512_fmadd_ps(wv, _mm512_loadu_ps(xp.add(j)), a);
                    j += 16;
                }
                out[r] = _mm512_reduce_add_ps(a) + tail(r);
                r += 1;
            }
        }
    }
}

#[cfg(target_arch = "aarch64")]
mod arm {
    use half::bf16;
    use std::arch::aarch64::*;

    /// See [`super::gemv_rows_with`]; 8 columns per step in two 4-lane accumulators. One
    /// `unsafe` block, as in the x86 kernel (raw-pointer loads).
    ///
    /// # Safety
    /// NEON must be available; `x.len() == k` and `w.len() >= out.len() * k`.
    #[target_feature(enable = "neon")]
    pub(super) unsafe fn gemv(w: &[bf16], k: usize, x: &[f32], out: &mut [f32]) {
        let k8 = k - k % 8;
        let (wp, xp) = (w.as_ptr().cast::<u16>(), x.as_ptr());
        for (r, o) in out.iter_mut().enumerate() {
            let tail = super::row_tail(w, k, x, r, k8);
            // SAFETY: NEON is available (caller contract); j + 8 <= k8 <= x.len() and
            // r·k + j + 8 <= (r+1)·k <= w.len() (caller contract); bf16 has the size and
            // alignment of u16.
            unsafe {
                let mut lo = vdupq_n_f32(0.0);
                let mut hi = vdupq_n_f32(0.0);
                let mut j = 0;
                while j < k8 {
                    let raw = vld1q_u16(wp.add(r * k + j));
                    let wl = vreinterpretq_f32_u32(vshll_n_u16::<16>(vget_low_u16(raw)));
                    let wh = vreinterpretq_f32_u32(vshll_high_n_u16::<16>(raw));
                    lo = vfmaq_f32(lo, wl, vld1q_f32(xp.add(j)));
                    hi = vfmaq_f32(hi, wh, vld1q_f32(xp.add(j + 4)));
                    j += 8;
                }
                *o = vaddvq_f32(vaddq_f32(lo, hi)) + tail;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Relative bound vs an f64 reference over the exactly widened weights: f32 accumulation
    /// of k products of magnitude ≤ 1 (error ≈ k·2⁻²⁴, kept loose for reassociation).
    fn tol(k: usize, scale: f64) -> f64 {
        1e-6 * (k as f64 + 1.0) * scale.max(1.0)
    }

    fn random(rng: &mut ChaCha8Rng, m: usize, k: usize, n: usize) -> (Vec<bf16>, Vec<f32>) {
        let w = (0..m * k)
            .map(|_| bf16::from_f32(rng.random_range(-1.0f32..1.0)))
            .collect();
        let x = (0..n * k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        (w, x)
    }

    /// f64 reference of `x[n,k]·Wᵀ` over the widened bf16 values.
    fn reference(x: &[f32], n: usize, k: usize, w: &[bf16], m: usize) -> Vec<f64> {
        let mut out = vec![0.0f64; n * m];
        for t in 0..n {
            for r in 0..m {
                out[t * m + r] = (0..k)
                    .map(|j| f64::from(w[r * k + j].to_f32()) * f64::from(x[t * k + j]))
                    .sum();
            }
        }
        out
    }

    #[test]
    fn widen_matches_half_for_finite_values() {
        for bits in (0u16..=u16::MAX).step_by(7) {
            let b = bf16::from_bits(bits);
            if b.is_finite() {
                assert_eq!(widen(b).to_bits(), b.to_f32().to_bits());
            }
        }
    }

    /// Every supported path on random shapes, odd sizes included (row tails, k tails).
    #[test]
    fn every_gemv_path_matches_reference() {
        let mut rng = ChaCha8Rng::seed_from_u64(0xbf16);
        let paths = Isa::supported();
        assert!(paths.contains(&Isa::Scalar));
        for case in 0..200 {
            let m = rng.random_range(1..40usize);
            let k = if case % 5 == 0 {
                rng.random_range(1..9usize)
            } else {
                rng.random_range(1..300usize)
            };
            let (w, x) = random(&mut rng, m, k, 1);
            let want = reference(&x, 1, k, &w, m);
            for &isa in &paths {
                let mut got = vec![f32::NAN; m];
                gemv_rows_with(isa, &w, k, &x, &mut got);
                for (r, (g, e)) in got.iter().zip(&want).enumerate() {
                    let d = (f64::from(*g) - e).abs();
                    assert!(
                        d <= tol(k, 1.0),
                        "{isa:?} m={m} k={k} row {r}: {g} vs {e} (|d| {d})"
                    );
                }
            }
        }
    }

    /// The public entry points (parallel GEMV for n = 1, tiled gemm for n > 1), with shapes
    /// that leave partial tiles and partial rayon chunks.
    #[test]
    fn linear_matches_reference() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        for &(n, k, m) in &[
            (1, 1, 1),
            (1, 1023, 131),
            (1, 17, 515),
            (2, 9, 3),
            (3, 333, 77),
            (5, 64, 1025),
            (33, 257, 19),
            (64, 1000, 150),
        ] {
            let (w, x) = random(&mut rng, m, k, n);
            let want = reference(&x, n, k, &w, m);
            let got = linear(&x, n, k, &w, m);
            assert_eq!(got.len(), n * m);
            // and the crate's f32 path (gemm) on the widened weights
            let wide: Vec<f32> = w.iter().map(|b| b.to_f32()).collect();
            let f32_path = super::super::linear(&x, n, k, &wide, m);
            for (g, e) in got.iter().zip(&f32_path) {
                assert!(
                    f64::from((g - e).abs()) <= tol(k, 1.0),
                    "n={n} k={k} m={m}: bf16 {g} vs f32 path {e}"
                );
            }
            for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                let d = (f64::from(*g) - e).abs();
                assert!(d <= tol(k, 1.0), "n={n} k={k} m={m} [{i}]: {g} vs {e}");
            }
        }
    }

    #[test]
    fn detected_path_is_supported() {
        assert!(Isa::detect().is_supported());
        #[cfg(target_arch = "aarch64")]
        assert_eq!(Isa::detect(), Isa::Neon);
    }
}

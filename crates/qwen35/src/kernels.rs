//! Matrix products through the `gemm` crate. This is the crate's one compute module allowed
//! `unsafe` (docs/conventions.md, "Where `unsafe` is allowed"): `gemm::gemm` takes raw pointers,
//! so every call goes through [`gemm_into`], which checks all strided extents first; the
//! bf16-weight kernels (SIMD intrinsics) live in the submodule [`bf16`].
#![allow(unsafe_code)]

pub mod bf16;

use crate::weights::WeightData;

/// A strided read-only matrix view: element (r, c) is `data[r*rs + c*cs]`.
#[derive(Clone, Copy)]
pub struct MatRef<'a> {
    pub data: &'a [f32],
    pub rows: usize,
    pub cols: usize,
    pub rs: usize,
    pub cs: usize,
}

impl<'a> MatRef<'a> {
    /// Row-major `[rows, cols]`.
    pub fn rows(data: &'a [f32], rows: usize, cols: usize) -> Self {
        Self {
            data,
            rows,
            cols,
            rs: cols,
            cs: 1,
        }
    }
    /// Transposed view of a row-major `[cols, rows]` buffer (e.g. a weight `[out, in]` seen as `[in, out]`).
    pub fn transposed(data: &'a [f32], rows: usize, cols: usize) -> Self {
        Self {
            data,
            rows,
            cols,
            rs: 1,
            cs: rows,
        }
    }
    fn fits(&self) -> bool {
        self.rows == 0
            || self.cols == 0
            || (self.rows - 1) * self.rs + (self.cols - 1) * self.cs < self.data.len()
    }
}

/// Work above which gemm may use the rayon pool.
const PARALLEL_FLOPS: usize = 1 << 18;

/// `out[m, n] (row stride out_rs) = (accumulate ? out : 0) + a[m, k] · b[k, n]`.
///
/// Panics if the views do not fit their buffers (a caller bug, never data-dependent).
pub fn gemm_into(out: &mut [f32], out_rs: usize, a: MatRef<'_>, b: MatRef<'_>, accumulate: bool) {
    gemm_into_with(out, out_rs, a, b, accumulate, true);
}

/// [`gemm_into`] with the rayon pool allowed (`parallel`, above a work threshold) or not
/// (callers that already split the work over the pool).
pub fn gemm_into_with(
    out: &mut [f32],
    out_rs: usize,
    a: MatRef<'_>,
    b: MatRef<'_>,
    accumulate: bool,
    parallel: bool,
) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert_eq!(b.rows, k, "gemm inner dimensions differ");
    assert!(a.fits() && b.fits(), "gemm operand view exceeds its buffer");
    assert!(
        m == 0 || n == 0 || (m - 1) * out_rs + n <= out.len(),
        "gemm output view exceeds its buffer"
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for r in 0..m {
                out[r * out_rs..r * out_rs + n].fill(0.0);
            }
        }
        return;
    }
    let par = if parallel && m * n * k >= PARALLEL_FLOPS {
        gemm::Parallelism::Rayon(0)
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: the asserts above guarantee that every element gemm addresses — (r, c) at
    // r*rs + c*cs for r < rows, c < cols, and out rows r*out_rs .. +n — lies inside its slice;
    // `out` is uniquely borrowed and cannot alias `a` or `b` (shared borrows).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            out_rs as isize,
            accumulate,
            a.data.as_ptr(),
            a.cs as isize,
            a.rs as isize,
            b.data.as_ptr(),
            b.cs as isize,
            b.rs as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            par,
        );
    }
}

/// `x[n, k] · wᵀ` with `w` row-major `[m, k]` (a PyTorch Linear weight) → `[n, m]`.
pub fn linear(x: &[f32], n: usize, k: usize, w: &[f32], m: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; n * m];
    gemm_into(
        &mut out,
        m,
        MatRef::rows(x, n, k),
        MatRef::transposed(w, k, m),
        false,
    );
    out
}

/// The bf16 GEMV path the run-time dispatch picked for this process ([`bf16::Isa::detect`]):
/// `"avx512"`, `"avx2"`, `"neon"` or `"scalar"` (the names `QWEN35_BF16_ISA` takes). Tests
/// assert it per architecture (`tests/kernel_path.rs`: `"neon"` on aarch64).
pub fn active_path() -> &'static str {
    bf16::Isa::detect().name()
}

/// `x[n, k] · wᵀ` for a weight `[m, k]` in its stored precision: f32 takes [`linear`]
/// unchanged (the exact f32 path), bf16 takes [`bf16::linear`].
pub fn linear_any(x: &[f32], n: usize, k: usize, w: &WeightData, m: usize) -> Vec<f32> {
    match w {
        WeightData::F32(w) => linear(x, n, k, w, m),
        WeightData::Bf16(w) => bf16::linear(x, n, k, w.as_slice(), m),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// gemm path vs a plain f64 triple loop.
    const GEMM_TOL: f32 = 1e-4;

    proptest! {
        #[test]
        fn gemm_into_matches_naive(m in 1usize..20, k in 1usize..40, n in 1usize..20, seed in 0u32..1000, at in any::<bool>()) {
            let a: Vec<f32> = (0..m * k).map(|i| (((i as u32).wrapping_mul(2_654_435_761) ^ seed) % 1000) as f32 / 500.0 - 1.0).collect();
            let b: Vec<f32> = (0..k * n).map(|i| (((i as u32).wrapping_mul(40_503) ^ seed) % 997) as f32 / 498.0 - 1.0).collect();
            // `a` either row-major [m, k] or stored transposed [k, m]
            let av = if at { MatRef::transposed(&a, m, k) } else { MatRef::rows(&a, m, k) };
            let mut out = vec![0.0f32; m * n];
            gemm_into(&mut out, n, av, MatRef::rows(&b, k, n), false);
            for r in 0..m {
                for c in 0..n {
                    let want: f64 = (0..k).map(|j| {
                        let x = if at { a[j * m + r] } else { a[r * k + j] };
                        x as f64 * b[j * n + c] as f64
                    }).sum();
                    prop_assert!((out[r * n + c] as f64 - want).abs() < GEMM_TOL as f64);
                }
            }
        }
    }

    #[test]
    fn gemm_matches_naive_on_strided_views() {
        let (m, k, n) = (5, 7, 3);
        let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let w: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.11).cos()).collect();
        let y = linear(&a, m, k, &w, n);
        for r in 0..m {
            for c in 0..n {
                let want: f32 = (0..k).map(|j| a[r * k + j] * w[c * k + j]).sum();
                assert!((y[r * n + c] - want).abs() < 1e-5);
            }
        }
        // accumulate into a strided destination
        let mut out = vec![1.0f32; m * 10];
        gemm_into(
            &mut out,
            10,
            MatRef::rows(&a, m, k),
            MatRef::transposed(&w, k, n),
            true,
        );
        for r in 0..m {
            for c in 0..n {
                assert!((out[r * 10 + c] - 1.0 - y[r * n + c]).abs() < 1e-5);
            }
            assert_eq!(out[r * 10 + 5], 1.0);
        }
    }
}

//! The bf16 GEMV path the run-time dispatch picks on this CPU
//! ([`qwen35::kernels::active_path`]). On aarch64 (the board's Cortex-A78AE; qemu-user's
//! cortex-a76 in the aarch64 phase of `tools/test.sh`) it must be NEON: the scalar fallback
//! passes every numeric test while streaming weights several times slower, so only this test
//! would notice the dispatch missing it. One test in this binary, so the override variable is
//! cleared before anything runs the dispatch.
#![allow(clippy::unwrap_used)]

use half::bf16;
use qwen35::kernels::active_path;
use qwen35::kernels::bf16::{gemv, gemv_rows_with, Isa};

#[test]
fn dispatch_picks_the_fastest_path_of_this_cpu_and_it_computes_the_scalar_result() {
    // `QWEN35_BF16_ISA` would replace the choice under test.
    std::env::remove_var("QWEN35_BF16_ISA");
    let path = active_path();

    #[cfg(target_arch = "aarch64")]
    assert_eq!(path, "neon", "aarch64 must take the NEON GEMV");
    #[cfg(target_arch = "x86_64")]
    {
        let best = if std::arch::is_x86_feature_detected!("avx512f") {
            "avx512"
        } else if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
        {
            "avx2"
        } else {
            "scalar"
        };
        assert_eq!(path, best);
    }
    assert_eq!(Isa::from_name(path).map(Isa::name), Some(path));
    assert!(Isa::from_name(path).unwrap().is_supported());

    // The dispatched GEMV (rayon chunks, row and column tails) against the scalar loop.
    let (m, k) = (131, 1027);
    let w: Vec<bf16> = (0..m * k)
        .map(|i| bf16::from_f32((i * 7919 % 2001) as f32 / 1000.0 - 1.0))
        .collect();
    let x: Vec<f32> = (0..k).map(|j| (j * 31 % 97) as f32 / 48.0 - 1.0).collect();
    let got = gemv(&w, k, &x, m);
    let mut want = vec![0.0f32; m];
    gemv_rows_with(Isa::Scalar, &w, k, &x, &mut want);
    for r in 0..m {
        // f32 sums in another order: relative to the sum of |products|
        let scale: f32 = (0..k).map(|j| (w[r * k + j].to_f32() * x[j]).abs()).sum();
        let d = (got[r] - want[r]).abs();
        assert!(
            d <= 1e-5 * scale,
            "row {r}: {path} {} vs scalar {} (|d| {d})",
            got[r],
            want[r]
        );
    }
}

//! The engine (scheduler + `CpuBackend`) through the scenarios every backend must pass
//! (`vlm_testkit::scenarios`): the HF goldens of the fixture models for every schedule, the
//! CPU reference, chunked prefill vs stepping, snapshot/restore, context overflow and the
//! window end, cancel/deadline, image vs no image. Then the CPU's own state layout.
#![allow(clippy::unwrap_used)]

use vlm::engine::Backend;
use vlm_testkit::{
    case_prompt, config, golden_case, BackendFactory, BackendSpec, CpuFactory, Mask,
};

vlm_testkit::backend_suite!(CpuFactory::default());

/// The CPU's state blob after a prefill: header + sizes + trimmed K/V (P rows of
/// kv_heads·head_dim f32, K and V) + GDN state whole + logits.
#[test]
fn a_snapshot_after_the_prefill_has_the_cpu_layout_size() {
    let mut e = CpuFactory::default().engine(BackendSpec::new("tiny-4b", 256, 32).mask(Mask::One));
    let (prompt, images) = case_prompt(&e, &golden_case("tiny-4b", "image_one"));
    assert!(e.prefill(&prompt, &images, &mut || false).unwrap());
    let blob = e.backend_mut().snapshot().unwrap();
    let tc = &config("tiny-4b").text;
    let p = prompt.rows();
    let kv = tc
        .layer_types
        .iter()
        .filter(|t| **t == qwen35::LayerType::FullAttention)
        .count();
    let gdn = tc.num_layers() - kv;
    let gdn_bytes = (tc.linear_num_value_heads * tc.linear_key_head_dim * tc.linear_value_head_dim
        + tc.linear_conv_dim() * (tc.linear_conv_kernel_dim - 1))
        * 4;
    let want = 7 * 4
        + 2 * tc.num_layers() * 4
        + kv * 2 * p * tc.num_key_value_heads * tc.head_dim * 4
        + gdn * gdn_bytes
        + tc.vocab_size * 4;
    assert_eq!(blob.size_bytes(), want);
    assert_eq!(blob.consumed(), Some(p));
}

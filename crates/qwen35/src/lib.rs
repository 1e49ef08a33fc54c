//! Qwen3.5 (hybrid Gated DeltaNet / gated attention VLM) on the CPU, loaded from HF
//! safetensors checkpoints. It is the numerical ground truth of the project: the BPU
//! simulator runs its graphs with this crate and the CPU backend serves dev PCs with it.
//!
//! Precision: activations, state and all arithmetic are f32. f32 checkpoints run in f32
//! throughout (the path the HF goldens are checked against, ≤ 1e-4). bf16 checkpoints keep
//! their weight matrices in bf16, read in place from the memory map (memory ≈ the file size),
//! and multiply them with the bf16×f32 kernels of [`kernels::bf16`] (run-time choice of
//! AVX-512F / AVX2+FMA / NEON / scalar). bf16 weights are a different model from the f32
//! one they were rounded from: on the random tiny fixtures bf16 rounding moves logits by up
//! to ~0.13, more than some golden top-1/top-2 margins, so the bf16 parity test
//! (`tests/weights.rs`) asks for a mean cosine ≥ 0.999, ≥ 0.995 per step and the same top-1
//! only where the f32 margin is ≥ 0.25 (the committed fixtures were made for the f32 bar and
//! are not regenerated for bf16). The kernels themselves are exact on the widened bf16
//! values: a bf16 checkpoint and its f32 widening give the same logits within 1e-4. f16
//! checkpoints are widened to f32 on load.
//!
//! Must not depend on: `vlm`, `hbdnn`, `bpu-sim`, tokio, ROS. No I/O beyond the config and
//! safetensors loader; only `mmap` (memory map) and `kernels` (gemm calls; SIMD intrinsics in
//! `kernels::bf16`) use `unsafe`.
//!
//! Two ways to run the text model, one code path underneath:
//! - CPU convenience: [`TextModel::forward`] with positions (cos/sin made inside), K/V growing;
//! - BPU graph semantics: [`TextModel::forward_window`] with caller cos/sin `[n, rot]`, an
//!   additive mask `[mask_heads, n, CL]` and a fixed right-aligned K/V window of CL rows.
//!
//! ```
//! use qwen35::{rope::{window_mask, Pos3, MASK_NEG}, config::mrope_axes};
//! let m = window_mask(0, 1, 4, 1); // first token in a 4-slot window sees only the last slot
//! assert_eq!(m, vec![MASK_NEG, MASK_NEG, MASK_NEG, 0.0]);
//! assert_eq!(mrope_axes(6, &[2, 2, 2]), vec![0, 1, 2, 0, 1, 2]);
//! let _ = Pos3::text(0);
//! ```
#![deny(unsafe_code)]

pub mod config;
pub mod error;
pub mod gdn;
pub mod generate;
pub mod kernels;
pub mod layers;
mod mmap;
pub mod model;
pub mod ops;
pub mod rope;
pub mod text;
pub mod vision;
pub mod weights;

pub use config::{Config, LayerType, TextConfig, VisionConfig};
pub use error::{Error, Result};
pub use gdn::GdnState;
pub use generate::{argmax, Generation, PreparedImage, PromptInputs};
pub use layers::KvState;
pub use model::Qwen35Model;
pub use rope::{mrope_positions, rope_tables, window_mask, ImageGrid, Pos3, MASK_NEG};
pub use text::{
    f32_from_le_bytes, f32_to_le_bytes, KvLayout, LayerState, LogitRows, SequenceState, TextModel,
};
pub use vision::{patchify, patchify_rgb8, Normalise, PatchLayout, VisionTower};
pub use weights::{Bf16Data, WeightData, WeightStore};

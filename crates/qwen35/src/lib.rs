//! Qwen3.5 (hybrid Gated DeltaNet / gated attention VLM) on the CPU in f32, loaded from HF
//! safetensors checkpoints. It is the numerical ground truth of the project: the BPU
//! simulator runs its graphs with this crate and the CPU backend serves dev PCs with it.
//!
//! Must not depend on: `vlm`, `hbdnn`, `bpu-sim`, tokio, ROS. No I/O beyond the config and
//! safetensors loader; only `mmap` (memory map) and `kernels` (gemm calls) use `unsafe`.
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
pub use vision::{patchify_rgb8, VisionTower};
pub use weights::WeightStore;

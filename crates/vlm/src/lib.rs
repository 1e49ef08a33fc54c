//! vlm — the runtime of bpu_vlm, independent of where the model runs.
//!
//! What lives here: the BLLM package manifest (`model.json`) and its file checks
//! ([`package`]), Pillow-exact image resizing and the vision tower's input layout
//! ([`vision`]), ChatML turn building with image slots, tools and M-RoPE positions
//! ([`chat`]), the token sampler ([`sampler`]), the streaming detokeniser with stop
//! handling and the `<think>` split ([`stream`]), the scheduler that feeds rows through a
//! [`engine::Backend`] (with the CPU backend over `qwen35`) ([`engine`]), where every decode
//! state lives and moves ([`residency`]), and conversations with their cached system prefix
//! and frame priming ([`assistant`]); [`interrupt`] stops
//! opening and warm-up at the next graph-call boundary.
//!
//! `qwen35` is used for its shared arithmetic (patchify, M-RoPE positions) and by the CPU
//! backend. Must not depend on the BPU (`hbdnn`, `bpu-sim`: the BPU backend is the
//! `vlm-bpu` crate), on ROS (`r2r`), on an async runtime, or on a CLI's crates (`clap`,
//! `anyhow`, `tracing-subscriber`): the node and the `vlm` binary share it.
#![forbid(unsafe_code)]

pub mod assistant;
pub mod chat;
pub mod engine;
pub mod grounding;
pub mod interrupt;
pub mod package;
pub mod residency;
pub mod sampler;
pub mod stream;
pub mod structured;
pub mod vision;

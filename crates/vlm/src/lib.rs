//! vlm — the backend-independent runtime pieces of bpu_vlm.
//!
//! What lives here: the BLLM package manifest (`model.json`) and its file checks
//! ([`package`]), Pillow-exact image resizing and the vision tower's input layout
//! ([`vision`]), ChatML turn building with image slots, tools and M-RoPE positions
//! ([`chat`]), the token sampler ([`sampler`]) and the streaming detokeniser with stop
//! handling and the `<think>` split ([`stream`]). The engine feeds rows and logits; these
//! modules decide what the rows are and what the tokens mean.
//!
//! These modules must not use the backends (`hbdnn`, `bpu-sim`, `qwen35` — the engine and
//! the `vlm` binary do), ROS (`r2r`) or any async runtime: plain data in, plain data out,
//! so the node, the CLI and both backends share them.
#![forbid(unsafe_code)]

pub mod assistant;
pub mod bpu;
pub mod chat;
pub mod engine;
pub mod package;
pub mod sampler;
pub mod stream;
pub mod vision;

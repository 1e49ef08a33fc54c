//! The engine: the [`Backend`] seam between the runtime and compute, the CPU backend over
//! `qwen35`, decode-state snapshots in the contract's format, and the generation driver that
//! turns a rendered [`crate::chat::Prompt`] into streamed [`crate::stream::Event`]s.
//!
//! One scheduler for every backend: rows go through [`Backend::step_interruptible`] in
//! N-row prefill chunks with the tail stepped one row at a time (docs/package-contract.md §4.3), positions
//! follow the prompt's M-RoPE layout from the backend's `maxPos + 1`, and a turn that does
//! not fit the window fails with [`EngineError::ContextOverflow`] before anything runs.
//!
//! The CPU backend runs `qwen35`'s math; the BPU backend lives in `vlm-bpu` and implements
//! the same [`Backend`] seam.
#![forbid(unsafe_code)]

mod backend;
mod cpu;
mod error;
mod generate;
mod state;

pub use backend::check_rows;
pub use backend::{Backend, BackendInfo, Device, VisionSpec};
pub use cpu::{CpuBackend, CpuOptions, DEFAULT_CONTEXT, DEFAULT_IMAGE_SIDE, DEFAULT_PREFILL_CHUNK};
pub use error::EngineError;
pub use generate::{
    prompt_from_ids, ConstraintOutcome, DecodeOptions, Engine, Generation, ImageInput, Lead,
};
pub use state::{CacheLayout, StateBlob, StateShape, StateView, STATE_MAGIC};

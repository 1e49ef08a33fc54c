//! The engine's error type.

use crate::sampler::{ConstraintError, SamplerError};
use crate::stream::StreamError;
use crate::vision::VisionError;

/// Errors of backends and of the generation driver. A request fails with one of these; the
/// backend stays usable (after [`super::Backend::reset`] or a restore when state was touched).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The input does not fit the free window slots (`CL - P`); nothing was fed.
    #[error("context overflow: {needed} rows do not fit in the {left} free slots of the window")]
    ContextOverflow { needed: usize, left: usize },
    #[error("{what}: expected {expected} values, got {found}")]
    Shape {
        what: &'static str,
        expected: usize,
        found: usize,
    },
    #[error("token id {id} is out of range (vocab size {vocab})")]
    TokenId { id: u32, vocab: usize },
    #[error("this model has no vision tower, but an image was given")]
    NoVision,
    /// An image slot of the prompt does not fit the images given or the tower's bucket.
    #[error("image {index}: {reason}")]
    Image { index: usize, reason: String },
    /// A prefill chunk or step with a row count the backend cannot run.
    #[error("{rows} rows cannot run in one graph call (1 or the prefill chunk {chunk})")]
    RowCount { rows: usize, chunk: usize },
    /// Nothing has been fed, so there are no logits to continue from.
    #[error("no logits: feed a prompt first")]
    NoLogits,
    /// A snapshot that does not belong to this model/window, or a damaged one.
    #[error("state blob: {reason}")]
    State { reason: String },
    /// Backend options that cannot work with this model.
    #[error("backend configuration: {reason}")]
    Config { reason: String },
    #[error("CPU model: {0}")]
    Cpu(#[from] qwen35::Error),
    /// A BPU call (board runtime or simulator) failed; `what` names the step of the request.
    /// `timeout`: a task did not finish in time, in this call or an earlier one; the device
    /// may still be running it, so the backend accepts no more work (see
    /// [`EngineError::backend_is_lost`]).
    #[error("BPU {what} failed: {source}")]
    Bpu {
        what: String,
        timeout: bool,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("image preprocessing: {0}")]
    Vision(#[from] VisionError),
    #[error("sampler: {0}")]
    Sampler(#[from] SamplerError),
    /// Constrained decoding failed mid-answer (the grammar engine's error, e.g. a step over
    /// its limits).
    #[error("{0}")]
    Constraint(#[from] ConstraintError),
    #[error("stream: {0}")]
    Stream(#[from] StreamError),
}

impl EngineError {
    /// No later request can succeed on this backend: the process must restart it.
    pub fn backend_is_lost(&self) -> bool {
        matches!(self, Self::Bpu { timeout: true, .. })
    }
}

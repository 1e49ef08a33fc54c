//! The crate's error type: every variant names the file, key or tensor it is about.

use std::path::PathBuf;

/// Errors of config parsing, weight loading and forward calls.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: invalid JSON: {source}")]
    ConfigJson {
        path: PathBuf,
        source: serde_json::Error,
    },
    /// A config key is missing, has an unsupported value, or is inconsistent.
    #[error("config key `{key}`: {reason}")]
    Config { key: String, reason: String },
    /// The safetensors container itself is malformed (truncated, bad header).
    #[error("safetensors file {path}: {reason}")]
    Safetensors { path: PathBuf, reason: String },
    #[error("missing tensor `{name}` in the checkpoint")]
    MissingTensor { name: String },
    #[error("tensor `{name}` has shape {found:?}, expected {expected:?}")]
    TensorShape {
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("tensor `{name}` has unsupported dtype {dtype} (supported: F32, BF16, F16)")]
    TensorDtype { name: String, dtype: String },
    /// A caller-provided buffer has the wrong number of values.
    #[error("{what}: expected {expected} values, got {found}")]
    InputShape {
        what: &'static str,
        expected: usize,
        found: usize,
    },
    #[error("token id {id} is out of range (vocab size {vocab})")]
    TokenId { id: u32, vocab: usize },
    /// A state does not fit the call (wrong kind, capacity exceeded, other model).
    #[error("sequence state: {reason}")]
    State { reason: String },
    #[error("image: {reason}")]
    Image { reason: String },
    /// An image slot of a prompt does not fit the images given.
    #[error("{reason}")]
    ImageSlot { reason: String },
    #[error("positions: {reason}")]
    Positions { reason: String },
}

pub type Result<T> = std::result::Result<T, Error>;

pub(crate) fn check_len(what: &'static str, expected: usize, found: usize) -> Result<()> {
    if expected == found {
        Ok(())
    } else {
        Err(Error::InputShape {
            what,
            expected,
            found,
        })
    }
}

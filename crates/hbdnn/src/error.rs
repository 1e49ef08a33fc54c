//! The one conversion point from a C status to [`Error`].

use std::fmt;
use std::path::PathBuf;

use hbdnn_sys as sys;

/// An hbUCP/hbDNN status code (on S100 the hbDNN codes alias the hbUCP ones).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    InvalidArgument,
    ApiUseError,
    InitFailed,
    /// The table's own "unknown error" code (-100004).
    UnknownError,
    TaskNumberExceedLimit,
    Timeout,
    RunFailed,
    TaskHandleInvalid,
    MemAllocFail,
    MemFreeFail,
    MemFlushFail,
    MemInvalidateFail,
    MemIsInvalid,
    MemMapFail,
    MemUnmapFail,
    FileOpenFailed,
    ModelNumberExceed,
    ModelInvalid,
    ModelIsInUse,
    ModelIncompatible,
    /// A code not in the tables we know; kept verbatim.
    Unknown(i32),
}

impl Status {
    /// Maps a non-zero status; never panics on a foreign value.
    pub fn from_code(code: i32) -> Self {
        match code {
            sys::HB_UCP_INVALID_ARGUMENT => Self::InvalidArgument,
            sys::HB_UCP_API_USE_ERROR => Self::ApiUseError,
            sys::HB_UCP_INIT_FAILED => Self::InitFailed,
            sys::HB_UCP_UNKNOWN => Self::UnknownError,
            sys::HB_UCP_TASK_NUMBER_EXCEED_LIMIT => Self::TaskNumberExceedLimit,
            sys::HB_UCP_TASK_TIMEOUT => Self::Timeout,
            sys::HB_UCP_TASK_RUN_FAILED => Self::RunFailed,
            sys::HB_UCP_TASK_HANDLE_INVALID => Self::TaskHandleInvalid,
            sys::HB_UCP_MEM_ALLOC_FAIL => Self::MemAllocFail,
            sys::HB_UCP_MEM_FREE_FAIL => Self::MemFreeFail,
            sys::HB_UCP_MEM_FLUSH_FAIL => Self::MemFlushFail,
            sys::HB_UCP_MEM_INVALIDATE_FAIL => Self::MemInvalidateFail,
            sys::HB_UCP_MEM_IS_INVALID => Self::MemIsInvalid,
            sys::HB_UCP_MEM_MAP_FAIL => Self::MemMapFail,
            sys::HB_UCP_MEM_UNMAP_FAIL => Self::MemUnmapFail,
            sys::HB_UCP_FILE_OPEN_FAILED => Self::FileOpenFailed,
            sys::HB_UCP_MODEL_NUMBER_EXCEED => Self::ModelNumberExceed,
            sys::HB_UCP_MODEL_INVALID => Self::ModelInvalid,
            sys::HB_UCP_MODEL_IS_INUSE => Self::ModelIsInUse,
            sys::HB_UCP_MODEL_INCOMPATIBLE => Self::ModelIncompatible,
            other => Self::Unknown(other),
        }
    }

    /// The numeric code.
    pub fn code(self) -> i32 {
        match self {
            Self::InvalidArgument => sys::HB_UCP_INVALID_ARGUMENT,
            Self::ApiUseError => sys::HB_UCP_API_USE_ERROR,
            Self::InitFailed => sys::HB_UCP_INIT_FAILED,
            Self::UnknownError => sys::HB_UCP_UNKNOWN,
            Self::TaskNumberExceedLimit => sys::HB_UCP_TASK_NUMBER_EXCEED_LIMIT,
            Self::Timeout => sys::HB_UCP_TASK_TIMEOUT,
            Self::RunFailed => sys::HB_UCP_TASK_RUN_FAILED,
            Self::TaskHandleInvalid => sys::HB_UCP_TASK_HANDLE_INVALID,
            Self::MemAllocFail => sys::HB_UCP_MEM_ALLOC_FAIL,
            Self::MemFreeFail => sys::HB_UCP_MEM_FREE_FAIL,
            Self::MemFlushFail => sys::HB_UCP_MEM_FLUSH_FAIL,
            Self::MemInvalidateFail => sys::HB_UCP_MEM_INVALIDATE_FAIL,
            Self::MemIsInvalid => sys::HB_UCP_MEM_IS_INVALID,
            Self::MemMapFail => sys::HB_UCP_MEM_MAP_FAIL,
            Self::MemUnmapFail => sys::HB_UCP_MEM_UNMAP_FAIL,
            Self::FileOpenFailed => sys::HB_UCP_FILE_OPEN_FAILED,
            Self::ModelNumberExceed => sys::HB_UCP_MODEL_NUMBER_EXCEED,
            Self::ModelInvalid => sys::HB_UCP_MODEL_INVALID,
            Self::ModelIsInUse => sys::HB_UCP_MODEL_IS_INUSE,
            Self::ModelIncompatible => sys::HB_UCP_MODEL_INCOMPATIBLE,
            Self::Unknown(c) => c,
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unknown(c) => write!(f, "unknown status {c}"),
            other => write!(f, "{other:?} ({})", other.code()),
        }
    }
}

/// Which side of a graph a tensor index refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Input,
    Output,
}

impl fmt::Display for Side {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Side::Input => "input",
            Side::Output => "output",
        })
    }
}

/// Errors of the safe wrapper.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A C entry point returned a non-zero status.
    #[error("{call} failed: {status}: {description}")]
    Call {
        call: &'static str,
        status: Status,
        description: String,
    },
    /// Loading `.hbm` files into a packed handle failed.
    #[error("loading {}: {source}", display_paths(files))]
    Load {
        files: Vec<PathBuf>,
        #[source]
        source: Box<Error>,
    },
    /// The function table could not be built.
    #[error(transparent)]
    Table(#[from] sys::LoadError),
    /// A path or name cannot be passed to C (interior NUL or not UTF-8).
    #[error("{what} cannot be passed to C: {value:?}")]
    BadCString { what: &'static str, value: String },
    /// The packed handle has no graph of this name.
    #[error("no graph named {name:?} (available: {available:?})")]
    GraphNotFound {
        name: String,
        available: Vec<String>,
    },
    /// A graph call did not finish in time; the task may still be running on the BPU.
    #[error("graph {graph}: the BPU task did not finish within {timeout_ms} ms ({status}); it may still be running, so the runtime accepts no more runs")]
    Timeout {
        graph: String,
        timeout_ms: i32,
        status: Status,
    },
    /// A task of this runtime timed out earlier: the BPU may still be running it, so the
    /// runtime accepts no further runs.
    #[error("the BPU runtime accepts no more runs: an earlier task timed out and may still be running (restart the process)")]
    Wedged,
    /// A call returned a null pointer where a value was promised.
    #[error("{call} returned a null pointer")]
    NullPointer { call: &'static str },
    /// A tensor's properties cannot be used as reported.
    #[error("graph {graph}, {side} {index}: {reason}")]
    Spec {
        graph: String,
        side: Side,
        index: usize,
        reason: String,
    },
    /// Wrong number of buffers bound to a run.
    #[error("graph {graph}: {expected} {side} buffers expected, {got} given")]
    BufferCount {
        graph: String,
        side: Side,
        expected: usize,
        got: usize,
    },
    /// A bound buffer is smaller than its tensor.
    #[error("graph {graph}, {side} {index}: buffer holds {got} bytes, tensor needs {need}")]
    BufferTooSmall {
        graph: String,
        side: Side,
        index: usize,
        got: usize,
        need: usize,
    },
    /// A byte range outside a buffer, or data not matching a tensor.
    #[error("{what}: range {offset}+{len} outside {size} bytes")]
    OutOfBounds {
        what: &'static str,
        offset: usize,
        len: usize,
        size: usize,
    },
    /// Element type size does not match the tensor's dtype.
    #[error("tensor dtype {dtype:?} has {expected} bytes per element, accessed with {got}")]
    ElementSize {
        dtype: crate::DType,
        expected: usize,
        got: usize,
    },
}

impl Error {
    /// The C status behind this error, if any.
    pub fn status(&self) -> Option<Status> {
        match self {
            Error::Call { status, .. } | Error::Timeout { status, .. } => Some(*status),
            Error::Load { source, .. } => source.status(),
            _ => None,
        }
    }

    /// True when a wait ran out of time.
    pub fn is_timeout(&self) -> bool {
        self.status() == Some(Status::Timeout)
    }
}

fn display_paths(files: &[PathBuf]) -> String {
    files
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip_and_unknown_stays_verbatim() {
        for code in [
            -100001, -100002, -100003, -100004, -200001, -200002, -200003, -200004, -400001,
            -400002, -400003, -400004, -400005, -400006, -400007, -500001, -600001, -600002,
            -600003, -600004,
        ] {
            let s = Status::from_code(code);
            assert!(!matches!(s, Status::Unknown(_)), "{code}");
            assert_eq!(s.code(), code);
        }
        assert_eq!(Status::from_code(-300017), Status::Unknown(-300017));
        assert_eq!(Status::from_code(42).code(), 42);
    }
}

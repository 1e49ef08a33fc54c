//! What can go wrong, in the two vocabularies the crate speaks: [`BpuError`] while a package
//! is opened or checked (each names the file), [`EngineError`] once a request runs.

use std::path::{Path, PathBuf};

use bpu_sim::DetectError;
use vlm::engine::EngineError;
use vlm::package::PackageError;

use crate::pool;

/// Failures opening a package on the BPU; each names the file and the reason.
#[derive(Debug, thiserror::Error)]
pub enum BpuError {
    #[error(transparent)]
    Package(#[from] PackageError),
    #[error(transparent)]
    Detect(#[from] DetectError),
    #[error("{}: {source}", path.display())]
    Hbdnn {
        path: PathBuf,
        #[source]
        source: hbdnn::Error,
    },
    #[error("simulator function table: {0}")]
    SimTable(#[from] bpu_sim::SimTableError),
    #[error("{}: graph contract mismatch: {reason}", path.display())]
    Contract { path: PathBuf, reason: String },
    #[error("{}: {reason}", path.display())]
    Embed { path: PathBuf, reason: String },
    #[error("{}: {reason}", path.display())]
    Config { path: PathBuf, reason: String },
    /// Another BPU engine (this process or another) holds the engine lock.
    #[error("{}: another BPU engine is running on this board (the engine lock is held); stop it first — two can take the board down", path.display())]
    Busy { path: PathBuf },
    #[error("{}: {reason}", path.display())]
    Lock { path: PathBuf, reason: String },
    /// The ION pool cannot hold what the package needs; nothing was loaded or allocated.
    #[error("{}: {what} need {needed} bytes but the ION pool has {available} bytes free ({source_desc}); fix: {fix}", path.display())]
    Pool {
        path: PathBuf,
        what: String,
        needed: u64,
        available: u64,
        source_desc: String,
        fix: String,
    },
    /// `--pool-check strict` and the pool could not be identified with certainty.
    #[error("{}: {what} need {needed} bytes but the ION pool cannot be identified with certainty ({reason}; found: {found}); refusing under --pool-check strict (--pool-check warn loads anyway)", path.display())]
    PoolUnknown {
        path: PathBuf,
        what: String,
        needed: u64,
        reason: String,
        found: String,
    },
    /// A graph compiled for another BPU architecture.
    #[error("{}: compiled for another BPU: {detail}", path.display())]
    March { path: PathBuf, detail: String },
    /// [`crate::BpuOptions::interrupt`] was raised: opening stopped before `step`, and
    /// everything loaded or allocated until then was released.
    #[error("opening the package was interrupted before {step}")]
    Interrupted { step: &'static str },
}

/// Any device failure fails the request; the state (the input cache set) is left untouched.
/// A timeout, now or earlier, leaves the runtime wedged: no later request can run.
pub(crate) fn device(what: &str, e: hbdnn::Error) -> EngineError {
    EngineError::Bpu {
        what: what.to_owned(),
        timeout: e.is_timeout() || matches!(e, hbdnn::Error::Wedged),
        source: Box::new(e),
    }
}

/// A load failure, with the ION advice for an exhausted pool and the march explanation for an
/// incompatible graph.
pub(crate) fn load_error(path: &Path, source: hbdnn::Error) -> BpuError {
    match source.status() {
        Some(hbdnn::Status::MemAllocFail) => BpuError::Pool {
            path: path.to_owned(),
            what: "the load".into(),
            needed: std::fs::metadata(path).map_or(0, |m| m.len()),
            available: 0,
            source_desc: format!("the runtime refused the allocation: {source}"),
            fix: pool::ION_FIX.to_owned(),
        },
        Some(hbdnn::Status::ModelIncompatible) => BpuError::March {
            path: path.to_owned(),
            detail: format!(
                "the runtime refused it ({source}); the published packages are compiled for `nash-m` (S100/S100P) and must be recompiled for another BPU"
            ),
        },
        _ => BpuError::Hbdnn {
            path: path.to_owned(),
            source,
        },
    }
}

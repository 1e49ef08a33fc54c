//! One BPU engine per board: an advisory exclusive `flock` held for the backend's lifetime.
//! Two LLM processes can exhaust the ION pools and take the board down (contract §11), so the
//! second one must fail fast instead of loading. The lock is per open file description, so a
//! second [`super::BpuBackend::open`] in the same process is refused as well.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

use bpu_sim::Implementation;
use fs4::fs_std::FileExt;

use super::BpuError;

/// Env var: path of the engine lock file (overrides the default).
pub const LOCK_ENV: &str = "VLM_BPU_LOCK";

/// Default lock path: `/run/lock` where the system has it, else `/tmp`.
pub fn default_lock_path() -> PathBuf {
    let run = Path::new("/run/lock");
    if run.is_dir() {
        run.join("bpu_vlm.lock")
    } else {
        PathBuf::from("/tmp/bpu_vlm.lock")
    }
}

/// The lock path from `LOCK_ENV`, if set and non-empty.
pub fn env_lock_path() -> Option<PathBuf> {
    std::env::var_os(LOCK_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// The lock an engine of `implementation` takes: at `explicit`, else `VLM_BPU_LOCK`, else
/// (boards only) [`default_lock_path`]. Simulator packages lock only when asked: each
/// simulator instance is its own board, and tests open many at once.
pub(crate) fn acquire_for(
    implementation: Implementation,
    explicit: Option<&Path>,
) -> Result<Option<EngineLock>, BpuError> {
    match (
        implementation,
        explicit.map(Path::to_owned).or_else(env_lock_path),
    ) {
        (_, Some(p)) => EngineLock::acquire(&p).map(Some),
        (Implementation::Board, None) => EngineLock::acquire(&default_lock_path()).map(Some),
        (Implementation::Sim, None) => Ok(None),
    }
}

/// A held engine lock; released when dropped (closing the file releases the `flock`).
#[derive(Debug)]
pub struct EngineLock {
    _file: File,
    path: PathBuf,
}

impl EngineLock {
    /// Takes the lock at `path` without waiting; `BpuError::Busy` when another engine holds it.
    pub fn acquire(path: &Path) -> Result<Self, BpuError> {
        let io = |reason: String| BpuError::Lock {
            path: path.to_owned(),
            reason,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| io(format!("cannot open the engine lock file: {e}")))?;
        match FileExt::try_lock_exclusive(&file) {
            Ok(true) => {}
            Ok(false) => {
                return Err(BpuError::Busy {
                    path: path.to_owned(),
                })
            }
            Err(e) => return Err(io(format!("cannot lock: {e}"))),
        }
        tracing::debug!(lock = %path.display(), "BPU engine lock taken");
        Ok(Self {
            _file: file,
            path: path.to_owned(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

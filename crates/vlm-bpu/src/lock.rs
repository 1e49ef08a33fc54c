//! One BPU engine per board: an advisory exclusive `flock` held for the backend's lifetime.
//! Two LLM processes can exhaust the ION pools and take the board down, so the second one
//! must fail fast instead of loading. The lock is per open file description, so a second
//! [`super::BpuBackend::open`] in the same process is refused as well.
//!
//! The file is shared by every user of the board: when another user created it (mode 0644,
//! not ours to write), it is opened read-only — `flock` locks the file, not the descriptor's
//! access mode, so a read-only descriptor excludes a read-write one just the same.

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
        Self::acquire_with(path, open_read_write)
    }

    /// [`Self::acquire`] with the read-write open given (tests inject a refusal: they run
    /// as root, which permission bits do not stop).
    fn acquire_with(
        path: &Path,
        open_rw: impl Fn(&Path) -> std::io::Result<File>,
    ) -> Result<Self, BpuError> {
        let io = |reason: String| BpuError::Lock {
            path: path.to_owned(),
            reason,
        };
        let file = match open_rw(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                let f = File::open(path).map_err(|ro| {
                    io(format!(
                        "cannot open the engine lock file read-write ({e}) nor read-only ({ro})"
                    ))
                })?;
                tracing::debug!(lock = %path.display(), "engine lock file not writable (another user's): locked read-only");
                f
            }
            Err(e) => return Err(io(format!("cannot open the engine lock file: {e}"))),
        };
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

fn open_read_write(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn refused(_: &Path) -> std::io::Result<File> {
        Err(std::io::Error::from(std::io::ErrorKind::PermissionDenied))
    }

    /// Another user's lock file (0444 here): the read-write open is refused, the read-only
    /// one locks, and the lock still excludes every other engine.
    #[test]
    fn a_lock_file_not_ours_to_write_is_locked_read_only() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("bpu_vlm.lock");
        std::fs::write(&p, b"").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o444)).unwrap();
        let held = EngineLock::acquire_with(&p, refused).unwrap();
        assert_eq!(held.path(), p);
        // A second engine (read-write or read-only) is refused clearly while it is held.
        let e = EngineLock::acquire(&p).unwrap_err();
        assert!(matches!(e, BpuError::Busy { .. }), "{e}");
        assert!(e.to_string().contains("another BPU engine"), "{e}");
        let e = EngineLock::acquire_with(&p, refused).unwrap_err();
        assert!(matches!(e, BpuError::Busy { .. }), "{e}");
        drop(held);
        // Released with the read-only descriptor.
        let again = EngineLock::acquire_with(&p, refused).unwrap();
        drop(again);
        // Without root (which permission bits do not stop) the plain path takes the same way.
        drop(EngineLock::acquire(&p).unwrap());
    }

    #[test]
    fn a_lock_held_read_write_refuses_a_read_only_engine() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("bpu_vlm.lock");
        let held = EngineLock::acquire(&p).unwrap();
        let e = EngineLock::acquire_with(&p, refused).unwrap_err();
        assert!(matches!(e, BpuError::Busy { .. }), "{e}");
        drop(held);
    }

    #[test]
    fn a_missing_file_that_cannot_be_created_names_both_failures() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("absent.lock");
        let e = EngineLock::acquire_with(&p, refused).unwrap_err();
        let msg = e.to_string();
        assert!(
            matches!(e, BpuError::Lock { .. })
                && msg.contains("read-write")
                && msg.contains("read-only"),
            "{msg}"
        );
        // Other failures are not retried read-only.
        let other = |_: &Path| -> std::io::Result<File> {
            Err(std::io::Error::from(std::io::ErrorKind::NotFound))
        };
        std::fs::write(&p, b"").unwrap();
        let e = EngineLock::acquire_with(&p, other).unwrap_err();
        assert!(matches!(e, BpuError::Lock { .. }), "{e}");
    }
}

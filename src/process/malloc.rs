//! glibc malloc's mmap threshold, held at its start value for the node's whole run
//! (BENCHMARKS.md, "Mixed hostile soak").
//!
//! glibc gives each allocation of 128 KiB or more its own mapping and unmaps it on free, until
//! such a block is freed: then it raises the threshold to that block's size (up to 32 MiB),
//! and from then on buffers of that size — camera frames, decoded images, snapshots, logits —
//! come from the arenas, whose freed space stays in the process. Under a mixed load the node's
//! RSS so grew by 3–5 MiB over the first ~750 asks while its live heap grew by well under
//! that (heaptrack), and ended ~10 MiB higher than with the threshold held. Holding it
//! (`glibc.malloc.mmap_threshold`, which also stops the raising) needs either `mallopt`, an
//! unsafe call, or the tunable in the environment when the process starts: so `vlm_node`
//! executes itself once more with the tunable added, before it starts any thread.
//! A `GLIBC_TUNABLES` that already names the threshold is left as it is (the user's choice).

use std::ffi::{OsStr, OsString};

/// The environment variable glibc reads its tunables from, at process start only.
pub const TUNABLES_VAR: &str = "GLIBC_TUNABLES";

/// The tunable this module sets.
pub const MMAP_THRESHOLD: &str = "glibc.malloc.mmap_threshold";

/// glibc's own start value of the threshold (128 KiB), held for the whole run.
pub const MMAP_THRESHOLD_BYTES: usize = 128 * 1024;

/// The `GLIBC_TUNABLES` value to run with, given the current one; `None` when the current
/// one already names the threshold (so the re-executed process does not execute again).
pub fn tunables_with_threshold(current: Option<&OsStr>) -> Option<OsString> {
    let entry = format!("{MMAP_THRESHOLD}={MMAP_THRESHOLD_BYTES}");
    match current {
        None => Some(entry.into()),
        Some(v) if v.is_empty() => Some(entry.into()),
        Some(v) => {
            let text = v.to_string_lossy();
            if text
                .split(':')
                .any(|t| t.split('=').next() == Some(MMAP_THRESHOLD))
            {
                return None;
            }
            let mut out = v.to_owned();
            out.push(":");
            out.push(entry);
            Some(out)
        }
    }
}

/// Executes this program again with the threshold tunable added to its environment, same
/// arguments, same process id. Returns only when it did not: `Ok(())` when the tunable is
/// already set (or the platform has no glibc), the error when the exec failed (the node then
/// runs with glibc's default behaviour). Call first thing in `main`, before any thread.
pub fn hold_mmap_threshold() -> std::io::Result<()> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        use std::os::unix::process::CommandExt as _;
        let Some(value) = tunables_with_threshold(std::env::var_os(TUNABLES_VAR).as_deref()) else {
            return Ok(());
        };
        let mut args = std::env::args_os();
        let argv0 = args.next().unwrap_or_else(|| OsString::from("vlm_node"));
        // `/proc/self/exe` is this very file even when the path was replaced since the start.
        let err = std::process::Command::new("/proc/self/exe")
            .arg0(argv0)
            .args(args)
            .env(TUNABLES_VAR, value)
            .exec();
        Err(err)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_the_threshold_to_no_or_other_tunables() {
        let entry = "glibc.malloc.mmap_threshold=131072";
        assert_eq!(tunables_with_threshold(None), Some(entry.into()));
        assert_eq!(
            tunables_with_threshold(Some(OsStr::new(""))),
            Some(entry.into())
        );
        assert_eq!(
            tunables_with_threshold(Some(OsStr::new("glibc.malloc.arena_max=2"))),
            Some(format!("glibc.malloc.arena_max=2:{entry}").into())
        );
    }

    #[test]
    fn a_threshold_already_given_is_kept() {
        for v in [
            "glibc.malloc.mmap_threshold=131072",
            "glibc.malloc.mmap_threshold=4096",
            "glibc.malloc.arena_max=1:glibc.malloc.mmap_threshold=65536",
        ] {
            assert_eq!(tunables_with_threshold(Some(OsStr::new(v))), None, "{v}");
        }
        // A name that only starts like it is another tunable.
        assert!(
            tunables_with_threshold(Some(OsStr::new("glibc.malloc.mmap_threshold_x=1"))).is_some()
        );
    }
}

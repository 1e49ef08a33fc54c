//! glibc malloc's mmap and trim thresholds, held for the node's whole run (BENCHMARKS.md,
//! "Mixed hostile soak").
//!
//! glibc gives each allocation of 128 KiB or more its own mapping and unmaps it on free, until
//! such a block is freed: then it raises the threshold to that block's size (up to 32 MiB),
//! and from then on buffers of that size — camera frames, decoded images, snapshots, logits —
//! come from the arenas, whose freed space stays in the process. Under a mixed load the node's
//! RSS so grew by 3–5 MiB over the first ~750 asks while its live heap grew by well under
//! that (heaptrack). Holding the thresholds (`glibc.malloc.mmap_threshold`, which also stops
//! the raising, and `glibc.malloc.trim_threshold` at twice it, glibc's own ratio) keeps RSS
//! flat. 1 MiB, not glibc's 128 KiB start value: at 128 KiB every decode step maps and unmaps
//! its buffers and the tiny model decodes 2.5× slower. Holding them needs either `mallopt`,
//! an unsafe call, or the tunables in the environment when the process starts: so `vlm_node`
//! executes itself once more with them added, before it starts any thread. A
//! `GLIBC_TUNABLES` that already names either is left as it is (the user's choice).

use std::ffi::{OsStr, OsString};

/// The environment variable glibc reads its tunables from, at process start only.
pub const TUNABLES_VAR: &str = "GLIBC_TUNABLES";

/// The tunables this module sets.
pub const MMAP_THRESHOLD: &str = "glibc.malloc.mmap_threshold";
pub const TRIM_THRESHOLD: &str = "glibc.malloc.trim_threshold";

/// Blocks of this size or more get their own mapping, for the whole run.
pub const MMAP_THRESHOLD_BYTES: usize = 1024 * 1024;

/// Free space above this at the top of a heap goes back to the system.
pub const TRIM_THRESHOLD_BYTES: usize = 2 * MMAP_THRESHOLD_BYTES;

/// The `GLIBC_TUNABLES` value to run with, given the current one; `None` when the current
/// one already names either threshold (so the re-executed process does not execute again).
pub fn tunables_with_threshold(current: Option<&OsStr>) -> Option<OsString> {
    let entry =
        format!("{MMAP_THRESHOLD}={MMAP_THRESHOLD_BYTES}:{TRIM_THRESHOLD}={TRIM_THRESHOLD_BYTES}");
    match current {
        None => Some(entry.into()),
        Some(v) if v.is_empty() => Some(entry.into()),
        Some(v) => {
            let text = v.to_string_lossy();
            if text
                .split(':')
                .any(|t| matches!(t.split('=').next(), Some(MMAP_THRESHOLD | TRIM_THRESHOLD)))
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
        let entry = "glibc.malloc.mmap_threshold=1048576:glibc.malloc.trim_threshold=2097152";
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
            "glibc.malloc.trim_threshold=0",
        ] {
            assert_eq!(tunables_with_threshold(Some(OsStr::new(v))), None, "{v}");
        }
        // A name that only starts like it is another tunable.
        assert!(
            tunables_with_threshold(Some(OsStr::new("glibc.malloc.mmap_threshold_x=1"))).is_some()
        );
    }
}

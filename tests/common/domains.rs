//! ROS domains for test processes that may run beside other test binaries on one machine
//! (two `cargo test` runs, or CI beside a developer's tests): each domain in use is held by
//! an exclusive lock on a file in the temp folder for the life of the process, so no two
//! processes pick the same domain and answer each other's asks.

use std::fs::{File, OpenOptions};
use std::path::PathBuf;
use std::sync::Mutex;

use fs4::fs_std::FileExt;

/// Domains 1..=100 keep the DDS port range valid and avoid the default 0.
const DOMAINS: u32 = 100;

/// The lock files this process holds; released when it exits.
static HELD: Mutex<Vec<File>> = Mutex::new(Vec::new());

fn lock_dir() -> PathBuf {
    std::env::temp_dir().join("bpu_vlm-ros-domains")
}

/// Claims the first free domain at or after `start` (wrapping within 1..=100). Falls back
/// to `start` unlocked when every domain is taken or the folder cannot be written: the test
/// then runs as it did before there were locks.
pub fn claim(start: u32) -> u32 {
    let first = (start.saturating_sub(1)) % DOMAINS;
    let dir = lock_dir();
    let _ = std::fs::create_dir_all(&dir);
    for step in 0..DOMAINS {
        let domain = 1 + (first + step) % DOMAINS;
        let Ok(file) = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(format!("{domain}.lock")))
        else {
            break;
        };
        if matches!(FileExt::try_lock_exclusive(&file), Ok(true)) {
            if let Ok(mut held) = HELD.lock() {
                held.push(file);
            }
            return domain;
        }
    }
    1 + first
}

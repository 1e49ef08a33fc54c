//! The device memory this process holds through this crate, counted process-wide so a front
//! end can report it from any thread: live cached buffers at their requested size, and loaded
//! packed models at the size of their `.hbm` files (the loader's own figure is not exposed; it
//! takes slightly more). Memory a wedged runtime leaves allocated stays counted: it is held.

use std::sync::atomic::{AtomicU64, Ordering};

static HELD: AtomicU64 = AtomicU64::new(0);

/// Bytes of device memory held now by every runtime of the process.
pub fn device_bytes_held() -> u64 {
    HELD.load(Ordering::Relaxed)
}

pub(crate) fn take(bytes: u64) {
    HELD.fetch_add(bytes, Ordering::Relaxed);
}

pub(crate) fn give_back(bytes: u64) {
    // Never below zero, whatever the order of concurrent updates.
    let _ = HELD.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |h| {
        Some(h.saturating_sub(bytes))
    });
}

//! What every watch goal shares with the rest of the node: the watch slots (`max_watches`),
//! the counters diagnostics report, and the stop flags of the evaluations queued or running,
//! which an ask or a detect raises when it is queued ([`WatchBoard::yield_to_request`]), so
//! it waits at most one graph call behind an evaluation.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::serve::registry::Registry;

/// Most `max_watches` may be; also the depth of the evaluations' own registry.
pub(crate) const MAX_WATCHES_LIMIT: usize = 64;

/// Watch counters as diagnostics report them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct WatchCounts {
    pub active: usize,
    pub evaluations: u64,
    pub events: u64,
    /// Evaluations stopped for an ask or a detect, and made again later.
    pub yielded: u64,
}

/// Shared by the watch goals, the ask path and diagnostics.
pub(crate) struct WatchBoard {
    active: AtomicUsize,
    evaluations: AtomicU64,
    events: AtomicU64,
    yielded: AtomicU64,
    ends: AtomicU64,
    /// Stop flags of the evaluations queued or running.
    running: Mutex<Vec<Arc<AtomicBool>>>,
    /// The evaluations' places and ids: beside the asks' `queue_depth`, which evaluations
    /// never take (bounded by the watch slots instead).
    pub(crate) registry: Arc<Registry>,
}

impl Default for WatchBoard {
    fn default() -> Self {
        Self {
            active: AtomicUsize::new(0),
            evaluations: AtomicU64::new(0),
            events: AtomicU64::new(0),
            yielded: AtomicU64::new(0),
            ends: AtomicU64::new(0),
            running: Mutex::new(Vec::new()),
            registry: Arc::new(Registry::new(MAX_WATCHES_LIMIT)),
        }
    }
}

/// A watch goal's slot, freed on drop.
pub(crate) struct WatchSlot {
    board: Arc<WatchBoard>,
}

impl Drop for WatchSlot {
    fn drop(&mut self) {
        self.board.active.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An evaluation's stop flag on the board, taken off on drop.
pub(crate) struct Registered {
    board: Arc<WatchBoard>,
    pub(crate) flag: Arc<AtomicBool>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.board.lock().retain(|f| !Arc::ptr_eq(f, &self.flag));
    }
}

impl WatchBoard {
    fn lock(&self) -> MutexGuard<'_, Vec<Arc<AtomicBool>>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot for one more watch, or `None` when `max` are running.
    pub(crate) fn take_slot(self: &Arc<Self>, max: usize) -> Option<WatchSlot> {
        self.active
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()?;
        Some(WatchSlot {
            board: Arc::clone(self),
        })
    }

    /// Puts a new evaluation's stop flag on the board until the returned guard drops.
    pub(crate) fn register(self: &Arc<Self>) -> Registered {
        let flag = Arc::new(AtomicBool::new(false));
        self.lock().push(Arc::clone(&flag));
        Registered {
            board: Arc::clone(self),
            flag,
        }
    }

    /// An ask or a detect was queued: every evaluation queued or running stops at its next
    /// graph call (and is made again once the requests are served).
    pub(crate) fn yield_to_request(&self) {
        for f in self.lock().iter() {
            f.store(true, Ordering::Release);
        }
    }

    /// Ends every watch (a deactivate, the shutdown): their evaluations stop at the next
    /// graph call, and each goal sees the new [`WatchBoard::ends`] count and ends — even when
    /// the node is active again before the goal looks.
    pub(crate) fn end_all(&self) {
        self.ends.fetch_add(1, Ordering::AcqRel);
        self.yield_to_request();
    }

    /// How often [`WatchBoard::end_all`] ran: a goal that saw another count at its start ends.
    pub(crate) fn ends(&self) -> u64 {
        self.ends.load(Ordering::Acquire)
    }

    pub(crate) fn evaluated(&self) {
        self.evaluations.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn event(&self) {
        self.events.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn yielded(&self) {
        self.yielded.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn counts(&self) -> WatchCounts {
        WatchCounts {
            active: self.active.load(Ordering::Acquire),
            evaluations: self.evaluations.load(Ordering::Relaxed),
            events: self.events.load(Ordering::Relaxed),
            yielded: self.yielded.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_bounded_and_freed_on_drop() {
        let b = Arc::new(WatchBoard::default());
        let (s1, s2) = (b.take_slot(2), b.take_slot(2));
        assert!(s1.is_some() && s2.is_some());
        assert!(b.take_slot(2).is_none(), "a third is refused");
        drop(s1);
        assert_eq!(b.counts().active, 1);
        assert!(b.take_slot(2).is_some());
    }

    #[test]
    fn a_request_stops_the_registered_evaluations_only() {
        let b = Arc::new(WatchBoard::default());
        let r = b.register();
        let gone = b.register();
        let gone_flag = Arc::clone(&gone.flag);
        drop(gone);
        b.yield_to_request();
        assert!(r.flag.load(Ordering::Acquire));
        assert!(
            !gone_flag.load(Ordering::Acquire),
            "a finished evaluation is off the board"
        );
    }
}

//! A stop request for work that belongs to no request: opening a model and warming it up.
//!
//! A graph call cannot be stopped once submitted (on a board it runs to its end on the BPU),
//! so long work checks the flag at its boundaries — between the named steps of opening a
//! package and between the cache buffers it allocates and clears, before each graph call of
//! the warm-up — and stops at the next one. A request has
//! its own cancel flag ([`crate::assistant::Turn::cancel`]); this one is raised from outside,
//! e.g. by a signal handler on another thread.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// A shared flag: raised once, seen by every clone.
#[derive(Clone, Default)]
pub struct Interrupt(Arc<AtomicBool>);

impl Interrupt {
    /// A flag that is not raised.
    pub fn new() -> Self {
        Self::default()
    }

    /// Asks the work to stop at its next boundary. Callable from any thread, any number of
    /// times.
    pub fn raise(&self) {
        self.0.store(true, Ordering::Release);
    }

    pub fn is_raised(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }

    /// The flag itself, for [`crate::assistant::Turn::cancel`] and the token stream, which
    /// check it between graph calls.
    pub fn flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.0)
    }
}

impl std::fmt::Debug for Interrupt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Interrupt").field(&self.is_raised()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_clone_sees_a_raise_from_another_thread() {
        let i = Interrupt::new();
        let seen_by = i.clone();
        let flag = i.flag();
        assert!(!seen_by.is_raised());
        std::thread::scope(|s| {
            s.spawn(|| i.raise());
        });
        assert!(seen_by.is_raised());
        assert!(flag.load(Ordering::Acquire));
    }
}

//! When the action's status array goes out. Every accept, end, cancel and expiry changes it,
//! and each message carries every known goal (up to [`super::goals::MAX_FINISHED`] finished
//! ones, about 115 KB): sent per change, a flood of goals would send that much per goal.
//! A change is published at once when the last message is at least [`STATUS_INTERVAL`]
//! old, else when that interval has passed, in one message with every change since.

use std::time::{Duration, Instant};

/// The shortest time between two status messages.
pub(crate) const STATUS_INTERVAL: Duration = Duration::from_millis(50);

/// Whether and when the status array is due.
#[derive(Debug, Default)]
pub(crate) struct StatusPacer {
    last: Option<Instant>,
    due: Option<Instant>,
}

impl StatusPacer {
    /// The goals changed at `now`.
    pub(crate) fn changed(&mut self, now: Instant) {
        if self.due.is_none() {
            let next = self
                .last
                .and_then(|last| last.checked_add(STATUS_INTERVAL))
                .map_or(now, |next| next.max(now));
            self.due = Some(next);
        }
    }

    /// When the next message is due; `None` while nothing changed since the last.
    pub(crate) fn due(&self) -> Option<Instant> {
        self.due
    }

    /// Whether a message is due at `now`.
    pub(crate) fn is_due(&self, now: Instant) -> bool {
        self.due.is_some_and(|due| due <= now)
    }

    /// The status array was published at `now`.
    pub(crate) fn published(&mut self, now: Instant) {
        self.last = Some(now);
        self.due = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_change_goes_out_at_once_and_a_burst_in_one_message() {
        let t0 = Instant::now();
        let mut p = StatusPacer::default();
        assert_eq!(p.due(), None);
        p.changed(t0);
        assert!(p.is_due(t0));
        p.published(t0);
        assert_eq!(p.due(), None, "nothing changed since");
        // A burst within the interval: one message, at its end.
        let ms = Duration::from_millis;
        for i in 1..=40 {
            p.changed(t0 + ms(i));
        }
        assert_eq!(p.due(), Some(t0 + STATUS_INTERVAL));
        assert!(!p.is_due(t0 + ms(40)));
        assert!(p.is_due(t0 + STATUS_INTERVAL));
        p.published(t0 + STATUS_INTERVAL);
        // A change long after the last message goes out at once again.
        let later = t0 + ms(500);
        p.changed(later);
        assert_eq!(p.due(), Some(later));
    }
}

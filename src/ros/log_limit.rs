//! Warnings a peer can trigger at will (a malformed action goal, say) are rate-limited: a
//! peer that sends thousands must not flood the log or `/rosout`. At most one warning per
//! interval goes out; the ones held back in between are counted and reported with the next.

use std::time::{Duration, Instant};

/// Decides whether a warning of one kind goes out now.
#[derive(Debug)]
pub(crate) struct WarnLimit {
    interval: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl WarnLimit {
    /// At most one warning per `interval`.
    pub(crate) fn new(interval: Duration) -> Self {
        Self {
            interval,
            last: None,
            suppressed: 0,
        }
    }

    /// A warning is due at `now`: `Some(n)` to log it, with `n` warnings held back since the
    /// previous one; `None` to hold it back (it is counted).
    pub(crate) fn allow(&mut self, now: Instant) -> Option<u64> {
        let due = self
            .last
            .is_none_or(|t| now.saturating_duration_since(t) >= self.interval);
        if !due {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.suppressed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_warning_per_interval_and_the_rest_counted() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut w = WarnLimit::new(s(10));
        assert_eq!(w.allow(t0), Some(0), "the first goes out");
        // A flood within the interval: all held back.
        for i in 1..=1000 {
            assert_eq!(w.allow(t0 + Duration::from_millis(i)), None);
        }
        assert_eq!(
            w.allow(t0 + s(10)),
            Some(1000),
            "the next says how many were held"
        );
        assert_eq!(w.allow(t0 + s(11)), None);
        assert_eq!(w.allow(t0 + s(25)), Some(1));
        // Long quiet: the next goes out at once, nothing held.
        assert_eq!(w.allow(t0 + s(100)), Some(0));
    }
}

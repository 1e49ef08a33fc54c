//! The drawn tokens and their probabilities, readable while the generation still runs.

use std::sync::{Arc, Mutex, MutexGuard};

/// Each drawn token's id and probability, in order, shared between the sampler that writes
/// it and a reader that wants them before the reply is complete (a detect's feedback scores
/// each object as it closes, `crate::grounding::LiveScores`). Written only while the sampler
/// records probabilities ([`super::Sampler::record_probabilities`]); one short lock per token.
#[derive(Debug, Clone, Default)]
pub struct DrawnLog(Arc<Mutex<Vec<(u32, f32)>>>);

impl DrawnLog {
    pub fn new() -> Self {
        Self::default()
    }

    /// The ids and the probabilities drawn so far.
    pub fn snapshot(&self) -> (Vec<u32>, Vec<f32>) {
        self.lock().iter().copied().unzip()
    }

    pub(super) fn push(&self, id: u32, probability: f32) {
        self.lock().push((id, probability));
    }

    /// A writer that panicked mid-push left a whole entry or none: the list stays usable.
    fn lock(&self) -> MutexGuard<'_, Vec<(u32, f32)>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_clone_reads_what_the_writer_pushed() {
        let log = DrawnLog::new();
        let reader = log.clone();
        log.push(7, 0.5);
        log.push(9, 0.25);
        assert_eq!(reader.snapshot(), (vec![7, 9], vec![0.5, 0.25]));
    }
}

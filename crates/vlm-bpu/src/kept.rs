//! One decode state kept on the device ([`vlm::engine::Backend::keep`]): it stays in its cache
//! set, which no run writes, so making it current again is a switch of sets, not a copy of
//! the ~60 MB state. A latest-frame pre-fill is kept so that every ask about its frame starts
//! from it at once, whatever ran in between (other asks, a parked pre-fill, a restore).

use std::sync::atomic::{AtomicU64, Ordering};

use crate::BpuBackend;

static NEXT_KEPT: AtomicU64 = AtomicU64::new(1);

/// What the set alone does not hold: `P`, `maxPos` and the decode-logits image.
pub(crate) struct Kept {
    id: u64,
    set: usize,
    consumed: usize,
    max_pos: Option<u32>,
    logit_image: Vec<u8>,
}

impl Kept {
    pub(crate) fn set(&self) -> usize {
        self.set
    }
}

impl BpuBackend {
    /// Keeps the current state in its set (replacing the state kept before); `None` without
    /// a third set ([`crate::BpuOptions::keep_set`]): two sets are both needed by every run.
    pub(crate) fn keep_current(&mut self) -> Option<u64> {
        if self.sets.len() < 3 {
            return None;
        }
        self.materialise_image();
        let id = NEXT_KEPT.fetch_add(1, Ordering::Relaxed);
        self.kept = Some(Kept {
            id,
            set: self.current,
            consumed: self.consumed,
            max_pos: self.max_pos,
            logit_image: self.logit_image.clone(),
        });
        tracing::debug!(
            id,
            set = self.current,
            consumed = self.consumed,
            "state kept"
        );
        Some(id)
    }

    /// Makes the kept state `id` current again; false when another one (or none) is kept.
    pub(crate) fn resume(&mut self, id: u64) -> bool {
        let Some(k) = self.kept.as_ref().filter(|k| k.id == id) else {
            return false;
        };
        self.current = k.set;
        self.consumed = k.consumed;
        self.max_pos = k.max_pos;
        self.logit_image.copy_from_slice(&k.logit_image);
        self.image_in_decode_buffer = false;
        if self.consumed > 0 {
            self.logits_from_image();
        } else {
            self.logits_at = crate::logits::LogitsAt::Nowhere;
        }
        true
    }
}

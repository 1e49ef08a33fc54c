//! One decode state kept on the device, and one parked there ([`vlm::engine::Backend::keep`]): it stays in its cache
//! set, which no run writes, so making it current again is a switch of sets, not a copy of
//! the ~60 MB state. A latest-frame pre-fill is kept so that every ask about its frame starts
//! from it at once, whatever ran in between (other asks, a parked pre-fill, a restore).

use std::sync::atomic::{AtomicU64, Ordering};

use vlm::engine::{EngineError, StateBlob};

use crate::state::SavedAt;
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
        let Some(k) = self.kept.take_if(|k| k.id == id) else {
            return false;
        };
        self.switch_to(k.set, k.consumed, k.max_pos, &k.logit_image);
        self.kept = Some(k);
        true
    }

    /// Makes the state in `set` current (no copy): what the set alone does not hold.
    fn switch_to(&mut self, set: usize, consumed: usize, max_pos: Option<u32>, logit_image: &[u8]) {
        self.current = set;
        self.consumed = consumed;
        self.max_pos = max_pos;
        self.logit_image.copy_from_slice(logit_image);
        self.image_in_decode_buffer = false;
        if consumed > 0 {
            self.logits_from_image();
        } else {
            self.logits_at = crate::logits::LogitsAt::Nowhere;
        }
    }
}

/// A state parked in its set ([`vlm::engine::Backend::park`]): it stays there until a run or
/// a restore needs the set, and only then is copied to the host, so the copy is not on the
/// way of the work that displaced it (an ask's first token), and not made at all when the
/// state is taken up again before.
pub(crate) struct Parked {
    id: u64,
    /// Its set while it is there; `None` once moved to `copy`.
    set: Option<usize>,
    consumed: usize,
    max_pos: Option<u32>,
    logit_image: Vec<u8>,
    copy: Option<StateBlob>,
}

impl Parked {
    pub(crate) fn set(&self) -> Option<usize> {
        self.set
    }
}

impl BpuBackend {
    /// Parks the current state where it is (replacing one parked before); `None` without a
    /// third set, or when it is the kept state (already safe).
    pub(crate) fn park_current(&mut self) -> Option<u64> {
        if self.sets.len() < 3 || self.kept.as_ref().map(Kept::set) == Some(self.current) {
            return None;
        }
        self.release_parked();
        self.materialise_image();
        let id = NEXT_KEPT.fetch_add(1, Ordering::Relaxed);
        self.parked = Some(Parked {
            id,
            set: Some(self.current),
            consumed: self.consumed,
            max_pos: self.max_pos,
            logit_image: self.logit_image.clone(),
            copy: None,
        });
        tracing::debug!(
            id,
            set = self.current,
            consumed = self.consumed,
            "state parked"
        );
        Some(id)
    }

    /// Copies the parked state to the host and frees its set.
    pub(crate) fn move_parked_to_host(&mut self) -> Result<(), EngineError> {
        let Some(p) = self.parked.take() else {
            return Ok(());
        };
        let Some(set) = p.set else {
            self.parked = Some(p);
            return Ok(());
        };
        let at = SavedAt {
            set,
            consumed: p.consumed,
            max_pos: p.max_pos,
        };
        let spare = self.park_spare.take();
        let copy = match self.save_set(&at, &p.logit_image, spare) {
            Ok(c) => c,
            Err(e) => {
                self.parked = Some(p);
                return Err(e);
            }
        };
        tracing::debug!(id = p.id, "parked state moved to the host");
        self.parked = Some(Parked {
            set: None,
            copy: Some(copy),
            ..p
        });
        Ok(())
    }

    /// Makes the parked state `id` current again: a switch of sets while it is in its own,
    /// else its copy restored. `Ok(false)` when another one (or none) is parked.
    pub(crate) fn unpark(&mut self, id: u64) -> Result<bool, EngineError> {
        let Some(p) = self.parked.take_if(|p| p.id == id) else {
            return Ok(false);
        };
        match (p.set, p.copy) {
            (Some(set), _) => self.switch_to(set, p.consumed, p.max_pos, &p.logit_image),
            (None, Some(copy)) => {
                let loaded = self.load_state(&copy);
                self.park_spare = Some(copy);
                loaded?;
            }
            (None, None) => return Ok(false),
        }
        Ok(true)
    }

    /// Forgets the parked state (its set becomes writable; a copy's memory is kept for the
    /// next one).
    pub(crate) fn release_parked(&mut self) {
        if let Some(copy) = self.parked.take().and_then(|p| p.copy) {
            self.park_spare = Some(copy);
        }
    }
}

//! The states a [`vlm::engine::Device`] holds in place: one pinned and one stashed. A pinned
//! state stays in its cache set, which no run writes, so making it current again is a switch
//! of sets, not a copy of the ~60 MB state: the completed frame priming is pinned so that
//! every ask about its frame starts from it at once, whatever ran in between. A stashed state
//! stays in its set until a run or a restore needs the set, and only then is copied to the
//! host, so the copy is not on the way of the work that displaced it (an ask's first token),
//! and not made at all when the state is taken up again before. Which states these are is
//! decided by `vlm::residency::DecodeStates`.

use std::sync::atomic::{AtomicU64, Ordering};

use vlm::engine::{EngineError, StateBlob};

use crate::state::SavedAt;
use crate::BpuBackend;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A state left in cache set `set`, with what the set alone does not hold: `P`, `maxPos` and
/// the decode-logits image.
pub(crate) struct InSet {
    id: u64,
    set: usize,
    consumed: usize,
    max_pos: Option<u32>,
    logit_image: Vec<u8>,
}

/// The pinned state.
pub(crate) struct Pinned(InSet);

impl Pinned {
    pub(crate) fn set(&self) -> usize {
        self.0.set
    }
}

/// The stashed state: in its set, or moved to `copy`.
pub(crate) struct Stashed {
    state: InSet,
    copy: Option<StateBlob>,
}

impl Stashed {
    /// Its set while it is there.
    pub(crate) fn set(&self) -> Option<usize> {
        self.copy.is_none().then_some(self.state.set)
    }
}

impl BpuBackend {
    /// The current state as it lies in its set, under a new id; `None` without a third set
    /// ([`crate::BpuOptions::keep_set`]): two sets are both needed by every run.
    fn in_set(&mut self, what: &str) -> Option<InSet> {
        if self.sets.len() < 3 {
            return None;
        }
        self.materialise_image();
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            id,
            set = self.current,
            consumed = self.consumed,
            "state {what}"
        );
        Some(InSet {
            id,
            set: self.current,
            consumed: self.consumed,
            max_pos: self.max_pos,
            logit_image: self.logit_image.clone(),
        })
    }

    /// Makes the state `s` current (no copy).
    fn switch_to(&mut self, s: &InSet) {
        self.current = s.set;
        self.consumed = s.consumed;
        self.max_pos = s.max_pos;
        self.logit_image.copy_from_slice(&s.logit_image);
        self.image_in_decode_buffer = false;
        if s.consumed > 0 {
            self.logits_from_image();
        } else {
            self.logits_at = crate::logits::LogitsAt::Nowhere;
        }
    }

    /// Pins the current state in its set (replacing the state pinned before).
    pub(crate) fn pin_current(&mut self) -> Option<u64> {
        let s = self.in_set("pinned")?;
        let id = s.id;
        self.pinned = Some(Pinned(s));
        Some(id)
    }

    /// Makes the pinned state `id` current again; false when another one (or none) is pinned.
    pub(crate) fn resume_pinned(&mut self, id: u64) -> bool {
        let Some(k) = self.pinned.take_if(|k| k.0.id == id) else {
            return false;
        };
        self.switch_to(&k.0);
        self.pinned = Some(k);
        true
    }

    /// Stashes the current state where it is (replacing one stashed before); `None` without
    /// a third set, or when it is the pinned state (already safe).
    pub(crate) fn stash_current(&mut self) -> Option<u64> {
        if self.pinned.as_ref().map(Pinned::set) == Some(self.current) {
            return None;
        }
        let s = self.in_set("stashed")?;
        self.forget_stash();
        let id = s.id;
        self.stashed = Some(Stashed {
            state: s,
            copy: None,
        });
        Some(id)
    }

    /// Copies the stashed state to the host and frees its set.
    pub(crate) fn move_stash_to_host(&mut self) -> Result<(), EngineError> {
        let Some(mut p) = self.stashed.take_if(|p| p.copy.is_none()) else {
            return Ok(());
        };
        let at = SavedAt {
            set: p.state.set,
            consumed: p.state.consumed,
            max_pos: p.state.max_pos,
        };
        let spare = self.stash_spare.take();
        let saved = self.save_set(&at, &p.state.logit_image, spare);
        if let Ok(copy) = &saved {
            tracing::debug!(
                id = p.state.id,
                bytes = copy.size_bytes(),
                "stashed state moved to the host"
            );
        }
        let result = saved.map(|copy| p.copy = Some(copy));
        self.stashed = Some(p);
        result
    }

    /// Makes the stashed state `id` current again: a switch of sets while it is in its own,
    /// else its copy restored. `Ok(false)` when another one (or none) is stashed.
    pub(crate) fn unstash(&mut self, id: u64) -> Result<bool, EngineError> {
        let Some(p) = self.stashed.take_if(|p| p.state.id == id) else {
            return Ok(false);
        };
        match p.copy {
            None => self.switch_to(&p.state),
            Some(copy) => {
                let loaded = self.load_state(&copy);
                self.stash_spare = Some(copy);
                loaded?;
            }
        }
        Ok(true)
    }

    /// Forgets the stashed state (its set becomes writable; a copy's memory is kept for the
    /// next one).
    pub(crate) fn forget_stash(&mut self) {
        if let Some(copy) = self.stashed.take().and_then(|p| p.copy) {
            self.stash_spare = Some(copy);
        }
    }
}

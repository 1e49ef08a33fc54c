//! The decode state: two cache sets A/B used ping-pong (a run reads the current set and writes
//! the other, so a failed run leaves the state as it was), `P`, `maxPos`, and the §10.2
//! snapshots that save and restore all of it with the decode-logits image.

use std::path::Path;

use hbdnn::{DeviceBuffer, Graph};

use vlm::chat::Pos3;
use vlm::engine::{CacheLayout, EngineError, StateBlob, StateShape};
use vlm::interrupt::Interrupt;

use crate::contract::{self, DecodeShape, FIXED_IN};
use crate::error::device;
use crate::logits::LogitsAt;
use crate::{held, BpuBackend, BpuError};

/// One cache set: a buffer per cache input of the decode graph, of `bytes[c]` bytes
/// ([`contract::cache_buffer_bytes`]). `interrupt` is asked before each buffer: a 4B set at
/// ctx4k is 64 buffers and ~310 MB that the runtime zeroes and flushes, seconds on a busy
/// host, and a shutdown must not wait for the rest of them.
pub(crate) fn alloc_set(
    decode: &Graph,
    bytes: &[usize],
    hbm: &Path,
    interrupt: &Interrupt,
) -> Result<Vec<DeviceBuffer>, BpuError> {
    let mut set = Vec::with_capacity(bytes.len());
    for (c, &n) in bytes.iter().enumerate() {
        if interrupt.is_raised() {
            tracing::info!(
                buffer = c,
                of = bytes.len(),
                "opening the package interrupted before {ALLOCATING_THE_REST}"
            );
            return Err(BpuError::Interrupted {
                step: ALLOCATING_THE_REST,
            });
        }
        let buf = decode
            .alloc_input_at_least(FIXED_IN + c, n)
            .map_err(|source| BpuError::Hbdnn {
                path: hbm.to_owned(),
                source,
            })?;
        set.push(buf);
    }
    Ok(set)
}

/// Where [`alloc_set`] stops when interrupted.
pub(crate) const ALLOCATING_THE_REST: &str = "allocating the rest of the cache buffers";

/// Where [`BpuBackend::clear_state_until`] stops when interrupted at open.
pub(crate) const CLEARING_THE_REST: &str = "clearing the rest of the state";

/// What a snapshot holds: each cache's size (and window rows, saved only as far as filled)
/// and the decode-logits image.
pub(crate) fn state_shape(decode: &Graph, shape: &DecodeShape) -> StateShape {
    let caches = decode.inputs()[FIXED_IN..]
        .iter()
        .map(|s| CacheLayout {
            bytes: s.byte_size,
            window_row_bytes: contract::window_row_bytes(s, shape.context),
        })
        .collect();
    StateShape {
        vocab: shape.vocab,
        context: shape.context,
        logit_bytes: decode.outputs()[0].byte_size,
        caches,
    }
}

/// Where a state to snapshot lies and what the set alone does not hold.
pub(crate) struct SavedAt {
    pub set: usize,
    pub consumed: usize,
    pub max_pos: Option<u32>,
}

/// Set `cur` (a run's input) and set `out` (its output), two different sets.
pub(crate) fn pair(
    sets: &mut [Vec<DeviceBuffer>],
    cur: usize,
    out: usize,
) -> (&[DeviceBuffer], &mut [DeviceBuffer]) {
    if cur < out {
        let (a, b) = sets.split_at_mut(out);
        (&a[cur], &mut b[0])
    } else {
        let (a, b) = sets.split_at_mut(cur);
        (&b[0], &mut a[out])
    }
}

impl BpuBackend {
    /// Whether set `i` holds a state that must not be written: the pinned one, or a stashed
    /// one not moved to the host yet.
    pub(crate) fn protected(&self, i: usize) -> bool {
        self.pinned.as_ref().map(held::Pinned::set) == Some(i)
            || self.stashed.as_ref().and_then(held::Stashed::set) == Some(i)
    }

    /// The set a run (or a restore away from a protected set) writes: neither the current
    /// one nor a protected one. [`BpuBackend::free_a_set`] makes sure there is one.
    pub(crate) fn out_set(&self) -> usize {
        (0..self.sets.len())
            .find(|&i| i != self.current && !self.protected(i))
            // Unreachable after `free_a_set` (a state is pinned or stashed only with a third set).
            .unwrap_or((self.current + 1) % self.sets.len())
    }

    /// Makes a set other than the current one writable: a stashed state in the way moves
    /// to the host now (its copy is taken when a run needs its set, not when it is stashed).
    pub(crate) fn free_a_set(&mut self) -> Result<(), EngineError> {
        let free = (0..self.sets.len()).any(|i| i != self.current && !self.protected(i));
        if !free {
            // Only background work is at stake: the run or restore that needs the set goes on.
            if let Err(e) = self.move_stash_to_host() {
                tracing::warn!("the stashed state could not be moved to the host ({e}): dropped");
                self.forget_stash();
            }
        }
        Ok(())
    }

    /// Before a run: until it succeeds, its output set holds rows we cannot name.
    pub(crate) fn run_starts(&mut self) -> Result<(), EngineError> {
        self.free_a_set()?;
        let out = self.out_set();
        self.held[out] = self.shape.context;
        Ok(())
    }

    /// After a successful run: its output set becomes the state, `P` grows by the real rows
    /// and `maxPos` by their largest coordinate.
    pub(crate) fn advance(&mut self, positions: &[Pos3]) {
        let out = self.out_set();
        self.consumed += positions.len();
        self.held[out] = self.consumed.min(self.shape.context);
        self.current = out;
        let top = positions.iter().map(Pos3::max).max().unwrap_or(0);
        self.max_pos = Some(self.max_pos.map_or(top, |m| m.max(top)));
    }

    /// Empties the state: every set but the protected ones is zeroed (as far as it may hold
    /// rows).
    pub(crate) fn clear_state(&mut self) -> Result<(), EngineError> {
        self.clear_state_until(&Interrupt::new()).map(|_| ())
    }

    /// [`Self::clear_state`], asking `interrupt` before each buffer (the fresh sets of a 4B
    /// package at ctx4k are ~930 MB to zero and flush). `Ok(false)`: interrupted, the state
    /// is only partly cleared (what was not zeroed still counts as held) and opening stops.
    pub(crate) fn clear_state_until(&mut self, interrupt: &Interrupt) -> Result<bool, EngineError> {
        let protected: Vec<bool> = (0..self.sets.len()).map(|i| self.protected(i)).collect();
        let context = self.shape.context;
        for (i, set) in self.sets.iter_mut().enumerate() {
            if protected[i] {
                continue;
            }
            for (buf, layout) in set.iter_mut().zip(&self.state_shape.caches) {
                if interrupt.is_raised() {
                    tracing::info!(
                        set = i,
                        "opening the package interrupted before {CLEARING_THE_REST}"
                    );
                    return Ok(false);
                }
                let r = layout.occupied(self.held[i], context);
                if r.is_empty() {
                    continue;
                }
                buf.prepare_write(r.start, r.len())
                    .map_err(|e| device("INVALIDATE", e))?;
                buf.as_mut_bytes()[r.clone()].fill(0);
                buf.clean_range(r.start, r.len())
                    .map_err(|e| device("CLEAN", e))?;
            }
            self.held[i] = 0;
        }
        self.current = (0..self.sets.len()).find(|&i| !protected[i]).unwrap_or(0);
        self.consumed = 0;
        self.max_pos = None;
        self.logits_at = LogitsAt::Nowhere;
        self.logits.clear();
        self.image_in_decode_buffer = false;
        self.logit_image.fill(0);
        Ok(true)
    }

    pub(crate) fn save_state(
        &mut self,
        spare: Option<StateBlob>,
    ) -> Result<StateBlob, EngineError> {
        self.materialise_image();
        let at = SavedAt {
            set: self.current,
            consumed: self.consumed,
            max_pos: self.max_pos,
        };
        let logits = std::mem::take(&mut self.logit_image);
        let blob = self.save_set(&at, &logits, spare);
        self.logit_image = logits;
        blob
    }

    /// A snapshot of the state in set `at.set` with its `P`, `maxPos` and logits image.
    pub(crate) fn save_set(
        &mut self,
        at: &SavedAt,
        logit_image: &[u8],
        spare: Option<StateBlob>,
    ) -> Result<StateBlob, EngineError> {
        // Only the occupied bytes are saved, so only they need the device's view: the cost
        // follows the conversation, not the window size.
        let (consumed, context) = (at.consumed, self.shape.context);
        let set = &mut self.sets[at.set];
        for (buf, layout) in set.iter_mut().zip(&self.state_shape.caches) {
            let r = layout.occupied(consumed, context);
            // An empty state occupies no window row: nothing to flush (a zero-length flush
            // at the buffer's end is not a call to make on the board).
            if !r.is_empty() {
                buf.invalidate_range(r.start, r.len())
                    .map_err(|e| device("INVALIDATE", e))?;
            }
        }
        let caches: Vec<&[u8]> = set.iter().map(DeviceBuffer::as_bytes).collect();
        let blob = StateBlob::build_reusing(
            spare,
            &self.state_shape,
            consumed,
            at.max_pos,
            &caches,
            logit_image,
        )?;
        tracing::debug!(bytes = blob.size_bytes(), consumed, "BPU state snapshot");
        Ok(blob)
    }

    pub(crate) fn load_state(&mut self, blob: &StateBlob) -> Result<(), EngineError> {
        let view = blob.view(&self.state_shape)?;
        if view.consumed > self.shape.context {
            return Err(EngineError::State {
                reason: format!(
                    "P {} exceeds the window {}",
                    view.consumed, self.shape.context
                ),
            });
        }
        // A pinned or stashed state's set is never written: the restore goes into another one.
        let target = if self.protected(self.current) {
            self.free_a_set()?;
            self.out_set()
        } else {
            self.current
        };
        if let Err(e) = self.write_caches(target, &view.caches) {
            // A half-written set holds no state we can name: leave an empty one (the whole
            // window counts as written until the clear has zeroed it).
            self.held[target] = self.shape.context;
            self.clear_state()?;
            return Err(e);
        }
        self.held[target] = view.consumed.min(self.shape.context);
        self.current = target;
        self.consumed = view.consumed;
        self.max_pos = view.max_pos;
        self.logit_image.copy_from_slice(view.logits);
        self.image_in_decode_buffer = false;
        if view.consumed > 0 {
            self.logits_from_image();
        } else {
            self.logits_at = LogitsAt::Nowhere;
        }
        tracing::debug!(
            bytes = blob.size_bytes(),
            consumed = view.consumed,
            "BPU state restored"
        );
        Ok(())
    }

    /// Writes a blob's occupied cache bytes into set `target`. A window row outside the rows
    /// a set holds is zero (a set starts zeroed and the graph only shifts rows in from the
    /// right), so of the rest only the rows the set holds and the blob does not are zeroed;
    /// the whole window is neither written nor cleaned.
    fn write_caches(
        &mut self,
        target: usize,
        caches: &[(std::ops::Range<usize>, &[u8])],
    ) -> Result<(), EngineError> {
        let (before, context) = (self.held[target], self.shape.context);
        let set = &mut self.sets[target];
        for ((buf, layout), (range, data)) in
            set.iter_mut().zip(&self.state_shape.caches).zip(caches)
        {
            let old = layout.occupied(before, context);
            let touched = old.start.min(range.start)..range.end.max(old.end);
            if !touched.is_empty() {
                buf.prepare_write(touched.start, touched.len())
                    .map_err(|e| device("INVALIDATE", e))?;
            }
            let bytes = buf.as_mut_bytes();
            bytes[touched.start..range.start].fill(0);
            bytes[range.clone()].copy_from_slice(data);
            if !touched.is_empty() {
                buf.clean_range(touched.start, touched.len())
                    .map_err(|e| device("CLEAN", e))?;
            }
        }
        Ok(())
    }
}

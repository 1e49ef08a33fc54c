//! The decode state: two cache sets A/B used ping-pong (a run reads the current set and writes
//! the other, so a failed run leaves the state as it was), `P`, `maxPos`, and the §10.2
//! snapshots that save and restore all of it with the decode-logits image.

use std::path::Path;

use hbdnn::{DeviceBuffer, Graph};

use vlm::chat::Pos3;
use vlm::engine::{CacheLayout, EngineError, StateBlob, StateShape};

use crate::contract::{self, DecodeShape, FIXED_IN};
use crate::error::device;
use crate::logits::LogitsAt;
use crate::{BpuBackend, BpuError};

/// One cache set: a buffer per cache input of the decode graph.
pub(crate) fn alloc_set(
    decode: &Graph,
    n_cache: usize,
    hbm: &Path,
) -> Result<Vec<DeviceBuffer>, BpuError> {
    (0..n_cache)
        .map(|c| decode.alloc_input(FIXED_IN + c))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| BpuError::Hbdnn {
            path: hbm.to_owned(),
            source,
        })
}

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

/// The current set (the run's input) and the other (its output).
pub(crate) fn ping_pong(
    sets: &mut [Vec<DeviceBuffer>; 2],
    phase: usize,
) -> (&[DeviceBuffer], &mut [DeviceBuffer]) {
    let (a, b) = sets.split_at_mut(1);
    if phase == 0 {
        (&a[0], &mut b[0])
    } else {
        (&b[0], &mut a[0])
    }
}

impl BpuBackend {
    /// After a successful run: its output set becomes the state, `P` grows by the real rows
    /// and `maxPos` by their largest coordinate.
    pub(crate) fn advance(&mut self, positions: &[Pos3]) {
        self.phase ^= 1;
        self.consumed += positions.len();
        let top = positions.iter().map(Pos3::max).max().unwrap_or(0);
        self.max_pos = Some(self.max_pos.map_or(top, |m| m.max(top)));
    }

    pub(crate) fn clear_state(&mut self) -> Result<(), EngineError> {
        for set in &mut self.sets {
            for buf in set.iter_mut() {
                buf.as_mut_bytes().fill(0);
                buf.clean().map_err(|e| device("CLEAN", e))?;
            }
        }
        self.phase = 0;
        self.consumed = 0;
        self.max_pos = None;
        self.logits_at = LogitsAt::Nowhere;
        self.logits.clear();
        self.image_in_decode_buffer = false;
        self.logit_image.fill(0);
        Ok(())
    }

    pub(crate) fn save_state(
        &mut self,
        spare: Option<StateBlob>,
    ) -> Result<StateBlob, EngineError> {
        self.materialise_image();
        // Only the occupied bytes are saved, so only they need the device's view: the cost
        // follows the conversation, not the window size.
        let (consumed, context) = (self.consumed, self.shape.context);
        let set = &mut self.sets[self.phase];
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
            self.consumed,
            self.max_pos,
            &caches,
            &self.logit_image,
        )?;
        tracing::debug!(
            bytes = blob.size_bytes(),
            consumed = self.consumed,
            "BPU state snapshot"
        );
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
        if let Err(e) = self.write_caches(&view.caches) {
            // A half-written set holds no state we can name: leave an empty one. Until that
            // is done, the whole window counts as written, so that a clear that fails too
            // leaves the next restore zeroing all of it.
            self.consumed = self.shape.context;
            self.clear_state()?;
            return Err(e);
        }
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

    /// Writes a blob's occupied cache bytes into the current set. A window row outside the
    /// occupied range is zero in a live set (it starts zeroed and the graph only shifts rows
    /// in from the right), so of the rest only the rows the current state occupies and the
    /// new one does not are zeroed; the whole window is neither written nor cleaned.
    fn write_caches(
        &mut self,
        caches: &[(std::ops::Range<usize>, &[u8])],
    ) -> Result<(), EngineError> {
        let (before, context) = (self.consumed, self.shape.context);
        let set = &mut self.sets[self.phase];
        for ((buf, layout), (range, data)) in
            set.iter_mut().zip(&self.state_shape.caches).zip(caches)
        {
            let old = layout.occupied(before, context);
            let touched = old.start.min(range.start)..range.end.max(old.end);
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

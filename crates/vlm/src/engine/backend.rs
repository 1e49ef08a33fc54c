//! The seam between the runtime and compute, shaped like docs/package-contract.md (§3–§5) so the
//! BPU backend maps onto it 1:1: embedding rows in, logits of the last row out, a right-aligned
//! window of `CL` slots with `P` (slots consumed) and `maxPos` (highest rope coordinate) kept
//! by the backend, N-row prefill chunks and one-row steps, whole-state snapshots.

use crate::chat::Pos3;
use crate::vision::{Geometry, PixelValues};

use super::error::EngineError;
use super::state::StateBlob;

/// What the scheduler needs to know about a backend (from the graphs on the BPU, from the
/// config on the CPU).
#[derive(Debug, Clone, PartialEq)]
pub struct BackendInfo {
    /// Text hidden size `H` (last dim of decode input 0).
    pub hidden: usize,
    /// Vocabulary size (last dim of decode output 0).
    pub vocab: usize,
    /// Window capacity `CL` in rows (from the mask shape on the BPU).
    pub context: usize,
    /// Rows per prefill chunk `N`; 0 = no prefill graph, every row is stepped.
    pub prefill_chunk: usize,
    /// Leading dim of the mask (1, or the attention head count); every plane gets the same row.
    pub mask_heads: usize,
    /// The vision tower's input geometry and normalisation; `None` = text only.
    pub vision: Option<VisionSpec>,
}

/// Vision tower input: bucket geometry plus per-channel normalisation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VisionSpec {
    pub geometry: Geometry,
    pub mean: [f32; 3],
    pub std: [f32; 3],
}

/// Compute for one model and one decode state (a conversation).
///
/// Required methods are the graph-level operations; the ingest loop ([`Backend::step`],
/// [`Backend::step_interruptible`]) is provided so every backend chunks and checks the window
/// identically: `N`-row chunks while at least `N` rows remain, the tail one row at a time, and
/// an input that does not fit the free slots is refused with
/// [`EngineError::ContextOverflow`] before anything runs (never silent eviction).
pub trait Backend {
    fn info(&self) -> &BackendInfo;

    /// Appends the embedding rows `[ids.len(), hidden]` of `ids` to `out`.
    fn embed(&self, ids: &[u32], out: &mut Vec<f32>) -> Result<(), EngineError>;

    /// Runs the vision tower on one preprocessed image (`[n_patch, row_len]` of
    /// [`VisionSpec::geometry`]) and returns its rows `[n_tokens, hidden]`.
    fn encode_image(&mut self, pixels: &PixelValues) -> Result<Vec<f32>, EngineError>;

    /// Runs `n` rows `[n, hidden]` at `positions` through the decoder, where `n` is 1 (the
    /// decode graph) or exactly [`BackendInfo::prefill_chunk`] (the prefill graph), and
    /// `n <= context_left()`. Advances `P` by `n` and `maxPos` to the largest coordinate fed;
    /// the last row's logits become [`Backend::last_logits`].
    fn run_rows(&mut self, rows: &[f32], positions: &[Pos3]) -> Result<(), EngineError>;

    /// `P`: window slots consumed.
    fn consumed(&self) -> usize;

    /// `maxPos`: the largest rope coordinate fed so far (`None` for an empty state).
    fn max_pos(&self) -> Option<u32>;

    /// Logits `[vocab]` of the last row fed (`None` for an empty state).
    fn last_logits(&self) -> Option<&[f32]>;

    /// Empties the state (caches zeroed, `P` = 0, no `maxPos`, no logits).
    fn reset(&mut self) -> Result<(), EngineError>;

    /// The whole decode state (caches, `P`, `maxPos`, last logits) in the contract's format.
    fn snapshot(&mut self) -> Result<StateBlob, EngineError>;

    /// [`Backend::snapshot`] into the memory of `spare`, a snapshot the caller no longer needs.
    fn snapshot_reusing(&mut self, spare: StateBlob) -> Result<StateBlob, EngineError> {
        drop(spare);
        self.snapshot()
    }

    /// Replaces the decode state by `blob` (taken from a backend of the same model and `CL`).
    fn restore(&mut self, blob: &StateBlob) -> Result<(), EngineError>;

    /// What this backend offers beyond compute and the state primitives (cache sets that
    /// hold a state in place, task priority); `None` for a backend without a device (the CPU).
    /// Only [`crate::residency::DecodeStates`] uses the cache sets.
    fn device(&mut self) -> Option<&mut dyn Device> {
        None
    }

    /// Free window slots, `CL - P`.
    fn context_left(&self) -> usize {
        self.info().context.saturating_sub(self.consumed())
    }

    /// Rope position of the next text token (`maxPos + 1`, 0 for an empty state).
    fn next_position(&self) -> u32 {
        self.max_pos().map_or(0, |m| m + 1)
    }

    /// Whether a tail of `rows` rows (fewer than a chunk) would go as one padded prefill
    /// chunk rather than row by row (the BPU's padded tail); the provided ingest never pads.
    fn pads_tail(&self, rows: usize) -> bool {
        let _ = rows;
        false
    }

    /// Feeds rows with their positions (the contract's `feed_embeds`) and returns the logits
    /// of the last row.
    fn step(&mut self, rows: &[f32], positions: &[Pos3]) -> Result<&[f32], EngineError> {
        self.step_interruptible(rows, positions, &mut || false)?;
        self.last_logits().ok_or(EngineError::NoLogits)
    }

    /// [`Backend::step`] that asks `interrupt` before each graph run and stops early when it
    /// returns true (`Ok(false)`; the rows fed so far stay in the state). `Ok(true)` = all fed.
    fn step_interruptible(
        &mut self,
        rows: &[f32],
        positions: &[Pos3],
        interrupt: &mut dyn FnMut() -> bool,
    ) -> Result<bool, EngineError> {
        let h = self.info().hidden;
        let n = check_rows(h, rows, positions, self.context_left())?;
        let chunk = self.info().prefill_chunk;
        let mut i = 0;
        while i < n {
            if interrupt() {
                return Ok(false);
            }
            let take = if chunk >= 2 && n - i >= chunk {
                chunk
            } else {
                1
            };
            self.run_rows(&rows[i * h..(i + take) * h], &positions[i..i + take])?;
            i += take;
        }
        Ok(true)
    }
}

// A boxed backend is a backend, so the assistant holds either kind behind one type; every
// method forwards, the provided ones too (the BPU schedules its own padded tail).
impl<B: Backend + ?Sized> Backend for Box<B> {
    fn info(&self) -> &BackendInfo {
        (**self).info()
    }
    fn embed(&self, ids: &[u32], out: &mut Vec<f32>) -> Result<(), EngineError> {
        (**self).embed(ids, out)
    }
    fn encode_image(&mut self, pixels: &PixelValues) -> Result<Vec<f32>, EngineError> {
        (**self).encode_image(pixels)
    }
    fn run_rows(&mut self, rows: &[f32], positions: &[Pos3]) -> Result<(), EngineError> {
        (**self).run_rows(rows, positions)
    }
    fn consumed(&self) -> usize {
        (**self).consumed()
    }
    fn max_pos(&self) -> Option<u32> {
        (**self).max_pos()
    }
    fn last_logits(&self) -> Option<&[f32]> {
        (**self).last_logits()
    }
    fn reset(&mut self) -> Result<(), EngineError> {
        (**self).reset()
    }
    fn snapshot(&mut self) -> Result<StateBlob, EngineError> {
        (**self).snapshot()
    }
    fn snapshot_reusing(&mut self, spare: StateBlob) -> Result<StateBlob, EngineError> {
        (**self).snapshot_reusing(spare)
    }
    fn restore(&mut self, blob: &StateBlob) -> Result<(), EngineError> {
        (**self).restore(blob)
    }
    fn device(&mut self) -> Option<&mut dyn Device> {
        (**self).device()
    }
    fn context_left(&self) -> usize {
        (**self).context_left()
    }
    fn next_position(&self) -> u32 {
        (**self).next_position()
    }
    fn pads_tail(&self, rows: usize) -> bool {
        (**self).pads_tail(rows)
    }
    fn step(&mut self, rows: &[f32], positions: &[Pos3]) -> Result<&[f32], EngineError> {
        (**self).step(rows, positions)
    }
    fn step_interruptible(
        &mut self,
        rows: &[f32],
        positions: &[Pos3],
        interrupt: &mut dyn FnMut() -> bool,
    ) -> Result<bool, EngineError> {
        (**self).step_interruptible(rows, positions, interrupt)
    }
}

/// A device's cache sets and scheduler, offered by [`Backend::device`]. A backend runs from
/// two cache sets; with a third, one state can stay in place while others run:
/// - **pinned**: a state no run or restore writes, made current again by a switch of sets
///   rather than a copy of the whole state (the completed frame priming every ask about that
///   frame starts from);
/// - **stashed**: a state left in its set until a run or restore needs the set, copied to the
///   host only then (a stopped frame priming set aside for an ask).
///
/// Which state is pinned or stashed, and why, is decided by
/// [`crate::residency::DecodeStates`]; a backend only carries it out.
pub trait Device {
    /// Pins the current state in its set, replacing the state pinned before; `None` when
    /// the backend has no set to spare (then the caller saves a host snapshot instead).
    fn pin(&mut self) -> Option<u64>;

    /// Makes the pinned state `id` current again; `false` when another one (or none) is
    /// pinned.
    fn switch_to_pinned(&mut self, id: u64) -> bool;

    /// Stashes the current state in its set, replacing the state stashed before; `None`
    /// without a set to spare, or when the current state is the pinned one (already safe).
    fn stash(&mut self) -> Option<u64>;

    /// Makes the stashed state `id` current again (a switch of sets, or its host copy
    /// restored); `Ok(false)` when another one (or none) is stashed.
    fn take_stash(&mut self, id: u64) -> Result<bool, EngineError>;

    /// Forgets the stashed state.
    fn drop_stash(&mut self);

    /// Sets the task priority of later graph runs (hbUCP: 0 lowest ..= 255), so background
    /// work (a frame priming) yields to other tasks.
    fn set_priority(&mut self, priority: u8);
}

/// Checks a block of rows for [`Backend::step_interruptible`] (every implementation): `rows`
/// is `[n, hidden]` for the `n` positions, `n >= 1`, and the rows fit the `left` context rows.
/// Returns `n`.
pub fn check_rows(
    hidden: usize,
    rows: &[f32],
    positions: &[Pos3],
    left: usize,
) -> Result<usize, EngineError> {
    let n = positions.len();
    if n == 0 || rows.len() != n * hidden {
        return Err(EngineError::Shape {
            what: "rows [n, hidden] for n positions",
            expected: n.max(1) * hidden,
            found: rows.len(),
        });
    }
    if n > left {
        return Err(EngineError::ContextOverflow { needed: n, left });
    }
    Ok(n)
}

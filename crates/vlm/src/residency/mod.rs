//! Decode-state residency: the one record of where every decode state the assistant may need
//! again lives, and the only code that moves one. A backend offers primitives only (save to a
//! host snapshot, load one, reset; on a device, [`Device`](crate::engine::Device) cache sets that pin or stash a state
//! in place); [`DecodeStates`] decides which state goes where, and keeps count.
//!
//! The states (docs/architecture.md has the transitions as a table):
//! - the **current** state, in the backend, labelled with what it holds ([`Holder`]): a
//!   conversation right after its saved turn, a frame priming (stopped or completed), or
//!   something no one will ask for again;
//! - **system blocks**: host snapshots right after a system prompt and its tools, an LRU
//!   bounded in entries and bytes ([`prefixes`]);
//! - **conversations**: host snapshots after a saved turn; the caller holds them
//!   ([`crate::assistant::Conversation`]) and hands them back to continue;
//! - the **primed frame**: the state after a completed frame priming, pinned in a spare cache
//!   set where the device has one (a switch of sets brings it back), else a host snapshot;
//! - the **stopped priming**: the state of a priming stopped between graph calls, stashed in
//!   its cache set (copied to the host only when a run needs the set) or saved to the host,
//!   while another turn uses the backend.
//!
//! Holding the current state's label here is what lets a turn skip a copy: an ask right after
//! a priming, or the next turn of the conversation that just answered, finds its state
//! already current. Every path that changes the state without a label first calls
//! [`DecodeStates::touched`].

mod prefixes;

use crate::engine::{Backend, EngineError, StateBlob};

/// What the backend's current decode state holds, as far as a later turn could use it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holder {
    /// Nothing a later turn can start from without a load.
    Unknown,
    /// The conversation with this id, right after its last saved turn.
    Conversation(u64),
    /// The frame priming with this id: stopped between graph calls, or completed.
    Priming(u64),
}

/// Where a completed frame priming's state is.
#[derive(Debug, Clone)]
pub enum FrameState {
    /// Pinned in a device cache set under this id ([`Device::pin`](crate::engine::Device::pin)).
    Pinned(u64),
    /// A host snapshot (no set to spare, or a backend without a device).
    Host(StateBlob),
}

impl FrameState {
    /// Host bytes held (a pinned state lives in device memory the pool already counts).
    pub fn size_bytes(&self) -> usize {
        match self {
            Self::Pinned(_) => 0,
            Self::Host(blob) => blob.size_bytes(),
        }
    }
}

/// Where a stopped priming's state waits while another turn uses the backend.
#[derive(Debug)]
enum Stashed {
    /// In its cache set on the device ([`Device::stash`](crate::engine::Device::stash)).
    Device(u64),
    Host(StateBlob),
}

/// What the residency holds, for logs and diagnostics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Residency {
    pub current: Holder,
    /// System-block snapshots cached, and their bytes.
    pub prefixes: usize,
    pub prefix_bytes: usize,
    /// The frame priming pinned on the device, by priming id.
    pub pinned_priming: Option<u64>,
    /// The stopped priming set aside, by priming id, and whether it is on the device.
    pub stashed_priming: Option<(u64, bool)>,
    /// Host bytes kept for the next stopped-priming snapshot.
    pub spare_bytes: usize,
}

/// The owner of decode-state residency (module docs).
#[derive(Debug)]
pub struct DecodeStates {
    current: Holder,
    prefixes: prefixes::PrefixCache,
    /// `(priming id, device id)` of the primed frame pinned on the device.
    pinned: Option<(u64, u64)>,
    /// The stopped priming set aside, by priming id.
    stashed: Option<(u64, Stashed)>,
    /// The memory of the last stopped priming's host snapshot, reused for the next one: a
    /// fresh ~60 MB allocation is paid in page faults on an ask's path.
    spare: Option<StateBlob>,
    snapshots: u64,
    restores: u64,
}

impl Default for DecodeStates {
    fn default() -> Self {
        Self::new()
    }
}

impl DecodeStates {
    pub fn new() -> Self {
        Self {
            current: Holder::Unknown,
            prefixes: prefixes::PrefixCache::new(usize::MAX),
            pinned: None,
            stashed: None,
            spare: None,
            snapshots: 0,
            restores: 0,
        }
    }

    /// What the current state holds.
    pub fn current(&self) -> Holder {
        self.current
    }

    /// The current state is about to change in a way no label describes (a run, a reset).
    pub fn touched(&mut self) {
        self.current = Holder::Unknown;
    }

    /// The current state now holds `holder` (a run just made it so).
    pub fn now_holds(&mut self, holder: Holder) {
        self.current = holder;
    }

    /// Host snapshots taken so far (saved turns, cached system blocks, stopped primings and
    /// primed frames without a set to spare).
    pub fn snapshots(&self) -> u64 {
        self.snapshots
    }

    /// States loaded back into the backend from host snapshots so far; a switch of cache sets
    /// (a pinned or stashed state) is not counted, even when the backend had to move a stashed
    /// one out and back.
    pub fn restores(&self) -> u64 {
        self.restores
    }

    pub fn residency(&self) -> Residency {
        Residency {
            current: self.current,
            prefixes: self.prefixes.len(),
            prefix_bytes: self.prefixes.bytes(),
            pinned_priming: self.pinned.map(|(p, _)| p),
            stashed_priming: self
                .stashed
                .as_ref()
                .map(|(p, s)| (*p, matches!(s, Stashed::Device(_)))),
            spare_bytes: self.spare.as_ref().map_or(0, StateBlob::size_bytes),
        }
    }

    /// Empties the current state (after a failure nothing about it can be trusted; the host
    /// snapshots stay valid).
    pub fn reset(&mut self, backend: &mut dyn Backend) -> Result<(), EngineError> {
        self.current = Holder::Unknown;
        backend.reset()
    }

    /// Sets the task priority of later graph runs where the backend has one.
    pub fn set_priority(&mut self, backend: &mut dyn Backend, priority: u8) {
        if let Some(device) = backend.device() {
            device.set_priority(priority);
        }
    }

    // System blocks.

    /// Bytes the cached system blocks may hold; at least the most recent one is kept.
    pub fn set_prefix_budget(&mut self, bytes: usize) {
        self.prefixes.set_budget(bytes);
    }

    /// Bytes and entries held by the cached system blocks.
    pub fn prefix_usage(&self) -> (usize, usize) {
        (self.prefixes.bytes(), self.prefixes.len())
    }

    /// Loads the cached state after the system block `text`; `false` when it is not cached
    /// (the current state is then to be rebuilt by the caller).
    pub fn load_prefix(
        &mut self,
        backend: &mut dyn Backend,
        text: &str,
    ) -> Result<bool, EngineError> {
        self.current = Holder::Unknown;
        let Some(blob) = self.prefixes.get(text) else {
            return Ok(false);
        };
        backend.restore(blob)?;
        self.restores += 1;
        Ok(true)
    }

    /// Caches the current state as the one after the system block `text`; returns its bytes.
    pub fn save_prefix(
        &mut self,
        backend: &mut dyn Backend,
        text: String,
    ) -> Result<usize, EngineError> {
        let blob = backend.snapshot()?;
        self.snapshots += 1;
        let bytes = blob.size_bytes();
        self.prefixes.put(text, blob);
        Ok(bytes)
    }

    // Conversations.

    /// Makes the conversation `id` (saved as `blob`) current, unless it already is; the state
    /// is then about to change.
    pub fn load_conversation(
        &mut self,
        backend: &mut dyn Backend,
        id: u64,
        blob: &StateBlob,
    ) -> Result<(), EngineError> {
        let current = std::mem::replace(&mut self.current, Holder::Unknown);
        if current != Holder::Conversation(id) {
            backend.restore(blob)?;
            self.restores += 1;
        }
        Ok(())
    }

    /// Saves the current state as the conversation `id` after its turn.
    pub fn save_conversation(
        &mut self,
        backend: &mut dyn Backend,
        id: u64,
    ) -> Result<StateBlob, EngineError> {
        let blob = backend.snapshot()?;
        self.snapshots += 1;
        self.current = Holder::Conversation(id);
        Ok(blob)
    }

    // Frame priming.

    /// Whether the stopped priming `priming` can be continued: its state is current or set
    /// aside.
    pub fn holds_priming(&self, priming: u64) -> bool {
        self.current == Holder::Priming(priming)
            || self.stashed.as_ref().is_some_and(|(p, _)| *p == priming)
    }

    /// Forgets the stopped priming set aside (a newer priming supersedes it).
    pub fn drop_stash(&mut self, backend: &mut dyn Backend) {
        match self.stashed.take() {
            Some((_, Stashed::Host(blob))) => self.spare = Some(blob),
            Some((_, Stashed::Device(_))) => {
                if let Some(device) = backend.device() {
                    device.drop_stash();
                }
            }
            None => {}
        }
    }

    /// Sets the stopped priming `priming` aside before another turn uses the backend:
    /// stashed in its cache set where the device can (no copy unless the set is needed), else
    /// saved to the host. Nothing to do unless its state is current and not set aside yet.
    pub fn stash_priming(
        &mut self,
        backend: &mut dyn Backend,
        priming: u64,
    ) -> Result<(), EngineError> {
        if self.stashed.is_some() || self.current != Holder::Priming(priming) {
            return Ok(());
        }
        if let Some(id) = backend.device().and_then(|d| d.stash()) {
            self.stashed = Some((priming, Stashed::Device(id)));
            return Ok(());
        }
        let blob = match self.spare.take() {
            Some(spare) => backend.snapshot_reusing(spare)?,
            None => backend.snapshot()?,
        };
        self.snapshots += 1;
        self.stashed = Some((priming, Stashed::Host(blob)));
        Ok(())
    }

    /// Makes the stopped priming `priming` current again — it may be already — and forgets
    /// where it was set aside (the state moves on from there). `false`: it is neither current
    /// nor to be had any more.
    pub fn resume_priming(
        &mut self,
        backend: &mut dyn Backend,
        priming: u64,
    ) -> Result<bool, EngineError> {
        if self.current != Holder::Priming(priming) {
            self.current = Holder::Unknown;
            match self.stashed.take() {
                Some((p, Stashed::Device(id))) if p == priming => {
                    let taken = match backend.device() {
                        Some(device) => device.take_stash(id)?,
                        None => false,
                    };
                    if !taken {
                        return Ok(false);
                    }
                }
                Some((p, Stashed::Host(blob))) if p == priming => {
                    let restored = backend.restore(&blob);
                    self.spare = Some(blob);
                    restored?;
                    self.restores += 1;
                }
                other => {
                    self.stashed = other;
                    return Ok(false);
                }
            }
        }
        self.drop_stash(backend);
        self.current = Holder::Unknown;
        Ok(true)
    }

    /// Keeps the completed priming `priming`'s state, now current: pinned on the device where
    /// it can be (no copy: the ask waiting for this last graph call does not wait for a copy
    /// too), else a host snapshot. A newer pin replaces the older one.
    pub fn save_primed_frame(
        &mut self,
        backend: &mut dyn Backend,
        priming: u64,
    ) -> Result<FrameState, EngineError> {
        let pinned = backend.device().and_then(|d| d.pin());
        self.pinned = pinned.map(|id| (priming, id));
        let state = match pinned {
            Some(id) => FrameState::Pinned(id),
            None => {
                self.snapshots += 1;
                FrameState::Host(backend.snapshot()?)
            }
        };
        self.current = Holder::Priming(priming);
        Ok(state)
    }

    /// Whether a primed frame's state is still to be had (a pinned one is replaced by the
    /// next pin, and gone with a reopened model).
    pub fn frame_held(&self, state: &FrameState) -> bool {
        match state {
            FrameState::Pinned(id) => self.pinned.map(|(_, d)| d) == Some(*id),
            FrameState::Host(_) => true,
        }
    }

    /// Makes the primed frame `priming` current, unless it already is; the state is then
    /// about to change. `false`: its pinned state is no longer held.
    pub fn load_primed_frame(
        &mut self,
        backend: &mut dyn Backend,
        priming: u64,
        state: &FrameState,
    ) -> Result<bool, EngineError> {
        let current = std::mem::replace(&mut self.current, Holder::Unknown);
        if current != Holder::Priming(priming) {
            match state {
                FrameState::Pinned(id) => {
                    let switched = backend.device().is_some_and(|d| d.switch_to_pinned(*id));
                    if !switched {
                        return Ok(false);
                    }
                }
                FrameState::Host(blob) => {
                    backend.restore(blob)?;
                    self.restores += 1;
                }
            }
        }
        Ok(true)
    }
}

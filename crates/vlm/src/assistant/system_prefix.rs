//! The system block of a fresh conversation: restored from [`crate::residency::DecodeStates`]'s
//! cache of system-block snapshots, or prefilled and cached there.

use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{Assistant, AssistantError, Reply, Turn};
use crate::chat::{Pos3, SystemOptions, UserTurn};
use crate::engine::{Backend, ConstraintOutcome, EngineError};
use crate::sampler::Sampler;
use crate::stream::{Event, FinishReason, TokenStream};

/// Why `turn` must stop now (its cancel flag, then its deadline), as the token stream says it.
pub(super) fn stopped(turn: &Turn) -> Option<FinishReason> {
    if turn
        .cancel
        .as_ref()
        .is_some_and(|c| c.load(Ordering::Relaxed))
    {
        return Some(FinishReason::Cancelled);
    }
    if turn.deadline.is_some_and(|d| Instant::now() >= d) {
        return Some(FinishReason::Timeout);
    }
    None
}

impl Assistant {
    /// Bytes the cached system blocks may hold (a front end takes them from the memory it
    /// gives parked conversations); at least the most recent block is always kept.
    pub fn set_prefix_budget(&mut self, bytes: usize) {
        self.states.set_prefix_budget(bytes);
    }

    /// Bytes and entries held by the cached system blocks.
    pub fn prefix_cache_usage(&self) -> (usize, usize) {
        self.states.prefix_usage()
    }

    /// Puts the state right after the system block: restored from the cache when the block
    /// is there, else prefilled and cached; `interrupt` is asked before each graph call of
    /// the prefill.
    /// Returns the prefix's row count; `None` when `interrupt` stopped it (nothing cached).
    /// A block longer than the whole window fails with [`EngineError::ContextOverflow`]
    /// before it is embedded: its rows (`ids × hidden` floats) would be reserved first, and
    /// the system text may come from a peer.
    pub(super) fn load_prefix(
        &mut self,
        opts: &SystemOptions,
        interrupt: &mut dyn FnMut() -> bool,
    ) -> Result<Option<usize>, AssistantError> {
        let text = self.template.system_text(opts)?;
        if self
            .states
            .load_prefix(&mut **self.engine.backend_mut(), &text)?
        {
            return Ok(Some(self.engine.backend().consumed()));
        }
        let ids = self.template.system_prefix(opts)?;
        let backend = &mut **self.engine.backend_mut();
        // The whole window is free after the reset below; checked first so a refused block
        // leaves the state (and what the residency says of it) untouched.
        let left = backend.info().context;
        if ids.len() > left {
            return Err(EngineError::ContextOverflow {
                needed: ids.len(),
                left,
            }
            .into());
        }
        backend.reset()?;
        let mut rows = Vec::new();
        backend.embed(&ids, &mut rows)?;
        let positions: Vec<Pos3> = (0..ids.len() as u32).map(Pos3::text).collect();
        if !positions.is_empty() && !backend.step_interruptible(&rows, &positions, interrupt)? {
            return Ok(None);
        }
        let bytes = self.states.save_prefix(backend, text)?;
        tracing::info!(
            tokens = ids.len(),
            bytes,
            "system prefix prefilled and cached"
        );
        Ok(Some(ids.len()))
    }

    /// Window rows a fresh conversation of `turn` fills before its answer: the system block
    /// and the rendered turn with its images (each image's slot of the tower's bucket). A
    /// front end adds the answer's token budget to see whether the answer fits the window
    /// (`crate::grounding::fit_budget`).
    pub fn fresh_turn_rows(&self, turn: &Turn) -> Result<usize, AssistantError> {
        let opts = SystemOptions {
            system: turn.system.clone(),
            tools: turn.tools.clone(),
        };
        let system = self.template.system_prefix(&opts)?.len();
        let slot = match (turn.images.is_empty(), self.slot()) {
            (true, _) => None,
            (false, None) => return Err(AssistantError::Engine(EngineError::NoVision)),
            (false, Some(s)) => Some(s),
        };
        let user = UserTurn {
            text: &turn.text,
            images: slot.map_or_else(Vec::new, |s| vec![s; turn.images.len()]),
            thinking: turn.thinking,
        };
        Ok(system + self.template.render_after_system(&user)?.rows())
    }

    /// The reply of a fresh turn stopped (cancel, deadline) while its system block was
    /// prefilled: nothing generated and nothing kept, as when the prompt's own prefill is
    /// stopped, so the front end ends the request `cancelled` or `timeout` as any other.
    pub(super) fn stopped_in_prefix(
        &mut self,
        turn: &Turn,
        on_event: &mut dyn FnMut(Event),
    ) -> Result<Reply, AssistantError> {
        // Part of the block ran: the state holds nothing a label describes.
        self.states.touched();
        let sampler = Sampler::new(turn.sampling.clone()).map_err(EngineError::from)?;
        let reason = stopped(turn).unwrap_or(FinishReason::Cancelled);
        let tokenizer = self.engine.tokenizer().clone();
        let ts = TokenStream::new(tokenizer, self.stream_config(turn, false));
        let completion = ts.finish(reason, on_event).map_err(EngineError::from)?;
        tracing::debug!(?reason, "turn stopped during its system prefix");
        Ok(Reply {
            completion,
            conversation: None,
            seed: sampler.seed(),
            constraint: turn
                .json_schema
                .as_ref()
                .map(|_| ConstraintOutcome::Incomplete),
            token_probs: Vec::new(),
        })
    }
}

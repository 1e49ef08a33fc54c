//! The system block of a fresh conversation: restored from [`crate::residency::DecodeStates`]'s
//! cache of system-block snapshots, or prefilled and cached there.

use super::{Assistant, AssistantError};
use crate::chat::{Pos3, SystemOptions};
use crate::engine::Backend;

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
}

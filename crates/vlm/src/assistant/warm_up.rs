//! The warm-up: every graph runs once before the first request, so that request does not pay
//! first-run costs. Each graph call is a boundary where an [`Interrupt`] is seen, so a
//! shutdown during warm-up (the 4B's is many graph calls of up to ~0.74 s each on the S100P)
//! stops after the call in flight instead of after all of them.

use std::time::Instant;

use super::{Assistant, AssistantError};
use crate::chat::{Pos3, SystemOptions, UserTurn};
use crate::engine::{Backend, EngineError, ImageInput};
use crate::interrupt::Interrupt;
use crate::vision::RgbImage;

/// The graph calls of one warm-up, each preceded by a look at the interrupt.
struct Boundaries<'a> {
    interrupt: &'a Interrupt,
    /// Graph calls let through so far.
    calls: usize,
}

impl Boundaries<'_> {
    /// Asked right before a graph call: true = do not make it.
    fn stop(&mut self) -> bool {
        if self.interrupt.is_raised() {
            return true;
        }
        self.calls += 1;
        false
    }

    fn interrupted(&self, stage: &str) -> AssistantError {
        let step = format!("graph call {} of the warm-up ({stage})", self.calls + 1);
        tracing::info!(
            graph_calls_done = self.calls,
            "warm-up interrupted before {step}"
        );
        AssistantError::Interrupted { step }
    }
}

impl Assistant {
    /// Runs every graph once — the system prefix (prefilled with `system` and cached for the
    /// next fresh conversation), the vision tower when there is one, the turn's prefill and
    /// one decode step — so the first real request does not pay first-run costs.
    ///
    /// `interrupt` is asked before each graph call; once raised, the warm-up stops there with
    /// [`AssistantError::Interrupted`] naming the call it did not make. The call in flight
    /// when it is raised runs to its end: a submitted BPU task cannot be taken back.
    pub fn warm_up(
        &mut self,
        system: Option<String>,
        interrupt: &Interrupt,
    ) -> Result<(), AssistantError> {
        let t0 = Instant::now();
        let mut b = Boundaries {
            interrupt,
            calls: 0,
        };
        tracing::info!("warm-up started");
        let opts = SystemOptions {
            system,
            tools: Vec::new(),
        };
        if self.load_prefix(&opts, &mut || b.stop())?.is_none() {
            return Err(b.interrupted("system prefix"));
        }
        let images = match self.info.image_side {
            Some(side) => vec![ImageInput::Rgb(
                RgbImage::new(side, side, vec![0; side * side * 3]).map_err(EngineError::from)?,
            )],
            None => Vec::new(),
        };
        let slots = match (images.is_empty(), self.slot()) {
            (false, Some(s)) => vec![s; images.len()],
            _ => Vec::new(),
        };
        let prompt = self.template.render_after_system(&UserTurn {
            text: "hi",
            images: slots,
            thinking: false,
        })?;
        self.states.touched();
        if !self.engine.prefill(&prompt, &images, &mut || b.stop())? {
            return Err(b.interrupted("tower and prompt rows"));
        }
        let backend = self.engine.backend_mut();
        if backend.context_left() > 0 {
            if b.stop() {
                return Err(b.interrupted("decode step"));
            }
            let mut row = Vec::new();
            backend.embed(&[0], &mut row)?;
            let pos = Pos3::text(backend.next_position());
            backend.step(&row, &[pos])?;
        }
        tracing::info!(
            ms = t0.elapsed().as_millis() as u64,
            graph_calls = b.calls,
            "warm-up done"
        );
        Ok(())
    }
}

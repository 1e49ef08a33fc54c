//! A quiet job (a watch evaluation) that primes its own frame ([`super::Chosen::Prime`]): the
//! scene changed and no priming holds it yet, so the job runs the priming (the tower and the
//! system block with the image) before its question, and that state stays for the asks and
//! watches after it — or, when an ask stops the job, for that ask to continue.

use std::sync::Arc;

use camera_frame::CachedFrame;
use vlm::assistant::{Assistant, AssistantError, PrimedFrame, PrimingOutcome, Turn};

use super::Primer;
use crate::serve::job::Images;

impl Primer {
    /// Primes `frame` for a quiet job's `turn`, stopped only by the turn's cancel: the
    /// completed priming, or `Err` (interrupted, with the priming left to be continued; or
    /// the frame cannot be converted).
    pub(super) fn prime_for(
        &mut self,
        frame: CachedFrame,
        assistant: &mut Assistant,
        turn: &Turn,
    ) -> Result<Arc<PrimedFrame>, AssistantError> {
        // The job's frame was not converted for it (the priming holds the image): a frame
        // that cannot be fails the job here, never as a question without its image.
        let image = match Images::Camera(frame.clone()).take_inputs(None) {
            Ok((mut images, _)) if images.len() == 1 => images.remove(0),
            Ok(_) => return Err(AssistantError::Turn("the frame gave no image".into())),
            Err(f) => return Err(AssistantError::Turn(f.message)),
        };
        let cancel = turn.cancel.clone();
        let mut stop = || {
            cancel
                .as_ref()
                .is_some_and(|c| c.load(std::sync::atomic::Ordering::Acquire))
        };
        self.tried = Some((frame.topic.clone(), frame.seq));
        self.count_change(&frame);
        let system = self.system.clone();
        match assistant.prime_frame(&system, &image, &mut stop) {
            Ok(PrimingOutcome::Done(p)) => {
                self.stats.done += 1;
                self.stats.frame_arrival = Some(frame.arrival);
                let p = Arc::new(p);
                self.completed = Some((frame, Arc::clone(&p)));
                Ok(p)
            }
            Ok(PrimingOutcome::Stopped) => {
                if assistant.can_resume_priming(&system) {
                    self.stopped = Some(frame);
                    self.tried = None;
                }
                Err(cancelled_priming())
            }
            Err(e) => Err(e),
        }
    }
}

/// How a job's priming stopped by the job's own cancel ends the job (`cancelled`).
pub(super) fn cancelled_priming() -> AssistantError {
    AssistantError::Interrupted {
        step: "the rest of the frame's priming (the request was cancelled)".into(),
    }
}

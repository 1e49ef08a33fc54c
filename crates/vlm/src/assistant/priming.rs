//! Frame priming: while nothing is asked, a front end runs a camera frame through the tower
//! and prefills it after the cached system block as the start of a user turn
//! (`…<|im_start|>user\n<|vision_start|>…<|vision_end|>`), and keeps the state
//! ([`crate::residency::DecodeStates::save_primed_frame`]). A fresh turn about that frame with
//! the same system block then starts from it and prefills only its question and the assistant
//! header ([`Assistant::ask_primed`]).
//!
//! The split is exact: the chat template tokenizes the text between two special tokens on its
//! own, so the rows before `<|vision_end|>` do not depend on the question, and the question's
//! positions continue from the restored `maxPos` exactly as in one pass. Every graph call is a
//! boundary where the front end's `interrupt` is asked; a priming stopped there keeps its rows
//! and the state fed so far, and [`Assistant::resume_priming`] continues it as long as its
//! state is current or set aside ([`Assistant::stash_priming`]).
//!
//! A head whose last chunk would be short (at most half a chunk) is fed only up to its last
//! whole chunk: the short rest is kept as a [`Lead`] and goes in front of the question, in the
//! question's own padded chunk. A padded chunk costs a whole graph call whatever it holds, so
//! a short question pays nothing more and the priming one graph call less (fresher frames,
//! less BPU time); a question whose rows and the lead's pass a chunk pays one more.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{Assistant, AssistantError, Reply, Turn};
use crate::chat::{Pos3, Prompt, Segment, SystemOptions, UserTurn};
use crate::engine::{Backend, EngineError, ImageInput, Lead};
use crate::residency::{FrameState, Holder};
use crate::sampler::Sampler;
use crate::stream::Event;

static NEXT_PRIMING: AtomicU64 = AtomicU64::new(1);

/// A completed frame priming: the state after the system block and one image block.
#[derive(Debug, Clone)]
pub struct PrimedFrame {
    /// Its priming's id: while the backend's current state is this one
    /// ([`Holder::Priming`]) an ask needs no load.
    id: u64,
    /// The system block's text ([`crate::chat::ChatTemplate::system_text`]).
    system: String,
    /// Pinned on the device — until a newer priming is pinned instead —, or a snapshot.
    state: FrameState,
    /// Rows of the turn (system block, user header, image block), the lead's included.
    rows: usize,
    /// The head's rows not in the state (`[n, hidden]`) and their positions: fed in front of
    /// the question.
    lead_rows: Vec<f32>,
    lead_positions: Vec<Pos3>,
}

impl PrimedFrame {
    /// Host bytes held (the snapshot, if any, and the lead).
    pub fn size_bytes(&self) -> usize {
        self.state.size_bytes() + std::mem::size_of_val(self.lead_rows.as_slice())
    }

    /// Rows of the turn's head: the system block, the user header and the image block, the
    /// lead's included (those are not in the state yet: they go with the question).
    pub fn rows(&self) -> usize {
        self.rows
    }
}

/// A priming stopped between graph calls: the rows still to feed, valid while its state is
/// current or set aside ([`crate::residency::DecodeStates::holds_priming`]).
#[derive(Debug)]
pub(super) struct Partial {
    id: u64,
    system: String,
    rows: Vec<f32>,
    positions: Vec<Pos3>,
    /// Rows of `rows` already fed.
    fed: usize,
    /// Rows of `rows` the priming feeds; the rest is the lead.
    end: usize,
    /// Rows in the state before `rows` (the system block).
    base: usize,
}

/// How far a priming got.
#[derive(Debug)]
pub enum PrimingOutcome {
    Done(PrimedFrame),
    /// Stopped at a graph-call boundary; [`Assistant::resume_priming`] may continue it.
    Stopped,
}

/// The rendered turn cut right after its (single) image block's `<|vision_end|>`: the part a
/// priming feeds and the part the question adds.
fn split_after_image(prompt: Prompt) -> Result<(Prompt, Prompt), AssistantError> {
    let bad = || AssistantError::Turn("the turn has no image block to prime".into());
    let last = prompt
        .segments
        .iter()
        .rposition(|s| matches!(s, Segment::Image { .. }))
        .ok_or_else(bad)?;
    let mut head = prompt.segments;
    let mut tail = head.split_off(last + 1);
    match tail.first_mut() {
        Some(Segment::Tokens(ids)) if !ids.is_empty() => {
            let end = ids.remove(0);
            head.push(Segment::Tokens(vec![end]));
        }
        _ => return Err(bad()),
    }
    let starts_in_think = prompt.starts_in_think;
    Ok((
        Prompt {
            segments: head,
            starts_in_think: false,
        },
        Prompt {
            segments: tail,
            starts_in_think,
        },
    ))
}

/// How many of a head's `n` rows a priming feeds with `chunk`-row graph calls and padded
/// tails (0: no padded tail): all, but a last short chunk of at most half a chunk (the lead,
/// see the module docs).
fn fed_rows(n: usize, chunk: usize) -> usize {
    let whole = match chunk {
        0 => return n,
        c => n / c * c,
    };
    if whole > 0 && n - whole <= chunk / 2 {
        whole
    } else {
        n
    }
}

impl Assistant {
    /// The turn `text` with one image slot, split where a priming stops.
    fn split_turn(&self, text: &str, thinking: bool) -> Result<(Prompt, Prompt), AssistantError> {
        let slot = self
            .slot()
            .ok_or(AssistantError::Engine(EngineError::NoVision))?;
        let prompt = self.template.render_after_system(&UserTurn {
            text,
            images: vec![slot],
            thinking,
        })?;
        split_after_image(prompt)
    }

    /// Primes `image` as the start of a fresh user turn after the system block of `system`.
    /// `interrupt` is asked before every graph call (system block, tower, chunks); when it
    /// stops the work, the rows fed so far stay and [`Assistant::resume_priming`] can go on.
    /// Runs at the backend's priority: the caller lowers it for background work.
    pub fn prime_frame(
        &mut self,
        system: &SystemOptions,
        image: &ImageInput,
        interrupt: &mut dyn FnMut() -> bool,
    ) -> Result<PrimingOutcome, AssistantError> {
        let text = self.template.system_text(system)?;
        // A new priming supersedes a stopped one: whatever stops this one, the stopped state
        // left behind is never another image's.
        self.priming = None;
        self.states.drop_stash(&mut **self.engine.backend_mut());
        let Some(base) = self.load_prefix(system, interrupt)? else {
            return Ok(PrimingOutcome::Stopped);
        };
        let (head, _) = self.split_turn("", false)?;
        if interrupt() {
            return Ok(PrimingOutcome::Stopped);
        }
        self.states.touched();
        let (rows, positions) = self.engine.turn_rows(&head, std::slice::from_ref(image))?;
        let id = NEXT_PRIMING.fetch_add(1, Ordering::Relaxed);
        let backend = self.engine.backend();
        let chunk = backend.info().prefill_chunk;
        // The lead only pays where the question's tail goes as a padded chunk.
        let padded = chunk >= 2 && backend.pads_tail(chunk / 2);
        let end = fed_rows(positions.len(), if padded { chunk } else { 0 });
        // The tower left the state alone: it is the priming's start (the system block).
        self.states.now_holds(Holder::Priming(id));
        self.priming = Some(Partial {
            id,
            system: text,
            rows,
            positions,
            fed: 0,
            end,
            base,
        });
        self.feed_partial(interrupt)
    }

    /// Sets the BPU task priority of later graph runs (background primings run lower than
    /// asks); keeps a stopped priming resumable.
    pub fn set_priority(&mut self, priority: u8) {
        self.states
            .set_priority(&mut **self.engine.backend_mut(), priority);
    }

    /// Whether a stopped priming for the system block of `system` can be continued.
    pub fn can_resume_priming(&self, system: &SystemOptions) -> bool {
        let Some(p) = &self.priming else {
            return false;
        };
        self.states.holds_priming(p.id)
            && self.template.system_text(system).ok().as_deref() == Some(p.system.as_str())
    }

    /// Continues the stopped priming ([`Assistant::can_resume_priming`]); `Stopped` when
    /// there is none to continue or `interrupt` stops it again.
    pub fn resume_priming(
        &mut self,
        interrupt: &mut dyn FnMut() -> bool,
    ) -> Result<PrimingOutcome, AssistantError> {
        match &self.priming {
            Some(p) if self.states.holds_priming(p.id) => self.feed_partial(interrupt),
            _ => Ok(PrimingOutcome::Stopped),
        }
    }

    /// Sets the state of a stopped priming aside so it can be continued after another turn
    /// has used the backend (where: [`crate::residency::DecodeStates::stash_priming`]); a
    /// front end calls it before serving such a turn. Nothing to do when no stopped priming
    /// holds the backend.
    pub fn stash_priming(&mut self) -> Result<(), AssistantError> {
        if let Some(p) = &self.priming {
            self.states
                .stash_priming(&mut **self.engine.backend_mut(), p.id)?;
        }
        Ok(())
    }

    /// Feeds the stopped priming's remaining rows; keeps the state when all are in.
    fn feed_partial(
        &mut self,
        interrupt: &mut dyn FnMut() -> bool,
    ) -> Result<PrimingOutcome, AssistantError> {
        let Some(mut p) = self.priming.take() else {
            return Ok(PrimingOutcome::Stopped);
        };
        if !self
            .states
            .resume_priming(&mut **self.engine.backend_mut(), p.id)?
        {
            return Ok(PrimingOutcome::Stopped);
        }
        let h = self.info.hidden;
        let backend = self.engine.backend_mut();
        let before = backend.consumed();
        let done = p.fed >= p.end
            || backend.step_interruptible(
                &p.rows[p.fed * h..p.end * h],
                &p.positions[p.fed..p.end],
                interrupt,
            )?;
        if !done {
            p.fed += backend.consumed().saturating_sub(before);
            self.states.now_holds(Holder::Priming(p.id));
            self.priming = Some(p);
            return Ok(PrimingOutcome::Stopped);
        }
        let state = self
            .states
            .save_primed_frame(&mut **self.engine.backend_mut(), p.id)?;
        let rows = p.base + p.positions.len();
        let lead = p.positions.len() - p.end;
        let on_device = matches!(state, FrameState::Pinned(_));
        let bytes = state.size_bytes();
        tracing::debug!(rows, lead, on_device, bytes, "frame primed");
        Ok(PrimingOutcome::Done(PrimedFrame {
            id: p.id,
            system: p.system,
            state,
            rows,
            lead_rows: p.rows.split_off(p.end * h),
            lead_positions: p.positions.split_off(p.end),
        }))
    }

    /// Whether `turn` (fresh, about the primed frame) has the system block of `frame`, and
    /// the primed state is still to be had (one pinned on the device is replaced by the next
    /// priming pinned there, and gone with a reopened model).
    pub fn primed_frame_fits(&self, frame: &PrimedFrame, turn: &Turn) -> bool {
        let opts = SystemOptions {
            system: turn.system.clone(),
            tools: turn.tools.clone(),
        };
        self.states.frame_held(&frame.state)
            && self.template.system_text(&opts).ok().as_deref() == Some(frame.system.as_str())
    }

    /// Answers a fresh `turn` about the primed frame: its state is made current and only the
    /// question and the assistant header are prefilled. `turn.images` is not used (the image
    /// is in the state); `turn.image_keys` name it for a kept conversation. The reply equals
    /// [`Assistant::ask`] with that image, `prompt_tokens` included.
    pub fn ask_primed(
        &mut self,
        frame: &PrimedFrame,
        turn: &Turn,
        on_event: &mut dyn FnMut(Event),
    ) -> Result<Reply, AssistantError> {
        self.check_turn(turn)?;
        if !self.primed_frame_fits(frame, turn) {
            return Err(AssistantError::Turn(
                "the frame was primed for another system prompt or tools".into(),
            ));
        }
        let (_, prompt) = self.split_turn(&turn.text, turn.thinking)?;
        if !self.states.load_primed_frame(
            &mut **self.engine.backend_mut(),
            frame.id,
            &frame.state,
        )? {
            return Err(AssistantError::Turn(
                "the primed state is no longer pinned: a newer priming replaced it".into(),
            ));
        }
        let mut sampler = Sampler::new(turn.sampling.clone()).map_err(EngineError::from)?;
        sampler.record_probabilities(turn.token_probs);
        sampler.share_drawn(turn.drawn_log.clone());
        let seed = sampler.seed();
        let stream = self.stream_config(turn, prompt.starts_in_think);
        let lead = Lead {
            rows: &frame.lead_rows,
            positions: &frame.lead_positions,
        };
        let mut constraint = turn.json_schema.as_ref().map(|s| s.constraint(&stream.eos));
        let mut gen = self.engine.generate_after(
            lead,
            &prompt,
            &mut sampler,
            constraint
                .as_mut()
                .map(|c| c as &mut dyn crate::sampler::TokenConstraint),
            stream,
            on_event,
        )?;
        gen.completion.timings.prompt_tokens += frame.rows;
        let id = super::NEXT_CONVERSATION.fetch_add(1, Ordering::Relaxed);
        let images = turn.image_keys.iter().flatten().take(1).cloned().collect();
        let conversation = self.keep_conversation(&gen.completion, turn, id, 1, images)?;
        Ok(Reply {
            completion: gen.completion,
            conversation,
            seed,
            constraint: gen.constraint,
            token_probs: sampler.take_probabilities(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::ImageSlot;

    #[test]
    fn the_split_ends_the_head_at_the_vision_end_token() {
        let prompt = Prompt {
            segments: vec![
                Segment::Tokens(vec![1, 2, 3]),
                Segment::Image {
                    index: 0,
                    slot: ImageSlot::square(2),
                },
                Segment::Tokens(vec![9, 10, 11]),
            ],
            starts_in_think: true,
        };
        let (head, tail) = split_after_image(prompt).unwrap();
        assert_eq!(head.rows(), 3 + 4 + 1);
        assert_eq!(head.segments.last(), Some(&Segment::Tokens(vec![9])));
        assert!(!head.starts_in_think);
        assert_eq!(tail.segments, vec![Segment::Tokens(vec![10, 11])]);
        assert!(tail.starts_in_think);
        let text_only = Prompt {
            segments: vec![Segment::Tokens(vec![1])],
            starts_in_think: false,
        };
        assert!(split_after_image(text_only).is_err());
    }

    #[test]
    fn a_short_last_chunk_is_left_to_the_question() {
        assert_eq!(
            fed_rows(105, 32),
            96,
            "9 rows left for the question's chunk"
        );
        assert_eq!(fed_rows(96, 32), 96, "whole chunks only: nothing left");
        assert_eq!(
            fed_rows(120, 32),
            120,
            "24 rows: longer than half a chunk, fed"
        );
        assert_eq!(fed_rows(20, 32), 20, "less than one chunk: fed");
        assert_eq!(fed_rows(105, 0), 105, "no padded tail: all fed");
    }
}

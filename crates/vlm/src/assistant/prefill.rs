//! Latest-frame pre-fill: while nothing is asked, a front end runs a camera frame through the
//! tower and prefills it after the cached system block as the start of a user turn
//! (`…<|im_start|>user\n<|vision_start|>…<|vision_end|>`), and keeps the state. A fresh turn
//! about that frame with the same system block then restores it and prefills only its question
//! and the assistant header ([`Assistant::ask_prefilled`]).
//!
//! The split is exact: the chat template tokenizes the text between two special tokens on its
//! own, so the rows before `<|vision_end|>` do not depend on the question, and the question's
//! positions continue from the restored `maxPos` exactly as in one pass. Every graph call is a
//! boundary where the front end's `interrupt` is asked; a pre-fill stopped there keeps its rows
//! and the state fed so far, and [`Assistant::resume_prefill`] continues it as long as nothing
//! else has used the backend meanwhile.
//!
//! A head whose last chunk would be short (at most half a chunk) is fed only up to its last
//! whole chunk: the short rest is kept as a [`Lead`] and goes in front of the question, in the
//! question's own padded chunk. A padded chunk costs a whole graph call whatever it holds, so
//! a short question pays nothing more and the pre-fill one graph call less (fresher frames,
//! less BPU time); a question whose rows and the lead's pass a chunk pays one more.

use std::sync::atomic::{AtomicU64, Ordering};

use super::{Assistant, AssistantError, Conversation, Reply, Resident, Turn};
use crate::chat::{Pos3, Prompt, Segment, SystemOptions, UserTurn};
use crate::engine::{Backend, EngineError, ImageInput, Lead, StateBlob};
use crate::sampler::Sampler;
use crate::stream::{Event, FinishReason};

static NEXT_PREFILL: AtomicU64 = AtomicU64::new(1);

/// A completed pre-fill: the state after the system block and one image block.
#[derive(Debug, Clone)]
pub struct ImagePrefill {
    /// Its pre-fill's id: while the backend still holds this state (`Resident::Prefill(id)`)
    /// an ask needs no restore.
    id: u64,
    /// The system block's text ([`crate::chat::ChatTemplate::system_text`]).
    system: String,
    /// Kept on the device ([`Backend::keep`]) — until a newer pre-fill is kept instead —, or
    /// a snapshot where the backend keeps none.
    state: Stored,
    /// Rows of the turn (system block, user header, image block), the lead's included.
    rows: usize,
    /// The head's rows not in the state (`[n, hidden]`) and their positions: fed in front of
    /// the question.
    lead_rows: Vec<f32>,
    lead_positions: Vec<Pos3>,
}

impl ImagePrefill {
    /// Bytes held by the snapshot.
    pub fn size_bytes(&self) -> usize {
        let state = match &self.state {
            Stored::Device(_) => 0,
            Stored::Host(blob) => blob.size_bytes(),
        };
        state + std::mem::size_of_val(self.lead_rows.as_slice())
    }

    /// Rows of the turn's head: the system block, the user header and the image block, the
    /// lead's included (those are not in the state yet: they go with the question).
    pub fn rows(&self) -> usize {
        self.rows
    }
}

/// A pre-fill stopped between graph calls: the rows still to feed, valid while the backend's
/// state is its own (`Resident::Prefill(id)`).
#[derive(Debug)]
pub(super) struct Partial {
    id: u64,
    system: String,
    rows: Vec<f32>,
    positions: Vec<Pos3>,
    /// Rows of `rows` already fed.
    fed: usize,
    /// Rows of `rows` the pre-fill feeds; the rest is the lead.
    end: usize,
    /// Rows in the state before `rows` (the system block).
    base: usize,
    /// The state where it stopped, kept ([`Assistant::park_prefill`]) before another turn
    /// used the backend.
    parked: Option<Parked>,
}

/// Where a completed pre-fill's state is.
#[derive(Debug, Clone)]
enum Stored {
    Device(u64),
    Host(StateBlob),
}

/// Where a stopped pre-fill's state is kept while another turn uses the backend.
#[derive(Debug)]
enum Parked {
    /// On the device ([`Backend::park`]), copied out only if the set is needed.
    Device(u64),
    Host(StateBlob),
}

/// How far a pre-fill got.
#[derive(Debug)]
pub enum PrefillOutcome {
    Done(ImagePrefill),
    /// Stopped at a graph-call boundary; [`Assistant::resume_prefill`] may continue it.
    Stopped,
}

/// The rendered turn cut right after its (single) image block's `<|vision_end|>`: the part a
/// pre-fill feeds and the part the question adds.
fn split_after_image(prompt: Prompt) -> Result<(Prompt, Prompt), AssistantError> {
    let bad = || AssistantError::Turn("the turn has no image block to pre-fill".into());
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

/// How many of a head's `n` rows a pre-fill feeds with `chunk`-row graph calls and padded
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
    /// The turn `text` with one image slot, split where a pre-fill stops.
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

    /// Pre-fills `image` as the start of a fresh user turn after the system block of
    /// `system`. `interrupt` is asked before every graph call (system block, tower, chunks);
    /// when it stops the work, the rows fed so far stay and [`Assistant::resume_prefill`] can
    /// go on. Runs at the backend's priority: the caller lowers it for background work.
    pub fn prefill_image(
        &mut self,
        system: &SystemOptions,
        image: &ImageInput,
        interrupt: &mut dyn FnMut() -> bool,
    ) -> Result<PrefillOutcome, AssistantError> {
        let text = self.template.system_text(system)?;
        // A new pre-fill supersedes a stopped one: whatever stops this one, the stopped state
        // left behind is never another image's.
        match self.partial.take().and_then(|p| p.parked) {
            Some(Parked::Host(blob)) => self.spare_state = Some(blob),
            Some(Parked::Device(_)) => self.engine.backend_mut().release_parked(),
            None => {}
        }
        let Some(base) = self.load_prefix(system, interrupt)? else {
            return Ok(PrefillOutcome::Stopped);
        };
        let (head, _) = self.split_turn("", false)?;
        if interrupt() {
            return Ok(PrefillOutcome::Stopped);
        }
        self.resident = Resident::Unknown;
        let (rows, positions) = self.engine.turn_rows(&head, std::slice::from_ref(image))?;
        let id = NEXT_PREFILL.fetch_add(1, Ordering::Relaxed);
        let backend = self.engine.backend();
        let chunk = backend.info().prefill_chunk;
        // The lead only pays where the question's tail goes as a padded chunk.
        let padded = chunk >= 2 && backend.pads_tail(chunk / 2);
        let end = fed_rows(positions.len(), if padded { chunk } else { 0 });
        // The tower left the state alone: it is the pre-fill's start (the system block).
        self.resident = Resident::Prefill(id);
        self.partial = Some(Partial {
            id,
            system: text,
            rows,
            positions,
            fed: 0,
            end,
            base,
            parked: None,
        });
        self.feed_partial(interrupt)
    }

    /// Sets the BPU task priority of later graph runs (background pre-fills run lower than
    /// asks); keeps a stopped pre-fill resumable.
    pub fn set_priority(&mut self, priority: u8) {
        self.engine.backend_mut().set_priority(priority);
    }

    /// Whether a stopped pre-fill for the system block of `system` can be continued.
    pub fn can_resume_prefill(&self, system: &SystemOptions) -> bool {
        let Some(p) = &self.partial else {
            return false;
        };
        // `partial` is dropped when its pre-fill completes, so a resident id is a stopped one.
        (self.resident == Resident::Prefill(p.id) || p.parked.is_some())
            && self.template.system_text(system).ok().as_deref() == Some(p.system.as_str())
    }

    /// Continues the stopped pre-fill ([`Assistant::can_resume_prefill`]); `Stopped` when
    /// there is none to continue or `interrupt` stops it again.
    pub fn resume_prefill(
        &mut self,
        interrupt: &mut dyn FnMut() -> bool,
    ) -> Result<PrefillOutcome, AssistantError> {
        match &self.partial {
            Some(p) if self.resident == Resident::Prefill(p.id) || p.parked.is_some() => {
                self.feed_partial(interrupt)
            }
            _ => Ok(PrefillOutcome::Stopped),
        }
    }

    /// Keeps the state of a stopped pre-fill so it can be continued after another turn has
    /// used the backend — parked on the device where it is ([`Backend::park`]: no copy unless
    /// its set is needed, and then not before the turn's first graph call), else a snapshot;
    /// a front end calls it before serving such a turn. Nothing to do when no stopped pre-fill
    /// holds the backend.
    pub fn park_prefill(&mut self) -> Result<(), AssistantError> {
        let Some(p) = &mut self.partial else {
            return Ok(());
        };
        if p.parked.is_none() && self.resident == Resident::Prefill(p.id) {
            let backend = self.engine.backend_mut();
            p.parked = Some(match backend.park() {
                Some(id) => Parked::Device(id),
                None => {
                    self.snapshots += 1;
                    Parked::Host(match self.spare_state.take() {
                        Some(spare) => backend.snapshot_reusing(spare)?,
                        None => backend.snapshot()?,
                    })
                }
            });
        }
        Ok(())
    }

    /// Feeds the stopped pre-fill's remaining rows; snapshots the state when all are in.
    fn feed_partial(
        &mut self,
        interrupt: &mut dyn FnMut() -> bool,
    ) -> Result<PrefillOutcome, AssistantError> {
        let Some(mut p) = self.partial.take() else {
            return Ok(PrefillOutcome::Stopped);
        };
        if self.resident != Resident::Prefill(p.id) {
            self.resident = Resident::Unknown;
            match p.parked.take() {
                Some(Parked::Device(id)) => {
                    if !self.engine.backend_mut().unpark(id)? {
                        return Ok(PrefillOutcome::Stopped);
                    }
                }
                Some(Parked::Host(blob)) => {
                    let restored = self.engine.backend_mut().restore(&blob);
                    self.spare_state = Some(blob);
                    restored?;
                    self.restores += 1;
                }
                None => return Ok(PrefillOutcome::Stopped),
            }
        }
        // The state moves on from where it was parked.
        match p.parked.take() {
            Some(Parked::Host(blob)) => self.spare_state = Some(blob),
            Some(Parked::Device(_)) => self.engine.backend_mut().release_parked(),
            None => {}
        }
        self.resident = Resident::Unknown;
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
            self.resident = Resident::Prefill(p.id);
            self.partial = Some(p);
            return Ok(PrefillOutcome::Stopped);
        }
        // Kept on the device, no snapshot is taken: the ask that waits for this last graph
        // call does not wait for a copy too.
        let kept = backend.keep();
        self.kept_prefill = kept;
        let state = match kept {
            Some(id) => Stored::Device(id),
            None => {
                self.snapshots += 1;
                Stored::Host(backend.snapshot()?)
            }
        };
        let rows = p.base + p.positions.len();
        let lead = p.positions.len() - p.end;
        let (on_device, bytes) = match &state {
            Stored::Device(_) => (true, 0),
            Stored::Host(blob) => (false, blob.size_bytes()),
        };
        tracing::debug!(rows, lead, on_device, bytes, "image pre-filled");
        self.resident = Resident::Prefill(p.id);
        Ok(PrefillOutcome::Done(ImagePrefill {
            id: p.id,
            system: p.system,
            state,
            rows,
            lead_rows: p.rows.split_off(p.end * h),
            lead_positions: p.positions.split_off(p.end),
        }))
    }

    /// Whether `turn` (fresh, about the pre-filled image) has the system block of `prefill`,
    /// and the pre-filled state is still to be had (one kept on the device is replaced by the
    /// next pre-fill kept there, and gone with a reopened model).
    pub fn prefill_fits(&self, prefill: &ImagePrefill, turn: &Turn) -> bool {
        let opts = SystemOptions {
            system: turn.system.clone(),
            tools: turn.tools.clone(),
        };
        let held = match prefill.state {
            Stored::Device(id) => self.kept_prefill == Some(id),
            Stored::Host(_) => true,
        };
        held && self.template.system_text(&opts).ok().as_deref() == Some(prefill.system.as_str())
    }

    /// Answers a fresh `turn` about the pre-filled image: its state is restored and only the
    /// question and the assistant header are prefilled. `turn.images` is not used (the image
    /// is in the state); `turn.image_keys` name it for a kept conversation. The reply equals
    /// [`Assistant::ask`] with that image, `prompt_tokens` included.
    pub fn ask_prefilled(
        &mut self,
        prefill: &ImagePrefill,
        turn: &Turn,
        on_event: &mut dyn FnMut(Event),
    ) -> Result<Reply, AssistantError> {
        self.check_prefilled_turn(turn)?;
        if !self.prefill_fits(prefill, turn) {
            return Err(AssistantError::Turn(
                "the pre-fill was made for another system prompt or tools".into(),
            ));
        }
        let (_, prompt) = self.split_turn(&turn.text, turn.thinking)?;
        // Right after the pre-fill the backend still holds its state: no copy back needed.
        if self.resident != Resident::Prefill(prefill.id) {
            self.resident = Resident::Unknown;
            let backend = self.engine.backend_mut();
            // Kept on the device: a switch of cache sets; else the copy back.
            match &prefill.state {
                Stored::Device(id) => {
                    if !backend.resume_kept(*id) {
                        return Err(AssistantError::Turn(
                            "the pre-filled state is no longer kept: a newer pre-fill replaced it"
                                .into(),
                        ));
                    }
                }
                Stored::Host(blob) => {
                    backend.restore(blob)?;
                    self.restores += 1;
                }
            }
        }
        self.resident = Resident::Unknown;
        let mut sampler = Sampler::new(turn.sampling.clone()).map_err(EngineError::from)?;
        let seed = sampler.seed();
        let stream = self.stream_config(turn, prompt.starts_in_think);
        let lead = Lead {
            rows: &prefill.lead_rows,
            positions: &prefill.lead_positions,
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
        gen.completion.timings.prompt_tokens += prefill.rows;
        let finished = matches!(
            gen.completion.finish_reason,
            FinishReason::Stop | FinishReason::Length
        );
        let conversation = if finished && turn.keep {
            let state = self.engine.backend_mut().snapshot()?;
            self.snapshots += 1;
            let id = super::NEXT_CONVERSATION.fetch_add(1, Ordering::Relaxed);
            self.resident = Resident::Conversation(id);
            Some(Conversation {
                id,
                state,
                turns: 1,
                images: turn.image_keys.iter().flatten().take(1).cloned().collect(),
            })
        } else {
            None
        };
        Ok(Reply {
            completion: gen.completion,
            conversation,
            seed,
            constraint: gen.constraint,
        })
    }

    /// What [`Assistant::ask`] refuses before touching the state, for a pre-filled turn.
    fn check_prefilled_turn(&self, turn: &Turn) -> Result<(), AssistantError> {
        if turn.text.trim().is_empty() {
            return Err(AssistantError::Turn("the prompt is empty".into()));
        }
        turn.check_json_schema()?;
        match &turn.json_schema {
            Some(s) if s.vocab() != self.info.vocab => {
                Err(crate::structured::SchemaError::Vocabulary {
                    schema: s.vocab(),
                    model: self.info.vocab,
                }
                .into())
            }
            _ => Ok(()),
        }
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

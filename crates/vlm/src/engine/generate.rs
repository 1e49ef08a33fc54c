//! The generation driver: a rendered turn ([`Prompt`]) → embedding rows with image rows
//! spliced in at their M-RoPE positions → [`Backend::step_interruptible`] (chunked) → the
//! decode loop (logits → [`Sampler`] → [`TokenStream`] → events) until eos / stop string /
//! max new tokens, the window end (`length`), cancel or deadline.
//!
//! Constrained output (structured answers): a [`TokenConstraint`] masks each step of the
//! answer ([`Engine::generate_constrained`]); a think block before the answer is free but for
//! the stop ids, and the answer ends (`stop`) as soon as the constraint admits nothing more.

use std::sync::Arc;

use tokenizers::Tokenizer;

use crate::chat::{ImageSlot, Pos3, Prompt, Segment};
use crate::sampler::{Sampler, TokenConstraint, TokenMask};
use crate::stream::{Action, Completion, Event, FinishReason, StreamConfig, TokenStream};
use crate::vision::{preprocess, PixelValues, RgbImage};

use super::backend::Backend;
use super::error::EngineError;

/// One image of a turn, in the order of the prompt's image slots.
#[derive(Debug, Clone, PartialEq)]
pub enum ImageInput {
    /// Any RGB8 frame; resized to the tower's bucket (Pillow bicubic) and patchified.
    Rgb(RgbImage),
    /// Already preprocessed tower input `[n_patch, row_len]` of the backend's bucket.
    Pixels(PixelValues),
}

/// Embedding rows `[n, hidden]` of a turn and their positions.
type TurnRows = (Vec<f32>, Vec<Pos3>);

/// Rows not in the state yet that go ahead of a prompt's own rows, in the same step: the
/// tail of a primed turn that would have taken a padded chunk of its own
/// ([`Engine::generate_after`]). The prompt's positions continue after them.
#[derive(Debug, Clone, Copy, Default)]
pub struct Lead<'a> {
    /// `[positions.len(), hidden]`.
    pub rows: &'a [f32],
    pub positions: &'a [Pos3],
}

/// Result of [`Engine::generate`].
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    pub completion: Completion,
    /// Raw logits that chose each sampled token (eos and a stop token included), when
    /// [`DecodeOptions::keep_logits`] was set; empty otherwise.
    pub step_logits: Vec<Vec<f32>>,
    /// How a constrained answer ended; `None` for free text.
    pub constraint: Option<ConstraintOutcome>,
}

/// How an answer under a [`TokenConstraint`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConstraintOutcome {
    /// The output is a complete value: it parses and satisfies the constraint.
    Complete,
    /// Generation ended before the value did (token limit, window end, cancel, timeout): the
    /// text is a prefix of a value and does not parse. Front ends answer `success=false` with
    /// the error `incomplete` and the partial text — never a success that does not parse.
    Incomplete,
}

/// What a generation prefills: `lead`, then `prompt` with its `images`.
struct Input<'a> {
    lead: Lead<'a>,
    prompt: &'a Prompt,
    images: &'a [ImageInput],
}

/// What chooses each token: the sampler, masked per step by an optional constraint.
struct Pick<'a> {
    sampler: &'a mut Sampler,
    constraint: Option<&'a mut dyn TokenConstraint>,
}

/// Per-request knobs of the decode loop beyond sampling and streaming.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DecodeOptions {
    /// Keep each step's logits (`generate --json`, tests); costs `vocab × 4` bytes per token.
    pub keep_logits: bool,
}

/// Builds a [`Prompt`] from raw token ids in the HF form, where each maximal run of `pad`
/// (`<|image_pad|>`) is one square image of `side × side` merged rows (`generate --hf` /
/// `--package`).
pub fn prompt_from_ids(ids: &[u32], pad: u32, side: u32) -> Result<Prompt, EngineError> {
    let mut segments = Vec::new();
    let mut text = Vec::new();
    let mut i = 0;
    let mut index = 0;
    let slot = ImageSlot::square(side);
    while i < ids.len() {
        if ids[i] != pad {
            text.push(ids[i]);
            i += 1;
            continue;
        }
        let run = ids[i..].iter().take_while(|&&x| x == pad).count();
        if run != slot.rows() {
            return Err(EngineError::Image {
                index,
                reason: format!(
                    "slot at token {i} has {run} pad tokens, the bucket gives {}",
                    slot.rows()
                ),
            });
        }
        if !text.is_empty() {
            segments.push(Segment::Tokens(std::mem::take(&mut text)));
        }
        segments.push(Segment::Image { index, slot });
        index += 1;
        i += run;
    }
    if !text.is_empty() {
        segments.push(Segment::Tokens(text));
    }
    Ok(Prompt {
        segments,
        starts_in_think: false,
    })
}

/// The runtime over one backend: owns the decode state of one conversation at a time.
pub struct Engine<B: Backend> {
    backend: B,
    tokenizer: Arc<Tokenizer>,
}

impl<B: Backend> std::fmt::Debug for Engine<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("info", self.backend.info())
            .field("consumed", &self.backend.consumed())
            .finish_non_exhaustive()
    }
}

impl<B: Backend> Engine<B> {
    pub fn new(backend: B, tokenizer: Arc<Tokenizer>) -> Self {
        Self { backend, tokenizer }
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Direct access (reset, snapshot, restore, teacher forcing).
    pub fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
    }

    pub fn tokenizer(&self) -> &Arc<Tokenizer> {
        &self.tokenizer
    }

    /// Embedding rows and positions of a turn, images encoded and spliced; positions start
    /// at the backend's next text position. Fails with `ContextOverflow` before running the
    /// tower when the turn cannot fit.
    pub fn turn_rows(
        &mut self,
        prompt: &Prompt,
        images: &[ImageInput],
    ) -> Result<(Vec<f32>, Vec<Pos3>), EngineError> {
        // Never `None`: nothing asks to stop.
        self.turn_rows_until(Lead::default(), prompt, images, &mut || false)
            .map(Option::unwrap_or_default)
    }

    /// [`Engine::turn_rows`] that asks `interrupt` before each tower run (a graph call) and
    /// returns `None` when it says stop.
    fn turn_rows_until(
        &mut self,
        lead: Lead<'_>,
        prompt: &Prompt,
        images: &[ImageInput],
        interrupt: &mut dyn FnMut() -> bool,
    ) -> Result<Option<TurnRows>, EngineError> {
        let needed = prompt.rows() + lead.positions.len();
        let left = self.backend.context_left();
        if needed > left {
            return Err(EngineError::ContextOverflow { needed, left });
        }
        let slots = prompt
            .segments
            .iter()
            .filter(|s| matches!(s, Segment::Image { .. }))
            .count();
        if slots != images.len() {
            return Err(EngineError::Image {
                index: slots.min(images.len()),
                reason: format!(
                    "the prompt has {slots} image slots but {} images were given",
                    images.len()
                ),
            });
        }
        let h = self.backend.info().hidden;
        if lead.rows.len() != lead.positions.len() * h {
            return Err(EngineError::Shape {
                what: "lead rows [n, hidden]",
                expected: lead.positions.len() * h,
                found: lead.rows.len(),
            });
        }
        let mut rows = Vec::with_capacity(needed * h);
        rows.extend_from_slice(lead.rows);
        for seg in &prompt.segments {
            match seg {
                Segment::Tokens(ids) => self.backend.embed(ids, &mut rows)?,
                Segment::Image { index, slot } => {
                    if interrupt() {
                        return Ok(None);
                    }
                    let img = images.get(*index).ok_or_else(|| EngineError::Image {
                        index: *index,
                        reason: "no image for this slot".into(),
                    })?;
                    let encoded = self.encode(*index, *slot, img)?;
                    rows.extend_from_slice(&encoded);
                }
            }
        }
        // The prompt continues after the lead as it would after the lead in the state.
        let start = lead
            .positions
            .iter()
            .map(|p| p.max() + 1)
            .fold(self.backend.next_position(), u32::max);
        let (own, _) = prompt.positions(start);
        let mut positions = lead.positions.to_vec();
        positions.extend(own);
        Ok(Some((rows, positions)))
    }

    fn encode(
        &mut self,
        index: usize,
        slot: ImageSlot,
        img: &ImageInput,
    ) -> Result<Vec<f32>, EngineError> {
        let spec = self.backend.info().vision.ok_or(EngineError::NoVision)?;
        let g = spec.geometry;
        if slot.grid_h as usize != g.merged_side() || slot.grid_w as usize != g.merged_side() {
            return Err(EngineError::Image {
                index,
                reason: format!(
                    "slot grid {}x{} but the tower's {} px bucket gives {}x{}",
                    slot.grid_h,
                    slot.grid_w,
                    g.side,
                    g.merged_side(),
                    g.merged_side()
                ),
            });
        }
        let _span = tracing::debug_span!("encode_image", index).entered();
        let rows = match img {
            ImageInput::Rgb(rgb) => {
                let pv = preprocess(rgb, &g, spec.mean, spec.std)?;
                self.backend.encode_image(&pv)?
            }
            ImageInput::Pixels(pv) => self.backend.encode_image(pv)?,
        };
        let want = slot.rows() * self.backend.info().hidden;
        if rows.len() != want {
            return Err(EngineError::Shape {
                what: "vision tower rows [n_tokens, hidden]",
                expected: want,
                found: rows.len(),
            });
        }
        Ok(rows)
    }

    /// Feeds a turn (prefill only, e.g. a system prefix or a replayed turn). Returns false
    /// when `interrupt` stopped it between graph runs (tower runs included).
    pub fn prefill(
        &mut self,
        prompt: &Prompt,
        images: &[ImageInput],
        interrupt: &mut dyn FnMut() -> bool,
    ) -> Result<bool, EngineError> {
        self.prefill_after(Lead::default(), prompt, images, interrupt)
    }

    fn prefill_after(
        &mut self,
        lead: Lead<'_>,
        prompt: &Prompt,
        images: &[ImageInput],
        interrupt: &mut dyn FnMut() -> bool,
    ) -> Result<bool, EngineError> {
        let Some((rows, positions)) = self.turn_rows_until(lead, prompt, images, interrupt)? else {
            return Ok(false);
        };
        if positions.is_empty() {
            return Ok(true);
        }
        let _span = tracing::debug_span!("prefill", rows = positions.len()).entered();
        self.backend
            .step_interruptible(&rows, &positions, interrupt)
    }

    /// Answers a turn: prefill, then [`Engine::decode`]. `stream.prompt_tokens` is set to
    /// the turn's rows.
    pub fn generate(
        &mut self,
        prompt: &Prompt,
        images: &[ImageInput],
        sampler: &mut Sampler,
        stream: StreamConfig,
        opts: DecodeOptions,
        on_event: &mut dyn FnMut(Event),
    ) -> Result<Generation, EngineError> {
        let pick = Pick {
            sampler,
            constraint: None,
        };
        let input = Input {
            lead: Lead::default(),
            prompt,
            images,
        };
        self.generate_with(input, pick, stream, opts, on_event)
    }

    /// [`Engine::generate`] with the answer restricted by `constraint`: from the answer's
    /// first token (after a think block, which is free but may not end the reply) each step
    /// draws only ids the constraint allows, and decoding stops (`stop`) as soon as it admits
    /// nothing more. [`Generation::constraint`] says whether the value was completed. The
    /// constraint's stop ids must be `stream.eos`.
    pub fn generate_constrained(
        &mut self,
        prompt: &Prompt,
        images: &[ImageInput],
        sampler: &mut Sampler,
        constraint: &mut dyn TokenConstraint,
        stream: StreamConfig,
        on_event: &mut dyn FnMut(Event),
    ) -> Result<Generation, EngineError> {
        let pick = Pick {
            sampler,
            constraint: Some(constraint),
        };
        let opts = DecodeOptions::default();
        let input = Input {
            lead: Lead::default(),
            prompt,
            images,
        };
        self.generate_with(input, pick, stream, opts, on_event)
    }

    /// [`Engine::generate`] (or [`Engine::generate_constrained`] with `constraint`) of a
    /// text-only `prompt` whose rows follow `lead` in one step.
    pub fn generate_after<'a>(
        &mut self,
        lead: Lead<'_>,
        prompt: &Prompt,
        sampler: &'a mut Sampler,
        constraint: Option<&'a mut dyn TokenConstraint>,
        stream: StreamConfig,
        on_event: &mut dyn FnMut(Event),
    ) -> Result<Generation, EngineError> {
        let pick = Pick {
            sampler,
            constraint,
        };
        let opts = DecodeOptions::default();
        let input = Input {
            lead,
            prompt,
            images: &[],
        };
        self.generate_with(input, pick, stream, opts, on_event)
    }

    fn generate_with(
        &mut self,
        input: Input<'_>,
        pick: Pick<'_>,
        mut stream: StreamConfig,
        opts: DecodeOptions,
        on_event: &mut dyn FnMut(Event),
    ) -> Result<Generation, EngineError> {
        let Input {
            lead,
            prompt,
            images,
        } = input;
        stream.prompt_tokens = prompt.rows();
        let ts = TokenStream::new(self.tokenizer.clone(), stream);
        let done = self.prefill_after(lead, prompt, images, &mut || ts.interrupted().is_some())?;
        if !done {
            let reason = ts.interrupted().unwrap_or(FinishReason::Cancelled);
            let completion = ts.finish(reason, on_event)?;
            return Ok(Generation {
                completion,
                step_logits: Vec::new(),
                constraint: pick.constraint.map(|_| ConstraintOutcome::Incomplete),
            });
        }
        self.decode_stream(ts, pick, opts, on_event)
    }

    /// The decode loop from the state's last logits (after a prefill or a restore).
    pub fn decode(
        &mut self,
        sampler: &mut Sampler,
        stream: StreamConfig,
        opts: DecodeOptions,
        on_event: &mut dyn FnMut(Event),
    ) -> Result<Generation, EngineError> {
        let ts = TokenStream::new(self.tokenizer.clone(), stream);
        let pick = Pick {
            sampler,
            constraint: None,
        };
        self.decode_stream(ts, pick, opts, on_event)
    }

    /// [`Engine::decode`] under `constraint`, as [`Engine::generate_constrained`] decodes.
    pub fn decode_constrained(
        &mut self,
        sampler: &mut Sampler,
        constraint: &mut dyn TokenConstraint,
        stream: StreamConfig,
        on_event: &mut dyn FnMut(Event),
    ) -> Result<Generation, EngineError> {
        let ts = TokenStream::new(self.tokenizer.clone(), stream);
        let pick = Pick {
            sampler,
            constraint: Some(constraint),
        };
        self.decode_stream(ts, pick, DecodeOptions::default(), on_event)
    }

    fn decode_stream(
        &mut self,
        mut ts: TokenStream,
        pick: Pick<'_>,
        opts: DecodeOptions,
        on_event: &mut dyn FnMut(Event),
    ) -> Result<Generation, EngineError> {
        let Pick {
            sampler,
            mut constraint,
        } = pick;
        let mut step_logits = Vec::new();
        let mut row = Vec::with_capacity(self.backend.info().hidden);
        let mut mask = constraint
            .as_ref()
            .map(|_| TokenMask::new(self.backend.info().vocab));
        let reason = loop {
            if let Some(r) = ts.interrupted() {
                break r;
            }
            let logits = self.backend.last_logits().ok_or(EngineError::NoLogits)?;
            // The answer's tokens are the constraint's; a think block before it may be
            // anything but its end, so a constrained reply always reaches its answer.
            let answering = ts.answering();
            let tok = match (constraint.as_deref_mut(), mask.as_mut()) {
                (Some(c), Some(m)) => {
                    if answering {
                        c.next_mask(m)?;
                    } else {
                        m.allow_all();
                        ts.eos().iter().for_each(|&e| m.forbid(e));
                    }
                    sampler.sample_masked(logits, m)?
                }
                _ => sampler.sample(logits)?,
            };
            if opts.keep_logits {
                step_logits.push(logits.to_vec());
            }
            // The value is complete and nothing may follow it.
            let mut complete = false;
            if let (true, Some(c)) = (answering, constraint.as_deref_mut()) {
                c.accept(tok)?;
                complete = c.is_finished();
            }
            match ts.push(tok, on_event)? {
                // A value that ends exactly at the token limit is a stop, not a cut.
                Action::Finish(FinishReason::Length) if complete => break FinishReason::Stop,
                Action::Finish(r) => break r,
                Action::Feed => {}
            }
            if self.backend.context_left() == 0 {
                break if complete {
                    FinishReason::Stop
                } else {
                    FinishReason::Length
                };
            }
            sampler.accept(tok);
            row.clear();
            self.backend.embed(&[tok], &mut row)?;
            let pos = Pos3::text(self.backend.next_position());
            self.backend.step(&row, &[pos])?;
            if complete {
                // Fed first, so a continued conversation holds the whole value, as it holds
                // an answer that the model's eos ended.
                break FinishReason::Stop;
            }
        };
        let outcome = constraint.map(|c| {
            if c.is_complete() {
                ConstraintOutcome::Complete
            } else {
                ConstraintOutcome::Incomplete
            }
        });
        let completion = ts.finish(reason, on_event)?;
        tracing::debug!(
            tokens = completion.tokens.len(),
            finish = %completion.finish_reason,
            constraint = ?outcome,
            "generation done"
        );
        Ok(Generation {
            completion,
            step_logits,
            constraint: outcome,
        })
    }
}

//! A user turn with its settings ([`Turn`]), what it answers ([`Reply`]), and the
//! conversation a kept turn leaves to continue from ([`Conversation`]).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;

use super::ImageKey;
use crate::engine::{ConstraintOutcome, ImageInput, StateBlob};
use crate::sampler::{DrawnLog, SamplingParams};
use crate::stream::Completion;
use crate::structured::{JsonSchema, SchemaError};

/// One user turn with its generation settings.
#[derive(Debug, Clone)]
pub struct Turn {
    pub text: String,
    /// Images of the turn, in order (each becomes one image block before the text).
    pub images: Vec<ImageInput>,
    /// `image_keys[i]` names `images[i]` (missing or `None`: no identity, always added). An
    /// image whose key the continued conversation already holds is not added again: the turn
    /// adds only its text and the answer refers to the earlier image block (`frames.rs`).
    pub image_keys: Vec<Option<ImageKey>>,
    pub thinking: bool,
    /// System prompt of a fresh conversation; `None` = the model's own. Ignored when
    /// continuing a conversation (its system block is already in the state).
    pub system: Option<String>,
    /// OpenAI-style tool list, rendered into the system block of a fresh conversation.
    pub tools: Vec<Value>,
    pub sampling: SamplingParams,
    pub max_new_tokens: usize,
    pub stop: Vec<String>,
    /// Stop at the model's eos ids.
    pub use_default_stop: bool,
    pub deadline: Option<Instant>,
    pub cancel: Option<Arc<AtomicBool>>,
    /// TTFT is measured from here (the request's arrival).
    pub started: Instant,
    /// Park the finished conversation ([`Reply::conversation`]) so a later turn can continue
    /// it. A snapshot copies the whole decode state out of device memory (an INVALIDATE of
    /// every cache buffer, tens of MB on the 4B), so only a turn that may be continued asks.
    pub keep: bool,
    /// Structured output: the answer is a JSON value valid under this schema, compiled by
    /// [`super::Assistant::json_schemas`] — a front end compiles it before queueing, so a bad schema
    /// is refused at once. Tools and stop strings cannot go with it
    /// ([`Turn::check_json_schema`]). The front end also decides, per request: thinking off
    /// unless the request turns it on (then the think block is free and the constraint starts
    /// at the answer's first token), and the repetition / frequency / presence penalties off
    /// unless the request sets them (JSON repeats its punctuation). [`Reply::constraint`]
    /// says whether the value was completed.
    pub json_schema: Option<Arc<JsonSchema>>,
    /// Record each generated token's probability ([`Reply::token_probs`]); costs one pass
    /// over the allowed ids per token, so only a request that scores its answer asks
    /// (detections, `crate::grounding`).
    pub token_probs: bool,
    /// With [`Turn::token_probs`]: each drawn token and its probability also go here as they
    /// are drawn, so a reader scores a partial answer while it streams (a detect's feedback).
    pub drawn_log: Option<DrawnLog>,
}

impl Turn {
    /// A text turn with greedy decoding and the model's defaults.
    pub fn new(text: impl Into<String>, max_new_tokens: usize) -> Self {
        Self {
            text: text.into(),
            images: Vec::new(),
            image_keys: Vec::new(),
            thinking: false,
            system: None,
            tools: Vec::new(),
            sampling: SamplingParams::default(),
            max_new_tokens,
            stop: Vec::new(),
            use_default_stop: true,
            deadline: None,
            cancel: None,
            started: Instant::now(),
            keep: false,
            json_schema: None,
            token_probs: false,
            drawn_log: None,
        }
    }

    /// What cannot go with a JSON schema in one turn: tools (Qwen3.5's tool calls are XML,
    /// not JSON) and stop strings (they could cut the value). `Ok` without a schema.
    pub fn check_json_schema(&self) -> Result<(), SchemaError> {
        if self.json_schema.is_none() {
            return Ok(());
        }
        if !self.tools.is_empty() {
            return Err(SchemaError::Conflict("tools"));
        }
        if !self.stop.is_empty() {
            return Err(SchemaError::Conflict("stop strings"));
        }
        Ok(())
    }
}

/// A conversation saved between turns: the whole decode state after its last answer.
#[derive(Debug, Clone)]
pub struct Conversation {
    pub(super) id: u64,
    pub(super) state: StateBlob,
    pub(super) turns: usize,
    /// Keys of the images prefilled in `state`, in the order they were added.
    pub(super) images: Vec<ImageKey>,
}

impl Conversation {
    /// Bytes held by the snapshot.
    pub fn size_bytes(&self) -> usize {
        self.state.size_bytes()
    }

    /// Turns answered so far.
    pub fn turns(&self) -> usize {
        self.turns
    }

    /// Window slots the conversation occupies.
    pub fn consumed(&self) -> Option<usize> {
        self.state.consumed()
    }

    /// Keys of the images the conversation holds ([`Turn::image_keys`]).
    pub fn images(&self) -> &[ImageKey] {
        &self.images
    }
}

/// The outcome of one turn.
#[derive(Debug, Clone)]
pub struct Reply {
    pub completion: Completion,
    /// The conversation including this turn; `None` when the turn was not kept
    /// ([`Turn::keep`]) or did not finish (cancel, timeout), so a session continues from its
    /// previous state.
    pub conversation: Option<Conversation>,
    /// Seed the sampler used (reproduce a sampled answer with it).
    pub seed: u64,
    /// With a [`Turn::json_schema`]: whether the answer is a complete value. `Incomplete`
    /// (cut by `max_new_tokens` or the window end) is a failure with the partial text:
    /// `finish_reason` `length`, error `incomplete`. `None` for free text.
    pub constraint: Option<ConstraintOutcome>,
    /// With [`Turn::token_probs`]: the probability of each generated token, aligned with
    /// `completion.tokens` (one more, the eos, when the model ended the answer); see
    /// [`crate::sampler::probability`]. Empty otherwise.
    pub token_probs: Vec<f32>,
}

impl Reply {
    /// A structured answer that ended before its value did ([`Reply::constraint`]).
    pub fn is_incomplete(&self) -> bool {
        self.constraint == Some(ConstraintOutcome::Incomplete)
    }
}

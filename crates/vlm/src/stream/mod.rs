//! Streaming: a driver-agnostic state machine fed one sampled token at a time.
//!
//! The engine calls [`TokenStream::push`] after each sampled token; the answer says whether
//! to feed the token back ([`Action::Feed`]) or to stop ([`Action::Finish`]), and text comes
//! out through the `emit` callback as it becomes final. Then [`TokenStream::finish`] flushes
//! and returns the [`Completion`]. Between steps the engine may call
//! [`TokenStream::interrupted`] (cancel flag, deadline) — e.g. between prefill chunks.
//!
//! Text pipeline per token: incremental detokenisation (decode the window since the last
//! emitted boundary, emit only the new suffix, and only when it does not end in U+FFFD, so
//! half a UTF-8 character never goes out; at the end the dangling bytes are flushed as
//! U+FFFD) → stop strings (a suffix that could still start a stop string is held back; the
//! match and everything after it is dropped) → for the `qwen3.5` dialect, the `<think>`
//! split and `<tool_call>` capture (markers are never emitted as text; partial markers are
//! held back). The completion's texts are the concatenation of what was emitted, so the
//! stream and the final answer are identical by construction.
//!
//! A constrained answer (structured output, [`StreamConfig::verbatim_answer`]) passes through
//! verbatim: no markers are looked for in it and nothing is trimmed, and a think block before
//! it ends only at the `</think>` token, so the answer starts at a token boundary — where the
//! decode loop starts the constraint ([`TokenStream::answering`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokenizers::Tokenizer;

use crate::chat::{parse_tool_call, ToolCall};

mod detok;
mod split;

use detok::{Detok, StopFilter};
use split::{Out, Splitter};

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FinishReason {
    /// eos token or stop string.
    Stop,
    /// max new tokens or the end of the context window.
    Length,
    Cancelled,
    Timeout,
    Error,
}

impl FinishReason {
    /// The wire name (`stop`, `length`, `cancelled`, `timeout`, `error`).
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::Cancelled => "cancelled",
            Self::Timeout => "timeout",
            Self::Error => "error",
        }
    }
}

impl std::fmt::Display for FinishReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Errors of the stream.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    #[error("detokenising: {0}")]
    Decode(String),
}

/// What to do with the token just pushed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Feed it to the model and continue.
    Feed,
    /// Do not feed it; call [`TokenStream::finish`] with this reason.
    Finish(FinishReason),
}

/// Output of the stream.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// New final text; `reasoning` = inside `<think>`.
    Text { text: String, reasoning: bool },
    /// A complete `<tool_call>` block, parsed.
    ToolCall(ToolCall),
}

/// Stopping and splitting settings of one generation.
#[derive(Debug, Clone)]
pub struct StreamConfig {
    /// Stop ids (never fed back, never shown).
    pub eos: Vec<u32>,
    /// Stop strings, matched on the decoded text.
    pub stop: Vec<String>,
    pub max_new_tokens: usize,
    pub deadline: Option<Instant>,
    pub cancel: Option<Arc<AtomicBool>>,
    /// `<think>` split (the `qwen3.5` dialect): reasoning goes out with `reasoning: true`,
    /// markers are dropped, leading and trailing whitespace of each part is trimmed.
    pub think_split: bool,
    /// The prompt's opener ends inside `<think>` ([`crate::chat::Prompt::starts_in_think`]).
    pub starts_in_think: bool,
    /// Capture `<tool_call>` blocks as [`Event::ToolCall`] instead of answer text.
    pub tool_calls: bool,
    /// Tool list of the request, for typing XML parameters.
    pub tools: Vec<Value>,
    /// The answer is a constrained value (structured output), kept verbatim: no markers are
    /// looked for in it (a JSON string may hold `<think>` or `<tool_call>`), nothing is
    /// trimmed, and a think block ends only at the token [`StreamConfig::think_end`] — never
    /// at text that spells `</think>` — so the answer starts exactly at a token. Stop strings
    /// are not used with it (they could cut the value).
    pub verbatim_answer: bool,
    /// The `</think>` token id, which ends the think block of a `verbatim_answer`.
    pub think_end: Option<u32>,
    /// Rows of the prompt, for the timings.
    pub prompt_tokens: usize,
    /// When the request started (TTFT is measured from here).
    pub started: Instant,
}

impl StreamConfig {
    /// Plain settings: nothing split, no limits but `max_new_tokens`.
    pub fn new(eos: Vec<u32>, max_new_tokens: usize) -> Self {
        Self {
            eos,
            stop: Vec::new(),
            max_new_tokens,
            deadline: None,
            cancel: None,
            think_split: false,
            starts_in_think: false,
            tool_calls: false,
            tools: Vec::new(),
            verbatim_answer: false,
            think_end: None,
            prompt_tokens: 0,
            started: Instant::now(),
        }
    }
}

/// Token counts and speeds of one generation.
#[derive(Debug, Clone, PartialEq)]
pub struct Timings {
    pub prompt_tokens: usize,
    /// Generated tokens that entered the reply (an eos is not counted).
    pub completion_tokens: usize,
    /// From [`StreamConfig::started`] to the first sampled token.
    pub ttft: Option<Duration>,
    /// Sampled tokens after the first, per second between the first and the last.
    pub decode_tokens_per_s: Option<f64>,
    pub total: Duration,
}

/// The finished generation.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    /// Answer text (everything emitted with `reasoning: false`).
    pub text: String,
    /// Reasoning text (everything emitted with `reasoning: true`).
    pub reasoning: String,
    pub tool_calls: Vec<ToolCall>,
    /// `<tool_call>` blocks that did not parse, raw.
    pub invalid_tool_calls: Vec<String>,
    pub finish_reason: FinishReason,
    /// Generated ids, eos excluded (the stop-string token included).
    pub tokens: Vec<u32>,
    pub timings: Timings,
}

/// The per-generation streaming state machine.
pub struct TokenStream {
    tokenizer: Arc<Tokenizer>,
    cfg: StreamConfig,
    detok: Detok,
    stop: StopFilter,
    split: Splitter,
    answer: String,
    reasoning: String,
    blocks: Vec<String>,
    tool_calls: Vec<ToolCall>,
    invalid_tool_calls: Vec<String>,
    sampled: usize,
    first_at: Option<Instant>,
    last_at: Option<Instant>,
    finished: Option<FinishReason>,
}

impl std::fmt::Debug for TokenStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenStream")
            .field("tokens", &self.detok.ids().len())
            .field("finished", &self.finished)
            .finish_non_exhaustive()
    }
}

impl TokenStream {
    pub fn new(tokenizer: Arc<Tokenizer>, cfg: StreamConfig) -> Self {
        let split = Splitter::new(
            cfg.think_split,
            cfg.tool_calls,
            cfg.verbatim_answer,
            cfg.starts_in_think,
        );
        let stop = StopFilter::new(&cfg.stop);
        Self {
            tokenizer,
            cfg,
            detok: Detok::default(),
            stop,
            split,
            answer: String::new(),
            reasoning: String::new(),
            blocks: Vec::new(),
            tool_calls: Vec::new(),
            invalid_tool_calls: Vec::new(),
            sampled: 0,
            first_at: None,
            last_at: None,
            finished: None,
        }
    }

    /// Cancel flag or deadline, if either has fired.
    pub fn interrupted(&self) -> Option<FinishReason> {
        if self
            .cfg
            .cancel
            .as_ref()
            .is_some_and(|c| c.load(Ordering::Relaxed))
        {
            return Some(FinishReason::Cancelled);
        }
        if self.cfg.deadline.is_some_and(|d| Instant::now() >= d) {
            return Some(FinishReason::Timeout);
        }
        None
    }

    /// Tokens generated so far (eos excluded).
    pub fn tokens(&self) -> &[u32] {
        self.detok.ids()
    }

    /// The stop ids ([`StreamConfig::eos`]).
    pub fn eos(&self) -> &[u32] {
        &self.cfg.eos
    }

    /// The next token belongs to the answer: not to a think block (nor to a tool call).
    pub fn answering(&self) -> bool {
        self.split.answering()
    }

    /// Takes one sampled token.
    pub fn push(&mut self, id: u32, emit: &mut dyn FnMut(Event)) -> Result<Action, StreamError> {
        if let Some(r) = self.finished {
            return Ok(Action::Finish(r));
        }
        let now = Instant::now();
        self.first_at.get_or_insert(now);
        self.last_at = Some(now);
        self.sampled += 1;
        if self.cfg.eos.contains(&id) {
            return Ok(self.end(FinishReason::Stop));
        }
        let ends_think =
            self.cfg.verbatim_answer && self.split.thinking() && self.cfg.think_end == Some(id);
        let hit = if ends_think {
            // What the detokeniser holds is reasoning; the marker's own text is never shown.
            let tail = self.detok.flush(&self.tokenizer)?;
            let hit = self.forward(&tail, emit);
            self.detok.skip(id);
            self.split.end_think();
            hit
        } else {
            match self.detok.step(&self.tokenizer, id)? {
                Some(text) => self.forward(&text, emit),
                None => false,
            }
        };
        if hit {
            return Ok(self.end(FinishReason::Stop));
        }
        if self.detok.ids().len() >= self.cfg.max_new_tokens {
            return Ok(self.end(FinishReason::Length));
        }
        if let Some(r) = self.interrupted() {
            return Ok(self.end(r));
        }
        Ok(Action::Feed)
    }

    fn end(&mut self, r: FinishReason) -> Action {
        self.finished = Some(r);
        Action::Finish(r)
    }

    /// Text through the stop filter and the splitter; true when a stop string matched.
    fn forward(&mut self, text: &str, emit: &mut dyn FnMut(Event)) -> bool {
        let (ready, hit) = self.stop.push(text);
        let mut out = Out {
            emit: &mut *emit,
            answer: &mut self.answer,
            reasoning: &mut self.reasoning,
            blocks: &mut self.blocks,
        };
        self.split.push(&ready, &mut out);
        self.drain_blocks(emit);
        hit
    }

    fn drain_blocks(&mut self, emit: &mut dyn FnMut(Event)) {
        for block in std::mem::take(&mut self.blocks) {
            match parse_tool_call(&block, &self.cfg.tools) {
                Ok(call) => {
                    self.tool_calls.push(call.clone());
                    emit(Event::ToolCall(call));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "unparseable tool call kept raw");
                    self.invalid_tool_calls.push(block);
                }
            }
        }
    }

    /// Flushes what is held back (unless a stop string ended the text) and returns the
    /// completion. `reason` is the one [`Action::Finish`] gave, or the engine's own
    /// (`Length` at the window end, `Error`, or an interruption between steps).
    pub fn finish(
        mut self,
        reason: FinishReason,
        emit: &mut dyn FnMut(Event),
    ) -> Result<Completion, StreamError> {
        if !self.stop.hit() {
            let tail = self.detok.flush(&self.tokenizer)?;
            let (mut ready, hit) = self.stop.push(&tail);
            if !hit {
                ready.push_str(&self.stop.flush());
            }
            let mut out = Out {
                emit,
                answer: &mut self.answer,
                reasoning: &mut self.reasoning,
                blocks: &mut self.blocks,
            };
            self.split.push(&ready, &mut out);
            self.split.flush(&mut out);
        }
        self.drain_blocks(emit);
        let total = self.cfg.started.elapsed();
        let decode_tokens_per_s = match (self.first_at, self.last_at) {
            (Some(a), Some(b)) if self.sampled >= 2 && b > a => {
                Some((self.sampled - 1) as f64 / (b - a).as_secs_f64())
            }
            _ => None,
        };
        let timings = Timings {
            prompt_tokens: self.cfg.prompt_tokens,
            completion_tokens: self.detok.ids().len(),
            ttft: self
                .first_at
                .map(|t| t.saturating_duration_since(self.cfg.started)),
            decode_tokens_per_s,
            total,
        };
        Ok(Completion {
            text: self.answer,
            reasoning: self.reasoning,
            tool_calls: self.tool_calls,
            invalid_tool_calls: self.invalid_tool_calls,
            finish_reason: reason,
            tokens: self.detok.into_ids(),
            timings,
        })
    }
}

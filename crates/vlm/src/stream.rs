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

/// Incremental detokeniser over a window of ids.
#[derive(Debug, Default)]
struct Detok {
    ids: Vec<u32>,
    prefix: usize,
    read: usize,
}

impl Detok {
    fn decode(tok: &Tokenizer, ids: &[u32]) -> Result<String, StreamError> {
        tok.decode(ids, false)
            .map_err(|e| StreamError::Decode(e.to_string()))
    }

    fn delta(&self, tok: &Tokenizer) -> Result<(String, usize), StreamError> {
        let before = Self::decode(tok, &self.ids[self.prefix..self.read])?;
        let now = Self::decode(tok, &self.ids[self.prefix..])?;
        Ok((now, before.len()))
    }

    fn step(&mut self, tok: &Tokenizer, id: u32) -> Result<Option<String>, StreamError> {
        self.ids.push(id);
        let (now, start) = self.delta(tok)?;
        if now.len() > start && !now.ends_with('\u{FFFD}') {
            if let Some(d) = now.get(start..) {
                let d = d.to_string();
                self.prefix = self.read;
                self.read = self.ids.len();
                return Ok(Some(d));
            }
        }
        Ok(None)
    }

    /// Takes `id` without its text: the window restarts after it.
    fn skip(&mut self, id: u32) {
        self.ids.push(id);
        self.prefix = self.ids.len();
        self.read = self.ids.len();
    }

    /// Everything not yet emitted; an incomplete UTF-8 tail comes out as U+FFFD.
    fn flush(&mut self, tok: &Tokenizer) -> Result<String, StreamError> {
        if self.read == self.ids.len() {
            return Ok(String::new());
        }
        let (now, start) = self.delta(tok)?;
        self.prefix = self.read;
        self.read = self.ids.len();
        Ok(now.get(start..).map(str::to_string).unwrap_or_default())
    }
}

/// Holds back text that could still become a stop string.
#[derive(Debug, Default)]
struct StopFilter {
    stops: Vec<String>,
    pending: String,
    hit: bool,
}

impl StopFilter {
    /// Returns the text that is final now, and whether a stop string matched.
    fn push(&mut self, text: &str) -> (String, bool) {
        if self.hit {
            return (String::new(), true);
        }
        self.pending.push_str(text);
        if self.stops.is_empty() {
            return (std::mem::take(&mut self.pending), false);
        }
        let first = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min();
        if let Some(m) = first {
            let out = self.pending[..m].to_string();
            self.pending.clear();
            self.hit = true;
            return (out, true);
        }
        let hold = (0..self.pending.len())
            .filter(|&i| self.pending.is_char_boundary(i))
            .find(|&i| {
                let tail = &self.pending[i..];
                self.stops.iter().any(|s| s.starts_with(tail))
            })
            .unwrap_or(self.pending.len());
        let out = self.pending[..hold].to_string();
        self.pending.drain(..hold);
        (out, false)
    }

    fn flush(&mut self) -> String {
        if self.hit {
            return String::new();
        }
        std::mem::take(&mut self.pending)
    }
}

const THINK: &str = "<think>";
const THINK_END: &str = "</think>";
const TOOL: &str = "<tool_call>";
const TOOL_END: &str = "</tool_call>";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Channel {
    Answer,
    Think,
    Tool,
}

/// Routes final text to answer / reasoning / tool blocks.
#[derive(Debug)]
struct Splitter {
    think_split: bool,
    tool_calls: bool,
    /// [`StreamConfig::verbatim_answer`]: no markers at all; the think block ends at a token.
    verbatim: bool,
    channel: Channel,
    pending: String,
    tool_buf: String,
    /// Trailing whitespace of the current channel, emitted only if more text follows.
    ws: String,
    answer_started: bool,
    reasoning_started: bool,
}

/// Sink for the splitter: emitted text and tool blocks.
struct Out<'a> {
    emit: &'a mut dyn FnMut(Event),
    answer: &'a mut String,
    reasoning: &'a mut String,
    blocks: &'a mut Vec<String>,
}

impl Splitter {
    fn markers(&self) -> &'static [&'static str] {
        if self.verbatim {
            return &[];
        }
        match (self.channel, self.think_split, self.tool_calls) {
            (Channel::Think, ..) => &[THINK_END],
            (Channel::Tool, ..) => &[TOOL_END],
            (Channel::Answer, true, true) => &[THINK, THINK_END, TOOL],
            (Channel::Answer, true, false) => &[THINK, THINK_END],
            (Channel::Answer, false, true) => &[TOOL],
            (Channel::Answer, false, false) => &[],
        }
    }

    fn push(&mut self, text: &str, out: &mut Out<'_>) {
        self.pending.push_str(text);
        loop {
            let markers = self.markers();
            let found = markers
                .iter()
                .filter_map(|m| self.pending.find(m).map(|i| (i, *m)))
                .min_by_key(|(i, _)| *i);
            match found {
                Some((i, marker)) => {
                    let before = self.pending[..i].to_string();
                    self.pending.drain(..i + marker.len());
                    self.route(&before, out);
                    self.switch(marker, out);
                }
                None => {
                    // Hold back a tail that could still grow into a marker.
                    let hold = self
                        .pending
                        .rfind('<')
                        .filter(|&i| {
                            let tail = &self.pending[i..];
                            markers.iter().any(|m| m.starts_with(tail))
                        })
                        .unwrap_or(self.pending.len());
                    let ready = self.pending[..hold].to_string();
                    self.pending.drain(..hold);
                    self.route(&ready, out);
                    return;
                }
            }
        }
    }

    fn switch(&mut self, marker: &str, out: &mut Out<'_>) {
        self.ws.clear();
        match (self.channel, marker) {
            (Channel::Answer, THINK) => self.channel = Channel::Think,
            (Channel::Think, THINK_END) => self.channel = Channel::Answer,
            (Channel::Answer, TOOL) => self.channel = Channel::Tool,
            (Channel::Tool, TOOL_END) => {
                out.blocks.push(std::mem::take(&mut self.tool_buf));
                self.channel = Channel::Answer;
            }
            // A stray `</think>` in the answer: dropped, never shown.
            _ => {}
        }
    }

    fn route(&mut self, text: &str, out: &mut Out<'_>) {
        if text.is_empty() {
            return;
        }
        match self.channel {
            Channel::Tool => self.tool_buf.push_str(text),
            Channel::Answer | Channel::Think if !self.think_split => {
                emit_text(text.to_string(), false, out)
            }
            Channel::Answer if self.verbatim => emit_text(text.to_string(), false, out),
            ch => {
                let reasoning = ch == Channel::Think;
                let started = if reasoning {
                    &mut self.reasoning_started
                } else {
                    &mut self.answer_started
                };
                let mut t = text;
                if !*started {
                    t = t.trim_start();
                    if t.is_empty() {
                        return;
                    }
                    *started = true;
                }
                let body = t.trim_end();
                if body.is_empty() {
                    self.ws.push_str(t);
                    return;
                }
                let mut s = std::mem::take(&mut self.ws);
                s.push_str(body);
                self.ws.push_str(&t[body.len()..]);
                emit_text(s, reasoning, out);
            }
        }
    }

    /// The `</think>` token of a verbatim answer: the think block ends here.
    fn end_think(&mut self) {
        if self.channel == Channel::Think {
            self.ws.clear();
            self.channel = Channel::Answer;
        }
    }

    /// End of text: a partial marker is plain text; an open tool block is kept raw.
    fn flush(&mut self, out: &mut Out<'_>) {
        let rest = std::mem::take(&mut self.pending);
        self.route(&rest, out);
        if self.channel == Channel::Tool {
            out.blocks.push(std::mem::take(&mut self.tool_buf));
        }
        if !self.think_split {
            let ws = std::mem::take(&mut self.ws);
            if !ws.is_empty() {
                emit_text(ws, false, out);
            }
        }
    }
}

fn emit_text(text: String, reasoning: bool, out: &mut Out<'_>) {
    if text.is_empty() {
        return;
    }
    if reasoning {
        out.reasoning.push_str(&text);
    } else {
        out.answer.push_str(&text);
    }
    (out.emit)(Event::Text { text, reasoning });
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
            .field("tokens", &self.detok.ids.len())
            .field("finished", &self.finished)
            .finish_non_exhaustive()
    }
}

impl TokenStream {
    pub fn new(tokenizer: Arc<Tokenizer>, cfg: StreamConfig) -> Self {
        let stops = cfg.stop.iter().filter(|s| !s.is_empty()).cloned().collect();
        let split = Splitter {
            think_split: cfg.think_split,
            tool_calls: cfg.tool_calls,
            verbatim: cfg.verbatim_answer,
            channel: if cfg.think_split && cfg.starts_in_think {
                Channel::Think
            } else {
                Channel::Answer
            },
            pending: String::new(),
            tool_buf: String::new(),
            ws: String::new(),
            answer_started: false,
            reasoning_started: false,
        };
        Self {
            tokenizer,
            cfg,
            detok: Detok::default(),
            stop: StopFilter {
                stops,
                ..StopFilter::default()
            },
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
        &self.detok.ids
    }

    /// The stop ids ([`StreamConfig::eos`]).
    pub fn eos(&self) -> &[u32] {
        &self.cfg.eos
    }

    /// The next token belongs to the answer: not to a think block (nor to a tool call).
    pub fn answering(&self) -> bool {
        self.split.channel == Channel::Answer
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
        let ends_think = self.cfg.verbatim_answer
            && self.split.channel == Channel::Think
            && self.cfg.think_end == Some(id);
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
        if self.detok.ids.len() >= self.cfg.max_new_tokens {
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
        if !self.stop.hit {
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
            completion_tokens: self.detok.ids.len(),
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
            tokens: self.detok.ids,
            timings,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_filter_holds_back_prefixes_and_cuts_matches() {
        let mut f = StopFilter {
            stops: vec!["STOP".into(), "\n\nUser:".into()],
            ..Default::default()
        };
        assert_eq!(f.push("hello S"), ("hello ".into(), false));
        assert_eq!(f.push("T"), (String::new(), false));
        assert_eq!(f.push("x"), ("STx".into(), false));
        assert_eq!(f.push("a\n"), ("a".into(), false));
        assert_eq!(f.push("\nUs"), (String::new(), false));
        assert_eq!(f.push("er: more"), (String::new(), true));
        assert_eq!(f.flush(), "");
        let mut f = StopFilter {
            stops: vec!["é!".into()],
            ..Default::default()
        };
        assert_eq!(f.push("caf"), ("caf".into(), false));
        assert_eq!(f.push("é"), (String::new(), false));
        assert_eq!(f.flush(), "é");
    }

    /// Runs the splitter over `text` cut into pieces of `step` chars.
    fn split(text: &str, step: usize, starts_in_think: bool) -> (String, String, Vec<String>) {
        let mut sp = Splitter {
            think_split: true,
            tool_calls: true,
            verbatim: false,
            channel: if starts_in_think {
                Channel::Think
            } else {
                Channel::Answer
            },
            pending: String::new(),
            tool_buf: String::new(),
            ws: String::new(),
            answer_started: false,
            reasoning_started: false,
        };
        let (mut answer, mut reasoning, mut blocks) = (String::new(), String::new(), Vec::new());
        let mut sink = |e: Event| {
            if let Event::Text { text, .. } = e {
                assert!(
                    !text.contains("think>") && !text.contains("tool_call>"),
                    "{text:?}"
                );
            }
        };
        let mut out = Out {
            emit: &mut sink,
            answer: &mut answer,
            reasoning: &mut reasoning,
            blocks: &mut blocks,
        };
        let chars: Vec<char> = text.chars().collect();
        for piece in chars.chunks(step) {
            sp.push(&piece.iter().collect::<String>(), &mut out);
        }
        sp.flush(&mut out);
        (answer, reasoning, blocks)
    }

    #[test]
    fn markers_split_across_pieces_are_recognised() {
        let text = "<think>\nLook at <b> the cup.\n</think>\n\nA red cup <3.\n<tool_call>\n<function=f>\n</function>\n</tool_call>";
        for step in 1..=9 {
            let (answer, reasoning, blocks) = split(text, step, false);
            assert_eq!(reasoning, "Look at <b> the cup.", "step {step}");
            assert_eq!(answer, "A red cup <3.", "step {step}");
            assert_eq!(blocks, vec!["\n<function=f>\n</function>\n".to_string()]);
        }
        let (answer, reasoning, _) = split("plan</think>done <thi", 2, true);
        assert_eq!((answer.as_str(), reasoning.as_str()), ("done <thi", "plan"));
    }
}

//! Structured output: answers constrained to a JSON Schema, so that a planner always gets a
//! value it can parse — whatever the model, a random one included.
//!
//! The grammar engine is `llguidance` (the one llama.cpp and other servers use); this module
//! fits it to the decode loop's [`TokenConstraint`] seam:
//!
//! - [`JsonSchemas`], one per model: llguidance's token table built from our own
//!   `tokenizers::Tokenizer` (no second load of `tokenizer.json`: the decoder, the added tokens
//!   and the vocabulary go to `llguidance::token_bytes_from_tokenizer_json` from memory), the
//!   compilation of schema texts, and a small LRU of compiled schemas per text. `Send + Sync`:
//!   a front end compiles — and refuses — a request's schema before queueing it.
//! - [`JsonSchema`], a compiled schema; [`JsonSchema::constraint`] starts one answer.
//! - [`JsonConstraint`], the state of one answer: a [`TokenConstraint`].
//!
//! The JSON is compact (`whitespace_flexible: false`, separators `,` and `:`): no whitespace
//! between the value's tokens, so a schema whose strings (`maxLength`), arrays (`maxItems`)
//! and numbers are bounded completes within a bounded number of tokens. The end of the value
//! is a synthetic token one past the model's vocabulary, which [`JsonConstraint`] maps onto
//! the request's stop ids: the model's eos is allowed only where the value is complete.
//!
//! What cannot be enforced is refused with a [`SchemaError`] naming the reason — text that is
//! not JSON, keywords llguidance does not implement (it is not lenient), references outside
//! the document, schemas beyond its parser limits, and `x-guidance` (which would change the
//! output format) — never ignored.
#![forbid(unsafe_code)]

use std::collections::VecDeque;
use std::panic::catch_unwind;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use llguidance::api::{StopReason, TopLevelGrammar};
use llguidance::earley::SlicedBiasComputer;
use llguidance::toktrie::InferenceCapabilities;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{JsonCompileOptions, Matcher, ParserFactory};
use serde_json::{json, Value};
use tokenizers::Tokenizer;

use crate::sampler::{ConstraintError, TokenConstraint, TokenMask};

/// Compiled schemas kept per model (by schema text, least recently used dropped first).
pub const SCHEMA_CACHE: usize = 16;

/// Why a schema (or a turn with one) is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    #[error("the JSON schema is empty")]
    Empty,
    #[error("the JSON schema is not valid JSON: {0}")]
    NotJson(String),
    #[error("a JSON schema is an object or a boolean, not {0}")]
    NotASchema(&'static str),
    /// A key that would change what is enforced or how the output is written.
    #[error("the JSON schema sets `{0}`, which a request may not set (the output format is fixed: compact JSON)")]
    Reserved(&'static str),
    /// Something llguidance cannot enforce: an unimplemented keyword, a reference outside
    /// the document, a schema no value satisfies, a malformed keyword value.
    #[error("the JSON schema cannot be enforced: {0}")]
    Unsupported(String),
    /// Beyond llguidance's parser limits (grammar size, lexer states, fuel).
    #[error("the JSON schema is too complex for the grammar engine: {0}")]
    TooComplex(String),
    /// The tokenizer cannot be turned into llguidance's token table.
    #[error("constrained decoding is not available for this tokenizer: {0}")]
    Tokenizer(String),
    /// Something in the same turn that cannot go with a schema: `"tools"` (tool calls are
    /// XML, not JSON) or `"stop strings"` (they could cut the value).
    #[error("a JSON schema cannot be combined with {0} in the same turn")]
    Conflict(&'static str),
    /// A schema compiled for another model.
    #[error("the schema was compiled for a vocabulary of {schema} ids, this model has {model}")]
    Vocabulary { schema: usize, model: usize },
}

/// Error texts of llguidance that mean "over a limit" rather than "cannot express".
const LIMIT_WORDS: [&str; 6] = [
    "too big",
    "too large",
    "too complex",
    "fuel",
    "limit",
    "exceeded",
];

fn classify(message: String) -> SchemaError {
    let lower = message.to_lowercase();
    if LIMIT_WORDS.iter().any(|w| lower.contains(w)) {
        SchemaError::TooComplex(message)
    } else {
        SchemaError::Unsupported(message)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock left plain data (a matcher, a list): still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// llguidance's view of our tokenizer: the token table as a trie, and tokenisation of forced
/// bytes by the model's own tokenizer where that reproduces them (the trie's greedy split
/// otherwise: invalid UTF-8, text the NFC normaliser would change, special-token text).
struct VocabEnv {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl TokenizerEnv for VocabEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        if let Ok(text) = std::str::from_utf8(s) {
            if let Ok(enc) = self.tokenizer.encode(text, false) {
                let ids = enc.get_ids();
                let vocab = self.trie.vocab_size() as u32;
                if ids.iter().all(|&id| id < vocab) && self.trie.decode_raw(ids) == s {
                    return ids.to_vec();
                }
            }
        }
        self.trie.greedy_tokenize(s)
    }
}

/// The bytes of every id below `vocab` (ids the tokenizer does not name are empty and never
/// allowed), then the synthetic end token (empty) at `vocab`.
fn token_table(tok: &Tokenizer, vocab: usize) -> Result<Vec<Vec<u8>>, SchemaError> {
    let decoder = match tok.get_decoder() {
        Some(d) => serde_json::to_value(d).map_err(|e| SchemaError::Tokenizer(e.to_string()))?,
        None => Value::Null,
    };
    let added: Vec<Value> = tok
        .get_added_tokens_decoder()
        .into_iter()
        .map(|(id, t)| json!({"id": id, "content": t.content, "special": t.special}))
        .collect();
    let table = json!({
        "decoder": decoder,
        "added_tokens": added,
        "model": {"vocab": tok.get_vocab(false)},
    });
    let mut words = catch_unwind(|| llguidance::token_bytes_from_tokenizer_json(&table))
        .map_err(|_| SchemaError::Tokenizer("the token table builder panicked".into()))?
        .map_err(|e| SchemaError::Tokenizer(e.to_string()))?;
    if words.len() > vocab {
        tracing::warn!(
            tokenizer = words.len(),
            model = vocab,
            "the tokenizer names ids past the model's vocabulary; they are never allowed"
        );
    }
    words.resize(vocab, Vec::new());
    words.push(Vec::new());
    Ok(words)
}

fn build_factory(tok: &Arc<Tokenizer>, vocab: usize) -> Result<Arc<ParserFactory>, SchemaError> {
    let t0 = std::time::Instant::now();
    let words = token_table(tok, vocab)?;
    let end = vocab as TokenId;
    let trie = catch_unwind(|| TokTrie::from(&TokRxInfo::new(words.len() as u32, end), &words))
        .map_err(|_| SchemaError::Tokenizer("the token trie builder panicked".into()))?;
    let env: TokEnv = Arc::new(VocabEnv {
        trie,
        tokenizer: Arc::clone(tok),
    });
    let mut factory = ParserFactory::new(&env, InferenceCapabilities::default(), &slices())
        .map_err(|e| SchemaError::Tokenizer(e.to_string()))?;
    // A library prints nothing; warnings are read from the matcher and logged. Errors name
    // the reason without the parser's state dump (they reach clients).
    factory.quiet();
    factory.limits_mut().verbose_errors = false;
    tracing::info!(
        vocab,
        ms = t0.elapsed().as_millis() as u64,
        "constrained decoding: token table built"
    );
    Ok(Arc::new(factory))
}

/// Token-set slices llguidance precomputes: its JSON ones (whitespace, string bodies of up
/// to 10, 30 or any characters) plus shorter bodies. A string position with `r` characters
/// left under `maxLength` can take a whole precomputed slice only if the slice's strings fit
/// in `r`; without the short ones the last 9 characters of every bounded string cost a walk
/// of the whole token trie (several ms over 248k tokens).
fn slices() -> Vec<String> {
    let mut s = SlicedBiasComputer::json_slices();
    for k in [1, 2, 3, 4, 6, 8] {
        s.push(format!(r#"[^"\\\x00-\x1F\x7F]{{1,{k}}}"#));
    }
    s
}

/// The JSON options of every schema: compact output, strict keywords.
fn json_options() -> JsonCompileOptions {
    JsonCompileOptions {
        item_separator: ",".into(),
        key_separator: ":".into(),
        whitespace_flexible: false,
        whitespace_pattern: None,
        lenient: false,
        ..JsonCompileOptions::default()
    }
}

/// Compiles JSON schemas for one model (its tokenizer and vocabulary) and keeps the last
/// [`SCHEMA_CACHE`] compiled ones. The token table is built on first use ([`JsonSchemas::prepare`]
/// builds it ahead). Shareable across threads.
pub struct JsonSchemas {
    tokenizer: Arc<Tokenizer>,
    vocab: usize,
    factory: OnceLock<Result<Arc<ParserFactory>, SchemaError>>,
    cache: Mutex<VecDeque<(String, Arc<JsonSchema>)>>,
}

impl std::fmt::Debug for JsonSchemas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsonSchemas")
            .field("vocab", &self.vocab)
            .field("ready", &self.factory.get().is_some())
            .field("cached", &lock(&self.cache).len())
            .finish()
    }
}

impl JsonSchemas {
    /// For a model whose logits rows have `vocab` entries and whose tokens `tokenizer` names.
    pub fn new(tokenizer: Arc<Tokenizer>, vocab: usize) -> Self {
        Self {
            tokenizer,
            vocab,
            factory: OnceLock::new(),
            cache: Mutex::new(VecDeque::new()),
        }
    }

    /// The model's vocabulary (the length of a logits row).
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    fn factory(&self) -> Result<&Arc<ParserFactory>, SchemaError> {
        self.factory
            .get_or_init(|| build_factory(&self.tokenizer, self.vocab))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Builds the token table now (about a second for the 248k Qwen3.5 vocabulary in a
    /// release build), so the first request with a schema does not wait for it.
    pub fn prepare(&self) -> Result<(), SchemaError> {
        self.factory().map(|_| ())
    }

    /// Compiles `text` (JSON Schema), or returns the cached compilation of the same text.
    /// Refusals name their reason; nothing in the schema is silently ignored.
    pub fn compile(&self, text: &str) -> Result<Arc<JsonSchema>, SchemaError> {
        if text.trim().is_empty() {
            return Err(SchemaError::Empty);
        }
        if let Some(hit) = self.cached(text) {
            return Ok(hit);
        }
        let mut schema: Value =
            serde_json::from_str(text).map_err(|e| SchemaError::NotJson(e.to_string()))?;
        match &mut schema {
            Value::Object(o) if o.contains_key("x-guidance") => {
                return Err(SchemaError::Reserved("x-guidance"))
            }
            Value::Object(_) => {}
            Value::Bool(true) => schema = json!({}),
            Value::Bool(false) => {
                return Err(SchemaError::Unsupported(
                    "the schema `false` admits no value".into(),
                ))
            }
            Value::Null => return Err(SchemaError::NotASchema("null")),
            Value::Number(_) => return Err(SchemaError::NotASchema("a number")),
            Value::String(_) => return Err(SchemaError::NotASchema("a string")),
            Value::Array(_) => return Err(SchemaError::NotASchema("an array")),
        }
        json_options().apply_to(&mut schema);
        let factory = self.factory()?;
        let t0 = std::time::Instant::now();
        let parser = factory
            .create_parser(TopLevelGrammar::from_json_schema(schema))
            .map_err(|e| classify(e.to_string()))?;
        let mut matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(classify(e));
        }
        // The first mask, on a copy: it must exist (a vocabulary that cannot spell the value
        // is refused here, not mid-answer), and its lexer states stay cached for the answers.
        let mut probe = matcher.clone();
        probe.compute_mask().map_err(|e| classify(e.to_string()))?;
        for w in matcher.grammar_warnings() {
            tracing::warn!(warning = %w, "JSON schema");
        }
        tracing::debug!(
            bytes = text.len(),
            us = t0.elapsed().as_micros() as u64,
            "JSON schema compiled"
        );
        let compiled = Arc::new(JsonSchema {
            prototype: Mutex::new(matcher),
            vocab: self.vocab,
        });
        self.remember(text, &compiled);
        Ok(compiled)
    }

    fn cached(&self, text: &str) -> Option<Arc<JsonSchema>> {
        let mut cache = lock(&self.cache);
        let i = cache.iter().position(|(t, _)| t == text)?;
        let entry = cache.remove(i)?;
        let hit = Arc::clone(&entry.1);
        cache.push_back(entry);
        Some(hit)
    }

    fn remember(&self, text: &str, schema: &Arc<JsonSchema>) {
        let mut cache = lock(&self.cache);
        if cache.iter().any(|(t, _)| t == text) {
            return;
        }
        if cache.len() == SCHEMA_CACHE {
            cache.pop_front();
        }
        cache.push_back((text.to_owned(), Arc::clone(schema)));
    }
}

/// A compiled JSON schema of one model; [`JsonSchema::constraint`] starts an answer.
pub struct JsonSchema {
    /// The parser before the first token; each answer runs on a copy (the copies share its
    /// lexer cache, so later answers reuse the states earlier ones built).
    prototype: Mutex<Matcher>,
    vocab: usize,
}

impl std::fmt::Debug for JsonSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsonSchema")
            .field("vocab", &self.vocab)
            .finish_non_exhaustive()
    }
}

impl JsonSchema {
    /// The vocabulary it was compiled for.
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// The state of one answer. `stop` are the ids that may end it (the request's eos ids),
    /// allowed only where the value is complete; without any, the answer ends where nothing
    /// can follow the value (or at the token limit).
    pub fn constraint(&self, stop: &[u32]) -> JsonConstraint {
        JsonConstraint {
            matcher: lock(&self.prototype).clone(),
            end: self.vocab as TokenId,
            stop: stop
                .iter()
                .copied()
                .filter(|&s| (s as usize) < self.vocab)
                .collect(),
        }
    }
}

/// One answer under a [`JsonSchema`].
pub struct JsonConstraint {
    matcher: Matcher,
    /// The synthetic end token (one past the model's vocabulary).
    end: TokenId,
    stop: Vec<u32>,
}

impl std::fmt::Debug for JsonConstraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JsonConstraint")
            .field("stop_reason", &self.matcher.stop_reason())
            .finish_non_exhaustive()
    }
}

fn failed(e: impl std::fmt::Display) -> ConstraintError {
    ConstraintError(e.to_string())
}

impl TokenConstraint for JsonConstraint {
    fn next_mask(&mut self, mask: &mut TokenMask) -> Result<(), ConstraintError> {
        let allowed = self.matcher.compute_mask().map_err(failed)?;
        mask.copy_from_words(allowed.as_slice());
        if allowed.is_allowed(self.end) {
            for &s in &self.stop {
                mask.allow(s);
            }
        }
        Ok(())
    }

    fn accept(&mut self, id: u32) -> Result<(), ConstraintError> {
        let t = if self.stop.contains(&id) {
            self.end
        } else {
            id
        };
        self.matcher.consume_token(t).map_err(failed)
    }

    fn is_finished(&self) -> bool {
        matches!(
            self.matcher.stop_reason(),
            StopReason::NoExtension | StopReason::EndOfSentence
        )
    }

    fn is_complete(&mut self) -> bool {
        match self.matcher.stop_reason() {
            StopReason::NoExtension | StopReason::EndOfSentence => true,
            StopReason::NotStopped => self.matcher.is_accepting().unwrap_or(false),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn front_ends_may_share_the_compiler_and_send_constraints() {
        fn send_sync<T: Send + Sync>() {}
        fn send<T: Send>() {}
        send_sync::<JsonSchemas>();
        send_sync::<JsonSchema>();
        send::<JsonConstraint>();
    }

    #[test]
    fn limit_messages_are_told_apart() {
        assert!(matches!(
            classify("grammar size (number of symbols) too big (limit for this grammar: 5)".into()),
            SchemaError::TooComplex(_)
        ));
        assert!(matches!(
            classify("Unimplemented keys: [\"if\"]".into()),
            SchemaError::Unsupported(_)
        ));
    }
}

//! Scores: each generated token's probability placed on the bytes of the answer it wrote,
//! so a label's score is read off the tokens that carry its characters.

use std::ops::Range;
use std::sync::Arc;

use tokenizers::Tokenizer;

use super::RawObject;
use crate::sampler::DrawnLog;

/// The answer's tokens as byte ranges of its text, with their probabilities
/// ([`crate::sampler::probability`]: the model's softmax over the ids the schema allowed at
/// that step, at temperature 1, whatever the sampling settings).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenScores {
    spans: Vec<Range<usize>>,
    probs: Vec<f32>,
}

impl TokenScores {
    /// `tokens` and `probs` of one answer whose text is `text` (a constrained answer kept
    /// verbatim: no think block). `None` when there are fewer probabilities than tokens (none
    /// were recorded) or the tokens do not decode to `text`.
    pub fn new(tokenizer: &Tokenizer, tokens: &[u32], probs: &[f32], text: &str) -> Option<Self> {
        if probs.len() < tokens.len() {
            return None;
        }
        let spans = spans_one_by_one(tokenizer, tokens, text)
            .or_else(|| spans_by_prefixes(tokenizer, tokens, text))?;
        Some(Self {
            spans,
            probs: probs[..tokens.len()].to_vec(),
        })
    }

    /// From spans and probabilities already known (tests, other front ends).
    pub fn from_parts(spans: Vec<Range<usize>>, probs: Vec<f32>) -> Self {
        Self { spans, probs }
    }

    /// Geometric mean of the probabilities of the tokens that carry any byte of `bytes`
    /// (a token that also carries a quote counts whole); 0 when none does.
    pub fn geometric_mean(&self, bytes: Range<usize>) -> f32 {
        let mut sum = 0.0f64;
        let mut n = 0usize;
        for (span, &p) in self.spans.iter().zip(&self.probs) {
            if span.start < bytes.end && bytes.start < span.end {
                sum += f64::from(p.max(f32::MIN_POSITIVE)).ln();
                n += 1;
            }
        }
        if n == 0 {
            return 0.0;
        }
        (sum / n as f64).exp() as f32
    }
}

/// An object's score: the geometric mean of the probabilities of its label's tokens
/// ([`TokenScores::geometric_mean`]); 0 without scores. The one rule for a result's objects
/// and a feedback's, so both give an object the same score.
pub fn label_score(raw: &RawObject, scores: Option<&TokenScores>) -> f32 {
    scores.map_or(0.0, |s| s.geometric_mean(raw.label_span.clone()))
}

/// Scores of an answer while it streams: the tokens drawn so far, read from the turn's
/// [`DrawnLog`] ([`crate::assistant::Turn::drawn_log`]). An object's label is drawn before
/// the brace that closes it, so once the object closed its score here is the one the
/// complete answer gives it.
#[derive(Debug, Clone)]
pub struct LiveScores {
    log: DrawnLog,
    tokenizer: Arc<Tokenizer>,
}

impl LiveScores {
    pub fn new(log: DrawnLog, tokenizer: Arc<Tokenizer>) -> Self {
        Self { log, tokenizer }
    }

    /// The scores of `text`, the answer so far; `None` when the tokens drawn so far do not
    /// decode to it (a token whose text the stream still holds back).
    pub fn scores(&self, text: &str) -> Option<TokenScores> {
        let (ids, probs) = self.log.snapshot();
        TokenScores::new(&self.tokenizer, &ids, &probs, text)
    }
}

/// Each token decoded alone: exact when every token is whole characters, as in a grounding
/// answer (ASCII only under the schema). Checked against `text`.
fn spans_one_by_one(tok: &Tokenizer, tokens: &[u32], text: &str) -> Option<Vec<Range<usize>>> {
    let mut spans = Vec::with_capacity(tokens.len());
    let mut at = 0;
    for &id in tokens {
        let piece = tok.decode(&[id], false).ok()?;
        if !text.get(at..)?.starts_with(&piece) {
            return None;
        }
        spans.push(at..at + piece.len());
        at += piece.len();
    }
    (at == text.len()).then_some(spans)
}

/// The general case: each token ends where the decoded prefix up to it ends (quadratic; only
/// when a token splits a character or the decoder joins tokens).
fn spans_by_prefixes(tok: &Tokenizer, tokens: &[u32], text: &str) -> Option<Vec<Range<usize>>> {
    let mut spans = Vec::with_capacity(tokens.len());
    let mut at = 0;
    for i in 1..=tokens.len() {
        let prefix = tok.decode(&tokens[..i], false).ok()?;
        // A prefix that ends inside a character decodes with U+FFFD: its token ends where
        // the common part with the text ends.
        let end = common_prefix(&prefix, text).max(at);
        spans.push(at..end);
        at = end;
    }
    (at == text.len()).then_some(spans)
}

fn common_prefix(a: &str, b: &str) -> usize {
    a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count()
}

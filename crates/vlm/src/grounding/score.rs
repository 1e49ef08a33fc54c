//! Scores: each generated token's probability placed on the bytes of the answer it wrote,
//! so a label's score is read off the tokens that carry its characters.

use std::ops::Range;

use tokenizers::Tokenizer;

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

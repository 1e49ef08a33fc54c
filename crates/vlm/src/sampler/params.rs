//! What a request may set. Checked once, when a [`Sampler`](super::Sampler) is built, so
//! the per-token path never meets a NaN temperature or an empty top-p mass and needs no
//! error of its own for them; the defaults are the contract's, and the presets are the
//! model card's, so "non-thinking" means the same numbers everywhere.
//!
//! The two predicates at the end are facts about the settings, not about a token: they
//! decide how much of the logits row the sampler has to look at.

/// Temperatures below this take the best candidate, as 0 does: `1 / t` of a tiny positive
/// `t` overflows to infinity (below about 3e-39) and the softmax turns to NaN, and anything
/// this cold is greedy in effect anyway.
pub const GREEDY_TEMPERATURE: f32 = 1e-6;

/// The smallest `repetition_penalty` accepted. A penalised positive logit is divided by it,
/// so a value near 0 would blow an ordinary logit up to infinity; 0.01 still lets a caller
/// favour repeats a hundredfold.
pub const MIN_REPETITION_PENALTY: f64 = 0.01;

/// The most negative `frequency_penalty` and `presence_penalty` accepted: a negative
/// penalty raises a logit, and one of -100 already makes a repeated id certain.
pub const MIN_ADDITIVE_PENALTY: f32 = -100.0;

/// Errors of sampling.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SamplerError {
    #[error("sampling parameter `{name}` = {value} is out of range ({range})")]
    BadParam {
        name: &'static str,
        value: f64,
        range: &'static str,
    },
    #[error("empty logits")]
    EmptyLogits,
    #[error("logit bias for token {id} is outside the vocabulary of {vocab}")]
    BiasOutOfVocab { id: u32, vocab: usize },
    #[error("every logit is NaN or -inf; nothing can be sampled")]
    NothingToSample,
    #[error("the token mask covers {mask} ids but the logits row has {vocab}")]
    MaskSize { mask: usize, vocab: usize },
    #[error("no id the token mask allows has a finite logit")]
    NothingAllowed,
}

/// Sampling settings; `Default` is the contract's (greedy, nothing else active).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Below [`GREEDY_TEMPERATURE`] (1e-6; 0 and negatives included): take the best
    /// candidate.
    pub temperature: f32,
    /// 0 = off.
    pub top_k: usize,
    /// 1 = off.
    pub top_p: f32,
    /// 0 = off.
    pub min_p: f32,
    /// 1 = off.
    pub typical_p: f32,
    pub min_keep: usize,
    /// Penalty window in generated tokens; negative = the whole history, 0 = no penalties.
    pub penalty_last_n: i32,
    /// Divides positive / multiplies negative logits of tokens in the window; 1 = off; at
    /// least [`MIN_REPETITION_PENALTY`] (0.01).
    pub repetition_penalty: f32,
    /// Subtracted once per occurrence in the window; at least [`MIN_ADDITIVE_PENALTY`] (-100).
    pub frequency_penalty: f32,
    /// Subtracted once if the token occurs in the window (additive, as the model card means);
    /// at least [`MIN_ADDITIVE_PENALTY`] (-100).
    pub presence_penalty: f32,
    /// Added to a token's logit; `f32::NEG_INFINITY` bans it.
    pub logit_bias: Vec<(u32, f32)>,
    /// `None`: a fresh random seed per generation (reported by [`Sampler::seed`]).
    ///
    /// [`Sampler::seed`]: super::Sampler::seed
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            typical_p: 1.0,
            min_keep: 1,
            penalty_last_n: 64,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            logit_bias: Vec::new(),
            seed: None,
        }
    }
}

impl SamplingParams {
    /// The Qwen3.5 model card's non-thinking setting: T 0.7, top-p 0.8, top-k 20,
    /// presence penalty 1.5.
    pub fn qwen35_non_thinking() -> Self {
        Self {
            temperature: 0.7,
            top_p: 0.8,
            top_k: 20,
            presence_penalty: 1.5,
            ..Self::default()
        }
    }

    /// The model card's general thinking setting: T 1.0, top-p 0.95, top-k 20, presence 1.5.
    pub fn qwen35_thinking() -> Self {
        Self {
            temperature: 1.0,
            top_p: 0.95,
            top_k: 20,
            presence_penalty: 1.5,
            ..Self::default()
        }
    }

    pub fn validate(&self) -> Result<(), SamplerError> {
        let check = |name, v: f32, ok: bool, range| {
            if ok && !v.is_nan() {
                Ok(())
            } else {
                Err(SamplerError::BadParam {
                    name,
                    value: f64::from(v),
                    range,
                })
            }
        };
        check(
            "temperature",
            self.temperature,
            self.temperature.is_finite(),
            "finite",
        )?;
        check(
            "top_p",
            self.top_p,
            self.top_p > 0.0 && self.top_p <= 1.0,
            "(0, 1]",
        )?;
        check(
            "min_p",
            self.min_p,
            (0.0..=1.0).contains(&self.min_p),
            "[0, 1]",
        )?;
        check(
            "typical_p",
            self.typical_p,
            self.typical_p > 0.0 && self.typical_p <= 1.0,
            "(0, 1]",
        )?;
        check(
            "repetition_penalty",
            self.repetition_penalty,
            // Compared in f32, so that the f32 nearest 0.01 (what a request's 0.01 becomes)
            // is accepted.
            self.repetition_penalty.is_finite()
                && self.repetition_penalty >= MIN_REPETITION_PENALTY as f32,
            ">= 0.01",
        )?;
        check(
            "frequency_penalty",
            self.frequency_penalty,
            self.frequency_penalty.is_finite() && self.frequency_penalty >= MIN_ADDITIVE_PENALTY,
            "finite, >= -100",
        )?;
        check(
            "presence_penalty",
            self.presence_penalty,
            self.presence_penalty.is_finite() && self.presence_penalty >= MIN_ADDITIVE_PENALTY,
            "finite, >= -100",
        )?;
        for &(_, b) in &self.logit_bias {
            check("logit_bias", b, b != f32::INFINITY, "finite or -inf")?;
        }
        Ok(())
    }

    /// Whether the best candidate is taken (the temperature is below
    /// [`GREEDY_TEMPERATURE`]).
    pub fn greedy(&self) -> bool {
        self.temperature < GREEDY_TEMPERATURE
    }

    /// Whether penalties and biases can only lower a logit (the usual settings): then the
    /// final top-k set needs fewer raw candidates.
    pub(super) fn adjustments_only_lower(&self) -> bool {
        self.repetition_penalty >= 1.0
            && self.frequency_penalty >= 0.0
            && self.presence_penalty >= 0.0
            && self.logit_bias.iter().all(|&(_, b)| b <= 0.0)
    }

    pub(super) fn penalties_active(&self) -> bool {
        self.penalty_last_n != 0
            && (self.repetition_penalty != 1.0
                || self.frequency_penalty != 0.0
                || self.presence_penalty != 0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::Sampler;

    #[test]
    fn invalid_parameters_are_rejected() {
        for p in [
            SamplingParams {
                top_p: 0.0,
                ..Default::default()
            },
            SamplingParams {
                top_p: 1.5,
                ..Default::default()
            },
            SamplingParams {
                min_p: -0.1,
                ..Default::default()
            },
            SamplingParams {
                typical_p: 0.0,
                ..Default::default()
            },
            SamplingParams {
                repetition_penalty: 0.0,
                ..Default::default()
            },
            SamplingParams {
                temperature: f32::NAN,
                ..Default::default()
            },
            SamplingParams {
                presence_penalty: f32::INFINITY,
                ..Default::default()
            },
        ] {
            assert!(Sampler::new(p.clone()).is_err(), "{p:?}");
        }
    }

    /// Penalties near the values that overflow a logit are refused, naming the parameter and
    /// its bound; the bounds themselves are accepted.
    #[test]
    fn penalties_have_lower_bounds() {
        let refused = |p: SamplingParams| match p.validate() {
            Err(SamplerError::BadParam { name, range, .. }) => (name, range),
            other => panic!("{p:?}: {other:?}"),
        };
        for rp in [0.009, 1e-6, 1e-30, f32::MIN_POSITIVE] {
            let p = SamplingParams {
                repetition_penalty: rp,
                ..Default::default()
            };
            assert_eq!(refused(p), ("repetition_penalty", ">= 0.01"));
        }
        let p = SamplingParams {
            presence_penalty: -100.5,
            ..Default::default()
        };
        assert_eq!(refused(p), ("presence_penalty", "finite, >= -100"));
        let p = SamplingParams {
            frequency_penalty: -1e30,
            ..Default::default()
        };
        assert_eq!(refused(p), ("frequency_penalty", "finite, >= -100"));
        let at_the_bounds = SamplingParams {
            repetition_penalty: 0.01,
            presence_penalty: -100.0,
            frequency_penalty: -100.0,
            ..Default::default()
        };
        assert_eq!(at_the_bounds.validate(), Ok(()));
        let e = SamplingParams {
            repetition_penalty: 0.001,
            ..Default::default()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("repetition_penalty") && e.contains(">= 0.01"),
            "{e}"
        );
    }
}

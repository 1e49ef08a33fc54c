//! Token sampling with bllm's algorithm and defaults (docs/package-contract.md §8), so that a request's
//! settings — and the model card's recommended ones — mean what they mean there, and a
//! given seed reproduces its generation.
//!
//! It runs on the host between two BPU decode steps, once per token over a 248k
//! vocabulary, so it is on the per-token latency path: nothing here sorts, softmaxes or
//! penalises the whole row. Only the raw candidates that can still win are looked at, and
//! finding them is the one cost that grows with the vocabulary, which is why that search
//! lives apart in `candidates`; what a request may set, and its checks, live in `params`.
//!
//! Constrained output (structured answers) reaches the sampler only as a [`TokenMask`] per
//! step ([`Sampler::sample_masked`]); the [`TokenConstraint`] that produces it is called by the
//! decode loop (`constraint`).

mod candidates;
mod constraint;
mod drawn;
mod params;

pub use candidates::argmax;
pub use constraint::{probability, ConstraintError, TokenConstraint, TokenMask};
pub use drawn::DrawnLog;
pub use params::{
    SamplerError, SamplingParams, GREEDY_TEMPERATURE, MIN_ADDITIVE_PENALTY, MIN_REPETITION_PENALTY,
};

use std::collections::{HashMap, VecDeque};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use candidates::top_n;

/// Candidates considered before filtering, at least (bllm's single-pass heap size).
pub const MIN_CANDIDATES: usize = 512;

/// Per-generation sampler state: RNG, penalty window, scratch buffers.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    seed: u64,
    rng: ChaCha8Rng,
    window: VecDeque<u32>,
    counts: HashMap<u32, u32>,
    bias: HashMap<u32, f32>,
    cand: Vec<(f32, u32)>,
    probs: Vec<f32>,
    maxima: Vec<f32>,
    sel: Vec<f32>,
    /// The row with masked-out logits at `-inf` ([`Sampler::sample_masked`]).
    masked: Vec<f32>,
    /// The probability of each drawn token, when recording ([`Sampler::record_probabilities`]).
    drawn_probs: Option<Vec<f32>>,
    /// Where each drawn token also goes while recording ([`Sampler::share_drawn`]).
    drawn_log: Option<DrawnLog>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Result<Self, SamplerError> {
        params.validate()?;
        let seed = params.seed.unwrap_or_else(rand::random);
        let mut bias = HashMap::new();
        for &(id, b) in &params.logit_bias {
            *bias.entry(id).or_insert(0.0) += b;
        }
        Ok(Self {
            seed,
            rng: ChaCha8Rng::seed_from_u64(seed),
            params,
            window: VecDeque::new(),
            counts: HashMap::new(),
            bias,
            cand: Vec::with_capacity(MIN_CANDIDATES * 2),
            probs: Vec::with_capacity(MIN_CANDIDATES * 2),
            maxima: Vec::new(),
            sel: Vec::new(),
            masked: Vec::new(),
            drawn_probs: None,
            drawn_log: None,
        })
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The seed in use (the drawn one when the parameters gave none).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Records the probability of each token drawn from now on ([`probability`]: the model's
    /// softmax over the ids the mask allowed, at temperature 1 — not the sampling
    /// distribution, which greedy decoding makes certain). One pass over the allowed ids per
    /// token, so only a request that uses them asks (the detection scores,
    /// `crate::grounding`).
    pub fn record_probabilities(&mut self, on: bool) {
        self.drawn_probs = on.then(Vec::new);
    }

    /// While recording, also writes each drawn token's id and probability to `log` as it is
    /// drawn, for a reader that wants them before the reply ends; `None` stops that.
    pub fn share_drawn(&mut self, log: Option<DrawnLog>) {
        self.drawn_log = log;
    }

    /// The probabilities recorded so far, one per drawn token in order (eos included); empty
    /// when not recording. Recording goes on with an empty list.
    pub fn take_probabilities(&mut self) -> Vec<f32> {
        self.drawn_probs
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default()
    }

    /// Starts a new generation: empty penalty window, RNG reseeded (a fresh seed when the
    /// parameters gave none).
    pub fn reset(&mut self) {
        self.seed = self.params.seed.unwrap_or_else(rand::random);
        self.rng = ChaCha8Rng::seed_from_u64(self.seed);
        self.window.clear();
        self.counts.clear();
    }

    /// Records a generated token in the penalty window (call for each token fed back).
    pub fn accept(&mut self, id: u32) {
        let n = self.params.penalty_last_n;
        if n == 0 {
            return;
        }
        self.window.push_back(id);
        *self.counts.entry(id).or_insert(0) += 1;
        if n > 0 && self.window.len() > n as usize {
            if let Some(old) = self.window.pop_front() {
                if let Some(c) = self.counts.get_mut(&old) {
                    *c -= 1;
                    if *c == 0 {
                        self.counts.remove(&old);
                    }
                }
            }
        }
    }

    /// Picks the next token from raw logits (one row, `vocab` long).
    ///
    /// Greedy with no penalties or bias is a plain argmax. Otherwise: the top
    /// `max(top_k, 512, min_keep)` raw logits are selected (fewer under top-k when every
    /// adjustment can only lower a logit), each candidate gets the repetition / frequency /
    /// presence penalties of the last-n window and its logit bias (biased ids join the
    /// candidates), then: a temperature below [`GREEDY_TEMPERATURE`] takes the best; else softmax at temperature,
    /// top-k, top-p, min-p and locally-typical filtering (each keeping at least
    /// `min_keep`), and a draw from the remaining mass with the seeded ChaCha RNG.
    pub fn sample(&mut self, logits: &[f32]) -> Result<u32, SamplerError> {
        let id = self.sample_row(logits)?;
        self.record(id, || probability(logits, None, id));
        Ok(id)
    }

    /// Records the drawn `id`'s probability when recording (computed only then).
    fn record(&mut self, id: u32, probability: impl FnOnce() -> f32) {
        let Some(v) = self.drawn_probs.as_mut() else {
            return;
        };
        let p = probability();
        v.push(p);
        if let Some(log) = &self.drawn_log {
            log.push(id, p);
        }
    }

    fn sample_row(&mut self, logits: &[f32]) -> Result<u32, SamplerError> {
        if logits.is_empty() {
            return Err(SamplerError::EmptyLogits);
        }
        if let Some(&id) = self.bias.keys().find(|&&id| id as usize >= logits.len()) {
            return Err(SamplerError::BiasOutOfVocab {
                id,
                vocab: logits.len(),
            });
        }
        let p = Knobs::from(&self.params);
        let penalise = self.params.penalties_active() && !self.counts.is_empty();
        if p.greedy() && !penalise && self.bias.is_empty() {
            return argmax(logits).ok_or(SamplerError::NothingToSample);
        }
        self.candidates(logits, p, penalise)?;
        let min_keep = p.min_keep.max(1);
        if p.greedy() {
            return Ok(best(&self.cand));
        }
        self.filter(p, min_keep);
        Ok(self.draw())
    }

    /// Fills `cand` with the raw candidates that can still win, adjusted by the penalties
    /// (when `penalise`) and the logit bias; ids left at NaN or `-inf` are dropped.
    fn candidates(&mut self, logits: &[f32], p: Knobs, penalise: bool) -> Result<(), SamplerError> {
        let mut n = p
            .top_k
            .max(MIN_CANDIDATES)
            .max(p.min_keep)
            .min(logits.len());
        if p.top_k > 0 && self.params.adjustments_only_lower() {
            // Only the top k survive, and an adjustment can only move an id down: each of
            // the k winners is among the top k raw logits or is one of the adjusted ids
            // (penalised or biased), so k + that many raw candidates give the same k.
            let adjusted = if penalise { self.counts.len() } else { 0 } + self.bias.len();
            n = n.min(p.top_k.max(p.min_keep) + adjusted);
        }
        top_n(logits, n, &mut self.cand, &mut self.maxima, &mut self.sel);
        for &id in self.bias.keys() {
            if !self.cand.iter().any(|&(_, c)| c == id) {
                self.cand.push((logits[id as usize], id));
            }
        }
        for (l, id) in self.cand.iter_mut() {
            if penalise {
                if let Some(&count) = self.counts.get(id) {
                    if *l > 0.0 {
                        *l /= p.repetition_penalty;
                    } else {
                        *l *= p.repetition_penalty;
                    }
                    *l -= count as f32 * p.frequency_penalty + p.presence_penalty;
                }
            }
            if let Some(b) = self.bias.get(id) {
                *l += b;
            }
            // An adjustment may overflow (a tiny repetition penalty on a huge logit, two
            // maximal biases on one id); `+inf` would make the softmax NaN. (Not `min`,
            // which would turn a NaN into a number.)
            if *l == f32::INFINITY {
                *l = f32::MAX;
            }
        }
        self.cand
            .retain(|(l, _)| !l.is_nan() && *l != f32::NEG_INFINITY);
        if self.cand.is_empty() {
            return Err(SamplerError::NothingToSample);
        }
        Ok(())
    }

    /// Sorts the candidates best first with their probabilities at temperature in `probs`,
    /// cut by top-k, top-p, min-p and locally-typical filtering.
    fn filter(&mut self, p: Knobs, min_keep: usize) {
        // Only the first k survive top-k, so select them before sorting.
        if p.top_k > 0 {
            let k = p.top_k.max(min_keep);
            if k < self.cand.len() {
                self.cand
                    .select_nth_unstable_by(k - 1, |a, b| b.0.total_cmp(&a.0));
                self.cand.truncate(k);
            }
        }
        self.cand.sort_unstable_by(|a, b| b.0.total_cmp(&a.0));

        // Softmax at temperature.
        let inv_t = 1.0 / p.temperature;
        let max = self.cand[0].0;
        self.probs.clear();
        self.probs
            .extend(self.cand.iter().map(|&(l, _)| ((l - max) * inv_t).exp()));
        normalise(&mut self.probs);

        // top-p: the smallest prefix whose mass reaches top_p.
        if p.top_p < 1.0 {
            let mut cum = 0.0;
            let mut keep = self.probs.len();
            for (i, &q) in self.probs.iter().enumerate() {
                cum += q;
                if cum >= p.top_p && i + 1 >= min_keep {
                    keep = i + 1;
                    break;
                }
            }
            self.truncate(keep);
        }
        // min-p: relative to the most likely candidate.
        if p.min_p > 0.0 {
            let floor = p.min_p * self.probs[0];
            let keep = self
                .probs
                .iter()
                .position(|&q| q < floor)
                .unwrap_or(self.probs.len())
                .max(min_keep)
                .min(self.probs.len());
            self.truncate(keep);
        }
        // Locally typical: keep tokens whose surprise is closest to the entropy.
        if p.typical_p < 1.0 {
            self.typical(p.typical_p, min_keep);
        }
    }

    /// Draws from the remaining mass with the seeded RNG.
    fn draw(&mut self) -> u32 {
        let total: f32 = self.probs.iter().sum();
        let r = self.rng.random::<f32>() * total;
        let mut cum = 0.0;
        for (i, &q) in self.probs.iter().enumerate() {
            cum += q;
            if r < cum {
                return self.cand[i].1;
            }
        }
        self.cand[self.probs.len() - 1].1
    }

    /// [`Sampler::sample`] restricted to the ids `mask` allows. Every other logit is `-inf`
    /// before anything looks at the row — the greedy and top-k shortcuts, penalties and
    /// biases included (a penalty or bias never lifts `-inf`) — so a masked-out id is never
    /// drawn, whatever the settings. With every id allowed it draws what `sample` draws, from
    /// the same random numbers.
    pub fn sample_masked(&mut self, logits: &[f32], mask: &TokenMask) -> Result<u32, SamplerError> {
        if mask.len() != logits.len() {
            return Err(SamplerError::MaskSize {
                mask: mask.len(),
                vocab: logits.len(),
            });
        }
        let mut row = std::mem::take(&mut self.masked);
        mask.apply(logits, &mut row);
        let drawn = self.sample_row(&row);
        self.masked = row;
        match drawn {
            Ok(id) if mask.allows(id) => {
                self.record(id, || probability(logits, Some(mask), id));
                Ok(id)
            }
            // The greedy path takes the first `-inf` of a row with nothing finite left.
            Ok(_) | Err(SamplerError::NothingToSample) => Err(SamplerError::NothingAllowed),
            Err(e) => Err(e),
        }
    }

    fn truncate(&mut self, keep: usize) {
        if keep < self.probs.len() {
            self.probs.truncate(keep);
            self.cand.truncate(keep);
            normalise(&mut self.probs);
        }
    }

    fn typical(&mut self, typical_p: f32, min_keep: usize) {
        let entropy: f32 = self
            .probs
            .iter()
            .filter(|&&q| q > 0.0)
            .map(|&q| -q * q.ln())
            .sum();
        let mut order: Vec<(f32, usize)> = self
            .probs
            .iter()
            .enumerate()
            .map(|(i, &q)| ((-q.ln() - entropy).abs(), i))
            .collect();
        order.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut cum = 0.0;
        let mut keep = order.len();
        for (j, &(_, i)) in order.iter().enumerate() {
            cum += self.probs[i];
            if cum >= typical_p && j + 1 >= min_keep {
                keep = j + 1;
                break;
            }
        }
        let cand: Vec<(f32, u32)> = order[..keep].iter().map(|&(_, i)| self.cand[i]).collect();
        let probs: Vec<f32> = order[..keep].iter().map(|&(_, i)| self.probs[i]).collect();
        self.cand = cand;
        self.probs = probs;
        normalise(&mut self.probs);
    }
}

/// The scalar parameters, copied so `sample` can borrow the scratch buffers mutably.
#[derive(Clone, Copy)]
struct Knobs {
    temperature: f32,
    top_k: usize,
    top_p: f32,
    min_p: f32,
    typical_p: f32,
    min_keep: usize,
    repetition_penalty: f32,
    frequency_penalty: f32,
    presence_penalty: f32,
}

impl Knobs {
    fn greedy(&self) -> bool {
        self.temperature < GREEDY_TEMPERATURE
    }
}

impl From<&SamplingParams> for Knobs {
    fn from(p: &SamplingParams) -> Self {
        Self {
            temperature: p.temperature,
            top_k: p.top_k,
            top_p: p.top_p,
            min_p: p.min_p,
            typical_p: p.typical_p,
            min_keep: p.min_keep,
            repetition_penalty: p.repetition_penalty,
            frequency_penalty: p.frequency_penalty,
            presence_penalty: p.presence_penalty,
        }
    }
}

fn normalise(p: &mut [f32]) {
    let s: f32 = p.iter().sum();
    if s > 0.0 {
        let inv = 1.0 / s;
        p.iter_mut().for_each(|q| *q *= inv);
    }
}

/// The candidate with the largest logit, lowest id on ties: [`argmax`]'s rule, so greedy
/// decoding takes the same token whether or not an adjustment sends it down this path.
fn best(cand: &[(f32, u32)]) -> u32 {
    let mut b = cand[0];
    for &c in &cand[1..] {
        if c.0 > b.0 || (c.0 == b.0 && c.1 < b.1) {
            b = c;
        }
    }
    b.1
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand_chacha::ChaCha8Rng;

    fn freq(s: &mut Sampler, logits: &[f32], n: usize, accept: bool) -> Vec<usize> {
        let mut f = vec![0; logits.len()];
        for _ in 0..n {
            let id = s.sample(logits).unwrap();
            f[id as usize] += 1;
            if accept {
                s.accept(id);
            }
        }
        f
    }

    fn seeded(p: SamplingParams) -> Sampler {
        Sampler::new(SamplingParams {
            seed: Some(1234),
            ..p
        })
        .unwrap()
    }

    fn logits_of(probs: &[f64]) -> Vec<f32> {
        probs.iter().map(|p| p.ln() as f32).collect()
    }

    #[test]
    fn drawn_probabilities_are_recorded_on_request() {
        let logits = logits_of(&[0.1, 0.2, 0.3, 0.4]);
        let mut s = Sampler::new(SamplingParams::default()).unwrap();
        s.sample(&logits).unwrap();
        assert!(s.take_probabilities().is_empty());
        s.record_probabilities(true);
        assert_eq!(s.sample(&logits).unwrap(), 3);
        let mut m = TokenMask::new(4);
        m.allow(1);
        m.allow(2);
        assert_eq!(s.sample_masked(&logits, &m).unwrap(), 2);
        let p = s.take_probabilities();
        assert_eq!(p.len(), 2);
        assert!((p[0] - 0.4).abs() < 1e-6, "{p:?}");
        assert!((p[1] - 0.6).abs() < 1e-6, "{p:?}");
        assert!(s.take_probabilities().is_empty());
    }

    #[test]
    fn a_shared_log_gets_each_drawn_token_as_it_is_drawn() {
        let logits = logits_of(&[0.1, 0.2, 0.3, 0.4]);
        let mut s = Sampler::new(SamplingParams::default()).unwrap();
        let log = DrawnLog::new();
        s.share_drawn(Some(log.clone()));
        s.sample(&logits).unwrap();
        assert_eq!(log.snapshot(), (vec![], vec![]), "only while recording");
        s.record_probabilities(true);
        s.sample(&logits).unwrap();
        let mut m = TokenMask::new(4);
        m.allow(1);
        assert_eq!(log.snapshot().0, vec![3], "before the reply ends");
        s.sample_masked(&logits, &m).unwrap();
        let (ids, probs) = log.snapshot();
        assert_eq!(ids, vec![3, 1]);
        assert_eq!(
            probs,
            s.take_probabilities(),
            "the same numbers as the reply's"
        );
    }

    #[test]
    fn greedy_is_argmax() {
        let mut logits: Vec<f32> = (0..5000)
            .map(|i| ((i * 7919) % 5000) as f32 * 0.001)
            .collect();
        logits[4321] = 100.0;
        logits[17] = f32::NAN;
        let mut s = Sampler::new(SamplingParams::default()).unwrap();
        assert_eq!(s.sample(&logits).unwrap(), 4321);
    }

    #[test]
    fn seeded_sampling_is_reproducible() {
        let logits: Vec<f32> = (0..1000).map(|i| ((i * 31) % 97) as f32 * 0.05).collect();
        let p = SamplingParams::qwen35_non_thinking();
        let run = |seed| {
            let mut s = Sampler::new(SamplingParams {
                seed: Some(seed),
                ..p.clone()
            })
            .unwrap();
            (0..200)
                .map(|_| {
                    let id = s.sample(&logits).unwrap();
                    s.accept(id);
                    id
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
        let mut s = seeded(p);
        let a: Vec<u32> = (0..50).map(|_| s.sample(&logits).unwrap()).collect();
        s.reset();
        let b: Vec<u32> = (0..50).map(|_| s.sample(&logits).unwrap()).collect();
        assert_eq!(a, b, "reset reseeds");
        assert_eq!(s.seed(), 1234);
    }

    #[test]
    fn temperature_sampling_matches_softmax() {
        let probs = [0.4, 0.3, 0.2, 0.1];
        let mut s = seeded(SamplingParams {
            temperature: 1.0,
            ..Default::default()
        });
        let f = freq(&mut s, &logits_of(&probs), 20000, false);
        for (i, &p) in probs.iter().enumerate() {
            let got = f[i] as f64 / 20000.0;
            assert!((got - p).abs() < 0.015, "id {i}: {got} vs {p}");
        }
        // T = 0.5 squares the ratios: 16:9:4:1 over 30.
        let mut s = seeded(SamplingParams {
            temperature: 0.5,
            ..Default::default()
        });
        let f = freq(&mut s, &logits_of(&probs), 20000, false);
        for (i, w) in [16.0, 9.0, 4.0, 1.0].iter().enumerate() {
            let got = f[i] as f64 / 20000.0;
            assert!((got - w / 30.0).abs() < 0.015, "id {i}: {got}");
        }
    }

    #[test]
    fn top_k_top_p_min_p_restrict_the_support() {
        let probs = [0.35, 0.25, 0.2, 0.1, 0.06, 0.04];
        let l = logits_of(&probs);
        let t1 = SamplingParams {
            temperature: 1.0,
            ..Default::default()
        };
        let mut s = seeded(SamplingParams {
            top_k: 2,
            ..t1.clone()
        });
        let f = freq(&mut s, &l, 10000, false);
        assert_eq!(f[2..].iter().sum::<usize>(), 0);
        let r = f[0] as f64 / 10000.0;
        assert!((r - 0.35 / 0.6).abs() < 0.02, "renormalised top-2: {r}");

        // cumulative 0.35, 0.60, 0.80 → top_p 0.7 keeps three.
        let mut s = seeded(SamplingParams {
            top_p: 0.7,
            ..t1.clone()
        });
        let f = freq(&mut s, &l, 10000, false);
        assert!(f[2] > 0 && f[3..].iter().sum::<usize>() == 0, "{f:?}");

        // min_p 0.25 keeps p ≥ 0.0875: ids 0..=3.
        let mut s = seeded(SamplingParams {
            min_p: 0.25,
            ..t1.clone()
        });
        let f = freq(&mut s, &l, 10000, false);
        assert!(f[3] > 0 && f[4] + f[5] == 0, "{f:?}");

        // min_keep wins over the filters.
        let mut s = seeded(SamplingParams {
            top_k: 1,
            min_keep: 3,
            ..t1
        });
        let f = freq(&mut s, &l, 5000, false);
        assert!(f[2] > 0 && f[3..].iter().sum::<usize>() == 0, "{f:?}");
    }

    #[test]
    fn typical_p_keeps_the_typical_set() {
        // H = 1.089; surprises 0.51, 1.61, 2.30, 2.30 → id 1 is the most typical.
        let mut s = seeded(SamplingParams {
            temperature: 1.0,
            typical_p: 0.15,
            ..Default::default()
        });
        let f = freq(&mut s, &logits_of(&[0.6, 0.2, 0.1, 0.1]), 2000, false);
        assert_eq!(f, vec![0, 2000, 0, 0]);
        let mut s = seeded(SamplingParams {
            temperature: 1.0,
            typical_p: 0.7,
            ..Default::default()
        });
        let f = freq(&mut s, &logits_of(&[0.6, 0.2, 0.1, 0.1]), 4000, false);
        assert!(f[0] > 0 && f[1] > 0 && f[2] + f[3] == 0, "{f:?}");
    }

    /// The top-k shortcut (k + adjusted ids instead of 512 raw candidates) draws exactly what
    /// the full candidate set draws. The reference disables the shortcut with a positive bias
    /// on a `-inf` logit, which joins the candidates and is dropped again, so both samplers see
    /// the same candidates and consume the same random numbers.
    #[test]
    fn top_k_shortcut_draws_what_the_full_candidate_set_draws() {
        let mut rng = ChaCha8Rng::seed_from_u64(42);
        for case in 0..20 {
            let vocab = 3000;
            let mut logits: Vec<f32> = (0..vocab)
                .map(|_| {
                    let v = rng.random_range(-2.0f32..2.0);
                    if rng.random::<f32>() < 0.01 {
                        v + 8.0
                    } else {
                        v
                    }
                })
                .collect();
            logits[vocab - 1] = f32::NEG_INFINITY;
            let params = SamplingParams {
                seed: Some(case),
                temperature: rng.random_range(0.3f32..1.5),
                top_k: rng.random_range(1..40usize),
                top_p: rng.random_range(0.5f32..1.0),
                min_keep: rng.random_range(1..4usize),
                penalty_last_n: rng.random_range(1..64i32),
                repetition_penalty: rng.random_range(1.0f32..1.5),
                frequency_penalty: rng.random_range(0.0f32..1.0),
                presence_penalty: rng.random_range(0.0f32..3.0),
                logit_bias: vec![(rng.random_range(0..vocab as u32 - 1), -5.0)],
                ..SamplingParams::default()
            };
            assert!(params.adjustments_only_lower());
            let mut fast = Sampler::new(params.clone()).unwrap();
            let mut reference = Sampler::new(SamplingParams {
                logit_bias: [params.logit_bias.clone(), vec![(vocab as u32 - 1, 1e-3)]].concat(),
                ..params
            })
            .unwrap();
            assert!(!reference.params.adjustments_only_lower());
            for step in 0..100 {
                // rotate the row so penalised ids stay among the large logits
                logits[..vocab - 1].rotate_left(step % 7);
                let a = fast.sample(&logits).unwrap();
                let b = reference.sample(&logits).unwrap();
                assert_eq!(a, b, "case {case} step {step}");
                fast.accept(a);
                reference.accept(b);
            }
        }
    }

    /// The greedy shortcut (a plain argmax of the raw row) takes what the candidate path
    /// (top 512, adjustments, `best`) takes. A bias of 0 on some id sends the reference down
    /// the candidate path without changing a logit. Rows have NaN, `-inf` and a few tied
    /// maxima, but always a finite logit and fewer ties than candidates: on a row of only
    /// `-inf` the shortcut takes the first id where the candidate path finds nothing to
    /// sample, and more than 512 tied maxima may lose the lowest id from the candidates.
    #[test]
    fn greedy_shortcut_takes_what_the_candidate_path_takes() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        for case in 0..200 {
            let vocab = rng.random_range(1..6000usize);
            let mut logits: Vec<f32> = (0..vocab)
                .map(|_| match rng.random::<f32>() {
                    u if u < 0.02 => f32::NAN,
                    u if u < 0.04 => f32::NEG_INFINITY,
                    _ => rng.random_range(-4.0f32..4.0),
                })
                .collect();
            let top = rng.random_range(0..vocab);
            logits[top] = 5.0;
            for _ in 0..rng.random_range(0..4) {
                logits[rng.random_range(0..vocab)] = 5.0;
            }
            let mut fast = Sampler::new(SamplingParams::default()).unwrap();
            let mut reference = Sampler::new(SamplingParams {
                logit_bias: vec![(rng.random_range(0..vocab as u32), 0.0)],
                ..SamplingParams::default()
            })
            .unwrap();
            let a = fast.sample(&logits).unwrap();
            assert_eq!(Some(a), argmax(&logits), "case {case}");
            assert_eq!(a, reference.sample(&logits).unwrap(), "case {case}");
        }
    }

    #[test]
    fn presence_penalty_is_additive_and_windowed() {
        // Two equal tokens; after token 0 is generated its logit drops by 1.5.
        let mut s = seeded(SamplingParams {
            temperature: 1.0,
            presence_penalty: 1.5,
            ..Default::default()
        });
        s.accept(0);
        let f = freq(&mut s, &[0.0, 0.0], 20000, false);
        let want = (-1.5f64).exp() / (1.0 + (-1.5f64).exp());
        let got = f[0] as f64 / 20000.0;
        assert!((got - want).abs() < 0.015, "{got} vs {want}");

        // Greedy with penalties: frequency counts occurrences, the window forgets.
        let mut s = Sampler::new(SamplingParams {
            frequency_penalty: 0.4,
            penalty_last_n: 3,
            ..Default::default()
        })
        .unwrap();
        let l = [1.0, 0.5];
        s.accept(0);
        assert_eq!(s.sample(&l).unwrap(), 0, "1.0-0.4 > 0.5");
        s.accept(0);
        assert_eq!(s.sample(&l).unwrap(), 1, "1.0-0.8 < 0.5");
        s.accept(1);
        s.accept(1);
        assert_eq!(s.counts.get(&0), Some(&1), "window of 3 keeps one 0");
        s.accept(1);
        assert_eq!(s.sample(&l).unwrap(), 0, "0 left the window");
    }

    #[test]
    fn repetition_penalty_divides_positive_and_multiplies_negative() {
        let mut s = Sampler::new(SamplingParams {
            repetition_penalty: 1.1,
            ..Default::default()
        })
        .unwrap();
        s.accept(0);
        assert_eq!(s.sample(&[2.0, 1.9]).unwrap(), 1, "2.0/1.1 < 1.9");
        assert_eq!(s.sample(&[2.0, 1.7]).unwrap(), 0, "2.0/1.1 > 1.7");
        assert_eq!(s.sample(&[-1.0, -1.05]).unwrap(), 1, "-1.1 < -1.05");
    }

    #[test]
    fn logit_bias_joins_candidates_and_bans() {
        let mut logits = vec![0.0f32; 2000];
        logits[5] = 10.0;
        let mut s = Sampler::new(SamplingParams {
            logit_bias: vec![(1999, 100.0)],
            ..Default::default()
        })
        .unwrap();
        assert_eq!(s.sample(&logits).unwrap(), 1999);
        let mut s = seeded(SamplingParams {
            temperature: 1.0,
            logit_bias: vec![(5, f32::NEG_INFINITY)],
            ..Default::default()
        });
        assert!((0..200).all(|_| s.sample(&logits).unwrap() != 5));
        let mut s = Sampler::new(SamplingParams {
            logit_bias: vec![(3000, 1.0)],
            ..Default::default()
        })
        .unwrap();
        assert!(matches!(
            s.sample(&logits),
            Err(SamplerError::BiasOutOfVocab { id: 3000, .. })
        ));
    }

    /// Random settings of every kind (greedy and sampled, top-k shortcut or not, penalties,
    /// positive biases on forbidden ids) and random masks (one id, a few, most): the drawn id is
    /// always allowed. Rows carry NaN and `-inf`, and the forbidden ids get the largest logits,
    /// so any path that looked at the raw row would take them.
    #[test]
    fn masked_out_ids_are_never_drawn() {
        let mut rng = ChaCha8Rng::seed_from_u64(17);
        for case in 0..300 {
            let vocab = rng.random_range(2..3000usize);
            let mut mask = TokenMask::new(vocab);
            let density = [0.0, 0.01, 0.5, 0.99][case % 4];
            for id in 0..vocab as u32 {
                if rng.random::<f64>() < density {
                    mask.allow(id);
                }
            }
            mask.allow(rng.random_range(0..vocab as u32));
            let logits: Vec<f32> = (0..vocab as u32)
                .map(|id| match rng.random::<f32>() {
                    u if u < 0.02 => f32::NAN,
                    u if u < 0.04 => f32::NEG_INFINITY,
                    _ if !mask.allows(id) => rng.random_range(5.0f32..9.0),
                    _ => rng.random_range(-4.0f32..4.0),
                })
                .collect();
            let forbidden: Vec<u32> = (0..vocab as u32).filter(|&i| !mask.allows(i)).collect();
            let greedy = case % 3 == 0;
            let params = SamplingParams {
                seed: Some(case as u64),
                temperature: if greedy {
                    0.0
                } else {
                    rng.random_range(0.3f32..1.5)
                },
                top_k: [0, 1, 20][case % 3],
                top_p: rng.random_range(0.5f32..1.0),
                min_p: [0.0, 0.05][case % 2],
                typical_p: [1.0, 0.9][(case / 2) % 2],
                penalty_last_n: [0, 64, -1][(case / 3) % 3],
                repetition_penalty: rng.random_range(1.0f32..1.5),
                frequency_penalty: rng.random_range(-0.5f32..1.0),
                presence_penalty: rng.random_range(0.0f32..3.0),
                logit_bias: forbidden.iter().take(3).map(|&id| (id, 50.0)).collect(),
                ..SamplingParams::default()
            };
            let mut s = Sampler::new(params).unwrap();
            for step in 0..20 {
                match s.sample_masked(&logits, &mask) {
                    Ok(id) => {
                        assert!(mask.allows(id), "case {case} step {step}: drew {id}");
                        s.accept(id);
                    }
                    // Every allowed logit NaN or -inf: an error, never a forbidden id.
                    Err(SamplerError::NothingAllowed) => {
                        assert!(mask.iter().all(|id| !logits[id as usize].is_finite()));
                        break;
                    }
                    Err(e) => panic!("case {case}: {e}"),
                }
            }
        }
    }

    /// A mask that allows everything changes nothing: the same ids from the same seed.
    #[test]
    fn an_all_allowing_mask_draws_what_sample_draws() {
        let logits: Vec<f32> = (0..1000).map(|i| ((i * 31) % 97) as f32 * 0.05).collect();
        let mut all = TokenMask::new(logits.len());
        all.allow_all();
        for params in [
            SamplingParams::default(),
            SamplingParams::qwen35_non_thinking(),
            SamplingParams::qwen35_thinking(),
        ] {
            let p = SamplingParams {
                seed: Some(3),
                ..params
            };
            let (mut a, mut b) = (Sampler::new(p.clone()).unwrap(), Sampler::new(p).unwrap());
            for _ in 0..100 {
                let x = a.sample(&logits).unwrap();
                assert_eq!(x, b.sample_masked(&logits, &all).unwrap());
                a.accept(x);
                b.accept(x);
            }
        }
        let mut s = Sampler::new(SamplingParams::default()).unwrap();
        assert_eq!(
            s.sample_masked(&logits, &TokenMask::new(999)),
            Err(SamplerError::MaskSize {
                mask: 999,
                vocab: 1000
            })
        );
        assert_eq!(
            s.sample_masked(&logits, &TokenMask::new(1000)),
            Err(SamplerError::NothingAllowed)
        );
    }

    /// A positive temperature too small to invert (`1 / t` = inf below about 3e-39) is greedy,
    /// as is anything below 1e-6: the best candidate, never the worst one a NaN softmax
    /// would leave to the draw.
    #[test]
    fn a_tiny_temperature_is_greedy() {
        let logits = [0.5f32, 3.0, 1.0, -2.0];
        for t in [1e-39f32, f32::MIN_POSITIVE, 1e-20, 9e-7] {
            let mut s = seeded(SamplingParams {
                temperature: t,
                top_k: 3,
                ..Default::default()
            });
            assert!(s.params().greedy(), "{t}");
            for _ in 0..20 {
                assert_eq!(s.sample(&logits).unwrap(), 1, "temperature {t}");
            }
        }
        let warm = SamplingParams {
            temperature: GREEDY_TEMPERATURE,
            ..Default::default()
        };
        assert!(!warm.greedy());
    }

    /// The smallest repetition penalty on a huge logit, and two maximal biases on one id,
    /// overflow to `+inf`; the candidate stays the finite best, so the draw takes it instead
    /// of the last candidate of a NaN softmax.
    #[test]
    fn an_overflowing_adjustment_stays_finite() {
        let mut s = seeded(SamplingParams {
            temperature: 1.0,
            repetition_penalty: 0.01,
            ..Default::default()
        });
        s.accept(0);
        for _ in 0..50 {
            assert_eq!(s.sample(&[1e37, 1.0, 0.5]).unwrap(), 0);
        }
        let mut s = seeded(SamplingParams {
            temperature: 0.7,
            logit_bias: vec![(2, f32::MAX), (2, f32::MAX)],
            ..Default::default()
        });
        for _ in 0..50 {
            assert_eq!(s.sample(&[3.0, 1.0, 0.5]).unwrap(), 2);
        }
    }

    #[test]
    fn empty_logits_are_an_error() {
        let mut s = Sampler::new(SamplingParams::default()).unwrap();
        assert_eq!(s.sample(&[]), Err(SamplerError::EmptyLogits));
    }
}

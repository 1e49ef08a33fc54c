//! The one seam between decoding and constrained output (structured answers): a
//! [`TokenConstraint`] says, before each step, which ids may come next ([`TokenMask`]) and is
//! told each id drawn. The decode loop (`engine::generate`) calls it; the sampler only ever sees
//! the mask ([`Sampler::sample_masked`]), so it knows nothing of grammars, and a grammar engine
//! (`crate::structured`, over llguidance) knows nothing of sampling.
//!
//! [`Sampler::sample_masked`]: super::Sampler::sample_masked

/// A set of token ids over a vocabulary: one bit per id, 32 ids per word, id `i` at bit
/// `i % 32` of word `i / 32` (llguidance's and most engines' layout, so a mask is copied word
/// by word). Bits past the vocabulary are always clear.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenMask {
    words: Vec<u32>,
    len: usize,
}

impl TokenMask {
    /// An empty mask (nothing allowed) over `len` ids.
    pub fn new(len: usize) -> Self {
        Self {
            words: vec![0; len.div_ceil(32)],
            len,
        }
    }

    /// The vocabulary size the mask covers.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn allows(&self, id: u32) -> bool {
        let i = id as usize;
        i < self.len && self.words[i / 32] & (1 << (i % 32)) != 0
    }

    /// Allows `id`; ids outside the vocabulary are ignored.
    pub fn allow(&mut self, id: u32) {
        let i = id as usize;
        if i < self.len {
            self.words[i / 32] |= 1 << (i % 32);
        }
    }

    pub fn forbid(&mut self, id: u32) {
        let i = id as usize;
        if i < self.len {
            self.words[i / 32] &= !(1 << (i % 32));
        }
    }

    /// Nothing allowed.
    pub fn clear(&mut self) {
        self.words.fill(0);
    }

    /// Everything allowed.
    pub fn allow_all(&mut self) {
        self.words.fill(!0);
        self.trim();
    }

    /// Sets the mask from words in this layout (a longer source is cut at the vocabulary; a
    /// shorter one leaves the rest forbidden).
    pub fn copy_from_words(&mut self, src: &[u32]) {
        let n = src.len().min(self.words.len());
        self.words[..n].copy_from_slice(&src[..n]);
        self.words[n..].fill(0);
        self.trim();
    }

    /// Allowed ids.
    pub fn count(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// The allowed ids, ascending.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.words.iter().enumerate().flat_map(|(wi, &w)| {
            let mut bits = w;
            std::iter::from_fn(move || {
                (bits != 0).then(|| {
                    let b = bits.trailing_zeros();
                    bits &= bits - 1;
                    (wi * 32) as u32 + b
                })
            })
        })
    }

    /// `out` = `logits` where allowed, `-inf` elsewhere (one pass, whole words at a time).
    pub(super) fn apply(&self, logits: &[f32], out: &mut Vec<f32>) {
        out.clear();
        out.resize(logits.len(), f32::NEG_INFINITY);
        for (wi, (&w, dst)) in self.words.iter().zip(out.chunks_mut(32)).enumerate() {
            if w == 0 {
                continue;
            }
            let src = &logits[wi * 32..wi * 32 + dst.len()];
            if w == !0 {
                dst.copy_from_slice(src);
            } else {
                for (b, (d, &s)) in dst.iter_mut().zip(src).enumerate() {
                    if w & (1 << b) != 0 {
                        *d = s;
                    }
                }
            }
        }
    }

    fn trim(&mut self) {
        let tail = self.len % 32;
        if tail != 0 {
            if let Some(last) = self.words.last_mut() {
                *last &= (1u32 << tail) - 1;
            }
        }
    }
}

/// The model's probability of `id` among the ids `mask` allows (all of them without a mask):
/// the softmax of the raw logits restricted to those ids, at temperature 1. The sampler's
/// settings (temperature, penalties, bias, top-k/p filters) are not applied: greedy decoding
/// would make every drawn token certain, which says nothing about the model. 0 for an id the
/// mask forbids or a row with nothing finite allowed.
pub fn probability(logits: &[f32], mask: Option<&TokenMask>, id: u32) -> f32 {
    let Some(&own) = logits.get(id as usize) else {
        return 0.0;
    };
    if mask.is_some_and(|m| !m.allows(id)) || !own.is_finite() {
        return 0.0;
    }
    // Shifted by the drawn logit: exp never overflows for the ids that matter, and the
    // drawn id contributes exactly 1.
    let mut sum = 0.0f64;
    let mut add = |l: f32| {
        if l.is_finite() {
            sum += f64::from(l - own).exp();
        }
    };
    match mask {
        Some(m) => m.iter().for_each(|i| add(logits[i as usize])),
        None => logits.iter().for_each(|&l| add(l)),
    }
    if sum.is_finite() && sum > 0.0 {
        (1.0 / sum) as f32
    } else {
        0.0
    }
}

/// A constraint failed (its engine reported an error, or a token it never allowed was fed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("constrained decoding: {0}")]
pub struct ConstraintError(pub String);

/// What the decode loop asks of a constraint, once per step: the allowed ids, then the id
/// drawn. `Send`, so a request can carry its constraint to the thread that owns the model.
pub trait TokenConstraint: Send {
    /// Writes the ids allowed next into `mask` (sized to the model's vocabulary). The end of
    /// the answer is one of the request's stop ids, allowed only when the output so far is
    /// complete.
    fn next_mask(&mut self, mask: &mut TokenMask) -> Result<(), ConstraintError>;

    /// Advances over `id`, the token drawn from the last mask (a stop id ends the output).
    fn accept(&mut self, id: u32) -> Result<(), ConstraintError>;

    /// Nothing may follow: the output is complete and admits no continuation, so decoding
    /// stops here (`finish_reason` `stop`) without waiting for the model's eos.
    fn is_finished(&self) -> bool;

    /// The output so far is complete (it may still admit a continuation, as a number may).
    fn is_complete(&mut self) -> bool;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_bits_and_iteration() {
        let mut m = TokenMask::new(70);
        assert_eq!(m.count(), 0);
        for id in [0, 31, 32, 69, 70, 1000] {
            m.allow(id);
        }
        assert_eq!(m.iter().collect::<Vec<_>>(), vec![0, 31, 32, 69]);
        assert!(m.allows(69) && !m.allows(70) && !m.allows(1));
        m.forbid(31);
        assert_eq!(m.count(), 3);
        m.allow_all();
        assert_eq!(m.count(), 70);
        m.copy_from_words(&[1, 0, !0, !0]);
        assert_eq!(
            m.iter().collect::<Vec<_>>(),
            vec![0, 64, 65, 66, 67, 68, 69]
        );
        let logits: Vec<f32> = (0..70).map(|i| i as f32).collect();
        let mut out = Vec::new();
        m.apply(&logits, &mut out);
        assert_eq!(out.len(), 70);
        assert_eq!(out[0], 0.0);
        assert_eq!(out[1], f32::NEG_INFINITY);
        assert_eq!(out[66], 66.0);
    }

    #[test]
    fn probability_is_the_softmax_over_the_allowed_ids() {
        let logits = [0.0f32, (2.0f32).ln(), 5.0, f32::NEG_INFINITY];
        let mut m = TokenMask::new(4);
        m.allow(0);
        m.allow(1);
        m.allow(3);
        assert!((probability(&logits, Some(&m), 1) - 2.0 / 3.0).abs() < 1e-6);
        assert!((probability(&logits, Some(&m), 0) - 1.0 / 3.0).abs() < 1e-6);
        assert_eq!(probability(&logits, Some(&m), 2), 0.0);
        assert_eq!(probability(&logits, Some(&m), 3), 0.0);
        let all = probability(&logits, None, 2);
        let want = 5.0f64.exp() / (1.0 + 2.0 + 5.0f64.exp());
        assert!((f64::from(all) - want).abs() < 1e-6);
        assert_eq!(probability(&logits, None, 9), 0.0);
    }
}

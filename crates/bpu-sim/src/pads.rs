//! How a padded prefill graph tells its pad rows from the real ones. BLLM's padding code is
//! not public, so a package's graph may have been compiled for any of several markings: the
//! pads' rope (cos 1 / sin 0, or cos 0 / sin 0) and the pads' mask row (every column
//! masked, or only the row's own slot open). A simulated graph of one marking takes as pads
//! exactly the rows that carry its marking in every respect and runs everything else as
//! real rows, so a runtime marking pads another way gets wrong numbers, as it would from a
//! graph compiled for that marking.

use serde::{Deserialize, Serialize};

/// Rope values in a pad row.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PadRope {
    /// cos 1, sin 0 (the rotation of position 0: the pad row is left unrotated).
    #[default]
    Identity,
    /// cos 0, sin 0 (the pad's q and k become zero).
    Zero,
}

impl PadRope {
    pub fn is_identity(&self) -> bool {
        *self == PadRope::Identity
    }

    /// `identity` or `zero`.
    pub fn as_str(self) -> &'static str {
        match self {
            PadRope::Identity => "identity",
            PadRope::Zero => "zero",
        }
    }

    /// The (cos, sin) a pad row carries.
    pub fn values(self) -> (f32, f32) {
        match self {
            PadRope::Identity => (1.0, 0.0),
            PadRope::Zero => (0.0, 0.0),
        }
    }
}

impl std::str::FromStr for PadRope {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "identity" => Ok(PadRope::Identity),
            "zero" => Ok(PadRope::Zero),
            other => Err(format!("pad rope {other:?}: expected `identity` or `zero`")),
        }
    }
}

/// The mask row of a pad.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PadMask {
    /// Every column masked.
    #[default]
    Masked,
    /// Only the pad's own window slot open (its softmax has one finite entry).
    #[serde(rename = "self")]
    SelfOnly,
}

impl PadMask {
    pub fn is_masked(&self) -> bool {
        *self == PadMask::Masked
    }

    /// `masked` or `self`.
    pub fn as_str(self) -> &'static str {
        match self {
            PadMask::Masked => "masked",
            PadMask::SelfOnly => "self",
        }
    }
}

impl std::str::FromStr for PadMask {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "masked" => Ok(PadMask::Masked),
            "self" => Ok(PadMask::SelfOnly),
            other => Err(format!("pad mask {other:?}: expected `masked` or `self`")),
        }
    }
}

/// Tolerance on a pad's rope values (an input tensor may be stored in a narrower type).
const ROPE_TOL: f32 = 1e-3;

/// The inputs of one `n`-row chunk as a padded graph reads them to find its pads.
pub(crate) struct ChunkView<'a> {
    pub cos: &'a [f32],
    pub sin: &'a [f32],
    /// Plane 0 of the mask, `n × window`.
    pub mask: &'a [f32],
    pub n: usize,
    pub window: usize,
}

impl ChunkView<'_> {
    /// Whether row `j` carries both `rope` and `mask` (a real row never has cos 0 everywhere
    /// and always sees itself; it can only look like an `identity` + `self` pad when it is the
    /// first row of an empty window, which the runtime avoids).
    pub(crate) fn is_pad(&self, j: usize, rope: PadRope, mask: PadMask) -> bool {
        let rot = self.cos.len() / self.n.max(1);
        let (c0, s0) = rope.values();
        let near = |v: &[f32], want: f32| v.iter().all(|&x| (x - want).abs() <= ROPE_TOL);
        let rope_ok = rot > 0
            && near(&self.cos[j * rot..(j + 1) * rot], c0)
            && near(&self.sin[j * rot..(j + 1) * rot], s0);
        if !rope_ok {
            return false;
        }
        let cl = self.window;
        let row = &self.mask[j * cl..(j + 1) * cl];
        let open = |v: f32| v > qwen35::MASK_NEG / 2.0;
        match mask {
            PadMask::Masked => !row.iter().any(|&v| open(v)),
            PadMask::SelfOnly => {
                // Row j's own slot once the graph has shifted the window by n.
                let own = cl - self.n + j;
                row.iter().enumerate().all(|(c, &v)| open(v) == (c == own))
            }
        }
    }

    /// Rows carrying the marking, wherever they are.
    pub(crate) fn pads(&self, rope: PadRope, mask: PadMask) -> usize {
        (0..self.n).filter(|&j| self.is_pad(j, rope, mask)).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_round_trip() {
        for r in [PadRope::Identity, PadRope::Zero] {
            assert_eq!(r.as_str().parse::<PadRope>().unwrap(), r);
            let j = serde_json::to_string(&r).unwrap();
            assert_eq!(j, format!("\"{}\"", r.as_str()));
        }
        for m in [PadMask::Masked, PadMask::SelfOnly] {
            assert_eq!(m.as_str().parse::<PadMask>().unwrap(), m);
            let j = serde_json::to_string(&m).unwrap();
            assert_eq!(j, format!("\"{}\"", m.as_str()));
        }
        assert!("one".parse::<PadRope>().is_err());
        assert!("open".parse::<PadMask>().is_err());
    }

    #[test]
    fn a_row_is_a_pad_only_with_both_markings() {
        // Two rows, window 4, rot 2: row 0 real at position 1 seeing slots 1..=2, row 1 a pad.
        let n = 2;
        let cl = 4;
        let neg = qwen35::MASK_NEG;
        let cos = [0.5, 0.8, 1.0, 1.0];
        let sin = [0.8, 0.6, 0.0, 0.0];
        // Pad row 1 sees only its own slot (cl − n + 1 = 3).
        let mask = [neg, 0.0, 0.0, neg, neg, neg, neg, 0.0];
        let v = ChunkView {
            cos: &cos,
            sin: &sin,
            mask: &mask,
            n,
            window: cl,
        };
        assert!(!v.is_pad(0, PadRope::Identity, PadMask::SelfOnly));
        assert!(v.is_pad(1, PadRope::Identity, PadMask::SelfOnly));
        assert!(!v.is_pad(1, PadRope::Identity, PadMask::Masked));
        assert!(!v.is_pad(1, PadRope::Zero, PadMask::SelfOnly));
        assert_eq!(v.pads(PadRope::Identity, PadMask::SelfOnly), 1);
        assert_eq!(v.pads(PadRope::Zero, PadMask::Masked), 0);
        // Fully masked and zero rope.
        let cos = [0.5, 0.8, 0.0, 0.0];
        let mask = [neg, 0.0, 0.0, neg, neg, neg, neg, neg];
        let v = ChunkView {
            cos: &cos,
            mask: &mask,
            ..v
        };
        assert!(v.is_pad(1, PadRope::Zero, PadMask::Masked));
        assert!(!v.is_pad(1, PadRope::Identity, PadMask::Masked));
        assert!(!v.is_pad(1, PadRope::Zero, PadMask::SelfOnly));
    }
}

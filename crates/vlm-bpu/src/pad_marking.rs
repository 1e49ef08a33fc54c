//! How the pad rows of a padded prompt tail are marked ([`crate::tail`]). Nothing published
//! says what a prefill graph compiled for pads expects, only that the one public padding code
//! of the same toolchain (for another model) puts pads last with x = 0 and cos = sin = 0,
//! while this runtime used to mark pads with cos 1 / sin 0 and a fully masked mask row. A
//! graph tells its pads from real rows by some such marking, so a runtime marking pads
//! another way feeds the pads to it as real rows. The calibration at open therefore tries
//! every [`PadMarking`] and keeps the one that reproduces stepping.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::tail::PadLayout;

/// Rope values of a pad row (`vlm make-sim-package --pad-rope`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PadRope {
    /// cos 1, sin 0: the pad is left unrotated.
    #[default]
    Identity,
    /// cos 0, sin 0: the pad's q and k vanish.
    Zero,
}

impl PadRope {
    /// `identity` or `zero`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Identity => "identity",
            Self::Zero => "zero",
        }
    }

    /// The (cos, sin) written into every rope entry of a pad row.
    fn values(self) -> (f32, f32) {
        match self {
            Self::Identity => (1.0, 0.0),
            Self::Zero => (0.0, 0.0),
        }
    }
}

/// Mask row of a pad (`vlm make-sim-package --pad-mask`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PadMask {
    /// Every column masked.
    #[default]
    Masked,
    /// Only the pad's own window slot open (so its softmax has a finite entry).
    #[serde(rename = "self")]
    SelfOnly,
}

impl PadMask {
    /// `masked` or `self`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Masked => "masked",
            Self::SelfOnly => "self",
        }
    }
}

/// Where the pads of a padded chunk go and how they are marked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PadMarking {
    pub layout: PadLayout,
    pub rope: PadRope,
    pub mask: PadMask,
}

impl PadMarking {
    /// The marking of a forced `pads_first` / `pads_last`: cos 1 / sin 0, fully masked.
    pub fn default_for(layout: PadLayout) -> Self {
        Self {
            layout,
            rope: PadRope::Identity,
            mask: PadMask::Masked,
        }
    }

    /// Every marking, in the order the calibration tries them (a tie goes to the earlier one,
    /// so the default marking of a layout wins a tie with its variants).
    pub fn all() -> [Self; 8] {
        let mut out = [Self::default_for(PadLayout::First); 8];
        let mut i = 0;
        for layout in [PadLayout::First, PadLayout::Last] {
            for rope in [PadRope::Identity, PadRope::Zero] {
                for mask in [PadMask::Masked, PadMask::SelfOnly] {
                    out[i] = Self { layout, rope, mask };
                    i += 1;
                }
            }
        }
        out
    }

    /// Whether the first row of an empty window could pass for a pad: it sits at position 0
    /// (rope cos 1 / sin 0) and sees only its own slot, which is exactly an `identity` +
    /// `self` pad. Such a chunk is not padded (its first row is stepped).
    pub fn ambiguous_in_empty_window(self) -> bool {
        self.rope == PadRope::Identity && self.mask == PadMask::SelfOnly
    }
}

impl fmt::Display for PadMarking {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let layout = match self.layout {
            PadLayout::First => "first",
            PadLayout::Last => "last",
        };
        write!(
            f,
            "pads {layout}, rope {}, mask {}",
            self.rope.as_str(),
            self.mask.as_str()
        )
    }
}

/// The pieces of a padded run's fixed inputs that carry the pads.
pub(crate) struct PadRows<'a> {
    /// The `n` real rows, `n × hidden`.
    pub rows: &'a [f32],
    pub hidden: usize,
    /// Rope entries per row.
    pub rot: usize,
    /// Window (`CL`).
    pub window: usize,
    /// Rows the graph runs (`N`).
    pub g_rows: usize,
}

/// Adds the `N − n` pads to the real rows' `cos`, `sin` (`n × rot` each) and to the `N`-row
/// window `mask` (every head plane) where `m` says, and returns `x`: the real rows with zero
/// pad rows. A real row never sees a pad slot.
pub(crate) fn pad_inputs(
    m: PadMarking,
    p: &PadRows,
    cos: &mut Vec<f32>,
    sin: &mut Vec<f32>,
    mask: &mut [f32],
) -> Vec<f32> {
    let (h, rot, cl, g) = (p.hidden, p.rot, p.window, p.g_rows);
    let n = p.rows.len() / h.max(1);
    let pads = g - n;
    let (pc, ps) = m.rope.values();
    // Chunk rows [first_pad, first_pad + pads) are the pads.
    let first_pad = match m.layout {
        PadLayout::First => 0,
        PadLayout::Last => n,
    };
    let mut x = Vec::with_capacity(g * h);
    match m.layout {
        PadLayout::Last => {
            cos.resize(g * rot, pc);
            sin.resize(g * rot, ps);
            x.extend_from_slice(p.rows);
            x.resize(g * h, 0.0);
        }
        PadLayout::First => {
            cos.splice(0..0, std::iter::repeat_n(pc, pads * rot));
            sin.splice(0..0, std::iter::repeat_n(ps, pads * rot));
            x.resize(pads * h, 0.0);
            x.extend_from_slice(p.rows);
        }
    }
    for plane in mask.chunks_exact_mut(g * cl) {
        if m.layout == PadLayout::First {
            // Real row j (row pads + j) sees the old slots and the new rows up to its own,
            // never the pad slots [CL − N, CL − n) between them. With pads last the window
            // mask already keeps each real row off the later (pad) slots.
            for row in plane[pads * cl..].chunks_exact_mut(cl) {
                row[cl - g..cl - n].fill(qwen35::MASK_NEG);
            }
        }
        for j in first_pad..first_pad + pads {
            let row = &mut plane[j * cl..(j + 1) * cl];
            row.fill(qwen35::MASK_NEG);
            if m.mask == PadMask::SelfOnly {
                // Chunk row j's own slot once the graph has shifted the window by N.
                row[cl - g + j] = 0.0;
            }
        }
    }
    x
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eight_distinct_markings_defaults_first() {
        let all = PadMarking::all();
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert_ne!(a, b);
            }
        }
        assert_eq!(all[0], PadMarking::default_for(PadLayout::First));
        assert_eq!(all[4], PadMarking::default_for(PadLayout::Last));
        let j = serde_json::to_value(all[7]).unwrap();
        assert_eq!(
            j,
            serde_json::json!({"layout": "last", "rope": "zero", "mask": "self"})
        );
    }

    fn padded(m: PadMarking) -> (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>) {
        // Two real rows (hidden 1, rot 1) at P = 1 in a window of 6, chunk of 4.
        let rows = [5.0, 6.0];
        let (mut cos, mut sin) = (vec![0.5, 0.6], vec![0.8, 0.7]);
        let mut mask = qwen35::window_mask(1, 4, 6, 1);
        let p = PadRows {
            rows: &rows,
            hidden: 1,
            rot: 1,
            window: 6,
            g_rows: 4,
        };
        let x = pad_inputs(m, &p, &mut cos, &mut sin, &mut mask);
        (x, cos, sin, mask)
    }

    #[test]
    fn pads_first_zero_rope_own_slot() {
        let m = PadMarking {
            layout: PadLayout::First,
            rope: PadRope::Zero,
            mask: PadMask::SelfOnly,
        };
        let (x, cos, sin, mask) = padded(m);
        assert_eq!(x, [0.0, 0.0, 5.0, 6.0]);
        assert_eq!(cos, [0.0, 0.0, 0.5, 0.6]);
        assert_eq!(sin, [0.0, 0.0, 0.8, 0.7]);
        let open =
            |r: usize| -> Vec<usize> { (0..6).filter(|&c| mask[r * 6 + c] == 0.0).collect() };
        // Pads see their own slots 2 and 3; the real rows the old slot 1 and the new rows up
        // to their own (4, 5), never a pad slot.
        assert_eq!(open(0), [2]);
        assert_eq!(open(1), [3]);
        assert_eq!(open(2), [1, 4]);
        assert_eq!(open(3), [1, 4, 5]);
    }

    #[test]
    fn pads_last_default_marking() {
        let (x, cos, sin, mask) = padded(PadMarking::default_for(PadLayout::Last));
        assert_eq!(x, [5.0, 6.0, 0.0, 0.0]);
        assert_eq!(cos, [0.5, 0.6, 1.0, 1.0]);
        assert_eq!(sin, [0.8, 0.7, 0.0, 0.0]);
        let open =
            |r: usize| -> Vec<usize> { (0..6).filter(|&c| mask[r * 6 + c] == 0.0).collect() };
        assert_eq!(open(0), [1, 2]);
        assert_eq!(open(1), [1, 2, 3]);
        assert!(open(2).is_empty() && open(3).is_empty());
    }
}

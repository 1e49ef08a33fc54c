//! Positions: M-RoPE position ids for mixed image/text sequences, cos/sin tables in the HF
//! rotate-half layout, and the right-aligned additive window mask of the package contract.

use crate::error::{Error, Result};

/// One token's rope coordinates (temporal, height, width). Text tokens use `(p, p, p)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Pos3 {
    pub t: i64,
    pub h: i64,
    pub w: i64,
}

impl Pos3 {
    pub fn text(p: i64) -> Self {
        Self { t: p, h: p, w: p }
    }
    fn axis(&self, a: usize) -> i64 {
        match a {
            1 => self.h,
            2 => self.w,
            _ => self.t,
        }
    }
    pub fn max(&self) -> i64 {
        self.t.max(self.h).max(self.w)
    }
}

/// Additive mask value for a hidden column (contract `kMaskNegInf`; never -inf).
pub const MASK_NEG: f32 = -1e9;

/// cos and sin tables `[n, rot]` for `positions`: for frequency `i < rot/2`, angle =
/// `pos[axes[i]] · theta^(-2i/rot)` (computed in f64), written at `i` and `i + rot/2`.
pub fn rope_tables(
    positions: &[Pos3],
    rot: usize,
    theta: f64,
    axes: &[usize],
) -> (Vec<f32>, Vec<f32>) {
    let half = rot / 2;
    let inv: Vec<f64> = (0..half)
        .map(|i| theta.powf(-(2.0 * i as f64) / rot as f64))
        .collect();
    let mut cos = vec![0.0f32; positions.len() * rot];
    let mut sin = vec![0.0f32; positions.len() * rot];
    for (r, p) in positions.iter().enumerate() {
        for i in 0..half {
            let a = p.axis(axes.get(i).copied().unwrap_or(0)) as f64 * inv[i];
            let (s, c) = a.sin_cos();
            cos[r * rot + i] = c as f32;
            cos[r * rot + i + half] = c as f32;
            sin[r * rot + i] = s as f32;
            sin[r * rot + i + half] = s as f32;
        }
    }
    (cos, sin)
}

/// Additive mask `[heads, n, cl]` for `n` new rows entering a right-aligned window of `cl`
/// slots that already holds `consumed` rows (docs/package-contract.md §3.4/§4.3): with `T = consumed + n` and
/// `lo = cl - min(T, cl)`, row `j` sees columns `[lo, cl - n + j]`; every head plane is the same.
pub fn window_mask(consumed: usize, n: usize, cl: usize, heads: usize) -> Vec<f32> {
    let mut plane = vec![MASK_NEG; n * cl];
    let lo = cl - (consumed + n).min(cl);
    for j in 0..n {
        let hi = (cl + j + 1).saturating_sub(n); // exclusive
        for c in lo..hi.min(cl) {
            plane[j * cl + c] = 0.0;
        }
    }
    let mut out = Vec::with_capacity(heads * n * cl);
    for _ in 0..heads {
        out.extend_from_slice(&plane);
    }
    out
}

/// One image placed in a token sequence: its patch grid `(t, h, w)` in patches (before merge).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageGrid {
    pub t: usize,
    pub h: usize,
    pub w: usize,
}

/// M-RoPE positions for a token sequence in which each maximal run of `image_token_id` is one
/// image (in order of `grids`, merged by `merge`). Text runs advance all axes by one; an image
/// starting at `p` gets `(p + ti, p + row, p + col)`; the next token starts after the largest
/// coordinate used. Returns the positions and `rope_delta = max + 1 - len`.
pub fn mrope_positions(
    ids: &[u32],
    image_token_id: u32,
    grids: &[ImageGrid],
    merge: usize,
) -> Result<(Vec<Pos3>, i64)> {
    let mut out = Vec::with_capacity(ids.len());
    let mut next: i64 = 0;
    let mut i = 0;
    let mut img = 0;
    while i < ids.len() {
        if ids[i] != image_token_id {
            out.push(Pos3::text(next));
            next += 1;
            i += 1;
            continue;
        }
        let run = ids[i..]
            .iter()
            .take_while(|&&x| x == image_token_id)
            .count();
        let g = grids.get(img).ok_or_else(|| Error::Positions {
            reason: format!("image slot {img} (token {i}) has no image grid"),
        })?;
        if merge == 0 || g.h % merge != 0 || g.w % merge != 0 {
            return Err(Error::Positions {
                reason: format!(
                    "image {img}: grid {}x{} not divisible by merge {merge}",
                    g.h, g.w
                ),
            });
        }
        let (mh, mw) = (g.h / merge, g.w / merge);
        if run != g.t * mh * mw {
            return Err(Error::Positions {
                reason: format!(
                    "image slot {img} (token {i}) has {run} pad tokens but the image gives {} rows",
                    g.t * mh * mw
                ),
            });
        }
        let st = next;
        for ti in 0..g.t {
            for r in 0..mh {
                for c in 0..mw {
                    out.push(Pos3 {
                        t: st + ti as i64,
                        h: st + r as i64,
                        w: st + c as i64,
                    });
                }
            }
        }
        next = st + (g.t.max(mh).max(mw)) as i64;
        i += run;
        img += 1;
    }
    if img != grids.len() {
        return Err(Error::Positions {
            reason: format!(
                "{} image grids given but the sequence has {img} image slots",
                grids.len()
            ),
        });
    }
    Ok((out, next - ids.len() as i64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_mask_row_matches_contract() {
        // P = 2 consumed, CL = 5: valid = 3 → columns 2,3,4 open
        let m = window_mask(2, 1, 5, 2);
        let want = [MASK_NEG, MASK_NEG, 0.0, 0.0, 0.0];
        assert_eq!(&m[..5], &want);
        assert_eq!(&m[5..], &want);
    }

    #[test]
    fn prefill_mask_is_causal_inside_chunk() {
        // P = 1, N = 3, CL = 6: lo = 2; row j sees [2, 3 + j]
        let m = window_mask(1, 3, 6, 1);
        for j in 0..3 {
            for c in 0..6 {
                let open = (2..=3 + j).contains(&c);
                assert_eq!(m[j * 6 + c] == 0.0, open, "row {j} col {c}");
            }
        }
        // full window: everything up to the row's slot is open
        let f = window_mask(10, 2, 4, 1);
        assert_eq!(&f[..4], &[0.0, 0.0, 0.0, MASK_NEG]);
        assert_eq!(&f[4..], &[0.0; 4]);
    }

    #[test]
    fn text_tables_reduce_to_plain_rope() {
        let axes = crate::config::mrope_axes(4, &[2, 1, 1]);
        let (c, s) = rope_tables(&[Pos3::text(3)], 8, 100.0, &axes);
        for i in 0..4 {
            let a = 3.0 * 100f64.powf(-(2.0 * i as f64) / 8.0);
            assert!((c[i] as f64 - a.cos()).abs() < 1e-6 && (c[i + 4] - c[i]).abs() == 0.0);
            assert!((s[i] as f64 - a.sin()).abs() < 1e-6 && (s[i + 4] - s[i]).abs() == 0.0);
        }
    }

    #[test]
    fn image_positions_follow_hf_rule() {
        // 2 text, vision_start, 2x2 merged image (grid 4x4 with merge 2), vision_end, text
        let ids = [5, 6, 98, 100, 100, 100, 100, 99, 7];
        let (p, delta) = mrope_positions(&ids, 100, &[ImageGrid { t: 1, h: 4, w: 4 }], 2).unwrap();
        assert_eq!(p[2], Pos3::text(2));
        assert_eq!(p[3], Pos3 { t: 3, h: 3, w: 3 });
        assert_eq!(p[4], Pos3 { t: 3, h: 3, w: 4 });
        assert_eq!(p[5], Pos3 { t: 3, h: 4, w: 3 });
        assert_eq!(p[7], Pos3::text(5));
        assert_eq!(p[8], Pos3::text(6));
        assert_eq!(delta, 7 - 9);
        let err = mrope_positions(&ids[..6], 100, &[ImageGrid { t: 1, h: 4, w: 4 }], 2);
        assert!(err.is_err());
    }
}

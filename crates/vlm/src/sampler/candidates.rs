//! The search for the largest logits of a row. It is apart from sampling because it is the
//! only part whose cost grows with the vocabulary — 248k logits per token, against a few
//! hundred candidates for everything after it — so it is written for the vectoriser rather
//! than for the reader: packed block maxima first, then element-wise work only in the
//! blocks that can hold a winner. A heap or a sort would be shorter, but their
//! data-dependent branches mispredict on a random-looking row and cost more than the scan.
//!
//! [`argmax`] is the one-candidate case, kept apart from [`top_n`] because greedy decoding
//! needs no candidate list and a lowest-index tie rule that `top_n` does not give.

/// Block scanned with one vectorised max before any per-element work.
const BLOCK: usize = 64;
/// Independent accumulators per block: four 4-wide chains even on the baseline x86-64
/// target (SSE2), so the scan is bound by loads, not by `maxps` latency.
const LANES: usize = 16;

/// Largest value of a block (NaN ignored), written as lane-wise selects so it compiles to
/// packed max instructions; a full block has a fixed length, so the loop unrolls.
#[inline]
fn block_max(block: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let mut lanes = block.chunks_exact(LANES);
    for c in &mut lanes {
        for (a, &v) in acc.iter_mut().zip(c) {
            *a = if v > *a { v } else { *a };
        }
    }
    // Halving tree of selects: no data-dependent branch (a scalar `if v > m` loop
    // mispredicts on every block of a random-looking logits row).
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for i in 0..width {
            acc[i] = if acc[i + width] > acc[i] {
                acc[i + width]
            } else {
                acc[i]
            };
        }
    }
    let mut m = acc[0];
    for &v in lanes.remainder() {
        m = if v > m { v } else { m };
    }
    m
}

/// The maximum of each `BLOCK`-sized block of `logits`, in order (the last block may be
/// shorter). Full blocks go through a fixed-size path so the compiler unrolls them.
fn block_maxima(logits: &[f32]) -> impl Iterator<Item = f32> + '_ {
    let full = logits.chunks_exact(BLOCK);
    let rest = full.remainder();
    full.map(|b| match <&[f32; BLOCK]>::try_from(b) {
        Ok(b) => block_max(b),
        Err(_) => block_max(b),
    })
    .chain((!rest.is_empty()).then(|| block_max(rest)))
}

/// Index of the largest logit (lowest index on ties; NaN ignored).
pub fn argmax(logits: &[f32]) -> Option<u32> {
    let mut best_v = f32::NEG_INFINITY;
    let mut best_i = None;
    let mut base = 0;
    for (block, m) in logits.chunks(BLOCK).zip(block_maxima(logits)) {
        if m > best_v {
            best_v = m;
            best_i = block.iter().position(|&v| v == m).map(|j| base + j);
        }
        base += block.len();
    }
    if best_i.is_none() {
        // Every value is -inf or NaN: the first -inf is the argmax.
        return logits
            .iter()
            .position(|v| *v == f32::NEG_INFINITY)
            .map(|i| i as u32);
    }
    best_i.map(|i| i as u32)
}

/// The `n` largest logits (unordered) into `out`; NaN and `-inf` never qualify (neither can
/// be drawn), so fewer than `n` come out of a row with fewer finite logits.
///
/// Two vectorised-friendly passes instead of a heap (whose unpredictable sift branches
/// cost more than the scan): block maxima, then `t` = the n-th largest block maximum —
/// at least `n` logits are ≥ `t`, one per such block — and only blocks whose maximum
/// reaches `t` are scanned for values ≥ `t`; a final selection trims to `n`. A block whose
/// maximum is `-inf` is never scanned: a masked row (constrained decoding, every forbidden
/// logit `-inf`) costs the block maxima plus the blocks that hold allowed ids.
pub(super) fn top_n(
    logits: &[f32],
    n: usize,
    out: &mut Vec<(f32, u32)>,
    maxima: &mut Vec<f32>,
    sel: &mut Vec<f32>,
) {
    out.clear();
    if n == 0 {
        return;
    }
    let desc = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0);
    maxima.clear();
    maxima.extend(block_maxima(logits));
    if maxima.len() <= n {
        out.extend(
            logits
                .iter()
                .enumerate()
                .filter(|(_, &v)| v > f32::NEG_INFINITY)
                .map(|(i, &v)| (v, i as u32)),
        );
    } else {
        sel.clear();
        sel.extend_from_slice(maxima);
        sel.select_nth_unstable_by(n - 1, |a, b| b.total_cmp(a));
        let t = sel[n - 1];
        for (bi, block) in logits.chunks(BLOCK).enumerate() {
            if maxima[bi] >= t && maxima[bi] > f32::NEG_INFINITY {
                let base = bi * BLOCK;
                out.extend(
                    block
                        .iter()
                        .enumerate()
                        .filter(|(_, &v)| v >= t && v > f32::NEG_INFINITY)
                        .map(|(j, &v)| (v, (base + j) as u32)),
                );
            }
        }
    }
    if out.len() > n {
        out.select_nth_unstable_by(n - 1, desc);
        out.truncate(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn top_n_finds_the_largest() {
        let mut logits: Vec<f32> = (0..5000)
            .map(|i| ((i * 7919) % 5000) as f32 * 0.001)
            .collect();
        logits[4321] = 100.0;
        logits[17] = f32::NAN;
        let mut out = Vec::new();
        top_n(&logits, 512, &mut out, &mut Vec::new(), &mut Vec::new());
        let mut got: Vec<u32> = out.iter().map(|c| c.1).collect();
        got.sort_unstable();
        let mut idx: Vec<u32> = (0..5000u32).filter(|&i| i != 17).collect();
        idx.sort_by(|&a, &b| logits[b as usize].total_cmp(&logits[a as usize]));
        let mut want = idx[..512].to_vec();
        want.sort_unstable();
        assert_eq!(got, want);
        assert_eq!(argmax(&[f32::NEG_INFINITY, f32::NEG_INFINITY]), Some(0));
        assert_eq!(argmax(&[1.0, 3.0, 3.0]), Some(1));
    }

    /// The obvious argmax: one scalar pass, first maximum, NaN ignored, and the first
    /// `-inf` when nothing else is left.
    fn reference_argmax(logits: &[f32]) -> Option<u32> {
        let mut best: Option<usize> = None;
        for (i, &v) in logits.iter().enumerate() {
            if v.is_nan() {
                continue;
            }
            if best.is_none_or(|b| v > logits[b]) {
                best = Some(i);
            }
        }
        best.map(|i| i as u32)
    }

    /// A row with the shapes the block search has to get right: lengths around the block
    /// size, NaN and `-inf` (sometimes whole blocks of them), and ties at the top.
    fn awkward_row(rng: &mut ChaCha8Rng) -> Vec<f32> {
        let len = match rng.random_range(0..4) {
            0 => rng.random_range(1..3 * BLOCK),
            1 => BLOCK * rng.random_range(1..40),
            _ => rng.random_range(1..5000),
        };
        let mut row: Vec<f32> = (0..len)
            .map(|_| {
                let u: f32 = rng.random();
                if u < 0.02 {
                    f32::NAN
                } else if u < 0.04 {
                    f32::NEG_INFINITY
                } else {
                    // Coarse values tie often.
                    (rng.random_range(-40i32..40) as f32) * 0.25
                }
            })
            .collect();
        if rng.random::<f32>() < 0.2 {
            let fill = if rng.random() {
                f32::NAN
            } else {
                f32::NEG_INFINITY
            };
            let start = rng.random_range(0..len);
            let end = (start + rng.random_range(1..3 * BLOCK)).min(len);
            row[start..end].fill(fill);
        }
        if rng.random::<f32>() < 0.05 {
            row.fill(f32::NEG_INFINITY);
        }
        if rng.random::<f32>() < 0.05 {
            row.fill(f32::NAN);
        }
        row
    }

    /// The block search is a fast path for two plain scans; on rows with NaN, `-inf`, ties
    /// and partial blocks it gives what they give: the same argmax, and `n` largest values
    /// (ids may differ only among ties at the threshold) that really are those logits.
    #[test]
    fn block_search_matches_a_plain_scan_and_a_sort() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let (mut out, mut maxima, mut sel) = (Vec::new(), Vec::new(), Vec::new());
        for case in 0..400 {
            let row = awkward_row(&mut rng);
            assert_eq!(argmax(&row), reference_argmax(&row), "case {case}");

            let mut sorted: Vec<f32> = row
                .iter()
                .copied()
                .filter(|&v| v > f32::NEG_INFINITY)
                .collect();
            sorted.sort_by(|a, b| b.total_cmp(a));
            for n in [0, 1, 2, 20, 512, rng.random_range(0..row.len() + 2)] {
                top_n(&row, n, &mut out, &mut maxima, &mut sel);
                let mut got: Vec<f32> = out.iter().map(|c| c.0).collect();
                got.sort_by(|a, b| b.total_cmp(a));
                let want = &sorted[..n.min(sorted.len())];
                assert_eq!(got, want, "case {case}, n {n}");
                let mut ids: Vec<u32> = out.iter().map(|c| c.1).collect();
                assert!(
                    out.iter()
                        .all(|&(v, id)| row[id as usize].total_cmp(&v).is_eq()),
                    "case {case}, n {n}: a value is not its logit"
                );
                ids.sort_unstable();
                ids.dedup();
                assert_eq!(ids.len(), out.len(), "case {case}, n {n}: repeated id");
            }
        }
    }
}

//! Vision tower (Qwen3-VL style ViT without deepstack) and the HF processor's normalise +
//! merge-order patchify of an RGB8 image.

use crate::config::VisionConfig;
use crate::error::{check_len, Error, Result};
use crate::layers::{attention, AttnMask, Linear};
use crate::ops::{apply_rotary, gelu_erf, gelu_tanh, layer_norm};
use crate::rope::ImageGrid;
use crate::weights::WeightStore;

/// LayerNorm epsilon of every vision norm.
const VISION_LN_EPS: f32 = 1e-6;
/// 2-D rotary base of the vision attention.
const VISION_ROPE_THETA: f64 = 10_000.0;

struct Block {
    norm1: (Vec<f32>, Vec<f32>),
    norm2: (Vec<f32>, Vec<f32>),
    qkv: Linear,
    proj: Linear,
    fc1: Linear,
    fc2: Linear,
}

/// `model.visual.*`.
pub struct VisionTower {
    cfg: VisionConfig,
    patch_embed: Linear,
    pos_embed: Vec<f32>,
    blocks: Vec<Block>,
    merger_norm: (Vec<f32>, Vec<f32>),
    merger_fc1: Linear,
    merger_fc2: Linear,
}

fn ln(ws: &WeightStore, p: &str, d: usize) -> Result<(Vec<f32>, Vec<f32>)> {
    Ok((
        ws.get_f32(&format!("{p}.weight"), &[d])?,
        ws.get_f32(&format!("{p}.bias"), &[d])?,
    ))
}

impl VisionTower {
    pub fn new(cfg: &VisionConfig, ws: &WeightStore, prefix: &str) -> Result<Self> {
        let d = cfg.hidden_size;
        let pe_name = format!("{prefix}patch_embed.proj.weight");
        let pe_w = ws.get_f32(
            &pe_name,
            &[
                d,
                cfg.in_channels,
                cfg.temporal_patch_size,
                cfg.patch_size,
                cfg.patch_size,
            ],
        )?;
        let pe_b = ws.get_f32(&format!("{prefix}patch_embed.proj.bias"), &[d])?;
        let mut blocks = Vec::with_capacity(cfg.depth);
        for i in 0..cfg.depth {
            let p = format!("{prefix}blocks.{i}.");
            blocks.push(Block {
                norm1: ln(ws, &format!("{p}norm1"), d)?,
                norm2: ln(ws, &format!("{p}norm2"), d)?,
                qkv: Linear::with_bias(ws, &format!("{p}attn.qkv"), 3 * d, d)?,
                proj: Linear::with_bias(ws, &format!("{p}attn.proj"), d, d)?,
                fc1: Linear::with_bias(
                    ws,
                    &format!("{p}mlp.linear_fc1"),
                    cfg.intermediate_size,
                    d,
                )?,
                fc2: Linear::with_bias(
                    ws,
                    &format!("{p}mlp.linear_fc2"),
                    d,
                    cfg.intermediate_size,
                )?,
            });
        }
        let m2 = d * cfg.spatial_merge_size * cfg.spatial_merge_size;
        Ok(Self {
            patch_embed: Linear::from_parts(pe_w, Some(pe_b), d, cfg.patch_len()),
            pos_embed: ws.get_f32(
                &format!("{prefix}pos_embed.weight"),
                &[cfg.num_position_embeddings, d],
            )?,
            blocks,
            merger_norm: ln(ws, &format!("{prefix}merger.norm"), d)?,
            merger_fc1: Linear::with_bias(ws, &format!("{prefix}merger.linear_fc1"), m2, m2)?,
            merger_fc2: Linear::with_bias(
                ws,
                &format!("{prefix}merger.linear_fc2"),
                cfg.out_hidden_size,
                m2,
            )?,
            cfg: cfg.clone(),
        })
    }

    pub fn config(&self) -> &VisionConfig {
        &self.cfg
    }

    /// Output rows of one image.
    pub fn rows_for(&self, g: ImageGrid) -> usize {
        let m = self.cfg.spatial_merge_size;
        g.t * g.h * g.w / (m * m)
    }

    /// `pixel_values [patches, C·T·P·P]` (images concatenated, each in merge order) with one
    /// grid per image → `[Σ rows, out_hidden_size]`.
    pub fn forward(&self, pixel_values: &[f32], grids: &[ImageGrid]) -> Result<Vec<f32>> {
        let cfg = &self.cfg;
        let m = cfg.spatial_merge_size;
        let total = self.patch_count(grids)?;
        check_len(
            "pixel_values [patches, C*T*P*P]",
            total * cfg.patch_len(),
            pixel_values.len(),
        )?;
        let mut x = self.patch_embed.forward(pixel_values, total);
        let rc = merge_order_positions(grids, m);
        self.add_position_embedding(&mut x, &rc);
        let (cos, sin) = self.rotary_tables(&rc);
        let frames = frame_spans(grids);
        for b in &self.blocks {
            self.block_forward(b, &mut x, total, &frames, &cos, &sin);
        }
        layer_norm(
            &mut x,
            &self.merger_norm.0,
            &self.merger_norm.1,
            VISION_LN_EPS,
        );
        let rows = total / (m * m);
        let mut hsn = self.merger_fc1.forward(&x, rows);
        hsn.iter_mut().for_each(|v| *v = gelu_erf(*v));
        Ok(self.merger_fc2.forward(&hsn, rows))
    }

    /// Patches of all images; every grid must be non-empty and divisible by the merge size.
    fn patch_count(&self, grids: &[ImageGrid]) -> Result<usize> {
        let m = self.cfg.spatial_merge_size;
        let mut total = 0;
        for g in grids {
            if g.t == 0 || g.h == 0 || g.w == 0 || g.h % m != 0 || g.w % m != 0 {
                return Err(Error::Image {
                    reason: format!(
                        "grid {}x{}x{} is empty or not divisible by merge {m}",
                        g.t, g.h, g.w
                    ),
                });
            }
            total += g.t * g.h * g.w;
        }
        Ok(total)
    }

    /// Adds the learned position grid, resampled bilinearly (align_corners) to each image's
    /// grid, to the patch rows.
    fn add_position_embedding(&self, x: &mut [f32], rc: &[PatchPos]) {
        let d = self.cfg.hidden_size;
        let side = self.cfg.pos_grid_side;
        let taps = |i: usize, n: usize| {
            let src = if n > 1 {
                i as f64 * (side - 1) as f64 / (n - 1) as f64
            } else {
                0.0
            };
            let f = src.floor() as usize;
            let f1 = (f + 1).min(side - 1);
            let w1 = (src - f as f64) as f32;
            (f.min(side - 1), f1, 1.0 - w1, w1)
        };
        for (p, &(r, c, gh, gw)) in rc.iter().enumerate() {
            let (r0, r1, wr0, wr1) = taps(r, gh);
            let (c0, c1, wc0, wc1) = taps(c, gw);
            let row = &mut x[p * d..(p + 1) * d];
            for (idx, wt) in [
                (r0 * side + c0, wr0 * wc0),
                (r0 * side + c1, wr0 * wc1),
                (r1 * side + c0, wr1 * wc0),
                (r1 * side + c1, wr1 * wc1),
            ] {
                let pe = &self.pos_embed[idx * d..(idx + 1) * d];
                row.iter_mut().zip(pe).for_each(|(a, b)| *a += wt * b);
            }
        }
    }

    /// 2-D rotary tables `(cos, sin)`, `[patches, head_dim]` each, over the full head dim:
    /// `[row·f, col·f]` duplicated.
    fn rotary_tables(&self, rc: &[PatchPos]) -> (Vec<f32>, Vec<f32>) {
        let hd = self.cfg.head_dim();
        let nf = hd / 4;
        let inv: Vec<f64> = (0..nf)
            .map(|i| VISION_ROPE_THETA.powf(-(2.0 * i as f64) / (hd / 2) as f64))
            .collect();
        let mut cos = vec![0.0f32; rc.len() * hd];
        let mut sin = vec![0.0f32; rc.len() * hd];
        for (p, &(r, c, _, _)) in rc.iter().enumerate() {
            for (i, f) in inv.iter().enumerate() {
                for (j, pos) in [(i, r), (i + nf, c)] {
                    let (s, co) = (pos as f64 * f).sin_cos();
                    for off in [j, j + hd / 2] {
                        cos[p * hd + off] = co as f32;
                        sin[p * hd + off] = s as f32;
                    }
                }
            }
        }
        (cos, sin)
    }

    /// One pre-norm block: block-diagonal attention over each frame, then the MLP.
    fn block_forward(
        &self,
        b: &Block,
        x: &mut [f32],
        total: usize,
        frames: &[(usize, usize)],
        cos: &[f32],
        sin: &[f32],
    ) {
        let d = self.cfg.hidden_size;
        let mut h = x.to_vec();
        layer_norm(&mut h, &b.norm1.0, &b.norm1.1, VISION_LN_EPS);
        let qkv = b.qkv.forward(&h, total);
        let mut attn_out = vec![0.0f32; total * d];
        for &(s0, len) in frames {
            let o = self.frame_attention(&qkv, s0, len, cos, sin);
            attn_out[s0 * d..(s0 + len) * d].copy_from_slice(&o);
        }
        let pr = b.proj.forward(&attn_out, total);
        x.iter_mut().zip(&pr).for_each(|(a, c)| *a += c);
        let mut h = x.to_vec();
        layer_norm(&mut h, &b.norm2.0, &b.norm2.1, VISION_LN_EPS);
        let mut f = b.fc1.forward(&h, total);
        f.iter_mut().for_each(|v| *v = gelu_tanh(*v));
        let f2 = b.fc2.forward(&f, total);
        x.iter_mut().zip(&f2).for_each(|(a, c)| *a += c);
    }

    /// Attention of the `len` patches from row `s0` (one frame) among themselves, rotary
    /// applied to q and k → `[len, hidden]`.
    fn frame_attention(
        &self,
        qkv: &[f32],
        s0: usize,
        len: usize,
        cos: &[f32],
        sin: &[f32],
    ) -> Vec<f32> {
        let d = self.cfg.hidden_size;
        let hd = self.cfg.head_dim();
        let nh = self.cfg.num_heads;
        let scale = 1.0 / (hd as f32).sqrt();
        let mut q = vec![0.0f32; len * d];
        let mut k = vec![0.0f32; len * d];
        let mut v = vec![0.0f32; len * d];
        for t in 0..len {
            let row = &qkv[(s0 + t) * 3 * d..(s0 + t + 1) * 3 * d];
            q[t * d..(t + 1) * d].copy_from_slice(&row[..d]);
            k[t * d..(t + 1) * d].copy_from_slice(&row[d..2 * d]);
            v[t * d..(t + 1) * d].copy_from_slice(&row[2 * d..]);
            let (c, s) = (
                &cos[(s0 + t) * hd..(s0 + t + 1) * hd],
                &sin[(s0 + t) * hd..(s0 + t + 1) * hd],
            );
            apply_rotary(&mut q[t * d..(t + 1) * d], hd, c, s);
            apply_rotary(&mut k[t * d..(t + 1) * d], hd, c, s);
        }
        attention(&q, len, nh, &k, &v, len, nh, hd, scale, AttnMask::None)
    }
}

/// `(row, col, grid height, grid width)` of one patch.
type PatchPos = (usize, usize, usize, usize);

/// Row/col of every patch in merge order, frame by frame.
fn merge_order_positions(grids: &[ImageGrid], m: usize) -> Vec<PatchPos> {
    let mut rc = Vec::with_capacity(grids.iter().map(|g| g.t * g.h * g.w).sum());
    for g in grids {
        for _ in 0..g.t {
            for br in 0..g.h / m {
                for bc in 0..g.w / m {
                    for ir in 0..m {
                        for ic in 0..m {
                            rc.push((br * m + ir, bc * m + ic, g.h, g.w));
                        }
                    }
                }
            }
        }
    }
    rc
}

/// `(first patch, patches)` of every frame: the blocks of the block-diagonal attention.
fn frame_spans(grids: &[ImageGrid]) -> Vec<(usize, usize)> {
    let mut frames = Vec::new();
    let mut start = 0;
    for g in grids {
        for _ in 0..g.t {
            frames.push((start, g.h * g.w));
            start += g.h * g.w;
        }
    }
    frames
}

/// Where pixels go in the tower's input: patch side, merge-block side, frames per patch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PatchLayout {
    pub patch: usize,
    pub merge: usize,
    pub temporal: usize,
}

impl VisionConfig {
    pub fn patch_layout(&self) -> PatchLayout {
        PatchLayout {
            patch: self.patch_size,
            merge: self.spatial_merge_size,
            temporal: self.temporal_patch_size,
        }
    }
}

/// The image processor's per-channel normalisation, `(x/255 − mean) / std`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Normalise {
    pub mean: [f32; 3],
    pub std: [f32; 3],
}

impl Normalise {
    /// Qwen3.5's processor: `image_mean` = `image_std` = 0.5 on every channel.
    pub const QWEN: Self = Self {
        mean: [0.5; 3],
        std: [0.5; 3],
    };
}

/// HF processor (`Qwen2VLImageProcessor*` with Qwen3.5 values) for an image whose sides are
/// already multiples of `patch·merge` (no resize here): see [`patchify`].
pub fn patchify_rgb8(
    rgb: &[u8],
    width: usize,
    height: usize,
    cfg: &VisionConfig,
) -> Result<(Vec<f32>, ImageGrid)> {
    if cfg.in_channels != 3 {
        return Err(Error::Image {
            reason: format!("in_channels {} (only RGB supported)", cfg.in_channels),
        });
    }
    patchify(rgb, width, height, cfg.patch_layout(), Normalise::QWEN)
}

/// Normalise and patchify an interleaved RGB8 image (row-major `[height, width, 3]`) whose
/// sides are multiples of `patch·merge` into the tower's input `[n_patch, 3·T·P·P]`.
///
/// Order ("merged", as BLLM and the HF processor use it): for each merge block (row-major
/// over the merged grid), its `merge × merge` patches row-major; inside a patch: channel,
/// frame, py, px; a still image fills every frame with the same pixels. Arithmetic as the HF
/// processor's: `f32(v · (1/255) in f64)`, then `(x − mean) / std` in f32.
pub fn patchify(
    rgb: &[u8],
    width: usize,
    height: usize,
    layout: PatchLayout,
    norm: Normalise,
) -> Result<(Vec<f32>, ImageGrid)> {
    let PatchLayout {
        patch: p,
        merge: m,
        temporal: t,
    } = layout;
    check_len("rgb8 [height, width, 3]", width * height * 3, rgb.len())?;
    let unit = p * m;
    if unit == 0
        || t == 0
        || width == 0
        || height == 0
        || !width.is_multiple_of(unit)
        || !height.is_multiple_of(unit)
    {
        return Err(Error::Image {
            reason: format!(
                "{width}x{height} is not a positive multiple of {unit} px (resize first), \
                 or the layout {layout:?} is empty"
            ),
        });
    }
    // 256 values per channel: a table is both exact and cheaper than the arithmetic.
    let mut lut = [[0f32; 256]; 3];
    for (c, table) in lut.iter_mut().enumerate() {
        for (v, out) in table.iter_mut().enumerate() {
            let x = (v as f64 * (1.0 / 255.0)) as f32;
            *out = (x - norm.mean[c]) / norm.std[c];
        }
    }
    let (gh, gw) = (height / p, width / p);
    let mut out = Vec::with_capacity(gh * gw * 3 * t * p * p);
    for bh in 0..gh / m {
        for bw in 0..gw / m {
            for mh in 0..m {
                for mw in 0..m {
                    let (y0, x0) = ((bh * m + mh) * p, (bw * m + mw) * p);
                    for (c, table) in lut.iter().enumerate() {
                        let start = out.len();
                        for y in y0..y0 + p {
                            let row = &rgb[(y * width + x0) * 3..(y * width + x0 + p) * 3];
                            out.extend(row.chunks_exact(3).map(|px| table[usize::from(px[c])]));
                        }
                        for _ in 1..t {
                            out.extend_from_within(start..start + p * p);
                        }
                    }
                }
            }
        }
    }
    Ok((out, ImageGrid { t: 1, h: gh, w: gw }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> VisionConfig {
        VisionConfig {
            depth: 0,
            hidden_size: 8,
            intermediate_size: 8,
            num_heads: 2,
            in_channels: 3,
            patch_size: 2,
            temporal_patch_size: 2,
            spatial_merge_size: 2,
            out_hidden_size: 4,
            num_position_embeddings: 16,
            pos_grid_side: 4,
        }
    }

    #[test]
    fn patchify_merge_order_and_normalisation() {
        let (w, h) = (8, 4); // grid 2 x 4 patches, merged 1 x 2
        let rgb: Vec<u8> = (0..w * h * 3).map(|i| (i % 251) as u8).collect();
        let (pv, g) = patchify_rgb8(&rgb, w, h, &cfg()).unwrap();
        assert_eq!(g, ImageGrid { t: 1, h: 2, w: 4 });
        assert_eq!(pv.len(), 8 * 24);
        // patch index 2 = block (0,0), in_row 1, in_col 0 → patch row 1, col 0 → pixel (2, 0)
        let px =
            |y: usize, x: usize, c: usize| (rgb[(y * w + x) * 3 + c] as f32 / 255.0 - 0.5) / 0.5;
        assert!((pv[2 * 24] - px(2, 0, 0)).abs() < 1e-6);
        // patch 4 = block (0,1): patch row 0, col 2 → pixel (0, 4); channel 1, frame 1, py 1, px 1
        let off = 4 * 24 + 8 + 4 + 2 + 1;
        assert!((pv[off] - px(1, 5, 1)).abs() < 1e-6);
        assert!(patchify_rgb8(&rgb[..10], w, h, &cfg()).is_err());
        assert!(patchify_rgb8(&[0; 6 * 4 * 3], 6, 4, &cfg()).is_err());
    }
}

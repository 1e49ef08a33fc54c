//! Scene signatures: whether two camera frames show the same scene, in microseconds on the
//! CPU, so a pre-filled frame can be trusted (or not) for an ask about a newer one.
//!
//! The signature is a luma thumbnail of [`GRID_W`]×[`GRID_H`] cells over the whole frame,
//! two numbers per cell: the mean luma and the mean absolute luma step between horizontal
//! neighbours (texture), sampled on every second pixel of every second row of a raw frame.
//! The change between two signatures ([`SceneSignature::change`]) is, per channel, each
//! cell's difference less the median difference over all cells (so a global brightness
//! change, flicker or auto-exposure, cancels out), and the score is the largest such residual
//! over the cells of both channels, on a 0–1 scale (1 = full luma range).
//!
//! Chosen from the unit tests below on the bundled scene pictures, scaled to 640×480:
//! Gaussian sensor noise of σ = 4/255 on every pixel scores at most 0.007 (averaged over a
//! cell's ~100 samples), a small global flicker (gain ±3 %, offset ±6/255) at most 0.016 (a
//! gain moves bright cells more than the median), a 64×64 patch replaced by another scene's
//! content (at every position on a 29-px grid, where it differs by ≥ 24/255 mean luma) at
//! least 0.036, the pictures switched above 0.3. The default threshold
//! [`DEFAULT_SCENE_CHANGE_THRESHOLD`], 0.025, sits between flicker and patch with a margin of
//! about 1.5 each way; a noisier camera (strong JPEG artefacts, low light) may need it higher.
//!
//! What it cannot see: a change smaller than a cell (20×20 pixels at 640×480) or one that
//! keeps a cell's mean luma and texture (an object swapped for one of the same brightness and
//! texture, a colour change of equal luma), and a change that moves most of the cells alike
//! (it is taken for a brightness change). Sampling every second pixel also misses detail
//! finer than two pixels.

use crate::encoding::PixelFormat;
use crate::frame::Frame;
use crate::validate::{Layout, RawLayout};

/// Cells across the thumbnail.
pub const GRID_W: usize = 32;
/// Cells down the thumbnail.
pub const GRID_H: usize = 24;
const CELLS: usize = GRID_W * GRID_H;

/// Default of the node's `scene_change_threshold`: scores above it are a different scene.
pub const DEFAULT_SCENE_CHANGE_THRESHOLD: f64 = 0.025;

/// A frame's luma thumbnail (see the module docs).
#[derive(Debug, Clone, PartialEq)]
pub struct SceneSignature {
    width: u32,
    height: u32,
    /// Mean luma per cell, 0–255; `NaN` for a cell no sample fell in (a tiny frame).
    mean: Vec<f32>,
    /// Mean absolute horizontal luma step per cell, 0–255; `NaN` as above.
    texture: Vec<f32>,
}

impl SceneSignature {
    /// The signature of a validated frame; `None` for a jpeg/png body not decoded yet (the
    /// node decodes camera frames on arrival, so it gets one for every camera frame).
    pub fn of_frame(frame: &Frame) -> Option<Self> {
        match frame.layout() {
            Layout::Raw(raw) => Some(of_raw(raw, frame.data())),
            Layout::Compressed(_) => None,
        }
    }

    /// The signature of an RGB8 image.
    pub fn of_rgb(img: &image::RgbImage) -> Self {
        let raw = RawLayout {
            format: PixelFormat::Rgb8,
            width: img.width(),
            height: img.height(),
            step: img.width() * 3,
            plane_rows: img.height(),
            big_endian: false,
        };
        of_raw(&raw, img.as_raw())
    }

    /// How different `other`'s scene is, 0 (the same) to 1; frames of different sizes are
    /// different scenes (1).
    pub fn change(&self, other: &Self) -> f64 {
        if (self.width, self.height) != (other.width, other.height) {
            return 1.0;
        }
        let a = channel_change(&self.mean, &other.mean);
        let b = channel_change(&self.texture, &other.texture);
        f64::from(a.max(b)) / 255.0
    }

    /// Whether `other` shows the same scene under `threshold` (a [`Self::change`] score).
    pub fn same_scene(&self, other: &Self, threshold: f64) -> bool {
        self.change(other) <= threshold
    }
}

/// The largest cell difference after the median difference is taken off.
fn channel_change(a: &[f32], b: &[f32]) -> f32 {
    let mut d: Vec<f32> = a
        .iter()
        .zip(b)
        .filter(|(x, y)| x.is_finite() && y.is_finite())
        .map(|(x, y)| y - x)
        .collect();
    if d.is_empty() {
        return 0.0;
    }
    let mid = d.len() / 2;
    let (_, median, _) = d.select_nth_unstable_by(mid, f32::total_cmp);
    let median = *median;
    d.iter().map(|x| (x - median).abs()).fold(0.0, f32::max)
}

/// Luma (BT.601 weights, 0–255) of pixel `x` of a row starting at `row` (NV12: in the Y
/// plane).
fn luma(format: PixelFormat, big_endian: bool, row: &[u8], x: usize) -> u32 {
    let rgb =
        |r: u8, g: u8, b: u8| (77 * u32::from(r) + 150 * u32::from(g) + 29 * u32::from(b)) >> 8;
    match format {
        PixelFormat::Rgb8 => rgb(row[3 * x], row[3 * x + 1], row[3 * x + 2]),
        PixelFormat::Bgr8 => rgb(row[3 * x + 2], row[3 * x + 1], row[3 * x]),
        PixelFormat::Rgba8 => rgb(row[4 * x], row[4 * x + 1], row[4 * x + 2]),
        PixelFormat::Bgra8 => rgb(row[4 * x + 2], row[4 * x + 1], row[4 * x]),
        PixelFormat::Mono8 | PixelFormat::Nv12 => u32::from(row[x]),
        PixelFormat::Mono16 => u32::from(row[2 * x + usize::from(!big_endian)]),
        PixelFormat::Uyvy => u32::from(row[2 * x + 1]),
        PixelFormat::Yuyv => u32::from(row[2 * x]),
    }
}

fn of_raw(raw: &RawLayout, data: &[u8]) -> SceneSignature {
    let (w, h) = (raw.width as usize, raw.height as usize);
    let step = raw.step as usize;
    // Every second pixel and row once the frame has two per cell each way: a quarter of the
    // reads, still ~100 samples a cell at 640×480.
    let stride = if w >= 2 * GRID_W && h >= 2 * GRID_H {
        2
    } else {
        1
    };
    let mut sum = [0u32; CELLS];
    let mut tex = [0u32; CELLS];
    let mut n = [0u32; CELLS];
    for y in (0..h).step_by(stride) {
        // Validation guarantees every row of the (Y) plane lies inside the payload.
        let Some(row) = data.get(y * step..) else {
            break;
        };
        let cy = y * GRID_H / h;
        let mut x = 0;
        while x < w {
            let cell = cy * GRID_W + x * GRID_W / w;
            let l = luma(raw.format, raw.big_endian, row, x);
            let next = if x + 1 < w {
                luma(raw.format, raw.big_endian, row, x + 1)
            } else {
                l
            };
            sum[cell] += l;
            tex[cell] += l.abs_diff(next);
            n[cell] += 1;
            x += stride;
        }
    }
    let per = |s: &[u32; CELLS]| -> Vec<f32> {
        s.iter()
            .zip(&n)
            .map(|(&s, &n)| {
                if n == 0 {
                    f32::NAN
                } else {
                    s as f32 / n as f32
                }
            })
            .collect()
    };
    SceneSignature {
        width: raw.width,
        height: raw.height,
        mean: per(&sum),
        texture: per(&tex),
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use image::RgbImage;

    use super::*;
    use crate::validate::{ImageMsg, Limits};

    fn scene(name: &str) -> RgbImage {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../tools/fixtures/images")
            .join(name);
        let img = image::open(&path).unwrap().to_rgb8();
        image::imageops::resize(&img, 640, 480, image::imageops::FilterType::Triangle)
    }

    const SCENES: [&str; 3] = ["scene_a.png", "scene_b.png", "scene_c.png"];

    /// A deterministic generator (xorshift) and Gaussian samples (Box–Muller).
    struct Noise(u64);

    impl Noise {
        fn uniform(&mut self) -> f64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            ((self.0 >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        }

        fn gauss(&mut self) -> f64 {
            let (u, v) = (self.uniform(), self.uniform());
            (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
        }
    }

    fn map(img: &RgbImage, mut f: impl FnMut(u8) -> f64) -> RgbImage {
        let mut out = img.clone();
        for p in out.iter_mut() {
            *p = f(*p).round().clamp(0.0, 255.0) as u8;
        }
        out
    }

    fn noisy(img: &RgbImage, seed: u64) -> RgbImage {
        let mut n = Noise(seed);
        map(img, |v| f64::from(v) + 4.0 * n.gauss())
    }

    fn score(a: &RgbImage, b: &RgbImage) -> f64 {
        SceneSignature::of_rgb(a).change(&SceneSignature::of_rgb(b))
    }

    #[test]
    fn sensor_noise_is_never_a_change() {
        let mut worst: f64 = 0.0;
        for (i, name) in SCENES.iter().enumerate() {
            let img = scene(name);
            let reference = noisy(&img, 1 + i as u64);
            assert_eq!(score(&img, &img), 0.0);
            for seed in 0..8 {
                worst = worst.max(score(&reference, &noisy(&img, 100 + seed)));
            }
        }
        // Measured: 0.007.
        assert!(worst < 0.0125, "noise scores {worst}");
        assert!(worst < DEFAULT_SCENE_CHANGE_THRESHOLD / 2.0);
    }

    #[test]
    fn small_global_flicker_is_not_a_change() {
        let mut worst: f64 = 0.0;
        for name in SCENES {
            let img = scene(name);
            for (gain, offset) in [
                (1.03, 0.0),
                (0.97, 0.0),
                (1.0, 6.0),
                (1.0, -6.0),
                (1.02, 3.0),
            ] {
                let flicker = map(&img, |v| f64::from(v) * gain + offset);
                worst = worst.max(score(&noisy(&img, 3), &noisy(&flicker, 4)));
            }
        }
        // Measured: 0.016 (a 3 % gain moves the bright cells more than the median).
        assert!(worst < 0.02, "flicker scores {worst}");
        assert!(worst < DEFAULT_SCENE_CHANGE_THRESHOLD);
    }

    #[test]
    fn a_replaced_64_px_patch_is_always_a_change() {
        let mut weakest: f64 = 1.0;
        for (i, name) in SCENES.iter().enumerate() {
            let img = scene(name);
            let reference = SceneSignature::of_rgb(&noisy(&img, 7));
            let base = noisy(&img, 11 + i as u64);
            for other in SCENES.iter().filter(|o| *o != name) {
                let donor = scene(other);
                let noisy_donor = noisy(&donor, 13);
                // Every position on a 29-px grid (not a divisor of the 20-px cells, so the
                // patch straddles cells in every way).
                for y0 in (0..=480 - 64).step_by(29) {
                    for x0 in (0..=640 - 64).step_by(29) {
                        // The donor may match the picture at this spot; only a patch that
                        // visibly differs (mean luma step ≥ 24/255 over the patch) counts.
                        if patch_difference(&img, &donor, x0, y0) < 24.0 {
                            continue;
                        }
                        let mut patched = base.clone();
                        for y in y0..y0 + 64 {
                            for x in x0..x0 + 64 {
                                patched.put_pixel(x, y, *noisy_donor.get_pixel(x, y));
                            }
                        }
                        let s = reference.change(&SceneSignature::of_rgb(&patched));
                        weakest = weakest.min(s);
                    }
                }
            }
        }
        // Measured: 0.036.
        assert!(weakest > 0.03, "patch scores down to {weakest}");
        assert!(weakest > DEFAULT_SCENE_CHANGE_THRESHOLD);
    }

    /// Mean absolute luma difference between two pictures over a 64×64 patch.
    fn patch_difference(a: &RgbImage, b: &RgbImage, x0: u32, y0: u32) -> f64 {
        let l = |p: &image::Rgb<u8>| {
            0.299 * f64::from(p[0]) + 0.587 * f64::from(p[1]) + 0.114 * f64::from(p[2])
        };
        let mut s = 0.0;
        for y in y0..y0 + 64 {
            for x in x0..x0 + 64 {
                s += (l(a.get_pixel(x, y)) - l(b.get_pixel(x, y))).abs();
            }
        }
        s / 4096.0
    }

    #[test]
    fn switched_pictures_are_always_a_change() {
        for a in SCENES {
            for b in SCENES.iter().filter(|b| **b != a) {
                let s = score(&noisy(&scene(a), 5), &noisy(&scene(b), 6));
                assert!(s > 0.3, "{a} → {b}: {s}");
            }
        }
    }

    #[test]
    fn raw_encodings_give_the_rgb_signature_and_sizes_must_match() {
        let img = scene("scene_a.png");
        let bgr: Vec<u8> = img
            .as_raw()
            .chunks_exact(3)
            .flat_map(|p| [p[2], p[1], p[0]])
            .collect();
        let frame = Frame::from_image(
            ImageMsg {
                encoding: "bgr8",
                width: 640,
                height: 480,
                step: 640 * 3,
                is_bigendian: false,
                data: bgr,
            },
            &Limits::default(),
        )
        .unwrap();
        let sig = SceneSignature::of_frame(&frame).unwrap();
        assert_eq!(sig, SceneSignature::of_rgb(&img));
        let small = image::imageops::resize(&img, 320, 240, image::imageops::FilterType::Triangle);
        assert_eq!(sig.change(&SceneSignature::of_rgb(&small)), 1.0);
        // A frame smaller than the grid still compares (cells without samples are skipped).
        let tiny = RgbImage::from_pixel(2, 1, image::Rgb([9, 9, 9]));
        let tiny_sig = SceneSignature::of_rgb(&tiny);
        assert_eq!(tiny_sig.change(&tiny_sig), 0.0);
    }
}

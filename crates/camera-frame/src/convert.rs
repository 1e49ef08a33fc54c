//! Pixel-format loops to RGB8 and the jpeg/png decode path.
//!
//! Raw conversions run one output row per rayon task; they read only what a validated
//! [`RawLayout`] promises is inside the payload.

use std::io::Cursor;

use image::{ColorType, ImageDecoder, RgbImage};
use rayon::prelude::*;

use crate::encoding::{Codec, PixelFormat};
use crate::error::FrameError;
use crate::validate::{image_format, Limits, RawLayout};

/// Fixed-point shift of the YUV coefficients.
const SHIFT: u32 = 20;
/// Rounds the final `>> SHIFT` to nearest.
const HALF: i32 = 1 << (SHIFT - 1);
// BT.601 limited range (Kr = 0.299, Kb = 0.114; Y in 16..=235, Cb/Cr in 16..=240), each
// coefficient `round(c * 2^20)`:
/// 255 / 219
const CY: i32 = 1_220_945;
/// 1.402 * 255 / 224
const CVR: i32 = 1_673_555;
/// -0.344136 * 255 / 224 (= -2 (1 - Kb) Kb / Kg scaled)
const CUG: i32 = -410_793;
/// -0.714136 * 255 / 224 (= -2 (1 - Kr) Kr / Kg scaled)
const CVG: i32 = -852_458;
/// 1.772 * 255 / 224
const CUB: i32 = 2_115_221;

/// Converts one BT.601 limited-range YUV sample to RGB8.
///
/// With `y' = max(Y - 16, 0)`, `u = U - 128`, `v = V - 128`, and the coefficients above in
/// 2^20 fixed point:
///
/// ```text
/// R = clamp((CY·y' + CVR·v           + 2^19) >> 20)
/// G = clamp((CY·y' + CUG·u + CVG·v   + 2^19) >> 20)
/// B = clamp((CY·y' + CUB·u           + 2^19) >> 20)
/// ```
///
/// i.e. `R = 1.164383 y' + 1.596027 v`, `G = 1.164383 y' - 0.391762 u - 0.812968 v`,
/// `B = 1.164383 y' + 2.017232 u`, rounded to nearest and clamped to 0..=255. Luma below the
/// black level 16 is clipped before the chroma is added, as OpenCV's `COLOR_YUV2RGB_*` do.
pub fn yuv_to_rgb(y: u8, u: u8, v: u8) -> [u8; 3] {
    pixel(y, chroma(u, v))
}

#[inline(always)]
fn chroma(u: u8, v: u8) -> [i32; 3] {
    let u = i32::from(u) - 128;
    let v = i32::from(v) - 128;
    [CVR * v + HALF, CUG * u + CVG * v + HALF, CUB * u + HALF]
}

#[inline(always)]
fn pixel(y: u8, c: [i32; 3]) -> [u8; 3] {
    let y = (i32::from(y) - 16).max(0) * CY;
    // The clamp makes the narrowing exact.
    let px = |t: i32| ((y + t) >> SHIFT).clamp(0, 255) as u8;
    [px(c[0]), px(c[1]), px(c[2])]
}

/// Pixels per step of the YUV kernel: wide enough for LLVM to vectorise the arithmetic over
/// fixed-size arrays, small enough to stay in registers and L1.
const BLOCK: usize = 32;

/// BLOCK pixels: `y[i]` with chroma `u[i / 2]`, `v[i / 2]`; the same math as [`yuv_to_rgb`].
#[inline(always)]
fn yuv_block(y: &[u8; BLOCK], u: &[u8; BLOCK / 2], v: &[u8; BLOCK / 2], out: &mut [u8]) {
    let mut uf = [0i32; BLOCK];
    let mut vf = [0i32; BLOCK];
    for i in 0..BLOCK {
        uf[i] = i32::from(u[i / 2]) - 128;
        vf[i] = i32::from(v[i / 2]) - 128;
    }
    let mut rgb = [[0i32; BLOCK]; 3];
    for i in 0..BLOCK {
        let yy = (i32::from(y[i]) - 16).max(0) * CY + HALF;
        rgb[0][i] = ((yy + CVR * vf[i]) >> SHIFT).clamp(0, 255);
        rgb[1][i] = ((yy + CUG * uf[i] + CVG * vf[i]) >> SHIFT).clamp(0, 255);
        rgb[2][i] = ((yy + CUB * uf[i]) >> SHIFT).clamp(0, 255);
    }
    for (i, px) in out[..3 * BLOCK].chunks_exact_mut(3).enumerate() {
        // Clamped above, so the narrowing is exact.
        px.copy_from_slice(&[rgb[0][i] as u8, rgb[1][i] as u8, rgb[2][i] as u8]);
    }
}

/// One row of packed 4:2:2; `order` gives the byte offsets of `[Y0, U, Y1, V]` in each
/// 4-byte group (UYVY `[1, 0, 3, 2]`, YUYV `[0, 1, 2, 3]`).
fn packed_422_row(dst: &mut [u8], src: &[u8], order: [usize; 4]) {
    let [y0, u0, y1, v0] = order;
    let (mut y, mut u, mut v) = ([0u8; BLOCK], [0u8; BLOCK / 2], [0u8; BLOCK / 2]);
    let mut dst_blocks = dst.chunks_exact_mut(3 * BLOCK);
    let mut src_blocks = src.chunks_exact(2 * BLOCK);
    for (d, s) in (&mut dst_blocks).zip(&mut src_blocks) {
        for (k, g) in s.chunks_exact(4).enumerate() {
            y[2 * k] = g[y0];
            y[2 * k + 1] = g[y1];
            u[k] = g[u0];
            v[k] = g[v0];
        }
        yuv_block(&y, &u, &v, d);
    }
    for (d, g) in dst_blocks
        .into_remainder()
        .chunks_exact_mut(6)
        .zip(src_blocks.remainder().chunks_exact(4))
    {
        let c = chroma(g[u0], g[v0]);
        d[..3].copy_from_slice(&pixel(g[y0], c));
        d[3..].copy_from_slice(&pixel(g[y1], c));
    }
}

/// One NV12 row: `ys` is the row of the Y plane, `uv` the matching `U V` row (both `width`
/// bytes).
fn nv12_row(dst: &mut [u8], ys: &[u8], uv: &[u8]) {
    let (mut u, mut v) = ([0u8; BLOCK / 2], [0u8; BLOCK / 2]);
    let mut dst_blocks = dst.chunks_exact_mut(3 * BLOCK);
    let mut y_blocks = ys.chunks_exact(BLOCK);
    let mut uv_blocks = uv.chunks_exact(BLOCK);
    for ((d, yb), cb) in (&mut dst_blocks).zip(&mut y_blocks).zip(&mut uv_blocks) {
        for (k, pair) in cb.chunks_exact(2).enumerate() {
            u[k] = pair[0];
            v[k] = pair[1];
        }
        let y = <&[u8; BLOCK]>::try_from(yb).expect("chunks_exact yields BLOCK bytes");
        yuv_block(y, &u, &v, d);
    }
    for ((d, y), c) in dst_blocks
        .into_remainder()
        .chunks_exact_mut(6)
        .zip(y_blocks.remainder().chunks_exact(2))
        .zip(uv_blocks.remainder().chunks_exact(2))
    {
        let c = chroma(c[0], c[1]);
        d[..3].copy_from_slice(&pixel(y[0], c));
        d[3..].copy_from_slice(&pixel(y[1], c));
    }
}

/// Converts a validated raw frame. `data` must be the payload `layout` was validated against.
pub(crate) fn raw_to_rgb8(layout: &RawLayout, data: &[u8]) -> RgbImage {
    let w = layout.width as usize;
    let h = layout.height as usize;
    let step = layout.step as usize;
    let mut out = vec![0u8; w * h * 3];
    let format = layout.format;
    let big_endian = layout.big_endian;
    let uv_plane = step * layout.plane_rows as usize;
    out.par_chunks_exact_mut(w * 3)
        .enumerate()
        .for_each(|(row, dst)| {
            let src = &data[row * step..];
            match format {
                PixelFormat::Rgb8 => dst.copy_from_slice(&src[..w * 3]),
                PixelFormat::Bgr8 => {
                    for (d, s) in dst.chunks_exact_mut(3).zip(src.chunks_exact(3)) {
                        d.copy_from_slice(&[s[2], s[1], s[0]]);
                    }
                }
                PixelFormat::Rgba8 => {
                    for (d, s) in dst.chunks_exact_mut(3).zip(src.chunks_exact(4)) {
                        d.copy_from_slice(&s[..3]);
                    }
                }
                PixelFormat::Bgra8 => {
                    for (d, s) in dst.chunks_exact_mut(3).zip(src.chunks_exact(4)) {
                        d.copy_from_slice(&[s[2], s[1], s[0]]);
                    }
                }
                PixelFormat::Mono8 => {
                    for (d, &s) in dst.chunks_exact_mut(3).zip(&src[..w]) {
                        d.fill(s);
                    }
                }
                PixelFormat::Mono16 => {
                    let hi = usize::from(!big_endian);
                    for (d, s) in dst.chunks_exact_mut(3).zip(src.chunks_exact(2)) {
                        d.fill(s[hi]);
                    }
                }
                PixelFormat::Uyvy => packed_422_row(dst, &src[..w * 2], [1, 0, 3, 2]),
                PixelFormat::Yuyv => packed_422_row(dst, &src[..w * 2], [0, 1, 2, 3]),
                PixelFormat::Nv12 => {
                    let uv = &data[uv_plane + (row / 2) * step..][..w];
                    nv12_row(dst, &src[..w], uv);
                }
            }
        });
    RgbImage::from_raw(layout.width, layout.height, out).expect("buffer sized width*height*3")
}

/// Decodes a jpeg/png payload to RGB8 under `limits`.
///
/// Alpha is dropped (not blended); grey is replicated; 16-bit samples become 8 bit by `>> 8`,
/// the same rule as `mono16` (and as OpenCV's `imdecode` with `IMREAD_COLOR`). A jpeg without
/// Huffman tables (UVC MJPEG) gets the standard ones.
///
/// The decoder writes into one buffer of the size its header announces, and that buffer is
/// narrowed (or widened, for grey) to RGB8 in place: a 16-bit or RGBA image never has a
/// second full-size copy, so the peak is the header's `w·h·bytes per pixel`
/// ([`crate::Layout::decoded_bytes`]).
pub(crate) fn decode_to_rgb8(
    codec: Codec,
    data: &[u8],
    limits: &Limits,
) -> Result<RgbImage, FrameError> {
    let patched = match codec {
        Codec::Jpeg => crate::mjpeg::with_standard_tables(data),
        Codec::Png => None,
    };
    if patched.is_some() {
        tracing::debug!("jpeg without Huffman tables: using the standard ones (MJPEG)");
    }
    let data = patched.as_deref().unwrap_or(data);
    let failed = |e: image::ImageError| FrameError::Decode {
        codec,
        reason: e.to_string(),
    };
    let mut reader = image::ImageReader::with_format(Cursor::new(data), image_format(codec));
    let mut caps = image::Limits::default();
    caps.max_image_width = Some(limits.max_width);
    caps.max_image_height = Some(limits.max_height);
    caps.max_alloc = Some(limits.max_decoded_bytes());
    reader.limits(caps.clone());
    let decoder = reader.into_decoder().map_err(failed)?;
    let (w, h) = decoder.dimensions();
    let color = decoder.color_type();
    let total = decoder.total_bytes();
    caps.reserve(total).map_err(failed)?;
    let mut buf = vec![
        0u8;
        usize::try_from(total).map_err(|_| FrameError::TooLarge {
            width: w,
            height: h,
            max_width: limits.max_width,
            max_height: limits.max_height,
        })?
    ];
    decoder.read_image(&mut buf).map_err(failed)?;
    let pixels = w as usize * h as usize;
    to_rgb8_in_place(&mut buf, color, pixels).map_err(|reason| FrameError::Decode {
        codec,
        reason: reason.to_owned(),
    })?;
    Ok(RgbImage::from_raw(w, h, buf).expect("narrowed to width*height*3"))
}

/// Turns `pixels` decoded pixels of `color` (samples in native byte order, as
/// `ImageDecoder::read_image` gives them) into tight RGB8 in the same buffer.
///
/// A pixel of at least three bytes is narrowed front to back (pixel `i` is written at `3i`,
/// never past where pixel `i + 1` is still to be read), then the tail is cut off; a smaller
/// one (grey, grey+alpha, 16-bit grey) is widened back to front after the buffer grows to
/// RGB8. Either way only one buffer exists.
fn to_rgb8_in_place(
    buf: &mut Vec<u8>,
    color: ColorType,
    pixels: usize,
) -> Result<(), &'static str> {
    let channels = usize::from(color.channel_count());
    let bpp = usize::from(color.bytes_per_pixel());
    let sample = bpp / channels.max(1);
    // The high byte of a native-endian u16 sample, the only byte of an 8-bit one.
    let hi = match sample {
        1 => 0,
        2 => usize::from(cfg!(target_endian = "little")),
        _ => return Err("unsupported sample depth (only 8 and 16 bit are decoded)"),
    };
    if buf.len() != pixels * bpp {
        return Err("decoded size does not match the header");
    }
    if color == ColorType::Rgb8 {
        return Ok(());
    }
    // Grey (with or without alpha) replicates its one sample; colour takes its first three.
    let offsets = if channels >= 3 {
        [hi, sample + hi, 2 * sample + hi]
    } else {
        [hi; 3]
    };
    if bpp >= 3 {
        for i in 0..pixels {
            let src = i * bpp;
            let px = offsets.map(|o| buf[src + o]);
            buf[3 * i..3 * i + 3].copy_from_slice(&px);
        }
        buf.truncate(3 * pixels);
        // Gives the tail back (a shrinking realloc; large blocks shrink in place).
        buf.shrink_to_fit();
    } else {
        buf.resize(3 * pixels, 0);
        for i in (0..pixels).rev() {
            let src = i * bpp;
            let px = offsets.map(|o| buf[src + o]);
            buf[3 * i..3 * i + 3].copy_from_slice(&px);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coefficients_match_their_definition() {
        let scale = f64::from(1u32 << SHIFT);
        let (kr, kb) = (0.299_f64, 0.114_f64);
        let kg = 1.0 - kr - kb;
        let c = 255.0 / 224.0;
        let want = [
            (CY, 255.0 / 219.0),
            (CVR, 2.0 * (1.0 - kr) * c),
            (CUG, -2.0 * (1.0 - kb) * kb / kg * c),
            (CVG, -2.0 * (1.0 - kr) * kr / kg * c),
            (CUB, 2.0 * (1.0 - kb) * c),
        ];
        for (got, f) in want {
            assert_eq!(got, (f * scale).round() as i32, "{f}");
        }
    }

    /// The blocked row kernels against the per-pixel formula, for widths around the block.
    #[test]
    fn row_kernels_match_per_pixel_formula() {
        let mut seed = 0x2545_f491_u32;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            seed as u8
        };
        for w in (2..=3 * BLOCK + 6).step_by(2) {
            let packed: Vec<u8> = (0..2 * w).map(|_| next()).collect();
            let ys: Vec<u8> = (0..w).map(|_| next()).collect();
            let uv: Vec<u8> = (0..w).map(|_| next()).collect();
            let mut got = vec![0u8; 3 * w];
            for (order, name) in [([1, 0, 3, 2], "uyvy"), ([0, 1, 2, 3], "yuyv")] {
                packed_422_row(&mut got, &packed, order);
                for x in 0..w {
                    let g = &packed[(x / 2) * 4..][..4];
                    let want = yuv_to_rgb(g[order[2 * (x % 2)]], g[order[1]], g[order[3]]);
                    assert_eq!(&got[3 * x..3 * x + 3], &want, "{name} w={w} x={x}");
                }
            }
            nv12_row(&mut got, &ys, &uv);
            for x in 0..w {
                let want = yuv_to_rgb(ys[x], uv[x & !1], uv[x | 1]);
                assert_eq!(&got[3 * x..3 * x + 3], &want, "nv12 w={w} x={x}");
            }
        }
    }

    #[test]
    fn yuv_reference_points() {
        // Black, white and the 75% colour bars of BT.601 limited range.
        assert_eq!(yuv_to_rgb(16, 128, 128), [0, 0, 0]);
        assert_eq!(yuv_to_rgb(235, 128, 128), [255, 255, 255]);
        assert_eq!(yuv_to_rgb(0, 128, 128), [0, 0, 0]);
        assert_eq!(yuv_to_rgb(255, 128, 128), [255, 255, 255]);
        // Float formula, every (Y, U, V) on a coarse grid: within rounding.
        for y in (0..=255u8).step_by(5) {
            for u in (0..=255u8).step_by(15) {
                for v in (0..=255u8).step_by(15) {
                    let yf = (f64::from(y) - 16.0).max(0.0) * 255.0 / 219.0;
                    let (uf, vf) = (f64::from(u) - 128.0, f64::from(v) - 128.0);
                    let c = 255.0 / 224.0;
                    let r = yf + 1.402 * c * vf;
                    let g = yf - 0.344136 * c * uf - 0.714136 * c * vf;
                    let b = yf + 1.772 * c * uf;
                    let got = yuv_to_rgb(y, u, v);
                    for (k, f) in [r, g, b].into_iter().enumerate() {
                        let want = f.round().clamp(0.0, 255.0);
                        assert!((f64::from(got[k]) - want).abs() <= 1.0, "{y} {u} {v}");
                    }
                }
            }
        }
    }
}

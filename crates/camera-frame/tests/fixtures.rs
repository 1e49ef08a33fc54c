//! Conversion against OpenCV: every case in `tools/fixtures/frames` (see its `generate.py`).
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use anyhow::{ensure, Context, Result};
use camera_frame::image::RgbImage;
use camera_frame::{
    Codec, CompressedMsg, Encoding, Frame, FrameErrorKind, ImageMsg, Limits, PixelFormat,
};
use serde::Deserialize;

#[derive(Deserialize)]
struct Manifest {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    kind: String,
    #[serde(default)]
    encoding: String,
    #[serde(default)]
    format: String,
    #[serde(default)]
    width: u32,
    #[serde(default)]
    height: u32,
    #[serde(default)]
    step: u32,
    #[serde(default)]
    is_bigendian: bool,
}

/// How close our RGB must be to OpenCV's.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Tolerance {
    /// Byte-identical.
    Exact,
    /// Every channel within this many levels.
    MaxAbs(u8),
}

/// Rounding of the BT.601 fixed-point math: ours uses the exact coefficients, OpenCV
/// 3-decimal ones (1.164, 1.596, ...).
const YUV: Tolerance = Tolerance::MaxAbs(1);
/// zune-jpeg (the `image` crate) against libjpeg-turbo (OpenCV): IDCT, colour conversion and
/// chroma upsampling round differently. Measured on these fixtures (opencv-python-headless
/// 4.12.0.88, zune-jpeg 0.5.15): max 3 levels for 4:2:0 and 4:4:4, 2 for 4:2:2, 1 for grey;
/// mean below 0.4 levels (see `JPEG_MEAN`).
const JPEG: Tolerance = Tolerance::MaxAbs(3);
/// Bound on the mean absolute difference of a jpeg case (measured at most 0.354, 4:2:0).
const JPEG_MEAN: f64 = 0.4;

fn tolerance(encoding: Encoding) -> Tolerance {
    match encoding {
        Encoding::Raw(PixelFormat::Uyvy | PixelFormat::Yuyv | PixelFormat::Nv12) => YUV,
        Encoding::Compressed(Codec::Jpeg) => JPEG,
        Encoding::Raw(_) | Encoding::Compressed(Codec::Png) => Tolerance::Exact,
    }
}

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tools/fixtures/frames")
}

fn manifest() -> Result<Manifest> {
    let text = std::fs::read_to_string(dir().join("manifest.json")).context("manifest.json")?;
    Ok(serde_json::from_str(&text)?)
}

fn expected(name: &str) -> Result<RgbImage> {
    Ok(image::open(dir().join(format!("{name}.rgb.png")))?.into_rgb8())
}

/// Largest per-channel difference, how many channels differ at all, mean difference.
fn diff(a: &RgbImage, b: &RgbImage) -> (u8, usize, f64) {
    let (max, count, sum) =
        a.as_raw()
            .iter()
            .zip(b.as_raw())
            .fold((0, 0, 0u64), |(m, n, s), (&x, &y)| {
                let d = x.abs_diff(y);
                (m.max(d), n + usize::from(d > 0), s + u64::from(d))
            });
    (max, count, sum as f64 / a.as_raw().len().max(1) as f64)
}

fn convert(case: &Case, data: Vec<u8>, limits: &Limits) -> Result<Frame> {
    Ok(match case.kind.as_str() {
        "image" => Frame::from_image(
            ImageMsg {
                encoding: &case.encoding,
                width: case.width,
                height: case.height,
                step: case.step,
                is_bigendian: case.is_bigendian,
                data,
            },
            limits,
        )?,
        "compressed" => Frame::from_compressed(
            CompressedMsg {
                format: &case.format,
                data,
            },
            limits,
        )?,
        other => anyhow::bail!("unknown case kind {other}"),
    })
}

#[test]
fn every_encoding_matches_opencv() -> Result<()> {
    let limits = Limits::default();
    let cases = manifest()?.cases;
    ensure!(
        cases.len() >= 20,
        "manifest lists only {} cases",
        cases.len()
    );
    let mut seen = std::collections::HashSet::new();
    let mut failures = Vec::new();
    for case in &cases {
        let data = std::fs::read(dir().join(format!("{}.bin", case.name)))?;
        let frame = convert(case, data, &limits).with_context(|| case.name.clone())?;
        let got = frame.to_rgb8().with_context(|| case.name.clone())?;
        let want = expected(&case.name)?;
        ensure!(
            got.dimensions() == want.dimensions(),
            "{}: {:?} vs OpenCV {:?}",
            case.name,
            got.dimensions(),
            want.dimensions()
        );
        let (max, count, mean) = diff(&got, &want);
        let tol = tolerance(frame.encoding());
        println!(
            "{:<20} {:<12} max diff {max} in {count} channels, mean {mean:.3}",
            case.name,
            frame.encoding()
        );
        let within = match tol {
            Tolerance::Exact => max == 0,
            Tolerance::MaxAbs(t) => max <= t,
        } && (tol != JPEG || mean <= JPEG_MEAN);
        if !within {
            failures.push(format!("{}: differs by {max}, allowed {tol:?}", case.name));
        }
        seen.insert(frame.encoding());
    }
    ensure!(failures.is_empty(), "{failures:#?}");
    let all = [
        PixelFormat::Rgb8,
        PixelFormat::Bgr8,
        PixelFormat::Rgba8,
        PixelFormat::Bgra8,
        PixelFormat::Mono8,
        PixelFormat::Mono16,
        PixelFormat::Uyvy,
        PixelFormat::Yuyv,
        PixelFormat::Nv12,
    ]
    .map(Encoding::Raw)
    .into_iter()
    .chain([Codec::Jpeg, Codec::Png].map(Encoding::Compressed));
    for e in all {
        ensure!(seen.contains(&e), "no fixture for {e}");
    }
    Ok(())
}

#[test]
fn padded_nv12_uses_the_padded_plane() -> Result<()> {
    // The same payload read with the tight rule would take the UV plane from Y rows 14..;
    // matching OpenCV proves the plane starts at step * 16.
    let cases = manifest()?.cases;
    let case = cases.iter().find(|c| c.name == "nv12_padded_rows").unwrap();
    let data = std::fs::read(dir().join("nv12_padded_rows.bin"))?;
    let frame = convert(case, data, &Limits::default())?;
    let camera_frame::Layout::Raw(raw) = frame.layout() else {
        anyhow::bail!("not raw");
    };
    assert_eq!((raw.height, raw.plane_rows, raw.step), (14, 16, 32));
    Ok(())
}

#[test]
fn compressed_format_strings_and_signatures() -> Result<()> {
    let limits = Limits::default();
    let jpeg = std::fs::read(dir().join("jpeg_420.bin"))?;
    let want = expected("jpeg_420")?;
    for format in [
        "jpeg",
        "JPEG",
        "jpg",
        "rgb8; jpeg compressed bgr8",
        "bgr8; jpeg compressed ",
        "",
    ] {
        let got = CompressedMsg {
            format,
            data: &jpeg[..],
        }
        .to_rgb8(&limits)?;
        let (max, _, mean) = diff(&got, &want);
        ensure!(max <= 3 && mean <= JPEG_MEAN, "{format:?}: {max} {mean}");
    }
    let err = CompressedMsg {
        format: "png",
        data: &jpeg[..],
    }
    .validate(&limits)
    .unwrap_err();
    assert_eq!(err.kind(), FrameErrorKind::BadMagic);
    let err = CompressedMsg {
        format: "tiff",
        data: &jpeg[..],
    }
    .validate(&limits)
    .unwrap_err();
    assert_eq!(err.kind(), FrameErrorKind::UnknownFormat);
    // The header size is checked against the limits on arrival.
    let tiny = Limits {
        max_width: 64,
        ..Limits::default()
    };
    let err = CompressedMsg {
        format: "jpeg",
        data: &jpeg[..],
    }
    .validate(&tiny)
    .unwrap_err();
    assert_eq!(err.kind(), FrameErrorKind::TooLarge);
    // A truncated body passes the header check but fails to decode, without panicking.
    let cut = &jpeg[..jpeg.len() / 2];
    let frame = Frame::from_compressed(
        CompressedMsg {
            format: "jpeg",
            data: cut,
        },
        &limits,
    );
    match frame {
        Ok(f) => {
            // zune-jpeg may fill the missing scan; it must still give a full-size image.
            if let Ok(img) = f.to_rgb8() {
                assert_eq!(img.dimensions(), (96, 64));
            }
        }
        Err(e) => assert_eq!(e.kind(), FrameErrorKind::BadHeader),
    }
    Ok(())
}

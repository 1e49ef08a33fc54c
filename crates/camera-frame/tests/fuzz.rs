//! Random headers, steps, encodings and payloads: validation never panics, gives the error the
//! documented rules predict, and whatever it accepts converts to a full-size image.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use camera_frame::{
    CompressedMsg, Frame, FrameErrorKind, ImageMsg, Layout, Limits, MAX_NV12_ROW_PADDING,
};
use proptest::prelude::*;

const ENCODINGS: &[&str] = &[
    "rgb8",
    "bgr8",
    "rgba8",
    "bgra8",
    "mono8",
    "mono16",
    "yuv422",
    "uyvy",
    "yuv422_yuy2",
    "yuyv",
    "nv12",
    "NV12",
    "rgb16",
    "bayer_rggb8",
    "",
    "nv21",
    "16UC1",
];

const LIMITS: Limits = Limits {
    max_width: 32,
    max_height: 32,
    max_data_bytes: 6000,
};

/// The documented rules, written independently of the crate: bytes per pixel, chroma
/// alignment, step, length (NV12 with its padded-plane rule), in the documented order.
fn model(enc: &str, w: u32, h: u32, step: u32, len: usize) -> Result<u32, FrameErrorKind> {
    let (bpp, even_w, even_h, nv12) = match enc.to_ascii_lowercase().as_str() {
        "rgb8" | "bgr8" => (3, false, false, false),
        "rgba8" | "bgra8" => (4, false, false, false),
        "mono8" => (1, false, false, false),
        "mono16" => (2, false, false, false),
        "yuv422" | "uyvy" | "yuv422_yuy2" | "yuyv" => (2, true, false, false),
        "nv12" => (1, true, true, true),
        _ => return Err(FrameErrorKind::UnknownEncoding),
    };
    if len > LIMITS.max_data_bytes {
        return Err(FrameErrorKind::DataTooLarge);
    }
    if w == 0 || h == 0 {
        return Err(FrameErrorKind::ZeroSize);
    }
    if w > LIMITS.max_width || h > LIMITS.max_height {
        return Err(FrameErrorKind::TooLarge);
    }
    if (even_w && w % 2 == 1) || (even_h && h % 2 == 1) {
        return Err(FrameErrorKind::OddSize);
    }
    if u64::from(step) < u64::from(w) * bpp {
        return Err(FrameErrorKind::StepTooSmall);
    }
    let (step, len, hh) = (u64::from(step), len as u64, u64::from(h));
    if nv12 {
        // Padded plane: the payload is exactly step * R * 3/2 for an even R just above h.
        for r in (hh + 1)..=(hh + u64::from(MAX_NV12_ROW_PADDING)) {
            if r % 2 == 0 && step * r * 3 / 2 == len {
                return Ok(r as u32);
            }
        }
        if len < step * hh * 3 / 2 {
            return Err(FrameErrorKind::DataTooShort);
        }
    } else if len < step * hh {
        return Err(FrameErrorKind::DataTooShort);
    }
    Ok(h)
}

fn bpp(enc: &str) -> u32 {
    match enc.to_ascii_lowercase().as_str() {
        "rgb8" | "bgr8" => 3,
        "rgba8" | "bgra8" => 4,
        "mono16" | "yuv422" | "uyvy" | "yuv422_yuy2" | "yuyv" => 2,
        _ => 1,
    }
}

fn header() -> impl Strategy<Value = (&'static str, u32, u32, u32, usize, bool)> {
    (
        prop::sample::select(ENCODINGS),
        0u32..40,
        0u32..40,
        (any::<bool>(), 0u32..300, 0u32..8),
        (0u8..3, 0usize..7000, -3i64..3, 0u64..40),
        any::<bool>(),
    )
        .prop_map(
            |(enc, w, h, (step_free, step_raw, extra), (len_mode, raw, delta, pad), be)| {
                let step = if step_free {
                    step_raw
                } else {
                    w * bpp(enc) + extra
                };
                let rows = if enc.eq_ignore_ascii_case("nv12") {
                    u64::from(h) * 3 / 2
                } else {
                    u64::from(h)
                };
                let len = match len_mode {
                    0 => raw,
                    1 => (u64::from(step) * rows).saturating_add_signed(delta) as usize,
                    // NV12 buffers allocated for more rows than reported.
                    _ => (u64::from(step) * (u64::from(h) + pad) * 3 / 2) as usize,
                };
                (enc, w, h, step, len, be)
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(4000))]

    #[test]
    fn raw_headers_follow_the_rules((enc, w, h, step, len, be) in header()) {
        let data: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
        let msg = ImageMsg { encoding: enc, width: w, height: h, step, is_bigendian: be, data: &data[..] };
        let got = msg.validate(&LIMITS);
        match (model(enc, w, h, step, len), got) {
            (Ok(rows), Ok(Layout::Raw(raw))) => {
                prop_assert_eq!(raw.plane_rows, rows);
                let rgb = Frame::from_image(msg, &LIMITS).unwrap().to_rgb8().unwrap();
                prop_assert_eq!(rgb.dimensions(), (w, h));
            }
            (Err(want), Err(e)) => prop_assert_eq!(e.kind(), want, "{}", e),
            (want, got) => prop_assert!(false, "model {:?}, crate {:?}", want, got),
        }
    }

    #[test]
    fn corrupted_compressed_payloads_never_panic(
        which in 0usize..4,
        cut in 0.0f64..1.0,
        flips in prop::collection::vec((0.0f64..1.0, any::<u8>()), 0..6),
        in_image in any::<bool>(),
    ) {
        let (file, format) = [
            ("jpeg_420", "jpeg"), ("jpeg_444", "jpeg"), ("png_rgb", "png"), ("png_grey16", "png"),
        ][which];
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tools/fixtures/frames");
        let mut data = std::fs::read(dir.join(format!("{file}.bin"))).unwrap();
        data.truncate((data.len() as f64 * cut) as usize);
        let n = data.len();
        for (at, byte) in flips {
            if n > 0 {
                data[((n as f64 * at) as usize).min(n - 1)] = byte;
            }
        }
        // Small caps so a corrupted header cannot make a decode allocate much.
        let limits = Limits { max_width: 256, max_height: 256, max_data_bytes: 1 << 20 };
        let validated = if in_image {
            let msg = ImageMsg { encoding: format, width: 0, height: 0, step: 0, is_bigendian: false, data: &data[..] };
            msg.validate(&limits).map(|l| (l.width(), l.height()))
        } else {
            CompressedMsg { format, data: &data[..] }.validate(&limits).map(|l| (l.width, l.height))
        };
        match validated {
            Ok((w, h)) => {
                let frame = if in_image {
                    Frame::from_image(ImageMsg { encoding: format, width: 0, height: 0, step: 0, is_bigendian: false, data: &data[..] }, &limits)
                } else {
                    Frame::from_compressed(CompressedMsg { format, data: &data[..] }, &limits)
                }.unwrap();
                match frame.to_rgb8() {
                    Ok(rgb) => prop_assert_eq!(rgb.dimensions(), (w, h)),
                    Err(e) => prop_assert_eq!(e.kind(), FrameErrorKind::Decode),
                }
            }
            Err(e) => prop_assert!(
                matches!(e.kind(), FrameErrorKind::BadMagic | FrameErrorKind::BadHeader | FrameErrorKind::ZeroSize | FrameErrorKind::TooLarge),
                "{}", e
            ),
        }
    }

    #[test]
    fn random_bytes_as_compressed(data in prop::collection::vec(any::<u8>(), 0..64), format in prop::sample::select(&["jpeg", "png", "", "tiff", "rgb8; jpeg compressed bgr8"][..])) {
        let limits = Limits::default();
        if let Ok(frame) = Frame::from_compressed(CompressedMsg { format, data: &data[..] }, &limits) {
            let _ = frame.to_rgb8();
        }
    }
}

/// The header strategy reaches every rule, so the property above tests each of them.
#[test]
fn header_strategy_covers_every_rule() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    use std::collections::HashSet;

    let mut runner = TestRunner::deterministic();
    let strategy = header();
    let mut seen = HashSet::new();
    for _ in 0..4000 {
        let (enc, w, h, step, len, _) = strategy.new_tree(&mut runner).unwrap().current();
        seen.insert(match model(enc, w, h, step, len) {
            Ok(rows) if rows > h => "ok padded nv12".to_owned(),
            Ok(_) => "ok".to_owned(),
            Err(kind) => format!("{kind:?}"),
        });
    }
    for want in [
        "ok",
        "ok padded nv12",
        "UnknownEncoding",
        "DataTooLarge",
        "ZeroSize",
        "TooLarge",
        "OddSize",
        "StepTooSmall",
        "DataTooShort",
    ] {
        assert!(seen.contains(want), "{want} never generated: {seen:?}");
    }
}

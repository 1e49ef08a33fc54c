//! A png decodes within the bytes its header announces: 16-bit and RGBA pictures are narrowed
//! to RGB8 in the decoder's own buffer, never beside a second full-size copy (issue 23, decode
//! bombs). Measured as the process's peak resident memory (Linux `VmHWM`, reset through
//! `/proc/self/clear_refs`), so this file holds one test: nothing else may allocate meanwhile.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use camera_frame::{CompressedMsg, Limits};
use image::codecs::png::PngEncoder;
use image::{ExtendedColorType, ImageEncoder};

const MIB: u64 = 1 << 20;
/// Room for the decoder's own row and inflate buffers and the allocator's bookkeeping.
const SLACK: u64 = 12 * MIB;

fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("{field} missing from /proc/self/status"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// A zero png of `side`² pixels, encoded before the measurement starts.
fn zero_png(side: u32, color: ExtendedColorType) -> Vec<u8> {
    let bytes = u64::from(side) * u64::from(side) * u64::from(color.bits_per_pixel()) / 8;
    let raw = vec![0u8; bytes as usize];
    let mut out = Vec::new();
    PngEncoder::new(&mut out)
        .write_image(&raw, side, side, color)
        .unwrap();
    out
}

#[test]
fn png_decodes_within_the_bytes_its_header_announces() {
    if std::fs::write("/proc/self/clear_refs", "5").is_err() {
        eprintln!("skipped: no /proc/self/clear_refs to reset the peak with");
        return;
    }
    let side = 4096u32;
    let pixels = u64::from(side) * u64::from(side);
    // (colour, decoded bytes per pixel): what the header lets the budget charge.
    for (color, bpp) in [
        (ExtendedColorType::Rgba16, 8),
        (ExtendedColorType::Rgb16, 6),
        (ExtendedColorType::Rgba8, 4),
        (ExtendedColorType::L16, 3),
    ] {
        let png = zero_png(side, color);
        let msg = CompressedMsg {
            format: "png",
            data: &png[..],
        };
        let charged = camera_frame::Layout::Compressed(msg.validate(&Limits::default()).unwrap())
            .decoded_bytes();
        assert_eq!(charged, pixels * bpp, "{color:?}");
        std::fs::write("/proc/self/clear_refs", "5").unwrap();
        let before = status_kib("VmRSS:") * 1024;
        let rgb = msg.to_rgb8(&Limits::default()).unwrap();
        let peak = status_kib("VmHWM:") * 1024;
        assert_eq!(rgb.as_raw().len() as u64, pixels * 3);
        assert!(rgb.as_raw().iter().all(|&v| v == 0));
        drop(rgb);
        let grew = peak.saturating_sub(before);
        eprintln!(
            "{color:?}: peak grew {} MiB, charged {} MiB",
            grew / MIB,
            charged / MIB
        );
        assert!(
            grew <= charged + SLACK,
            "{color:?}: decoding took {} MiB at its peak, the header announces {} MiB",
            grew / MIB,
            charged / MIB
        );
    }
}

//! A compressed frame whose body does not decode never replaces a good one: decoded on
//! arrival ([`Frame::decoded`]) it is a rejection the cache counts, and the camera's previous
//! frame stays what an ask gets.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use camera_frame::{
    CacheConfig, CameraCache, CompressedMsg, Frame, FrameErrorKind, ImageMsg, Layout, Limits,
    PixelFormat, Stamp,
};

fn fixture(name: &str) -> Vec<u8> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tools/fixtures/frames");
    std::fs::read(dir.join(name)).unwrap()
}

/// The fixture jpeg with its scan pointing at Huffman tables it never defines: the header
/// (SOF, DHT, SOS) still reads, the body cannot decode. zune-jpeg fills a truncated or
/// garbled scan with grey instead of failing, so this is the jpeg body that does fail.
fn jpeg_with_undefined_tables() -> Vec<u8> {
    let mut data = fixture("jpeg_420.bin");
    let sos = data.windows(2).position(|w| w == [0xff, 0xda]).unwrap();
    // FF DA, length (2), component count (1), then per component: id, table selectors.
    data[sos + 6] = 0x33;
    data
}

/// The fixture png cut inside its image data: header fine, body truncated.
fn truncated_png() -> Vec<u8> {
    let mut data = fixture("png_rgb.bin");
    let idat = data.windows(4).position(|w| w == b"IDAT").unwrap();
    data.truncate(idat + 16);
    data
}

fn compressed(format: &str, data: Vec<u8>) -> Frame {
    Frame::from_compressed(CompressedMsg { format, data }, &Limits::default()).unwrap()
}

#[test]
fn broken_bodies_pass_validation_and_fail_decoding() {
    for (format, data) in [
        ("jpeg", jpeg_with_undefined_tables()),
        ("png", truncated_png()),
    ] {
        // Validation accepts it (it reads the header only)...
        let frame = compressed(format, data);
        // ...decoding on arrival finds it.
        let e = frame.decoded().unwrap_err();
        assert_eq!(e.kind(), FrameErrorKind::Decode, "{format}: {e}");
    }
}

#[test]
fn decoded_frames_are_tight_rgb8_with_the_same_pixels() {
    for (format, file) in [("jpeg", "jpeg_420.bin"), ("png", "png_rgba.bin")] {
        let frame = compressed(format, fixture(file));
        let direct = frame.to_rgb8().unwrap();
        let decoded = frame.decoded().unwrap();
        match decoded.layout() {
            Layout::Raw(r) => {
                assert_eq!(r.format, PixelFormat::Rgb8, "{format}");
                assert_eq!(r.step, r.width * 3, "{format}");
            }
            Layout::Compressed(_) => panic!("{format}: still compressed"),
        }
        assert_eq!(decoded.to_rgb8().unwrap(), direct, "{format}");
        assert_eq!(decoded.into_rgb8().unwrap(), direct, "{format}");
    }
}

#[test]
fn into_rgb8_matches_to_rgb8_for_tight_and_stepped_frames() {
    let (w, h) = (5u32, 3u32);
    for step in [w * 3, w * 3 + 4] {
        let data: Vec<u8> = (0..step * h).map(|i| (i * 7 % 251) as u8).collect();
        let msg = |data| ImageMsg {
            encoding: "rgb8",
            width: w,
            height: h,
            step,
            is_bigendian: false,
            data,
        };
        let frame = Frame::from_image(msg(data), &Limits::default()).unwrap();
        let want = frame.to_rgb8().unwrap();
        assert_eq!(frame.into_rgb8().unwrap(), want, "step {step}");
    }
}

#[test]
fn a_broken_frame_after_a_good_one_leaves_the_good_one_selected() {
    let t0 = Instant::now();
    let topic = "/image_raw/compressed";
    let cache = CameraCache::new(
        CacheConfig {
            topics: vec![topic.into()],
            default_camera: None,
            warn_interval: Duration::from_secs(10),
        },
        t0,
    )
    .unwrap();
    let good = compressed("jpeg", fixture("jpeg_420.bin"));
    let want = good.to_rgb8().unwrap();
    let at = |s| t0 + Duration::from_secs(s);
    cache
        .record(topic, good.decoded(), Stamp { sec: 1, nanosec: 0 }, at(1))
        .unwrap();
    let bad = [
        compressed("jpeg", jpeg_with_undefined_tables()),
        compressed("png", truncated_png()),
    ];
    for (i, b) in bad.into_iter().enumerate() {
        let warning = cache
            .record(topic, b.decoded(), Stamp::default(), at(2 + i as u64))
            .unwrap();
        assert_eq!(
            warning.is_some(),
            i == 0,
            "first rejection warns, then rate-limited"
        );
    }
    let got = cache
        .select(
            None,
            camera_frame::Freshness {
                max_age: Some(Duration::from_secs(5)),
                max_silence: None,
            },
            at(4),
        )
        .unwrap();
    assert_eq!(got.stamp, Stamp { sec: 1, nanosec: 0 });
    assert_eq!(got.frame.to_rgb8().unwrap(), want);
    let stats = cache.stats(topic).unwrap();
    assert_eq!((stats.accepted, stats.rejected), (1, 2));
    assert_eq!(stats.last_rejection, Some(FrameErrorKind::Decode));
}

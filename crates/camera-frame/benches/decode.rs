//! What decoding jpeg/png camera frames on arrival costs (`cargo bench -p camera-frame --bench
//! decode`): the node decodes every compressed camera frame when it arrives
//! ([`Frame::decoded`]), so a body that does not decode never replaces a good frame. Per frame
//! and size: validation alone (what arrival cost before), validation plus decode (what it
//! costs now), and what an ask then pays to take the decoded frame out of the cache (a copy)
//! against decoding it at ask time. Frames are the fixture scene resized to 640×480 and
//! 1920×1080, jpeg at quality 90 (4:2:0, as cameras send) and png (default compression).
//!
//! Prints the median and minimum wall time of repeated runs and the CPU time per run summed
//! over all threads (from `/proc/self/stat`), which stays meaningful when other processes
//! share the cores.
#![allow(clippy::unwrap_used)]

mod timing;

use std::io::Cursor;
use std::path::PathBuf;
use timing::time;

use camera_frame::{CompressedMsg, Frame, Limits};
use image::codecs::jpeg::JpegEncoder;
use image::imageops::FilterType;
use image::ImageFormat;

fn main() {
    let scene =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tools/fixtures/images/scene_a.png");
    let scene = image::open(scene).unwrap().to_rgb8();
    let limits = Limits::default();
    for (w, h, iters) in [(640u32, 480u32, 200usize), (1920, 1080, 40)] {
        let img = image::imageops::resize(&scene, w, h, FilterType::Triangle);
        let mut jpeg = Vec::new();
        JpegEncoder::new_with_quality(&mut jpeg, 90)
            .encode_image(&img)
            .unwrap();
        let mut png = Vec::new();
        img.write_to(&mut Cursor::new(&mut png), ImageFormat::Png)
            .unwrap();
        for (format, data) in [("jpeg", &jpeg), ("png", &png)] {
            let tag = format!("{format} {w}x{h} ({} KiB)", data.len() / 1024);
            let msg = || CompressedMsg {
                format,
                data: &data[..],
            };
            time(&format!("{tag} validate only"), iters * 10, || {
                std::hint::black_box(Frame::from_compressed(msg(), &limits).unwrap());
            });
            time(&format!("{tag} validate + decode"), iters, || {
                let f = Frame::from_compressed(msg(), &limits).unwrap();
                std::hint::black_box(f.decoded().unwrap());
            });
            let decoded = Frame::from_compressed(msg(), &limits)
                .unwrap()
                .decoded()
                .unwrap();
            time(&format!("{tag} ask: copy decoded frame"), iters, || {
                std::hint::black_box(decoded.to_rgb8().unwrap());
            });
            let lazy = Frame::from_compressed(msg(), &limits).unwrap();
            time(&format!("{tag} ask: decode at ask time"), iters, || {
                std::hint::black_box(lazy.to_rgb8().unwrap());
            });
        }
    }
}

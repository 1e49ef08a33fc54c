//! What a scene signature costs per camera frame (`cargo bench -p camera-frame --bench scene`):
//! the node computes one for every accepted frame on arrival, on the camera's task, and
//! compares two whenever it decides whether to prime or which frame an ask gets. Frames are
//! the fixture scene resized to 640×480 and 1920×1080, as rgb8 (a decoded jpeg/png or an rgb8
//! camera).
#![allow(clippy::unwrap_used)]

mod timing;

use std::path::PathBuf;
use timing::time;

use camera_frame::SceneSignature;
use image::imageops::FilterType;

fn main() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tools/fixtures/images");
    let a = image::open(dir.join("scene_a.png")).unwrap().to_rgb8();
    let b = image::open(dir.join("scene_b.png")).unwrap().to_rgb8();
    for (w, h, iters) in [(640u32, 480u32, 2000usize), (1920, 1080, 400)] {
        let fa = image::imageops::resize(&a, w, h, FilterType::Triangle);
        let fb = image::imageops::resize(&b, w, h, FilterType::Triangle);
        time(&format!("signature rgb8 {w}x{h}"), iters, || {
            std::hint::black_box(SceneSignature::of_rgb(&fa));
        });
        let (sa, sb) = (SceneSignature::of_rgb(&fa), SceneSignature::of_rgb(&fb));
        time(&format!("change score {w}x{h}"), iters * 10, || {
            std::hint::black_box(sa.change(&sb));
        });
    }
}

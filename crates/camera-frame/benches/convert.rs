//! Conversion timings (`cargo bench -p camera-frame`): validation plus RGB8 conversion of the
//! frame sizes the node sees most. Prints the median and minimum wall time of repeated runs and,
//! on Linux, the CPU time per run summed over all threads (from `/proc/self/stat`), which stays
//! meaningful when other processes share the cores.
#![allow(clippy::unwrap_used)]

mod timing;

use timing::time;

use camera_frame::{Frame, ImageMsg, Limits};

fn frame(encoding: &str, width: u32, height: u32, step: u32, len: usize) -> Frame {
    let data: Vec<u8> = (0..len).map(|i| (i * 7 % 253) as u8).collect();
    let msg = ImageMsg {
        encoding,
        width,
        height,
        step,
        is_bigendian: false,
        data,
    };
    Frame::from_image(msg, &Limits::default()).unwrap()
}

fn main() {
    let cases = [
        (
            "nv12 1920x1080 (step 1920, 1088 rows)",
            frame("nv12", 1920, 1080, 1920, 1920 * 1088 * 3 / 2),
        ),
        (
            "nv12 1920x1080 (tight)",
            frame("nv12", 1920, 1080, 1920, 1920 * 1080 * 3 / 2),
        ),
        (
            "rgb8 640x480",
            frame("rgb8", 640, 480, 640 * 3, 640 * 480 * 3),
        ),
        (
            "bgr8 640x480",
            frame("bgr8", 640, 480, 640 * 3, 640 * 480 * 3),
        ),
        (
            "bgr8 1920x1080",
            frame("bgr8", 1920, 1080, 1920 * 3, 1920 * 1080 * 3),
        ),
        (
            "yuv422 (uyvy) 1280x720",
            frame("yuv422", 1280, 720, 2560, 2560 * 720),
        ),
    ];
    for (name, f) in &cases {
        time(name, 100, || {
            std::hint::black_box(f.to_rgb8().unwrap());
        });
    }
    let data = vec![0u8; 1920 * 1088 * 3 / 2];
    time("validate nv12 1920x1080 (no conversion)", 10000, || {
        let msg = ImageMsg {
            encoding: "nv12",
            width: 1920,
            height: 1080,
            step: 1920,
            is_bigendian: false,
            data: &data[..],
        };
        std::hint::black_box(msg.validate(&Limits::default()).unwrap());
    });
}

//! `vision::resize_bicubic` against Pillow 12.3.0 goldens (tools/fixtures/resize).
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;

use vlm::vision::{preprocess, resize_bicubic, Geometry, RgbImage};

/// Normalised pixel values vs the Pillow golden (one f32 rounding of `(v / 255 - 0.5) / 0.5`).
const PIXEL_TOL: f32 = 1e-6;

fn fixtures() -> PathBuf {
    vlm_testkit::fixtures().join("resize")
}

/// Same formula as `pattern()` in tools/fixtures/resize/generate.py (u32, wrapping).
fn pattern(w: u32, h: u32, seed: u32) -> RgbImage {
    let s = seed.wrapping_mul(2_654_435_761);
    let mut data = vec![0u8; (w * h * 3) as usize];
    let cell_x = (w / 40).max(2);
    let cell_y = (h / 30).max(2);
    let period = w.max(h) / 9 + 5;
    for y in 0..h {
        for x in 0..w {
            for c in 0..3u32 {
                let grad = (x * 255 / (w - 1).max(1) + y * 3 + c * 40) & 0xFF;
                let mut v = x.wrapping_mul(73_856_093)
                    ^ y.wrapping_mul(19_349_663)
                    ^ (c + 1).wrapping_mul(83_492_791)
                    ^ s;
                v ^= v >> 13;
                v = v.wrapping_mul(0x5BD1_E995);
                v ^= v >> 15;
                let noise = v & 0xFF;
                let checker = ((x / cell_x + y / cell_y) & 1) * 255;
                let lines = (x + y) % period < 3;
                let band = (x * 16) / w == 5 || (y * 16) / h == 9;
                let top = (y * 4) / h == 0;
                let mut val = grad;
                if top {
                    val = checker;
                }
                if lines {
                    val = 255 - grad;
                }
                if band {
                    val = noise;
                }
                data[((y * w + x) * 3 + c) as usize] = val as u8;
            }
        }
    }
    RgbImage::new(w as usize, h as usize, data).unwrap()
}

#[test]
fn resize_is_bit_exact_against_pillow_12_3_0() {
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("cases.json")).unwrap())
            .unwrap();
    assert_eq!(manifest["pillow"], "12.3.0");
    let cases = manifest["cases"].as_array().unwrap();
    assert!(cases.len() >= 10);
    let mut failures = Vec::new();
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let get = |k: &str| case[k].as_u64().unwrap() as u32;
        let src = pattern(get("in_w"), get("in_h"), get("seed"));
        let golden = image::open(fixtures().join("out").join(format!("{name}.png")))
            .unwrap()
            .into_rgb8();
        let (ow, oh) = (get("out_w") as usize, get("out_h") as usize);
        assert_eq!(
            (golden.width() as usize, golden.height() as usize),
            (ow, oh)
        );
        let got = resize_bicubic(&src, ow, oh).unwrap();
        let want = golden.as_raw();
        let diffs = got.data.iter().zip(want).filter(|(a, b)| a != b).count();
        let max = got
            .data
            .iter()
            .zip(want)
            .map(|(a, b)| a.abs_diff(*b))
            .max()
            .unwrap_or(0);
        if diffs != 0 {
            failures.push(format!("{name}: {diffs} bytes differ, max {max}"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn preprocess_of_a_golden_case_uses_the_exact_resize() {
    // 640x480 → 320 bucket → [400, 1536]; the first patch row starts with the golden's
    // top-left 16 px of the red channel, normalised with mean = std = 0.5.
    let src = pattern(640, 480, 1);
    let golden = image::open(fixtures().join("out/landscape_640x480.png"))
        .unwrap()
        .into_rgb8();
    let geom = Geometry::from_tower_input(400, 1536, 16, 2, 2).unwrap();
    let pv = preprocess(&src, &geom, [0.5; 3], [0.5; 3]).unwrap();
    assert_eq!(
        (pv.rows, pv.row_len, pv.data.len()),
        (400, 1536, 400 * 1536)
    );
    for px in 0..16 {
        let v = f32::from(golden.get_pixel(px, 0)[0]);
        assert!((pv.data[px as usize] - (v / 255.0 - 0.5) / 0.5).abs() < PIXEL_TOL);
    }
}

//! `vlm detect`: on random tiny models (HF weights on the CPU, and a sim package on the
//! simulated BPU) every detection is well-formed and equals the mapping of the numbers in the
//! model's text; `--draw` writes the picture with the boxes on it; a budget the window cannot
//! hold is refused before the model runs.
#![allow(clippy::unwrap_used)]

use vlm_testkit as common;

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

fn image() -> std::path::PathBuf {
    common::fixtures().join("images").join("chelsea.png")
}

fn detect(model: &[&std::ffi::OsStr], extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_vlm"))
        .arg("detect")
        .args(model)
        .arg("--image")
        .arg(image())
        .args(["--query", "cats"])
        .args(extra)
        .output()
        .unwrap()
}

fn result(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The detections of `r` against the numbers of its `text`: x·W/1000, y·H/1000 (± 1 px),
/// inside the frame, positive size for boxes, ids in the answer's order.
fn check(r: &Value, points: bool, max_objects: usize) -> usize {
    let (w, h) = (
        r["image_width"].as_f64().unwrap(),
        r["image_height"].as_f64().unwrap(),
    );
    let text: Value = serde_json::from_str(r["text"].as_str().unwrap()).unwrap();
    let raw = text.as_array().unwrap();
    assert!(raw.len() <= max_objects);
    let dets = r["detections"].as_array().unwrap();
    let key = if points { "point_2d" } else { "bbox_2d" };
    for d in dets {
        let id = d["id"].as_u64().unwrap() as usize;
        let n: Vec<f64> = raw[id][key]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert_eq!(d["label"], raw[id]["label"]);
        let s = d["score"].as_f64().unwrap();
        assert!(s > 0.0 && s <= 1.0, "{s}");
        let got: Vec<f64> = if points {
            d["point"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
                .collect()
        } else {
            d["bbox"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
                .collect()
        };
        let want: Vec<f64> = n
            .iter()
            .enumerate()
            .map(|(i, v)| v * if i % 2 == 0 { w } else { h } / 1000.0)
            .collect();
        let want = if points {
            want
        } else {
            vec![
                want[0].min(want[2]),
                want[1].min(want[3]),
                want[0].max(want[2]),
                want[1].max(want[3]),
            ]
        };
        for (g, e) in got.iter().zip(&want) {
            assert!((g - e).abs() <= 1.0, "{got:?} vs {want:?}");
        }
        for (i, g) in got.iter().enumerate() {
            assert!(*g >= 0.0 && *g <= if i % 2 == 0 { w } else { h });
        }
        if !points {
            assert!(got[2] > got[0] && got[3] > got[1], "{got:?}");
        }
    }
    dets.len()
}

fn hf() -> Vec<std::ffi::OsString> {
    vec!["--hf".into(), common::model_dir("tiny-sym").into()]
}

fn os(v: &[std::ffi::OsString]) -> Vec<&std::ffi::OsStr> {
    v.iter().map(|s| s.as_os_str()).collect()
}

#[test]
fn random_detections_are_exact_and_drawn() {
    let dir = tempfile::tempdir().unwrap();
    let mut found = 0;
    let mut edges = 0;
    for seed in ["1", "2", "3", "4"] {
        let png = dir.path().join(format!("out{seed}.png"));
        let out = detect(
            &os(&hf()),
            &[
                "--json",
                "--temperature",
                "1",
                "--seed",
                seed,
                "--max-objects",
                "3",
                "--draw",
                png.to_str().unwrap(),
            ],
        );
        let r = result(&out);
        found += check(&r, false, 3);
        edges += check_drawing(&r, &png);
    }
    assert!(found > 0 && edges > 0, "{found} {edges}");
}

/// The PNG has the image's size and, on the last box drawn (nothing is drawn over it but its
/// own tag, above its top edge), the left edge at mid-height has a palette colour that the
/// source image does not have there.
fn check_drawing(r: &Value, png: &Path) -> usize {
    let drawn = image::open(png).unwrap().to_rgb8();
    let src = image::open(image()).unwrap().to_rgb8();
    assert_eq!(drawn.dimensions(), src.dimensions());
    let Some(last) = r["detections"].as_array().unwrap().last() else {
        return 0;
    };
    let b: Vec<f64> = last["bbox"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    if b[3] - b[1] < 60.0 || b[2] - b[0] < 8.0 {
        return 0;
    }
    let (x, y) = (b[0].floor() as u32, ((b[1] + b[3]) / 2.0) as u32);
    let px = drawn.get_pixel(x, y).0;
    let id = last["id"].as_u64().unwrap() as usize;
    assert_eq!(
        px,
        annotate::PALETTE[id % annotate::PALETTE.len()],
        "({x},{y})"
    );
    1
}

#[test]
fn points_on_a_sim_package_and_plain_output() {
    let d = tempfile::tempdir().unwrap();
    common::sim_package("tiny-4b", d.path(), |o| o.cache_len = 1024);
    let pkg = vec![d.path().as_os_str().to_owned()];
    for seed in ["1", "2"] {
        let out = detect(
            &os(&pkg),
            &[
                "--json",
                "--points",
                "--temperature",
                "1",
                "--seed",
                seed,
                "--max-objects",
                "2",
            ],
        );
        check(&result(&out), true, 2);
    }
    let out = detect(&os(&pkg), &["--max-objects", "1"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(" box (") || text.contains("nothing found"),
        "{text}"
    );
}

#[test]
fn a_budget_the_window_cannot_hold_is_refused() {
    let d = tempfile::tempdir().unwrap();
    common::sim_package("tiny-sym", d.path(), |o| o.cache_len = 512);
    let pkg = vec![d.path().as_os_str().to_owned()];
    let out = detect(&os(&pkg), &["--max-objects", "16"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ask for fewer objects"), "{err}");
}

//! `vlm generate --hf` on the fixture models against the HF goldens (tokens and the logits
//! of every step), plus the slot/image mismatch exit.
#![allow(clippy::unwrap_used)]

use vlm_testkit as common;

use std::path::{Path, PathBuf};
use std::process::Command;

/// f32 logits vs HF goldens (issue 3).
const LOGIT_TOL: f32 = 1e-4;

fn run(dir: &Path, ids: &[u32], images: &[PathBuf], max_new: usize) -> std::process::Output {
    let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vlm"));
    cmd.args(["generate", "--hf"])
        .arg(dir)
        .args(["--prompt-ids", &ids.join(",")]);
    for i in images {
        cmd.arg("--image").arg(i);
    }
    cmd.args(["--max-new", &max_new.to_string(), "--json"]);
    cmd.output().unwrap()
}

fn u32s(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| u32::try_from(x.as_u64().unwrap()).unwrap())
        .collect()
}

#[test]
fn generate_hf_matches_goldens() {
    for name in ["tiny-sym", "tiny-untied"] {
        let dir = common::model_dir(name);
        for cname in ["text_long", "image_two"] {
            let case = common::golden_case(name, cname);
            let out = run(&dir, &case.ids, &case.images, case.greedy.len());
            assert!(
                out.status.success(),
                "{name}/{cname}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let stdout = String::from_utf8(out.stdout).unwrap();
            assert_eq!(
                stdout.trim_end().lines().count(),
                1,
                "exactly one JSON line"
            );
            let j: serde_json::Value = serde_json::from_str(&stdout).unwrap();
            assert_eq!(u32s(&j["prompt_ids"]), case.ids);
            assert_eq!(u32s(&j["tokens"]), case.greedy, "{name}/{cname}: tokens");
            let want = common::golden_step_logits(name, &case);
            let logits = j["logits"].as_array().unwrap();
            assert_eq!(logits.len(), case.greedy.len());
            for (i, row) in logits.iter().enumerate() {
                let row: Vec<f32> = row
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap() as f32)
                    .collect();
                let d = common::max_abs_diff(&row, &want[i]);
                assert!(d <= LOGIT_TOL, "{name}/{cname}: step {i} max |diff| {d}");
            }
        }
    }
}

#[test]
fn missing_image_for_a_slot_exits_non_zero_naming_it() {
    let case = common::golden_case("tiny-sym", "image_two");
    let out = run(
        &common::model_dir("tiny-sym"),
        &case.ids,
        &case.images[..1],
        1,
    );
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("image slot 1"), "{err}");
}

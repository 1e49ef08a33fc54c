//! `vlm generate --hf` on the fixture models against the HF goldens (tokens and the logits
//! of every step), plus the slot/image mismatch exit.
#![allow(clippy::unwrap_used)]

use vlm_testkit as common;

use std::path::{Path, PathBuf};
use std::process::Command;

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
            assert_eq!(common::ids(&j["prompt_ids"]), case.ids);
            assert_eq!(
                common::ids(&j["tokens"]),
                case.greedy,
                "{name}/{cname}: tokens"
            );
            let want = common::golden_step_logits(name, &case);
            let logits = common::f32_rows(&j["logits"]);
            assert_eq!(logits.len(), case.greedy.len());
            common::assert_logits_close(
                &logits,
                &want,
                common::LOGIT_TOL,
                &format!("{name}/{cname}"),
            );
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

//! `vlm generate --hf` on the fixture models against the HF goldens (tokens and the logits
//! of every step), plus the slot/image mismatch exit.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// f32 logits vs HF goldens (issue 3).
const LOGIT_TOL: f32 = 1e-4;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tools/fixtures/models")
        .join(name)
}

fn golden_f32(dir: &Path, key: &str) -> Vec<f32> {
    let bytes = std::fs::read(dir.join("goldens.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor(key).unwrap();
    t.data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn run(dir: &Path, ids: &[u64], images: &[PathBuf], max_new: usize) -> std::process::Output {
    let ids: Vec<String> = ids.iter().map(u64::to_string).collect();
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
        let dir = fixture(name);
        let g: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("goldens.json")).unwrap()).unwrap();
        for case in g["cases"].as_array().unwrap() {
            let cname = case["name"].as_str().unwrap();
            if !["text_long", "image_two"].contains(&cname) {
                continue;
            }
            let ids: Vec<u64> = case["prompt_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap())
                .collect();
            let images: Vec<PathBuf> = case["images"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| dir.join(p.as_str().unwrap()))
                .collect();
            let greedy: Vec<u64> = case["greedy_tokens"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap())
                .collect();
            let out = run(&dir, &ids, &images, greedy.len());
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
            let pids: Vec<u64> = j["prompt_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap())
                .collect();
            assert_eq!(pids, ids);
            let toks: Vec<u64> = j["tokens"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap())
                .collect();
            assert_eq!(toks, greedy, "{name}/{cname}: tokens");
            let want = golden_f32(&dir, case["tensors"]["step_logits"].as_str().unwrap());
            let logits = j["logits"].as_array().unwrap();
            assert_eq!(logits.len(), greedy.len());
            let v = want.len() / greedy.len();
            for (i, row) in logits.iter().enumerate() {
                let row: Vec<f32> = row
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap() as f32)
                    .collect();
                assert_eq!(row.len(), v);
                let d = row
                    .iter()
                    .zip(&want[i * v..(i + 1) * v])
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0f32, f32::max);
                assert!(d <= LOGIT_TOL, "{name}/{cname}: step {i} max |diff| {d}");
            }
        }
    }
}

#[test]
fn missing_image_for_a_slot_exits_non_zero_naming_it() {
    let dir = fixture("tiny-sym");
    let g: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("goldens.json")).unwrap()).unwrap();
    let case = g["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "image_two")
        .unwrap();
    let ids: Vec<u64> = case["prompt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    let first = dir.join(case["images"][0].as_str().unwrap());
    let out = run(&dir, &ids, &[first], 1);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("image slot 1"), "{err}");
}

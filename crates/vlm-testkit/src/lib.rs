//! Test-only helpers shared by the integration tests of `vlm`, `vlm-bpu` and `vlm-cli`: the
//! committed fixtures (tiny random Qwen3.5 models, their HF goldens, the fixture tokenizer)
//! and sim packages built from them. A dev-dependency only; it panics on a broken fixture,
//! which is a test failure, never a user's input.
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::Arc;

use tokenizers::Tokenizer;

/// The committed tiny fixture tokenizer (Qwen3.5 pre-tokeniser and the real special-token
/// names, ids 600..=632).
pub fn tokenizer() -> Arc<Tokenizer> {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tools/fixtures/tokenizer.json");
    Arc::new(Tokenizer::from_file(path).unwrap())
}

pub fn encode(tok: &Tokenizer, text: &str) -> Vec<u32> {
    tok.encode(text, false).unwrap().get_ids().to_vec()
}

/// `tools/fixtures` of the repository.
pub fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tools/fixtures")
}

/// A committed fixture model (`tiny-sym`, `tiny-4b`, `tiny-untied`).
pub fn model_dir(name: &str) -> PathBuf {
    fixtures().join("models").join(name)
}

/// Writes a sim package of fixture model `model` into `dir` (tokenizer from the fixtures),
/// after `tweak` adjusts the options.
pub fn sim_package(
    model: &str,
    dir: &std::path::Path,
    tweak: impl FnOnce(&mut bpu_sim::package::PackageOptions),
) {
    let mut o = bpu_sim::package::PackageOptions::new(&model_dir(model), dir);
    o.tokenizer = Some(fixtures().join("tokenizer.json"));
    tweak(&mut o);
    bpu_sim::package::make_sim_package(&o).unwrap();
}

/// One case of a fixture model's `goldens.json`.
#[derive(Debug, Clone)]
pub struct GoldenCase {
    pub name: String,
    pub ids: Vec<u32>,
    pub images: Vec<PathBuf>,
    pub greedy: Vec<u32>,
    /// Key of the step logits `[steps, vocab]` in `goldens.safetensors`.
    pub step_logits_key: String,
}

pub fn golden_case(model: &str, name: &str) -> GoldenCase {
    let dir = model_dir(model);
    let g: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("goldens.json")).unwrap()).unwrap();
    let c = g["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no golden case {name}"));
    GoldenCase {
        name: name.into(),
        ids: ids(&c["prompt_ids"]),
        images: c["images"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| dir.join(p.as_str().unwrap()))
            .collect(),
        greedy: ids(&c["greedy_tokens"]),
        step_logits_key: c["tensors"]["step_logits"].as_str().unwrap_or("").into(),
    }
}

/// A JSON array of token ids (goldens, `vlm generate --json` output).
pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// The golden step logits of `case`, one row per generated token.
pub fn golden_step_logits(model: &str, case: &GoldenCase) -> Vec<Vec<f32>> {
    let bytes = std::fs::read(model_dir(model).join("goldens.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor(&case.step_logits_key).unwrap();
    let all: Vec<f32> = t
        .data()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let v = all.len() / case.greedy.len();
    all.chunks_exact(v).map(<[f32]>::to_vec).collect()
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

pub fn argmax(l: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in l.iter().enumerate() {
        if v > l[best] {
            best = i;
        }
    }
    best as u32
}

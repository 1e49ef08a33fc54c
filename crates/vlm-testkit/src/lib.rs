//! Test-only helpers shared by the integration tests of `vlm`, `vlm-bpu` and `vlm-cli`: the
//! committed fixtures (tiny random Qwen3.5 models, their HF goldens, the fixture tokenizer),
//! sim packages built from them, teacher-forced runs, and the scenarios every backend must
//! pass ([`scenarios`], run by [`backend_suite!`] over a [`BackendFactory`]). A
//! dev-dependency only; it panics on a broken fixture, which is a test failure, never a
//! user's input.
#![forbid(unsafe_code)]
#![allow(clippy::unwrap_used)]

mod factory;
mod run;
pub mod scenarios;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokenizers::Tokenizer;
use vlm::engine::ImageInput;
use vlm::vision::RgbImage;

pub use factory::{BackendFactory, BackendSpec, CpuFactory, Mask, SimPackages};
pub use run::{
    assert_logits_close, assert_matches_reference, case_prompt, continue_greedy, decode_greedy,
    feed_text, generate_greedy, greedy, greedy_case, text_then_greedy, try_generate_text, Teacher,
};

/// Named tolerance of f32 logits: against the HF goldens, and between two computation orders
/// (schedules, backends) of the same model.
pub const LOGIT_TOL: f32 = 1e-4;

/// Greedy steps of every golden case (`max_new` of the goldens).
pub const GOLDEN_STEPS: usize = 16;

/// The committed fixture models.
pub const MODELS: [&str; 3] = ["tiny-sym", "tiny-4b", "tiny-untied"];

/// The committed tiny fixture tokenizer (Qwen3.5 pre-tokeniser and the real special-token
/// names, ids 600..=632).
pub fn tokenizer() -> Arc<Tokenizer> {
    Arc::new(Tokenizer::from_file(fixtures().join("tokenizer.json")).unwrap())
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

/// The `config.json` of fixture model `name`.
pub fn config(name: &str) -> qwen35::Config {
    qwen35::Config::from_file(&model_dir(name).join("config.json")).unwrap()
}

/// An image file as engine input (any RGB8 frame; the engine resizes it to its bucket).
pub fn image_input(path: &Path) -> ImageInput {
    let img = image::open(path).unwrap().to_rgb8();
    let (w, h) = (img.width() as usize, img.height() as usize);
    ImageInput::Rgb(RgbImage::new(w, h, img.into_raw()).unwrap())
}

/// Writes a sim package of fixture model `model` into `dir` (tokenizer from the fixtures),
/// after `tweak` adjusts the options.
pub fn sim_package(
    model: &str,
    dir: &Path,
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

/// Every case of fixture model `model`'s goldens, in file order.
pub fn golden_cases(model: &str) -> Vec<GoldenCase> {
    let dir = model_dir(model);
    let g: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("goldens.json")).unwrap()).unwrap();
    g["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| GoldenCase {
            name: c["name"].as_str().unwrap().into(),
            ids: ids(&c["prompt_ids"]),
            images: c["images"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| dir.join(p.as_str().unwrap()))
                .collect(),
            greedy: ids(&c["greedy_tokens"]),
            step_logits_key: c["tensors"]["step_logits"].as_str().unwrap_or("").into(),
        })
        .collect()
}

pub fn golden_case(model: &str, name: &str) -> GoldenCase {
    golden_cases(model)
        .into_iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no golden case {name}"))
}

/// A JSON array of token ids (goldens, `vlm generate --json` output).
pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| u32::try_from(x.as_u64().unwrap()).unwrap())
        .collect()
}

/// A JSON array of f32 rows (`vlm generate --json` logits).
pub fn f32_rows(v: &serde_json::Value) -> Vec<Vec<f32>> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect()
        })
        .collect()
}

/// The golden step logits of `case`, one row per generated token.
pub fn golden_step_logits(model: &str, case: &GoldenCase) -> Vec<Vec<f32>> {
    let bytes = std::fs::read(model_dir(model).join("goldens.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let t = st.tensor(&case.step_logits_key).unwrap();
    assert_eq!(
        t.dtype(),
        safetensors::Dtype::F32,
        "{}",
        case.step_logits_key
    );
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

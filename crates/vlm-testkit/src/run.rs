//! Driving a backend the way the tests do: greedy generation through the engine, and
//! teacher-forced runs straight on the backend (prompt, then argmax fed back).

use vlm::chat::{Pos3, Prompt};
use vlm::engine::{
    prompt_from_ids, Backend, DecodeOptions, Engine, EngineError, Generation, ImageInput,
};
use vlm::sampler::{Sampler, SamplingParams};
use vlm::stream::StreamConfig;

use crate::{argmax, image_input, max_abs_diff, GoldenCase};

/// The greedy sampler (default sampling parameters).
pub fn greedy() -> Sampler {
    Sampler::new(SamplingParams::default()).unwrap()
}

/// [`Engine::generate`] with the greedy sampler, keeping the logits of every step.
pub fn generate_greedy<B: Backend>(
    e: &mut Engine<B>,
    prompt: &Prompt,
    images: &[ImageInput],
    cfg: StreamConfig,
) -> Generation {
    let keep = DecodeOptions { keep_logits: true };
    e.generate(prompt, images, &mut greedy(), cfg, keep, &mut |_| {})
        .unwrap()
}

/// [`Engine::decode`] from the current state with the greedy sampler, keeping the logits of
/// every step.
pub fn decode_greedy<B: Backend>(e: &mut Engine<B>, cfg: StreamConfig) -> Generation {
    let keep = DecodeOptions { keep_logits: true };
    e.decode(&mut greedy(), cfg, keep, &mut |_| {}).unwrap()
}

/// [`Engine::generate`] of a text-only `prompt` with the greedy sampler; events dropped,
/// logits not kept.
pub fn try_generate_text<B: Backend>(
    e: &mut Engine<B>,
    prompt: &Prompt,
    cfg: StreamConfig,
) -> Result<Generation, EngineError> {
    let opts = DecodeOptions::default();
    e.generate(prompt, &[], &mut greedy(), cfg, opts, &mut |_| {})
}

/// The prompt of golden case `c` for `e` (the HF ids, each run of `<|image_pad|>` one slot of
/// the backend's bucket) and the case's images.
pub fn case_prompt<B: Backend>(e: &Engine<B>, c: &GoldenCase) -> (Prompt, Vec<ImageInput>) {
    let pad = e.tokenizer().token_to_id("<|image_pad|>").unwrap();
    let side = e.backend().info().vision.map_or(1, |v| {
        (v.geometry.side / v.geometry.patch / v.geometry.merge) as u32
    });
    let prompt = prompt_from_ids(&c.ids, pad, side).unwrap();
    (prompt, c.images.iter().map(|p| image_input(p)).collect())
}

/// Feeds text `ids` at the next text positions; the logits of the last row.
pub fn feed_text<B: Backend>(b: &mut B, ids: &[u32]) -> Vec<f32> {
    let mut rows = Vec::new();
    b.embed(ids, &mut rows).unwrap();
    let at = b.next_position();
    let pos: Vec<Pos3> = (0..ids.len() as u32).map(|i| Pos3::text(at + i)).collect();
    b.step(&rows, &pos).unwrap().to_vec()
}

/// `n` greedy steps from the current state (the argmax of the last logits fed back); the
/// logits of each step.
pub fn continue_greedy<B: Backend>(b: &mut B, n: usize) -> Vec<Vec<f32>> {
    let mut out = Vec::new();
    for _ in 0..n {
        let t = argmax(b.last_logits().unwrap());
        let mut x = Vec::new();
        b.embed(&[t], &mut x).unwrap();
        let p = [Pos3::text(b.next_position())];
        out.push(b.step(&x, &p).unwrap().to_vec());
    }
    out
}

/// From an empty state: text `ids`, then `steps` greedy steps; the logits of the prompt and
/// of every step.
pub fn text_then_greedy<B: Backend>(b: &mut B, ids: &[u32], steps: usize) -> Vec<Vec<f32>> {
    b.reset().unwrap();
    let mut all = vec![feed_text(b, ids)];
    all.extend(continue_greedy(b, steps));
    all
}

/// A teacher-forced greedy run.
#[derive(Debug, Clone, PartialEq)]
pub struct Teacher {
    /// Logits of the prompt, then of every step.
    pub logits: Vec<Vec<f32>>,
    /// The token chosen from each but the last row of `logits`.
    pub tokens: Vec<u32>,
}

/// From an empty state: golden case `c` (images encoded and spliced), then `steps` greedy
/// steps.
pub fn greedy_case<B: Backend>(e: &mut Engine<B>, c: &GoldenCase, steps: usize) -> Teacher {
    e.backend_mut().reset().unwrap();
    let (prompt, images) = case_prompt(e, c);
    let (rows, pos) = e.turn_rows(&prompt, &images).unwrap();
    let b = e.backend_mut();
    let mut logits = vec![b.step(&rows, &pos).unwrap().to_vec()];
    logits.extend(continue_greedy(b, steps));
    let tokens = logits[..steps].iter().map(|l| argmax(l)).collect();
    Teacher { logits, tokens }
}

/// `got` within `tol` of the CPU reference run `cpu` at every row, and both chose the golden
/// tokens of `c`.
pub fn assert_matches_reference(got: &Teacher, cpu: &Teacher, tol: f32, c: &GoldenCase) {
    assert_logits_close(&got.logits, &cpu.logits, tol, &c.name);
    assert_eq!(got.tokens, c.greedy, "{}: greedy tokens vs goldens", c.name);
    assert_eq!(
        cpu.tokens, c.greedy,
        "{}: CPU greedy tokens vs goldens",
        c.name
    );
}

/// Every row of `got` within `tol` of the same row of `want` (max |Δ|), as many rows.
pub fn assert_logits_close(got: &[Vec<f32>], want: &[Vec<f32>], tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: steps");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        let d = max_abs_diff(a, b);
        assert!(d <= tol, "{what}: step {i}: max |Δ| {d} > {tol}");
    }
}

//! Host cost of sampling one token over the 4B vocabulary (248,320 logits), the sampler's
//! share of the per-token host overhead (`vlm bench --host-overhead` measures the whole).
//!
//! ```text
//! cargo bench -p vlm --bench sampler
//! ```
//!
//! Each token first copies its logits row into one reused buffer, as the decode step's
//! INVALIDATE does, so the sampler reads a row that is warm in cache exactly as in the engine;
//! only `Sampler::sample` is timed. Rows are roughly LM-shaped (most logits near 0, one in a
//! thousand 12 higher), so top-k/top-p selection sees a realistic distribution.
#![allow(clippy::unwrap_used)]

use std::time::Instant;

use rand::{Rng, SeedableRng};
use vlm::sampler::{Sampler, SamplingParams};

const VOCAB: usize = 248_320;
const TOKENS: usize = 4000;

fn logits(seed: u64) -> Vec<f32> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..VOCAB)
        .map(|_| {
            let u: f32 = rng.random();
            let v: f32 = rng.random::<f32>() * 4.0 - 2.0;
            if u < 0.001 {
                v + 12.0
            } else {
                v
            }
        })
        .collect()
}

/// Sorted per-token times in ms.
fn per_token(params: SamplingParams, rows: &[Vec<f32>]) -> Vec<f64> {
    let mut s = Sampler::new(params).unwrap();
    let mut host = vec![0.0f32; VOCAB];
    let mut times = Vec::with_capacity(TOKENS);
    for i in 0..TOKENS + 8 {
        host.copy_from_slice(&rows[i % rows.len()]);
        let t = Instant::now();
        let id = s.sample(&host).unwrap();
        let dt = t.elapsed().as_secs_f64() * 1e3;
        s.accept(id);
        if i >= 8 {
            times.push(dt);
        }
    }
    times.sort_by(f64::total_cmp);
    times
}

fn main() {
    let rows: Vec<Vec<f32>> = (0..16).map(logits).collect();
    let q = |t: &[f64], f: f64| t[((t.len() - 1) as f64 * f) as usize];
    println!("sampler, vocabulary {VOCAB}, {TOKENS} tokens, ms per token");
    println!("| sampling | min | p10 | median | p90 |");
    println!("|---|---|---|---|---|");
    for (name, params) in [
        ("greedy", SamplingParams::default()),
        (
            "non-thinking (T 0.7, top-p 0.8, top-k 20, presence 1.5)",
            SamplingParams {
                seed: Some(1),
                ..SamplingParams::qwen35_non_thinking()
            },
        ),
        (
            "thinking (T 1.0, top-p 0.95, top-k 20, presence 1.5)",
            SamplingParams {
                seed: Some(1),
                ..SamplingParams::qwen35_thinking()
            },
        ),
        (
            "T 0.8, top-p 0.9, no top-k (512 candidates)",
            SamplingParams {
                seed: Some(1),
                temperature: 0.8,
                top_p: 0.9,
                ..SamplingParams::default()
            },
        ),
    ] {
        let t = per_token(params, &rows);
        println!(
            "| {name} | {:.4} | {:.4} | {:.4} | {:.4} |",
            t[0],
            q(&t, 0.1),
            q(&t, 0.5),
            q(&t, 0.9)
        );
    }
}

//! Host cost of sampling one token over the 4B vocabulary (248320). A measurement, not a
//! gate: run with `cargo test --release -p vlm --test sampler_perf -- --ignored --nocapture`.
#![allow(clippy::unwrap_used)]

use std::time::Instant;

use rand::{Rng, SeedableRng};
use vlm::sampler::{Sampler, SamplingParams};

const VOCAB: usize = 248_320;

fn logits(seed: u64) -> Vec<f32> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    // Roughly LM-shaped: most logits near 0, a few large ones.
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

/// Per-call times in ms, sorted (wall clock per call, so preemption on a busy machine shows
/// up only in the upper percentiles).
fn per_token(params: SamplingParams, rows: &[Vec<f32>], n: usize) -> Vec<f64> {
    let mut s = Sampler::new(params).unwrap();
    for row in rows.iter().take(8) {
        let id = s.sample(row).unwrap();
        s.accept(id);
    }
    let mut times = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        let id = s.sample(&rows[i % rows.len()]).unwrap();
        times.push(t.elapsed().as_secs_f64() * 1e3);
        s.accept(id);
    }
    times.sort_by(f64::total_cmp);
    times
}

#[test]
#[ignore = "benchmark; run in release"]
fn sampling_cost_per_token_on_a_4b_vocabulary() {
    let rows: Vec<Vec<f32>> = (0..16).map(logits).collect();
    let greedy = per_token(SamplingParams::default(), &rows, 2000);
    let card = per_token(
        SamplingParams {
            seed: Some(1),
            ..SamplingParams::qwen35_non_thinking()
        },
        &rows,
        2000,
    );
    let q = |t: &[f64], f: f64| t[((t.len() - 1) as f64 * f) as usize];
    println!(
        "greedy: min {:.4} p10 {:.4} median {:.4} ms/token",
        greedy[0],
        q(&greedy, 0.1),
        q(&greedy, 0.5)
    );
    println!(
        "T0.7 top-p0.8 top-k20 presence1.5: min {:.4} p10 {:.4} median {:.4} ms/token",
        card[0],
        q(&card, 0.1),
        q(&card, 0.5)
    );
    if !cfg!(debug_assertions) {
        let p10 = q(&card, 0.1);
        assert!(
            p10 < 0.2,
            "model-card sampling p10 {p10} ms/token exceeds 0.2 ms"
        );
    }
}

//! Host cost of the stop filter per generated token at the node's request limits
//! (`max_stop_strings` 16, each at most 256 bytes), through the public streaming API.
//!
//! ```text
//! cargo bench -p vlm --bench stop_filter
//! ```
//!
//! Each case streams the same token ids through [`TokenStream::push`] once without stop
//! strings and once with 16 stop strings of 256 bytes; the difference per token is the stop
//! filter's cost (detokenising is the same in both). Cases:
//! - prose: an English paragraph against 16 random lowercase strings (a held-back suffix is
//!   rare: only text that could still start a stop string is held);
//! - near-miss: a stream of `a` against 16 strings of 255 `a` and one distinct last byte, the
//!   worst case: every token leaves 255 bytes held back, which are searched and tested
//!   against every stop string again.
//!
//! The fixture tokenizer (`tools/fixtures/tokenizer.json`, 600-entry byte-level BPE) has
//! short tokens; the bytes per token are printed with each case.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use rand::{Rng, SeedableRng};
use tokenizers::Tokenizer;
use vlm::stream::{Action, Event, StreamConfig, TokenStream};

const STOPS: usize = 16;
const STOP_BYTES: usize = 256;
const RUNS: usize = 7;

const PROSE: &str = "The robot stands in a small kitchen. On the table there is a red mug, \
    a plate with two slices of bread and a folded newspaper. Behind the table a window shows \
    a garden with a wooden fence; the light comes from the left, so the mug casts a short \
    shadow to the right. A chair is pushed under the table and a green towel hangs on its \
    back. ";

/// Seconds per token of streaming `ids` with `stop`, the median of [`RUNS`] runs, and the
/// bytes emitted per token.
fn per_token(tok: &Arc<Tokenizer>, ids: &[u32], stop: &[String]) -> (f64, f64) {
    let mut times = Vec::with_capacity(RUNS);
    let mut bytes = 0usize;
    for _ in 0..RUNS + 1 {
        let mut cfg = StreamConfig::new(Vec::new(), usize::MAX);
        cfg.stop = stop.to_vec();
        let mut stream = TokenStream::new(tok.clone(), cfg);
        let mut out = 0usize;
        let mut emit = |e: Event| {
            if let Event::Text { text, .. } = e {
                out += text.len();
            }
        };
        let t = Instant::now();
        for &id in ids {
            let action = stream.push(id, &mut emit).unwrap();
            assert_eq!(
                action,
                Action::Feed,
                "a stop string matched: the case is wrong"
            );
        }
        times.push(t.elapsed().as_secs_f64() / ids.len() as f64);
        bytes = out;
    }
    // The first run warms caches and the allocator.
    let mut times = times.split_off(1);
    times.sort_by(f64::total_cmp);
    (times[RUNS / 2], bytes as f64 / ids.len() as f64)
}

fn main() {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tools/fixtures/tokenizer.json");
    let tok = Arc::new(Tokenizer::from_file(path).unwrap());
    let ids = |text: &str| tok.encode(text, false).unwrap().get_ids().to_vec();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let random: Vec<String> = (0..STOPS)
        .map(|_| {
            (0..STOP_BYTES)
                .map(|_| char::from(b'a' + rng.random_range(0..26u8)))
                .collect()
        })
        .collect();
    let near_miss: Vec<String> = (0..STOPS)
        .map(|i| "a".repeat(STOP_BYTES - 1) + &char::from(b'b' + i as u8).to_string())
        .collect();
    let cases = [
        (
            "prose, 16 random stop strings",
            ids(&PROSE.repeat(40)),
            random,
        ),
        (
            "near-miss, 16 strings of 255 'a' + 1",
            ids(&"a".repeat(20_000)),
            near_miss,
        ),
    ];
    println!("stop filter, {STOPS} stop strings of {STOP_BYTES} bytes, µs per token (median of {RUNS} runs)");
    println!("| case | tokens | bytes/token | no stop strings | with stop strings | stop filter |");
    println!("|---|---|---|---|---|---|");
    for (name, ids, stop) in cases {
        let (base, bytes) = per_token(&tok, &ids, &[]);
        let (with, _) = per_token(&tok, &ids, &stop);
        println!(
            "| {name} | {} | {bytes:.2} | {:.2} | {:.2} | {:.2} |",
            ids.len(),
            base * 1e6,
            with * 1e6,
            (with - base) * 1e6
        );
    }
}

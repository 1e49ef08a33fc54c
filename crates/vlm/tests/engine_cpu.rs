//! The engine (scheduler + `CpuBackend`) against the HF goldens of the fixture models:
//! greedy tokens and step logits, chunked prefill vs stepping, snapshot/restore, context
//! overflow and the window end, cancel/deadline, image vs no image.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use qwen35::Qwen35Model;
use safetensors::{Dtype, SafeTensors};
use tokenizers::Tokenizer;
use vlm::chat::{Prompt, Segment};
use vlm::engine::{
    prompt_from_ids, Backend, CpuBackend, CpuOptions, DecodeOptions, Engine, EngineError,
    Generation, ImageInput, StateBlob,
};
use vlm::sampler::{Sampler, SamplingParams};
use vlm::stream::{Event, FinishReason, StreamConfig};
use vlm::vision::RgbImage;

/// f32 logits vs HF goldens and between schedules (issue 5).
const LOGIT_TOL: f32 = 1e-4;
const MODELS: [&str; 3] = ["tiny-sym", "tiny-4b", "tiny-untied"];
/// Merged grid side of the 320 px bucket (patch 16, merge 2).
const SIDE: u32 = 10;

struct Fixture {
    dir: PathBuf,
    json: serde_json::Value,
    goldens: Vec<u8>,
    model: Arc<Qwen35Model>,
    tokenizer: Arc<Tokenizer>,
}

impl Fixture {
    fn load(name: &str) -> Self {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../tools/fixtures/models")
            .join(name);
        let json =
            serde_json::from_slice(&std::fs::read(dir.join("goldens.json")).unwrap()).unwrap();
        let goldens = std::fs::read(dir.join("goldens.safetensors")).unwrap();
        let model = Arc::new(Qwen35Model::load(&dir).unwrap());
        let tokenizer = Arc::new(Tokenizer::from_file(dir.join("tokenizer.json")).unwrap());
        Self {
            dir,
            json,
            goldens,
            model,
            tokenizer,
        }
    }

    fn case(&self, name: &str) -> &serde_json::Value {
        self.json["cases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap()
    }

    fn f32(&self, key: &str) -> Vec<f32> {
        let st = SafeTensors::deserialize(&self.goldens).unwrap();
        let t = st.tensor(key).unwrap();
        assert_eq!(t.dtype(), Dtype::F32);
        t.data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    fn pad(&self) -> u32 {
        self.model.config.image_token_id.unwrap()
    }

    /// The case's prompt (ids as HF fed them, image pads as slots) and its images.
    fn prompt(&self, case: &serde_json::Value) -> (Prompt, Vec<ImageInput>) {
        let prompt = prompt_from_ids(&ids(&case["prompt_ids"]), self.pad(), SIDE).unwrap();
        let images = case["images"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| self.image(p.as_str().unwrap()))
            .collect();
        (prompt, images)
    }

    fn image(&self, rel: &str) -> ImageInput {
        let img = image::open(self.dir.join(rel)).unwrap().to_rgb8();
        let (w, h) = (img.width() as usize, img.height() as usize);
        ImageInput::Rgb(RgbImage::new(w, h, img.into_raw()).unwrap())
    }

    fn engine(&self, opts: CpuOptions) -> Engine<CpuBackend> {
        Engine::new(
            CpuBackend::new(self.model.clone(), opts).unwrap(),
            self.tokenizer.clone(),
        )
    }
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn opts(context: usize, chunk: usize) -> CpuOptions {
    CpuOptions {
        context: Some(context),
        prefill_chunk: chunk,
        ..CpuOptions::default()
    }
}

fn greedy() -> Sampler {
    Sampler::new(SamplingParams::default()).unwrap()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn run(
    engine: &mut Engine<CpuBackend>,
    prompt: &Prompt,
    images: &[ImageInput],
    cfg: StreamConfig,
) -> Generation {
    let keep = DecodeOptions { keep_logits: true };
    engine
        .generate(prompt, images, &mut greedy(), cfg, keep, &mut |_| {})
        .unwrap()
}

#[test]
fn greedy_tokens_and_step_logits_match_goldens_for_every_schedule() {
    for name in MODELS {
        let fx = Fixture::load(name);
        let v = fx.model.config.text.vocab_size;
        for case in fx.json["cases"].as_array().unwrap() {
            let cname = case["name"].as_str().unwrap();
            let (prompt, images) = fx.prompt(case);
            let want_tokens = ids(&case["greedy_tokens"]);
            let want_logits = fx.f32(case["tensors"]["step_logits"].as_str().unwrap());
            let mut per_schedule = Vec::new();
            for (chunk, heads) in [
                (32, 1),
                (16, fx.model.config.text.num_attention_heads),
                (0, 1),
            ] {
                let mut e = fx.engine(CpuOptions {
                    mask_heads: heads,
                    ..opts(512, chunk)
                });
                let g = run(
                    &mut e,
                    &prompt,
                    &images,
                    StreamConfig::new(vec![], want_tokens.len()),
                );
                let c = &g.completion;
                assert_eq!(
                    c.finish_reason,
                    FinishReason::Length,
                    "{name}/{cname}/N={chunk}"
                );
                assert_eq!(
                    c.tokens, want_tokens,
                    "{name}/{cname}/N={chunk}: greedy tokens"
                );
                assert_eq!(c.timings.prompt_tokens, prompt.rows());
                for (i, l) in g.step_logits.iter().enumerate() {
                    let d = max_abs_diff(l, &want_logits[i * v..(i + 1) * v]);
                    assert!(
                        d <= LOGIT_TOL,
                        "{name}/{cname}/N={chunk}: step {i} |diff| {d}"
                    );
                }
                // every fed row occupies one slot: prompt rows + all generated tokens but the last
                assert_eq!(
                    e.backend().consumed(),
                    prompt.rows() + want_tokens.len() - 1
                );
                per_schedule.push(g.step_logits);
            }
            for other in &per_schedule[1..] {
                for (a, b) in per_schedule[0].iter().zip(other) {
                    let d = max_abs_diff(a, b);
                    assert!(
                        d <= LOGIT_TOL,
                        "{name}/{cname}: chunked vs stepped |diff| {d}"
                    );
                }
            }
        }
    }
}

#[test]
fn images_change_the_answer_and_positions_advance_by_the_grid_side() {
    let fx = Fixture::load("tiny-4b");
    let case = fx.case("image_one");
    let (prompt, images) = fx.prompt(case);
    let with = run(
        &mut fx.engine(opts(512, 32)),
        &prompt,
        &images,
        StreamConfig::new(vec![], 16),
    );
    // the same turn without the image block
    let text_only = Prompt {
        segments: prompt
            .segments
            .iter()
            .filter(|s| matches!(s, Segment::Tokens(_)))
            .cloned()
            .map(|s| match s {
                Segment::Tokens(t) => {
                    Segment::Tokens(t.into_iter().filter(|&id| id != 609 && id != 610).collect())
                }
                other => other,
            })
            .collect(),
        starts_in_think: false,
    };
    let mut e = fx.engine(opts(512, 32));
    let without = run(&mut e, &text_only, &[], StreamConfig::new(vec![], 16));
    assert_ne!(with.completion.tokens, without.completion.tokens);
    let other = run(
        &mut fx.engine(opts(512, 32)),
        &prompt,
        &[fx.image("../../images/scene_b.png")],
        StreamConfig::new(vec![], 16),
    );
    assert_ne!(with.completion.tokens, other.completion.tokens);

    // maxPos bookkeeping: 119 rows, one 10x10 image → next text position = 119 - 100 + 10
    let mut e = fx.engine(opts(512, 32));
    assert!(e.prefill(&prompt, &images, &mut || false).unwrap());
    assert_eq!(e.backend().consumed(), 119);
    assert_eq!(e.backend().next_position(), 119 - 100 + 10);
    // a slot that does not match the images given is refused before anything runs
    let err = fx
        .engine(opts(512, 32))
        .prefill(&prompt, &[], &mut || false)
        .unwrap_err();
    assert!(matches!(err, EngineError::Image { .. }), "{err}");
    assert!(prompt_from_ids(&[609, 612, 612, 610], fx.pad(), SIDE).is_err());
}

#[test]
fn snapshot_restore_continue_equals_an_uninterrupted_run() {
    let fx = Fixture::load("tiny-4b");
    let case = fx.case("image_one");
    let (prompt, images) = fx.prompt(case);
    let keep = DecodeOptions { keep_logits: true };

    let mut a = fx.engine(opts(256, 32));
    assert!(a.prefill(&prompt, &images, &mut || false).unwrap());
    let blob = a.backend_mut().snapshot().unwrap();
    // header + sizes + trimmed K/V (P rows of kv_heads·head_dim f32, K and V) + GDN whole + logits
    let tc = &fx.model.config.text;
    let p = prompt.rows();
    let kv = tc
        .layer_types
        .iter()
        .filter(|t| **t == qwen35::LayerType::FullAttention)
        .count();
    let gdn = tc.num_layers() - kv;
    let gdn_bytes = (tc.linear_num_value_heads * tc.linear_key_head_dim * tc.linear_value_head_dim
        + tc.linear_conv_dim() * (tc.linear_conv_kernel_dim - 1))
        * 4;
    let want = 7 * 4
        + 2 * tc.num_layers() * 4
        + kv * 2 * p * tc.num_key_value_heads * tc.head_dim * 4
        + gdn * gdn_bytes
        + tc.vocab_size * 4;
    assert_eq!(blob.size_bytes(), want);
    assert_eq!(blob.consumed(), Some(p));

    let first = a
        .decode(
            &mut greedy(),
            StreamConfig::new(vec![], 16),
            keep,
            &mut |_| {},
        )
        .unwrap();
    assert_eq!(first.completion.tokens, ids(&case["greedy_tokens"]));

    // restore into a fresh backend with another schedule (stored bytes round trip)
    let mut b = fx.engine(opts(256, 16));
    b.backend_mut()
        .restore(&StateBlob::from_bytes(blob.clone().into_bytes()))
        .unwrap();
    assert_eq!(b.backend().consumed(), p);
    assert_eq!(
        b.backend().next_position(),
        a.backend().next_position() - 15
    );
    let second = b
        .decode(
            &mut greedy(),
            StreamConfig::new(vec![], 16),
            keep,
            &mut |_| {},
        )
        .unwrap();
    assert_eq!(second.completion.tokens, first.completion.tokens);
    assert_eq!(
        second.step_logits, first.step_logits,
        "restored run must be bit-identical"
    );

    // mid-conversation: park A, restore it into B, continue both with the same rows
    let mid = a.backend_mut().snapshot().unwrap();
    b.backend_mut().restore(&mid).unwrap();
    let more = [5u32, 77, 300, 12];
    for &t in &more {
        for e in [&mut a, &mut b] {
            let mut row = Vec::new();
            e.backend().embed(&[t], &mut row).unwrap();
            let pos = vlm::chat::Pos3::text(e.backend().next_position());
            e.backend_mut().step(&row, &[pos]).unwrap();
        }
        assert_eq!(a.backend().last_logits(), b.backend().last_logits());
    }

    // a blob from another window size, a damaged one and one with a wrong magic are refused
    let mut c = fx.engine(opts(128, 32));
    assert!(matches!(
        c.backend_mut().restore(&blob),
        Err(EngineError::State { .. })
    ));
    let mut bytes = blob.clone().into_bytes();
    bytes.truncate(bytes.len() - 3);
    assert!(matches!(
        b.backend_mut().restore(&StateBlob::from_bytes(bytes)),
        Err(EngineError::State { .. })
    ));
    let mut bytes = blob.into_bytes();
    bytes[0] ^= 1;
    assert!(matches!(
        b.backend_mut().restore(&StateBlob::from_bytes(bytes)),
        Err(EngineError::State { .. })
    ));

    // reset empties the state
    a.backend_mut().reset().unwrap();
    assert_eq!(
        (
            a.backend().consumed(),
            a.backend().max_pos(),
            a.backend().last_logits()
        ),
        (0, None, None)
    );
}

#[test]
fn context_overflow_is_a_typed_error_and_the_window_end_is_length() {
    let fx = Fixture::load("tiny-4b");
    let case = fx.case("text_32");
    let (prompt, _) = fx.prompt(case);
    let mut e = fx.engine(opts(16, 0));
    let err = e
        .generate(
            &prompt,
            &[],
            &mut greedy(),
            StreamConfig::new(vec![], 16),
            DecodeOptions::default(),
            &mut |_| {},
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::ContextOverflow {
                needed: 32,
                left: 16
            }
        ),
        "{err}"
    );
    assert_eq!(e.backend().consumed(), 0, "nothing may be fed on overflow");

    // 32 prompt rows in a 40-slot window: 8 tokens fit back in, the 9th ends the reply
    let mut e = fx.engine(opts(40, 32));
    let g = run(&mut e, &prompt, &[], StreamConfig::new(vec![], 16));
    assert_eq!(g.completion.finish_reason, FinishReason::Length);
    assert_eq!(
        g.completion.tokens,
        ids(&case["greedy_tokens"])[..9].to_vec()
    );
    assert_eq!(e.backend().context_left(), 0);
    let err = e
        .backend_mut()
        .step(
            &vec![0.0; fx.model.config.text.hidden_size],
            &[vlm::chat::Pos3::text(99)],
        )
        .unwrap_err();
    assert!(
        matches!(err, EngineError::ContextOverflow { needed: 1, left: 0 }),
        "{err}"
    );
}

#[test]
fn cancel_and_deadline_stop_generation() {
    let fx = Fixture::load("tiny-4b");
    let case = fx.case("text_short");
    let (prompt, _) = fx.prompt(case);

    // cancelled from the event callback after the first delta
    let flag = Arc::new(AtomicBool::new(false));
    let mut cfg = StreamConfig::new(vec![], 16);
    cfg.cancel = Some(flag.clone());
    let mut text = String::new();
    let mut e = fx.engine(opts(64, 0));
    let g = e
        .generate(
            &prompt,
            &[],
            &mut greedy(),
            cfg,
            DecodeOptions::default(),
            &mut |ev| {
                if let Event::Text { text: t, .. } = ev {
                    text.push_str(&t);
                    flag.store(true, Ordering::Relaxed);
                }
            },
        )
        .unwrap();
    let c = g.completion;
    assert_eq!(c.finish_reason, FinishReason::Cancelled);
    assert!(
        !c.tokens.is_empty() && c.tokens.len() < 16,
        "{} tokens",
        c.tokens.len()
    );
    assert_eq!(
        c.tokens,
        ids(&case["greedy_tokens"])[..c.tokens.len()].to_vec()
    );
    assert_eq!(text, c.text);
    // the engine stays usable
    e.backend_mut().reset().unwrap();
    let g = run(&mut e, &prompt, &[], StreamConfig::new(vec![], 4));
    assert_eq!(
        g.completion.tokens,
        ids(&case["greedy_tokens"])[..4].to_vec()
    );

    // cancelled before the prefill: nothing runs
    let mut cfg = StreamConfig::new(vec![], 16);
    cfg.cancel = Some(Arc::new(AtomicBool::new(true)));
    let mut e = fx.engine(opts(64, 0));
    let g = e
        .generate(
            &prompt,
            &[],
            &mut greedy(),
            cfg,
            DecodeOptions::default(),
            &mut |_| {},
        )
        .unwrap();
    assert_eq!(g.completion.finish_reason, FinishReason::Cancelled);
    assert!(g.completion.tokens.is_empty());
    assert_eq!(e.backend().consumed(), 0);

    // a deadline in the past
    let mut cfg = StreamConfig::new(vec![], 16);
    cfg.deadline = Some(Instant::now() - Duration::from_millis(1));
    let g = fx
        .engine(opts(64, 0))
        .generate(
            &prompt,
            &[],
            &mut greedy(),
            cfg,
            DecodeOptions::default(),
            &mut |_| {},
        )
        .unwrap();
    assert_eq!(g.completion.finish_reason, FinishReason::Timeout);

    // eos is never fed back: stop on the golden's 3rd token
    let want = ids(&case["greedy_tokens"]);
    let mut e = fx.engine(opts(64, 0));
    let g = run(&mut e, &prompt, &[], StreamConfig::new(vec![want[2]], 16));
    assert_eq!(g.completion.finish_reason, FinishReason::Stop);
    assert_eq!(g.completion.tokens, want[..2].to_vec());
    assert_eq!(e.backend().consumed(), prompt.rows() + 2);
}

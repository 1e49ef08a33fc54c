//! `BpuBackend` over the simulator on sim packages built from the committed tiny fixture,
//! checked against the CPU backend (`qwen35` on the HF weights, an independent code path)
//! and the HF goldens' greedy tokens.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use bpu_sim::package::{PackageOptions, PrefillIn};
use bpu_sim::{FaultAction, FaultRule, LogitsType, Sim, SimConfig};
use vlm_bpu::{BpuBackend, BpuOptions};
use vlm::chat::Pos3;
use vlm::engine::{
    prompt_from_ids, Backend, CpuBackend, CpuOptions, Engine, EngineError, ImageInput,
};

use vlm_testkit as common;

use common::{argmax, golden_case, max_abs_diff as max_diff, tokenizer, GoldenCase as Case};

/// Named tolerance of f32 logits between two computation orders.
const F32_TOL: f32 = 1e-4;
const STEPS: usize = 16;

fn model_dir() -> PathBuf {
    common::model_dir("tiny-sym")
}

fn package(dir: &Path, tweak: impl FnOnce(&mut PackageOptions)) {
    common::sim_package("tiny-sym", dir, tweak);
}

fn sim() -> Sim {
    let s = Sim::new(SimConfig::default());
    s.install();
    s
}

fn bpu(dir: &Path) -> Engine<BpuBackend> {
    Engine::new(
        BpuBackend::open(dir, &BpuOptions::default()).unwrap(),
        tokenizer(),
    )
}

fn cpu() -> Engine<CpuBackend> {
    let opts = CpuOptions {
        context: Some(512),
        prefill_chunk: 0,
        ..CpuOptions::default()
    };
    Engine::new(CpuBackend::load(&model_dir(), opts).unwrap(), tokenizer())
}

fn case(name: &str) -> Case {
    golden_case("tiny-sym", name)
}

/// Prompt then `STEPS` greedy steps: the logits of the prompt and of every step, and the tokens.
fn greedy<B: Backend>(e: &mut Engine<B>, c: &Case) -> (Vec<Vec<f32>>, Vec<u32>) {
    e.backend_mut().reset().unwrap();
    let pad = e.tokenizer().token_to_id("<|image_pad|>").unwrap();
    let side = e.backend().info().vision.map_or(1, |v| {
        (v.geometry.side / v.geometry.patch / v.geometry.merge) as u32
    });
    let prompt = prompt_from_ids(&c.ids, pad, side).unwrap();
    let images: Vec<ImageInput> = c
        .images
        .iter()
        .map(|p| {
            let im = image::open(p).unwrap().to_rgb8();
            let (w, h) = (im.width() as usize, im.height() as usize);
            ImageInput::Rgb(vlm::vision::RgbImage::new(w, h, im.into_raw()).unwrap())
        })
        .collect();
    let (rows, pos) = e.turn_rows(&prompt, &images).unwrap();
    let b = e.backend_mut();
    let mut all = vec![b.step(&rows, &pos).unwrap().to_vec()];
    let mut toks = Vec::new();
    for _ in 0..STEPS {
        let t = argmax(all.last().unwrap());
        toks.push(t);
        let mut x = Vec::new();
        b.embed(&[t], &mut x).unwrap();
        let p = Pos3::text(b.next_position());
        all.push(b.step(&x, &[p]).unwrap().to_vec());
    }
    (all, toks)
}

fn compare(
    bpu_run: &(Vec<Vec<f32>>, Vec<u32>),
    cpu_run: &(Vec<Vec<f32>>, Vec<u32>),
    tol: f32,
    c: &Case,
) {
    for (i, (a, b)) in bpu_run.0.iter().zip(&cpu_run.0).enumerate() {
        let d = max_diff(a, b);
        assert!(d <= tol, "{}: step {i}: max |Δ| = {d} > {tol}", c.name);
    }
    assert_eq!(bpu_run.1, c.greedy, "{}: greedy tokens vs goldens", c.name);
    assert_eq!(
        cpu_run.1, c.greedy,
        "{}: CPU greedy tokens vs goldens",
        c.name
    );
}

#[test]
fn golden_cases_match_the_cpu_backend() {
    let d = tempfile::tempdir().unwrap();
    package(d.path(), |_| {});
    let _sim = sim();
    let mut b = bpu(d.path());
    assert_eq!(b.backend().info().prefill_chunk, 32);
    assert_eq!(b.backend().implementation(), bpu_sim::Implementation::Sim);
    let mut c = cpu();
    for name in ["text_short", "text_32", "text_long", "image_one"] {
        let k = case(name);
        let got = greedy(&mut b, &k);
        let want = greedy(&mut c, &k);
        compare(&got, &want, F32_TOL, &k);
    }
}

#[test]
fn variants_match_the_cpu_backend() {
    let _sim = sim();
    let mut c = cpu();
    let k = case("text_long");
    let want = greedy(&mut c, &k);
    // One mask plane, prefill graph inside model.hbm with all-row logits.
    let d = tempfile::tempdir().unwrap();
    package(d.path(), |o| {
        o.mask_heads_one = true;
        o.prefill_in = PrefillIn::Model;
        o.prefill_logits_all = true;
    });
    let mut b = bpu(d.path());
    assert_eq!(b.backend().info().mask_heads, 1);
    assert_eq!(b.backend().info().prefill_chunk, 32);
    compare(&greedy(&mut b, &k), &want, F32_TOL, &k);
    // No prefill graph: every row is stepped.
    let d = tempfile::tempdir().unwrap();
    package(d.path(), |o| o.prefill_in = PrefillIn::None);
    let mut b = bpu(d.path());
    assert_eq!(b.backend().info().prefill_chunk, 0);
    compare(&greedy(&mut b, &k), &want, F32_TOL, &k);
    // S16 logits: within half a quantisation step, same tokens.
    let d = tempfile::tempdir().unwrap();
    package(d.path(), |o| o.logits = LogitsType::S16);
    let mut b = bpu(d.path());
    let (dtype, scale) = b.backend().logits_format();
    assert_eq!(dtype, hbdnn::DType::S16);
    compare(&greedy(&mut b, &k), &want, scale / 2.0 + F32_TOL, &k);
}

/// Teacher-forces the same 48-token continuation through "with prefill graph" and
/// "stepping only"; every step's logits agree.
#[test]
fn prefill_and_stepping_agree_over_a_teacher_forced_continuation() {
    let _sim = sim();
    let (dp, ds) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    package(dp.path(), |_| {});
    package(ds.path(), |o| o.prefill_in = PrefillIn::None);
    let mut p = BpuBackend::open(dp.path(), &BpuOptions::default()).unwrap();
    let mut s = BpuBackend::open(ds.path(), &BpuOptions::default()).unwrap();
    assert_eq!((p.info().prefill_chunk, s.info().prefill_chunk), (32, 0));
    let k = case("text_long");
    let cont: Vec<u32> = (0..48).map(|i| (i * 37 + 11) % 600).collect();
    let mut rows = Vec::new();
    p.embed(&k.ids, &mut rows).unwrap();
    let pos: Vec<Pos3> = (0..k.ids.len() as u32).map(Pos3::text).collect();
    let a = p.step(&rows, &pos).unwrap().to_vec();
    let b = s.step(&rows, &pos).unwrap().to_vec();
    assert!(max_diff(&a, &b) <= F32_TOL, "prompt logits");
    assert_eq!(argmax(&a), argmax(&b), "first token");
    for (i, &t) in cont.iter().enumerate() {
        let mut x = Vec::new();
        p.embed(&[t], &mut x).unwrap();
        let at = [Pos3::text(p.next_position())];
        let a = p.step(&x, &at).unwrap().to_vec();
        let b = s.step(&x, &at).unwrap().to_vec();
        let d = max_diff(&a, &b);
        assert!(d <= F32_TOL, "continuation step {i}: {d}");
    }
    assert_eq!(p.consumed(), s.consumed());
}

fn continue_greedy(b: &mut BpuBackend, n: usize) -> Vec<Vec<f32>> {
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

#[test]
fn snapshot_restore_continue_equals_uninterrupted() {
    let d = tempfile::tempdir().unwrap();
    package(d.path(), |o| o.cache_len = 64);
    let _sim = sim();
    let mut b = BpuBackend::open(d.path(), &BpuOptions::default()).unwrap();
    let k = case("text_32");
    let mut rows = Vec::new();
    b.embed(&k.ids, &mut rows).unwrap();
    let pos: Vec<Pos3> = (0..k.ids.len() as u32).map(Pos3::text).collect();
    b.step(&rows, &pos).unwrap();
    let blob = b.snapshot().unwrap();
    assert_eq!(blob.consumed(), Some(k.ids.len()));
    let straight = continue_greedy(&mut b, 8);
    // Something else in between, then back to the parked state.
    b.reset().unwrap();
    b.step(&rows[..64 * 3], &pos[..3]).unwrap();
    b.restore(&blob).unwrap();
    assert_eq!(b.consumed(), k.ids.len());
    assert_eq!(b.max_pos(), Some(k.ids.len() as u32 - 1));
    let resumed = continue_greedy(&mut b, 8);
    assert_eq!(straight, resumed);
    // A blob from another window size is refused.
    let d2 = tempfile::tempdir().unwrap();
    package(d2.path(), |o| o.cache_len = 48);
    let mut other = BpuBackend::open(d2.path(), &BpuOptions::default()).unwrap();
    assert!(matches!(
        other.restore(&blob),
        Err(EngineError::State { .. })
    ));
}

#[test]
fn context_overflow_is_a_typed_error() {
    let d = tempfile::tempdir().unwrap();
    package(d.path(), |o| {
        o.cache_len = 16;
        o.prefill_chunk = 4;
    });
    let _sim = sim();
    let mut b = BpuBackend::open(d.path(), &BpuOptions::default()).unwrap();
    assert_eq!(b.info().context, 16);
    let ids: Vec<u32> = (0..17).collect();
    let mut rows = Vec::new();
    b.embed(&ids, &mut rows).unwrap();
    let pos: Vec<Pos3> = (0..17).map(Pos3::text).collect();
    assert!(matches!(
        b.step(&rows, &pos),
        Err(EngineError::ContextOverflow {
            needed: 17,
            left: 16
        })
    ));
    assert_eq!(b.consumed(), 0);
    b.step(&rows[..16 * 64], &pos[..16]).unwrap();
    assert!(matches!(
        b.run_rows(&rows[16 * 64..], &pos[16..]),
        Err(EngineError::ContextOverflow { needed: 1, left: 0 })
    ));
}

#[test]
fn a_simulator_fault_fails_the_request_and_the_next_succeeds() {
    let d = tempfile::tempdir().unwrap();
    package(d.path(), |_| {});
    let sim = sim();
    let mut b = BpuBackend::open(d.path(), &BpuOptions::default()).unwrap();
    let k = case("text_short");
    let mut rows = Vec::new();
    b.embed(&k.ids, &mut rows).unwrap();
    let pos: Vec<Pos3> = (0..k.ids.len() as u32).map(Pos3::text).collect();
    let want = b.step(&rows, &pos).unwrap().to_vec();
    let want_next = continue_greedy(&mut b, 4);
    // Mid-generation: the third decode step times out.
    b.reset().unwrap();
    b.step(&rows, &pos).unwrap();
    sim.add_fault(
        FaultRule::new("hbUCPWaitTaskDone", FaultAction::Timeout)
            .after(2)
            .times(1),
    );
    let mut failed = false;
    for _ in 0..4 {
        let t = argmax(b.last_logits().unwrap());
        let mut x = Vec::new();
        b.embed(&[t], &mut x).unwrap();
        let p = [Pos3::text(b.next_position())];
        match b.step(&x, &p) {
            Ok(_) => {}
            Err(e) => {
                assert!(
                    matches!(&e, EngineError::Bpu { timeout: true, .. }),
                    "{e}"
                );
                failed = true;
                break;
            }
        }
    }
    assert!(failed, "the injected timeout did not fail the request");
    // The next request runs normally.
    b.reset().unwrap();
    let got = b.step(&rows, &pos).unwrap().to_vec();
    assert_eq!(got, want);
    assert_eq!(continue_greedy(&mut b, 4), want_next);
}

#[test]
fn open_failures_name_the_file() {
    let d = tempfile::tempdir().unwrap();
    package(d.path(), |_| {});
    let _sim = sim();
    // An explicit board choice contradicts the sim containers.
    let e = BpuBackend::open(
        d.path(),
        &BpuOptions {
            implementation: Some(bpu_sim::Implementation::Board),
            ..BpuOptions::default()
        },
    )
    .err()
    .unwrap();
    assert!(e.to_string().contains("model.hbm"), "{e}");
    // A truncated embedding table.
    let emb = d.path().join("embed_tokens.bin");
    let bytes = std::fs::read(&emb).unwrap();
    std::fs::write(&emb, &bytes[..bytes.len() - 2]).unwrap();
    let e = BpuBackend::open(d.path(), &BpuOptions::default())
        .err()
        .unwrap();
    let msg = e.to_string();
    assert!(
        msg.contains("embed_tokens.bin") && msg.contains("size mismatch"),
        "{msg}"
    );
    // Text only: the tower is never opened.
    std::fs::write(&emb, &bytes).unwrap();
    std::fs::write(d.path().join("visual.hbm"), b"garbage").unwrap();
    let b = BpuBackend::open(
        d.path(),
        &BpuOptions {
            no_vision: true,
            ..BpuOptions::default()
        },
    )
    .unwrap();
    assert!(b.info().vision.is_none());
}

//! The padded prompt tail both ways (contract §4.4, issue 14 item 2) over the simulator: sim
//! packages whose prefill graph was "compiled" for pads first or pads last, the calibration
//! that finds out which at open (and its cache), the goldens through each padded layout,
//! wrong numbers from the wrong layout, packages that cannot or need not be calibrated, and
//! a run without the prefill graph (item 6).
#![allow(clippy::unwrap_used)]

use vlm_testkit as common;

use std::path::Path;

use bpu_sim::package::PackageOptions;
use bpu_sim::{PadLayout, Sim, SimConfig};
use common::{
    assert_logits_close, generate_greedy, golden_case, golden_step_logits, max_abs_diff,
    sim_package, text_then_greedy, tokenizer, LOGIT_TOL,
};
use vlm::engine::{Backend, Engine};
use vlm::stream::StreamConfig;
use vlm_bpu::tail::COSINE_MIN;
use vlm_bpu::{BpuBackend, BpuOptions, PrefillTail, TailMode};

const MODEL: &str = "tiny-sym";

fn sim() -> Sim {
    let s = Sim::new(SimConfig::defaults_with_env_flush().unwrap());
    s.install();
    s
}

/// A tiny-sym package whose prefill graph takes pads laid out as `layout`; tails of 4..32
/// rows are padded.
fn pads_package(dir: &Path, layout: PadLayout, tweak: impl FnOnce(&mut PackageOptions)) {
    sim_package(MODEL, dir, |o| {
        o.prefill_pads = true;
        o.prefill_min_tail = Some(4);
        o.pad_layout = layout;
        tweak(o);
    });
}

fn options(cache: &Path, tail: PrefillTail) -> BpuOptions {
    BpuOptions {
        no_vision: true,
        prefill_tail: tail,
        cache_dir: Some(cache.to_owned()),
        ..BpuOptions::default()
    }
}

/// Opens `dir`; the graph runs the open took.
fn open_counting(s: &Sim, dir: &Path, opts: &BpuOptions) -> (BpuBackend, u64) {
    let r0 = s.stats().runs;
    let b = BpuBackend::open(dir, opts).unwrap();
    (b, s.stats().runs - r0)
}

#[test]
fn calibration_picks_the_layout_the_graph_was_built_for() {
    let s = sim();
    for (layout, want, other) in [
        (PadLayout::First, TailMode::PadsFirst, TailMode::PadsLast),
        (PadLayout::Last, TailMode::PadsLast, TailMode::PadsFirst),
    ] {
        let d = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        pads_package(d.path(), layout, |_| {});
        let (b, runs) = open_counting(&s, d.path(), &options(cache.path(), PrefillTail::Auto));
        let t = b.tail_decision();
        assert_eq!(t.mode, want, "{layout:?}: {}", t.reason);
        assert_eq!(t.min_tail, Some(4));
        assert!(!t.cached);
        let cal = t.calibration.as_ref().unwrap();
        let score = |m: TailMode| {
            let trial = cal.trials.iter().find(|x| x.mode == m).unwrap();
            trial.score().unwrap_or(f32::NEG_INFINITY)
        };
        assert!(score(want) >= 0.9999, "{layout:?}: {cal:?}");
        assert!(score(other) < COSINE_MIN, "{layout:?}: {cal:?}");
        // t stepped rows + one decode step, then per layout one padded chunk + one step.
        let rows = cal.prompt_rows as u64;
        assert!((4..32).contains(&cal.prompt_rows));
        assert_eq!(
            runs,
            rows + 1 + 2 * 2,
            "{layout:?}: graph runs of the calibration"
        );
        // The calibration leaves an empty state.
        assert_eq!(b.consumed(), 0);
        assert!(b.last_logits().is_none());
    }
}

#[test]
fn each_padded_layout_reproduces_the_stepped_goldens() {
    let s = sim();
    for (layout, logits_all) in [
        (PadLayout::First, false),
        (PadLayout::Last, false),
        (PadLayout::First, true),
        (PadLayout::Last, true),
    ] {
        let d = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        pads_package(d.path(), layout, |o| o.prefill_logits_all = logits_all);
        let opts = |tail| BpuOptions {
            no_vision: false,
            ..options(cache.path(), tail)
        };
        let mut padded = Engine::new(
            BpuBackend::open(d.path(), &opts(PrefillTail::Auto)).unwrap(),
            tokenizer(),
        );
        let mut stepped = Engine::new(
            BpuBackend::open(d.path(), &opts(PrefillTail::Stepped)).unwrap(),
            tokenizer(),
        );
        let want_mode = match layout {
            PadLayout::First => TailMode::PadsFirst,
            PadLayout::Last => TailMode::PadsLast,
        };
        assert_eq!(padded.backend().tail_decision().mode, want_mode);
        for name in ["text_short", "text_long", "image_one"] {
            let what = format!("{layout:?} (all-row logits {logits_all}) / {name}");
            let c = golden_case(MODEL, name);
            let want = golden_step_logits(MODEL, &c);
            let run = |e: &mut Engine<BpuBackend>| {
                e.backend_mut().reset().unwrap();
                let (prompt, images) = common::case_prompt(e, &c);
                let r0 = s.stats().runs;
                let g = generate_greedy(
                    e,
                    &prompt,
                    &images,
                    StreamConfig::new(Vec::new(), c.greedy.len()),
                );
                (g, s.stats().runs - r0)
            };
            let (p, p_runs) = run(&mut padded);
            let (st, st_runs) = run(&mut stepped);
            assert_eq!(p.completion.tokens, c.greedy, "{what}: tokens");
            assert_eq!(st.completion.tokens, c.greedy, "{what}: stepped tokens");
            assert_logits_close(&p.step_logits, &want, LOGIT_TOL, &what);
            // The tail ran as one padded chunk instead of `tail` decode steps.
            let tail = c.ids.len() % 32;
            assert_eq!(st_runs - p_runs, tail as u64 - 1, "{what}: graph runs");
        }
    }
}

#[test]
fn the_other_layout_gives_wrong_numbers() {
    let s = sim();
    let ids = golden_case(MODEL, "text_short").ids;
    for (layout, wrong) in [
        (PadLayout::First, PrefillTail::PadsLast),
        (PadLayout::Last, PrefillTail::PadsFirst),
    ] {
        let d = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        pads_package(d.path(), layout, |_| {});
        let (mut w, _) = open_counting(&s, d.path(), &options(cache.path(), wrong));
        let (mut st, _) = open_counting(&s, d.path(), &options(cache.path(), PrefillTail::Stepped));
        let a = text_then_greedy(&mut w, &ids, 2);
        let b = text_then_greedy(&mut st, &ids, 2);
        // Both the next-token logits and the step after (K/V window) are off.
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            let d = max_abs_diff(x, y);
            assert!(d > 0.05, "{layout:?} run as {wrong}: step {i}: max |Δ| {d}");
        }
    }
}

#[test]
fn the_decision_is_cached_until_a_package_file_changes() {
    let s = sim();
    let d = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    pads_package(d.path(), PadLayout::First, |_| {});
    let opts = options(cache.path(), PrefillTail::Auto);
    let (b, runs) = open_counting(&s, d.path(), &opts);
    assert!(runs > 0);
    let first = b.tail_decision().clone();
    drop(b);
    assert!(cache.path().join(vlm_bpu::tail_cache::CACHE_FILE).is_file());
    // The next start is free.
    let (b, runs) = open_counting(&s, d.path(), &opts);
    assert_eq!(runs, 0, "a cached decision runs no graph");
    let again = b.tail_decision();
    assert!(again.cached);
    assert_eq!(again.mode, TailMode::PadsFirst);
    assert_eq!(again.calibration, first.calibration);
    drop(b);
    // Another package file (same size, new mtime): calibrated again.
    let f = std::fs::File::options()
        .write(true)
        .open(d.path().join("model_prefill.hbm"))
        .unwrap();
    f.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(5))
        .unwrap();
    drop(f);
    let (b, runs) = open_counting(&s, d.path(), &opts);
    assert!(runs > 0);
    assert!(!b.tail_decision().cached);
    assert_eq!(b.tail_decision().mode, TailMode::PadsFirst);
}

#[test]
fn packages_that_need_no_or_allow_no_calibration_run_nothing_at_open() {
    let s = sim();
    let cache = tempfile::tempdir().unwrap();
    // No `prefill_pads`: stepped, whatever is asked.
    let plain = tempfile::tempdir().unwrap();
    sim_package(MODEL, plain.path(), |_| {});
    for tail in [PrefillTail::Auto, PrefillTail::PadsFirst] {
        let (b, runs) = open_counting(&s, plain.path(), &options(cache.path(), tail));
        assert_eq!(runs, 0);
        let t = b.tail_decision();
        assert_eq!(t.mode, TailMode::Stepped);
        assert!(t.reason.contains("prefill_pads"), "{}", t.reason);
    }
    // No weights (synthetic logits): `auto` says so and steps; an explicit layout is taken.
    let nw = tempfile::tempdir().unwrap();
    pads_package(nw.path(), PadLayout::First, |o| o.no_weights = true);
    let (b, runs) = open_counting(&s, nw.path(), &options(cache.path(), PrefillTail::Auto));
    assert_eq!(runs, 0);
    assert_eq!(b.tail_decision().mode, TailMode::Stepped);
    assert!(b.tail_decision().reason.contains("no weights"));
    let (b, _) = open_counting(
        &s,
        nw.path(),
        &options(cache.path(), PrefillTail::PadsFirst),
    );
    assert_eq!(b.tail_decision().mode, TailMode::PadsFirst);
    // Stepped on request, and a `prefill_min_tail` of a whole chunk steps every tail.
    let d = tempfile::tempdir().unwrap();
    pads_package(d.path(), PadLayout::Last, |_| {});
    let (b, runs) = open_counting(&s, d.path(), &options(cache.path(), PrefillTail::Stepped));
    assert_eq!((runs, b.tail_decision().mode), (0, TailMode::Stepped));
    let whole = tempfile::tempdir().unwrap();
    pads_package(whole.path(), PadLayout::Last, |o| {
        o.prefill_min_tail = Some(32)
    });
    let (b, runs) = open_counting(&s, whole.path(), &options(cache.path(), PrefillTail::Auto));
    assert_eq!((runs, b.tail_decision().mode), (0, TailMode::Stepped));
    assert!(
        std::fs::read_dir(cache.path()).unwrap().next().is_none(),
        "nothing calibrated, nothing cached"
    );
}

#[test]
fn without_the_prefill_graph_every_row_is_a_decode_run() {
    let s = sim();
    let cache = tempfile::tempdir().unwrap();
    let d = tempfile::tempdir().unwrap();
    pads_package(d.path(), PadLayout::First, |_| {});
    let opts = BpuOptions {
        no_prefill_graph: true,
        ..options(cache.path(), PrefillTail::Auto)
    };
    let packed0 = s.stats().live_packed;
    let (b, runs) = open_counting(&s, d.path(), &opts);
    assert_eq!(runs, 0);
    assert_eq!(b.info().prefill_chunk, 0);
    assert_eq!(b.tail_decision().mode, TailMode::Stepped);
    // model_prefill.hbm is not even loaded.
    assert_eq!(s.stats().live_packed - packed0, 1);
    let mut e = Engine::new(b, tokenizer());
    let c = golden_case(MODEL, "text_long");
    let (prompt, _) = common::case_prompt(&e, &c);
    let r0 = s.stats().runs;
    e.prefill(&prompt, &[], &mut || false).unwrap();
    assert_eq!(s.stats().runs - r0, c.ids.len() as u64);
    let g = common::decode_greedy(&mut e, StreamConfig::new(Vec::new(), c.greedy.len()));
    assert_eq!(g.completion.tokens, c.greedy);
    let want = golden_step_logits(MODEL, &c);
    assert_logits_close(&g.step_logits, &want, LOGIT_TOL, "no prefill graph");
}

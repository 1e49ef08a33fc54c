//! The padded prompt tail both ways (docs/package-contract.md §4.4, issue 14 item 2) over the simulator: sim
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
use vlm_bpu::{BpuBackend, BpuOptions, PadMarking, PadMask, PadRope, PrefillTail, TailMode};

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

/// A tiny-sym package whose prefill graph was built for marking `m`.
fn marked_package(dir: &Path, m: PadMarking) {
    pads_package(dir, sim_layout(m.layout), |o| {
        o.pad_rope = match m.rope {
            PadRope::Identity => bpu_sim::PadRope::Identity,
            PadRope::Zero => bpu_sim::PadRope::Zero,
        };
        o.pad_mask = match m.mask {
            PadMask::Masked => bpu_sim::PadMask::Masked,
            PadMask::SelfOnly => bpu_sim::PadMask::SelfOnly,
        };
    });
}

fn sim_layout(l: vlm_bpu::tail::PadLayout) -> PadLayout {
    match l {
        vlm_bpu::tail::PadLayout::First => PadLayout::First,
        vlm_bpu::tail::PadLayout::Last => PadLayout::Last,
    }
}

#[test]
fn calibration_picks_the_marking_the_graph_was_built_for() {
    let s = sim();
    for want in PadMarking::all() {
        let d = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        marked_package(d.path(), want);
        let (b, runs) = open_counting(&s, d.path(), &options(cache.path(), PrefillTail::Auto));
        let t = b.tail_decision();
        let cal = t.calibration.as_ref().unwrap();
        let figures: Vec<String> = cal.trials.iter().map(|x| x.summary()).collect();
        assert_eq!(
            t.marking(),
            Some(want),
            "{want}: {}\n{figures:#?}",
            t.reason
        );
        assert_eq!(t.min_tail, Some(4));
        assert!(!t.cached);
        // Every trial ran, in the published order; only the built one passes.
        let order: Vec<PadMarking> = cal.trials.iter().map(|x| x.marking).collect();
        assert_eq!(order, PadMarking::all());
        for trial in &cal.trials {
            if trial.marking == want {
                assert!(
                    trial.passes() && trial.score().unwrap() >= 0.9999,
                    "{want}: {figures:#?}"
                );
            } else {
                assert!(
                    !trial.passes(),
                    "{want}: {} passes too: {figures:#?}",
                    trial.marking
                );
            }
        }
        // One prefix row and t rows stepped + one decode step, then per marking one padded
        // chunk + one step.
        let rows = cal.prompt_rows as u64;
        assert_eq!(cal.prefix_rows, 1);
        assert!((4..32).contains(&cal.prompt_rows));
        assert_eq!(
            runs,
            1 + rows + 1 + 8 * 2,
            "{want}: graph runs of the calibration"
        );
        // The calibration leaves an empty state.
        assert_eq!(b.consumed(), 0);
        assert!(b.last_logits().is_none());
    }
}

#[test]
fn each_padded_marking_reproduces_the_stepped_goldens() {
    let s = sim();
    let mut variants: Vec<(PadMarking, bool)> =
        PadMarking::all().into_iter().map(|m| (m, false)).collect();
    for l in [
        vlm_bpu::tail::PadLayout::First,
        vlm_bpu::tail::PadLayout::Last,
    ] {
        variants.push((PadMarking::default_for(l), true));
    }
    for (m, logits_all) in variants {
        let d = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        if logits_all {
            // The default marking, all-row logits.
            pads_package(d.path(), sim_layout(m.layout), |o| {
                o.prefill_logits_all = true
            });
        } else {
            marked_package(d.path(), m);
        }
        let opts = |tail| BpuOptions {
            no_vision: false,
            ..options(cache.path(), tail)
        };
        let mut padded = Engine::new(
            BpuBackend::open(d.path(), &opts(PrefillTail::Auto)).unwrap(),
            tokenizer(),
        );
        // Every prompt row a decode run: the reference for the run count (and a graph built
        // for `identity` + `self` pads cannot tell the first row of an empty window from a
        // pad, so whole chunks from an empty window need the runtime's marking too).
        let mut stepped = Engine::new(
            BpuBackend::open(
                d.path(),
                &BpuOptions {
                    no_prefill_graph: true,
                    ..opts(PrefillTail::Stepped)
                },
            )
            .unwrap(),
            tokenizer(),
        );
        assert_eq!(padded.backend().tail_decision().marking(), Some(m));
        for name in ["text_short", "text_long", "image_one"] {
            let what = format!("{m} (all-row logits {logits_all}) / {name}");
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
            // Whole chunks, then the tail as one padded chunk; under a marking the first row
            // of an empty window could pass for, that row is stepped first.
            let first = usize::from(m.ambiguous_in_empty_window());
            let rest = c.ids.len() - first;
            let prompt_runs = first + rest / 32 + 1;
            assert!(rest % 32 >= 4, "{what}: the tail is padded");
            assert_eq!(
                st_runs - p_runs,
                (c.ids.len() - prompt_runs) as u64,
                "{what}: graph runs"
            );
        }
    }
}

#[test]
fn another_layout_or_marking_gives_wrong_numbers() {
    let s = sim();
    // A tail after a whole chunk: pads in front of an empty window would do no harm even
    // when the graph took them for real rows.
    let ids = golden_case(MODEL, "text_long").ids;
    let with = |layout, rope, mask| PadMarking { layout, rope, mask };
    use vlm_bpu::tail::PadLayout::{First, Last};
    for (built, wrong) in [
        (
            with(First, PadRope::Identity, PadMask::Masked),
            PrefillTail::PadsLast,
        ),
        (
            with(Last, PadRope::Identity, PadMask::Masked),
            PrefillTail::PadsFirst,
        ),
        // A forced layout marks pads the default way (cos 1 / sin 0, fully masked).
        (
            with(Last, PadRope::Zero, PadMask::Masked),
            PrefillTail::PadsLast,
        ),
        (
            with(First, PadRope::Identity, PadMask::SelfOnly),
            PrefillTail::PadsFirst,
        ),
        (
            with(Last, PadRope::Zero, PadMask::SelfOnly),
            PrefillTail::PadsLast,
        ),
    ] {
        let d = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        marked_package(d.path(), built);
        let (mut w, _) = open_counting(&s, d.path(), &options(cache.path(), wrong));
        let (mut st, _) = open_counting(&s, d.path(), &options(cache.path(), PrefillTail::Stepped));
        let a = text_then_greedy(&mut w, &ids, 2);
        let b = text_then_greedy(&mut st, &ids, 2);
        // Both the next-token logits and the step after (K/V window, GDN state) are off.
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            let d = max_abs_diff(x, y);
            assert!(d > 0.05, "{built} run as {wrong}: step {i}: max |Δ| {d}");
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
fn entries_of_an_older_tail_cache_are_ignored_not_misread() {
    let s = sim();
    let d = tempfile::tempdir().unwrap();
    let other = tempfile::tempdir().unwrap();
    let cache = tempfile::tempdir().unwrap();
    let built = PadMarking {
        layout: vlm_bpu::tail::PadLayout::Last,
        rope: PadRope::Zero,
        mask: PadMask::SelfOnly,
    };
    marked_package(d.path(), built);
    let opts = options(cache.path(), PrefillTail::Auto);
    drop(open_counting(&s, d.path(), &opts));
    // Rewrite this package's entry as the previous protocol wrote it (two layouts, no
    // marking: read today it would say pads first with the default marking), and add an
    // entry of some other package that does not parse at all.
    let file = cache.path().join(vlm_bpu::tail_cache::CACHE_FILE);
    let mut j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    let entries = j["entries"].as_object_mut().unwrap();
    let (_, entry) = entries.iter_mut().next().unwrap();
    let runtime = entry["key"]["runtime"].as_str().unwrap().to_owned();
    assert!(runtime.contains("tail protocol 2"), "{runtime}");
    entry["key"]["runtime"] = runtime.replace("tail protocol 2", "tail protocol 1").into();
    entry["decision"] = serde_json::json!({
        "mode": "pads_first", "requested": "auto", "min_tail": 4, "chunk": 32,
        "reason": "calibrated", "cached": false,
        "calibration": {"prompt_rows": 8, "top1": 1, "margin": 1.0, "threshold": 0.99,
            "seconds": 0.1, "trials": [{"mode": "pads_first", "cos_next": 1.0,
            "cos_step": 1.0, "top1_next": 1, "top1_step": 1, "error": null}]}
    });
    let junk = serde_json::json!({"key": "from a future version", "decision": 7});
    let other_key = std::fs::canonicalize(other.path()).unwrap();
    entries.insert(other_key.display().to_string(), junk.clone());
    std::fs::write(&file, serde_json::to_string(&j).unwrap()).unwrap();
    // Calibrated again (not the old answer), and the other entry is kept as it was.
    let (b, runs) = open_counting(&s, d.path(), &opts);
    assert!(runs > 0, "the old entry was not reused");
    assert!(!b.tail_decision().cached);
    assert_eq!(b.tail_decision().marking(), Some(built));
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(j["entries"][other_key.display().to_string()], junk);
    drop(b);
    let (b, runs) = open_counting(&s, d.path(), &opts);
    assert_eq!(runs, 0);
    assert!(b.tail_decision().cached);
    assert_eq!(b.tail_decision().marking(), Some(built));
    assert_eq!(
        b.tail_decision().calibration.as_ref().unwrap().trials.len(),
        8
    );
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

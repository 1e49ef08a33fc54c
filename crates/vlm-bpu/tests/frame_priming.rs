//! Frame priming and the system-prefix LRU on a sim package of the tiny-4b fixture
//! (vision on): a greedy answer from a primed image equals the cold answer on the same
//! image, prompt_tokens included, also when the priming was stopped at a graph-call boundary
//! and continued, directly or from its parked state after another turn, and when the head's
//! short last chunk waits for the question (padded tails); a turn with another system block
//! does not fit it; each of two alternating system prompts is prefilled once; a priming's tasks go at the priority it is given, the
//! ask's at theirs. Graph runs and submits per priority are counted by the simulator.
#![allow(clippy::unwrap_used)]

use vlm::assistant::{Assistant, PrimedFrame, PrimingOutcome, Turn};
use vlm::chat::SystemOptions;
use vlm::engine::ImageInput;
use vlm::stream::Completion;
use vlm::vision::RgbImage;
use vlm_bpu::{open_assistant, BpuOptions, ModelSource, OpenOptions, PrefillTail};

const MAX_NEW: usize = 8;

fn open() -> (tempfile::TempDir, Assistant) {
    let dir = tempfile::tempdir().unwrap();
    let pkg = dir.path().join("pkg");
    vlm_testkit::sim_package("tiny-4b", &pkg, |o| o.cache_len = 512);
    let a = open_assistant(&ModelSource::Package(pkg), &OpenOptions::default()).unwrap();
    (dir, a)
}

/// The tiny-4b package with padded tails (4..N rows, the sim's pads-last layout).
fn open_padded() -> (tempfile::TempDir, Assistant) {
    let dir = tempfile::tempdir().unwrap();
    let pkg = dir.path().join("pkg");
    vlm_testkit::sim_package("tiny-4b", &pkg, |o| {
        o.cache_len = 512;
        o.prefill_pads = true;
        o.prefill_min_tail = Some(4);
    });
    let opts = OpenOptions {
        bpu: BpuOptions {
            prefill_tail: PrefillTail::PadsLast,
            cache_dir: Some(dir.path().join("cache")),
            ..BpuOptions::default()
        },
        ..OpenOptions::default()
    };
    let a = open_assistant(&ModelSource::Package(pkg), &opts).unwrap();
    (dir, a)
}

/// The tiny-4b package opened with a third cache set (`keep_set`), or without.
fn open_keeping(keep_set: bool) -> (tempfile::TempDir, Assistant) {
    let dir = tempfile::tempdir().unwrap();
    let pkg = dir.path().join("pkg");
    vlm_testkit::sim_package("tiny-4b", &pkg, |o| o.cache_len = 512);
    let opts = OpenOptions {
        bpu: BpuOptions {
            keep_set,
            ..BpuOptions::default()
        },
        ..OpenOptions::default()
    };
    let a = open_assistant(&ModelSource::Package(pkg), &opts).unwrap();
    (dir, a)
}

fn runs() -> u64 {
    bpu_sim::Sim::current().stats().runs
}

fn image(seed: u8) -> ImageInput {
    let data = (0..64 * 48 * 3)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect();
    ImageInput::Rgb(RgbImage::new(64, 48, data).unwrap())
}

fn turn(text: &str, system: Option<&str>) -> Turn {
    Turn {
        system: system.map(str::to_owned),
        ..Turn::new(text, MAX_NEW)
    }
}

fn opts(system: Option<&str>) -> SystemOptions {
    SystemOptions {
        system: system.map(str::to_owned),
        tools: Vec::new(),
    }
}

fn cold(a: &mut Assistant, img: &ImageInput, t: &Turn) -> Completion {
    let t = Turn {
        images: vec![img.clone()],
        ..t.clone()
    };
    a.ask(None, &t, &mut |_| {}).unwrap().completion
}

fn done(o: PrimingOutcome) -> PrimedFrame {
    match o {
        PrimingOutcome::Done(p) => p,
        PrimingOutcome::Stopped => panic!("the priming stopped"),
    }
}

#[test]
fn an_answer_from_a_prefilled_image_equals_the_cold_answer() {
    let (_d, mut a) = open();
    let img = image(7);
    let q = turn("What do you see?", None);
    let want = cold(&mut a, &img, &q);

    let p = done(a.prime_frame(&opts(None), &img, &mut || false).unwrap());
    let before = runs();
    let got = a.ask_primed(&p, &q, &mut |_| {}).unwrap().completion;
    assert_eq!(got.tokens, want.tokens);
    assert_eq!(got.text, want.text);
    assert_eq!(got.timings.prompt_tokens, want.timings.prompt_tokens);
    // Only the question, the header and the decode steps ran: no tower, no image rows.
    let question_rows = want.timings.prompt_tokens - p.rows();
    assert!(
        runs() - before <= (question_rows + got.tokens.len()) as u64,
        "{} graph runs for {question_rows} question rows and {} tokens",
        runs() - before,
        got.tokens.len()
    );
    // The priming serves again (a snapshot is restored, not consumed).
    let again = a.ask_primed(&p, &q, &mut |_| {}).unwrap().completion;
    assert_eq!(again.tokens, want.tokens);
}

#[test]
fn a_prefill_kept_on_the_device_serves_asks_after_other_turns_without_a_copy() {
    for keep_set in [true, false] {
        let (_d, mut a) = open_keeping(keep_set);
        let (img, other) = (image(3), image(9));
        let q = turn("What do you see?", None);
        let want = cold(&mut a, &img, &q);
        let p = done(a.prime_frame(&opts(None), &img, &mut || false).unwrap());
        let mut copies = Vec::new();
        for _ in 0..2 {
            // Another turn in between: the backend's state is not the priming's anymore.
            cold(&mut a, &other, &turn("And this one?", None));
            let before = a.restores();
            let got = a.ask_primed(&p, &q, &mut |_| {}).unwrap().completion;
            copies.push(a.restores() - before);
            assert_eq!(got.tokens, want.tokens, "keep_set {keep_set}");
            assert_eq!(got.timings.prompt_tokens, want.timings.prompt_tokens);
        }
        // Kept: a switch of cache sets each time; else the primed state is copied back.
        let expect = if keep_set { vec![0, 0] } else { vec![1, 1] };
        assert_eq!(copies, expect, "keep_set {keep_set}");
        // A newer priming replaces a kept one, which then fits no ask; a snapshot stays good.
        let newer = done(a.prime_frame(&opts(None), &other, &mut || false).unwrap());
        assert!(a.primed_frame_fits(&newer, &q));
        assert_eq!(
            a.primed_frame_fits(&p, &q),
            !keep_set,
            "keep_set {keep_set}"
        );
    }
}

#[test]
fn with_padded_tails_the_short_rest_of_the_image_goes_with_the_question() {
    let (_d, mut a) = open_padded();
    let img = image(5);
    let q = turn("What do you see?", None);
    let want = cold(&mut a, &img, &q);
    let before = runs();
    let p = done(a.prime_frame(&opts(None), &img, &mut || false).unwrap());
    let prefill_runs = runs() - before;
    let before = runs();
    let got = a.ask_primed(&p, &q, &mut |_| {}).unwrap().completion;
    let ask_runs = runs() - before;
    assert_eq!(got.tokens, want.tokens);
    assert_eq!(got.text, want.text);
    assert_eq!(got.timings.prompt_tokens, want.timings.prompt_tokens);
    // 17 system rows, then a 105-row head (user header, image, vision end) in 32-row chunks:
    // the tower and 3 whole chunks; the last 9 rows go in front of the question, whose chunk
    // is padded anyway (one run), then a decode step per token after the first.
    assert_eq!(p.rows(), 17 + 105);
    assert_eq!(
        prefill_runs,
        1 + 3,
        "no padded chunk for the head's last 9 rows"
    );
    assert_eq!(ask_runs, 1 + got.tokens.len() as u64 - 1);
    let again = a.ask_primed(&p, &q, &mut |_| {}).unwrap().completion;
    assert_eq!(
        again.tokens, want.tokens,
        "the lead is kept with the snapshot"
    );
}

#[test]
fn a_prefill_stopped_at_each_graph_call_continues_to_the_same_answer() {
    // Parked as a snapshot, and parked on the device (a third set; moved out by the turn).
    for keep_set in [false, true] {
        stopped_prefills_continue(keep_set);
    }
}

fn stopped_prefills_continue(keep_set: bool) {
    let (_d, mut a) = open_keeping(keep_set);
    let img = image(3);
    let q = turn("Describe it.", Some("You are a robot."));
    let want = cold(&mut a, &img, &q);
    // Every graph call of a priming: the system block is cached by the cold ask, so the
    // tower and the image block's rows.
    let before = runs();
    done(
        a.prime_frame(&opts(q.system.as_deref()), &img, &mut || false)
            .unwrap(),
    );
    let total = runs() - before;
    assert!(total >= 2, "{total} graph calls");
    for k in 0..total {
        let mut calls = 0;
        let before = runs();
        let mut stop_after_k = || {
            calls += 1;
            calls > k
        };
        let o = a
            .prime_frame(&opts(q.system.as_deref()), &img, &mut stop_after_k)
            .unwrap();
        assert!(
            matches!(o, PrimingOutcome::Stopped),
            "stopped after call {k}"
        );
        assert_eq!(runs() - before, k, "call {k} is the last to run");
        if k == 0 {
            // Stopped before the tower: nothing worth continuing.
            assert!(!a.can_resume_priming(&opts(q.system.as_deref())));
            continue;
        }
        assert!(a.can_resume_priming(&opts(q.system.as_deref())));
        assert!(!a.can_resume_priming(&opts(Some("another"))));
        if k % 2 == 0 {
            // Parked, then another turn uses the backend: the priming goes on from the snapshot.
            a.stash_priming().unwrap();
            let text = a
                .ask(None, &turn("hi", None), &mut |_| {})
                .unwrap()
                .completion;
            assert!(a.can_resume_priming(&opts(q.system.as_deref())));
            let before_resume = runs();
            let p = done(a.resume_priming(&mut || false).unwrap());
            let ask_runs = text.timings.prompt_tokens as u64 + text.tokens.len() as u64;
            assert!(
                runs() - before_resume < total,
                "{ask_runs} runs for the ask"
            );
            let got = a.ask_primed(&p, &q, &mut |_| {}).unwrap().completion;
            assert_eq!(got.tokens, want.tokens, "parked after call {k}");
            continue;
        }
        let p = done(a.resume_priming(&mut || false).unwrap());
        assert_eq!(runs() - before, total, "nothing runs twice");
        let got = a.ask_primed(&p, &q, &mut |_| {}).unwrap().completion;
        assert_eq!(got.tokens, want.tokens, "stopped after call {k}");
        assert!(!a.can_resume_priming(&opts(q.system.as_deref())));
    }
    // Stopped after the tower, then a new priming stopped before its tower: the first one's
    // state is not offered for the second's image.
    let mut calls = 0;
    let o = a.prime_frame(&opts(q.system.as_deref()), &img, &mut || {
        calls += 1;
        calls > 1
    });
    assert!(matches!(o.unwrap(), PrimingOutcome::Stopped));
    assert!(a.can_resume_priming(&opts(q.system.as_deref())));
    a.stash_priming().unwrap();
    let o = a.prime_frame(&opts(q.system.as_deref()), &image(4), &mut || true);
    assert!(matches!(o.unwrap(), PrimingOutcome::Stopped));
    assert!(!a.can_resume_priming(&opts(q.system.as_deref())));
}

#[test]
fn another_system_block_does_not_fit_and_alternating_blocks_are_prefilled_once() {
    let (_d, mut a) = open();
    let img = image(1);
    let p = done(
        a.prime_frame(&opts(Some("A")), &img, &mut || false)
            .unwrap(),
    );
    assert!(a.primed_frame_fits(&p, &turn("hi", Some("A"))));
    assert!(!a.primed_frame_fits(&p, &turn("hi", Some("B"))));
    let mut tools = turn("hi", Some("A"));
    tools.tools = vec![serde_json::json!({"type": "function", "function": {"name": "f"}})];
    assert!(!a.primed_frame_fits(&p, &tools));
    assert!(a
        .ask_primed(&p, &turn("hi", Some("B")), &mut |_| {})
        .is_err());

    let snapshots = a.snapshots();
    for _ in 0..3 {
        for s in ["A", "B", "C"] {
            a.ask(None, &turn("hi", Some(s)), &mut |_| {}).unwrap();
        }
    }
    // A was cached by the priming; B and C once each.
    assert_eq!(a.snapshots() - snapshots, 2);
    let (bytes, entries) = a.prefix_cache_usage();
    assert_eq!(entries, 3);
    a.set_prefix_budget(bytes / 3);
    assert_eq!(
        a.prefix_cache_usage().1,
        1,
        "the budget keeps the newest only"
    );
}

#[test]
fn a_prefill_submits_at_the_priority_it_is_given() {
    let (_d, mut a) = open();
    let img = image(5);
    let q = turn("What do you see?", None);
    let sim = bpu_sim::Sim::current();
    a.set_priority(7);
    cold(&mut a, &img, &q);
    a.set_priority(6);
    let before = sim.submits_by_priority();
    let p = done(a.prime_frame(&opts(None), &img, &mut || false).unwrap());
    a.set_priority(7);
    let after = sim.submits_by_priority();
    let at = |m: &std::collections::BTreeMap<u8, u64>, k| m.get(&k).copied().unwrap_or(0);
    assert!(at(&after, 6) > at(&before, 6), "{after:?}");
    assert_eq!(
        at(&after, 7),
        at(&before, 7),
        "nothing at the asks' priority"
    );
    let before = sim.submits_by_priority();
    a.ask_primed(&p, &q, &mut |_| {}).unwrap();
    let after = sim.submits_by_priority();
    assert_eq!(
        at(&after, 6),
        at(&before, 6),
        "the ask runs at its own priority"
    );
    assert!(at(&after, 7) > at(&before, 7));
}

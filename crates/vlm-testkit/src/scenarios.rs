//! The scenarios every backend must pass, written once: each is a function over a
//! [`BackendFactory`], and [`backend_suite!`](crate::backend_suite) expands to one `#[test]`
//! per scenario for the factory a test file supplies (the CPU in `vlm`'s tests, the BPU over
//! the simulator in `vlm-bpu`'s, the board in a later board file). A new scenario goes here
//! and into the macro's list, and then runs on every backend.
//!
//! The fixture engines use the fixture tokenizer; every backend is built with the fixture
//! model's HF weights (a sim package of them on the BPU), so the HF goldens hold on each.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vlm::chat::{Pos3, Prompt, Segment};
use vlm::engine::{prompt_from_ids, Backend, DecodeOptions, EngineError, StateBlob};
use vlm::stream::{Event, FinishReason, StreamConfig};

use crate::{
    argmax, assert_logits_close, assert_matches_reference, case_prompt, continue_greedy,
    decode_greedy, feed_text, fixtures, generate_greedy, golden_case, golden_cases,
    golden_step_logits, greedy, greedy_case, image_input, max_abs_diff, try_generate_text,
    BackendFactory, BackendSpec, CpuFactory, Mask, GOLDEN_STEPS, MODELS,
};

/// Merged grid side of the 320 px bucket (patch 16, merge 2).
const SIDE: u32 = 10;

/// Expands to one `#[test]` per scenario of [`scenarios`](crate::scenarios), each building
/// its own factory from `$factory` (an expression, evaluated on the test's thread).
/// Attributes before the factory go on every test (`#[ignore = "needs the board"]`).
///
/// ```ignore
/// vlm_testkit::backend_suite!(vlm_testkit::CpuFactory::default());
/// ```
#[macro_export]
macro_rules! backend_suite {
    ($(#[$attr:meta])* $factory:expr) => {
        $crate::backend_suite!(@each [$(#[$attr])*] $factory;
            greedy_tokens_and_step_logits_match_goldens_for_every_schedule,
            images_change_the_answer_and_positions_advance_by_the_grid_side,
            snapshot_restore_continue_equals_an_uninterrupted_run,
            a_parked_state_restored_after_other_work_continues_unchanged,
            context_overflow_is_a_typed_error_and_the_window_end_is_length,
            context_overflow_is_refused_by_chunked_steps_and_by_run_rows,
            cancel_and_deadline_stop_generation,
            golden_cases_match_the_cpu_reference,
            prefill_and_stepping_agree_over_a_teacher_forced_continuation,
        );
    };
    (@each [$($attrs:tt)*] $factory:expr; $scenario:ident $(, $rest:ident)* $(,)?) => {
        #[test]
        $($attrs)*
        fn $scenario() {
            $crate::scenarios::$scenario(&$factory);
        }
        $crate::backend_suite!(@each [$($attrs)*] $factory; $($rest),*);
    };
    (@each [$($attrs:tt)*] $factory:expr;) => {};
}

/// Greedy tokens and step logits of every golden case of every fixture model match the HF
/// goldens at chunk 32 (one mask plane), chunk 16 (a plane per head) and stepping only, and
/// the schedules agree with each other.
pub fn greedy_tokens_and_step_logits_match_goldens_for_every_schedule<F: BackendFactory>(f: &F) {
    let tol = f.logit_tol();
    for model in MODELS {
        for case in golden_cases(model) {
            let cname = &case.name;
            let want_tokens = &case.greedy;
            let want_logits = golden_step_logits(model, &case);
            let mut per_schedule = Vec::new();
            for (chunk, mask) in [(32, Mask::One), (16, Mask::PerHead), (0, Mask::One)] {
                let mut e = f.engine(BackendSpec::new(model, 512, chunk).mask(mask));
                let (prompt, images) = case_prompt(&e, &case);
                let cfg = StreamConfig::new(vec![], want_tokens.len());
                let g = generate_greedy(&mut e, &prompt, &images, cfg);
                let c = &g.completion;
                let what = format!("{model}/{cname}/N={chunk}");
                assert_eq!(c.finish_reason, FinishReason::Length, "{what}");
                assert_eq!(&c.tokens, want_tokens, "{what}: greedy tokens");
                assert_eq!(c.timings.prompt_tokens, prompt.rows());
                assert_logits_close(&g.step_logits, &want_logits, tol, &what);
                // every fed row occupies one slot: prompt rows + all generated tokens but the last
                assert_eq!(
                    e.backend().consumed(),
                    prompt.rows() + want_tokens.len() - 1
                );
                per_schedule.push(g.step_logits);
            }
            for other in &per_schedule[1..] {
                let what = format!("{model}/{cname}: chunked vs stepped");
                assert_logits_close(other, &per_schedule[0], tol, &what);
            }
        }
    }
}

/// An image changes the answer (vs no image, vs another image); the text after a 10×10 image
/// resumes at the grid side, not the row count; a slot without its image is refused.
pub fn images_change_the_answer_and_positions_advance_by_the_grid_side<F: BackendFactory>(f: &F) {
    let spec = BackendSpec::new("tiny-4b", 512, 32).mask(Mask::One);
    let case = golden_case("tiny-4b", "image_one");
    let mut e = f.engine(spec);
    let (prompt, images) = case_prompt(&e, &case);
    let with = generate_greedy(&mut e, &prompt, &images, StreamConfig::new(vec![], 16));
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
    let without = generate_greedy(
        &mut f.engine(spec),
        &text_only,
        &[],
        StreamConfig::new(vec![], 16),
    );
    assert_ne!(with.completion.tokens, without.completion.tokens);
    let other = generate_greedy(
        &mut f.engine(spec),
        &prompt,
        &[image_input(&fixtures().join("images/scene_b.png"))],
        StreamConfig::new(vec![], 16),
    );
    assert_ne!(with.completion.tokens, other.completion.tokens);

    // maxPos bookkeeping: 119 rows, one 10x10 image → next text position = 119 - 100 + 10
    let mut e = f.engine(spec);
    assert!(e.prefill(&prompt, &images, &mut || false).unwrap());
    assert_eq!(e.backend().consumed(), 119);
    assert_eq!(e.backend().next_position(), 119 - 100 + 10);
    // a slot that does not match the images given is refused before anything runs
    let err = f
        .engine(spec)
        .prefill(&prompt, &[], &mut || false)
        .unwrap_err();
    assert!(matches!(err, EngineError::Image { .. }), "{err}");
    let pad = e.tokenizer().token_to_id("<|image_pad|>").unwrap();
    assert!(prompt_from_ids(&[609, 612, 612, 610], pad, SIDE).is_err());
}

/// A snapshot after the prefill, restored into a fresh backend with another schedule, decodes
/// bit-identically (its size is the backend's own cache layout: see the CPU's tests); a mid-conversation snapshot continues in
/// lockstep; blobs of another window, damaged or with a wrong magic are refused; reset
/// empties the state.
pub fn snapshot_restore_continue_equals_an_uninterrupted_run<F: BackendFactory>(f: &F) {
    let case = golden_case("tiny-4b", "image_one");
    let spec = |context, chunk| BackendSpec::new("tiny-4b", context, chunk).mask(Mask::One);
    let mut a = f.engine(spec(256, 32));
    let (prompt, images) = case_prompt(&a, &case);
    assert!(a.prefill(&prompt, &images, &mut || false).unwrap());
    let blob = a.backend_mut().snapshot().unwrap();
    let p = prompt.rows();
    assert_eq!(blob.consumed(), Some(p));

    let first = decode_greedy(&mut a, StreamConfig::new(vec![], 16));
    assert_eq!(first.completion.tokens, case.greedy);

    // restore into a fresh backend with another schedule (stored bytes round trip)
    let mut b = f.engine(spec(256, 16));
    b.backend_mut()
        .restore(&StateBlob::from_bytes(blob.clone().into_bytes()))
        .unwrap();
    assert_eq!(b.backend().consumed(), p);
    assert_eq!(
        b.backend().next_position(),
        a.backend().next_position() - 15
    );
    let second = decode_greedy(&mut b, StreamConfig::new(vec![], 16));
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
            let pos = Pos3::text(e.backend().next_position());
            e.backend_mut().step(&row, &[pos]).unwrap();
        }
        assert_eq!(a.backend().last_logits(), b.backend().last_logits());
    }

    // a blob from another window size, a damaged one and one with a wrong magic are refused
    let mut c = f.engine(spec(128, 32));
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

/// A state parked after a prompt, then restored over other work (shorter or longer),
/// continues exactly as the uninterrupted run; a blob from another window size is refused.
pub fn a_parked_state_restored_after_other_work_continues_unchanged<F: BackendFactory>(f: &F) {
    let mut b = f.open(BackendSpec::new("tiny-sym", 64, 32));
    let k = golden_case("tiny-sym", "text_32");
    feed_text(&mut b, &k.ids);
    let blob = b.snapshot().unwrap();
    assert_eq!(blob.consumed(), Some(k.ids.len()));
    let straight = continue_greedy(&mut b, 8);
    // Something else in between, then back to the parked state.
    b.reset().unwrap();
    feed_text(&mut b, &k.ids[..3]);
    b.restore(&blob).unwrap();
    assert_eq!(b.consumed(), k.ids.len());
    assert_eq!(b.max_pos(), Some(k.ids.len() as u32 - 1));
    let resumed = continue_greedy(&mut b, 8);
    assert_eq!(straight, resumed);
    // A short state restored over a longer one (the backend may write only what either
    // occupies): nothing of the longer one shows, now or as the window fills on.
    let short = {
        b.reset().unwrap();
        feed_text(&mut b, &k.ids[..5]);
        b.snapshot().unwrap()
    };
    let short_straight = continue_greedy(&mut b, 12);
    let short_after = b.snapshot().unwrap();
    b.restore(&blob).unwrap();
    continue_greedy(&mut b, 4);
    b.restore(&short).unwrap();
    assert_eq!(continue_greedy(&mut b, 12), short_straight);
    assert_eq!(b.snapshot().unwrap(), short_after);
    // A blob from another window size is refused.
    let mut other = f.open(BackendSpec::new("tiny-sym", 48, 32));
    assert!(matches!(
        other.restore(&blob),
        Err(EngineError::State { .. })
    ));
}

/// A prompt longer than the window is refused whole with the typed error (nothing fed); a
/// reply that reaches the window end finishes with `length`, and one more row is refused.
pub fn context_overflow_is_a_typed_error_and_the_window_end_is_length<F: BackendFactory>(f: &F) {
    let case = golden_case("tiny-4b", "text_32");
    let mut e = f.engine(BackendSpec::new("tiny-4b", 16, 0).mask(Mask::One));
    let (prompt, _) = case_prompt(&e, &case);
    let err = try_generate_text(&mut e, &prompt, StreamConfig::new(vec![], 16)).unwrap_err();
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
    let mut e = f.engine(BackendSpec::new("tiny-4b", 40, 32).mask(Mask::One));
    let g = generate_greedy(&mut e, &prompt, &[], StreamConfig::new(vec![], 16));
    assert_eq!(g.completion.finish_reason, FinishReason::Length);
    assert_eq!(g.completion.tokens, case.greedy[..9].to_vec());
    assert_eq!(e.backend().context_left(), 0);
    let hidden = e.backend().info().hidden;
    let err = e
        .backend_mut()
        .step(&vec![0.0; hidden], &[Pos3::text(99)])
        .unwrap_err();
    assert!(
        matches!(err, EngineError::ContextOverflow { needed: 1, left: 0 }),
        "{err}"
    );
}

/// Rows past the window are refused by a chunked step before anything runs, and by a graph
/// run on a full window.
pub fn context_overflow_is_refused_by_chunked_steps_and_by_run_rows<F: BackendFactory>(f: &F) {
    let mut b = f.open(BackendSpec::new("tiny-sym", 16, 4));
    assert_eq!(b.info().context, 16);
    let h = b.info().hidden;
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
    b.step(&rows[..16 * h], &pos[..16]).unwrap();
    assert!(matches!(
        b.run_rows(&rows[16 * h..], &pos[16..]),
        Err(EngineError::ContextOverflow { needed: 1, left: 0 })
    ));
}

/// Cancel from the event callback, cancel before the prefill, a past deadline and a stop
/// token each end the reply with their reason, and the engine stays usable.
pub fn cancel_and_deadline_stop_generation<F: BackendFactory>(f: &F) {
    let spec = BackendSpec::new("tiny-4b", 64, 0).mask(Mask::One);
    let case = golden_case("tiny-4b", "text_short");
    let want = &case.greedy;

    // cancelled from the event callback after the first delta
    let flag = Arc::new(AtomicBool::new(false));
    let mut cfg = StreamConfig::new(vec![], 16);
    cfg.cancel = Some(flag.clone());
    let mut text = String::new();
    let mut e = f.engine(spec);
    let (prompt, _) = case_prompt(&e, &case);
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
    assert_eq!(c.tokens, want[..c.tokens.len()].to_vec());
    assert_eq!(text, c.text);
    // the engine stays usable
    e.backend_mut().reset().unwrap();
    let g = generate_greedy(&mut e, &prompt, &[], StreamConfig::new(vec![], 4));
    assert_eq!(g.completion.tokens, want[..4].to_vec());

    // cancelled before the prefill: nothing runs
    let mut cfg = StreamConfig::new(vec![], 16);
    cfg.cancel = Some(Arc::new(AtomicBool::new(true)));
    let mut e = f.engine(spec);
    let g = try_generate_text(&mut e, &prompt, cfg).unwrap();
    assert_eq!(g.completion.finish_reason, FinishReason::Cancelled);
    assert!(g.completion.tokens.is_empty());
    assert_eq!(e.backend().consumed(), 0);

    // a deadline in the past
    let mut cfg = StreamConfig::new(vec![], 16);
    cfg.deadline = Some(Instant::now() - Duration::from_millis(1));
    let g = try_generate_text(&mut f.engine(spec), &prompt, cfg).unwrap();
    assert_eq!(g.completion.finish_reason, FinishReason::Timeout);

    // eos is never fed back: stop on the golden's 3rd token
    let mut e = f.engine(spec);
    let g = generate_greedy(&mut e, &prompt, &[], StreamConfig::new(vec![want[2]], 16));
    assert_eq!(g.completion.finish_reason, FinishReason::Stop);
    assert_eq!(g.completion.tokens, want[..2].to_vec());
    assert_eq!(e.backend().consumed(), prompt.rows() + 2);
}

/// Teacher-forced golden cases (shorter than, equal to and longer than one chunk; one
/// image) give the CPU reference's logits at the prompt and every step, and the goldens'
/// tokens.
pub fn golden_cases_match_the_cpu_reference<F: BackendFactory>(f: &F) {
    let mut b = f.engine(BackendSpec::new("tiny-sym", 512, 32));
    assert_eq!(b.backend().info().prefill_chunk, 32);
    let mut c = CpuFactory::reference("tiny-sym");
    for name in ["text_short", "text_32", "text_long", "image_one"] {
        let k = golden_case("tiny-sym", name);
        let got = greedy_case(&mut b, &k, GOLDEN_STEPS);
        let want = greedy_case(&mut c, &k, GOLDEN_STEPS);
        assert_matches_reference(&got, &want, f.logit_tol(), &k);
    }
}

/// The same prompt and 48-token continuation fed through "with a prefill graph" and
/// "stepping only" give the same logits at every step.
pub fn prefill_and_stepping_agree_over_a_teacher_forced_continuation<F: BackendFactory>(f: &F) {
    let tol = f.logit_tol();
    let mut p = f.open(BackendSpec::new("tiny-sym", 512, 32));
    let mut s = f.open(BackendSpec::new("tiny-sym", 512, 0));
    assert_eq!((p.info().prefill_chunk, s.info().prefill_chunk), (32, 0));
    let k = golden_case("tiny-sym", "text_long");
    let cont: Vec<u32> = (0..48).map(|i| (i * 37 + 11) % 600).collect();
    let mut rows = Vec::new();
    p.embed(&k.ids, &mut rows).unwrap();
    let pos: Vec<Pos3> = (0..k.ids.len() as u32).map(Pos3::text).collect();
    let a = p.step(&rows, &pos).unwrap().to_vec();
    let b = s.step(&rows, &pos).unwrap().to_vec();
    assert!(max_abs_diff(&a, &b) <= tol, "prompt logits");
    assert_eq!(argmax(&a), argmax(&b), "first token");
    for (i, &t) in cont.iter().enumerate() {
        let mut x = Vec::new();
        p.embed(&[t], &mut x).unwrap();
        let at = [Pos3::text(p.next_position())];
        let a = p.step(&x, &at).unwrap().to_vec();
        let b = s.step(&x, &at).unwrap().to_vec();
        let d = max_abs_diff(&a, &b);
        assert!(d <= tol, "continuation step {i}: {d}");
    }
    assert_eq!(p.consumed(), s.consumed());
}

#[cfg(test)]
mod tests {
    /// Every scenario is in `backend_suite!`'s list, so every backend runs it.
    #[test]
    fn the_suite_lists_every_scenario() {
        let src = include_str!("scenarios.rs");
        let (head, body) = src.split_once("macro_rules! backend_suite").unwrap();
        assert!(!head.contains("pub fn "));
        let list = body.split_once("$factory;").unwrap().1;
        let list = list.split_once(");").unwrap().0;
        let mut n = 0;
        for line in body.lines() {
            if let Some(rest) = line.strip_prefix("pub fn ") {
                let name = rest.split('<').next().unwrap();
                assert!(
                    list.contains(&format!("{name},")),
                    "{name} is not in the suite"
                );
                n += 1;
            }
        }
        assert_eq!(
            list.matches(',').count(),
            n,
            "the suite lists a scenario twice"
        );
    }
}

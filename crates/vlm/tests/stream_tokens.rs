//! The streaming state machine fed token by token with the fixture tokenizer.
#![allow(clippy::unwrap_used)]

use vlm_testkit as common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use vlm::stream::{Action, Completion, Event, FinishReason, StreamConfig, TokenStream};

struct Run {
    events: Vec<Event>,
    actions: Vec<Action>,
    done: Completion,
}

impl Run {
    fn text(&self, reasoning: bool) -> String {
        self.events
            .iter()
            .filter_map(|e| match e {
                Event::Text { text, reasoning: r } if *r == reasoning => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }

    fn deltas(&self) -> Vec<&str> {
        self.events
            .iter()
            .filter_map(|e| match e {
                Event::Text { text, .. } => Some(text.as_str()),
                Event::ToolCall(_) => None,
            })
            .collect()
    }
}

/// Feeds `ids` until the stream says stop; then finishes with that reason (or `Stop` as if an
/// eos had followed the last id).
/// `<|im_end|>` of the fixture tokenizer.
fn eos() -> u32 {
    common::tokenizer().token_to_id("<|im_end|>").unwrap()
}

fn run(cfg: StreamConfig, ids: &[u32]) -> Run {
    let mut s = TokenStream::new(common::tokenizer(), cfg);
    let mut events = Vec::new();
    let mut actions = Vec::new();
    let mut reason = None;
    for &id in ids {
        let a = s.push(id, &mut |e| events.push(e)).unwrap();
        actions.push(a);
        if let Action::Finish(r) = a {
            reason = Some(r);
            break;
        }
    }
    let done = s
        .finish(reason.unwrap_or(FinishReason::Stop), &mut |e| {
            events.push(e)
        })
        .unwrap();
    Run {
        events,
        actions,
        done,
    }
}

fn ids(text: &str) -> Vec<u32> {
    common::encode(&common::tokenizer(), text)
}

#[test]
fn multibyte_characters_split_across_tokens_are_never_emitted_in_halves() {
    let text = "Robot café 😀👍🏽 机器人看到桌子 ok";
    let toks = ids(text);
    assert!(toks.len() > 10);
    let r = run(StreamConfig::new(vec![eos()], 1000), &toks);
    assert!(
        r.deltas().iter().all(|d| !d.contains('\u{FFFD}')),
        "{:?}",
        r.deltas()
    );
    assert!(
        r.deltas().len() < toks.len(),
        "some tokens must end mid-character and be held back"
    );
    assert_eq!(r.text(false), text);
    assert_eq!(r.done.text, text);
    assert_eq!(r.done.tokens, toks);
    assert_eq!(r.done.finish_reason, FinishReason::Stop);
}

#[test]
fn a_dangling_sequence_is_flushed_as_replacement_identically() {
    let mut toks = ids("ok 😀");
    // Drop the emoji's last byte token: the stream ends inside the character.
    let tok = common::tokenizer();
    while tok.decode(&toks, false).unwrap().ends_with('😀') {
        toks.pop();
    }
    let r = run(StreamConfig::new(vec![eos()], 1000), &toks);
    assert!(r.done.text.starts_with("ok "));
    assert!(r.done.text.ends_with('\u{FFFD}'), "{:?}", r.done.text);
    assert_eq!(r.text(false), r.done.text);
    assert_eq!(r.done.text, tok.decode(&toks, false).unwrap());
}

#[test]
fn eos_stops_without_being_kept() {
    let mut toks = ids("Hello there");
    toks.push(eos());
    toks.extend(ids(" never"));
    let mut cfg = StreamConfig::new(
        vec![
            eos(),
            common::tokenizer().token_to_id("<|endoftext|>").unwrap(),
        ],
        1000,
    );
    cfg.prompt_tokens = 42;
    let r = run(cfg, &toks);
    assert_eq!(r.done.text, "Hello there");
    assert_eq!(r.done.finish_reason, FinishReason::Stop);
    assert_eq!(
        *r.actions.last().unwrap(),
        Action::Finish(FinishReason::Stop)
    );
    assert!(r.actions[..r.actions.len() - 1]
        .iter()
        .all(|a| *a == Action::Feed));
    assert!(!r.done.tokens.contains(&eos()));
    assert_eq!(r.done.timings.completion_tokens, r.done.tokens.len());
    assert_eq!(r.done.timings.prompt_tokens, 42);
    assert!(r.done.timings.ttft.is_some());
}

#[test]
fn stop_strings_split_across_tokens_are_held_back_and_cut() {
    let text = "The cup is red.\nUser: and then";
    let toks = ids(text);
    let mut cfg = StreamConfig::new(vec![eos()], 1000);
    cfg.stop = vec!["\nUser:".into()];
    let r = run(cfg.clone(), &toks);
    assert_eq!(r.done.text, "The cup is red.");
    assert_eq!(r.text(false), "The cup is red.");
    assert_eq!(r.done.finish_reason, FinishReason::Stop);
    assert!(
        !r.deltas().iter().any(|d| d.contains('\n')),
        "held back, never emitted"
    );
    // The stop string spans several tokens; the stream stops at the token completing it.
    let fed = r.actions.iter().filter(|a| **a == Action::Feed).count();
    assert!(fed < toks.len() - 1);
    // A prefix that never completes is released at the end.
    let r = run(cfg, &ids("Done.\nUs"));
    assert_eq!(r.done.text, "Done.\nUs");
    assert_eq!(r.text(false), "Done.\nUs");
}

#[test]
fn max_new_tokens_gives_length() {
    let toks = ids("one two three four five six");
    let r = run(StreamConfig::new(vec![eos()], 3), &toks);
    assert_eq!(r.done.finish_reason, FinishReason::Length);
    assert_eq!(r.done.tokens, toks[..3]);
    assert_eq!(r.actions.len(), 3);
    assert_eq!(
        r.done.text,
        common::tokenizer().decode(&toks[..3], false).unwrap()
    );
}

#[test]
fn cancel_and_deadline_stop_at_the_next_step() {
    let cancel = Arc::new(AtomicBool::new(false));
    let mut cfg = StreamConfig::new(vec![eos()], 1000);
    cfg.cancel = Some(cancel.clone());
    let mut s = TokenStream::new(common::tokenizer(), cfg);
    let toks = ids("alpha beta gamma delta");
    let mut out = Vec::new();
    assert_eq!(s.push(toks[0], &mut |e| out.push(e)).unwrap(), Action::Feed);
    assert_eq!(s.interrupted(), None);
    cancel.store(true, Ordering::Relaxed);
    assert_eq!(s.interrupted(), Some(FinishReason::Cancelled));
    assert_eq!(
        s.push(toks[1], &mut |e| out.push(e)).unwrap(),
        Action::Finish(FinishReason::Cancelled)
    );
    let done = s
        .finish(FinishReason::Cancelled, &mut |e| out.push(e))
        .unwrap();
    assert_eq!(done.finish_reason, FinishReason::Cancelled);
    assert_eq!(
        done.text,
        common::tokenizer().decode(&toks[..2], false).unwrap()
    );

    let tok = common::tokenizer();
    let mut cfg = StreamConfig::new(vec![eos()], 1000);
    cfg.deadline = Some(Instant::now() + Duration::from_millis(500));
    let s = TokenStream::new(tok, cfg);
    assert_eq!(s.interrupted(), None);
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(s.interrupted(), Some(FinishReason::Timeout));
    assert_eq!(FinishReason::Timeout.as_str(), "timeout");
}

fn qwen35(starts_in_think: bool) -> StreamConfig {
    let mut cfg = StreamConfig::new(vec![eos()], 1000);
    cfg.think_split = true;
    cfg.tool_calls = true;
    cfg.starts_in_think = starts_in_think;
    cfg
}

#[test]
fn think_split_when_the_opener_ends_inside_think() {
    let r = run(
        qwen35(true),
        &ids("The user asks.\nA cup.\n</think>\n\nIt is a red cup."),
    );
    assert_eq!(r.done.reasoning, "The user asks.\nA cup.");
    assert_eq!(r.done.text, "It is a red cup.");
    assert_eq!(r.text(true), r.done.reasoning);
    assert_eq!(r.text(false), r.done.text);
    assert!(r.deltas().iter().all(|d| !d.contains("think>")));
}

#[test]
fn think_split_when_the_model_opens_think_itself() {
    let r = run(
        qwen35(false),
        &ids("<think>\nhmm\n</think>\n\nAnswer <b>bold</b>"),
    );
    assert_eq!(r.done.reasoning, "hmm");
    assert_eq!(r.done.text, "Answer <b>bold</b>");
    // Without the split (plain ChatML) the markers stay text.
    let raw = "<think>\nhmm\n</think>\n\nAnswer";
    let r = run(StreamConfig::new(vec![eos()], 1000), &ids(raw));
    assert_eq!(r.done.text, raw);
    assert_eq!(r.done.reasoning, "");
}

#[test]
fn tool_call_blocks_become_structured_calls() {
    let mut cfg = qwen35(false);
    cfg.tools = serde_json::from_str(
        r#"[{"type":"function","function":{"name":"move","parameters":{"type":"object","properties":{"meters":{"type":"number"}}}}}]"#,
    )
    .unwrap();
    let out = "Moving now.\n\n<tool_call>\n<function=move>\n<parameter=meters>\n2\n</parameter>\n</function>\n</tool_call>";
    let r = run(cfg, &ids(out));
    assert_eq!(r.done.text, "Moving now.");
    assert_eq!(r.done.tool_calls.len(), 1);
    assert_eq!(
        r.done.tool_calls[0].to_json(),
        serde_json::json!({"name": "move", "arguments": {"meters": 2}})
    );
    assert!(r
        .events
        .iter()
        .any(|e| matches!(e, Event::ToolCall(c) if c.name == "move")));
    assert!(r.deltas().iter().all(|d| !d.contains("function")));

    let r = run(
        qwen35(false),
        &ids("<tool_call>\nnot a call\n</tool_call>ok"),
    );
    assert_eq!(r.done.text, "ok");
    assert!(r.done.tool_calls.is_empty());
    assert_eq!(
        r.done.invalid_tool_calls,
        vec!["\nnot a call\n".to_string()]
    );
}

/// A constrained answer is verbatim: markers and leading whitespace inside it stay (a JSON
/// string may hold them), and a think block ends only at the `</think>` token — text that
/// spells `</think>` out of smaller tokens stays reasoning.
#[test]
fn verbatim_answers_keep_markers_and_end_think_only_at_the_token() {
    let tok = common::tokenizer();
    let think_end = tok.token_to_id("</think>").unwrap();
    let verbatim = |starts_in_think| {
        let mut cfg = qwen35(starts_in_think);
        cfg.verbatim_answer = true;
        cfg.tool_calls = false;
        cfg.think_end = Some(think_end);
        cfg
    };
    let value = r#"{"a":" <think> <tool_call>x</tool_call> "}"#;
    let r = run(verbatim(false), &ids(value));
    assert_eq!(r.done.text, value);
    assert!(r.done.reasoning.is_empty() && r.done.tool_calls.is_empty());

    // Spelled out of pieces, `</think>` is reasoning text; the token ends the block.
    let spelled: Vec<u32> = "</think>".chars().map(|c| ids(&c.to_string())[0]).collect();
    let mut toks = ids("plan ");
    toks.extend(&spelled);
    toks.push(think_end);
    toks.extend(ids(r#"["</think>"]"#));
    let mut s = TokenStream::new(tok, verbatim(true));
    let mut events = Vec::new();
    let mut answering = Vec::new();
    for &id in &toks {
        answering.push(s.answering());
        assert_eq!(s.push(id, &mut |e| events.push(e)).unwrap(), Action::Feed);
    }
    let done = s
        .finish(FinishReason::Stop, &mut |e| events.push(e))
        .unwrap();
    assert_eq!(done.reasoning, "plan </think>");
    assert_eq!(done.text, r#"["</think>"]"#);
    let at = toks.iter().position(|&t| t == think_end).unwrap();
    assert!(
        answering[..=at].iter().all(|a| !a),
        "reasoning until the token"
    );
    assert!(
        answering[at + 1..].iter().all(|&a| a),
        "answering right after it"
    );
    assert_eq!(done.tokens, toks);
}

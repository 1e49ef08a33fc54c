//! The conversation layer (`vlm::assistant`) and `vlm chat` on top of it: the BPU path
//! through the simulator answers exactly as the CPU backend on the same HF weights, the
//! system prefix prefilled once gives the same tokens as one full render, a parked
//! conversation continues as an uninterrupted one, and the CLI prints what the library
//! computes (one-shot and REPL).
#![allow(clippy::unwrap_used)]

use vlm_testkit as common;

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::Value;
use vlm::assistant::Turn;
use vlm::chat::{Segment, SystemOptions, UserTurn};
use vlm::engine::{CpuOptions, ImageInput};
use vlm::stream::FinishReason;
use vlm_bpu::{open_assistant, ModelSource, OpenOptions};

const MAX_NEW: usize = 10;

fn image(name: &str) -> ImageInput {
    common::image_input(&common::fixtures().join("images").join(name))
}

fn turn(text: &str, images: Vec<ImageInput>) -> Turn {
    let mut t = Turn::new(text, MAX_NEW);
    t.images = images;
    t
}

/// A text turn whose conversation is parked for the next turn.
fn kept(text: &str) -> Turn {
    let mut t = turn(text, vec![]);
    t.keep = true;
    t
}

/// A sim package of tiny-4b with the fixture tokenizer, in a temp dir.
fn package() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let pkg = dir.path().join("pkg");
    common::sim_package("tiny-4b", &pkg, |o| o.cache_len = 512);
    (dir, pkg)
}

fn flat(p: &vlm::chat::Prompt) -> Vec<u32> {
    p.segments
        .iter()
        .flat_map(|s| match s {
            Segment::Tokens(t) => t.clone(),
            Segment::Image { .. } => vec![u32::MAX],
        })
        .collect()
}

#[test]
fn system_prefix_plus_turn_equals_the_full_first_turn() {
    let (_d, pkg) = package();
    let a = open_assistant(&ModelSource::Package(pkg), &OpenOptions::default()).unwrap();
    let t = a.template();
    for (system, tools) in [
        (None, vec![]),
        (
            Some("Be brief.".to_owned()),
            vec![serde_json::json!({"type": "function", "function": {"name": "look"}})],
        ),
    ] {
        let opts = SystemOptions { system, tools };
        for thinking in [false, true] {
            let user = UserTurn {
                text: "What is here?",
                images: vec![vlm::chat::ImageSlot::square(10)],
                thinking,
            };
            let full = t.render(Some(&opts), &user).unwrap();
            let mut split = t.system_prefix(&opts).unwrap();
            let rest = t.render_after_system(&user).unwrap();
            split.extend(flat(&rest));
            assert_eq!(flat(&full), split);
            assert_eq!(full.starts_in_think, rest.starts_in_think);
        }
    }
}

#[test]
fn bpu_sim_and_cpu_backends_answer_alike_and_sessions_continue() {
    let (_d, pkg) = package();
    let mut bpu = open_assistant(&ModelSource::Package(pkg), &OpenOptions::default()).unwrap();
    assert_eq!(bpu.info().backend.as_str(), "bpu-sim");
    let cpu_opts = OpenOptions {
        cpu: CpuOptions {
            context: Some(512),
            ..CpuOptions::default()
        },
        ..OpenOptions::default()
    };
    let mut cpu =
        open_assistant(&ModelSource::Hf(common::model_dir("tiny-4b")), &cpu_opts).unwrap();
    assert_eq!(cpu.info().backend.as_str(), "cpu");

    let mut system = turn("Describe the scene.", vec![image("scene_a.png")]);
    // The package's system prompt, so both render the same system block.
    system.system = Some(bpu.info().system.clone());
    let b = bpu.ask(None, &system, &mut |_| {}).unwrap();
    let c = cpu.ask(None, &system, &mut |_| {}).unwrap();
    assert_eq!(
        b.completion.tokens, c.completion.tokens,
        "BPU sim vs CPU, with an image"
    );
    assert_eq!(b.completion.text, c.completion.text);
    assert_eq!(
        b.completion.timings.prompt_tokens,
        c.completion.timings.prompt_tokens
    );

    // Two images in one turn, and with vs without an image.
    let two = bpu
        .ask(
            None,
            &turn("Compare.", vec![image("scene_a.png"), image("scene_b.png")]),
            &mut |_| {},
        )
        .unwrap();
    let none = bpu
        .ask(None, &turn("Compare.", vec![]), &mut |_| {})
        .unwrap();
    assert_eq!(
        two.completion.timings.prompt_tokens - none.completion.timings.prompt_tokens,
        2 * 102
    );
    assert_ne!(two.completion.tokens, none.completion.tokens);

    // A conversation parked after turn 1 and resumed after an unrelated ask equals the same
    // two turns asked back to back.
    let t1 = bpu
        .ask(None, &kept("First question."), &mut |_| {})
        .unwrap();
    let conv = t1.conversation.clone().unwrap();
    assert!(conv.size_bytes() > 0);
    let back_to_back = bpu
        .ask(Some(&conv), &turn("Second.", vec![]), &mut |_| {})
        .unwrap();
    bpu.ask(
        None,
        &turn("Something else entirely.", vec![image("scene_c.png")]),
        &mut |_| {},
    )
    .unwrap();
    let resumed = bpu
        .ask(Some(&conv), &turn("Second.", vec![]), &mut |_| {})
        .unwrap();
    assert_eq!(back_to_back.completion.tokens, resumed.completion.tokens);
    let mut first = kept("First question.");
    first.system = Some(bpu.info().system.clone());
    let cpu_t1 = cpu.ask(None, &first, &mut |_| {}).unwrap();
    let cpu_t2 = cpu
        .ask(
            cpu_t1.conversation.as_ref(),
            &turn("Second.", vec![]),
            &mut |_| {},
        )
        .unwrap();
    assert_eq!(
        cpu_t2.completion.tokens, resumed.completion.tokens,
        "CPU conversation"
    );
}

#[test]
fn bad_turns_fail_with_a_reason_and_the_assistant_stays_usable() {
    let (_d, pkg) = package();
    let mut a =
        open_assistant(&ModelSource::Package(pkg.clone()), &OpenOptions::default()).unwrap();
    let e = a.ask(None, &turn("  ", vec![]), &mut |_| {}).unwrap_err();
    assert!(e.to_string().contains("empty"), "{e}");
    let mut long = turn(&"word ".repeat(2000), vec![]);
    long.max_new_tokens = 4;
    let e = a.ask(None, &long, &mut |_| {}).unwrap_err();
    assert!(e.is_context_overflow(), "{e}");
    let cancel = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let mut cancelled = kept("hi");
    cancelled.cancel = Some(cancel);
    let r = a.ask(None, &cancelled, &mut |_| {}).unwrap();
    assert_eq!(r.completion.finish_reason, FinishReason::Cancelled);
    assert!(r.conversation.is_none(), "an unfinished turn parks nothing");
    let ok = a.ask(None, &turn("hi", vec![]), &mut |_| {}).unwrap();
    assert!(matches!(
        ok.completion.finish_reason,
        FinishReason::Stop | FinishReason::Length
    ));
    // Text only: images are refused, the tower is never opened.
    let mut text_only = open_assistant(
        &ModelSource::Package(pkg),
        &OpenOptions {
            vision: false,
            ..OpenOptions::default()
        },
    )
    .unwrap();
    assert_eq!(text_only.info().image_side, None);
    let e = text_only
        .ask(None, &turn("hi", vec![image("scene_a.png")]), &mut |_| {})
        .unwrap_err();
    assert!(e.to_string().contains("vision"), "{e}");
}

fn vlm() -> Command {
    Command::new(env!("CARGO_BIN_EXE_vlm"))
}

#[test]
fn vlm_chat_prints_what_the_assistant_computes() {
    let (_d, pkg) = package();
    let mut a =
        open_assistant(&ModelSource::Package(pkg.clone()), &OpenOptions::default()).unwrap();
    let mut t = turn("What is in the picture?", vec![image("scene_a.png")]);
    let direct = a.ask(None, &t, &mut |_| {}).unwrap();

    let out = vlm()
        .arg("chat")
        .arg(&pkg)
        .args([
            "--prompt",
            "What is in the picture?",
            "--no-think",
            "--temperature",
            "0",
        ])
        .args(["--presence-penalty", "0", "--top-k", "0", "--top-p", "1"])
        .args([
            "--max-new-tokens",
            &MAX_NEW.to_string(),
            "--json",
            "--image",
        ])
        .arg(common::fixtures().join("images/scene_a.png"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["answer"], direct.completion.text.as_str());
    assert_eq!(
        v["tokens"],
        serde_json::to_value(&direct.completion.tokens).unwrap()
    );

    // REPL: two lines are two turns of one conversation.
    t = kept("First question.");
    let t1 = a.ask(None, &t, &mut |_| {}).unwrap();
    let t2 = a
        .ask(
            t1.conversation.as_ref(),
            &turn("Second.", vec![]),
            &mut |_| {},
        )
        .unwrap();
    let mut child = vlm()
        .arg("chat")
        .arg(&pkg)
        .args([
            "--no-think",
            "--temperature",
            "0",
            "--presence-penalty",
            "0",
        ])
        .args([
            "--top-k",
            "0",
            "--top-p",
            "1",
            "--max-new-tokens",
            &MAX_NEW.to_string(),
            "--json",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"First question.\nSecond.\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2);
    assert_eq!(lines[0]["answer"], t1.completion.text.as_str());
    assert_eq!(lines[1]["answer"], t2.completion.text.as_str());

    // A missing package names the file.
    let out = vlm()
        .args(["chat", "/nonexistent/pkg", "--prompt", "hi"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/pkg"));
}

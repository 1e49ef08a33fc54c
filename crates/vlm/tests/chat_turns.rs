//! Turn rendering against the template strings of docs/package-contract.md (§7) tokenised in one go,
//! the way HF tokenises `apply_chat_template` output.
#![allow(clippy::unwrap_used)]

use vlm_testkit as common;

use vlm::chat::{ChatTemplate, ImageSlot, Segment, SystemOptions, UserTurn};
use vlm::package::{ChatConfig, ChatFormat, Dialect};

fn chat_config() -> ChatConfig {
    ChatConfig {
        format: ChatFormat::ChatMl,
        im_start: None,
        im_end: None,
        bos: None,
        system: "You are a robot.".into(),
    }
}

fn template(dialect: Dialect) -> ChatTemplate {
    ChatTemplate::new(common::tokenizer(), &chat_config(), dialect).unwrap()
}

fn flat(p: &vlm::chat::Prompt) -> Vec<u32> {
    p.segments
        .iter()
        .flat_map(|s| match s {
            Segment::Tokens(t) => t.clone(),
            Segment::Image { .. } => panic!("unexpected image"),
        })
        .collect()
}

#[test]
fn first_turn_with_thinking_off() {
    let t = template(Dialect::Qwen35);
    let tok = t.tokenizer().clone();
    let p = t
        .render(
            Some(&SystemOptions::default()),
            &UserTurn {
                text: "What is on the table?",
                images: vec![],
                thinking: false,
            },
        )
        .unwrap();
    let want = "<|im_start|>system\nYou are a robot.<|im_end|>\n<|im_start|>user\nWhat is on the table?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
    assert_eq!(flat(&p), common::encode(&tok, want));
    assert!(!p.starts_in_think);
    assert_eq!(p.rows(), flat(&p).len());
    assert_eq!(tok.decode(&flat(&p), false).unwrap(), want);
}

#[test]
fn thinking_on_differs_by_dialect_and_system_can_be_overridden() {
    let turn = UserTurn {
        text: "Why?",
        images: vec![],
        thinking: true,
    };
    let sys = SystemOptions {
        system: Some("Be brief.".into()),
        tools: vec![],
    };
    let q = template(Dialect::Qwen35).render(Some(&sys), &turn).unwrap();
    let tok = common::tokenizer();
    let want = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhy?<|im_end|>\n<|im_start|>assistant\n<think>\n";
    assert_eq!(flat(&q), common::encode(&tok, want));
    assert!(q.starts_in_think, "qwen3.5 opener ends inside <think>");

    let c = template(Dialect::ChatMl).render(Some(&sys), &turn).unwrap();
    let want = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhy?<|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(flat(&c), common::encode(&tok, want));
    assert!(
        !c.starts_in_think,
        "plain ChatML: the model opens <think> itself"
    );
}

#[test]
fn later_turn_closes_the_previous_reply() {
    let t = template(Dialect::Qwen35);
    let p = t
        .render(
            None,
            &UserTurn {
                text: "And now?",
                images: vec![],
                thinking: false,
            },
        )
        .unwrap();
    let want = "<|im_end|>\n<|im_start|>user\nAnd now?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n";
    assert_eq!(flat(&p), common::encode(t.tokenizer(), want));
}

#[test]
fn two_images_become_slots_between_vision_markers() {
    let t = template(Dialect::Qwen35);
    let tok = t.tokenizer().clone();
    let m = *t.markers();
    let p = t
        .render(
            Some(&SystemOptions::default()),
            &UserTurn {
                text: "Compare the two pictures.",
                images: vec![ImageSlot::square(10), ImageSlot::square(10)],
                thinking: false,
            },
        )
        .unwrap();
    let images: Vec<usize> = p
        .segments
        .iter()
        .filter_map(|s| match s {
            Segment::Image { index, slot } => {
                assert_eq!(slot.rows(), 100);
                Some(*index)
            }
            Segment::Tokens(_) => None,
        })
        .collect();
    assert_eq!(images, [0, 1]);
    // Each slot sits between <|vision_start|> and <|vision_end|>.
    for (i, s) in p.segments.iter().enumerate() {
        if matches!(s, Segment::Image { .. }) {
            let Segment::Tokens(before) = &p.segments[i - 1] else {
                panic!()
            };
            let Segment::Tokens(after) = &p.segments[i + 1] else {
                panic!()
            };
            assert_eq!(before.last(), m.vision_start.as_ref());
            assert_eq!(after.first(), m.vision_end.as_ref());
        }
    }
    // With the slots expanded to <|image_pad|> the ids equal HF's tokenisation of the
    // rendered template.
    let pads = "<|image_pad|>".repeat(100);
    let want = format!(
        "<|im_start|>system\nYou are a robot.<|im_end|>\n<|im_start|>user\n<|vision_start|>{pads}<|vision_end|><|vision_start|>{pads}<|vision_end|>Compare the two pictures.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    );
    let pad = m.image_pad.unwrap();
    assert_eq!(p.ids_with_pad(pad), common::encode(&tok, &want));
    // Positions: the second block starts G = 10 after the first one's start + 2 markers.
    let (pos, _) = p.positions(0);
    let first = p.ids_with_pad(pad).iter().position(|&x| x == pad).unwrap() as u32;
    assert_eq!(pos[first as usize].t, first);
    assert_eq!(
        pos[first as usize + 100].t,
        first + 10,
        "<|vision_end|> at st + G"
    );
    assert_eq!(
        pos[first as usize + 102].t,
        first + 12,
        "second block start"
    );
}

#[test]
fn tools_are_rendered_into_the_system_block() {
    let t = template(Dialect::Qwen35);
    let tools: Vec<serde_json::Value> = serde_json::from_str(
        r#"[{"type":"function","function":{"name":"move","description":"Move the robot","parameters":{"type":"object","properties":{"meters":{"type":"number"}},"required":["meters"]}}}]"#,
    )
    .unwrap();
    let sys = SystemOptions {
        system: None,
        tools,
    };
    let text = t.system_text(&sys).unwrap();
    assert!(text.starts_with(
        "# Tools\n\nYou have access to the following functions:\n\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"move\", \"description\": \"Move the robot\", \"parameters\": {\"type\": \"object\", \"properties\": {\"meters\": {\"type\": \"number\"}}, \"required\": [\"meters\"]}}}\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n<tool_call>\n<function=example_function_name>\n"
    ), "{text}");
    assert!(text
        .ends_with("do not tell the user about function calls\n</IMPORTANT>\n\nYou are a robot."));
    let p = t
        .render(
            Some(&sys),
            &UserTurn {
                text: "Go forward 2 m.",
                images: vec![],
                thinking: false,
            },
        )
        .unwrap();
    let want = format!(
        "<|im_start|>system\n{text}<|im_end|>\n<|im_start|>user\nGo forward 2 m.<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
    );
    assert_eq!(flat(&p), common::encode(t.tokenizer(), &want));
    let bad = SystemOptions {
        system: None,
        tools: vec![serde_json::json!("move")],
    };
    assert!(t.system_text(&bad).is_err());
}

#[test]
fn markers_from_the_manifest_win_and_other_formats_are_refused() {
    let tok = common::tokenizer();
    let mut cfg = chat_config();
    let bos = tok.token_to_id("<|endoftext|>").unwrap();
    cfg.bos = Some(bos);
    let t = ChatTemplate::new(tok.clone(), &cfg, Dialect::ChatMl).unwrap();
    let p = t
        .render(
            Some(&SystemOptions::default()),
            &UserTurn {
                text: "hi",
                images: vec![],
                thinking: false,
            },
        )
        .unwrap();
    assert_eq!(
        flat(&p)[..2],
        [bos, tok.token_to_id("<|im_start|>").unwrap()]
    );
    cfg.format = ChatFormat::Phi;
    assert!(ChatTemplate::new(tok, &cfg, Dialect::ChatMl).is_err());
}

//! Follow-ups on the same image (`Turn::image_keys`): an image whose key the continued
//! conversation already holds runs no tower call and adds no rows, so the follow-up adds only
//! its question and answers exactly as the same question without an image would; a new key
//! adds the image; a conversation that was not kept or was dropped does not hold the image,
//! so it is added again. The tower calls are counted at the backend.
#![allow(clippy::unwrap_used)]

use vlm_testkit as common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use vlm::assistant::{
    load_tokenizer, Assistant, BackendKind, Conversation, ImageKey, ModelParts, Reply, Turn,
};
use vlm::chat::Pos3;
use vlm::engine::{
    Backend, BackendInfo, CpuBackend, CpuOptions, EngineError, ImageInput, StateBlob,
};
use vlm::package::{ChatConfig, ChatFormat, Dialect};
use vlm::vision::PixelValues;

const MODEL: &str = "tiny-4b";
const MAX_NEW: usize = 6;

/// The CPU backend, counting its vision tower runs.
struct Counting {
    inner: CpuBackend,
    tower: Arc<AtomicUsize>,
}

impl Backend for Counting {
    fn info(&self) -> &BackendInfo {
        self.inner.info()
    }
    fn embed(&self, ids: &[u32], out: &mut Vec<f32>) -> Result<(), EngineError> {
        self.inner.embed(ids, out)
    }
    fn encode_image(&mut self, pixels: &PixelValues) -> Result<Vec<f32>, EngineError> {
        self.tower.fetch_add(1, Ordering::Relaxed);
        self.inner.encode_image(pixels)
    }
    fn run_rows(&mut self, rows: &[f32], positions: &[Pos3]) -> Result<(), EngineError> {
        self.inner.run_rows(rows, positions)
    }
    fn consumed(&self) -> usize {
        self.inner.consumed()
    }
    fn max_pos(&self) -> Option<u32> {
        self.inner.max_pos()
    }
    fn last_logits(&self) -> Option<&[f32]> {
        self.inner.last_logits()
    }
    fn reset(&mut self) -> Result<(), EngineError> {
        self.inner.reset()
    }
    fn snapshot(&mut self) -> Result<StateBlob, EngineError> {
        self.inner.snapshot()
    }
    fn restore(&mut self, blob: &StateBlob) -> Result<(), EngineError> {
        self.inner.restore(blob)
    }
}

fn open() -> (Assistant, Arc<AtomicUsize>) {
    let dir = common::model_dir(MODEL);
    let tower = Arc::new(AtomicUsize::new(0));
    let backend = Counting {
        inner: CpuBackend::load(&dir, CpuOptions::default()).unwrap(),
        tower: Arc::clone(&tower),
    };
    let parts = ModelParts {
        name: MODEL.into(),
        kind: BackendKind::Cpu,
        dir: dir.clone(),
        tokenizer: load_tokenizer(&dir.join("tokenizer.json")).unwrap(),
        chat: ChatConfig {
            format: ChatFormat::ChatMl,
            im_start: None,
            im_end: None,
            bos: None,
            system: String::new(),
        },
        dialect: Dialect::Qwen35,
        // The random model's answers end at max_new_tokens: the same length every time.
        eos: Vec::new(),
        vision: true,
    };
    (Assistant::new(Box::new(backend), parts).unwrap(), tower)
}

fn image(name: &str) -> ImageInput {
    common::image_input(&common::fixtures().join("images").join(name))
}

/// A kept turn with `images`, each under its key (`None`: no key).
fn turn(text: &str, images: &[(&str, Option<&str>)]) -> Turn {
    let mut t = Turn::new(text, MAX_NEW);
    t.images = images.iter().map(|(f, _)| image(f)).collect();
    t.image_keys = images.iter().map(|(_, k)| k.map(ImageKey::new)).collect();
    t.keep = true;
    t
}

fn ask(a: &mut Assistant, c: Option<&Conversation>, t: &Turn) -> Reply {
    a.ask(c, t, &mut |_| {}).unwrap()
}

fn prompt_tokens(r: &Reply) -> usize {
    r.completion.timings.prompt_tokens
}

fn keys(c: &Conversation) -> Vec<&str> {
    c.images().iter().map(ImageKey::as_str).collect()
}

const FOLLOW_UP: &str = "And what colour is it?";

#[test]
fn a_follow_up_on_a_held_image_adds_only_its_question() {
    let (mut a, tower) = open();
    let first = ask(
        &mut a,
        None,
        &turn("What is here?", &[("scene_a.png", Some("cam@1"))]),
    );
    assert_eq!(tower.load(Ordering::Relaxed), 1);
    let c1 = first.conversation.unwrap();
    assert_eq!(keys(&c1), ["cam@1"]);

    // The same question without any image, from the same conversation: what the follow-up
    // must equal, row for row and token for token. Both continue `c1` (a fork): the second
    // must restore `c1`, not continue the first one's state.
    let text_only = ask(&mut a, Some(&c1), &turn(FOLLOW_UP, &[]));
    assert_eq!(tower.load(Ordering::Relaxed), 1);

    let same = ask(
        &mut a,
        Some(&c1),
        &turn(FOLLOW_UP, &[("scene_a.png", Some("cam@1"))]),
    );
    assert_eq!(
        tower.load(Ordering::Relaxed),
        1,
        "no tower call for a held image"
    );
    assert_eq!(a.images_encoded(), 1);
    assert_eq!(prompt_tokens(&same), prompt_tokens(&text_only));
    assert_eq!(same.completion.tokens, text_only.completion.tokens);
    let c2 = same.conversation.unwrap();
    assert_eq!(keys(&c2), ["cam@1"]);
    assert_eq!(c2.turns(), 2);
    assert_eq!(c2.consumed(), text_only.conversation.unwrap().consumed());
}

#[test]
fn a_new_key_adds_its_image_and_a_missing_key_always_does() {
    let (mut a, tower) = open();
    // Rows of one image block: a fresh image turn minus the same fresh text turn.
    let fresh_text = ask(&mut a, None, &turn(FOLLOW_UP, &[]));
    let fresh_image = ask(&mut a, None, &turn(FOLLOW_UP, &[("scene_b.png", None)]));
    let block = prompt_tokens(&fresh_image) - prompt_tokens(&fresh_text);
    assert!(
        block > 2,
        "an image block is more than its two markers: {block}"
    );
    assert_eq!(tower.load(Ordering::Relaxed), 1);

    let c1 = ask(
        &mut a,
        None,
        &turn("What is here?", &[("scene_a.png", Some("cam@1"))]),
    )
    .conversation
    .unwrap();
    let text_only = ask(&mut a, Some(&c1), &turn(FOLLOW_UP, &[]));
    let newer = ask(
        &mut a,
        Some(&c1),
        &turn(FOLLOW_UP, &[("scene_b.png", Some("cam@2"))]),
    );
    assert_eq!(tower.load(Ordering::Relaxed), 3);
    assert_eq!(prompt_tokens(&newer), prompt_tokens(&text_only) + block);
    let c2 = newer.conversation.unwrap();
    assert_eq!(keys(&c2), ["cam@1", "cam@2"]);

    // Both frames are held now; an image without a key is added even with held pixels.
    let both = ask(
        &mut a,
        Some(&c2),
        &turn(
            FOLLOW_UP,
            &[
                ("scene_a.png", Some("cam@1")),
                ("scene_b.png", Some("cam@2")),
            ],
        ),
    );
    assert_eq!(tower.load(Ordering::Relaxed), 3);
    let c3 = both.conversation.as_ref().unwrap();
    let unkeyed = ask(&mut a, Some(c3), &turn(FOLLOW_UP, &[("scene_a.png", None)]));
    assert_eq!(tower.load(Ordering::Relaxed), 4);
    assert_eq!(prompt_tokens(&unkeyed), prompt_tokens(&both) + block);
    assert_eq!(keys(&unkeyed.conversation.unwrap()), ["cam@1", "cam@2"]);
}

#[test]
fn an_image_is_added_again_when_its_conversation_is_gone() {
    let (mut a, tower) = open();
    let c1 = ask(
        &mut a,
        None,
        &turn("What is here?", &[("scene_a.png", Some("cam@1"))]),
    )
    .conversation
    .unwrap();
    // A turn that is not kept leaves nothing behind: the conversation it continued does not
    // hold its new image, so the next turn from that conversation adds it.
    let mut unkept = turn(FOLLOW_UP, &[("scene_b.png", Some("cam@2"))]);
    unkept.keep = false;
    assert!(ask(&mut a, Some(&c1), &unkept).conversation.is_none());
    assert_eq!(tower.load(Ordering::Relaxed), 2);
    let again = ask(
        &mut a,
        Some(&c1),
        &turn(FOLLOW_UP, &[("scene_b.png", Some("cam@2"))]),
    );
    assert_eq!(tower.load(Ordering::Relaxed), 3);
    assert_eq!(keys(&again.conversation.unwrap()), ["cam@1", "cam@2"]);

    // A dropped conversation (an evicted or expired session) starts afresh: the image of its
    // first turn goes in again, with the same rows as the first time.
    let first_rows = {
        let r = ask(
            &mut a,
            None,
            &turn("What is here?", &[("scene_a.png", Some("cam@1"))]),
        );
        prompt_tokens(&r)
    };
    drop(c1);
    let fresh = ask(
        &mut a,
        None,
        &turn("What is here?", &[("scene_a.png", Some("cam@1"))]),
    );
    assert_eq!(tower.load(Ordering::Relaxed), 5);
    assert_eq!(prompt_tokens(&fresh), first_rows);
    assert_eq!(keys(&fresh.conversation.unwrap()), ["cam@1"]);
}

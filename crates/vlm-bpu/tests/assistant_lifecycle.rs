//! The assistant around its requests, on a sim package of the tiny-4b fixture (vision on):
//! opening and warm-up stop at the next step, cache buffer or graph call once interrupted —
//! counted by the simulator, never timed — and release what they opened; a decode-state
//! snapshot is taken only for a turn that is kept, counted at the backend seam.
#![allow(clippy::unwrap_used)]

use std::fmt::Debug;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing::{span, Event, Metadata, Subscriber};
use vlm::assistant::{load_tokenizer, Assistant, AssistantError, BackendKind, ModelParts, Turn};
use vlm::chat::Pos3;
use vlm::engine::{Backend, BackendInfo, EngineError, StateBlob};
use vlm::interrupt::Interrupt;
use vlm::vision::PixelValues;
use vlm_bpu::{open_assistant, BpuBackend, BpuError, BpuOptions, ModelSource, OpenOptions};

fn package() -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let pkg = dir.path().join("pkg");
    vlm_testkit::sim_package("tiny-4b", &pkg, |o| o.cache_len = 512);
    (dir, pkg)
}

/// The fields of one tracing event that these tests look at.
#[derive(Debug, Default)]
struct Seen {
    message: String,
    /// `bpu-sim call` events: the C entry point.
    call: String,
    /// `open step` events: the step about to run.
    step: String,
}

impl Visit for Seen {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "call" => self.call = value.to_owned(),
            "step" => self.step = value.to_owned(),
            _ => {}
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        }
    }
}

/// A subscriber that hands every event (all levels) to a closure: the tests act on the
/// simulator's per-call trace and the open steps as they happen, on the same thread.
struct Watch<F>(F);

impl<F: Fn(&Seen) + Send + Sync + 'static> Subscriber for Watch<F> {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
        span::Id::from_u64(1)
    }
    fn record(&self, _: &span::Id, _: &span::Record<'_>) {}
    fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut seen = Seen::default();
        event.record(&mut seen);
        (self.0)(&seen);
    }
    fn enter(&self, _: &span::Id) {}
    fn exit(&self, _: &span::Id) {}
}

fn watching<R>(on: impl Fn(&Seen) + Send + Sync + 'static, body: impl FnOnce() -> R) -> R {
    tracing::subscriber::with_default(Watch(on), body)
}

/// This thread's simulator: graph runs so far and what is alive.
fn runs() -> u64 {
    bpu_sim::Sim::current().stats().runs
}

fn alive() -> (usize, usize, usize) {
    let s = bpu_sim::Sim::current().stats();
    (s.live_buffers, s.live_tasks, s.live_packed)
}

#[test]
fn opening_stops_before_the_next_step_and_releases_what_it_opened() {
    let (_d, pkg) = package();
    let baseline = alive();
    // The steps of an uninterrupted open, in order.
    let steps = Arc::new(Mutex::new(Vec::<String>::new()));
    let record = steps.clone();
    let b = watching(
        move |e| {
            if e.message == "open step" {
                record.lock().unwrap().push(e.step.clone());
            }
        },
        || BpuBackend::open(&pkg, &BpuOptions::default()).unwrap(),
    );
    drop(b);
    let steps = steps.lock().unwrap().clone();
    for named in [
        "loading the text graphs",
        "loading the vision tower",
        "allocating the buffers",
        "clearing the state",
    ] {
        assert!(steps.iter().any(|s| s == named), "{named} in {steps:?}");
    }
    assert_eq!(alive(), baseline);

    // Raised before opening: not even the manifest is read.
    let opts = |i: &Interrupt| BpuOptions {
        interrupt: i.clone(),
        ..BpuOptions::default()
    };
    let early = Interrupt::new();
    early.raise();
    match BpuBackend::open(&pkg, &opts(&early)) {
        Err(BpuError::Interrupted { step }) => assert_eq!(step, steps[0]),
        other => panic!("expected an interruption, got {:?}", other.err()),
    }

    // Raised while step i runs: step i completes, step i + 1 never starts, and everything
    // loaded or allocated so far is released. The two steps made of one call per cache buffer
    // stop inside, before their next buffer (here: before the first).
    let inside = |step: &str| match step {
        "allocating the buffers" => Some("allocating the rest of the cache buffers"),
        "clearing the state" => Some("clearing the rest of the state"),
        _ => None,
    };
    for (i, during) in steps.iter().enumerate() {
        let interrupt = Interrupt::new();
        let raise = interrupt.clone();
        let at = during.clone();
        let r = watching(
            move |e| {
                if e.message == "open step" && e.step == at {
                    raise.raise();
                }
            },
            || BpuBackend::open(&pkg, &opts(&interrupt)),
        );
        let next = inside(during).or(steps.get(i + 1).map(String::as_str));
        match (next, r) {
            (Some(next), Err(BpuError::Interrupted { step })) => assert_eq!(step, next),
            // Nothing is asked after the last step: the open completes.
            (None, Ok(b)) => drop(b),
            (next, r) => panic!(
                "raised during {during:?}: expected a stop before {next:?}, got {:?}",
                r.err()
            ),
        }
        assert_eq!(alive(), baseline, "after an interruption during {during:?}");
    }
}

#[test]
fn warm_up_stops_at_the_next_graph_call() {
    let (_d, pkg) = package();
    let open =
        || open_assistant(&ModelSource::Package(pkg.clone()), &OpenOptions::default()).unwrap();
    let mut a = open();
    assert!(
        a.info().image_side.is_some(),
        "the warm-up should run the tower too"
    );
    let before = runs();
    a.warm_up(None, &Interrupt::new()).unwrap();
    let total = runs() - before;
    drop(a);
    // System prefix rows, the tower, the turn's rows, a decode step.
    assert!(total >= 4, "{total} graph calls");

    for k in [0, 1, 2, total / 2, total - 1] {
        let mut a = open();
        let interrupt = Interrupt::new();
        if k == 0 {
            interrupt.raise();
        }
        // Raised inside graph call k, while it runs (as a signal handler would).
        let raise = interrupt.clone();
        let submits = AtomicUsize::new(0);
        let before = runs();
        let e = watching(
            move |e| {
                if e.call == "hbUCPSubmitTask"
                    && submits.fetch_add(1, Ordering::Relaxed) + 1 == k as usize
                {
                    raise.raise();
                }
            },
            || a.warm_up(None, &interrupt),
        )
        .unwrap_err();
        assert_eq!(
            runs() - before,
            k,
            "call {k} completes and no call follows it"
        );
        assert!(matches!(e, AssistantError::Interrupted { .. }), "{e}");
        assert!(
            e.to_string()
                .contains(&format!("graph call {} of the warm-up", k + 1)),
            "{e}"
        );
        // An interrupted warm-up leaves a usable assistant (the node drops it; a caller may not).
        let r = a.ask(None, &Turn::new("hi", 2), &mut |_| {}).unwrap();
        assert!(!r.completion.tokens.is_empty());
    }
}

/// A backend that counts the snapshots taken through the seam, whatever the assistant says.
struct Counting {
    inner: BpuBackend,
    snapshots: Arc<AtomicUsize>,
}

impl Backend for Counting {
    fn info(&self) -> &BackendInfo {
        self.inner.info()
    }
    fn embed(&self, ids: &[u32], out: &mut Vec<f32>) -> Result<(), EngineError> {
        self.inner.embed(ids, out)
    }
    fn encode_image(&mut self, pixels: &PixelValues) -> Result<Vec<f32>, EngineError> {
        self.inner.encode_image(pixels)
    }
    fn run_rows(&mut self, rows: &[f32], positions: &[Pos3]) -> Result<(), EngineError> {
        self.inner.run_rows(rows, positions)
    }
    fn step_interruptible(
        &mut self,
        rows: &[f32],
        positions: &[Pos3],
        interrupt: &mut dyn FnMut() -> bool,
    ) -> Result<bool, EngineError> {
        self.inner.step_interruptible(rows, positions, interrupt)
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
        self.snapshots.fetch_add(1, Ordering::Relaxed);
        self.inner.snapshot()
    }
    fn restore(&mut self, blob: &StateBlob) -> Result<(), EngineError> {
        self.inner.restore(blob)
    }
}

#[test]
fn a_snapshot_is_taken_only_for_a_kept_turn() {
    let (_d, pkg) = package();
    let inner = BpuBackend::open(&pkg, &BpuOptions::default()).unwrap();
    let cfg = inner.config().clone();
    let parts = ModelParts {
        name: cfg.name.clone(),
        kind: BackendKind::BpuSim,
        dir: pkg.clone(),
        tokenizer: load_tokenizer(&cfg.tokenizer).unwrap(),
        chat: cfg.chat,
        dialect: cfg.dialect,
        eos: cfg.eos,
        vision: true,
    };
    let count = Arc::new(AtomicUsize::new(0));
    let backend = Counting {
        inner,
        snapshots: count.clone(),
    };
    let mut a = Assistant::new(Box::new(backend), parts).unwrap();
    let taken = |a: &Assistant| {
        let n = count.load(Ordering::Relaxed);
        assert_eq!(a.snapshots(), n as u64, "the assistant's own count");
        n
    };
    // The warm-up caches the system prefix: the one snapshot every fresh turn restores.
    a.warm_up(None, &Interrupt::new()).unwrap();
    assert_eq!(taken(&a), 1);

    let turn = |text: &str, keep: bool| {
        let mut t = Turn::new(text, 4);
        t.keep = keep;
        t
    };
    let once = a
        .ask(None, &turn("What is this?", false), &mut |_| {})
        .unwrap();
    assert!(once.conversation.is_none(), "nothing parked without keep");
    assert_eq!(taken(&a), 1, "no snapshot for a turn that is not kept");

    let first = a
        .ask(None, &turn("What is this?", true), &mut |_| {})
        .unwrap();
    assert_eq!(first.completion.tokens, once.completion.tokens);
    let conv = first.conversation.unwrap();
    assert_eq!(taken(&a), 2, "one snapshot for a kept turn");

    let last = a
        .ask(Some(&conv), &turn("And then?", false), &mut |_| {})
        .unwrap();
    assert!(last.conversation.is_none());
    assert_eq!(taken(&a), 2, "continuing without keeping takes none");
    let second = a
        .ask(Some(&conv), &turn("And then?", true), &mut |_| {})
        .unwrap();
    assert_eq!(second.completion.tokens, last.completion.tokens);
    assert_eq!(second.conversation.unwrap().turns(), 2);
    assert_eq!(taken(&a), 3);

    // Another system block is prefilled and cached once (not per turn).
    let mut other = turn("What is this?", false);
    other.system = Some("Answer in one word.".into());
    a.ask(None, &other, &mut |_| {}).unwrap();
    a.ask(None, &other, &mut |_| {}).unwrap();
    assert_eq!(taken(&a), 4);
}

//! The system block of a fresh conversation against hostile sizes and stopped turns, on a sim
//! package of the tiny-4b fixture: a block longer than the window is refused
//! (`ContextOverflow`) before any of it is embedded, and a turn whose cancel flag is raised or
//! whose deadline has passed stops before the block's first graph call — counted by the
//! simulator — ending `cancelled` or `timeout` with nothing cached.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use vlm::assistant::{load_tokenizer, Assistant, BackendKind, ModelParts, Turn};
use vlm::chat::Pos3;
use vlm::engine::{Backend, BackendInfo, EngineError, StateBlob};
use vlm::stream::FinishReason;
use vlm::vision::PixelValues;
use vlm_bpu::{BpuBackend, BpuOptions};

/// A backend that records the most ids one `embed` was asked for.
struct Watched {
    inner: BpuBackend,
    most_embedded: Arc<AtomicUsize>,
}

impl Backend for Watched {
    fn info(&self) -> &BackendInfo {
        self.inner.info()
    }
    fn embed(&self, ids: &[u32], out: &mut Vec<f32>) -> Result<(), EngineError> {
        self.most_embedded.fetch_max(ids.len(), Ordering::Relaxed);
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
        self.inner.snapshot()
    }
    fn restore(&mut self, blob: &StateBlob) -> Result<(), EngineError> {
        self.inner.restore(blob)
    }
}

/// An assistant on a fresh tiny-4b sim package (a 512-row window) and its embed record.
fn assistant() -> (tempfile::TempDir, Assistant, Arc<AtomicUsize>) {
    let dir = tempfile::tempdir().unwrap();
    let pkg = dir.path().join("pkg");
    vlm_testkit::sim_package("tiny-4b", &pkg, |o| o.cache_len = 512);
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
        vision: false,
    };
    let most_embedded = Arc::new(AtomicUsize::new(0));
    let backend = Watched {
        inner,
        most_embedded: most_embedded.clone(),
    };
    let a = Assistant::new(Box::new(backend), parts).unwrap();
    (dir, a, most_embedded)
}

fn runs() -> u64 {
    bpu_sim::Sim::current().stats().runs
}

#[test]
fn a_system_block_longer_than_the_window_is_refused_before_it_is_embedded() {
    let (_d, mut a, most_embedded) = assistant();
    let context = a.info().context;
    let mut turn = Turn::new("hi", 2);
    // Every " word" is at least one token: twice the window.
    turn.system = Some(" word".repeat(2 * context));
    let before = runs();
    let e = a.ask(None, &turn, &mut |_| {}).unwrap_err();
    assert!(e.is_context_overflow(), "{e}");
    assert!(
        most_embedded.load(Ordering::Relaxed) <= context,
        "{} ids embedded for a {context}-row window",
        most_embedded.load(Ordering::Relaxed)
    );
    assert_eq!(runs(), before, "no graph call for a refused block");
    // The assistant answers the next turn.
    let r = a.ask(None, &Turn::new("hi", 2), &mut |_| {}).unwrap();
    assert!(!r.completion.tokens.is_empty());
}

#[test]
fn a_stopped_turn_stops_before_its_system_block_runs() {
    fn cancelled(t: &mut Turn) {
        t.cancel = Some(Arc::new(AtomicBool::new(true)));
    }
    fn expired(t: &mut Turn) {
        t.deadline = Some(Instant::now());
    }
    type Stop = fn(&mut Turn);
    let cases: [(FinishReason, Stop); 2] = [
        (FinishReason::Cancelled, cancelled),
        (FinishReason::Timeout, expired),
    ];
    for (reason, stop) in cases {
        let (_d, mut a, _) = assistant();
        let cached = a.prefix_cache_usage();
        let mut turn = Turn::new("hi", 2);
        turn.system = Some("Answer in one word.".into());
        turn.keep = true;
        stop(&mut turn);
        let before = runs();
        let r = a.ask(None, &turn, &mut |_| {}).unwrap();
        assert_eq!(r.completion.finish_reason, reason);
        assert!(r.completion.tokens.is_empty());
        assert!(
            r.conversation.is_none(),
            "{reason:?}: a stopped turn is kept"
        );
        assert_eq!(runs(), before, "{reason:?}: the system block ran");
        assert_eq!(
            a.prefix_cache_usage(),
            cached,
            "{reason:?}: a block was cached"
        );
        // The same block, not stopped: prefilled, cached and answered.
        let mut again = Turn::new("hi", 2);
        again.system = turn.system.clone();
        let r = a.ask(None, &again, &mut |_| {}).unwrap();
        assert!(!r.completion.tokens.is_empty());
        assert!(runs() > before);
        assert_eq!(a.prefix_cache_usage().1, cached.1 + 1);
    }
}

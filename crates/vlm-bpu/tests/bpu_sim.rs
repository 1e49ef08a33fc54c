//! `BpuBackend` over the simulator on sim packages built from the committed tiny fixtures:
//! the scenarios every backend must pass (`vlm_testkit::scenarios`: the HF goldens, the CPU
//! backend as reference — `qwen35` on the HF weights, an independent code path — snapshots,
//! overflow, cancel), then what only the BPU has: package variants, simulator faults and
//! open failures.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use bpu_sim::package::PrefillIn;
use bpu_sim::{FaultAction, FaultRule, FlushPolicy, LogitsType};
use hbdnn::FlushMode;
use vlm::chat::Pos3;
use vlm::engine::{Backend, Engine, EngineError};
use vlm_bpu::report::package_report;
use vlm_bpu::{BpuBackend, BpuError, BpuOptions, FlushDecision, FlushOption};

use vlm_testkit as common;

use common::{
    argmax, assert_matches_reference, continue_greedy, feed_text, golden_case, greedy_case,
    sim_package, BackendFactory, BackendSpec, CpuFactory, SimPackages, GOLDEN_STEPS, LOGIT_TOL,
};

/// `BpuBackend` with default options on a sim package of each spec.
#[derive(Default)]
struct SimFactory {
    packages: SimPackages,
}

impl BackendFactory for SimFactory {
    type Backend = BpuBackend;

    fn open(&self, spec: BackendSpec) -> BpuBackend {
        BpuBackend::open(&self.packages.dir(spec), &BpuOptions::default()).unwrap()
    }
}

common::backend_suite!(SimFactory::default());

/// [`SimFactory`] on a simulator whose library flushes only whole allocations (any other
/// range fails the call), whatever `BPU_SIM_FLUSH` says.
struct WholeFlushFactory(SimFactory);

impl WholeFlushFactory {
    fn new() -> Self {
        let f = SimFactory::default();
        f.packages.sim().set_flush(FlushPolicy::Whole);
        Self(f)
    }
}

impl BackendFactory for WholeFlushFactory {
    type Backend = BpuBackend;

    fn open(&self, spec: BackendSpec) -> BpuBackend {
        let b = self.0.open(spec);
        let whole = FlushDecision {
            found: FlushMode::Whole,
            used: FlushMode::Whole,
        };
        assert_eq!(b.flush(), whole);
        b
    }
}

/// A library that refuses flushes of part of an allocation: the probe at open finds it, the
/// backend flushes whole buffers (so no call is refused), generation reproduces the HF
/// goldens, snapshots round-trip, and the report says `whole`.
#[test]
fn whole_allocation_flushes_reproduce_the_goldens() {
    let f = WholeFlushFactory::new();
    common::scenarios::golden_cases_match_the_cpu_reference(&f);
    common::scenarios::snapshot_restore_continue_equals_an_uninterrupted_run(&f);
    let dir = f.0.packages.dir(BackendSpec::new("tiny-sym", 512, 32));
    let r = package_report(&dir, &BpuOptions::default());
    assert_eq!(r.flush.as_deref(), Some("whole"), "{:?}", r.violations);
    assert!(r.violations.is_empty(), "{:?}", r.violations);
}

/// `--flush` against each library: `range` is what the probe finds on one that takes
/// ranges; `whole` forced there flushes whole buffers and changes no logit, while the report
/// still says what the probe found; `range` forced on a library that refuses ranges fails
/// at open naming the option (and is a violation in the report).
#[test]
fn the_flush_option_against_each_library() {
    let f = SimFactory::default();
    f.packages.sim().set_flush(FlushPolicy::Range);
    let dir = f.packages.dir(BackendSpec::new("tiny-sym", 512, 32));
    let with = |flush| BpuOptions {
        flush,
        ..BpuOptions::default()
    };
    let decision = |found, used| FlushDecision { found, used };
    let k = golden_case("tiny-sym", "text_long");
    let run = |flush, want: FlushDecision| {
        let b = BpuBackend::open(&dir, &with(flush)).unwrap();
        assert_eq!(b.flush(), want);
        greedy_case(&mut Engine::new(b, common::tokenizer()), &k, GOLDEN_STEPS)
    };
    let ranges = run(
        FlushOption::Auto,
        decision(FlushMode::Range, FlushMode::Range),
    );
    let wholes = run(
        FlushOption::Whole,
        decision(FlushMode::Range, FlushMode::Whole),
    );
    assert_matches_reference(&wholes, &ranges, 0.0, &k);
    for opt in [FlushOption::Auto, FlushOption::Whole] {
        assert_eq!(
            package_report(&dir, &with(opt)).flush.as_deref(),
            Some("range")
        );
    }
    f.packages.sim().set_flush(FlushPolicy::Whole);
    let e = BpuBackend::open(&dir, &with(FlushOption::Range))
        .err()
        .unwrap();
    let msg = e.to_string();
    assert!(matches!(e, BpuError::Config { .. }), "{msg}");
    assert!(
        msg.contains("--flush range") && msg.contains("bpu_flush") && msg.contains("refuses"),
        "{msg}"
    );
    let r = package_report(&dir, &with(FlushOption::Range));
    assert_eq!(r.flush.as_deref(), Some("whole"));
    assert!(
        r.violations.iter().any(|v| v.contains("--flush range")),
        "{:?}",
        r.violations
    );
    assert_eq!(
        f.packages.sim().stats().live_buffers,
        0,
        "the probes free their scratch"
    );
}

#[test]
fn variants_match_the_cpu_backend() {
    let f = SimFactory::default();
    let mut c = CpuFactory::reference("tiny-sym");
    let k = golden_case("tiny-sym", "text_long");
    let want = greedy_case(&mut c, &k, GOLDEN_STEPS);
    let variant = |tweak: fn(&mut bpu_sim::package::PackageOptions)| {
        let d = tempfile::tempdir().unwrap();
        sim_package("tiny-sym", d.path(), tweak);
        let b = BpuBackend::open(d.path(), &BpuOptions::default()).unwrap();
        (d, Engine::new(b, common::tokenizer()))
    };
    // The default package runs on the simulator with 32-row chunks.
    let b = f.open(BackendSpec::new("tiny-sym", 512, 32));
    assert_eq!(b.info().prefill_chunk, 32);
    assert_eq!(b.implementation(), bpu_sim::Implementation::Sim);
    // One mask plane, prefill graph inside model.hbm with all-row logits.
    let (_d, mut b) = variant(|o| {
        o.mask_heads_one = true;
        o.prefill_in = PrefillIn::Model;
        o.prefill_logits_all = true;
    });
    assert_eq!(b.backend().info().mask_heads, 1);
    assert_eq!(b.backend().info().prefill_chunk, 32);
    assert_matches_reference(&greedy_case(&mut b, &k, GOLDEN_STEPS), &want, LOGIT_TOL, &k);
    // No prefill graph: every row is stepped.
    let (_d, mut b) = variant(|o| o.prefill_in = PrefillIn::None);
    assert_eq!(b.backend().info().prefill_chunk, 0);
    assert_matches_reference(&greedy_case(&mut b, &k, GOLDEN_STEPS), &want, LOGIT_TOL, &k);
    // S16 logits: within half a quantisation step, same tokens.
    let (_d, mut b) = variant(|o| o.logits = LogitsType::S16);
    let (dtype, scale) = b.backend().logits_format();
    assert_eq!(dtype, hbdnn::DType::S16);
    let tol = scale / 2.0 + LOGIT_TOL;
    assert_matches_reference(&greedy_case(&mut b, &k, GOLDEN_STEPS), &want, tol, &k);
}

/// A timed-out task fails its request with `timeout`; the backend is then lost (the BPU may
/// still write its buffers, so hbdnn wedges the runtime and refuses every further run), and
/// the next request, on a backend opened afresh, runs normally.
#[test]
fn a_simulator_fault_fails_the_request_and_the_next_succeeds() {
    let f = SimFactory::default();
    let spec = BackendSpec::new("tiny-sym", 512, 32);
    // The injected timeout waits out the limit: keep it short.
    let opts = BpuOptions {
        timeout: Duration::from_millis(200),
        ..BpuOptions::default()
    };
    let mut b = BpuBackend::open(&f.packages.dir(spec), &opts).unwrap();
    let k = golden_case("tiny-sym", "text_short");
    let want = feed_text(&mut b, &k.ids);
    let want_next = continue_greedy(&mut b, 4);
    // Mid-generation: the third decode step times out.
    b.reset().unwrap();
    feed_text(&mut b, &k.ids);
    f.packages.sim().add_fault(
        FaultRule::new("hbUCPWaitTaskDone", FaultAction::Timeout)
            .after(2)
            .times(1),
    );
    let mut failed = false;
    for _ in 0..4 {
        let t = argmax(b.last_logits().unwrap());
        let mut x = Vec::new();
        b.embed(&[t], &mut x).unwrap();
        let p = [Pos3::text(b.next_position())];
        match b.step(&x, &p) {
            Ok(_) => {}
            Err(e) => {
                assert!(matches!(&e, EngineError::Bpu { timeout: true, .. }), "{e}");
                failed = true;
                break;
            }
        }
    }
    assert!(failed, "the injected timeout did not fail the request");
    // The timed-out backend runs nothing more.
    let mut x = Vec::new();
    b.embed(&[k.ids[0]], &mut x).unwrap();
    let e = b.step(&x, &[Pos3::text(b.next_position())]).unwrap_err();
    assert!(
        e.backend_is_lost() && e.to_string().contains("restart the process"),
        "{e}"
    );
    // The next request, on a backend opened afresh, runs normally.
    drop(b);
    let mut b = f.open(spec);
    let got = feed_text(&mut b, &k.ids);
    assert_eq!(got, want);
    assert_eq!(continue_greedy(&mut b, 4), want_next);
}

#[test]
fn open_failures_name_the_file() {
    let f = SimFactory::default();
    let d = f.packages.dir(BackendSpec::new("tiny-sym", 512, 32));
    // An explicit board choice contradicts the sim containers.
    let e = BpuBackend::open(
        &d,
        &BpuOptions {
            implementation: Some(bpu_sim::Implementation::Board),
            ..BpuOptions::default()
        },
    )
    .err()
    .unwrap();
    assert!(e.to_string().contains("model.hbm"), "{e}");
    // A truncated embedding table.
    let emb = d.join("embed_tokens.bin");
    let bytes = std::fs::read(&emb).unwrap();
    std::fs::write(&emb, &bytes[..bytes.len() - 2]).unwrap();
    let e = BpuBackend::open(&d, &BpuOptions::default()).err().unwrap();
    let msg = e.to_string();
    assert!(
        msg.contains("embed_tokens.bin") && msg.contains("size mismatch"),
        "{msg}"
    );
    // Text only: the tower is never opened.
    std::fs::write(&emb, &bytes).unwrap();
    std::fs::write(d.join("visual.hbm"), b"garbage").unwrap();
    let b = BpuBackend::open(
        &d,
        &BpuOptions {
            no_vision: true,
            ..BpuOptions::default()
        },
    )
    .unwrap();
    assert!(b.info().vision.is_none());
}

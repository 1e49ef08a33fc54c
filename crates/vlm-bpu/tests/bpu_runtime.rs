//! BpuBackend over the simulator: the one-engine lock, the ION pool preflight, the march
//! check, the padded prompt tail (docs/package-contract.md §4.4) against stepping, and a simulator fault in
//! the middle of an `Engine::generate` request.
#![allow(clippy::unwrap_used)]

use vlm_testkit as common;

use std::path::Path;

use bpu_sim::{FaultAction, FaultRule, Sim, SimConfig};
use common::{
    argmax, assert_logits_close, golden_case, sim_package, text_then_greedy, tokenizer,
    try_generate_text, LOGIT_TOL,
};
use vlm::engine::{prompt_from_ids, Backend, Engine, EngineError};
use vlm::stream::StreamConfig;
use vlm_bpu::{BpuBackend, BpuError, BpuOptions, PrefillTail};

fn sim(cfg: SimConfig) -> Sim {
    let s = Sim::new(cfg);
    s.install();
    s
}

fn open(dir: &Path, opts: &BpuOptions) -> Result<BpuBackend, BpuError> {
    BpuBackend::open(dir, opts)
}

#[test]
fn a_second_open_fails_fast_until_the_first_is_dropped() {
    let d = tempfile::tempdir().unwrap();
    sim_package("tiny-sym", d.path(), |o| o.cache_len = 64);
    let _sim = sim(SimConfig::default());
    let lock = d.path().join("bpu.lock");
    let opts = BpuOptions {
        lock_path: Some(lock.clone()),
        no_vision: true,
        ..BpuOptions::default()
    };
    let first = open(d.path(), &opts).unwrap();
    let t = std::time::Instant::now();
    let e = open(d.path(), &opts).err().unwrap();
    assert!(t.elapsed().as_secs() < 5);
    assert!(
        matches!(&e, BpuError::Busy { path } if *path == lock),
        "{e}"
    );
    assert!(e.to_string().contains("another BPU engine"), "{e}");
    drop(first);
    let again = open(d.path(), &opts).unwrap();
    assert_eq!(again.info().context, 64);
}

#[test]
fn a_pool_too_small_refuses_before_loading_anything_under_strict() {
    let d = tempfile::tempdir().unwrap();
    sim_package("tiny-sym", d.path(), |o| o.cache_len = 64);
    let hbm: u64 = ["model.hbm", "model_prefill.hbm"]
        .iter()
        .map(|f| std::fs::metadata(d.path().join(f)).unwrap().len())
        .sum();
    let opts = BpuOptions {
        no_vision: true,
        pool_check: vlm_bpu::PoolCheck::Strict,
        ..BpuOptions::default()
    };
    let warn = BpuOptions {
        pool_check: vlm_bpu::PoolCheck::Warn,
        ..opts.clone()
    };
    // Smaller than the .hbm files: refused before the first load.
    let s = sim(SimConfig {
        pool_bytes: Some(hbm - 1),
        ..SimConfig::default()
    });
    // `warn` only warns: the load itself then fails (the simulator's pool is exact), with
    // the same advice and nothing left behind.
    let e = open(d.path(), &warn).err().unwrap();
    assert!(
        matches!(&e, BpuError::Pool { fix, .. } if fix.contains("bpu_first")),
        "{e}"
    );
    let st = s.stats();
    assert_eq!((st.live_packed, st.live_buffers, st.pool_used), (0, 0, 0));
    let e = open(d.path(), &opts).err().unwrap();
    match &e {
        BpuError::Pool {
            path,
            needed,
            available,
            fix,
            ..
        } => {
            assert!(path.ends_with("model.hbm"));
            assert_eq!((*needed, *available), (hbm, hbm - 1));
            assert!(fix.contains("hb_switch_ion.sh bpu_first"), "{fix}");
        }
        other => panic!("expected a pool error, got {other}"),
    }
    let st = s.stats();
    assert_eq!((st.live_packed, st.live_buffers, st.pool_used), (0, 0, 0));
    // The graphs fit but not the two cache sets: refused before any buffer is allocated.
    s.set_pool(Some(hbm + 1024));
    let e = open(d.path(), &opts).err().unwrap();
    assert!(
        matches!(&e, BpuError::Pool { what, .. } if what.contains("cache sets")),
        "{e}"
    );
    let st = s.stats();
    assert_eq!((st.live_packed, st.live_buffers, st.pool_used), (0, 0, 0));
    // Room for everything: opens.
    s.set_pool(Some(hbm + (8 << 20)));
    open(d.path(), &opts).unwrap();
    // A load the runtime itself refuses (-400001, pool exhausted) gets the same advice.
    s.add_fault(FaultRule::new("hbDNNInitializeFromFiles", FaultAction::AllocFail).times(1));
    let e = open(d.path(), &opts).err().unwrap();
    assert!(
        matches!(&e, BpuError::Pool { path, fix, .. }
            if path.ends_with("model.hbm") && fix.contains("bpu_first")),
        "{e}"
    );
    assert_eq!(s.stats().live_packed, 0);
}

#[test]
fn a_graph_for_another_march_is_refused_naming_the_file() {
    let d = tempfile::tempdir().unwrap();
    sim_package("tiny-sym", d.path(), |o| o.march = "nash-e".into());
    let s = sim(SimConfig::default());
    let e = open(d.path(), &BpuOptions::default()).err().unwrap();
    let msg = e.to_string();
    assert!(matches!(e, BpuError::March { .. }), "{msg}");
    assert!(
        msg.contains("model.hbm") && msg.contains("nash-e") && msg.contains("nash-m"),
        "{msg}"
    );
    assert_eq!(s.stats().live_packed, 0);
    // The simulated hbDNN refuses it too (for callers that skip the check).
    let rt = hbdnn::Runtime::new(bpu_sim::table().unwrap());
    let err = rt.load(&[d.path().join("model.hbm")]).err().unwrap();
    assert_eq!(err.status(), Some(hbdnn::Status::ModelIncompatible));
    // A platform of another march refuses the S100P package.
    let ok = tempfile::tempdir().unwrap();
    sim_package("tiny-sym", ok.path(), |_| {});
    s.set_march(Some("nash-p".into()));
    let e = open(ok.path(), &BpuOptions::default()).err().unwrap();
    assert!(e.to_string().contains("platform march `nash-p`"), "{e}");
    s.set_march(None);
    open(ok.path(), &BpuOptions::default()).unwrap();
}

#[test]
fn a_padded_tail_matches_stepping() {
    let d = tempfile::tempdir().unwrap();
    sim_package("tiny-sym", d.path(), |o| {
        o.cache_len = 128;
        o.prefill_pads = true;
        o.prefill_min_tail = Some(4);
    });
    let s = sim(SimConfig::default());
    let stepping = BpuOptions {
        no_vision: true,
        prefill_tail: PrefillTail::Stepped,
        ..BpuOptions::default()
    };
    // The default sim layout is pads last.
    let padding = BpuOptions {
        prefill_tail: PrefillTail::PadsLast,
        ..stepping.clone()
    };
    let mut st = open(d.path(), &stepping).unwrap();
    let mut pd = open(d.path(), &padding).unwrap();
    // 9 rows (tail only), 45 rows (one chunk + a 13-row tail), 34 rows (a 2-row tail,
    // shorter than prefill_min_tail: stepped in both).
    let long = golden_case("tiny-sym", "text_long").ids;
    for (ids, padded) in [
        (golden_case("tiny-sym", "text_short").ids, true),
        (long.clone(), true),
        (long[..34].to_vec(), false),
    ] {
        let r0 = s.stats().runs;
        let a = text_then_greedy(&mut st, &ids, 8);
        let r1 = s.stats().runs;
        let b = text_then_greedy(&mut pd, &ids, 8);
        let r2 = s.stats().runs;
        let tail = ids.len() % 32;
        let (stepped_runs, padded_runs) = (r1 - r0, r2 - r1);
        if padded {
            assert_eq!(
                stepped_runs - padded_runs,
                tail as u64 - 1,
                "{} rows: the tail must be one padded run",
                ids.len()
            );
        } else {
            assert_eq!(stepped_runs, padded_runs);
        }
        assert_eq!(st.consumed(), pd.consumed());
        assert_eq!(st.max_pos(), pd.max_pos());
        assert_logits_close(&b, &a, LOGIT_TOL, &format!("{} rows", ids.len()));
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            assert_eq!(argmax(x), argmax(y), "{} rows: step {i}", ids.len());
        }
        // The window after the padded tail is the stepped one: snapshots agree.
        let (sa, sb) = (st.snapshot().unwrap(), pd.snapshot().unwrap());
        assert_eq!(sa.consumed(), sb.consumed());
    }
    // Without `prefill_pads` in the package the option changes nothing.
    let plain = tempfile::tempdir().unwrap();
    sim_package("tiny-sym", plain.path(), |o| o.cache_len = 128);
    let mut p = open(plain.path(), &padding).unwrap();
    let r0 = s.stats().runs;
    text_then_greedy(&mut p, &long, 0);
    assert_eq!(s.stats().runs - r0, 1 + 13);
}

#[test]
fn a_fault_mid_generation_fails_the_request_and_the_next_succeeds() {
    let d = tempfile::tempdir().unwrap();
    sim_package("tiny-sym", d.path(), |o| o.cache_len = 128);
    let s = sim(SimConfig::default());
    let b = open(
        d.path(),
        &BpuOptions {
            no_vision: true,
            ..BpuOptions::default()
        },
    )
    .unwrap();
    let mut e = Engine::new(b, tokenizer());
    let c = golden_case("tiny-sym", "text_long");
    let prompt = prompt_from_ids(&c.ids, u32::MAX, 1).unwrap();
    let go = |e: &mut Engine<BpuBackend>| {
        e.backend_mut().reset().unwrap();
        try_generate_text(e, &prompt, StreamConfig::new(Vec::new(), c.greedy.len()))
    };
    let clean = go(&mut e).unwrap().completion.tokens;
    assert_eq!(clean, c.greedy);
    // The prompt takes 1 + 13 graph runs; fail the 5th decode step.
    s.add_fault(
        FaultRule::new("hbUCPSubmitTask", FaultAction::Status(-200003))
            .after(14 + 4)
            .times(1),
    );
    let err = go(&mut e).err().unwrap();
    assert!(
        matches!(&err, EngineError::Bpu { what, .. } if what == "decode run"),
        "{err}"
    );
    assert_eq!(s.stats().faults_injected, 1);
    let again = go(&mut e).unwrap().completion.tokens;
    assert_eq!(again, clean);
}

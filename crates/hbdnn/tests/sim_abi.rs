//! The wrapper through the function table on the simulator: specs, strides, coherency,
//! faults, pool exhaustion and leak counters.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use bpu_sim::{
    Container, FaultAction, FaultRule, FlushPolicy, GraphDesc, GraphKind, Sim, SimConfig,
    TensorDesc,
};
use hbdnn::{DeviceBuffer, Error, FlushMode, Graph, PackedModel, Runtime, Sched, Status};

const F32: i32 = hbdnn_sys::HB_DNN_TENSOR_TYPE_F32;

/// A graph computing out = 2·in + 1 on a [3,5] f32 tensor; the input reports dense (-1)
/// strides, the output an explicitly padded row pitch of 64 bytes.
fn affine_container(name: &str) -> Container {
    Container {
        header: bpu_sim::container::Header {
            graphs: vec![GraphDesc {
                name: name.into(),
                kind: GraphKind::Affine { mul: 2.0, add: 1.0 },
                inputs: vec![TensorDesc {
                    shape: vec![3, 5],
                    dtype: F32,
                    strides: vec![-1, -1],
                    scale: vec![],
                }],
                outputs: vec![TensorDesc {
                    shape: vec![3, 5],
                    dtype: F32,
                    strides: vec![64, 4],
                    scale: vec![],
                }],
                compile_cores: 1,
            }],
            config: None,
            has_weights: true,
            march: None,
        },
        payload: vec![],
    }
}

struct Fixture {
    _dir: tempfile::TempDir,
    file: PathBuf,
    sim: Sim,
    rt: Runtime,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("affine.hbm");
    affine_container("affine").write(&file).unwrap();
    let sim = Sim::new(SimConfig::default());
    sim.install();
    let rt = Runtime::new(bpu_sim::table().unwrap());
    Fixture {
        _dir: dir,
        file,
        sim,
        rt,
    }
}

fn input_data() -> Vec<f32> {
    (0..15).map(|i| i as f32 * 0.5 - 3.0).collect()
}

fn expected() -> Vec<f32> {
    input_data().iter().map(|v| v * 2.0 + 1.0).collect()
}

fn setup(f: &Fixture) -> (PackedModel, Graph, DeviceBuffer, DeviceBuffer) {
    let m = f.rt.load(&[&f.file]).unwrap();
    let g = m.graph("affine").unwrap();
    let i = g.alloc_input(0).unwrap();
    let o = g.alloc_output(0).unwrap();
    (m, g, i, o)
}

fn run_once(
    g: &Graph,
    i: &mut DeviceBuffer,
    o: &mut DeviceBuffer,
    clean: bool,
    invalidate: bool,
) -> Vec<f32> {
    i.write_tensor(&g.inputs()[0], &input_data()).unwrap();
    if clean {
        i.clean().unwrap();
    }
    g.run(&[i], &mut [o], &Sched::default()).unwrap();
    if invalidate {
        o.invalidate().unwrap();
    }
    o.read_tensor::<f32>(&g.outputs()[0]).unwrap()
}

#[test]
fn versions_and_graph_specs() {
    let f = fixture();
    let v = f.rt.versions();
    assert!(v.dnn.contains("bpu-sim"), "{v:?}");
    let (m, g, _, _) = setup(&f);
    assert_eq!(m.graph_names(), ["affine".to_string()]);
    let i = &g.inputs()[0];
    assert_eq!(i.shape, vec![3, 5]);
    assert_eq!(i.dtype, hbdnn::DType::F32);
    assert_eq!(i.reported_strides, vec![-1, -1]);
    // 5 floats = 20 bytes per row, aligned up to 32.
    assert_eq!(i.strides, vec![32, 4]);
    assert_eq!(i.byte_size, 96);
    let o = &g.outputs()[0];
    assert_eq!(o.strides, vec![64, 4]);
    assert_eq!(o.byte_size, 192);
    assert_eq!(o.row_offset(2), 128);
    assert!(i.scale.is_empty());
}

#[test]
fn run_round_trip_honours_strides() {
    let f = fixture();
    let (_m, g, mut i, mut o) = setup(&f);
    assert_eq!(run_once(&g, &mut i, &mut o, true, true), expected());
    // Row padding stays untouched by typed writes: the pad bytes of row 0 are still zero.
    assert!(i.as_bytes()[20..32].iter().all(|&b| b == 0));
}

#[test]
fn skipped_clean_shows_stale_input() {
    let f = fixture();
    let (_m, g, mut i, mut o) = setup(&f);
    let got = run_once(&g, &mut i, &mut o, false, true);
    // The device still holds the zeros cleaned at allocation: 2·0 + 1.
    assert_eq!(got, vec![1.0; 15]);
    assert_ne!(got, expected());
}

#[test]
fn skipped_invalidate_shows_stale_output() {
    let f = fixture();
    let (_m, g, mut i, mut o) = setup(&f);
    let got = run_once(&g, &mut i, &mut o, true, false);
    assert_eq!(got, vec![0.0; 15]);
    o.invalidate().unwrap();
    assert_eq!(o.read_tensor::<f32>(&g.outputs()[0]).unwrap(), expected());
}

#[test]
fn range_flushes_move_whole_cache_lines() {
    let f = fixture();
    let (_m, g, mut i, mut o) = setup(&f);
    let spec = g.inputs()[0].clone();
    assert_eq!(spec.row_stride(), 32, "two input rows share a 64-byte line");
    i.write_tensor(&spec, &input_data()).unwrap();
    // A CLEAN of one float of row 0 writes its whole line back: rows 0 and 1, not row 2.
    i.clean_range(4, 4).unwrap();
    g.run(&[&i], &mut [&mut o], &Sched::default()).unwrap();
    let ospec = &g.outputs()[0];
    assert_eq!(ospec.row_stride(), 64, "one output row per line");
    // An INVALIDATE of one float of row 1 brings its whole line (row 1) in, not row 0.
    o.invalidate_range(ospec.row_offset(1) + 8, 4).unwrap();
    let got = o.read_tensor::<f32>(ospec).unwrap();
    assert_eq!(
        &got[..5],
        &[0.0; 5],
        "row 0 of the output was not invalidated"
    );
    assert_eq!(&got[5..10], &expected()[5..10], "row 1 came in whole");
    assert_eq!(&got[10..], &[0.0; 5], "row 2 was not invalidated");
    // Bytes the CPU writes and never cleans are lost when a partial INVALIDATE covers their
    // line, as on hardware.
    o.as_mut_bytes()[4..8].copy_from_slice(&9f32.to_le_bytes());
    o.invalidate_range(60, 4).unwrap();
    assert_eq!(o.read_tensor::<f32>(ospec).unwrap()[..5], expected()[..5]);
    let dev = f.sim.device_bytes(i.sys_mem().phyAddr + 64, 20).unwrap();
    assert!(dev.iter().all(|&b| b == 0), "input row 2 was never cleaned");
    assert!(matches!(
        i.clean_range(90, 10),
        Err(Error::OutOfBounds { .. })
    ));
}

/// A library that flushes only whole allocations: the probe finds it, and in whole mode
/// every range flush covers the whole buffer (a range would be refused), with
/// `prepare_write` keeping stale host bytes from overwriting what the device wrote.
#[test]
fn the_flush_probe_and_whole_mode() {
    let f = fixture();
    let p = f.rt.probe_flush().unwrap();
    assert_eq!((p.mode, p.refusal.is_none()), (FlushMode::Range, true));
    assert_eq!(f.rt.flush_mode(), FlushMode::Range, "probing sets nothing");
    let (_m, g, mut i, mut o) = setup(&f);
    f.sim.set_flush(FlushPolicy::Whole);
    let p = f.rt.probe_flush().unwrap();
    assert_eq!(p.mode, FlushMode::Whole);
    let refusal = p.refusal.unwrap();
    assert_eq!(refusal.status(), Some(Status::InvalidArgument), "{refusal}");
    // Range mode on a whole-only library: the range flush fails.
    assert_eq!(
        i.clean_range(4, 4).unwrap_err().status(),
        Some(Status::InvalidArgument)
    );
    f.rt.set_flush_mode(FlushMode::Whole);
    assert_eq!(i.flush_mode(), FlushMode::Whole, "existing buffers follow");
    // A CLEAN "of one float" now writes all three rows back, row 2 included.
    i.write_tensor(&g.inputs()[0], &input_data()).unwrap();
    i.clean_range(4, 4).unwrap();
    g.run(&[&i], &mut [&mut o], &Sched::default()).unwrap();
    let ospec = g.outputs()[0].clone();
    o.invalidate_range(ospec.row_offset(1), 4).unwrap();
    assert_eq!(o.read_tensor::<f32>(&ospec).unwrap(), expected());
    // The BPU writes the output again; the host view of it is now stale. The CPU rewrites
    // row 0 only: without `prepare_write` the whole CLEAN would push the stale rows 1 and 2
    // back over the BPU's (the simulator writes back every line that differs).
    i.write_tensor(&g.inputs()[0], &[1f32; 15]).unwrap();
    i.clean().unwrap();
    g.run(&[&i], &mut [&mut o], &Sched::default()).unwrap();
    o.prepare_write(0, 20).unwrap();
    o.write_rows(0, 0, 5, &[9f32; 5]).unwrap();
    o.clean_range(0, 20).unwrap();
    let dev = f.sim.device_bytes(o.sys_mem().phyAddr, 192).unwrap();
    let row = |r: usize| -> Vec<f32> {
        dev[r * 64..r * 64 + 20]
            .chunks(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect()
    };
    assert_eq!(
        (row(0), row(1), row(2)),
        (vec![9.0; 5], vec![3.0; 5], vec![3.0; 5])
    );
}

#[test]
fn an_eviction_writes_back_what_the_cpu_never_cleaned() {
    let f = fixture();
    let (_m, g, mut i, mut o) = setup(&f);
    let ospec = g.outputs()[0].clone();
    // The CPU scribbles on the output buffer and forgets to CLEAN; the BPU writes the result;
    // the cache then evicts the dirty line over it.
    o.as_mut_bytes()[..4].copy_from_slice(&7f32.to_le_bytes());
    f.sim
        .add_fault(FaultRule::new("hbUCPWaitTaskDone", FaultAction::Evict).times(1));
    let got = run_once(&g, &mut i, &mut o, true, true);
    assert_eq!(got[0], 7.0, "the evicted line overwrote the BPU's row 0");
    assert_eq!(
        &got[1..5],
        &[0.0; 4],
        "the whole line came back, zeros included"
    );
    assert_eq!(&got[5..], &expected()[5..]);
    assert_eq!(f.sim.stats().faults_injected, 1);
    // Input bytes written and never cleaned reach the BPU once evicted before the run.
    i.write_tensor(&g.inputs()[0], &[0f32; 15]).unwrap();
    i.clean().unwrap();
    i.write_tensor(&g.inputs()[0], &input_data()).unwrap();
    assert_eq!(f.sim.evict(), 2, "the input's two lines");
    g.run(&[&i], &mut [&mut o], &Sched::default()).unwrap();
    o.invalidate().unwrap();
    assert_eq!(o.read_tensor::<f32>(&ospec).unwrap(), expected());
    assert_eq!(f.sim.evict(), 0, "nothing is dirty after an INVALIDATE");
}

#[test]
fn a_table_without_the_optional_entries_runs_with_fallback_texts() {
    let mut raw = bpu_sim::ffi::raw_table();
    raw.hbDNNGetErrorDesc = None;
    raw.hbDNNGetInputName = None;
    raw.hbDNNGetOutputName = None;
    raw.hbUCPGetSocName = None;
    let table = hbdnn_sys::FnTable::from_raw(raw, "bpu-sim, optional entries removed").unwrap();
    let f = fixture();
    let rt = Runtime::new(table);
    assert!(
        rt.versions().soc.contains("no hbUCPGetSocName"),
        "{:?}",
        rt.versions()
    );
    assert!(rt.describe(-400001).contains("ION"));
    let m = rt.load(&[&f.file]).unwrap();
    let g = m.graph("affine").unwrap();
    let (mut i, mut o) = (g.alloc_input(0).unwrap(), g.alloc_output(0).unwrap());
    assert_eq!(run_once(&g, &mut i, &mut o, true, true), expected());
}

#[test]
fn fresh_allocations_are_zeroed_on_both_sides() {
    let f = fixture();
    let b = f.rt.alloc(100).unwrap();
    assert!(b.as_bytes().iter().all(|&x| x == 0));
    let dev = f.sim.device_bytes(b.sys_mem().phyAddr, 100).unwrap();
    assert!(
        dev.iter().all(|&x| x == 0),
        "allocation must be cleaned after zeroing"
    );
}

#[test]
fn wrapper_errors_for_misuse() {
    let f = fixture();
    let (m, g, i, mut o) = setup(&f);
    match m.graph("nope") {
        Err(Error::GraphNotFound { available, .. }) => {
            assert_eq!(available, vec!["affine".to_string()])
        }
        other => panic!("{other:?}"),
    }
    let small = f.rt.alloc(8).unwrap();
    assert!(matches!(
        g.run(&[&small], &mut [&mut o], &Sched::default()),
        Err(Error::BufferTooSmall {
            index: 0,
            need: 96,
            ..
        })
    ));
    assert!(matches!(
        g.run(&[&i, &i], &mut [&mut o], &Sched::default()),
        Err(Error::BufferCount { .. })
    ));
    let bad = Sched {
        priority: 0,
        core_mask: 1 << 3,
        timeout_ms: 0,
    };
    let e = g.run(&[&i], &mut [&mut o], &bad).unwrap_err();
    assert_eq!(e.status(), Some(Status::InvalidArgument), "{e}");
    assert!(e.to_string().contains("hbUCPSubmitTask"), "{e}");
    drop((i, o, small, g, m));
    assert_eq!(f.sim.stats().live_tasks, 0);
    assert_eq!(f.sim.stats().live_buffers, 0);
}

#[test]
fn missing_file_and_foreign_file_fail_naming_them() {
    let f = fixture();
    let missing = f.file.with_file_name("missing.hbm");
    let e = f.rt.load(&[&missing]).unwrap_err();
    assert_eq!(e.status(), Some(Status::FileOpenFailed));
    assert!(e.to_string().contains("missing.hbm"), "{e}");
    let foreign = f.file.with_file_name("foreign.hbm");
    std::fs::write(&foreign, vec![7u8; 8192]).unwrap();
    let e = f.rt.load(&[&foreign]).unwrap_err();
    assert_eq!(e.status(), Some(Status::ModelInvalid));
    assert!(e.to_string().contains("foreign.hbm"), "{e}");
    assert_eq!(f.sim.stats().live_packed, 0);
}

fn check_fault(f: &Fixture, call: &str, action: FaultAction, sched: Sched, want: Status) {
    let base = f.sim.stats();
    {
        let (_m, g, mut i, mut o) = setup(f);
        f.sim
            .add_fault(FaultRule::new(call, action.clone()).times(1));
        let res = (|| -> Result<(), Error> {
            i.write_tensor(&g.inputs()[0], &input_data())?;
            i.clean()?;
            g.run(&[&i], &mut [&mut o], &sched)?;
            o.invalidate()
        })();
        let e = res.expect_err(call);
        assert_eq!(e.status(), Some(want), "{call} {action:?}: {e}");
        assert_eq!(f.sim.stats().live_tasks, 0, "{call}: task leaked");
        // The wrapper stays usable: the next run succeeds.
        assert_eq!(
            run_once(&g, &mut i, &mut o, true, true),
            expected(),
            "{call}"
        );
    }
    let after = f.sim.stats();
    assert_eq!(
        (
            after.live_buffers,
            after.live_tasks,
            after.live_packed,
            after.pool_used
        ),
        (
            base.live_buffers,
            base.live_tasks,
            base.live_packed,
            base.pool_used
        ),
        "{call}: leak"
    );
}

#[test]
fn every_fault_surfaces_typed_and_leaves_the_wrapper_usable() {
    let f = fixture();
    let d = Sched::default();
    check_fault(
        &f,
        "hbDNNInferV2",
        FaultAction::Status(-200003),
        d,
        Status::RunFailed,
    );
    check_fault(
        &f,
        "hbUCPSubmitTask",
        FaultAction::Status(-200001),
        d,
        Status::TaskNumberExceedLimit,
    );
    check_fault(
        &f,
        "hbUCPWaitTaskDone",
        FaultAction::Status(-200003),
        d,
        Status::RunFailed,
    );
    check_fault(
        &f,
        "hbUCPMemFlush",
        FaultAction::Status(-400003),
        d,
        Status::MemFlushFail,
    );
    check_fault(
        &f,
        "hbUCPSubmitTask",
        FaultAction::Panic,
        d,
        Status::UnknownError,
    );
    assert!(f.sim.stats().faults_injected >= 5);
}

/// A timed-out task may still be running on the BPU: it is never released, no buffer or
/// model it may touch is freed, and the runtime refuses every further run.
#[test]
fn a_timed_out_task_wedges_the_runtime_and_nothing_it_may_touch_is_released() {
    let timed = Sched {
        timeout_ms: 20,
        ..Sched::default()
    };
    let slow = FaultAction::Slow(Duration::from_millis(300));
    for (call, action, sched) in [
        ("hbUCPWaitTaskDone", FaultAction::Timeout, Sched::default()),
        // A slow task against a wait limit is a real timeout, whether the task was made slow
        // at submit or the wait itself hangs.
        ("hbUCPSubmitTask", slow.clone(), timed),
        ("hbUCPWaitTaskDone", slow.clone(), timed),
    ] {
        let f = fixture();
        let (m, g, mut i, mut o) = setup(&f);
        let held = f.sim.stats();
        f.sim
            .add_fault(FaultRule::new(call, action.clone()).times(1));
        i.write_tensor(&g.inputs()[0], &input_data()).unwrap();
        i.clean().unwrap();
        let e = g.run(&[&i], &mut [&mut o], &sched).unwrap_err();
        assert_eq!(e.status(), Some(Status::Timeout), "{call} {action:?}: {e}");
        assert!(f.rt.is_wedged(), "{call}");
        assert_eq!(f.sim.stats().live_tasks, 1, "{call}: the task was released");
        let runs = f.sim.stats().runs;
        let again = g.run(&[&i], &mut [&mut o], &Sched::default()).unwrap_err();
        assert!(matches!(again, Error::Wedged), "{call}: {again}");
        assert_eq!(
            f.sim.stats().runs,
            runs,
            "{call}: a graph ran after the timeout"
        );
        drop((i, o, g, m));
        let after = f.sim.stats();
        assert_eq!(
            (after.live_buffers, after.live_packed, after.live_tasks),
            (held.live_buffers, held.live_packed, 1),
            "{call}: something the task may touch was released"
        );
    }
}

#[test]
fn release_failure_after_a_successful_run_is_only_a_warning() {
    let f = fixture();
    let (_m, g, mut i, mut o) = setup(&f);
    f.sim
        .add_fault(FaultRule::new("hbUCPReleaseTask", FaultAction::Status(-200004)).times(1));
    // The run's results stand.
    assert_eq!(run_once(&g, &mut i, &mut o, true, true), expected());
    assert_eq!(f.sim.stats().faults_injected, 1);
    // The injected failure left the task in the simulator: it is counted, not hidden.
    assert_eq!(f.sim.stats().live_tasks, 1);
    // A failed run still releases its task, and still fails.
    f.sim
        .add_fault(FaultRule::new("hbUCPSubmitTask", FaultAction::Status(-200003)).times(1));
    let e = g.run(&[&i], &mut [&mut o], &Sched::default()).unwrap_err();
    assert_eq!(e.status(), Some(Status::RunFailed));
    assert_eq!(f.sim.stats().live_tasks, 1);
}

#[test]
fn allocation_and_load_faults() {
    let f = fixture();
    f.sim
        .add_fault(FaultRule::new("hbUCPMallocCached", FaultAction::AllocFail).times(1));
    let e = f.rt.alloc(64).unwrap_err();
    assert_eq!(e.status(), Some(Status::MemAllocFail));
    f.rt.alloc(64).unwrap();
    f.sim.add_fault(
        FaultRule::new("hbDNNInitializeFromFiles", FaultAction::Status(-600004)).times(1),
    );
    let e = f.rt.load(&[&f.file]).unwrap_err();
    assert!(matches!(e, Error::Load { .. }));
    assert_eq!(e.status(), Some(Status::ModelIncompatible));
    f.rt.load(&[&f.file]).unwrap();
    assert_eq!(f.sim.stats().live_packed, 0);
}

#[test]
fn pool_exhaustion_fails_allocation_and_load() {
    let f = fixture();
    let model_size = std::fs::metadata(&f.file).unwrap().len();
    f.sim.set_pool(Some(model_size + 300));
    let (m, g, i, o) = setup(&f); // 96 + 192 bytes of buffers fit
    let e = f.rt.alloc(100).unwrap_err();
    assert_eq!(e.status(), Some(Status::MemAllocFail), "{e}");
    // A second copy of the model does not fit either.
    let e = f.rt.load(&[&f.file]).unwrap_err();
    assert_eq!(e.status(), Some(Status::MemAllocFail), "{e}");
    drop((i, o));
    let b = f.rt.alloc(290).unwrap();
    drop((b, g, m));
    assert_eq!(f.sim.stats().pool_used, 0);
    assert_eq!(f.sim.stats().live_buffers, 0);
}

#[test]
fn packed_handle_outlives_its_buffers() {
    let f = fixture();
    let (m, g, i, o) = setup(&f);
    drop((m, g));
    // Buffers keep the packed handle alive: it is released only after them.
    assert_eq!(f.sim.stats().live_packed, 1);
    drop(i);
    assert_eq!(f.sim.stats().live_packed, 1);
    drop(o);
    assert_eq!(f.sim.stats().live_packed, 0);
}

#[test]
fn many_runs_leave_no_tasks() {
    let f = fixture();
    let (_m, g, mut i, mut o) = setup(&f);
    for _ in 0..50 {
        run_once(&g, &mut i, &mut o, true, true);
    }
    let s = f.sim.stats();
    assert_eq!(s.live_tasks, 0);
    assert_eq!(s.runs, 50);
}

#[test]
fn timing_model_sleeps() {
    let f = fixture();
    let _ = Path::new("");
    let (_m, g, mut i, mut o) = setup(&f);
    f.sim.add_fault(
        FaultRule::new(
            "hbUCPSubmitTask",
            FaultAction::Slow(Duration::from_millis(60)),
        )
        .times(1),
    );
    let t0 = std::time::Instant::now();
    run_once(&g, &mut i, &mut o, true, true);
    assert!(t0.elapsed() >= Duration::from_millis(60));
}

//! The step-by-step probe of a package (`vlm probe`): the first thing to run on a new board.
//!
//! Each step does one thing the runtime does when it opens and runs a package — read the
//! manifest, take the engine lock, open the libraries, resolve and call their entry points,
//! load each `.hbm`, read every graph's tensors, flush a scratch buffer whole and by range,
//! run the decode, prefill and tower graphs once — and reports before and after it through
//! a [`StepLog`]. The caller writes those reports to disk before each step runs, so when a
//! vendor library crashes the process (a segfault in a load or a graph call), the last start
//! on disk names the step that did it.
//!
//! The graph calls bind zero-filled buffers (what an allocation starts as): the outputs mean
//! nothing; what counts is that the call returns. Steps that do not apply to a package (no
//! prefill graph, no `visual.hbm`, `--no-vision`) are left out, not skipped.

use std::path::{Path, PathBuf};
use std::time::Instant;

use bpu_sim::Implementation;
use hbdnn::{DeviceBuffer, Error as DnnError, FnTable, Graph, PackedModel, Runtime, Sched};
use serde_json::Value;

use vlm::package::{LoadOptions, ModelConfig};

use crate::check::GraphReport;
use crate::report::graph_entry;
use crate::{lock, open, tower, BpuOptions, EngineLock, RuntimeInfo};

/// Bytes of the scratch buffer of the flush steps: a few pages, like a small tensor.
const SCRATCH_BYTES: usize = 64 * 1024;
/// The range flushed by `flush_range`: one page in, a few cache lines long, like the rows
/// of a prompt written into a larger input.
const RANGE_OFFSET: usize = 4096;
const RANGE_LEN: usize = 256;

/// What one step found.
#[derive(Debug, Clone)]
pub struct StepOutcome {
    pub pass: bool,
    /// One or a few lines for a person.
    pub detail: String,
    /// Structured data for tools (the `graphs` step: every graph's tensors).
    pub data: Option<Value>,
}

impl StepOutcome {
    fn ok(detail: impl Into<String>) -> Self {
        Self {
            pass: true,
            detail: detail.into(),
            data: None,
        }
    }

    fn fail(detail: impl Into<String>) -> Self {
        Self {
            pass: false,
            detail: detail.into(),
            data: None,
        }
    }
}

/// Where the probe reports. `start` must have reached stable storage when it returns: the
/// step runs right after it, and may take the process down.
pub trait StepLog {
    fn start(&mut self, step: &str) -> std::io::Result<()>;
    fn end(&mut self, step: &str, outcome: &StepOutcome, ms: f64) -> std::io::Result<()>;
}

/// Runs `f` as step `name`: its start reported first, then its outcome and time.
fn step<T>(
    log: &mut dyn StepLog,
    passed: &mut bool,
    name: &str,
    f: impl FnOnce() -> Result<(T, StepOutcome), StepOutcome>,
) -> std::io::Result<Option<T>> {
    log.start(name)?;
    let t0 = Instant::now();
    let (value, outcome) = match f() {
        Ok((v, o)) => (Some(v), o),
        Err(o) => (None, o),
    };
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    *passed &= outcome.pass;
    log.end(name, &outcome, ms)?;
    Ok(value.filter(|_| outcome.pass))
}

/// The package as the probe sees it after the `manifest` step.
struct Package {
    cfg: ModelConfig,
    files: Vec<PathBuf>,
    implementation: Implementation,
}

/// Probes the package in `dir` (vision unless `opts.no_vision`), reporting every step to
/// `log`. `Ok(true)` when every step that ran passed; `Err` only when `log` cannot write.
pub fn run(dir: &Path, opts: &BpuOptions, log: &mut dyn StepLog) -> std::io::Result<bool> {
    let mut passed = true;
    let Some(pkg) = step(log, &mut passed, "manifest", || manifest(dir, opts))? else {
        return Ok(false);
    };
    let Some(_lock) = step(log, &mut passed, "lock", || engine_lock(&pkg, opts))? else {
        return Ok(false);
    };
    let Some(table) = step(log, &mut passed, "libraries", || libraries(&pkg, opts))? else {
        return Ok(false);
    };
    let Some(rt) = step(log, &mut passed, "symbols", || Ok(symbols(table)))? else {
        return Ok(false);
    };
    let mut models: Vec<(PathBuf, PackedModel)> = Vec::new();
    for f in &pkg.files {
        let name = format!("load:{}", file_name(f));
        if let Some(m) = step(log, &mut passed, &name, || load(&rt, f))? {
            models.push((f.clone(), m));
        }
    }
    step(log, &mut passed, "graphs", || {
        Ok(((), graphs(&pkg, &models)))
    })?;
    step(log, &mut passed, "flush_whole", || {
        Ok(((), flush_whole(&rt)))
    })?;
    step(log, &mut passed, "flush_range", || {
        Ok(((), flush_range(&rt)))
    })?;
    let sched = sched(&pkg.cfg, opts);
    for (name, graph) in graph_calls(&pkg, opts, &models) {
        step(log, &mut passed, name, || Ok(((), call(graph, &sched))))?;
    }
    Ok(passed)
}

fn file_name(p: &Path) -> String {
    p.file_name().map_or_else(
        || p.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

fn manifest(dir: &Path, opts: &BpuOptions) -> Result<(Package, StepOutcome), StepOutcome> {
    let load = LoadOptions {
        vision: !opts.no_vision,
    };
    let cfg = ModelConfig::load(dir, load).map_err(|e| StepOutcome::fail(e.to_string()))?;
    let mut files = open::hbm_files(&cfg);
    if opts.no_prefill_graph {
        // As an open backend: a separate prefill `.hbm` is not loaded at all.
        let pre = cfg.existing_hbm_prefill().map(Path::to_owned);
        files.retain(|f| Some(f) != pre.as_ref());
    }
    let implementation = bpu_sim::inspect_package(&files, opts.implementation)
        .map_err(|e| StepOutcome::fail(e.to_string()))?;
    let listed: Vec<String> = files
        .iter()
        .map(|f| {
            let bytes = std::fs::metadata(f).map_or(0, |m| m.len());
            format!("{} ({bytes} bytes)", file_name(f))
        })
        .collect();
    let detail = format!(
        "package {:?}, {implementation} files: {}; decode graph `{}`, prefill graph `{}`",
        cfg.name,
        listed.join(", "),
        cfg.graph,
        cfg.prefill_graph()
    );
    let pkg = Package {
        cfg,
        files,
        implementation,
    };
    Ok((pkg, StepOutcome::ok(detail)))
}

fn engine_lock(
    pkg: &Package,
    opts: &BpuOptions,
) -> Result<(Option<EngineLock>, StepOutcome), StepOutcome> {
    let l = lock::acquire_for(pkg.implementation, opts.lock_path.as_deref())
        .map_err(|e| StepOutcome::fail(e.to_string()))?;
    let detail = match &l {
        Some(l) => format!("engine lock held: {}", l.path().display()),
        None => "no engine lock (a simulator package locks only when asked)".to_owned(),
    };
    Ok((l, StepOutcome::ok(detail)))
}

fn libraries(pkg: &Package, opts: &BpuOptions) -> Result<(FnTable, StepOutcome), StepOutcome> {
    let table = match pkg.implementation {
        Implementation::Sim => bpu_sim::table().map_err(|e| e.to_string()),
        Implementation::Board => {
            FnTable::load_board(opts.lib_dir.as_deref()).map_err(|e| e.to_string())
        }
    }
    .map_err(StepOutcome::fail)?;
    let detail = match table.source() {
        hbdnn::TableSource::Board { lib_dir } => format!(
            "{} and {} in {}: every required entry point resolved",
            hbdnn::LIBDNN,
            hbdnn::LIBHBUCP,
            lib_dir.display()
        ),
        other => format!("{other} (in-process simulator): every required entry point set"),
    };
    Ok((table, StepOutcome::ok(detail)))
}

/// The first calls into the libraries: the version getters (and the optional entry points
/// that are missing, whose fallbacks are then in use).
fn symbols(table: FnTable) -> (Runtime, StepOutcome) {
    let rt = Runtime::new(table);
    let info = RuntimeInfo::of(&rt);
    let missing = if info.missing_entry_points.is_empty() {
        "none".to_owned()
    } else {
        info.missing_entry_points.join(", ")
    };
    let detail = format!(
        "hbDNN {}, hbUCP {}, SoC {}; optional entry points missing: {missing}",
        info.dnn_version, info.ucp_version, info.soc
    );
    (rt, StepOutcome::ok(detail))
}

fn load(rt: &Runtime, f: &Path) -> Result<(PackedModel, StepOutcome), StepOutcome> {
    let m = rt
        .load(&[f])
        .map_err(|e| StepOutcome::fail(e.to_string()))?;
    let detail = format!("graphs {:?}", m.graph_names());
    Ok((m, StepOutcome::ok(detail)))
}

/// Every graph's inputs and outputs as the runtime reports them, in the form of
/// `vlm check --report` (the `data` of the step).
fn graphs(pkg: &Package, models: &[(PathBuf, PackedModel)]) -> StepOutcome {
    let mut entries = Vec::new();
    let mut lines = Vec::new();
    let mut errors = Vec::new();
    for (file, m) in models {
        for name in m.graph_names() {
            let g = match m.graph(name) {
                Ok(g) => g,
                Err(e) => {
                    errors.push(format!("{} graph `{name}`: {e}", file_name(file)));
                    continue;
                }
            };
            let r = GraphReport {
                file: file.clone(),
                name: name.clone(),
                inputs: g.inputs().to_vec(),
                outputs: g.outputs().to_vec(),
            };
            lines.push(format!(
                "`{name}` in {}: {} inputs {}; {} outputs {}",
                file_name(file),
                r.inputs.len(),
                tensors(&r.inputs),
                r.outputs.len(),
                tensors(&r.outputs)
            ));
            entries.push(graph_entry(&r, Some(&pkg.cfg)));
        }
    }
    let mut outcome = if errors.is_empty() {
        StepOutcome::ok(lines.join("\n"))
    } else {
        StepOutcome::fail(errors.join("; "))
    };
    outcome.data = serde_json::to_value(&entries).ok();
    outcome
}

fn tensors(specs: &[hbdnn::TensorSpec]) -> String {
    let each: Vec<String> = specs
        .iter()
        .map(|t| {
            format!(
                "{:?} {:?} strides {:?} ({} bytes)",
                t.shape, t.dtype, t.reported_strides, t.byte_size
            )
        })
        .collect();
    format!("[{}]", each.join(", "))
}

/// A pattern no allocation starts with, to see that the host view survives the flushes.
fn fill_pattern(buf: &mut DeviceBuffer) {
    for (i, b) in buf.as_mut_bytes().iter_mut().enumerate() {
        *b = (i % 251) as u8 ^ 0x5a;
    }
}

fn pattern_intact(buf: &DeviceBuffer) -> bool {
    buf.as_bytes()
        .iter()
        .enumerate()
        .all(|(i, &b)| b == (i % 251) as u8 ^ 0x5a)
}

fn flush_whole(rt: &Runtime) -> StepOutcome {
    let mut buf = match rt.alloc(SCRATCH_BYTES) {
        Ok(b) => b,
        Err(e) => return StepOutcome::fail(format!("scratch allocation: {e}")),
    };
    fill_pattern(&mut buf);
    if let Err(e) = buf.clean() {
        return StepOutcome::fail(format!("CLEAN of the whole scratch buffer: {e}"));
    }
    if let Err(e) = buf.invalidate() {
        return StepOutcome::fail(format!("INVALIDATE of the whole scratch buffer: {e}"));
    }
    if !pattern_intact(&buf) {
        return StepOutcome::fail(
            "CLEAN then INVALIDATE of the whole scratch buffer changed its bytes",
        );
    }
    StepOutcome::ok(format!(
        "CLEAN and INVALIDATE of a whole {SCRATCH_BYTES}-byte buffer returned 0; its bytes \
         read back unchanged"
    ))
}

fn flush_range(rt: &Runtime) -> StepOutcome {
    let mut buf = match rt.alloc(SCRATCH_BYTES) {
        Ok(b) => b,
        Err(e) => return StepOutcome::fail(format!("scratch allocation: {e}")),
    };
    fill_pattern(&mut buf);
    let range =
        format!("{RANGE_LEN} bytes at offset {RANGE_OFFSET} of a {SCRATCH_BYTES}-byte buffer");
    let flushed = buf
        .clean_range(RANGE_OFFSET, RANGE_LEN)
        .map(|()| "CLEAN")
        .and_then(|_| {
            buf.invalidate_range(RANGE_OFFSET, RANGE_LEN)
                .map(|()| "INVALIDATE")
        });
    range_outcome(flushed.map(|_| pattern_intact(&buf)), &range)
}

/// The `flush_range` verdict from the flushes' result (`Ok(bytes intact)`).
fn range_outcome(flushed: Result<bool, DnnError>, range: &str) -> StepOutcome {
    match flushed {
        Ok(true) => StepOutcome::ok(format!(
            "CLEAN and INVALIDATE of {range} returned 0; its bytes read back unchanged"
        )),
        Ok(false) => StepOutcome::fail(format!(
            "CLEAN then INVALIDATE of {range} changed the buffer's bytes"
        )),
        // The runtime says no to a sub-range: a finding about this board's library, which
        // the node can live with by flushing whole allocations.
        Err(DnnError::Call { status, call, .. }) => StepOutcome::ok(format!(
            "range flush refused by the runtime (status {}): the node will flush whole \
             allocations ({call} on {range})",
            status.code()
        )),
        Err(e) => StepOutcome::fail(format!("flush of {range}: {e}")),
    }
}

/// Scheduling as an open backend runs its graphs.
fn sched(cfg: &ModelConfig, opts: &BpuOptions) -> Sched {
    Sched {
        priority: opts.priority,
        core_mask: Sched::cores(cfg.bpu_cores),
        // At least 1 ms: 0 would mean "wait forever" to hbUCP.
        timeout_ms: i32::try_from(opts.timeout.as_millis())
            .unwrap_or(i32::MAX)
            .max(1),
    }
}

/// The graph calls that apply, in order: `decode`, `prefill` (when the package has a
/// prefill graph the runtime would use), `tower` (when `visual.hbm` was loaded). A graph
/// whose file did not load, or that cannot be opened, is a failed call, not a left-out one.
fn graph_calls<'a>(
    pkg: &Package,
    opts: &BpuOptions,
    models: &'a [(PathBuf, PackedModel)],
) -> Vec<(&'static str, Result<Graph, String>)> {
    let find = |file: &Path| models.iter().find(|(p, _)| p == file).map(|(_, m)| m);
    let not_loaded = |file: &Path| format!("not run: {} did not load", file_name(file));
    let open = |m: &'a PackedModel, name: &str| m.graph(name).map_err(|e| e.to_string());
    let cfg = &pkg.cfg;
    let mut calls = Vec::new();
    let main = find(&cfg.hbm);
    calls.push((
        "decode",
        main.ok_or_else(|| not_loaded(&cfg.hbm))
            .and_then(|m| open(m, &cfg.graph)),
    ));
    if !opts.no_prefill_graph {
        // The holder the runtime would use: the separate prefill file when it has the graph,
        // else the main file when it has it; a separate file that did not load is a failure.
        let pre = cfg.prefill_graph();
        let separate = cfg.existing_hbm_prefill();
        let holder = separate
            .and_then(find)
            .filter(|m| m.has_graph(&pre))
            .or_else(|| main.filter(|m| m.has_graph(&pre)));
        match (holder, separate) {
            (Some(m), _) => calls.push(("prefill", open(m, &pre))),
            (None, Some(p)) if find(p).is_none() => calls.push(("prefill", Err(not_loaded(p)))),
            (None, _) => {}
        }
    }
    if let Some(vp) = &cfg.visual {
        let g = find(vp)
            .ok_or_else(|| not_loaded(vp))
            .and_then(|m| tower::graph_name(m).and_then(|n| open(m, &n)));
        calls.push(("tower", g));
    }
    calls
}

/// One call of `graph` with zero-filled inputs and outputs; the buffers are freed before
/// the next call, so the probe never holds more than one graph's I/O.
fn call(graph: Result<Graph, String>, sched: &Sched) -> StepOutcome {
    let g = match graph {
        Ok(g) => g,
        Err(reason) => return StepOutcome::fail(reason),
    };
    let alloc = || -> Result<(Vec<DeviceBuffer>, Vec<DeviceBuffer>), DnnError> {
        let ins = (0..g.inputs().len())
            .map(|i| g.alloc_input(i))
            .collect::<Result<Vec<_>, _>>()?;
        let outs = (0..g.outputs().len())
            .map(|i| g.alloc_output(i))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((ins, outs))
    };
    let (ins, mut outs) = match alloc() {
        Ok(b) => b,
        Err(e) => return StepOutcome::fail(format!("graph `{}`: buffers: {e}", g.name())),
    };
    let bytes: usize = ins.iter().chain(&outs).map(DeviceBuffer::size).sum();
    let in_refs: Vec<&DeviceBuffer> = ins.iter().collect();
    let mut out_refs: Vec<&mut DeviceBuffer> = outs.iter_mut().collect();
    let t0 = Instant::now();
    if let Err(e) = g.run(&in_refs, &mut out_refs, sched) {
        return StepOutcome::fail(format!("graph `{}`: {e}", g.name()));
    }
    let run_ms = t0.elapsed().as_secs_f64() * 1e3;
    for (i, b) in outs.iter_mut().enumerate() {
        if let Err(e) = b.invalidate() {
            return StepOutcome::fail(format!("graph `{}`: output {i}: {e}", g.name()));
        }
    }
    StepOutcome::ok(format!(
        "graph `{}`: one call with zero-filled inputs returned in {run_ms:.1} ms ({} inputs, \
         {} outputs, {bytes} bytes of buffers)",
        g.name(),
        ins.len(),
        outs.len()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_range_flush_is_a_finding_not_a_failure() {
        let refused = DnnError::Call {
            call: "hbUCPMemFlush(CLEAN)",
            status: hbdnn::Status::MemFlushFail,
            description: "range not supported".into(),
        };
        let code = hbdnn::Status::MemFlushFail.code();
        let o = range_outcome(Err(refused), "256 bytes");
        assert!(o.pass);
        assert!(
            o.detail.starts_with(&format!(
                "range flush refused by the runtime (status {code}): the node will flush whole \
                 allocations"
            )),
            "{}",
            o.detail
        );
        let out_of_bounds = DnnError::OutOfBounds {
            what: "flush range",
            offset: 1,
            len: 2,
            size: 0,
        };
        assert!(!range_outcome(Err(out_of_bounds), "x").pass);
        assert!(range_outcome(Ok(true), "x").pass);
        assert!(!range_outcome(Ok(false), "x").pass);
    }
}

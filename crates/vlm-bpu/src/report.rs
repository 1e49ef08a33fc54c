//! `vlm check --report`: what someone holding a board needs to see of a package before the
//! first run, in one place — the libraries and their versions, the SoC, every graph's inputs
//! and outputs as the runtime reports them (names, shapes, types, strides, sizes,
//! quantisation) and the file that supplied it, the `ion*` reserved-memory nodes and the pool
//! preflight's numbers, the prompt-tail decision and every contract violation.
//!
//! Built on [`crate::check::check_package`]; the tail decision comes from the same plan and
//! cache as an open backend, and only a package that needs a calibration and has none cached
//! is opened (which calibrates and caches, as the first real start would).

use std::path::{Path, PathBuf};

use bpu_sim::Implementation;
use hbdnn::{Runtime, TensorSpec};
use serde::Serialize;

use vlm::package::ModelConfig;

use crate::check::{check_package, CheckReport, GraphReport};
use crate::contract::FIXED_IN;
use crate::tail::{plan, PadLayout, PadMask, PadRope, Plan, TailDecision, TailMode};
use crate::{pool, tail_cache, BpuBackend, BpuOptions, RuntimeInfo};

/// Everything `vlm check --report` shows.
#[derive(Debug, Clone, Serialize)]
pub struct PackageReport {
    pub package: PathBuf,
    /// `sim` or `board`, when the package's files say.
    pub implementation: Option<String>,
    pub runtime: Option<RuntimeInfo>,
    /// Why the runtime could not be opened.
    pub runtime_error: Option<String>,
    pub manifest: Option<Manifest>,
    pub files: Vec<FileEntry>,
    pub graphs: Vec<GraphEntry>,
    /// Rows per prefill chunk when a compatible prefill graph exists.
    pub prefill_chunk: Option<usize>,
    pub memory: Option<Memory>,
    /// `stepped`, `pads_first` or `pads_last`.
    pub prefill_tail: TailMode,
    /// The pads' rope, `identity` (cos 1, sin 0) or `zero` (cos 0, sin 0); null when stepped.
    pub pad_rope: Option<PadRope>,
    /// The pads' mask row, `masked` (every column) or `self` (only its own slot open); null
    /// when stepped.
    pub pad_mask: Option<PadMask>,
    /// Every trial of the calibration behind the decision (also a cached one), in the order
    /// run; empty when no calibration was needed (stepped by the package or the request, or
    /// a forced layout).
    pub calibration_trials: Vec<TrialEntry>,
    pub prefill_tail_decision: TailDecision,
    pub violations: Vec<String>,
    /// What does not stop the package but a board owner should know (a pool that looks too
    /// small under `--pool-check warn`, a prefill cache's different `alignedByteSize`).
    pub warnings: Vec<String>,
    /// `range` when the runtime accepted a CLEAN and an INVALIDATE of part of an allocation
    /// (probed on a scratch buffer), `whole` when it refused; what was found, whatever
    /// `--flush` asks. `None` without a runtime.
    pub flush: Option<String>,
}

/// The `model.json` keys a board user checks first.
#[derive(Debug, Clone, Serialize)]
pub struct Manifest {
    pub name: String,
    pub graph: String,
    pub prefill_graph: String,
    pub cache_len: u32,
    pub bpu_cores: u32,
    pub prefill_pads: bool,
    pub prefill_min_tail: Option<u32>,
    pub eos: Vec<u32>,
    pub vision: bool,
}

/// One calibration trial: a pad marking against stepping.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TrialEntry {
    /// `first` or `last`.
    pub layout: PadLayout,
    pub rope: PadRope,
    pub mask: PadMask,
    /// Centred cosine of the logits against stepping: the next token, one decode step later
    /// (null where the run failed).
    pub cosine: [Option<f32>; 2],
    /// The top-1 token agrees with stepping at both steps.
    pub top1_agree: bool,
    /// This marking is the decision.
    pub chosen: bool,
}

/// The trials of `d`'s calibration, the decided one marked.
pub fn trial_entries(d: &TailDecision) -> Vec<TrialEntry> {
    let decided = d.marking();
    d.calibration
        .iter()
        .flat_map(|c| &c.trials)
        .map(|t| TrialEntry {
            layout: t.marking.layout,
            rope: t.marking.rope,
            mask: t.marking.mask,
            cosine: [t.cos_next, t.cos_step],
            top1_agree: t.top1_agree,
            chosen: decided == Some(t.marking),
        })
        .collect()
}

/// One `.hbm` file and the graphs it supplied.
#[derive(Debug, Clone, Serialize)]
pub struct FileEntry {
    pub path: PathBuf,
    pub bytes: u64,
    pub graphs: Vec<String>,
}

/// One graph.
#[derive(Debug, Clone, Serialize)]
pub struct GraphEntry {
    pub name: String,
    pub file: PathBuf,
    pub inputs: Vec<TensorEntry>,
    pub outputs: Vec<TensorEntry>,
}

/// One tensor as the runtime reports it.
#[derive(Debug, Clone, Serialize)]
pub struct TensorEntry {
    pub index: usize,
    /// `None` when the library has no name getter.
    pub name: Option<String>,
    /// What the runtime binds here by the contract's index order (`x`, `cos`, `sin`, `mask`,
    /// `cache 3`, `logits`, `patches`, `embeddings`); `None` for a graph it does not use.
    pub role: Option<String>,
    pub shape: Vec<usize>,
    pub tensor_type: String,
    /// As reported (`-1` = the runtime picks).
    pub strides_reported: Vec<i64>,
    /// As used (`-1` resolved with 32-byte alignment).
    pub strides: Vec<usize>,
    /// `alignedByteSize` as reported (≤ 0: none).
    pub aligned_byte_size: i64,
    /// Bytes a buffer is allocated with.
    pub buffer_bytes: usize,
    /// `quantiType` (`none`, `scale`, or the number).
    pub quanti_type: String,
    pub scale_len: usize,
    pub quantize_axis: i32,
    /// The scale when there is exactly one.
    pub scale: Option<f32>,
    pub zero_point_len: usize,
}

impl TensorEntry {
    fn of(index: usize, t: &TensorSpec, role: Option<String>) -> Self {
        Self {
            index,
            name: t.name.clone(),
            role,
            shape: t.shape.clone(),
            tensor_type: format!("{:?}", t.dtype),
            strides_reported: t.reported_strides.clone(),
            strides: t.strides.clone(),
            aligned_byte_size: t.reported_aligned_byte_size,
            buffer_bytes: t.byte_size,
            quanti_type: match t.quanti_type {
                0 => "none".into(),
                1 => "scale".into(),
                n => n.to_string(),
            },
            scale_len: t.scale.len(),
            quantize_axis: t.quantize_axis,
            scale: (t.scale.len() == 1).then(|| t.scale0()),
            zero_point_len: t.zero_point.len(),
        }
    }
}

/// The ION pool and what the package needs of it.
#[derive(Debug, Clone, Serialize)]
pub struct Memory {
    /// Where the free bytes come from, or why they are unknown.
    pub source: String,
    /// Free bytes before loading; `None` = unknown or unlimited.
    pub available: Option<u64>,
    pub unlimited: bool,
    /// Every `ion*` reserved-memory node: name and size (or why it could not be read).
    pub reserved_memory: Vec<ReservedNode>,
    /// Pool bytes the `.hbm` loads take (board: the files plus the loader's margin).
    pub hbm_bytes: u64,
    /// `cache_sets` cache sets plus the text graphs' I/O buffers.
    pub buffer_bytes: Option<u64>,
    /// Cache sets counted: 2, or 3 with the optional kept set (`--keep-set`, `keep_set`).
    pub cache_sets: u64,
    /// The preflight mode: `strict` refuses a pool too small, `warn` only warns, `off`.
    pub pool_check: String,
    /// `fits`, `too small` or `unknown`.
    pub verdict: String,
    /// What to do when it does not fit.
    pub fix: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct ReservedNode {
    pub name: String,
    pub bytes: Option<u64>,
    pub error: Option<String>,
}

/// Builds the report of the package in `dir` (see the module docs).
pub fn package_report(dir: &Path, opts: &BpuOptions) -> PackageReport {
    let r = check_package(dir, opts);
    let implementation = r.implementation;
    let (runtime, runtime_error) = match implementation.map(|i| runtime_info(i, opts)) {
        Some(Ok(info)) => (Some(info), None),
        Some(Err(e)) => (None, Some(e)),
        None => (None, None),
    };
    let files = r
        .files
        .iter()
        .map(|(path, bytes)| FileEntry {
            path: path.clone(),
            bytes: *bytes,
            graphs: r
                .graphs
                .iter()
                .filter(|g| g.file == *path)
                .map(|g| g.name.clone())
                .collect(),
        })
        .collect();
    let graphs = r
        .graphs
        .iter()
        .map(|g| graph_entry(g, r.config.as_ref()))
        .collect();
    let memory = memory(&r, opts);
    let mut violations: Vec<String> = r.violations.iter().map(ToString::to_string).collect();
    let warnings = r.warnings.iter().map(ToString::to_string).collect();
    let decision = tail_decision(dir, opts, &r, runtime.as_ref(), &mut violations);
    let flush = implementation
        .filter(|_| runtime.is_some())
        .and_then(|i| probe_flush(i, opts, &mut violations));
    PackageReport {
        package: dir.to_owned(),
        implementation: implementation.map(|i| i.to_string()),
        runtime,
        runtime_error,
        manifest: r.config.as_ref().map(manifest),
        files,
        graphs,
        prefill_chunk: r.prefill_chunk,
        memory,
        prefill_tail: decision.mode,
        pad_rope: decision.pad_rope,
        pad_mask: decision.pad_mask,
        calibration_trials: trial_entries(&decision),
        prefill_tail_decision: decision,
        violations,
        warnings,
        flush,
    }
}

/// What the flush probe finds on a runtime of its own; a failed probe, or a forced
/// `--flush range` the runtime refuses, is a violation (opening would fail the same way).
fn probe_flush(
    implementation: Implementation,
    opts: &BpuOptions,
    violations: &mut Vec<String>,
) -> Option<String> {
    let rt = match implementation {
        Implementation::Sim => Runtime::new(bpu_sim::table().ok()?),
        Implementation::Board => Runtime::board(opts.lib_dir.as_deref()).ok()?,
    };
    match rt.probe_flush() {
        Ok(p) => {
            if let (crate::FlushOption::Range, Some(refusal)) = (opts.flush, &p.refusal) {
                violations.push(format!(
                    "--flush range (bpu_flush: range) is asked for, but the runtime refuses a \
                     flush of part of an allocation ({refusal})"
                ));
            }
            Some(p.mode.to_string())
        }
        Err(e) => {
            violations.push(format!("probing range flushes on a scratch buffer: {e}"));
            None
        }
    }
}

fn runtime_info(implementation: Implementation, opts: &BpuOptions) -> Result<RuntimeInfo, String> {
    let rt = match implementation {
        Implementation::Sim => Runtime::new(bpu_sim::table().map_err(|e| e.to_string())?),
        Implementation::Board => {
            Runtime::board(opts.lib_dir.as_deref()).map_err(|e| e.to_string())?
        }
    };
    Ok(RuntimeInfo::of(&rt))
}

fn manifest(c: &ModelConfig) -> Manifest {
    Manifest {
        name: c.name.clone(),
        graph: c.graph.clone(),
        prefill_graph: c.prefill_graph(),
        cache_len: c.cache_len,
        bpu_cores: c.bpu_cores,
        prefill_pads: c.prefill_pads,
        prefill_min_tail: c.prefill_min_tail,
        eos: c.eos.clone(),
        vision: c.visual.is_some(),
    }
}

/// What the runtime binds to tensor `index` of a graph of `kind`.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Text,
    Tower,
    Other,
}

fn role(kind: Kind, input: bool, index: usize) -> Option<String> {
    const FIXED: [&str; FIXED_IN] = ["x", "cos", "sin", "mask"];
    match (kind, input) {
        (Kind::Text, true) if index < FIXED_IN => Some(FIXED[index].into()),
        (Kind::Text, true) => Some(format!("cache {}", index - FIXED_IN)),
        (Kind::Text, false) if index == 0 => Some("logits".into()),
        (Kind::Text, false) => Some(format!("cache {} out", index - 1)),
        (Kind::Tower, true) if index == 0 => Some("patches".into()),
        (Kind::Tower, false) if index == 0 => Some("embeddings".into()),
        _ => None,
    }
}

/// One graph as the report shows it (roles by the manifest's graph names and files).
pub fn graph_entry(g: &GraphReport, cfg: Option<&ModelConfig>) -> GraphEntry {
    let kind = match cfg {
        Some(c) if g.name == c.graph || g.name == c.prefill_graph() => Kind::Text,
        Some(c) if c.visual.as_deref() == Some(g.file.as_path()) => Kind::Tower,
        _ => Kind::Other,
    };
    let list = |v: &[TensorSpec], input: bool| {
        v.iter()
            .enumerate()
            .map(|(i, t)| TensorEntry::of(i, t, role(kind, input, i)))
            .collect()
    };
    GraphEntry {
        name: g.name.clone(),
        file: g.file.clone(),
        inputs: list(&g.inputs, true),
        outputs: list(&g.outputs, false),
    }
}

/// The decode graph (from the main `.hbm`) and the prefill graph the runtime would use.
fn text_graphs<'a>(
    r: &'a CheckReport,
    cfg: &ModelConfig,
) -> (Option<&'a GraphReport>, Option<&'a GraphReport>) {
    let find = |file: &Path, name: &str| r.graphs.iter().find(|g| g.file == file && g.name == name);
    let decode = find(&cfg.hbm, &cfg.graph);
    let name = cfg.prefill_graph();
    let prefill = r.prefill_chunk.and_then(|_| {
        cfg.existing_hbm_prefill()
            .and_then(|p| find(p, &name))
            .or_else(|| find(&cfg.hbm, &name))
    });
    (decode, prefill)
}

fn memory(r: &CheckReport, opts: &BpuOptions) -> Option<Memory> {
    let p = r.pool.as_ref()?;
    let implementation = r.implementation?;
    let hbm_bytes: u64 = r
        .files
        .iter()
        .map(|&(_, n)| pool::load_bytes(implementation, n))
        .sum();
    let cache_sets = pool::cache_sets(opts.keep_set);
    let buffer_bytes = r.config.as_ref().and_then(|cfg| {
        let (decode, prefill) = text_graphs(r, cfg);
        let io = |g: &GraphReport| -> u64 {
            g.inputs[..FIXED_IN.min(g.inputs.len())]
                .iter()
                .chain(g.outputs.first())
                .map(|s| s.byte_size as u64)
                .sum()
        };
        let d = decode?;
        // Each cache buffer holds the largest size a graph bound to it reports.
        let cache_set: u64 = (FIXED_IN..d.inputs.len())
            .map(|i| {
                let p = prefill.map_or(0, |p| {
                    let pin = p.inputs.get(i).map_or(0, |s| s.byte_size);
                    let pout = p.outputs.get(i + 1 - FIXED_IN).map_or(0, |s| s.byte_size);
                    pin.max(pout)
                });
                d.inputs[i].byte_size.max(p) as u64
            })
            .sum();
        Some(cache_sets * cache_set + io(d) + prefill.map_or(0, io))
    });
    let needed = hbm_bytes + buffer_bytes.unwrap_or(0);
    let verdict = match p.available {
        Some(a) if a >= needed => "fits",
        Some(_) => "too small",
        None if p.unlimited => "fits",
        None => "unknown",
    };
    Some(Memory {
        source: p.source.clone(),
        available: p.available,
        unlimited: p.unlimited,
        reserved_memory: p
            .nodes
            .iter()
            .map(|n| ReservedNode {
                name: n.name.clone(),
                bytes: n.size.as_ref().ok().copied(),
                error: n.size.as_ref().err().cloned(),
            })
            .collect(),
        hbm_bytes,
        buffer_bytes,
        cache_sets,
        pool_check: opts.pool_check.to_string(),
        verdict: verdict.into(),
        fix: p.fix.clone(),
    })
}

/// The decision an open backend would reach: from the plan or the cache when they settle it,
/// else by opening the package (which calibrates and caches). A failure to open is a
/// violation: the runtime would fail the same way.
fn tail_decision(
    dir: &Path,
    opts: &BpuOptions,
    r: &CheckReport,
    runtime: Option<&RuntimeInfo>,
    violations: &mut Vec<String>,
) -> TailDecision {
    let chunk = r.prefill_chunk.unwrap_or(0);
    let stepped = |reason: String| TailDecision::stepped(opts.prefill_tail, chunk, reason);
    let Some(cfg) = r.config.as_ref() else {
        return stepped("no readable manifest".into());
    };
    if !violations.is_empty() {
        return stepped("not decided: the package has contract violations".into());
    }
    let has_weights = match (r.implementation, text_graphs(r, cfg).1) {
        (Some(Implementation::Sim), Some(g)) => bpu_sim::Container::read_header(&g.file)
            .ok()
            .map(|h| h.has_weights),
        _ => None,
    };
    match plan(
        opts.prefill_tail,
        cfg,
        chunk,
        opts.no_prefill_graph,
        has_weights,
    ) {
        Plan::Decided(d) => return d,
        Plan::Calibrate { .. } => {}
    }
    let cached = tail_cache::cache_dir(opts.cache_dir.as_deref()).and_then(|c| {
        let key = tail_cache::CacheKey::new(cfg, &runtime?.versions())?;
        tail_cache::lookup(&c, dir, &key)
    });
    if let Some(mut d) = cached {
        d.cached = true;
        d.requested = opts.prefill_tail;
        return d;
    }
    // The tower plays no part in the tail: leave it out of the pool.
    let open = BpuOptions {
        no_vision: true,
        ..opts.clone()
    };
    match BpuBackend::open(dir, &open) {
        Ok(b) => b.tail_decision().clone(),
        Err(e) => {
            violations.push(format!("opening the package to calibrate the tail: {e}"));
            stepped(format!("not decided: opening failed ({e})"))
        }
    }
}

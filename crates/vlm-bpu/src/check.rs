//! `vlm check`: every contract violation of a package, not just the first — the manifest, the
//! implementation its `.hbm` files need (and the libraries for it), the BPU march, the ION pool,
//! each graph's I/O against docs/package-contract.md (§3.1, §4.1–§4.2, §6) and the embedding table's size.
//! Loads the graphs (under the engine lock on a board) but allocates no cache set.

use std::path::{Path, PathBuf};

use bpu_sim::Implementation;
use hbdnn::{PackedModel, Runtime, TensorSpec};

use vlm::package::{LoadOptions, ModelConfig};

use crate::contract::{TEXT_INPUTS, TEXT_OUTPUTS};
use crate::error::load_error;
use crate::{contract, lock, open, pool, tower, BpuError, BpuOptions, EmbedTable};

/// One contract violation: the file and the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub path: PathBuf,
    pub reason: String,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.reason)
    }
}

/// One graph and its I/O.
#[derive(Debug, Clone)]
pub struct GraphReport {
    pub file: PathBuf,
    pub name: String,
    pub inputs: Vec<TensorSpec>,
    pub outputs: Vec<TensorSpec>,
}

/// What `check` found.
#[derive(Debug, Default)]
pub struct CheckReport {
    pub config: Option<ModelConfig>,
    pub implementation: Option<Implementation>,
    /// `(file, bytes)` of every `.hbm` the package loads.
    pub files: Vec<(PathBuf, u64)>,
    pub pool: Option<pool::PoolReading>,
    pub graphs: Vec<GraphReport>,
    /// Decode shape (hidden, vocab, window …) when the decode graph passed.
    pub decode: Option<contract::DecodeShape>,
    /// Prefill rows per chunk when a compatible prefill graph exists.
    pub prefill_chunk: Option<usize>,
    pub violations: Vec<Violation>,
    /// What does not stop the package from running but a board owner should know: a pool
    /// that looks too small or cannot be identified under `--pool-check warn`, a prefill
    /// cache whose `alignedByteSize` differs from decode's.
    pub warnings: Vec<Violation>,
}

impl CheckReport {
    fn violation(&mut self, path: &Path, reason: impl Into<String>) {
        self.violations.push(Violation {
            path: path.to_owned(),
            reason: reason.into(),
        });
    }

    fn error(&mut self, e: &BpuError, fallback: &Path) {
        let (path, reason) = split(e, fallback);
        self.violation(&path, reason);
    }
}

/// A `BpuError`'s file and the rest of its message.
fn split(e: &BpuError, fallback: &Path) -> (PathBuf, String) {
    let msg = e.to_string();
    let path = match e {
        BpuError::Hbdnn { path, .. }
        | BpuError::Contract { path, .. }
        | BpuError::Embed { path, .. }
        | BpuError::Config { path, .. }
        | BpuError::Busy { path }
        | BpuError::Lock { path, .. }
        | BpuError::Pool { path, .. }
        | BpuError::PoolUnknown { path, .. }
        | BpuError::March { path, .. } => path.clone(),
        _ => return (fallback.to_owned(), msg),
    };
    let prefix = format!("{}: ", path.display());
    let reason = msg.strip_prefix(&prefix).map_or(msg.clone(), str::to_owned);
    (path, reason)
}

/// Checks the package in `dir` (vision included unless `opts.no_vision`).
pub fn check_package(dir: &Path, opts: &BpuOptions) -> CheckReport {
    let mut r = CheckReport::default();
    let manifest = dir.join(vlm::package::MANIFEST);
    let cfg = match ModelConfig::load(
        dir,
        LoadOptions {
            vision: !opts.no_vision,
        },
    ) {
        Ok(c) => c,
        Err(e) => {
            // Everything else depends on a readable manifest naming existing files.
            let msg = e.to_string();
            let prefix = format!("{}: ", manifest.display());
            let reason = msg.strip_prefix(&prefix).map_or(msg.clone(), str::to_owned);
            r.violation(&manifest, reason);
            return r;
        }
    };
    check_loaded(&mut r, &cfg, opts);
    r.config = Some(cfg);
    r
}

/// Everything after the manifest: implementation, lock, march, pool, then the graphs.
fn check_loaded(r: &mut CheckReport, cfg: &ModelConfig, opts: &BpuOptions) {
    let files = open::hbm_files(cfg);
    for f in &files {
        let len = std::fs::metadata(f).map_or(0, |m| m.len());
        r.files.push((f.clone(), len));
    }
    let implementation = match bpu_sim::inspect_package(&files, opts.implementation) {
        Ok(i) => i,
        Err(e) => {
            r.error(&BpuError::Detect(e), &cfg.hbm);
            return;
        }
    };
    r.implementation = Some(implementation);
    // Held until the report is done: the check loads graphs like an engine does.
    let _lock = match lock::acquire_for(implementation, opts.lock_path.as_deref()) {
        Ok(l) => l,
        Err(e) => {
            r.error(&e, &cfg.hbm);
            return;
        }
    };
    check_march_and_pool(r, cfg, &files, implementation, opts);
    if !r.violations.is_empty() {
        // A march or pool problem: loading would fail (or worse, on a board).
        return;
    }
    let Some(runtime) = open_runtime(r, cfg, implementation, opts) else {
        return;
    };
    let models = load_graphs(r, &runtime, &files);
    check_graphs(r, cfg, &models);
}

/// The sim containers' march, and whether the `.hbm` loads fit the ION pool.
fn check_march_and_pool(
    r: &mut CheckReport,
    cfg: &ModelConfig,
    files: &[PathBuf],
    implementation: Implementation,
    opts: &BpuOptions,
) {
    if implementation == Implementation::Sim {
        if let Err(e) = open::check_sim_march(files) {
            r.error(&e, &cfg.hbm);
        }
    }
    let reading = pool::reading(implementation);
    let hbm_bytes: u64 = r
        .files
        .iter()
        .map(|&(_, n)| pool::load_bytes(implementation, n))
        .sum();
    match pool::check(
        "the .hbm files",
        hbm_bytes,
        &reading,
        &cfg.hbm,
        opts.pool_check,
    ) {
        Ok(Some(w)) => r.warnings.push(Violation {
            path: cfg.hbm.clone(),
            reason: w,
        }),
        Ok(None) => {}
        Err(e) => r.error(&e, &cfg.hbm),
    }
    r.pool = Some(reading);
}

/// The simulator's or the board's runtime; `None` with a violation when it cannot be opened.
fn open_runtime(
    r: &mut CheckReport,
    cfg: &ModelConfig,
    implementation: Implementation,
    opts: &BpuOptions,
) -> Option<Runtime> {
    match implementation {
        Implementation::Sim => match bpu_sim::table() {
            Ok(t) => Some(Runtime::new(t)),
            Err(e) => {
                r.error(&BpuError::SimTable(e), &cfg.hbm);
                None
            }
        },
        Implementation::Board => match Runtime::board(opts.lib_dir.as_deref()) {
            Ok(rt) => Some(rt),
            Err(source) => {
                let path = opts
                    .lib_dir
                    .clone()
                    .unwrap_or_else(|| PathBuf::from("board libraries"));
                r.violation(&path, format!("libraries not found or unusable: {source}"));
                None
            }
        },
    }
}

/// Loads every `.hbm` and lists its graphs; a file or graph that fails is a violation.
fn load_graphs(
    r: &mut CheckReport,
    runtime: &Runtime,
    files: &[PathBuf],
) -> Vec<(PathBuf, PackedModel)> {
    let mut models: Vec<(PathBuf, PackedModel)> = Vec::new();
    for f in files {
        match runtime.load(&[f]) {
            Ok(m) => {
                for name in m.graph_names().to_vec() {
                    match m.graph(&name) {
                        Ok(g) => r.graphs.push(GraphReport {
                            file: f.clone(),
                            name: name.clone(),
                            inputs: g.inputs().to_vec(),
                            outputs: g.outputs().to_vec(),
                        }),
                        Err(e) => r.violation(f, format!("graph `{name}`: {e}")),
                    }
                }
                models.push((f.clone(), m));
            }
            Err(source) => r.error(&load_error(f, source), f),
        }
    }
    models
}

fn find<'a>(models: &'a [(PathBuf, PackedModel)], file: &Path) -> Option<&'a PackedModel> {
    models.iter().find(|(p, _)| p == file).map(|(_, m)| m)
}

fn check_graphs(r: &mut CheckReport, cfg: &ModelConfig, models: &[(PathBuf, PackedModel)]) {
    let Some(main) = find(models, &cfg.hbm) else {
        return;
    };
    if !main.has_graph(&cfg.graph) {
        r.violation(
            &cfg.hbm,
            format!(
                "graph contract mismatch: no graph `{}` (has {:?})",
                cfg.graph,
                main.graph_names()
            ),
        );
        return;
    }
    let dec = match main.graph(&cfg.graph) {
        Ok(g) => g,
        Err(e) => {
            r.violation(&cfg.hbm, e.to_string());
            return;
        }
    };
    let shape = match contract::check_decode(&dec) {
        Ok(s) => s,
        Err(reason) => {
            r.violation(&cfg.hbm, format!("graph contract mismatch: {reason}"));
            return;
        }
    };
    if cfg.cache_len != 0 && shape.context != cfg.cache_len as usize {
        r.violation(
            &cfg.manifest,
            format!(
                "`cache_len` {} differs from the decode graph's window {} (mask of {})",
                cfg.cache_len,
                shape.context,
                cfg.hbm.display()
            ),
        );
    }
    let pre_name = cfg.prefill_graph();
    let holder: Option<(PathBuf, &PackedModel)> = cfg
        .existing_hbm_prefill()
        .and_then(|p| find(models, p).map(|m| (p.to_owned(), m)))
        .filter(|(_, m)| m.has_graph(&pre_name))
        .or_else(|| main.has_graph(&pre_name).then(|| (cfg.hbm.clone(), main)));
    if let Some((path, m)) = holder {
        match m.graph(&pre_name) {
            Ok(g) => match contract::check_quantisation(&g, TEXT_INPUTS, TEXT_OUTPUTS)
                .and_then(|()| contract::check_prefill(&g, &dec, &shape).map_err(|reason| {
                    format!("prefill graph `{pre_name}`: {reason} (the runtime would step every row)")
                })) {
                Ok(fit) => {
                    r.prefill_chunk = Some(fit.rows);
                    r.warnings.extend(fit.warnings.into_iter().map(|reason| Violation {
                        path: path.clone(),
                        reason,
                    }));
                }
                Err(reason) => r.violation(&path, format!("graph contract mismatch: {reason}")),
            },
            Err(e) => r.violation(&path, e.to_string()),
        }
    }
    match &cfg.embed {
        Some(p) => {
            if let Err(e) = EmbedTable::open(p, shape.vocab, shape.hidden) {
                r.error(&e, p);
            }
        }
        None => r.violation(&cfg.manifest, "the package names no `embed` table"),
    }
    if let Some(vp) = &cfg.visual {
        if let Some(m) = find(models, vp) {
            check_tower(r, cfg, vp, m, shape.hidden);
        }
    }
    r.decode = Some(shape);
}

fn check_tower(
    r: &mut CheckReport,
    cfg: &ModelConfig,
    path: &Path,
    m: &PackedModel,
    hidden: usize,
) {
    let g = match tower::graph_name(m) {
        Ok(name) => m.graph(&name).map_err(|e| e.to_string()),
        Err(reason) => Err(format!("graph contract mismatch: {reason}")),
    };
    let reason = match g {
        Ok(g) => match tower::check(cfg, &g, hidden) {
            Ok(_) => return,
            Err(reason) => format!("graph contract mismatch: {reason}"),
        },
        Err(reason) => reason,
    };
    r.violation(path, reason);
}

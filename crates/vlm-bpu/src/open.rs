//! Opening a package. The order is the point: everything that can refuse a package cheaply
//! (the engine lock, the march, the ION pool) runs before the step it protects, because on a
//! board a second engine or an over-full pool can take the machine down rather than fail.
//! Graphs are loaded and checked against the contract before any buffer exists, and the
//! buffers are checked against the pool before any is allocated.
//!
//! Each named step first looks at [`BpuOptions::interrupt`]: raised, opening stops there with
//! [`BpuError::Interrupted`] and whatever was loaded or allocated is released. Allocating and
//! clearing the cache sets also look at it before each buffer: the runtime zeroes and flushes
//! every buffer, ~930 MB for the 4B's three sets at ctx4k, which took up to 7.5 s on a busy
//! host and made a shutdown wait for all of it. Other steps cannot be cut short: on a board,
//! loading the text graphs is one `hbDNNInitializeFromFiles` call that reads several GB of
//! `.hbm` (≈ 15 s for the 4B) and returns only when done, so a shutdown then waits for it.

use std::path::{Path, PathBuf};

use bpu_sim::Implementation;
use hbdnn::{Graph, PackedModel, Runtime, Sched};

use vlm::engine::BackendInfo;
use vlm::interrupt::Interrupt;
use vlm::package::{LoadOptions, ModelConfig};

use crate::contract::{self, DecodeShape, FIXED_IN};
use crate::error::load_error;
use crate::logits::LogitsAt;
use crate::pool::{self, PoolCheck, PoolReading};
use crate::step::Io;
use crate::tail::TailDecision;
use crate::tower::Tower;
use crate::{lock, state, BpuBackend, BpuError, BpuOptions, EmbedTable, EngineLock, RuntimeInfo};

/// The text graphs, loaded and checked against the contract; no buffer exists yet.
struct TextGraphs {
    /// The main `.hbm`: the decode graph, and the prefill graph when no file of its own has it.
    main: PackedModel,
    decode: Graph,
    shape: DecodeShape,
    /// The prefill graph, its rows per chunk and its file, when it agrees with the decode graph.
    prefill: Option<(Graph, usize, PathBuf)>,
    /// The package's separate prefill `.hbm`, loaded whether or not its graph is used.
    prefill_model: Option<PackedModel>,
    /// Bytes of each cache buffer: the largest size any graph bound to it reports.
    cache_bytes: Vec<usize>,
}

/// Everything read from the package and checked, before any buffer exists.
struct Loaded {
    cfg: ModelConfig,
    implementation: Implementation,
    text: TextGraphs,
    embed: EmbedTable,
    /// The vision tower's file and model; its graph is checked when its buffers are made.
    tower: Option<(PathBuf, PackedModel)>,
    axes: Vec<usize>,
    lock: Option<EngineLock>,
    runtime: RuntimeInfo,
    /// Allocate the optional third cache set (asked for, and the pool preflight allows it).
    keep_set: bool,
    flush: crate::FlushDecision,
}

impl BpuBackend {
    /// Opens the package in `dir`. For simulator packages the calling thread's simulator
    /// instance ([`bpu_sim::Sim::current`], or one `install`ed before) runs the graphs.
    pub fn open(dir: &Path, opts: &BpuOptions) -> Result<Self, BpuError> {
        let step = |name| step(&opts.interrupt, name);
        step("reading the manifest")?;
        let cfg = ModelConfig::load(
            dir,
            LoadOptions {
                vision: !opts.no_vision,
            },
        )?;
        let mut files = hbm_files(&cfg);
        if opts.no_prefill_graph {
            // Not loaded at all: it would only take pool memory.
            files.retain(|f| Some(f.as_path()) != cfg.existing_hbm_prefill());
        }
        let implementation = bpu_sim::inspect_package(&files, opts.implementation)?;
        let lock = lock::acquire_for(implementation, opts.lock_path.as_deref())?;
        if implementation == Implementation::Sim {
            check_sim_march(&files)?;
        }
        let (before_load, hbm_bytes) =
            preflight_files(implementation, &files, &cfg.hbm, opts.pool_check)?;
        step("opening the runtime")?;
        let runtime = runtime(implementation, opts.lib_dir.as_deref())?;
        let runtime_info = RuntimeInfo::of(&runtime);
        let flush = crate::flush::decide(&runtime, opts.flush, &cfg.hbm)?;
        tracing::info!(package = %dir.display(), %implementation, "opening BPU package");
        step("loading the text graphs")?;
        let text = load_text_graphs(&runtime, &cfg, opts.no_prefill_graph)?;
        let has_weights = sim_weights(implementation, &text);
        step("opening the embedding table")?;
        let embed = open_embed(&cfg, &text.shape)?;
        step("loading the vision tower")?;
        let tower = load_tower(&runtime, &cfg)?;
        let axes = rope_axes(&cfg, &text.shape)?;
        let after_load = pool::after_load(implementation, &before_load, hbm_bytes);
        let keep_set = preflight_buffers(&text, &after_load, &cfg.hbm, opts)?;
        step("allocating the buffers")?;
        let mut me = allocate(
            Loaded {
                cfg,
                implementation,
                text,
                embed,
                tower,
                axes,
                lock,
                runtime: runtime_info,
                keep_set,
                flush,
            },
            opts,
        )?;
        step("clearing the state")?;
        // Fresh buffers hold whatever the pool held before: the state starts zeroed and
        // flushed to the device.
        let cleared = me
            .clear_state_until(&opts.interrupt)
            .map_err(|e| BpuError::Config {
                path: me.cfg.hbm.clone(),
                reason: e.to_string(),
            })?;
        if !cleared {
            return Err(BpuError::Interrupted {
                step: state::CLEARING_THE_REST,
            });
        }
        step("deciding the prompt tail")?;
        me.decide_tail(dir, opts, has_weights)?;
        Ok(me)
    }
}

/// Asked before each named step of [`BpuBackend::open`]: stops opening when `interrupt` is
/// raised (what was built so far is dropped, so released, on the way out).
fn step(interrupt: &Interrupt, name: &'static str) -> Result<(), BpuError> {
    if interrupt.is_raised() {
        tracing::info!("opening the package interrupted before {name}");
        return Err(BpuError::Interrupted { step: name });
    }
    tracing::debug!(step = name, "open step");
    Ok(())
}

/// Every `.hbm` the package loads: the main file, a separate prefill file, the vision tower.
pub(crate) fn hbm_files(cfg: &ModelConfig) -> Vec<PathBuf> {
    let mut files = vec![cfg.hbm.clone()];
    files.extend(cfg.existing_hbm_prefill().map(Path::to_owned));
    files.extend(cfg.visual.clone());
    files
}

/// Sim containers name the march they were compiled for; refuse those the simulated platform
/// would refuse, naming the file, before anything is loaded.
pub(crate) fn check_sim_march(files: &[PathBuf]) -> Result<(), BpuError> {
    let platform = bpu_sim::Sim::current().platform_march();
    for f in files {
        let c = bpu_sim::Container::read(f).map_err(|e| BpuError::Config {
            path: f.clone(),
            reason: e.to_string(),
        })?;
        if let Some(m) = c.header.march.as_deref() {
            if m != platform {
                return Err(BpuError::March {
                    path: f.clone(),
                    detail: format!("model march `{m}`, platform march `{platform}`"),
                });
            }
        }
    }
    Ok(())
}

/// First preflight, before anything is loaded: the `.hbm` files against the pool. Returns the
/// pool reading and the bytes the loads will take from it.
fn preflight_files(
    implementation: Implementation,
    files: &[PathBuf],
    hbm: &Path,
    mode: PoolCheck,
) -> Result<(PoolReading, u64), BpuError> {
    let reading = pool::reading(implementation);
    if !reading.nodes.is_empty() || reading.available.is_some() {
        tracing::info!(pool = %reading.source, found = %reading.found(), "ION reserved memory");
    }
    let mut hbm_bytes = 0u64;
    for f in files {
        let len = std::fs::metadata(f)
            .map_err(|e| BpuError::Config {
                path: f.clone(),
                reason: format!("cannot stat: {e}"),
            })?
            .len();
        hbm_bytes += pool::load_bytes(implementation, len);
    }
    pool::check("the .hbm files", hbm_bytes, &reading, hbm, mode)?;
    Ok((reading, hbm_bytes))
}

fn runtime(implementation: Implementation, lib_dir: Option<&Path>) -> Result<Runtime, BpuError> {
    match implementation {
        Implementation::Sim => Ok(Runtime::new(bpu_sim::table()?)),
        Implementation::Board => Runtime::board(lib_dir).map_err(|source| BpuError::Hbdnn {
            path: lib_dir.map_or_else(|| PathBuf::from("board libraries"), Path::to_owned),
            source,
        }),
    }
}

fn load(runtime: &Runtime, path: &Path) -> Result<PackedModel, BpuError> {
    runtime
        .load(&[path])
        .map_err(|source| load_error(path, source))
}

fn contract_error(path: &Path, reason: String) -> BpuError {
    BpuError::Contract {
        path: path.to_owned(),
        reason,
    }
}

/// Loads the decode graph (which must meet the contract) and the prefill graph if any (none
/// with `no_prefill`: its own file is not even loaded).
fn load_text_graphs(
    runtime: &Runtime,
    cfg: &ModelConfig,
    no_prefill: bool,
) -> Result<TextGraphs, BpuError> {
    let main = load(runtime, &cfg.hbm)?;
    if !main.has_graph(&cfg.graph) {
        return Err(contract_error(
            &cfg.hbm,
            format!("no graph `{}` (has {:?})", cfg.graph, main.graph_names()),
        ));
    }
    let decode = main.graph(&cfg.graph).map_err(|source| BpuError::Hbdnn {
        path: cfg.hbm.clone(),
        source,
    })?;
    let shape = contract::check_decode(&decode).map_err(|r| contract_error(&cfg.hbm, r))?;
    tracing::info!(file = %cfg.hbm.display(), graph = %cfg.graph, "decode graph");
    let own = match cfg.existing_hbm_prefill() {
        Some(p) if !no_prefill => Some((p.to_owned(), load(runtime, p)?)),
        _ => None,
    };
    let prefill = if no_prefill {
        tracing::info!("the prefill graph is turned off: every row runs through the decode graph");
        None
    } else {
        prefill_graph(cfg, &main, own.as_ref(), &decode, &shape)?
    };
    let cache_bytes =
        contract::cache_buffer_bytes(&decode, prefill.as_ref().map(|(g, _, _)| g), shape.n_cache);
    Ok(TextGraphs {
        main,
        decode,
        shape,
        prefill,
        prefill_model: own.map(|(_, m)| m),
        cache_bytes,
    })
}

/// The prefill graph from the package's own prefill file, else from the main file. One that
/// disagrees with the decode graph only costs speed (every row is stepped), so it is a
/// warning, not an error.
fn prefill_graph(
    cfg: &ModelConfig,
    main: &PackedModel,
    own: Option<&(PathBuf, PackedModel)>,
    decode: &Graph,
    shape: &DecodeShape,
) -> Result<Option<(Graph, usize, PathBuf)>, BpuError> {
    let name = cfg.prefill_graph();
    let holder = match own {
        Some((p, m)) if m.has_graph(&name) => Some((p.clone(), m)),
        _ if main.has_graph(&name) => Some((cfg.hbm.clone(), main)),
        _ => None,
    };
    let Some((path, m)) = holder else {
        tracing::info!(graph = %name, "no prefill graph: stepping every row");
        return Ok(None);
    };
    let g = m.graph(&name).map_err(|source| BpuError::Hbdnn {
        path: path.clone(),
        source,
    })?;
    // Wrong numbers, not just slower ones: refused rather than stepped around.
    contract::check_quantisation(&g, contract::TEXT_INPUTS, contract::TEXT_OUTPUTS)
        .map_err(|r| contract_error(&path, r))?;
    match contract::check_prefill(&g, decode, shape) {
        Ok(fit) => {
            // Its warnings (a different alignedByteSize) are logged by the check.
            let n = fit.rows;
            tracing::info!(file = %path.display(), graph = %name, chunk = n, "prefill graph");
            Ok(Some((g, n, path)))
        }
        Err(reason) => {
            tracing::warn!(
                file = %path.display(), graph = %name, %reason,
                "prefill graph not compatible with the decode graph: stepping every row"
            );
            Ok(None)
        }
    }
}

/// `Some(false)` for a simulator prefill graph without weights (synthetic logits: the pad
/// layout cannot be calibrated); `None` when unknown (a board graph) or there is none.
fn sim_weights(implementation: Implementation, text: &TextGraphs) -> Option<bool> {
    let (_, _, path) = text.prefill.as_ref()?;
    (implementation == Implementation::Sim)
        .then(|| bpu_sim::Container::read_header(path).ok())
        .flatten()
        .map(|h| h.has_weights)
}

fn open_embed(cfg: &ModelConfig, shape: &DecodeShape) -> Result<EmbedTable, BpuError> {
    let path = cfg.embed.as_deref().ok_or_else(|| BpuError::Config {
        path: cfg.manifest.clone(),
        reason: "the package names no `embed` table".into(),
    })?;
    EmbedTable::open(path, shape.vocab, shape.hidden)
}

fn load_tower(
    runtime: &Runtime,
    cfg: &ModelConfig,
) -> Result<Option<(PathBuf, PackedModel)>, BpuError> {
    match &cfg.visual {
        Some(p) => Ok(Some((p.clone(), load(runtime, p)?))),
        None => Ok(None),
    }
}

/// The M-RoPE axis of each rotary pair; the rope tables are built for the interleaved layout
/// only, so a sectioned one would silently give wrong positions.
fn rope_axes(cfg: &ModelConfig, shape: &DecodeShape) -> Result<Vec<usize>, BpuError> {
    if !cfg.mrope_interleaved && !cfg.mrope_section.is_empty() {
        return Err(BpuError::Config {
            path: cfg.manifest.clone(),
            reason: "only interleaved M-RoPE (`mrope_interleaved: true`) is supported".into(),
        });
    }
    let section: Vec<usize> = cfg.mrope_section.iter().map(|&s| s as usize).collect();
    Ok(qwen35::config::mrope_axes(shape.rot / 2, &section))
}

/// Second preflight, before any buffer exists: two cache sets (three with
/// [`BpuOptions::keep_set`]) plus the graphs' I/O. `Ok(true)`: allocate the third set.
fn preflight_buffers(
    text: &TextGraphs,
    pool: &PoolReading,
    hbm: &Path,
    opts: &BpuOptions,
) -> Result<bool, BpuError> {
    let io_bytes = |g: &Graph| -> u64 {
        g.inputs()[..FIXED_IN.min(g.inputs().len())]
            .iter()
            .chain(g.outputs().first())
            .map(|s| s.byte_size as u64)
            .sum()
    };
    let cache_set: u64 = text.cache_bytes.iter().map(|&n| n as u64).sum();
    let mut io = io_bytes(&text.decode);
    if let Some((g, _, _)) = &text.prefill {
        io += io_bytes(g);
    }
    let mut sets = pool::cache_sets(opts.keep_set);
    let needs = |sets: u64| sets * cache_set + io;
    if sets == 3
        && opts.pool_check != PoolCheck::Off
        && pool::known_too_small(needs(3), pool)
        && !pool::known_too_small(needs(2), pool)
    {
        // The third set is optional: better without it than an allocation the pool
        // cannot serve (which can take a board down rather than fail).
        tracing::warn!(
            needed = needs(3),
            available = ?pool.available,
            "the ION pool cannot also hold the optional third cache set: opening without it \
             (a kept state is a host snapshot)"
        );
        sets = 2;
    }
    let what = format!("{sets} cache sets and the graph I/O buffers");
    pool::check(&what, needs(sets), pool, hbm, opts.pool_check)?;
    Ok(sets == 3)
}

/// Allocates every buffer and assembles the backend (state not yet cleared).
fn allocate(loaded: Loaded, opts: &BpuOptions) -> Result<BpuBackend, BpuError> {
    let Loaded {
        cfg,
        implementation,
        text,
        embed,
        tower,
        axes,
        lock,
        runtime,
        keep_set,
        flush,
    } = loaded;
    let TextGraphs {
        main,
        decode,
        shape,
        prefill,
        prefill_model,
        cache_bytes,
    } = text;
    let prefill = match prefill {
        Some((g, n, path)) => Some(Io::new(g, n, &path)?),
        None => None,
    };
    let mut packed: Vec<PackedModel> = prefill_model.into_iter().collect();
    let tower = match tower {
        Some((p, m)) => {
            let t = Tower::open(&cfg, &p, &m, shape.hidden)?;
            packed.push(m);
            Some(t)
        }
        None => None,
    };
    let decode = Io::new(decode, 1, &cfg.hbm)?;
    let interrupt = &opts.interrupt;
    let sets = alloc_sets(&decode.graph, &cache_bytes, keep_set, &cfg.hbm, interrupt)?;
    // Fresh device memory holds anything: the first clear zeroes every row.
    let held = vec![shape.context; sets.len()];
    let state_shape = state::state_shape(&decode.graph, &shape);
    let info = BackendInfo {
        hidden: shape.hidden,
        vocab: shape.vocab,
        context: shape.context,
        prefill_chunk: prefill.as_ref().map_or(0, |p| p.rows),
        mask_heads: shape.mask_heads,
        vision: tower.as_ref().map(|t| t.spec),
    };
    packed.push(main);
    // Decided by `decide_tail` once the state is clear.
    let tail = TailDecision::stepped(
        opts.prefill_tail,
        info.prefill_chunk,
        "not decided yet".into(),
    );
    let sched = Sched {
        priority: opts.priority,
        core_mask: Sched::cores(cfg.bpu_cores),
        // At least 1 ms: 0 would mean "wait forever" to hbUCP.
        timeout_ms: i32::try_from(opts.timeout.as_millis())
            .unwrap_or(i32::MAX)
            .max(1),
    };
    Ok(BpuBackend {
        implementation,
        info,
        embed,
        decode,
        prefill,
        tower,
        sets,
        current: 0,
        held,
        pinned: None,
        stashed: None,
        stash_spare: None,
        consumed: 0,
        max_pos: None,
        logit_image: vec![0; state_shape.logit_bytes],
        image_in_decode_buffer: false,
        logits_at: LogitsAt::Nowhere,
        logits: Vec::new(),
        decode_mask_for: None,
        shape,
        axes,
        state_shape,
        sched,
        cfg,
        tail,
        runtime,
        flush,
        graph_time: std::time::Duration::ZERO,
        _packed: packed,
        _lock: lock,
    })
}

/// The two cache sets a run ping-pongs between, and the optional third one (`keep_set`).
/// Interruptible between buffers ([`state::alloc_set`]): after the graph loads this is the
/// longest step of opening (each buffer is zeroed and flushed; the 4B's three sets at ctx4k
/// are ~930 MB), and a shutdown waited for all of it.
fn alloc_sets(
    decode: &Graph,
    cache_bytes: &[usize],
    keep_set: bool,
    hbm: &Path,
    interrupt: &Interrupt,
) -> Result<Vec<Vec<hbdnn::DeviceBuffer>>, BpuError> {
    let per_set = cache_bytes
        .iter()
        .fold(0u64, |a, &n| a.saturating_add(n as u64));
    tracing::info!(
        sets = 2 + usize::from(keep_set),
        buffers_per_set = cache_bytes.len(),
        mb_per_set = per_set >> 20,
        "allocating the decode cache sets"
    );
    let mut sets = vec![
        state::alloc_set(decode, cache_bytes, hbm, interrupt)?,
        state::alloc_set(decode, cache_bytes, hbm, interrupt)?,
    ];
    if keep_set {
        // Optional: without it a kept state is a host snapshot, as with the CPU backend.
        match state::alloc_set(decode, cache_bytes, hbm, interrupt) {
            Ok(set) => sets.push(set),
            Err(e @ BpuError::Interrupted { .. }) => return Err(e),
            Err(e) => tracing::warn!(
                "no third decode cache set ({e}): a primed state is restored by copy"
            ),
        }
    }
    Ok(sets)
}

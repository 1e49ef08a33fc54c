//! The calibrated tail decision, cached so that the next start of the same package is free:
//! one small JSON file (`prefill_tail.json`) in the cache folder, one entry per package
//! folder, keyed by the package files' path, size and mtime and the runtime's versions.
//! Entries of package folders that no longer exist are dropped on each write. A cache that
//! cannot be read or written only costs a calibration (logged), never a start.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use vlm::package::ModelConfig;

use crate::tail::TailDecision;

/// Overrides the cache folder ([`crate::BpuOptions::cache_dir`] wins over it).
pub const CACHE_DIR_ENV: &str = "VLM_BPU_CACHE_DIR";

/// The file in the cache folder.
pub const CACHE_FILE: &str = "prefill_tail.json";

/// Bumped whenever the calibration prompt, the criterion or the padded-tail protocol
/// changes, so older decisions are not reused. 2: eight pad markings (layout × rope × mask
/// row) from a one-row prefix, top-1 agreement required.
const PROTOCOL: u32 = 2;

/// The cache folder: `explicit`, else `$VLM_BPU_CACHE_DIR`, else `$XDG_CACHE_HOME/bpu_vlm`,
/// else `$HOME/.cache/bpu_vlm`; `None` when none is set.
pub fn cache_dir(explicit: Option<&Path>) -> Option<PathBuf> {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    explicit
        .map(Path::to_owned)
        .or_else(|| env(CACHE_DIR_ENV))
        .or_else(|| env("XDG_CACHE_HOME").map(|d| d.join("bpu_vlm")))
        .or_else(|| env("HOME").map(|d| d.join(".cache").join("bpu_vlm")))
}

/// One package file as the key sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct FileStamp {
    path: PathBuf,
    bytes: u64,
    /// Nanoseconds since the Unix epoch (0 when the file system keeps none).
    mtime_ns: u128,
}

/// What a cached decision is valid for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CacheKey {
    runtime: String,
    files: Vec<FileStamp>,
}

impl CacheKey {
    /// The key of `cfg`'s package under the runtime whose hbDNN / hbUCP versions are
    /// `runtime_versions`; `None` when a file cannot be stat'ed.
    pub(crate) fn new(cfg: &ModelConfig, runtime_versions: &str) -> Option<Self> {
        let mut paths = vec![cfg.manifest.clone(), cfg.hbm.clone()];
        paths.extend(cfg.existing_hbm_prefill().map(Path::to_owned));
        paths.extend(cfg.embed.clone());
        paths.push(cfg.tokenizer.clone());
        let files = paths
            .into_iter()
            .map(|p| {
                let path = std::fs::canonicalize(&p).ok()?;
                let m = std::fs::metadata(&path).ok()?;
                let mtime_ns = m
                    .modified()
                    .ok()
                    .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                    .map_or(0, |d| d.as_nanos());
                Some(FileStamp {
                    path,
                    bytes: m.len(),
                    mtime_ns,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Self {
            runtime: format!(
                "vlm-bpu {} (tail protocol {PROTOCOL}); {runtime_versions}",
                env!("CARGO_PKG_VERSION")
            ),
            files,
        })
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Entry {
    key: CacheKey,
    decision: TailDecision,
}

/// Entries are kept as raw JSON and decoded one at a time, so an entry written by another
/// version of the runtime (whose decision may not even parse) is ignored on lookup and kept
/// as it is on a write, instead of making the whole file unreadable.
#[derive(Debug, Default, Serialize, Deserialize)]
struct CacheFile {
    /// Package folder (canonical) → entry.
    entries: BTreeMap<PathBuf, serde_json::Value>,
}

fn read(file: &Path) -> CacheFile {
    match std::fs::read_to_string(file) {
        Ok(text) => serde_json::from_str(&text).unwrap_or_else(|e| {
            tracing::warn!(file = %file.display(), error = %e, "unreadable tail cache: ignored");
            CacheFile::default()
        }),
        Err(_) => CacheFile::default(),
    }
}

fn package_key(dir: &Path) -> PathBuf {
    std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_owned())
}

/// The cached decision for the package in `dir`, if its key still matches.
pub(crate) fn lookup(cache: &Path, dir: &Path, key: &CacheKey) -> Option<TailDecision> {
    let mut f = read(&cache.join(CACHE_FILE));
    let raw = f.entries.remove(&package_key(dir))?;
    // The key first: an entry of another runtime version is stale whatever its decision
    // looks like, so it is not decoded at all.
    let same_key = raw
        .get("key")
        .cloned()
        .and_then(|k| serde_json::from_value::<CacheKey>(k).ok())
        .is_some_and(|k| k == *key);
    let entry = same_key
        .then(|| serde_json::from_value::<Entry>(raw).ok())
        .flatten();
    if let Some(e) = entry {
        Some(e.decision)
    } else {
        tracing::info!(
            package = %dir.display(),
            "the package or the runtime changed since the last calibration: calibrating again"
        );
        None
    }
}

/// Stores `decision` for the package in `dir` (write to a temporary file, then rename, so a
/// concurrent reader never sees half a file).
pub(crate) fn store(cache: &Path, dir: &Path, key: &CacheKey, decision: &TailDecision) {
    let file = cache.join(CACHE_FILE);
    let result = (|| -> Result<(), String> {
        std::fs::create_dir_all(cache).map_err(|e| e.to_string())?;
        let mut f = read(&file);
        f.entries.retain(|d, _| d.is_dir());
        let entry = Entry {
            key: key.clone(),
            decision: decision.clone(),
        };
        let entry = serde_json::to_value(entry).map_err(|e| e.to_string())?;
        f.entries.insert(package_key(dir), entry);
        let text = serde_json::to_string_pretty(&f).map_err(|e| e.to_string())?;
        let tmp = cache.join(format!("{CACHE_FILE}.{}.tmp", std::process::id()));
        std::fs::write(&tmp, text).map_err(|e| e.to_string())?;
        std::fs::rename(&tmp, &file).map_err(|e| e.to_string())
    })();
    match result {
        Ok(()) => tracing::debug!(file = %file.display(), "tail decision cached"),
        Err(e) => tracing::warn!(
            file = %file.display(), error = %e,
            "cannot cache the tail decision: the next start calibrates again"
        ),
    }
}

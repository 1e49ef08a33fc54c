//! The embedded demo model: a tiny random Qwen3.5 VLM (the `tiny-4b` test fixture: 4B-like
//! layer pattern and head ratios, 320 px tower, 640-token vocabulary) compiled into the binary,
//! so `vlm_node -p demo_model:=true` answers on any machine without a `model_dir`. On first
//! use it is written to a cache folder and turned into a sim package by the same code as
//! `vlm make-sim-package`; the folder name carries the simulator container version and a
//! hash of the files, so a new container version or new weights build a new package. It
//! answers with random tokens: it shows the plumbing, not the model.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use vlm_bpu::sim::{make_sim_package, PackageOptions};

const FILES: &[(&str, &[u8])] = &[
    (
        "config.json",
        include_bytes!("../tools/fixtures/models/tiny-4b/config.json"),
    ),
    (
        "generation_config.json",
        include_bytes!("../tools/fixtures/models/tiny-4b/generation_config.json"),
    ),
    (
        "model.safetensors",
        include_bytes!("../tools/fixtures/models/tiny-4b/model.safetensors"),
    ),
    (
        "tokenizer.json",
        include_bytes!("../tools/fixtures/models/tiny-4b/tokenizer.json"),
    ),
];

/// Window of the embedded package (rows): room for a few images and a conversation.
pub const CONTEXT: usize = 1024;

/// Errors writing the embedded model out.
#[derive(Debug, thiserror::Error)]
pub enum EmbeddedError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("building the embedded sim package: {0}")]
    Package(#[from] vlm_bpu::sim::PackageError),
    #[error("no cache folder: set the cache_dir parameter, XDG_CACHE_HOME or HOME")]
    NoCacheDir,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> EmbeddedError + '_ {
    move |source| EmbeddedError::Io {
        path: path.to_owned(),
        source,
    }
}

/// `cache_dir` parameter, else `$XDG_CACHE_HOME/bpu_vlm`, else `~/.cache/bpu_vlm`.
pub(crate) fn cache_root(param: Option<&Path>) -> Result<PathBuf, EmbeddedError> {
    if let Some(p) = param {
        return Ok(p.to_owned());
    }
    let env = |k| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    env("XDG_CACHE_HOME")
        .or_else(|| env("HOME").map(|h| h.join(".cache")))
        .map(|d| d.join("bpu_vlm"))
        .ok_or(EmbeddedError::NoCacheDir)
}

/// Folder name of the package for this build's files and container version.
pub(crate) fn package_key() -> String {
    // FNV-style hashing through std's SipHash with fixed keys is stable within a toolchain;
    // a different toolchain at worst rebuilds the package once.
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for (name, bytes) in FILES {
        name.hash(&mut h);
        bytes.hash(&mut h);
    }
    CONTEXT.hash(&mut h);
    format!(
        "tiny-4b-v{}-{:016x}",
        vlm_bpu::sim::CONTAINER_VERSION,
        h.finish()
    )
}

/// The sim package of the embedded model under `root`, built when missing.
pub fn ensure_package(root: &Path) -> Result<PathBuf, EmbeddedError> {
    let dir = root.join(package_key());
    let pkg = dir.join("package");
    if pkg.join("model.json").is_file() {
        tracing::debug!(package = %pkg.display(), "embedded sim package found");
        return Ok(pkg);
    }
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    // Build in a private folder, then rename: two nodes starting at once never see half a
    // package.
    let work = tempfile_dir(&dir)?;
    // The folder name becomes the package's `name` (logs, diagnostics).
    let hf = work.join("tiny-4b-embedded");
    std::fs::create_dir_all(&hf).map_err(io(&hf))?;
    for (name, bytes) in FILES {
        let p = hf.join(name);
        std::fs::write(&p, bytes).map_err(io(&p))?;
    }
    let out = work.join("package");
    let mut o = PackageOptions::new(&hf, &out);
    o.cache_len = CONTEXT;
    make_sim_package(&o)?;
    match std::fs::rename(&out, &pkg) {
        Ok(()) => {}
        // Another process won the race; its package is equivalent.
        Err(_) if pkg.join("model.json").is_file() => {}
        Err(e) => return Err(io(&pkg)(e)),
    }
    let _ = std::fs::remove_dir_all(&work);
    tracing::info!(package = %pkg.display(), "embedded sim package built");
    Ok(pkg)
}

fn tempfile_dir(parent: &Path) -> Result<PathBuf, EmbeddedError> {
    let p = parent.join(format!(".build-{}", std::process::id()));
    if p.exists() {
        std::fs::remove_dir_all(&p).map_err(io(&p))?;
    }
    std::fs::create_dir_all(&p).map_err(io(&p))?;
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn package_is_built_once_and_reused() {
        let root = tempfile::tempdir().unwrap();
        let a = ensure_package(root.path()).unwrap();
        assert!(a.join("model.json").is_file());
        assert!(a.ends_with("package"));
        let stamp = std::fs::metadata(a.join("model.hbm"))
            .unwrap()
            .modified()
            .unwrap();
        let b = ensure_package(root.path()).unwrap();
        assert_eq!(a, b);
        let again = std::fs::metadata(b.join("model.hbm"))
            .unwrap()
            .modified()
            .unwrap();
        assert_eq!(stamp, again);
        assert!(package_key().contains(&format!("-v{}-", vlm_bpu::sim::CONTAINER_VERSION)));
    }
}

//! The BLLM package manifest (`model.json`) with the contract's keys, types and defaults
//! (docs/package-contract.md §1.2, §1.4).
//!
//! The file is read into [`bllm_manifest::Manifest`], the type the sim-package writer writes,
//! then resolved here: defaults, paths against the package folder, value checks. Every known
//! key has its own default, so unknown keys (newer bllm versions) are ignored, while a known
//! key of the wrong type is an error naming the file and the key — the C++ loader would throw
//! a JSON type error there, and silently taking a default for, say, a string `"cache_len"`
//! would hide a broken package. Type errors come before value errors.

use std::path::{Path, PathBuf};

use bllm_manifest::{Chat, Manifest, ManifestError, Vision};
use serde_json::Value;

/// File name of the manifest inside a package folder.
pub const MANIFEST: &str = bllm_manifest::FILE_NAME;

/// CLIP normalisation constants, the contract's default for `vision.mean` / `vision.std`.
pub const CLIP_MEAN: [f32; 3] = [0.481_454_66, 0.457_827_5, 0.408_210_73];
/// See [`CLIP_MEAN`].
pub const CLIP_STD: [f32; 3] = [0.268_629_54, 0.261_302_6, 0.275_777_1];

/// Errors while reading or checking a package.
#[derive(Debug, thiserror::Error)]
pub enum PackageError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: invalid JSON: {source}", path.display())]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{}: the top level must be a JSON object", path.display())]
    NotAnObject { path: PathBuf },
    #[error("{}: key `{key}` must be {expected}, found {found}", path.display())]
    WrongType {
        path: PathBuf,
        key: String,
        expected: &'static str,
        found: String,
    },
    #[error("{}: key `{key}`: {reason}", path.display())]
    BadValue {
        path: PathBuf,
        key: String,
        reason: String,
    },
    #[error("{}: required key `{key}` is missing", path.display())]
    MissingKey { path: PathBuf, key: &'static str },
    #[error("{}: missing file(s): {}", manifest.display(), list_missing(.files))]
    MissingFiles {
        manifest: PathBuf,
        /// `(manifest key, resolved path)` of every file that does not exist.
        files: Vec<(String, PathBuf)>,
    },
}

fn list_missing(files: &[(String, PathBuf)]) -> String {
    files
        .iter()
        .map(|(k, p)| format!("{} (`{k}`)", p.display()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Chat marker format (`chat.format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChatFormat {
    ChatMl,
    Phi,
    None,
}

/// Chat-template family (`dialect`, bllm 0.8.0). Absent means plain ChatML.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dialect {
    /// Plain ChatML as bllm ≤ 0.5 renders it: thinking-on appends nothing.
    ChatMl,
    /// `"qwen3.5"`: the official template's opener, `<think>` split, XML tool calls.
    Qwen35,
    /// A value this runtime does not know; rendered as plain ChatML.
    Other(String),
}

/// `chat` object of the manifest.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatConfig {
    pub format: ChatFormat,
    /// Marker ids; `-1` in the file (the default) becomes `None` = look up by name.
    pub im_start: Option<u32>,
    pub im_end: Option<u32>,
    pub bos: Option<u32>,
    /// System prompt of the first turn.
    pub system: String,
}

/// `vision` object of the manifest (tower geometry and normalisation).
#[derive(Debug, Clone, PartialEq)]
pub struct VisionConfig {
    pub patch: u32,
    pub merge: u32,
    pub temporal: u32,
    pub mean: [f32; 3],
    pub std: [f32; 3],
}

/// A parsed `model.json`, paths resolved against the package folder.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// The manifest file itself (for messages).
    pub manifest: PathBuf,
    /// The package folder.
    pub dir: PathBuf,
    pub name: String,
    pub backend: String,
    pub arch: String,
    /// Decode graph name (default `qwen35`); the prefill graph is `<graph>_prefill`.
    pub graph: String,
    pub hbm: PathBuf,
    /// `hbm_prefill` as declared (resolved); the file may be absent, which is not an error.
    pub hbm_prefill: Option<PathBuf>,
    pub tokenizer: PathBuf,
    pub embed: Option<PathBuf>,
    /// Vision tower; `None` for text-only packages and when loaded with `vision: false`.
    pub visual: Option<PathBuf>,
    pub eos: Vec<u32>,
    /// Informational only: the runtime takes the window from the graph's mask.
    pub cache_len: u32,
    pub bpu_cores: u32,
    pub rope_theta: f64,
    /// Empty, or exactly three entries.
    pub mrope_section: Vec<u32>,
    pub mrope_interleaved: bool,
    pub vision: VisionConfig,
    pub chat: ChatConfig,
    /// bllm 0.8.0: the prefill graph accepts a padded tail.
    pub prefill_pads: bool,
    /// bllm 0.8.0: tails shorter than this are stepped; `None` = the chunk size (always step).
    pub prefill_min_tail: Option<u32>,
    pub dialect: Dialect,
    /// Image placeholder id for `generate`; `None` = the tokenizer's `<|image_pad|>`.
    pub image_token_id: Option<u32>,
}

/// How to load a package.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadOptions {
    /// `false`: drop `visual` from the configuration; its file is never checked or opened.
    pub vision: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self { vision: true }
    }
}

impl ModelConfig {
    /// Reads `<dir>/model.json` and checks that every file it names exists.
    pub fn load(dir: &Path, opts: LoadOptions) -> Result<Self, PackageError> {
        let cfg = Self::read(dir, opts)?;
        cfg.check_files()?;
        Ok(cfg)
    }

    /// Reads and validates `<dir>/model.json` without touching the files it names.
    pub fn read(dir: &Path, opts: LoadOptions) -> Result<Self, PackageError> {
        let manifest = dir.join(MANIFEST);
        let text = std::fs::read_to_string(&manifest).map_err(|source| PackageError::Read {
            path: manifest.clone(),
            source,
        })?;
        Self::parse(&text, dir, &manifest, opts)
    }

    /// Parses manifest text; `dir` resolves relative paths, `manifest` names the file in errors.
    pub fn parse(
        text: &str,
        dir: &Path,
        manifest: &Path,
        opts: LoadOptions,
    ) -> Result<Self, PackageError> {
        let value: Value = serde_json::from_str(text).map_err(|source| PackageError::Json {
            path: manifest.to_path_buf(),
            source,
        })?;
        let r = Resolver {
            file: manifest,
            dir,
        };
        let m = Manifest::from_value(value).map_err(|e| r.manifest_error(e))?;
        let (backend, arch) = r.engine(&m)?;
        let graph = m
            .graph
            .filter(|g| !g.is_empty())
            .unwrap_or_else(|| "qwen35".into());
        let hbm = r.path("hbm", m.hbm)?.ok_or_else(|| r.missing("hbm"))?;
        let hbm_prefill = r.path("hbm_prefill", m.hbm_prefill)?;
        let tokenizer = r
            .path("tokenizer", m.tokenizer)?
            .unwrap_or_else(|| dir.join("tokenizer.json"));
        let embed = Some(
            r.path("embed", m.embed)?
                .ok_or_else(|| r.missing("embed"))?,
        );
        // Checked even when the tower is not loaded: a name that leaves the folder is a
        // broken (or hostile) package either way.
        let visual = r.path("visual", m.visual)?;
        let bpu_cores = m.bpu_cores.unwrap_or(1);
        if bpu_cores == 0 {
            return Err(r.bad("bpu_cores", "must be at least 1"));
        }
        let rope_theta = m.rope_theta.unwrap_or(1e7);
        if !(rope_theta.is_finite() && rope_theta > 0.0) {
            return Err(r.bad("rope_theta", "must be a positive number"));
        }
        let mrope_section = m.mrope_section.unwrap_or_default();
        if !mrope_section.is_empty() && mrope_section.len() != 3 {
            return Err(r.bad("mrope_section", "must have exactly 3 entries (t, h, w)"));
        }
        let vision = r.vision(m.vision.unwrap_or_default())?;
        let chat = r.chat(m.chat.unwrap_or_default())?;
        let dialect = r.dialect(m.dialect);
        let visual = visual.filter(|_| opts.vision);
        if visual.is_some() && mrope_section.is_empty() {
            return Err(r.bad(
                "mrope_section",
                "required when `visual` is present (plain rope would collapse the whole patch grid onto one position)",
            ));
        }
        Ok(Self {
            manifest: manifest.to_path_buf(),
            dir: dir.to_path_buf(),
            name: m.name.unwrap_or_default(),
            backend,
            arch,
            graph,
            hbm,
            hbm_prefill,
            tokenizer,
            embed,
            visual,
            eos: m.eos.unwrap_or_default(),
            cache_len: m.cache_len.unwrap_or(0),
            bpu_cores,
            rope_theta,
            mrope_section,
            mrope_interleaved: m.mrope_interleaved.unwrap_or(false),
            vision,
            chat,
            prefill_pads: m.prefill_pads.unwrap_or(false),
            prefill_min_tail: m.prefill_min_tail,
            dialect,
            image_token_id: m.image_token_id,
        })
    }

    /// Fails naming every required file that does not exist. A declared `hbm_prefill` that is
    /// missing is only logged: the prefill graph may live in `model.hbm`, or be absent.
    pub fn check_files(&self) -> Result<(), PackageError> {
        let mut required: Vec<(&str, &Path)> =
            vec![("hbm", &self.hbm), ("tokenizer", &self.tokenizer)];
        if let Some(e) = &self.embed {
            required.push(("embed", e));
        }
        if let Some(v) = &self.visual {
            required.push(("visual", v));
        }
        let files: Vec<(String, PathBuf)> = required
            .into_iter()
            .filter(|(_, p)| !p.is_file())
            .map(|(k, p)| (k.to_string(), p.to_path_buf()))
            .collect();
        if !files.is_empty() {
            return Err(PackageError::MissingFiles {
                manifest: self.manifest.clone(),
                files,
            });
        }
        if let Some(p) = &self.hbm_prefill {
            if !p.is_file() {
                tracing::warn!(
                    file = %p.display(),
                    "hbm_prefill names a missing file; looking for the prefill graph in hbm"
                );
            }
        }
        Ok(())
    }

    /// The declared prefill `.hbm` if the file exists.
    pub fn existing_hbm_prefill(&self) -> Option<&Path> {
        self.hbm_prefill.as_deref().filter(|p| p.is_file())
    }

    /// Name of the prefill graph inside the packed handle.
    pub fn prefill_graph(&self) -> String {
        format!("{}_prefill", self.graph)
    }

    /// Whether this configuration carries a vision tower.
    pub fn has_vision(&self) -> bool {
        self.visual.is_some()
    }
}

/// Resolves a [`Manifest`]: defaults, paths against the package folder, value checks, and
/// errors naming the file.
struct Resolver<'a> {
    file: &'a Path,
    dir: &'a Path,
}

impl Resolver<'_> {
    fn manifest_error(&self, e: ManifestError) -> PackageError {
        let path = self.file.to_path_buf();
        match e {
            ManifestError::NotAnObject => PackageError::NotAnObject { path },
            ManifestError::WrongType {
                key,
                expected,
                found,
            } => PackageError::WrongType {
                path,
                key,
                expected,
                found,
            },
            ManifestError::OutOfRange { key, value } => PackageError::BadValue {
                path,
                key,
                reason: format!("{value} is out of range (0..=4294967295)"),
            },
            ManifestError::Length { key, found } => PackageError::BadValue {
                path,
                key,
                reason: format!("must have exactly 3 entries, found {found}"),
            },
            ManifestError::Decode(source) => PackageError::Json { path, source },
        }
    }

    fn bad(&self, key: &str, reason: impl Into<String>) -> PackageError {
        PackageError::BadValue {
            path: self.file.to_path_buf(),
            key: key.to_string(),
            reason: reason.into(),
        }
    }

    fn missing(&self, key: &'static str) -> PackageError {
        PackageError::MissingKey {
            path: self.file.to_path_buf(),
            key,
        }
    }

    /// A declared file of manifest key `key`, inside the package folder; an empty string is
    /// no file. Only a plain file name is accepted — no absolute path, no `.` or `..`, no
    /// path separator — so a package can name no file outside its folder.
    fn path(&self, key: &str, p: Option<String>) -> Result<Option<PathBuf>, PackageError> {
        let Some(name) = p.filter(|s| !s.is_empty()) else {
            return Ok(None);
        };
        if name == "." || name == ".." || name.contains(['/', '\\', '\0']) {
            return Err(self.bad(
                key,
                format!(
                    "{name:?} is not a plain file name inside the package folder (no absolute \
                     path, no `..`, no path separator)"
                ),
            ));
        }
        Ok(Some(self.dir.join(name)))
    }

    /// `(backend, arch)`: this runtime runs `hybrid` packages, and not through libxlm.
    fn engine(&self, m: &Manifest) -> Result<(String, String), PackageError> {
        let backend = m.backend.clone().unwrap_or_else(|| "auto".into());
        if backend == "libxlm" {
            return Err(self.bad(
                "backend",
                "\"libxlm\" packages need D-Robotics' LLM SDK, which this runtime does not use",
            ));
        }
        let arch = m.arch.clone().unwrap_or_else(|| "dense".into());
        if arch != "hybrid" {
            return Err(self.bad(
                "arch",
                format!(
                    "\"{arch}\" is not supported; this runtime runs Qwen3.5 \"hybrid\" packages"
                ),
            ));
        }
        Ok((backend, arch))
    }

    fn vision(&self, v: Vision) -> Result<VisionConfig, PackageError> {
        let f32s = |t: [f64; 3]| t.map(|x| x as f32);
        let vision = VisionConfig {
            patch: v.patch.unwrap_or(14),
            merge: v.merge.unwrap_or(2),
            temporal: v.temporal.unwrap_or(2),
            mean: v.mean.map_or(CLIP_MEAN, f32s),
            std: v.std.map_or(CLIP_STD, f32s),
        };
        for (key, v) in [
            ("vision.patch", vision.patch),
            ("vision.merge", vision.merge),
            ("vision.temporal", vision.temporal),
        ] {
            if v == 0 {
                return Err(self.bad(key, "must be at least 1"));
            }
        }
        // The tower's patch row is 3·T·P² values and a merge block P·M pixels wide: sizes
        // the runtime multiplies, so a product that does not fit is refused here.
        let (p, m, t) = (
            u64::from(vision.patch),
            u64::from(vision.merge),
            u64::from(vision.temporal),
        );
        let row = p
            .checked_mul(p)
            .and_then(|x| x.checked_mul(t))
            .and_then(|x| x.checked_mul(3 * 4))
            .filter(|&x| usize::try_from(x).is_ok());
        if row.is_none() {
            return Err(self.bad(
                "vision.patch",
                format!("a patch row of 3 × temporal {t} × patch {p}² f32 values overflows"),
            ));
        }
        if p.checked_mul(m).is_none_or(|x| u32::try_from(x).is_err()) {
            return Err(self.bad(
                "vision.merge",
                format!("patch {p} × merge {m} is out of range"),
            ));
        }
        if vision.std.iter().any(|s| *s == 0.0 || !s.is_finite()) {
            return Err(self.bad("vision.std", "entries must be finite and non-zero"));
        }
        Ok(vision)
    }

    fn chat(&self, c: Chat) -> Result<ChatConfig, PackageError> {
        let format = match c.format.as_deref() {
            None | Some("chatml") => ChatFormat::ChatMl,
            Some("phi") => ChatFormat::Phi,
            Some("none") => ChatFormat::None,
            Some(other) => {
                return Err(self.bad(
                    "chat.format",
                    format!("unknown format \"{other}\" (chatml, phi, none)"),
                ))
            }
        };
        Ok(ChatConfig {
            format,
            im_start: self.marker("im_start", c.im_start)?,
            im_end: self.marker("im_end", c.im_end)?,
            bos: self.marker("bos", c.bos)?,
            system: c
                .system
                .unwrap_or_else(|| "You are a helpful assistant.".into()),
        })
    }

    /// `chat.<key>` marker id: `-1` (or any negative) means "none".
    fn marker(&self, key: &str, id: Option<i64>) -> Result<Option<u32>, PackageError> {
        match id {
            None => Ok(None),
            Some(i) if i < 0 => Ok(None),
            Some(i) => u32::try_from(i)
                .map(Some)
                .map_err(|_| self.bad(&format!("chat.{key}"), format!("{i} is out of range"))),
        }
    }

    fn dialect(&self, d: Option<String>) -> Dialect {
        match d.as_deref() {
            None | Some("") | Some("chatml") => Dialect::ChatMl,
            Some("qwen3.5") => Dialect::Qwen35,
            Some(other) => {
                tracing::warn!(
                    manifest = %self.file.display(),
                    dialect = other,
                    "unknown dialect; rendering plain ChatML"
                );
                Dialect::Other(other.to_string())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PUBLISHED_LIKE: &str = r#"{
        "name": "qwen3.5-4b-ctx4k", "arch": "hybrid", "backend": "native",
        "hbm": "model.hbm", "hbm_prefill": "model_prefill.hbm", "tokenizer": "tokenizer.json",
        "embed": "embed_tokens.bin", "visual": "visual.hbm", "eos": [248046, 248044],
        "cache_len": 4096, "chat": {"format": "chatml", "im_start": 248045, "im_end": 248046,
        "system": "You are a robot."}, "graph": "qwen35", "rope_theta": 10000000,
        "mrope_section": [11, 11, 10], "mrope_interleaved": true,
        "vision": {"patch": 16, "merge": 2, "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]},
        "prefill_pads": true, "prefill_min_tail": 5, "dialect": "qwen3.5",
        "some_future_key": {"x": [1, 2]}
    }"#;

    fn parse(text: &str) -> Result<ModelConfig, PackageError> {
        ModelConfig::parse(
            text,
            Path::new("/pkg"),
            Path::new("/pkg/model.json"),
            LoadOptions::default(),
        )
    }

    #[test]
    fn published_manifest_parses_with_all_keys() {
        let c = parse(PUBLISHED_LIKE).unwrap();
        assert_eq!(c.name, "qwen3.5-4b-ctx4k");
        assert_eq!(c.hbm, PathBuf::from("/pkg/model.hbm"));
        assert_eq!(c.hbm_prefill, Some(PathBuf::from("/pkg/model_prefill.hbm")));
        assert_eq!(c.visual, Some(PathBuf::from("/pkg/visual.hbm")));
        assert_eq!(c.eos, vec![248046, 248044]);
        assert_eq!(c.cache_len, 4096);
        assert_eq!(c.rope_theta, 1e7);
        assert_eq!(c.mrope_section, vec![11, 11, 10]);
        assert!(c.mrope_interleaved);
        assert_eq!(c.vision.patch, 16);
        assert_eq!(c.vision.temporal, 2, "temporal is never written; default 2");
        assert_eq!(c.vision.mean, [0.5; 3]);
        assert_eq!(c.chat.im_start, Some(248045));
        assert_eq!(c.chat.bos, None);
        assert_eq!(c.chat.system, "You are a robot.");
        assert!(c.prefill_pads);
        assert_eq!(c.prefill_min_tail, Some(5));
        assert_eq!(c.dialect, Dialect::Qwen35);
        assert_eq!(c.prefill_graph(), "qwen35_prefill");
        assert_eq!(c.image_token_id, None);
    }

    #[test]
    fn defaults_apply_when_keys_are_absent() {
        let c = parse(r#"{"arch":"hybrid","hbm":"m.hbm","embed":"e.bin"}"#).unwrap();
        assert_eq!(c.tokenizer, PathBuf::from("/pkg/tokenizer.json"));
        assert_eq!(c.embed, Some(PathBuf::from("/pkg/e.bin")));
        assert_eq!(c.graph, "qwen35");
        assert_eq!(c.backend, "auto");
        assert_eq!(c.bpu_cores, 1);
        assert_eq!(c.cache_len, 0);
        assert_eq!(c.rope_theta, 1e7);
        assert_eq!(c.vision.patch, 14);
        assert_eq!(c.vision.mean, CLIP_MEAN);
        assert_eq!(c.vision.std, CLIP_STD);
        assert_eq!(c.chat.format, ChatFormat::ChatMl);
        assert_eq!(c.chat.system, "You are a helpful assistant.");
        assert!(!c.prefill_pads);
        assert_eq!(c.prefill_min_tail, None);
        assert_eq!(c.dialect, Dialect::ChatMl);
        assert!(c.visual.is_none() && c.hbm_prefill.is_none());
    }

    fn with(key_json: &str) -> String {
        format!(r#"{{"arch":"hybrid","hbm":"m.hbm","embed":"e.bin",{key_json}}}"#)
    }

    /// Every file key takes only a plain name inside the package folder: an absolute path,
    /// `..`, `.` or a separator is refused naming the key, with vision loaded or not.
    #[test]
    fn file_names_stay_inside_the_package() {
        let keys = ["hbm", "hbm_prefill", "tokenizer", "embed", "visual"];
        for key in keys {
            for bad in [
                "/etc/passwd",
                "..",
                ".",
                "../model.hbm",
                "sub/model.hbm",
                "sub\\model.hbm",
                "a\0b",
            ] {
                let mut m = serde_json::json!({
                    "arch": "hybrid", "hbm": "m.hbm", "embed": "e.bin",
                    "mrope_section": [1, 1, 1],
                });
                m[key] = Value::from(bad);
                for vision in [true, false] {
                    let err = ModelConfig::parse(
                        &m.to_string(),
                        Path::new("/pkg"),
                        Path::new("/pkg/model.json"),
                        LoadOptions { vision },
                    )
                    .unwrap_err();
                    match &err {
                        PackageError::BadValue { key: k, reason, .. } => {
                            assert_eq!(k, key, "{bad}");
                            assert!(reason.contains("plain file name"), "{reason}");
                        }
                        other => panic!("{key} = {bad:?}: expected BadValue, got {other}"),
                    }
                    assert!(err.to_string().contains(key), "{err}");
                }
            }
        }
        let c = parse(&with(
            r#""visual":"..visual.hbm","tokenizer":"tok.json","mrope_section":[1,1,1]"#,
        ))
        .unwrap();
        assert_eq!(
            c.visual,
            Some(PathBuf::from("/pkg/..visual.hbm")),
            "a plain name"
        );
        assert_eq!(c.tokenizer, PathBuf::from("/pkg/tok.json"));
    }

    /// Tower sizes the runtime multiplies are refused when their product does not fit.
    #[test]
    fn vision_sizes_that_overflow_are_refused() {
        for (vision, key) in [
            (
                r#"{"patch":4294967295,"temporal":4294967295}"#,
                "vision.patch",
            ),
            (r#"{"patch":4294967295}"#, "vision.patch"),
            (r#"{"patch":65536,"merge":65536}"#, "vision.merge"),
        ] {
            match parse(&with(&format!(r#""vision":{vision}"#))) {
                Err(PackageError::BadValue { key: k, .. }) => assert_eq!(k, key, "{vision}"),
                other => panic!("{vision}: {other:?}"),
            }
        }
        let c = parse(&with(r#""vision":{"patch":16,"merge":2,"temporal":2}"#)).unwrap();
        assert_eq!(c.vision.patch, 16);
    }

    #[test]
    fn wrong_types_name_the_file_and_key() {
        for (json, key) in [
            (r#""cache_len":"4096""#, "cache_len"),
            (r#""cache_len":4096.5"#, "cache_len"),
            (r#""eos":248046"#, "eos"),
            (r#""eos":[248046,"x"]"#, "eos"),
            (r#""prefill_pads":"yes""#, "prefill_pads"),
            (r#""prefill_min_tail":5.0"#, "prefill_min_tail"),
            (r#""dialect":3"#, "dialect"),
            (r#""image_token_id":"248056""#, "image_token_id"),
            (r#""chat":{"im_start":"x"}"#, "chat.im_start"),
            (r#""chat":{"system":null}"#, "chat.system"),
            (r#""vision":{"patch":"16"}"#, "vision.patch"),
            (r#""vision":[16]"#, "vision"),
            (r#""mrope_interleaved":1"#, "mrope_interleaved"),
            (r#""rope_theta":"1e7""#, "rope_theta"),
            (r#""hbm_prefill":false"#, "hbm_prefill"),
        ] {
            let err = parse(&with(json)).unwrap_err();
            match &err {
                PackageError::WrongType { path, key: k, .. } => {
                    assert_eq!(path, Path::new("/pkg/model.json"));
                    assert_eq!(k, key, "{json}");
                }
                other => panic!("{json}: expected WrongType, got {other}"),
            }
            let msg = err.to_string();
            assert!(
                msg.contains("/pkg/model.json") && msg.contains(key),
                "{msg}"
            );
        }
    }

    #[test]
    fn bad_values_are_rejected() {
        for (json, key) in [
            (r#""backend":"libxlm""#, "backend"),
            (r#""cache_len":-1"#, "cache_len"),
            (r#""vision":{"mean":[0.5,0.5]}"#, "vision.mean"),
            (r#""mrope_section":[11,11]"#, "mrope_section"),
            (r#""visual":"v.hbm""#, "mrope_section"),
            (r#""chat":{"format":"llama"}"#, "chat.format"),
            (r#""bpu_cores":0"#, "bpu_cores"),
        ] {
            match parse(&with(json)).unwrap_err() {
                PackageError::BadValue { key: k, .. } => assert_eq!(k, key, "{json}"),
                other => panic!("{json}: expected BadValue, got {other}"),
            }
        }
        assert!(matches!(
            parse(r#"{"arch":"hybrid","embed":"e"}"#),
            Err(PackageError::MissingKey { key: "hbm", .. })
        ));
        assert!(matches!(
            parse(r#"{"arch":"hybrid","hbm":"m"}"#),
            Err(PackageError::MissingKey { key: "embed", .. })
        ));
        assert!(matches!(
            parse("[1]"),
            Err(PackageError::NotAnObject { .. })
        ));
        assert!(matches!(parse("{"), Err(PackageError::Json { .. })));
        assert!(matches!(
            parse(r#"{"arch":"dense","hbm":"m","embed":"e"}"#),
            Err(PackageError::BadValue { .. })
        ));
    }

    /// What the sim-package writer builds (`bpu_sim::make_sim_package`), through JSON, reads
    /// back with the same meaning.
    #[test]
    fn a_written_manifest_reads_back() {
        let written = Manifest {
            name: Some("tiny".into()),
            arch: Some("hybrid".into()),
            backend: Some("native".into()),
            graph: Some("qwen35".into()),
            hbm: Some("model.hbm".into()),
            hbm_prefill: Some("model_prefill.hbm".into()),
            embed: Some("embed_tokens.bin".into()),
            tokenizer: Some("tokenizer.json".into()),
            eos: Some(vec![248046, 248044]),
            chat: Some(Chat {
                format: Some("chatml".into()),
                im_start: Some(248045),
                im_end: Some(-1),
                bos: None,
                system: Some("Be brief.".into()),
            }),
            rope_theta: Some(1e7),
            cache_len: Some(512),
            prefill_pads: Some(true),
            prefill_min_tail: Some(32),
            dialect: Some("qwen3.5".into()),
            image_token_id: Some(248056),
            visual: Some("visual.hbm".into()),
            mrope_section: Some(vec![11, 11, 10]),
            mrope_interleaved: Some(true),
            vision: Some(Vision {
                patch: Some(16),
                merge: Some(2),
                mean: Some([0.5; 3]),
                std: Some([0.5; 3]),
                ..Vision::default()
            }),
            bpu_cores: None,
        };
        let c = parse(&written.to_json_pretty().unwrap()).unwrap();
        assert_eq!(c.name, "tiny");
        assert_eq!(c.backend, "native");
        assert_eq!(c.graph, "qwen35");
        assert_eq!(c.hbm, PathBuf::from("/pkg/model.hbm"));
        assert_eq!(c.hbm_prefill, Some(PathBuf::from("/pkg/model_prefill.hbm")));
        assert_eq!(c.embed, Some(PathBuf::from("/pkg/embed_tokens.bin")));
        assert_eq!(c.tokenizer, PathBuf::from("/pkg/tokenizer.json"));
        assert_eq!(c.visual, Some(PathBuf::from("/pkg/visual.hbm")));
        assert_eq!(c.eos, vec![248046, 248044]);
        assert_eq!(c.chat.format, ChatFormat::ChatMl);
        assert_eq!(
            (c.chat.im_start, c.chat.im_end, c.chat.bos),
            (Some(248045), None, None)
        );
        assert_eq!(c.chat.system, "Be brief.");
        assert_eq!(c.rope_theta, 1e7);
        assert_eq!(c.cache_len, 512);
        assert_eq!(c.bpu_cores, 1);
        assert!(c.prefill_pads);
        assert_eq!(c.prefill_min_tail, Some(32));
        assert_eq!(c.dialect, Dialect::Qwen35);
        assert_eq!(c.image_token_id, Some(248056));
        assert_eq!(c.mrope_section, vec![11, 11, 10]);
        assert!(c.mrope_interleaved);
        assert_eq!(
            c.vision,
            VisionConfig {
                patch: 16,
                merge: 2,
                temporal: 2,
                mean: [0.5; 3],
                std: [0.5; 3],
            }
        );
    }

    #[test]
    fn out_of_range_integers_and_null_keys_keep_their_errors() {
        match parse(&with(r#""eos":[1,-2]"#)).unwrap_err() {
            PackageError::BadValue { key, reason, .. } => {
                assert_eq!(key, "eos");
                assert_eq!(reason, "-2 is out of range (0..=4294967295)");
            }
            other => panic!("{other}"),
        }
        match parse(&with(r#""chat":{"bos":4294967296}"#)).unwrap_err() {
            PackageError::BadValue { key, reason, .. } => {
                assert_eq!(key, "chat.bos");
                assert_eq!(reason, "4294967296 is out of range");
            }
            other => panic!("{other}"),
        }
        let err = parse(&with(r#""name":null"#)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "/pkg/model.json: key `name` must be a string, found null"
        );
        let err = parse(&with(r#""vision":{"std":[1,2]}"#)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "/pkg/model.json: key `vision.std`: must have exactly 3 entries, found 2"
        );
    }

    #[test]
    fn chat_markers_minus_one_mean_none_and_image_token_is_honoured() {
        let c = parse(&with(
            r#""chat":{"im_start":-1,"bos":5},"image_token_id":248056,"dialect":"future""#,
        ))
        .unwrap();
        assert_eq!(c.chat.im_start, None);
        assert_eq!(c.chat.bos, Some(5));
        assert_eq!(c.image_token_id, Some(248056));
        assert_eq!(c.dialect, Dialect::Other("future".into()));
    }

    #[test]
    fn vision_false_drops_the_tower_and_its_requirements() {
        let text = with(r#""visual":"visual.hbm""#);
        let c = ModelConfig::parse(
            &text,
            Path::new("/pkg"),
            Path::new("/pkg/model.json"),
            LoadOptions { vision: false },
        )
        .unwrap();
        assert!(!c.has_vision());
    }

    #[test]
    fn load_checks_files_and_names_the_missing_ones() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("model.json"), PUBLISHED_LIKE).unwrap();
        for f in ["model.hbm", "tokenizer.json"] {
            std::fs::write(dir.path().join(f), b"x").unwrap();
        }
        let err = ModelConfig::load(dir.path(), LoadOptions::default()).unwrap_err();
        let PackageError::MissingFiles { files, .. } = &err else {
            panic!("expected MissingFiles, got {err}");
        };
        let keys: Vec<&str> = files.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["embed", "visual"]);
        assert!(err.to_string().contains("embed_tokens.bin"));

        // Text-only load never asks for visual.hbm; a missing prefill file is not an error.
        std::fs::write(dir.path().join("embed_tokens.bin"), b"x").unwrap();
        let c = ModelConfig::load(dir.path(), LoadOptions { vision: false }).unwrap();
        assert!(c.visual.is_none());
        assert_eq!(c.existing_hbm_prefill(), None);
        std::fs::write(dir.path().join("model_prefill.hbm"), b"x").unwrap();
        let c = ModelConfig::load(dir.path(), LoadOptions { vision: false }).unwrap();
        assert_eq!(
            c.existing_hbm_prefill(),
            Some(dir.path().join("model_prefill.hbm").as_path())
        );
        assert!(matches!(
            ModelConfig::load(dir.path(), LoadOptions::default()),
            Err(PackageError::MissingFiles { .. })
        ));
        assert!(matches!(
            ModelConfig::load(&dir.path().join("nope"), LoadOptions::default()),
            Err(PackageError::Read { .. })
        ));
    }
}

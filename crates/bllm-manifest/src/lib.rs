//! The BLLM package manifest, `model.json`, as one serde type: [`Manifest`] is what
//! `bpu-sim`'s package writer serialises and what `vlm::package` reads. Keys, types, defaults
//! and meanings: docs/package-contract.md §1.2 ("Keys the runtime reads") and §1.4 (the keys
//! of bllm 0.8.0).
//!
//! The type holds the keys as the file has them. Every key is optional: an absent key is
//! `None` and is not written. No default is applied and no path resolved here; that, and the
//! checks of values (a positive `rope_theta`, three `mrope_section` entries …), is the
//! reader's (`vlm::package`). Unknown keys (newer bllm versions) are ignored when reading and
//! never written. A present key must have its type: `null` is a wrong type, not an absent key.
//!
//! [`Manifest::from_value`] is the reader's entry. It checks the JSON type of every known key
//! first, in the order of the contract's table, so that a wrong one is reported by key with
//! what was expected and what was found, and only then deserialises.
#![forbid(unsafe_code)]

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

/// File name of the manifest inside a package folder.
pub const FILE_NAME: &str = "model.json";

/// The top level of `model.json` (docs/package-contract.md §1.2, §1.4). Paths are written as
/// in the file: relative ones resolve against the package folder.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Manifest {
    /// `name`: display name (reader's default `""`).
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub name: Option<String>,
    /// `backend` (default `"auto"`); `"libxlm"` is refused by the reader.
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub backend: Option<String>,
    /// `arch` (default `"dense"`); `"hybrid"` is the Qwen3.5 engine, the only one run here.
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub arch: Option<String>,
    /// `graph`: decode graph name (default `"qwen35"`); the prefill graph is `<graph>_prefill`.
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub graph: Option<String>,
    /// `hbm`: the decode `.hbm` (required).
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub hbm: Option<String>,
    /// `hbm_prefill`: an extra `.hbm` with the prefill graph; a missing file is not an error.
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub hbm_prefill: Option<String>,
    /// `tokenizer`: HF tokenizers JSON (default `tokenizer.json`).
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub tokenizer: Option<String>,
    /// `embed`: the fp16 embedding table (required for hybrid packages).
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub embed: Option<String>,
    /// `visual`: the vision tower; present = a VLM.
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub visual: Option<String>,
    /// `eos`: stop ids (default empty; §1.3).
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub eos: Option<Vec<u32>>,
    /// `cache_len`: informational only, the window comes from the graph (default 0).
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub cache_len: Option<u32>,
    /// `bpu_cores` (default 1): more than 1 binds tasks to cores `0..N-1`.
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub bpu_cores: Option<u32>,
    /// `rope_theta`: rope base (default 1e7).
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub rope_theta: Option<f64>,
    /// `mrope_section`: `[t, h, w]` (default empty); required with `visual`.
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub mrope_section: Option<Vec<u32>>,
    /// `mrope_interleaved` (default false); true for Qwen3.5.
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub mrope_interleaved: Option<bool>,
    /// `vision`: tower geometry and normalisation.
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub vision: Option<Vision>,
    /// `chat`: marker format, marker ids and system prompt.
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub chat: Option<Chat>,
    /// `prefill_pads` (bllm 0.8.0, §1.4): the prefill graph accepts a padded tail (default
    /// false).
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub prefill_pads: Option<bool>,
    /// `prefill_min_tail` (bllm 0.8.0, §1.4): shorter tails are stepped (default: the chunk
    /// size, i.e. every tail is stepped).
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub prefill_min_tail: Option<u32>,
    /// `dialect` (bllm 0.8.0, §1.4): chat-template family, `"qwen3.5"`; absent, `""` or
    /// `"chatml"` is plain ChatML.
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub dialect: Option<String>,
    /// `image_token_id` (this project, §1.2): the image placeholder id for `vlm generate`;
    /// absent = the tokenizer's `<|image_pad|>`.
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub image_token_id: Option<u32>,
}

/// The `vision` object (docs/package-contract.md §1.2).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Vision {
    /// `vision.patch`: patch side in pixels (default 14; Qwen3.5 16).
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub patch: Option<u32>,
    /// `vision.merge`: merge-block side in patches (default 2).
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub merge: Option<u32>,
    /// `vision.temporal`: frames per patch (default 2).
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub temporal: Option<u32>,
    /// `vision.mean`: per-channel normalisation mean (default the CLIP constants).
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub mean: Option<[f64; 3]>,
    /// `vision.std`: per-channel normalisation deviation (default the CLIP constants).
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub std: Option<[f64; 3]>,
}

/// The `chat` object (docs/package-contract.md §1.2, §1.3).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Chat {
    /// `chat.format`: `"chatml"` (default), `"phi"` or `"none"`.
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub format: Option<String>,
    /// `chat.im_start`: marker id; `-1` (the default) or any negative = none, look up by name.
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub im_start: Option<i64>,
    /// `chat.im_end`: as `im_start`.
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub im_end: Option<i64>,
    /// `chat.bos`: as `im_start`.
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub bos: Option<i64>,
    /// `chat.system`: system prompt of the first turn (default "You are a helpful assistant.").
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "present")]
    pub system: Option<String>,
}

/// A present key: `null` is refused like any other wrong type (absent keys never get here,
/// `#[serde(default)]` fills them).
fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

/// Why a manifest value is not a [`Manifest`]. Keys are full (`vision.patch`, `chat.bos`).
#[derive(Debug)]
pub enum ManifestError {
    /// The top level is not a JSON object.
    NotAnObject,
    /// A known key has the wrong JSON type.
    WrongType {
        key: String,
        /// What the key must be, e.g. "an integer", "an array of 3 numbers".
        expected: &'static str,
        /// What it is, from [`describe`].
        found: String,
    },
    /// An integer (or a list entry) outside `0..=u32::MAX`.
    OutOfRange { key: String, value: i64 },
    /// A list that must have exactly three entries has `found`.
    Length { key: String, found: usize },
    /// Deserialising failed after the key checks passed (the checks and the type disagree).
    Decode(serde_json::Error),
}

impl std::fmt::Display for ManifestError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NotAnObject => write!(f, "the top level must be a JSON object"),
            Self::WrongType {
                key,
                expected,
                found,
            } => write!(f, "key `{key}` must be {expected}, found {found}"),
            Self::OutOfRange { key, value } => {
                write!(f, "key `{key}`: {value} is out of range (0..=4294967295)")
            }
            Self::Length { key, found } => {
                write!(f, "key `{key}`: must have exactly 3 entries, found {found}")
            }
            Self::Decode(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ManifestError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Decode(e) => Some(e),
            _ => None,
        }
    }
}

/// A JSON value as an error message names it: `string "4096"`, `number 5.0`, `an array` ….
pub fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Number(n) => format!("number {n}"),
        Value::String(s) => format!("string {s:?}"),
        Value::Array(_) => "an array".into(),
        Value::Object(_) => "an object".into(),
    }
}

impl Manifest {
    /// Reads a parsed `model.json`: checks the type of every known key (the first wrong one,
    /// in the contract's key order, is the error), then deserialises. Unknown keys are ignored.
    pub fn from_value(value: Value) -> Result<Self, ManifestError> {
        let Value::Object(root) = value else {
            return Err(ManifestError::NotAnObject);
        };
        check_keys(&root, "", KEYS)?;
        serde_json::from_value(Value::Object(root)).map_err(ManifestError::Decode)
    }

    /// The manifest as the text of a `model.json` file.
    pub fn to_json_pretty(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string_pretty(self)
    }
}

/// The JSON type a key must have.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Str,
    Bool,
    /// An integer in `0..=u32::MAX`.
    U32,
    /// Any number.
    Number,
    /// An array of integers in `0..=u32::MAX`.
    U32List,
    /// An array of exactly three numbers.
    Triple,
    /// Any integer (chat marker ids, where negative means none).
    Marker,
    /// An object with these keys.
    Object(&'static [(&'static str, Kind)]),
}

/// Every key [`Manifest`] has, with its type, in the order the contract lists them.
const KEYS: &[(&str, Kind)] = &[
    ("name", Kind::Str),
    ("backend", Kind::Str),
    ("arch", Kind::Str),
    ("graph", Kind::Str),
    ("hbm", Kind::Str),
    ("hbm_prefill", Kind::Str),
    ("tokenizer", Kind::Str),
    ("embed", Kind::Str),
    ("visual", Kind::Str),
    ("eos", Kind::U32List),
    ("cache_len", Kind::U32),
    ("bpu_cores", Kind::U32),
    ("rope_theta", Kind::Number),
    ("mrope_section", Kind::U32List),
    ("mrope_interleaved", Kind::Bool),
    ("vision", Kind::Object(VISION_KEYS)),
    ("chat", Kind::Object(CHAT_KEYS)),
    ("prefill_pads", Kind::Bool),
    ("prefill_min_tail", Kind::U32),
    ("dialect", Kind::Str),
    ("image_token_id", Kind::U32),
];

const VISION_KEYS: &[(&str, Kind)] = &[
    ("patch", Kind::U32),
    ("merge", Kind::U32),
    ("temporal", Kind::U32),
    ("mean", Kind::Triple),
    ("std", Kind::Triple),
];

const CHAT_KEYS: &[(&str, Kind)] = &[
    ("format", Kind::Str),
    ("im_start", Kind::Marker),
    ("im_end", Kind::Marker),
    ("bos", Kind::Marker),
    ("system", Kind::Str),
];

fn check_keys(
    m: &Map<String, Value>,
    prefix: &str,
    keys: &[(&str, Kind)],
) -> Result<(), ManifestError> {
    for &(key, kind) in keys {
        if let Some(v) = m.get(key) {
            check_value(v, &format!("{prefix}{key}"), kind)?;
        }
    }
    Ok(())
}

fn wrong(key: &str, expected: &'static str, found: &Value) -> ManifestError {
    ManifestError::WrongType {
        key: key.to_string(),
        expected,
        found: describe(found),
    }
}

/// An integer that fits `i64` (a larger one is not an integer to the reader either).
fn integer(v: &Value, key: &str) -> Result<i64, ManifestError> {
    v.as_i64()
        .filter(|_| v.is_i64() || v.is_u64())
        .ok_or_else(|| wrong(key, "an integer", v))
}

fn check_u32(v: &Value, key: &str) -> Result<(), ManifestError> {
    let i = integer(v, key)?;
    u32::try_from(i)
        .map(drop)
        .map_err(|_| ManifestError::OutOfRange {
            key: key.to_string(),
            value: i,
        })
}

fn check_value(v: &Value, key: &str, kind: Kind) -> Result<(), ManifestError> {
    match (kind, v) {
        (Kind::Str, Value::String(_))
        | (Kind::Bool, Value::Bool(_))
        | (Kind::Number, Value::Number(_)) => Ok(()),
        (Kind::Str, _) => Err(wrong(key, "a string", v)),
        (Kind::Bool, _) => Err(wrong(key, "a boolean", v)),
        (Kind::Number, _) => Err(wrong(key, "a number", v)),
        (Kind::U32, _) => check_u32(v, key),
        (Kind::Marker, _) => integer(v, key).map(drop),
        (Kind::U32List, Value::Array(items)) => {
            for item in items {
                if !(item.is_i64() || item.is_u64()) {
                    return Err(wrong(key, "an array of integers", item));
                }
                check_u32(item, key)?;
            }
            Ok(())
        }
        (Kind::U32List, _) => Err(wrong(key, "an array of integers", v)),
        (Kind::Triple, Value::Array(items)) => {
            if items.len() != 3 {
                return Err(ManifestError::Length {
                    key: key.to_string(),
                    found: items.len(),
                });
            }
            match items.iter().find(|x| !x.is_number()) {
                Some(x) => Err(wrong(key, "an array of 3 numbers", x)),
                None => Ok(()),
            }
        }
        (Kind::Triple, _) => Err(wrong(key, "an array of 3 numbers", v)),
        (Kind::Object(keys), Value::Object(o)) => check_keys(o, &format!("{key}."), keys),
        (Kind::Object(_), _) => Err(wrong(key, "an object", v)),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use serde_json::json;

    /// Every key set: what the contract's table lists.
    fn full() -> Manifest {
        Manifest {
            name: Some("qwen3.5-4b-ctx4k".into()),
            backend: Some("native".into()),
            arch: Some("hybrid".into()),
            graph: Some("qwen35".into()),
            hbm: Some("model.hbm".into()),
            hbm_prefill: Some("model_prefill.hbm".into()),
            tokenizer: Some("tokenizer.json".into()),
            embed: Some("embed_tokens.bin".into()),
            visual: Some("visual.hbm".into()),
            eos: Some(vec![248046, 248044]),
            cache_len: Some(4096),
            bpu_cores: Some(2),
            rope_theta: Some(1e7),
            mrope_section: Some(vec![11, 11, 10]),
            mrope_interleaved: Some(true),
            vision: Some(Vision {
                patch: Some(16),
                merge: Some(2),
                temporal: Some(2),
                mean: Some([0.5; 3]),
                std: Some([0.25, 0.5, 0.75]),
            }),
            chat: Some(Chat {
                format: Some("chatml".into()),
                im_start: Some(248045),
                im_end: Some(248046),
                bos: Some(-1),
                system: Some("You are a robot.".into()),
            }),
            prefill_pads: Some(true),
            prefill_min_tail: Some(5),
            dialect: Some("qwen3.5".into()),
            image_token_id: Some(248056),
        }
    }

    #[test]
    fn every_key_round_trips() {
        let m = full();
        let text = m.to_json_pretty().unwrap();
        let back = Manifest::from_value(serde_json::from_str(&text).unwrap()).unwrap();
        assert_eq!(back, m);
        let empty = Manifest::default();
        assert_eq!(serde_json::to_value(&empty).unwrap(), json!({}));
        assert_eq!(Manifest::from_value(json!({})).unwrap(), empty);
    }

    /// The key table and the serde names are the same keys: a key checked but never
    /// deserialised (or the reverse) would be a drift between the two.
    #[test]
    fn key_table_matches_the_type() {
        let v = serde_json::to_value(full()).unwrap();
        let keys = |m: &Value| -> Vec<String> {
            let mut k: Vec<String> = m.as_object().unwrap().keys().cloned().collect();
            k.sort();
            k
        };
        let table = |t: &[(&str, Kind)]| -> Vec<String> {
            let mut k: Vec<String> = t.iter().map(|(k, _)| k.to_string()).collect();
            k.sort();
            k
        };
        assert_eq!(keys(&v), table(KEYS));
        assert_eq!(keys(&v["vision"]), table(VISION_KEYS));
        assert_eq!(keys(&v["chat"]), table(CHAT_KEYS));
    }

    /// What the checks refuse, serde refuses too (so the checks only add the key to the
    /// message), and `null` is never "absent".
    #[test]
    fn checks_and_serde_refuse_the_same_values() {
        let base = serde_json::to_value(full()).unwrap();
        let mut cases: Vec<(Vec<&str>, Value)> = Vec::new();
        for (k, kind) in KEYS {
            cases.push((vec![k], Value::Null));
            let other = match kind {
                Kind::Object(_) => json!(1),
                _ => json!({"x": 1}),
            };
            cases.push((vec![k], other));
        }
        for (k, _) in VISION_KEYS {
            cases.push((vec!["vision", k], Value::Null));
            cases.push((vec!["vision", k], json!("1")));
        }
        for (k, _) in CHAT_KEYS {
            cases.push((vec!["chat", k], Value::Null));
            cases.push((vec!["chat", k], json!([1])));
        }
        for (k, bad) in [
            ("cache_len", json!(-1)),
            ("cache_len", json!(4096.5)),
            ("prefill_min_tail", json!(5.0)),
            ("cache_len", json!(u64::MAX)),
            ("eos", json!([1, -2])),
            ("eos", json!([1, "x"])),
            ("mrope_section", json!(11)),
            ("rope_theta", json!("1e7")),
        ] {
            cases.push((vec![k], bad));
        }
        cases.push((vec!["vision", "mean"], json!([0.5, 0.5])));
        cases.push((vec!["vision", "std"], json!([0.5, 0.5, "x"])));
        cases.push((vec!["chat", "bos"], json!(u64::MAX)));
        for (path, bad) in cases {
            let mut v = base.clone();
            let slot = path.iter().fold(&mut v, |v, k| &mut v[*k]);
            *slot = bad.clone();
            let err = Manifest::from_value(v.clone()).unwrap_err();
            assert!(
                !matches!(err, ManifestError::Decode(_)),
                "{path:?} = {bad}: {err}"
            );
            assert!(
                err.to_string().contains(&path.join(".")),
                "{path:?} = {bad}: {err}"
            );
            assert!(
                serde_json::from_value::<Manifest>(v).is_err(),
                "{path:?} = {bad}: serde takes it"
            );
        }
    }

    #[test]
    fn unknown_keys_are_ignored_and_negative_markers_kept() {
        let m = Manifest::from_value(json!({
            "hbm": "m.hbm",
            "some_future_key": {"x": [1, 2]},
            "vision": {"future": null},
            "chat": {"im_start": -1, "future": "x"},
        }))
        .unwrap();
        assert_eq!(m.hbm.as_deref(), Some("m.hbm"));
        assert_eq!(m.vision, Some(Vision::default()));
        assert_eq!(m.chat.unwrap().im_start, Some(-1));
        assert!(matches!(
            Manifest::from_value(json!([1])),
            Err(ManifestError::NotAnObject)
        ));
    }

    #[test]
    fn errors_name_the_first_key_in_table_order() {
        let err = Manifest::from_value(json!({"image_token_id": "x", "cache_len": "y"}));
        match err {
            Err(ManifestError::WrongType {
                key,
                expected,
                found,
            }) => {
                assert_eq!(key, "cache_len");
                assert_eq!(expected, "an integer");
                assert_eq!(found, "string \"y\"");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            Manifest::from_value(json!({"eos": [1, -2]})),
            Err(ManifestError::OutOfRange { value: -2, .. })
        ));
        assert!(matches!(
            Manifest::from_value(json!({"vision": {"mean": [1]}})),
            Err(ManifestError::Length { found: 1, .. })
        ));
    }
}

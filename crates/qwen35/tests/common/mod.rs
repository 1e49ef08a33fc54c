//! Shared helpers of the fixture tests: paths, goldens, images, comparisons.
#![allow(dead_code, clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use qwen35::{patchify_rgb8, PreparedImage, Qwen35Model};
use safetensors::{Dtype, SafeTensors};

/// f32 logits vs HF goldens (issue 3).
pub const LOGIT_TOL: f32 = 1e-4;
/// Vision tower rows vs HF goldens.
pub const VISION_TOL: f32 = 1e-4;
/// Chunked prefill vs token-by-token, window path vs positions path.
pub const PARITY_TOL: f32 = 1e-4;
/// bf16/f16 weights vs f32: minimum cosine of logits.
pub const LOW_PRECISION_MIN_COSINE: f64 = 0.999;

pub const MODELS: [&str; 3] = ["tiny-sym", "tiny-4b", "tiny-untied"];

pub fn fixtures_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/fixtures")
}

pub fn model_dir(name: &str) -> PathBuf {
    let d = fixtures_root().join("models").join(name);
    assert!(
        d.join("config.json").is_file(),
        "fixture {} is missing",
        d.display()
    );
    d
}

pub struct Goldens {
    pub dir: PathBuf,
    pub json: serde_json::Value,
    pub bytes: Vec<u8>,
}

impl Goldens {
    pub fn load(name: &str) -> Self {
        let dir = model_dir(name);
        let json =
            serde_json::from_slice(&std::fs::read(dir.join("goldens.json")).unwrap()).unwrap();
        let bytes = std::fs::read(dir.join("goldens.safetensors")).unwrap();
        Self { dir, json, bytes }
    }

    pub fn cases(&self) -> Vec<serde_json::Value> {
        self.json["cases"].as_array().unwrap().clone()
    }

    pub fn case(&self, name: &str) -> serde_json::Value {
        self.cases()
            .into_iter()
            .find(|c| c["name"] == name)
            .unwrap()
    }

    /// (shape, f32 values) of a golden tensor.
    pub fn f32(&self, key: &str) -> (Vec<usize>, Vec<f32>) {
        let st = SafeTensors::deserialize(&self.bytes).unwrap();
        let t = st.tensor(key).unwrap();
        assert_eq!(t.dtype(), Dtype::F32, "{key}");
        let v = t
            .data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        (t.shape().to_vec(), v)
    }

    pub fn i64(&self, key: &str) -> (Vec<usize>, Vec<i64>) {
        let st = SafeTensors::deserialize(&self.bytes).unwrap();
        let t = st.tensor(key).unwrap();
        assert_eq!(t.dtype(), Dtype::I64, "{key}");
        let v = t
            .data()
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        (t.shape().to_vec(), v)
    }

    pub fn images(&self, case: &serde_json::Value, model: &Qwen35Model) -> Vec<PreparedImage> {
        case["images"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| load_image(&self.dir.join(p.as_str().unwrap()), model))
            .collect()
    }
}

pub fn ids_of(case: &serde_json::Value, key: &str) -> Vec<u32> {
    case[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

pub fn load_image(path: &Path, model: &Qwen35Model) -> PreparedImage {
    let img = image::open(path).unwrap().to_rgb8();
    let (pixel_values, grid) = patchify_rgb8(
        img.as_raw(),
        img.width() as usize,
        img.height() as usize,
        model.config.vision.as_ref().unwrap(),
    )
    .unwrap();
    PreparedImage { pixel_values, grid }
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (mut ab, mut aa, mut bb) = (0.0f64, 0.0f64, 0.0f64);
    for (x, y) in a.iter().zip(b) {
        ab += *x as f64 * *y as f64;
        aa += *x as f64 * *x as f64;
        bb += *y as f64 * *y as f64;
    }
    ab / (aa.sqrt() * bb.sqrt())
}

/// Rewrites `src` (a safetensors file) with every float tensor passed through `f`
/// (name, dtype, shape, data) → optional replacement (None drops the tensor).
pub fn rewrite_safetensors(
    src: &Path,
    dst: &Path,
    mut f: impl FnMut(&str, Dtype, &[usize], &[u8]) -> Option<(Dtype, Vec<usize>, Vec<u8>)>,
) {
    let bytes = std::fs::read(src).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let mut owned: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, view) in st.tensors() {
        if let Some((dt, shape, data)) = f(&name, view.dtype(), view.shape(), view.data()) {
            owned.push((name, dt, shape, data));
        }
    }
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = owned
        .iter()
        .map(|(n, dt, s, d)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(*dt, s.clone(), d).unwrap(),
            )
        })
        .collect();
    let out = safetensors::serialize(views, None).unwrap();
    std::fs::write(dst, out).unwrap();
}

/// Copy of a fixture directory's config with converted weights (`Dtype::BF16` or `F16`).
pub fn converted_copy(name: &str, to: Dtype, out: &Path) {
    let dir = model_dir(name);
    std::fs::copy(dir.join("config.json"), out.join("config.json")).unwrap();
    rewrite_safetensors(
        &dir.join("model.safetensors"),
        &out.join("model.safetensors"),
        |_, dt, shape, data| {
            if dt != Dtype::F32 {
                return Some((dt, shape.to_vec(), data.to_vec()));
            }
            let vals = data
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
            let bytes: Vec<u8> = match to {
                Dtype::BF16 => vals
                    .flat_map(|v| half::bf16::from_f32(v).to_le_bytes())
                    .collect(),
                Dtype::F16 => vals
                    .flat_map(|v| half::f16::from_f32(v).to_le_bytes())
                    .collect(),
                _ => panic!("unsupported target dtype"),
            };
            Some((to, shape.to_vec(), bytes))
        },
    );
}

//! HF `config.json` of a Qwen3.5 checkpoint: raw serde structs with the HF key names, resolved
//! once into [`Config`] so that the forward code never branches on an unsupported setting.

use std::path::Path;

use serde::Deserialize;

use crate::error::{Error, Result};

/// `config.json` as written by HF (`Qwen3_5Config`), with `Option`s where HF has defaults.
/// A text-only checkpoint (`qwen3_5_text`) keeps the text keys at the top level.
#[derive(Debug, Clone, Deserialize)]
pub struct RawConfig {
    pub model_type: Option<String>,
    pub image_token_id: Option<u32>,
    pub video_token_id: Option<u32>,
    pub vision_start_token_id: Option<u32>,
    pub vision_end_token_id: Option<u32>,
    pub tie_word_embeddings: Option<bool>,
    pub text_config: Option<RawTextConfig>,
    pub vision_config: Option<RawVisionConfig>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct RawRopeParameters {
    pub rope_type: Option<String>,
    pub rope_theta: Option<f64>,
    pub partial_rotary_factor: Option<f64>,
    pub mrope_interleaved: Option<bool>,
    pub mrope_section: Option<Vec<usize>>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct RawTextConfig {
    pub model_type: Option<String>,
    pub vocab_size: Option<usize>,
    pub hidden_size: Option<usize>,
    pub intermediate_size: Option<usize>,
    pub num_hidden_layers: Option<usize>,
    pub num_attention_heads: Option<usize>,
    pub num_key_value_heads: Option<usize>,
    pub head_dim: Option<usize>,
    pub linear_num_key_heads: Option<usize>,
    pub linear_num_value_heads: Option<usize>,
    pub linear_key_head_dim: Option<usize>,
    pub linear_value_head_dim: Option<usize>,
    pub linear_conv_kernel_dim: Option<usize>,
    pub layer_types: Option<Vec<String>>,
    pub full_attention_interval: Option<usize>,
    pub hidden_act: Option<String>,
    pub rms_norm_eps: Option<f64>,
    pub max_position_embeddings: Option<usize>,
    pub tie_word_embeddings: Option<bool>,
    pub attention_bias: Option<bool>,
    pub rope_parameters: Option<RawRopeParameters>,
    pub eos_token_id: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct RawVisionConfig {
    pub depth: Option<usize>,
    pub hidden_size: Option<usize>,
    pub intermediate_size: Option<usize>,
    pub num_heads: Option<usize>,
    pub in_channels: Option<usize>,
    pub patch_size: Option<usize>,
    pub temporal_patch_size: Option<usize>,
    pub spatial_merge_size: Option<usize>,
    pub out_hidden_size: Option<usize>,
    pub num_position_embeddings: Option<usize>,
    pub hidden_act: Option<String>,
    pub deepstack_visual_indexes: Option<Vec<usize>>,
}

/// Mixer of one decoder layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerType {
    /// Gated DeltaNet (`"linear_attention"`).
    LinearAttention,
    /// Gated full attention (`"full_attention"`).
    FullAttention,
}

/// Resolved text-decoder settings (all shapes come from here).
#[derive(Debug, Clone, PartialEq)]
pub struct TextConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub linear_num_key_heads: usize,
    pub linear_num_value_heads: usize,
    pub linear_key_head_dim: usize,
    pub linear_value_head_dim: usize,
    pub linear_conv_kernel_dim: usize,
    pub layer_types: Vec<LayerType>,
    pub rms_norm_eps: f32,
    pub max_position_embeddings: usize,
    pub rope_theta: f64,
    /// Rotated dims per attention head (`head_dim × partial_rotary_factor`), `ROT`.
    pub rotary_dim: usize,
    /// Interleaved M-RoPE section `[t, h, w]` (empty = plain 1-D rope).
    pub mrope_section: Vec<usize>,
    pub tie_word_embeddings: bool,
    pub eos_token_ids: Vec<u32>,
}

impl TextConfig {
    pub fn num_layers(&self) -> usize {
        self.layer_types.len()
    }
    /// GDN key width `Hk·dk`.
    pub fn linear_key_dim(&self) -> usize {
        self.linear_num_key_heads * self.linear_key_head_dim
    }
    /// GDN value width `Hv·dv`.
    pub fn linear_value_dim(&self) -> usize {
        self.linear_num_value_heads * self.linear_value_head_dim
    }
    /// Channels of the GDN causal conv (`2·key_dim + value_dim`).
    pub fn linear_conv_dim(&self) -> usize {
        2 * self.linear_key_dim() + self.linear_value_dim()
    }
    /// For each of the `rotary_dim/2` frequencies, the position axis it reads (0 = T, 1 = H,
    /// 2 = W), interleaved as HF `apply_interleaved_mrope` does (docs/package-contract.md §5).
    pub fn mrope_axes(&self) -> Vec<usize> {
        mrope_axes(self.rotary_dim / 2, &self.mrope_section)
    }
}

/// Axis map of interleaved M-RoPE for `half` frequencies: index `i` with `i % 3 == 1` and
/// `i < 3·section[1]` reads H, `i % 3 == 2` and `i < 3·section[2]` reads W, the rest T.
pub fn mrope_axes(half: usize, section: &[usize]) -> Vec<usize> {
    (0..half)
        .map(|i| {
            if section.len() == 3 && i % 3 == 1 && i < 3 * section[1] {
                1
            } else if section.len() == 3 && i % 3 == 2 && i < 3 * section[2] {
                2
            } else {
                0
            }
        })
        .collect()
}

/// Resolved vision-tower settings.
#[derive(Debug, Clone, PartialEq)]
pub struct VisionConfig {
    pub depth: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_heads: usize,
    pub in_channels: usize,
    pub patch_size: usize,
    pub temporal_patch_size: usize,
    pub spatial_merge_size: usize,
    pub out_hidden_size: usize,
    pub num_position_embeddings: usize,
    /// Side of the learned position-embedding grid (`sqrt(num_position_embeddings)`).
    pub pos_grid_side: usize,
}

impl VisionConfig {
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads
    }
    /// Length of one patch vector `C·T·P·P`.
    pub fn patch_len(&self) -> usize {
        self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size
    }
}

/// The whole checkpoint's settings.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub text: TextConfig,
    pub vision: Option<VisionConfig>,
    pub image_token_id: Option<u32>,
    pub video_token_id: Option<u32>,
    pub vision_start_token_id: Option<u32>,
    pub vision_end_token_id: Option<u32>,
}

fn need<T>(v: Option<T>, key: &str) -> Result<T> {
    v.ok_or_else(|| Error::Config {
        key: key.to_string(),
        reason: "missing".to_string(),
    })
}

fn bad(key: &str, reason: impl Into<String>) -> Error {
    Error::Config {
        key: key.to_string(),
        reason: reason.into(),
    }
}

impl Config {
    /// Reads and resolves `<dir>/config.json` (or the file itself).
    pub fn from_file(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let raw: RawConfig =
            serde_json::from_slice(&bytes).map_err(|source| Error::ConfigJson {
                path: path.to_path_buf(),
                source,
            })?;
        let flat: Option<RawTextConfig> = if raw.text_config.is_none() {
            Some(
                serde_json::from_slice(&bytes).map_err(|source| Error::ConfigJson {
                    path: path.to_path_buf(),
                    source,
                })?,
            )
        } else {
            None
        };
        raw.resolve(flat)
    }

    /// Parses a `config.json` text.
    pub fn from_json_str(text: &str) -> Result<Self> {
        let raw: RawConfig = serde_json::from_str(text).map_err(|source| Error::ConfigJson {
            path: "<string>".into(),
            source,
        })?;
        let flat = if raw.text_config.is_none() {
            Some(
                serde_json::from_str(text).map_err(|source| Error::ConfigJson {
                    path: "<string>".into(),
                    source,
                })?,
            )
        } else {
            None
        };
        raw.resolve(flat)
    }
}

impl RawConfig {
    /// Resolves defaults once; `flat` is the top level read as a text config (text-only files).
    pub fn resolve(self, flat: Option<RawTextConfig>) -> Result<Config> {
        if let Some(mt) = &self.model_type {
            if !matches!(mt.as_str(), "qwen3_5" | "qwen3_5_text") {
                return Err(bad(
                    "model_type",
                    format!("`{mt}` is not qwen3_5 / qwen3_5_text"),
                ));
            }
        }
        let (t, prefix) = match (self.text_config, flat) {
            (Some(t), _) => (t, "text_config."),
            (None, Some(t)) => (t, ""),
            (None, None) => return Err(bad("text_config", "missing")),
        };
        let text = resolve_text(&t, prefix, self.tie_word_embeddings)?;
        let vision = match self.vision_config {
            None => None,
            Some(v) => Some(resolve_vision(v)?),
        };
        if vision.is_some() && self.image_token_id.is_none() {
            return Err(bad(
                "image_token_id",
                "missing (required with vision_config)",
            ));
        }
        Ok(Config {
            text,
            vision,
            image_token_id: self.image_token_id,
            video_token_id: self.video_token_id,
            vision_start_token_id: self.vision_start_token_id,
            vision_end_token_id: self.vision_end_token_id,
        })
    }
}

/// The text model; `prefix` names where its keys live (`text_config.` or the top level),
/// `tie_top` is the top-level `tie_word_embeddings`, which wins over the text config's.
fn resolve_text(t: &RawTextConfig, prefix: &str, tie_top: Option<bool>) -> Result<TextConfig> {
    let k = |name: &str| format!("{prefix}{name}");
    let rk = |name: &str| format!("{prefix}rope_parameters.{name}");
    let num_layers = need(t.num_hidden_layers, &k("num_hidden_layers"))?;
    let layer_types = resolve_layer_types(t, prefix, num_layers)?;
    if let Some(act) = &t.hidden_act {
        if act != "silu" {
            return Err(bad(
                &k("hidden_act"),
                format!("`{act}` unsupported (only silu)"),
            ));
        }
    }
    if t.attention_bias == Some(true) {
        return Err(bad(
            &k("attention_bias"),
            "true is unsupported (Qwen3.5 has no attention biases)",
        ));
    }
    let rope = need(t.rope_parameters.clone(), &k("rope_parameters"))?;
    if let Some(rt) = &rope.rope_type {
        if rt != "default" {
            return Err(bad(
                &rk("rope_type"),
                format!("`{rt}` unsupported (only default)"),
            ));
        }
    }
    let head_dim = need(t.head_dim, &k("head_dim"))?;
    let rotary = rotary_dim(&rope, head_dim, prefix)?;
    let mrope_section = resolve_mrope_section(&rope, rotary, prefix)?;
    let hidden = need(t.hidden_size, &k("hidden_size"))?;
    let nh = need(t.num_attention_heads, &k("num_attention_heads"))?;
    let nkv = need(t.num_key_value_heads, &k("num_key_value_heads"))?;
    if nkv == 0 || nh % nkv != 0 {
        return Err(bad(
            &k("num_key_value_heads"),
            format!("{nkv} does not divide num_attention_heads {nh}"),
        ));
    }
    let hk = need(t.linear_num_key_heads, &k("linear_num_key_heads"))?;
    let hv = need(t.linear_num_value_heads, &k("linear_num_value_heads"))?;
    if hk == 0 || hv % hk != 0 {
        return Err(bad(
            &k("linear_num_value_heads"),
            format!("{hv} is not a multiple of linear_num_key_heads {hk}"),
        ));
    }
    let conv = need(t.linear_conv_kernel_dim, &k("linear_conv_kernel_dim"))?;
    if conv == 0 {
        return Err(bad(&k("linear_conv_kernel_dim"), "must be ≥ 1"));
    }
    let eos_token_ids = resolve_eos(t, prefix)?;
    Ok(TextConfig {
        vocab_size: need(t.vocab_size, &k("vocab_size"))?,
        hidden_size: hidden,
        intermediate_size: need(t.intermediate_size, &k("intermediate_size"))?,
        num_attention_heads: nh,
        num_key_value_heads: nkv,
        head_dim,
        linear_num_key_heads: hk,
        linear_num_value_heads: hv,
        linear_key_head_dim: need(t.linear_key_head_dim, &k("linear_key_head_dim"))?,
        linear_value_head_dim: need(t.linear_value_head_dim, &k("linear_value_head_dim"))?,
        linear_conv_kernel_dim: conv,
        layer_types,
        rms_norm_eps: t.rms_norm_eps.unwrap_or(1e-6) as f32,
        max_position_embeddings: t.max_position_embeddings.unwrap_or(262_144),
        rope_theta: need(rope.rope_theta, &rk("rope_theta"))?,
        rotary_dim: rotary,
        mrope_section,
        tie_word_embeddings: tie_top.or(t.tie_word_embeddings).unwrap_or(true),
        eos_token_ids,
    })
}

/// `layer_types` as listed, or every `full_attention_interval`-th layer full attention.
fn resolve_layer_types(
    t: &RawTextConfig,
    prefix: &str,
    num_layers: usize,
) -> Result<Vec<LayerType>> {
    let k = |name: &str| format!("{prefix}{name}");
    let Some(list) = &t.layer_types else {
        let interval = t.full_attention_interval.unwrap_or(4);
        if interval == 0 {
            return Err(bad(&k("full_attention_interval"), "must be ≥ 1"));
        }
        return Ok((0..num_layers)
            .map(|i| {
                if (i + 1) % interval == 0 {
                    LayerType::FullAttention
                } else {
                    LayerType::LinearAttention
                }
            })
            .collect());
    };
    if list.len() != num_layers {
        return Err(bad(
            &k("layer_types"),
            format!(
                "{} entries but num_hidden_layers = {num_layers}",
                list.len()
            ),
        ));
    }
    list.iter()
        .enumerate()
        .map(|(i, s)| match s.as_str() {
            "linear_attention" => Ok(LayerType::LinearAttention),
            "full_attention" => Ok(LayerType::FullAttention),
            other => Err(bad(
                &format!("{prefix}layer_types[{i}]"),
                format!(
                    "unknown layer type `{other}` (supported: linear_attention, full_attention)"
                ),
            )),
        })
        .collect()
}

/// Rotated dims per head: `head_dim × partial_rotary_factor`, even and at most `head_dim`.
fn rotary_dim(rope: &RawRopeParameters, head_dim: usize, prefix: &str) -> Result<usize> {
    let rk = |name: &str| format!("{prefix}rope_parameters.{name}");
    let prf = need(rope.partial_rotary_factor, &rk("partial_rotary_factor"))?;
    let rotary = (head_dim as f64 * prf).round() as usize;
    if rotary == 0 || !rotary.is_multiple_of(2) || rotary > head_dim {
        return Err(bad(
            &rk("partial_rotary_factor"),
            format!("gives rotary dim {rotary}, which must be even and in 2..={head_dim}"),
        ));
    }
    Ok(rotary)
}

/// The M-RoPE split `[t, h, w]` (empty = plain rope); it must cover `rotary / 2` and be
/// interleaved.
fn resolve_mrope_section(
    rope: &RawRopeParameters,
    rotary: usize,
    prefix: &str,
) -> Result<Vec<usize>> {
    let rk = |name: &str| format!("{prefix}rope_parameters.{name}");
    let mrope_section = rope.mrope_section.clone().unwrap_or_default();
    if !mrope_section.is_empty() {
        if mrope_section.len() != 3 {
            return Err(bad(&rk("mrope_section"), "must have 3 entries [t, h, w]"));
        }
        if mrope_section.iter().sum::<usize>() != rotary / 2 {
            return Err(bad(
                &rk("mrope_section"),
                format!(
                    "sums to {} but rotary_dim/2 = {}",
                    mrope_section.iter().sum::<usize>(),
                    rotary / 2
                ),
            ));
        }
        if rope.mrope_interleaved == Some(false) {
            return Err(bad(
                &rk("mrope_interleaved"),
                "false (contiguous M-RoPE) is unsupported",
            ));
        }
    }
    Ok(mrope_section)
}

/// `eos_token_id`: absent, null, one id or a list of ids.
fn resolve_eos(t: &RawTextConfig, prefix: &str) -> Result<Vec<u32>> {
    let key = format!("{prefix}eos_token_id");
    Ok(match &t.eos_token_id {
        None | Some(serde_json::Value::Null) => Vec::new(),
        Some(serde_json::Value::Number(n)) => {
            vec![n.as_u64().ok_or_else(|| bad(&key, "not an id"))? as u32]
        }
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .map(|v| {
                v.as_u64()
                    .map(|x| x as u32)
                    .ok_or_else(|| bad(&key, "not an id"))
            })
            .collect::<Result<_>>()?,
        Some(_) => return Err(bad(&key, "must be an id or a list of ids")),
    })
}

fn resolve_vision(v: RawVisionConfig) -> Result<VisionConfig> {
    let k = |name: &str| format!("vision_config.{name}");
    if let Some(act) = &v.hidden_act {
        if act != "gelu_pytorch_tanh" {
            return Err(bad(
                &k("hidden_act"),
                format!("`{act}` unsupported (only gelu_pytorch_tanh)"),
            ));
        }
    }
    if let Some(ds) = &v.deepstack_visual_indexes {
        if !ds.is_empty() {
            return Err(bad(
                &k("deepstack_visual_indexes"),
                "deepstack injection is unsupported (must be [])",
            ));
        }
    }
    let hidden = need(v.hidden_size, &k("hidden_size"))?;
    let heads = need(v.num_heads, &k("num_heads"))?;
    if heads == 0 || hidden % heads != 0 || (hidden / heads) % 4 != 0 {
        return Err(bad(
            &k("num_heads"),
            format!("{heads} heads do not split hidden {hidden} into a head dim divisible by 4"),
        ));
    }
    let npos = need(v.num_position_embeddings, &k("num_position_embeddings"))?;
    let side = (npos as f64).sqrt().round() as usize;
    if side * side != npos || side < 2 {
        return Err(bad(
            &k("num_position_embeddings"),
            format!("{npos} is not a square ≥ 4"),
        ));
    }
    let merge = need(v.spatial_merge_size, &k("spatial_merge_size"))?;
    if merge == 0 {
        return Err(bad(&k("spatial_merge_size"), "must be ≥ 1"));
    }
    Ok(VisionConfig {
        depth: need(v.depth, &k("depth"))?,
        hidden_size: hidden,
        intermediate_size: need(v.intermediate_size, &k("intermediate_size"))?,
        num_heads: heads,
        in_channels: v.in_channels.unwrap_or(3),
        patch_size: need(v.patch_size, &k("patch_size"))?,
        temporal_patch_size: need(v.temporal_patch_size, &k("temporal_patch_size"))?,
        spatial_merge_size: merge,
        out_hidden_size: need(v.out_hidden_size, &k("out_hidden_size"))?,
        num_position_embeddings: npos,
        pos_grid_side: side,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axes_match_contract_for_4b_section() {
        let a = mrope_axes(32, &[11, 11, 10]);
        assert_eq!(a.iter().filter(|&&x| x == 0).count(), 11);
        assert_eq!(a.iter().filter(|&&x| x == 1).count(), 11);
        assert_eq!(a.iter().filter(|&&x| x == 2).count(), 10);
        assert_eq!(&a[..6], &[0, 1, 2, 0, 1, 2]);
        assert_eq!(a[30], 0);
        assert_eq!(a[31], 1);
        assert!(mrope_axes(8, &[]).iter().all(|&x| x == 0));
    }
}

//! The sim-package writer behind `vlm make-sim-package`: turns an HF Qwen3.5 checkpoint into
//! the published package layout with sim containers in place of compiled graphs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::container::{Container, Header, LogitsType, PadLayout, TextParams, VisualParams};
use crate::graphs::{text_graph_desc, visual_graph_desc};
use crate::pads::{PadMask, PadRope};

mod manifest;

use manifest::sim_manifest;

/// Where the prefill graph goes (`--prefill-in`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefillIn {
    /// Only `model.hbm` carries `qwen35_prefill`.
    Model,
    /// Only `model_prefill.hbm` carries it (the default).
    Separate,
    /// Both: `model.hbm` carries an older variant (all-row logits), `model_prefill.hbm` the
    /// requested one.
    Both,
    /// No prefill graph at all.
    None,
}

/// Options of `make-sim-package`, with the pinned defaults of issue 4.
#[derive(Debug, Clone)]
pub struct PackageOptions {
    /// HF checkpoint directory (`config.json`, `*.safetensors`).
    pub hf_dir: PathBuf,
    pub out_dir: PathBuf,
    /// `--config`: a config.json used instead of `hf_dir/config.json`.
    pub config: Option<PathBuf>,
    /// `--no-weights`: real shapes, no weights (timing model only).
    pub no_weights: bool,
    /// tokenizer.json to copy (default `hf_dir/tokenizer.json`).
    pub tokenizer: Option<PathBuf>,
    pub cache_len: usize,
    pub prefill_chunk: usize,
    pub prefill_in: PrefillIn,
    /// `--mask-heads`: `None` = the attention head count (default), else 1.
    pub mask_heads_one: bool,
    /// `--prefill-logits all` (default last).
    pub prefill_logits_all: bool,
    pub logits: LogitsType,
    /// Scale of S16 logits and S16 tower output.
    pub s16_scale: f32,
    /// Tower input bucket in pixels.
    pub image_size: usize,
    /// System prompt written to `model.json`.
    pub system: String,
    /// `--prefill-pads`: the prefill graph accepts a padded tail (docs/package-contract.md §4.4, inferred).
    pub prefill_pads: bool,
    /// `prefill_min_tail` written with `--prefill-pads` (default: the chunk size).
    pub prefill_min_tail: Option<usize>,
    /// `--pad-layout`: where the padded prefill graph expects its pad rows (default `last`).
    /// Not written to `model.json`: as with a real package, the runtime has to find out.
    pub pad_layout: PadLayout,
    /// `--pad-rope`: the rope the padded prefill graph recognises its pads by (default
    /// `identity`). Not written to `model.json` either.
    pub pad_rope: PadRope,
    /// `--pad-mask`: the mask row the padded prefill graph recognises its pads by (default
    /// `masked`). Not written to `model.json` either.
    pub pad_mask: PadMask,
    /// BPU march written into every container (default `nash-m`, the S100P's).
    pub march: String,
    /// `--tower-rank`: rank of the vision tower's input and output (2, or more with leading
    /// 1s, as real towers may report `[1, n, len]`).
    pub tower_rank: usize,
    /// `--dynamic-strides`: every graph reports `-1` strides and `alignedByteSize` `-1`.
    pub dynamic_strides: bool,
    /// `--quant-axis`: the text graphs' logits are S16 with per-axis scales (`scaleLen` =
    /// vocab, `quantizeAxis` = 1), which a runtime must refuse rather than read `scale[0]`.
    pub quant_axis: bool,
    /// K/V caches of one head report other strides for their outputs than for their inputs
    /// (same bytes; [`crate::TextParams::cache_out_strides`]). Not with `dynamic_strides`.
    pub cache_out_strides: bool,
}

impl PackageOptions {
    /// Defaults: cache_len 512, chunk 32, separate prefill file, mask heads = H, last-row
    /// prefill logits, f32 logits, 320 px tower.
    pub fn new(hf_dir: &Path, out_dir: &Path) -> Self {
        Self {
            hf_dir: hf_dir.to_owned(),
            out_dir: out_dir.to_owned(),
            config: None,
            no_weights: false,
            tokenizer: None,
            cache_len: 512,
            prefill_chunk: 32,
            prefill_in: PrefillIn::Separate,
            mask_heads_one: false,
            prefill_logits_all: false,
            logits: LogitsType::F32,
            s16_scale: 1.0 / 512.0,
            image_size: 320,
            system: "You are a helpful assistant.".into(),
            prefill_pads: false,
            prefill_min_tail: None,
            pad_layout: PadLayout::Last,
            pad_rope: PadRope::Identity,
            pad_mask: PadMask::Masked,
            march: crate::config::PLATFORM_MARCH.to_owned(),
            tower_rank: 2,
            dynamic_strides: false,
            quant_axis: false,
            cache_out_strides: false,
        }
    }
}

/// Errors of the package writer; each names the file or setting.
#[derive(Debug, thiserror::Error)]
pub enum PackageError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {reason}", path.display())]
    Input { path: PathBuf, reason: String },
    #[error("invalid option: {0}")]
    Option(String),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> PackageError + '_ {
    move |source| PackageError::Io {
        path: path.to_owned(),
        source,
    }
}

/// What was written.
#[derive(Debug, Clone)]
pub struct PackageSummary {
    pub files: Vec<PathBuf>,
    pub vocab: usize,
    pub hidden: usize,
    pub vision: bool,
}

fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>, PackageError> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io(dir))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        // HF weight files are `model.safetensors` or `model-0000i-of-0000n.safetensors`;
        // other safetensors (fixture goldens) are not weights.
        .filter(|p| {
            p.extension().is_some_and(|x| x == "safetensors")
                && p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("model"))
        })
        .collect();
    v.sort();
    if v.is_empty() {
        return Err(PackageError::Input {
            path: dir.to_owned(),
            reason: "no *.safetensors file".into(),
        });
    }
    Ok(v)
}

/// Raw tensors of a checkpoint: name → (dtype, shape, bytes).
type Tensors = BTreeMap<String, (safetensors::Dtype, Vec<usize>, Vec<u8>)>;

fn read_tensors(files: &[PathBuf]) -> Result<Tensors, PackageError> {
    let mut out = Tensors::new();
    for f in files {
        let bytes = std::fs::read(f).map_err(io(f))?;
        let st =
            safetensors::SafeTensors::deserialize(&bytes).map_err(|e| PackageError::Input {
                path: f.clone(),
                reason: e.to_string(),
            })?;
        for (name, view) in st.tensors() {
            out.insert(
                name,
                (view.dtype(), view.shape().to_vec(), view.data().to_vec()),
            );
        }
    }
    Ok(out)
}

fn serialize(tensors: &Tensors, keep: impl Fn(&str) -> bool) -> Result<Vec<u8>, PackageError> {
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .filter(|(n, _)| keep(n))
        .map(|(n, (dt, shape, data))| {
            safetensors::tensor::TensorView::new(*dt, shape.clone(), data)
                .map(|v| (n.clone(), v))
                .map_err(|e| PackageError::Option(format!("tensor {n}: {e}")))
        })
        .collect::<Result<_, _>>()?;
    safetensors::serialize(views, None)
        .map_err(|e| PackageError::Option(format!("safetensors: {e}")))
}

fn token_id(tokenizer: &Value, content: &str) -> Option<u32> {
    tokenizer["added_tokens"]
        .as_array()?
        .iter()
        .find(|t| t["content"] == content)
        .and_then(|t| t["id"].as_u64())
        .map(|v| v as u32)
}

fn to_f16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter()
        .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
        .collect()
}

/// Writes a sim package (see the module docs and issue 4 item 4).
pub fn make_sim_package(o: &PackageOptions) -> Result<PackageSummary, PackageError> {
    check_options(o)?;
    let src = Sources::read(o)?;
    let tc = &src.cfg.text;
    std::fs::create_dir_all(&o.out_dir).map_err(io(&o.out_dir))?;

    let tensors = if o.no_weights {
        Tensors::new()
    } else {
        read_tensors(&safetensors_files(&o.hf_dir)?)?
    };
    let mut files = Vec::new();
    let has_prefill_file = write_text_graphs(o, &src, &tensors, &mut files)?;
    let vision = src.cfg.vision.as_ref();
    if let Some(vc) = vision {
        write_tower(o, &src, vc, &tensors, &mut files)?;
    }
    files.push(write_embed(o, tc, &tensors)?);
    let tok_out = o.out_dir.join("tokenizer.json");
    std::fs::write(&tok_out, src.tok_text.as_bytes()).map_err(io(&tok_out))?;
    files.push(tok_out);

    let mj_path = o.out_dir.join(bllm_manifest::FILE_NAME);
    let text = sim_manifest(o, &src, has_prefill_file)?
        .to_json_pretty()
        .map_err(|e| PackageError::Option(e.to_string()))?;
    std::fs::write(&mj_path, text).map_err(io(&mj_path))?;
    files.push(mj_path);
    tracing::info!(out = %o.out_dir.display(), files = files.len(), "sim package written");
    Ok(PackageSummary {
        files,
        vocab: tc.vocab_size,
        hidden: tc.hidden_size,
        vision: vision.is_some(),
    })
}

/// Options that contradict each other or the container format.
fn check_options(o: &PackageOptions) -> Result<(), PackageError> {
    if !(2..=hbdnn_sys::HB_DNN_TENSOR_MAX_DIMENSIONS as usize).contains(&o.tower_rank) {
        return Err(PackageError::Option(format!(
            "tower rank {} must be in 2..={}",
            o.tower_rank,
            hbdnn_sys::HB_DNN_TENSOR_MAX_DIMENSIONS
        )));
    }
    if o.quant_axis && o.logits != LogitsType::S16 {
        return Err(PackageError::Option(
            "per-axis scales (--quant-axis) need S16 logits (--logits s16)".into(),
        ));
    }
    if o.cache_out_strides && o.dynamic_strides {
        return Err(PackageError::Option(
            "differing cache output strides need fixed strides (not --dynamic-strides)".into(),
        ));
    }
    if o.prefill_chunk < 2 || o.prefill_chunk > o.cache_len {
        return Err(PackageError::Option(format!(
            "prefill chunk {} must be in 2..=cache_len ({})",
            o.prefill_chunk, o.cache_len
        )));
    }
    Ok(())
}

/// The checkpoint's `config.json` and `tokenizer.json`, read and parsed.
struct Sources {
    cfg_path: PathBuf,
    /// `config.json` as JSON, stored in every container header.
    cfg_json: Value,
    cfg: qwen35::Config,
    tok_text: String,
    tok: Value,
}

impl Sources {
    fn read(o: &PackageOptions) -> Result<Self, PackageError> {
        let cfg_path = o
            .config
            .clone()
            .unwrap_or_else(|| o.hf_dir.join("config.json"));
        let cfg_text = std::fs::read_to_string(&cfg_path).map_err(io(&cfg_path))?;
        let input = |path: &Path, e: &dyn std::fmt::Display| PackageError::Input {
            path: path.to_owned(),
            reason: e.to_string(),
        };
        let cfg_json: Value = serde_json::from_str(&cfg_text).map_err(|e| input(&cfg_path, &e))?;
        let cfg = qwen35::Config::from_json_str(&cfg_text).map_err(|e| input(&cfg_path, &e))?;
        let tok_path = o
            .tokenizer
            .clone()
            .unwrap_or_else(|| o.hf_dir.join("tokenizer.json"));
        let tok_text = std::fs::read_to_string(&tok_path).map_err(io(&tok_path))?;
        let tok: Value = serde_json::from_str(&tok_text).map_err(|e| input(&tok_path, &e))?;
        Ok(Self {
            cfg_path,
            cfg_json,
            cfg,
            tok_text,
            tok,
        })
    }

    fn header(&self, o: &PackageOptions, graphs: Vec<crate::container::GraphDesc>) -> Header {
        Header {
            graphs,
            config: Some(self.cfg_json.clone()),
            has_weights: !o.no_weights,
            march: Some(o.march.clone()),
        }
    }
}

fn write_container(
    o: &PackageOptions,
    name: &str,
    c: Container,
    files: &mut Vec<PathBuf>,
) -> Result<(), PackageError> {
    let p = o.out_dir.join(name);
    c.write(&p).map_err(|e| PackageError::Input {
        path: p.clone(),
        reason: e.to_string(),
    })?;
    files.push(p);
    Ok(())
}

fn is_visual(name: &str) -> bool {
    name.starts_with("model.visual.")
}

/// `model.hbm` and, per `--prefill-in`, `model_prefill.hbm`; returns whether the latter was
/// written.
fn write_text_graphs(
    o: &PackageOptions,
    src: &Sources,
    tensors: &Tensors,
    files: &mut Vec<PathBuf>,
) -> Result<bool, PackageError> {
    let tc = &src.cfg.text;
    let text_payload = if o.no_weights {
        Vec::new()
    } else {
        serialize(tensors, |n| !is_visual(n))?
    };
    let (decode, prefill, older_prefill) = text_params(o, tc);
    let mut model_graphs = vec![text_graph_desc("qwen35", tc, &decode)];
    match o.prefill_in {
        PrefillIn::Model => model_graphs.push(text_graph_desc("qwen35_prefill", tc, &prefill)),
        PrefillIn::Both => model_graphs.push(text_graph_desc("qwen35_prefill", tc, &older_prefill)),
        PrefillIn::Separate | PrefillIn::None => {}
    }
    write_container(
        o,
        "model.hbm",
        Container {
            header: src.header(o, model_graphs),
            payload: text_payload.clone(),
        },
        files,
    )?;
    let has_prefill_file = matches!(o.prefill_in, PrefillIn::Separate | PrefillIn::Both);
    if has_prefill_file {
        let g = vec![text_graph_desc("qwen35_prefill", tc, &prefill)];
        write_container(
            o,
            "model_prefill.hbm",
            Container {
                header: src.header(o, g),
                payload: text_payload,
            },
            files,
        )?;
    }
    Ok(has_prefill_file)
}

/// `(decode, prefill, older prefill)` graph parameters; the older prefill graph (in
/// `model.hbm` with `--prefill-in both`) has all-row logits and no pads.
fn text_params(
    o: &PackageOptions,
    tc: &qwen35::TextConfig,
) -> (TextParams, TextParams, TextParams) {
    let mask_heads = if o.mask_heads_one {
        1
    } else {
        tc.num_attention_heads
    };
    let decode = TextParams {
        rows: 1,
        window: o.cache_len,
        mask_heads,
        logits_all_rows: false,
        logits: o.logits,
        logits_scale: o.s16_scale,
        pads: false,
        pad_layout: PadLayout::Last,
        pad_rope: PadRope::Identity,
        pad_mask: PadMask::Masked,
        dynamic_strides: o.dynamic_strides,
        logits_per_axis: o.quant_axis,
        cache_out_strides: o.cache_out_strides,
        cache_aligned_extra: 0,
    };
    let prefill = TextParams {
        rows: o.prefill_chunk,
        logits_all_rows: o.prefill_logits_all,
        pads: o.prefill_pads,
        pad_layout: o.pad_layout,
        pad_rope: o.pad_rope,
        pad_mask: o.pad_mask,
        ..decode.clone()
    };
    let older_prefill = TextParams {
        logits_all_rows: true,
        pads: false,
        ..prefill.clone()
    };
    (decode, prefill, older_prefill)
}

/// `visual.hbm`, after checking that the image bucket tiles into merge blocks.
fn write_tower(
    o: &PackageOptions,
    src: &Sources,
    vc: &qwen35::VisionConfig,
    tensors: &Tensors,
    files: &mut Vec<PathBuf>,
) -> Result<(), PackageError> {
    if !o
        .image_size
        .is_multiple_of(vc.patch_size * vc.spatial_merge_size)
    {
        return Err(PackageError::Option(format!(
            "image size {} is not a multiple of patch {} × merge {}",
            o.image_size, vc.patch_size, vc.spatial_merge_size
        )));
    }
    let p = VisualParams {
        image_size: o.image_size,
        output: o.logits,
        output_scale: o.s16_scale,
        rank: o.tower_rank,
        dynamic_strides: o.dynamic_strides,
    };
    let payload = if o.no_weights {
        Vec::new()
    } else {
        serialize(tensors, is_visual)?
    };
    write_container(
        o,
        "visual.hbm",
        Container {
            header: src.header(o, vec![visual_graph_desc("visual", vc, &p)]),
            payload,
        },
        files,
    )
}

/// `embed_tokens.bin`: headerless fp16 `[vocab, H]` (sparse zeros without weights).
fn write_embed(
    o: &PackageOptions,
    tc: &qwen35::TextConfig,
    tensors: &Tensors,
) -> Result<PathBuf, PackageError> {
    let embed_path = o.out_dir.join("embed_tokens.bin");
    let embed_len = (tc.vocab_size * tc.hidden_size * 2) as u64;
    if o.no_weights {
        let f = std::fs::File::create(&embed_path).map_err(io(&embed_path))?;
        f.set_len(embed_len).map_err(io(&embed_path))?; // sparse zeros
        return Ok(embed_path);
    }
    let name = [
        "model.language_model.embed_tokens.weight",
        "model.embed_tokens.weight",
    ]
    .into_iter()
    .find(|n| tensors.contains_key(*n))
    .ok_or_else(|| PackageError::Input {
        path: o.hf_dir.clone(),
        reason: "no embed_tokens weight".into(),
    })?;
    let checkpoint = |e: &dyn std::fmt::Display| PackageError::Input {
        path: o.hf_dir.clone(),
        reason: e.to_string(),
    };
    let ws = qwen35::WeightStore::open_files(&safetensors_files(&o.hf_dir)?)
        .map_err(|e| checkpoint(&e))?;
    let table = ws
        .get_f32(name, &[tc.vocab_size, tc.hidden_size])
        .map_err(|e| checkpoint(&e))?;
    std::fs::write(&embed_path, to_f16_bytes(&table)).map_err(io(&embed_path))?;
    Ok(embed_path)
}

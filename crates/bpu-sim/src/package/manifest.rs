//! The `model.json` of a sim package: the keys of a real hybrid VLM package, as
//! [`bllm_manifest::Manifest`] (docs/package-contract.md §1.2–§1.4).

use bllm_manifest::{Chat, Manifest, Vision};
use serde_json::Value;

use super::{token_id, PackageError, PackageOptions, Sources};

/// Stop ids: `generation_config.json`'s `eos_token_id` (one id or a list), else
/// `<|im_end|>` and `<|endoftext|>` (docs/package-contract.md §1.3).
fn sim_eos(o: &PackageOptions, tok: &Value) -> Vec<u32> {
    let mut eos: Vec<u32> = Vec::new();
    let gen_cfg = o.hf_dir.join("generation_config.json");
    if let Ok(text) = std::fs::read_to_string(&gen_cfg) {
        if let Ok(v) = serde_json::from_str::<Value>(&text) {
            match &v["eos_token_id"] {
                Value::Number(n) => eos.extend(n.as_u64().map(|x| x as u32)),
                Value::Array(a) => {
                    eos.extend(a.iter().filter_map(|x| x.as_u64()).map(|x| x as u32))
                }
                _ => {}
            }
        }
    }
    if eos.is_empty() {
        eos.extend(token_id(tok, "<|im_end|>"));
        eos.extend(token_id(tok, "<|endoftext|>"));
    }
    eos
}

/// A count as the manifest's `u32`.
fn manifest_u32(key: &str, v: usize) -> Result<u32, PackageError> {
    u32::try_from(v).map_err(|_| {
        PackageError::Option(format!(
            "{key} {v} does not fit model.json's 32-bit integer"
        ))
    })
}

/// `model.json` with the keys of a real hybrid VLM package.
pub(super) fn sim_manifest(
    o: &PackageOptions,
    src: &Sources,
    has_prefill_file: bool,
) -> Result<Manifest, PackageError> {
    let tc = &src.cfg.text;
    let marker = |name: &str| token_id(&src.tok, name).map_or(-1, i64::from);
    let mut m = Manifest {
        name: Some(
            src.cfg_path
                .parent()
                .and_then(|p| p.file_name())
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default(),
        ),
        arch: Some("hybrid".into()),
        backend: Some("native".into()),
        graph: Some("qwen35".into()),
        hbm: Some("model.hbm".into()),
        hbm_prefill: has_prefill_file.then(|| "model_prefill.hbm".into()),
        embed: Some("embed_tokens.bin".into()),
        tokenizer: Some("tokenizer.json".into()),
        eos: Some(sim_eos(o, &src.tok)),
        chat: Some(Chat {
            format: Some("chatml".into()),
            im_start: Some(marker("<|im_start|>")),
            im_end: Some(marker("<|im_end|>")),
            bos: None,
            system: Some(o.system.clone()),
        }),
        rope_theta: Some(tc.rope_theta),
        cache_len: Some(manifest_u32("cache_len", o.cache_len)?),
        prefill_pads: Some(o.prefill_pads),
        prefill_min_tail: Some(manifest_u32(
            "prefill_min_tail",
            o.prefill_min_tail.unwrap_or(o.prefill_chunk),
        )?),
        dialect: Some("qwen3.5".into()),
        image_token_id: src.cfg.image_token_id,
        ..Manifest::default()
    };
    if let Some(vc) = &src.cfg.vision {
        m.visual = Some("visual.hbm".into());
        m.mrope_section = Some(
            tc.mrope_section
                .iter()
                .map(|&s| manifest_u32("mrope_section", s))
                .collect::<Result<_, _>>()?,
        );
        m.mrope_interleaved = Some(true);
        m.vision = Some(Vision {
            patch: Some(manifest_u32("vision.patch", vc.patch_size)?),
            merge: Some(manifest_u32("vision.merge", vc.spatial_merge_size)?),
            mean: Some([0.5; 3]),
            std: Some([0.5; 3]),
            temporal: None,
        });
    }
    Ok(m)
}

//! Weight-loading paths: bf16/f16 checkpoints against f32, and bad inputs that must give
//! clear errors naming the key or tensor.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use qwen35::{argmax, LogitRows, Qwen35Model, WeightData};
use safetensors::Dtype;

/// f32 top-1/top-2 margin above which bf16 weights must keep the same top-1.
const BF16_TOP1_MARGIN: f32 = 0.25;
/// Per-step cosine floor for bf16 weights (the mean must still reach 0.999).
const BF16_STEP_MIN_COSINE: f64 = 0.995;

/// Teacher-forced logits at the positions that chose the golden greedy tokens.
fn step_logits(model: &Qwen35Model, ids: &[u32], greedy: &[u32]) -> Vec<Vec<f32>> {
    let mut all = ids.to_vec();
    all.extend_from_slice(&greedy[..greedy.len() - 1]);
    let inp = model.prompt_inputs(&all, &[]).unwrap();
    let mut st = model.text.new_state();
    let l = model
        .text
        .forward(&inp.embeds, &inp.positions, &mut st, LogitRows::All)
        .unwrap();
    let v = model.config.text.vocab_size;
    (ids.len() - 1..all.len())
        .map(|r| l[r * v..(r + 1) * v].to_vec())
        .collect()
}

#[test]
fn bf16_and_f16_weights_track_f32() {
    for name in MODELS {
        let g = Goldens::load(name);
        let f32_model = Qwen35Model::load(&g.dir).unwrap();
        let cases: Vec<(Vec<u32>, Vec<u32>)> = ["text_short", "text_32", "text_long"]
            .iter()
            .map(|c| {
                let case = g.case(c);
                (ids_of(&case, "prompt_ids"), ids_of(&case, "greedy_tokens"))
            })
            .collect();
        let reference: Vec<Vec<f32>> = cases
            .iter()
            .flat_map(|(ids, greedy)| step_logits(&f32_model, ids, greedy))
            .collect();
        for dt in [Dtype::BF16, Dtype::F16] {
            let tmp = tempfile::tempdir().unwrap();
            converted_copy(name, dt, tmp.path());
            let m = Qwen35Model::load(tmp.path()).unwrap();
            // bf16 must stay bf16 (mapped in place) and run through the bf16×f32 kernels;
            // f16 is widened to f32 on load
            match (dt, m.text.embed_weight()) {
                (Dtype::BF16, WeightData::Bf16(b)) => assert!(b.is_mapped()),
                (Dtype::F16, WeightData::F32(_)) => {}
                _ => panic!("{name} {dt:?}: embedding kept in an unexpected precision"),
            }
            let got: Vec<Vec<f32>> = cases
                .iter()
                .flat_map(|(ids, greedy)| step_logits(&m, ids, greedy))
                .collect();
            let mut checked = 0;
            let mut cos_sum = 0.0;
            for (i, (a, b)) in got.iter().zip(&reference).enumerate() {
                let c = cosine(a, b);
                // f16 keeps 11 mantissa bits and meets the bar at every step; bf16 (8 bits)
                // on these random tiny models dips below it at a few steps, so bf16 must meet
                // it on average and a looser floor per step. The loosening is about the
                // weights, not the kernel: the bf16×f32 kernels compute exactly on the widened
                // bf16 values (property-tested in `kernels::bf16` to f32 rounding), so the gap
                // to f32 is the rounding of the weights themselves, fixed by the committed
                // fixtures (generated for the f32 1e-4 bar, not regenerated for bf16).
                let floor = if dt == Dtype::F16 {
                    LOW_PRECISION_MIN_COSINE
                } else {
                    BF16_STEP_MIN_COSINE
                };
                assert!(c >= floor, "{name} {dt:?}: step {i} cosine {c}");
                cos_sum += c;
                let mut sorted = b.clone();
                sorted.sort_by(|x, y| y.total_cmp(x));
                let margin = sorted[0] - sorted[1];
                // bf16 rounding of these random weights moves logits by up to ~0.13, more than
                // the smallest f32 top-1/top-2 margins of the goldens (≥ 1e-2): top-1 is only
                // required to agree where the f32 margin clears that perturbation.
                if dt == Dtype::F16 || margin >= BF16_TOP1_MARGIN {
                    assert_eq!(
                        argmax(a),
                        argmax(b),
                        "{name} {dt:?}: step {i} top-1 (f32 margin {margin})"
                    );
                    checked += 1;
                }
            }
            let mean = cos_sum / reference.len() as f64;
            assert!(
                mean >= LOW_PRECISION_MIN_COSINE,
                "{name} {dt:?}: mean cosine {mean}"
            );
            assert!(
                checked * 3 >= reference.len(),
                "{name} {dt:?}: only {checked} steps had a clear top-1"
            );
        }
    }
}

/// The bf16 kernels against the exact f32 path on the same numbers: a bf16 checkpoint and its
/// f32 widening (every value bf16-representable) must give the same logits to f32 rounding.
#[test]
fn bf16_kernels_match_f32_path_on_identical_weights() {
    for name in MODELS {
        let g = Goldens::load(name);
        let bf = tempfile::tempdir().unwrap();
        converted_copy(name, Dtype::BF16, bf.path());
        let wide = tempfile::tempdir().unwrap();
        std::fs::copy(
            bf.path().join("config.json"),
            wide.path().join("config.json"),
        )
        .unwrap();
        rewrite_safetensors(
            &bf.path().join("model.safetensors"),
            &wide.path().join("model.safetensors"),
            |_, dt, shape, data| {
                if dt != Dtype::BF16 {
                    return Some((dt, shape.to_vec(), data.to_vec()));
                }
                let bytes = data
                    .chunks_exact(2)
                    .flat_map(|c| {
                        half::bf16::from_le_bytes([c[0], c[1]])
                            .to_f32()
                            .to_le_bytes()
                    })
                    .collect();
                Some((Dtype::F32, shape.to_vec(), bytes))
            },
        );
        let mb = Qwen35Model::load(bf.path()).unwrap();
        let mf = Qwen35Model::load(wide.path()).unwrap();
        assert!(matches!(mb.text.embed_weight(), WeightData::Bf16(_)));
        assert!(matches!(mf.text.embed_weight(), WeightData::F32(_)));
        let case = g.case("text_long");
        let ids = ids_of(&case, "prompt_ids");
        let greedy = ids_of(&case, "greedy_tokens");
        // prefill rows (tiled gemm) and one-row steps (GEMV) both
        let a = step_logits(&mb, &ids, &greedy);
        let b = step_logits(&mf, &ids, &greedy);
        let mut sb = mb.text.new_state();
        let mut sf = mf.text.new_state();
        let inp = mb.prompt_inputs(&ids, &[]).unwrap();
        let h = mb.config.text.hidden_size;
        for (t, p) in inp.positions.iter().enumerate() {
            let x = &inp.embeds[t * h..(t + 1) * h];
            let lb = mb
                .text
                .forward(x, std::slice::from_ref(p), &mut sb, LogitRows::Last)
                .unwrap();
            let lf = mf
                .text
                .forward(x, std::slice::from_ref(p), &mut sf, LogitRows::Last)
                .unwrap();
            let d = max_abs_diff(&lb, &lf);
            assert!(d <= PARITY_TOL, "{name}: one-row step {t} max |diff| {d}");
        }
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            let d = max_abs_diff(x, y);
            assert!(d <= PARITY_TOL, "{name}: prefill row {i} max |diff| {d}");
        }
        // the vision tower's bf16 matrices (tower rows spliced into the prompt), then a prefill
        let case = g.case("image_one");
        let ids = ids_of(&case, "prompt_ids");
        let images = g.images(&case, &mb);
        let ib = mb.prompt_inputs(&ids, &images).unwrap();
        let iw = mf.prompt_inputs(&ids, &images).unwrap();
        let d = max_abs_diff(&ib.embeds, &iw.embeds);
        assert!(d <= VISION_TOL, "{name}: image prompt rows max |diff| {d}");
        let lb = mb
            .text
            .forward(
                &ib.embeds,
                &ib.positions,
                &mut mb.text.new_state(),
                LogitRows::All,
            )
            .unwrap();
        let lf = mf
            .text
            .forward(
                &iw.embeds,
                &iw.positions,
                &mut mf.text.new_state(),
                LogitRows::All,
            )
            .unwrap();
        let d = max_abs_diff(&lb, &lf);
        assert!(
            d <= PARITY_TOL,
            "{name}: image prompt logits max |diff| {d}"
        );
    }
}

fn load_err(dir: &std::path::Path) -> String {
    match Qwen35Model::load(dir) {
        Ok(_) => panic!("loading {} should fail", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn unknown_layer_type_names_the_key() {
    let src = model_dir("tiny-sym");
    let tmp = tempfile::tempdir().unwrap();
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(src.join("config.json")).unwrap()).unwrap();
    cfg["text_config"]["layer_types"][2] = "sliding_attention".into();
    std::fs::write(
        tmp.path().join("config.json"),
        serde_json::to_vec(&cfg).unwrap(),
    )
    .unwrap();
    std::fs::copy(
        src.join("model.safetensors"),
        tmp.path().join("model.safetensors"),
    )
    .unwrap();
    let e = load_err(tmp.path());
    assert!(
        e.contains("text_config.layer_types[2]") && e.contains("sliding_attention"),
        "{e}"
    );
}

#[test]
fn missing_tensor_is_named() {
    let src = model_dir("tiny-sym");
    let tmp = tempfile::tempdir().unwrap();
    std::fs::copy(src.join("config.json"), tmp.path().join("config.json")).unwrap();
    let victim = "model.language_model.layers.1.linear_attn.A_log";
    rewrite_safetensors(
        &src.join("model.safetensors"),
        &tmp.path().join("model.safetensors"),
        |n, dt, s, d| (n != victim).then(|| (dt, s.to_vec(), d.to_vec())),
    );
    let e = load_err(tmp.path());
    assert!(e.contains(victim) && e.contains("missing"), "{e}");
}

#[test]
fn wrong_shape_is_named() {
    let src = model_dir("tiny-sym");
    let tmp = tempfile::tempdir().unwrap();
    std::fs::copy(src.join("config.json"), tmp.path().join("config.json")).unwrap();
    let victim = "model.language_model.layers.3.self_attn.k_proj.weight";
    rewrite_safetensors(
        &src.join("model.safetensors"),
        &tmp.path().join("model.safetensors"),
        |n, dt, s, d| {
            if n == victim {
                // same bytes seen as [in, out] instead of [out, in]
                Some((dt, vec![s[1], s[0]], d.to_vec()))
            } else {
                Some((dt, s.to_vec(), d.to_vec()))
            }
        },
    );
    let e = load_err(tmp.path());
    assert!(e.contains(victim) && e.contains("shape"), "{e}");
}

#[test]
fn truncated_file_is_an_error_naming_the_file() {
    let src = model_dir("tiny-sym");
    let tmp = tempfile::tempdir().unwrap();
    std::fs::copy(src.join("config.json"), tmp.path().join("config.json")).unwrap();
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    std::fs::write(
        tmp.path().join("model.safetensors"),
        &bytes[..bytes.len() / 2],
    )
    .unwrap();
    let e = load_err(tmp.path());
    assert!(
        e.contains("model.safetensors") && e.contains("truncated"),
        "{e}"
    );
    // a header cut in the middle
    std::fs::write(tmp.path().join("model.safetensors"), &bytes[..20]).unwrap();
    let e = load_err(tmp.path());
    assert!(e.contains("model.safetensors"), "{e}");
}

#[test]
fn image_slot_mismatches_name_the_slot() {
    let g = Goldens::load("tiny-sym");
    let model = Qwen35Model::load(&g.dir).unwrap();
    let case = g.case("image_one");
    let ids = ids_of(&case, "prompt_ids");
    let images = g.images(&case, &model);
    let e = model.prompt_inputs(&ids, &[]).unwrap_err().to_string();
    assert!(e.contains("image slot 0"), "{e}");
    let two = [images[0].clone(), images[0].clone()];
    let e = model.prompt_inputs(&ids, &two).unwrap_err().to_string();
    assert!(e.contains("image 1 has no image slot"), "{e}");
    let pad = model.config.image_token_id.unwrap();
    let at = ids.iter().position(|&x| x == pad).unwrap();
    let mut short = ids.clone();
    short.remove(at);
    let e = model
        .prompt_inputs(&short, &images)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("image slot 0") && e.contains("pad tokens"),
        "{e}"
    );
}

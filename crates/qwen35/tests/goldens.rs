//! crates/qwen35 against the HF transformers goldens of every fixture model
//! (`tools/fixtures/models/*`): logits, greedy continuations, vision rows, M-RoPE positions,
//! per-layer hidden states.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use qwen35::{argmax, LogitRows, Pos3, Qwen35Model};

#[test]
fn prompt_logits_positions_and_greedy_match_goldens() {
    for name in MODELS {
        let g = Goldens::load(name);
        let model = Qwen35Model::load(&g.dir).unwrap();
        for case in g.cases() {
            let cname = case["name"].as_str().unwrap().to_string();
            let ids = ids_of(&case, "prompt_ids");
            let images = g.images(&case, &model);
            let inp = model.prompt_inputs(&ids, &images).unwrap();
            if let Some(key) = case["tensors"]["position_ids"].as_str() {
                let (shape, pos) = g.i64(key);
                assert_eq!(shape, vec![3, ids.len()]);
                for (i, p) in inp.positions.iter().enumerate() {
                    let want = Pos3 {
                        t: pos[i],
                        h: pos[ids.len() + i],
                        w: pos[2 * ids.len() + i],
                    };
                    assert_eq!(*p, want, "{name}/{cname}: position {i}");
                }
            }
            let mut st = model.text.new_state();
            let logits = model
                .text
                .forward(&inp.embeds, &inp.positions, &mut st, LogitRows::All)
                .unwrap();
            let (shape, want) = g.f32(case["tensors"]["prompt_logits"].as_str().unwrap());
            assert_eq!(shape, vec![ids.len(), model.config.text.vocab_size]);
            let d = max_abs_diff(&logits, &want);
            assert!(
                d <= LOGIT_TOL,
                "{name}/{cname}: prompt logits max |diff| {d}"
            );

            let greedy = ids_of(&case, "greedy_tokens");
            let gen = model.generate_greedy(&ids, &images, greedy.len()).unwrap();
            assert_eq!(gen.tokens, greedy, "{name}/{cname}: greedy tokens");
            let (_, steps) = g.f32(case["tensors"]["step_logits"].as_str().unwrap());
            let v = model.config.text.vocab_size;
            for (i, l) in gen.logits.iter().enumerate() {
                let d = max_abs_diff(l, &steps[i * v..(i + 1) * v]);
                assert!(
                    d <= LOGIT_TOL,
                    "{name}/{cname}: step {i} logits max |diff| {d}"
                );
                assert_eq!(argmax(l) as u32, greedy[i]);
            }
        }
    }
}

#[test]
fn vision_rows_match_goldens() {
    for name in MODELS {
        let g = Goldens::load(name);
        let model = Qwen35Model::load(&g.dir).unwrap();
        let tower = model.vision.as_ref().unwrap();
        for entry in g.json["vision"].as_array().unwrap() {
            let img = load_image(&g.dir.join(entry["image"].as_str().unwrap()), &model);
            let thw: Vec<usize> = entry["grid_thw"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as usize)
                .collect();
            assert_eq!(
                vec![img.grid.t, img.grid.h, img.grid.w],
                thw,
                "{name}: grid of {}",
                entry["image"]
            );
            let rows = tower.forward(&img.pixel_values, &[img.grid]).unwrap();
            let (shape, want) = g.f32(entry["rows"].as_str().unwrap());
            assert_eq!(
                shape,
                vec![tower.rows_for(img.grid), model.config.text.hidden_size]
            );
            let d = max_abs_diff(&rows, &want);
            assert!(
                d <= VISION_TOL,
                "{name}: vision rows of {} max |diff| {d}",
                entry["image"]
            );
        }
    }
}

#[test]
fn hidden_states_match_goldens_layer_by_layer() {
    for name in MODELS {
        let g = Goldens::load(name);
        let model = Qwen35Model::load(&g.dir).unwrap();
        let case = g.case("text_short");
        let ids = ids_of(&case, "prompt_ids");
        let inp = model.prompt_inputs(&ids, &[]).unwrap();
        let mut st = model.text.new_state();
        let (_, hidden) = model
            .text
            .forward_hidden(&inp.embeds, &inp.positions, &mut st)
            .unwrap();
        let (shape, want) = g.f32(case["tensors"]["hidden_states"].as_str().unwrap());
        let layers = model.config.text.num_layers();
        assert_eq!(shape[0], layers + 1);
        let per = ids.len() * model.config.text.hidden_size;
        // entries 0..layers: embeddings and the residual stream after each layer but the last
        // (HF replaces the last entry by the final-normed stream)
        for l in 0..layers {
            let d = max_abs_diff(&hidden[l], &want[l * per..(l + 1) * per]);
            assert!(d <= LOGIT_TOL, "{name}: hidden state {l} max |diff| {d}");
        }
    }
}

//! Internal parity on the fixture models: chunked prefill vs token-by-token, and the
//! fixed-window / caller cos-sin / additive-mask forward vs the positions path.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use qwen35::{window_mask, LogitRows, Qwen35Model};

/// Logits `[n, vocab]` of feeding the prompt in chunks of `chunk` rows.
fn chunked_logits(
    model: &Qwen35Model,
    embeds: &[f32],
    pos: &[qwen35::Pos3],
    chunk: usize,
) -> Vec<f32> {
    let h = model.config.text.hidden_size;
    let mut st = model.text.new_state();
    let mut out = Vec::new();
    for (ci, p) in pos.chunks(chunk).enumerate() {
        let s = ci * chunk;
        out.extend(
            model
                .text
                .forward(
                    &embeds[s * h..(s + p.len()) * h],
                    p,
                    &mut st,
                    LogitRows::All,
                )
                .unwrap(),
        );
    }
    out
}

#[test]
fn chunked_prefill_matches_token_by_token() {
    for name in MODELS {
        let g = Goldens::load(name);
        let model = Qwen35Model::load(&g.dir).unwrap();
        for cname in ["text_long", "image_one"] {
            let case = g.case(cname);
            let ids = ids_of(&case, "prompt_ids");
            let images = g.images(&case, &model);
            let inp = model.prompt_inputs(&ids, &images).unwrap();
            let one = chunked_logits(&model, &inp.embeds, &inp.positions, 1);
            for n in [32, 16] {
                let c = chunked_logits(&model, &inp.embeds, &inp.positions, n);
                let d = max_abs_diff(&c, &one);
                assert!(
                    d <= PARITY_TOL,
                    "{name}/{cname}: N={n} chunked vs token-by-token max |diff| {d}"
                );
            }
        }
    }
}

#[test]
fn window_forward_matches_positions_path() {
    for name in MODELS {
        let g = Goldens::load(name);
        let model = Qwen35Model::load(&g.dir).unwrap();
        let cfg = &model.config.text;
        let case = g.case("image_one");
        let ids = ids_of(&case, "prompt_ids");
        let images = g.images(&case, &model);
        let inp = model.prompt_inputs(&ids, &images).unwrap();
        let want = chunked_logits(&model, &inp.embeds, &inp.positions, 32);
        let h = cfg.hidden_size;
        for mask_heads in [1, cfg.num_attention_heads] {
            for (cl, chunk) in [(ids.len() + 7, 32), (ids.len(), 16)] {
                let mut st = model.text.new_window_state(cl);
                let mut got = Vec::new();
                for (ci, p) in inp.positions.chunks(chunk).enumerate() {
                    let s = ci * chunk;
                    let (cos, sin) = model.text.rope_tables(p);
                    let mask = window_mask(st.consumed, p.len(), cl, mask_heads);
                    let x = &inp.embeds[s * h..(s + p.len()) * h];
                    got.extend(
                        model
                            .text
                            .forward_window(
                                x,
                                &cos,
                                &sin,
                                &mask,
                                mask_heads,
                                &mut st,
                                LogitRows::All,
                            )
                            .unwrap(),
                    );
                }
                let d = max_abs_diff(&got, &want);
                assert!(
                    d <= PARITY_TOL,
                    "{name}: window CL={cl} chunk={chunk} heads={mask_heads} max |diff| {d}"
                );
                let shapes = model.text.state_buffer_shapes(cl);
                for (b, shape) in st.buffers().iter().zip(&shapes) {
                    assert_eq!(b.len(), shape.iter().product::<usize>());
                }
                // state buffers round-trip through bytes
                let bufs: Vec<Vec<u8>> = st
                    .buffers()
                    .iter()
                    .map(|b| qwen35::f32_to_le_bytes(b))
                    .collect();
                let mut st2 = model.text.new_window_state(cl);
                st2.consumed = st.consumed;
                for (dst, b) in st2.buffers_mut().into_iter().zip(&bufs) {
                    qwen35::f32_from_le_bytes(dst, b).unwrap();
                }
                assert_eq!(st2, st);
            }
        }
    }
}

//! Prompt assembly (image slots → tower rows + M-RoPE positions) and greedy generation on
//! the CPU path. Shared by `vlm generate --hf` and the CPU backend.

use crate::error::{Error, Result};
use crate::model::Qwen35Model;
use crate::rope::{mrope_positions, ImageGrid, Pos3};
use crate::text::LogitRows;

/// One preprocessed image: `pixel_values [patches, C·T·P·P]` in merge order and its grid.
#[derive(Debug, Clone)]
pub struct PreparedImage {
    pub pixel_values: Vec<f32>,
    pub grid: ImageGrid,
}

/// Embedding rows and positions of a prompt, ready for [`crate::TextModel::forward`].
#[derive(Debug, Clone)]
pub struct PromptInputs {
    /// `[len, hidden]`.
    pub embeds: Vec<f32>,
    pub positions: Vec<Pos3>,
    /// Position of the first generated token (max prompt coordinate + 1).
    pub next_position: i64,
}

/// Result of [`Qwen35Model::generate_greedy`].
#[derive(Debug, Clone)]
pub struct Generation {
    pub tokens: Vec<u32>,
    /// `logits[i]` are the raw logits `[vocab]` that chose `tokens[i]`.
    pub logits: Vec<Vec<f32>>,
}

/// Index of the largest value (first one on ties, like `torch.argmax`).
pub fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best
}

impl Qwen35Model {
    /// Splices image rows into a prompt. An image slot is `<|vision_start|>`, a run of
    /// `image_token_id`, `<|vision_end|>`; slot `i` takes `images[i]`, whose tower rows must
    /// equal the run length. Errors name the slot.
    pub fn prompt_inputs(&self, ids: &[u32], images: &[PreparedImage]) -> Result<PromptInputs> {
        let h = self.config.text.hidden_size;
        let mut embeds = self.text.embed(ids)?;
        let pad = self.config.image_token_id;
        // find slots: maximal runs of the pad id
        let mut slots = Vec::new();
        if let Some(pad) = pad {
            let mut i = 0;
            while i < ids.len() {
                if ids[i] == pad {
                    let run = ids[i..].iter().take_while(|&&x| x == pad).count();
                    slots.push((i, run));
                    i += run;
                } else {
                    i += 1;
                }
            }
        }
        let slot_err = |reason: String| Error::ImageSlot { reason };
        for (s, &(start, run)) in slots.iter().enumerate() {
            if let Some(vs) = self.config.vision_start_token_id {
                if start == 0 || ids[start - 1] != vs {
                    return Err(slot_err(format!(
                        "image slot {s} (token {start}) is not preceded by <|vision_start|> ({vs})"
                    )));
                }
            }
            if let Some(ve) = self.config.vision_end_token_id {
                if ids.get(start + run) != Some(&ve) {
                    return Err(slot_err(format!(
                        "image slot {s} (token {start}) is not followed by <|vision_end|> ({ve})"
                    )));
                }
            }
        }
        if slots.len() != images.len() {
            let which = if slots.len() > images.len() {
                format!("image slot {} has no image", images.len())
            } else {
                format!("image {} has no image slot", slots.len())
            };
            return Err(slot_err(format!(
                "{} slots in the prompt, {} images given: {which}",
                slots.len(),
                images.len()
            )));
        }
        let mut grids = Vec::with_capacity(images.len());
        if !images.is_empty() {
            let tower = self
                .vision
                .as_ref()
                .ok_or_else(|| slot_err("the checkpoint has no vision tower".into()))?;
            for (s, (img, &(start, run))) in images.iter().zip(&slots).enumerate() {
                let want = tower.rows_for(img.grid);
                if want != run {
                    return Err(slot_err(format!(
                        "image slot {s} (token {start}) has {run} pad tokens but its image gives {want} rows"
                    )));
                }
                let rows = tower.forward(&img.pixel_values, &[img.grid])?;
                embeds[start * h..(start + run) * h].copy_from_slice(&rows);
                grids.push(img.grid);
            }
        }
        let merge = self
            .config
            .vision
            .as_ref()
            .map_or(1, |v| v.spatial_merge_size);
        let (positions, _delta) = mrope_positions(ids, pad.unwrap_or(u32::MAX), &grids, merge)?;
        let next_position = positions.iter().map(Pos3::max).max().map_or(0, |m| m + 1);
        Ok(PromptInputs {
            embeds,
            positions,
            next_position,
        })
    }

    /// Greedy decoding: one N-row prefill of the prompt, then one-row steps.
    pub fn generate_greedy(
        &self,
        ids: &[u32],
        images: &[PreparedImage],
        max_new: usize,
    ) -> Result<Generation> {
        let inp = self.prompt_inputs(ids, images)?;
        let mut state = self.text.new_state();
        let mut tokens = Vec::with_capacity(max_new);
        let mut logits = Vec::with_capacity(max_new);
        if max_new == 0 {
            return Ok(Generation { tokens, logits });
        }
        let mut last =
            self.text
                .forward(&inp.embeds, &inp.positions, &mut state, LogitRows::Last)?;
        let mut pos = inp.next_position;
        loop {
            let tok = argmax(&last) as u32;
            tokens.push(tok);
            logits.push(last);
            if tokens.len() == max_new {
                break;
            }
            let x = self.text.embed(&[tok])?;
            last = self
                .text
                .forward(&x, &[Pos3::text(pos)], &mut state, LogitRows::Last)?;
            pos += 1;
        }
        Ok(Generation { tokens, logits })
    }
}

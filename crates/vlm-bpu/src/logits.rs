//! The last row's logits and the decode-logits image (§10.2). F32 decode logits are read in
//! place from the graph's output buffer, and that buffer stands in for the image until a
//! prefill or a snapshot needs the copy: a decode step then costs no copy of `vocab` floats.

use hbdnn::DType;
use vlm::engine::EngineError;

use crate::BpuBackend;

/// Where the last row's logits live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LogitsAt {
    /// Empty state.
    Nowhere,
    /// `BpuBackend::logits` (S16 dequantised, or after a prefill / restore).
    Vec,
    /// F32 logits read in place from the decode graph's output buffer (no copy per step).
    DecodeBuffer,
}

/// Dequantises one raw logits row into `out` (reused between steps).
fn dequantise_into(dtype: DType, scale: f32, vocab: usize, raw: &[u8], out: &mut Vec<f32>) {
    out.clear();
    match dtype {
        DType::S16 => out.extend(
            raw.chunks_exact(2)
                .take(vocab)
                .map(|b| f32::from(i16::from_le_bytes([b[0], b[1]])) * scale),
        ),
        _ => out.extend(
            raw.chunks_exact(4)
                .take(vocab)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        ),
    }
}

impl BpuBackend {
    /// The logits dtype of the decode graph (F32 or S16) and its dequantisation scale.
    pub fn logits_format(&self) -> (DType, f32) {
        let s = &self.decode.graph.outputs()[0];
        (s.dtype, s.scale0())
    }

    /// Bytes of one logits row.
    pub(crate) fn row_bytes(&self) -> usize {
        let esz = if self.shape.logits == DType::S16 {
            2
        } else {
            4
        };
        self.shape.vocab * esz
    }

    pub(crate) fn read_logits(&self) -> Option<&[f32]> {
        match self.logits_at {
            LogitsAt::Nowhere => None,
            LogitsAt::Vec => Some(&self.logits),
            LogitsAt::DecodeBuffer => {
                let len = self.shape.vocab * 4;
                bytemuck::try_cast_slice(&self.decode.logits.as_bytes()[..len]).ok()
            }
        }
    }

    /// After a decode run its output buffer is the image; F32 logits are read in place when
    /// the buffer is aligned for it.
    pub(crate) fn logits_after_decode(&mut self) {
        self.image_in_decode_buffer = true;
        let len = self.row_bytes();
        let raw = &self.decode.logits.as_bytes()[..len];
        if self.shape.logits == DType::F32 && bytemuck::try_cast_slice::<u8, f32>(raw).is_ok() {
            self.logits_at = LogitsAt::DecodeBuffer;
        } else {
            let (dtype, scale) = self.logits_format();
            dequantise_into(dtype, scale, self.shape.vocab, raw, &mut self.logits);
            self.logits_at = LogitsAt::Vec;
        }
    }

    /// After a prefill chunk the row at byte `off` of its logits output (the last real row)
    /// replaces the first row of the decode image, as if the decode graph had produced it.
    pub(crate) fn logits_after_prefill(
        &mut self,
        off: usize,
        rows: usize,
    ) -> Result<(), EngineError> {
        let len = self.row_bytes();
        self.materialise_image();
        let io = self.prefill.as_ref().ok_or(EngineError::RowCount {
            rows,
            chunk: self.info.prefill_chunk,
        })?;
        self.logit_image[..len].copy_from_slice(&io.logits.as_bytes()[off..off + len]);
        self.logits_from_image();
        Ok(())
    }

    /// Sets the last logits from the raw row at the start of the decode-logits image.
    pub(crate) fn logits_from_image(&mut self) {
        let (dtype, scale) = self.logits_format();
        let len = self.row_bytes();
        dequantise_into(
            dtype,
            scale,
            self.shape.vocab,
            &self.logit_image[..len],
            &mut self.logits,
        );
        self.logits_at = LogitsAt::Vec;
    }

    /// Copies the decode output buffer into the decode-logits image when it stands for it.
    pub(crate) fn materialise_image(&mut self) {
        if self.image_in_decode_buffer {
            let full = self.decode.logits.as_bytes();
            let k = full.len().min(self.logit_image.len());
            self.logit_image[..k].copy_from_slice(&full[..k]);
            self.image_in_decode_buffer = false;
        }
    }
}

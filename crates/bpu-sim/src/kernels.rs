//! Graph computations behind the simulated graphs.

use crate::container::{self, Container, GraphDesc, GraphKind, TensorDesc};

/// A graph body: reads input tensors, writes output tensors (device bytes, graph layouts).
/// State lives only in the tensors (cache inputs/outputs), so kernels are immutable.
pub(crate) trait Kernel: Send {
    /// False when the graph only models time (a `--no-weights` package): no bytes move.
    fn needs_data(&self) -> bool {
        true
    }
    fn run(&self, inputs: &[&[u8]], outputs: &mut [&mut [u8]]) -> Result<(), String>;
    /// Bytes written to output 0 by a graph that `!needs_data` (its constant result).
    fn fixed_output0(&self) -> Option<&[u8]> {
        None
    }
}

pub(crate) fn build(
    desc: &GraphDesc,
    c: &Container,
    loaded: &mut Option<std::sync::Arc<crate::graphs::Loaded>>,
) -> Result<Box<dyn Kernel>, String> {
    if !c.header.has_weights {
        let logits = match &desc.kind {
            GraphKind::Qwen35Text(p) => Some(crate::graphs::synthetic_logits(
                &desc.outputs[0],
                p.logits,
                p.logits_scale,
            )),
            _ => None,
        };
        return Ok(Box::new(TimingOnly { logits }));
    }
    match &desc.kind {
        GraphKind::Affine { mul, add } => {
            Affine::new(desc, *mul, *add).map(|k| Box::new(k) as Box<dyn Kernel>)
        }
        other => crate::graphs::build(desc, other, loaded, c),
    }
}

/// A graph of a `--no-weights` package: only its time is modelled. Text graphs still emit a
/// fixed synthetic logits output (so a sampler sees a realistic distribution); caches and the
/// tower output are left untouched.
struct TimingOnly {
    logits: Option<Vec<u8>>,
}

impl Kernel for TimingOnly {
    fn needs_data(&self) -> bool {
        false
    }
    fn fixed_output0(&self) -> Option<&[u8]> {
        self.logits.as_deref()
    }
    fn run(&self, _: &[&[u8]], _: &mut [&mut [u8]]) -> Result<(), String> {
        Ok(())
    }
}

/// Reads a dense row-major f32 copy of a tensor laid out by its (resolved) strides.
pub(crate) fn read_f32(t: &TensorDesc, bytes: &[u8]) -> Vec<f32> {
    let strides = container::resolved_strides(t);
    let rank = t.shape.len();
    let last = t.shape[rank - 1] as usize;
    let rows: usize = t.shape[..rank - 1].iter().map(|&d| d as usize).product();
    let mut out = Vec::with_capacity(rows * last);
    for r in 0..rows {
        let base = row_offset(t, &strides, r);
        for c in 0..last {
            let at = base + c * strides[rank - 1];
            out.push(f32::from_le_bytes(
                bytes[at..at + 4].try_into().expect("4 bytes"),
            ));
        }
    }
    out
}

/// Writes a dense row-major f32 array into a tensor by its strides (padding untouched).
pub(crate) fn write_f32(t: &TensorDesc, bytes: &mut [u8], data: &[f32]) {
    let strides = container::resolved_strides(t);
    let rank = t.shape.len();
    let last = t.shape[rank - 1] as usize;
    for (r, row) in data.chunks(last).enumerate() {
        let base = row_offset(t, &strides, r);
        for (c, v) in row.iter().enumerate() {
            let at = base + c * strides[rank - 1];
            bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
        }
    }
}

/// Copies tensor `t`'s elements from `src` (laid out by `src_strides`) into `dst` (by
/// `dst_strides`); padding in `dst` is left as it was.
pub(crate) fn restride(
    t: &TensorDesc,
    src: &[u8],
    src_strides: &[usize],
    dst: &mut [u8],
    dst_strides: &[usize],
) {
    let esz = container::elem_size(t.dtype).unwrap_or(1);
    let rank = t.shape.len();
    let last = t.shape[rank - 1] as usize;
    let rows: usize = t.shape[..rank - 1].iter().map(|&d| d as usize).product();
    let (sl, dl) = (src_strides[rank - 1], dst_strides[rank - 1]);
    for r in 0..rows {
        let (s0, d0) = (row_offset(t, src_strides, r), row_offset(t, dst_strides, r));
        if sl == esz && dl == esz {
            dst[d0..d0 + last * esz].copy_from_slice(&src[s0..s0 + last * esz]);
            continue;
        }
        for c in 0..last {
            let (s, d) = (s0 + c * sl, d0 + c * dl);
            dst[d..d + esz].copy_from_slice(&src[s..s + esz]);
        }
    }
}

fn row_offset(t: &TensorDesc, strides: &[usize], mut r: usize) -> usize {
    let rank = t.shape.len();
    let mut off = 0;
    for d in (0..rank - 1).rev() {
        let dim = t.shape[d] as usize;
        off += (r % dim) * strides[d];
        r /= dim;
    }
    off
}

/// Test graph: output i = input i × mul + add.
struct Affine {
    inputs: Vec<TensorDesc>,
    outputs: Vec<TensorDesc>,
    mul: f32,
    add: f32,
}

impl Affine {
    fn new(desc: &GraphDesc, mul: f32, add: f32) -> Result<Self, String> {
        if desc.inputs.len() != desc.outputs.len() {
            return Err("affine graph needs as many outputs as inputs".into());
        }
        for (i, o) in desc.inputs.iter().zip(&desc.outputs) {
            if i.shape != o.shape
                || i.dtype != hbdnn_sys::HB_DNN_TENSOR_TYPE_F32
                || o.dtype != i.dtype
            {
                return Err("affine graph needs f32 tensors of equal shapes".into());
            }
        }
        Ok(Self {
            inputs: desc.inputs.clone(),
            outputs: desc.outputs.clone(),
            mul,
            add,
        })
    }
}

impl Kernel for Affine {
    fn run(&self, inputs: &[&[u8]], outputs: &mut [&mut [u8]]) -> Result<(), String> {
        for (k, out) in outputs.iter_mut().enumerate() {
            let x = read_f32(&self.inputs[k], inputs[k]);
            let y: Vec<f32> = x.iter().map(|v| v * self.mul + self.add).collect();
            write_f32(&self.outputs[k], out, &y);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restride_moves_elements_between_layouts() {
        let t = TensorDesc {
            shape: vec![2, 3],
            dtype: hbdnn_sys::HB_DNN_TENSOR_TYPE_S16,
            strides: vec![-1, -1],
            scale: vec![],
        };
        let tight: Vec<u8> = (1..=12).collect();
        let mut wide = vec![0u8; 2 * 32];
        restride(&t, &tight, &[6, 2], &mut wide, &[32, 2]);
        assert_eq!(&wide[..6], &tight[..6]);
        assert_eq!(&wide[32..38], &tight[6..]);
        assert!(wide[6..32].iter().all(|&b| b == 0));
        let mut back = vec![0u8; 12];
        restride(&t, &wide, &[32, 2], &mut back, &[6, 2]);
        assert_eq!(back, tight);
        let mut spread = vec![0u8; 2 * 32];
        restride(&t, &tight, &[6, 2], &mut spread, &[32, 4]);
        assert_eq!(&spread[..6], &[1, 2, 0, 0, 3, 4]);
    }
}

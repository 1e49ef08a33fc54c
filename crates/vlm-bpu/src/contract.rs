//! Graph checks against docs/package-contract.md (§3.1 decode I/O, §4.1–§4.2 prefill I/O): the
//! window `CL` and mask planes come from the mask, `H` from input 0, `ROT` from input 1,
//! `vocab` from output 0, caches by index. As tolerant as BLLM where a board may report
//! otherwise than our simulator: a cache output only has to fit the buffer of its input (a
//! different layout is a warning naming both), and prefill caches are compared with decode's
//! by `stride[0] × dim[0]` only, as BLLM sizes them (a different `alignedByteSize` is a
//! warning, and the shared buffers are allocated for the larger). Refused outright: per-axis quantisation (or a
//! zero point) on a tensor the runtime reads or writes, which one scale would silently get
//! wrong.

use hbdnn::{DType, Graph, TensorSpec};

/// Number of fixed inputs before the caches (x, cos, sin, mask).
pub const FIXED_IN: usize = 4;

/// What the decode graph says about the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeShape {
    pub hidden: usize,
    pub rot: usize,
    pub context: usize,
    pub mask_heads: usize,
    pub vocab: usize,
    pub logits: DType,
    pub n_cache: usize,
}

fn dims(s: &TensorSpec) -> String {
    format!("{:?} {:?}", s.shape, s.dtype)
}

/// Checks the decode graph; `Err` carries the reason (the caller names the file).
pub fn check_decode(g: &Graph) -> Result<DecodeShape, String> {
    let (ins, outs) = (g.inputs(), g.outputs());
    if ins.len() < FIXED_IN + 1 {
        return Err(format!(
            "graph `{}` has {} inputs; the contract needs 4 fixed inputs and at least one cache",
            g.name(),
            ins.len()
        ));
    }
    if let Some(s) = ins.iter().chain(outs).find(|s| s.rank() == 0) {
        return Err(format!(
            "graph `{}` has a scalar tensor {}",
            g.name(),
            dims(s)
        ));
    }
    let n_cache = ins.len() - FIXED_IN;
    if outs.len() != 1 + n_cache {
        return Err(format!(
            "graph `{}`: output count {} != 1 + nCache ({})",
            g.name(),
            outs.len(),
            1 + n_cache
        ));
    }
    let mask = &ins[3];
    if mask.rank() != 2 || mask.dtype != DType::F32 {
        return Err(format!(
            "decode mask (input 3) must be 2-D [nHead, CL] f32, found {}",
            dims(mask)
        ));
    }
    let (mask_heads, context) = (mask.shape[0], mask.shape[1]);
    let hidden = ins[0].last_dim();
    let rot = ins[1].last_dim();
    if hidden == 0 || rot == 0 || rot % 2 != 0 || context == 0 || mask_heads == 0 {
        return Err(format!(
            "decode graph sizes unusable: hidden {hidden}, rot {rot}, mask {}",
            dims(mask)
        ));
    }
    for (i, what) in [(0, "x"), (1, "cos"), (2, "sin")] {
        let s = &ins[i];
        if s.rows() != 1 || s.dtype != DType::F32 {
            return Err(format!(
                "decode input {i} ({what}) must be one f32 row, found {}",
                dims(s)
            ));
        }
    }
    if ins[2].last_dim() != rot {
        return Err(format!(
            "decode sin (input 2) {} differs from cos (input 1) {}",
            dims(&ins[2]),
            dims(&ins[1])
        ));
    }
    let out = &outs[0];
    if !matches!(out.dtype, DType::F32 | DType::S16) || out.last_dim() == 0 {
        return Err(format!(
            "decode logits (output 0) must be F32 or S16 [.., vocab], found {}",
            dims(out)
        ));
    }
    for c in 0..n_cache {
        cache_output_fits(g.name(), c, &ins[FIXED_IN + c], &outs[1 + c])?;
    }
    check_quantisation(g, TEXT_INPUTS, TEXT_OUTPUTS)?;
    Ok(DecodeShape {
        hidden,
        rot,
        context,
        mask_heads,
        vocab: out.last_dim(),
        logits: out.dtype,
        n_cache,
    })
}

/// A prefill graph that agrees with the decode graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefillFit {
    /// Rows per chunk.
    pub rows: usize,
    /// Differences that do not stop it being used (each already logged as a warning).
    pub warnings: Vec<String>,
}

/// `stride[0] × dim[0]` (strides resolved): the bytes the tensor's rows span, which is how
/// BLLM sizes a tensor.
pub fn extent(s: &TensorSpec) -> usize {
    match (s.strides.first(), s.shape.first()) {
        (Some(st), Some(d)) => st.saturating_mul(*d),
        _ => 0,
    }
}

/// Checks a prefill graph against the decode graph (§4.1).
pub fn check_prefill(p: &Graph, dec: &Graph, d: &DecodeShape) -> Result<PrefillFit, String> {
    let (ins, outs) = (p.inputs(), p.outputs());
    if ins.len() != dec.inputs().len() || outs.len() != dec.outputs().len() {
        return Err(format!(
            "{} inputs / {} outputs, decode has {} / {}",
            ins.len(),
            outs.len(),
            dec.inputs().len(),
            dec.outputs().len()
        ));
    }
    if let Some(s) = ins.iter().chain(outs).find(|s| s.rank() == 0) {
        return Err(format!("scalar tensor {}", dims(s)));
    }
    let n = prefill_rows(ins, d)?;
    let mut warnings = Vec::new();
    for c in 0..d.n_cache {
        warnings.extend(check_prefill_cache(p, dec, c)?);
    }
    check_prefill_logits(&outs[0], &dec.outputs()[0], d)?;
    Ok(PrefillFit { rows: n, warnings })
}

/// Rows `N` of a prefill chunk, from input 0 `[N, H]`; cos, sin and mask must agree with it.
fn prefill_rows(ins: &[TensorSpec], d: &DecodeShape) -> Result<usize, String> {
    let x = &ins[0];
    if x.rank() < 2 || x.last_dim() != d.hidden {
        return Err(format!("input 0 {} is not [N, {}]", dims(x), d.hidden));
    }
    let n = x.shape[x.rank() - 2];
    if n < 2 {
        return Err(format!("input 0 {} has N = {n} < 2", dims(x)));
    }
    for (i, what) in [(1, "cos"), (2, "sin")] {
        let s = &ins[i];
        if s.rows() != n || s.last_dim() != d.rot || s.dtype != DType::F32 {
            return Err(format!(
                "input {i} ({what}) {} is not [{n}, {}] f32",
                dims(s),
                d.rot
            ));
        }
    }
    let mask = &ins[3];
    if mask.shape != [d.mask_heads, n, d.context] || mask.dtype != DType::F32 {
        return Err(format!(
            "mask (input 3) {} is not [{}, {n}, {}] f32",
            dims(mask),
            d.mask_heads,
            d.context
        ));
    }
    Ok(n)
}

/// Cache `c` of the prefill graph against decode's: the same rows in, an output that fits
/// the shared buffer. Returns the warnings (already logged).
fn check_prefill_cache(p: &Graph, dec: &Graph, c: usize) -> Result<Vec<String>, String> {
    let (pi, di) = (&p.inputs()[FIXED_IN + c], &dec.inputs()[FIXED_IN + c]);
    // The decode graph's cache buffers are shared: the same rows in, outputs that fit.
    if extent(pi) != extent(di) {
        return Err(format!(
            "cache {c}: {:?} strides {:?} spans {} bytes (stride[0] × dim[0]), decode's \
             {:?} strides {:?} spans {} bytes",
            pi.shape,
            pi.strides,
            extent(pi),
            di.shape,
            di.strides,
            extent(di)
        ));
    }
    if pi.strides != di.strides {
        tracing::warn!(
            graph = p.name(),
            cache = c,
            "cache input {} strides {:?} differ from the decode graph's {:?} (same size)",
            FIXED_IN + c,
            pi.strides,
            di.strides
        );
    }
    let po = &p.outputs()[1 + c];
    if extent(po) > extent(di) {
        return Err(format!(
            "cache {c}: output {} {:?} strides {:?} spans {} bytes, more than the {} bytes \
             of decode's input {} {:?} strides {:?}",
            1 + c,
            po.shape,
            po.strides,
            extent(po),
            extent(di),
            FIXED_IN + c,
            di.shape,
            di.strides
        ));
    }
    // BLLM never compares alignedByteSize; the cache buffers are allocated for the
    // largest one reported (`cache_buffer_bytes`), so a difference only costs memory.
    let mut warnings = Vec::new();
    for (side, t) in [("input", pi), ("output", po)] {
        if t.aligned_byte_size != di.aligned_byte_size {
            let w = format!(
                "graph `{}` cache {c} {side}: alignedByteSize {} differs from the decode \
                 graph's {} (same stride[0] × dim[0], {} bytes); the cache buffers are \
                 allocated with {} bytes",
                p.name(),
                t.reported_aligned_byte_size,
                di.reported_aligned_byte_size,
                extent(di),
                t.byte_size.max(di.byte_size)
            );
            tracing::warn!("{w}");
            warnings.push(w);
        }
    }
    Ok(warnings)
}

/// Prefill logits (output 0) against decode's: same type and vocab, rows that fit.
fn check_prefill_logits(
    out: &TensorSpec,
    dout: &TensorSpec,
    d: &DecodeShape,
) -> Result<(), String> {
    // bllm copies `row_stride` bytes into the decode buffer; we copy only the row's values,
    // so an all-rows graph with a padded pitch (wider than the decode buffer) still fits.
    let row_bytes = d.vocab * out.dtype.size().unwrap_or(4);
    if out.dtype != dout.dtype
        || out.last_dim() != d.vocab
        || out.rank() < 2
        || out.row_stride() == 0
        || out.row_stride() < row_bytes
        || row_bytes > dout.byte_size
    {
        return Err(format!(
            "logits (output 0) {} do not match decode's {}",
            dims(out),
            dims(dout)
        ));
    }
    Ok(())
}

/// Bytes each cache buffer is allocated with: decode's cache input, and (when the prefill
/// graph is used) the largest of its cache input and output, which are bound to the same
/// buffers and may report a larger `alignedByteSize`.
pub fn cache_buffer_bytes(dec: &Graph, prefill: Option<&Graph>, n_cache: usize) -> Vec<usize> {
    (0..n_cache)
        .map(|c| {
            let mut n = dec.inputs()[FIXED_IN + c].byte_size;
            if let Some(p) = prefill {
                for t in [p.inputs().get(FIXED_IN + c), p.outputs().get(1 + c)]
                    .into_iter()
                    .flatten()
                {
                    n = n.max(t.byte_size);
                }
            }
            n
        })
        .collect()
}

/// Cache `c`'s output is bound to a buffer sized for its input (the ping-pong sets): it only
/// has to fit. Other strides or sizes than the input's are a warning naming both layouts.
fn cache_output_fits(graph: &str, c: usize, i: &TensorSpec, o: &TensorSpec) -> Result<(), String> {
    if o.byte_size > i.byte_size {
        return Err(format!(
            "cache {c}: output {} ({:?} strides {:?}) needs {} bytes, more than the {} bytes of \
             the buffer sized for input {} ({:?} strides {:?})",
            1 + c,
            o.shape,
            o.strides,
            o.byte_size,
            i.byte_size,
            FIXED_IN + c,
            i.shape,
            i.strides
        ));
    }
    if i.strides != o.strides || i.byte_size != o.byte_size {
        tracing::warn!(
            graph,
            cache = c,
            "cache input {} {:?} strides {:?} ({} bytes) and output {} {:?} strides {:?} ({} \
             bytes) differ; the output fits the input's buffer, so it is bound there",
            FIXED_IN + c,
            i.shape,
            i.strides,
            i.byte_size,
            1 + c,
            o.shape,
            o.strides,
            o.byte_size
        );
    }
    Ok(())
}

/// Inputs of a text graph the runtime writes (x, cos, sin, mask).
pub const TEXT_INPUTS: &[usize] = &[0, 1, 2, 3];
/// Outputs of a text graph the runtime reads (logits).
pub const TEXT_OUTPUTS: &[usize] = &[0];

/// Refuses per-axis quantisation (more than one scale or zero point) and non-zero zero points
/// on the `inputs` and `outputs` of `g` the runtime reads or writes: it (de)quantises with one
/// scale per tensor, so such a tensor would silently come out wrong. One scale with any
/// `quantizeAxis` is one scale for the whole tensor and is accepted (a board may report an
/// axis of 0 for per-tensor scales).
pub fn check_quantisation(g: &Graph, inputs: &[usize], outputs: &[usize]) -> Result<(), String> {
    let sides = [
        ("input", g.inputs(), inputs),
        ("output", g.outputs(), outputs),
    ];
    for (side, specs, used) in sides {
        for &i in used {
            let Some(s) = specs.get(i) else { continue };
            if let Some(why) = unsupported_quantisation(s) {
                return Err(format!(
                    "graph `{}` {side} {i}: {why} is not supported: the runtime (de)quantises \
                     with one scale per tensor",
                    g.name()
                ));
            }
        }
    }
    Ok(())
}

fn unsupported_quantisation(s: &TensorSpec) -> Option<String> {
    let list = |v: &[f32]| {
        let shown: Vec<String> = v.iter().take(4).map(|x| format!("{x}")).collect();
        let more = if v.len() > 4 { ", …" } else { "" };
        format!("[{}{more}]", shown.join(", "))
    };
    if s.scale.len() > 1 || s.zero_point.len() > 1 {
        return Some(format!(
            "per-axis quantisation (scaleLen {}, quantizeAxis {}, scales {}, zeroPointLen {})",
            s.scale.len(),
            s.quantize_axis,
            list(&s.scale),
            s.zero_point.len()
        ));
    }
    match s.zero_point.first() {
        Some(&zp) if zp != 0 => Some(format!(
            "a zero point of {zp} (scale {}, quantizeAxis {})",
            list(&s.scale),
            s.quantize_axis
        )),
        _ => None,
    }
}

/// `Some(bytes per window row)` for a window-indexed K/V cache (`dim[0] == CL` and
/// `stride0 · CL == byte size`), `None` for caches saved whole.
pub fn window_row_bytes(spec: &TensorSpec, context: usize) -> Option<usize> {
    (spec.rank() >= 2 && spec.shape[0] == context && spec.strides[0] * context == spec.byte_size)
        .then_some(spec.strides[0])
}

//! Running rows through the text graphs: one row through decode, `N` through prefill, or a
//! short prompt tail padded to `N` with the pads in front of or after the real rows
//! (docs/package-contract.md §4.4, [`crate::tail`]). Each run writes its fixed inputs (the rows, M-RoPE
//! cos/sin, the right-aligned window mask in every head plane), CLEANs them, reads the
//! current cache set and writes the other, and INVALIDATEs the logits before the CPU reads
//! them.

use std::borrow::Cow;
use std::path::Path;
use std::time::Instant;

use hbdnn::{DeviceBuffer, FlushMode, Graph, TensorSpec};

use vlm::chat::Pos3;
use vlm::engine::{check_rows, Backend, EngineError, StateShape};

use crate::contract::FIXED_IN;
use crate::error::device;
use crate::pad_marking::{pad_inputs, PadRows};
use crate::tail::{PadLayout, PadMarking};
use crate::{state, BpuBackend, BpuError};

/// Input index of the window mask among the fixed inputs.
const MASK: usize = 3;

/// Fixed inputs (x, cos, sin, mask) and the logits output of one text graph.
pub(crate) struct Io {
    pub(crate) graph: Graph,
    pub(crate) fixed: Vec<DeviceBuffer>,
    pub(crate) logits: DeviceBuffer,
    /// Rows per run: 1 for decode, `N` for prefill.
    pub(crate) rows: usize,
}

impl Io {
    pub(crate) fn new(graph: Graph, rows: usize, path: &Path) -> Result<Self, BpuError> {
        let hb = |source| BpuError::Hbdnn {
            path: path.to_owned(),
            source,
        };
        let fixed = (0..FIXED_IN)
            .map(|i| graph.alloc_input(i))
            .collect::<Result<Vec<_>, _>>()
            .map_err(hb)?;
        let logits = graph.alloc_output(0).map_err(hb)?;
        Ok(Self {
            graph,
            fixed,
            logits,
            rows,
        })
    }
}

/// The fixed inputs of one run, pad rows included.
struct Inputs<'a> {
    x: Cow<'a, [f32]>,
    cos: Vec<f32>,
    sin: Vec<f32>,
    /// Empty for a decode run: its mask is updated in place (`write_decode_mask`).
    mask: Vec<f32>,
}

impl Inputs<'_> {
    fn in_order(&self) -> [&[f32]; FIXED_IN] {
        [&self.x, &self.cos, &self.sin, &self.mask]
    }
}

fn write_input(buf: &mut DeviceBuffer, spec: &TensorSpec, data: &[f32]) -> Result<(), EngineError> {
    buf.write_tensor(spec, data)
        .map_err(|e| device("input write", e))?;
    buf.clean().map_err(|e| device("CLEAN", e))
}

impl BpuBackend {
    /// Runs `rows` as whole prefill chunks while they last, then the tail padded to one chunk
    /// when [`Self::pad_tail_marking`] says so, else row by row; `interrupt` is asked before
    /// every run.
    pub(crate) fn step_rows(
        &mut self,
        rows: &[f32],
        positions: &[Pos3],
        interrupt: &mut dyn FnMut() -> bool,
    ) -> Result<bool, EngineError> {
        let h = self.info.hidden;
        let n = check_rows(h, rows, positions, self.context_left())?;
        let chunk = self.info.prefill_chunk;
        let mut i = 0;
        while i < n {
            if interrupt() {
                return Ok(false);
            }
            let rest = n - i;
            let (take, pad) = if self.first_row_alone() {
                (1, None)
            } else if chunk >= 2 && rest >= chunk {
                (chunk, None)
            } else if let Some(marking) = self.pad_tail_marking(rest) {
                (rest, Some(marking))
            } else {
                (1, None)
            };
            let (r, p) = (&rows[i * h..(i + take) * h], &positions[i..i + take]);
            self.run_chunk(r, p, pad)?;
            i += take;
        }
        Ok(true)
    }

    /// The pad layout and marking when a tail of `t` rows goes through the prefill graph
    /// padded to `N`: padding decided ([`crate::tail::TailDecision`]), `prefill_min_tail <= t
    /// < N`, and `N` free slots (the graph shifts every window by `N` before the host takes
    /// the pad rows back out).
    pub(crate) fn pad_tail_marking(&self, t: usize) -> Option<PadMarking> {
        let n = self.info.prefill_chunk;
        let min = self.tail.min_tail?;
        let fits = t >= min && t < n && self.context_left() >= n && !self.first_row_alone();
        self.tail.marking().filter(|_| fits)
    }

    /// Whether the next row goes alone through the decode graph because, under the decided
    /// marking, a graph would take it for a pad: the first row of an empty window sits at
    /// position 0 and sees only its own slot, exactly an `identity` + `self` pad. One decode
    /// run per prompt into an empty window, and only under that marking.
    fn first_row_alone(&self) -> bool {
        self.consumed == 0
            && self
                .tail
                .marking()
                .is_some_and(PadMarking::ambiguous_in_empty_window)
    }

    /// Runs `positions.len()` rows through the decode graph (1 row) or the prefill graph
    /// (`N` rows, or fewer padded to `N` where and as `pad` says: pad rows are zero, with the
    /// marking's rope and mask row, docs/package-contract.md §4.4).
    pub(crate) fn run_chunk(
        &mut self,
        rows: &[f32],
        positions: &[Pos3],
        pad: Option<PadMarking>,
    ) -> Result<(), EngineError> {
        let n = positions.len();
        let g_rows = self.graph_rows(rows.len(), n, pad.is_some())?;
        let marking = pad.filter(|_| g_rows > n);
        let inputs = self.inputs(rows, positions, g_rows, marking)?;
        let layout = marking.map(|m| m.layout);
        let off = self.run_graph(&inputs, g_rows, n, layout)?;
        if let Some(layout) = layout {
            let out = self.out_set();
            let next = &mut self.sets[out];
            let fix = Unpad {
                layout,
                pads: g_rows - n,
                chunk: g_rows,
                filled: self.consumed + g_rows,
            };
            unpad_windows(next, &self.state_shape, &fix)?;
        }
        self.advance(positions);
        if g_rows == 1 {
            self.logits_after_decode();
            Ok(())
        } else {
            self.logits_after_prefill(off, n)
        }
    }

    /// Rows the graph runs for `n` real rows of `values` floats: the real ones, plus pads up
    /// to `N` when the tail is padded.
    fn graph_rows(&self, values: usize, n: usize, pad: bool) -> Result<usize, EngineError> {
        let h = self.shape.hidden;
        if values != n * h {
            return Err(EngineError::Shape {
                what: "rows [n, hidden]",
                expected: n * h,
                found: values,
            });
        }
        let chunk = self.info.prefill_chunk;
        let padded = pad && chunk >= 2 && n >= 1 && n < chunk;
        if !(padded || n == 1 || (chunk >= 2 && n == chunk)) {
            return Err(EngineError::RowCount { rows: n, chunk });
        }
        let g_rows = if padded { chunk } else { n };
        let left = self.context_left();
        if g_rows > left {
            return Err(EngineError::ContextOverflow {
                needed: g_rows,
                left,
            });
        }
        Ok(g_rows)
    }

    /// The fixed inputs for `g_rows` graph rows; the `g_rows − n` pads go where and as
    /// `marking` says.
    fn inputs<'a>(
        &mut self,
        rows: &'a [f32],
        positions: &[Pos3],
        g_rows: usize,
        marking: Option<PadMarking>,
    ) -> Result<Inputs<'a>, EngineError> {
        let n = positions.len();
        let rope: Vec<qwen35::Pos3> = positions.iter().map(|&p| p.into()).collect();
        let (mut cos, mut sin) =
            qwen35::rope_tables(&rope, self.shape.rot, self.cfg.rope_theta, &self.axes);
        let cl = self.shape.context;
        let mut mask = if g_rows == 1 {
            self.write_decode_mask()?;
            Vec::new()
        } else {
            qwen35::window_mask(self.consumed, g_rows, cl, self.shape.mask_heads)
        };
        let Some(marking) = marking.filter(|_| g_rows > n) else {
            return Ok(Inputs {
                x: Cow::Borrowed(rows),
                cos,
                sin,
                mask,
            });
        };
        let pads = PadRows {
            rows,
            hidden: self.shape.hidden,
            rot: self.shape.rot,
            window: cl,
            g_rows,
        };
        let x = pad_inputs(marking, &pads, &mut cos, &mut sin, &mut mask);
        Ok(Inputs {
            x: Cow::Owned(x),
            cos,
            sin,
            mask,
        })
    }

    /// Runs the graph for `g_rows` from the current cache set into the other and returns the
    /// byte offset of the last real row's logits in its output (row `n − 1`, or the last row
    /// with pads in front).
    fn run_graph(
        &mut self,
        inputs: &Inputs,
        g_rows: usize,
        n: usize,
        layout: Option<PadLayout>,
    ) -> Result<usize, EngineError> {
        let len = self.row_bytes();
        let chunk = self.info.prefill_chunk;
        self.run_starts()?;
        let (cur_set, out_set) = (self.current, self.out_set());
        let io = if g_rows == 1 {
            &mut self.decode
        } else {
            self.prefill
                .as_mut()
                .ok_or(EngineError::RowCount { rows: n, chunk })?
        };
        let specs = io.graph.inputs()[..FIXED_IN].to_vec();
        for (i, data) in inputs.in_order().into_iter().enumerate() {
            // The decode mask is already in place (`write_decode_mask`).
            if i == MASK && g_rows == 1 {
                continue;
            }
            write_input(&mut io.fixed[i], &specs[i], data)?;
        }
        let (cur, next) = state::pair(&mut self.sets, cur_set, out_set);
        let mut ins: Vec<&DeviceBuffer> = io.fixed.iter().collect();
        ins.extend(cur.iter());
        let mut outs: Vec<&mut DeviceBuffer> = vec![&mut io.logits];
        outs.extend(next.iter_mut());
        let what = if g_rows == 1 {
            "decode run"
        } else {
            "prefill run"
        };
        let t0 = Instant::now();
        let ran = io.graph.run(&ins, &mut outs, &self.sched);
        self.graph_time += t0.elapsed();
        ran.map_err(|e| device(what, e))?;
        io.logits
            .invalidate()
            .map_err(|e| device("INVALIDATE", e))?;
        let out = &io.graph.outputs()[0];
        // All-row logits: the last real row's. A last-row output is that row already (pads
        // in front, or a graph that selects it).
        let last = if out.rows() >= g_rows {
            match layout {
                Some(PadLayout::First) => g_rows - 1,
                _ => n - 1,
            }
        } else {
            out.rows().saturating_sub(1)
        };
        let off = out.row_offset(last);
        if io.logits.as_bytes().len() < off + len {
            return Err(EngineError::Shape {
                what: "logits row inside the output buffer",
                expected: off + len,
                found: io.logits.size(),
            });
        }
        Ok(off)
    }

    /// The decode mask for `P = consumed`: when the buffer holds the mask for `P - 1`, only
    /// column `CL - P - 1` of each plane opens (docs/package-contract.md §3.3); otherwise the whole mask is
    /// written.
    fn write_decode_mask(&mut self) -> Result<(), EngineError> {
        let p = self.consumed;
        let cl = self.shape.context;
        let spec = &self.decode.graph.inputs()[MASK];
        if p >= 1 && p < cl && self.decode_mask_for == Some(p - 1) && spec.strides.len() == 2 {
            let col = cl - p - 1;
            let (s0, s1) = (spec.strides[0], spec.strides[1]);
            let buf = &mut self.decode.fixed[MASK];
            // Only the CPU writes the mask, so a whole CLEAN writes back just these columns.
            let whole = buf.flush_mode() == FlushMode::Whole;
            for h in 0..self.shape.mask_heads {
                let at = h * s0 + col * s1;
                let bytes = buf.as_mut_bytes();
                bytes[at..at + 4].copy_from_slice(&0f32.to_le_bytes());
                if !whole {
                    buf.clean_range(at, 4).map_err(|e| device("CLEAN", e))?;
                }
            }
            if whole {
                buf.clean().map_err(|e| device("CLEAN", e))?;
            }
        } else {
            let mask = qwen35::window_mask(p, 1, cl, self.shape.mask_heads);
            let spec = spec.clone();
            write_input(&mut self.decode.fixed[MASK], &spec, &mask)?;
        }
        self.decode_mask_for = Some(p);
        Ok(())
    }
}

/// One padded chunk, for the K/V fix-up after it.
struct Unpad {
    layout: PadLayout,
    /// Pad rows (`N − t`).
    pads: usize,
    /// Rows the graph ran (`N`).
    chunk: usize,
    /// `P` before the chunk + `N`: only the last `filled` window rows can be non-zero (the
    /// window is right-aligned and starts zeroed), so only they move and the cost follows
    /// the conversation, not the window size.
    filled: usize,
}

/// After a padded chunk the graph has shifted every window-indexed K/V cache by `N`, so its
/// pad rows sit among the real ones: at the window end with pads last (`[old | t new |
/// pads]`), between the old and the new rows with pads first (`[old | pads | t new]`). The
/// rows before the pads move right by their count and the front is zeroed (docs/package-contract.md §4.4):
/// `P` grows by the real rows only.
fn unpad_windows(
    set: &mut [DeviceBuffer],
    shape: &StateShape,
    u: &Unpad,
) -> Result<(), EngineError> {
    let cl = shape.context;
    let first = cl - u.filled.min(cl);
    // Window rows [first, end) move right by `pads`.
    let end = match u.layout {
        PadLayout::Last => cl - u.pads,
        PadLayout::First => cl - u.chunk,
    };
    for (buf, layout) in set.iter_mut().zip(&shape.caches) {
        let Some(row) = layout.window_row_bytes else {
            continue;
        };
        let (start, stop) = (first * row, cl * row);
        buf.invalidate_range(start, stop - start)
            .map_err(|e| device("INVALIDATE", e))?;
        let bytes = buf.as_mut_bytes();
        let shift = u.pads * row;
        if end > first {
            bytes.copy_within(start..end * row, start + shift);
        }
        bytes[start..start + shift].fill(0);
        buf.clean_range(start, stop - start)
            .map_err(|e| device("CLEAN", e))?;
    }
    Ok(())
}

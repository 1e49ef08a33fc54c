//! The vision tower: one graph, patchified pixels `[n_patch, row_len]` F32 in, merged image
//! embeddings `[n, hidden]` (F32, or S16 with a positive output scale) out. Its input shape
//! fixes the image geometry the preprocessor must produce.
//!
//! As tolerant as BLLM: the graph named `visual` in the tower file, else its only graph;
//! input and output of any rank ≥ 2, read by their last two dims (leading dims must be 1).

use std::path::Path;

use hbdnn::{DType, DeviceBuffer, Graph, PackedModel, Sched, TensorSpec};

use vlm::engine::{EngineError, VisionSpec};
use vlm::package::ModelConfig;
use vlm::vision::{Geometry, PixelValues};

use crate::error::device;
use crate::{contract, BpuError};

/// The vision tower graph and its buffers.
pub(crate) struct Tower {
    graph: Graph,
    input: DeviceBuffer,
    output: DeviceBuffer,
    pub(crate) spec: VisionSpec,
}

/// The tower graph of `m`: the one named `visual`, else the only one, else an error naming
/// the graphs found.
pub(crate) fn graph_name(m: &PackedModel) -> Result<String, String> {
    let names = m.graph_names();
    if names.iter().any(|n| n == "visual") {
        return Ok("visual".into());
    }
    match names {
        [one] => Ok(one.clone()),
        [] => Err("no graph in the file".into()),
        many => Err(format!(
            "no graph `visual` and {} others to choose from: {many:?}",
            many.len()
        )),
    }
}

/// `[rows, len]`: the last two dims of a tensor whose other dims are all 1.
fn last_two(s: &TensorSpec) -> Option<(usize, usize)> {
    let r = s.rank();
    (r >= 2 && s.shape[..r - 2].iter().all(|&d| d == 1)).then(|| (s.shape[r - 2], s.shape[r - 1]))
}

/// Checks the tower graph `g` against docs/package-contract.md (§6) and returns the image geometry its
/// input fixes.
pub(crate) fn check(cfg: &ModelConfig, g: &Graph, hidden: usize) -> Result<Geometry, String> {
    let name = g.name();
    let (i, o) = (g.inputs(), g.outputs());
    if i.len() != 1 || o.len() != 1 {
        return Err(format!(
            "tower `{name}` has {} inputs and {} outputs; the contract has one of each",
            i.len(),
            o.len()
        ));
    }
    let (Some((n_patch, row_len)), Some((_, out_len))) = (last_two(&i[0]), last_two(&o[0])) else {
        return Err(format!(
            "tower `{name}` input {:?} / output {:?}: each must be [n, len] with any leading \
             dims 1",
            i[0].shape, o[0].shape
        ));
    };
    if i[0].dtype != DType::F32 {
        return Err(format!(
            "tower `{name}` input 0 is {:?}; it must be F32 (pixel values are written as f32)",
            i[0].dtype
        ));
    }
    if out_len != hidden || !matches!(o[0].dtype, DType::F32 | DType::S16) {
        return Err(format!(
            "tower output {:?} {:?} is not [n, {hidden}] F32/S16",
            o[0].shape, o[0].dtype
        ));
    }
    if o[0].dtype == DType::S16 && !o[0].scale.first().is_some_and(|&s| s > 0.0) {
        return Err(format!(
            "tower `{name}` output 0 is S16 without a positive scale ({:?})",
            o[0].scale
        ));
    }
    contract::check_quantisation(g, &[0], &[0])?;
    let v = &cfg.vision;
    Geometry::from_tower_input(
        n_patch,
        row_len,
        v.patch as usize,
        v.merge as usize,
        v.temporal as usize,
    )
    .map_err(|e| format!("tower input {:?}: {e}", i[0].shape))
}

impl Tower {
    /// Finds and checks the tower graph of `m` (the tower file at `path`) and allocates its
    /// buffers.
    pub(crate) fn open(
        cfg: &ModelConfig,
        path: &Path,
        m: &PackedModel,
        hidden: usize,
    ) -> Result<Self, BpuError> {
        let contract = |reason: String| BpuError::Contract {
            path: path.to_owned(),
            reason,
        };
        let name = graph_name(m).map_err(contract)?;
        let hb = |source| BpuError::Hbdnn {
            path: path.to_owned(),
            source,
        };
        let graph = m.graph(&name).map_err(hb)?;
        let geometry = check(cfg, &graph, hidden).map_err(contract)?;
        tracing::info!(file = %path.display(), graph = %name, "vision tower graph");
        let input = graph.alloc_input(0).map_err(hb)?;
        let output = graph.alloc_output(0).map_err(hb)?;
        let v = &cfg.vision;
        Ok(Self {
            spec: VisionSpec {
                geometry,
                mean: v.mean,
                std: v.std,
            },
            graph,
            input,
            output,
        })
    }

    /// The image's embedding rows, dequantised when the tower's output is S16.
    pub(crate) fn encode(
        &mut self,
        pixels: &PixelValues,
        sched: &Sched,
    ) -> Result<Vec<f32>, EngineError> {
        let ispec = &self.graph.inputs()[0];
        if pixels.rows != ispec.rows() || pixels.row_len != ispec.last_dim() {
            return Err(EngineError::Shape {
                what: "tower input [n_patch, row_len]",
                expected: ispec.rows() * ispec.last_dim(),
                found: pixels.rows * pixels.row_len,
            });
        }
        self.input
            .write_tensor(ispec, &pixels.data)
            .map_err(|e| device("tower input write", e))?;
        self.input.clean().map_err(|e| device("CLEAN", e))?;
        self.graph
            .run(&[&self.input], &mut [&mut self.output], sched)
            .map_err(|e| device("vision tower run", e))?;
        self.output
            .invalidate()
            .map_err(|e| device("INVALIDATE", e))?;
        let ospec = &self.graph.outputs()[0];
        match ospec.dtype {
            DType::S16 => {
                let s = ospec.scale0();
                let q = self
                    .output
                    .read_tensor::<i16>(ospec)
                    .map_err(|e| device("tower output read", e))?;
                Ok(q.into_iter().map(|v| f32::from(v) * s).collect())
            }
            _ => self
                .output
                .read_tensor::<f32>(ospec)
                .map_err(|e| device("tower output read", e)),
        }
    }
}

//! The vision tower: one graph, patchified pixels `[n_patch, row_len]` in, merged image
//! embeddings `[n, hidden]` (F32, or S16 with an output scale) out. Its input shape fixes
//! the image geometry the preprocessor must produce.

use std::path::Path;

use hbdnn::{DType, DeviceBuffer, Graph, PackedModel, Sched};

use vlm::engine::{EngineError, VisionSpec};
use vlm::package::ModelConfig;
use vlm::vision::{Geometry, PixelValues};

use crate::error::device;
use crate::BpuError;

/// The vision tower graph and its buffers.
pub(crate) struct Tower {
    graph: Graph,
    input: DeviceBuffer,
    output: DeviceBuffer,
    pub(crate) spec: VisionSpec,
}

impl Tower {
    /// Checks the first graph of `m` (the tower file at `path`) and allocates its buffers.
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
        let name = m
            .graph_names()
            .first()
            .cloned()
            .ok_or_else(|| contract("no graph in the file".into()))?;
        let hb = |source| BpuError::Hbdnn {
            path: path.to_owned(),
            source,
        };
        let graph = m.graph(&name).map_err(hb)?;
        let (i, o) = (graph.inputs(), graph.outputs());
        if i.len() != 1 || o.len() != 1 || i[0].rank() != 2 || o[0].rank() != 2 {
            return Err(contract(format!(
                "tower `{name}` must have one 2-D input and one 2-D output"
            )));
        }
        if o[0].last_dim() != hidden || !matches!(o[0].dtype, DType::F32 | DType::S16) {
            return Err(contract(format!(
                "tower output {:?} {:?} is not [n, {hidden}] F32/S16",
                o[0].shape, o[0].dtype
            )));
        }
        let v = &cfg.vision;
        let geometry = Geometry::from_tower_input(
            i[0].shape[0],
            i[0].shape[1],
            v.patch as usize,
            v.merge as usize,
            v.temporal as usize,
        )
        .map_err(|e| contract(format!("tower input {:?}: {e}", i[0].shape)))?;
        let input = graph.alloc_input(0).map_err(hb)?;
        let output = graph.alloc_output(0).map_err(hb)?;
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
        if pixels.rows != ispec.shape[0] || pixels.row_len != ispec.shape[1] {
            return Err(EngineError::Shape {
                what: "tower input [n_patch, row_len]",
                expected: ispec.shape[0] * ispec.shape[1],
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

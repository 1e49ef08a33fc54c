//! Tensor element types and specs; strides the runtime reports as `-1` are resolved here.

use hbdnn_sys as sys;

use crate::{Error, Result, Side};

/// Row and plane strides are aligned to this many bytes when the graph reports `-1`.
pub const STRIDE_ALIGN: usize = 32;

/// Tensor element type (`hbDNNDataType`, S100 numbering).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    S4,
    U4,
    S8,
    U8,
    F16,
    S16,
    U16,
    F32,
    S32,
    U32,
    F64,
    S64,
    U64,
    Bool8,
    Other(i32),
}

impl DType {
    /// From the C value; unknown values are kept.
    pub fn from_raw(v: i32) -> Self {
        match v {
            sys::HB_DNN_TENSOR_TYPE_S4 => Self::S4,
            sys::HB_DNN_TENSOR_TYPE_U4 => Self::U4,
            sys::HB_DNN_TENSOR_TYPE_S8 => Self::S8,
            sys::HB_DNN_TENSOR_TYPE_U8 => Self::U8,
            sys::HB_DNN_TENSOR_TYPE_F16 => Self::F16,
            sys::HB_DNN_TENSOR_TYPE_S16 => Self::S16,
            sys::HB_DNN_TENSOR_TYPE_U16 => Self::U16,
            sys::HB_DNN_TENSOR_TYPE_F32 => Self::F32,
            sys::HB_DNN_TENSOR_TYPE_S32 => Self::S32,
            sys::HB_DNN_TENSOR_TYPE_U32 => Self::U32,
            sys::HB_DNN_TENSOR_TYPE_F64 => Self::F64,
            sys::HB_DNN_TENSOR_TYPE_S64 => Self::S64,
            sys::HB_DNN_TENSOR_TYPE_U64 => Self::U64,
            sys::HB_DNN_TENSOR_TYPE_BOOL8 => Self::Bool8,
            o => Self::Other(o),
        }
    }

    /// Bytes per element; `None` for sub-byte and unknown types.
    pub fn size(self) -> Option<usize> {
        match self {
            Self::S8 | Self::U8 | Self::Bool8 => Some(1),
            Self::F16 | Self::S16 | Self::U16 => Some(2),
            Self::F32 | Self::S32 | Self::U32 => Some(4),
            Self::F64 | Self::S64 | Self::U64 => Some(8),
            Self::S4 | Self::U4 | Self::Other(_) => None,
        }
    }
}

/// Rounds `v` up to a multiple of `a` (a power of two).
pub fn align_up(v: usize, a: usize) -> usize {
    v.div_ceil(a) * a
}

/// Resolves reported byte strides: `-1` on the last dim becomes the element size, on an outer
/// dim `align_up(stride[d+1] * dim[d+1], 32)`. Non-negative strides are kept as reported.
pub fn resolve_strides(
    shape: &[usize],
    reported: &[i64],
    elem: Option<usize>,
) -> Option<Vec<usize>> {
    let rank = shape.len();
    let mut out = vec![0usize; rank];
    for d in (0..rank).rev() {
        let r = *reported.get(d)?;
        out[d] = if r >= 0 {
            usize::try_from(r).ok()?
        } else if d + 1 == rank {
            elem?
        } else {
            align_up(out[d + 1].checked_mul(shape[d + 1])?, STRIDE_ALIGN)
        };
    }
    Some(out)
}

/// One graph input or output as reported by the runtime, strides resolved.
#[derive(Debug, Clone)]
pub struct TensorSpec {
    /// The tensor's name (`hbDNNGet{Input,Output}Name`), `None` when the library has no such
    /// entry point or reports none.
    pub name: Option<String>,
    /// `validShape` dimensions.
    pub shape: Vec<usize>,
    pub dtype: DType,
    /// Quantisation scale values (empty when `scaleLen` is 0).
    pub scale: Vec<f32>,
    /// Zero points (empty when `zeroPointLen` is 0).
    pub zero_point: Vec<i32>,
    /// `quantiType` as reported (`HB_DNN_QUANTI_TYPE_*`).
    pub quanti_type: i32,
    /// `quantizeAxis` as reported (meaningful with more than one scale).
    pub quantize_axis: i32,
    /// `alignedByteSize` as reported; graphs with dynamic strides report `-1`.
    pub reported_aligned_byte_size: i64,
    /// `alignedByteSize`, or `stride[0] × dim[0]` (resolved strides) when the graph reports
    /// none (≤ 0), as BLLM sizes its buffers.
    pub aligned_byte_size: usize,
    /// Strides as reported (`-1` = dense).
    pub reported_strides: Vec<i64>,
    /// Byte strides, `-1` resolved.
    pub strides: Vec<usize>,
    /// Bytes a buffer for this tensor must hold: `max(stride[0] × dim[0], alignedByteSize)`.
    pub byte_size: usize,
    /// The properties handed back to the runtime at inference, with resolved strides.
    pub(crate) raw: sys::hbDNNTensorProperties,
}

impl TensorSpec {
    pub(crate) fn from_properties(
        graph: &str,
        side: Side,
        index: usize,
        p: sys::hbDNNTensorProperties,
    ) -> Result<Self> {
        let bad = |reason: String| Error::Spec {
            graph: graph.to_owned(),
            side,
            index,
            reason,
        };
        let rank = usize::try_from(p.validShape.numDimensions)
            .ok()
            .filter(|r| (1..=p.validShape.dimensionSize.len()).contains(r))
            .ok_or_else(|| bad(format!("rank {}", p.validShape.numDimensions)))?;
        let shape = p.validShape.dimensionSize[..rank]
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| bad(format!("dimension {d}"))))
            .collect::<Result<Vec<_>>>()?;
        let dtype = DType::from_raw(p.tensorType);
        let reported_strides = p.stride[..rank].to_vec();
        let strides =
            resolve_strides(&shape, &reported_strides, dtype.size()).ok_or_else(|| {
                bad(format!(
                    "cannot resolve strides {reported_strides:?} for {dtype:?}"
                ))
            })?;
        let extent = strides[0]
            .checked_mul(shape[0])
            .ok_or_else(|| bad(format!("strides {strides:?} overflow for {shape:?}")))?;
        let aligned_byte_size = match usize::try_from(p.alignedByteSize) {
            Ok(n) if n > 0 => n,
            _ => {
                tracing::debug!(
                    graph,
                    %side,
                    index,
                    reported = p.alignedByteSize,
                    size = extent,
                    "no alignedByteSize reported: sized by stride[0] × dim[0]"
                );
                extent
            }
        };
        let byte_size = extent.max(aligned_byte_size);
        // SAFETY: the scale arrays are owned by the packed handle and hold `scaleLen` /
        // `zeroPointLen` entries; they are copied here.
        let scale = unsafe { copy_array(p.scale.scaleData, p.scale.scaleLen) };
        // SAFETY: as above.
        let zero_point = unsafe { copy_array(p.scale.zeroPointData, p.scale.zeroPointLen) };
        let mut raw = p;
        for (d, s) in strides.iter().enumerate() {
            raw.stride[d] = i64::try_from(*s).map_err(|_| bad(format!("stride {s}")))?;
        }
        Ok(Self {
            name: None,
            shape,
            dtype,
            scale,
            zero_point,
            quanti_type: p.quantiType,
            quantize_axis: p.quantizeAxis,
            reported_aligned_byte_size: p.alignedByteSize,
            aligned_byte_size,
            reported_strides,
            strides,
            byte_size,
            raw,
        })
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Last dimension.
    pub fn last_dim(&self) -> usize {
        self.shape.last().copied().unwrap_or(1)
    }

    /// Byte pitch between rows (`stride[rank-2]`), or the byte size for rank-1 tensors.
    pub fn row_stride(&self) -> usize {
        if self.rank() >= 2 {
            self.strides[self.rank() - 2]
        } else {
            self.byte_size
        }
    }

    /// Number of innermost rows (product of every dim but the last).
    pub fn rows(&self) -> usize {
        self.shape[..self.rank() - 1].iter().product()
    }

    /// Byte offset of row `r` (row-major over every dim but the last), honouring strides.
    pub fn row_offset(&self, mut r: usize) -> usize {
        let mut off = 0;
        for d in (0..self.rank() - 1).rev() {
            let dim = self.shape[d].max(1);
            off += (r % dim) * self.strides[d];
            r /= dim;
        }
        off
    }

    /// The first scale value, or 1.0 when the tensor carries none.
    pub fn scale0(&self) -> f32 {
        self.scale.first().copied().unwrap_or(1.0)
    }

    pub(crate) fn elem_check<T>(&self) -> Result<()> {
        let got = std::mem::size_of::<T>();
        match self.dtype.size() {
            Some(expected) if expected == got => Ok(()),
            expected => Err(Error::ElementSize {
                dtype: self.dtype,
                expected: expected.unwrap_or(0),
                got,
            }),
        }
    }
}

/// Copies a C array; empty for null or non-positive length.
///
/// # Safety
/// `p` is null or points to at least `len` valid elements.
unsafe fn copy_array<T: Copy>(p: *const T, len: i32) -> Vec<T> {
    match usize::try_from(len) {
        Ok(n) if n > 0 && !p.is_null() => {
            // SAFETY: guaranteed by the caller.
            unsafe { std::slice::from_raw_parts(p, n) }.to_vec()
        }
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stride_resolution_aligns_outer_dims_to_32() {
        // [2, 3, 5] f32: last 4 B, rows 5*4=20 → 32, planes 3*32=96.
        assert_eq!(
            resolve_strides(&[2, 3, 5], &[-1, -1, -1], Some(4)),
            Some(vec![96, 32, 4])
        );
        // Reported strides are kept; only -1 entries are filled.
        assert_eq!(
            resolve_strides(&[2, 3, 5], &[-1, 64, -1], Some(4)),
            Some(vec![192, 64, 4])
        );
        // Dense already aligned.
        assert_eq!(
            resolve_strides(&[1, 64], &[-1, -1], Some(4)),
            Some(vec![256, 4])
        );
        // Unknown element size cannot be resolved.
        assert_eq!(resolve_strides(&[4], &[-1], None), None);
        assert_eq!(align_up(33, 32), 64);
    }

    fn props(shape: &[i32], strides: &[i64], aligned: i64) -> sys::hbDNNTensorProperties {
        let mut p = sys::hbDNNTensorProperties::default();
        p.validShape.numDimensions = shape.len() as i32;
        p.validShape.dimensionSize[..shape.len()].copy_from_slice(shape);
        p.tensorType = sys::HB_DNN_TENSOR_TYPE_F32;
        p.stride[..strides.len()].copy_from_slice(strides);
        p.alignedByteSize = aligned;
        p
    }

    #[test]
    fn an_unreported_aligned_byte_size_falls_back_to_the_strides() {
        for aligned in [-1, 0] {
            let s = TensorSpec::from_properties(
                "g",
                Side::Input,
                0,
                props(&[3, 5], &[-1, -1], aligned),
            )
            .unwrap();
            assert_eq!(s.reported_aligned_byte_size, aligned);
            assert_eq!((s.aligned_byte_size, s.byte_size), (96, 96));
            assert_eq!(s.raw.stride[..2], [32, 4]);
        }
        let s = TensorSpec::from_properties("g", Side::Output, 1, props(&[3, 5], &[64, 4], 256))
            .unwrap();
        assert_eq!((s.aligned_byte_size, s.byte_size), (256, 256));
    }
}

//! What `hbDNNInferV2` checks of every tensor handed to it, as the board's `libdnn` does (its
//! log strings: "need tensor type", "validShape is not equal to model's", "stride must be
//! modified according to validShape!", "stride should be at least", "stride should be align
//! to", "virAddr should be {} aligned"):
//! - the tensor type and `validShape` equal the model's;
//! - every stride is resolved (no `-1`), at least the tight one (the element size on the last
//!   dim, `stride[d+1] × dim[d+1]` outside), a multiple of 32 on an outer dim the model leaves
//!   to the runtime (`-1`; the alignment of docs/package-contract.md §3.3), and equal to the
//!   model's where the model fixes it (the graph was compiled for that layout);
//! - `virAddr` aligned to [`crate::SimConfig::vir_align`] (no document gives libdnn's number:
//!   64 bytes, one cache line, by default);
//! - `memSize` holds the tensor: `stride[0] × dim[0]` of the given strides, and the model's
//!   `alignedByteSize` when it reports one (> 0).
//!
//! A violation is `HB_UCP_INVALID_ARGUMENT` (`HB_DNN_INVALID_ARGUMENT`, −100001) with a WARN
//! naming the side, the index and both values.

use hbdnn_sys as sys;

use crate::container::elem_size;

/// Outer strides the runtime resolves are aligned to this (docs/package-contract.md §3.3, `kAlign`).
pub const STRIDE_ALIGN: i64 = 32;

/// `"input"` or `"output"`.
pub(crate) type Side = &'static str;

fn dims(s: &sys::hbDNNTensorShape) -> &[i32] {
    let rank = usize::try_from(s.numDimensions)
        .unwrap_or(0)
        .min(s.dimensionSize.len());
    &s.dimensionSize[..rank]
}

/// Checks one tensor against the model's properties; returns the bytes its memory must hold,
/// or libdnn's complaint.
pub(crate) fn check_tensor(
    side: Side,
    index: usize,
    model: &sys::hbDNNTensorProperties,
    given: &sys::hbDNNTensor,
    vir_align: u64,
) -> Result<u64, String> {
    let g = &given.properties;
    if g.tensorType != model.tensorType {
        return Err(format!(
            "{side} {index} need tensor type {}, but given {}",
            model.tensorType, g.tensorType
        ));
    }
    let shape = dims(&model.validShape);
    if g.validShape.numDimensions != model.validShape.numDimensions || dims(&g.validShape) != shape
    {
        return Err(format!(
            "{side} {index} validShape is not equal to model's: given {:?}, model {shape:?}",
            dims(&g.validShape)
        ));
    }
    let rank = shape.len();
    let esz = elem_size(model.tensorType).map_or(1, |e| e as i64);
    for d in (0..rank).rev() {
        let s = g.stride[d];
        if s < 0 {
            return Err(format!(
                "{side} {index} stride must be modified according to validShape! \
                 stride[{d}] is {s}"
            ));
        }
        let m = model.stride[d];
        if m >= 0 && s != m {
            return Err(format!(
                "{side} {index} stride[{d}] should be {m} as the model's, but given {s}"
            ));
        }
        let tight = if d + 1 == rank {
            esz
        } else {
            g.stride[d + 1].saturating_mul(i64::from(shape[d + 1]))
        };
        if s < tight {
            return Err(format!(
                "{side} {index} stride should be at least {tight} for dim {d}, but given {s}"
            ));
        }
        if m < 0 && d + 1 < rank && s % STRIDE_ALIGN != 0 {
            return Err(format!(
                "{side} {index} stride should be align to {STRIDE_ALIGN} for dim {d}, \
                 but given {s}"
            ));
        }
    }
    let vir = given.sysMem.virAddr as u64;
    if vir_align > 1 && !vir.is_multiple_of(vir_align) {
        return Err(format!(
            "{side} {index} virAddr should be {vir_align} aligned, but given {vir:#x}"
        ));
    }
    let extent = match shape.first() {
        Some(&d0) => g.stride[0].saturating_mul(i64::from(d0)),
        None => 0,
    };
    Ok(extent.max(model.alignedByteSize).max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const F32: i32 = sys::HB_DNN_TENSOR_TYPE_F32;

    /// A `[3, 5]` f32 tensor whose model strides are `strides`.
    fn model(strides: [i64; 2], aligned: i64) -> sys::hbDNNTensorProperties {
        let mut p = sys::hbDNNTensorProperties::default();
        p.validShape.numDimensions = 2;
        p.validShape.dimensionSize[..2].copy_from_slice(&[3, 5]);
        p.tensorType = F32;
        p.stride[..2].copy_from_slice(&strides);
        p.alignedByteSize = aligned;
        p
    }

    fn given(m: &sys::hbDNNTensorProperties, strides: [i64; 2], vir: usize) -> sys::hbDNNTensor {
        let mut properties = *m;
        properties.stride[..2].copy_from_slice(&strides);
        sys::hbDNNTensor {
            sysMem: sys::hbUCPSysMem {
                phyAddr: 0,
                virAddr: vir as *mut std::ffi::c_void,
                memSize: 4096,
            },
            properties,
        }
    }

    fn err(m: &sys::hbDNNTensorProperties, t: &sys::hbDNNTensor) -> String {
        check_tensor("input", 2, m, t, 64).unwrap_err()
    }

    #[test]
    fn resolved_strides_pass_and_size_the_memory() {
        let dynamic = model([-1, -1], -1);
        assert_eq!(
            check_tensor("input", 0, &dynamic, &given(&dynamic, [32, 4], 4096), 64),
            Ok(96)
        );
        // A wider row pitch is the runtime's choice when the model leaves it open.
        assert_eq!(
            check_tensor("input", 0, &dynamic, &given(&dynamic, [64, 4], 4096), 64),
            Ok(192)
        );
        let fixed = model([64, 4], 192);
        assert_eq!(
            check_tensor("output", 0, &fixed, &given(&fixed, [64, 4], 0x1040), 64),
            Ok(192)
        );
    }

    #[test]
    fn each_violation_is_named_like_libdnn() {
        let dynamic = model([-1, -1], -1);
        let e = err(&dynamic, &given(&dynamic, [-1, 4], 4096));
        assert!(
            e.contains("stride must be modified according to validShape!"),
            "{e}"
        );
        let e = err(&dynamic, &given(&dynamic, [16, 4], 4096));
        assert!(
            e.contains("input 2 stride should be at least 20 for dim 0"),
            "{e}"
        );
        let e = err(&dynamic, &given(&dynamic, [40, 4], 4096));
        assert!(e.contains("stride should be align to 32"), "{e}");
        let e = err(&dynamic, &given(&dynamic, [32, 2], 4096));
        assert!(e.contains("stride should be at least 4 for dim 1"), "{e}");
        let fixed = model([64, 4], 192);
        let e = err(&fixed, &given(&fixed, [96, 4], 4096));
        assert!(e.contains("stride[0] should be 64 as the model's"), "{e}");
        let e = err(&dynamic, &given(&dynamic, [32, 4], 4096 + 32));
        assert!(
            e.contains("virAddr should be 64 aligned, but given 0x1020"),
            "{e}"
        );
        assert!(check_tensor("input", 0, &dynamic, &given(&dynamic, [32, 4], 4128), 32).is_ok());
        let mut t = given(&dynamic, [32, 4], 4096);
        t.properties.tensorType = sys::HB_DNN_TENSOR_TYPE_S16;
        assert!(err(&dynamic, &t).contains("need tensor type 7, but given 5"));
        let mut t = given(&dynamic, [32, 4], 4096);
        t.properties.validShape.dimensionSize[0] = 4;
        let e = err(&dynamic, &t);
        assert!(
            e.contains("validShape is not equal to model's: given [4, 5], model [3, 5]"),
            "{e}"
        );
        t.properties.validShape.dimensionSize[0] = 3;
        t.properties.validShape.numDimensions = 3;
        assert!(err(&dynamic, &t).contains("validShape"));
    }

    #[test]
    fn infer_v2_checks_tensors_on_live_buffers() {
        let sim = crate::Sim::new(crate::SimConfig::default());
        let mut st = sim.lock();
        let mem = st.alloc(256).unwrap();
        let dynamic = model([-1, -1], -1);
        let mut t = given(&dynamic, [32, 4], 0);
        t.sysMem = mem;
        assert_eq!(
            st.check_tensors("input", &[dynamic], &[t]),
            sys::HB_UCP_SUCCESS
        );
        // A tensor 32 bytes into the buffer: inside it, but not on a 64-byte boundary.
        let mut sub = t;
        sub.sysMem.phyAddr += 32;
        sub.sysMem.virAddr = (mem.virAddr as usize + 32) as *mut std::ffi::c_void;
        sub.sysMem.memSize -= 32;
        let code = st.check_tensors("input", &[dynamic], &[sub]);
        assert_eq!(code, sys::HB_UCP_INVALID_ARGUMENT);
        st.config.vir_align = 32;
        assert_eq!(
            st.check_tensors("input", &[dynamic], &[sub]),
            sys::HB_UCP_SUCCESS
        );
        // memSize below stride[0] × dim[0].
        let mut small = t;
        small.sysMem.memSize = 64;
        let code = st.check_tensors("input", &[dynamic], &[small]);
        assert_eq!(code, sys::HB_UCP_INVALID_ARGUMENT);
        // Memory that is no allocation.
        let mut stray = t;
        stray.sysMem.phyAddr = 0x10;
        assert_eq!(
            st.check_tensors("input", &[dynamic], &[stray]),
            sys::HB_UCP_MEM_IS_INVALID
        );
    }
}

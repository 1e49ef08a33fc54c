//! Opt-in (`--features board-check`, on a board): our declarations against the installed
//! vendor headers — sizes, offsets, constant values and entry-point signatures.
#![cfg(feature = "board-check")]
use hbdnn_sys as ours;
use hbdnn_sys::board as theirs;
use std::mem::{offset_of, size_of};

macro_rules! same_layout {
    ($t:ident { $($f:ident),* }) => {
        assert_eq!(size_of::<ours::$t>(), size_of::<theirs::$t>(), stringify!($t));
        $( assert_eq!(offset_of!(ours::$t, $f), offset_of!(theirs::$t, $f),
                      concat!(stringify!($t), ".", stringify!($f))); )*
    };
}

#[test]
fn struct_layouts_match_vendor_headers() {
    same_layout!(hbUCPSysMem {
        phyAddr,
        virAddr,
        memSize
    });
    same_layout!(hbDNNTensorShape {
        dimensionSize,
        numDimensions
    });
    same_layout!(hbDNNQuantiScale {
        scaleLen,
        scaleData,
        zeroPointLen,
        zeroPointData
    });
    same_layout!(hbDNNTensorProperties {
        validShape,
        tensorType,
        scale,
        quantiType,
        quantizeAxis,
        alignedByteSize,
        stride
    });
    same_layout!(hbDNNTensor { sysMem, properties });
    same_layout!(hbUCPSchedParam {
        priority,
        customId,
        backend,
        deviceId
    });
}

#[test]
fn constants_match_vendor_headers() {
    macro_rules! same {
        ($($c:ident),*) => { $( assert_eq!(ours::$c as i64, theirs::$c as i64, stringify!($c)); )* };
    }
    same!(
        HB_DNN_TENSOR_MAX_DIMENSIONS,
        HB_DNN_TENSOR_TYPE_S4,
        HB_DNN_TENSOR_TYPE_U4,
        HB_DNN_TENSOR_TYPE_S8,
        HB_DNN_TENSOR_TYPE_U8,
        HB_DNN_TENSOR_TYPE_F16,
        HB_DNN_TENSOR_TYPE_S16,
        HB_DNN_TENSOR_TYPE_U16,
        HB_DNN_TENSOR_TYPE_F32,
        HB_DNN_TENSOR_TYPE_S32,
        HB_DNN_TENSOR_TYPE_U32,
        HB_DNN_TENSOR_TYPE_F64,
        HB_DNN_TENSOR_TYPE_S64,
        HB_DNN_TENSOR_TYPE_U64,
        HB_DNN_TENSOR_TYPE_BOOL8,
        HB_DNN_TENSOR_TYPE_MAX,
        HB_SYS_MEM_CACHE_INVALIDATE,
        HB_SYS_MEM_CACHE_CLEAN,
        HB_UCP_PRIORITY_LOWEST,
        HB_UCP_PRIORITY_HIGHEST,
        HB_UCP_BPU_CORE_0,
        HB_UCP_BPU_CORE_1,
        HB_UCP_BPU_CORE_ANY
    );
    assert_eq!(
        theirs::HB_DNN_INVALID_ARGUMENT as i64,
        ours::HB_UCP_INVALID_ARGUMENT as i64
    );
    assert_eq!(
        theirs::HB_DNN_TIMEOUT as i64,
        ours::HB_UCP_TASK_TIMEOUT as i64
    );
    assert_eq!(
        theirs::HB_DNN_CAN_NOT_OPEN_FILE as i64,
        ours::HB_UCP_FILE_OPEN_FAILED as i64
    );
    assert_eq!(
        theirs::HB_DNN_INCOMPATIBLE_MODEL as i64,
        ours::HB_UCP_MODEL_INCOMPATIBLE as i64
    );
}

/// Each vendor prototype (bound over our struct types) must coerce to our table's field
/// type; a signature mismatch does not compile. Links libdnn + libhbucp (the build script adds them with this feature).
#[test]
fn signatures_match_vendor_headers() {
    let mut t = ours::hbdnn_sys_fn_table::default();
    macro_rules! sig {
        ($($f:ident),*) => { $( t.$f = Some(hbdnn_sys::board_fns::$f); assert!(t.$f.is_some()); )* };
    }
    sig!(
        hbDNNGetVersion,
        hbDNNInitializeFromFiles,
        hbDNNRelease,
        hbDNNGetModelNameList,
        hbDNNGetModelHandle,
        hbDNNGetInputCount,
        hbDNNGetOutputCount,
        hbDNNGetInputName,
        hbDNNGetOutputName,
        hbDNNGetInputTensorProperties,
        hbDNNGetOutputTensorProperties,
        hbDNNGetCompileBpuCoreNum,
        hbDNNInferV2,
        hbDNNGetErrorDesc,
        hbUCPGetVersion,
        hbUCPGetSocName,
        hbUCPSubmitTask,
        hbUCPWaitTaskDone,
        hbUCPReleaseTask,
        hbUCPMallocCached,
        hbUCPMemFlush,
        hbUCPFree,
        hbUCPGetErrorDesc
    );
}

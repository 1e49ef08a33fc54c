//! Names and descriptions of the hbUCP status codes (the only codes the simulator returns).

use std::ffi::CStr;

use hbdnn_sys as sys;

/// Name of a status code (for logs).
pub fn status_name(code: i32) -> &'static str {
    match code {
        sys::HB_UCP_SUCCESS => "HB_UCP_SUCCESS",
        sys::HB_UCP_INVALID_ARGUMENT => "HB_UCP_INVALID_ARGUMENT",
        sys::HB_UCP_API_USE_ERROR => "HB_UCP_API_USE_ERROR",
        sys::HB_UCP_INIT_FAILED => "HB_UCP_INIT_FAILED",
        sys::HB_UCP_UNKNOWN => "HB_UCP_UNKNOWN",
        sys::HB_UCP_TASK_NUMBER_EXCEED_LIMIT => "HB_UCP_TASK_NUMBER_EXCEED_LIMIT",
        sys::HB_UCP_TASK_TIMEOUT => "HB_UCP_TASK_TIMEOUT",
        sys::HB_UCP_TASK_RUN_FAILED => "HB_UCP_TASK_RUN_FAILED",
        sys::HB_UCP_TASK_HANDLE_INVALID => "HB_UCP_TASK_HANDLE_INVALID",
        sys::HB_UCP_MEM_ALLOC_FAIL => "HB_UCP_MEM_ALLOC_FAIL",
        sys::HB_UCP_MEM_FREE_FAIL => "HB_UCP_MEM_FREE_FAIL",
        sys::HB_UCP_MEM_FLUSH_FAIL => "HB_UCP_MEM_FLUSH_FAIL",
        sys::HB_UCP_MEM_INVALIDATE_FAIL => "HB_UCP_MEM_INVALIDATE_FAIL",
        sys::HB_UCP_MEM_IS_INVALID => "HB_UCP_MEM_IS_INVALID",
        sys::HB_UCP_MEM_MAP_FAIL => "HB_UCP_MEM_MAP_FAIL",
        sys::HB_UCP_MEM_UNMAP_FAIL => "HB_UCP_MEM_UNMAP_FAIL",
        sys::HB_UCP_FILE_OPEN_FAILED => "HB_UCP_FILE_OPEN_FAILED",
        sys::HB_UCP_MODEL_NUMBER_EXCEED => "HB_UCP_MODEL_NUMBER_EXCEED",
        sys::HB_UCP_MODEL_INVALID => "HB_UCP_MODEL_INVALID",
        sys::HB_UCP_MODEL_IS_INUSE => "HB_UCP_MODEL_IS_INUSE",
        sys::HB_UCP_MODEL_INCOMPATIBLE => "HB_UCP_MODEL_INCOMPATIBLE",
        _ => "unknown status",
    }
}

pub(crate) fn description(code: i32) -> &'static CStr {
    match code {
        sys::HB_UCP_SUCCESS => c"success",
        sys::HB_UCP_INVALID_ARGUMENT => c"invalid argument",
        sys::HB_UCP_API_USE_ERROR => c"API used out of order",
        sys::HB_UCP_INIT_FAILED => c"initialisation failed",
        sys::HB_UCP_UNKNOWN => c"unknown error",
        sys::HB_UCP_TASK_NUMBER_EXCEED_LIMIT => c"too many tasks",
        sys::HB_UCP_TASK_TIMEOUT => c"task timed out",
        sys::HB_UCP_TASK_RUN_FAILED => c"task run failed",
        sys::HB_UCP_TASK_HANDLE_INVALID => c"invalid task handle",
        sys::HB_UCP_MEM_ALLOC_FAIL => c"memory allocation failed (ION pool exhausted)",
        sys::HB_UCP_MEM_FREE_FAIL => c"memory free failed",
        sys::HB_UCP_MEM_FLUSH_FAIL => c"cache clean failed",
        sys::HB_UCP_MEM_INVALIDATE_FAIL => c"cache invalidate failed",
        sys::HB_UCP_MEM_IS_INVALID => c"invalid memory",
        sys::HB_UCP_MEM_MAP_FAIL => c"memory map failed",
        sys::HB_UCP_MEM_UNMAP_FAIL => c"memory unmap failed",
        sys::HB_UCP_FILE_OPEN_FAILED => c"cannot open file",
        sys::HB_UCP_MODEL_NUMBER_EXCEED => c"too many models",
        sys::HB_UCP_MODEL_INVALID => c"invalid model",
        sys::HB_UCP_MODEL_IS_INUSE => c"model in use",
        sys::HB_UCP_MODEL_INCOMPATIBLE => c"model incompatible with this platform",
        _ => c"unknown status code",
    }
}

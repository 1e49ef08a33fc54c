//! Typed copies of the constants declared in `msg/` (bpu_vlm_msgs).
//!
//! r2r 0.9 exposes IDL string constants as NUL-terminated byte arrays and integer constants
//! as bindgen enums, which are awkward to compare with message fields. These are the same
//! values as plain `&str`/`i8`; the root tests check them against the generated ones.

/// Values of `Token.finish_reason`, `Answer.finish_reason` and `Ask.Response.finish_reason`.
pub mod finish_reason {
    pub const STOP: &str = "stop";
    pub const LENGTH: &str = "length";
    pub const CANCELLED: &str = "cancelled";
    pub const TIMEOUT: &str = "timeout";
    pub const ERROR: &str = "error";
}

/// Values of `Ask.Response.error_code`.
pub mod error_code {
    pub const BUSY: &str = "busy";
    pub const NOT_READY: &str = "not_ready";
    pub const NO_IMAGE: &str = "no_image";
    pub const STALE_IMAGE: &str = "stale_image";
    pub const INVALID_REQUEST: &str = "invalid_request";
    pub const CONTEXT_OVERFLOW: &str = "context_overflow";
    pub const CANCELLED: &str = "cancelled";
    pub const TIMEOUT: &str = "timeout";
    pub const BACKEND_ERROR: &str = "backend_error";
}

/// Values of `Ask.Request.enable_thinking`.
pub mod enable_thinking {
    /// Use the node's `enable_thinking` parameter (the field's default).
    pub const DEFAULT: i8 = -1;
    pub const OFF: i8 = 0;
    pub const ON: i8 = 1;
}

/// An r2r string constant (`&[u8; N]` holding the text and a trailing NUL) as text, or
/// `None` when it is not NUL-terminated UTF-8.
pub fn idl_str(constant: &'static [u8]) -> Option<&'static str> {
    std::ffi::CStr::from_bytes_with_nul(constant)
        .ok()?
        .to_str()
        .ok()
}

//! Typed copies of the constants declared in `msg/` (bpu_vlm_msgs).
//!
//! r2r 0.9 exposes IDL string constants as NUL-terminated byte arrays and integer constants
//! as bindgen enums, which are awkward to compare with message fields. These are the same
//! values as Rust types; the root tests check them against the generated ones. Finish
//! reasons are the runtime's `vlm::stream::FinishReason`, whose `as_str` gives the values of
//! `Token.FINISH_*`.

use std::fmt;

/// Why a request did not complete: `Ask.Response.error_code`, one of its `ERROR_*` values.
/// The node passes this type around and turns it into text only when it fills a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorCode {
    Busy,
    NotReady,
    NoImage,
    StaleImage,
    InvalidRequest,
    ContextOverflow,
    Cancelled,
    Timeout,
    BackendError,
    /// A `json_schema` answer that generation ended before its value was complete.
    Incomplete,
}

impl ErrorCode {
    /// Every code, in the order `Ask.srv` declares them.
    pub const ALL: [Self; 10] = [
        Self::Busy,
        Self::NotReady,
        Self::NoImage,
        Self::StaleImage,
        Self::InvalidRequest,
        Self::ContextOverflow,
        Self::Cancelled,
        Self::Timeout,
        Self::BackendError,
        Self::Incomplete,
    ];

    /// The wire value (`Ask.Response.ERROR_*`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Busy => "busy",
            Self::NotReady => "not_ready",
            Self::NoImage => "no_image",
            Self::StaleImage => "stale_image",
            Self::InvalidRequest => "invalid_request",
            Self::ContextOverflow => "context_overflow",
            Self::Cancelled => "cancelled",
            Self::Timeout => "timeout",
            Self::BackendError => "backend_error",
            Self::Incomplete => "incomplete",
        }
    }
}

impl ErrorCode {
    /// The code of a wire value, `None` for one that is none of them.
    pub fn parse(value: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.as_str() == value)
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
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

//! Handling of `/ask` and `/vlm/cancel` requests.
//!
//! No engine is attached yet, so every question is refused with `not_ready` and no request
//! is ever queued or running; nothing here pretends to answer.

use crate::interface::error_code;
use crate::msgs::srv::{Ask, Cancel};

/// The message sent with `not_ready` while the node has no engine.
pub const NOT_READY_MESSAGE: &str =
    "no model is loaded: this build of vlm_node has no inference engine attached yet, \
     so it cannot answer questions";

/// Response to an Ask request while no model is loaded.
pub fn not_ready_response(request: &Ask::Request) -> Ask::Response {
    Ask::Response {
        success: false,
        error_code: error_code::NOT_READY.to_owned(),
        error_message: NOT_READY_MESSAGE.to_owned(),
        request_id: request.request_id.clone(),
        ..Default::default()
    }
}

/// Response to a Cancel request while no request can be queued or running.
pub fn cancel_unknown_response(request: &Cancel::Request) -> Cancel::Response {
    Cancel::Response {
        success: false,
        message: format!(
            "no queued or running request has id {:?} (no model is loaded, so none can)",
            request.request_id
        ),
    }
}

//! Why a request did not complete, as the client is told: an error code and a message.

use vlm::assistant::AssistantError;
use vlm::engine::EngineError;

use crate::interface::ErrorCode;

/// Why a request did not complete: the response's `error_code` and `error_message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub code: ErrorCode,
    pub message: String,
}

impl Failure {
    pub(crate) fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// An assistant error as the client sees it: its code says whether retrying the same
    /// request can help.
    pub(crate) fn from_assistant(e: &AssistantError) -> Self {
        Self::new(classify(e), e.to_string())
    }
}

fn classify(e: &AssistantError) -> ErrorCode {
    match e {
        AssistantError::Engine(EngineError::ContextOverflow { .. }) => ErrorCode::ContextOverflow,
        // A schema the request sent that cannot be used, or that conflicts with the turn.
        AssistantError::Turn(_)
        | AssistantError::Schema(_)
        | AssistantError::Engine(
            EngineError::NoVision | EngineError::Image { .. } | EngineError::Vision(_),
        ) => ErrorCode::InvalidRequest,
        // Only the request's own cancel interrupts a request's work.
        AssistantError::Interrupted { .. } => ErrorCode::Cancelled,
        _ => ErrorCode::BackendError,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schema_the_runtime_refuses_is_the_clients_mistake() {
        let e = AssistantError::Schema(vlm::structured::SchemaError::Conflict("tools"));
        assert_eq!(Failure::from_assistant(&e).code, ErrorCode::InvalidRequest);
    }
}

//! Structured output on the node side: a request's `json_schema` is compiled — or refused
//! with `invalid_request` naming the reason — while the request is planned, before it is
//! queued, so a client learns at once that its schema cannot be enforced instead of after
//! waiting its turn. A schema also decides what else the request may carry and which of the
//! node's defaults apply (`Ask.srv`, `json_schema`).

use std::sync::Arc;

use serde_json::Value;
use vlm::sampler::SamplingParams;
use vlm::structured::{JsonSchema, JsonSchemas, SchemaError};

use crate::interface::ErrorCode;
use crate::msgs::srv::Ask;
use crate::serve::failure::Failure;

/// How many schemas the node compiles at once, each on a blocking-pool thread: a few large
/// schemas cannot take every core from the answers, and the rest wait their turn (in
/// order) without a thread.
pub(crate) const COMPILES_AT_ONCE: usize = 2;

fn invalid(e: SchemaError) -> Failure {
    Failure::new(ErrorCode::InvalidRequest, format!("json_schema: {e}"))
}

/// The request's schema, compiled for the served model by its compiler (`schemas`, `None`
/// while no model is loaded); `None` for free text (an empty field). A schema of only
/// whitespace is refused like any other that is not one: nothing is silently ignored.
/// The compiler caches compiled schemas by text, but a large new one can take long to
/// compile: the node runs this off the async runtime (`plan::plan_async`).
pub(crate) fn compile(
    text: &str,
    schemas: Option<&JsonSchemas>,
) -> Result<Option<Arc<JsonSchema>>, Failure> {
    if text.is_empty() {
        return Ok(None);
    }
    let schemas = schemas.ok_or_else(|| {
        Failure::new(
            ErrorCode::NotReady,
            "json_schema: no model is loaded to compile the schema for",
        )
    })?;
    schemas.compile(text).map(Some).map_err(invalid)
}

/// What cannot go with a schema in one request: tools (Qwen3.5's tool calls are XML, not
/// JSON, so they cannot be constrained yet) and stop strings (they could cut the value).
/// `tools` is the parsed `tools_json` (an empty array is no tools).
pub(crate) fn check_conflicts(tools: &[Value], stop: &[String]) -> Result<(), Failure> {
    if !tools.is_empty() {
        return Err(invalid(SchemaError::Conflict("tools_json")));
    }
    if !stop.is_empty() {
        return Err(invalid(SchemaError::Conflict("stop strings")));
    }
    Ok(())
}

/// The sampling of a schema answer: the repetition, frequency and presence penalties are off
/// unless the request sets them. JSON repeats its punctuation (`"`, `,`, `:`), so the node's
/// default presence penalty (1.5) would push a model away from the very tokens the value
/// needs; a request that wants a penalty anyway still gets it.
pub(crate) fn sampling(mut s: SamplingParams, req: &Ask::Request) -> SamplingParams {
    // The sentinels of `Ask.srv`: -1 (repetition) and any negative (presence) = the node's.
    if req.repetition_penalty == -1.0 {
        s.repetition_penalty = 1.0;
    }
    if req.presence_penalty < 0.0 {
        s.presence_penalty = 0.0;
    }
    // No request field sets it: it stays off.
    s.frequency_penalty = 0.0;
    s
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use serde_json::json;

    use super::*;
    use crate::request::plan::sampling as request_sampling;
    use crate::ros::params::Params;

    fn params() -> Params {
        Params::from_values(&HashMap::new()).expect("defaults are valid")
    }

    #[test]
    fn penalties_are_off_unless_the_request_sets_them() {
        let p = params();
        assert_eq!(p.presence_penalty, 1.5, "the case this rule exists for");
        // The fields' sentinels: the node's penalties (1.0 and 1.5) if it were free text.
        let req = Ask::Request {
            repetition_penalty: -1.0,
            presence_penalty: -1.0,
            ..Default::default()
        };
        let s = sampling(request_sampling(&req, &p).expect("valid"), &req);
        assert_eq!(
            (
                s.repetition_penalty,
                s.presence_penalty,
                s.frequency_penalty
            ),
            (1.0, 0.0, 0.0)
        );
        let req = Ask::Request {
            repetition_penalty: 1.2,
            presence_penalty: 0.5,
            temperature: 0.3,
            ..Default::default()
        };
        let s = sampling(request_sampling(&req, &p).expect("valid"), &req);
        assert_eq!((s.repetition_penalty, s.presence_penalty), (1.2, 0.5));
        assert_eq!(s.temperature, 0.3, "other settings are the request's");
    }

    #[test]
    fn tools_and_stop_strings_conflict_with_a_schema() {
        let m = |r: Result<(), Failure>| {
            let f = r.expect_err("refused");
            assert_eq!(f.code, ErrorCode::InvalidRequest);
            f.message
        };
        assert!(m(check_conflicts(&[json!({"type": "function"})], &[])).contains("tools_json"));
        assert!(m(check_conflicts(&[], &["}".into()])).contains("stop strings"));
        assert!(check_conflicts(&[], &[]).is_ok());
    }

    #[test]
    fn an_empty_schema_is_free_text_and_a_schema_needs_a_model() {
        assert!(compile("", None).expect("free text").is_none());
        let f = compile(r#"{"type": "integer"}"#, None).expect_err("no compiler");
        assert_eq!(f.code, ErrorCode::NotReady);
    }
}

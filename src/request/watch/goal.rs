//! A watch goal checked once, when it is accepted: its question as an ask (every check an
//! ask meets but the queue's and the image's, which each evaluation meets), its camera, its
//! intervals, its `until` value and its time limit; and the ask each evaluation is.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

use crate::interface::{enable_thinking, ErrorCode};
use crate::msgs::action::Watch;
use crate::msgs::srv::Ask;
use crate::request::context::AskContext;
use crate::request::plan::{validate, NO_CAMERA};
use crate::ros::params::time_limit;
use crate::serve::failure::Failure;

/// The answer a goal without `json_schema` is held to.
pub(crate) const YES_NO_SCHEMA: &str = r#"{"enum": ["yes", "no"]}"#;

fn invalid(message: impl Into<String>) -> Failure {
    Failure::new(ErrorCode::InvalidRequest, message)
}

/// A checked goal.
pub(crate) struct WatchSpec {
    pub question: String,
    pub schema: String,
    /// The camera as the goal names it ("" = the default), for each evaluation's ask.
    pub camera: String,
    /// The camera's topic in the cache.
    pub topic: Arc<str>,
    pub min_interval: Duration,
    /// `None`: only a changed scene is evaluated again.
    pub max_interval: Option<Duration>,
    pub until: Option<Value>,
    /// `None`: until cancelled.
    pub timeout: Option<Duration>,
}

/// Seconds a goal field gives: finite and >= 0 (0 means "none" where the field says so).
fn seconds(v: f64, name: &str) -> Result<Duration, Failure> {
    if !v.is_finite() || v < 0.0 {
        return Err(invalid(format!(
            "{name} {v} must be a finite number of seconds >= 0"
        )));
    }
    Duration::try_from_secs_f64(v).map_err(|e| invalid(format!("{name} {v}: {e}")))
}

/// `Some` when `v` > 0: the field's 0 means "none".
fn optional_seconds(v: f64, name: &str) -> Result<Option<Duration>, Failure> {
    seconds(v, name)?;
    time_limit(v).map_err(|e| invalid(format!("{name} {v}: {e}")))
}

impl WatchSpec {
    /// Checks `goal` against the node's parameters and cameras.
    pub(crate) async fn check(goal: Watch::Goal, ctx: &AskContext) -> Result<Self, Failure> {
        let Some(cameras) = ctx.cameras.as_ref() else {
            return Err(invalid(
                "the node runs without vision: there is nothing to watch",
            ));
        };
        if goal.question.trim().is_empty() {
            return Err(invalid("the question is empty"));
        }
        if goal.camera == NO_CAMERA {
            return Err(invalid("camera \"none\" gives no frames to watch"));
        }
        let topic = if goal.camera.is_empty() {
            cameras.default_camera().and_then(|c| cameras.resolve(c))
        } else {
            cameras.resolve(&goal.camera)
        }
        .ok_or_else(|| {
            invalid(format!(
                "camera {:?} is not a configured camera",
                goal.camera
            ))
        })?;
        let min_interval = seconds(goal.min_interval_s, "min_interval_s")?;
        let max_interval = optional_seconds(goal.max_interval_s, "max_interval_s")?;
        let timeout = optional_seconds(goal.timeout_s, "timeout_s")?;
        let until = match goal.until.trim() {
            "" => None,
            text => Some(
                serde_json::from_str(text)
                    .map_err(|e| invalid(format!("until is not a JSON value: {e}")))?,
            ),
        };
        let schema = if goal.json_schema.trim().is_empty() {
            YES_NO_SCHEMA.to_owned()
        } else {
            goal.json_schema
        };
        let spec = Self {
            question: goal.question,
            schema,
            camera: goal.camera,
            topic,
            min_interval,
            max_interval,
            until,
            timeout,
        };
        validate(spec.ask(), ctx).await?;
        Ok(spec)
    }

    /// The ask one evaluation is: the question on the watched camera, greedy (the same frame
    /// gets the same answer, so an unchanged scene raises no event), under the schema.
    pub(crate) fn ask(&self) -> Ask::Request {
        Ask::Request {
            prompt: self.question.clone(),
            camera: self.camera.clone(),
            json_schema: self.schema.clone(),
            temperature: 0.0,
            enable_thinking: enable_thinking::OFF,
            ..Ask::Request::default()
        }
    }
}

/// Whether two answers are the same, as JSON values (key order and spacing aside); text
/// that is not JSON (no schema can give it, but a model's output is never trusted) is
/// compared as text.
pub(crate) fn same_answer(a: &str, b: &str) -> bool {
    match (
        serde_json::from_str::<Value>(a),
        serde_json::from_str::<Value>(b),
    ) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}

/// Whether `answer` equals the goal's `until` value.
pub(crate) fn reaches(answer: &str, until: Option<&Value>) -> bool {
    until.is_some_and(|u| serde_json::from_str::<Value>(answer).is_ok_and(|a| &a == u))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_compare_as_json_values() {
        assert!(same_answer("\"yes\"", " \"yes\" "));
        assert!(same_answer(r#"{"a":1,"b":2}"#, r#"{"b": 2, "a": 1}"#));
        assert!(!same_answer("\"yes\"", "\"no\""));
        assert!(same_answer("not json", "not json"));
        let until = serde_json::json!("yes");
        assert!(reaches("\"yes\"", Some(&until)));
        assert!(
            !reaches("yes", Some(&until)),
            "the text yes is not the JSON string"
        );
        assert!(!reaches("\"yes\"", None));
    }

    #[test]
    fn seconds_must_be_finite_and_not_negative() {
        assert!(seconds(f64::NAN, "x").is_err());
        assert!(seconds(-1.0, "x").is_err());
        assert!(seconds(f64::INFINITY, "x").is_err());
        assert_eq!(seconds(1.5, "x").unwrap(), Duration::from_millis(1500));
        assert_eq!(optional_seconds(0.0, "x").unwrap(), None);
        assert_eq!(
            optional_seconds(2.0, "x").unwrap(),
            Some(Duration::from_secs(2))
        );
    }
}

//! How a request ended, and the messages that say so. An admitted request ends in one
//! [`Outcome`]; its last Token's finish reason, its `Answer` and its `Ask` response are all
//! read from that value, so the three cannot disagree. A request refused before admission
//! gets its response from [`refused`]. Every `Ask::Response` the node sends is built in this
//! file, and error codes and finish reasons become strings only here. Every string is made
//! safe for r2r once, when the outcome is built ([`crate::ros::text`]).

use r2r::builtin_interfaces::msg::Time;
use r2r::std_msgs::msg::Header;
use serde_json::Value;
use vlm::stream::{Completion, FinishReason};

use crate::interface::ErrorCode;
use crate::msgs::msg::Answer;
use crate::msgs::srv::Ask;
use crate::ros::clock;
use crate::ros::text::{ros_text_uncounted, NulCount};
use crate::serve::failure::Failure;
use crate::serve::job::ImageOrigin;

/// The response to a request that was never admitted (no Token, no Answer). Its
/// `finish_reason` stays empty: generation never started, and its `session_turn` is 0: no
/// session was looked at.
pub(crate) fn refused(request_id: String, failure: Failure, nuls: &NulCount) -> Ask::Response {
    Ask::Response {
        success: false,
        error_code: failure.code.as_str().to_owned(),
        error_message: nuls.safe(failure.message),
        request_id: nuls.safe(request_id),
        ..Default::default()
    }
}

/// What generation gave: the completion, possibly partial, and for a `json_schema` answer
/// whether its value ended unfinished (`vlm::assistant::Reply::is_incomplete`).
#[derive(Debug, Clone)]
pub(crate) struct Generated {
    pub completion: Completion,
    pub incomplete: bool,
}

impl From<Completion> for Generated {
    /// A free-text completion: nothing to be incomplete.
    fn from(completion: Completion) -> Self {
        Self {
            completion,
            incomplete: false,
        }
    }
}

/// How an admitted request ended.
#[derive(Debug, Clone)]
pub(crate) struct Outcome {
    request_id: String,
    prompt: String,
    origin: ImageOrigin,
    /// What was generated, possibly partial; `None` when generation failed or never started.
    completion: Option<Completion>,
    /// The completion's texts and numbers as the messages carry them (empty without one).
    figures: Figures,
    /// `None` when the answer completed (finish reason stop or length).
    failure: Option<Failure>,
    /// The turn of its session (0 without one), as the Answer and the response report it.
    session_turn: u32,
    /// The Answer's one-way tag of the session id (empty without one).
    session_tag: String,
}

impl Outcome {
    /// `result` as the worker got it. A completion that ended by cancel or timeout, or a
    /// `json_schema` value that `max_new_tokens` cut, keeps its partial text but is a
    /// failure for the client: a successful structured answer always parses.
    pub(crate) fn new(
        request_id: String,
        prompt: String,
        origin: ImageOrigin,
        result: Result<Generated, Failure>,
        nuls: &NulCount,
    ) -> Self {
        let (completion, failure) = match result {
            Ok(Generated {
                completion: c,
                incomplete,
            }) => {
                let failure = match c.finish_reason {
                    FinishReason::Cancelled => Some(Failure::new(
                        ErrorCode::Cancelled,
                        "cancelled while generating",
                    )),
                    FinishReason::Timeout => Some(Failure::new(
                        ErrorCode::Timeout,
                        "the request's time limit elapsed while generating",
                    )),
                    _ if incomplete => Some(Failure::new(
                        ErrorCode::Incomplete,
                        format!(
                            "generation ended ({}) before the JSON value was complete; \
                             raise max_new_tokens or bound the schema's strings and arrays",
                            c.finish_reason.as_str()
                        ),
                    )),
                    _ => None,
                };
                (Some(c), failure)
            }
            Err(f) => (None, Some(f)),
        };
        let failure = failure.map(|f| Failure::new(f.code, nuls.safe(f.message)));
        let figures = completion
            .as_ref()
            .map_or_else(Figures::default, |c| Figures::of(c, nuls));
        Self {
            request_id: nuls.safe(request_id),
            prompt: nuls.safe(prompt),
            origin: ImageOrigin {
                source: nuls.safe(origin.source),
                stamp: origin.stamp,
                frame_id: nuls.safe(origin.frame_id),
                width: origin.width,
                height: origin.height,
                scene_checked: origin.scene_checked,
            },
            completion,
            figures,
            failure,
            session_turn: 0,
            session_tag: String::new(),
        }
    }

    /// The outcome of turn `n` of its session (0, the default: no session).
    pub(crate) fn with_session_turn(mut self, n: u32) -> Self {
        self.session_turn = n;
        self
    }

    /// The outcome of a request on session `tag` ([`crate::serve::sessions::Sessions::tag`]).
    pub(crate) fn with_session_tag(mut self, tag: String) -> Self {
        self.session_tag = tag;
        self
    }

    /// The header of the frame used (zero stamp and empty frame_id without an image).
    fn image_header(&self) -> Header {
        Header {
            stamp: clock::time(self.origin.stamp),
            frame_id: self.origin.frame_id.clone(),
        }
    }

    pub(crate) fn succeeded(&self) -> bool {
        self.failure.is_none()
    }

    pub(crate) fn failure(&self) -> Option<&Failure> {
        self.failure.as_ref()
    }

    pub(crate) fn completion(&self) -> Option<&Completion> {
        self.completion.as_ref()
    }

    /// The generation's own reason when there is one; otherwise the failure's (a job
    /// cancelled or timed out in the queue reports that, anything else `error`).
    pub(crate) fn finish_reason(&self) -> FinishReason {
        match (&self.completion, &self.failure) {
            (Some(c), _) => c.finish_reason,
            (None, Some(f)) if f.code == ErrorCode::Cancelled => FinishReason::Cancelled,
            (None, Some(f)) if f.code == ErrorCode::Timeout => FinishReason::Timeout,
            (None, _) => FinishReason::Error,
        }
    }

    /// The counts and texts the Answer and the response share (empty without a completion).
    pub(crate) fn figures(&self) -> &Figures {
        &self.figures
    }

    /// The message for `/vlm/answers`, stamped `stamp` (now).
    pub(crate) fn answer(&self, stamp: Time) -> Answer {
        let f = self.figures.clone();
        Answer {
            header: Header {
                stamp,
                frame_id: self.origin.frame_id.clone(),
            },
            request_id: self.request_id.clone(),
            success: self.succeeded(),
            error_code: self
                .failure
                .as_ref()
                .map_or_else(String::new, |x| x.code.as_str().to_owned()),
            session_tag: self.session_tag.clone(),
            prompt: self.prompt.clone(),
            answer: f.text,
            reasoning: f.reasoning,
            tool_calls_json: f.tool_calls_json,
            image_source: self.origin.source.clone(),
            image_header: self.image_header(),
            image_stamp: clock::time(self.origin.stamp),
            scene_checked_stamp: clock::time(self.origin.scene_checked),
            image_width: self.origin.width,
            image_height: self.origin.height,
            finish_reason: self.finish_reason().as_str().to_owned(),
            prompt_tokens: f.prompt_tokens,
            completion_tokens: f.completion_tokens,
            ttft_s: f.ttft_s,
            decode_tokens_per_s: f.decode_tokens_per_s,
            session_turn: self.session_turn,
        }
    }

    /// The `/ask` response (the Ask action's result is made from it: the same fields).
    pub(crate) fn response(&self) -> Ask::Response {
        let f = self.figures.clone();
        let (error_code, error_message) =
            self.failure.as_ref().map_or_else(Default::default, |x| {
                (x.code.as_str().to_owned(), x.message.clone())
            });
        Ask::Response {
            success: self.succeeded(),
            error_code,
            error_message,
            request_id: self.request_id.clone(),
            answer: f.text,
            reasoning: f.reasoning,
            tool_calls_json: f.tool_calls_json,
            finish_reason: self.finish_reason().as_str().to_owned(),
            image_source: self.origin.source.clone(),
            image_header: self.image_header(),
            image_stamp: clock::time(self.origin.stamp),
            scene_checked_stamp: clock::time(self.origin.scene_checked),
            image_width: self.origin.width,
            image_height: self.origin.height,
            prompt_tokens: f.prompt_tokens,
            completion_tokens: f.completion_tokens,
            ttft_s: f.ttft_s,
            decode_tokens_per_s: f.decode_tokens_per_s,
            session_turn: self.session_turn,
        }
    }
}

/// A completion's texts and numbers in the message fields' types.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Figures {
    pub text: String,
    pub reasoning: String,
    /// The tool calls as a JSON array; empty when there are none.
    pub tool_calls_json: String,
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    /// 0 when no token was sampled.
    pub ttft_s: f64,
    /// 0 when fewer than two tokens were sampled.
    pub decode_tokens_per_s: f64,
}

impl Figures {
    /// The texts made safe for the messages. The answer and the reasoning were counted as
    /// they streamed (the Token sink), so they are replaced without counting again; JSON
    /// escapes U+0000 itself.
    pub(crate) fn of(c: &Completion, nuls: &NulCount) -> Self {
        let calls: Vec<Value> = c.tool_calls.iter().map(|t| t.to_json()).collect();
        Self {
            text: ros_text_uncounted(c.text.as_str()),
            reasoning: ros_text_uncounted(c.reasoning.as_str()),
            tool_calls_json: if calls.is_empty() {
                String::new()
            } else {
                nuls.safe(Value::Array(calls).to_string())
            },
            prompt_tokens: saturate(c.timings.prompt_tokens),
            completion_tokens: saturate(c.timings.completion_tokens),
            ttft_s: c.timings.ttft.map_or(0.0, |d| d.as_secs_f64()),
            decode_tokens_per_s: c.timings.decode_tokens_per_s.unwrap_or(0.0),
        }
    }
}

fn saturate(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use camera_frame::Stamp;
    use vlm::stream::Timings;

    use super::*;
    use crate::serve::sessions::Sessions;

    fn completion(finish_reason: FinishReason) -> Completion {
        Completion {
            text: "an apple".into(),
            reasoning: "round, red".into(),
            tool_calls: Vec::new(),
            invalid_tool_calls: Vec::new(),
            finish_reason,
            tokens: vec![1, 2, 3],
            timings: Timings {
                prompt_tokens: 120,
                completion_tokens: 3,
                ttft: Some(Duration::from_millis(250)),
                decode_tokens_per_s: Some(12.5),
                total: Duration::from_millis(400),
            },
        }
    }

    fn outcome(result: Result<Completion, Failure>) -> Outcome {
        Outcome::new(
            "req-1".into(),
            "what is this?".into(),
            origin(),
            result.map(Generated::from),
            &NulCount::default(),
        )
    }

    fn origin() -> ImageOrigin {
        ImageOrigin {
            source: "/image_raw".into(),
            stamp: Stamp { sec: 7, nanosec: 9 },
            frame_id: "camera_optical".into(),
            width: 640,
            height: 480,
            scene_checked: Stamp { sec: 8, nanosec: 1 },
        }
    }

    /// Interface 1.0: the frame's whole header in the Answer and the response, the Answer's
    /// success and error code as the response's, and the session as a one-way tag only.
    #[test]
    fn answer_and_response_carry_the_frame_header_and_the_answer_its_status() {
        let ok = outcome(Ok(completion(FinishReason::Stop)))
            .with_session_tag(Sessions::tag(Some("kitchen")));
        let (a, r) = (ok.answer(Time::default()), ok.response());
        for h in [&a.image_header, &r.image_header] {
            assert_eq!(h.frame_id, "camera_optical");
            assert_eq!((h.stamp.sec, h.stamp.nanosec), (7, 9));
        }
        assert_eq!(r.image_header.stamp, r.image_stamp);
        assert!(a.success);
        assert_eq!(a.error_code, "");
        // SHA-256("kitchen") begins with these 16 hex digits; the id itself is nowhere.
        assert_eq!(a.session_tag, "3171d89ad00530ff");
        assert!(!format!("{a:?}").contains("kitchen"));
        let late = outcome(Err(Failure::new(ErrorCode::Timeout, "late")));
        let a = late.answer(Time::default());
        assert!(!a.success);
        assert_eq!(a.error_code, "timeout");
        assert_eq!(a.session_tag, "");
    }

    #[test]
    fn answer_and_response_carry_the_same_outcome() {
        let o = outcome(Ok(completion(FinishReason::Stop)));
        let (a, r) = (o.answer(Time::default()), o.response());
        assert!(r.success && o.succeeded());
        assert_eq!((r.error_code.as_str(), r.error_message.as_str()), ("", ""));
        assert_eq!(
            (a.answer.as_str(), r.answer.as_str()),
            ("an apple", "an apple")
        );
        assert_eq!(a.reasoning, r.reasoning);
        assert_eq!(a.tool_calls_json, "");
        assert_eq!(
            (a.finish_reason.as_str(), r.finish_reason.as_str()),
            ("stop", "stop")
        );
        assert_eq!((a.prompt_tokens, a.completion_tokens), (120, 3));
        assert_eq!((r.prompt_tokens, r.completion_tokens), (120, 3));
        assert_eq!((a.ttft_s, r.ttft_s), (0.25, 0.25));
        assert_eq!((a.decode_tokens_per_s, r.decode_tokens_per_s), (12.5, 12.5));
        assert_eq!(
            (a.image_source.as_str(), a.header.frame_id.as_str()),
            ("/image_raw", "camera_optical")
        );
        assert_eq!((r.image_stamp.sec, r.image_stamp.nanosec), (7, 9));
        assert_eq!((a.image_width, a.image_height), (640, 480));
        assert_eq!((r.image_width, r.image_height), (640, 480));
        assert_eq!(a.image_stamp, r.image_stamp);
        let checked = &r.scene_checked_stamp;
        assert_eq!((checked.sec, checked.nanosec), (8, 1));
        assert_eq!(a.scene_checked_stamp, r.scene_checked_stamp);
        assert_eq!(
            (a.request_id.as_str(), a.prompt.as_str()),
            ("req-1", "what is this?")
        );
    }

    #[test]
    fn a_stopped_generation_keeps_its_text_and_fails() {
        let o = outcome(Ok(completion(FinishReason::Cancelled)));
        let r = o.response();
        assert!(!r.success);
        assert_eq!(
            (r.error_code.as_str(), r.finish_reason.as_str()),
            ("cancelled", "cancelled")
        );
        assert_eq!(r.answer, "an apple");
        let o = outcome(Ok(completion(FinishReason::Timeout)));
        assert_eq!(o.failure().map(|f| f.code), Some(ErrorCode::Timeout));
        assert_eq!(o.answer(Time::default()).finish_reason, "timeout");
    }

    #[test]
    fn a_failure_without_text_names_its_finish_reason() {
        for (code, finish) in [
            (ErrorCode::Cancelled, FinishReason::Cancelled),
            (ErrorCode::Timeout, FinishReason::Timeout),
            (ErrorCode::ContextOverflow, FinishReason::Error),
            (ErrorCode::BackendError, FinishReason::Error),
        ] {
            let o = outcome(Err(Failure::new(code, "why")));
            assert_eq!(o.finish_reason(), finish);
            let (a, r) = (o.answer(Time::default()), o.response());
            assert_eq!(
                (r.error_code.as_str(), r.error_message.as_str()),
                (code.as_str(), "why")
            );
            assert_eq!(
                (a.finish_reason.as_str(), r.finish_reason.as_str()),
                (finish.as_str(), finish.as_str())
            );
            assert_eq!((a.answer.as_str(), a.prompt_tokens, r.ttft_s), ("", 0, 0.0));
        }
    }

    #[test]
    fn no_string_of_the_messages_holds_a_nul() {
        let mut c = completion(FinishReason::Stop);
        c.text = "a\0b".into();
        c.reasoning = "\0".into();
        let o = outcome(Ok(c));
        let (a, r) = (o.answer(Time::default()), o.response());
        assert_eq!(
            (a.answer.as_str(), r.answer.as_str()),
            ("a\u{FFFD}b", "a\u{FFFD}b")
        );
        assert_eq!(
            (a.reasoning.as_str(), r.reasoning.as_str()),
            ("\u{FFFD}", "\u{FFFD}")
        );
        let o = outcome(Err(Failure::new(ErrorCode::BackendError, "bad \0 byte")));
        assert_eq!(o.response().error_message, "bad \u{FFFD} byte");
        let r = refused(
            "id\0".into(),
            Failure::new(ErrorCode::Busy, "x\0"),
            &NulCount::default(),
        );
        assert_eq!(
            (r.request_id.as_str(), r.error_message.as_str()),
            ("id\u{FFFD}", "x\u{FFFD}")
        );
    }

    /// A `json_schema` value cut by `max_new_tokens` is a failure with its partial text; the
    /// same cut of free text, or a structured answer that completed, is a success.
    #[test]
    fn an_incomplete_value_fails_with_its_partial_text() {
        let cut = |incomplete, finish_reason| {
            Outcome::new(
                "req-3".into(),
                "count".into(),
                ImageOrigin::default(),
                Ok(Generated {
                    completion: completion(finish_reason),
                    incomplete,
                }),
                &NulCount::default(),
            )
        };
        let o = cut(true, FinishReason::Length);
        let (a, r) = (o.answer(Time::default()), o.response());
        assert!(!r.success);
        assert_eq!(
            (r.error_code.as_str(), r.finish_reason.as_str()),
            ("incomplete", "length")
        );
        assert!(
            r.error_message.contains("max_new_tokens"),
            "{}",
            r.error_message
        );
        assert_eq!(
            (a.answer.as_str(), r.answer.as_str()),
            ("an apple", "an apple")
        );
        assert_eq!(a.finish_reason, "length");
        assert_eq!((r.image_width, a.image_height), (0, 0));
        assert!(cut(false, FinishReason::Length).succeeded());
        assert!(cut(false, FinishReason::Stop).succeeded());
        // A cancel or timeout is reported as such even when the value is unfinished.
        assert_eq!(
            cut(true, FinishReason::Cancelled).failure().map(|f| f.code),
            Some(ErrorCode::Cancelled)
        );
    }

    /// The session's turn reaches the Answer and the response alike, on a failure too; an
    /// outcome without one, and a refusal, report 0.
    #[test]
    fn the_session_turn_is_reported_in_the_answer_and_the_response() {
        let o = outcome(Ok(completion(FinishReason::Stop))).with_session_turn(3);
        assert_eq!(
            (
                o.answer(Time::default()).session_turn,
                o.response().session_turn
            ),
            (3, 3)
        );
        let o = outcome(Err(Failure::new(ErrorCode::Timeout, "late"))).with_session_turn(2);
        assert_eq!(
            (
                o.answer(Time::default()).session_turn,
                o.response().session_turn
            ),
            (2, 2)
        );
        let o = outcome(Ok(completion(FinishReason::Stop)));
        assert_eq!(
            (
                o.answer(Time::default()).session_turn,
                o.response().session_turn
            ),
            (0, 0)
        );
        let r = refused(
            "req-4".into(),
            Failure::new(ErrorCode::Busy, "full"),
            &NulCount::default(),
        );
        assert_eq!(r.session_turn, 0);
    }

    #[test]
    fn a_refusal_has_no_finish_reason() {
        let r = refused(
            "req-2".into(),
            Failure::new(ErrorCode::Busy, "full"),
            &NulCount::default(),
        );
        assert!(!r.success);
        assert_eq!(
            (r.error_code.as_str(), r.error_message.as_str()),
            ("busy", "full")
        );
        assert_eq!(
            (r.request_id.as_str(), r.finish_reason.as_str()),
            ("req-2", "")
        );
    }
}

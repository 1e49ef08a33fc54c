//! The Ask action's messages in terms of the Ask service's: a Goal is an Ask request, a
//! Result is an Ask response (msg/action/Ask.action repeats Ask.srv's fields, and
//! tests/action_interface.rs keeps them equal), and Feedback is one Token. Each field is
//! moved, not copied: a goal's images go to the request as they are. Both sides are
//! destructured in full, so a field added to one message and not handled here does not
//! compile.

use r2r::unique_identifier_msgs::msg::UUID;
use r2r::Publisher;

use crate::msgs::action::Ask as AskAction;
use crate::msgs::msg::Token;
use crate::msgs::srv::Ask;

/// Moves every named field of `$from` (a `$src` value) into a new `$dst`.
macro_rules! move_fields {
    ($from:expr, $src:path => $dst:path { $($field:ident),* $(,)? }) => {{
        let $src { $($field),* } = $from;
        $dst { $($field),* }
    }};
}

/// The goal as the Ask request the service path plans, validates and queues.
pub fn request(goal: AskAction::Goal) -> Ask::Request {
    move_fields!(goal, AskAction::Goal => Ask::Request {
        request_id, prompt, camera, max_image_age_s, images, compressed_images, session_id,
        system_prompt, tools_json, temperature, top_p, min_p, top_k, repetition_penalty,
        presence_penalty, seed, enable_thinking, max_new_tokens, stop, use_default_stop,
        timeout_s, json_schema,
    })
}

/// The Ask response (built in [`crate::outcome`]) as the goal's result.
pub fn result(response: Ask::Response) -> AskAction::Result {
    move_fields!(response, Ask::Response => AskAction::Result {
        success, error_code, error_message, request_id, answer, reasoning, tool_calls_json,
        finish_reason, image_source, image_stamp, image_width, image_height, prompt_tokens,
        completion_tokens, ttft_s, decode_tokens_per_s,
    })
}

/// Where one goal's Tokens go as feedback (`<action>/_action/feedback`), beside the tokens
/// topic. Best effort, like the Token stream: a failed publish is logged, and the result
/// stays authoritative.
#[derive(Clone)]
pub struct GoalFeedback {
    publisher: Publisher<AskAction::FeedbackMessage>,
    goal_id: UUID,
}

impl GoalFeedback {
    pub fn new(publisher: Publisher<AskAction::FeedbackMessage>, goal_id: UUID) -> Self {
        Self { publisher, goal_id }
    }

    /// Sends `token` (the message just published on the tokens topic) as the goal's feedback.
    pub fn send(&self, token: &Token) {
        let msg = AskAction::FeedbackMessage {
            goal_id: self.goal_id.clone(),
            feedback: AskAction::Feedback {
                token: token.clone(),
            },
        };
        if let Err(e) = self.publisher.publish(&msg) {
            tracing::warn!(request_id = %token.request_id, error = %e, "could not publish action feedback");
        }
    }
}

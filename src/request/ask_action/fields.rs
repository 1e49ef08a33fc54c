//! The Ask action's messages in terms of the Ask service's: a Goal is an Ask request, a
//! Result is an Ask response (msg/action/Ask.action repeats Ask.srv's fields, and
//! tests/action_interface.rs keeps them equal), and Feedback is one Token
//! ([`crate::serve::token_sink::GoalFeedback`]). Each field is
//! moved, not copied: a goal's images go to the request as they are. Both sides are
//! destructured in full, so a field added to one message and not handled here does not
//! compile.

use crate::msgs::action::Ask as AskAction;
use crate::msgs::srv::Ask;

/// Moves every named field of `$from` (a `$src` value) into a new `$dst`.
macro_rules! move_fields {
    ($from:expr, $src:path => $dst:path { $($field:ident),* $(,)? }) => {{
        let $src { $($field),* } = $from;
        $dst { $($field),* }
    }};
}

/// The goal as the Ask request the service path plans, validates and queues.
pub(crate) fn request(goal: AskAction::Goal) -> Ask::Request {
    move_fields!(goal, AskAction::Goal => Ask::Request {
        request_id, prompt, camera, max_image_age_s, images, compressed_images, session_id,
        system_prompt, tools_json, temperature, top_p, min_p, top_k, repetition_penalty,
        presence_penalty, seed, enable_thinking, max_new_tokens, stop, use_default_stop,
        timeout_s, json_schema,
    })
}

/// The Ask response (built in [`crate::serve::outcome`]) as the goal's result.
pub(crate) fn result(response: Ask::Response) -> AskAction::Result {
    move_fields!(response, Ask::Response => AskAction::Result {
        success, error_code, error_message, request_id, answer, reasoning, tool_calls_json,
        finish_reason, image_source, image_header, image_stamp, scene_checked_stamp, image_width, image_height, prompt_tokens,
        completion_tokens, ttft_s, decode_tokens_per_s, session_turn,
    })
}

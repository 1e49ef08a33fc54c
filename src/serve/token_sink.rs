//! The Token stream of one request on `/vlm/tokens`: indices without gaps from 0, and
//! exactly one `last` Token, which carries the finish reason. Model text is made safe for
//! the message here ([`NulCount::safe`]: a NUL becomes U+FFFD and is counted).

use std::sync::Arc;

use r2r::std_msgs::msg::Header;
use r2r::unique_identifier_msgs::msg::UUID;
use r2r::Publisher;
use vlm::stream::FinishReason;

use crate::msgs::action::Ask as AskAction;
use crate::msgs::msg::Token;
use crate::ros::clock::RosClock;
use crate::ros::publish::Publish;
use crate::ros::text::{ros_text_uncounted, NulCount};
use crate::serve::detect_feedback::DetectFeedback;

pub(crate) struct TokenSink<'a> {
    publisher: &'a dyn Publish<Token>,
    clock: &'a RosClock,
    nuls: &'a NulCount,
    request_id: &'a str,
    /// The image source, as the Answer's header names it.
    frame_id: &'a str,
    index: u32,
    finished: bool,
    /// An action goal's feedback: each Token goes there too.
    feedback: Option<&'a GoalFeedback>,
}

impl<'a> TokenSink<'a> {
    pub(crate) fn new(
        publisher: &'a dyn Publish<Token>,
        clock: &'a RosClock,
        nuls: &'a NulCount,
        request_id: &'a str,
        frame_id: &'a str,
    ) -> Self {
        Self {
            publisher,
            clock,
            nuls,
            request_id,
            frame_id,
            index: 0,
            finished: false,
            feedback: None,
        }
    }

    /// Also sends every Token to an action goal's feedback.
    pub(crate) fn with_feedback(self, feedback: Option<&'a GoalFeedback>) -> Self {
        Self { feedback, ..self }
    }

    /// The goal's feedback the Tokens also go to, if any.
    pub(crate) fn feedback(&self) -> Option<&'a GoalFeedback> {
        self.feedback
    }

    /// Publishes one delta; an empty one is skipped (it would carry nothing), and so is one
    /// after the `last` Token.
    pub(crate) fn delta(&mut self, text: String, reasoning: bool) {
        if !text.is_empty() && !self.finished {
            self.publish(self.nuls.safe(text), reasoning, None);
        }
    }

    /// Publishes the `last` Token, once: a request that panicked after finishing its stream
    /// does not get a second one.
    pub(crate) fn finish(&mut self, reason: FinishReason) {
        if !self.finished {
            self.publish(String::new(), false, Some(reason));
            self.finished = true;
        }
    }

    fn publish(&mut self, text: String, reasoning: bool, last: Option<FinishReason>) {
        let msg = Token {
            header: Header {
                stamp: self.clock.now(),
                frame_id: ros_text_uncounted(self.frame_id),
            },
            request_id: ros_text_uncounted(self.request_id),
            index: self.index,
            text,
            reasoning,
            last: last.is_some(),
            finish_reason: last.map_or("", |r| r.as_str()).to_owned(),
        };
        if let Err(e) = self.publisher.publish(&msg) {
            tracing::warn!(request_id = %self.request_id, error = %e, "could not publish a Token");
        }
        if let Some(f) = self.feedback {
            f.send(&msg);
        }
        // After the call: a publish that panicked (contained by the worker) leaves no gap.
        self.index += 1;
    }
}

/// Where one goal's Tokens go as feedback (`<action>/_action/feedback`), beside the tokens
/// topic. Best effort, like the Token stream: a failed publish is logged, and the result
/// stays authoritative.
/// A `vlm/detect` goal's feedback is the detections so far instead ([`DetectFeedback`]).
#[derive(Clone)]
pub(crate) enum GoalFeedback {
    Ask {
        publisher: Publisher<AskAction::FeedbackMessage>,
        goal_id: UUID,
    },
    Detect(Arc<DetectFeedback>),
}

impl GoalFeedback {
    pub(crate) fn new(publisher: Publisher<AskAction::FeedbackMessage>, goal_id: UUID) -> Self {
        Self::Ask { publisher, goal_id }
    }

    /// Sends `token` (the message just published on the tokens topic) as the goal's feedback.
    pub(crate) fn send(&self, token: &Token) {
        let (publisher, goal_id) = match self {
            Self::Ask { publisher, goal_id } => (publisher, goal_id),
            Self::Detect(d) => return d.on_token(token),
        };
        let msg = AskAction::FeedbackMessage {
            goal_id: goal_id.clone(),
            feedback: AskAction::Feedback {
                token: token.clone(),
            },
        };
        if let Err(e) = publisher.publish(&msg) {
            tracing::warn!(request_id = %token.request_id, error = %e, "could not publish action feedback");
        }
    }
}

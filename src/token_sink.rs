//! The Token stream of one request on `/vlm/tokens`: indices without gaps from 0, and
//! exactly one `last` Token, which carries the finish reason.

use r2r::std_msgs::msg::Header;
use r2r::Publisher;
use vlm::stream::FinishReason;

use crate::clock;
use crate::msgs::msg::Token;

pub struct TokenSink<'a> {
    publisher: &'a Publisher<Token>,
    request_id: &'a str,
    /// The image source, as the Answer's header names it.
    frame_id: &'a str,
    index: u32,
}

impl<'a> TokenSink<'a> {
    pub fn new(publisher: &'a Publisher<Token>, request_id: &'a str, frame_id: &'a str) -> Self {
        Self {
            publisher,
            request_id,
            frame_id,
            index: 0,
        }
    }

    /// Publishes one delta; an empty one is skipped (it would carry nothing).
    pub fn delta(&mut self, text: String, reasoning: bool) {
        if !text.is_empty() {
            self.publish(text, reasoning, None);
        }
    }

    /// Publishes the `last` Token.
    pub fn finish(mut self, reason: FinishReason) {
        self.publish(String::new(), false, Some(reason));
    }

    fn publish(&mut self, text: String, reasoning: bool, last: Option<FinishReason>) {
        let msg = Token {
            header: Header {
                stamp: clock::now(),
                frame_id: self.frame_id.to_owned(),
            },
            request_id: self.request_id.to_owned(),
            index: self.index,
            text,
            reasoning,
            last: last.is_some(),
            finish_reason: last.map_or("", |r| r.as_str()).to_owned(),
        };
        self.index += 1;
        if let Err(e) = self.publisher.publish(&msg) {
            tracing::warn!(request_id = %self.request_id, error = %e, "could not publish a Token");
        }
    }
}

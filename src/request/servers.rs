//! The request servers the node runs once the model is loaded (`/ask`, `vlm/ask`, `/detect`,
//! `vlm/detect`, `vlm/watch`), and their end in the shutdown sequence.

use crate::request::ask_action::AskActionServer;
use crate::request::ask_server::AskServer;

/// The servers started so far.
#[derive(Default)]
pub(crate) struct Services {
    pub ask: Option<AskServer>,
    pub action: Option<AskActionServer>,
    pub detect: Option<AskServer>,
    pub detect_action: Option<AskActionServer>,
    pub watch_action: Option<AskActionServer>,
}

impl Services {
    /// Stops taking requests and completes once every request and goal taken has had its
    /// response or result sent. Call it after the worker has ended (every job answered or
    /// dropped), so no task is left waiting for an answer.
    pub(crate) async fn finish(self) {
        for server in [self.ask, self.detect].into_iter().flatten() {
            server.finish().await;
        }
        for server in [self.action, self.detect_action, self.watch_action]
            .into_iter()
            .flatten()
        {
            server.finish().await;
        }
    }
}

//! The Watch action (`vlm/watch`, `bpu_vlm_msgs/action/Watch`), served by the Ask action's
//! server ([`crate::request::ask_action`]): the same protocol, goal table, expiry and
//! cancel. A goal runs as [`crate::request::watch::run`]; its answer changes also go to
//! `vlm/events` (`bpu_vlm_msgs/msg/WatchEvent`, reliable).

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use r2r::builtin_interfaces::msg::Time;
use r2r::unique_identifier_msgs::msg::UUID;
use r2r::Publisher;

use crate::interface::ErrorCode;
use crate::msgs::action::Watch;
use crate::msgs::msg::WatchEvent;
use crate::process::panics::contained_async;
use crate::request::ask_action::kind::{ActionKind, GoalTask};
use crate::request::ask_action::{AskActionServer, Entities};
use crate::request::context::AskContext;
use crate::request::watch::{run, WatchOutputs};
use crate::ros::qos::answers_qos;
use crate::ros::spin::NodeOps;
use crate::ros::text::NulCount;
use crate::serve::failure::Failure;

/// The action's name (relative: under the node's namespace).
pub(crate) const ACTION: &str = "vlm/watch";
/// Where a watch's answer changes go.
pub(crate) const EVENTS_TOPIC: &str = "vlm/events";

/// `vlm/watch`: its goals publish on `vlm/events`.
pub(crate) struct WatchKind {
    events: Arc<Mutex<Publisher<WatchEvent>>>,
}

fn failed_result(failure: Failure, nuls: &NulCount) -> Watch::Result {
    Watch::Result {
        error_code: failure.code.as_str().to_owned(),
        error_message: nuls.safe(failure.message),
        ..Default::default()
    }
}

impl ActionKind for WatchKind {
    type SendGoal = Watch::SendGoal::Service;
    type GetResult = Watch::GetResult::Service;
    type Feedback = Watch::FeedbackMessage;
    type Goal = Watch::Goal;
    type Result = Watch::Result;
    type Response = Watch::Result;

    fn take_goal(req: &mut Watch::SendGoal::Request) -> (UUID, Watch::Goal) {
        let msg = std::mem::take(req);
        (msg.goal_id, msg.goal)
    }

    fn accepted(accepted: bool, stamp: Time) -> Watch::SendGoal::Response {
        Watch::SendGoal::Response { accepted, stamp }
    }

    fn result_uuid(req: &Watch::GetResult::Request) -> &[u8] {
        &req.goal_id.uuid
    }

    fn result_response(status: i8, result: Watch::Result) -> Watch::GetResult::Response {
        Watch::GetResult::Response { status, result }
    }

    fn run(
        &self,
        goal: Watch::Goal,
        ctx: Arc<AskContext>,
        cancel: Arc<AtomicBool>,
        feedback: Publisher<Watch::FeedbackMessage>,
        goal_id: UUID,
    ) -> GoalTask<Watch::Result> {
        let out = WatchOutputs {
            feedback: Mutex::new(feedback),
            goal_id,
            events: Arc::clone(&self.events),
        };
        Box::pin(async move {
            let nuls = ctx.nuls.clone();
            match contained_async(run(goal, ctx, cancel, out)).await {
                Ok(r) => r,
                Err(p) => failed_result(
                    Failure::new(ErrorCode::BackendError, format!("internal error: {p}")),
                    &nuls,
                ),
            }
        })
    }

    fn result(response: Watch::Result) -> Watch::Result {
        response
    }

    fn failed(failure: Failure, nuls: &NulCount) -> Watch::Result {
        failed_result(failure, nuls)
    }
}

/// Creates the `vlm/watch` action and `vlm/events` on the spin thread and starts serving
/// goals; `None` when the spin thread is gone.
pub(crate) async fn start(
    ops: &NodeOps,
    ctx: &Arc<AskContext>,
    result_timeout: Duration,
) -> Option<r2r::Result<AskActionServer>> {
    let created = ops
        .call_draining(move |n, d| -> r2r::Result<_> {
            let events = n.create_publisher::<WatchEvent>(EVENTS_TOPIC, answers_qos())?;
            let entities = Entities::<WatchKind>::create(n, d, ACTION)?;
            Ok((events, entities))
        })
        .await?;
    let ctx = ctx.clone();
    Some(created.map(|(events, entities)| {
        let kind = WatchKind {
            events: Arc::new(Mutex::new(events)),
        };
        AskActionServer::start_kind(kind, entities, ctx, result_timeout)
    }))
}

//! The Detect action (`vlm/detect`, `bpu_vlm_msgs/action/Detect`), served by the Ask
//! action's server ([`crate::request::ask_action`]): the same protocol, goal table, expiry
//! and cancel. A goal is a `/detect` request ([`crate::request::detect::handle`]); its
//! feedback is the detections found so far, sent each time the answer's next object closes
//! (`crate::serve::detect_feedback`). Goal = Detect.srv's request fields, Result = its
//! response fields (tests/action_interface.rs keeps them equal); both are moved field by
//! field and destructured in full, so a field added to one message and not here does not
//! compile.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use r2r::builtin_interfaces::msg::Time;
use r2r::unique_identifier_msgs::msg::UUID;
use r2r::{Publisher, QosProfile};
use vlm::grounding::Kind;

use crate::interface::ErrorCode;
use crate::msgs::action::Detect as DetectAction;
use crate::msgs::srv::Detect;
use crate::process::panics::contained_async;
use crate::request::ask::GoalHooks;
use crate::request::ask_action::kind::{ActionKind, GoalTask};
use crate::request::ask_action::{AskActionServer, Entities};
use crate::request::ask_server::AskServer;
use crate::request::context::AskContext;
use crate::request::detect::{
    answer, handle, DetectOutputs, ACTION, ANNOTATED_TOPIC, DETECTIONS_TOPIC, SERVICE,
};
use crate::ros::qos::{answers_qos, requests_qos};
use crate::ros::spin::NodeOps;
use crate::ros::text::NulCount;
use crate::serve::detect_feedback::DetectFeedback;
use crate::serve::failure::Failure;
use crate::serve::outcome::refused;
use crate::serve::token_sink::GoalFeedback;

/// `vlm/detect`: its goals publish on the topics `/detect` publishes on.
pub(crate) struct DetectKind {
    pub outputs: Arc<DetectOutputs>,
}

fn request(goal: DetectAction::Goal) -> Detect::Request {
    let DetectAction::Goal {
        request_id,
        query,
        camera,
        images,
        compressed_images,
        max_objects,
        points,
        max_image_age_s,
        timeout_s,
    } = goal;
    Detect::Request {
        request_id,
        query,
        camera,
        images,
        compressed_images,
        max_objects,
        points,
        max_image_age_s,
        timeout_s,
    }
}

fn result(response: Detect::Response) -> DetectAction::Result {
    let Detect::Response {
        success,
        error_code,
        error_message,
        request_id,
        detections,
        text,
        image_source,
        image_header,
        image_width,
        image_height,
        prompt_tokens,
        completion_tokens,
        ttft_s,
        decode_tokens_per_s,
    } = response;
    DetectAction::Result {
        success,
        error_code,
        error_message,
        request_id,
        detections,
        text,
        image_source,
        image_header,
        image_width,
        image_height,
        prompt_tokens,
        completion_tokens,
        ttft_s,
        decode_tokens_per_s,
    }
}

/// The Detect response of an Ask refusal (no detections, no image).
fn failed_response(failure: Failure, nuls: &NulCount) -> Detect::Response {
    let a = refused(String::new(), failure, nuls);
    Detect::Response {
        success: a.success,
        error_code: a.error_code,
        error_message: a.error_message,
        request_id: a.request_id,
        ..Default::default()
    }
}

impl ActionKind for DetectKind {
    type SendGoal = DetectAction::SendGoal::Service;
    type GetResult = DetectAction::GetResult::Service;
    type Feedback = DetectAction::FeedbackMessage;
    type Goal = DetectAction::Goal;
    type Result = DetectAction::Result;
    type Response = Detect::Response;

    fn take_goal(req: &mut DetectAction::SendGoal::Request) -> (UUID, DetectAction::Goal) {
        let msg = std::mem::take(req);
        (msg.goal_id, msg.goal)
    }

    fn accepted(accepted: bool, stamp: Time) -> DetectAction::SendGoal::Response {
        DetectAction::SendGoal::Response { accepted, stamp }
    }

    fn result_uuid(req: &DetectAction::GetResult::Request) -> &[u8] {
        &req.goal_id.uuid
    }

    fn result_response(
        status: i8,
        result: DetectAction::Result,
    ) -> DetectAction::GetResult::Response {
        DetectAction::GetResult::Response { status, result }
    }

    fn run(
        &self,
        goal: DetectAction::Goal,
        ctx: Arc<AskContext>,
        cancel: Arc<AtomicBool>,
        feedback: Publisher<DetectAction::FeedbackMessage>,
        goal_id: UUID,
    ) -> GoalTask<Detect::Response> {
        let kind = if goal.points {
            Kind::Points
        } else {
            Kind::Boxes
        };
        let hooks = GoalHooks {
            cancel: Some(cancel),
            watch: false,
            feedback: Some(GoalFeedback::Detect(Arc::new(DetectFeedback::new(
                feedback, goal_id, kind,
            )))),
        };
        let outputs = self.outputs.clone();
        Box::pin(async move {
            let nuls = ctx.nuls.clone();
            let id = goal.request_id.clone();
            match contained_async(handle(request(goal), ctx, outputs, hooks)).await {
                Ok(r) => r,
                Err(p) => {
                    let f = Failure::new(ErrorCode::BackendError, format!("internal error: {p}"));
                    Detect::Response {
                        request_id: id,
                        ..failed_response(f, &nuls)
                    }
                }
            }
        })
    }

    fn result(response: Detect::Response) -> DetectAction::Result {
        result(response)
    }

    fn failed(failure: Failure, nuls: &NulCount) -> Detect::Response {
        failed_response(failure, nuls)
    }
}

/// Creates `/detect`, the `vlm/detect` action and the topics on the spin thread and starts
/// serving them; `None` when the spin thread is gone.
pub(crate) async fn start(
    ops: &NodeOps,
    ctx: &Arc<AskContext>,
    result_timeout: Duration,
) -> Option<r2r::Result<(AskServer, AskActionServer)>> {
    let created = ops
        .call_draining(move |n, d| -> r2r::Result<_> {
            let service = n.create_service::<Detect::Service>(SERVICE, requests_qos())?;
            let outputs = DetectOutputs {
                detections: Mutex::new(n.create_publisher(DETECTIONS_TOPIC, answers_qos())?),
                // A frame is large: a late reader wants the newest, not a backlog.
                annotated: Mutex::new(
                    n.create_publisher(ANNOTATED_TOPIC, QosProfile::default().keep_last(2))?,
                ),
            };
            let entities = Entities::<DetectKind>::create(n, d, ACTION)?;
            Ok((d.relay(service), outputs, entities))
        })
        .await?;
    let ctx = ctx.clone();
    Some(created.map(|(service, outputs, entities)| {
        let outputs = Arc::new(outputs);
        let kind = DetectKind {
            outputs: outputs.clone(),
        };
        let action = AskActionServer::start_kind(kind, entities, ctx.clone(), result_timeout);
        let service =
            AskServer::start_with(service, move |r| answer(r, ctx.clone(), outputs.clone()));
        (service, action)
    }))
}

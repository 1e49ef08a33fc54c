//! What the action server needs to know of one action — its generated types, how a goal is
//! taken from `send_goal` and run on the service's path, how its response becomes the
//! result — so one server serves `vlm/ask` ([`AskKind`]) and `vlm/detect`
//! (`crate::request::detect_action`) alike.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use r2r::builtin_interfaces::msg::Time;
use r2r::unique_identifier_msgs::msg::UUID;
use r2r::{Publisher, WrappedServiceTypeSupport, WrappedTypesupport};

use super::fields;
use super::goals::GoalResult;
use crate::msgs::action::Ask as AskAction;
use crate::msgs::srv::Ask;
use crate::request::ask::GoalHooks;
use crate::request::ask_server::answer_contained;
use crate::request::context::AskContext;
use crate::ros::text::NulCount;
use crate::serve::failure::Failure;
use crate::serve::outcome::refused;
use crate::serve::token_sink::GoalFeedback;

/// One goal's run, to its response.
pub(crate) type GoalTask<R> = Pin<Box<dyn Future<Output = R> + Send>>;

type Req<S> = <S as WrappedServiceTypeSupport>::Request;
type Resp<S> = <S as WrappedServiceTypeSupport>::Response;

/// One action's types and the steps of a goal that differ between actions.
pub(crate) trait ActionKind: Send + Sync + 'static {
    type SendGoal: WrappedServiceTypeSupport + 'static;
    type GetResult: WrappedServiceTypeSupport + 'static;
    type Feedback: WrappedTypesupport + 'static;
    type Goal: Send + 'static;
    type Result: GoalResult + Send + 'static;
    /// What a goal's run answers (the service's response).
    type Response: Send + 'static;

    /// The goal's id and the goal, moved out of the request.
    fn take_goal(req: &mut Req<Self::SendGoal>) -> (UUID, Self::Goal);
    fn accepted(accepted: bool, stamp: Time) -> Resp<Self::SendGoal>;
    fn result_uuid(req: &Req<Self::GetResult>) -> &[u8];
    fn result_response(status: i8, result: Self::Result) -> Resp<Self::GetResult>;
    /// Runs the goal on the service's path, its cancel set by `cancel`, its feedback sent on
    /// `feedback` with `goal_id`.
    fn run(
        &self,
        goal: Self::Goal,
        ctx: Arc<AskContext>,
        cancel: Arc<AtomicBool>,
        feedback: Publisher<Self::Feedback>,
        goal_id: UUID,
    ) -> GoalTask<Self::Response>;
    fn result(response: Self::Response) -> Self::Result;
    /// The response of a goal whose task ended without one.
    fn failed(failure: Failure, nuls: &NulCount) -> Self::Response;
}

/// `vlm/ask`.
pub(crate) struct AskKind;

impl ActionKind for AskKind {
    type SendGoal = AskAction::SendGoal::Service;
    type GetResult = AskAction::GetResult::Service;
    type Feedback = AskAction::FeedbackMessage;
    type Goal = AskAction::Goal;
    type Result = AskAction::Result;
    type Response = Ask::Response;

    fn take_goal(req: &mut AskAction::SendGoal::Request) -> (UUID, AskAction::Goal) {
        let msg = std::mem::take(req);
        (msg.goal_id, msg.goal)
    }

    fn accepted(accepted: bool, stamp: Time) -> AskAction::SendGoal::Response {
        AskAction::SendGoal::Response { accepted, stamp }
    }

    fn result_uuid(req: &AskAction::GetResult::Request) -> &[u8] {
        &req.goal_id.uuid
    }

    fn result_response(status: i8, result: AskAction::Result) -> AskAction::GetResult::Response {
        AskAction::GetResult::Response { status, result }
    }

    fn run(
        &self,
        goal: AskAction::Goal,
        ctx: Arc<AskContext>,
        cancel: Arc<AtomicBool>,
        feedback: Publisher<AskAction::FeedbackMessage>,
        goal_id: UUID,
    ) -> GoalTask<Ask::Response> {
        let hooks = GoalHooks {
            cancel: Some(cancel),
            watch: false,
            feedback: Some(GoalFeedback::new(feedback, goal_id)),
        };
        Box::pin(answer_contained(fields::request(goal), ctx, hooks))
    }

    fn result(response: Ask::Response) -> AskAction::Result {
        fields::result(response)
    }

    fn failed(failure: Failure, nuls: &NulCount) -> Ask::Response {
        refused(String::new(), failure, nuls)
    }
}

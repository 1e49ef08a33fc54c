//! The Ask action (`vlm/ask`, `bpu_vlm_msgs/action/Ask`): the server side of the ROS 2
//! action protocol over plain r2r services and topics — `<name>/_action/send_goal`,
//! `cancel_goal`, `get_result`, `feedback` and `status` with the generated types. r2r 0.9.7's
//! own action server never expires a finished goal (`handle_goal_expired` never runs), so
//! every goal would stay in memory and in every status message for the node's lifetime; here
//! a finished goal is forgotten after the result timeout, as rcl_action does
//! (docs/ask-action.md has the figures).
//!
//! A goal is an Ask request on the service's path ([`crate::request::ask::handle_with`]): the same
//! validation, limits, queue and error codes. Every goal is accepted; one the service would
//! refuse (busy, invalid_request, not_ready…) is then aborted with the reason in the result's
//! `error_code`/`error_message` (an action rejection could carry no reason). Its Tokens go to
//! the tokens topic and, the same messages, to the goal's feedback. Cancelling the goal sets
//! the request's cancel flag: generation stops at the next token, and the goal ends CANCELED
//! with error_code `cancelled` and the partial answer.

pub(crate) mod fields;
pub(crate) mod goals;
pub(crate) mod kind;
pub(crate) mod pacing;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream::BoxStream;
use futures::StreamExt;
use r2r::action_msgs::msg::GoalStatusArray;
use r2r::action_msgs::srv::CancelGoal;
use r2r::{Publisher, QosProfile, ServiceRequest};
use tokio::sync::oneshot;
use tokio::task::{JoinHandle, JoinSet};

use crate::interface::ErrorCode;
use crate::request::context::AskContext;
use crate::ros::log_limit::WarnLimit;
use crate::ros::spin::Drains;
use crate::serve::failure::Failure;
use goals::{GoalId, GoalResult, Goals};
pub(crate) use kind::AskKind;
use kind::{ActionKind, GoalTask};
use pacing::StatusPacer;

/// At most one "action goal rejected" warning per this interval (as for rejected camera
/// frames): any peer can send malformed goals as fast as it likes.
const REJECTED_WARN_INTERVAL: Duration = Duration::from_secs(5);

type SendGoal<K> = ServiceRequest<<K as ActionKind>::SendGoal>;
type GetResult<K> = ServiceRequest<<K as ActionKind>::GetResult>;
type Cancel = ServiceRequest<CancelGoal::Service>;

/// The action's services and topics, created on the node.
pub(crate) struct Entities<K: ActionKind = AskKind> {
    send_goal: BoxStream<'static, SendGoal<K>>,
    cancel_goal: BoxStream<'static, Cancel>,
    get_result: BoxStream<'static, GetResult<K>>,
    feedback: Publisher<K::Feedback>,
    status: Publisher<GoalStatusArray>,
}

/// QoS of `_action/status`: reliable, transient local, the latest message only — rcl_action's
/// `rcl_action_qos_profile_status_default`, so a client that joins late sees every goal.
fn status_qos() -> QosProfile {
    QosProfile::default()
        .reliable()
        .transient_local()
        .keep_last(1)
}

impl<K: ActionKind> Entities<K> {
    /// Creates the action `name` (relative names resolve in the node's namespace); its
    /// services' requests are relayed through `drains` (`crate::ros::spin`).
    pub(crate) fn create(
        node: &mut r2r::Node,
        drains: &mut Drains,
        name: &str,
    ) -> r2r::Result<Self> {
        let sub = |s: &str| format!("{name}/_action/{s}");
        let qos = crate::ros::qos::requests_qos;
        Ok(Self {
            send_goal: drains
                .relay(node.create_service::<K::SendGoal>(&sub("send_goal"), qos())?)
                .boxed(),
            cancel_goal: drains
                .relay(node.create_service::<CancelGoal::Service>(&sub("cancel_goal"), qos())?)
                .boxed(),
            get_result: drains
                .relay(node.create_service::<K::GetResult>(&sub("get_result"), qos())?)
                .boxed(),
            // As deep as the tokens topic: a reliable writer with a short history would
            // overwrite deltas a client has not acknowledged yet.
            feedback: node.create_publisher(&sub("feedback"), crate::ros::qos::tokens_qos())?,
            status: node.create_publisher(&sub("status"), status_qos())?,
        })
    }
}

/// The running server.
pub(crate) struct AskActionServer {
    stop: oneshot::Sender<()>,
    handle: JoinHandle<usize>,
}

impl AskActionServer {
    /// Starts serving goals; a finished goal is forgotten `result_timeout` after its end.
    pub(crate) fn start(
        entities: Entities,
        ctx: Arc<AskContext>,
        result_timeout: Duration,
    ) -> Self {
        Self::start_kind(AskKind, entities, ctx, result_timeout)
    }

    /// [`AskActionServer::start`] for the action `kind` (`vlm/detect` is served this way).
    pub(crate) fn start_kind<K: ActionKind>(
        kind: K,
        entities: Entities<K>,
        ctx: Arc<AskContext>,
        result_timeout: Duration,
    ) -> Self {
        let (stop, stopped) = oneshot::channel();
        Self {
            stop,
            handle: tokio::spawn(serve(
                Arc::new(kind),
                entities,
                ctx,
                result_timeout,
                stopped,
            )),
        }
    }

    /// Stops taking goals and completes once every goal taken has ended (its result sent to
    /// the clients waiting for it). Call it after the worker has ended, as
    /// [`crate::request::ask_server::AskServer::finish`]. Returns how many were running at the stop.
    pub(crate) async fn finish(self) -> usize {
        let _ = self.stop.send(());
        self.handle.await.unwrap_or_else(|e| {
            tracing::error!(error = %e, "the action loop ended abnormally");
            0
        })
    }
}

/// One task owns the goal table; each goal runs as its own task on the service's path.
async fn serve<K: ActionKind>(
    kind: Arc<K>,
    mut e: Entities<K>,
    ctx: Arc<AskContext>,
    result_timeout: Duration,
    mut stopped: oneshot::Receiver<()>,
) -> usize {
    let mut goals = Goals::<GetResult<K>, K::Result>::new(result_timeout);
    let mut flags: HashMap<GoalId, Arc<AtomicBool>> = HashMap::new();
    // Which goal each task runs: a task that ends without a response (it cannot panic past
    // `answer_contained`, but a JoinError names only the task) still ends its goal.
    let mut tasks: HashMap<tokio::task::Id, GoalId> = HashMap::new();
    let mut running: JoinSet<K::Response> = JoinSet::new();
    let mut taking = true;
    let mut left = 0;
    let mut pacer = StatusPacer::default();
    let mut rejected = WarnLimit::new(REJECTED_WARN_INTERVAL);
    status_changed(&mut pacer, &e.status, &goals);
    loop {
        publish_if_due(&mut pacer, &e.status, &goals);
        let expiry = goals.next_expiry();
        let status_due = pacer.due();
        tokio::select! {
            biased;
            _ = &mut stopped, if taking => {
                taking = false;
                left = running.len();
                if left > 0 {
                    tracing::info!(left, "waiting for the action goals already taken");
                }
            }
            Some(done) = running.join_next_with_id(), if !running.is_empty() => {
                let (task, response) = match done {
                    Ok(done) => done,
                    Err(err) => {
                        tracing::error!(error = %err, "an action goal task ended without a result");
                        let failure =
                            Failure::new(ErrorCode::BackendError, format!("internal error: {err}"));
                        (err.id(), K::failed(failure, &ctx.nuls))
                    }
                };
                if let Some(id) = tasks.remove(&task) {
                    flags.remove(&id);
                    let result = K::result(response);
                    let (status, waiting) = goals.finish(&id, result.clone(), Instant::now());
                    status_changed(&mut pacer, &e.status, &goals);
                    for w in waiting {
                        respond_result::<K>(w, status, result.clone());
                    }
                }
            }
            Some(req) = e.send_goal.next(), if taking => {
                if let Some((id, flag, task)) = accept(&kind, req, &mut goals, &mut rejected, &e.feedback, &ctx) {
                    flags.insert(id, flag);
                    tasks.insert(running.spawn(task).id(), id);
                    status_changed(&mut pacer, &e.status, &goals);
                }
            }
            Some(req) = e.cancel_goal.next() => {
                let (response, canceling) = goals.cancel(&req.message.goal_info);
                for id in &canceling {
                    if let Some(f) = flags.get(id) {
                        f.store(true, Ordering::Release);
                    }
                }
                if !canceling.is_empty() {
                    tracing::info!(goals = canceling.len(), "action goals cancelled");
                    status_changed(&mut pacer, &e.status, &goals);
                }
                if let Err(error) = req.respond(response) {
                    tracing::warn!(%error, "could not send a cancel_goal response");
                }
            }
            Some(req) = e.get_result.next() => {
                let uuid = K::result_uuid(&req.message).to_vec();
                if let Some((req, status, result)) = goals.get_result(&uuid, req) {
                    respond_result::<K>(req, status, result);
                }
            }
            () = sleep_until(expiry), if expiry.is_some() => {
                if goals.expire(Instant::now()) {
                    status_changed(&mut pacer, &e.status, &goals);
                }
            }
            // Published at the top of the loop.
            () = sleep_until(status_due), if status_due.is_some() => {}
        }
        if !taking && running.is_empty() {
            break;
        }
    }
    // The last changes (the last goals' ends) go out before the server stops.
    if pacer.due().is_some() {
        publish_status(&e.status, &goals);
    }
    left
}

async fn sleep_until(at: Option<Instant>) {
    if let Some(at) = at {
        tokio::time::sleep_until(at.into()).await;
    }
}

/// Accepts a goal (a malformed or repeated goal id is the only rejection, warned about
/// through `rejected`) and returns the task that runs it, with its cancel flag.
fn accept<K: ActionKind>(
    kind: &Arc<K>,
    mut req: SendGoal<K>,
    goals: &mut Goals<GetResult<K>, K::Result>,
    rejected: &mut WarnLimit,
    feedback: &Publisher<K::Feedback>,
    ctx: &Arc<AskContext>,
) -> Option<(GoalId, Arc<AtomicBool>, GoalTask<K::Response>)> {
    let (goal_id, goal) = K::take_goal(&mut req.message);
    let stamp = ctx.clock.now();
    let accepted = goals.accept(&goal_id.uuid, stamp.clone());
    if let Err(error) = &accepted {
        if let Some(suppressed) = rejected.allow(Instant::now()) {
            tracing::warn!(%error, suppressed, "action goal rejected");
        }
    }
    if let Err(error) = req.respond(K::accepted(accepted.is_ok(), stamp)) {
        tracing::warn!(%error, "could not send a send_goal response");
    }
    let id = accepted.ok()?;
    let flag = Arc::new(AtomicBool::new(false));
    let task = kind.run(goal, ctx.clone(), flag.clone(), feedback.clone(), goal_id);
    Some((id, flag, task))
}

fn respond_result<K: ActionKind>(req: GetResult<K>, status: i8, result: K::Result) {
    if let Err(error) = req.respond(K::result_response(status, result)) {
        tracing::warn!(%error, "could not send a get_result response");
    }
}

/// Notes a change of the status array and sends it now when the pacer allows (else the
/// loop sends it when due), so in the usual case a goal's status still goes out before its
/// result.
fn status_changed<W, R: GoalResult>(
    pacer: &mut StatusPacer,
    publisher: &Publisher<GoalStatusArray>,
    goals: &Goals<W, R>,
) {
    pacer.changed(Instant::now());
    publish_if_due(pacer, publisher, goals);
}

fn publish_if_due<W, R: GoalResult>(
    pacer: &mut StatusPacer,
    publisher: &Publisher<GoalStatusArray>,
    goals: &Goals<W, R>,
) {
    let now = Instant::now();
    if pacer.is_due(now) {
        publish_status(publisher, goals);
        pacer.published(now);
    }
}

fn publish_status<W, R: GoalResult>(publisher: &Publisher<GoalStatusArray>, goals: &Goals<W, R>) {
    if let Err(error) = publisher.publish(&goals.status_array()) {
        tracing::warn!(%error, "could not publish the action status");
    }
}

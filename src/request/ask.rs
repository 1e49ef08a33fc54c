//! `/ask` and `/vlm/cancel`: a request is planned ([`crate::request::plan`]) — admitted to the
//! bounded queue as soon as its cheap checks pass, before its schema is compiled — and handed
//! to the worker thread. Nothing here blocks on inference: a refused request is answered at
//! once, an admitted one by the worker when it finishes.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use futures::{Stream, StreamExt};
use r2r::ServiceRequest;

use crate::interface::ErrorCode;
use crate::msgs::srv::{Ask, Cancel};
use crate::process::test_hooks::{self, Site};
use crate::request::context::AskContext;
use crate::request::plan::plan_admitted;
use crate::serve::failure::Failure;
use crate::serve::job::{Job, JobPlan};
use crate::serve::outcome::refused;
use crate::serve::registry::{client_id_error, AdmitError, Registry};
use crate::serve::token_sink::GoalFeedback;

/// What an Ask action goal adds to its request: the cancel flag the goal's cancel sets
/// (from the start, so a cancel that comes before admission is not lost) and where its
/// Tokens go as feedback. A service request has neither.
#[derive(Default)]
pub(crate) struct GoalHooks {
    pub cancel: Option<Arc<AtomicBool>>,
    pub feedback: Option<GoalFeedback>,
    /// A watch goal's evaluation (`crate::request::watch`): admitted beside the asks'
    /// `queue_depth` (the watch slots bound it), quiet, and stopped by any ask or detect
    /// queued after it rather than stopping one.
    pub watch: bool,
}

/// Handles one Ask request to its response; `hooks` are an action goal's (none for a
/// service request). The request's place in the queue is taken right after the cheap
/// checks, before its schema is compiled ([`plan_admitted`]).
pub(crate) async fn handle_with(
    req: Ask::Request,
    ctx: Arc<AskContext>,
    hooks: GoalHooks,
) -> Ask::Response {
    handle_planned(req, ctx, hooks, |_| {}).await
}

/// [`handle_with`], where `adjust` completes the planned job before it is queued: a detect
/// request (`crate::request::detect`) sets its answer's budget and its link to the worker
/// there, past the checks an ask's own `max_new_tokens` meets.
pub(crate) async fn handle_planned(
    req: Ask::Request,
    ctx: Arc<AskContext>,
    hooks: GoalHooks,
    adjust: impl FnOnce(&mut JobPlan),
) -> Ask::Response {
    let now = Instant::now();
    let given = !req.request_id.is_empty();
    let id = if !given {
        ctx.registry.fresh_id()
    } else {
        req.request_id.clone()
    };
    let GoalHooks {
        cancel,
        feedback,
        watch,
    } = hooks;
    let registry = if watch {
        &ctx.watches.registry
    } else {
        &ctx.registry
    };
    // Runs after the size checks, so an id named in a refusal is a short one.
    let admit = || {
        if let Some(why) = client_id_error(&id).filter(|_| given) {
            return Err(Failure::new(ErrorCode::InvalidRequest, why));
        }
        // Only an active node takes asks (docs/lifecycle.md).
        if let Some(why) = ctx.not_serving() {
            return Err(Failure::new(ErrorCode::NotReady, why));
        }
        match cancel {
            Some(flag) => registry.admit_with(&id, flag),
            None => registry.admit(&id),
        }
        .map_err(|e| {
            let code = match e {
                AdmitError::Busy { .. } => ErrorCode::Busy,
                AdmitError::DuplicateId(_) => ErrorCode::InvalidRequest,
            };
            Failure::new(code, e.to_string())
        })
    };
    let planned = plan_admitted(req, ctx.params.snapshot(), &ctx, now, admit).await;
    let (mut plan, admission) = match planned {
        Ok(p) => p,
        Err(f) => {
            log_refusal(&id, &f, watch);
            return refused(id, f, &ctx.nuls);
        }
    };
    plan.turn.cancel = Some(admission.cancel_flag());
    plan.quiet = watch;
    adjust(&mut plan);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let job = Job {
        id: id.clone(),
        plan,
        admission,
        respond: tx,
        feedback,
    };
    // A job that is not sent comes back in the error and is dropped with its admission here,
    // so its place is free before the refusal goes out.
    let sent = match ctx.jobs.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
        Some(s) => s.send(job).is_ok(),
        None => false,
    };
    if !sent {
        return refused(
            id,
            Failure::new(ErrorCode::NotReady, "the engine is shutting down"),
            &ctx.nuls,
        );
    }
    if !watch {
        // Asks and detects come first: an evaluation running now stops at its next graph
        // call, one queued before this job is answered without starting.
        ctx.watches.yield_to_request();
    }
    tracing::debug!(request_id = %id, "ask queued");
    match rx.await {
        Ok(r) => r,
        Err(_) => refused(
            id,
            Failure::new(
                ErrorCode::BackendError,
                "the engine stopped before answering",
            ),
            &ctx.nuls,
        ),
    }
}

/// A watch evaluation refused (a silent camera, a node stopping) is its goal's business:
/// not logged as an ask.
fn log_refusal(id: &str, f: &Failure, watch: bool) {
    if watch {
        tracing::debug!(
            code = f.code.as_str(),
            "watch evaluation refused: {}",
            f.message
        );
    } else {
        tracing::info!(request_id = %id, code = f.code.as_str(), "ask refused: {}", f.message);
    }
}

/// Answers `/vlm/cancel` from `registry` until the service's stream ends.
pub(crate) async fn serve_cancels(
    mut cancels: impl Stream<Item = ServiceRequest<Cancel::Service>> + Unpin,
    registry: Arc<Registry>,
) {
    while let Some(req) = cancels.next().await {
        test_hooks::point(Site::Cancel);
        let resp = cancel(&req.message, &registry);
        if let Err(e) = req.respond(resp) {
            tracing::warn!(error = %e, "could not send the cancel response");
        }
    }
}

/// Handles one Cancel request.
pub(crate) fn cancel(req: &Cancel::Request, registry: &Registry) -> Cancel::Response {
    if registry.cancel(&req.request_id) {
        tracing::info!(request_id = %req.request_id, "cancel requested");
        Cancel::Response {
            success: true,
            message: format!("request {:?} is being cancelled", req.request_id),
        }
    } else {
        Cancel::Response {
            success: false,
            message: format!("no queued or running request has id {:?}", req.request_id),
        }
    }
}

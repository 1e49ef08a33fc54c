//! `/ask`'s request loop: each request is answered in its own task (a long answer never holds
//! up the next request, which may be refused with `busy` at once), and every task is tracked,
//! so shutdown waits for each taken request's response to be sent instead of guessing how
//! long that takes.

use std::sync::Arc;

use futures::StreamExt;
use r2r::ServiceRequest;
use tokio::sync::oneshot;
use tokio::task::{JoinHandle, JoinSet};

use crate::interface::ErrorCode;
use crate::msgs::srv::Ask;
use crate::process::panics::contained_async;
use crate::request::ask::{self, GoalHooks};
use crate::request::context::AskContext;
use crate::serve::failure::Failure;
use crate::serve::outcome::refused;

/// The running loop.
pub(crate) struct AskServer {
    stop: oneshot::Sender<()>,
    handle: JoinHandle<usize>,
}

impl AskServer {
    /// Starts taking requests from `asks`.
    pub(crate) fn start(
        asks: impl futures::Stream<Item = ServiceRequest<Ask::Service>> + Unpin + Send + 'static,
        ctx: Arc<AskContext>,
    ) -> Self {
        Self::start_with(asks, move |r| answer(r, ctx.clone()))
    }

    /// Starts taking requests of any service from `requests`, each answered by its own
    /// `answer` task (`/detect`'s loop is this one).
    pub(crate) fn start_with<T, F, Fut>(
        requests: impl futures::Stream<Item = ServiceRequest<T>> + Unpin + Send + 'static,
        answer: F,
    ) -> Self
    where
        T: r2r::WrappedServiceTypeSupport + 'static,
        F: Fn(ServiceRequest<T>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let (stop, stopped) = oneshot::channel();
        Self {
            stop,
            handle: tokio::spawn(serve(requests, answer, stopped)),
        }
    }

    /// Stops taking requests and completes once every request taken has had its response
    /// sent. Call it after the worker has ended (every job answered or dropped), so no task
    /// is left waiting for an answer. Returns how many were still running at the stop.
    pub(crate) async fn finish(self) -> usize {
        // The loop may already have ended (the service stream closed): nothing to stop then.
        let _ = self.stop.send(());
        self.handle.await.unwrap_or_else(|e| {
            tracing::error!(error = %e, "the /ask loop ended abnormally");
            0
        })
    }
}

async fn serve<T, Fut>(
    mut asks: impl futures::Stream<Item = ServiceRequest<T>> + Unpin,
    answer: impl Fn(ServiceRequest<T>) -> Fut,
    mut stopped: oneshot::Receiver<()>,
) -> usize
where
    T: r2r::WrappedServiceTypeSupport,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let mut running = JoinSet::new();
    loop {
        tokio::select! {
            // The stop wins over a waiting request: after it, nothing new is taken.
            biased;
            _ = &mut stopped => break,
            Some(done) = running.join_next(), if !running.is_empty() => reap(done),
            next = asks.next() => match next {
                Some(request) => {
                    running.spawn(answer(request));
                }
                None => break,
            },
        }
    }
    let left = running.len();
    if left > 0 {
        tracing::info!(left, "waiting for the responses of requests already taken");
    }
    while let Some(done) = running.join_next().await {
        reap(done);
    }
    left
}

fn reap(done: Result<(), tokio::task::JoinError>) {
    if let Err(e) = done {
        tracing::error!(error = %e, "an /ask task ended without responding");
    }
}

async fn answer(mut request: ServiceRequest<Ask::Service>, ctx: Arc<AskContext>) {
    // Taken, not cloned: the request's images are its bulk, and they are copied once,
    // from the middleware's buffer into this message.
    let message = std::mem::take(&mut request.message);
    let response = answer_contained(message, ctx, GoalHooks::default()).await;
    if let Err(error) = request.respond(response) {
        tracing::warn!(%error, "could not send the /ask response");
    }
}

/// [`ask::handle_with`], where a request that trips a bug is refused with the reason and
/// the node goes on (the service's requests and the action's goals alike).
pub(crate) async fn answer_contained(
    message: Ask::Request,
    ctx: Arc<AskContext>,
    hooks: GoalHooks,
) -> Ask::Response {
    let id = message.request_id.clone();
    let nuls = ctx.nuls.clone();
    match contained_async(ask::handle_with(message, ctx, hooks)).await {
        Ok(response) => response,
        Err(p) => refused(
            id,
            Failure::new(ErrorCode::BackendError, format!("internal error: {p}")),
            &nuls,
        ),
    }
}

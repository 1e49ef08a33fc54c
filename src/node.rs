//! Entity creation, the spin thread and orderly shutdown.
//!
//! Order (r2r's rule: create every entity first, then hand the `Node` to one thread):
//! 1. node, publishers and services are created on the caller's thread;
//! 2. one `ros-spin` thread owns the `Node` and calls `spin_once` until told to stop;
//! 3. one tokio task per service drains its request stream and responds without blocking;
//! 4. on shutdown the spin thread stops and drops the node (services and DDS entities are
//!    finalised, so Fast DDS releases its shared-memory segments), the request streams end
//!    and the tasks finish.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use futures::{Stream, StreamExt};
use r2r::{Publisher, QosProfile, ServiceRequest};

use crate::ask;
use crate::msgs::msg::{Answer, Token};
use crate::msgs::srv::{Ask, Cancel};
use crate::names::{EntityNames, ANSWERS_HISTORY_DEPTH, NODE_NAME, TOKENS_HISTORY_DEPTH};

/// How long one `spin_once` may wait; bounds how fast the spin thread notices a stop. The
/// wait set wakes on any event, so this adds no latency to messages or requests.
const SPIN_PERIOD: Duration = Duration::from_millis(20);

/// Errors that stop the node from starting or shutting down cleanly.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("ROS 2 failed to {action}: {source}")]
    Ros {
        action: String,
        #[source]
        source: r2r::Error,
    },
    #[error("could not start the ROS spin thread: {0}")]
    SpinThread(#[source] std::io::Error),
    #[error("the ROS spin thread panicked")]
    SpinPanicked,
    #[error("the {service} handler task failed: {source}")]
    Task {
        service: &'static str,
        #[source]
        source: tokio::task::JoinError,
    },
}

fn ros<T>(action: impl FnOnce() -> String, result: r2r::Result<T>) -> Result<T, NodeError> {
    result.map_err(|source| NodeError::Ros {
        action: action(),
        source,
    })
}

/// Settings of one node instance.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub node_name: String,
    pub namespace: String,
    pub names: EntityNames,
}

impl Default for NodeConfig {
    fn default() -> Self {
        Self {
            node_name: NODE_NAME.to_owned(),
            namespace: String::new(),
            names: EntityNames::default(),
        }
    }
}

/// QoS of `/vlm/tokens`: reliable with a deep history, so no delta of an answer is lost.
pub fn tokens_qos() -> QosProfile {
    QosProfile::default()
        .reliable()
        .keep_last(TOKENS_HISTORY_DEPTH)
}

/// QoS of `/vlm/answers`.
pub fn answers_qos() -> QosProfile {
    QosProfile::default()
        .reliable()
        .keep_last(ANSWERS_HISTORY_DEPTH)
}

/// Where answers are published. Held by the request handlers; the engine streams into it.
pub struct Outputs {
    pub tokens: Publisher<Token>,
    pub answers: Publisher<Answer>,
}

/// The node with every entity created, not yet spinning.
pub struct VlmNode {
    node: r2r::Node,
    outputs: Outputs,
    asks: Box<dyn Stream<Item = ServiceRequest<Ask::Service>> + Send + Unpin>,
    cancels: Box<dyn Stream<Item = ServiceRequest<Cancel::Service>> + Send + Unpin>,
    names: EntityNames,
}

impl VlmNode {
    /// Creates the node and all of its publishers and services.
    pub fn create(ctx: r2r::Context, config: &NodeConfig) -> Result<Self, NodeError> {
        let mut node = ros(
            || format!("create node {:?}", config.node_name),
            r2r::Node::create(ctx, &config.node_name, &config.namespace),
        )?;
        let names = config.names.clone();
        let tokens = ros(
            || format!("create publisher {}", names.tokens),
            node.create_publisher::<Token>(&names.tokens, tokens_qos()),
        )?;
        let answers = ros(
            || format!("create publisher {}", names.answers),
            node.create_publisher::<Answer>(&names.answers, answers_qos()),
        )?;
        let asks = ros(
            || format!("create service {}", names.ask),
            node.create_service::<Ask::Service>(&names.ask, QosProfile::services_default()),
        )?;
        let cancels = ros(
            || format!("create service {}", names.cancel),
            node.create_service::<Cancel::Service>(&names.cancel, QosProfile::services_default()),
        )?;
        Ok(Self {
            node,
            outputs: Outputs { tokens, answers },
            asks: Box::new(asks),
            cancels: Box::new(cancels),
            names,
        })
    }

    /// Spins until `shutdown` completes, then stops in order (see the module doc).
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), NodeError> {
        let Self {
            node,
            outputs,
            asks,
            cancels,
            names,
        } = self;
        let logger = node.logger().to_owned();
        let spin = SpinThread::start(node)?;

        let ask_task = tokio::spawn(serve_ask(asks, logger.clone()));
        let cancel_task = tokio::spawn(serve_cancel(cancels));
        tracing::info!(
            ask = %names.ask,
            cancel = %names.cancel,
            tokens = %names.tokens,
            answers = %names.answers,
            "vlm_node is up; no inference engine is attached yet: /ask answers not_ready"
        );
        r2r::log_info!(
            &logger,
            "vlm_node is up (no inference engine attached yet: {} answers not_ready)",
            names.ask
        );

        shutdown.await;
        tracing::info!("shutting down: stopping the spin thread and finalising ROS entities");
        let spin_result = spin.stop();
        // The node is gone, so the request streams end and the tasks return.
        let ask_result = ask_task.await;
        let cancel_result = cancel_task.await;
        drop(outputs);
        spin_result?;
        ask_result.map_err(|source| NodeError::Task {
            service: "ask",
            source,
        })?;
        cancel_result.map_err(|source| NodeError::Task {
            service: "cancel",
            source,
        })?;
        tracing::info!("vlm_node stopped cleanly");
        Ok(())
    }
}

/// Answers every Ask request. A failed respond (the client went away) is logged, never fatal.
async fn serve_ask(
    mut asks: impl Stream<Item = ServiceRequest<Ask::Service>> + Unpin,
    logger: String,
) {
    while let Some(request) = asks.next().await {
        let response = ask::not_ready_response(&request.message);
        tracing::warn!(
            request_id = %request.message.request_id,
            "refusing /ask: {}",
            ask::NOT_READY_MESSAGE
        );
        r2r::log_warn!(&logger, "refusing /ask: {}", ask::NOT_READY_MESSAGE);
        if let Err(error) = request.respond(response) {
            tracing::warn!(%error, "could not send the /ask response");
        }
    }
}

/// Answers every Cancel request.
async fn serve_cancel(mut cancels: impl Stream<Item = ServiceRequest<Cancel::Service>> + Unpin) {
    while let Some(request) = cancels.next().await {
        let response = ask::cancel_unknown_response(&request.message);
        tracing::info!(request_id = %request.message.request_id, "cancel of an unknown request");
        if let Err(error) = request.respond(response) {
            tracing::warn!(%error, "could not send the /vlm/cancel response");
        }
    }
}

/// The one thread that owns and spins the `r2r::Node`.
pub struct SpinThread {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<()>,
}

impl SpinThread {
    /// Moves `node` into a new `ros-spin` thread.
    pub fn start(mut node: r2r::Node) -> Result<Self, NodeError> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let handle = std::thread::Builder::new()
            .name("ros-spin".to_owned())
            .spawn(move || {
                while !flag.load(Ordering::Acquire) {
                    node.spin_once(SPIN_PERIOD);
                }
                // Dropping the node here finalises its entities on the thread that used them.
                drop(node);
            })
            .map_err(NodeError::SpinThread)?;
        Ok(Self { stop, handle })
    }

    /// Stops spinning, drops the node and waits for the thread.
    pub fn stop(self) -> Result<(), NodeError> {
        self.stop.store(true, Ordering::Release);
        self.handle.join().map_err(|_| NodeError::SpinPanicked)
    }
}

//! The one thread that owns and spins the `r2r::Node`, and the handle other threads run node
//! operations through once it does.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How long one `spin_once` may wait; bounds how fast the spin thread notices a stop or a
/// queued node operation. The wait set wakes on any event, so messages are not delayed.
const SPIN_PERIOD: Duration = Duration::from_millis(10);

/// The spin thread could not start, or it panicked.
#[derive(Debug, thiserror::Error)]
pub enum SpinError {
    #[error("could not start the ros-spin thread: {0}")]
    Start(#[source] std::io::Error),
    #[error("the ros-spin thread panicked")]
    Panicked,
}

type NodeOp = Box<dyn FnOnce(&mut r2r::Node) + Send>;

/// Runs operations on the spin thread, which owns the node.
#[derive(Clone)]
pub struct NodeOps {
    tx: mpsc::Sender<NodeOp>,
}

impl NodeOps {
    /// Runs `f` on the spin thread and returns its result (`None`: the node is gone).
    pub async fn call<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut r2r::Node) -> R + Send + 'static,
    ) -> Option<R> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let op: NodeOp = Box::new(move |node| {
            let _ = tx.send(f(node));
        });
        self.tx.send(op).ok()?;
        rx.await.ok()
    }
}

/// The one thread that owns and spins the `r2r::Node`.
pub struct SpinThread {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<()>,
}

impl SpinThread {
    /// Moves `node` into a new `ros-spin` thread.
    pub fn start(mut node: r2r::Node) -> Result<(Self, NodeOps), SpinError> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let (tx, rx) = mpsc::channel::<NodeOp>();
        let handle = std::thread::Builder::new()
            .name("ros-spin".to_owned())
            .spawn(move || {
                while !flag.load(Ordering::Acquire) {
                    node.spin_once(SPIN_PERIOD);
                    while let Ok(op) = rx.try_recv() {
                        op(&mut node);
                    }
                }
                // Dropping the node here finalises its entities on the thread that used them.
                drop(node);
            })
            .map_err(SpinError::Start)?;
        Ok((Self { stop, handle }, NodeOps { tx }))
    }

    /// Stops spinning, drops the node and waits for the thread.
    pub fn stop(self) -> Result<(), SpinError> {
        self.stop.store(true, Ordering::Release);
        self.handle.join().map_err(|_| SpinError::Panicked)
    }
}

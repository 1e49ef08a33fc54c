//! The one thread that owns and spins the `r2r::Node`, and the handle other threads run node
//! operations through once it does.
//!
//! r2r 0.9.7 takes at most one request per ready service in a `spin_once` and `try_send`s it
//! into a channel of 10 places, dropping it (a log line, no response) when the channel is
//! full. A burst of requests would fill it faster than the async tasks that answer them
//! drain it, so the spin thread itself empties every request stream the node serves after
//! each `spin_once` ([`Drains`]): nothing waits in r2r's channel, and no request is dropped.
//! (The services also keep a deeper DDS history than ROS's default: `qos::requests_qos`.)

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use futures::channel::mpsc as relay;
use futures::{FutureExt, Stream, StreamExt};

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

type NodeOp = Box<dyn FnOnce(&mut r2r::Node, &mut Drains) + Send>;

/// One drain: takes what is ready now; false once it has nothing more to do.
type Drain = Box<dyn FnMut() -> bool + Send>;

/// What the spin thread empties after every `spin_once`: the node's request streams.
#[derive(Default)]
pub struct Drains {
    drains: Vec<Drain>,
}

impl Drains {
    /// Takes over `requests` (a service's stream): the spin thread moves every request
    /// that is ready into the stream returned, which has no bound — the requests wait
    /// there instead of in r2r's 10 places, and each is answered. Once the returned stream
    /// is dropped, `requests` is dropped too (r2r then removes the service at its next
    /// request, as when its stream is dropped).
    pub fn relay<T: Send + 'static>(
        &mut self,
        mut requests: impl Stream<Item = T> + Unpin + Send + 'static,
    ) -> relay::UnboundedReceiver<T> {
        let (tx, rx) = relay::unbounded();
        self.drains.push(Box::new(move || loop {
            if tx.is_closed() {
                return false;
            }
            match requests.next().now_or_never() {
                Some(Some(request)) => {
                    if tx.unbounded_send(request).is_err() {
                        return false;
                    }
                }
                Some(None) => return false,
                None => return true,
            }
        }));
        rx
    }

    /// Runs `serve` on the spin thread, one poll after each `spin_once`: for a future that
    /// answers requests as they come and never waits on anything else (r2r's parameter
    /// services), each poll answers every request that is ready.
    pub fn run(&mut self, serve: impl std::future::Future<Output = ()> + Send + 'static) {
        let mut serve = Box::pin(serve);
        self.drains
            .push(Box::new(move || (&mut serve).now_or_never().is_none()));
    }

    fn drain(&mut self) {
        self.drains.retain_mut(|d| d());
    }
}

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
        self.call_draining(move |node, _| f(node)).await
    }

    /// [`NodeOps::call`] that may also hand request streams to the spin thread's
    /// [`Drains`] (a service created after the start).
    pub async fn call_draining<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut r2r::Node, &mut Drains) -> R + Send + 'static,
    ) -> Option<R> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let op: NodeOp = Box::new(move |node, drains| {
            let _ = tx.send(f(node, drains));
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
    pub fn start(node: r2r::Node) -> Result<(Self, NodeOps), SpinError> {
        Self::start_draining(node, Drains::default())
    }

    /// [`SpinThread::start`] that empties `drains` (and any added later) after every
    /// `spin_once`.
    pub fn start_draining(
        mut node: r2r::Node,
        mut drains: Drains,
    ) -> Result<(Self, NodeOps), SpinError> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let (tx, rx) = mpsc::channel::<NodeOp>();
        let handle = std::thread::Builder::new()
            .name("ros-spin".to_owned())
            .spawn(move || {
                while !flag.load(Ordering::Acquire) {
                    node.spin_once(SPIN_PERIOD);
                    drains.drain();
                    while let Ok(op) = rx.try_recv() {
                        op(&mut node, &mut drains);
                    }
                }
                // Dropping the node here finalises its entities on the thread that used them.
                drop(drains);
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::task::Poll;

    use super::*;

    #[test]
    fn a_relay_takes_everything_ready_and_ends_with_its_receiver() {
        // r2r's stream is such a channel of 10 (+ 1 per sender) places.
        let (mut tx, rx) = relay::channel::<u32>(10);
        let mut drains = Drains::default();
        let mut out = drains.relay(rx);
        let mut got = Vec::new();
        for round in 0..4 {
            for i in 0..10 {
                tx.try_send(round * 10 + i).expect("the relay made room");
            }
            drains.drain();
        }
        while let Some(Some(v)) = out.next().now_or_never() {
            got.push(v);
        }
        assert_eq!(got, (0..40).collect::<Vec<_>>());
        assert_eq!(drains.drains.len(), 1);
        drop(out);
        drains.drain();
        assert!(drains.drains.is_empty(), "a relay without a receiver ends");
        assert!(tx.try_send(0).is_err(), "and drops the service's stream");
    }

    #[test]
    fn a_future_run_is_polled_once_per_drain_until_it_ends() {
        let polls = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&polls);
        let mut drains = Drains::default();
        drains.run(futures::future::poll_fn(move |_| {
            if counted.fetch_add(1, Ordering::Relaxed) < 2 {
                Poll::Pending
            } else {
                Poll::Ready(())
            }
        }));
        drains.drain();
        drains.drain();
        assert_eq!(drains.drains.len(), 1);
        drains.drain();
        assert!(drains.drains.is_empty());
        assert_eq!(polls.load(Ordering::Relaxed), 3);
    }
}

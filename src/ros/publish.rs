//! Where the node's messages go, behind a trait: the worker's outcome path and the Token sink
//! publish through [`Publish`], so they run in-process (unit tests record what would go out)
//! as they run against DDS.

use r2r::WrappedTypesupport;

/// Sends one message; `r2r::Publisher` is the real one.
pub(crate) trait Publish<M>: Send {
    fn publish(&self, msg: &M) -> r2r::Result<()>;
}

impl<M: WrappedTypesupport + 'static> Publish<M> for r2r::Publisher<M> {
    fn publish(&self, msg: &M) -> r2r::Result<()> {
        r2r::Publisher::publish(self, msg)
    }
}

/// A publisher that keeps what it is given, for tests.
#[cfg(test)]
#[derive(Default)]
pub(crate) struct Recorded<M>(pub(crate) std::sync::Mutex<Vec<M>>);

#[cfg(test)]
impl<M: Clone + Send> Publish<M> for Recorded<M> {
    fn publish(&self, msg: &M) -> r2r::Result<()> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(msg.clone());
        Ok(())
    }
}

#[cfg(test)]
impl<M: Clone> Recorded<M> {
    pub(crate) fn taken(&self) -> Vec<M> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

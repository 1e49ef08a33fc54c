//! Live requests (queued or running): bounded by `queue_depth`, unique ids, cancel flags.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Why a request could not be admitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmitError {
    #[error("the queue is full ({depth} requests queued or running); retry later")]
    Busy { depth: usize },
    #[error("request id {0:?} is already queued or running")]
    DuplicateId(String),
}

/// The set of live requests.
pub struct Registry {
    depth: usize,
    live: Mutex<HashMap<String, Arc<AtomicBool>>>,
    next: AtomicU64,
}

impl Registry {
    pub fn new(depth: usize) -> Self {
        Self {
            depth,
            live: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<AtomicBool>>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An id for a request that came without one.
    pub fn fresh_id(&self) -> String {
        format!("req-{}", self.next.fetch_add(1, Ordering::Relaxed))
    }

    /// Admits `id` and returns its cancel flag.
    pub fn admit(&self, id: &str) -> Result<Arc<AtomicBool>, AdmitError> {
        let mut live = self.lock();
        if live.contains_key(id) {
            return Err(AdmitError::DuplicateId(id.to_owned()));
        }
        if live.len() >= self.depth {
            return Err(AdmitError::Busy { depth: self.depth });
        }
        let flag = Arc::new(AtomicBool::new(false));
        live.insert(id.to_owned(), flag.clone());
        Ok(flag)
    }

    /// Sets the cancel flag of a live request; false when no such request is live.
    pub fn cancel(&self, id: &str) -> bool {
        match self.lock().get(id) {
            Some(f) => {
                f.store(true, Ordering::Release);
                true
            }
            None => false,
        }
    }

    /// Cancels every live request (shutdown).
    pub fn cancel_all(&self) -> usize {
        let live = self.lock();
        for f in live.values() {
            f.store(true, Ordering::Release);
        }
        live.len()
    }

    pub fn remove(&self, id: &str) {
        self.lock().remove(id);
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_ids_and_cancel() {
        let r = Registry::new(2);
        let a = r.admit("a").unwrap();
        assert_eq!(
            r.admit("a").err(),
            Some(AdmitError::DuplicateId("a".into()))
        );
        r.admit("b").unwrap();
        assert_eq!(r.admit("c").err(), Some(AdmitError::Busy { depth: 2 }));
        assert!(r.cancel("a"));
        assert!(a.load(Ordering::Acquire));
        assert!(!r.cancel("zz"));
        r.remove("a");
        r.admit("c").unwrap();
        assert_eq!(r.len(), 2);
        assert_ne!(r.fresh_id(), r.fresh_id());
    }
}

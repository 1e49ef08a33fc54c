//! Live requests (queued or running): bounded by `queue_depth`, unique ids, cancel flags.
//!
//! A request holds its place through an [`Admission`], which frees the id and the queue place
//! when it is released or dropped — before the response goes out, so a client that reuses the
//! id the moment it has its answer is admitted, and on every other way a request can end.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Why a request could not be admitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum AdmitError {
    #[error("the queue is full ({depth} requests queued or running); retry later")]
    Busy { depth: usize },
    #[error("request id {0:?} is already queued or running")]
    DuplicateId(String),
}

/// A live request's place: its id, its queue place and its cancel flag. Dropping it frees
/// the place (only its own: the id may already belong to a newer request).
pub(crate) struct Admission {
    registry: Arc<Registry>,
    id: String,
    flag: Arc<AtomicBool>,
}

impl Admission {
    /// The cancel flag `/vlm/cancel` and shutdown set.
    pub(crate) fn cancel_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.flag)
    }

    /// Frees the place now (the same as dropping it, said where it matters).
    pub(crate) fn release(self) {}
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.registry.release(&self.id, &self.flag);
    }
}

/// The set of live requests.
pub(crate) struct Registry {
    depth: usize,
    live: Mutex<HashMap<String, Arc<AtomicBool>>>,
    next: AtomicU64,
}

impl Registry {
    pub(crate) fn new(depth: usize) -> Self {
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
    pub(crate) fn fresh_id(&self) -> String {
        format!("req-{}", self.next.fetch_add(1, Ordering::Relaxed))
    }

    /// Admits `id`; the request keeps its place as long as it holds the [`Admission`].
    pub(crate) fn admit(self: &Arc<Self>, id: &str) -> Result<Admission, AdmitError> {
        self.admit_with(id, Arc::new(AtomicBool::new(false)))
    }

    /// [`Registry::admit`] with a cancel flag made beforehand (an action goal's, which its
    /// cancel may set before the request is admitted). The flag must be this request's own.
    pub(crate) fn admit_with(
        self: &Arc<Self>,
        id: &str,
        flag: Arc<AtomicBool>,
    ) -> Result<Admission, AdmitError> {
        let mut live = self.lock();
        if live.contains_key(id) {
            return Err(AdmitError::DuplicateId(id.to_owned()));
        }
        if live.len() >= self.depth {
            return Err(AdmitError::Busy { depth: self.depth });
        }
        live.insert(id.to_owned(), flag.clone());
        Ok(Admission {
            registry: Arc::clone(self),
            id: id.to_owned(),
            flag,
        })
    }

    /// Sets the cancel flag of a live request; false when no such request is live.
    pub(crate) fn cancel(&self, id: &str) -> bool {
        match self.lock().get(id) {
            Some(f) => {
                f.store(true, Ordering::Release);
                true
            }
            None => false,
        }
    }

    /// Cancels every live request (shutdown).
    pub(crate) fn cancel_all(&self) -> usize {
        let live = self.lock();
        for f in live.values() {
            f.store(true, Ordering::Release);
        }
        live.len()
    }

    /// Frees `id` if the entry is still the admission holding `flag`.
    fn release(&self, id: &str, flag: &Arc<AtomicBool>) {
        let mut live = self.lock();
        if live.get(id).is_some_and(|f| Arc::ptr_eq(f, flag)) {
            live.remove(id);
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether a request could be admitted now (a hint: [`Registry::admit`] decides), so
    /// costly planning is skipped for a request that would be refused `busy` anyway.
    pub(crate) fn room(&self) -> Result<(), AdmitError> {
        if self.len() >= self.depth {
            return Err(AdmitError::Busy { depth: self.depth });
        }
        Ok(())
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn depth_ids_and_cancel() {
        let r = Arc::new(Registry::new(2));
        let a = r.admit("a").unwrap();
        assert_eq!(
            r.admit("a").err(),
            Some(AdmitError::DuplicateId("a".into()))
        );
        let _b = r.admit("b").unwrap();
        assert_eq!(r.admit("c").err(), Some(AdmitError::Busy { depth: 2 }));
        assert!(r.cancel("a"));
        assert!(a.cancel_flag().load(Ordering::Acquire));
        assert!(!r.cancel("zz"));
        a.release();
        let _c = r.admit("c").unwrap();
        assert_eq!(r.len(), 2);
        assert_ne!(r.fresh_id(), r.fresh_id());
    }

    #[test]
    fn a_released_id_is_free_at_once_and_a_stale_release_frees_nothing() {
        let r = Arc::new(Registry::new(4));
        let first = r.admit("x").unwrap();
        first.release();
        let second = r.admit("x").expect("the id is free once released");
        // A stale release of the first admission (a late cleanup) must not free the second.
        let stale = Arc::new(AtomicBool::new(false));
        r.release("x", &stale);
        assert_eq!(r.len(), 1);
        assert_eq!(
            r.admit("x").err(),
            Some(AdmitError::DuplicateId("x".into()))
        );
        drop(second);
        assert!(r.is_empty(), "dropping an admission frees its place");
    }
}

//! Live requests (queued or running): bounded by `queue_depth`, unique ids, cancel flags.
//!
//! A request holds its place through an [`Admission`], which frees the id and the queue place
//! when it is released or dropped — before the response goes out, so a client that reuses the
//! id the moment it has its answer is admitted, and on every other way a request can end.
//!
//! Ids the node assigns are [`NODE_ID_PREFIX`] and 128 random bits: a peer that sees one on
//! `vlm/tokens` cannot guess the next to cancel it, and since clients may not use the prefix
//! ([`client_id_error`]), no client's id can collide with one the node hands out.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// How every node-assigned request id starts; reserved, so a client id may not.
pub(crate) const NODE_ID_PREFIX: &str = "req-";

/// Why a client-chosen `request_id` is refused (`None`: it may be used). An empty id is
/// the client asking for one of the node's.
pub(crate) fn client_id_error(id: &str) -> Option<String> {
    id.starts_with(NODE_ID_PREFIX).then(|| {
        format!(
            "request_id {id:?}: ids that start with {NODE_ID_PREFIX:?} are the node's own; \
             leave it empty for one, or choose another"
        )
    })
}

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

    /// The worker took this request up: a deactivate lets it finish
    /// ([`Registry::cancel_waiting`]).
    pub(crate) fn running(&self) {
        *self.registry.running() = Some(Arc::clone(&self.flag));
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        let mut running = self.registry.running();
        if running.as_ref().is_some_and(|f| Arc::ptr_eq(f, &self.flag)) {
            *running = None;
        }
        drop(running);
        self.registry.release(&self.id, &self.flag);
    }
}

/// The set of live requests.
pub(crate) struct Registry {
    depth: usize,
    live: Mutex<HashMap<String, Arc<AtomicBool>>>,
    /// The cancel flag of the request the worker is serving.
    running: Mutex<Option<Arc<AtomicBool>>>,
}

impl Registry {
    pub(crate) fn new(depth: usize) -> Self {
        Self {
            depth,
            live: Mutex::new(HashMap::new()),
            running: Mutex::new(None),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<AtomicBool>>> {
        self.live.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// An id for a request that came without one: the prefix and 32 lowercase hex digits
    /// from the thread's CSPRNG (seeded from the OS), so it is neither guessable nor, in
    /// practice, ever repeated.
    pub(crate) fn fresh_id(&self) -> String {
        format!("{NODE_ID_PREFIX}{:032x}", rand::random::<u128>())
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

    /// Cancels every live request but the running one (a deactivate: queued requests are
    /// answered `cancelled`, the running one may finish).
    pub(crate) fn cancel_waiting(&self) -> usize {
        let running = self.running().clone();
        let live = self.lock();
        let waiting = live
            .values()
            .filter(|f| !running.as_ref().is_some_and(|r| Arc::ptr_eq(r, f)));
        waiting.map(|f| f.store(true, Ordering::Release)).count()
    }

    fn running(&self) -> MutexGuard<'_, Option<Arc<AtomicBool>>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
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

    pub(crate) fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_deactivate_cancels_the_waiting_requests_not_the_running_one() {
        let r = Arc::new(Registry::new(4));
        let (running, queued) = (r.admit("a").unwrap(), r.admit("b").unwrap());
        running.running();
        assert_eq!(r.cancel_waiting(), 1);
        let flag = |a: &Admission| a.cancel_flag().load(Ordering::Acquire);
        assert!(!flag(&running) && flag(&queued));
        drop(running);
        // Nothing runs now: every live request is waiting.
        let next = r.admit("c").unwrap();
        assert_eq!(r.cancel_waiting(), 2);
        assert!(flag(&next));
    }

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
    fn node_ids_are_random_hex_and_clients_may_not_use_the_prefix() {
        let r = Registry::new(1);
        let ids: std::collections::HashSet<String> = (0..1000).map(|_| r.fresh_id()).collect();
        assert_eq!(ids.len(), 1000);
        for id in &ids {
            let hex = id.strip_prefix("req-").expect("prefix");
            assert_eq!(hex.len(), 32, "{id}");
            assert!(
                hex.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f')),
                "{id}"
            );
            assert!(client_id_error(id).is_some());
        }
        let why = client_id_error("req-7").expect("refused");
        assert!(why.contains("request_id") && why.contains("req-"), "{why}");
        assert!(client_id_error("").is_none());
        assert!(client_id_error("kitchen-req-1").is_none());
        assert!(client_id_error("REQ-1").is_none());
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

//! Conversations parked between turns (requests with a `session_id`): the state snapshot
//! after each answer, bounded by `session_memory_mb` (least recently used go first) and
//! dropped after `session_idle_s` without use.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use vlm::assistant::Conversation;

/// Parked conversations, bounded by memory and idle time.
pub(crate) struct Sessions {
    map: HashMap<String, (Conversation, Instant)>,
    budget: usize,
    idle: Duration,
}

impl Sessions {
    pub(crate) fn new(budget: usize, idle: Duration) -> Self {
        Self {
            map: HashMap::new(),
            budget,
            idle,
        }
    }

    pub(crate) fn bytes(&self) -> usize {
        self.map.values().map(|(c, _)| c.size_bytes()).sum()
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    pub(crate) fn get(&self, id: &str) -> Option<&Conversation> {
        self.map.get(id).map(|(c, _)| c)
    }

    pub(crate) fn put(&mut self, id: String, c: Conversation, now: Instant) {
        self.map.insert(id, (c, now));
        while self.bytes() > self.budget {
            let Some(oldest) = self
                .map
                .iter()
                .min_by_key(|(_, (_, t))| *t)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            tracing::info!(session = %oldest, "session evicted: session_memory_mb is full");
            self.map.remove(&oldest);
        }
    }

    pub(crate) fn expire(&mut self, now: Instant) {
        let idle = self.idle;
        self.map.retain(|id, (_, t)| {
            let keep = now.duration_since(*t) < idle;
            if !keep {
                tracing::info!(session = %id, "session expired (idle)");
            }
            keep
        });
    }
}

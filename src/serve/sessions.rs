//! Conversations parked between turns (requests with a `session_id`): the state snapshot
//! after each answer, bounded by `session_memory_mb` (least recently used go first) and
//! dropped after `session_idle_s` without use. A session the node dropped starts afresh
//! under the same id; the client learns it from the answer's `session_turn` (1 again), and
//! `/diagnostics` counts the drops (`sessions_evicted`, `sessions_expired`).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use vlm::assistant::Conversation;

/// Parked conversations, bounded by memory and idle time.
pub(crate) struct Sessions {
    map: HashMap<String, (Conversation, Instant)>,
    budget: usize,
    idle: Duration,
    /// Sessions dropped because `session_memory_mb` was full, since start.
    evicted: u64,
    /// Sessions dropped after `session_idle_s` without use, since start.
    expired: u64,
}

impl Sessions {
    pub(crate) fn new(budget: usize, idle: Duration) -> Self {
        Self {
            map: HashMap::new(),
            budget,
            idle,
            evicted: 0,
            expired: 0,
        }
    }

    pub(crate) fn bytes(&self) -> usize {
        self.map.values().map(|(c, _)| c.size_bytes()).sum()
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    pub(crate) fn evicted(&self) -> u64 {
        self.evicted
    }

    pub(crate) fn expired(&self) -> u64 {
        self.expired
    }

    pub(crate) fn get(&self, id: &str) -> Option<&Conversation> {
        self.map.get(id).map(|(c, _)| c)
    }

    /// The `session_tag` of session `id` in an Answer: the first 16 lowercase hex digits of
    /// the id's SHA-256 (empty without a session). The id is a client's secret and is
    /// published nowhere; the tag only lets subscribers group one conversation's answers.
    pub(crate) fn tag(id: Option<&str>) -> String {
        use sha2::{Digest, Sha256};
        id.map_or_else(String::new, |id| {
            Sha256::digest(id.as_bytes())[..8]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect()
        })
    }

    /// The `session_turn` an ask on session `id` is now: 0 without a session, 1 for one the
    /// node does not hold (new, evicted or expired), else one more than the turns it holds.
    pub(crate) fn turn(&self, id: Option<&str>) -> u32 {
        id.map_or(0, |id| {
            self.get(id).map_or(1, |c| {
                u32::try_from(c.turns()).map_or(u32::MAX, |n| n.saturating_add(1))
            })
        })
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
            // The id is a client's secret: it is not logged.
            tracing::info!("a session was evicted: session_memory_mb is full");
            self.map.remove(&oldest);
            self.evicted += 1;
        }
    }

    pub(crate) fn expire(&mut self, now: Instant) {
        let idle = self.idle;
        let before = self.map.len();
        self.map.retain(|_, (_, t)| now.duration_since(*t) < idle);
        let gone = before - self.map.len();
        if gone > 0 {
            tracing::info!(sessions = gone, "sessions expired (idle)");
            self.expired += gone as u64;
        }
    }
}

//! The system blocks (system prompt + tools) prefilled once and restored per fresh
//! conversation: a small LRU of state snapshots keyed by the block's text, bounded in entries
//! and bytes ([`super::DecodeStates::set_prefix_budget`]). A robot that alternates between a
//! few system prompts (a planner's and a describer's) then prefills each only once.

use std::collections::VecDeque;

use crate::engine::StateBlob;

/// Most system blocks kept, whatever the byte budget.
const MAX_ENTRIES: usize = 8;

/// Snapshots after a system block, most recently used last.
#[derive(Debug)]
pub(super) struct PrefixCache {
    entries: VecDeque<(String, StateBlob)>,
    budget: usize,
}

impl PrefixCache {
    pub(super) fn new(budget: usize) -> Self {
        Self {
            entries: VecDeque::new(),
            budget,
        }
    }

    /// The snapshot of `text`, now the most recently used.
    pub(super) fn get(&mut self, text: &str) -> Option<&StateBlob> {
        let i = self.entries.iter().position(|(t, _)| t == text)?;
        let e = self.entries.remove(i)?;
        self.entries.push_back(e);
        self.entries.back().map(|(_, b)| b)
    }

    /// Keeps `blob` for `text`; the least recently used go while over the entry count or the
    /// byte budget. The newest always stays: it is the state the next fresh turn needs.
    pub(super) fn put(&mut self, text: String, blob: StateBlob) {
        self.entries.retain(|(t, _)| *t != text);
        self.entries.push_back((text, blob));
        while self.entries.len() > 1
            && (self.entries.len() > MAX_ENTRIES || self.bytes() > self.budget)
        {
            self.entries.pop_front();
        }
    }

    pub(super) fn bytes(&self) -> usize {
        self.entries.iter().map(|(_, b)| b.size_bytes()).sum()
    }

    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(super) fn set_budget(&mut self, budget: usize) {
        self.budget = budget;
        while self.entries.len() > 1 && self.bytes() > self.budget {
            self.entries.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blob(n: usize) -> StateBlob {
        StateBlob::from_bytes(vec![0; n])
    }

    #[test]
    fn least_recently_used_goes_first_within_the_byte_budget() {
        let mut c = PrefixCache::new(25);
        c.put("a".into(), blob(10));
        c.put("b".into(), blob(10));
        assert!(c.get("a").is_some(), "a is now the most recent");
        c.put("c".into(), blob(10));
        assert!(c.get("b").is_none(), "b was the least recently used");
        assert!(c.get("a").is_some());
        assert!(c.get("c").is_some());
        assert_eq!(c.bytes(), 20);
    }

    #[test]
    fn the_newest_block_stays_even_over_budget_and_the_count_is_bounded() {
        let mut c = PrefixCache::new(0);
        c.put("a".into(), blob(10));
        assert_eq!(c.len(), 1);
        c.put("b".into(), blob(10));
        assert!(c.get("a").is_none());
        assert!(c.get("b").is_some());
        let mut c = PrefixCache::new(usize::MAX);
        for i in 0..MAX_ENTRIES + 3 {
            c.put(format!("s{i}"), blob(1));
        }
        assert_eq!(c.len(), MAX_ENTRIES);
        assert!(c.get("s0").is_none());
        c.put(format!("s{}", MAX_ENTRIES + 2), blob(1));
        assert_eq!(c.len(), MAX_ENTRIES, "a block put again replaces its entry");
    }
}

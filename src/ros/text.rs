//! Text bound for a ROS message. r2r converts every `string` field with
//! `CString::new(..).unwrap()`, so a single U+0000 — which a sampled model may emit at any
//! time, as any other token — would panic whichever thread publishes or responds. Every
//! string field the node fills passes through here where its message is built (the Token
//! sink, the request's outcome, diagnostics): U+0000 becomes U+FFFD.
//!
//! Replacements are counted for diagnostics, each character once: model output as it streams
//! (the Token sink), other text (error messages, ids) where the outcome is built. Text that
//! repeats what was counted already (the Answer's copy of the streamed deltas) or that goes out
//! again every period (diagnostics) is replaced without counting.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The node's count of replaced U+0000 characters (diagnostics' `nul_replaced`), cloned into
/// everything that builds messages from model or client text.
#[derive(Clone, Default)]
pub(crate) struct NulCount(Arc<AtomicU64>);

impl NulCount {
    /// `text` made safe for a message, its replacements counted.
    pub(crate) fn safe(&self, text: impl Into<String>) -> String {
        let text = text.into();
        if !text.contains('\0') {
            return text;
        }
        let n = text.chars().filter(|&c| c == '\0').count();
        self.0.fetch_add(n as u64, Ordering::Relaxed);
        text.replace('\0', "\u{FFFD}")
    }

    /// U+0000 characters replaced since the node started.
    pub(crate) fn total(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// `text` made safe for a message, not counted (see the module doc for when).
pub(crate) fn ros_text_uncounted(text: impl Into<String>) -> String {
    let text = text.into();
    if text.contains('\0') {
        text.replace('\0', "\u{FFFD}")
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nul_becomes_the_replacement_character_and_is_counted() {
        let nuls = NulCount::default();
        assert_eq!(nuls.safe("a\0b\0"), "a\u{FFFD}b\u{FFFD}");
        assert_eq!(nuls.total(), 2);
        assert_eq!(nuls.safe("长 🍎, no NUL"), "长 🍎, no NUL");
        assert_eq!(ros_text_uncounted("\0"), "\u{FFFD}");
        assert_eq!(nuls.total(), 2, "uncounted");
        // The result converts as r2r converts message strings.
        assert!(std::ffi::CString::new(nuls.clone().safe("x\0y")).is_ok());
        assert_eq!(nuls.total(), 3, "clones share the count");
    }
}

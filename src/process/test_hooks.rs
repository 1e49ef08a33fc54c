//! Test-only panic injection, so the node tests can prove that a panic while serving a request
//! is contained and that one in a long-lived task stops the node. Compiled only into builds
//! with debug assertions (`cargo build`, `cargo test`); release builds (`--release`, the
//! board's colcon build) compile [`point`] to nothing and never read the variable.
//!
//! `VLM_NODE_TEST_PANIC=site[@n][,site[@n]...]` panics the n-th time (default: the first)
//! the node passes `site`:
//! - `serve`: a request's first delta, raised from the Token callback inside the runtime's
//!   generation call (unwinds through the engine, sampler and stream);
//! - `reset`: the backend reset that follows a contained panic (the model is then reopened);
//! - `cancel`: a `/vlm/cancel` request, in the cancel task;
//! - `diagnostics`: a diagnostics period, in the diagnostics task;
//! - `schema`: a request's `json_schema` compile, on its blocking-pool thread;
//! - `camera`: a camera message's header check and decoding, on its blocking-pool thread.

/// The environment variable read by debug builds.
#[cfg(debug_assertions)]
pub(crate) const ENV: &str = "VLM_NODE_TEST_PANIC";

/// A place where a test may inject a panic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Site {
    Serve,
    Reset,
    Cancel,
    Diagnostics,
    Schema,
    Camera,
}

#[cfg(debug_assertions)]
impl Site {
    const ALL: [Self; 6] = [
        Self::Serve,
        Self::Reset,
        Self::Cancel,
        Self::Diagnostics,
        Self::Schema,
        Self::Camera,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Serve => "serve",
            Self::Reset => "reset",
            Self::Cancel => "cancel",
            Self::Diagnostics => "diagnostics",
            Self::Schema => "schema",
            Self::Camera => "camera",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Passes `site`: panics when the test plan says so (debug builds only).
#[cfg(debug_assertions)]
pub(crate) fn point(site: Site) {
    armed::point(site);
}

/// Passes `site`: nothing happens in a release build.
#[cfg(not(debug_assertions))]
#[inline(always)]
pub(crate) fn point(_site: Site) {}

/// Test-only: with `VLM_NODE_TEST_DETECT_ANSWER=<JSON>` (debug builds), every detect's answer
/// is held to that value (a schema whose only value it is), so a test knows which boxes even
/// a random model gives; `None` otherwise, and always in a release build.
pub(crate) fn held_detect_answer() -> Option<String> {
    if cfg!(debug_assertions) {
        std::env::var("VLM_NODE_TEST_DETECT_ANSWER")
            .ok()
            .filter(|v| !v.trim().is_empty())
            .map(|v| format!(r#"{{"const":{v}}}"#))
    } else {
        None
    }
}

#[cfg(debug_assertions)]
mod armed {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::OnceLock;

    use super::{Site, ENV};

    struct Plan {
        /// Per site: the pass that panics (1-based).
        at: [Option<u32>; Site::ALL.len()],
        seen: [AtomicU32; Site::ALL.len()],
    }

    fn parse(text: &str) -> Plan {
        let mut at = [None; Site::ALL.len()];
        for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (name, n) = item.split_once('@').unwrap_or((item, "1"));
            let site = Site::ALL.iter().find(|s| s.name() == name);
            match (site, n.parse::<u32>()) {
                (Some(s), Ok(n)) if n > 0 => at[s.index()] = Some(n),
                _ => tracing::warn!("{ENV}: ignoring {item:?} (want site[@n], n >= 1)"),
            }
        }
        if at.iter().any(Option::is_some) {
            tracing::warn!("{ENV}={text:?}: test panics are armed (debug build)");
        }
        Plan {
            at,
            seen: Default::default(),
        }
    }

    fn plan() -> &'static Plan {
        static PLAN: OnceLock<Plan> = OnceLock::new();
        PLAN.get_or_init(|| parse(&std::env::var(ENV).unwrap_or_default()))
    }

    pub(crate) fn point(site: Site) {
        let p = plan();
        let Some(n) = p.at[site.index()] else { return };
        let pass = p.seen[site.index()].fetch_add(1, Ordering::Relaxed) + 1;
        if pass == n {
            panic!("test panic at {} (pass {pass}, {ENV})", site.name());
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn plans_name_sites_and_passes() {
            let p = parse("serve@2, cancel,bogus,reset@0,camera@3");
            assert_eq!(p.at[Site::Serve.index()], Some(2));
            assert_eq!(p.at[Site::Cancel.index()], Some(1));
            assert_eq!(p.at[Site::Reset.index()], None);
            assert_eq!(p.at[Site::Diagnostics.index()], None);
            assert_eq!(p.at[Site::Camera.index()], Some(3));
            assert_eq!(p.at[Site::Schema.index()], None);
        }
    }
}

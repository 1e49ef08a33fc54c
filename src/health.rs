//! The node's health as `/diagnostics` states it: a level, a message naming every reason for
//! it, and the hardware id. ERROR: the engine cannot serve (it failed to load, its backend is
//! lost, it could not be reopened) or the node is stopping after a runtime failure — the
//! status never says OK about a dead engine. WARN: it serves, but something needs a look (a
//! silent camera, a saturated queue, a stale default camera, model output with NUL
//! characters, a model being reopened after an internal error).

use std::sync::Arc;
use std::time::{Duration, Instant};

use vlm::assistant::{BackendKind, ModelInfo};

use crate::serve::stats::WorkerState;

pub(crate) const OK: u8 = 0;
pub(crate) const WARN: u8 = 1;
pub(crate) const ERROR: u8 = 2;

/// How long replaced NUL characters keep the status at WARN after the last one.
pub(crate) const NUL_WARN_FOR: Duration = Duration::from_secs(60);

/// What the status is judged from, gathered by diagnostics each period.
#[derive(Debug, Clone)]
pub(crate) struct Observed<'a> {
    pub state: &'a WorkerState,
    /// The runtime failure the node is stopping for ([`crate::process::fatal::reason`]).
    pub fatal: Option<&'a str>,
    /// Requests queued or running, and how many the queue holds (`queue_depth`).
    pub queued: usize,
    pub queue_depth: usize,
    /// Camera topics without any message for a while, with how long.
    pub silent: Vec<(Arc<str>, Duration)>,
    /// The default camera, its latest frame's age and the limit, when the frame is older
    /// than `max_image_age_s`.
    pub stale_default: Option<(Arc<str>, Duration, Duration)>,
    /// NUL characters replaced so far, when the last replacement is recent.
    pub recent_nuls: Option<u64>,
}

/// The level and the message.
pub(crate) fn assess(o: &Observed<'_>) -> (u8, String) {
    if let WorkerState::Failed(reason) = o.state {
        return (ERROR, format!("engine failed: {reason}"));
    }
    if let Some(reason) = o.fatal {
        return (ERROR, format!("stopping after a runtime failure: {reason}"));
    }
    let mut warnings = Vec::new();
    if *o.state == WorkerState::Recovering {
        warnings.push("reopening the model after an internal error".to_owned());
    }
    if o.queued >= o.queue_depth {
        warnings.push(format!(
            "queue saturated: {} of {} requests queued or running (new asks get busy)",
            o.queued, o.queue_depth
        ));
    }
    for (topic, silent) in &o.silent {
        warnings.push(format!(
            "camera {topic}: no message for {:.0} s",
            silent.as_secs_f64()
        ));
    }
    if let Some((topic, age, max)) = &o.stale_default {
        warnings.push(format!(
            "default camera {topic}: latest frame is {:.1} s old, above max_image_age_s {:.1} \
             (asks without a camera get stale_image)",
            age.as_secs_f64(),
            max.as_secs_f64()
        ));
    }
    if let Some(n) = o.recent_nuls {
        warnings.push(format!(
            "model output held NUL characters ({n} replaced by U+FFFD so far)"
        ));
    }
    if warnings.is_empty() {
        (OK, o.state.as_str().to_owned())
    } else {
        (
            WARN,
            format!("{}: {}", o.state.as_str(), warnings.join("; ")),
        )
    }
}

/// Remembers when the count of replaced NUL characters last grew.
#[derive(Debug, Default)]
pub(crate) struct NulWatch {
    seen: u64,
    grew_at: Option<Instant>,
}

impl NulWatch {
    /// The total when it grew within [`NUL_WARN_FOR`] of `now`.
    pub(crate) fn observe(&mut self, total: u64, now: Instant) -> Option<u64> {
        if total > self.seen {
            self.seen = total;
            self.grew_at = Some(now);
        }
        self.grew_at
            .filter(|t| now.saturating_duration_since(*t) < NUL_WARN_FOR)
            .map(|_| total)
    }
}

/// The SoC (or `simulator`, or `cpu`) and the package (or checkpoint) behind the engine;
/// empty until a model is loaded. `board` is [`board`]'s answer.
pub(crate) fn hardware_id(model: Option<&ModelInfo>, board: &str) -> String {
    let Some(m) = model else {
        return String::new();
    };
    match m.backend {
        BackendKind::BpuSim => format!("simulator; package {}", m.name),
        BackendKind::Bpu => format!("{board}; package {}", m.name),
        BackendKind::Cpu => format!("cpu; checkpoint {}", m.name),
    }
}

/// The board as its device tree names it (the RDK S100P's names the SoC); the node reads it
/// once, at start.
pub(crate) fn board() -> String {
    [
        "/proc/device-tree/model",
        "/sys/firmware/devicetree/base/model",
    ]
    .iter()
    .find_map(|p| std::fs::read(p).ok())
    // Device-tree strings end in NUL bytes, which a ROS string cannot carry.
    .map(|b| {
        String::from_utf8_lossy(&b)
            .replace('\0', " ")
            .trim()
            .to_owned()
    })
    .filter(|s| !s.is_empty())
    .unwrap_or_else(|| "BPU board (device-tree model unreadable)".to_owned())
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn observed(state: &WorkerState) -> Observed<'_> {
        Observed {
            state,
            fatal: None,
            queued: 0,
            queue_depth: 4,
            silent: Vec::new(),
            stale_default: None,
            recent_nuls: None,
        }
    }

    #[test]
    fn a_dead_engine_is_an_error_whatever_else_holds() {
        let failed = WorkerState::Failed("the BPU backend is lost: graph decode".into());
        let (level, message) = assess(&observed(&failed));
        assert_eq!(level, ERROR);
        assert!(message.contains("graph decode"), "{message}");
        let ready = WorkerState::Ready;
        let mut o = observed(&ready);
        o.fatal = Some("panic in thread tokio-runtime-worker");
        o.queued = 4;
        assert_eq!(assess(&o).0, ERROR);
    }

    #[test]
    fn each_warning_is_named() {
        let ready = WorkerState::Ready;
        assert_eq!(assess(&observed(&ready)), (OK, "ready".to_owned()));
        let mut o = observed(&ready);
        o.queued = 4;
        o.silent = vec![("/cam".into(), Duration::from_secs(7))];
        o.stale_default = Some((
            "/cam".into(),
            Duration::from_secs(3),
            Duration::from_secs(1),
        ));
        o.recent_nuls = Some(2);
        let (level, message) = assess(&o);
        assert_eq!(level, WARN);
        for part in [
            "queue saturated: 4 of 4",
            "camera /cam: no message for 7 s",
            "default camera /cam: latest frame is 3.0 s old",
            "2 replaced by U+FFFD",
        ] {
            assert!(message.contains(part), "{part:?} not in {message:?}");
        }
        assert_eq!(assess(&observed(&WorkerState::Recovering)).0, WARN);
    }

    #[test]
    fn nul_warnings_last_a_while_after_the_last_replacement() {
        let t0 = Instant::now();
        let mut w = NulWatch::default();
        assert_eq!(w.observe(0, t0), None);
        assert_eq!(w.observe(3, t0), Some(3));
        assert_eq!(w.observe(3, t0 + NUL_WARN_FOR / 2), Some(3));
        assert_eq!(w.observe(3, t0 + NUL_WARN_FOR), None);
        assert_eq!(w.observe(4, t0 + NUL_WARN_FOR * 2), Some(4));
    }

    #[test]
    fn the_hardware_id_names_the_soc_and_the_package() {
        let info = ModelInfo {
            name: "tiny-4b-embedded".into(),
            backend: BackendKind::BpuSim,
            dir: PathBuf::from("/tmp/pkg"),
            context: 1024,
            vocab: 640,
            hidden: 64,
            image_side: None,
            system: String::new(),
        };
        assert_eq!(
            hardware_id(Some(&info), "RDK S100P"),
            "simulator; package tiny-4b-embedded"
        );
        let board = ModelInfo {
            backend: BackendKind::Bpu,
            ..info
        };
        assert_eq!(
            hardware_id(Some(&board), "RDK S100P"),
            "RDK S100P; package tiny-4b-embedded"
        );
        assert_eq!(hardware_id(None, "RDK S100P"), "");
    }
}

//! Whether cache maintenance names ranges inside an allocation or whole allocations. The
//! backend CLEANs and INVALIDATEs parts of buffers (4 bytes of the decode mask per head
//! plane every step, the occupied rows of a cache set for snapshots, restores and the
//! padded-tail fix-up); BLLM only ever flushes whole allocations, and whether libhbucp takes
//! a range is not documented. So the runtime is probed once at open
//! ([`hbdnn::Runtime::probe_flush`]) and, when it refuses a range, every flush covers the
//! whole allocation. An accepted range flush that does the wrong thing cannot be seen from
//! the CPU: [`FlushOption::Whole`] forces whole flushes (`--flush whole`, `bpu_flush`).

use std::path::Path;

use hbdnn::{FlushMode, Runtime};

use crate::BpuError;

/// What [`crate::BpuOptions::flush`] asks for (`--flush`, the node's `bpu_flush`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FlushOption {
    /// Ranges when the probe finds them accepted, else whole allocations.
    #[default]
    Auto,
    /// Ranges; opening fails when the runtime refuses them.
    Range,
    /// Whole allocations, whatever the probe found.
    Whole,
}

impl FlushOption {
    /// The spelling of flags and parameters.
    pub fn as_str(self) -> &'static str {
        match self {
            FlushOption::Auto => "auto",
            FlushOption::Range => "range",
            FlushOption::Whole => "whole",
        }
    }
}

impl std::fmt::Display for FlushOption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for FlushOption {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "auto" => Ok(FlushOption::Auto),
            "range" => Ok(FlushOption::Range),
            "whole" => Ok(FlushOption::Whole),
            other => Err(format!("{other:?} is not auto, range or whole")),
        }
    }
}

/// The flush mode of one opened backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlushDecision {
    /// What the probe found the runtime accepts.
    pub found: FlushMode,
    /// What the backend's buffers use: `found`, or `Whole` when forced.
    pub used: FlushMode,
}

/// Probes `rt`, sets its flush mode as `option` says and returns the decision. A forced
/// `Range` on a runtime that refuses ranges is an error naming the option (`hbm`: the file
/// errors name).
pub(crate) fn decide(
    rt: &Runtime,
    option: FlushOption,
    hbm: &Path,
) -> Result<FlushDecision, BpuError> {
    let probe = rt.probe_flush().map_err(|source| BpuError::Hbdnn {
        path: hbm.to_owned(),
        source,
    })?;
    let used = match (option, &probe.refusal) {
        (FlushOption::Range, Some(refusal)) => {
            return Err(BpuError::Config {
                path: hbm.to_owned(),
                reason: format!(
                    "--flush range (node parameter bpu_flush: range) was asked for, but this \
                     runtime refuses a flush of part of an allocation ({refusal}); use \
                     --flush auto or whole (bpu_flush: auto or whole)"
                ),
            });
        }
        (FlushOption::Whole, _) => FlushMode::Whole,
        _ => probe.mode,
    };
    rt.set_flush_mode(used);
    tracing::info!(found = %probe.mode, used = %used, option = %option, "cache flush mode");
    Ok(FlushDecision {
        found: probe.mode,
        used,
    })
}

//! Flags every subcommand that opens a package shares, so each is spelled and checked once.

use clap::Args;
use vlm_bpu::BpuOptions;

#[derive(Debug, Clone, Args)]
pub struct BpuFlags {
    /// Longest wait for one BPU graph call, in seconds. A call that takes longer fails with
    /// an error naming the graph; the process must then exit (the task may still be running).
    #[arg(long, value_name = "SECONDS", default_value_t = vlm_bpu::DEFAULT_TIMEOUT.as_secs_f64(), value_parser = parse_timeout)]
    pub bpu_timeout_s: f64,
    /// ION pool preflight: `strict` refuses when the pool is too small or cannot be
    /// identified with certainty; `warn` never refuses (it warns in both cases, naming the
    /// fix); `off` checks nothing.
    #[arg(long, value_name = "strict|warn|off", default_value_t = vlm_bpu::PoolCheck::Warn)]
    pub pool_check: vlm_bpu::PoolCheck,
    /// How a prompt tail shorter than a prefill chunk runs: `auto` pads it when the package
    /// sets `prefill_pads`, with the pad layout calibrated once per package (cached in
    /// $VLM_BPU_CACHE_DIR, else $XDG_CACHE_HOME/bpu_vlm or ~/.cache/bpu_vlm), and steps it
    /// otherwise; `stepped` runs it row by row through the decode graph; `pads_first` /
    /// `pads_last` force a layout (timing runs on packages without weights).
    #[arg(
        long,
        value_name = "auto|stepped|pads_first|pads_last",
        default_value_t = vlm_bpu::PrefillTail::Auto,
        conflicts_with = "pad_tail"
    )]
    pub prefill_tail: vlm_bpu::PrefillTail,
    /// Same as `--prefill-tail auto` (kept for older scripts).
    #[arg(long)]
    pub pad_tail: bool,
    /// Cache flushes of part of a buffer: `auto` probes the runtime at open and flushes
    /// whole buffers when it refuses a range; `range` fails to open on such a runtime;
    /// `whole` always flushes whole buffers (for a runtime that accepts a range flush but
    /// gets it wrong, which no probe can see).
    #[arg(long, value_name = "auto|range|whole", default_value_t = vlm_bpu::FlushOption::Auto)]
    pub flush: vlm_bpu::FlushOption,
}

/// Flags of the commands that run requests (generate, chat, bench).
#[derive(Debug, Clone, Args)]
pub struct RunFlags {
    /// Never use the prefill graph: every prompt row runs through the decode graph (the
    /// model zoo's parity gate compares with and without it); a separate prefill `.hbm` is
    /// not loaded.
    #[arg(long)]
    pub no_prefill_graph: bool,
}

impl RunFlags {
    /// Copies the flags into `opts`.
    pub fn apply(&self, opts: &mut BpuOptions) {
        opts.no_prefill_graph = self.no_prefill_graph;
    }
}

pub(super) fn parse_timeout(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{s:?}: {e}"))?;
    vlm_bpu::timeout_from_secs(v).map(|_| v)
}

impl BpuFlags {
    /// Copies the flags into `opts`.
    pub fn apply(&self, opts: &mut BpuOptions) {
        opts.timeout =
            vlm_bpu::timeout_from_secs(self.bpu_timeout_s).unwrap_or(vlm_bpu::DEFAULT_TIMEOUT);
        opts.pool_check = self.pool_check;
        opts.flush = self.flush;
        opts.prefill_tail = if self.pad_tail {
            vlm_bpu::PrefillTail::Auto
        } else {
            self.prefill_tail
        };
    }
}

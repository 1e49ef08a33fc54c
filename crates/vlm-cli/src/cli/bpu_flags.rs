//! Flags every subcommand that opens a package shares, so each is spelled and checked once.

use clap::Args;
use vlm_bpu::BpuOptions;

#[derive(Debug, Clone, Args)]
pub struct BpuFlags {
    /// Longest wait for one BPU graph call, in seconds. A call that takes longer fails with
    /// an error naming the graph; the process must then exit (the task may still be running).
    #[arg(long, value_name = "SECONDS", default_value_t = vlm_bpu::DEFAULT_TIMEOUT.as_secs_f64(), value_parser = parse_timeout)]
    pub bpu_timeout_s: f64,
}

fn parse_timeout(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{s:?}: {e}"))?;
    vlm_bpu::timeout_from_secs(v).map(|_| v)
}

impl BpuFlags {
    /// Copies the flags into `opts`.
    pub fn apply(&self, opts: &mut BpuOptions) {
        opts.timeout =
            vlm_bpu::timeout_from_secs(self.bpu_timeout_s).unwrap_or(vlm_bpu::DEFAULT_TIMEOUT);
    }
}

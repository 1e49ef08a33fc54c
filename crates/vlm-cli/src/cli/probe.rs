//! `vlm probe <PACKAGE> --log <FILE>`: the step-by-step probe of a package
//! ([`vlm_bpu::probe`]) with every step on disk before it runs.
//!
//! The log is JSON lines: a header `{"event":"probe",...}`, then per step
//! `{"step":NAME,"event":"start"}` and, when the step returned,
//! `{"step":NAME,"event":"end","pass":..,"ms":..,"detail":..}` (the `graphs` step adds
//! `"data"`: every graph's tensors as `vlm check --report --json` shows them). Each line is
//! flushed and `fdatasync`ed before the probe goes on, so when a vendor library kills the
//! process, or hangs the board until a power cycle, the last `start` without an `end` is the
//! step that did it. Stdout gets one line per step for a person. Exits non-zero when a step
//! failed.
//!
//! Test-only: `VLM_PROBE_CRASH_AT=<step>` makes the process die by SIGSEGV right after that
//! step's start line is on disk, so tests can check that a crash leaves the step named.
//! Nothing else reads it; never set it on a board run.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use serde_json::json;

use vlm_bpu::probe::{StepLog, StepOutcome};
use vlm_bpu::BpuOptions;

/// The test-only crash hook (see the module docs).
pub const CRASH_AT_ENV: &str = "VLM_PROBE_CRASH_AT";

#[derive(Debug, Args)]
pub struct ProbeArgs {
    /// Package folder (model.json).
    #[arg(value_name = "PACKAGE")]
    pub package: PathBuf,
    /// The step log (JSON lines), written and synced to disk before each step runs.
    #[arg(long, value_name = "FILE")]
    pub log: PathBuf,
    /// Text only: `visual.hbm` is neither loaded nor called.
    #[arg(long)]
    pub no_vision: bool,
    /// Leave out the prefill graph (and a separate prefill `.hbm`).
    #[arg(long)]
    pub no_prefill_graph: bool,
    /// Board library folder (default: the system search).
    #[arg(long, value_name = "DIR")]
    pub lib_dir: Option<PathBuf>,
    /// Longest wait for one graph call, in seconds.
    #[arg(long, value_name = "SECONDS", default_value_t = vlm_bpu::DEFAULT_TIMEOUT.as_secs_f64(), value_parser = super::bpu_flags::parse_timeout)]
    pub bpu_timeout_s: f64,
}

/// The on-disk step log.
struct DiskLog {
    file: File,
    crash_at: Option<String>,
}

impl DiskLog {
    fn create(path: &Path, header: serde_json::Value) -> anyhow::Result<Self> {
        let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
        let mut log = Self {
            file,
            crash_at: std::env::var(CRASH_AT_ENV).ok().filter(|s| !s.is_empty()),
        };
        log.line(&header)
            .with_context(|| format!("writing {}", path.display()))?;
        // The file's directory entry too: a board that hangs needs a power cycle, and a log
        // whose name was never synced could be gone after it.
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        File::open(dir)
            .and_then(|d| d.sync_all())
            .with_context(|| format!("syncing {}", dir.display()))?;
        Ok(log)
    }

    fn line(&mut self, v: &serde_json::Value) -> std::io::Result<()> {
        let mut text = v.to_string();
        text.push('\n');
        self.file.write_all(text.as_bytes())?;
        self.file.sync_data()
    }
}

impl StepLog for DiskLog {
    fn start(&mut self, step: &str) -> std::io::Result<()> {
        self.line(&json!({"step": step, "event": "start"}))?;
        if self.crash_at.as_deref() == Some(step) {
            crash_by_sigsegv()?;
        }
        Ok(())
    }

    fn end(&mut self, step: &str, outcome: &StepOutcome, ms: f64) -> std::io::Result<()> {
        let mut v = json!({
            "step": step,
            "event": "end",
            "pass": outcome.pass,
            "ms": (ms * 1000.0).round() / 1000.0,
            "detail": outcome.detail,
        });
        if let (Some(data), Some(obj)) = (&outcome.data, v.as_object_mut()) {
            obj.insert("data".into(), data.clone());
        }
        self.line(&v)?;
        let word = if outcome.pass { "pass" } else { "FAIL" };
        let mut out = std::io::stdout().lock();
        writeln!(out, "{step}: {word} ({ms:.1} ms)")?;
        for l in outcome.detail.lines() {
            writeln!(out, "  {l}")?;
        }
        out.flush()
    }
}

/// The test hook: this process dies by SIGSEGV, delivered by `kill` (this crate forbids
/// `unsafe`, so no `raise`). The first SIGSEGV may be taken by the Rust runtime's
/// stack-overflow handler, which sees no guard-page fault, restores the default action and
/// returns; the next one ends the process. It never returns `Ok`.
fn crash_by_sigsegv() -> std::io::Result<()> {
    let pid = std::process::id().to_string();
    for _ in 0..50 {
        // The shell's own `kill`: no procps needed.
        std::process::Command::new("sh")
            .args(["-c", "kill -s SEGV \"$0\"", &pid])
            .status()?;
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(std::io::Error::other(format!(
        "{CRASH_AT_ENV}: SIGSEGV sent to {pid} did not end it"
    )))
}

pub fn run(args: &ProbeArgs) -> anyhow::Result<()> {
    let opts = BpuOptions {
        no_vision: args.no_vision,
        no_prefill_graph: args.no_prefill_graph,
        lib_dir: args.lib_dir.clone(),
        timeout: vlm_bpu::timeout_from_secs(args.bpu_timeout_s).unwrap_or(vlm_bpu::DEFAULT_TIMEOUT),
        ..BpuOptions::default()
    };
    let header = json!({
        "event": "probe",
        "package": args.package,
        "pid": std::process::id(),
        "vlm_version": env!("CARGO_PKG_VERSION"),
    });
    let mut log = DiskLog::create(&args.log, header)?;
    let passed = vlm_bpu::probe::run(&args.package, &opts, &mut log)
        .with_context(|| format!("writing the probe log {}", args.log.display()))?;
    if !passed {
        bail!(
            "a probe step failed (see {} or the lines above)",
            args.log.display()
        );
    }
    Ok(())
}

//! Simulator configuration: memory pool, fault plan, timing model. From the environment or
//! built in code.

use std::time::Duration;

/// Env var: fault plan, e.g. `hbUCPSubmitTask:status=-200003@1*2;hbUCPMallocCached:alloc_fail`.
pub const FAULTS_ENV: &str = "BPU_SIM_FAULTS";
/// Env var: size of the simulated ION carveout in MiB (unset = unlimited).
pub const POOL_ENV: &str = "BPU_SIM_POOL_MB";
/// Env var: timing model, `off`, `s100p`, or `decode=ms,prefill=ms,visual=ms`.
pub const TIMING_ENV: &str = "BPU_SIM_TIMING";
/// Env var: the simulated platform's BPU march (default [`PLATFORM_MARCH`]).
pub const MARCH_ENV: &str = "BPU_SIM_MARCH";
/// The march of the RDK S100P, which the simulator stands for.
pub const PLATFORM_MARCH: &str = "nash-m";
/// Env var: the `virAddr` alignment `hbDNNInferV2` demands of every tensor, in bytes (a power
/// of two; `1` turns the check off). Default [`DEFAULT_VIR_ALIGN`].
pub const VIR_ALIGN_ENV: &str = "BPU_SIM_VIRADDR_ALIGN";
/// Env var: which `hbUCPMemFlush` ranges the simulated library accepts, `range` (default: any
/// range inside one allocation) or `whole` (only whole allocations, [`FlushPolicy::Whole`]).
pub const FLUSH_ENV: &str = "BPU_SIM_FLUSH";
/// Default `virAddr` alignment: no document gives libdnn's number, so the strictest plausible
/// one, a cache line of the S100's Cortex-A78AE.
pub const DEFAULT_VIR_ALIGN: u64 = 64;

/// What an injected fault does.
#[derive(Debug, Clone, PartialEq)]
pub enum FaultAction {
    /// The call returns this status (must be a code from the hbUCP tables).
    Status(i32),
    /// `hbUCPWaitTaskDone` (or the call named) reports `HB_UCP_TASK_TIMEOUT`.
    Timeout,
    /// An allocation (`hbUCPMallocCached`, or a model load) fails with `HB_UCP_MEM_ALLOC_FAIL`.
    AllocFail,
    /// The task takes this much longer (applies at submit; waits see it).
    Slow(Duration),
    /// The entry point panics (tests the panic boundary: the call returns `HB_UCP_UNKNOWN`).
    Panic,
    /// Before the call runs, the CPU cache writes back every dirty line of every buffer (bytes
    /// the CPU wrote and never CLEANed), as hardware may at any moment; the call itself then
    /// runs normally.
    Evict,
}

/// One rule: `action` on calls to `call`, after `skip` unaffected calls, `times` times (None =
/// every call from then on).
#[derive(Debug, Clone, PartialEq)]
pub struct FaultRule {
    pub call: String,
    pub action: FaultAction,
    pub skip: u32,
    pub times: Option<u32>,
    seen: u32,
    fired: u32,
}

impl FaultRule {
    /// A rule that fires on the next call and every one after.
    pub fn new(call: &str, action: FaultAction) -> Self {
        Self {
            call: call.to_owned(),
            action,
            skip: 0,
            times: None,
            seen: 0,
            fired: 0,
        }
    }

    /// Lets `n` calls pass first.
    pub fn after(mut self, n: u32) -> Self {
        self.skip = n;
        self
    }

    /// Fires at most `n` times.
    pub fn times(mut self, n: u32) -> Self {
        self.times = Some(n);
        self
    }

    /// Counts a call; returns the action when this call is hit.
    fn hit(&mut self, call: &str) -> Option<FaultAction> {
        if self.call != call {
            return None;
        }
        self.seen += 1;
        if self.seen <= self.skip || self.times.is_some_and(|t| self.fired >= t) {
            return None;
        }
        self.fired += 1;
        Some(self.action.clone())
    }
}

/// Errors in a textual fault plan or timing spec.
#[derive(Debug, thiserror::Error)]
#[error("{var}: cannot parse {text:?}: {reason}")]
pub struct ConfigError {
    pub var: &'static str,
    pub text: String,
    pub reason: String,
}

/// The ordered set of fault rules.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FaultPlan {
    pub rules: Vec<FaultRule>,
}

const KNOWN_STATUSES: &[i32] = &[
    -100001, -100002, -100003, -100004, -200001, -200002, -200003, -200004, -400001, -400002,
    -400003, -400004, -400005, -400006, -400007, -500001, -600001, -600002, -600003, -600004,
];

impl FaultPlan {
    /// Parses `rule;rule…`, rule = `<symbol>:<action>[@<skip>][*<times>]`, action =
    /// `status=<code>` | `timeout` | `alloc_fail` | `slow=<ms>` | `panic` | `evict`.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let err = |reason: String| ConfigError {
            var: FAULTS_ENV,
            text: text.to_owned(),
            reason,
        };
        let mut rules = Vec::new();
        for raw in text.split(';').map(str::trim).filter(|s| !s.is_empty()) {
            let (call, rest) = raw
                .split_once(':')
                .ok_or_else(|| err(format!("{raw:?} lacks ':'")))?;
            if !hbdnn_sys::entry_points().iter().any(|(n, _)| *n == call) {
                return Err(err(format!("{call:?} is not an entry point")));
            }
            let (rest, times) = match rest.split_once('*') {
                Some((r, t)) => (
                    r,
                    Some(
                        t.parse::<u32>()
                            .map_err(|e| err(format!("times {t:?}: {e}")))?,
                    ),
                ),
                None => (rest, None),
            };
            let (action, skip) = match rest.split_once('@') {
                Some((a, s)) => (
                    a,
                    s.parse::<u32>()
                        .map_err(|e| err(format!("skip {s:?}: {e}")))?,
                ),
                None => (rest, 0),
            };
            let action = match action.split_once('=') {
                Some(("status", v)) => {
                    let code = v
                        .parse::<i32>()
                        .map_err(|e| err(format!("status {v:?}: {e}")))?;
                    if !KNOWN_STATUSES.contains(&code) {
                        return Err(err(format!("status {code} is not in the hbUCP tables")));
                    }
                    FaultAction::Status(code)
                }
                Some(("slow", v)) => FaultAction::Slow(Duration::from_millis(
                    v.parse::<u64>()
                        .map_err(|e| err(format!("slow {v:?}: {e}")))?,
                )),
                None if action == "timeout" => FaultAction::Timeout,
                None if action == "alloc_fail" => FaultAction::AllocFail,
                None if action == "panic" => FaultAction::Panic,
                None if action == "evict" => FaultAction::Evict,
                _ => return Err(err(format!("unknown action {action:?}"))),
            };
            rules.push(FaultRule {
                call: call.to_owned(),
                action,
                skip,
                times,
                seen: 0,
                fired: 0,
            });
        }
        Ok(Self { rules })
    }

    /// Counts a call against every rule; the first rule that fires wins.
    pub(crate) fn hit(&mut self, call: &str) -> Option<FaultAction> {
        let mut out = None;
        for r in &mut self.rules {
            let a = r.hit(call);
            if out.is_none() {
                out = a;
            }
        }
        out
    }
}

/// Which ranges `hbUCPMemFlush` accepts. No document says whether libhbucp takes a range
/// inside an allocation (BLLM only ever flushes whole ones), so the simulator can stand for
/// either library.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FlushPolicy {
    /// Any range inside one allocation.
    #[default]
    Range,
    /// Only a whole allocation (the `phyAddr`, `virAddr` and `memSize` it was allocated
    /// with); any other range fails with `HB_UCP_INVALID_ARGUMENT` and flushes nothing.
    Whole,
}

impl FlushPolicy {
    /// Parses `range` or `whole` (empty = `range`, as when the variable is unset).
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        match text.trim() {
            "" | "range" => Ok(Self::Range),
            "whole" => Ok(Self::Whole),
            other => Err(ConfigError {
                var: FLUSH_ENV,
                text: text.to_owned(),
                reason: format!("{other:?} is not `range` or `whole`"),
            }),
        }
    }
}

/// Sleeps per graph run, standing for the measured S100P latencies.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct TimingModel {
    /// Per decode-graph run.
    pub decode: Duration,
    /// Per prefill-graph run (one chunk).
    pub prefill: Duration,
    /// Per vision-tower run.
    pub visual: Duration,
    /// Replace `decode`/`prefill` by [`TimingModel::s100p`] of each text graph's hidden size
    /// (the package size), as `BPU_SIM_TIMING=s100p` does.
    pub by_package_size: bool,
}

impl TimingModel {
    /// Latencies derived from docs/package-contract.md §10.4 for a model of text hidden size `hidden`:
    /// decode = 1 / published tok/s of the ctx4k package of that size (0.8B 18.52, 2B 13.20,
    /// 4B 6.14 tok/s); prefill chunk: 4B = the measured full 32-row chunk of the published
    /// ctx4k package (739 ms, seed package, 2026-11 update table), smaller sizes = 32 rows at
    /// 1/76 of the 0.8B stepping cost (68.5 ms) scaled by the decode ratio (inferred; the 4B
    /// measurement shows this scaling underestimates large models ~8×); tower 0.36 s (the
    /// 448 px measurement, an upper bound for 320 px).
    pub fn s100p(hidden: usize) -> Self {
        let tps = match hidden {
            0..=1024 => 18.52,
            1025..=2048 => 13.20,
            _ => 6.14,
        };
        let decode = 1.0 / tps;
        let ratio = decode / (1.0 / 18.52);
        let prefill = if hidden > 2048 {
            0.739
        } else {
            32.0 * (0.0685 / 76.0) * ratio
        };
        Self {
            decode: Duration::from_secs_f64(decode),
            prefill: Duration::from_secs_f64(prefill),
            visual: Duration::from_secs_f64(0.36),
            by_package_size: false,
        }
    }

    /// Parses `off`, `s100p` (4B numbers) or `decode=ms,prefill=ms,visual=ms`.
    pub fn parse(text: &str) -> Result<Option<Self>, ConfigError> {
        let err = |reason: String| ConfigError {
            var: TIMING_ENV,
            text: text.to_owned(),
            reason,
        };
        match text.trim() {
            "" | "off" => return Ok(None),
            "s100p" => {
                return Ok(Some(Self {
                    by_package_size: true,
                    ..Self::s100p(2560)
                }))
            }
            _ => {}
        }
        let mut t = Self::default();
        for kv in text.split(',') {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| err(format!("{kv:?} lacks '='")))?;
            let ms = v
                .trim()
                .parse::<f64>()
                .map_err(|e| err(format!("{v:?}: {e}")))?;
            let d = Duration::from_secs_f64(ms.max(0.0) / 1000.0);
            match k.trim() {
                "decode" => t.decode = d,
                "prefill" => t.prefill = d,
                "visual" => t.visual = d,
                other => return Err(err(format!("unknown graph {other:?}"))),
            }
        }
        Ok(Some(t))
    }
}

/// Everything configurable about one simulator instance.
#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    /// ION carveout size in bytes (`None` = unlimited). Model files and buffers draw from it.
    pub pool_bytes: Option<u64>,
    pub faults: FaultPlan,
    pub timing: Option<TimingModel>,
    /// Platform march (`None` = [`PLATFORM_MARCH`]); containers compiled for another are
    /// refused at load with `HB_UCP_MODEL_INCOMPATIBLE`, as hbDNN does.
    pub march: Option<String>,
    /// Alignment in bytes `hbDNNInferV2` demands of every tensor's `virAddr` (a power of two;
    /// 1 = any address). Default [`DEFAULT_VIR_ALIGN`]; env [`VIR_ALIGN_ENV`].
    pub vir_align: u64,
    /// Which flush ranges are accepted; env [`FLUSH_ENV`].
    pub flush: FlushPolicy,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            pool_bytes: None,
            faults: FaultPlan::default(),
            timing: None,
            march: None,
            vir_align: DEFAULT_VIR_ALIGN,
            flush: FlushPolicy::Range,
        }
    }
}

impl SimConfig {
    /// Reads `BPU_SIM_POOL_MB`, `BPU_SIM_FAULTS`, `BPU_SIM_TIMING`, `BPU_SIM_MARCH`,
    /// `BPU_SIM_VIRADDR_ALIGN`, `BPU_SIM_FLUSH`.
    pub fn from_env() -> Result<Self, ConfigError> {
        let mut c = Self::default();
        if let Ok(v) = std::env::var(POOL_ENV) {
            let mb = v.trim().parse::<u64>().map_err(|e| ConfigError {
                var: POOL_ENV,
                text: v.clone(),
                reason: e.to_string(),
            })?;
            c.pool_bytes = Some(mb << 20);
        }
        if let Ok(v) = std::env::var(FAULTS_ENV) {
            c.faults = FaultPlan::parse(&v)?;
        }
        if let Ok(v) = std::env::var(TIMING_ENV) {
            c.timing = TimingModel::parse(&v)?;
        }
        if let Ok(v) = std::env::var(MARCH_ENV) {
            c.march = Some(v.trim().to_owned());
        }
        if let Ok(v) = std::env::var(VIR_ALIGN_ENV) {
            c.vir_align = parse_align(&v)?;
        }
        if let Ok(v) = std::env::var(FLUSH_ENV) {
            c.flush = FlushPolicy::parse(&v)?;
        }
        Ok(c)
    }

    /// The defaults with the flush policy of `BPU_SIM_FLUSH` (unset: `range`): what test
    /// suites build their simulators with, so that a suite reruns against a library that
    /// flushes only whole allocations while every other setting stays fixed.
    pub fn defaults_with_env_flush() -> Result<Self, ConfigError> {
        let flush = match std::env::var(FLUSH_ENV) {
            Ok(v) => FlushPolicy::parse(&v)?,
            Err(_) => FlushPolicy::Range,
        };
        Ok(Self {
            flush,
            ..Self::default()
        })
    }

    /// The platform march this configuration simulates.
    pub fn platform_march(&self) -> &str {
        self.march.as_deref().unwrap_or(PLATFORM_MARCH)
    }
}

/// Parses a `virAddr` alignment: a power of two in bytes.
pub fn parse_align(text: &str) -> Result<u64, ConfigError> {
    let err = |reason: String| ConfigError {
        var: VIR_ALIGN_ENV,
        text: text.to_owned(),
        reason,
    };
    let v = text.trim().parse::<u64>().map_err(|e| err(e.to_string()))?;
    if !v.is_power_of_two() || v > 1 << 20 {
        return Err(err("not a power of two in 1..=1048576".into()));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fault_plan_grammar() {
        let p = FaultPlan::parse("hbUCPSubmitTask:status=-200003@1*2; hbUCPMallocCached:alloc_fail;hbUCPWaitTaskDone:slow=25").unwrap();
        assert_eq!(p.rules.len(), 3);
        assert_eq!(p.rules[0].action, FaultAction::Status(-200003));
        assert_eq!((p.rules[0].skip, p.rules[0].times), (1, Some(2)));
        assert_eq!(
            p.rules[2].action,
            FaultAction::Slow(Duration::from_millis(25))
        );
        assert!(FaultPlan::parse("hbFoo:timeout").is_err());
        assert!(FaultPlan::parse("hbUCPSubmitTask:status=-7").is_err());
        assert!(FaultPlan::parse("hbUCPSubmitTask:explode").is_err());
        let e = FaultPlan::parse("hbUCPSubmitTask:evict@2*1").unwrap();
        assert_eq!(e.rules[0].action, FaultAction::Evict);
        assert_eq!((e.rules[0].skip, e.rules[0].times), (2, Some(1)));
    }

    #[test]
    fn vir_align_setting() {
        assert_eq!(SimConfig::default().vir_align, 64);
        assert_eq!(parse_align("4096").unwrap(), 4096);
        assert_eq!(parse_align(" 1 ").unwrap(), 1);
        for bad in ["0", "48", "-64", "x", "2097152"] {
            let e = parse_align(bad).unwrap_err();
            assert!(e.to_string().contains(VIR_ALIGN_ENV), "{e}");
        }
    }

    #[test]
    fn flush_setting() {
        assert_eq!(SimConfig::default().flush, FlushPolicy::Range);
        assert_eq!(FlushPolicy::parse("whole").unwrap(), FlushPolicy::Whole);
        assert_eq!(FlushPolicy::parse(" range ").unwrap(), FlushPolicy::Range);
        assert_eq!(FlushPolicy::parse("").unwrap(), FlushPolicy::Range);
        for bad in ["Whole", "all", "partial"] {
            let e = FlushPolicy::parse(bad).unwrap_err();
            assert!(e.to_string().contains(FLUSH_ENV), "{e}");
            assert!(e.to_string().contains(bad), "{e}");
        }
    }

    #[test]
    fn rule_skip_and_times() {
        let mut p = FaultPlan {
            rules: vec![FaultRule::new("hbUCPSubmitTask", FaultAction::Timeout)
                .after(1)
                .times(2)],
        };
        let hits: Vec<bool> = (0..5).map(|_| p.hit("hbUCPSubmitTask").is_some()).collect();
        assert_eq!(hits, vec![false, true, true, false, false]);
        assert!(p.hit("hbUCPFree").is_none());
    }

    #[test]
    fn timing_spec() {
        assert_eq!(TimingModel::parse("off").unwrap(), None);
        let t = TimingModel::parse("decode=10,prefill=20.5,visual=0")
            .unwrap()
            .unwrap();
        assert_eq!(t.decode, Duration::from_millis(10));
        let auto = TimingModel::parse("s100p").unwrap().unwrap();
        assert!(auto.by_package_size);
        let small = TimingModel::s100p(1024);
        assert!((small.decode.as_secs_f64() - 1.0 / 18.52).abs() < 1e-9);
        let s = TimingModel::s100p(2560);
        assert!((s.decode.as_secs_f64() - 1.0 / 6.14).abs() < 1e-9);
        assert!((s.prefill.as_secs_f64() - 0.739).abs() < 1e-9);
        assert!(TimingModel::parse("decode").is_err());
    }
}

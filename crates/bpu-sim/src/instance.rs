//! [`Sim`]: the shared handle of one simulator instance, the calling thread's current one,
//! and the settings and counters tests reach through it.

use std::sync::{Arc, Mutex, MutexGuard};

use hbdnn_sys as sys;

use crate::config::{FaultPlan, FaultRule, FlushPolicy, SimConfig, TimingModel};
use crate::state::{SimState, SimStats};

/// A simulator instance. Cheap to clone (shared). The C entry points act on the instance
/// installed on the calling thread ([`Sim::install`]), or a per-thread one built from the
/// environment on first use.
#[derive(Clone)]
pub struct Sim(Arc<Mutex<SimState>>);

impl std::fmt::Debug for Sim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Sim").field(&self.stats()).finish()
    }
}

thread_local! {
    static CURRENT: std::cell::RefCell<Option<Sim>> = const { std::cell::RefCell::new(None) };
}

impl Sim {
    /// A fresh instance.
    pub fn new(config: SimConfig) -> Self {
        Self(Arc::new(Mutex::new(SimState::new(config))))
    }

    /// The calling thread's instance; created from the environment on first use (an invalid
    /// environment is logged and ignored; [`crate::table`] reports it as an error instead).
    pub fn current() -> Self {
        CURRENT.with(|c| {
            c.borrow_mut()
                .get_or_insert_with(|| {
                    let cfg = SimConfig::from_env().unwrap_or_else(|e| {
                        tracing::error!(error = %e, "bpu-sim: ignoring invalid environment");
                        SimConfig::default()
                    });
                    Sim::new(cfg)
                })
                .clone()
        })
    }

    /// Makes this instance the calling thread's one (e.g. on an engine thread).
    pub fn install(&self) {
        CURRENT.with(|c| *c.borrow_mut() = Some(self.clone()));
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, SimState> {
        // A panic inside an entry point is caught at the boundary; the state stays usable.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counters.
    pub fn stats(&self) -> SimStats {
        self.lock().stats
    }

    /// Tasks submitted so far per hbUCP priority (`hbUCPSubmitTask`'s `priority`).
    pub fn submits_by_priority(&self) -> std::collections::BTreeMap<u8, u64> {
        self.lock().submits_by_priority.clone()
    }

    /// Replaces the fault plan.
    pub fn set_faults(&self, plan: FaultPlan) {
        self.lock().config.faults = plan;
    }

    /// Adds one fault rule.
    pub fn add_fault(&self, rule: FaultRule) {
        self.lock().config.faults.rules.push(rule);
    }

    /// Pool size in bytes (`None` = unlimited).
    pub fn pool_bytes(&self) -> Option<u64> {
        self.lock().config.pool_bytes
    }

    /// Bytes still free in the pool (`None` = unlimited).
    pub fn pool_available(&self) -> Option<u64> {
        let st = self.lock();
        st.config
            .pool_bytes
            .map(|l| l.saturating_sub(st.stats.pool_used))
    }

    /// The platform march this instance simulates.
    pub fn platform_march(&self) -> String {
        self.lock().config.platform_march().to_owned()
    }

    /// Sets the platform march (`None` = the S100P's).
    pub fn set_march(&self, march: Option<String>) {
        self.lock().config.march = march;
    }

    /// Sets the pool size (`None` = unlimited).
    pub fn set_pool(&self, bytes: Option<u64>) {
        self.lock().config.pool_bytes = bytes;
    }

    /// Sets the timing model.
    pub fn set_timing(&self, timing: Option<TimingModel>) {
        self.lock().config.timing = timing;
    }

    /// Sets the `virAddr` alignment `hbDNNInferV2` demands (bytes, a power of two; 1 = any).
    pub fn set_vir_align(&self, bytes: u64) {
        self.lock().config.vir_align = bytes.max(1);
    }

    /// Sets which flush ranges `hbUCPMemFlush` accepts ([`FlushPolicy`], `BPU_SIM_FLUSH`).
    pub fn set_flush(&self, policy: FlushPolicy) {
        self.lock().config.flush = policy;
    }

    /// Evicts now: writes back every dirty cache line of every buffer (what the CPU wrote and
    /// never CLEANed); returns how many lines moved. [`crate::FaultAction::Evict`] does the same at a
    /// call of the fault plan's choosing.
    pub fn evict(&self) -> usize {
        self.lock().evict()
    }

    /// The device copy of the buffer at `phy` (for tests that inspect what the BPU sees).
    pub fn device_bytes(&self, phy: u64, len: usize) -> Option<Vec<u8>> {
        let mut st = self.lock();
        let m = sys::hbUCPSysMem {
            phyAddr: phy,
            virAddr: std::ptr::null_mut(),
            memSize: len as u64,
        };
        let (_, buf) = st.buffers.range_mut(..=m.phyAddr).next_back()?;
        let off = (phy - buf.phy) as usize;
        buf.device.get(off..off + len).map(<[u8]>::to_vec)
    }
}

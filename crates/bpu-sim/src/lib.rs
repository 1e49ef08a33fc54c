//! A CPU simulator of the hbDNN/hbUCP C ABI (RDK S100P), running the BLLM package contract.
//!
//! Every entry point the runtime calls is an `unsafe extern "C"` function here ([`ffi`]), with
//! a panic boundary, status codes from the hbUCP tables only and a TRACE event per call. They
//! fill the `hbdnn-sys` function table ([`table`]), so the runtime's board code path — FFI,
//! buffers, strides, flushes, graph I/O by index, ping-pong caches — runs unchanged.
//!
//! Board behaviours modelled:
//! - separate host and device copies of every buffer, coherent only through `hbUCPMemFlush`
//!   in whole 64-byte cache lines ([`CACHE_LINE`]): a missing CLEAN or INVALIDATE yields stale
//!   bytes, a partial INVALIDATE discards the CPU's unflushed bytes in the whole line, and the
//!   fault `evict` ([`FaultAction::Evict`], or [`Sim::evict`]) writes back lines the CPU wrote
//!   and never CLEANed; fresh allocations are dirty ([`DIRTY_BYTE`]) and page-aligned; a
//!   library that flushes only whole allocations (`BPU_SIM_FLUSH=whole`, [`FlushPolicy`]:
//!   any other range is `HB_UCP_INVALID_ARGUMENT`);
//! - what libdnn checks at `hbDNNInferV2` (tensor type and `validShape` equal to the model's,
//!   every stride resolved, at least tight, 32-byte aligned where the model leaves it open and
//!   equal to the model's where it fixes it, `virAddr` aligned to [`SimConfig::vir_align`] —
//!   64 bytes by default, `BPU_SIM_VIRADDR_ALIGN` — and `memSize` large enough): a violation
//!   is `HB_UCP_INVALID_ARGUMENT` with a WARN in libdnn's words;
//! - padded row strides on multi-row tensors, or graphs reporting `-1` strides and
//!   `alignedByteSize` `-1` (the runtime picks the layout), per-axis scales (`scaleLen > 1`,
//!   `quantizeAxis`), towers of rank 3 ([`package::PackageOptions`]);
//! - a configurable ION pool whose exhaustion fails allocation and model load, a fault plan
//!   (status codes, timeouts, allocation failures, slow tasks, evictions; `BPU_SIM_FAULTS` or
//!   [`Sim::add_fault`]), counters of live buffers/tasks/handles, an optional timing model
//!   (`BPU_SIM_TIMING`) and the platform march (`BPU_SIM_MARCH`).
//!
//! Which implementation runs is decided by the package's files ([`inspect_package`]): sim
//! containers ([`container`]) run here, real `.hbm` files on the board libraries.
//!
//! Must not depend on: `hbdnn`, `vlm` (it sits beside the wrapper, under the same table).
//!
//! ```
//! let table = bpu_sim::table().expect("valid environment");
//! assert_eq!(table.source().to_string(), "bpu-sim");
//! ```

pub mod config;
pub mod container;
pub mod detect;
#[allow(non_snake_case)]
pub mod ffi;
pub mod graphs;
mod infer_check;
mod instance;
mod kernels;
mod memory;
pub mod package;
pub mod pads;
mod state;
mod status;

pub use config::{
    ConfigError, FaultAction, FaultPlan, FaultRule, FlushPolicy, SimConfig, TimingModel,
};
pub use container::{
    Container, ContainerError, GraphDesc, GraphKind, LogitsType, PadLayout, TensorDesc, TextParams,
    VisualParams,
};
pub use detect::{classify, inspect_package, DetectError, Implementation};
pub use instance::Sim;
pub use memory::{CACHE_LINE, DIRTY_BYTE};
pub use pads::{PadMask, PadRope};
pub use state::SimStats;

/// The simulator's function table. Validates the `BPU_SIM_*` environment first, so a bad
/// fault plan is an error here rather than a silently ignored setting.
pub fn table() -> Result<hbdnn_sys::FnTable, SimTableError> {
    SimConfig::from_env()?;
    Ok(hbdnn_sys::FnTable::from_raw(ffi::raw_table(), "bpu-sim")?)
}

/// Why [`table`] failed.
#[derive(Debug, thiserror::Error)]
pub enum SimTableError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Table(#[from] hbdnn_sys::LoadError),
}

//! A CPU simulator of the hbDNN/hbUCP C ABI (RDK S100P), running the BLLM package contract.
//!
//! Every entry point the runtime calls is an `unsafe extern "C"` function here ([`ffi`]), with
//! a panic boundary, status codes from the hbUCP tables only and a TRACE event per call. They
//! fill the `hbdnn-sys` function table ([`table`]), so the runtime's board code path — FFI,
//! buffers, strides, flushes, graph I/O by index, ping-pong caches — runs unchanged.
//!
//! Board behaviours modelled: separate host and device copies of every buffer (a missing
//! CLEAN or INVALIDATE yields stale bytes; fresh allocations are dirty), padded row strides on
//! multi-row tensors, a configurable ION pool whose exhaustion fails allocation and model load,
//! a fault plan (status codes, timeouts, allocation failures, slow tasks; `BPU_SIM_FAULTS` or
//! [`Sim::add_fault`]), counters of live buffers/tasks/handles, and an optional timing model.
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
mod kernels;
pub mod package;
mod state;

pub use config::{ConfigError, FaultAction, FaultPlan, FaultRule, SimConfig, TimingModel};
pub use container::{
    Container, ContainerError, GraphDesc, GraphKind, LogitsType, TensorDesc, TextParams,
    VisualParams,
};
pub use detect::{classify, inspect_package, DetectError, Implementation};
pub use state::{Sim, SimStats, DIRTY_BYTE};

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

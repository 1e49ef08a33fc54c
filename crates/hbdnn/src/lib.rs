//! Safe wrapper over the hbDNN/hbUCP function table of `hbdnn-sys`.
//!
//! [`Runtime`] owns a function table (board libraries or the simulator — the caller decides);
//! [`PackedModel`] owns a packed handle of one or more `.hbm` files; [`Graph`] describes one
//! graph's inputs and outputs as [`TensorSpec`]s (strides with `-1` resolved using 32-byte
//! alignment) and runs it; [`DeviceBuffer`] owns one cached device allocation. Every C status
//! passes through one conversion point into [`Error`].
//!
//! Release order follows from ownership: a buffer allocated for a graph keeps its packed
//! handle alive, a task never outlives [`Graph::run`], and the packed handle is released when
//! its last graph or buffer is gone. Handles are `Rc`-based, hence neither `Send` nor `Sync`:
//! one engine thread owns them.
//!
//! Modules (private; everything public is re-exported at the crate root):
//! - `runtime` — the function table, versions, status checks, loading and plain allocations;
//! - `model` — [`PackedModel`] and its graph list;
//! - `tensor` — [`DType`], [`TensorSpec`] and stride resolution;
//! - `graph` — [`Graph`], [`Sched`] and the task of one run;
//! - `buffer` — [`DeviceBuffer`]: host view, clean/invalidate, row and tensor copies;
//! - `flush` — [`FlushMode`]: whether range flushes reach the library as ranges or as whole
//!   allocations, and the probe that finds out;
//! - `error` — [`Error`], [`Status`], [`Side`];
//! - `memory` — [`device_bytes_held`]: the device memory the process holds.
//!
//! Must not depend on: `bpu-sim`, `vlm`, `qwen35` (the simulator is reached only through the
//! function table; `bpu-sim` and `qwen35` are dev-dependencies of the tests only). Normal
//! dependencies stay at `hbdnn-sys`, `bytemuck`, `thiserror` and `tracing`.
//!
//! ```
//! // A [2, 3, 5] f32 tensor reported with dense (-1) strides: rows of 20 bytes get a
//! // 32-byte pitch, planes 3 × 32 bytes.
//! let s = hbdnn::resolve_strides(&[2, 3, 5], &[-1, -1, -1], Some(4));
//! assert_eq!(s, Some(vec![96, 32, 4]));
//! ```

mod buffer;
mod error;
mod flush;
mod graph;
mod memory;
mod model;
mod runtime;
mod tensor;

pub use buffer::DeviceBuffer;
pub use error::{Error, Side, Status};
pub use flush::{FlushMode, FlushProbe};
pub use graph::{Graph, Sched};
pub use hbdnn_sys::{FnTable, MappedLibrary, TableSource, LIBDNN, LIBHBUCP};
pub use memory::device_bytes_held;
pub use model::PackedModel;
pub use runtime::{Runtime, Versions};
pub use tensor::{align_up, resolve_strides, DType, TensorSpec, STRIDE_ALIGN};

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

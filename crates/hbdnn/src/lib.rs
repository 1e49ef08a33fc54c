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
//! Must not depend on: `bpu-sim`, `vlm`, `qwen35` (the simulator is reached only through the
//! function table).
//!
//! ```
//! // A [2, 3, 5] f32 tensor reported with dense (-1) strides: rows of 20 bytes get a
//! // 32-byte pitch, planes 3 × 32 bytes.
//! let s = hbdnn::resolve_strides(&[2, 3, 5], &[-1, -1, -1], Some(4));
//! assert_eq!(s, Some(vec![96, 32, 4]));
//! ```

mod error;

pub use error::{Error, Side, Status};
pub use hbdnn_sys::{FnTable, TableSource};

use std::ffi::{c_char, CStr, CString};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use hbdnn_sys as sys;

/// Result alias of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Row and plane strides are aligned to this many bytes when the graph reports `-1`.
pub const STRIDE_ALIGN: usize = 32;

/// Calls an entry of the validated table.
macro_rules! ffi {
    ($rt:expr, $f:ident) => {
        $rt.table
            .raw()
            .$f
            .expect("FnTable checks every entry at construction")
    };
}

struct RtInner {
    table: FnTable,
}

impl RtInner {
    /// The one conversion point from a C status to a `Result`.
    fn check(&self, call: &'static str, code: i32) -> Result<()> {
        if code == sys::HB_UCP_SUCCESS {
            return Ok(());
        }
        let status = Status::from_code(code);
        let description = self.describe(code);
        tracing::debug!(call, code, %description, "hbDNN/hbUCP call failed");
        Err(Error::Call {
            call,
            status,
            description,
        })
    }

    fn describe(&self, code: i32) -> String {
        // SAFETY: hbUCPGetErrorDesc takes any integer and returns a static string or null.
        let p = unsafe { ffi!(self, hbUCPGetErrorDesc)(code) };
        // SAFETY: a non-null result is a NUL-terminated string owned by the library.
        unsafe { c_string(p) }.unwrap_or_else(|| format!("no description for status {code}"))
    }
}

/// Copies a C string; `None` for null.
///
/// # Safety
/// `p` is null or points to a NUL-terminated string valid for the duration of the call.
unsafe fn c_string(p: *const c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: guaranteed by the caller.
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// Runtime version strings, logged once at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versions {
    pub dnn: String,
    pub ucp: String,
    pub soc: String,
}

/// The entry point: a function table plus the calls that need no model.
#[derive(Clone)]
pub struct Runtime {
    inner: Rc<RtInner>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("source", self.inner.table.source())
            .finish()
    }
}

impl Runtime {
    /// Wraps a table and logs the runtime versions.
    pub fn new(table: FnTable) -> Self {
        let rt = Self {
            inner: Rc::new(RtInner { table }),
        };
        let v = rt.versions();
        tracing::info!(
            source = %rt.inner.table.source(),
            dnn = %v.dnn, ucp = %v.ucp, soc = %v.soc,
            "hbDNN runtime ready"
        );
        rt
    }

    /// Loads the board libraries (`libdnn.so`, `libhbucp.so`) from `lib_dir` or the default.
    pub fn board(lib_dir: Option<&Path>) -> Result<Self> {
        Ok(Self::new(FnTable::load_board(lib_dir)?))
    }

    /// Where the table comes from.
    pub fn source(&self) -> &TableSource {
        self.inner.table.source()
    }

    /// hbDNN, hbUCP and SoC version strings.
    pub fn versions(&self) -> Versions {
        let rt = &self.inner;
        // SAFETY: the version getters take no arguments and return static strings or null.
        let (dnn, ucp, soc) = unsafe {
            (
                c_string(ffi!(rt, hbDNNGetVersion)()),
                c_string(ffi!(rt, hbUCPGetVersion)()),
                c_string(ffi!(rt, hbUCPGetSocName)()),
            )
        };
        let unknown = || "unknown".to_owned();
        Versions {
            dnn: dnn.unwrap_or_else(unknown),
            ucp: ucp.unwrap_or_else(unknown),
            soc: soc.unwrap_or_else(unknown),
        }
    }

    /// The runtime's description of a status code.
    pub fn describe(&self, code: i32) -> String {
        self.inner.describe(code)
    }

    /// Loads `.hbm` files into one packed handle and lists its graphs.
    pub fn load<P: AsRef<Path>>(&self, files: &[P]) -> Result<PackedModel> {
        let files: Vec<PathBuf> = files.iter().map(|p| p.as_ref().to_path_buf()).collect();
        let wrap = |e: Error| Error::Load {
            files: files.clone(),
            source: Box::new(e),
        };
        let c_files = files
            .iter()
            .map(|p| {
                p.to_str()
                    .and_then(|s| CString::new(s).ok())
                    .ok_or_else(|| Error::BadCString {
                        what: "model path",
                        value: p.display().to_string(),
                    })
            })
            .collect::<Result<Vec<_>>>()
            .map_err(wrap)?;
        let mut ptrs: Vec<*const c_char> = c_files.iter().map(|c| c.as_ptr()).collect();
        let count = i32::try_from(ptrs.len()).map_err(|_| {
            wrap(Error::BadCString {
                what: "file count",
                value: ptrs.len().to_string(),
            })
        })?;
        let rt = &self.inner;
        let mut handle: sys::hbDNNPackedHandle_t = std::ptr::null_mut();
        // SAFETY: `handle` is a valid out-pointer; `ptrs` holds `count` NUL-terminated paths
        // that outlive the call.
        let code =
            unsafe { ffi!(rt, hbDNNInitializeFromFiles)(&mut handle, ptrs.as_mut_ptr(), count) };
        rt.check("hbDNNInitializeFromFiles", code).map_err(wrap)?;
        // From here on the handle is owned, so an error below releases it.
        let mut inner = PackedInner {
            rt: self.inner.clone(),
            handle,
            files: files.clone(),
            names: Vec::new(),
        };
        inner.names = inner.list_names().map_err(wrap)?;
        tracing::info!(files = ?files, graphs = ?inner.names, "packed model loaded");
        Ok(PackedModel {
            inner: Rc::new(inner),
        })
    }

    /// A cached device allocation of `size` bytes, zero-filled and cleaned.
    pub fn alloc(&self, size: usize) -> Result<DeviceBuffer> {
        DeviceBuffer::alloc(self.inner.clone(), size, None)
    }
}

struct PackedInner {
    rt: Rc<RtInner>,
    handle: sys::hbDNNPackedHandle_t,
    files: Vec<PathBuf>,
    names: Vec<String>,
}

impl PackedInner {
    fn list_names(&self) -> Result<Vec<String>> {
        let rt = &self.rt;
        let mut names: *mut *const c_char = std::ptr::null_mut();
        let mut count = 0i32;
        // SAFETY: valid out-pointers and a live packed handle.
        let code = unsafe { ffi!(rt, hbDNNGetModelNameList)(&mut names, &mut count, self.handle) };
        rt.check("hbDNNGetModelNameList", code)?;
        if count > 0 && names.is_null() {
            return Err(Error::NullPointer {
                call: "hbDNNGetModelNameList",
            });
        }
        let mut out = Vec::new();
        for i in 0..usize::try_from(count).unwrap_or(0) {
            // SAFETY: the list holds `count` entries owned by the packed handle; copied now.
            let name = unsafe { c_string(*names.add(i)) }.ok_or(Error::NullPointer {
                call: "hbDNNGetModelNameList",
            })?;
            out.push(name);
        }
        Ok(out)
    }
}

impl Drop for PackedInner {
    fn drop(&mut self) {
        let rt = &self.rt;
        // SAFETY: the handle came from hbDNNInitializeFromFiles and is released once, after
        // every graph and buffer that referenced it (they hold this Rc).
        let code = unsafe { ffi!(rt, hbDNNRelease)(self.handle) };
        if let Err(e) = rt.check("hbDNNRelease", code) {
            tracing::warn!(files = ?self.files, error = %e, "releasing packed model failed");
        }
    }
}

/// One packed handle over one or more `.hbm` files.
#[derive(Clone)]
pub struct PackedModel {
    inner: Rc<PackedInner>,
}

impl std::fmt::Debug for PackedModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackedModel")
            .field("files", &self.inner.files)
            .field("graphs", &self.inner.names)
            .finish()
    }
}

impl PackedModel {
    /// Graph names in the packed handle (copied at load).
    pub fn graph_names(&self) -> &[String] {
        &self.inner.names
    }

    /// The files this handle was loaded from.
    pub fn files(&self) -> &[PathBuf] {
        &self.inner.files
    }

    /// True when the handle carries a graph of this name.
    pub fn has_graph(&self, name: &str) -> bool {
        self.inner.names.iter().any(|n| n == name)
    }

    /// Opens a graph by name and reads its input/output specs. The name list is consulted
    /// first, so a missing graph never reaches the runtime (which logs an error of its own).
    pub fn graph(&self, name: &str) -> Result<Graph> {
        if !self.has_graph(name) {
            return Err(Error::GraphNotFound {
                name: name.to_owned(),
                available: self.inner.names.clone(),
            });
        }
        let rt = &self.inner.rt;
        let c_name = CString::new(name).map_err(|_| Error::BadCString {
            what: "graph name",
            value: name.to_owned(),
        })?;
        let mut handle: sys::hbDNNHandle_t = std::ptr::null_mut();
        // SAFETY: valid out-pointer, live packed handle, NUL-terminated name.
        let code = unsafe {
            ffi!(rt, hbDNNGetModelHandle)(&mut handle, self.inner.handle, c_name.as_ptr())
        };
        rt.check("hbDNNGetModelHandle", code)?;
        let mut n_in = 0i32;
        let mut n_out = 0i32;
        // SAFETY: valid out-pointers and a graph handle owned by the live packed handle.
        let code = unsafe { ffi!(rt, hbDNNGetInputCount)(&mut n_in, handle) };
        rt.check("hbDNNGetInputCount", code)?;
        // SAFETY: as above.
        let code = unsafe { ffi!(rt, hbDNNGetOutputCount)(&mut n_out, handle) };
        rt.check("hbDNNGetOutputCount", code)?;
        let mut cores = 0i32;
        // SAFETY: as above.
        let code = unsafe { ffi!(rt, hbDNNGetCompileBpuCoreNum)(&mut cores, handle) };
        rt.check("hbDNNGetCompileBpuCoreNum", code)?;
        let mut inputs = Vec::new();
        for i in 0..n_in {
            let mut p = sys::hbDNNTensorProperties::default();
            // SAFETY: `p` is a valid out-pointer, `i` < input count.
            let code = unsafe { ffi!(rt, hbDNNGetInputTensorProperties)(&mut p, handle, i) };
            rt.check("hbDNNGetInputTensorProperties", code)?;
            inputs.push(TensorSpec::from_properties(
                name,
                Side::Input,
                i as usize,
                p,
            )?);
        }
        let mut outputs = Vec::new();
        for i in 0..n_out {
            let mut p = sys::hbDNNTensorProperties::default();
            // SAFETY: `p` is a valid out-pointer, `i` < output count.
            let code = unsafe { ffi!(rt, hbDNNGetOutputTensorProperties)(&mut p, handle, i) };
            rt.check("hbDNNGetOutputTensorProperties", code)?;
            outputs.push(TensorSpec::from_properties(
                name,
                Side::Output,
                i as usize,
                p,
            )?);
        }
        tracing::debug!(
            graph = name,
            inputs = n_in,
            outputs = n_out,
            cores,
            "graph opened"
        );
        Ok(Graph {
            packed: self.inner.clone(),
            handle,
            name: name.to_owned(),
            inputs,
            outputs,
            compile_cores: cores,
        })
    }
}

/// Tensor element type (`hbDNNDataType`, S100 numbering).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    S4,
    U4,
    S8,
    U8,
    F16,
    S16,
    U16,
    F32,
    S32,
    U32,
    F64,
    S64,
    U64,
    Bool8,
    Other(i32),
}

impl DType {
    /// From the C value; unknown values are kept.
    pub fn from_raw(v: i32) -> Self {
        match v {
            sys::HB_DNN_TENSOR_TYPE_S4 => Self::S4,
            sys::HB_DNN_TENSOR_TYPE_U4 => Self::U4,
            sys::HB_DNN_TENSOR_TYPE_S8 => Self::S8,
            sys::HB_DNN_TENSOR_TYPE_U8 => Self::U8,
            sys::HB_DNN_TENSOR_TYPE_F16 => Self::F16,
            sys::HB_DNN_TENSOR_TYPE_S16 => Self::S16,
            sys::HB_DNN_TENSOR_TYPE_U16 => Self::U16,
            sys::HB_DNN_TENSOR_TYPE_F32 => Self::F32,
            sys::HB_DNN_TENSOR_TYPE_S32 => Self::S32,
            sys::HB_DNN_TENSOR_TYPE_U32 => Self::U32,
            sys::HB_DNN_TENSOR_TYPE_F64 => Self::F64,
            sys::HB_DNN_TENSOR_TYPE_S64 => Self::S64,
            sys::HB_DNN_TENSOR_TYPE_U64 => Self::U64,
            sys::HB_DNN_TENSOR_TYPE_BOOL8 => Self::Bool8,
            o => Self::Other(o),
        }
    }

    /// Bytes per element; `None` for sub-byte and unknown types.
    pub fn size(self) -> Option<usize> {
        match self {
            Self::S8 | Self::U8 | Self::Bool8 => Some(1),
            Self::F16 | Self::S16 | Self::U16 => Some(2),
            Self::F32 | Self::S32 | Self::U32 => Some(4),
            Self::F64 | Self::S64 | Self::U64 => Some(8),
            Self::S4 | Self::U4 | Self::Other(_) => None,
        }
    }
}

/// Rounds `v` up to a multiple of `a` (a power of two).
pub fn align_up(v: usize, a: usize) -> usize {
    v.div_ceil(a) * a
}

/// Resolves reported byte strides: `-1` on the last dim becomes the element size, on an outer
/// dim `align_up(stride[d+1] * dim[d+1], 32)`. Non-negative strides are kept as reported.
pub fn resolve_strides(
    shape: &[usize],
    reported: &[i64],
    elem: Option<usize>,
) -> Option<Vec<usize>> {
    let rank = shape.len();
    let mut out = vec![0usize; rank];
    for d in (0..rank).rev() {
        let r = *reported.get(d)?;
        out[d] = if r >= 0 {
            usize::try_from(r).ok()?
        } else if d + 1 == rank {
            elem?
        } else {
            align_up(out[d + 1].checked_mul(shape[d + 1])?, STRIDE_ALIGN)
        };
    }
    Some(out)
}

/// One graph input or output as reported by the runtime, strides resolved.
#[derive(Debug, Clone)]
pub struct TensorSpec {
    /// `validShape` dimensions.
    pub shape: Vec<usize>,
    pub dtype: DType,
    /// Quantisation scale values (empty when `scaleLen` is 0).
    pub scale: Vec<f32>,
    /// Zero points (empty when `zeroPointLen` is 0).
    pub zero_point: Vec<i32>,
    /// `alignedByteSize` as reported.
    pub aligned_byte_size: usize,
    /// Strides as reported (`-1` = dense).
    pub reported_strides: Vec<i64>,
    /// Byte strides, `-1` resolved.
    pub strides: Vec<usize>,
    /// Bytes a buffer for this tensor must hold: `max(stride[0] × dim[0], alignedByteSize)`.
    pub byte_size: usize,
    /// The properties handed back to the runtime at inference, with resolved strides.
    raw: sys::hbDNNTensorProperties,
}

impl TensorSpec {
    fn from_properties(
        graph: &str,
        side: Side,
        index: usize,
        p: sys::hbDNNTensorProperties,
    ) -> Result<Self> {
        let bad = |reason: String| Error::Spec {
            graph: graph.to_owned(),
            side,
            index,
            reason,
        };
        let rank = usize::try_from(p.validShape.numDimensions)
            .ok()
            .filter(|r| (1..=p.validShape.dimensionSize.len()).contains(r))
            .ok_or_else(|| bad(format!("rank {}", p.validShape.numDimensions)))?;
        let shape = p.validShape.dimensionSize[..rank]
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| bad(format!("dimension {d}"))))
            .collect::<Result<Vec<_>>>()?;
        let dtype = DType::from_raw(p.tensorType);
        let reported_strides = p.stride[..rank].to_vec();
        let strides =
            resolve_strides(&shape, &reported_strides, dtype.size()).ok_or_else(|| {
                bad(format!(
                    "cannot resolve strides {reported_strides:?} for {dtype:?}"
                ))
            })?;
        let aligned_byte_size = usize::try_from(p.alignedByteSize)
            .map_err(|_| bad(format!("alignedByteSize {}", p.alignedByteSize)))?;
        let byte_size = strides[0].saturating_mul(shape[0]).max(aligned_byte_size);
        // SAFETY: the scale arrays are owned by the packed handle and hold `scaleLen` /
        // `zeroPointLen` entries; they are copied here.
        let scale = unsafe { copy_array(p.scale.scaleData, p.scale.scaleLen) };
        // SAFETY: as above.
        let zero_point = unsafe { copy_array(p.scale.zeroPointData, p.scale.zeroPointLen) };
        let mut raw = p;
        for (d, s) in strides.iter().enumerate() {
            raw.stride[d] = i64::try_from(*s).map_err(|_| bad(format!("stride {s}")))?;
        }
        Ok(Self {
            shape,
            dtype,
            scale,
            zero_point,
            aligned_byte_size,
            reported_strides,
            strides,
            byte_size,
            raw,
        })
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Last dimension.
    pub fn last_dim(&self) -> usize {
        self.shape.last().copied().unwrap_or(1)
    }

    /// Byte pitch between rows (`stride[rank-2]`), or the byte size for rank-1 tensors.
    pub fn row_stride(&self) -> usize {
        if self.rank() >= 2 {
            self.strides[self.rank() - 2]
        } else {
            self.byte_size
        }
    }

    /// Number of innermost rows (product of every dim but the last).
    pub fn rows(&self) -> usize {
        self.shape[..self.rank() - 1].iter().product()
    }

    /// Byte offset of row `r` (row-major over every dim but the last), honouring strides.
    pub fn row_offset(&self, mut r: usize) -> usize {
        let mut off = 0;
        for d in (0..self.rank() - 1).rev() {
            let dim = self.shape[d].max(1);
            off += (r % dim) * self.strides[d];
            r /= dim;
        }
        off
    }

    /// The first scale value, or 1.0 when the tensor carries none.
    pub fn scale0(&self) -> f32 {
        self.scale.first().copied().unwrap_or(1.0)
    }

    fn elem_check<T>(&self) -> Result<()> {
        let got = std::mem::size_of::<T>();
        match self.dtype.size() {
            Some(expected) if expected == got => Ok(()),
            expected => Err(Error::ElementSize {
                dtype: self.dtype,
                expected: expected.unwrap_or(0),
                got,
            }),
        }
    }
}

/// Copies a C array; empty for null or non-positive length.
///
/// # Safety
/// `p` is null or points to at least `len` valid elements.
unsafe fn copy_array<T: Copy>(p: *const T, len: i32) -> Vec<T> {
    match usize::try_from(len) {
        Ok(n) if n > 0 && !p.is_null() => {
            // SAFETY: guaranteed by the caller.
            unsafe { std::slice::from_raw_parts(p, n) }.to_vec()
        }
        _ => Vec::new(),
    }
}

/// Scheduling of one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sched {
    /// 0 (lowest, the default) ..= 255.
    pub priority: u8,
    /// Backend mask; 0 = `HB_UCP_CORE_ANY`, else e.g. `(1 << n) - 1` for cores `0..n`.
    pub core_mask: u64,
    /// Wait timeout in ms; 0 waits until done.
    pub timeout_ms: i32,
}

impl Default for Sched {
    fn default() -> Self {
        Self {
            priority: 0,
            core_mask: sys::HB_UCP_CORE_ANY,
            timeout_ms: 0,
        }
    }
}

impl Sched {
    /// Mask for BPU cores `0..n` (`(1 << n) - 1`); 0 (any core) for `n <= 1`.
    pub fn cores(n: u32) -> u64 {
        if n <= 1 {
            sys::HB_UCP_CORE_ANY
        } else {
            (1u64 << n.min(63)) - 1
        }
    }
}

/// One graph of a packed model.
#[derive(Clone)]
pub struct Graph {
    packed: Rc<PackedInner>,
    handle: sys::hbDNNHandle_t,
    name: String,
    inputs: Vec<TensorSpec>,
    outputs: Vec<TensorSpec>,
    compile_cores: i32,
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Graph")
            .field("name", &self.name)
            .field("inputs", &self.inputs.len())
            .field("outputs", &self.outputs.len())
            .finish()
    }
}

/// Releases a task on every path.
struct Task<'a> {
    rt: &'a RtInner,
    handle: sys::hbUCPTaskHandle_t,
}

impl Task<'_> {
    fn release(mut self) -> Result<()> {
        let h = std::mem::replace(&mut self.handle, std::ptr::null_mut());
        // SAFETY: `h` came from hbDNNInferV2 and is released exactly once (the Drop below sees
        // null afterwards).
        let code = unsafe { ffi!(self.rt, hbUCPReleaseTask)(h) };
        self.rt.check("hbUCPReleaseTask", code)
    }
}

impl Drop for Task<'_> {
    fn drop(&mut self) {
        if self.handle.is_null() {
            return;
        }
        // SAFETY: a task not yet released (error path); released exactly once.
        let code = unsafe { ffi!(self.rt, hbUCPReleaseTask)(self.handle) };
        if let Err(e) = self.rt.check("hbUCPReleaseTask", code) {
            tracing::warn!(error = %e, "releasing a task on an error path failed");
        }
    }
}

impl Graph {
    /// Graph name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Input specs, by index.
    pub fn inputs(&self) -> &[TensorSpec] {
        &self.inputs
    }

    /// Output specs, by index.
    pub fn outputs(&self) -> &[TensorSpec] {
        &self.outputs
    }

    /// BPU cores the graph was compiled for.
    pub fn compile_cores(&self) -> i32 {
        self.compile_cores
    }

    /// A buffer sized for input `index` (keeps the packed handle alive).
    pub fn alloc_input(&self, index: usize) -> Result<DeviceBuffer> {
        let size = self.spec(Side::Input, index)?.byte_size;
        DeviceBuffer::alloc(self.packed.rt.clone(), size, Some(self.packed.clone()))
    }

    /// A buffer sized for output `index` (keeps the packed handle alive).
    pub fn alloc_output(&self, index: usize) -> Result<DeviceBuffer> {
        let size = self.spec(Side::Output, index)?.byte_size;
        DeviceBuffer::alloc(self.packed.rt.clone(), size, Some(self.packed.clone()))
    }

    fn spec(&self, side: Side, index: usize) -> Result<&TensorSpec> {
        let list = match side {
            Side::Input => &self.inputs,
            Side::Output => &self.outputs,
        };
        list.get(index).ok_or_else(|| Error::Spec {
            graph: self.name.clone(),
            side,
            index,
            reason: format!("index out of range ({} tensors)", list.len()),
        })
    }

    fn bind(
        &self,
        side: Side,
        specs: &[TensorSpec],
        bufs: &[&DeviceBuffer],
    ) -> Result<Vec<sys::hbDNNTensor>> {
        if specs.len() != bufs.len() {
            return Err(Error::BufferCount {
                graph: self.name.clone(),
                side,
                expected: specs.len(),
                got: bufs.len(),
            });
        }
        specs
            .iter()
            .zip(bufs)
            .enumerate()
            .map(|(index, (spec, buf))| {
                if buf.size < spec.byte_size {
                    return Err(Error::BufferTooSmall {
                        graph: self.name.clone(),
                        side,
                        index,
                        got: buf.size,
                        need: spec.byte_size,
                    });
                }
                Ok(sys::hbDNNTensor {
                    sysMem: buf.mem,
                    properties: spec.raw,
                })
            })
            .collect()
    }

    /// Runs the graph: InferV2 → Submit (priority, core mask) → Wait (timeout) → Release, the
    /// task released on every path. The caller cleans inputs it wrote and invalidates outputs
    /// it will read; cache buffers that only the BPU touches need neither.
    pub fn run(
        &self,
        inputs: &[&DeviceBuffer],
        outputs: &mut [&mut DeviceBuffer],
        sched: &Sched,
    ) -> Result<()> {
        let rt = &*self.packed.rt;
        let in_t = self.bind(Side::Input, &self.inputs, inputs)?;
        let out_refs: Vec<&DeviceBuffer> = outputs.iter().map(|b| &**b).collect();
        let mut out_t = self.bind(Side::Output, &self.outputs, &out_refs)?;
        let mut handle: sys::hbUCPTaskHandle_t = std::ptr::null_mut();
        // SAFETY: the tensor arrays hold exactly the graph's input/output counts and point at
        // live buffers large enough for each tensor (checked in `bind`); the outputs are
        // borrowed mutably for the whole run; `handle` is a null task, so a new one is made.
        let code = unsafe {
            ffi!(rt, hbDNNInferV2)(&mut handle, out_t.as_mut_ptr(), in_t.as_ptr(), self.handle)
        };
        rt.check("hbDNNInferV2", code)?;
        let task = Task { rt, handle };
        let mut param = sys::hb_ucp_initialize_sched_param();
        param.priority = i32::from(sched.priority);
        param.backend = sched.core_mask;
        // SAFETY: live task handle and a valid scheduling struct.
        let code = unsafe { ffi!(rt, hbUCPSubmitTask)(task.handle, &mut param) };
        rt.check("hbUCPSubmitTask", code)?;
        // SAFETY: live, submitted task.
        let code = unsafe { ffi!(rt, hbUCPWaitTaskDone)(task.handle, sched.timeout_ms) };
        rt.check("hbUCPWaitTaskDone", code)?;
        task.release()
    }
}

/// One cached device allocation (`hbUCPMallocCached`), freed on drop.
pub struct DeviceBuffer {
    rt: Rc<RtInner>,
    mem: sys::hbUCPSysMem,
    size: usize,
    _packed: Option<Rc<PackedInner>>,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("size", &self.size)
            .field("phy", &format_args!("{:#x}", self.mem.phyAddr))
            .finish()
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // SAFETY: `mem` came from hbUCPMallocCached and is freed exactly once; no task uses it
        // (tasks never outlive `Graph::run`, which borrows the buffer).
        let code = unsafe { ffi!(self.rt, hbUCPFree)(&mut self.mem) };
        if let Err(e) = self.rt.check("hbUCPFree", code) {
            tracing::warn!(error = %e, size = self.size, "freeing a device buffer failed");
        }
    }
}

impl DeviceBuffer {
    fn alloc(rt: Rc<RtInner>, size: usize, packed: Option<Rc<PackedInner>>) -> Result<Self> {
        let mut mem = sys::hbUCPSysMem::default();
        // SAFETY: valid out-pointer; device id 0 as documented.
        let code = unsafe { ffi!(rt, hbUCPMallocCached)(&mut mem, size as u64, 0) };
        rt.check("hbUCPMallocCached", code)?;
        let mut buf = Self {
            rt,
            mem,
            size,
            _packed: packed,
        };
        if buf.mem.virAddr.is_null() || (buf.mem.memSize as usize) < size {
            return Err(Error::NullPointer {
                call: "hbUCPMallocCached",
            });
        }
        // Freed ION comes back dirty: zero the host view and push it to the device.
        buf.as_mut_bytes().fill(0);
        buf.clean()?;
        Ok(buf)
    }

    /// Usable size in bytes (the requested size).
    pub fn size(&self) -> usize {
        self.size
    }

    /// The raw allocation (for building sub-range flushes or tensors by hand).
    pub fn sys_mem(&self) -> sys::hbUCPSysMem {
        self.mem
    }

    /// The host (CPU) view. Reflects device writes only after [`Self::invalidate`].
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: `virAddr` maps at least `size` bytes for the buffer's lifetime (checked at
        // allocation); device writes happen only inside `Graph::run`, which borrows output
        // buffers mutably, so no shared view exists while they happen.
        unsafe { std::slice::from_raw_parts(self.mem.virAddr as *const u8, self.size) }
    }

    /// The host (CPU) view, writable. Call [`Self::clean`] before the device reads it.
    pub fn as_mut_bytes(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_bytes`, and `&mut self` makes this the only view.
        unsafe { std::slice::from_raw_parts_mut(self.mem.virAddr.cast::<u8>(), self.size) }
    }

    fn range(&self, offset: usize, len: usize) -> Result<sys::hbUCPSysMem> {
        if offset.checked_add(len).is_none_or(|end| end > self.size) {
            return Err(Error::OutOfBounds {
                what: "flush range",
                offset,
                len,
                size: self.size,
            });
        }
        Ok(sys::hbUCPSysMem {
            phyAddr: self.mem.phyAddr + offset as u64,
            // SAFETY: offset <= size, so the pointer stays inside the allocation.
            virAddr: unsafe { self.mem.virAddr.cast::<u8>().add(offset) }.cast(),
            memSize: len as u64,
        })
    }

    fn flush(&self, mem: &sys::hbUCPSysMem, flag: i32, call: &'static str) -> Result<()> {
        // SAFETY: `mem` is this allocation or a sub-range of it.
        let code = unsafe { ffi!(self.rt, hbUCPMemFlush)(mem, flag) };
        self.rt.check(call, code)
    }

    /// CLEAN: write CPU-side changes back so the device sees them.
    pub fn clean(&self) -> Result<()> {
        self.flush(
            &self.mem,
            sys::HB_SYS_MEM_CACHE_CLEAN,
            "hbUCPMemFlush(CLEAN)",
        )
    }

    /// CLEAN of `len` bytes at `offset`.
    pub fn clean_range(&self, offset: usize, len: usize) -> Result<()> {
        let m = self.range(offset, len)?;
        self.flush(&m, sys::HB_SYS_MEM_CACHE_CLEAN, "hbUCPMemFlush(CLEAN)")
    }

    /// INVALIDATE: drop CPU-cached bytes so the host view shows device writes.
    pub fn invalidate(&mut self) -> Result<()> {
        self.flush(
            &self.mem,
            sys::HB_SYS_MEM_CACHE_INVALIDATE,
            "hbUCPMemFlush(INVALIDATE)",
        )
    }

    /// INVALIDATE of `len` bytes at `offset`.
    pub fn invalidate_range(&mut self, offset: usize, len: usize) -> Result<()> {
        let m = self.range(offset, len)?;
        self.flush(
            &m,
            sys::HB_SYS_MEM_CACHE_INVALIDATE,
            "hbUCPMemFlush(INVALIDATE)",
        )
    }

    /// Writes `data` as rows of `row_len` elements, row `i` at `offset + i × row_stride`.
    pub fn write_rows<T: bytemuck::Pod>(
        &mut self,
        offset: usize,
        row_stride: usize,
        row_len: usize,
        data: &[T],
    ) -> Result<()> {
        let esz = std::mem::size_of::<T>();
        let row_bytes = row_len * esz;
        let size = self.size;
        let bytes = self.as_mut_bytes();
        for (i, row) in data.chunks(row_len.max(1)).enumerate() {
            let at = offset + i * row_stride;
            let src: &[u8] = bytemuck::cast_slice(row);
            let dst = bytes
                .get_mut(at..at + src.len())
                .ok_or(Error::OutOfBounds {
                    what: "write_rows",
                    offset: at,
                    len: row_bytes,
                    size,
                })?;
            dst.copy_from_slice(src);
        }
        Ok(())
    }

    /// Reads `rows` rows of `row_len` elements, row `i` from `offset + i × row_stride`.
    pub fn read_rows<T: bytemuck::Pod>(
        &self,
        offset: usize,
        row_stride: usize,
        row_len: usize,
        rows: usize,
    ) -> Result<Vec<T>> {
        let esz = std::mem::size_of::<T>();
        let row_bytes = row_len * esz;
        let mut out = vec![T::zeroed(); rows * row_len];
        let bytes = self.as_bytes();
        for (i, dst) in out.chunks_mut(row_len.max(1)).enumerate() {
            let at = offset + i * row_stride;
            let src = bytes.get(at..at + row_bytes).ok_or(Error::OutOfBounds {
                what: "read_rows",
                offset: at,
                len: row_bytes,
                size: self.size,
            })?;
            bytemuck::cast_slice_mut(dst).copy_from_slice(src);
        }
        Ok(out)
    }

    /// Writes a whole tensor given densely (row-major) by the tensor's strides.
    pub fn write_tensor<T: bytemuck::Pod>(&mut self, spec: &TensorSpec, data: &[T]) -> Result<()> {
        spec.elem_check::<T>()?;
        let row_len = spec.last_dim();
        if data.len() != spec.rows() * row_len {
            return Err(Error::OutOfBounds {
                what: "write_tensor data",
                offset: 0,
                len: data.len(),
                size: spec.rows() * row_len,
            });
        }
        for (r, row) in data.chunks(row_len.max(1)).enumerate() {
            self.write_rows(spec.row_offset(r), 0, row_len, row)?;
        }
        Ok(())
    }

    /// Reads a whole tensor densely (row-major) by the tensor's strides.
    pub fn read_tensor<T: bytemuck::Pod>(&self, spec: &TensorSpec) -> Result<Vec<T>> {
        spec.elem_check::<T>()?;
        let row_len = spec.last_dim();
        let mut out = Vec::with_capacity(spec.rows() * row_len);
        for r in 0..spec.rows() {
            out.extend(self.read_rows::<T>(spec.row_offset(r), 0, row_len, 1)?);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stride_resolution_aligns_outer_dims_to_32() {
        // [2, 3, 5] f32: last 4 B, rows 5*4=20 → 32, planes 3*32=96.
        assert_eq!(
            resolve_strides(&[2, 3, 5], &[-1, -1, -1], Some(4)),
            Some(vec![96, 32, 4])
        );
        // Reported strides are kept; only -1 entries are filled.
        assert_eq!(
            resolve_strides(&[2, 3, 5], &[-1, 64, -1], Some(4)),
            Some(vec![192, 64, 4])
        );
        // Dense already aligned.
        assert_eq!(
            resolve_strides(&[1, 64], &[-1, -1], Some(4)),
            Some(vec![256, 4])
        );
        // Unknown element size cannot be resolved.
        assert_eq!(resolve_strides(&[4], &[-1], None), None);
        assert_eq!(align_up(33, 32), 64);
    }

    #[test]
    fn sched_core_masks() {
        assert_eq!(Sched::cores(1), 0);
        assert_eq!(Sched::cores(2), 0b11);
        assert_eq!(Sched::cores(4), 0b1111);
        assert_eq!(Sched::default().priority, 0);
    }
}

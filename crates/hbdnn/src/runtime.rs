//! The function table and the calls that need no model: versions, status descriptions,
//! loading a packed model, plain device allocations.

use std::cell::Cell;
use std::ffi::{c_char, CStr, CString};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use hbdnn_sys as sys;

use crate::{DeviceBuffer, Error, FnTable, PackedModel, Result, Status, TableSource};

/// Calls a required entry of the validated table (never one of
/// [`hbdnn_sys::OPTIONAL_ENTRY_POINTS`], which a library may lack).
macro_rules! ffi {
    ($rt:expr, $f:ident) => {
        $rt.table
            .raw()
            .$f
            .expect("FnTable checks every entry at construction")
    };
}
// Textual macro scope would tie every user to module order in `lib.rs`; a path import does not.
pub(crate) use ffi;

/// Shared by every handle made from one [`Runtime`], so the table outlives them all.
pub(crate) struct RtInner {
    pub(crate) table: FnTable,
    /// Set when a task timed out: the BPU may still be running it and writing its buffers,
    /// so nothing it could touch is released again (buffers, the task, the packed model).
    wedged: Cell<bool>,
    /// How range flushes reach the library ([`crate::FlushMode`]).
    pub(crate) flush: Cell<crate::FlushMode>,
}

impl RtInner {
    pub(crate) fn wedge(&self) {
        self.wedged.set(true);
    }

    pub(crate) fn is_wedged(&self) -> bool {
        self.wedged.get()
    }

    /// The one conversion point from a C status to a `Result`.
    pub(crate) fn check(&self, call: &'static str, code: i32) -> Result<()> {
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

    pub(crate) fn describe(&self, code: i32) -> String {
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
pub(crate) unsafe fn c_string(p: *const c_char) -> Option<String> {
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
    pub(crate) inner: Rc<RtInner>,
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
            inner: Rc::new(RtInner {
                table,
                wedged: Cell::new(false),
                flush: Cell::new(crate::FlushMode::Range),
            }),
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

    /// True after a task timed out: every further run is refused, and device memory is left
    /// allocated until the process exits (the BPU may still write it). Restart the process.
    pub fn is_wedged(&self) -> bool {
        self.inner.is_wedged()
    }

    /// Where the table comes from.
    pub fn source(&self) -> &TableSource {
        self.inner.table.source()
    }

    /// The board runtime libraries (`libdnn`, `libhbucp`, `libhbrt*`, `libhbtl`) this process
    /// has mapped now, from `/proc/self/maps`: what really runs, whatever the search path
    /// did. Empty under the simulator on a machine without them.
    pub fn mapped_libraries(&self) -> Vec<sys::MappedLibrary> {
        sys::mapped_libraries()
    }

    /// hbDNN, hbUCP and SoC version strings.
    pub fn versions(&self) -> Versions {
        let rt = &self.inner;
        // SAFETY: the version getters take no arguments and return static strings or null.
        let (dnn, ucp) = unsafe {
            (
                c_string(ffi!(rt, hbDNNGetVersion)()),
                c_string(ffi!(rt, hbUCPGetVersion)()),
            )
        };
        // An optional entry point (not needed to run): a library may lack it.
        let soc = match rt.table.raw().hbUCPGetSocName {
            // SAFETY: as above.
            Some(f) => unsafe { c_string(f()) },
            None => Some("unknown (the library exports no hbUCPGetSocName)".to_owned()),
        };
        let unknown = || "unknown".to_owned();
        Versions {
            dnn: dnn.unwrap_or_else(unknown),
            ucp: ucp.unwrap_or_else(unknown),
            soc: soc.unwrap_or_else(unknown),
        }
    }

    /// The optional entry points ([`hbdnn_sys::OPTIONAL_ENTRY_POINTS`]) the library lacks:
    /// their fallbacks are in use (status codes without text, tensors without names, an
    /// unknown SoC name).
    pub fn missing_entry_points(&self) -> Vec<&'static str> {
        let raw = self.inner.table.raw();
        [
            ("hbDNNGetErrorDesc", raw.hbDNNGetErrorDesc.is_none()),
            ("hbDNNGetInputName", raw.hbDNNGetInputName.is_none()),
            ("hbDNNGetOutputName", raw.hbDNNGetOutputName.is_none()),
            ("hbUCPGetSocName", raw.hbUCPGetSocName.is_none()),
        ]
        .into_iter()
        .filter_map(|(name, missing)| missing.then_some(name))
        .collect()
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
        PackedModel::from_handle(self.inner.clone(), handle, files.clone()).map_err(wrap)
    }

    /// A cached device allocation of `size` bytes, zero-filled and cleaned.
    pub fn alloc(&self, size: usize) -> Result<DeviceBuffer> {
        DeviceBuffer::alloc(self.inner.clone(), size, None)
    }
}

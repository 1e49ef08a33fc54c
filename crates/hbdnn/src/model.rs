//! The packed model: one handle over one or more `.hbm` files, released after its last graph
//! and buffer.

use std::ffi::c_char;
use std::path::PathBuf;
use std::rc::Rc;

use hbdnn_sys as sys;

use crate::runtime::{c_string, ffi, RtInner};
use crate::{Error, Graph, Result};

/// Shared by the model, its graphs and their buffers, so the handle is released only after
/// the last of them is gone.
pub(crate) struct PackedInner {
    pub(crate) rt: Rc<RtInner>,
    pub(crate) handle: sys::hbDNNPackedHandle_t,
    files: Vec<PathBuf>,
    names: Vec<String>,
    /// The files' size, counted as held ([`crate::memory`]).
    bytes: u64,
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
        if rt.is_wedged() {
            // A timed-out task may still run one of its graphs (see `Graph::run`).
            tracing::debug!(files = ?self.files, "packed model left loaded (runtime wedged)");
            return;
        }
        crate::memory::give_back(self.bytes);
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
    /// Takes ownership of a freshly initialised handle, so that any error from here on
    /// (including one while listing the graph names) releases it.
    pub(crate) fn from_handle(
        rt: Rc<RtInner>,
        handle: sys::hbDNNPackedHandle_t,
        files: Vec<PathBuf>,
    ) -> Result<Self> {
        let bytes = files
            .iter()
            .filter_map(|f| std::fs::metadata(f).ok())
            .map(|m| m.len())
            .sum();
        // Counted from here: dropping `inner` (also when listing fails) releases and uncounts.
        crate::memory::take(bytes);
        let mut inner = PackedInner {
            rt,
            handle,
            files,
            names: Vec::new(),
            bytes,
        };
        inner.names = inner.list_names()?;
        tracing::info!(files = ?inner.files, graphs = ?inner.names, "packed model loaded");
        Ok(Self {
            inner: Rc::new(inner),
        })
    }

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
        Graph::open(self.inner.clone(), name)
    }
}

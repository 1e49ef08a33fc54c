//! Cached device allocations: the host view, cache maintenance (clean / invalidate) and
//! strided row and tensor copies.

use std::rc::Rc;

use hbdnn_sys as sys;

use crate::model::PackedInner;
use crate::runtime::{ffi, RtInner};
use crate::{Error, FlushMode, Result, TensorSpec};

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
        if self.rt.is_wedged() {
            // A timed-out task may still write it (see `Graph::run`).
            tracing::debug!(
                size = self.size,
                "device buffer left allocated (runtime wedged)"
            );
            return;
        }
        crate::memory::give_back(self.size as u64);
        // SAFETY: `mem` came from hbUCPMallocCached and is freed exactly once; no task uses it
        // (a task either ends inside `Graph::run`, which borrows the buffer, or timed out and
        // wedged the runtime, which skips this free).
        let code = unsafe { ffi!(self.rt, hbUCPFree)(&mut self.mem) };
        if let Err(e) = self.rt.check("hbUCPFree", code) {
            tracing::warn!(error = %e, size = self.size, "freeing a device buffer failed");
        }
    }
}

impl DeviceBuffer {
    /// `packed` is set for buffers sized for a graph, so the model they will be bound to
    /// outlives them.
    pub(crate) fn alloc(
        rt: Rc<RtInner>,
        size: usize,
        packed: Option<Rc<PackedInner>>,
    ) -> Result<Self> {
        let mut mem = sys::hbUCPSysMem::default();
        // SAFETY: valid out-pointer; device id 0 as documented.
        let code = unsafe { ffi!(rt, hbUCPMallocCached)(&mut mem, size as u64, 0) };
        rt.check("hbUCPMallocCached", code)?;
        // Counted from here: dropping `buf` (also on the errors below) frees and uncounts it.
        crate::memory::take(size as u64);
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

    /// INVALIDATE: drop CPU-cached bytes so the host view shows device writes.
    pub fn invalidate(&mut self) -> Result<()> {
        self.flush(
            &self.mem,
            sys::HB_SYS_MEM_CACHE_INVALIDATE,
            "hbUCPMemFlush(INVALIDATE)",
        )
    }

    /// CLEAN of `len` bytes at `offset`; under [`FlushMode::Whole`] a CLEAN of the whole
    /// buffer (see [`Self::prepare_write`]).
    pub fn clean_range(&self, offset: usize, len: usize) -> Result<()> {
        let m = self.range(offset, len)?;
        match self.rt.flush.get() {
            FlushMode::Range => self.flush(&m, sys::HB_SYS_MEM_CACHE_CLEAN, "hbUCPMemFlush(CLEAN)"),
            FlushMode::Whole => self.clean(),
        }
    }

    /// INVALIDATE of `len` bytes at `offset`; under [`FlushMode::Whole`] an INVALIDATE of the
    /// whole buffer, which also drops CPU writes elsewhere in it that were not CLEANed: CLEAN
    /// every write before invalidating any part of a buffer.
    pub fn invalidate_range(&mut self, offset: usize, len: usize) -> Result<()> {
        let m = self.range(offset, len)?;
        match self.rt.flush.get() {
            FlushMode::Range => self.flush(
                &m,
                sys::HB_SYS_MEM_CACHE_INVALIDATE,
                "hbUCPMemFlush(INVALIDATE)",
            ),
            FlushMode::Whole => self.invalidate(),
        }
    }

    /// Call before the CPU writes `len` bytes at `offset` of a buffer the device may have
    /// written since the host view was last INVALIDATEd, when only that range will be
    /// CLEANed. Under [`FlushMode::Whole`] that CLEAN covers the whole buffer, and the
    /// simulator's CLEAN writes back every line whose host bytes differ from the device's
    /// (it sees bytes, not stores; hardware writes back only the lines the CPU dirtied), so
    /// stale host lines would overwrite device writes: the whole buffer is INVALIDATEd first,
    /// unless the write covers all of it. Nothing under [`FlushMode::Range`]. Every earlier
    /// CPU write must have been CLEANed.
    pub fn prepare_write(&mut self, offset: usize, len: usize) -> Result<()> {
        self.range(offset, len)?;
        let covers_all = offset == 0 && len == self.size;
        if self.rt.flush.get() == FlushMode::Whole && !covers_all {
            self.invalidate()?;
        }
        Ok(())
    }

    /// How this buffer's range flushes reach the library (its runtime's
    /// [`crate::Runtime::flush_mode`]).
    pub fn flush_mode(&self) -> FlushMode {
        self.rt.flush.get()
    }

    /// CLEAN of exactly `len` bytes at `offset`, whatever the flush mode.
    pub(crate) fn clean_exact(&self, offset: usize, len: usize) -> Result<()> {
        let m = self.range(offset, len)?;
        self.flush(&m, sys::HB_SYS_MEM_CACHE_CLEAN, "hbUCPMemFlush(CLEAN)")
    }

    /// INVALIDATE of exactly `len` bytes at `offset`, whatever the flush mode.
    pub(crate) fn invalidate_exact(&mut self, offset: usize, len: usize) -> Result<()> {
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

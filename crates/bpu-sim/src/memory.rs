//! One simulated ION buffer: a host copy (what the CPU sees through `virAddr`: memory behind
//! its cache) and a device copy (DRAM as the BPU reads and writes it), kept coherent only by
//! `hbUCPMemFlush`, in whole 64-byte cache lines as hardware does:
//! - CLEAN writes back every line the range touches whose host bytes differ from the
//!   device's, whole lines even where the range covers part of one. The simulator sees bytes,
//!   not stores: a line the CPU rewrote with the bytes it last saw (zeroing a buffer the BPU
//!   wrote since) must reach the device as on hardware, so a line the CPU holds stale is
//!   written back too — hardware would leave it alone;
//! - INVALIDATE discards every line the range touches: the CPU then sees the device bytes,
//!   and bytes it wrote into such a line without a CLEAN are lost, including those outside
//!   the range sharing a line with it;
//! - an eviction ([`crate::FaultAction::Evict`]) writes back every dirty line, as a cache may
//!   at any moment.
//!
//! For INVALIDATE and eviction a line is dirty when its host bytes differ from the bytes it
//! held at its last CLEAN or INVALIDATE (kept as a 64-bit hash per line); rewriting identical
//! bytes is not seen there.

use std::alloc::Layout;

/// Bytes per cache line (the S100's Cortex-A78AE).
pub const CACHE_LINE: usize = 64;
/// Alignment of the host copy of every allocation (ION buffers are page-aligned).
const HOST_ALIGN: usize = 4096;

/// Bytes written into fresh allocations: freed ION comes back dirty on a board.
pub const DIRTY_BYTE: u8 = 0xA5;

pub(crate) struct Buffer {
    pub phy: u64,
    /// Host copy (what `virAddr` points at): `lines × CACHE_LINE` bytes, page-aligned, owned.
    host: *mut u8,
    layout: Layout,
    /// The requested size.
    pub size: usize,
    /// Device copy: what the BPU reads and writes (`lines × CACHE_LINE` bytes).
    pub device: Vec<u8>,
    /// Hash of each host line at its last CLEAN or INVALIDATE (or allocation).
    synced: Vec<u64>,
}

fn line_hash(line: &[u8]) -> u64 {
    line.chunks(8).fold(0x243F_6A88_85A3_08D3, |h, w| {
        let mut b = [0u8; 8];
        b[..w.len()].copy_from_slice(w);
        (h.rotate_left(23) ^ u64::from_le_bytes(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15)
    })
}

impl Buffer {
    /// A buffer of `size` (> 0) bytes, both copies filled with [`DIRTY_BYTE`]; `None` when
    /// the host memory cannot be had.
    pub fn new(phy: u64, size: usize) -> Option<Self> {
        let lines = size.div_ceil(CACHE_LINE).max(1);
        let bytes = lines.checked_mul(CACHE_LINE)?;
        let layout = Layout::from_size_align(bytes, HOST_ALIGN).ok()?;
        // SAFETY: the layout has a non-zero size.
        let host = unsafe { std::alloc::alloc(layout) };
        if host.is_null() {
            return None;
        }
        // SAFETY: `host` points at `bytes` freshly allocated bytes.
        unsafe { std::ptr::write_bytes(host, DIRTY_BYTE, bytes) };
        let h = line_hash(&[DIRTY_BYTE; CACHE_LINE]);
        Some(Self {
            phy,
            host,
            layout,
            size,
            device: vec![DIRTY_BYTE; bytes],
            synced: vec![h; lines],
        })
    }

    pub fn vir(&self) -> usize {
        self.host as usize
    }

    /// Line `l` of the host copy.
    fn host_line(&self, l: usize) -> [u8; CACHE_LINE] {
        let mut out = [0u8; CACHE_LINE];
        // SAFETY: line `l` lies inside the `layout.size()` bytes at `host` (callers pass
        // `l < synced.len()`); no Rust reference to the host bytes outlives a call, and every
        // call holds the state lock.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.host.add(l * CACHE_LINE),
                out.as_mut_ptr(),
                CACHE_LINE,
            )
        };
        out
    }

    /// Overwrites line `l` of the host copy.
    fn set_host_line(&mut self, l: usize, line: &[u8; CACHE_LINE]) {
        // SAFETY: as in `host_line`; `&mut self` makes this the only writer.
        unsafe {
            std::ptr::copy_nonoverlapping(line.as_ptr(), self.host.add(l * CACHE_LINE), CACHE_LINE)
        };
    }

    /// The lines `[off, off+len)` touches (within the buffer).
    fn lines(&self, off: usize, len: usize) -> std::ops::Range<usize> {
        let end = (off + len).div_ceil(CACHE_LINE).min(self.synced.len());
        (off / CACHE_LINE).min(end)..end
    }

    /// CLEAN (`to_device`) or INVALIDATE of `[off, off+len)`, in whole lines; returns the
    /// lines that moved (written back, or discarded with CPU bytes in them).
    pub fn flush(&mut self, off: usize, len: usize, to_device: bool) -> usize {
        let mut moved = 0;
        for l in self.lines(off, len) {
            moved += usize::from(if to_device {
                self.clean_line(l)
            } else {
                self.discard(l)
            });
        }
        moved
    }

    /// CLEAN of line `l`: written back when its host bytes differ from the device's.
    fn clean_line(&mut self, l: usize) -> bool {
        let host = self.host_line(l);
        let r = l * CACHE_LINE..(l + 1) * CACHE_LINE;
        self.synced[l] = line_hash(&host);
        if self.device[r.clone()] == host {
            return false;
        }
        self.device[r].copy_from_slice(&host);
        true
    }

    /// Writes line `l` back when dirty (an eviction).
    fn write_back(&mut self, l: usize) -> bool {
        let host = self.host_line(l);
        let h = line_hash(&host);
        if h == self.synced[l] {
            return false;
        }
        self.device[l * CACHE_LINE..(l + 1) * CACHE_LINE].copy_from_slice(&host);
        self.synced[l] = h;
        true
    }

    /// Replaces line `l` of the host copy by the device's; true when CPU writes were lost.
    fn discard(&mut self, l: usize) -> bool {
        let r = l * CACHE_LINE..(l + 1) * CACHE_LINE;
        let mut line = [0u8; CACHE_LINE];
        line.copy_from_slice(&self.device[r]);
        let lost = line_hash(&self.host_line(l)) != self.synced[l];
        self.set_host_line(l, &line);
        self.synced[l] = line_hash(&line);
        lost
    }

    /// Writes back every dirty line (an eviction); returns how many.
    pub fn evict(&mut self) -> usize {
        (0..self.synced.len())
            .filter(|&l| self.write_back(l))
            .count()
    }
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: `host` came from `alloc(self.layout)` and is freed once.
        unsafe { std::alloc::dealloc(self.host, self.layout) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(b: &mut Buffer) -> &mut [u8] {
        // SAFETY: the test holds the only reference to the buffer.
        unsafe { std::slice::from_raw_parts_mut(b.host, b.layout.size()) }
    }

    #[test]
    fn host_copy_is_page_aligned_and_whole_lines() {
        let b = Buffer::new(0, 100).unwrap();
        assert_eq!(b.vir() % HOST_ALIGN, 0);
        assert_eq!(b.device.len(), 128);
    }

    #[test]
    fn clean_writes_back_whole_lines() {
        let mut b = Buffer::new(0, 256).unwrap();
        host(&mut b)[..256].fill(0);
        assert_eq!(b.flush(0, 256, true), 4);
        // The CPU writes bytes 10 and 70; a CLEAN of byte 10 alone writes line 0 whole.
        host(&mut b)[10] = 1;
        host(&mut b)[12] = 2;
        host(&mut b)[70] = 3;
        assert_eq!(b.flush(10, 1, true), 1);
        assert_eq!((b.device[10], b.device[12], b.device[70]), (1, 2, 0));
        assert_eq!(b.flush(0, 64, true), 0, "nothing left to write");
        // The BPU writes line 2; the CPU zeroes it again (the bytes it last saw) and cleans:
        // the zeros reach the device.
        b.device[130] = 9;
        host(&mut b)[128..192].fill(0);
        assert_eq!(b.flush(128, 64, true), 1);
        assert_eq!(b.device[130], 0);
    }

    #[test]
    fn invalidate_of_part_of_a_line_discards_the_whole_line() {
        let mut b = Buffer::new(0, 128).unwrap();
        host(&mut b)[..128].fill(0);
        b.flush(0, 128, true);
        host(&mut b)[0] = 5; // never cleaned
        b.device[40] = 7; // the BPU wrote
        assert_eq!(b.flush(32, 16, false), 1, "CPU bytes were lost");
        assert_eq!((host(&mut b)[0], host(&mut b)[40]), (0, 7));
    }

    #[test]
    fn eviction_writes_back_uncleaned_lines_over_device_writes() {
        let mut b = Buffer::new(0, 192).unwrap();
        host(&mut b)[..192].fill(0);
        b.flush(0, 192, true);
        host(&mut b)[65] = 4; // the CPU writes, never cleans
        b.device[66] = 8; // then the BPU writes the same line
        assert_eq!(b.evict(), 1);
        assert_eq!((b.device[65], b.device[66]), (4, 0));
        assert_eq!(b.evict(), 0, "written back lines are clean");
    }
}

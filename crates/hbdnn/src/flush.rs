//! Which ranges cache maintenance may name. `hbUCPMemFlush` takes an `hbUCPSysMem`, and
//! nothing documented says whether a range inside an allocation is accepted: BLLM only ever
//! flushes whole allocations. [`Runtime::probe_flush`] asks the library once;
//! [`Runtime::set_flush_mode`] makes every [`crate::DeviceBuffer`] of the runtime follow the
//! answer.

use crate::{Error, Result, Runtime};

/// How [`crate::DeviceBuffer::clean_range`] and [`crate::DeviceBuffer::invalidate_range`]
/// reach the library.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum FlushMode {
    /// The range asked for (in whole cache lines, as the hardware does).
    #[default]
    Range,
    /// The whole allocation the range lies in. An INVALIDATE then also drops CPU writes
    /// elsewhere in the buffer that were not CLEANed yet, and the host view of the whole
    /// buffer becomes the device's: see [`crate::DeviceBuffer::prepare_write`].
    Whole,
}

impl FlushMode {
    /// `range` or `whole`.
    pub fn as_str(self) -> &'static str {
        match self {
            FlushMode::Range => "range",
            FlushMode::Whole => "whole",
        }
    }
}

impl std::fmt::Display for FlushMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What [`Runtime::probe_flush`] found.
#[derive(Debug)]
pub struct FlushProbe {
    /// `Range` when the library took both range flushes, else `Whole`.
    pub mode: FlushMode,
    /// The library's refusal of a range flush (with `Whole`).
    pub refusal: Option<Error>,
}

/// Bytes of the scratch allocation: one page, as an ION allocation is at least one.
const SCRATCH: usize = 4096;

impl Runtime {
    /// Asks the library whether it takes a range inside an allocation, on a scratch buffer
    /// (allocated and freed here): a CLEAN of 4 bytes at an offset that is not a cache-line
    /// boundary — the narrowest flush the decode step makes — then an INVALIDATE of the same
    /// range. An error status from either means `Whole`. A CPU cannot see whether an
    /// accepted range flush does the right thing, so `Range` means "accepted", not "correct".
    ///
    /// Fails only when the scratch buffer cannot be had or a whole-buffer flush fails (then
    /// nothing would work).
    pub fn probe_flush(&self) -> Result<FlushProbe> {
        let mut scratch = self.alloc(SCRATCH)?;
        let (offset, len) = (68, 4);
        let refusal = match scratch.clean_exact(offset, len) {
            Ok(()) => scratch.invalidate_exact(offset, len).err(),
            Err(e) => Some(e),
        };
        let refusal = match refusal {
            Some(e @ Error::Call { .. }) => Some(e),
            Some(other) => return Err(other),
            None => None,
        };
        // Whatever the range flushes did, the whole buffer must still flush.
        scratch.clean()?;
        scratch.invalidate()?;
        let mode = if refusal.is_some() {
            FlushMode::Whole
        } else {
            FlushMode::Range
        };
        match &refusal {
            Some(e) => {
                tracing::info!(error = %e, "the library refuses range flushes: every flush covers a whole allocation")
            }
            None => tracing::debug!("the library accepts range flushes"),
        }
        Ok(FlushProbe { mode, refusal })
    }

    /// Makes every flush of this runtime's buffers (existing and future) follow `mode`.
    pub fn set_flush_mode(&self, mode: FlushMode) {
        self.inner.flush.set(mode);
    }

    /// The mode set by [`Self::set_flush_mode`] (`Range` until then).
    pub fn flush_mode(&self) -> FlushMode {
        self.inner.flush.get()
    }
}

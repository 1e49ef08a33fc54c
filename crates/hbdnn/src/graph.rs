//! One graph of a packed model: its tensor specs, scheduling, and a run whose task is
//! released on every path.

use std::ffi::CString;
use std::rc::Rc;

use hbdnn_sys as sys;

use crate::model::PackedInner;
use crate::runtime::{ffi, RtInner};
use crate::{DeviceBuffer, Error, Result, Side, Status, TensorSpec};

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
    /// Releases the task of a run that succeeded. A failure here cannot change the results
    /// the run wrote (BLLM ignores it), so it is a warning, not an error.
    fn release(mut self, graph: &str) {
        let h = std::mem::replace(&mut self.handle, std::ptr::null_mut());
        // SAFETY: `h` came from hbDNNInferV2 and is released exactly once (the Drop below sees
        // null afterwards).
        let code = unsafe { ffi!(self.rt, hbUCPReleaseTask)(h) };
        if let Err(e) = self.rt.check("hbUCPReleaseTask", code) {
            tracing::warn!(graph, error = %e, "releasing the task of a successful run failed; its results stand");
        }
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

/// A tensor's name from the optional name getters; `None` when the library lacks them or
/// the call fails (names only feed reports).
fn tensor_name(rt: &RtInner, handle: sys::hbDNNHandle_t, side: Side, index: i32) -> Option<String> {
    let raw = rt.table.raw();
    let get = match side {
        Side::Input => raw.hbDNNGetInputName?,
        Side::Output => raw.hbDNNGetOutputName?,
    };
    let mut p: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: valid out-pointer and a graph handle owned by a live packed handle; `index` is
    // below the count the runtime reported.
    let code = unsafe { get(&mut p, handle, index) };
    if code != 0 {
        return None;
    }
    // SAFETY: a non-null name is a NUL-terminated string owned by the graph handle, copied
    // here.
    unsafe { crate::runtime::c_string(p) }
}

impl Graph {
    /// Opens a graph the caller has found in `packed`'s name list and reads its specs.
    pub(crate) fn open(packed: Rc<PackedInner>, name: &str) -> Result<Self> {
        let rt = &packed.rt;
        let c_name = CString::new(name).map_err(|_| Error::BadCString {
            what: "graph name",
            value: name.to_owned(),
        })?;
        let mut handle: sys::hbDNNHandle_t = std::ptr::null_mut();
        // SAFETY: valid out-pointer, live packed handle, NUL-terminated name.
        let code =
            unsafe { ffi!(rt, hbDNNGetModelHandle)(&mut handle, packed.handle, c_name.as_ptr()) };
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
            let mut spec = TensorSpec::from_properties(name, Side::Input, i as usize, p)?;
            spec.name = tensor_name(rt, handle, Side::Input, i);
            inputs.push(spec);
        }
        let mut outputs = Vec::new();
        for i in 0..n_out {
            let mut p = sys::hbDNNTensorProperties::default();
            // SAFETY: `p` is a valid out-pointer, `i` < output count.
            let code = unsafe { ffi!(rt, hbDNNGetOutputTensorProperties)(&mut p, handle, i) };
            rt.check("hbDNNGetOutputTensorProperties", code)?;
            let mut spec = TensorSpec::from_properties(name, Side::Output, i as usize, p)?;
            spec.name = tensor_name(rt, handle, Side::Output, i);
            outputs.push(spec);
        }
        tracing::debug!(
            graph = name,
            inputs = n_in,
            outputs = n_out,
            cores,
            "graph opened"
        );
        Ok(Self {
            packed,
            handle,
            name: name.to_owned(),
            inputs,
            outputs,
            compile_cores: cores,
        })
    }

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

    /// A buffer for input `index` of at least `bytes` bytes (and at least the input's own
    /// size): one buffer that another graph's tensor is bound to as well, which may report a
    /// larger `alignedByteSize` (keeps the packed handle alive).
    pub fn alloc_input_at_least(&self, index: usize, bytes: usize) -> Result<DeviceBuffer> {
        let size = self.spec(Side::Input, index)?.byte_size.max(bytes);
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
                if buf.size() < spec.byte_size {
                    return Err(Error::BufferTooSmall {
                        graph: self.name.clone(),
                        side,
                        index,
                        got: buf.size(),
                        need: spec.byte_size,
                    });
                }
                Ok(sys::hbDNNTensor {
                    sysMem: buf.sys_mem(),
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
        if rt.is_wedged() {
            return Err(Error::Wedged);
        }
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
        if let Err(e) = rt.check("hbUCPWaitTaskDone", code) {
            if e.is_timeout() {
                // Releasing a task the BPU may still be running, or freeing the buffers it
                // writes, could corrupt memory that is reused next: leak both on purpose.
                rt.wedge();
                std::mem::forget(task);
                tracing::error!(
                    graph = %self.name,
                    timeout_ms = sched.timeout_ms,
                    "BPU task timed out: the task and every device buffer of this runtime are \
                     left unreleased until the process exits; no further runs are accepted"
                );
                return Err(Error::Timeout {
                    graph: self.name.clone(),
                    timeout_ms: sched.timeout_ms,
                    status: Status::Timeout,
                });
            }
            return Err(e);
        }
        task.release(&self.name);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sched_core_masks() {
        assert_eq!(Sched::cores(1), 0);
        assert_eq!(Sched::cores(2), 0b11);
        assert_eq!(Sched::cores(4), 0b1111);
        assert_eq!(Sched::default().priority, 0);
    }
}

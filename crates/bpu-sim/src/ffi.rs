//! The simulator's `extern "C"` entry points, one per function-table field. Each runs behind a
//! panic boundary (a panic becomes `HB_UCP_UNKNOWN`, never an unwind into C), consults the
//! fault plan, and traces its call with the returned status.

use std::ffi::{c_char, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use hbdnn_sys as sys;
use sys::{
    hbDNNHandle_t, hbDNNPackedHandle_t, hbDNNTensor, hbDNNTensorProperties, hbUCPSchedParam,
    hbUCPSysMem, hbUCPTaskHandle_t,
};

use crate::config::FaultAction;
use crate::instance::Sim;
use crate::state::{SimState, SubTask, Task, TaskState};
use crate::status::description;
pub use crate::status::status_name;

/// BPU cores the simulated S100P has.
const CORES: u32 = 1;

/// What the body of an entry point asks the boundary to do after releasing the lock.
enum AfterLock {
    Done(i32),
    /// Sleep, then return the code.
    SleepThen(Duration, i32),
}

impl From<i32> for AfterLock {
    fn from(c: i32) -> Self {
        AfterLock::Done(c)
    }
}

/// Runs `body` under the instance lock after the fault plan had its say; catches panics.
fn boundary(
    call: &'static str,
    handle: usize,
    body: impl FnOnce(&mut SimState, Option<FaultAction>) -> AfterLock,
) -> i32 {
    let r = catch_unwind(AssertUnwindSafe(|| {
        let sim = Sim::current();
        let outcome = {
            let mut st = sim.lock();
            let fault = st.fault(call);
            match fault {
                Some(FaultAction::Status(c)) => AfterLock::Done(c),
                Some(FaultAction::AllocFail) => AfterLock::Done(sys::HB_UCP_MEM_ALLOC_FAIL),
                Some(FaultAction::Panic) => panic!("bpu-sim: injected panic in {call}"),
                Some(FaultAction::Evict) => {
                    let lines = st.evict();
                    tracing::warn!(call, lines, "bpu-sim: dirty cache lines written back");
                    body(&mut st, None)
                }
                Some(FaultAction::Timeout) if call != "hbUCPWaitTaskDone" => {
                    AfterLock::Done(sys::HB_UCP_TASK_TIMEOUT)
                }
                // Submit and wait make a task slow themselves, so that a wait limit applies.
                Some(FaultAction::Slow(d))
                    if call != "hbUCPSubmitTask" && call != "hbUCPWaitTaskDone" =>
                {
                    match body(&mut st, None) {
                        AfterLock::Done(c) => AfterLock::SleepThen(d, c),
                        AfterLock::SleepThen(e, c) => AfterLock::SleepThen(d + e, c),
                    }
                }
                other => body(&mut st, other),
            }
        };
        match outcome {
            AfterLock::Done(c) => c,
            AfterLock::SleepThen(d, c) => {
                std::thread::sleep(d);
                c
            }
        }
    }));
    let code = r.unwrap_or_else(|_| {
        tracing::error!(call, "bpu-sim: panic caught at the C boundary");
        sys::HB_UCP_UNKNOWN
    });
    tracing::trace!(
        call,
        handle = format_args!("{handle:#x}"),
        status = code,
        name = status_name(code),
        "bpu-sim call"
    );
    code
}

/// String-returning entry points: the panic boundary falls back to a static string.
fn string_boundary(call: &'static str, f: impl FnOnce() -> &'static CStr) -> *const c_char {
    let s = catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        tracing::error!(call, "bpu-sim: panic caught at the C boundary");
        c"bpu-sim: internal error"
    });
    tracing::trace!(call, "bpu-sim call");
    s.as_ptr()
}

// ---------------------------------------------------------------------------------------------
// libdnn.so

/// # Safety
/// None: takes no arguments; the result is a static string.
pub unsafe extern "C" fn hbDNNGetVersion() -> *const c_char {
    string_boundary("hbDNNGetVersion", || c"bpu-sim-dnn 0.1.0 (S100 hbDNN ABI)")
}

/// # Safety
/// `packed` must be a valid out-pointer; `files` must hold `count` NUL-terminated paths.
pub unsafe extern "C" fn hbDNNInitializeFromFiles(
    packed: *mut hbDNNPackedHandle_t,
    files: *mut *const c_char,
    count: i32,
) -> i32 {
    boundary("hbDNNInitializeFromFiles", 0, |st, _| {
        if packed.is_null() || files.is_null() || count <= 0 {
            return sys::HB_UCP_INVALID_ARGUMENT.into();
        }
        let mut paths = Vec::new();
        for i in 0..count as usize {
            // SAFETY: the caller passes `count` entries.
            let p = unsafe { *files.add(i) };
            if p.is_null() {
                return sys::HB_UCP_INVALID_ARGUMENT.into();
            }
            // SAFETY: each entry is NUL-terminated (caller contract).
            let s = unsafe { CStr::from_ptr(p) };
            paths.push(PathBuf::from(s.to_string_lossy().into_owned()));
        }
        match st.load(paths) {
            Ok(key) => {
                // SAFETY: checked non-null; the caller owns the out-pointer.
                unsafe { *packed = key as hbDNNPackedHandle_t };
                sys::HB_UCP_SUCCESS.into()
            }
            Err(c) => c.into(),
        }
    })
}

/// # Safety
/// `packed` is a handle from `hbDNNInitializeFromFiles` not yet released.
pub unsafe extern "C" fn hbDNNRelease(packed: hbDNNPackedHandle_t) -> i32 {
    boundary("hbDNNRelease", packed as usize, |st, _| {
        st.release(packed as usize).into()
    })
}

/// # Safety
/// `names` and `count` must be valid out-pointers; the names live as long as the handle.
pub unsafe extern "C" fn hbDNNGetModelNameList(
    names: *mut *mut *const c_char,
    count: *mut i32,
    packed: hbDNNPackedHandle_t,
) -> i32 {
    boundary("hbDNNGetModelNameList", packed as usize, |st, _| {
        if names.is_null() || count.is_null() {
            return sys::HB_UCP_INVALID_ARGUMENT.into();
        }
        let Some(p) = st.packed.get_mut(&(packed as usize)) else {
            return sys::HB_UCP_MODEL_INVALID.into();
        };
        // SAFETY: checked non-null out-pointers; the list is owned by the packed model.
        unsafe {
            *names = p.name_ptrs.as_mut_ptr();
            *count = p.name_ptrs.len() as i32;
        }
        sys::HB_UCP_SUCCESS.into()
    })
}

/// # Safety
/// `handle` is a valid out-pointer, `name` a NUL-terminated string, `packed` a live handle.
pub unsafe extern "C" fn hbDNNGetModelHandle(
    handle: *mut hbDNNHandle_t,
    packed: hbDNNPackedHandle_t,
    name: *const c_char,
) -> i32 {
    boundary("hbDNNGetModelHandle", packed as usize, |st, _| {
        if handle.is_null() || name.is_null() {
            return sys::HB_UCP_INVALID_ARGUMENT.into();
        }
        // SAFETY: NUL-terminated by contract.
        let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
        let Some(p) = st.packed.get(&(packed as usize)) else {
            return sys::HB_UCP_MODEL_INVALID.into();
        };
        match p.graphs.iter().find(|g| g.desc.name == name) {
            Some(g) => {
                // SAFETY: checked non-null out-pointer.
                unsafe { *handle = &**g as *const _ as hbDNNHandle_t };
                sys::HB_UCP_SUCCESS.into()
            }
            None => {
                tracing::debug!(%name, "bpu-sim: model not exists");
                sys::HB_UCP_INVALID_ARGUMENT.into()
            }
        }
    })
}

fn with_graph(
    call: &'static str,
    handle: hbDNNHandle_t,
    f: impl FnOnce(&crate::state::GraphInst) -> i32,
) -> i32 {
    boundary(call, handle as usize, |st, _| {
        match st.graph(handle as usize) {
            Ok(g) => f(g).into(),
            Err(c) => c.into(),
        }
    })
}

/// # Safety
/// `count` is a valid out-pointer; `handle` a live graph handle.
pub unsafe extern "C" fn hbDNNGetInputCount(count: *mut i32, handle: hbDNNHandle_t) -> i32 {
    with_graph("hbDNNGetInputCount", handle, |g| {
        if count.is_null() {
            return sys::HB_UCP_INVALID_ARGUMENT;
        }
        // SAFETY: checked non-null out-pointer.
        unsafe { *count = g.props_in.len() as i32 };
        sys::HB_UCP_SUCCESS
    })
}

/// # Safety
/// `count` is a valid out-pointer; `handle` a live graph handle.
pub unsafe extern "C" fn hbDNNGetOutputCount(count: *mut i32, handle: hbDNNHandle_t) -> i32 {
    with_graph("hbDNNGetOutputCount", handle, |g| {
        if count.is_null() {
            return sys::HB_UCP_INVALID_ARGUMENT;
        }
        // SAFETY: checked non-null out-pointer.
        unsafe { *count = g.props_out.len() as i32 };
        sys::HB_UCP_SUCCESS
    })
}

fn name_at(list: &[std::ffi::CString], name: *mut *const c_char, index: i32) -> i32 {
    if name.is_null() {
        return sys::HB_UCP_INVALID_ARGUMENT;
    }
    match usize::try_from(index).ok().and_then(|i| list.get(i)) {
        Some(n) => {
            // SAFETY: checked non-null out-pointer; the name lives as long as the graph.
            unsafe { *name = n.as_ptr() };
            sys::HB_UCP_SUCCESS
        }
        None => sys::HB_UCP_INVALID_ARGUMENT,
    }
}

/// # Safety
/// `name` is a valid out-pointer; `handle` a live graph handle.
pub unsafe extern "C" fn hbDNNGetInputName(
    name: *mut *const c_char,
    handle: hbDNNHandle_t,
    index: i32,
) -> i32 {
    with_graph("hbDNNGetInputName", handle, |g| {
        name_at(&g.in_names, name, index)
    })
}

/// # Safety
/// `name` is a valid out-pointer; `handle` a live graph handle.
pub unsafe extern "C" fn hbDNNGetOutputName(
    name: *mut *const c_char,
    handle: hbDNNHandle_t,
    index: i32,
) -> i32 {
    with_graph("hbDNNGetOutputName", handle, |g| {
        name_at(&g.out_names, name, index)
    })
}

fn props_at(list: &[hbDNNTensorProperties], out: *mut hbDNNTensorProperties, index: i32) -> i32 {
    if out.is_null() {
        return sys::HB_UCP_INVALID_ARGUMENT;
    }
    match usize::try_from(index).ok().and_then(|i| list.get(i)) {
        Some(p) => {
            // SAFETY: checked non-null out-pointer to a properties struct.
            unsafe { *out = *p };
            sys::HB_UCP_SUCCESS
        }
        None => sys::HB_UCP_INVALID_ARGUMENT,
    }
}

/// # Safety
/// `properties` is a valid out-pointer; `handle` a live graph handle.
pub unsafe extern "C" fn hbDNNGetInputTensorProperties(
    properties: *mut hbDNNTensorProperties,
    handle: hbDNNHandle_t,
    index: i32,
) -> i32 {
    with_graph("hbDNNGetInputTensorProperties", handle, |g| {
        props_at(&g.props_in, properties, index)
    })
}

/// # Safety
/// `properties` is a valid out-pointer; `handle` a live graph handle.
pub unsafe extern "C" fn hbDNNGetOutputTensorProperties(
    properties: *mut hbDNNTensorProperties,
    handle: hbDNNHandle_t,
    index: i32,
) -> i32 {
    with_graph("hbDNNGetOutputTensorProperties", handle, |g| {
        props_at(&g.props_out, properties, index)
    })
}

/// # Safety
/// `cores` is a valid out-pointer; `handle` a live graph handle.
pub unsafe extern "C" fn hbDNNGetCompileBpuCoreNum(cores: *mut i32, handle: hbDNNHandle_t) -> i32 {
    with_graph("hbDNNGetCompileBpuCoreNum", handle, |g| {
        if cores.is_null() {
            return sys::HB_UCP_INVALID_ARGUMENT;
        }
        // SAFETY: checked non-null out-pointer.
        unsafe { *cores = g.desc.compile_cores };
        sys::HB_UCP_SUCCESS
    })
}

/// # Safety
/// `output` / `input` point at arrays of the graph's output / input count; `task` is null
/// (synchronous run) or a valid pointer to a null or not-yet-submitted task.
pub unsafe extern "C" fn hbDNNInferV2(
    task: *mut hbUCPTaskHandle_t,
    output: *mut hbDNNTensor,
    input: *const hbDNNTensor,
    handle: hbDNNHandle_t,
) -> i32 {
    let mut sync_run: Option<usize> = None;
    let code = boundary("hbDNNInferV2", handle as usize, |st, _| {
        let (n_in, n_out, props_in, props_out) = match st.graph(handle as usize) {
            Ok(g) => (
                g.props_in.len(),
                g.props_out.len(),
                g.props_in.clone(),
                g.props_out.clone(),
            ),
            Err(c) => return c.into(),
        };
        if output.is_null() || input.is_null() {
            return sys::HB_UCP_INVALID_ARGUMENT.into();
        }
        // SAFETY: the caller passes arrays of the graph's counts.
        let (ins, outs) = unsafe {
            (
                std::slice::from_raw_parts(input, n_in).to_vec(),
                std::slice::from_raw_parts(output, n_out).to_vec(),
            )
        };
        for (side, props, ts) in [("input", &props_in, &ins), ("output", &props_out, &outs)] {
            let c = st.check_tensors(side, props, ts);
            if c != sys::HB_UCP_SUCCESS {
                return c.into();
            }
        }
        let sub = SubTask {
            graph: handle as usize,
            inputs: ins,
            outputs: outs,
        };
        if task.is_null() {
            let h = st.new_task(Task {
                subtasks: vec![sub],
                state: TaskState::Created,
            });
            sync_run = Some(h);
            return sys::HB_UCP_SUCCESS.into();
        }
        // SAFETY: non-null task pointer owned by the caller.
        let existing = unsafe { *task } as usize;
        if existing == 0 {
            let h = st.new_task(Task {
                subtasks: vec![sub],
                state: TaskState::Created,
            });
            // SAFETY: as above.
            unsafe { *task = h as hbUCPTaskHandle_t };
            return sys::HB_UCP_SUCCESS.into();
        }
        match st.tasks.get_mut(&existing) {
            Some(t) if matches!(t.state, TaskState::Created) => {
                t.subtasks.push(sub);
                sys::HB_UCP_SUCCESS.into()
            }
            Some(_) => sys::HB_UCP_API_USE_ERROR.into(),
            None => sys::HB_UCP_TASK_HANDLE_INVALID.into(),
        }
    });
    match sync_run {
        Some(h) if code == sys::HB_UCP_SUCCESS => boundary("hbDNNInferV2", h, |st, _| {
            let (c, d) = st.execute(h);
            st.drop_task(h);
            AfterLock::SleepThen(d, c)
        }),
        _ => code,
    }
}

/// # Safety
/// None: any integer is accepted; the result is a static string.
pub unsafe extern "C" fn hbDNNGetErrorDesc(status: i32) -> *const c_char {
    string_boundary("hbDNNGetErrorDesc", || description(status))
}

// ---------------------------------------------------------------------------------------------
// libhbucp.so

/// # Safety
/// None: takes no arguments; the result is a static string.
pub unsafe extern "C" fn hbUCPGetVersion() -> *const c_char {
    string_boundary("hbUCPGetVersion", || c"bpu-sim-ucp 0.1.0 (S100 hbUCP ABI)")
}

/// # Safety
/// None: takes no arguments; the result is a static string.
pub unsafe extern "C" fn hbUCPGetSocName() -> *const c_char {
    string_boundary("hbUCPGetSocName", || c"bpu-sim (S100P model, 1 BPU core)")
}

/// # Safety
/// `task` is a live task from `hbDNNInferV2`; `sched` points at a scheduling struct.
pub unsafe extern "C" fn hbUCPSubmitTask(
    task: hbUCPTaskHandle_t,
    sched: *mut hbUCPSchedParam,
) -> i32 {
    boundary("hbUCPSubmitTask", task as usize, |st, fault| {
        if sched.is_null() {
            return sys::HB_UCP_INVALID_ARGUMENT.into();
        }
        // SAFETY: checked non-null; read only.
        let p = unsafe { *sched };
        let core_bits = (1u64 << CORES) - 1;
        let backend_ok = p.backend == sys::HB_UCP_CORE_ANY
            || p.backend == sys::HB_UCP_BPU_CORE_ANY
            || (p.backend & !core_bits == 0);
        let Ok(priority) = u8::try_from(p.priority) else {
            return sys::HB_UCP_INVALID_ARGUMENT.into();
        };
        if !backend_ok {
            return sys::HB_UCP_INVALID_ARGUMENT.into();
        }
        match st.tasks.get(&(task as usize)) {
            None => return sys::HB_UCP_TASK_HANDLE_INVALID.into(),
            Some(t) if !matches!(t.state, TaskState::Created) => {
                return sys::HB_UCP_API_USE_ERROR.into()
            }
            Some(_) => {}
        }
        *st.submits_by_priority.entry(priority).or_default() += 1;
        let (status, mut d) = st.execute(task as usize);
        if let Some(FaultAction::Slow(extra)) = fault {
            d += extra;
        }
        if let Some(t) = st.tasks.get_mut(&(task as usize)) {
            t.state = TaskState::Submitted {
                done_at: Instant::now() + d,
                status,
            };
        }
        sys::HB_UCP_SUCCESS.into()
    })
}

/// # Safety
/// `task` is a live, submitted task.
pub unsafe extern "C" fn hbUCPWaitTaskDone(task: hbUCPTaskHandle_t, timeout_ms: i32) -> i32 {
    boundary("hbUCPWaitTaskDone", task as usize, |st, fault| {
        let Some(t) = st.tasks.get(&(task as usize)) else {
            return sys::HB_UCP_TASK_HANDLE_INVALID.into();
        };
        let TaskState::Submitted { done_at, status } = t.state else {
            return sys::HB_UCP_API_USE_ERROR.into();
        };
        let mut remaining = done_at.saturating_duration_since(Instant::now());
        if let Some(FaultAction::Slow(extra)) = fault {
            remaining += extra;
        }
        let limit = (timeout_ms > 0).then(|| Duration::from_millis(timeout_ms as u64));
        if matches!(fault, Some(FaultAction::Timeout)) {
            return AfterLock::SleepThen(limit.unwrap_or(Duration::ZERO), sys::HB_UCP_TASK_TIMEOUT);
        }
        match limit {
            Some(l) if remaining > l => AfterLock::SleepThen(l, sys::HB_UCP_TASK_TIMEOUT),
            _ => AfterLock::SleepThen(remaining, status),
        }
    })
}

/// # Safety
/// `task` is a task from `hbDNNInferV2`, released once.
pub unsafe extern "C" fn hbUCPReleaseTask(task: hbUCPTaskHandle_t) -> i32 {
    boundary("hbUCPReleaseTask", task as usize, |st, _| {
        st.drop_task(task as usize).into()
    })
}

/// # Safety
/// `mem` is a valid out-pointer.
pub unsafe extern "C" fn hbUCPMallocCached(
    mem: *mut hbUCPSysMem,
    size: u64,
    device_id: i32,
) -> i32 {
    boundary("hbUCPMallocCached", 0, |st, _| {
        if mem.is_null() || device_id != 0 {
            return sys::HB_UCP_INVALID_ARGUMENT.into();
        }
        match st.alloc(size) {
            Ok(m) => {
                // SAFETY: checked non-null out-pointer.
                unsafe { *mem = m };
                sys::HB_UCP_SUCCESS.into()
            }
            Err(c) => c.into(),
        }
    })
}

/// # Safety
/// `mem` points at a struct describing a live allocation or a sub-range of one.
pub unsafe extern "C" fn hbUCPMemFlush(mem: *const hbUCPSysMem, flag: i32) -> i32 {
    boundary("hbUCPMemFlush", 0, |st, _| {
        if mem.is_null() {
            return sys::HB_UCP_INVALID_ARGUMENT.into();
        }
        // SAFETY: checked non-null; read only.
        let m = unsafe { *mem };
        let to_device = match flag {
            sys::HB_SYS_MEM_CACHE_CLEAN => true,
            sys::HB_SYS_MEM_CACHE_INVALIDATE => false,
            _ => return sys::HB_UCP_INVALID_ARGUMENT.into(),
        };
        st.flush(&m, to_device).into()
    })
}

/// # Safety
/// `mem` points at a struct from `hbUCPMallocCached`, freed once.
pub unsafe extern "C" fn hbUCPFree(mem: *mut hbUCPSysMem) -> i32 {
    boundary("hbUCPFree", 0, |st, _| {
        if mem.is_null() {
            return sys::HB_UCP_INVALID_ARGUMENT.into();
        }
        // SAFETY: checked non-null; read only.
        let m = unsafe { *mem };
        st.free(&m).into()
    })
}

/// # Safety
/// None: any integer is accepted; the result is a static string.
pub unsafe extern "C" fn hbUCPGetErrorDesc(status: i32) -> *const c_char {
    string_boundary("hbUCPGetErrorDesc", || description(status))
}

/// The raw table of the simulator's entry points. The field types are the generated ones, so
/// each entry point is checked against our declaration header at compile time.
pub fn raw_table() -> sys::hbdnn_sys_fn_table {
    sys::hbdnn_sys_fn_table {
        hbDNNGetVersion: Some(hbDNNGetVersion),
        hbDNNInitializeFromFiles: Some(hbDNNInitializeFromFiles),
        hbDNNRelease: Some(hbDNNRelease),
        hbDNNGetModelNameList: Some(hbDNNGetModelNameList),
        hbDNNGetModelHandle: Some(hbDNNGetModelHandle),
        hbDNNGetInputCount: Some(hbDNNGetInputCount),
        hbDNNGetOutputCount: Some(hbDNNGetOutputCount),
        hbDNNGetInputName: Some(hbDNNGetInputName),
        hbDNNGetOutputName: Some(hbDNNGetOutputName),
        hbDNNGetInputTensorProperties: Some(hbDNNGetInputTensorProperties),
        hbDNNGetOutputTensorProperties: Some(hbDNNGetOutputTensorProperties),
        hbDNNGetCompileBpuCoreNum: Some(hbDNNGetCompileBpuCoreNum),
        hbDNNInferV2: Some(hbDNNInferV2),
        hbDNNGetErrorDesc: Some(hbDNNGetErrorDesc),
        hbUCPGetVersion: Some(hbUCPGetVersion),
        hbUCPGetSocName: Some(hbUCPGetSocName),
        hbUCPSubmitTask: Some(hbUCPSubmitTask),
        hbUCPWaitTaskDone: Some(hbUCPWaitTaskDone),
        hbUCPReleaseTask: Some(hbUCPReleaseTask),
        hbUCPMallocCached: Some(hbUCPMallocCached),
        hbUCPMemFlush: Some(hbUCPMemFlush),
        hbUCPFree: Some(hbUCPFree),
        hbUCPGetErrorDesc: Some(hbUCPGetErrorDesc),
    }
}

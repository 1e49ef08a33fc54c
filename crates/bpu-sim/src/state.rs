//! One simulator instance: memory pool, buffers with separate host and device copies, packed
//! models, graphs, tasks, fault plan and counters.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{c_char, CString};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use hbdnn_sys as sys;

use crate::config::{FaultAction, FlushPolicy, SimConfig, TimingModel};
use crate::container::{self, Container, GraphDesc, GraphKind, TensorDesc};
use crate::infer_check;
use crate::kernels::{self, Kernel};
use crate::memory::Buffer;

const PHY_BASE: u64 = 0x1_0000_0000;
const TASK_BASE: usize = 0x7A5C_0000;

/// Live-object counters; tests assert they return to their baseline.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimStats {
    pub live_buffers: usize,
    pub live_tasks: usize,
    pub live_packed: usize,
    /// Bytes drawn from the pool (model files + buffers).
    pub pool_used: u64,
    /// Graph runs executed.
    pub runs: u64,
    /// Faults injected so far.
    pub faults_injected: u64,
}

pub(crate) struct GraphInst {
    pub desc: GraphDesc,
    pub props_in: Vec<sys::hbDNNTensorProperties>,
    pub props_out: Vec<sys::hbDNNTensorProperties>,
    pub in_names: Vec<CString>,
    pub out_names: Vec<CString>,
    /// Scale arrays the properties point into.
    _scales: Vec<Box<[f32]>>,
    pub kernel: Box<dyn Kernel>,
    pub file: PathBuf,
}

pub(crate) struct Packed {
    pub files: Vec<PathBuf>,
    /// Graphs, boxed so their addresses serve as handles whatever happens to the Vec.
    #[allow(clippy::vec_box)]
    pub graphs: Vec<Box<GraphInst>>,
    _names: Vec<CString>,
    pub name_ptrs: Vec<*const c_char>,
    pub pool_bytes: u64,
}

pub(crate) struct SubTask {
    pub graph: usize,
    pub inputs: Vec<sys::hbDNNTensor>,
    pub outputs: Vec<sys::hbDNNTensor>,
}

pub(crate) enum TaskState {
    Created,
    Submitted { done_at: Instant, status: i32 },
}

pub(crate) struct Task {
    pub subtasks: Vec<SubTask>,
    pub state: TaskState,
}

pub(crate) struct SimState {
    pub config: SimConfig,
    pub buffers: BTreeMap<u64, Buffer>,
    next_phy: u64,
    /// Keyed by the packed handle value (the Box address).
    pub packed: HashMap<usize, Box<Packed>>,
    /// Graph handle → packed handle.
    pub graph_owner: HashMap<usize, usize>,
    pub tasks: HashMap<usize, Task>,
    next_task: usize,
    pub stats: SimStats,
    /// Tasks submitted per hbUCP priority. One process runs its tasks in submission order, so
    /// the priority changes nothing here; it is recorded so tests can see what a board's
    /// scheduler would be asked for.
    pub submits_by_priority: BTreeMap<u8, u64>,
}

// SAFETY: the raw pointers inside (host copies, name lists, scale arrays) point into heap data
// owned by this state; all access is serialised by the `Mutex` in `Sim`.
unsafe impl Send for SimState {}

impl SimState {
    pub(crate) fn new(config: SimConfig) -> Self {
        Self {
            config,
            buffers: BTreeMap::new(),
            next_phy: PHY_BASE,
            packed: HashMap::new(),
            graph_owner: HashMap::new(),
            tasks: HashMap::new(),
            next_task: TASK_BASE,
            stats: SimStats::default(),
            submits_by_priority: BTreeMap::new(),
        }
    }

    /// Consults the fault plan for `call`.
    pub fn fault(&mut self, call: &'static str) -> Option<FaultAction> {
        let a = self.config.faults.hit(call)?;
        self.stats.faults_injected += 1;
        let status = match &a {
            FaultAction::Status(c) => crate::ffi::status_name(*c).to_owned(),
            FaultAction::Timeout => "HB_UCP_TASK_TIMEOUT".into(),
            FaultAction::AllocFail => "HB_UCP_MEM_ALLOC_FAIL".into(),
            FaultAction::Slow(d) => format!("slow {d:?}"),
            FaultAction::Panic => "panic".into(),
            FaultAction::Evict => "evict (dirty cache lines written back)".into(),
        };
        tracing::warn!(call, fault = %status, "bpu-sim: injected fault");
        Some(a)
    }

    fn pool_take(&mut self, bytes: u64) -> bool {
        if let Some(limit) = self.config.pool_bytes {
            if self.stats.pool_used.saturating_add(bytes) > limit {
                tracing::debug!(
                    bytes,
                    used = self.stats.pool_used,
                    limit,
                    "bpu-sim: pool exhausted"
                );
                return false;
            }
        }
        self.stats.pool_used += bytes;
        true
    }

    pub fn alloc(&mut self, size: u64) -> Result<sys::hbUCPSysMem, i32> {
        let Ok(len) = usize::try_from(size) else {
            return Err(sys::HB_UCP_INVALID_ARGUMENT);
        };
        if len == 0 {
            return Err(sys::HB_UCP_INVALID_ARGUMENT);
        }
        if !self.pool_take(size) {
            return Err(sys::HB_UCP_MEM_ALLOC_FAIL);
        }
        let phy = self.next_phy;
        // Keep a gap between buffers so an off-by-one range never lands in a neighbour.
        self.next_phy += (size.div_ceil(4096) + 1) * 4096;
        let Some(buf) = Buffer::new(phy, len) else {
            self.stats.pool_used -= size;
            return Err(sys::HB_UCP_MEM_ALLOC_FAIL);
        };
        let mem = sys::hbUCPSysMem {
            phyAddr: phy,
            virAddr: buf.vir() as *mut std::ffi::c_void,
            memSize: size,
        };
        self.buffers.insert(phy, buf);
        self.stats.live_buffers += 1;
        Ok(mem)
    }

    /// The buffer holding `[phy, phy+len)`, with the virtual address checked against it.
    pub fn locate(&mut self, mem: &sys::hbUCPSysMem) -> Result<(&mut Buffer, usize), i32> {
        let (_, buf) = self
            .buffers
            .range_mut(..=mem.phyAddr)
            .next_back()
            .ok_or(sys::HB_UCP_MEM_IS_INVALID)?;
        let off = (mem.phyAddr - buf.phy) as usize;
        let len = usize::try_from(mem.memSize).map_err(|_| sys::HB_UCP_MEM_IS_INVALID)?;
        if off.checked_add(len).is_none_or(|e| e > buf.size)
            || mem.virAddr as usize != buf.vir() + off
        {
            return Err(sys::HB_UCP_MEM_IS_INVALID);
        }
        Ok((buf, off))
    }

    pub fn free(&mut self, mem: &sys::hbUCPSysMem) -> i32 {
        match self.buffers.get(&mem.phyAddr) {
            Some(b) if b.vir() == mem.virAddr as usize => {}
            _ => return sys::HB_UCP_MEM_IS_INVALID,
        }
        if let Some(b) = self.buffers.remove(&mem.phyAddr) {
            self.stats.pool_used -= b.size as u64;
            self.stats.live_buffers -= 1;
        }
        sys::HB_UCP_SUCCESS
    }

    pub fn load(&mut self, files: Vec<PathBuf>) -> Result<usize, i32> {
        let mut graphs: Vec<Box<GraphInst>> = Vec::new();
        let mut pool_bytes = 0u64;
        for f in &files {
            let bytes = std::fs::read(f).map_err(|e| {
                tracing::warn!(file = %f.display(), error = %e, "bpu-sim: cannot open model file");
                sys::HB_UCP_FILE_OPEN_FAILED
            })?;
            let c = Container::parse(f, &bytes).map_err(|e| {
                tracing::warn!(error = %e, "bpu-sim: not a loadable sim container");
                sys::HB_UCP_MODEL_INVALID
            })?;
            if let Some(m) = &c.header.march {
                let platform = self.config.platform_march();
                if m != platform {
                    tracing::warn!(file = %f.display(), "bpu-sim: Model march incompatible! model march: {m}, platform march: {platform}");
                    return Err(sys::HB_UCP_MODEL_INCOMPATIBLE);
                }
            }
            pool_bytes += bytes.len() as u64;
            for g in build_graphs(f, &c)? {
                if graphs.iter().any(|h| h.desc.name == g.desc.name) {
                    tracing::debug!(graph = %g.desc.name, file = %f.display(), "duplicate graph name ignored (first file wins)");
                    continue;
                }
                graphs.push(g);
            }
        }
        // A whole .hbm goes into one contiguous carveout buffer on a board.
        if !self.pool_take(pool_bytes) {
            tracing::warn!(files = ?files, bytes = pool_bytes, "bpu-sim: model does not fit the ION pool");
            return Err(sys::HB_UCP_MEM_ALLOC_FAIL);
        }
        let names: Vec<CString> = graphs
            .iter()
            .map(|g| CString::new(g.desc.name.clone()).expect("validated: no NUL in names"))
            .collect();
        let name_ptrs = names.iter().map(|c| c.as_ptr()).collect();
        let packed = Box::new(Packed {
            files,
            graphs,
            _names: names,
            name_ptrs,
            pool_bytes,
        });
        let key = &*packed as *const Packed as usize;
        for g in &packed.graphs {
            self.graph_owner
                .insert(&**g as *const GraphInst as usize, key);
        }
        self.packed.insert(key, packed);
        self.stats.live_packed += 1;
        Ok(key)
    }

    pub fn release(&mut self, key: usize) -> i32 {
        let Some(p) = self.packed.remove(&key) else {
            return sys::HB_UCP_MODEL_INVALID;
        };
        for g in &p.graphs {
            self.graph_owner
                .remove(&(&**g as *const GraphInst as usize));
        }
        self.stats.pool_used -= p.pool_bytes;
        self.stats.live_packed -= 1;
        tracing::debug!(files = ?p.files, "bpu-sim: packed model released");
        sys::HB_UCP_SUCCESS
    }

    pub fn graph(&self, handle: usize) -> Result<&GraphInst, i32> {
        let owner = self
            .graph_owner
            .get(&handle)
            .ok_or(sys::HB_UCP_MODEL_INVALID)?;
        let p = self.packed.get(owner).ok_or(sys::HB_UCP_MODEL_INVALID)?;
        p.graphs
            .iter()
            .find(|g| &***g as *const GraphInst as usize == handle)
            .map(|g| &**g)
            .ok_or(sys::HB_UCP_MODEL_INVALID)
    }

    pub fn new_task(&mut self, t: Task) -> usize {
        self.next_task += 16;
        self.tasks.insert(self.next_task, t);
        self.stats.live_tasks += 1;
        self.next_task
    }

    pub fn drop_task(&mut self, h: usize) -> i32 {
        if self.tasks.remove(&h).is_none() {
            return sys::HB_UCP_TASK_HANDLE_INVALID;
        }
        self.stats.live_tasks -= 1;
        sys::HB_UCP_SUCCESS
    }

    /// Checks each tensor handed to `hbDNNInferV2` as libdnn does ([`crate::infer_check`]),
    /// then that its memory lies in a live buffer large enough for it.
    pub fn check_tensors(
        &mut self,
        side: infer_check::Side,
        props: &[sys::hbDNNTensorProperties],
        ts: &[sys::hbDNNTensor],
    ) -> i32 {
        for (i, (p, t)) in props.iter().zip(ts).enumerate() {
            let need = match infer_check::check_tensor(side, i, p, t, self.config.vir_align) {
                Ok(n) => n,
                Err(msg) => {
                    tracing::warn!("bpu-sim: hbDNNInferV2: {msg}");
                    return sys::HB_UCP_INVALID_ARGUMENT;
                }
            };
            if t.sysMem.memSize < need {
                tracing::warn!(
                    "bpu-sim: hbDNNInferV2: {side} {i} memSize {} is less than the {need} \
                     bytes the tensor needs",
                    t.sysMem.memSize
                );
                return sys::HB_UCP_INVALID_ARGUMENT;
            }
            let m = sys::hbUCPSysMem {
                memSize: need,
                ..t.sysMem
            };
            if self.locate(&m).is_err() {
                return sys::HB_UCP_MEM_IS_INVALID;
            }
        }
        sys::HB_UCP_SUCCESS
    }

    /// `hbUCPMemFlush` of `mem`: a CLEAN (`to_device`) or an INVALIDATE, in whole lines. Under
    /// [`FlushPolicy::Whole`] a range that is not exactly a whole allocation is refused, as a
    /// library that only flushes whole allocations would, and nothing moves.
    pub fn flush(&mut self, mem: &sys::hbUCPSysMem, to_device: bool) -> i32 {
        let whole_only = self.config.flush == FlushPolicy::Whole;
        match self.locate(mem) {
            Ok((buf, off)) => {
                if whole_only && (off != 0 || mem.memSize != buf.size as u64) {
                    tracing::debug!(
                        offset = off,
                        len = mem.memSize,
                        size = buf.size,
                        "bpu-sim: flush of part of an allocation refused (BPU_SIM_FLUSH=whole)"
                    );
                    return sys::HB_UCP_INVALID_ARGUMENT;
                }
                buf.flush(off, mem.memSize as usize, to_device);
                sys::HB_UCP_SUCCESS
            }
            Err(c) => c,
        }
    }

    /// Writes back every dirty cache line of every buffer (an eviction); returns how many.
    pub fn evict(&mut self) -> usize {
        self.buffers.values_mut().map(Buffer::evict).sum()
    }

    /// The bytes of tensor `t` in the graph's own layout `desc` (the given strides may differ
    /// where the graph left them to the runtime).
    fn fetch(&mut self, t: &sys::hbDNNTensor, desc: &TensorDesc) -> Result<Vec<u8>, i32> {
        let own = container::resolved_strides(desc);
        let given = given_strides(t, desc)?;
        let size = container::byte_size(desc);
        let extent = given[0] * desc.shape[0] as usize;
        let (buf, off) = self.locate(&sys::hbUCPSysMem {
            memSize: extent.max(size) as u64,
            ..t.sysMem
        })?;
        let src = &buf.device[off..off + extent.max(size)];
        if given == own {
            return Ok(src[..size].to_vec());
        }
        let mut out = vec![0u8; size];
        kernels::restride(desc, src, &given, &mut out, &own);
        Ok(out)
    }

    /// Stores `data` (the graph's own layout `desc`) into tensor `t` by its given strides.
    fn store(&mut self, t: &sys::hbDNNTensor, desc: &TensorDesc, data: &[u8]) -> Result<(), i32> {
        let own = container::resolved_strides(desc);
        let given = given_strides(t, desc)?;
        let extent = given[0] * desc.shape[0] as usize;
        let (buf, off) = self.locate(&sys::hbUCPSysMem {
            memSize: extent.max(data.len()) as u64,
            ..t.sysMem
        })?;
        let dst = &mut buf.device[off..off + extent.max(data.len())];
        if given == own {
            dst[..data.len()].copy_from_slice(data);
        } else {
            kernels::restride(desc, data, &own, dst, &given);
        }
        Ok(())
    }

    /// Runs every sub-task of a task on the device copies; returns the status and the
    /// modelled duration.
    pub fn execute(&mut self, task: usize) -> (i32, Duration) {
        let Some(t) = self.tasks.get(&task) else {
            return (sys::HB_UCP_TASK_HANDLE_INVALID, Duration::ZERO);
        };
        let subs: Vec<(usize, Vec<sys::hbDNNTensor>, Vec<sys::hbDNNTensor>)> = t
            .subtasks
            .iter()
            .map(|s| (s.graph, s.inputs.clone(), s.outputs.clone()))
            .collect();
        let mut total = Duration::ZERO;
        for (g, ins, outs) in subs {
            match self.run_graph(g, &ins, &outs) {
                Ok(d) => total += d,
                Err(code) => return (code, total),
            }
        }
        (sys::HB_UCP_SUCCESS, total)
    }

    fn run_graph(
        &mut self,
        handle: usize,
        ins: &[sys::hbDNNTensor],
        outs: &[sys::hbDNNTensor],
    ) -> Result<Duration, i32> {
        let (descs_in, descs_out, delay, needs_data) = {
            let g = self.graph(handle)?;
            let delay = timing_for(&g.desc, self.config.timing.as_ref());
            (
                g.desc.inputs.clone(),
                g.desc.outputs.clone(),
                delay,
                g.kernel.needs_data(),
            )
        };
        self.stats.runs += 1;
        if !needs_data {
            let fixed = self
                .graph(handle)?
                .kernel
                .fixed_output0()
                .map(<[u8]>::to_vec);
            if let (Some(bytes), Some(t), Some(d)) = (fixed, outs.first(), descs_out.first()) {
                self.store(t, d, &bytes)?;
            }
            return Ok(delay);
        }
        // Copy inputs out of the device copies first: a buffer may be bound on both sides.
        let in_data = ins
            .iter()
            .zip(&descs_in)
            .map(|(t, d)| self.fetch(t, d))
            .collect::<Result<Vec<_>, _>>()?;
        let mut out_data: Vec<Vec<u8>> = descs_out
            .iter()
            .map(|d| vec![0u8; container::byte_size(d)])
            .collect();
        {
            let g = self.graph(handle)?;
            let in_refs: Vec<&[u8]> = in_data.iter().map(Vec::as_slice).collect();
            let mut out_refs: Vec<&mut [u8]> = out_data.iter_mut().map(Vec::as_mut_slice).collect();
            if let Err(e) = g.kernel.run(&in_refs, &mut out_refs) {
                tracing::warn!(graph = %g.desc.name, file = %g.file.display(), error = %e, "bpu-sim: graph run failed");
                return Err(sys::HB_UCP_TASK_RUN_FAILED);
            }
        }
        for ((t, d), data) in outs.iter().zip(&descs_out).zip(&out_data) {
            self.store(t, d, data)?;
        }
        Ok(delay)
    }
}

/// The strides a tensor was handed over with (checked at `hbDNNInferV2`: resolved, at least
/// tight).
fn given_strides(t: &sys::hbDNNTensor, desc: &TensorDesc) -> Result<Vec<usize>, i32> {
    t.properties.stride[..desc.shape.len()]
        .iter()
        .map(|&s| usize::try_from(s).map_err(|_| sys::HB_UCP_INVALID_ARGUMENT))
        .collect()
}

fn timing_for(desc: &GraphDesc, timing: Option<&TimingModel>) -> Duration {
    let Some(t) = timing else {
        return Duration::ZERO;
    };
    let sized = |hidden: usize| {
        if t.by_package_size {
            TimingModel::s100p(hidden)
        } else {
            *t
        }
    };
    let hidden = desc
        .inputs
        .first()
        .and_then(|i| i.shape.last())
        .map_or(0, |&h| h as usize);
    match &desc.kind {
        GraphKind::Qwen35Text(p) if p.rows > 1 => sized(hidden).prefill,
        GraphKind::Qwen35Text(_) => sized(hidden).decode,
        GraphKind::Visual(_) => t.visual,
        GraphKind::Affine { .. } => Duration::ZERO,
    }
}

/// The properties the runtime reports for `t`: `alignedByteSize` `-1` in a graph with
/// `dynamic` strides; more than one scale = per-axis along the last axis (`quantizeAxis`).
fn properties(
    t: &TensorDesc,
    dynamic: bool,
    scales: &mut Vec<Box<[f32]>>,
) -> sys::hbDNNTensorProperties {
    let mut p = sys::hbDNNTensorProperties::default();
    p.validShape.numDimensions = t.shape.len() as i32;
    p.validShape.dimensionSize[..t.shape.len()].copy_from_slice(&t.shape);
    p.tensorType = t.dtype;
    p.stride[..t.strides.len()].copy_from_slice(&t.strides);
    p.alignedByteSize = if dynamic {
        -1
    } else {
        container::byte_size(t) as i64
    };
    if !t.scale.is_empty() {
        let mut s: Box<[f32]> = t.scale.clone().into_boxed_slice();
        p.scale.scaleLen = s.len() as i32;
        p.scale.scaleData = s.as_mut_ptr();
        p.quantiType = sys::HB_DNN_QUANTI_TYPE_SCALE;
        if s.len() > 1 {
            p.quantizeAxis = t.shape.len() as i32 - 1;
        }
        scales.push(s);
    }
    p
}

#[allow(clippy::vec_box)]
fn build_graphs(file: &std::path::Path, c: &Container) -> Result<Vec<Box<GraphInst>>, i32> {
    let mut out = Vec::new();
    let mut loaded = None;
    for desc in &c.header.graphs {
        let kernel = kernels::build(desc, c, &mut loaded).map_err(|e| {
            tracing::warn!(file = %file.display(), graph = %desc.name, error = %e, "bpu-sim: cannot build graph");
            sys::HB_UCP_MODEL_INVALID
        })?;
        let mut scales = Vec::new();
        let dynamic = desc.kind.dynamic_strides();
        // Cache tensors (text inputs from 4, outputs from 1) may report a padded size.
        let extra = match &desc.kind {
            GraphKind::Qwen35Text(p) if !dynamic => p.cache_aligned_extra as i64,
            _ => 0,
        };
        let props = |ts: &[TensorDesc], first_cache: usize, scales: &mut Vec<Box<[f32]>>| {
            ts.iter()
                .enumerate()
                .map(|(i, t)| {
                    let mut p = properties(t, dynamic, scales);
                    if i >= first_cache {
                        p.alignedByteSize += extra;
                    }
                    p
                })
                .collect::<Vec<_>>()
        };
        let props_in = props(&desc.inputs, 4, &mut scales);
        let props_out = props(&desc.outputs, 1, &mut scales);
        let name = |side: &str, i: usize| CString::new(format!("{side}_{i}")).expect("no NUL");
        out.push(Box::new(GraphInst {
            desc: desc.clone(),
            props_in,
            props_out,
            in_names: (0..desc.inputs.len()).map(|i| name("input", i)).collect(),
            out_names: (0..desc.outputs.len()).map(|i| name("output", i)).collect(),
            _scales: scales,
            kernel,
            file: file.to_owned(),
        }));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sub(mem: &sys::hbUCPSysMem, off: u64, len: u64) -> sys::hbUCPSysMem {
        sys::hbUCPSysMem {
            phyAddr: mem.phyAddr + off,
            virAddr: (mem.virAddr as usize + off as usize) as *mut std::ffi::c_void,
            memSize: len,
        }
    }

    fn write_host(mem: &sys::hbUCPSysMem, at: usize, byte: u8) {
        // SAFETY: `at` lies inside the allocation `mem` describes, which the test owns.
        unsafe { *(mem.virAddr as *mut u8).add(at) = byte };
    }

    #[test]
    fn whole_policy_refuses_every_range_but_the_whole_allocation() {
        let mut st = SimState::new(SimConfig {
            flush: FlushPolicy::Whole,
            ..SimConfig::default()
        });
        let mem = st.alloc(1000).unwrap();
        write_host(&mem, 100, 7);
        for (off, len) in [(64, 64), (0, 999), (1, 999), (100, 4), (0, 64)] {
            let r = sub(&mem, off, len);
            assert_eq!(
                st.flush(&r, true),
                sys::HB_UCP_INVALID_ARGUMENT,
                "{off}+{len}"
            );
            assert_eq!(
                st.flush(&r, false),
                sys::HB_UCP_INVALID_ARGUMENT,
                "{off}+{len}"
            );
        }
        let (buf, _) = st.locate(&mem).unwrap();
        assert_ne!(buf.device[100], 7, "a refused CLEAN moved nothing");
        assert_eq!(st.flush(&mem, true), sys::HB_UCP_SUCCESS);
        let (buf, _) = st.locate(&mem).unwrap();
        assert_eq!(buf.device[100], 7, "the whole CLEAN wrote the line back");
        assert_eq!(st.flush(&mem, false), sys::HB_UCP_SUCCESS);
        // A range outside any allocation is still invalid memory, not a refused range.
        let past = sub(&mem, 990, 20);
        assert_eq!(st.flush(&past, true), sys::HB_UCP_MEM_IS_INVALID);
    }

    #[test]
    fn range_policy_accepts_an_interior_range() {
        let mut st = SimState::new(SimConfig::default());
        let mem = st.alloc(1000).unwrap();
        write_host(&mem, 100, 7);
        assert_eq!(st.flush(&sub(&mem, 100, 4), true), sys::HB_UCP_SUCCESS);
        let (buf, _) = st.locate(&mem).unwrap();
        assert_eq!(buf.device[100], 7);
        assert_eq!(st.flush(&sub(&mem, 64, 64), false), sys::HB_UCP_SUCCESS);
    }
}

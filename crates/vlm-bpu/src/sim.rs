//! What front ends need of the simulator, reached through the runtime so that no front end
//! names `bpu-sim`: building sim packages (the node's embedded demo model) and the live
//! handle counters that diagnostics and leak tests watch.

pub use bpu_sim::container::VERSION as CONTAINER_VERSION;
pub use bpu_sim::package::{make_sim_package, PackageError, PackageOptions};

/// Device buffers and tasks alive in the calling thread's simulator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LiveHandles {
    pub buffers: usize,
    pub tasks: usize,
}

/// The calling thread's simulator counters (the thread that opened a sim package).
pub fn live_handles() -> LiveHandles {
    let st = bpu_sim::Sim::current().stats();
    LiveHandles {
        buffers: st.live_buffers,
        tasks: st.live_tasks,
    }
}

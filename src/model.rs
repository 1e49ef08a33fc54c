//! The model the node opens: the one `model_dir` names (a package, or with `backend:=cpu` an
//! HF checkpoint) or the embedded demo model, with the open options the parameters set.

use vlm::interrupt::Interrupt;
use vlm_bpu::{open_assistant, ModelSource, OpenOptions};

use crate::embedded;
use crate::ros::params::{BackendChoice, Params};

/// The model the parameters ask for (the embedded one when `model_dir` is empty, which
/// [`Params::require_model`] allows only with `demo_model`).
fn source(p: &Params) -> Result<ModelSource, String> {
    match (&p.model_dir, p.backend) {
        (Some(d), BackendChoice::Cpu) => Ok(ModelSource::Hf(d.clone())),
        (Some(d), BackendChoice::Auto) => Ok(ModelSource::Package(d.clone())),
        (None, _) => {
            let root = embedded::cache_root(p.cache_dir.as_deref()).map_err(|e| e.to_string())?;
            let pkg = embedded::ensure_package(&root).map_err(|e| e.to_string())?;
            tracing::warn!(
                package = %pkg.display(),
                "demo_model: running the EMBEDDED TINY RANDOM MODEL on the BPU SIMULATOR \
                 (its answers are random tokens; set model_dir to a package or, with backend:=cpu, \
                 an HF checkpoint)"
            );
            Ok(ModelSource::Package(pkg))
        }
    }
}

/// Opens the model the parameters name, on the worker thread (again after an internal error).
pub(crate) fn open(
    p: &Params,
    interrupt: &Interrupt,
) -> Result<vlm::assistant::Assistant, vlm_bpu::OpenError> {
    let source = source(p).map_err(|reason| vlm::assistant::AssistantError::File {
        path: p.cache_dir.clone().unwrap_or_default(),
        reason,
    })?;
    let mut opts = OpenOptions {
        vision: p.vision,
        interrupt: interrupt.clone(),
        ..OpenOptions::default()
    };
    opts.bpu.priority = p.bpu_priority;
    opts.bpu.timeout = p.bpu_timeout;
    opts.bpu.prefill_tail = p.prefill_tail;
    opts.bpu.pool_check = p.bpu_pool_check;
    opts.bpu.flush = p.bpu_flush;
    opts.bpu.keep_set = p.vision && p.prefill_latest_frame && p.prefill_keep_on_device;
    // The calibrated tail decision is cached beside the embedded package.
    opts.bpu.cache_dir = p.cache_dir.clone();
    open_assistant(&source, &opts)
}

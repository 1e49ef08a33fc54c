//! Opening a model for the assistant: a BLLM package on the BPU (board libraries or the
//! simulator, as its files say), or an HF checkpoint on the CPU. The one place that knows
//! both backends, so the node and the `vlm` binary choose the same way.

use std::path::{Path, PathBuf};

use bpu_sim::Implementation;
use vlm::assistant::{load_tokenizer, Assistant, AssistantError, BackendKind, ModelParts};
use vlm::engine::CpuOptions;
use vlm::interrupt::Interrupt;

use crate::{BpuBackend, BpuError, BpuOptions};

/// Where the model comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// A BLLM package folder (`model.json`); board libraries or the simulator per its files.
    Package(PathBuf),
    /// An HF Qwen3.5 checkpoint folder, run by `qwen35` on the CPU.
    Hf(PathBuf),
}

impl ModelSource {
    pub fn dir(&self) -> &Path {
        match self {
            Self::Package(d) | Self::Hf(d) => d,
        }
    }
}

/// How to open a model.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// `false`: text only; a package's `visual.hbm` is never opened.
    pub vision: bool,
    /// BPU settings (packages); `no_vision` is taken from [`OpenOptions::vision`].
    pub bpu: BpuOptions,
    /// CPU settings (HF checkpoints).
    pub cpu: CpuOptions,
    /// Stops opening between steps (packages: see [`BpuOptions::interrupt`], which takes
    /// this one; HF checkpoints: before the weights are read, which cannot be cut short).
    pub interrupt: Interrupt,
}

impl Default for OpenOptions {
    fn default() -> Self {
        Self {
            vision: true,
            bpu: BpuOptions::default(),
            cpu: CpuOptions::default(),
            interrupt: Interrupt::new(),
        }
    }
}

/// Errors of opening a model.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(transparent)]
    Bpu(#[from] BpuError),
    #[error(transparent)]
    Assistant(#[from] AssistantError),
}

impl OpenError {
    /// An interrupt stopped opening or warming up: not a failure of the model.
    pub fn is_interrupted(&self) -> bool {
        match self {
            Self::Bpu(e) => matches!(e, BpuError::Interrupted { .. }),
            Self::Assistant(e) => e.is_interrupted(),
        }
    }
}

/// Opens a model. For simulator packages the calling thread's simulator runs the graphs.
pub fn open_assistant(source: &ModelSource, opts: &OpenOptions) -> Result<Assistant, OpenError> {
    match source {
        ModelSource::Package(dir) => {
            let mut bpu = opts.bpu.clone();
            bpu.no_vision = !opts.vision;
            bpu.interrupt = opts.interrupt.clone();
            let b = BpuBackend::open(dir, &bpu)?;
            let cfg = b.config().clone();
            let parts = ModelParts {
                name: cfg.name.clone(),
                kind: match b.implementation() {
                    Implementation::Sim => BackendKind::BpuSim,
                    Implementation::Board => BackendKind::Bpu,
                },
                dir: dir.clone(),
                tokenizer: load_tokenizer(&cfg.tokenizer)?,
                chat: cfg.chat,
                dialect: cfg.dialect,
                eos: cfg.eos,
                vision: opts.vision,
            };
            Ok(Assistant::new(Box::new(b), parts)?)
        }
        ModelSource::Hf(dir) => {
            if opts.interrupt.is_raised() {
                return Err(AssistantError::Interrupted {
                    step: "reading the checkpoint".into(),
                }
                .into());
            }
            Ok(Assistant::open_hf(dir, opts.cpu, opts.vision)?)
        }
    }
}

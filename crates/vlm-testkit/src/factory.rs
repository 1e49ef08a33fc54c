//! What a backend suite runs on: a [`BackendFactory`] builds a fresh backend of a fixture
//! model for a [`BackendSpec`] (window, prefill chunk, mask planes). The CPU factory is here; the
//! BPU-over-the-simulator one is a few lines over [`SimPackages`] in `vlm-bpu`'s tests, and a
//! board factory supplies backends from packages compiled for the board the same way.

use std::cell::RefCell;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use bpu_sim::package::PrefillIn;
use bpu_sim::{Sim, SimConfig};
use qwen35::Qwen35Model;
use vlm::engine::{Backend, CpuBackend, CpuOptions, Engine};

use crate::{model_dir, sim_package, tokenizer, LOGIT_TOL};

/// Leading dim of the window mask.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mask {
    /// One plane shared by every head.
    One,
    /// One plane per attention head (the published packages).
    PerHead,
}

/// The backend a scenario asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BackendSpec {
    /// Fixture model (`tiny-sym`, `tiny-4b`, `tiny-untied`).
    pub model: &'static str,
    /// Window capacity CL in rows.
    pub context: usize,
    /// Prefill chunk N; 0 = no prefill graph, every row is stepped.
    pub chunk: usize,
    pub mask: Mask,
}

impl BackendSpec {
    /// `model` with a `context`-row window and `chunk`-row prefill, one mask plane per head.
    pub fn new(model: &'static str, context: usize, chunk: usize) -> Self {
        Self {
            model,
            context,
            chunk,
            mask: Mask::PerHead,
        }
    }

    pub fn mask(self, mask: Mask) -> Self {
        Self { mask, ..self }
    }
}

/// Builds the backend a scenario runs on. One factory serves one test (one thread), so it may
/// keep per-thread state (the simulator instance) and cache what it builds.
pub trait BackendFactory {
    type Backend: Backend;

    /// A fresh backend (empty state) of fixture model `spec.model` with `spec`'s window,
    /// prefill chunk and mask planes; panics (a test failure) when it cannot build one.
    fn open(&self, spec: BackendSpec) -> Self::Backend;

    /// Named tolerance of this backend's f32 logits against the goldens and between its own
    /// schedules.
    fn logit_tol(&self) -> f32 {
        LOGIT_TOL
    }

    /// [`BackendFactory::open`] behind an engine with the fixture tokenizer.
    fn engine(&self, spec: BackendSpec) -> Engine<Self::Backend> {
        Engine::new(self.open(spec), tokenizer())
    }
}

/// `CpuBackend` on the fixture's HF weights; each model is loaded once per factory.
#[derive(Default)]
pub struct CpuFactory {
    models: RefCell<HashMap<&'static str, Arc<Qwen35Model>>>,
}

impl CpuFactory {
    /// The CPU reference other backends are checked against: fixture model `model`, a
    /// 512-row window, every row stepped, one mask plane.
    pub fn reference(model: &'static str) -> Engine<CpuBackend> {
        Self::default().engine(BackendSpec::new(model, 512, 0).mask(Mask::One))
    }
}

impl BackendFactory for CpuFactory {
    type Backend = CpuBackend;

    fn open(&self, spec: BackendSpec) -> CpuBackend {
        let model = self
            .models
            .borrow_mut()
            .entry(spec.model)
            .or_insert_with(|| Arc::new(Qwen35Model::load(&model_dir(spec.model)).unwrap()))
            .clone();
        let mask_heads = match spec.mask {
            Mask::One => 1,
            Mask::PerHead => model.config.text.num_attention_heads,
        };
        let opts = CpuOptions {
            context: Some(spec.context),
            prefill_chunk: spec.chunk,
            mask_heads,
            ..CpuOptions::default()
        };
        CpuBackend::new(model, opts).unwrap()
    }
}

/// Sim packages of the fixture models, one per [`BackendSpec`], written on first use into temporary
/// directories that live as long as this value; a fresh simulator is installed on the
/// creating thread (no faults, no pool limit, whatever the environment says; only the flush
/// policy follows `BPU_SIM_FLUSH`, so the suites rerun against a whole-flush library).
pub struct SimPackages {
    sim: Sim,
    dirs: RefCell<HashMap<BackendSpec, tempfile::TempDir>>,
}

impl Default for SimPackages {
    fn default() -> Self {
        let sim = Sim::new(SimConfig::defaults_with_env_flush().unwrap());
        sim.install();
        Self {
            sim,
            dirs: RefCell::default(),
        }
    }
}

impl SimPackages {
    /// The simulator the packages run on.
    pub fn sim(&self) -> &Sim {
        &self.sim
    }

    /// The package directory of `spec`, written on first use.
    pub fn dir(&self, spec: BackendSpec) -> PathBuf {
        let mut dirs = self.dirs.borrow_mut();
        let dir = dirs.entry(spec).or_insert_with(|| {
            let d = tempfile::tempdir().unwrap();
            sim_package(spec.model, d.path(), |o| {
                o.cache_len = spec.context;
                o.mask_heads_one = spec.mask == Mask::One;
                if spec.chunk == 0 {
                    o.prefill_in = PrefillIn::None;
                    // unused without a prefill graph, but still checked against the window
                    o.prefill_chunk = o.prefill_chunk.min(spec.context);
                } else {
                    o.prefill_chunk = spec.chunk;
                }
            });
            d
        });
        dir.path().to_owned()
    }
}

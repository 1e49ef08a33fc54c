//! The conversation layer shared by `vlm chat` and the ROS node: one model (a BLLM package on
//! the BPU or simulator, or an HF checkpoint on the CPU) answering chat turns.
//!
//! It owns what both front ends would otherwise repeat: the backend (opened by
//! `vlm_bpu::open_assistant`, or [`Assistant::open_hf`] for the CPU) with its tokenizer,
//! the chat template, the system prefix prefilled once and restored per fresh conversation,
//! saved conversations as decode-state snapshots (taken only for a turn that asks,
//! [`Turn::keep`]), the frame priming ([`Assistant::prime_frame`]), the mapping of a turn's settings onto the sampler and the stream, and the
//! interruptible warm-up ([`Assistant::warm_up`]). Where each decode state lives is
//! [`crate::residency::DecodeStates`]'s to decide. It must not know about ROS, threads or
//! async: the caller owns the one thread that drives an [`Assistant`] (BPU handles are not
//! `Send`).
#![forbid(unsafe_code)]

mod frames;
mod priming;
mod system_prefix;
mod turn;
mod warm_up;

pub use frames::ImageKey;
pub use priming::{PrimedFrame, PrimingOutcome};
pub use turn::{Conversation, Reply, Turn};

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde_json::Value;
use tokenizers::Tokenizer;

use crate::chat::{ChatError, ChatTemplate, ImageSlot, SystemOptions, UserTurn};
use crate::engine::{Backend, CpuBackend, CpuOptions, DecodeOptions, Engine, EngineError};
use crate::package::{ChatConfig, ChatFormat, Dialect};
use crate::residency::DecodeStates;
use crate::sampler::Sampler;
use crate::stream::{Completion, Event, FinishReason, StreamConfig};
use crate::structured::{JsonSchemas, SchemaError};

/// Errors of opening a model or answering a turn.
#[derive(Debug, thiserror::Error)]
pub enum AssistantError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("chat template: {0}")]
    Chat(#[from] ChatError),
    #[error("{}: {reason}", path.display())]
    File { path: PathBuf, reason: String },
    /// The turn itself is unusable (empty text, images for a text-only model, ...).
    #[error("invalid turn: {0}")]
    Turn(String),
    /// The turn's JSON schema cannot be used ([`Turn::json_schema`]).
    #[error(transparent)]
    Schema(#[from] SchemaError),
    /// An [`crate::interrupt::Interrupt`] stopped the work before `step` (a graph call or a
    /// load step); the calls before it completed, none after it ran.
    #[error("interrupted before {step}")]
    Interrupted { step: String },
}

impl AssistantError {
    /// The turn did not fit the free window slots.
    pub fn is_context_overflow(&self) -> bool {
        matches!(self, Self::Engine(EngineError::ContextOverflow { .. }))
    }

    /// An [`crate::interrupt::Interrupt`] stopped the work: not a failure of the model.
    pub fn is_interrupted(&self) -> bool {
        matches!(self, Self::Interrupted { .. })
    }
}

/// Any backend behind one type, so the engine, sampler and stream are shared.
pub type AnyBackend = Box<dyn Backend>;

/// Which compute answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// A package on the board's BPU libraries.
    Bpu,
    /// A package on the BPU simulator.
    BpuSim,
    /// An HF checkpoint on the CPU.
    Cpu,
}

impl BackendKind {
    /// The name in logs, diagnostics and `vlm chat`'s banner.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Bpu => "bpu",
            Self::BpuSim => "bpu-sim",
            Self::Cpu => "cpu",
        }
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What an opened backend brings besides compute: the files and settings around the graphs.
#[derive(Debug, Clone)]
pub struct ModelParts {
    pub name: String,
    pub kind: BackendKind,
    /// The package or checkpoint folder.
    pub dir: PathBuf,
    pub tokenizer: Arc<Tokenizer>,
    pub chat: ChatConfig,
    pub dialect: Dialect,
    pub eos: Vec<u32>,
    /// `false`: never offer the tower, even where the backend has one.
    pub vision: bool,
}

/// What was opened, for logs, diagnostics and `vlm chat`'s banner.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelInfo {
    pub name: String,
    pub backend: BackendKind,
    pub dir: PathBuf,
    pub context: usize,
    pub vocab: usize,
    pub hidden: usize,
    /// Image bucket side in pixels; `None` = text only.
    pub image_side: Option<usize>,
    /// The package's (or checkpoint's) own system prompt.
    pub system: String,
}

static NEXT_CONVERSATION: AtomicU64 = AtomicU64::new(1);

/// One model answering turns. Not `Send` with a BPU backend: keep it on one thread.
pub struct Assistant {
    engine: Engine<AnyBackend>,
    template: ChatTemplate,
    eos: Vec<u32>,
    info: ModelInfo,
    /// Where every decode state lives: the current one, cached system blocks, the primed
    /// frame, a stopped priming.
    states: DecodeStates,
    /// A frame priming stopped between graph calls ([`Assistant::resume_priming`]).
    priming: Option<priming::Partial>,
    /// Images sent through the vision tower by [`Assistant::ask`].
    images_encoded: u64,
    /// The model's JSON-schema compiler (token table built on first use).
    schemas: Arc<JsonSchemas>,
}

impl std::fmt::Debug for Assistant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Assistant")
            .field("info", &self.info)
            .finish_non_exhaustive()
    }
}

pub fn load_tokenizer(path: &Path) -> Result<Arc<Tokenizer>, AssistantError> {
    Tokenizer::from_file(path)
        .map(Arc::new)
        .map_err(|e| AssistantError::File {
            path: path.to_owned(),
            reason: format!("cannot load the tokenizer: {e}"),
        })
}

/// eos ids of an HF checkpoint: `generation_config.json`, else `config.json`'s text config.
fn hf_eos(dir: &Path) -> Result<Vec<u32>, AssistantError> {
    let ids = |v: &Value| -> Vec<u32> {
        match v {
            Value::Number(n) => n
                .as_u64()
                .and_then(|x| u32::try_from(x).ok())
                .into_iter()
                .collect(),
            Value::Array(a) => a
                .iter()
                .filter_map(|x| x.as_u64().and_then(|x| u32::try_from(x).ok()))
                .collect(),
            _ => Vec::new(),
        }
    };
    for (file, pointers) in [
        ("generation_config.json", &["/eos_token_id"][..]),
        (
            "config.json",
            &["/text_config/eos_token_id", "/eos_token_id"][..],
        ),
    ] {
        let path = dir.join(file);
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let json: Value = serde_json::from_str(&text).map_err(|e| AssistantError::File {
            path: path.clone(),
            reason: format!("invalid JSON: {e}"),
        })?;
        for p in pointers {
            if let Some(v) = json.pointer(p) {
                let found = ids(v);
                if !found.is_empty() {
                    return Ok(found);
                }
            }
        }
    }
    Ok(Vec::new())
}

impl Assistant {
    /// An assistant over an opened backend (`vlm_bpu::open_assistant` opens either kind).
    pub fn new(backend: AnyBackend, parts: ModelParts) -> Result<Self, AssistantError> {
        let ModelParts {
            name,
            kind,
            dir,
            tokenizer,
            chat,
            dialect,
            eos,
            vision,
        } = parts;
        if eos.is_empty() {
            tracing::warn!(model = %name, "the model declares no eos id: answers end only at max_new_tokens, a stop string or the window end");
        }
        let template = ChatTemplate::new(tokenizer.clone(), &chat, dialect)?;
        let bi = backend.info().clone();
        let info = ModelInfo {
            name,
            backend: kind,
            dir,
            context: bi.context,
            vocab: bi.vocab,
            hidden: bi.hidden,
            // `vision: false` on the CPU keeps the tower loaded but never offers it.
            image_side: bi.vision.filter(|_| vision).map(|v| v.geometry.side),
            system: chat.system.clone(),
        };
        tracing::info!(
            model = %info.name,
            backend = %info.backend,
            context = info.context,
            vision = ?info.image_side,
            "model opened"
        );
        let schemas = Arc::new(JsonSchemas::new(tokenizer.clone(), bi.vocab));
        Ok(Self {
            engine: Engine::new(backend, tokenizer),
            template,
            eos,
            info,
            states: DecodeStates::new(),
            priming: None,
            images_encoded: 0,
            schemas,
        })
    }

    /// An HF Qwen3.5 checkpoint on the CPU.
    pub fn open_hf(dir: &Path, opts: CpuOptions, vision: bool) -> Result<Self, AssistantError> {
        let backend = CpuBackend::load(dir, opts)?;
        let parts = ModelParts {
            name: dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| dir.display().to_string()),
            kind: BackendKind::Cpu,
            dir: dir.to_owned(),
            tokenizer: load_tokenizer(&dir.join("tokenizer.json"))?,
            chat: ChatConfig {
                format: ChatFormat::ChatMl,
                im_start: None,
                im_end: None,
                bos: None,
                system: String::new(),
            },
            dialect: Dialect::Qwen35,
            eos: hf_eos(dir)?,
            vision,
        };
        Self::new(Box::new(backend), parts)
    }

    pub fn info(&self) -> &ModelInfo {
        &self.info
    }

    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }

    pub fn eos(&self) -> &[u32] {
        &self.eos
    }

    /// Decode-state snapshots taken so far: one per kept turn ([`Turn::keep`]) and one per
    /// system block prefilled (cached for the next fresh conversation). Each copies the whole
    /// state out of device memory, which is what makes an unneeded one costly.
    pub fn snapshots(&self) -> u64 {
        self.states.snapshots()
    }

    /// Decode states copied back into the device so far (a conversation, a cached system
    /// block, a primed frame, a stopped priming's snapshot); one a device cache set held in
    /// place ([`crate::engine::Device`]) is not counted.
    pub fn restores(&self) -> u64 {
        self.states.restores()
    }

    /// Where the decode states are, for logs and diagnostics.
    pub fn residency(&self) -> crate::residency::Residency {
        self.states.residency()
    }

    /// Images [`Assistant::ask`] sent through the vision tower (one tower run each); an image
    /// the conversation already held is not counted ([`Turn::image_keys`]).
    pub fn images_encoded(&self) -> u64 {
        self.images_encoded
    }

    /// The JSON-schema compiler of this model, for [`Turn::json_schema`]. `Send + Sync`: a
    /// front end keeps a clone on its request thread and compiles (refuses) there.
    pub fn json_schemas(&self) -> Arc<JsonSchemas> {
        Arc::clone(&self.schemas)
    }

    /// Empties the decode state: after a failure nothing about it can be trusted (saved
    /// conversations, cached system blocks and a host-saved primed frame stay valid).
    pub fn reset_state(&mut self) -> Result<(), EngineError> {
        self.priming = None;
        self.states.reset(&mut **self.engine.backend_mut())
    }

    /// Answers `turn`, continuing `conversation` when given (else a fresh one starting with
    /// the system block), streaming events into `on_event`.
    pub fn ask(
        &mut self,
        conversation: Option<&Conversation>,
        turn: &Turn,
        on_event: &mut dyn FnMut(Event),
    ) -> Result<Reply, AssistantError> {
        self.check_turn(turn)?;
        let slot = match (turn.images.is_empty(), self.info.image_side) {
            (true, _) => None,
            (false, None) => return Err(AssistantError::Engine(EngineError::NoVision)),
            (false, Some(_)) => self.slot(),
        };
        let held = conversation.map_or(&[][..], |c| c.images.as_slice());
        let new = frames::new_images(&turn.images, &turn.image_keys, held);
        if new.skipped > 0 {
            tracing::debug!(
                skipped = new.skipped,
                added = new.images.len(),
                "images already in the conversation are not added again"
            );
        }
        let user = UserTurn {
            text: &turn.text,
            images: slot.map_or_else(Vec::new, |s| vec![s; new.images.len()]),
            thinking: turn.thinking,
        };
        // Rows fed before the turn's own prompt (the system block of a fresh conversation).
        let mut prefix_rows = 0;
        let (prompt, turns, id) = match conversation {
            Some(c) => {
                self.states
                    .load_conversation(&mut **self.engine.backend_mut(), c.id, &c.state)?;
                // A new id: it names a state, and the caller may continue `c` again later
                // (a fork), which must restore `c`, not find this turn's state resident.
                let id = NEXT_CONVERSATION.fetch_add(1, Ordering::Relaxed);
                (self.template.render(None, &user)?, c.turns, id)
            }
            None => {
                let opts = SystemOptions {
                    system: turn.system.clone(),
                    tools: turn.tools.clone(),
                };
                // The turn's cancel and deadline stop the block's prefill as they stop the
                // prompt's: a long block must not hold the worker past either.
                let stop = &mut || system_prefix::stopped(turn).is_some();
                match self.load_prefix(&opts, stop)? {
                    Some(rows) => prefix_rows = rows,
                    None => return self.stopped_in_prefix(turn, on_event),
                }
                (
                    self.template.render_after_system(&user)?,
                    0,
                    NEXT_CONVERSATION.fetch_add(1, Ordering::Relaxed),
                )
            }
        };
        // From here the backend's state is this turn's, whatever happens.
        self.states.touched();
        let mut sampler = Sampler::new(turn.sampling.clone()).map_err(EngineError::from)?;
        sampler.record_probabilities(turn.token_probs);
        sampler.share_drawn(turn.drawn_log.clone());
        let seed = sampler.seed();
        let stream = self.stream_config(turn, prompt.starts_in_think);
        self.images_encoded += new.images.len() as u64;
        let mut gen = match &turn.json_schema {
            Some(schema) => {
                let mut constraint = schema.constraint(&stream.eos);
                self.engine.generate_constrained(
                    &prompt,
                    &new.images,
                    &mut sampler,
                    &mut constraint,
                    stream,
                    on_event,
                )?
            }
            None => self.engine.generate(
                &prompt,
                &new.images,
                &mut sampler,
                stream,
                DecodeOptions::default(),
                on_event,
            )?,
        };
        gen.completion.timings.prompt_tokens += prefix_rows;
        let conversation =
            self.keep_conversation(&gen.completion, turn, id, turns + 1, new.held)?;
        Ok(Reply {
            completion: gen.completion,
            conversation,
            seed,
            constraint: gen.constraint,
            token_probs: sampler.take_probabilities(),
        })
    }

    /// What [`Assistant::ask`] refuses before touching the state.
    fn check_turn(&self, turn: &Turn) -> Result<(), AssistantError> {
        if turn.text.trim().is_empty() {
            return Err(AssistantError::Turn("the prompt is empty".into()));
        }
        turn.check_json_schema()?;
        match &turn.json_schema {
            Some(s) if s.vocab() != self.info.vocab => Err(SchemaError::Vocabulary {
                schema: s.vocab(),
                model: self.info.vocab,
            }
            .into()),
            _ => Ok(()),
        }
    }

    /// The conversation `id` after a finished turn that asks to be kept ([`Turn::keep`]),
    /// saved from the current state; `None` otherwise (a cancelled or timed-out turn is not
    /// continued from: its session goes on from its previous state).
    fn keep_conversation(
        &mut self,
        completion: &Completion,
        turn: &Turn,
        id: u64,
        turns: usize,
        images: Vec<ImageKey>,
    ) -> Result<Option<Conversation>, AssistantError> {
        let finished = matches!(
            completion.finish_reason,
            FinishReason::Stop | FinishReason::Length
        );
        if !(finished && turn.keep) {
            return Ok(None);
        }
        let state = self
            .states
            .save_conversation(&mut **self.engine.backend_mut(), id)?;
        tracing::debug!(
            conversation = id,
            bytes = state.size_bytes(),
            "conversation snapshot"
        );
        Ok(Some(Conversation {
            id,
            state,
            turns,
            images,
        }))
    }

    fn slot(&self) -> Option<ImageSlot> {
        self.info.image_side?;
        self.engine
            .backend()
            .info()
            .vision
            .map(|v| ImageSlot::square(v.geometry.merged_side() as u32))
    }

    /// The stream settings [`Assistant::ask`] and the primed answer use for `turn`.
    fn stream_config(&self, turn: &Turn, starts_in_think: bool) -> StreamConfig {
        let qwen = *self.template.dialect() == Dialect::Qwen35;
        let structured = turn.json_schema.is_some();
        StreamConfig {
            eos: if turn.use_default_stop {
                self.eos.clone()
            } else {
                Vec::new()
            },
            stop: turn.stop.clone(),
            max_new_tokens: turn.max_new_tokens,
            deadline: turn.deadline,
            cancel: turn.cancel.clone(),
            think_split: qwen,
            starts_in_think,
            tool_calls: !structured && (qwen || !turn.tools.is_empty()),
            tools: turn.tools.clone(),
            verbatim_answer: structured,
            think_end: self.template.markers().think_end,
            prompt_tokens: 0,
            started: turn.started,
        }
    }
}

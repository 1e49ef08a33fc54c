//! The conversation layer shared by `vlm chat` and the ROS node: one model (a BLLM package on
//! the BPU or simulator, or an HF checkpoint on the CPU) answering chat turns.
//!
//! It owns what both front ends would otherwise repeat: the backend (opened by
//! `vlm_bpu::open_assistant`, or [`Assistant::open_hf`] for the CPU) with its tokenizer,
//! the chat template, the system prefix prefilled once and restored per fresh conversation,
//! parked conversations as decode-state snapshots (taken only for a turn that asks,
//! [`Turn::keep`]), the mapping of a turn's settings onto the sampler and the stream, and the
//! interruptible warm-up ([`Assistant::warm_up`]). It must not know about ROS, threads or
//! async: the caller owns the one thread that drives an [`Assistant`] (BPU handles are not
//! `Send`).
#![forbid(unsafe_code)]

mod frames;
mod prefill;
mod prefix_cache;
mod warm_up;

pub use frames::ImageKey;
pub use prefill::{ImagePrefill, PrefillOutcome};

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;
use tokenizers::Tokenizer;

use crate::chat::{ChatError, ChatTemplate, ImageSlot, SystemOptions, UserTurn};
use crate::engine::{
    Backend, ConstraintOutcome, CpuBackend, CpuOptions, DecodeOptions, Engine, EngineError,
    ImageInput, StateBlob,
};
use crate::package::{ChatConfig, ChatFormat, Dialect};
use crate::sampler::{Sampler, SamplingParams};
use crate::stream::{Completion, Event, FinishReason, StreamConfig};
use crate::structured::{JsonSchema, JsonSchemas, SchemaError};

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

/// One user turn with its generation settings.
#[derive(Debug, Clone)]
pub struct Turn {
    pub text: String,
    /// Images of the turn, in order (each becomes one image block before the text).
    pub images: Vec<ImageInput>,
    /// `image_keys[i]` names `images[i]` (missing or `None`: no identity, always added). An
    /// image whose key the continued conversation already holds is not added again: the turn
    /// adds only its text and the answer refers to the earlier image block (`frames.rs`).
    pub image_keys: Vec<Option<ImageKey>>,
    pub thinking: bool,
    /// System prompt of a fresh conversation; `None` = the model's own. Ignored when
    /// continuing a conversation (its system block is already in the state).
    pub system: Option<String>,
    /// OpenAI-style tool list, rendered into the system block of a fresh conversation.
    pub tools: Vec<Value>,
    pub sampling: SamplingParams,
    pub max_new_tokens: usize,
    pub stop: Vec<String>,
    /// Stop at the model's eos ids.
    pub use_default_stop: bool,
    pub deadline: Option<Instant>,
    pub cancel: Option<Arc<AtomicBool>>,
    /// TTFT is measured from here (the request's arrival).
    pub started: Instant,
    /// Park the finished conversation ([`Reply::conversation`]) so a later turn can continue
    /// it. A snapshot copies the whole decode state out of device memory (an INVALIDATE of
    /// every cache buffer, tens of MB on the 4B), so only a turn that may be continued asks.
    pub keep: bool,
    /// Structured output: the answer is a JSON value valid under this schema, compiled by
    /// [`Assistant::json_schemas`] — a front end compiles it before queueing, so a bad schema
    /// is refused at once. Tools and stop strings cannot go with it
    /// ([`Turn::check_json_schema`]). The front end also decides, per request: thinking off
    /// unless the request turns it on (then the think block is free and the constraint starts
    /// at the answer's first token), and the repetition / frequency / presence penalties off
    /// unless the request sets them (JSON repeats its punctuation). [`Reply::constraint`]
    /// says whether the value was completed.
    pub json_schema: Option<Arc<JsonSchema>>,
}

impl Turn {
    /// A text turn with greedy decoding and the model's defaults.
    pub fn new(text: impl Into<String>, max_new_tokens: usize) -> Self {
        Self {
            text: text.into(),
            images: Vec::new(),
            image_keys: Vec::new(),
            thinking: false,
            system: None,
            tools: Vec::new(),
            sampling: SamplingParams::default(),
            max_new_tokens,
            stop: Vec::new(),
            use_default_stop: true,
            deadline: None,
            cancel: None,
            started: Instant::now(),
            keep: false,
            json_schema: None,
        }
    }

    /// What cannot go with a JSON schema in one turn: tools (Qwen3.5's tool calls are XML,
    /// not JSON) and stop strings (they could cut the value). `Ok` without a schema.
    pub fn check_json_schema(&self) -> Result<(), SchemaError> {
        if self.json_schema.is_none() {
            return Ok(());
        }
        if !self.tools.is_empty() {
            return Err(SchemaError::Conflict("tools"));
        }
        if !self.stop.is_empty() {
            return Err(SchemaError::Conflict("stop strings"));
        }
        Ok(())
    }
}

/// A conversation parked between turns: the whole decode state after its last answer.
#[derive(Debug, Clone)]
pub struct Conversation {
    id: u64,
    state: StateBlob,
    turns: usize,
    /// Keys of the images prefilled in `state`, in the order they were added.
    images: Vec<ImageKey>,
}

impl Conversation {
    /// Bytes held by the snapshot.
    pub fn size_bytes(&self) -> usize {
        self.state.size_bytes()
    }

    /// Turns answered so far.
    pub fn turns(&self) -> usize {
        self.turns
    }

    /// Window slots the conversation occupies.
    pub fn consumed(&self) -> Option<usize> {
        self.state.consumed()
    }

    /// Keys of the images the conversation holds ([`Turn::image_keys`]).
    pub fn images(&self) -> &[ImageKey] {
        &self.images
    }
}

/// The outcome of one turn.
#[derive(Debug, Clone)]
pub struct Reply {
    pub completion: Completion,
    /// The conversation including this turn; `None` when the turn was not kept
    /// ([`Turn::keep`]) or did not finish (cancel, timeout), so a session continues from its
    /// previous state.
    pub conversation: Option<Conversation>,
    /// Seed the sampler used (reproduce a sampled answer with it).
    pub seed: u64,
    /// With a [`Turn::json_schema`]: whether the answer is a complete value. `Incomplete`
    /// (cut by `max_new_tokens` or the window end) is a failure with the partial text:
    /// `finish_reason` `length`, error `incomplete`. `None` for free text.
    pub constraint: Option<ConstraintOutcome>,
}

impl Reply {
    /// A structured answer that ended before its value did ([`Reply::constraint`]).
    pub fn is_incomplete(&self) -> bool {
        self.constraint == Some(ConstraintOutcome::Incomplete)
    }
}

/// What the backend's decode state currently holds, to skip needless restores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resident {
    Unknown,
    Conversation(u64),
    /// The state of the stopped pre-fill with this id ([`Assistant::resume_prefill`]).
    Prefill(u64),
}

static NEXT_CONVERSATION: AtomicU64 = AtomicU64::new(1);

/// One model answering turns. Not `Send` with a BPU backend: keep it on one thread.
pub struct Assistant {
    engine: Engine<AnyBackend>,
    template: ChatTemplate,
    eos: Vec<u32>,
    info: ModelInfo,
    /// The system blocks prefilled (by their text) and the state right after each.
    prefix: prefix_cache::PrefixCache,
    /// A latest-frame pre-fill stopped between graph calls ([`Assistant::resume_prefill`]).
    partial: Option<prefill::Partial>,
    /// The memory of the last parked pre-fill state, for the next park (an ask waits for it).
    spare_state: Option<StateBlob>,
    /// The pre-fill whose state the backend keeps on the device ([`ImagePrefill`]).
    kept_prefill: Option<u64>,
    resident: Resident,
    /// Decode-state snapshots taken (conversations kept and system prefixes cached).
    snapshots: u64,
    /// Decode states copied back ([`Assistant::restores`]).
    restores: u64,
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
            prefix: prefix_cache::PrefixCache::new(usize::MAX),
            partial: None,
            spare_state: None,
            kept_prefill: None,
            resident: Resident::Unknown,
            snapshots: 0,
            restores: 0,
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
        self.snapshots
    }

    /// Decode states copied back into the device so far (a conversation, a cached system
    /// block, a pre-filled frame, a parked pre-fill's snapshot); one the device kept or parked
    /// ([`crate::engine::Backend::keep`], [`crate::engine::Backend::park`]) is not counted, even
    /// when the backend had to move a parked one out and back.
    pub fn restores(&self) -> u64 {
        self.restores
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

    /// Direct engine access (tests, benchmarks). Invalidates the resident-state shortcut.
    pub fn engine_mut(&mut self) -> &mut Engine<AnyBackend> {
        self.resident = Resident::Unknown;
        &mut self.engine
    }

    /// Answers `turn`, continuing `conversation` when given (else a fresh one starting with
    /// the system block), streaming events into `on_event`.
    pub fn ask(
        &mut self,
        conversation: Option<&Conversation>,
        turn: &Turn,
        on_event: &mut dyn FnMut(Event),
    ) -> Result<Reply, AssistantError> {
        if turn.text.trim().is_empty() {
            return Err(AssistantError::Turn("the prompt is empty".into()));
        }
        turn.check_json_schema()?;
        if let Some(schema) = &turn.json_schema {
            if schema.vocab() != self.info.vocab {
                return Err(SchemaError::Vocabulary {
                    schema: schema.vocab(),
                    model: self.info.vocab,
                }
                .into());
            }
        }
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
                if self.resident != Resident::Conversation(c.id) {
                    self.resident = Resident::Unknown;
                    self.engine.backend_mut().restore(&c.state)?;
                    self.restores += 1;
                }
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
                prefix_rows = self.load_prefix(&opts, &mut || false)?.ok_or_else(|| {
                    AssistantError::Interrupted {
                        step: "the system prefix".into(),
                    }
                })?;
                (
                    self.template.render_after_system(&user)?,
                    0,
                    NEXT_CONVERSATION.fetch_add(1, Ordering::Relaxed),
                )
            }
        };
        // From here the backend's state is this turn's, whatever happens.
        self.resident = Resident::Unknown;
        let mut sampler = Sampler::new(turn.sampling.clone()).map_err(EngineError::from)?;
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
        let finished = matches!(
            gen.completion.finish_reason,
            FinishReason::Stop | FinishReason::Length
        );
        let conversation = if finished && turn.keep {
            let state = self.engine.backend_mut().snapshot()?;
            self.snapshots += 1;
            tracing::debug!(
                conversation = id,
                bytes = state.size_bytes(),
                "conversation snapshot"
            );
            self.resident = Resident::Conversation(id);
            Some(Conversation {
                id,
                state,
                turns: turns + 1,
                images: new.held,
            })
        } else {
            None
        };
        Ok(Reply {
            completion: gen.completion,
            conversation,
            seed,
            constraint: gen.constraint,
        })
    }

    fn slot(&self) -> Option<ImageSlot> {
        self.info.image_side?;
        self.engine
            .backend()
            .info()
            .vision
            .map(|v| ImageSlot::square(v.geometry.merged_side() as u32))
    }

    /// The stream settings [`Assistant::ask`] and the pre-filled answer use for `turn`.
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

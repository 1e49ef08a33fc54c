//! The engine thread: the only thread that touches the model (BPU handles are not `Send`).
//! It opens and warms the model, then takes jobs in arrival order, streams each delta on
//! `/vlm/tokens` as it is generated, publishes the `Answer`, and hands the service response
//! back to the waiting `/ask` task. Conversations with a `session_id` are parked between
//! turns as state snapshots (bounded by memory, least recently used first, idle expiry).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use camera_frame::{CachedFrame, Frame};
use r2r::builtin_interfaces::msg::Time;
use r2r::std_msgs::msg::Header;
use r2r::Publisher;
use serde_json::Value;
use vlm::assistant::{Assistant, AssistantError, BackendKind, Conversation, ModelInfo, Turn};
use vlm_bpu::OpenError;
use vlm::engine::{EngineError, ImageInput};
use vlm::sampler::SamplingParams;
use vlm::stream::{Completion, Event, FinishReason};
use vlm::vision::RgbImage;

use crate::interface::{error_code, finish_reason};
use crate::msgs::msg::{Answer, Token};
use crate::msgs::srv::Ask;
use crate::registry::Registry;

/// Where the images of an ask come from.
#[derive(Clone)]
pub enum Images {
    None,
    /// Frames sent in the request (validated on arrival).
    Request(Vec<Frame>),
    /// The latest frame of a camera topic.
    Camera(CachedFrame),
}

/// A validated request: what to ask and how.
pub struct JobPlan {
    pub prompt: String,
    pub images: Images,
    pub session_id: Option<String>,
    pub system: Option<String>,
    pub tools: Vec<Value>,
    pub sampling: SamplingParams,
    pub thinking: bool,
    pub max_new_tokens: usize,
    pub stop: Vec<String>,
    pub use_default_stop: bool,
    pub deadline: Option<Instant>,
}

/// An admitted request, ready for the engine.
pub struct Job {
    pub id: String,
    pub plan: JobPlan,
    pub arrived: Instant,
    pub cancel: Arc<AtomicBool>,
    pub respond: tokio::sync::oneshot::Sender<Ask::Response>,
}

/// Engine life cycle, as diagnostics report it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineState {
    Loading,
    Ready,
    Busy,
    Failed(String),
}

impl EngineState {
    pub fn as_str(&self) -> &str {
        match self {
            Self::Loading => "loading",
            Self::Ready => "ready",
            Self::Busy => "busy",
            Self::Failed(_) => "error",
        }
    }
}

/// Counters shared with diagnostics.
#[derive(Debug, Clone)]
pub struct EngineStats {
    pub state: EngineState,
    pub model: Option<ModelInfo>,
    pub served: u64,
    pub failed: u64,
    pub last_ttft_s: f64,
    pub last_tokens_per_s: f64,
    pub sessions: usize,
    pub session_bytes: usize,
    /// Simulator live buffers/tasks (`None` on the board or the CPU).
    pub sim_live: Option<(usize, usize)>,
}

impl Default for EngineStats {
    fn default() -> Self {
        Self {
            state: EngineState::Loading,
            model: None,
            served: 0,
            failed: 0,
            last_ttft_s: 0.0,
            last_tokens_per_s: 0.0,
            sessions: 0,
            session_bytes: 0,
            sim_live: None,
        }
    }
}

pub type SharedStats = Arc<Mutex<EngineStats>>;

pub fn update(stats: &SharedStats, f: impl FnOnce(&mut EngineStats)) {
    let mut g = stats.lock().unwrap_or_else(|e| e.into_inner());
    f(&mut g);
}

/// Publishers the engine streams into.
pub struct Outputs {
    pub tokens: Publisher<Token>,
    pub answers: Publisher<Answer>,
}

/// Parked conversations, bounded by memory and idle time.
pub struct Sessions {
    map: HashMap<String, (Conversation, Instant)>,
    budget: usize,
    idle: Duration,
}

impl Sessions {
    pub fn new(budget: usize, idle: Duration) -> Self {
        Self {
            map: HashMap::new(),
            budget,
            idle,
        }
    }

    pub fn bytes(&self) -> usize {
        self.map.values().map(|(c, _)| c.size_bytes()).sum()
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn get(&self, id: &str) -> Option<&Conversation> {
        self.map.get(id).map(|(c, _)| c)
    }

    pub fn put(&mut self, id: String, c: Conversation, now: Instant) {
        self.map.insert(id, (c, now));
        while self.bytes() > self.budget {
            let Some(oldest) = self
                .map
                .iter()
                .min_by_key(|(_, (_, t))| *t)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            tracing::info!(session = %oldest, "session evicted: session_memory_mb is full");
            self.map.remove(&oldest);
        }
    }

    pub fn expire(&mut self, now: Instant) {
        let idle = self.idle;
        self.map.retain(|id, (_, t)| {
            let keep = now.duration_since(*t) < idle;
            if !keep {
                tracing::info!(session = %id, "session expired (idle)");
            }
            keep
        });
    }
}

fn now_stamp() -> Time {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    Time {
        sec: i32::try_from(d.as_secs()).unwrap_or(i32::MAX),
        nanosec: d.subsec_nanos(),
    }
}

/// Settings of the engine thread.
pub struct EngineConfig {
    pub session_memory_bytes: usize,
    pub session_idle: Duration,
    pub warm_up_system: Option<String>,
}

/// Runs on the engine thread: `open` builds the assistant there, `ready` reports the outcome
/// of loading, then jobs are served until the channel closes.
pub fn run(
    open: impl FnOnce() -> Result<Assistant, OpenError>,
    config: EngineConfig,
    jobs: Receiver<Job>,
    outputs: Outputs,
    registry: Arc<Registry>,
    stats: SharedStats,
    ready: tokio::sync::oneshot::Sender<Result<ModelInfo, String>>,
) {
    let loaded = open().and_then(|mut a| {
        a.warm_up(config.warm_up_system.clone())?;
        Ok(a)
    });
    let mut assistant = match loaded {
        Ok(a) => a,
        Err(e) => {
            let msg = format!("{e}");
            update(&stats, |s| s.state = EngineState::Failed(msg.clone()));
            let _ = ready.send(Err(msg));
            return;
        }
    };
    let on_sim = assistant.info().backend == BackendKind::BpuSim;
    let sim_live = || {
        on_sim.then(|| {
            let live = vlm_bpu::sim::live_handles();
            (live.buffers, live.tasks)
        })
    };
    update(&stats, |s| {
        s.state = EngineState::Ready;
        s.model = Some(assistant.info().clone());
        s.sim_live = sim_live();
    });
    let _ = ready.send(Ok(assistant.info().clone()));
    let mut sessions = Sessions::new(config.session_memory_bytes, config.session_idle);
    loop {
        let job = match jobs.recv_timeout(Duration::from_secs(1)) {
            Ok(j) => j,
            Err(RecvTimeoutError::Timeout) => {
                sessions.expire(Instant::now());
                update(&stats, |s| {
                    s.sessions = sessions.len();
                    s.session_bytes = sessions.bytes();
                });
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => break,
        };
        update(&stats, |s| s.state = EngineState::Busy);
        let id = job.id.clone();
        let ok = serve(&mut assistant, &mut sessions, job, &outputs, &stats);
        registry.remove(&id);
        sessions.expire(Instant::now());
        update(&stats, |s| {
            s.state = EngineState::Ready;
            if ok {
                s.served += 1;
            } else {
                s.failed += 1;
            }
            s.sessions = sessions.len();
            s.session_bytes = sessions.bytes();
            s.sim_live = sim_live();
        });
    }
    tracing::info!("engine thread: queue closed, releasing the model");
    drop(assistant);
}

/// Streams Token messages of one request (index without gaps, exactly one `last`).
struct TokenSink<'a> {
    publisher: &'a Publisher<Token>,
    id: &'a str,
    frame_id: &'a str,
    index: u32,
}

impl TokenSink<'_> {
    fn send(&mut self, text: String, reasoning: bool, last: Option<&str>) {
        let msg = Token {
            header: Header {
                stamp: now_stamp(),
                frame_id: self.frame_id.to_owned(),
            },
            request_id: self.id.to_owned(),
            index: self.index,
            text,
            reasoning,
            last: last.is_some(),
            finish_reason: last.unwrap_or("").to_owned(),
        };
        self.index += 1;
        if let Err(e) = self.publisher.publish(&msg) {
            tracing::warn!(request_id = %self.id, error = %e, "could not publish a Token");
        }
    }
}

fn to_rgb(frame: &Frame) -> Result<ImageInput, String> {
    let img = frame.to_rgb8().map_err(|e| e.to_string())?;
    let (w, h) = (img.width() as usize, img.height() as usize);
    RgbImage::new(w, h, img.into_raw())
        .map(ImageInput::Rgb)
        .map_err(|e| e.to_string())
}

/// A failure to report: error code, message.
struct Failure(&'static str, String);

fn classify(e: &AssistantError) -> &'static str {
    match e {
        AssistantError::Engine(EngineError::ContextOverflow { .. }) => error_code::CONTEXT_OVERFLOW,
        AssistantError::Turn(_)
        | AssistantError::Engine(
            EngineError::NoVision | EngineError::Image { .. } | EngineError::Vision(_),
        ) => error_code::INVALID_REQUEST,
        _ => error_code::BACKEND_ERROR,
    }
}

/// Serves one job; true when the answer completed.
fn serve(
    assistant: &mut Assistant,
    sessions: &mut Sessions,
    job: Job,
    outputs: &Outputs,
    stats: &SharedStats,
) -> bool {
    let (image_source, image_stamp) = match &job.plan.images {
        Images::None => (String::new(), Time::default()),
        Images::Request(_) => ("request".to_owned(), Time::default()),
        Images::Camera(c) => (
            c.topic.to_string(),
            Time {
                sec: c.stamp.sec,
                nanosec: c.stamp.nanosec,
            },
        ),
    };
    let mut sink = TokenSink {
        publisher: &outputs.tokens,
        id: &job.id,
        frame_id: &image_source,
        index: 0,
    };
    let _span = tracing::info_span!("ask", request_id = %job.id).entered();
    let early = if job.cancel.load(Ordering::Acquire) {
        Some(FinishReason::Cancelled)
    } else if job.plan.deadline.is_some_and(|d| Instant::now() >= d) {
        Some(FinishReason::Timeout)
    } else {
        None
    };
    let outcome: Result<Completion, Failure> = match early {
        Some(r) => Err(Failure(
            if r == FinishReason::Cancelled {
                error_code::CANCELLED
            } else {
                error_code::TIMEOUT
            },
            format!("{r} before generation started (while queued)"),
        )),
        None => answer(assistant, sessions, &job, &mut sink),
    };
    let (completion, failure) = match outcome {
        Ok(c) => {
            let f = match c.finish_reason {
                FinishReason::Cancelled => Some(Failure(
                    error_code::CANCELLED,
                    "cancelled while generating".into(),
                )),
                FinishReason::Timeout => Some(Failure(
                    error_code::TIMEOUT,
                    "the request's time limit elapsed while generating".into(),
                )),
                _ => None,
            };
            (Some(c), f)
        }
        Err(f) => (None, Some(f)),
    };
    let finish = match (&completion, &failure) {
        (Some(c), _) => c.finish_reason.as_str(),
        (None, Some(Failure(code, _))) if *code == error_code::CANCELLED => {
            finish_reason::CANCELLED
        }
        (None, Some(Failure(code, _))) if *code == error_code::TIMEOUT => finish_reason::TIMEOUT,
        (None, _) => finish_reason::ERROR,
    };
    sink.send(String::new(), false, Some(finish));
    let (text, reasoning, tool_calls, prompt_tokens, completion_tokens, ttft, tps) =
        match &completion {
            Some(c) => {
                let calls: Vec<Value> = c.tool_calls.iter().map(|t| t.to_json()).collect();
                (
                    c.text.clone(),
                    c.reasoning.clone(),
                    if calls.is_empty() {
                        String::new()
                    } else {
                        Value::Array(calls).to_string()
                    },
                    c.timings.prompt_tokens as u32,
                    c.timings.completion_tokens as u32,
                    c.timings.ttft.map_or(0.0, |d| d.as_secs_f64()),
                    c.timings.decode_tokens_per_s.unwrap_or(0.0),
                )
            }
            None => Default::default(),
        };
    if completion.is_some() {
        update(stats, |s| {
            s.last_ttft_s = ttft;
            s.last_tokens_per_s = tps;
        });
    }
    let answer_msg = Answer {
        header: Header {
            stamp: now_stamp(),
            frame_id: image_source.clone(),
        },
        request_id: job.id.clone(),
        prompt: job.plan.prompt.clone(),
        answer: text.clone(),
        reasoning: reasoning.clone(),
        tool_calls_json: tool_calls.clone(),
        image_source: image_source.clone(),
        image_stamp: image_stamp.clone(),
        finish_reason: finish.to_owned(),
        prompt_tokens,
        completion_tokens,
        ttft_s: ttft,
        decode_tokens_per_s: tps,
    };
    if let Err(e) = outputs.answers.publish(&answer_msg) {
        tracing::warn!(error = %e, "could not publish the Answer");
    }
    let (code, message) = match &failure {
        Some(Failure(c, m)) => ((*c).to_owned(), m.clone()),
        None => (String::new(), String::new()),
    };
    if let Some(Failure(c, m)) = &failure {
        tracing::warn!(code = c, "ask failed: {m}");
    } else {
        tracing::info!(
            finish,
            prompt_tokens,
            completion_tokens,
            ttft_s = ttft,
            tok_s = tps,
            "ask answered"
        );
    }
    let response = Ask::Response {
        success: failure.is_none(),
        error_code: code,
        error_message: message,
        request_id: job.id.clone(),
        answer: text,
        reasoning,
        tool_calls_json: tool_calls,
        finish_reason: finish.to_owned(),
        image_source,
        image_stamp,
        prompt_tokens,
        completion_tokens,
        ttft_s: ttft,
        decode_tokens_per_s: tps,
    };
    // The client may have gone away; nothing to do then.
    let _ = job.respond.send(response);
    failure.is_none()
}

fn answer(
    assistant: &mut Assistant,
    sessions: &mut Sessions,
    job: &Job,
    sink: &mut TokenSink<'_>,
) -> Result<Completion, Failure> {
    let images = match &job.plan.images {
        Images::None => Vec::new(),
        Images::Request(frames) => frames
            .iter()
            .enumerate()
            .map(|(i, f)| {
                to_rgb(f).map_err(|e| {
                    Failure(
                        error_code::INVALID_REQUEST,
                        format!("request image {i}: {e}"),
                    )
                })
            })
            .collect::<Result<_, _>>()?,
        Images::Camera(c) => vec![to_rgb(&c.frame).map_err(|e| {
            Failure(
                error_code::NO_IMAGE,
                format!("the latest frame on {} cannot be decoded: {e}", c.topic),
            )
        })?],
    };
    let mut turn = Turn::new(job.plan.prompt.clone(), job.plan.max_new_tokens);
    turn.images = images;
    turn.thinking = job.plan.thinking;
    turn.system = job.plan.system.clone();
    turn.tools = job.plan.tools.clone();
    turn.sampling = job.plan.sampling.clone();
    turn.stop = job.plan.stop.clone();
    turn.use_default_stop = job.plan.use_default_stop;
    turn.deadline = job.plan.deadline;
    turn.cancel = Some(job.cancel.clone());
    turn.started = job.arrived;
    let conversation = job.plan.session_id.as_deref().and_then(|s| sessions.get(s));
    if job.plan.session_id.is_some() && conversation.is_none() {
        tracing::info!(session = ?job.plan.session_id, "new session");
    }
    let mut on_event = |e: Event| {
        if let Event::Text { text, reasoning } = e {
            if !text.is_empty() {
                sink.send(text, reasoning, None);
            }
        }
    };
    match assistant.ask(conversation, &turn, &mut on_event) {
        Ok(reply) => {
            if let (Some(sid), Some(conv)) = (&job.plan.session_id, reply.conversation) {
                tracing::debug!(session = %sid, bytes = conv.size_bytes(), turns = conv.turns(), "session parked");
                sessions.put(sid.clone(), conv, Instant::now());
            }
            Ok(reply.completion)
        }
        Err(e) => Err(Failure(classify(&e), e.to_string())),
    }
}

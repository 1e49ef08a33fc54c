//! The node's parameters: every default is built in (so `vlm_node --ros-args -p name:=value`
//! works without a params file), values given on the command line or in a params file
//! override them, and a value of the wrong type or out of range stops the node at start with
//! a message naming the parameter. `launch/vlm_params.yaml` repeats these defaults and the
//! README's parameter table documents them; a test keeps all three in step.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use r2r::ParameterValue;

use crate::ros::names::{ANSWERS_TOPIC, ASK_ACTION, ASK_SERVICE, CANCEL_SERVICE, TOKENS_TOPIC};

/// One parameter: name, built-in default, one-line description (the README table) and when
/// a new value takes effect.
pub struct Spec {
    pub name: &'static str,
    pub default: fn() -> ParameterValue,
    pub description: &'static str,
    pub apply: Apply,
}

/// When a parameter's new value takes effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Apply {
    /// Read at start only (entities, threads, the model): `ros2 param set` is refused.
    Restart,
    /// Read per ask: `ros2 param set` applies to the next ask.
    NextAsk,
}
use Apply::{NextAsk, Restart};

/// The spec of `name`, if it is a parameter of `vlm_node`.
pub fn spec(name: &str) -> Option<&'static Spec> {
    SPECS.iter().find(|s| s.name == name)
}

fn s(v: &str) -> ParameterValue {
    ParameterValue::String(v.to_owned())
}

/// Every parameter of `vlm_node`, in README order.
pub const SPECS: &[Spec] = &[
    Spec { name: "model_dir", default: || s(""), description: "Package folder (`model.json`), e.g. `/opt/models/qwen35-4b/s100p/ctx4k`, or, with `backend: cpu`, an HF checkpoint folder. Required: empty is a configuration error unless `demo_model` is true.", apply: Restart },
    Spec { name: "demo_model", default: || ParameterValue::Bool(false), description: "With `model_dir` empty, serve the embedded tiny random model on the simulator (random answers: a demo of the path, not a model).", apply: Restart },
    Spec { name: "backend", default: || s("auto"), description: "`auto` follows the package (simulator containers → simulator, real `.hbm` → board libraries); `cpu` runs an HF checkpoint with crates/qwen35.", apply: Restart },
    Spec { name: "vision", default: || ParameterValue::Bool(true), description: "Load the vision tower; false = text only (`visual.hbm` is never opened).", apply: Restart },
    Spec { name: "image_topics", default: || ParameterValue::StringArray(vec!["image_raw".to_owned()]), description: "sensor_msgs/Image topics to cache (raw encodings, or jpeg/png inside Image). Empty strings are ignored. Relative names resolve in the node's namespace.", apply: Restart },
    Spec { name: "compressed_image_topics", default: || ParameterValue::StringArray(vec![String::new()]), description: "sensor_msgs/CompressedImage topics to cache. Empty strings are ignored (ROS YAML cannot hold an empty list).", apply: Restart },
    Spec { name: "default_camera", default: || s(""), description: "Camera used when an ask names none; empty = the first image topic (else the first compressed one).", apply: Restart },
    Spec { name: "camera_qos", default: || s("sensor_data"), description: "QoS of camera subscriptions: `sensor_data` (best effort) or `reliable`.", apply: Restart },
    Spec { name: "max_image_age_s", default: || ParameterValue::Double(0.0), description: "Refuse (`stale_image`) a camera frame older than this, in seconds (>= 0); 0 = no limit.", apply: NextAsk },
    Spec { name: "system_prompt", default: || s(""), description: "System prompt of fresh conversations; empty = the package's `chat.system`.", apply: NextAsk },
    Spec { name: "enable_thinking", default: || ParameterValue::Bool(false), description: "Think before answering (`<think>`); off by default on a robot.", apply: NextAsk },
    Spec { name: "max_new_tokens", default: || ParameterValue::Integer(256), description: "Default cap on generated tokens per ask (1..=32768).", apply: NextAsk },
    Spec { name: "temperature", default: || ParameterValue::Double(0.7), description: "Default sampling temperature, >= 0 (0 = greedy). Defaults follow the Qwen3.5 model card's non-thinking setting.", apply: NextAsk },
    Spec { name: "top_p", default: || ParameterValue::Double(0.8), description: "Default nucleus mass in (0, 1].", apply: NextAsk },
    Spec { name: "top_k", default: || ParameterValue::Integer(20), description: "Default top-k, 0..=1000000 (0 = no limit).", apply: NextAsk },
    Spec { name: "min_p", default: || ParameterValue::Double(0.0), description: "Default min-p in [0, 1].", apply: NextAsk },
    Spec { name: "repetition_penalty", default: || ParameterValue::Double(1.0), description: "Default repetition penalty, > 0 (1 = none).", apply: NextAsk },
    Spec { name: "presence_penalty", default: || ParameterValue::Double(1.5), description: "Default presence penalty in [-100, 100] (0 = none).", apply: NextAsk },
    Spec { name: "seed", default: || ParameterValue::Integer(-1), description: "Default sampling seed, -1..=9223372036854775807; -1 = a fresh seed per ask.", apply: NextAsk },
    Spec { name: "queue_depth", default: || ParameterValue::Integer(4), description: "Requests held at once, the running one included (1..=1024); one more gets `busy` at once.", apply: Restart },
    Spec { name: "request_timeout_s", default: || ParameterValue::Double(120.0), description: "Default time limit of an ask from its arrival (queue wait included), in seconds (>= 0); 0 = none.", apply: NextAsk },
    Spec { name: "max_request_images", default: || ParameterValue::Integer(4), description: "Most images one ask may send (`images` and `compressed_images` together, 0..=64); more is `invalid_request`.", apply: NextAsk },
    Spec { name: "max_prompt_bytes", default: || ParameterValue::Integer(65536), description: "Longest `prompt` and `system_prompt` of an ask in UTF-8 bytes (1..=16777216); longer is `invalid_request`.", apply: NextAsk },
    Spec { name: "max_stop_strings", default: || ParameterValue::Integer(16), description: "Most `stop` strings of an ask (0..=1024), each at most 256 bytes; more is `invalid_request`. The stop filter's cost grows with them (BENCHMARKS.md).", apply: NextAsk },
    Spec { name: "max_tools_json_bytes", default: || ParameterValue::Integer(65536), description: "Longest `tools_json` of an ask in bytes (0..=16777216); longer is `invalid_request`.", apply: NextAsk },
    Spec { name: "max_json_schema_bytes", default: || ParameterValue::Integer(16384), description: "Longest `json_schema` of an ask in bytes (0..=1048576; 0 refuses every schema); longer is `invalid_request`. A schema is compiled before queueing: its cost grows with its size.", apply: NextAsk },
    Spec { name: "bpu_priority", default: || ParameterValue::Integer(0), description: "BPU task priority, 0..=255.", apply: Restart },
    Spec { name: "bpu_timeout_s", default: || ParameterValue::Double(30.0), description: "Longest wait for one BPU graph call, in seconds (> 0; the 4B's longest is ~0.74 s). A call that takes longer fails its request with `backend_error`, leaves the BPU runtime unusable, and the node exits for a restart (exit code 70).", apply: Restart },
    Spec { name: "prefill_tail", default: || s("auto"), description: "How a prompt tail runs on the BPU: auto (padded when the package sets prefill_pads and a calibration at start-up finds the pad layout and marking, cached per package; else stepped), stepped, pads_first, pads_last.", apply: Restart },
    Spec { name: "bpu_pool_check", default: || s("warn"), description: "ION pool preflight before loading: strict (refuse when the pool is too small or cannot be identified), warn (never refuse: warn and load when it looks too small, naming hb_switch_ion.sh, or cannot be identified), off.", apply: Restart },
    Spec { name: "bpu_flush", default: || s("auto"), description: "Cache flushes of part of a BPU buffer: auto (probed at start; whole buffers when the runtime refuses a range), range (refuse to start on such a runtime), whole (always whole buffers).", apply: Restart },
    Spec { name: "prefill_latest_frame", default: || ParameterValue::Bool(true), description: "While no ask is queued, run the newest frame of `prefill_camera` through the vision tower and prefill it after the system prompt, so an ask about it prefills only its question. Costs up to `prefill_duty` of the BPU on an idle robot.", apply: Restart },
    Spec { name: "prefill_camera", default: || s(""), description: "Camera whose frames are pre-filled; empty = the default camera.", apply: Restart },
    Spec { name: "prefill_duty", default: || ParameterValue::Double(0.5), description: "Most share of wall time pre-fills keep the BPU busy, in (0, 1].", apply: Restart },
    Spec { name: "prefill_max_age_s", default: || ParameterValue::Double(10.0), description: "An ask without `max_image_age_s` is served from a pre-filled frame at most this old (else from the newest frame).", apply: Restart },
    Spec { name: "prefill_keep_on_device", default: || ParameterValue::Bool(true), description: "Keep the completed pre-fill in a third decode cache set on the BPU, so an ask about its frame starts from it without copying the state back, whatever ran since; costs one more cache set of device memory (325 MB on the 4B ctx4k package, 90 MB on ctx512), and when that cannot be had the node starts without it. false: the state is copied back for each such ask (~65 MB).", apply: Restart },
    Spec { name: "ask_service", default: || s(ASK_SERVICE), description: "Name of the Ask service.", apply: Restart },
    Spec { name: "tokens_topic", default: || s(TOKENS_TOPIC), description: "Topic of streamed Token deltas (reliable, deep history).", apply: Restart },
    Spec { name: "answers_topic", default: || s(ANSWERS_TOPIC), description: "Topic of finished Answers.", apply: Restart },
    Spec { name: "cancel_service", default: || s(CANCEL_SERVICE), description: "Name of the Cancel service.", apply: Restart },
    Spec { name: "action_name", default: || s(ASK_ACTION), description: "Name of the Ask action (bpu_vlm_msgs/action/Ask).", apply: Restart },
    Spec { name: "action_result_timeout_s", default: || ParameterValue::Double(900.0), description: "A finished action goal (its status and result) is kept this long, in seconds (> 0), then forgotten, as rcl_action's result timeout.", apply: Restart },
    Spec { name: "diagnostics_period_s", default: || ParameterValue::Double(1.0), description: "Period of `/diagnostics` (diagnostic_msgs/DiagnosticArray), in seconds (> 0).", apply: Restart },
    Spec { name: "session_memory_mb", default: || ParameterValue::Integer(1024), description: "Memory for parked conversations (state snapshots), 0..=1048576 MiB; the least recently used go first. A quarter of it holds the cached system prompts.", apply: Restart },
    Spec { name: "session_idle_s", default: || ParameterValue::Double(600.0), description: "A conversation unused this long (seconds, > 0) is dropped.", apply: Restart },
    Spec { name: "cache_dir", default: || s(""), description: "Where the embedded model's sim package is written; empty = `$XDG_CACHE_HOME/bpu_vlm` or `~/.cache/bpu_vlm`.", apply: Restart },
];

/// A topic list as a parameter value: an empty list is `[""]`, because ROS YAML cannot hold an
/// empty list and `ros2 param dump` must write a file the node accepts back.
fn topic_list(topics: &[String]) -> ParameterValue {
    if topics.is_empty() {
        ParameterValue::StringArray(vec![String::new()])
    } else {
        ParameterValue::StringArray(topics.to_vec())
    }
}

/// An `f32` parameter as the double its decimal spelling is (0.7, not 0.699999988079071), so
/// `ros2 param get` and `dump` show the value as it was written.
fn f32_value(x: f32) -> ParameterValue {
    ParameterValue::Double(x.to_string().parse().unwrap_or(f64::from(x)))
}

/// A parameter that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("parameter `{name}`: {reason}")]
pub struct ParamError {
    pub name: &'static str,
    pub reason: String,
}

/// How the model is run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendChoice {
    Auto,
    Cpu,
}

/// Camera subscription QoS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CameraQos {
    SensorData,
    Reliable,
}

/// The typed, validated parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    pub model_dir: Option<PathBuf>,
    pub demo_model: bool,
    pub backend: BackendChoice,
    pub vision: bool,
    pub image_topics: Vec<String>,
    pub compressed_image_topics: Vec<String>,
    pub default_camera: Option<String>,
    pub camera_qos: CameraQos,
    pub max_image_age_s: f64,
    pub system_prompt: Option<String>,
    pub enable_thinking: bool,
    pub max_new_tokens: u32,
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: u32,
    pub min_p: f32,
    pub repetition_penalty: f32,
    pub presence_penalty: f32,
    pub seed: Option<u64>,
    pub queue_depth: usize,
    pub request_timeout_s: f64,
    pub max_request_images: usize,
    pub max_prompt_bytes: usize,
    pub max_stop_strings: usize,
    pub max_tools_json_bytes: usize,
    pub max_json_schema_bytes: usize,
    pub bpu_priority: u8,
    /// `bpu_timeout_s`, checked by `vlm_bpu::timeout_from_secs`.
    pub bpu_timeout: Duration,
    pub prefill_tail: vlm_bpu::PrefillTail,
    pub bpu_pool_check: vlm_bpu::PoolCheck,
    pub bpu_flush: vlm_bpu::FlushOption,
    pub prefill_latest_frame: bool,
    /// `None`: the default camera.
    pub prefill_camera: Option<String>,
    pub prefill_duty: f64,
    pub prefill_max_age_s: f64,
    pub prefill_keep_on_device: bool,
    pub ask_service: String,
    pub tokens_topic: String,
    pub answers_topic: String,
    pub cancel_service: String,
    pub action_name: String,
    pub action_result_timeout_s: f64,
    pub diagnostics_period_s: f64,
    pub session_memory_bytes: usize,
    pub session_idle_s: f64,
    pub cache_dir: Option<PathBuf>,
}

/// Where the published 4B package goes on the board (the example in messages and docs).
pub const EXAMPLE_MODEL_DIR: &str = "/opt/models/qwen35-4b/s100p/ctx4k";

/// Upper bound of `max_new_tokens` (a request above it is absurd, not just long).
pub const MAX_NEW_TOKENS_LIMIT: u32 = 32768;

/// A time limit in seconds that cannot be one.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
pub enum InvalidLimit {
    #[error("{0} is not a finite number of seconds >= 0")]
    NotSeconds(f64),
    /// Representable as an `f64` but not as a `Duration`, or not as a deadline on the
    /// monotonic clock (`Instant` + the limit overflows).
    #[error("{0} s is too long to be a time limit")]
    TooLong(f64),
}

/// A time limit as `max_image_age_s` and `request_timeout_s` (and the request fields that
/// override them) spell it: seconds, `0` meaning no limit. A limit must fit a `Duration` and a
/// deadline from now (1e300 fits an `f64` and neither), so no later `Instant + limit` panics.
pub fn time_limit(secs: f64) -> Result<Option<Duration>, InvalidLimit> {
    if !secs.is_finite() || secs < 0.0 {
        return Err(InvalidLimit::NotSeconds(secs));
    }
    if secs == 0.0 {
        return Ok(None);
    }
    Duration::try_from_secs_f64(secs)
        .ok()
        .filter(|d| Instant::now().checked_add(*d).is_some())
        .map(Some)
        .ok_or(InvalidLimit::TooLong(secs))
}

/// Whether a time parameter may be 0.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Zero {
    /// 0 = no limit.
    NoLimit,
    /// A period or an idle time: 0 makes no sense.
    Refused,
}

/// A positive time parameter as a `Duration`; [`Params::from_values`] has checked it, this
/// keeps a hand-built `Params` from panicking in `Duration::from_secs_f64`.
fn period(name: &'static str, secs: f64) -> Result<Duration, ParamError> {
    match time_limit(secs) {
        Ok(Some(d)) => Ok(d),
        Ok(None) => Err(ParamError {
            name,
            reason: "must be > 0".into(),
        }),
        Err(e) => Err(ParamError {
            name,
            reason: e.to_string(),
        }),
    }
}

struct Reader<'a> {
    given: &'a HashMap<String, ParameterValue>,
}

impl Reader<'_> {
    fn value(&self, name: &'static str) -> Result<ParameterValue, ParamError> {
        let spec = SPECS
            .iter()
            .find(|s| s.name == name)
            .ok_or_else(|| ParamError {
                name,
                reason: "not a parameter of vlm_node".into(),
            })?;
        Ok(match self.given.get(name) {
            None | Some(ParameterValue::NotSet) => (spec.default)(),
            Some(v) => v.clone(),
        })
    }

    fn bad(name: &'static str, want: &str, got: &ParameterValue) -> ParamError {
        ParamError {
            name,
            reason: format!("expected {want}, got {got:?}"),
        }
    }

    fn string(&self, name: &'static str) -> Result<String, ParamError> {
        match self.value(name)? {
            ParameterValue::String(s) => Ok(s),
            v => Err(Self::bad(name, "a string", &v)),
        }
    }

    fn opt_string(&self, name: &'static str) -> Result<Option<String>, ParamError> {
        let v = self.string(name)?;
        Ok(if v.trim().is_empty() { None } else { Some(v) })
    }

    fn bool(&self, name: &'static str) -> Result<bool, ParamError> {
        match self.value(name)? {
            ParameterValue::Bool(b) => Ok(b),
            v => Err(Self::bad(name, "a bool", &v)),
        }
    }

    fn int(
        &self,
        name: &'static str,
        range: std::ops::RangeInclusive<i64>,
    ) -> Result<i64, ParamError> {
        match self.value(name)? {
            ParameterValue::Integer(i) if range.contains(&i) => Ok(i),
            ParameterValue::Integer(i) => Err(ParamError {
                name,
                reason: format!("{i} is outside {}..={}", range.start(), range.end()),
            }),
            v => Err(Self::bad(name, "an integer", &v)),
        }
    }

    /// Integers are accepted for doubles (`max_image_age_s: 0` in YAML is an integer).
    fn double(
        &self,
        name: &'static str,
        ok: impl Fn(f64) -> bool,
        want: &str,
    ) -> Result<f64, ParamError> {
        let x = match self.value(name)? {
            ParameterValue::Double(d) => d,
            ParameterValue::Integer(i) => i as f64,
            v => return Err(Self::bad(name, "a number", &v)),
        };
        if x.is_finite() && ok(x) {
            Ok(x)
        } else {
            Err(ParamError {
                name,
                reason: format!("{x} is not {want}"),
            })
        }
    }

    /// A double the sampler holds as an `f32`: checked again after the cast, since a finite
    /// f64 can round to an infinite (1e39) or zero (1e-46) f32 that the range never saw.
    fn float(
        &self,
        name: &'static str,
        ok: impl Fn(f64) -> bool,
        want: &str,
    ) -> Result<f32, ParamError> {
        let x = self.double(name, &ok, want)?;
        let f = x as f32;
        if f.is_finite() && ok(f64::from(f)) {
            Ok(f)
        } else {
            Err(ParamError {
                name,
                reason: format!("{x} is {f} as a 32-bit float, which is not {want}"),
            })
        }
    }

    /// A time in seconds that also fits a `Duration` and a deadline ([`time_limit`]).
    fn seconds(&self, name: &'static str, zero: Zero) -> Result<f64, ParamError> {
        let (ok, want): (fn(f64) -> bool, _) = match zero {
            Zero::NoLimit => (|x| x >= 0.0, ">= 0"),
            Zero::Refused => (|x| x > 0.0, "> 0"),
        };
        let x = self.double(name, ok, want)?;
        time_limit(x).map_err(|e| ParamError {
            name,
            reason: e.to_string(),
        })?;
        Ok(x)
    }

    fn topics(&self, name: &'static str) -> Result<Vec<String>, ParamError> {
        let list = match self.value(name)? {
            ParameterValue::StringArray(v) => v,
            ParameterValue::String(s) => vec![s],
            v => return Err(Self::bad(name, "a list of topic names", &v)),
        };
        let mut out: Vec<String> = Vec::new();
        for t in list
            .into_iter()
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty())
        {
            if out.contains(&t) {
                return Err(ParamError {
                    name,
                    reason: format!("topic {t:?} is listed twice"),
                });
            }
            out.push(t);
        }
        Ok(out)
    }
}

impl Params {
    /// Defaults overridden by `given` (the node's parameters from the command line / file).
    pub fn from_values(given: &HashMap<String, ParameterValue>) -> Result<Self, ParamError> {
        for name in given.keys() {
            if !SPECS.iter().any(|s| s.name == name) && !name.starts_with("use_sim_time") {
                tracing::warn!(parameter = %name, "unknown parameter ignored");
            }
        }
        let r = Reader { given };
        let backend = match r.string("backend")?.as_str() {
            "auto" | "" => BackendChoice::Auto,
            "cpu" => BackendChoice::Cpu,
            other => {
                return Err(ParamError {
                    name: "backend",
                    reason: format!("{other:?} is not one of auto, cpu"),
                })
            }
        };
        let camera_qos = match r.string("camera_qos")?.as_str() {
            "sensor_data" => CameraQos::SensorData,
            "reliable" => CameraQos::Reliable,
            other => {
                return Err(ParamError {
                    name: "camera_qos",
                    reason: format!("{other:?} is not one of sensor_data, reliable"),
                })
            }
        };
        let unit = |x: f64| (0.0..=1.0).contains(&x);
        let bpu_timeout = r.double("bpu_timeout_s", |_| true, "a finite number")?;
        let bpu_timeout = vlm_bpu::timeout_from_secs(bpu_timeout).map_err(|reason| ParamError {
            name: "bpu_timeout_s",
            reason,
        })?;
        let prefill_tail = r
            .string("prefill_tail")?
            .parse()
            .map_err(|reason| ParamError {
                name: "prefill_tail",
                reason,
            })?;
        let bpu_pool_check = r
            .string("bpu_pool_check")?
            .parse()
            .map_err(|reason| ParamError {
                name: "bpu_pool_check",
                reason,
            })?;
        let p = Self {
            model_dir: r.opt_string("model_dir")?.map(PathBuf::from),
            demo_model: r.bool("demo_model")?,
            backend,
            vision: r.bool("vision")?,
            image_topics: r.topics("image_topics")?,
            compressed_image_topics: r.topics("compressed_image_topics")?,
            default_camera: r.opt_string("default_camera")?,
            camera_qos,
            max_image_age_s: r.seconds("max_image_age_s", Zero::NoLimit)?,
            system_prompt: r.opt_string("system_prompt")?,
            enable_thinking: r.bool("enable_thinking")?,
            max_new_tokens: r.int("max_new_tokens", 1..=i64::from(MAX_NEW_TOKENS_LIMIT))? as u32,
            temperature: r.float("temperature", |x| x >= 0.0, ">= 0")?,
            top_p: r.float("top_p", |x| x > 0.0 && x <= 1.0, "in (0, 1]")?,
            top_k: r.int("top_k", 0..=1_000_000)? as u32,
            min_p: r.float("min_p", unit, "in [0, 1]")?,
            repetition_penalty: r.float("repetition_penalty", |x| x > 0.0, "> 0")?,
            presence_penalty: r.float(
                "presence_penalty",
                |x| x.abs() <= 100.0,
                "in [-100, 100]",
            )?,
            seed: u64::try_from(r.int("seed", -1..=i64::MAX)?).ok(),
            queue_depth: r.int("queue_depth", 1..=1024)? as usize,
            request_timeout_s: r.seconds("request_timeout_s", Zero::NoLimit)?,
            max_request_images: r.int("max_request_images", 0..=64)? as usize,
            max_prompt_bytes: r.int("max_prompt_bytes", 1..=1 << 24)? as usize,
            max_stop_strings: r.int("max_stop_strings", 0..=1024)? as usize,
            max_tools_json_bytes: r.int("max_tools_json_bytes", 0..=1 << 24)? as usize,
            max_json_schema_bytes: r.int("max_json_schema_bytes", 0..=1 << 20)? as usize,
            bpu_priority: r.int("bpu_priority", 0..=255)? as u8,
            prefill_tail,
            bpu_pool_check,
            bpu_flush: r
                .string("bpu_flush")?
                .parse()
                .map_err(|reason| ParamError {
                    name: "bpu_flush",
                    reason,
                })?,
            prefill_latest_frame: r.bool("prefill_latest_frame")?,
            prefill_camera: r.opt_string("prefill_camera")?,
            prefill_duty: r.double("prefill_duty", |x| x > 0.0 && x <= 1.0, "in (0, 1]")?,
            prefill_max_age_s: r.double("prefill_max_age_s", |x| x >= 0.0, ">= 0")?,
            prefill_keep_on_device: r.bool("prefill_keep_on_device")?,
            bpu_timeout,
            ask_service: r.string("ask_service")?,
            tokens_topic: r.string("tokens_topic")?,
            answers_topic: r.string("answers_topic")?,
            cancel_service: r.string("cancel_service")?,
            action_name: r.string("action_name")?,
            action_result_timeout_s: r.seconds("action_result_timeout_s", Zero::Refused)?,
            diagnostics_period_s: r.seconds("diagnostics_period_s", Zero::Refused)?,
            session_memory_bytes: (r.int("session_memory_mb", 0..=1 << 20)? as usize) << 20,
            session_idle_s: r.seconds("session_idle_s", Zero::Refused)?,
            cache_dir: r.opt_string("cache_dir")?.map(PathBuf::from),
        };
        for (name, cam) in [
            ("default_camera", &p.default_camera),
            ("prefill_camera", &p.prefill_camera),
        ] {
            if let Some(cam) = cam {
                if !p.image_topics.contains(cam) && !p.compressed_image_topics.contains(cam) {
                    return Err(ParamError {
                        name,
                        reason: format!(
                            "{cam:?} is not in image_topics or compressed_image_topics"
                        ),
                    });
                }
            }
        }
        if p.backend == BackendChoice::Cpu && p.model_dir.is_none() {
            return Err(ParamError {
                name: "model_dir",
                reason: "backend cpu needs an HF checkpoint folder".into(),
            });
        }
        p.check_sampling_defaults()?;
        Ok(p)
    }

    /// The runtime's own check of the defaults an ask without sampling fields uses: a value
    /// it refuses is refused once here, not on every such ask.
    fn check_sampling_defaults(&self) -> Result<(), ParamError> {
        let defaults = vlm::sampler::SamplingParams {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k as usize,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            presence_penalty: self.presence_penalty,
            seed: self.seed,
            ..Default::default()
        };
        defaults.validate().map_err(|e| ParamError {
            name: match e {
                vlm::sampler::SamplerError::BadParam { name, .. } => name,
                _ => "temperature",
            },
            reason: e.to_string(),
        })
    }

    /// `diagnostics_period_s` as a `Duration`.
    pub fn diagnostics_period(&self) -> Result<Duration, ParamError> {
        period("diagnostics_period_s", self.diagnostics_period_s)
    }

    /// `action_result_timeout_s` as a `Duration`.
    pub fn action_result_timeout(&self) -> Result<Duration, ParamError> {
        period("action_result_timeout_s", self.action_result_timeout_s)
    }

    /// `session_idle_s` as a `Duration`.
    pub fn session_idle(&self) -> Result<Duration, ParamError> {
        period("session_idle_s", self.session_idle_s)
    }

    /// A model to serve: `model_dir`, or the embedded demo model when `demo_model` is true.
    /// Neither is a configuration error (a robot must not answer with random tokens because
    /// a setting was missed).
    pub fn require_model(&self) -> Result<(), ParamError> {
        if self.model_dir.is_none() && !self.demo_model {
            return Err(ParamError {
                name: "model_dir",
                reason: format!(
                    "empty: set it to the model package folder, e.g. model_dir:={EXAMPLE_MODEL_DIR} \
                     (with backend:=cpu, an HF checkpoint folder), or set demo_model:=true to \
                     serve the embedded tiny random model"
                ),
            });
        }
        Ok(())
    }

    /// The camera an ask without one uses.
    pub fn default_camera(&self) -> Option<String> {
        self.default_camera.clone().or_else(|| {
            self.image_topics
                .first()
                .or(self.compressed_image_topics.first())
                .cloned()
        })
    }

    /// The effective values, for the node's parameter list.
    pub fn effective(&self) -> Vec<(&'static str, ParameterValue)> {
        let st = |v: &Option<String>| s(v.as_deref().unwrap_or(""));
        let path = |v: &Option<PathBuf>| {
            s(&v.as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_default())
        };
        vec![
            ("model_dir", path(&self.model_dir)),
            ("demo_model", ParameterValue::Bool(self.demo_model)),
            (
                "backend",
                s(match self.backend {
                    BackendChoice::Auto => "auto",
                    BackendChoice::Cpu => "cpu",
                }),
            ),
            ("vision", ParameterValue::Bool(self.vision)),
            ("image_topics", topic_list(&self.image_topics)),
            (
                "compressed_image_topics",
                topic_list(&self.compressed_image_topics),
            ),
            ("default_camera", st(&self.default_camera)),
            (
                "camera_qos",
                s(match self.camera_qos {
                    CameraQos::SensorData => "sensor_data",
                    CameraQos::Reliable => "reliable",
                }),
            ),
            (
                "max_image_age_s",
                ParameterValue::Double(self.max_image_age_s),
            ),
            ("system_prompt", st(&self.system_prompt)),
            (
                "enable_thinking",
                ParameterValue::Bool(self.enable_thinking),
            ),
            (
                "max_new_tokens",
                ParameterValue::Integer(i64::from(self.max_new_tokens)),
            ),
            ("temperature", f32_value(self.temperature)),
            ("top_p", f32_value(self.top_p)),
            ("top_k", ParameterValue::Integer(i64::from(self.top_k))),
            ("min_p", f32_value(self.min_p)),
            ("repetition_penalty", f32_value(self.repetition_penalty)),
            ("presence_penalty", f32_value(self.presence_penalty)),
            (
                "seed",
                ParameterValue::Integer(
                    self.seed.and_then(|x| i64::try_from(x).ok()).unwrap_or(-1),
                ),
            ),
            (
                "queue_depth",
                ParameterValue::Integer(self.queue_depth as i64),
            ),
            (
                "request_timeout_s",
                ParameterValue::Double(self.request_timeout_s),
            ),
            (
                "max_request_images",
                ParameterValue::Integer(self.max_request_images as i64),
            ),
            (
                "max_prompt_bytes",
                ParameterValue::Integer(self.max_prompt_bytes as i64),
            ),
            (
                "max_stop_strings",
                ParameterValue::Integer(self.max_stop_strings as i64),
            ),
            (
                "max_tools_json_bytes",
                ParameterValue::Integer(self.max_tools_json_bytes as i64),
            ),
            (
                "max_json_schema_bytes",
                ParameterValue::Integer(self.max_json_schema_bytes as i64),
            ),
            (
                "bpu_priority",
                ParameterValue::Integer(i64::from(self.bpu_priority)),
            ),
            (
                "bpu_timeout_s",
                ParameterValue::Double(self.bpu_timeout.as_secs_f64()),
            ),
            ("prefill_tail", s(self.prefill_tail.as_str())),
            ("bpu_pool_check", s(self.bpu_pool_check.as_str())),
            ("bpu_flush", s(self.bpu_flush.as_str())),
            (
                "prefill_latest_frame",
                ParameterValue::Bool(self.prefill_latest_frame),
            ),
            ("prefill_camera", st(&self.prefill_camera)),
            ("prefill_duty", ParameterValue::Double(self.prefill_duty)),
            (
                "prefill_max_age_s",
                ParameterValue::Double(self.prefill_max_age_s),
            ),
            (
                "prefill_keep_on_device",
                ParameterValue::Bool(self.prefill_keep_on_device),
            ),
            ("ask_service", s(&self.ask_service)),
            ("tokens_topic", s(&self.tokens_topic)),
            ("answers_topic", s(&self.answers_topic)),
            ("cancel_service", s(&self.cancel_service)),
            ("action_name", s(&self.action_name)),
            (
                "action_result_timeout_s",
                ParameterValue::Double(self.action_result_timeout_s),
            ),
            (
                "diagnostics_period_s",
                ParameterValue::Double(self.diagnostics_period_s),
            ),
            (
                "session_memory_mb",
                ParameterValue::Integer((self.session_memory_bytes >> 20) as i64),
            ),
            (
                "session_idle_s",
                ParameterValue::Double(self.session_idle_s),
            ),
            ("cache_dir", path(&self.cache_dir)),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_listed_once() {
        let p = Params::from_values(&HashMap::new()).unwrap();
        assert_eq!(p.image_topics, vec!["image_raw".to_owned()]);
        assert!(p.compressed_image_topics.is_empty());
        assert_eq!(p.default_camera().as_deref(), Some("image_raw"));
        assert!(!p.enable_thinking);
        let names: Vec<_> = p.effective().iter().map(|(n, _)| *n).collect();
        let specs: Vec<_> = SPECS.iter().map(|s| s.name).collect();
        assert_eq!(names, specs);
    }

    #[test]
    fn an_empty_model_dir_needs_demo_model() {
        let p = Params::from_values(&HashMap::new()).unwrap();
        assert!(!p.demo_model);
        let e = p.require_model().unwrap_err();
        assert_eq!(e.name, "model_dir");
        assert!(e.to_string().contains(EXAMPLE_MODEL_DIR), "{e}");
        assert!(e.to_string().contains("demo_model:=true"), "{e}");
        let mut given = HashMap::new();
        given.insert("demo_model".to_owned(), ParameterValue::Bool(true));
        let p = Params::from_values(&given).unwrap();
        p.require_model().unwrap();
        given.insert("demo_model".to_owned(), ParameterValue::Bool(false));
        given.insert("model_dir".to_owned(), ParameterValue::String("/m".into()));
        let p = Params::from_values(&given).unwrap();
        p.require_model().unwrap();
        given.insert("demo_model".to_owned(), ParameterValue::Integer(1));
        assert_eq!(Params::from_values(&given).unwrap_err().name, "demo_model");
    }

    #[test]
    fn wrong_types_and_ranges_name_the_parameter() {
        let mut given = HashMap::new();
        given.insert("queue_depth".to_owned(), ParameterValue::Integer(0));
        let e = Params::from_values(&given).unwrap_err();
        assert_eq!(e.name, "queue_depth");
        given.clear();
        given.insert("vision".to_owned(), ParameterValue::String("yes".into()));
        assert_eq!(Params::from_values(&given).unwrap_err().name, "vision");
        given.clear();
        given.insert("max_image_age_s".to_owned(), ParameterValue::Integer(2));
        assert_eq!(Params::from_values(&given).unwrap().max_image_age_s, 2.0);
        given.insert(
            "default_camera".to_owned(),
            ParameterValue::String("/nope".into()),
        );
        assert_eq!(
            Params::from_values(&given).unwrap_err().name,
            "default_camera"
        );
        given.remove("default_camera");
        given.insert(
            "prefill_camera".to_owned(),
            ParameterValue::String("/nope".into()),
        );
        assert_eq!(
            Params::from_values(&given).unwrap_err().name,
            "prefill_camera"
        );
    }

    #[test]
    fn the_prefill_tail_and_the_pool_check_reach_the_bpu_options() {
        let p = Params::from_values(&HashMap::new()).unwrap();
        assert_eq!(
            (p.prefill_tail, p.bpu_pool_check),
            (vlm_bpu::PrefillTail::Auto, vlm_bpu::PoolCheck::Warn)
        );
        let mut given = HashMap::new();
        given.insert("prefill_tail".to_owned(), s("pads_first"));
        given.insert("bpu_pool_check".to_owned(), s("strict"));
        given.insert("bpu_flush".to_owned(), s("whole"));
        let p = Params::from_values(&given).unwrap();
        assert_eq!(
            (p.prefill_tail, p.bpu_pool_check),
            (vlm_bpu::PrefillTail::PadsFirst, vlm_bpu::PoolCheck::Strict)
        );
        assert_eq!(p.bpu_flush, vlm_bpu::FlushOption::Whole);
        assert_eq!(
            Params::from_values(&HashMap::new()).unwrap().bpu_flush,
            vlm_bpu::FlushOption::Auto
        );
        for (name, bad) in [
            ("prefill_tail", "padded"),
            ("bpu_pool_check", "maybe"),
            ("bpu_flush", "partial"),
        ] {
            let mut given = HashMap::new();
            given.insert(name.to_owned(), s(bad));
            let e = Params::from_values(&given).unwrap_err();
            assert_eq!(e.name, name);
            assert!(e.to_string().contains(bad), "{e}");
        }
    }

    #[test]
    fn the_bpu_timeout_is_a_positive_time_hbucp_can_hold() {
        let p = Params::from_values(&HashMap::new()).unwrap();
        assert_eq!(p.bpu_timeout, vlm_bpu::DEFAULT_TIMEOUT);
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e300] {
            let mut given = HashMap::new();
            given.insert("bpu_timeout_s".to_owned(), ParameterValue::Double(bad));
            let e = Params::from_values(&given).unwrap_err();
            assert_eq!(e.name, "bpu_timeout_s", "{bad}");
        }
        let mut given = HashMap::new();
        given.insert("bpu_timeout_s".to_owned(), ParameterValue::Double(0.25));
        let p = Params::from_values(&given).unwrap();
        assert_eq!(p.bpu_timeout, Duration::from_millis(250));
    }

    #[test]
    fn time_limits() {
        assert_eq!(time_limit(0.0), Ok(None));
        assert_eq!(time_limit(1.5), Ok(Some(Duration::from_millis(1500))));
        assert!(time_limit(-1.0).is_err());
        assert!(time_limit(f64::NAN).is_err());
        assert!(time_limit(f64::INFINITY).is_err());
        // Fits an f64, not a Duration (1e300) or only not a deadline (9.3e18 s > i64::MAX s).
        for secs in [1e300, f64::MAX, 1.9e19, 9.3e18] {
            assert_eq!(time_limit(secs), Err(InvalidLimit::TooLong(secs)), "{secs}");
        }
        assert!(time_limit(1e9).is_ok());
    }

    /// Every time parameter: NaN, ±inf, a value that overflows a `Duration` or a deadline, and
    /// a negative are configuration errors naming the parameter (1e300 used to pass the range
    /// check and panic in `Duration::from_secs_f64`).
    #[test]
    fn bad_time_parameters_name_the_parameter() {
        let names = [
            "max_image_age_s",
            "request_timeout_s",
            "diagnostics_period_s",
            "session_idle_s",
        ];
        for name in names {
            for bad in [
                f64::NAN,
                f64::INFINITY,
                f64::NEG_INFINITY,
                1e300,
                9.3e18,
                -1.0,
            ] {
                let given = HashMap::from([(name.to_owned(), ParameterValue::Double(bad))]);
                let e = Params::from_values(&given).unwrap_err();
                assert_eq!(e.name, name, "{name} = {bad}: {e}");
            }
            let given = HashMap::from([(name.to_owned(), ParameterValue::Double(1e6))]);
            assert!(Params::from_values(&given).is_ok(), "{name} = 1e6");
        }
        for name in ["diagnostics_period_s", "session_idle_s"] {
            let given = HashMap::from([(name.to_owned(), ParameterValue::Double(0.0))]);
            assert_eq!(Params::from_values(&given).unwrap_err().name, name);
        }
        let p = Params::from_values(&HashMap::new()).unwrap();
        assert_eq!(p.diagnostics_period().unwrap(), Duration::from_secs(1));
        assert_eq!(p.session_idle().unwrap(), Duration::from_secs(600));
        let hand_built = Params {
            diagnostics_period_s: 1e300,
            ..p
        };
        assert_eq!(
            hand_built.diagnostics_period().unwrap_err().name,
            "diagnostics_period_s"
        );
    }

    /// A finite f64 inside the range can still be an f32 outside it: 1e39 is inf and 1e-46
    /// is 0 as an f32, which every ask using the defaults would then be refused for.
    #[test]
    fn sampling_defaults_are_checked_as_the_f32_the_sampler_gets() {
        for (name, bad) in [
            ("temperature", 1e39),
            ("repetition_penalty", 1e39),
            ("top_p", 1e-46),
        ] {
            let given = HashMap::from([(name.to_owned(), ParameterValue::Double(bad))]);
            let e = Params::from_values(&given).unwrap_err();
            assert_eq!(e.name, name, "{bad}: {e}");
            assert!(e.to_string().contains("32-bit"), "{name} = {bad}: {e}");
        }
        let given = HashMap::from([("temperature".to_owned(), ParameterValue::Double(3e38))]);
        assert_eq!(Params::from_values(&given).unwrap().temperature, 3e38);
        let hand_built = Params {
            top_p: 0.0,
            ..Params::from_values(&HashMap::new()).unwrap()
        };
        assert_eq!(
            hand_built.check_sampling_defaults().unwrap_err().name,
            "top_p"
        );
    }

    #[test]
    fn request_limits_are_parameters_with_ranges() {
        let p = Params::from_values(&HashMap::new()).unwrap();
        assert_eq!(
            (
                p.max_request_images,
                p.max_prompt_bytes,
                p.max_stop_strings,
                p.max_tools_json_bytes,
                p.max_json_schema_bytes
            ),
            (4, 65536, 16, 65536, 16384)
        );
        for (name, bad) in [
            ("max_request_images", 65),
            ("max_request_images", -1),
            ("max_prompt_bytes", 0),
            ("max_stop_strings", 1025),
            ("max_tools_json_bytes", -1),
            ("max_json_schema_bytes", -1),
            ("max_json_schema_bytes", (1 << 20) + 1),
        ] {
            let given = HashMap::from([(name.to_owned(), ParameterValue::Integer(bad))]);
            assert_eq!(Params::from_values(&given).unwrap_err().name, name, "{bad}");
        }
    }

    /// The value as the YAML file and the README table spell it.
    fn spelled(v: &ParameterValue) -> String {
        match v {
            ParameterValue::Bool(b) => b.to_string(),
            ParameterValue::Integer(i) => i.to_string(),
            ParameterValue::Double(d) => format!("{d:?}"),
            ParameterValue::String(s) => format!("{s:?}"),
            ParameterValue::StringArray(a) => format!(
                "[{}]",
                a.iter()
                    .map(|s| format!("{s:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            other => format!("{other:?}"),
        }
    }

    #[test]
    fn params_file_and_readme_repeat_the_built_in_defaults() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let yaml = std::fs::read_to_string(root.join("launch/vlm_params.yaml")).unwrap();
        let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
        let yaml_values: HashMap<&str, &str> = yaml
            .lines()
            .filter_map(|l| {
                let l = l.split(" #").next()?.trim();
                let (k, v) = l.split_once(':')?;
                Some((k.trim(), v.trim()))
            })
            .collect();
        for spec in SPECS {
            let want = spelled(&(spec.default)());
            assert_eq!(
                yaml_values.get(spec.name).copied(),
                Some(want.as_str()),
                "launch/vlm_params.yaml: {}",
                spec.name
            );
            let row = format!("| `{}` | `{}` |", spec.name, want);
            assert!(readme.contains(&row), "README parameter table lacks {row}");
        }
    }
}

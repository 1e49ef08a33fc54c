//! The node's parameters, each declared once (the `declare!` table below): its name,
//! type, built-in default, accepted values ([`Kind`]), when a new value takes effect
//! ([`Apply`]) and description. From that one entry come [`SPECS`], the reading and checking
//! of values ([`Params::from_values`]), the values in force ([`Params::effective`]), the
//! descriptions `ros2 param describe` shows (`crate::ros::param_server`) and the parameter table of
//! docs/parameters.md (a test renders it and compares).
//!
//! Every default is built in (so `vlm_node --ros-args -p name:=value` works without a params
//! file), values given on the command line or in a params file override them, and a value of
//! the wrong type or out of range stops the node at start with a message naming the parameter.
//! `launch/vlm_params.yaml` repeats these defaults; a test keeps it in step.

mod kind;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use r2r::ParameterValue;

use crate::ros::names::{ANSWERS_TOPIC, ASK_ACTION, ASK_SERVICE, CANCEL_SERVICE, TOKENS_TOPIC};
use kind::Param;
pub use kind::{closed, Bound, Kind, Span, ABOVE_0, AT_LEAST_0, SHARE};

/// One parameter: name, built-in default, accepted values, description (docs/parameters.md)
/// and when a new value takes effect.
pub struct Spec {
    pub name: &'static str,
    pub default: fn() -> ParameterValue,
    pub kind: Kind,
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
    /// Read at start and at each lifecycle configure (the model and the worker): `ros2 param
    /// set` is accepted while the node is unconfigured and applies at the next configure.
    Configure,
}

/// The spec of `name`, if it is a parameter of `vlm_node`.
pub fn spec(name: &str) -> Option<&'static Spec> {
    SPECS.iter().find(|s| s.name == name)
}

fn s(v: &str) -> ParameterValue {
    ParameterValue::String(v.to_owned())
}
fn b(v: bool) -> ParameterValue {
    ParameterValue::Bool(v)
}
fn i(v: i64) -> ParameterValue {
    ParameterValue::Integer(v)
}
fn d(v: f64) -> ParameterValue {
    ParameterValue::Double(v)
}
fn list(v: &[&str]) -> ParameterValue {
    ParameterValue::StringArray(v.iter().map(|t| (*t).to_owned()).collect())
}

/// The value `name` is given, or its default (also for "not set").
fn given_or(
    given: &HashMap<String, ParameterValue>,
    name: &str,
    default: fn() -> ParameterValue,
) -> ParameterValue {
    match given.get(name) {
        None | Some(ParameterValue::NotSet) => default(),
        Some(v) => v.clone(),
    }
}

/// A parameter's name: its field's, unless the entry spells it (`field as "name"`).
macro_rules! param_name {
    ($field:ident) => {
        stringify!($field)
    };
    ($field:ident, $name:literal) => {
        $name
    };
}

/// Declares every parameter once, as
/// `field [as "name"]: Type = default, kind, Restart | NextAsk, "description";`,
/// and derives from the list the [`Params`] struct, [`SPECS`], the reading of each field and
/// [`Params::effective`]. Adding a parameter is one entry here (and its use).
macro_rules! declare {
    ($(
        $(#[$doc:meta])*
        $field:ident $(as $name:literal)? : $ty:ty = $default:expr, $kind:expr, $apply:ident,
            $about:literal;
    )*) => {
        /// The typed, validated parameters.
        #[derive(Debug, Clone, PartialEq)]
        pub struct Params {
            $($(#[$doc])* pub $field: $ty,)*
        }

        /// Every parameter of `vlm_node`, in the order of docs/parameters.md.
        pub const SPECS: &[Spec] = &[$(
            Spec {
                name: param_name!($field $(, $name)?),
                default: || $default,
                kind: $kind,
                description: $about,
                apply: Apply::$apply,
            },
        )*];

        impl Params {
            /// Each field from `given` or its default, checked on its own.
            fn read_each(given: &HashMap<String, ParameterValue>) -> Result<Self, ParamError> {
                Ok(Self {$(
                    $field: <$ty as Param>::read(
                        param_name!($field $(, $name)?),
                        &$kind,
                        given_or(given, param_name!($field $(, $name)?), || $default),
                    )?,
                )*})
            }

            /// The values in force, for the node's parameter list, in [`SPECS`] order.
            pub fn effective(&self) -> Vec<(&'static str, ParameterValue)> {
                vec![$((param_name!($field $(, $name)?), self.$field.value(&$kind)),)*]
            }
        }
    };
}

/// `>= 0.01`: the sampler's own lower bound, which the default is checked against too.
const REPETITION_PENALTY: Span = Span {
    lo: Bound::Incl(vlm::sampler::MIN_REPETITION_PENALTY),
    hi: Bound::None,
};

declare! {
    model_dir: Option<PathBuf> = s(""), Kind::Text, Configure,
        "Package folder (`model.json`), e.g. `/opt/models/qwen35-4b/s100p/ctx4k`, or, with \
        `backend: cpu`, an HF checkpoint folder. Required: empty is a configuration error unless \
        `demo_model` is true.";
    demo_model: bool = b(false), Kind::Bool, Configure,
        "With `model_dir` empty, serve the embedded tiny random model on the simulator (random \
        answers: a demo of the path, not a model).";
    backend: BackendChoice = s("auto"), Kind::Choice(&["auto", "cpu"]), Configure,
        "`auto` follows the package (simulator containers → simulator, real `.hbm` → board \
        libraries); `cpu` runs an HF checkpoint with crates/qwen35.";
    vision: bool = b(true), Kind::Bool, Restart,
        "Load the vision tower; `false` = text only (`visual.hbm` is never opened).";
    image_topics: Vec<String> = list(&["image_raw"]), Kind::Topics, Restart,
        "sensor_msgs/Image topics to cache (raw encodings, or jpeg/png inside Image). Empty \
        strings are ignored. Relative names resolve in the node's namespace.";
    compressed_image_topics: Vec<String> = list(&[""]), Kind::Topics, Restart,
        "sensor_msgs/CompressedImage topics to cache. Empty strings are ignored (ROS YAML cannot \
        hold an empty list).";
    default_camera: Option<String> = s(""), Kind::Text, Restart,
        "Camera used when an ask names none; empty = the first image topic (else the first \
        compressed one).";
    camera_qos: CameraQos = s("sensor_data"), Kind::Choice(&["sensor_data", "reliable"]), Restart,
        "QoS of camera subscriptions: `sensor_data` (best effort) or `reliable`.";
    max_image_age_s: f64 = d(0.0), Kind::Seconds(AT_LEAST_0), NextAsk,
        "Refuse (`stale_image`) a camera frame older than this, in seconds; 0 = no limit.";
    max_camera_silence_s: f64 = d(2.0), Kind::Seconds(AT_LEAST_0), NextAsk,
        "Refuse (`stale_image`, \"camera silent for N s\") an ask that uses a camera when no \
        valid frame arrived on it for longer than this, in seconds, whatever frame the answer \
        would use (a dead camera is an error, not an old answer); 0 = off.";
    system_prompt: Option<String> = s(""), Kind::Text, NextAsk,
        "System prompt of fresh conversations; empty = the package's `chat.system`. At most \
        `max_prompt_bytes` UTF-8 bytes (a longer value is refused).";
    enable_thinking: bool = b(false), Kind::Bool, NextAsk,
        "Think before answering (`<think>`); off by default on a robot.";
    max_new_tokens: u32 = i(256), Kind::Int { min: 1, max: MAX_NEW_TOKENS_LIMIT as i64 }, NextAsk,
        "Default cap on generated tokens per ask (cut to `max_request_new_tokens` when above it).";
    max_request_new_tokens: u32 = i(4096),
        Kind::Int { min: 1, max: MAX_NEW_TOKENS_LIMIT as i64 }, NextAsk,
        "Most generated tokens one ask may ask for: a `max_new_tokens` above it is \
        `invalid_request`, so no client holds the worker longer than the node allows.";
    temperature: f32 = d(0.7), Kind::Real(AT_LEAST_0), NextAsk,
        "Default sampling temperature (below 1e-6, 0 included, = greedy). Defaults follow the \
        Qwen3.5 model card's non-thinking setting.";
    top_p: f32 = d(0.8), Kind::Real(SHARE), NextAsk,
        "Default nucleus mass.";
    top_k: u32 = i(20), Kind::Int { min: 0, max: 1_000_000 }, NextAsk,
        "Default top-k (0 = no limit).";
    min_p: f32 = d(0.0), Kind::Real(closed(0.0, 1.0)), NextAsk,
        "Default min-p.";
    repetition_penalty: f32 = d(1.0), Kind::Real(REPETITION_PENALTY), NextAsk,
        "Default repetition penalty (1 = none).";
    presence_penalty: f32 = d(1.5), Kind::Real(closed(-100.0, 100.0)), NextAsk,
        "Default presence penalty (0 = none).";
    seed: Option<u64> = i(-1), Kind::Int { min: -1, max: i64::MAX }, NextAsk,
        "Default sampling seed; -1 = a fresh seed per ask.";
    queue_depth: usize = i(4), Kind::Int { min: 1, max: 1024 }, Restart,
        "Requests held at once, the running one included; one more gets `busy` at once.";
    max_watches: usize = i(4), Kind::Int { min: 0, max: 64 }, NextAsk,
        "Most `vlm/watch` goals running at once; one more is aborted `busy` (0 refuses every \
        watch). Lowering it ends no running watch.";
    request_timeout_s: f64 = d(120.0), Kind::Seconds(AT_LEAST_0), NextAsk,
        "Default time limit of an ask from its arrival (queue wait included), in seconds; 0 = \
        as long as `max_request_timeout_s` allows (a value above it is cut to it).";
    max_request_timeout_s: f64 = d(600.0), Kind::Seconds(ABOVE_0), NextAsk,
        "Longest time limit one ask may have, in seconds: a `timeout_s` above it is \
        `invalid_request`, and `timeout_s` 0 (no limit) gets this one.";
    max_request_images: usize = i(4), Kind::Int { min: 0, max: 64 }, NextAsk,
        "Most images one ask may send (`images` and `compressed_images` together); more is \
        `invalid_request`.";
    max_image_pixels: usize = i(4096 * 4096), Kind::Int { min: 1, max: 8192 * 8192 }, NextAsk,
        "Most pixels (width × height, read from its header) of one image an ask sends; more is \
        `invalid_request` before any pixel is decoded. Default 4096 × 4096.";
    max_request_decoded_bytes as "max_request_decoded_mb": usize = i(256),
        Kind::Mebibytes { min: 1, max: 1 << 16 }, NextAsk,
        "Most memory decoding the images of one ask may take, in MiB: each image counts width × \
        height × its decoded bytes per pixel (at least 3, the RGB8 it becomes; 8 for 16-bit \
        RGBA), summed over the ask's images; more is `invalid_request` before any pixel is \
        decoded.";
    max_prompt_bytes: usize = i(65536), Kind::Int { min: 1, max: 1 << 24 }, NextAsk,
        "Longest `prompt` and `system_prompt` of an ask in UTF-8 bytes; longer is \
        `invalid_request`. Also bounds the `system_prompt` parameter.";
    max_stop_strings: usize = i(16), Kind::Int { min: 0, max: 1024 }, NextAsk,
        "Most `stop` strings of an ask, each at most 256 bytes; more is `invalid_request`. The \
        stop filter's cost grows with them (BENCHMARKS.md).";
    max_tools_json_bytes: usize = i(65536), Kind::Int { min: 0, max: 1 << 24 }, NextAsk,
        "Longest `tools_json` of an ask in bytes; longer is `invalid_request`.";
    max_json_schema_bytes: usize = i(16384), Kind::Int { min: 0, max: 1 << 20 }, NextAsk,
        "Longest `json_schema` of an ask in bytes (0 refuses every schema); longer is \
        `invalid_request`. A schema is compiled before queueing: its cost grows with its size.";
    bpu_priority: u8 = i(0), Kind::Int { min: 0, max: 255 }, Configure,
        "BPU task priority.";
    /// `bpu_timeout_s`, checked by `vlm_bpu::timeout_from_secs`.
    bpu_timeout as "bpu_timeout_s": Duration = d(30.0), Kind::BpuSeconds, Configure,
        "Longest wait for one BPU graph call, in seconds (the 4B's longest is ~0.74 s). A call \
        that takes longer fails its request with `backend_error`, leaves the BPU runtime unusable, \
        and the node exits for a restart (exit code 70).";
    prefill_tail: vlm_bpu::PrefillTail = s("auto"),
        Kind::Choice(&["auto", "stepped", "pads_first", "pads_last"]), Configure,
        "How a prompt tail runs on the BPU: `auto` (padded when the package sets `prefill_pads` \
        and a calibration at start-up finds the pad layout and marking, cached per package; else \
        stepped), `stepped`, `pads_first`, `pads_last`.";
    bpu_pool_check: vlm_bpu::PoolCheck = s("warn"),
        Kind::Choice(&["strict", "warn", "off"]), Configure,
        "ION pool preflight before loading: `strict` (refuse when the pool is too small or cannot \
        be identified), `warn` (never refuse: warn and load when it looks too small, naming \
        hb_switch_ion.sh, or cannot be identified), `off`.";
    bpu_flush: vlm_bpu::FlushOption = s("auto"), Kind::Choice(&["auto", "range", "whole"]), Configure,
        "Cache flushes of part of a BPU buffer: `auto` (probed at start; whole buffers when the \
        runtime refuses a range), `range` (refuse to start on such a runtime), `whole` (always \
        whole buffers).";
    prefill_latest_frame: bool = b(true), Kind::Bool, Configure,
        "While no ask is queued, run the newest frame of `prefill_camera` through the vision tower \
        and prefill it after the system prompt, so an ask about it prefills only its question. \
        Costs up to `prefill_duty` of the BPU on an idle robot.";
    /// `None`: the default camera.
    prefill_camera: Option<String> = s(""), Kind::Text, Restart,
        "Camera whose frames are primed; empty = the default camera.";
    prefill_duty: f64 = d(0.5), Kind::Real(SHARE), Configure,
        "Most share of wall time primings keep the BPU busy.";
    prefill_max_age_s: f64 = d(60.0), Kind::Real(AT_LEAST_0), Configure,
        "An ask without `max_image_age_s` is served from a primed frame at most this old, in \
        seconds (else from the newest frame); with `scene_check`, a safety cap: a priming this \
        old is made again even on an unchanged scene.";
    scene_check: bool = b(true), Kind::Bool, Configure,
        "Compare scenes: a new priming starts when the camera's scene changed (and held for \
        `scene_settle_s`), not for every frame, and an ask gets a primed frame only when the \
        camera's newest frame shows the same scene. `false`: every new frame is primed and an \
        ask gets a primed frame by its age alone.";
    scene_change_threshold: f64 = d(camera_frame::DEFAULT_SCENE_CHANGE_THRESHOLD), Kind::Real(SHARE), Restart,
        "Change score (0-1: the largest cell difference of a 32x24 luma thumbnail, the median \
        difference taken off) above which two frames show different scenes.";
    scene_settle_s: f64 = d(0.5), Kind::Seconds(AT_LEAST_0), Configure,
        "With `scene_check`, a changed scene is primed once it has held this long, in seconds, \
        so a moving camera does not restart a priming every frame.";
    prefill_keep_on_device: bool = b(true), Kind::Bool, Configure,
        "Keep the completed priming in a third decode cache set on the BPU, so an ask about its \
        frame starts from it without copying the state back, whatever ran since; costs one more \
        cache set of device memory (325 MB on the 4B ctx4k package, 90 MB on ctx512), and when \
        that cannot be had the node starts without it. `false`: the state is copied back for each \
        such ask (~65 MB).";
    ask_service: String = s(ASK_SERVICE), Kind::Text, Restart,
        "Name of the Ask service.";
    tokens_topic: String = s(TOKENS_TOPIC), Kind::Text, Restart,
        "Topic of streamed Token deltas (reliable, deep history).";
    answers_topic: String = s(ANSWERS_TOPIC), Kind::Text, Restart,
        "Topic of finished Answers.";
    cancel_service: String = s(CANCEL_SERVICE), Kind::Text, Restart,
        "Name of the Cancel service.";
    action_name: String = s(ASK_ACTION), Kind::Text, Restart,
        "Name of the Ask action (`bpu_vlm_msgs/action/Ask`).";
    action_result_timeout_s: f64 = d(900.0), Kind::Seconds(ABOVE_0), Restart,
        "A finished action goal (its status and result) is kept this long, in seconds, then \
        forgotten, as rcl_action's result timeout.";
    diagnostics_period_s: f64 = d(1.0), Kind::Seconds(ABOVE_0), Restart,
        "Period of `/diagnostics` (diagnostic_msgs/DiagnosticArray), in seconds.";
    rosout_level: tracing::Level = s("info"),
        Kind::Choice(&["debug", "info", "warn", "error"]), Restart,
        "Least severity of the node's log messages that go to `/rosout` (`rqt_console`), under \
        the node's logger; rcutils' own level (`--log-level`) may hold back more.";
    session_memory_bytes as "session_memory_mb": usize = i(1024),
        Kind::Mebibytes { min: 0, max: 1 << 20 }, Configure,
        "Memory for parked conversations (state snapshots); the least recently used go first. A \
        quarter of it holds the cached system prompts.";
    session_idle_s: f64 = d(600.0), Kind::Seconds(ABOVE_0), Configure,
        "A conversation unused this long (seconds) is dropped.";
    cache_dir: Option<PathBuf> = s(""), Kind::Text, Configure,
        "Where the embedded model's sim package is written; empty = `$XDG_CACHE_HOME/bpu_vlm` or \
        `~/.cache/bpu_vlm`.";
    autostart: bool = b(true), Kind::Bool, Restart,
        "Configure and activate at start (load the model, serve). `false`: start unconfigured and \
        wait for a lifecycle manager (`~/change_state`; docs/lifecycle.md).";
    deactivate_timeout_s: f64 = d(5.0), Kind::Seconds(AT_LEAST_0), Restart,
        "How long a deactivate lets the running request finish before cancelling it, in \
        seconds (queued requests are cancelled at once and answered `cancelled` when the worker \
        reaches them, right after the running one).";
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

impl Params {
    /// Defaults overridden by `given` (the node's parameters from the command line / file).
    pub fn from_values(given: &HashMap<String, ParameterValue>) -> Result<Self, ParamError> {
        for name in given.keys() {
            if spec(name).is_none() && !name.starts_with("use_sim_time") {
                tracing::warn!(parameter = %name, "unknown parameter ignored");
            }
        }
        let p = Self::read_each(given)?;
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
        p.check_system_prompt()?;
        Ok(p)
    }

    /// Any peer may set `system_prompt`, and the idle priming embeds it with no ask at all:
    /// it is held to the bound an ask's own `system_prompt` has.
    fn check_system_prompt(&self) -> Result<(), ParamError> {
        match &self.system_prompt {
            Some(text) if text.len() > self.max_prompt_bytes => Err(ParamError {
                name: "system_prompt",
                reason: format!(
                    "{} bytes, above the limit of {} (parameter max_prompt_bytes)",
                    text.len(),
                    self.max_prompt_bytes
                ),
            }),
            _ => Ok(()),
        }
    }

    /// The `max_new_tokens` an ask that gives none gets: the default, cut to the cap.
    pub fn default_new_tokens(&self) -> u32 {
        self.max_new_tokens.min(self.max_request_new_tokens)
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

    /// `deactivate_timeout_s` as a `Duration` (0 cancels the running request at once).
    pub fn deactivate_timeout(&self) -> Duration {
        time_limit(self.deactivate_timeout_s)
            .ok()
            .flatten()
            .unwrap_or(Duration::ZERO)
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
}

#[cfg(test)]
mod table;

#[cfg(test)]
mod tests {
    use super::table::spelled;
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
            "max_request_timeout_s",
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
        for name in [
            "diagnostics_period_s",
            "session_idle_s",
            "max_request_timeout_s",
        ] {
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

    /// The decode caps of request images: 4096 × 4096 pixels, 256 MiB held in bytes; 0 and
    /// values past the ranges are refused naming the parameter.
    #[test]
    fn decode_caps_are_parameters_with_ranges() {
        let p = Params::from_values(&HashMap::new()).unwrap();
        assert_eq!(
            (p.max_image_pixels, p.max_request_decoded_bytes),
            (4096 * 4096, 256 << 20)
        );
        let mib = HashMap::from([(
            "max_request_decoded_mb".to_owned(),
            ParameterValue::Integer(64),
        )]);
        let p = Params::from_values(&mib).unwrap();
        assert_eq!(p.max_request_decoded_bytes, 64 << 20);
        assert!(p
            .effective()
            .contains(&("max_request_decoded_mb", ParameterValue::Integer(64))));
        for (name, bad) in [
            ("max_image_pixels", 0),
            ("max_image_pixels", 8192 * 8192 + 1),
            ("max_request_decoded_mb", 0),
            ("max_request_decoded_mb", (1 << 16) + 1),
        ] {
            let given = HashMap::from([(name.to_owned(), ParameterValue::Integer(bad))]);
            assert_eq!(Params::from_values(&given).unwrap_err().name, name, "{bad}");
        }
    }

    /// Any peer may set `system_prompt`: it is held to `max_prompt_bytes`, whichever of the
    /// two is given, and the refusal says why.
    #[test]
    fn the_system_prompt_parameter_is_held_to_max_prompt_bytes() {
        let at = HashMap::from([
            ("system_prompt".to_owned(), s(&"s".repeat(8))),
            ("max_prompt_bytes".to_owned(), i(8)),
        ]);
        assert!(Params::from_values(&at).is_ok());
        let mut over = at.clone();
        over.insert("system_prompt".to_owned(), s(&"s".repeat(9)));
        let e = Params::from_values(&over).unwrap_err();
        assert_eq!(e.name, "system_prompt");
        assert!(e.reason.contains("max_prompt_bytes"), "{e}");
        let mut lowered = at;
        lowered.insert("max_prompt_bytes".to_owned(), i(7));
        assert!(Params::from_values(&lowered).is_err());
        let long = HashMap::from([("system_prompt".to_owned(), s(&"s".repeat(65537)))]);
        assert_eq!(
            Params::from_values(&long).unwrap_err().name,
            "system_prompt"
        );
    }

    /// The caps on what a request may ask for; a default above a cap is accepted (and cut to
    /// it per ask), so lowering a cap at run time is never refused.
    #[test]
    fn request_caps_and_defaults_above_them() {
        let p = Params::from_values(&HashMap::new()).unwrap();
        assert_eq!(
            (p.max_request_timeout_s, p.max_request_new_tokens),
            (600.0, 4096)
        );
        assert_eq!(p.default_new_tokens(), 256);
        let given = HashMap::from([
            ("max_new_tokens".to_owned(), i(8192)),
            ("request_timeout_s".to_owned(), d(1000.0)),
            ("max_request_timeout_s".to_owned(), d(1.0)),
        ]);
        let p = Params::from_values(&given).unwrap();
        assert_eq!(p.default_new_tokens(), 4096);
        let zero = HashMap::from([("max_request_timeout_s".to_owned(), d(0.0))]);
        assert_eq!(
            Params::from_values(&zero).unwrap_err().name,
            "max_request_timeout_s"
        );
    }

    #[test]
    fn params_file_and_parameter_table_repeat_the_built_in_defaults() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let yaml = std::fs::read_to_string(root.join("launch/vlm_params.yaml")).unwrap();
        let readme = std::fs::read_to_string(root.join("docs/parameters.md")).unwrap();
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
            assert!(
                readme.contains(&row),
                "docs/parameters.md's parameter table lacks {row}"
            );
        }
    }

    /// The names a choice declares are the ones its type reads and writes back.
    #[test]
    fn declared_choices_are_the_accepted_names() {
        for spec in SPECS {
            let Kind::Choice(names) = spec.kind else {
                continue;
            };
            for name in names {
                // `backend: cpu` needs a checkpoint folder.
                let given = HashMap::from([
                    (spec.name.to_owned(), s(name)),
                    ("model_dir".to_owned(), s("/m")),
                ]);
                let p = Params::from_values(&given).unwrap_or_else(|e| panic!("{e}"));
                let back = p.effective().into_iter().find(|(n, _)| *n == spec.name);
                assert_eq!(back, Some((spec.name, s(name))));
            }
            let given = HashMap::from([(spec.name.to_owned(), s("no_such_choice"))]);
            assert_eq!(Params::from_values(&given).unwrap_err().name, spec.name);
        }
    }

    /// Every declared range is the one enforced: just outside either end is refused with the
    /// range in the message, each end itself is accepted.
    #[test]
    fn declared_ranges_are_enforced() {
        let refused = |name: &str, v: ParameterValue, range: &str| {
            let given = HashMap::from([(name.to_owned(), v.clone())]);
            let e = Params::from_values(&given).unwrap_err();
            assert_eq!(e.name, name, "{v:?}");
            assert!(e.reason.contains(range), "{name} = {v:?}: {e}");
        };
        for spec in SPECS {
            match spec.kind {
                Kind::Int { min, max } | Kind::Mebibytes { min, max } => {
                    let range = format!("{min}..={max}");
                    refused(spec.name, i(min - 1), &range);
                    if let Some(above) = max.checked_add(1) {
                        refused(spec.name, i(above), &range);
                    }
                    for end in [min, max] {
                        let given = HashMap::from([(spec.name.to_owned(), i(end))]);
                        let p = Params::from_values(&given).unwrap_or_else(|e| panic!("{e}"));
                        let back = p.effective().into_iter().find(|(n, _)| *n == spec.name);
                        assert_eq!(back, Some((spec.name, i(end))));
                    }
                }
                Kind::Real(span) | Kind::Seconds(span) => {
                    let below = match span.lo {
                        Bound::Incl(x) => x - 0.5,
                        Bound::Excl(x) => x,
                        Bound::None => f64::NAN,
                    };
                    refused(spec.name, d(below), &span.to_string());
                    if let Bound::Incl(x) | Bound::Excl(x) = span.hi {
                        refused(spec.name, d(x + 0.5), &span.to_string());
                    }
                }
                _ => {}
            }
        }
    }
}

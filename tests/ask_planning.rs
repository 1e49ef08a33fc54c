//! Request planning (`bpu_vlm::request::plan::plan_async`, as the node runs it) over hostile
//! requests: every Ask field random — NaN, ±inf, huge, negative, empty, very long, many images, many stop strings — always ends
//! in a plan or a refusal, never a panic; a plan never breaks a bound; and one bad field is
//! refused with `invalid_request` naming it. No ROS graph: planning is plain data in, data out
//! (tests/node.rs drives the same cases through a real node).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod planning;

use std::time::{Duration, Instant};

use bpu_vlm::interface::ErrorCode;
use bpu_vlm::msgs::srv::Ask;
use bpu_vlm::request::limits::{MAX_ID_BYTES, MAX_STOP_STRING_BYTES};
use proptest::prelude::*;
use r2r::sensor_msgs::msg::{CompressedImage, Image};

use planning::{cameras, params, plan, schemas, valid};

/// Doubles a client can send: the sentinels, the edges of every rule, the values that overflow
/// a `Duration` (above u64::MAX s) or only an `Instant` (above i64::MAX s), and any bit pattern.
/// Each field is mostly its sentinel, so a random request gets past the earlier checks and the
/// later ones (deadline, camera) are reached too.
fn f64_field() -> impl Strategy<Value = f64> {
    prop_oneof![
        4 => Just(-1.0),
        4 => prop::sample::select(vec![
            -1.0,
            0.0,
            -0.0,
            1e-9,
            0.5,
            1.0,
            2.0,
            120.0,
            1e9,
            9.3e18,
            1.9e19,
            1e300,
            f64::MAX,
            -1e300,
            -2.0,
            f64::MIN,
            f64::MIN_POSITIVE,
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
        ]),
        1 => any::<f64>(),
    ]
}

fn f32_field() -> impl Strategy<Value = f32> {
    prop_oneof![
        6 => Just(-1.0),
        2 => prop::sample::select(vec![
            -1.0,
            0.0,
            -0.0,
            0.5,
            1.0,
            1.5,
            100.0,
            100.5,
            1e30,
            f32::MAX,
            -1e30,
            -2.0,
            f32::MIN_POSITIVE,
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ]),
        1 => any::<f32>(),
    ]
}

/// Short text with any characters (NUL included), or text around a byte limit.
fn text(limit: usize) -> impl Strategy<Value = String> {
    prop_oneof![
        8 => "\\PC{0,24}",
        1 => Just(String::new()),
        1 => Just(" \t\n".to_owned()),
        1 => Just("a\u{0}b".to_owned()),
        1 => (limit.saturating_sub(2)..limit + 3).prop_map(|n| "x".repeat(n)),
    ]
}

fn camera() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "", "none", "/cam", "cam", "/silent", "/nope", " /cam "
        ])
        .prop_map(str::to_owned),
        text(300),
    ]
}

fn tools_json() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "",
            "[]",
            "[{}]",
            "[{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]",
            "{}",
            "[1]",
            "not json",
            "[",
            "\u{0}",
        ])
        .prop_map(str::to_owned),
        // Nesting far past serde_json's recursion limit must be an error, not a stack overflow.
        (100usize..5000).prop_map(|n| "[".repeat(n) + &"]".repeat(n)),
        (65534usize..65539).prop_map(|n| " ".repeat(n)),
    ]
}

/// Schemas a client may send: none, valid ones, text that is not JSON or not a schema,
/// what the engine refuses, deep nesting, and sizes around `max_json_schema_bytes`.
fn json_schema() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => Just(String::new()),
        4 => prop::sample::select(vec![
            r#"{"enum": ["yes", "no"]}"#,
            r#"{"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["n"]}"#,
            "true",
            "false",
            "{",
            " ",
            "null",
            "[]",
            "\u{0}",
            r#"{"type": "string", "x-guidance": {}}"#,
            r#"{"type": "nonsense"}"#,
            r#"{"$ref": "http://example.com/s.json"}"#,
        ])
        .prop_map(str::to_owned),
        1 => (100usize..3000).prop_map(|n| "[".repeat(n) + &"]".repeat(n)),
        1 => (16382usize..16387).prop_map(|n| format!("{{{}}}", " ".repeat(n - 2))),
        1 => "\\PC{0,24}",
    ]
}

fn image() -> impl Strategy<Value = Image> {
    (
        prop::sample::select(vec!["rgb8", "mono8", "nv12", "jpeg", "png", "bogus", ""]),
        0u32..5,
        0u32..5,
        0u32..20,
        prop::collection::vec(any::<u8>(), 0..64),
    )
        .prop_map(|(encoding, width, height, step, data)| Image {
            encoding: encoding.to_owned(),
            width,
            height,
            step,
            data,
            ..Default::default()
        })
}

fn compressed() -> impl Strategy<Value = CompressedImage> {
    (
        prop::sample::select(vec!["jpeg", "png", "", "tiff"]),
        prop::collection::vec(any::<u8>(), 0..64),
    )
        .prop_map(|(format, data)| CompressedImage {
            format: format.to_owned(),
            data,
            ..Default::default()
        })
}

fn request() -> impl Strategy<Value = Ask::Request> {
    let ids = (text(MAX_ID_BYTES), text(MAX_ID_BYTES));
    let texts = (
        text(65536),
        text(65536),
        camera(),
        tools_json(),
        json_schema(),
    );
    let floats = (
        f64_field(),
        f64_field(),
        f32_field(),
        f32_field(),
        f32_field(),
        f32_field(),
        f32_field(),
    );
    let ints = (
        prop_oneof![4 => Just(-1), 2 => 0..100i32, 1 => any::<i32>()],
        prop_oneof![4 => Just(-1), 2 => 0..100i64, 1 => any::<i64>()],
        prop_oneof![6 => -1..=1i8, 1 => any::<i8>()],
        prop_oneof![4 => 0..64u32, 1 => any::<u32>()],
        any::<bool>(),
    );
    let bulk = (
        prop_oneof![3 => Just(Vec::new()), 1 => prop::collection::vec(image(), 0..7)],
        prop_oneof![3 => Just(Vec::new()), 1 => prop::collection::vec(compressed(), 0..4)],
        prop_oneof![
            2 => Just(Vec::new()),
            2 => prop::collection::vec("[a-z]{1,8}", 0..4),
            1 => prop::collection::vec(text(MAX_STOP_STRING_BYTES), 0..20),
        ],
    );
    (ids, texts, floats, ints, bulk).prop_map(
        |(
            (request_id, session_id),
            (prompt, system_prompt, camera, tools_json, json_schema),
            (
                timeout_s,
                max_image_age_s,
                temperature,
                top_p,
                min_p,
                repetition_penalty,
                presence_penalty,
            ),
            (top_k, seed, enable_thinking, max_new_tokens, use_default_stop),
            (images, compressed_images, stop),
        )| Ask::Request {
            request_id,
            prompt,
            camera,
            max_image_age_s,
            images,
            compressed_images,
            session_id,
            system_prompt,
            tools_json,
            temperature,
            top_p,
            min_p,
            top_k,
            repetition_penalty,
            presence_penalty,
            seed,
            enable_thinking,
            max_new_tokens,
            stop,
            use_default_stop,
            timeout_s,
            json_schema,
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn any_request_is_planned_or_refused_never_a_panic(req in request(), vision in any::<bool>()) {
        let p = params();
        let t0 = Instant::now();
        let cache = cameras(t0);
        let now = t0 + Duration::from_millis(500);
        let sent_images = req.images.len() + req.compressed_images.len();
        let (prompt_len, stops) = (req.prompt.len(), req.stop.clone());
        let schema = !req.json_schema.is_empty();
        let (thinking_asked, repetition_asked, presence_asked) =
            (req.enable_thinking, req.repetition_penalty, req.presence_penalty);
        match plan(req, &p, vision.then_some(&cache), Some(schemas()), now) {
            Ok(job) => {
                let t = &job.turn;
                prop_assert_eq!(t.json_schema.is_some(), schema);
                if schema {
                    prop_assert!(t.tools.is_empty() && t.stop.is_empty());
                    prop_assert_eq!(t.thinking, thinking_asked == 1);
                    if repetition_asked == -1.0 {
                        prop_assert_eq!(t.sampling.repetition_penalty, 1.0);
                    }
                    if presence_asked < 0.0 {
                        prop_assert_eq!(t.sampling.presence_penalty, 0.0);
                    }
                    prop_assert_eq!(t.sampling.frequency_penalty, 0.0);
                }
                prop_assert!(sent_images <= p.max_request_images);
                prop_assert!(prompt_len <= p.max_prompt_bytes);
                prop_assert!(!t.text.trim().is_empty());
                prop_assert!(t.stop.len() <= p.max_stop_strings);
                prop_assert!(t.stop.iter().all(|s| !s.is_empty() && s.len() <= MAX_STOP_STRING_BYTES));
                prop_assert_eq!(&t.stop, &stops);
                // A tiny positive timeout rounds to a zero Duration: a deadline of now, not none.
                prop_assert!(t.deadline.is_none_or(|d| d >= now));
                let s = &t.sampling;
                for (name, v) in [
                    ("temperature", s.temperature),
                    ("top_p", s.top_p),
                    ("min_p", s.min_p),
                    ("repetition_penalty", s.repetition_penalty),
                    ("presence_penalty", s.presence_penalty),
                ] {
                    prop_assert!(v.is_finite(), "{} = {}", name, v);
                }
                prop_assert!(s.validate().is_ok());
            }
            Err(f) => {
                prop_assert!(
                    matches!(f.code, ErrorCode::InvalidRequest | ErrorCode::NoImage | ErrorCode::StaleImage),
                    "{:?}: {}", f.code, f.message
                );
                prop_assert!(!f.message.is_empty());
            }
        }
    }
}

/// One hostile value for one field.
#[derive(Debug, Clone)]
enum Hostile {
    TimeoutS(f64),
    MaxImageAgeS(f64),
    Temperature(f32),
    TopP(f32),
    MinP(f32),
    RepetitionPenalty(f32),
    PresencePenalty(f32),
    TopK(i32),
    Seed(i64),
    EnableThinking(i8),
    MaxNewTokens(u32),
    Prompt(String),
    SystemPrompt(String),
    Camera(String),
    ToolsJson(String),
    JsonSchema(String),
    RequestId(String),
    SessionId(String),
    Images(Vec<Image>),
    CompressedImages(Vec<CompressedImage>),
    Stop(Vec<String>),
}

impl Hostile {
    fn apply(self, r: &mut Ask::Request) {
        match self {
            Self::TimeoutS(v) => r.timeout_s = v,
            Self::MaxImageAgeS(v) => r.max_image_age_s = v,
            Self::Temperature(v) => r.temperature = v,
            Self::TopP(v) => r.top_p = v,
            Self::MinP(v) => r.min_p = v,
            Self::RepetitionPenalty(v) => r.repetition_penalty = v,
            Self::PresencePenalty(v) => r.presence_penalty = v,
            Self::TopK(v) => r.top_k = v,
            Self::Seed(v) => r.seed = v,
            Self::EnableThinking(v) => r.enable_thinking = v,
            Self::MaxNewTokens(v) => r.max_new_tokens = v,
            Self::Prompt(v) => r.prompt = v,
            Self::SystemPrompt(v) => r.system_prompt = v,
            Self::Camera(v) => r.camera = v,
            Self::ToolsJson(v) => r.tools_json = v,
            Self::JsonSchema(v) => r.json_schema = v,
            Self::RequestId(v) => r.request_id = v,
            Self::SessionId(v) => r.session_id = v,
            Self::Images(v) => r.images = v,
            Self::CompressedImages(v) => r.compressed_images = v,
            Self::Stop(v) => r.stop = v,
        }
    }

    /// The field a non-finite number was put in, which the refusal must name.
    fn non_finite(&self) -> Option<&'static str> {
        let f32 = |v: &f32| !v.is_finite();
        let f64 = |v: &f64| !v.is_finite();
        match self {
            Self::TimeoutS(v) if f64(v) => Some("timeout_s"),
            Self::MaxImageAgeS(v) if f64(v) => Some("max_image_age_s"),
            Self::Temperature(v) if f32(v) => Some("temperature"),
            Self::TopP(v) if f32(v) => Some("top_p"),
            Self::MinP(v) if f32(v) => Some("min_p"),
            Self::RepetitionPenalty(v) if f32(v) => Some("repetition_penalty"),
            Self::PresencePenalty(v) if f32(v) => Some("presence_penalty"),
            _ => None,
        }
    }
}

fn hostile() -> impl Strategy<Value = Hostile> {
    prop_oneof![
        f64_field().prop_map(Hostile::TimeoutS),
        f64_field().prop_map(Hostile::MaxImageAgeS),
        f32_field().prop_map(Hostile::Temperature),
        f32_field().prop_map(Hostile::TopP),
        f32_field().prop_map(Hostile::MinP),
        f32_field().prop_map(Hostile::RepetitionPenalty),
        f32_field().prop_map(Hostile::PresencePenalty),
        any::<i32>().prop_map(Hostile::TopK),
        any::<i64>().prop_map(Hostile::Seed),
        any::<i8>().prop_map(Hostile::EnableThinking),
        any::<u32>().prop_map(Hostile::MaxNewTokens),
        text(65536).prop_map(Hostile::Prompt),
        text(65536).prop_map(Hostile::SystemPrompt),
        camera().prop_map(Hostile::Camera),
        tools_json().prop_map(Hostile::ToolsJson),
        json_schema().prop_map(Hostile::JsonSchema),
        text(MAX_ID_BYTES).prop_map(Hostile::RequestId),
        text(MAX_ID_BYTES).prop_map(Hostile::SessionId),
        prop::collection::vec(image(), 0..7).prop_map(Hostile::Images),
        prop::collection::vec(compressed(), 0..7).prop_map(Hostile::CompressedImages),
        prop::collection::vec(text(MAX_STOP_STRING_BYTES), 0..20).prop_map(Hostile::Stop),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// Every other field valid, so the hostile one meets its own check, wherever in the
    /// order of checks that is; a non-finite number is refused naming its field.
    #[test]
    fn one_hostile_field_is_planned_or_refused_never_a_panic(h in hostile()) {
        let t0 = Instant::now();
        let cache = cameras(t0);
        let mut req = valid();
        req.camera = String::new();
        let must_name = h.non_finite();
        h.apply(&mut req);
        match plan(req, &params(), Some(&cache), Some(schemas()), t0 + Duration::from_millis(500)) {
            Ok(job) => prop_assert!(must_name.is_none(), "{:?} planned: {:?}", must_name, job.turn.sampling),
            Err(f) => {
                prop_assert!(
                    matches!(f.code, ErrorCode::InvalidRequest | ErrorCode::NoImage | ErrorCode::StaleImage),
                    "{:?}: {}", f.code, f.message
                );
                if let Some(field) = must_name {
                    prop_assert_eq!(f.code, ErrorCode::InvalidRequest);
                    prop_assert!(f.message.contains(field), "{}: {}", field, f.message);
                }
            }
        }
    }
}

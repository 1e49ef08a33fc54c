//! Request planning (`bpu_vlm::request::plan::plan_async`, as the node runs it) case by
//! case: the valid request and its edges, each bad number and each size bound refused naming its field or parameter, request text
//! and images moved (not copied) into the job, image identities in a conversation, and the
//! rules of a request with a `json_schema`. (tests/ask_planning.rs throws random hostile
//! requests at the same function.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod planning;

use std::sync::Arc;
use std::time::Instant;

use bpu_vlm::interface::ErrorCode;
use bpu_vlm::msgs::srv::Ask;
use bpu_vlm::ros::params::Params;
use camera_frame::{CameraCache, Frame, ImageMsg, Limits, Stamp};
use r2r::sensor_msgs::msg::{CompressedImage, Image};
use vlm::engine::ImageInput;

use planning::{cameras, params, plan, refusal, refusal_with, schemas, valid, Mutation};

#[test]
fn the_valid_request_is_planned() {
    assert_eq!(refusal(valid()), None);
    // The documented sentinels and edges are accepted.
    let edges: Vec<Mutation> = vec![
        Box::new(|r| r.timeout_s = 0.0),
        Box::new(|r| r.timeout_s = 1e9),
        Box::new(|r| r.max_image_age_s = 0.0),
        Box::new(|r| r.max_image_age_s = 1e9),
        Box::new(|r| r.presence_penalty = -5.0),
        Box::new(|r| r.temperature = 0.0),
        Box::new(|r| r.temperature = 1e-39),
        Box::new(|r| r.repetition_penalty = 0.01),
        Box::new(|r| r.top_p = 1.0),
        Box::new(|r| r.min_p = 1.0),
    ];
    // A timeout of 1e9 s is a time limit; the node takes it when its cap allows.
    let mut p = params();
    p.max_request_timeout_s = 1e9;
    for (i, edit) in edges.iter().enumerate() {
        let mut r = valid();
        edit(&mut r);
        assert_eq!(refusal_with(r, &p), None, "edge {i}");
    }
}

/// A request may ask for less time and fewer tokens than the node's caps, never more: above
/// a cap it is refused naming the parameter, at the cap it is planned; the sentinels get the
/// node's defaults, and "no limit" (`timeout_s` 0) gets the cap.
#[test]
fn timeout_and_new_tokens_are_capped_by_the_node() {
    let p = params();
    assert_eq!(
        (p.max_request_timeout_s, p.max_request_new_tokens),
        (600.0, 4096)
    );
    let over: [(&str, Mutation); 3] = [
        ("max_request_timeout_s", Box::new(|r| r.timeout_s = 600.5)),
        ("max_request_timeout_s", Box::new(|r| r.timeout_s = 1e9)),
        (
            "max_request_new_tokens",
            Box::new(|r| r.max_new_tokens = 4097),
        ),
    ];
    for (param, edit) in over {
        let mut r = valid();
        edit(&mut r);
        let m = refusal(r).unwrap_or_else(|| panic!("planned above {param}"));
        assert!(m.contains(param), "{m}");
    }
    let t0 = Instant::now();
    let planned = |edit: &dyn Fn(&mut Ask::Request), p: &Params| {
        let mut r = valid();
        edit(&mut r);
        plan(r, p, None, Some(schemas()), t0).unwrap().turn
    };
    let secs = |t: &vlm::assistant::Turn| t.deadline.map(|d| (d - t0).as_secs_f64());
    let at_cap = planned(
        &|r| {
            r.timeout_s = 600.0;
            r.max_new_tokens = 4096;
        },
        &p,
    );
    assert_eq!((secs(&at_cap), at_cap.max_new_tokens), (Some(600.0), 4096));
    let less = planned(
        &|r| {
            r.timeout_s = 5.0;
            r.max_new_tokens = 7;
        },
        &p,
    );
    assert_eq!((secs(&less), less.max_new_tokens), (Some(5.0), 7));
    let sentinels = planned(&|r| r.max_new_tokens = 0, &p);
    assert_eq!(
        (secs(&sentinels), sentinels.max_new_tokens),
        (Some(120.0), 256)
    );
    assert_eq!(secs(&planned(&|r| r.timeout_s = 0.0, &p)), Some(600.0));
    // The node's own defaults above the caps are cut to them.
    let mut high = params();
    high.request_timeout_s = 0.0;
    high.max_new_tokens = 32768;
    let cut = planned(&|_| {}, &high);
    assert_eq!((secs(&cut), cut.max_new_tokens), (Some(600.0), 4096));
    high.request_timeout_s = 1e6;
    assert_eq!(secs(&planned(&|_| {}, &high)), Some(600.0));
}

/// One bad number at a time: refused with `invalid_request`, the message naming the field.
#[test]
fn each_bad_number_is_refused_naming_its_field() {
    type Edit = fn(&mut Ask::Request, f64);
    let f64_fields: [(&str, Edit); 2] = [
        ("timeout_s", |r, v| r.timeout_s = v),
        ("max_image_age_s", |r, v| r.max_image_age_s = v),
    ];
    // 1e300 overflows a Duration, 9.3e18 s only an Instant (i64 seconds).
    let bad_f64 = [
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        1e300,
        9.3e18,
        f64::MAX,
        -2.0,
        -1e300,
    ];
    for (field, set) in f64_fields {
        for v in bad_f64 {
            let mut r = valid();
            set(&mut r, v);
            let m = refusal(r).unwrap_or_else(|| panic!("{field} = {v} was planned"));
            assert!(m.contains(field), "{field} = {v}: {m}");
        }
    }
    type Edit32 = fn(&mut Ask::Request, f32);
    let f32_fields: [(&str, Edit32, &[f32]); 5] = [
        ("temperature", |r, v| r.temperature = v, &[-2.0, -0.5]),
        ("top_p", |r, v| r.top_p = v, &[0.0, 1.5, -2.0]),
        ("min_p", |r, v| r.min_p = v, &[1.5, -2.0]),
        (
            "repetition_penalty",
            |r, v| r.repetition_penalty = v,
            // Below the sampler's bound of 0.01 a penalised logit overflows.
            &[0.0, -2.0, 0.005, 1e-30, f32::MIN_POSITIVE],
        ),
        (
            "presence_penalty",
            |r, v| r.presence_penalty = v,
            &[100.5, 1e30],
        ),
    ];
    for (field, set, extra) in f32_fields {
        for &v in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY]
            .iter()
            .chain(extra)
        {
            let mut r = valid();
            set(&mut r, v);
            let m = refusal(r).unwrap_or_else(|| panic!("{field} = {v} was planned"));
            assert!(m.contains(field), "{field} = {v}: {m}");
        }
    }
    for (field, edit) in [
        (
            "top_k",
            Box::new(|r: &mut Ask::Request| r.top_k = -2) as Mutation,
        ),
        ("seed", Box::new(|r| r.seed = -2)),
        ("enable_thinking", Box::new(|r| r.enable_thinking = 2)),
        ("max_new_tokens", Box::new(|r| r.max_new_tokens = u32::MAX)),
    ] {
        let mut r = valid();
        edit(&mut r);
        let m = refusal(r).unwrap_or_else(|| panic!("{field} was planned"));
        assert!(m.contains(field), "{field}: {m}");
    }
}

/// Each size bound at its default, one over: refused naming the limit's parameter, before any
/// other check (the request is otherwise valid).
#[test]
fn each_size_bound_is_refused_naming_its_parameter() {
    let cases: Vec<(&str, Mutation)> = vec![
        (
            "max_request_images",
            Box::new(|r| r.compressed_images = vec![CompressedImage::default(); 5]),
        ),
        (
            "max_prompt_bytes",
            Box::new(|r| r.prompt = "x".repeat(65537)),
        ),
        (
            "max_prompt_bytes",
            Box::new(|r| r.system_prompt = "x".repeat(65537)),
        ),
        (
            "max_stop_strings",
            Box::new(|r| r.stop = vec!["x".into(); 17]),
        ),
        ("stop[0]", Box::new(|r| r.stop = vec!["x".repeat(257)])),
        (
            "max_tools_json_bytes",
            Box::new(|r| r.tools_json = " ".repeat(65537)),
        ),
        ("request_id", Box::new(|r| r.request_id = "r".repeat(257))),
        ("session_id", Box::new(|r| r.session_id = "s".repeat(257))),
    ];
    for (name, edit) in cases {
        let mut r = valid();
        edit(&mut r);
        let m = refusal(r).unwrap_or_else(|| panic!("{name}: planned"));
        assert!(m.contains(name), "{name}: {m}");
    }
}

/// Request images are charged from their headers while the request is planned: one over
/// `max_image_pixels`, or one that takes the images' decoded bytes over
/// `max_request_decoded_mb`, is refused naming the image and the parameter; at the limits the
/// request is planned.
#[test]
fn request_images_over_the_pixel_cap_or_the_decode_budget_are_refused() {
    let rgb8 = |w: u32, h: u32| Image {
        encoding: "rgb8".into(),
        width: w,
        height: h,
        step: w * 3,
        data: vec![0; (w * h * 3) as usize],
        ..Default::default()
    };
    let with = |images: Vec<Image>| Ask::Request { images, ..valid() };
    let mut p = params();
    p.max_image_pixels = 64;
    p.max_request_decoded_bytes = 3 * 64 * 2;
    assert_eq!(refusal_with(with(vec![rgb8(8, 8), rgb8(16, 4)]), &p), None);
    let m = refusal_with(with(vec![rgb8(8, 8), rgb8(13, 5)]), &p).unwrap();
    assert!(
        m.contains("images[1]") && m.contains("13x5") && m.contains("max_image_pixels"),
        "{m}"
    );
    let m = refusal_with(with(vec![rgb8(8, 8), rgb8(8, 8), rgb8(1, 1)]), &p).unwrap();
    assert!(
        m.contains("images[2]") && m.contains("max_request_decoded_mb"),
        "{m}"
    );
}

/// A planned request's prompt and stop strings are moved, not copied, into the turn.
#[test]
fn request_text_moves_into_the_turn() {
    let mut r = valid();
    r.prompt = "p".repeat(1000);
    let at = r.prompt.as_ptr();
    let t0 = Instant::now();
    let job = plan(r, &params(), None, None, t0).unwrap();
    assert_eq!(job.turn.text.as_ptr(), at);
}

/// A request's rgb8 image reaches the model input in the buffer the message brought: planning
/// moves it into the job and the worker's conversion hands it over (no copy on the way).
#[test]
fn a_request_rgb8_image_reaches_the_model_input_without_a_copy() {
    let data: Vec<u8> = (0..4 * 3 * 3).map(|i| i as u8).collect();
    let at = data.as_ptr();
    let mut r = valid();
    r.images = vec![Image {
        encoding: "rgb8".into(),
        width: 4,
        height: 3,
        step: 12,
        data,
        ..Default::default()
    }];
    let t0 = Instant::now();
    let mut job = plan(r, &params(), Some(&cameras(t0)), None, t0).unwrap();
    let (inputs, _keys) = job.images.take_inputs(None).unwrap();
    match &inputs[..] {
        [ImageInput::Rgb(img)] => {
            assert_eq!((img.width, img.height), (4, 3));
            assert_eq!(img.data.as_ptr(), at, "the image data was copied");
        }
        other => panic!("{} inputs", other.len()),
    }
}

/// The identity an image has in a conversation (a session does not add a frame it holds):
/// a camera frame is the cached message — selected again it has the same key, the next one on
/// the topic another even with the same stamp — and a request image is its pixels, whatever
/// encoding brought them.
#[test]
fn image_keys_name_the_cached_message_or_the_pixels() {
    let t0 = Instant::now();
    let cams = cameras(t0);
    let keys = |r: Ask::Request, cams: &Arc<CameraCache>| {
        let mut job = plan(r, &params(), Some(cams), None, t0).unwrap();
        let (inputs, keys) = job.images.take_inputs(None).unwrap();
        assert_eq!(inputs.len(), keys.len());
        keys.into_iter()
            .map(|k| k.unwrap().as_str().to_owned())
            .collect::<Vec<_>>()
    };
    let camera = || Ask::Request {
        camera: "/cam".into(),
        ..valid()
    };
    let first = keys(camera(), &cams);
    assert!(first[0].starts_with("camera:/cam@"), "{first:?}");
    assert_eq!(keys(camera(), &cams), first);
    let same_stamp = Frame::from_image(
        ImageMsg {
            encoding: "mono8",
            width: 2,
            height: 2,
            step: 2,
            is_bigendian: false,
            data: vec![1, 2, 3, 4],
        },
        &Limits::default(),
    );
    cams.record("/cam", same_stamp, Stamp::default(), t0)
        .unwrap();
    assert_ne!(keys(camera(), &cams), first);

    let image = |encoding: &str, data: Vec<u8>| Ask::Request {
        images: vec![Image {
            encoding: encoding.into(),
            width: 2,
            height: 1,
            step: 6,
            data,
            ..Default::default()
        }],
        ..valid()
    };
    let rgb = keys(image("rgb8", vec![1, 2, 3, 4, 5, 6]), &cams);
    assert!(rgb[0].starts_with("sha256:"), "{rgb:?}");
    assert_eq!(keys(image("bgr8", vec![3, 2, 1, 6, 5, 4]), &cams), rgb);
    assert_ne!(keys(image("rgb8", vec![1, 2, 3, 4, 5, 7]), &cams), rgb);
}

/// The rules of a request with a `json_schema`, decided before queueing: compiled for the
/// model (or refused naming the reason), exclusive with tools and stop strings, bounded by
/// `max_json_schema_bytes`; thinking and the penalties off unless the request sets them.
#[test]
fn a_schema_is_compiled_before_queueing_and_changes_the_defaults() {
    let with = |schema: &str, edit: &dyn Fn(&mut Ask::Request)| {
        let mut r = valid();
        r.json_schema = schema.to_owned();
        edit(&mut r);
        let t0 = Instant::now();
        plan(r, &params(), Some(&cameras(t0)), Some(schemas()), t0)
    };
    let gate = r#"{"enum": ["yes", "no"]}"#;
    let job = with(gate, &|_| {}).unwrap();
    let t = &job.turn;
    assert!(t.json_schema.is_some());
    assert!(!t.thinking);
    let s = &t.sampling;
    assert_eq!(
        (
            s.repetition_penalty,
            s.presence_penalty,
            s.frequency_penalty
        ),
        (1.0, 0.0, 0.0),
        "the node's presence penalty (1.5) is off for a schema"
    );
    // Free text keeps the node's defaults.
    let free = with("", &|_| {}).unwrap();
    assert!(free.turn.json_schema.is_none());
    assert_eq!(free.turn.sampling.presence_penalty, 1.5);
    // What the request sets, it gets.
    let job = with(gate, &|r| {
        r.enable_thinking = 1;
        r.presence_penalty = 0.25;
        r.repetition_penalty = 1.1;
    })
    .unwrap();
    assert!(job.turn.thinking);
    assert_eq!(
        (
            job.turn.sampling.presence_penalty,
            job.turn.sampling.repetition_penalty
        ),
        (0.25, 1.1)
    );
    // An empty tools array is no tools.
    assert!(with(gate, &|r| r.tools_json = "[]".into()).is_ok());

    let refused = |schema: &str, edit: &dyn Fn(&mut Ask::Request), names: &[&str]| {
        let f = with(schema, edit)
            .err()
            .unwrap_or_else(|| panic!("{schema}: planned"));
        assert_eq!(f.code, ErrorCode::InvalidRequest, "{}", f.message);
        for n in names {
            assert!(f.message.contains(n), "{n}: {}", f.message);
        }
    };
    refused("{", &|_| {}, &["json_schema", "not valid JSON"]);
    refused(" ", &|_| {}, &["json_schema", "empty"]);
    refused("[]", &|_| {}, &["json_schema", "an array"]);
    refused(r#"{"type": "nonsense"}"#, &|_| {}, &["json_schema"]);
    refused(
        r#"{"type": "string", "x-guidance": {}}"#,
        &|_| {},
        &["x-guidance"],
    );
    refused(
        gate,
        &|r| r.tools_json = r#"[{"type": "function", "function": {"name": "f"}}]"#.into(),
        &["tools_json"],
    );
    refused(gate, &|r| r.stop = vec!["}".into()], &["stop strings"]);
    let big = format!(r#"{{"description": "{}"}}"#, "x".repeat(16384));
    refused(
        &big,
        &|_| {},
        &["json_schema", "max_json_schema_bytes", "16384"],
    );
}

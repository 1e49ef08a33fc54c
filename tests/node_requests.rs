//! Untrusted input against the real `vlm_node` process over a real ROS 2 graph (peer:
//! `tests/peers/request_peer.py`): numbers that overflow a `Duration` or an `Instant`, NaN and
//! infinities, every request limit at its default, and compressed camera frames whose body
//! does not decode. Each refusal is `invalid_request` naming the field or the parameter, and
//! the node answers the next ask; a broken frame never replaces the camera's good one. The
//! node runs the embedded tiny model on the BPU simulator with the launch file's params file.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use serde_json::Value;

use common::node_proc::{domain, start_demo_node};
use common::ros_env;

/// Runs `vlm_node` and the peer in `mode`; returns the peer's report and the node's log after
/// a clean SIGTERM stop.
async fn run(mode: &str) -> anyhow::Result<(Value, String)> {
    ros_env();
    let d = domain();
    let node = start_demo_node(
        &d,
        &[
            ("image_topics", "['/cam_jpeg']"),
            ("compressed_image_topics", "['/cam_compressed']"),
            ("diagnostics_period_s", "0.1"),
        ],
        &[],
    )?;
    let (rep, log) = node
        .serve_peer(
            &d,
            "tests/peers/request_peer.py",
            &[mode],
            Duration::from_secs(300),
        )
        .await?;
    Ok((rep, log))
}

fn refused_naming(case: &str, r: &Value, name: &str) {
    let resp = &r["response"];
    assert_eq!(resp["success"], false, "{case}: {resp}");
    assert_eq!(resp["error_code"], "invalid_request", "{case}: {resp}");
    let message = resp["error_message"].as_str().unwrap();
    assert!(
        message.contains(name),
        "{case}: {message:?} does not name {name}"
    );
    assert!(
        r["tokens"].as_array().unwrap().is_empty(),
        "{case}: a refused ask streamed"
    );
}

fn answered(case: &str, r: &Value) -> String {
    let resp = &r["response"];
    assert_eq!(resp["success"], true, "{case}: {resp}");
    let tokens = r["tokens"].as_array().unwrap();
    assert_eq!(
        tokens.iter().filter(|t| t["last"] == true).count(),
        1,
        "{case}: exactly one last Token"
    );
    resp["answer"].as_str().unwrap().to_owned()
}

/// Overflowing, NaN and infinite numbers and every request limit over ROS, one node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_refuses_bad_numbers_and_oversized_requests_naming_them() -> anyhow::Result<()> {
    let (rep, _log) = run("all").await?;
    let numbers = rep["numbers"].as_object().unwrap();
    let mut refused = 0;
    for (case, r) in numbers.iter().filter(|(k, _)| *k != "after") {
        refused_naming(case, &r["result"], r["field"].as_str().unwrap());
        refused += 1;
    }
    assert_eq!(refused, 15, "every number case came back");
    answered("after the numbers", &numbers["after"]);
    let limits = rep["limits"].as_object().unwrap();
    for (case, r) in limits.iter().filter(|(k, _)| *k != "after") {
        refused_naming(case, &r["result"], r["name"].as_str().unwrap());
    }
    assert_eq!(limits.len(), 7);
    answered("after the limits", &limits["after"]);

    // A broken jpeg/png after good frames: the ask gets the good frame (same answer, same
    // stamp), and diagnostics count the broken ones as rejected.
    for (name, f) in rep["frames"].as_object().unwrap() {
        let good = answered(&format!("{name}: good"), &f["good"]);
        let after = answered(&format!("{name}: after bad"), &f["after_bad"]);
        assert_eq!(after, good, "{name}: answer after the broken frames");
        assert_eq!(
            f["after_bad"]["response"]["image_stamp"], f["good_stamp"],
            "{name}: the ask used a frame other than the last good one"
        );
        let before = f["counts_before"].as_array().unwrap();
        let after = f["counts_after"].as_array().unwrap();
        assert_eq!(after[0], before[0], "{name}: a broken frame was accepted");
        assert!(
            after[1].as_i64().unwrap() > before[1].as_i64().unwrap(),
            "{name}: broken frames not counted as rejected: {before:?} → {after:?}"
        );
    }
    Ok(())
}

/// A dead camera is an error by default (`max_camera_silence_s` 2.0): asks about a camera
/// that streams are answered; 2.5 s after its last frame, a default-camera ask gets
/// `stale_image` naming the silence, while request validation still comes first and a
/// text-only ask is answered; when frames flow again, so do answers. Diagnostics report the
/// camera's rate and its newest frame's age (issue 25, item 3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_camera_that_stops_publishing_is_refused_after_two_seconds() -> anyhow::Result<()> {
    let (rep, _log) = run("silence").await?;
    let rep = &rep["silence"];
    answered("while streaming", &rep["streaming"]);
    let silent = &rep["silent"]["response"];
    assert_eq!(silent["error_code"], "stale_image", "{silent}");
    let message = silent["error_message"].as_str().unwrap();
    assert!(message.contains("silent for"), "{message}");
    assert!(rep["silent"]["tokens"].as_array().unwrap().is_empty());
    refused_naming(
        "invalid while silent",
        &rep["silent_invalid"],
        "temperature",
    );
    answered("text only while silent", &rep["silent_text_only"]);
    answered("frames again", &rep["back"]);
    let key = |d: &Value, k: &str| -> f64 {
        d[format!("camera /cam_jpeg {k}")]
            .as_str()
            .unwrap_or_else(|| panic!("no camera {k} in {d}"))
            .parse()
            .unwrap()
    };
    let rate = key(&rep["diag_streaming"], "frame_rate_hz");
    assert!((5.0..=12.0).contains(&rate), "a 10 Hz camera: {rate}");
    assert!(key(&rep["diag_streaming"], "newest_frame_age_s") < 1.0);
    assert!(key(&rep["diag_silent"], "newest_frame_age_s") >= 2.5);
    Ok(())
}

fn set_refused(case: &str, r: &Value) -> String {
    assert_eq!(r["successful"], false, "{case}: {r}");
    r["reason"].as_str().unwrap().to_owned()
}

/// A request may ask for less time and fewer tokens than `max_request_timeout_s` and
/// `max_request_new_tokens` allow, never more; both caps apply from the next ask when set at
/// run time, and the node's own default above a cap is cut to it. The `system_prompt`
/// parameter is held to `max_prompt_bytes` (issue 23, items 5 and 2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_are_held_to_the_node_caps_and_the_system_prompt_to_its_bound(
) -> anyhow::Result<()> {
    let (rep, _log) = run("caps").await?;
    let rep = &rep["caps"];
    refused_naming(
        "timeout above",
        &rep["timeout_above"],
        "max_request_timeout_s",
    );
    refused_naming(
        "tokens above",
        &rep["tokens_above"],
        "max_request_new_tokens",
    );
    answered("at the caps", &rep["at_caps"]);
    answered("timeout_s 0", &rep["no_limit"]);
    for case in ["set_tokens_cap", "set_timeout_cap", "system_prompt_ok"] {
        assert_eq!(rep[case]["successful"], true, "{case}: {}", rep[case]);
    }
    refused_naming(
        "tokens above the set cap",
        &rep["tokens_above_set"],
        "max_request_new_tokens",
    );
    refused_naming(
        "timeout above the set cap",
        &rep["timeout_above_set"],
        "max_request_timeout_s",
    );
    answered("the default cut to the cap", &rep["default_tokens"]);
    let cut = &rep["default_tokens"]["response"];
    assert_eq!(cut["completion_tokens"], 3, "{cut}");
    assert_eq!(cut["finish_reason"], "length", "{cut}");

    let long = set_refused("long system_prompt", &rep["system_prompt_long"]);
    assert!(
        long.contains("system_prompt") && long.contains("max_prompt_bytes"),
        "{long}"
    );
    let below = set_refused("max_prompt_bytes below", &rep["max_prompt_bytes_below"]);
    assert!(below.contains("max_prompt_bytes"), "{below}");
    let after = &rep["after"];
    assert_eq!(after["system_prompt"]["value"], "Be brief.", "{after}");
    assert_eq!(after["max_prompt_bytes"]["value"], 65536, "{after}");
    assert_eq!(after["max_request_new_tokens"]["value"], 3, "{after}");
    answered("after the sets", &rep["answer_after"]);
    Ok(())
}

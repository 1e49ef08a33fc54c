//! Frame priming over a real ROS 2 graph (peer: `tests/peers/prefill_peer.py`), on the
//! embedded tiny model on the BPU simulator, with priming on as by default:
//! - a greedy ask served from a primed frame answers exactly as a cold ask on the same
//!   pixels (sent as a request image, never primed), with that frame's stamp and frame id
//!   and the same `prompt_tokens`;
//! - behind a long ask, an ask without an age limit is served from the primed frame, one
//!   whose `max_image_age_s` the primed frame exceeds gets the newer frame (prefilled in
//!   full), both correct and answered in queue order;
//! - another system prompt or another camera misses the priming and is still correct;
//! - with a 10 Hz camera keeping primings due, none starts while asks are queued;
//! - a camera ask that times out in the queue is not counted as a priming camera ask;
//! - after `system_prompt` is set over the parameter service, the priming follows it: an ask
//!   without a system prompt (so with the set one) is served from the priming and answers as
//!   a cold ask.
//!
//! Hits, misses and primings are read from `/diagnostics` counters, never from timings.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use serde_json::Value;

use common::node_proc::{check_image_header, domain, ok, peer_env, start_demo_node};
use common::ros_env;

fn count(d: &Value, key: &str) -> u64 {
    d[key]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{key} in {d}"))
}

fn stamp(r: &Value) -> [i64; 2] {
    let s = &r["response"]["image_stamp"];
    [s["sec"].as_i64().unwrap(), s["nanosec"].as_i64().unwrap()]
}

fn sent(rep: &Value, key: &str) -> Vec<[i64; 2]> {
    rep[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| [s[0].as_i64().unwrap(), s[1].as_i64().unwrap()])
        .collect()
}

/// `got` answers exactly as the cold reference `want`: text, token count, finish reason and
/// prompt rows.
fn same_answer(case: &str, got: &Value, want: &Value) {
    assert_eq!(ok(case, got), ok(case, want), "{case}: answer text");
    for k in ["completion_tokens", "finish_reason", "prompt_tokens"] {
        assert_eq!(got["response"][k], want["response"][k], "{case}: {k}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asks_are_served_from_the_prefilled_frame_exactly_and_in_order() -> anyhow::Result<()> {
    ros_env();
    let d = domain();
    let mut env = peer_env(&d);
    env.remove(0);
    let node = start_demo_node(
        &d,
        &[
            ("image_topics", "['/cam', '/cam2']"),
            ("default_camera", "/cam"),
            ("diagnostics_period_s", "0.05"),
            ("prefill_duty", "1.0"),
            // Every new frame primed, as before scene checks: the peer counts primings of
            // an unchanged scene (tests/node_scene.rs covers scene_check).
            ("scene_check", "false"),
        ],
        &env,
    )?;
    let (rep, _log) = node
        .serve_peer(
            &d,
            "tests/peers/prefill_peer.py",
            &[],
            Duration::from_secs(300),
        )
        .await?;

    // Served from the priming: the cold answer on the same pixels, the frame's own header.
    let h1 = &rep["h1"];
    assert_eq!(count(&rep["d_h1"], "prefill_hits"), 1, "{}", rep["d_h1"]);
    assert_eq!(count(&rep["d_h1"], "prefill_camera_asks"), 1);
    assert!(sent(&rep, "sent_a").contains(&stamp(h1)), "{h1}");
    check_image_header("h-1", h1, "cam_a", stamp(h1));
    same_answer("h-1", h1, &rep["ca"]);

    // Behind L: X takes the (newest) primed scene_a frame, Y the newer scene_b frame.
    let newest_a = *sent(&rep, "sent_a").last().unwrap();
    assert_eq!(stamp(&rep["X"]), newest_a, "X: the primed frame");
    check_image_header("X", &rep["X"], "cam_a", newest_a);
    same_answer("X", &rep["X"], &rep["ca"]);
    assert!(
        sent(&rep, "sent_b").contains(&stamp(&rep["Y"])),
        "Y: a newer frame"
    );
    check_image_header("Y", &rep["Y"], "cam_b", stamp(&rep["Y"]));
    same_answer("Y", &rep["Y"], &rep["cb"]);
    ok("L", &rep["L"]);
    assert_eq!(
        rep["order"],
        serde_json::json!(["L", "X", "Y"]),
        "queue order"
    );
    let (before, strict) = (&rep["d_before_strict"], &rep["d_strict"]);
    assert_eq!(
        count(strict, "prefill_hits") - count(before, "prefill_hits"),
        1,
        "X hit, Y missed: {strict}"
    );
    assert_eq!(
        count(strict, "prefill_camera_asks") - count(before, "prefill_camera_asks"),
        2
    );

    // Misses: another system prompt on the priming camera, another camera.
    let s_hits = count(&rep["d_S"], "prefill_hits");
    assert_eq!(s_hits, count(strict, "prefill_hits"), "S missed");
    same_answer("S", &rep["S"], &rep["cs"]);
    assert_eq!(count(&rep["d_K"], "prefill_hits"), s_hits, "K missed");
    assert_eq!(
        count(&rep["d_K"], "prefill_camera_asks"),
        count(&rep["d_S"], "prefill_camera_asks"),
        "/cam2 is not the priming camera"
    );
    assert!(sent(&rep, "sent_c").contains(&stamp(&rep["K"])));
    same_answer("K", &rep["K"], &rep["cc"]);

    // Queued: every ask answered in order; while asks were waiting (served 1..=3 of 4), the
    // priming counters did not move.
    for id in ["Q0", "Q1", "Q2", "Q3"] {
        ok(id, &rep[id]);
    }
    assert_eq!(
        rep["queued_order"],
        serde_json::json!(["Q0", "Q1", "Q2", "Q3"])
    );
    let during: Vec<(u64, u64)> = rep["queued_diag"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| (1..=3).contains(&v[0].as_i64().unwrap()))
        .map(|v| (v[1].as_u64().unwrap(), v[2].as_u64().unwrap()))
        .collect();
    assert!(
        during.len() >= 2,
        "updates while asks were queued: {}",
        rep["queued_diag"]
    );
    assert!(
        during.windows(2).all(|w| w[0] == w[1]),
        "no priming while asks are queued: {}",
        rep["queued_diag"]
    );

    // Timed out in the queue: answered `timeout`, never chosen a frame for.
    ok("LT", &rep["LT"]);
    assert_eq!(
        rep["T"]["response"]["error_code"], "timeout",
        "{}",
        rep["T"]
    );
    let (before, after) = (&rep["d_before_T"], &rep["d_T"]);
    for key in ["prefill_camera_asks", "prefill_hits"] {
        assert_eq!(count(after, key), count(before, key), "{key}: {after}");
    }

    // A run-time system prompt: the next default ask is a hit, the cold answer.
    assert_eq!(rep["set"]["successful"], true, "{}", rep["set"]);
    let (before, after) = (&rep["d_before_set"], &rep["d_P"]);
    assert_eq!(
        count(after, "prefill_hits") - count(before, "prefill_hits"),
        1,
        "P served from the priming made for the set system prompt: {after}"
    );
    check_image_header("P", &rep["P"], "cam_a", stamp(&rep["P"]));
    same_answer("P", &rep["P"], &rep["cp"]);
    Ok(())
}

//! Session follow-ups about a frame the conversation already holds, over a real ROS 2 graph
//! (peer: `tests/peers/followup_peer.py`): a second ask about the same camera frame, or a
//! request image with the same pixels, adds only its question — `prompt_tokens` equals the
//! same question asked without an image, the answer is token for token that one, and the
//! vision tower does not run (`images_encoded` in `/diagnostics`). A newer frame goes in as
//! usual. Every answer reports the turn of its session (`session_turn`, peer:
//! `tests/peers/turns_peer.py`), 1 again once the node dropped the session (evicted or
//! expired, counted in `/diagnostics`). The node runs the embedded tiny model on the BPU
//! simulator.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use serde_json::Value;

use common::node_proc::{check_image_header, domain, ok, peer_env, start_demo_node};
use common::ros_env;

/// Rows of one 320 px image block on the demo model: 100 tower rows, `<|vision_start|>` and
/// `<|vision_end|>` (as tests/node.rs measures).
const IMAGE_BLOCK: u64 = 102;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_up_on_the_same_frame_adds_only_its_question() -> anyhow::Result<()> {
    ros_env();
    let d = domain();
    let node = start_demo_node(
        &d,
        &[
            ("image_topics", "['/cam']"),
            ("default_camera", "/cam"),
            ("diagnostics_period_s", "0.05"),
            // A primed frame runs the tower outside the asks; the counts here are the asks'.
            ("prefill_latest_frame", "false"),
        ],
        &peer_env(&d),
    )?;
    let (rep, _log) = node
        .serve_peer(
            &d,
            "tests/peers/followup_peer.py",
            &[],
            Duration::from_secs(300),
        )
        .await?;

    let asks = &rep["asks"];
    let r = |id: &str| -> &Value { &asks[id] };
    for id in ["a-1", "a-2", "b-1", "b-2", "a-3", "r-1", "r-2", "r-3"] {
        ok(id, r(id));
    }
    let rows = |id: &str| r(id)["response"]["prompt_tokens"].as_u64().unwrap();
    let encoded = |id: &str| r(id)["images_encoded"].as_u64().unwrap();
    let stamp = |id: &str| {
        let s = &r(id)["response"]["image_stamp"];
        [s["sec"].as_i64().unwrap(), s["nanosec"].as_i64().unwrap()]
    };
    let base = rep["base_images_encoded"].as_u64().unwrap();

    // The first ask of a session adds its frame.
    assert_eq!(encoded("a-1"), base + 1);
    // The follow-up on the same frame: no tower run, only the question's rows, and the same
    // answer as the same question without an image after the same first turn (session b).
    assert_eq!(
        encoded("a-2"),
        encoded("a-1"),
        "the tower ran for a held frame"
    );
    assert_eq!(encoded("b-1"), encoded("a-2") + 1);
    assert_eq!(encoded("b-2"), encoded("b-1"));
    assert_eq!(rows("a-2"), rows("b-2"));
    assert_eq!(rows("a-1"), rows("b-1"));
    assert_eq!(
        r("a-2")["response"]["answer"],
        r("b-2")["response"]["answer"]
    );
    // The response names the frame the answer is about: the one already in the session.
    assert_eq!(r("a-2")["response"]["image_source"], "/cam");
    assert_eq!(stamp("a-2"), stamp("a-1"));
    check_image_header("a-2", r("a-2"), "cam_a", stamp("a-1"));
    let sent_a: Vec<[i64; 2]> = serde_json::from_value(rep["sent_a"].clone())?;
    assert!(sent_a.contains(&stamp("a-1")), "{:?}", stamp("a-1"));

    // A newer frame is added to the same session.
    assert_eq!(encoded("a-3"), encoded("b-2") + 1);
    assert_eq!(rows("a-3"), rows("b-2") + IMAGE_BLOCK);
    let sent_b: Vec<[i64; 2]> = serde_json::from_value(rep["sent_b"].clone())?;
    assert!(sent_b.contains(&stamp("a-3")), "{:?}", stamp("a-3"));
    check_image_header("a-3", r("a-3"), "cam_b", stamp("a-3"));

    // Request images: the same pixels (here as a PNG) are not added twice; the response
    // carries the header sent with the request.
    assert_eq!(encoded("r-1"), encoded("a-3") + 1);
    assert_eq!(rows("r-1"), rows("a-1"));
    assert_eq!(
        encoded("r-2"),
        encoded("r-1"),
        "the tower ran for held pixels"
    );
    assert_eq!(rows("r-2"), rows("b-2"));
    assert_eq!(r("r-2")["response"]["image_source"], "request");
    check_image_header("r-2", r("r-2"), "req_2", [2, 0]);
    assert_eq!(encoded("r-3"), encoded("r-2") + 1);
    assert_eq!(rows("r-3"), rows("b-2") + IMAGE_BLOCK);
    Ok(())
}

/// The `session_turn` of one ask's report, in its response (the action's result for a goal)
/// and in its Answer on `/vlm/answers`, which must agree.
fn turn(rep: &Value, id: &str) -> u64 {
    let r = &rep["asks"][id];
    ok(id, r);
    let t = r["response"]["session_turn"].as_u64().unwrap();
    assert_eq!(r["answer"]["session_turn"], t, "{id}: Answer.session_turn");
    t
}

/// Runs `vlm_node` (diagnostics every 50 ms, plus `params`) and the turns peer in `mode`;
/// the peer's report and the node's log.
async fn run_turns(mode: &str, params: &[(&str, &str)]) -> anyhow::Result<(Value, String)> {
    ros_env();
    let d = domain();
    let mut all = vec![("diagnostics_period_s", "0.05")];
    all.extend_from_slice(params);
    let node = start_demo_node(&d, &all, &peer_env(&d))?;
    node.serve_peer(
        &d,
        "tests/peers/turns_peer.py",
        &[mode],
        Duration::from_secs(300),
    )
    .await
}

/// Each answer reports the turn of its session: 1, 2, 3 over the service and as action
/// goals, a session continued from the action over the service, 0 without a session. And a
/// flood of malformed goals (all refused) gets one rate-limited warning, not one each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_report_their_session_turn() -> anyhow::Result<()> {
    let (rep, log) = run_turns("turns", &[]).await?;
    for (i, id) in ["s-1", "s-2", "s-3"].into_iter().enumerate() {
        assert_eq!(turn(&rep, id), i as u64 + 1, "{id} (service)");
    }
    // A turn that fails after admission reports the turn it would have been, and is not
    // kept: the next ask is that turn again.
    let late = &rep["asks"]["s-late"];
    assert_eq!(late["response"]["error_code"], "timeout", "{late}");
    assert_eq!(late["response"]["session_turn"], 4, "{late}");
    assert_eq!(late["answer"]["session_turn"], 4, "{late}");
    assert_eq!(turn(&rep, "s-4"), 4);
    for (i, id) in ["g-1", "g-2", "g-3"].into_iter().enumerate() {
        assert_eq!(turn(&rep, id), i as u64 + 1, "{id} (action result)");
    }
    assert_eq!(
        turn(&rep, "g-4"),
        4,
        "the service continues the action's session"
    );
    assert_eq!(turn(&rep, "none-svc"), 0);
    assert_eq!(turn(&rep, "none-act"), 0);
    assert_eq!(rep["asks"]["s-3"]["diag"]["sessions_evicted"], "0");

    assert_eq!(rep["malformed"], 0, "a zero goal id is refused");
    // The node's own log lines (its /rosout echo repeats each warning without the target).
    let warned = log
        .lines()
        .filter(|l| l.contains("action goal rejected") && l.contains("ask_action"))
        .count();
    assert!(
        (1..=2).contains(&warned),
        "50 malformed goals gave {warned} warnings (at most one per 5 s)"
    );
    Ok(())
}

/// A session evicted by `session_memory_mb` starts afresh: its next ask reports turn 1, and
/// diagnostics count the eviction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_evicted_session_restarts_at_turn_1_and_is_counted() -> anyhow::Result<()> {
    let (rep, _log) = run_turns("evict", &[("session_memory_mb", "1")]).await?;
    assert_eq!(turn(&rep, "v-1"), 1);
    assert_eq!(turn(&rep, "v-2"), 2, "the session was kept");
    let fillers = rep["fillers"].as_u64().unwrap();
    assert!(fillers < 64, "no eviction after {fillers} new sessions");
    for f in 0..fillers {
        assert_eq!(turn(&rep, &format!("f-{f}")), 1);
    }
    let last = &rep["asks"][format!("f-{}", fillers - 1)]["diag"];
    assert_eq!(last["sessions_evicted"], "1", "{last}");
    // The least recently used session was v: it starts afresh.
    assert_eq!(turn(&rep, "v-3"), 1, "v was evicted");
    Ok(())
}

/// A session expired after `session_idle_s` starts afresh too, and is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_session_restarts_at_turn_1_and_is_counted() -> anyhow::Result<()> {
    let (rep, _log) = run_turns("expire", &[("session_idle_s", "2.0")]).await?;
    assert_eq!(turn(&rep, "e-1"), 1);
    assert_eq!(turn(&rep, "e-2"), 2);
    let expired = &rep["expired_diag"];
    assert_eq!(expired["sessions_expired"], "1", "{expired}");
    assert_eq!(expired["sessions_evicted"], "0", "{expired}");
    assert_eq!(turn(&rep, "e-3"), 1, "e expired");
    Ok(())
}

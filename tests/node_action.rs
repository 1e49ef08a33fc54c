//! The Ask action (`/vlm/ask`, `bpu_vlm_msgs/action/Ask`) of the real `vlm_node` process
//! against rclpy's ActionClient over a real ROS 2 graph (peer: `tests/peers/action_peer.py`):
//! feedback Tokens are the tokens topic's and add up to the result's answer; a cancelled goal
//! ends CANCELED with the partial answer; goals the service would refuse are accepted and
//! then aborted with the service's error code; the service keeps working beside the action;
//! finished goals leave the status array after the result timeout. The node runs the
//! embedded tiny model on the BPU simulator.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use anyhow::Context as _;
use serde_json::Value;

use common::node_proc::{
    check_image_header, check_stream, domain, ok, peer_env, report_with_sigterm_at_first_token,
    start_demo_node,
};
use common::{ros_env, spawn_python};

// action_msgs/GoalStatus values.
const SUCCEEDED: u64 = 4;
const CANCELED: u64 = 5;
const ABORTED: u64 = 6;
const UNKNOWN: u64 = 0;

/// The Answer's `session_tag` of session `id`: the first 16 hex digits of its SHA-256.
fn sha256_16(id: &str) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(id.as_bytes())[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// One goal's report: accepted, the terminal status, and the feedback (read on the feedback
/// topic, each message naming the goal) equal to the Tokens on the tokens topic, message for
/// message.
fn goal(case: &str, r: &Value, status: u64) {
    assert_eq!(r["accepted"], true, "{case}: every goal is accepted");
    assert_eq!(r["status"], status, "{case}: {}", r["response"]);
    assert_eq!(
        r["tokens"], r["topic_tokens"],
        "{case}: feedback = the Tokens on /vlm/tokens"
    );
    assert_eq!(r["feedback_goal_ids_ok"], true, "{case}: feedback goal ids");
}

/// rclpy's ActionClient delivered feedback to the goal's callback while it ran (the last
/// Tokens may come after the result, when the client no longer listens).
fn client_saw_feedback(case: &str, r: &Value) {
    assert!(
        r["client_feedback"].as_u64().unwrap() >= 1,
        "{case}: no feedback reached the ActionClient's callback"
    );
}

/// A goal refused on the service's path: accepted, ABORTED, `code` with a reason, and
/// nothing streamed.
fn aborted_with(case: &str, r: &Value, code: &str) {
    goal(case, r, ABORTED);
    let res = &r["response"];
    assert_eq!(res["success"], false, "{case}");
    assert_eq!(res["error_code"], code, "{case}: {res}");
    assert!(
        !res["error_message"].as_str().unwrap().is_empty(),
        "{case}: the reason is in the result"
    );
    assert_eq!(res["finish_reason"], "", "{case}: generation never started");
    assert!(
        r["tokens"].as_array().unwrap().is_empty(),
        "{case}: feedback"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn action_feedback_cancel_busy_invalid_beside_the_service() -> anyhow::Result<()> {
    ros_env();
    let d = domain();
    // Every BPU task 40 ms slower: a 400-token goal is still running when it is cancelled
    // and while the queue is full.
    let slow = vec![("BPU_SIM_FAULTS", "hbUCPSubmitTask:slow=40".to_owned())];
    let node = start_demo_node(
        &d,
        &[("queue_depth", "2"), ("diagnostics_period_s", "0.1")],
        &slow,
    )?;
    let (rep, _log) = node
        .serve_peer(
            &d,
            "tests/peers/action_peer.py",
            &["protocol", "--queue-depth", "2"],
            Duration::from_secs(300),
        )
        .await?;

    let g = &rep["greedy"];
    goal("greedy", g, SUCCEEDED);
    // The feedback adds up to the result's answer; the Answer matches the result.
    let answer = ok("greedy goal", g);
    client_saw_feedback("greedy", g);
    assert!(!answer.is_empty());
    // The same question over the service: the same path, the same answer.
    assert_eq!(ok("service", &rep["service_greedy"]), answer);

    // The frame's own header in the result and the Answer; the session as its tag only.
    let cam = &rep["camera_goal"];
    goal("camera goal", cam, SUCCEEDED);
    ok("camera goal", cam);
    let sent = rep["camera_sent"].as_array().unwrap();
    let stamp = cam["response"]["image_header"]["stamp"].clone();
    assert!(
        sent.iter()
            .any(|s| s[0] == stamp["sec"] && s[1] == stamp["nanosec"]),
        "a stamp the peer sent: {stamp}"
    );
    check_image_header(
        "camera goal",
        cam,
        "cam_link",
        [
            stamp["sec"].as_i64().unwrap(),
            stamp["nanosec"].as_i64().unwrap(),
        ],
    );
    assert_eq!(cam["answer"]["session_tag"], sha256_16("tag-session"));
    assert!(!cam["answer"].to_string().contains("\"tag-session\""));

    let cr = &rep["cancel_response"];
    assert_eq!(cr["return_code"], 0, "{cr}");
    assert_eq!(cr["goals_canceling"].as_array().unwrap().len(), 1, "{cr}");
    let c = &rep["cancelled"];
    goal("cancelled", c, CANCELED);
    let res = &c["response"];
    assert_eq!(res["success"], false);
    assert_eq!(res["error_code"], "cancelled");
    assert_eq!(res["finish_reason"], "cancelled");
    check_stream("cancelled goal", c);
    assert_eq!(c["answer"]["success"], false);
    assert_eq!(c["answer"]["error_code"], "cancelled");
    assert_eq!(c["answer"]["session_tag"], sha256_16("tag-session-2"));
    client_saw_feedback("cancelled", c);
    assert!(
        res["completion_tokens"].as_u64().unwrap() < 400,
        "stopped early: {res}"
    );

    // /vlm/cancel stops a goal as it stops a service request; the action protocol reaches
    // CANCELED only through its own cancel, so the goal is ABORTED with error_code cancelled.
    assert_eq!(rep["vlm_cancel_response"]["success"], true);
    let vc = &rep["vlm_cancelled"];
    goal("vlm/cancel", vc, ABORTED);
    assert_eq!(
        vc["response"]["error_code"], "cancelled",
        "{}",
        vc["response"]
    );
    assert_eq!(vc["response"]["finish_reason"], "cancelled");
    check_stream("goal stopped by /vlm/cancel", vc);

    aborted_with("busy", &rep["busy"], "busy");
    aborted_with("empty prompt", &rep["invalid"], "invalid_request");
    let all = &rep["cancel_all_response"];
    assert_eq!(all["return_code"], 0, "{all}");
    assert_eq!(
        all["goals_canceling"].as_array().unwrap().len(),
        2,
        "both queue goals were running or queued: {all}"
    );
    for q in rep["queued"].as_array().unwrap() {
        goal("queued", q, CANCELED);
        assert_eq!(q["response"]["error_code"], "cancelled", "{q}");
    }

    ok("service beside a goal", &rep["service_alongside"]);
    let ga = &rep["goal_alongside"];
    goal("goal beside a service ask", ga, SUCCEEDED);
    ok("goal beside a service ask", ga);
    Ok(())
}

/// Finished goals leave the status array after the result timeout (3 s here): two rounds of
/// goals, the second started once the first's have all expired, so its status arrays hold its
/// own goals only — r2r 0.9.7's server would list both rounds. Counted, not timed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn action_status_stays_bounded_as_finished_goals_expire() -> anyhow::Result<()> {
    ros_env();
    let d = domain();
    let count: u64 = 150;
    let node = start_demo_node(&d, &[("action_result_timeout_s", "3.0")], &[])?;
    let (rep, _log) = node
        .serve_peer(
            &d,
            "tests/peers/action_peer.py",
            &["expiry", "--count", &count.to_string(), "--timeout", "280"],
            Duration::from_secs(300),
        )
        .await?;
    // A result fetched within the result timeout of the goal's end.
    assert_eq!(
        rep["statuses"][SUCCEEDED.to_string()],
        2 * count,
        "every goal succeeded: {}",
        rep["statuses"]
    );
    let rounds = rep["rounds"].as_array().unwrap();
    for (i, r) in rounds.iter().enumerate() {
        eprintln!("round {i}: {r}");
        assert_eq!(r["final_status_length"], 0, "round {i}: every goal expired");
    }
    let max = rounds[1]["max_status_length"].as_u64().unwrap();
    assert!(
        (1..=count).contains(&max),
        "the second round's arrays held {max} goals: the first round's had not expired"
    );
    assert_eq!(rep["expired_status"], UNKNOWN, "an expired goal is unknown");
    assert_eq!(rep["expired_success"], false);
    Ok(())
}

/// SIGTERM while a goal generates: the node cancels it like every live request, and the
/// goal's result (ABORTED, `cancelled`, the partial answer) reaches the client before the
/// node exits cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn action_goal_gets_its_result_when_the_node_stops() -> anyhow::Result<()> {
    ros_env();
    let d = domain();
    let slow = vec![("BPU_SIM_FAULTS", "hbUCPSubmitTask:slow=40".to_owned())];
    let node = start_demo_node(&d, &[], &slow)?;
    let pid = node.child.id().context("node pid")?;
    let peer = spawn_python("tests/peers/action_peer.py", &["sigterm"], &peer_env(&d))?;
    let (rep, sent) =
        report_with_sigterm_at_first_token(peer, pid, Duration::from_secs(120)).await?;
    assert!(sent, "the peer never saw feedback");
    let (exit, log) = node.exited(Duration::from_secs(20)).await?;
    assert!(exit.success(), "exit status {exit}");
    assert!(log.contains("vlm_node stopped cleanly"), "{log}");
    goal("sigterm", &rep, ABORTED);
    assert_eq!(
        rep["response"]["error_code"], "cancelled",
        "{}",
        rep["response"]
    );
    check_stream("sigterm", &rep);
    Ok(())
}

/// Every response of the action reaches rclpy's client even when it is back before the
/// client has recorded its request: the peer's client pauses after each send (`race` in
/// `tests/peers/action_peer.py`), so each goal response, each result of a goal that has
/// already ended and the cancel response arrive inside that window. rclpy 7.1's own
/// ActionClient drops every one of them (the soak's lost goal, docs/ask-action.md); the
/// peers' `bpu_vlm_client.action_client.ActionClient` keeps them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn action_responses_that_beat_the_clients_bookkeeping_are_kept() -> anyhow::Result<()> {
    ros_env();
    let d = domain();
    let count: u64 = 5;
    // The cancelled goal is still generating when its cancel arrives.
    let slow = vec![("BPU_SIM_FAULTS", "hbUCPSubmitTask:slow=40".to_owned())];
    let node = start_demo_node(&d, &[], &slow)?;
    let (rep, _log) = node
        .serve_peer(
            &d,
            "tests/peers/action_peer.py",
            &["race", "--count", &count.to_string(), "--pause", "0.2"],
            Duration::from_secs(300),
        )
        .await?;
    assert_eq!(rep["goals"], count + 1, "{rep}");
    assert_eq!(
        rep["goal_responses"],
        count + 1,
        "goal responses lost: {rep}"
    );
    let mut expected = vec![Value::from(SUCCEEDED); count as usize];
    expected.push(Value::from(CANCELED));
    assert_eq!(rep["results"], Value::from(expected), "results lost: {rep}");
    assert_eq!(rep["cancel"], 1, "the cancel response was lost: {rep}");
    Ok(())
}

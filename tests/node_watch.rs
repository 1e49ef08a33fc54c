//! Standing questions (`vlm/watch`) over a real ROS 2 graph (peer: `tests/peers/watch_peer.py`),
//! on the embedded tiny model on the BPU simulator, with a scripted 10 Hz camera whose every
//! frame carries Gaussian noise of σ = 4/255:
//! - invalid goals are aborted with `invalid_request` and the reason;
//! - 10 s of a static noisy scene: exactly one evaluation (the one at acceptance);
//! - three scene switches 4 s apart: an evaluation after each, on a frame of the new scene
//!   sent after its switch;
//! - the events on `vlm/events` are exactly the feedback whose answer changed, in order, each
//!   naming the previous answer;
//! - a goal beyond `max_watches` is aborted `busy`; a silent camera gets a `camera_silent`
//!   feedback and the goal goes on when frames return; `until` ends a goal with success;
//!   cancel ends one CANCELED with its result;
//! - SIGTERM gives every running watch its result.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use anyhow::Context;
use serde_json::Value;

use common::node_proc::{domain, peer_env, report_with_sigterm_at_first_token, start_demo_node};
use common::scripted::{count, pair, pair_of, scene_of, secs};
use common::{ros_env, spawn_python};

const SUCCEEDED: i64 = 4;
const CANCELED: i64 = 5;
const ABORTED: i64 = 6;

fn status(r: &Value) -> i64 {
    r["status"].as_i64().unwrap()
}

fn params() -> Vec<(&'static str, &'static str)> {
    vec![
        ("image_topics", "['/cam']"),
        ("default_camera", "/cam"),
        ("diagnostics_period_s", "0.05"),
        ("max_watches", "2"),
        ("max_camera_silence_s", "1.0"),
    ]
}

/// W's evaluations (feedback that is no silence notice), in order.
fn evaluations(rep: &Value) -> Vec<Value> {
    rep["feedback"]["W"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| !f["camera_silent"].as_bool().unwrap())
        .cloned()
        .collect()
}

fn check_invalid(rep: &Value) {
    for (case, words) in [
        ("empty", "question is empty"),
        ("until", "until is not a JSON value"),
        ("camera", "camera \"none\""),
        ("schema", "json_schema"),
        ("interval", "min_interval_s"),
    ] {
        let r = &rep[format!("invalid_{case}")];
        assert_eq!(status(r), ABORTED, "{case}: {r}");
        assert_eq!(r["result"]["error_code"], "invalid_request", "{case}: {r}");
        let msg = r["result"]["error_message"].as_str().unwrap();
        assert!(msg.contains(words), "{case}: {msg}");
    }
}

/// After each switch, an evaluation on a frame of the new scene sent after the switch; and
/// every evaluation is about the scene in front of the camera at its frame's time.
fn check_switches(rep: &Value, evals: &[Value]) {
    let switches = rep["switches"].as_array().unwrap();
    for (i, s) in switches.iter().enumerate() {
        let (at, key) = (pair_of(&s[0]), s[1].as_str().unwrap());
        let next = switches
            .get(i + 1)
            .map_or(pair_of(&rep["back"]), |n| pair_of(&n[0]));
        let after: Vec<_> = evals
            .iter()
            .map(|e| pair(&e["image_header"]["stamp"]))
            .filter(|st| *st >= at && *st < next)
            .collect();
        assert!(
            !after.is_empty(),
            "no evaluation after switch {i} to {key}: {evals:?}"
        );
        for st in after {
            assert_eq!(
                scene_of(rep, st),
                key,
                "switch {i}: an evaluation on an old frame"
            );
        }
    }
}

/// The events of `goal` are the feedback whose answer changed, in order, with the previous
/// answers; each feedback's `changed` says whether its answer differs from the one before.
fn check_events(rep: &Value, evals: &[Value], goal: &Value) {
    let mut previous: Option<&str> = None;
    let mut expected = Vec::new();
    for e in evals {
        let answer = e["answer"].as_str().unwrap();
        let changed = previous != Some(answer);
        assert_eq!(e["changed"], changed, "{e}");
        if changed {
            expected.push((previous.unwrap_or("").to_owned(), answer.to_owned()));
        }
        previous = Some(answer);
    }
    let events: Vec<_> = rep["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| &e["goal_id"]["uuid"] == goal)
        .map(|e| {
            assert_eq!(e["question"], "Is there a cup?");
            (
                e["previous_answer"].as_str().unwrap().to_owned(),
                e["answer"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(events, expected, "events against the feedback");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_evaluates_on_scene_changes_and_reports_answer_changes() -> anyhow::Result<()> {
    ros_env();
    let d = domain();
    let node = start_demo_node(&d, &params(), &peer_env(&d))?;
    let (rep, _log) = node
        .serve_peer(
            &d,
            "tests/peers/watch_peer.py",
            &["scripted"],
            Duration::from_secs(240),
        )
        .await?;
    check_invalid(&rep);
    assert_eq!(rep["static_evaluations"], 1, "noise started an evaluation");
    let evals = evaluations(&rep);
    for e in &evals {
        let a = e["answer"].as_str().unwrap();
        assert!(
            a == "\"yes\"" || a == "\"no\"",
            "not the default schema's: {a}"
        );
    }
    check_switches(&rep, &evals);

    let x = &rep["X"];
    assert_eq!(
        (status(x), &x["result"]["error_code"]),
        (ABORTED, &"busy".into()),
        "{x}"
    );
    assert!(x["result"]["error_message"]
        .as_str()
        .unwrap()
        .contains("max_watches"));
    let silent: Vec<_> = rep["feedback"]["W"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["camera_silent"].as_bool().unwrap())
        .collect();
    assert_eq!(silent.len(), 1, "one notice per silence: {silent:?}");
    assert_eq!(silent[0]["answer"], "");
    let back = evals.last().unwrap();
    assert_eq!(scene_of(&rep, pair(&back["image_header"]["stamp"])), "b");

    let u = &rep["U"];
    assert_eq!(status(u), SUCCEEDED, "{u}");
    assert_eq!(u["result"]["success"], true);
    assert_eq!(u["result"]["answer"], "\"yes\"");
    assert_eq!(u["result"]["evaluations"], 1);

    let y = &rep["Y"];
    assert_eq!(status(y), CANCELED, "{y}");
    assert_eq!(y["result"]["error_code"], "cancelled", "{y}");
    // No two evaluations of W started closer than its min_interval_s (1 s).
    let starts: Vec<f64> = evals
        .iter()
        .map(|e| secs(pair_of(&e["at"])) - e["evaluation_s"].as_f64().unwrap())
        .collect();
    for pair in starts.windows(2) {
        assert!(
            pair[1] - pair[0] >= 0.95,
            "evaluations {pair:?} closer than 1 s"
        );
    }

    let w = &rep["W"];
    assert_eq!(status(w), CANCELED, "{w}");
    assert_eq!(w["result"]["error_code"], "cancelled");
    assert_eq!(w["result"]["evaluations"], evals.len() as u64);
    assert_eq!(w["result"]["answer"], back["answer"]);
    assert_eq!(w["result"]["image_header"], back["image_header"]);
    check_events(&rep, &evals, &w["goal_id"]);

    let diag = &rep["diag"];
    assert_eq!(diag["watches_active"], "0", "{diag}");
    let events = rep["events"].as_array().unwrap().len();
    assert_eq!(diag["watch_events"], events.to_string(), "{diag}");
    Ok(())
}

/// An ask that arrives while a watch evaluates goes first: the evaluation yields (counted in
/// `watch_evaluations_yielded`), the ask is answered, and the evaluation is made again after
/// it, on a frame of the new scene. The BPU is slowed so the evaluation is still running
/// when the ask comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ask_stops_a_running_evaluation_which_is_made_again_after_it() -> anyhow::Result<()> {
    ros_env();
    let d = domain();
    let mut env = peer_env(&d);
    env.push(("BPU_SIM_FAULTS", "hbUCPSubmitTask:slow=150".to_owned()));
    let node = start_demo_node(&d, &params(), &env)?;
    let (rep, _log) = node
        .serve_peer(
            &d,
            "tests/peers/watch_peer.py",
            &["yield"],
            Duration::from_secs(200),
        )
        .await?;
    let ask = &rep["ask"]["response"];
    assert_eq!(ask["success"], true, "{ask}");
    let (before, after) = (&rep["d_before"], &rep["d_after"]);
    let key = "watch_evaluations_yielded";
    assert!(
        count(after, key) > count(before, key),
        "no yield: {before} → {after}"
    );
    let done = secs(pair_of(&rep["ask_done"]));
    let later: Vec<_> = rep["feedback"]["W"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| secs(pair_of(&f["at"])) > done && f["camera_silent"] == false)
        .collect();
    let first = later.first().expect("an evaluation after the ask");
    let stamp = pair(&first["image_header"]["stamp"]);
    assert_eq!(scene_of(&rep, stamp), "b", "{first}");
    assert!(secs(stamp) >= secs(pair_of(&rep["switch"])), "{first}");
    assert_eq!(status(&rep["W"]), CANCELED);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_gives_every_watch_its_result() -> anyhow::Result<()> {
    ros_env();
    let d = domain();
    let node = start_demo_node(&d, &params(), &peer_env(&d))?;
    let pid = node.child.id().context("node pid")?;
    let peer = spawn_python("tests/peers/watch_peer.py", &["sigterm"], &peer_env(&d))?;
    let (rep, sent) =
        report_with_sigterm_at_first_token(peer, pid, Duration::from_secs(120)).await?;
    assert!(sent, "the watches never evaluated");
    let (exit, _log) = node.exited(Duration::from_secs(20)).await?;
    assert!(exit.success(), "vlm_node exit status {exit}");
    for n in ["S1", "S2"] {
        let r = &rep[n];
        assert_eq!(status(r), ABORTED, "{n}: {r}");
        assert_eq!(r["result"]["error_code"], "cancelled", "{n}: {r}");
        let msg = r["result"]["error_message"].as_str().unwrap();
        assert!(msg.contains("shutting down"), "{n}: {msg}");
        assert!(
            r["result"]["evaluations"].as_u64().unwrap() >= 1,
            "{n}: {r}"
        );
    }
    Ok(())
}

//! Detections ("Where is it?"), the node's side, over a real ROS 2 graph: `/detect` on the demo
//! (random) model gives well-formed detections in the source frame's pixels — boxes inside
//! the frame with a positive size, at most `max_objects`, every header the source frame's,
//! and each box the mapping of the numbers in `text` (x·W/1000, y·H/1000, ±1 px) — on a
//! request image and on raw, compressed and NV12 camera frames; every result is on
//! `vlm/detections`, and `vlm/annotated` shows the frame (its header and size) with the
//! boxes drawn; a `vlm/detect` goal's feedback gives each object the box, label and score the
//! result gives it. A detect stopped by `/vlm/cancel` is `cancelled` with the objects found
//! so far (published only when there is one), and one whose answer budget is above
//! `max_request_new_tokens` is refused. The rclpy peer is `tests/peers/detect_peer.py`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use serde_json::Value;

use common::node_proc::{domain, peer_env, start_demo_node};
use common::ros_env;

const MAX_OBJECTS: usize = 3;

/// The boxes (x1, y1, x2, y2 in pixels) that `text` maps to on a `w × h` frame, computed here
/// on their own: each axis scaled by its size over 1000, clamped, corners sorted, empty boxes
/// dropped. Each with its index in the answer.
fn expected_boxes(text: &str, w: f64, h: f64) -> Vec<(usize, [f64; 4])> {
    let v: Value = serde_json::from_str(text).unwrap();
    let mut out = Vec::new();
    for (i, o) in v.as_array().unwrap().iter().enumerate() {
        let c: Vec<f64> = o["bbox_2d"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_f64().unwrap())
            .collect();
        let x = |v: f64| (v * w / 1000.0).clamp(0.0, w);
        let y = |v: f64| (v * h / 1000.0).clamp(0.0, h);
        let (x1, x2) = (x(c[0]).min(x(c[2])), x(c[0]).max(x(c[2])));
        let (y1, y2) = (y(c[1]).min(y(c[3])), y(c[1]).max(y(c[3])));
        if x2 > x1 && y2 > y1 {
            out.push((i, [x1, y1, x2, y2]));
        }
    }
    out
}

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap()
}

/// A successful detect's result, checked against the frame it was asked about.
/// `stamps`: the frame's stamp is one of them (a camera's frames: the newest, or the one a
/// pre-fill primed).
fn check_result(case: &str, r: &Value, frame_id: &str, stamps: &[[i64; 2]]) {
    let resp = &r["response"];
    assert_eq!(resp["success"], true, "{case}: {resp}");
    assert_eq!(resp["error_code"], "", "{case}");
    let (w, h) = (num(&resp["image_width"]), num(&resp["image_height"]));
    assert_eq!((w, h), (640.0, 480.0), "{case}");
    let header = &resp["image_header"];
    assert_eq!(header["frame_id"], frame_id, "{case}: {header}");
    let stamp = [
        header["stamp"]["sec"].as_i64().unwrap(),
        header["stamp"]["nanosec"].as_i64().unwrap(),
    ];
    assert!(
        stamps.contains(&stamp),
        "{case}: {stamp:?} not in {stamps:?}"
    );
    let array = &resp["detections"];
    assert_eq!(&array["header"], header, "{case}: the array's header");
    let dets = array["detections"].as_array().unwrap();
    assert!(dets.len() <= MAX_OBJECTS, "{case}: {} objects", dets.len());
    let text = resp["text"].as_str().unwrap();
    let want = expected_boxes(text, w, h);
    assert_eq!(dets.len(), want.len(), "{case}: {text}");
    for (d, (i, [x1, y1, x2, y2])) in dets.iter().zip(&want) {
        assert_eq!(&d["header"], header, "{case}: a detection's header");
        assert_eq!(d["id"], i.to_string(), "{case}");
        let b = &d["bbox"];
        let (cx, cy) = (
            num(&b["center"]["position"]["x"]),
            num(&b["center"]["position"]["y"]),
        );
        let (sx, sy) = (num(&b["size_x"]), num(&b["size_y"]));
        assert!(sx > 0.0 && sy > 0.0, "{case}: size {sx}x{sy}");
        let got = [cx - sx / 2.0, cy - sy / 2.0, cx + sx / 2.0, cy + sy / 2.0];
        for v in got {
            assert!(
                v >= -1e-9 && v <= w.max(h) + 1e-9,
                "{case}: {got:?} outside the frame"
            );
        }
        assert!(got[2] <= w + 1e-9 && got[3] <= h + 1e-9, "{case}: {got:?}");
        for (g, e) in got.iter().zip([x1, y1, x2, y2]) {
            assert!((g - e).abs() <= 1.0, "{case}: {got:?} vs {text}");
        }
        let hyp = &d["results"][0]["hypothesis"];
        let score = num(&hyp["score"]);
        // A probability the model gave the label's tokens: never 0 for tokens it drew.
        assert!(score > 0.0 && score <= 1.0, "{case}: score {score}");
        assert!(!hyp["class_id"].as_str().unwrap().is_empty(), "{case}");
    }
    // The same result on vlm/detections.
    assert_eq!(&r["topic"], array, "{case}: vlm/detections");
    // vlm/annotated: the source header and size.
    let ann = &r["annotated"];
    assert_eq!(&ann["header"], header, "{case}: vlm/annotated's header");
    assert_eq!((num(&ann["width"]), num(&ann["height"])), (w, h), "{case}");
    assert_eq!(ann["encoding"], "rgb8", "{case}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detections_are_well_formed_in_the_source_frames_pixels() -> anyhow::Result<()> {
    ros_env();
    let d = domain();
    let mut env = peer_env(&d);
    env.remove(0);
    let node = start_demo_node(
        &d,
        &[
            ("image_topics", "['/cam', '/cam_nv12']"),
            ("compressed_image_topics", "['/cam_compressed']"),
            ("default_camera", "/cam"),
            ("max_camera_silence_s", "0.0"),
            ("max_image_age_s", "0.0"),
        ],
        &env,
    )?;
    let objects = MAX_OBJECTS.to_string();
    let (rep, _log) = node
        .serve_peer(
            &d,
            "tests/peers/detect_peer.py",
            &["--max-objects", &objects],
            Duration::from_secs(300),
        )
        .await?;

    for case in ["request", "raw", "compressed", "nv12", "points"] {
        let r = &rep[case]["response"];
        eprintln!(
            "{case}: {} -> {} detections, edge {}",
            r["text"],
            r["detections"]["detections"].as_array().map_or(0, Vec::len),
            rep[case].get("edge").unwrap_or(&Value::Null)
        );
    }
    check_result("request image", &rep["request"], "req_frame", &[[11, 22]]);
    for (case, frame_id) in [
        ("raw", "raw_frame"),
        ("compressed", "cmp_frame"),
        ("nv12", "nv12_frame"),
    ] {
        let r = &rep[case];
        let sent: Vec<[i64; 2]> = serde_json::from_value(r["sent"].clone())?;
        check_result(case, r, frame_id, &sent);
    }
    // The same pixels give the same greedy answer, however they came.
    let text = |c: &str| rep[c]["response"]["text"].as_str().unwrap().to_owned();
    assert_eq!(text("request"), text("raw"));

    // A drawn edge: a box's colour (the first box's, unless a later one crosses it).
    for case in ["request", "raw"] {
        if let Some(e) = rep[case].get("edge") {
            let drawn: [u8; 3] = serde_json::from_value(e["drawn"].clone())?;
            assert!(annotate::PALETTE.contains(&drawn), "{case}: {e}");
        }
    }

    // Points: size 0, the point inside the frame.
    let points = &rep["points"]["response"];
    assert_eq!(points["success"], true, "{points}");
    for p in points["detections"]["detections"].as_array().unwrap() {
        let b = &p["bbox"];
        assert_eq!((num(&b["size_x"]), num(&b["size_y"])), (0.0, 0.0));
        let (x, y) = (
            num(&b["center"]["position"]["x"]),
            num(&b["center"]["position"]["y"]),
        );
        assert!(
            (0.0..=640.0).contains(&x) && (0.0..=480.0).contains(&y),
            "{p}"
        );
    }

    // vlm/detect: the same result as the service's for the same frame; the feedback grows one
    // object at a time, each array with the frame's header, ending with the result's boxes.
    let goal = &rep["goal"];
    assert_eq!(goal["accepted"], true);
    assert_eq!(goal["status"], 4, "SUCCEEDED: {goal}");
    let result = &goal["response"];
    assert_eq!(result["request_id"], "g-request");
    assert_eq!(result["text"], rep["request"]["response"]["text"]);
    assert_eq!(
        result["detections"], rep["request"]["response"]["detections"],
        "the action's result is the service's"
    );
    let feedback = goal["feedback"].as_array().unwrap();
    let final_dets = result["detections"]["detections"].as_array().unwrap();
    assert_eq!(
        feedback.len(),
        final_dets.len(),
        "one feedback per object: {goal}"
    );
    for (n, f) in feedback.iter().enumerate() {
        assert_eq!(f["header"], result["image_header"], "feedback {n}'s header");
        let dets = f["detections"].as_array().unwrap();
        assert_eq!(dets.len(), n + 1, "feedback {n}");
        for (a, b) in dets.iter().zip(final_dets) {
            assert_eq!(
                a["bbox"], b["bbox"],
                "feedback {n}: the boxes as in the result"
            );
            assert_eq!(a["header"], b["header"]);
            // The label and its score too: the feedback scores an object as the result does.
            assert_eq!(
                a["results"], b["results"],
                "feedback {n}: the label and score as in the result"
            );
        }
    }
    // Cancelled after its first object: CANCELED with the objects closed so far (the answer
    // may also have ended before the cancel arrived: SUCCEEDED then).
    let cancelled = &rep["goal_cancelled"];
    let result = &cancelled["response"];
    let dets = result["detections"]["detections"].as_array().unwrap();
    eprintln!(
        "cancelled goal: status {}, {} objects, {}",
        cancelled["status"],
        dets.len(),
        result["text"]
    );
    match cancelled["status"].as_i64() {
        Some(5) => {
            assert_eq!(result["success"], false, "{result}");
            assert_eq!(result["error_code"], "cancelled", "{result}");
            assert!(
                !dets.is_empty(),
                "the first object closed before the cancel: {cancelled}"
            );
            assert_eq!(result["detections"]["header"], result["image_header"]);
            let last = cancelled["feedback"].as_array().unwrap().last().unwrap();
            let fed = last["detections"].as_array().unwrap();
            assert!(fed.len() <= dets.len(), "{cancelled}");
            for (a, b) in fed.iter().zip(dets) {
                assert_eq!(
                    a["bbox"], b["bbox"],
                    "the partial result keeps the fed boxes"
                );
            }
        }
        Some(4) => assert_eq!(result["success"], true, "{result}"),
        other => panic!("cancelled goal ended with status {other:?}: {cancelled}"),
    }

    // An answer that could not fit the window is refused before anything runs.
    let overflow = &rep["goal_overflow"];
    assert_eq!(overflow["status"], 6, "ABORTED: {overflow}");
    let result = &overflow["response"];
    assert_eq!(result["error_code"], "context_overflow", "{result}");
    assert_eq!(result["text"], "", "{result}");
    assert_eq!(overflow["feedback"], serde_json::json!([]));

    let refused = &rep["goal_refused"];
    assert_eq!(refused["status"], 6, "ABORTED: {refused}");
    assert_eq!(refused["response"]["error_code"], "invalid_request");

    // Out of time: Ask's error code, and whatever closed before the stop (here: nothing).
    let late = &rep["timeout"]["response"];
    assert_eq!(late["success"], false, "{late}");
    assert_eq!(late["error_code"], "timeout", "{late}");
    assert_eq!(late["request_id"], "d-timeout");
    assert_eq!(late["detections"]["header"], late["image_header"], "{late}");

    for case in ["empty_query", "no_camera"] {
        let resp = &rep[case]["response"];
        assert_eq!(resp["success"], false, "{case}: {resp}");
        assert_eq!(resp["error_code"], "invalid_request", "{case}: {resp}");
        assert!(
            rep[case].get("topic").is_none(),
            "{case}: a refusal is not published"
        );
    }
    Ok(())
}

/// A model held to `[{"bbox_2d":[100,200,300,400],"label":"cup"}]`
/// (debug builds' `VLM_NODE_TEST_DETECT_ANSWER`) finds the box (64, 96)–(192, 192) on a 640×480
/// frame, whichever way the frame came: x·640/1000 and y·480/1000, each axis on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_answer_gives_the_known_box_on_every_kind_of_frame() -> anyhow::Result<()> {
    ros_env();
    let d = domain();
    let mut env = peer_env(&d);
    env.remove(0);
    env.push((
        "VLM_NODE_TEST_DETECT_ANSWER",
        r#"[{"bbox_2d":[100,200,300,400],"label":"cup"}]"#.to_owned(),
    ));
    let node = start_demo_node(
        &d,
        &[
            ("image_topics", "['/cam', '/cam_nv12']"),
            ("compressed_image_topics", "['/cam_compressed']"),
            ("max_camera_silence_s", "0.0"),
            ("max_image_age_s", "0.0"),
        ],
        &env,
    )?;
    let (rep, _log) = node
        .serve_peer(
            &d,
            "tests/peers/detect_peer.py",
            &["--held"],
            Duration::from_secs(300),
        )
        .await?;
    for case in ["request", "raw", "compressed", "nv12"] {
        let resp = &rep[case]["response"];
        assert_eq!(resp["success"], true, "{case}: {resp}");
        let dets = resp["detections"]["detections"].as_array().unwrap();
        assert_eq!(dets.len(), 1, "{case}: {resp}");
        let b = &dets[0]["bbox"];
        let (cx, cy) = (
            num(&b["center"]["position"]["x"]),
            num(&b["center"]["position"]["y"]),
        );
        let (sx, sy) = (num(&b["size_x"]), num(&b["size_y"]));
        let corners = [cx - sx / 2.0, cy - sy / 2.0, cx + sx / 2.0, cy + sy / 2.0];
        assert_eq!(corners, [64.0, 96.0, 192.0, 192.0], "{case}");
        assert_eq!(
            dets[0]["results"][0]["hypothesis"]["class_id"], "cup",
            "{case}"
        );
        assert_eq!(&dets[0]["header"], &resp["image_header"], "{case}");
    }
    // The drawn box: its left edge at x = 64, on its middle row, in the first colour.
    let e = &rep["request"]["edge"];
    assert_eq!(
        (e["x"].as_u64(), e["y"].as_u64()),
        (Some(64), Some(144)),
        "{e}"
    );
    let drawn: [u8; 3] = serde_json::from_value(e["drawn"].clone())?;
    assert_eq!(drawn, annotate::PALETTE[0], "{e}");
    Ok(())
}

/// The held answer of the cancel tests: two objects, so a cancel after the first one closed
/// still finds the answer running.
const HELD_TWO: &str =
    r#"[{"bbox_2d":[100,200,300,400],"label":"cup"},{"bbox_2d":[500,500,900,900],"label":"box"}]"#;

/// `max_request_new_tokens` of the cancel test's node: the budget of exactly two objects
/// (`DetectSpec::token_budget`: 2 + 68·n + (n − 1) + 1), so `max_objects` 2 is admitted
/// and 3 is not.
const TWO_OBJECT_BUDGET: &str = "140";

/// The corners of a detection's box.
fn corners(d: &Value) -> [f64; 4] {
    let b = &d["bbox"];
    let (cx, cy) = (
        num(&b["center"]["position"]["x"]),
        num(&b["center"]["position"]["y"]),
    );
    let (sx, sy) = (num(&b["size_x"]), num(&b["size_y"]));
    [cx - sx / 2.0, cy - sy / 2.0, cx + sx / 2.0, cy + sy / 2.0]
}

/// A detect stopped by `/vlm/cancel` with its request id: the cancel found it, the response
/// (or result) is `cancelled` with the answer so far — a strict prefix of the held answer —
/// and the objects closed in it: none when cancelled at its first Token (and nothing on
/// `vlm/detections`), the cup when cancelled after it closed (and that array published).
fn check_cancelled(case: &str, r: &Value, rid: &str, after_first_object: bool) {
    assert_eq!(
        r["cancel"]["success"], true,
        "{case}: /vlm/cancel {}",
        r["cancel"]
    );
    let resp = &r["response"];
    assert_eq!(resp["success"], false, "{case}: {resp}");
    assert_eq!(resp["error_code"], "cancelled", "{case}: {resp}");
    assert_eq!(resp["request_id"], rid, "{case}");
    let text = resp["text"].as_str().unwrap();
    assert!(
        HELD_TWO.starts_with(text) && text.len() < HELD_TWO.len(),
        "{case}: the answer stopped before its end: {text:?}"
    );
    let frame_id = format!("{rid}_frame");
    assert_eq!(
        resp["image_header"]["frame_id"],
        frame_id.as_str(),
        "{case}"
    );
    let array = &resp["detections"];
    assert_eq!(array["header"], resp["image_header"], "{case}");
    let dets = array["detections"].as_array().unwrap();
    let topic = r["topic"].as_array().unwrap();
    eprintln!(
        "{case}: cancelled at {:?}, stopped at {text:?}, {} objects, {} published",
        r["cancelled_at"],
        dets.len(),
        topic.len()
    );
    if after_first_object {
        assert!(
            text.contains('}') && !text.ends_with(']'),
            "{case}: {text:?}"
        );
        assert_eq!(dets.len(), 1, "{case}: the object closed before the cancel");
        assert_eq!(corners(&dets[0]), [64.0, 96.0, 192.0, 192.0], "{case}");
        assert_eq!(dets[0]["results"][0]["hypothesis"]["class_id"], "cup");
        assert_eq!(dets[0]["header"], resp["image_header"], "{case}");
        assert_eq!(topic.len(), 1, "{case}: published once: {topic:?}");
        assert_eq!(
            &topic[0], array,
            "{case}: vlm/detections holds the result's array"
        );
    } else {
        assert!(
            !text.contains('}'),
            "{case}: the cancel came after an object closed: {text:?}"
        );
        assert!(dets.is_empty(), "{case}: {array}");
        assert!(
            topic.is_empty(),
            "{case}: a cancelled detect with no object is not published: {topic:?}"
        );
    }
}

/// A detect over the node's `max_request_new_tokens`: refused `invalid_request` before
/// anything runs, the reason naming the parameter, nothing published.
fn check_over_budget(case: &str, resp: &Value) {
    assert_eq!(resp["success"], false, "{case}: {resp}");
    assert_eq!(resp["error_code"], "invalid_request", "{case}: {resp}");
    let why = resp["error_message"].as_str().unwrap();
    assert!(
        why.contains("max_request_new_tokens") && why.contains(TWO_OBJECT_BUDGET),
        "{case}: the reason names the parameter and its value: {why}"
    );
    assert_eq!(resp["text"], "", "{case}: nothing ran");
    assert_eq!(resp["completion_tokens"], 0, "{case}");
    assert_eq!(resp["detections"]["detections"], serde_json::json!([]));
}

/// `/vlm/cancel` by request id stops a running detect, over the service and as a
/// `vlm/detect` goal (ABORTED, as it stops an Ask goal): `cancelled`, with the objects
/// found so far, published on `vlm/detections` only when there is one. The BPU is slowed
/// so each answer is still running when its cancel arrives. On the same node, with
/// `max_request_new_tokens` at exactly the two-object budget: a detect of 2 objects runs
/// (the cancelled ones), one of 3 — or of the default 16 — is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_by_request_id_stops_a_running_detect_and_the_budget_is_capped() -> anyhow::Result<()>
{
    ros_env();
    let d = domain();
    let mut env = peer_env(&d);
    env.remove(0);
    env.push(("VLM_NODE_TEST_DETECT_ANSWER", HELD_TWO.to_owned()));
    env.push(("BPU_SIM_FAULTS", "hbUCPSubmitTask:slow=40".to_owned()));
    let node = start_demo_node(&d, &[("max_request_new_tokens", TWO_OBJECT_BUDGET)], &env)?;
    let (rep, _log) = node
        .serve_peer(
            &d,
            "tests/peers/detect_peer.py",
            &["--cancels"],
            Duration::from_secs(300),
        )
        .await?;

    check_cancelled(
        "service, first Token",
        &rep["service_early"],
        "dc-early",
        false,
    );
    check_cancelled(
        "service, first object",
        &rep["service_late"],
        "dc-late",
        true,
    );
    for (case, key, rid, late) in [
        ("goal, first Token", "goal_early", "gc-early", false),
        ("goal, first object", "goal_late", "gc-late", true),
    ] {
        let r = &rep[key];
        assert_eq!(r["status"], 6, "{case}: ABORTED, as an Ask goal: {r}");
        check_cancelled(case, r, rid, late);
        let fed = r["feedback"].as_array().unwrap();
        let result = r["response"]["detections"]["detections"]
            .as_array()
            .unwrap();
        if late {
            // The feedback that told of the cup, and the result keeps it.
            let last = fed.last().expect("the first object's feedback");
            let boxes = |v: &Value| -> Vec<[f64; 4]> {
                v.as_array().unwrap().iter().map(corners).collect()
            };
            assert_eq!(
                boxes(&last["detections"]),
                boxes(&r["response"]["detections"]["detections"]),
                "{case}"
            );
            assert_eq!(result.len(), 1);
            // Its label and score as the (partial) result gives them.
            assert_eq!(
                last["detections"][0]["results"], result[0]["results"],
                "{case}: the feedback's score is the result's"
            );
        } else {
            assert!(fed.is_empty(), "{case}: no object, no feedback: {fed:?}");
        }
    }

    for case in ["budget_three", "budget_default"] {
        let r = &rep[case];
        check_over_budget(case, &r["response"]);
        assert!(
            r.get("topic").unwrap().as_array().unwrap().is_empty(),
            "{case}: published"
        );
    }
    let goal = &rep["budget_goal"];
    assert_eq!(goal["status"], 6, "ABORTED: {goal}");
    check_over_budget("goal of 3 objects", &goal["response"]);
    Ok(())
}

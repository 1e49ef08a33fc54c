//! The real `vlm_node` process over a real ROS 2 graph, driven by an rclpy peer
//! (`tests/peers/node_peer.py`). The node runs the embedded tiny model on the BPU simulator,
//! started with the launch file's params file (`launch/vlm_params.yaml`) plus overrides, as
//! `vlm.launch.py` would. Each test gets its own ROS domain, so `/diagnostics` and the default
//! names never cross between tests. Answers are compared with `vlm::assistant` — what
//! `vlm chat` runs — on the same package, turn and greedy settings.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use anyhow::Context as _;
use serde_json::Value;
use vlm::assistant::Turn;
use vlm::engine::ImageInput;
use vlm::vision::RgbImage;
use vlm_bpu::{open_assistant, ModelSource, OpenOptions};

use common::node_proc::{
    cache_dir, check_image_header, check_stream, domain, ok, peer_env,
    report_with_sigterm_at_first_token, start_demo_node as start_node,
};
use common::{repo_root, ros_env, spawn_python};

/// One node test at a time: each runs a node and a peer that together keep 2 cores busy, and
/// the timing-sensitive checks (queue overlap, idle expiry) should not depend on the others.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn refused(case: &str, r: &Value, code: &str) {
    let resp = &r["response"];
    assert_eq!(resp["success"], false, "{case}: {resp}");
    assert_eq!(resp["error_code"], code, "{case}: {resp}");
    assert!(
        !resp["error_message"].as_str().unwrap().is_empty(),
        "{case}"
    );
    assert!(
        r["tokens"].as_array().unwrap().is_empty(),
        "{case}: a refused ask streamed"
    );
}

fn load_png(name: &str) -> ImageInput {
    let img = image::open(repo_root().join("tools/fixtures/images").join(name))
        .unwrap()
        .to_rgb8();
    let (w, h) = (img.width() as usize, img.height() as usize);
    ImageInput::Rgb(RgbImage::new(w, h, img.into_raw()).unwrap())
}

const PROMPT: &str = "What is in the picture?";
const PROMPT2: &str = "And what colour is it?";
const MAX_NEW: usize = 12;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_answers_about_camera_frames_and_refuses_bad_requests() -> anyhow::Result<()> {
    ros_env();
    let _serial = SERIAL.lock().await;
    let d = domain();
    let mut env = peer_env(&d);
    env.remove(0);
    let enc = [
        "rgb8",
        "bgr8_step",
        "rgba8",
        "bgra8",
        "mono8",
        "mono16",
        "yuv422",
        "yuv422_yuy2",
        "nv12_padded",
        "png_in_image",
        "jpeg_in_image",
        "big_rgb8",
        "big_nv12",
    ];
    let mut topics = vec!["/cam".to_owned(), "/cam_silent".to_owned()];
    topics.extend(enc.iter().map(|e| format!("/enc_{e}")));
    let topics = format!(
        "[{}]",
        topics
            .iter()
            .map(|t| format!("'{t}'"))
            .collect::<Vec<_>>()
            .join(",")
    );
    let node = start_node(
        &d,
        &[
            ("image_topics", topics.as_str()),
            ("compressed_image_topics", "['/cam_compressed']"),
            ("default_camera", "/cam"),
            // The peer publishes a few frames per camera and asks about them for a while,
            // as about a still camera: the dead-camera rule is tested on its own
            // (node_requests.rs).
            ("max_camera_silence_s", "0.0"),
        ],
        &env,
    )?;
    let (rep, log) = node
        .serve_peer(
            &d,
            "tests/peers/node_peer.py",
            &[
                "answers",
                "--max-new-tokens",
                &MAX_NEW.to_string(),
                "--prompt",
                PROMPT,
                "--prompt2",
                PROMPT2,
            ],
            Duration::from_secs(300),
        )
        .await?;
    assert!(
        log.contains("EMBEDDED TINY RANDOM MODEL"),
        "the node must say it runs the toy model"
    );

    let camera = ok("camera", &rep["camera"]);
    assert_eq!(rep["camera"]["response"]["image_source"], "/cam");
    // The frame the node kept is one the camera sent (a best-effort sample may be lost).
    let sent: Vec<[i64; 2]> = serde_json::from_value(rep["camera_sent"].clone())?;
    let got = &rep["camera"]["response"]["image_stamp"];
    let got = [
        got["sec"].as_i64().unwrap(),
        got["nanosec"].as_i64().unwrap(),
    ];
    assert!(sent.contains(&got), "camera stamp {got:?} not in {sent:?}");
    assert!(got[0] > 0);
    check_image_header("camera", &rep["camera"], "cam_optical_frame", got);
    // The same turn through vlm::assistant (what `vlm chat` runs), greedy.
    let pkg = bpu_vlm::embedded::ensure_package(&cache_dir())?;
    let mut a = open_assistant(&ModelSource::Package(pkg), &OpenOptions::default())?;
    let turn = |text: &str, images: Vec<ImageInput>| {
        let mut t = Turn::new(text, MAX_NEW);
        t.images = images;
        t
    };
    let direct = a.ask(
        None,
        &turn(PROMPT, vec![load_png("scene_a.png")]),
        &mut |_| {},
    )?;
    assert_eq!(
        camera, direct.completion.text,
        "node vs vlm::assistant, same frame"
    );

    let think = &rep["think"];
    check_stream("think", think);
    // Thinking on: the prompt ends inside <think>, so the answer starts as reasoning.
    assert!(
        !think["response"]["reasoning"].as_str().unwrap().is_empty(),
        "{think}"
    );

    let text = ok("text_only", &rep["text_only"]);
    assert_eq!(rep["text_only"]["response"]["image_source"], "");
    let direct_text = a.ask(None, &turn(PROMPT, vec![]), &mut |_| {})?;
    assert_eq!(text, direct_text.completion.text);
    let rows = |c: &str| rep[c]["response"]["prompt_tokens"].as_u64().unwrap();
    // One 320 px image: 100 tower rows plus <|vision_start|> and <|vision_end|>.
    assert_eq!(rows("camera") - rows("text_only"), 102);
    assert_eq!(rows("two_images") - rows("text_only"), 204);

    let explicit = ok("explicit", &rep["explicit"]);
    assert_eq!(rep["explicit"]["response"]["image_source"], "request");
    check_image_header("explicit", &rep["explicit"], "req_frame", [1234, 5678]);
    check_image_header("compressed", &rep["compressed"], "cmp_frame", [99, 1]);
    check_image_header("two_images", &rep["two_images"], "first_frame", [42, 7]);
    check_image_header("text_only", &rep["text_only"], "", [0, 0]);
    let direct_b = a.ask(
        None,
        &turn(PROMPT, vec![load_png("scene_b.png")]),
        &mut |_| {},
    )?;
    assert_eq!(explicit, direct_b.completion.text);
    let compressed = ok("compressed", &rep["compressed"]);
    let direct_c = a.ask(
        None,
        &turn(PROMPT, vec![load_png("scene_c.png")]),
        &mut |_| {},
    )?;
    assert_eq!(compressed, direct_c.completion.text);
    ok("two_images", &rep["two_images"]);
    assert_ne!(
        camera, text,
        "with and without the image the answers should differ"
    );

    // A session continues the conversation exactly as vlm::assistant does.
    let s1 = ok("session 1", &rep["session"][0]);
    let s2 = ok("session 2", &rep["session"][1]);
    let mut first = turn(PROMPT, vec![]);
    first.keep = true;
    let t1 = a.ask(None, &first, &mut |_| {})?;
    let conv = t1.conversation.context("turn 1 finished")?;
    let t2 = a.ask(Some(&conv), &turn(PROMPT2, vec![]), &mut |_| {})?;
    assert_eq!(s1, t1.completion.text);
    assert_eq!(s2, t2.completion.text);
    // The continued turn occupies fewer rows than a fresh one: no system block again.
    let fresh2 = a.ask(None, &turn(PROMPT2, vec![]), &mut |_| {})?;
    assert_eq!(
        rows_of(&rep["session"][1]),
        t2.completion.timings.prompt_tokens as u64
    );
    assert!(rows_of(&rep["session"][1]) < fresh2.completion.timings.prompt_tokens as u64);

    // Malformed frames were rejected and the previous frame stayed.
    assert_eq!(ok("after bad frames", &rep["after_bad_frames"]), camera);
    assert!(
        log.contains("camera frame rejected"),
        "rejections are logged"
    );

    for (name, pair) in rep["encodings"].as_object().unwrap() {
        let node = ok(&format!("{name} (node)"), &pair["node"]);
        let cv = ok(&format!("{name} (opencv)"), &pair["opencv"]);
        assert_ne!(
            pair["node"]["response"]["image_source"], "request",
            "{name}"
        );
        assert_eq!(
            node, cv,
            "{name}: node's conversion vs OpenCV's gives another answer"
        );
    }
    for (big, reference) in [("big_rgb8", "big_rgb8_ref"), ("big_nv12", "big_nv12_ref")] {
        let got = ok(big, &rep[big]);
        assert_eq!(
            rep[big]["response"]["image_source"],
            format!("/enc_{big}"),
            "{big}: the large frame was not received"
        );
        assert_eq!(got, ok(reference, &rep[reference]), "{big}");
    }

    let e = &rep["errors"];
    for case in [
        "empty_prompt",
        "absurd_max_new_tokens",
        "unknown_camera",
        "bad_temperature",
        "bad_tools",
        "bad_request_image",
    ] {
        refused(case, &e[case], "invalid_request");
    }
    refused("no_image", &e["no_image"], "no_image");
    refused("stale_image", &e["stale_image"], "stale_image");
    assert_eq!(ok("after errors", &rep["after_errors"]), camera);
    Ok(())
}

fn rows_of(r: &Value) -> u64 {
    r["response"]["prompt_tokens"].as_u64().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_queue_cancel_timeout_and_readiness() -> anyhow::Result<()> {
    ros_env();
    let _serial = SERIAL.lock().await;
    let d = domain();
    // The first 25 BPU tasks (warm-up) 200 ms slower, every later one 40 ms: loading is
    // visible (diagnostics `loading`, no /ask) and asks overlap.
    let slow = vec![(
        "BPU_SIM_FAULTS",
        "hbUCPSubmitTask:slow=200*25;hbUCPSubmitTask:slow=40".to_owned(),
    )];
    let node = start_node(
        &d,
        &[("queue_depth", "2"), ("diagnostics_period_s", "0.1")],
        &slow,
    )?;
    let (rep, _log) = node
        .serve_peer(
            &d,
            "tests/peers/node_peer.py",
            &["queue", "--queue-depth", "2", "--extra", "2"],
            Duration::from_secs(240),
        )
        .await?;
    assert_eq!(
        rep["saw_loading_without_ask"], true,
        "/ask must appear only once warm"
    );
    assert_eq!(rep["state_when_ready"], "ready");
    let all = rep["concurrent"].as_array().unwrap();
    let busy = all
        .iter()
        .filter(|r| r["response"]["error_code"] == "busy")
        .count();
    assert_eq!(busy, 2, "N + k asks at depth N: exactly k busy");
    for r in all.iter().filter(|r| r["response"]["error_code"] != "busy") {
        ok("queued ask", r);
    }
    for r in all.iter().filter(|r| r["response"]["error_code"] == "busy") {
        refused("busy ask", r, "busy");
    }
    assert_eq!(rep["cancel_response"]["success"], true);
    for (case, reason) in [("cancelled", "cancelled"), ("timeout", "timeout")] {
        let r = &rep[case];
        let resp = &r["response"];
        assert_eq!(resp["success"], false, "{case}");
        assert_eq!(resp["error_code"], reason, "{case}");
        assert_eq!(resp["finish_reason"], reason, "{case}");
        check_stream(case, r);
        assert!(
            (resp["completion_tokens"].as_u64().unwrap()) < 400,
            "{case}: stopped early"
        );
    }
    ok("after cancel and timeout", &rep["after"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_soak_returns_to_baseline() -> anyhow::Result<()> {
    ros_env();
    let _serial = SERIAL.lock().await;
    let d = domain();
    let node = start_node(
        &d,
        &[
            ("diagnostics_period_s", "0.2"),
            ("session_idle_s", "3.0"),
            // Counts simulator buffers and tasks: no background priming.
            ("prefill_latest_frame", "false"),
        ],
        &[],
    )?;
    let (rep, _log) = node
        .serve_peer(
            &d,
            "tests/peers/node_peer.py",
            &["soak", "--count", "200", "--diag-period", "0.2"],
            Duration::from_secs(400),
        )
        .await?;
    let results = rep["results"].as_array().unwrap();
    assert_eq!(results.len(), 200);
    for (i, r) in results.iter().enumerate() {
        assert_eq!(r["success"], true, "ask {i}: {}", r["error"]);
        assert_eq!(r["lasts"], 1, "ask {i}: exactly one last Token");
    }
    let (before, settled) = (&rep["before"], &rep["settled"]);
    assert_eq!(rep["max_sessions"], 5, "five sessions were in use at once");
    assert_eq!(settled["sessions"], "0", "idle sessions expire");
    assert_eq!(settled["session_bytes"], "0");
    assert_eq!(settled["queue_depth"], "0");
    for k in ["sim_live_buffers", "sim_live_tasks"] {
        assert!(before[k].is_string(), "diagnostics lack {k}: {before}");
        assert_eq!(settled[k], before[k], "{k} back to baseline");
    }
    let served = |v: &Value| {
        v["requests_served"]
            .as_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
    };
    assert_eq!(served(settled) - served(before), 200);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_exits_cleanly_on_sigterm_mid_answer() -> anyhow::Result<()> {
    ros_env();
    let _serial = SERIAL.lock().await;
    let d = domain();
    let slow = vec![("BPU_SIM_FAULTS", "hbUCPSubmitTask:slow=40".to_owned())];
    let node = start_node(&d, &[], &slow)?;
    let pid = node.child.id().context("node pid")?;
    let peer = spawn_python("tests/peers/node_peer.py", &["sigterm"], &peer_env(&d))?;
    let (rep, sent) =
        report_with_sigterm_at_first_token(peer, pid, Duration::from_secs(120)).await?;
    assert!(sent, "the peer never saw a token");
    let (exit, log) = node.exited(Duration::from_secs(20)).await?;
    assert!(exit.success(), "exit status {exit}");
    assert!(log.contains("SIGTERM received"));
    assert!(log.contains("vlm_node stopped cleanly"), "{log}");
    let resp = &rep["response"];
    assert_eq!(resp["error_code"], "cancelled", "{resp}");
    check_stream("sigterm", &rep);
    Ok(())
}

/// `ros2 launch` is not installable here: the launch file is checked statically, and the
/// tests above start the node with the same params file and the overrides it passes.
/// `backend: cpu` runs an HF checkpoint with crates/qwen35 behind the same node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_runs_hf_weights_on_the_cpu_backend() -> anyhow::Result<()> {
    ros_env();
    let _serial = SERIAL.lock().await;
    let d = domain();
    let hf = repo_root().join("tools/fixtures/models/tiny-4b");
    let hf_arg = hf.display().to_string();
    let node = start_node(
        &d,
        &[("backend", "cpu"), ("model_dir", hf_arg.as_str())],
        &[],
    )?;
    let (rep, log) = node
        .serve_peer(
            &d,
            "tests/peers/node_peer.py",
            &[
                "text",
                "--max-new-tokens",
                &MAX_NEW.to_string(),
                "--prompt",
                PROMPT,
            ],
            Duration::from_secs(120),
        )
        .await?;
    assert!(
        log.contains(" on cpu, service"),
        "the node must say which backend runs"
    );
    let answer = ok("cpu backend", &rep["text"]);
    let mut a = open_assistant(&ModelSource::Hf(hf), &OpenOptions::default())?;
    let direct = a.ask(None, &Turn::new(PROMPT, MAX_NEW), &mut |_| {})?;
    assert_eq!(answer, direct.completion.text);
    Ok(())
}

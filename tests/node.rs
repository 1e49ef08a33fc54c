//! The real `vlm_node` process over a real ROS 2 graph, driven by an rclpy peer
//! (`tests/peers/node_peer.py`). The node runs the embedded tiny model on the BPU simulator,
//! started with the launch file's params file (`launch/vlm_params.yaml`) plus overrides, as
//! `vlm.launch.py` would. Each test gets its own ROS domain, so `/diagnostics` and the default
//! names never cross between tests. Answers are compared with `vlm::assistant` — what
//! `vlm chat` runs — on the same package, turn and greedy settings.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::{ensure, Context as _};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use vlm::assistant::Turn;
use vlm::engine::ImageInput;
use vlm::vision::RgbImage;
use vlm_bpu::{open_assistant, ModelSource, OpenOptions};

use common::{peer_report, peer_report_with, repo_root, ros_env, spawn_python};

/// One node test at a time: each runs a node and a peer that together keep 2 cores busy, and
/// the timing-sensitive checks (queue overlap, idle expiry) should not depend on the others.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A ROS domain of its own for each node test.
fn domain() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let base = std::process::id() % 50;
    (1 + (base + 50 + NEXT.fetch_add(1, Ordering::Relaxed) * 7) % 100).to_string()
}

fn cache_dir() -> PathBuf {
    repo_root().join(".cache/test-embedded-model")
}

fn fastdds_profile() -> String {
    repo_root()
        .join("launch/fastdds_large_frames.xml")
        .display()
        .to_string()
}

struct NodeProc {
    child: Child,
    log: tokio::task::JoinHandle<String>,
}

/// Starts `vlm_node` with the launch file's params file, `demo_model:=true` (the embedded
/// tiny model; `params` may set it back to false) and the `-p` overrides in `params`.
fn start_node(
    domain: &str,
    params: &[(&str, &str)],
    env: &[(&str, String)],
) -> anyhow::Result<NodeProc> {
    start_node_with(domain, &[], params, env)
}

/// [`start_node`] with more `--ros-args` (e.g. `-r __ns:=/robot1`) before the parameters.
fn start_node_with(
    domain: &str,
    ros_args: &[&str],
    params: &[(&str, &str)],
    env: &[(&str, String)],
) -> anyhow::Result<NodeProc> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vlm_node"));
    cmd.arg("--ros-args")
        .args(ros_args)
        .arg("--params-file")
        .arg(repo_root().join("launch/vlm_params.yaml"));
    let cache = cache_dir().display().to_string();
    let demo = [("demo_model", "true")];
    for (k, v) in demo
        .iter()
        .chain(params)
        .chain(&[("cache_dir", cache.as_str())])
    {
        cmd.arg("-p").arg(format!("{k}:={v}"));
    }
    let mut child = cmd
        .env("ROS_DOMAIN_ID", domain)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("starting vlm_node")?;
    let stderr = child.stderr.take().context("vlm_node stderr")?;
    let log = tokio::spawn(async move {
        let mut all = String::new();
        let mut lines = BufReader::new(stderr).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            eprintln!("vlm_node: {line}");
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    Ok(NodeProc { child, log })
}

impl NodeProc {
    /// SIGTERM, then the exit status and the whole log.
    async fn stop(mut self) -> anyhow::Result<(std::process::ExitStatus, String)> {
        let pid = self.child.id().context("vlm_node exited early")?;
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()?;
        ensure!(status.success(), "kill -TERM failed");
        let exit = tokio::time::timeout(Duration::from_secs(20), self.child.wait())
            .await
            .context("vlm_node did not exit within 20 s of SIGTERM")??;
        let log = tokio::time::timeout(Duration::from_secs(5), self.log).await??;
        Ok((exit, log))
    }
}

fn peer_env(domain: &str) -> Vec<(&'static str, String)> {
    vec![
        ("ROS_DOMAIN_ID", domain.to_owned()),
        // The peer is the camera process: the large-frame profile is what the README tells
        // camera drivers to use.
        ("FASTRTPS_DEFAULT_PROFILES_FILE", fastdds_profile()),
        ("FASTDDS_DEFAULT_PROFILES_FILE", fastdds_profile()),
    ]
}

/// The tokens of one ask, checked: the request's id, indices 0..n without gaps, exactly one
/// `last` (the final one, with the response's finish reason), deltas that add up to the
/// answer and the reasoning; the published Answer matches the response.
fn check_stream(case: &str, r: &Value) {
    let resp = &r["response"];
    let id = resp["request_id"].as_str().unwrap();
    let tokens = r["tokens"].as_array().unwrap();
    assert!(!tokens.is_empty(), "{case}: no Token");
    for (i, t) in tokens.iter().enumerate() {
        assert_eq!(t["request_id"], id, "{case}");
        assert_eq!(t["index"], i as u64, "{case}: index gap");
        assert_eq!(t["last"], i + 1 == tokens.len(), "{case}: last flag at {i}");
    }
    let last = tokens.last().unwrap();
    assert_eq!(last["finish_reason"], resp["finish_reason"], "{case}");
    let join = |reasoning: bool| -> String {
        tokens
            .iter()
            .filter(|t| t["reasoning"] == reasoning)
            .map(|t| t["text"].as_str().unwrap())
            .collect()
    };
    assert_eq!(
        join(false),
        resp["answer"].as_str().unwrap(),
        "{case}: answer deltas"
    );
    assert_eq!(
        join(true),
        resp["reasoning"].as_str().unwrap(),
        "{case}: reasoning deltas"
    );
    let a = &r["answer"];
    assert!(a.is_object(), "{case}: no Answer on /vlm/answers");
    for k in [
        "answer",
        "reasoning",
        "finish_reason",
        "image_source",
        "prompt_tokens",
        "completion_tokens",
        "tool_calls_json",
    ] {
        assert_eq!(a[k], resp[k], "{case}: Answer.{k}");
    }
}

fn ok(case: &str, r: &Value) -> String {
    let resp = &r["response"];
    assert_eq!(resp["success"], true, "{case}: {resp}");
    assert!(
        matches!(resp["finish_reason"].as_str(), Some("stop" | "length")),
        "{case}: {resp}"
    );
    check_stream(case, r);
    resp["answer"].as_str().unwrap().to_owned()
}

/// The used image's own header reaches the response, the Answer and every Token: `frame_id`
/// in the headers, the stamp as `image_stamp`.
fn check_image_header(case: &str, r: &Value, frame_id: &str, stamp: [i64; 2]) {
    let pair = |t: &Value| [t["sec"].as_i64().unwrap(), t["nanosec"].as_i64().unwrap()];
    assert_eq!(
        pair(&r["response"]["image_stamp"]),
        stamp,
        "{case}: response"
    );
    let a = &r["answer"];
    assert_eq!(pair(&a["image_stamp"]), stamp, "{case}: Answer.image_stamp");
    assert_eq!(a["header"]["frame_id"], frame_id, "{case}: Answer.header");
    let tokens = r["tokens"].as_array().unwrap();
    assert!(!tokens.is_empty(), "{case}: no tokens");
    for t in tokens {
        assert_eq!(
            t["header"]["frame_id"], frame_id,
            "{case}: Token.header {t}"
        );
    }
}

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
        ],
        &env,
    )?;
    let peer = spawn_python(
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
        &peer_env(&d),
    )?;
    let rep = peer_report(peer, Duration::from_secs(300)).await;
    let (exit, log) = node.stop().await?;
    let rep = rep?;
    assert!(exit.success(), "vlm_node exit status {exit}");
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_under_a_namespace_moves_every_interface_with_it() -> anyhow::Result<()> {
    ros_env();
    let _serial = SERIAL.lock().await;
    let d = domain();
    let mut env = peer_env(&d);
    env.remove(0);
    // Default (relative) names: only the namespace moves them.
    let node = start_node_with(&d, &["-r", "__ns:=/robot1"], &[], &env)?;
    let max_new = MAX_NEW.to_string();
    let peer = spawn_python(
        "tests/peers/node_peer.py",
        &[
            "namespace",
            "--max-new-tokens",
            &max_new,
            "--ask",
            "/robot1/ask",
            "--cancel",
            "/robot1/vlm/cancel",
            "--tokens",
            "/robot1/vlm/tokens",
            "--answers",
            "/robot1/vlm/answers",
            "--camera",
            "/robot1/image_raw",
            "--status-name",
            "/robot1/vlm_node: engine",
            "--node-ns",
            "/robot1",
        ],
        &peer_env(&d),
    )?;
    let rep = peer_report(peer, Duration::from_secs(180)).await;
    let (exit, _log) = node.stop().await?;
    let rep = rep?;
    assert!(exit.success(), "vlm_node exit status {exit}");

    // Tokens and the Answer arrived under /robot1/vlm/ (ok checks both), from the camera on
    // /robot1/image_raw, whichever way the request names it.
    let sent: Vec<[i64; 2]> = serde_json::from_value(rep["camera_sent"].clone())?;
    let mut answers = Vec::new();
    for case in ["default", "configured", "resolved"] {
        answers.push(ok(case, &rep[case]));
        let r = &rep[case]["response"];
        assert_eq!(r["image_source"], "/robot1/image_raw", "{case}");
        let got = [
            r["image_stamp"]["sec"].as_i64().unwrap(),
            r["image_stamp"]["nanosec"].as_i64().unwrap(),
        ];
        assert!(sent.contains(&got), "{case}: stamp {got:?} not in {sent:?}");
        check_image_header(case, &rep[case], "robot1_cam", got);
    }
    assert!(answers.windows(2).all(|w| w[0] == w[1]), "{answers:?}");
    // The diagnostics entry carries the node's full name (the peer matched it exactly).
    assert_eq!(
        rep["diagnostics"]["state"], "ready",
        "{}",
        rep["diagnostics"]
    );

    let names = |k: &str| -> Vec<String> { serde_json::from_value(rep[k].clone()).unwrap() };
    let (topics, services) = (names("node_topics"), names("node_services"));
    for want in [
        "/robot1/vlm/tokens",
        "/robot1/vlm/answers",
        "/robot1/image_raw",
    ] {
        assert!(topics.iter().any(|t| t == want), "{want} not in {topics:?}");
    }
    for want in ["/robot1/ask", "/robot1/vlm/cancel"] {
        assert!(
            services.iter().any(|s| s == want),
            "{want} not in {services:?}"
        );
    }
    // Only the conventional global topics stay outside the namespace.
    let global = ["/diagnostics", "/rosout", "/parameter_events"];
    for name in topics.iter().chain(&services) {
        assert!(
            name.starts_with("/robot1/") || global.contains(&name.as_str()),
            "{name} is outside /robot1"
        );
    }
    for gone in [
        "/ask",
        "/vlm/cancel",
        "/vlm/tokens",
        "/vlm/answers",
        "/image_raw",
    ] {
        assert!(
            !names("all_topics").iter().any(|t| t == gone)
                && !names("all_services").iter().any(|s| s == gone),
            "{gone} is offered in the root namespace"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_stamps_follow_sim_time() -> anyhow::Result<()> {
    ros_env();
    let _serial = SERIAL.lock().await;
    let d = domain();
    let mut env = peer_env(&d);
    env.remove(0);
    let node = start_node(
        &d,
        &[("use_sim_time", "true"), ("diagnostics_period_s", "0.2")],
        &env,
    )?;
    let peer = spawn_python(
        "tests/peers/node_peer.py",
        &["sim_time", "--max-new-tokens", &MAX_NEW.to_string()],
        &peer_env(&d),
    )?;
    let rep = peer_report(peer, Duration::from_secs(180)).await;
    let (exit, _log) = node.stop().await?;
    let rep = rep?;
    assert!(exit.success(), "vlm_node exit status {exit}");
    ok("sim time", &rep["ask"]);
    let pair = |v: &Value| [v[0].as_i64().unwrap(), v[1].as_i64().unwrap()];
    let stamp = |t: &Value| [t["sec"].as_i64().unwrap(), t["nanosec"].as_i64().unwrap()];
    let (first, last) = (pair(&rep["clock_first"]), pair(&rep["clock_last"]));
    // Sim time runs from 5000 s; wall time is ~1.8e9 s, so each stamp tells its clock.
    let in_sim = |what: &str, s: [i64; 2]| {
        assert!(
            first <= s && s <= last,
            "{what} {s:?} not in [{first:?}, {last:?}]"
        );
    };
    let mut prev = first;
    for t in rep["ask"]["tokens"].as_array().unwrap() {
        let s = stamp(&t["header"]["stamp"]);
        in_sim("Token", s);
        assert!(prev <= s, "Token stamps go back: {prev:?} then {s:?}");
        prev = s;
    }
    let answer = stamp(&rep["ask"]["answer"]["header"]["stamp"]);
    in_sim("Answer", answer);
    assert!(
        prev <= answer,
        "the Answer is stamped before the last Token"
    );
    in_sim("diagnostics", pair(&rep["diag_stamp"]));
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
    let peer = spawn_python(
        "tests/peers/node_peer.py",
        &["queue", "--queue-depth", "2", "--extra", "2"],
        &peer_env(&d),
    )?;
    let rep = peer_report(peer, Duration::from_secs(240)).await;
    let (exit, _log) = node.stop().await?;
    let rep = rep?;
    assert!(exit.success());
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
        &[("diagnostics_period_s", "0.2"), ("session_idle_s", "3.0")],
        &[],
    )?;
    let peer = spawn_python(
        "tests/peers/node_peer.py",
        &["soak", "--count", "200", "--diag-period", "0.2"],
        &peer_env(&d),
    )?;
    let rep = peer_report(peer, Duration::from_secs(400)).await;
    let (exit, _log) = node.stop().await?;
    let rep = rep?;
    assert!(exit.success());
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
    let mut sent = false;
    let rep = peer_report_with(peer, Duration::from_secs(120), |line| {
        if line == "FIRST TOKEN" && !sent {
            sent = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status()
                .is_ok_and(|s| s.success());
        }
    })
    .await?;
    assert!(sent, "the peer never saw a token");
    let mut node = node;
    let exit = tokio::time::timeout(Duration::from_secs(20), node.child.wait())
        .await
        .context("vlm_node did not exit within 20 s of SIGTERM")??;
    let log = tokio::time::timeout(Duration::from_secs(5), node.log).await??;
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
#[test]
fn launch_file_starts_only_vlm_node_with_its_arguments() {
    let out = std::process::Command::new(common::peer_python().unwrap())
        .arg(repo_root().join("tests/peers/check_launch.py"))
        .arg(repo_root().join("launch/vlm.launch.py"))
        .output()
        .unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("PEER OK"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The unit test of the launch file's `node_kwargs` (tests/peers/test_launch_args.py): with
/// no arguments the params file alone decides; each given argument overrides exactly its
/// parameter; `image_topic` becomes a list.
#[test]
fn launch_arguments_override_only_what_is_given() {
    let out = std::process::Command::new(common::peer_python().unwrap())
        .arg(repo_root().join("tests/peers/test_launch_args.py"))
        .arg(repo_root().join("launch/vlm.launch.py"))
        .output()
        .unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("PEER OK"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// No `model_dir` and no `demo_model`: a configuration error naming `model_dir` (with the
/// published package's path as the example), before anything is served; `demo_model:=true`
/// serves the embedded model (`/ask` answers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_without_model_dir_needs_demo_model() -> anyhow::Result<()> {
    ros_env();
    let _serial = SERIAL.lock().await;
    let d = domain();
    let mut node = start_node(&d, &[("demo_model", "false")], &[])?;
    let exit = tokio::time::timeout(Duration::from_secs(30), node.child.wait())
        .await
        .context("vlm_node without model_dir did not exit within 30 s")??;
    let log = tokio::time::timeout(Duration::from_secs(5), node.log).await??;
    assert_eq!(
        exit.code(),
        Some(i32::from(bpu_vlm::fatal::EXIT_CONFIG)),
        "exit status {exit}; log:\n{log}"
    );
    assert!(log.contains("parameter `model_dir`"), "{log}");
    assert!(log.contains(bpu_vlm::params::EXAMPLE_MODEL_DIR), "{log}");
    assert!(log.contains("demo_model:=true"), "{log}");
    assert!(!log.contains("EMBEDDED TINY RANDOM MODEL"), "{log}");

    let node = start_node(&d, &[("demo_model", "true")], &[])?;
    let peer = spawn_python(
        "tests/peers/node_peer.py",
        &["text", "--max-new-tokens", "4", "--prompt", PROMPT],
        &peer_env(&d),
    )?;
    let rep = peer_report(peer, Duration::from_secs(120)).await;
    let (exit, log) = node.stop().await?;
    let rep = rep?;
    assert!(exit.success(), "exit status {exit}");
    assert!(log.contains("EMBEDDED TINY RANDOM MODEL"), "{log}");
    ok("demo_model", &rep["text"]);
    Ok(())
}

/// `--ros-args --log-level` (what the launch argument `log_level` passes) sets the node's
/// stderr filter, over `RUST_LOG`. Without a model the node stops at once with its
/// configuration error, which every level shows.
#[test]
fn log_level_argument_sets_the_node_log_filter() {
    ros_env();
    let run = |level: &str, rust_log: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_vlm_node"))
            .args(["--ros-args", "--log-level", level, "--params-file"])
            .arg(repo_root().join("launch/vlm_params.yaml"))
            .env("RUST_LOG", rust_log)
            .env("ROS_DOMAIN_ID", domain())
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(i32::from(bpu_vlm::fatal::EXIT_CONFIG))
        );
        let log = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(log.contains("parameter `model_dir`"), "{log}");
        log
    };
    let info = "r2r context created";
    assert!(!run("warn", "debug").contains(info));
    assert!(run("debug", "error").contains(info));
    assert!(run("vlm_node:=info", "error").contains(info));
}

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
    let peer = spawn_python(
        "tests/peers/node_peer.py",
        &[
            "text",
            "--max-new-tokens",
            &MAX_NEW.to_string(),
            "--prompt",
            PROMPT,
        ],
        &peer_env(&d),
    )?;
    let rep = peer_report(peer, Duration::from_secs(120)).await;
    let (exit, log) = node.stop().await?;
    let rep = rep?;
    assert!(exit.success());
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

//! ROS conventions of the real `vlm_node` process (issue 13), driven by an rclpy peer
//! (`tests/peers/node_peer.py`) as in tests/node.rs: every interface moves with a namespace,
//! stamps follow the ROS clock (`use_sim_time`), the launch file's arguments override only
//! what is given, no model without `model_dir` or `demo_model`, and `--log-level` reaches the
//! node's log filter.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;

use common::node_proc::{
    check_image_header, domain, ok, peer_env, start_demo_node as start_node,
    start_demo_node_with as start_node_with,
};
use common::{repo_root, ros_env};

/// One node at a time: a node and its peer keep the 2 cores busy.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const PROMPT: &str = "What is in the picture?";
const MAX_NEW: usize = 12;

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
    let (rep, _log) = node
        .serve_peer(
            &d,
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
            Duration::from_secs(180),
        )
        .await?;

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
    // The diagnostics entry carries the node's full name (the peer matched it exactly). The
    // status the peer kept may predate the last answer, so the model is ready or still busy.
    assert!(
        matches!(rep["diagnostics"]["state"].as_str(), Some("ready" | "busy")),
        "{}",
        rep["diagnostics"]
    );
    assert_eq!(rep["diagnostics"]["model"], "tiny-4b-embedded");
    // INFO reaches /rosout (rosout_level's default), under the node's logger.
    assert_eq!(
        rep["rosout_ready"],
        serde_json::json!([["robot1.vlm_node", 20]])
    );

    let names = |k: &str| -> Vec<String> { serde_json::from_value(rep[k].clone()).unwrap() };
    let (topics, services) = (names("node_topics"), names("node_services"));
    for want in [
        "/robot1/vlm/tokens",
        "/robot1/vlm/answers",
        "/robot1/image_raw",
        "/robot1/vlm/ask/_action/feedback",
        "/robot1/vlm/ask/_action/status",
        "/robot1/vlm/detections",
        "/robot1/vlm/annotated",
        "/robot1/vlm/detect/_action/feedback",
    ] {
        assert!(topics.iter().any(|t| t == want), "{want} not in {topics:?}");
    }
    for want in [
        "/robot1/ask",
        "/robot1/vlm/cancel",
        "/robot1/vlm/ask/_action/send_goal",
        "/robot1/vlm/ask/_action/cancel_goal",
        "/robot1/vlm/ask/_action/get_result",
        "/robot1/detect",
        "/robot1/vlm/detect/_action/send_goal",
    ] {
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
        "/vlm/ask/_action/status",
        "/vlm/ask/_action/send_goal",
    ] {
        assert!(
            !names("all_topics").iter().any(|t| t == gone)
                && !names("all_services").iter().any(|s| s == gone),
            "{gone} is offered in the root namespace"
        );
    }
    Ok(())
}

/// Renamed, moved and its camera remapped, as the launch arguments `name`, `namespace` and
/// `remappings:=image_raw:=/my_cam/image` start it: `/diagnostics` names `/r2/vlm_front`,
/// answers name the camera `/my_cam/image` (its subscription is there, not on
/// `/r2/image_raw`), and "ready" reaches `/rosout` under `r2.vlm_front`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renamed_node_reports_its_actual_names() -> anyhow::Result<()> {
    ros_env();
    let _serial = SERIAL.lock().await;
    let d = domain();
    let mut env = peer_env(&d);
    env.remove(0);
    let remaps = ["__node:=vlm_front", "__ns:=/r2", "image_raw:=/my_cam/image"];
    let ros_args: Vec<&str> = remaps.iter().flat_map(|r| ["-r", r]).collect();
    let node = start_node_with(&d, &ros_args, &[], &env)?;
    let max_new = MAX_NEW.to_string();
    let mut args = vec!["namespace", "--max-new-tokens", &max_new];
    args.extend(["--ask", "/r2/ask", "--cancel", "/r2/vlm/cancel"]);
    args.extend(["--tokens", "/r2/vlm/tokens", "--answers", "/r2/vlm/answers"]);
    args.extend([
        "--camera",
        "/my_cam/image",
        "--status-name",
        "/r2/vlm_front: engine",
    ]);
    args.extend(["--node-ns", "/r2", "--node-name", "vlm_front"]);
    let (rep, _log) = node
        .serve_peer(
            &d,
            "tests/peers/node_peer.py",
            &args,
            Duration::from_secs(180),
        )
        .await?;
    for case in ["default", "configured", "resolved"] {
        ok(case, &rep[case]);
        assert_eq!(
            rep[case]["response"]["image_source"], "/my_cam/image",
            "{case}"
        );
    }
    // The peer kept only the status named "/r2/vlm_front: engine".
    assert_eq!(
        rep["diagnostics"]["model"], "tiny-4b-embedded",
        "{}",
        rep["diagnostics"]
    );
    assert_eq!(
        rep["rosout_ready"],
        serde_json::json!([["r2.vlm_front", 20]])
    );
    let topics: Vec<String> = serde_json::from_value(rep["node_topics"].clone())?;
    assert!(topics.iter().any(|t| t == "/my_cam/image"), "{topics:?}");
    assert!(
        !topics.iter().any(|t| t.ends_with("image_raw")),
        "{topics:?}"
    );
    assert!(topics.iter().any(|t| t == "/r2/vlm/tokens"), "{topics:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_stamps_follow_sim_time() -> anyhow::Result<()> {
    ros_env();
    let _serial = SERIAL.lock().await;
    let d = domain();
    let node = start_node(
        &d,
        &[("use_sim_time", "true"), ("diagnostics_period_s", "0.2")],
        &peer_env(&d),
    )?;
    let max_new = MAX_NEW.to_string();
    let (rep, _log) = node
        .serve_peer(
            &d,
            "tests/peers/node_peer.py",
            &["sim_time", "--max-new-tokens", &max_new],
            Duration::from_secs(180),
        )
        .await?;
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

/// Runs a Python check of the launch file (launch_ros is not installable here); it prints
/// "PEER OK" when every assertion held.
fn check_launch_file(script: &str) {
    let out = std::process::Command::new(common::peer_python().unwrap())
        .arg(repo_root().join("tests/peers").join(script))
        .arg(repo_root().join("launch/vlm.launch.py"))
        .output()
        .unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("PEER OK"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The static check: the launch file's arguments, defaults and its one Node action.
#[test]
fn launch_file_starts_only_vlm_node_with_its_arguments() {
    check_launch_file("check_launch.py");
}

/// The unit test of the launch file's `node_kwargs` (tests/peers/test_launch_args.py): with
/// no arguments the params file alone decides; each given argument overrides exactly its
/// parameter; `image_topic` becomes a list.
#[test]
fn launch_arguments_override_only_what_is_given() {
    check_launch_file("test_launch_args.py");
}

/// No `model_dir` and no `demo_model`: a configuration error naming `model_dir` (with the
/// published package's path as the example), before anything is served; `demo_model:=true`
/// serves the embedded model (`/ask` answers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_without_model_dir_needs_demo_model() -> anyhow::Result<()> {
    ros_env();
    let _serial = SERIAL.lock().await;
    let d = domain();
    let node = start_node(&d, &[("demo_model", "false")], &[])?;
    let (exit, log) = node.exited(Duration::from_secs(30)).await?;
    assert_eq!(
        exit.code(),
        Some(i32::from(bpu_vlm::process::fatal::EXIT_CONFIG)),
        "exit status {exit}; log:\n{log}"
    );
    assert!(log.contains("parameter `model_dir`"), "{log}");
    assert!(
        log.contains(bpu_vlm::ros::params::EXAMPLE_MODEL_DIR),
        "{log}"
    );
    assert!(log.contains("demo_model:=true"), "{log}");
    assert!(!log.contains("EMBEDDED TINY RANDOM MODEL"), "{log}");

    let node = start_node(&d, &[("demo_model", "true")], &[])?;
    let (rep, log) = node
        .serve_peer(
            &d,
            "tests/peers/node_peer.py",
            &["text", "--max-new-tokens", "4", "--prompt", PROMPT],
            Duration::from_secs(120),
        )
        .await?;
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
            Some(i32::from(bpu_vlm::process::fatal::EXIT_CONFIG))
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

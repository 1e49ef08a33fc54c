//! Untrusted input against the real `vlm_node` process over a real ROS 2 graph (peer:
//! `tests/peers/request_peer.py`): numbers that overflow a `Duration` or an `Instant`, NaN and
//! infinities, every request limit at its default, and compressed camera frames whose body
//! does not decode. Each refusal is `invalid_request` naming the field or the parameter, and
//! the node answers the next ask; a broken frame never replaces the camera's good one. The
//! node runs the embedded tiny model on the BPU simulator with the launch file's params file.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Stdio;
use std::time::Duration;

use anyhow::{ensure, Context as _};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

use common::{peer_report, repo_root, ros_env, spawn_python};

fn fastdds_profile() -> String {
    repo_root()
        .join("launch/fastdds_large_frames.xml")
        .display()
        .to_string()
}

/// Runs `vlm_node` and the peer in `mode`; returns the peer's report and the node's log after
/// a clean SIGTERM stop.
async fn run(mode: &str) -> anyhow::Result<(Value, String)> {
    ros_env();
    // A ROS domain of its own, away from the ones tests/node.rs picks.
    let domain = (1 + (std::process::id() + 37) % 100).to_string();
    let cache = repo_root().join(".cache/test-embedded-model");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vlm_node"));
    cmd.arg("--ros-args")
        .arg("--params-file")
        .arg(repo_root().join("launch/vlm_params.yaml"));
    for (k, v) in [
        ("demo_model", "true".to_owned()),
        ("image_topics", "['/cam_jpeg']".to_owned()),
        ("compressed_image_topics", "['/cam_compressed']".to_owned()),
        ("diagnostics_period_s", "0.1".to_owned()),
        ("cache_dir", cache.display().to_string()),
    ] {
        cmd.arg("-p").arg(format!("{k}:={v}"));
    }
    let mut node = cmd
        .env("ROS_DOMAIN_ID", &domain)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("starting vlm_node")?;
    let stderr = node.stderr.take().context("vlm_node stderr")?;
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
    let env = [
        ("ROS_DOMAIN_ID", domain.clone()),
        ("FASTRTPS_DEFAULT_PROFILES_FILE", fastdds_profile()),
        ("FASTDDS_DEFAULT_PROFILES_FILE", fastdds_profile()),
    ];
    let peer = spawn_python("tests/peers/request_peer.py", &[mode], &env)?;
    let rep = peer_report(peer, Duration::from_secs(300)).await;
    let pid = node.id().context("vlm_node exited early")?;
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()?;
    ensure!(killed.success(), "kill -TERM failed");
    let exit = tokio::time::timeout(Duration::from_secs(20), node.wait())
        .await
        .context("vlm_node did not exit within 20 s of SIGTERM")??;
    let log = tokio::time::timeout(Duration::from_secs(5), log).await??;
    let rep = rep?;
    ensure!(exit.success(), "vlm_node exit status {exit}");
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

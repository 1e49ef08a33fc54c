//! A real `vlm_node` process for the node tests: started with the launch file's params file
//! plus `-p` overrides in a ROS domain of its own, its stderr collected (and echoed), stopped
//! with SIGTERM or awaited when it is expected to end by itself.

use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::{ensure, Context as _};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use super::repo_root;

/// A ROS domain of its own for each node started by this test binary, held against other
/// test processes on the machine (`domains::claim`).
pub fn domain() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let base = std::process::id() % 50;
    super::domains::claim(1 + (base + 50 + NEXT.fetch_add(1, Ordering::Relaxed) * 7) % 100)
        .to_string()
}

/// Where the embedded model's sim package is built once for all node tests.
pub fn cache_dir() -> PathBuf {
    repo_root().join(".cache/test-embedded-model")
}

fn fastdds_profile() -> String {
    repo_root()
        .join("launch/fastdds_large_frames.xml")
        .display()
        .to_string()
}

/// The environment of a peer in `domain` (the camera-side Fast DDS profile, as docs/node.md
/// ("Large frames") tells camera drivers to use).
pub fn peer_env(domain: &str) -> Vec<(&'static str, String)> {
    vec![
        ("ROS_DOMAIN_ID", domain.to_owned()),
        ("FASTRTPS_DEFAULT_PROFILES_FILE", fastdds_profile()),
        ("FASTDDS_DEFAULT_PROFILES_FILE", fastdds_profile()),
    ]
}

pub struct NodeProc {
    pub child: Child,
    log: tokio::task::JoinHandle<String>,
}

/// Starts `vlm_node` with the launch file's params file, then `params` as `-p` overrides
/// (and `cache_dir`), with `env` added to its environment.
pub fn start_node(
    domain: &str,
    params: &[(&str, &str)],
    env: &[(&str, String)],
) -> anyhow::Result<NodeProc> {
    start_node_with(domain, &[], params, env)
}

/// [`start_node`] on the embedded demo model: `demo_model:=true` first, so `params` may set
/// it back to false.
pub fn start_demo_node(
    domain: &str,
    params: &[(&str, &str)],
    env: &[(&str, String)],
) -> anyhow::Result<NodeProc> {
    start_demo_node_with(domain, &[], params, env)
}

/// [`start_demo_node`] with more `--ros-args` (e.g. `-r __ns:=/robot1`) before the parameters.
pub fn start_demo_node_with(
    domain: &str,
    ros_args: &[&str],
    params: &[(&str, &str)],
    env: &[(&str, String)],
) -> anyhow::Result<NodeProc> {
    let params: Vec<(&str, &str)> = [("demo_model", "true")]
        .into_iter()
        .chain(params.iter().copied())
        .collect();
    start_node_with(domain, ros_args, &params, env)
}

/// [`start_node`] with more `--ros-args` before the parameters.
pub fn start_node_with(
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
    for (k, v) in params.iter().chain(&[("cache_dir", cache.as_str())]) {
        cmd.arg("-p").arg(format!("{k}:={v}"));
    }
    spawn_node(cmd, domain, env)
}

/// `vlm_node` with `params_file` as its only parameters (no launch file, no overrides).
pub fn start_node_from_file(
    domain: &str,
    params_file: &std::path::Path,
    env: &[(&str, String)],
) -> anyhow::Result<NodeProc> {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vlm_node"));
    cmd.arg("--ros-args").arg("--params-file").arg(params_file);
    spawn_node(cmd, domain, env)
}

fn spawn_node(mut cmd: Command, domain: &str, env: &[(&str, String)]) -> anyhow::Result<NodeProc> {
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
    pub async fn stop(self) -> anyhow::Result<(ExitStatus, String)> {
        let pid = self.child.id().context("vlm_node exited early")?;
        let status = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()?;
        ensure!(status.success(), "kill -TERM failed");
        self.exited(Duration::from_secs(20)).await
    }

    /// Waits (bounded) for the node to end by itself; the exit status and the whole log.
    pub async fn exited(mut self, limit: Duration) -> anyhow::Result<(ExitStatus, String)> {
        let exit = tokio::time::timeout(limit, self.child.wait())
            .await
            .with_context(|| format!("vlm_node did not exit within {limit:?}"))??;
        let log = tokio::time::timeout(Duration::from_secs(5), self.log).await??;
        Ok((exit, log))
    }

    /// Runs the rclpy peer `script` (with `args`) in `domain` against this node, then stops
    /// the node: the peer's report and the node's log. Fails when the peer fails or the
    /// node does not exit cleanly (the node is stopped either way, so its log is echoed).
    pub async fn serve_peer(
        self,
        domain: &str,
        script: &str,
        args: &[&str],
        limit: Duration,
    ) -> anyhow::Result<(Value, String)> {
        let peer = super::spawn_python(script, args, &peer_env(domain))?;
        let report = super::peer_report(peer, limit).await;
        let (exit, log) = self.stop().await?;
        let report = report?;
        ensure!(exit.success(), "vlm_node exit status {exit}");
        Ok((report, log))
    }
}

/// The messages of one admitted ask, checked: Tokens with the request's id and indices
/// 0..n without gaps, exactly one `last` (the final one, with the response's finish
/// reason), and an Answer on `/vlm/answers` that matches the response.
pub fn check_messages(case: &str, r: &Value) {
    let resp = &r["response"];
    let id = resp["request_id"].as_str().unwrap_or_default();
    let tokens = r["tokens"].as_array().cloned().unwrap_or_default();
    assert!(!tokens.is_empty(), "{case}: no Token");
    for (i, t) in tokens.iter().enumerate() {
        assert_eq!(t["request_id"], id, "{case}");
        assert_eq!(t["index"], i as u64, "{case}: index gap");
        assert_eq!(t["last"], i + 1 == tokens.len(), "{case}: last flag at {i}");
    }
    let last = &tokens[tokens.len() - 1];
    assert_eq!(last["finish_reason"], resp["finish_reason"], "{case}");
    let a = &r["answer"];
    assert!(a.is_object(), "{case}: no Answer on /vlm/answers");
    for k in ["answer", "reasoning", "finish_reason", "tool_calls_json"] {
        assert_eq!(a[k], resp[k], "{case}: Answer.{k}");
    }
    check_status_and_header(case, a, resp);
}

/// Interface 1.0: the Answer's `success` and `error_code` are the response's (a failure
/// after admission included), and both carry the used frame's `image_header`, whose stamp
/// is `image_stamp`.
pub fn check_status_and_header(case: &str, answer: &Value, resp: &Value) {
    for k in ["success", "error_code", "image_header", "image_stamp"] {
        assert_eq!(answer[k], resp[k], "{case}: Answer.{k}");
    }
    assert_eq!(
        resp["image_header"]["stamp"], resp["image_stamp"],
        "{case}: image_header.stamp"
    );
}

/// The tokens of one ask, checked: the request's id, indices 0..n without gaps, exactly one
/// `last` (the final one, with the response's finish reason), deltas that add up to the
/// answer and the reasoning; the published Answer matches the response.
pub fn check_stream(case: &str, r: &Value) {
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
        "image_width",
        "image_height",
        "prompt_tokens",
        "completion_tokens",
        "tool_calls_json",
        "session_turn",
    ] {
        assert_eq!(a[k], resp[k], "{case}: Answer.{k}");
    }
    check_status_and_header(case, a, resp);
}

pub fn ok(case: &str, r: &Value) -> String {
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
pub fn check_image_header(case: &str, r: &Value, frame_id: &str, stamp: [i64; 2]) {
    let pair = |t: &Value| [t["sec"].as_i64().unwrap(), t["nanosec"].as_i64().unwrap()];
    assert_eq!(
        pair(&r["response"]["image_stamp"]),
        stamp,
        "{case}: response"
    );
    let a = &r["answer"];
    assert_eq!(pair(&a["image_stamp"]), stamp, "{case}: Answer.image_stamp");
    assert_eq!(a["header"]["frame_id"], frame_id, "{case}: Answer.header");
    for (what, h) in [
        ("response", &r["response"]["image_header"]),
        ("Answer", &a["image_header"]),
    ] {
        assert_eq!(h["frame_id"], frame_id, "{case}: {what}.image_header");
        assert_eq!(
            pair(&h["stamp"]),
            stamp,
            "{case}: {what}.image_header.stamp"
        );
    }
    let tokens = r["tokens"].as_array().unwrap();
    assert!(!tokens.is_empty(), "{case}: no tokens");
    for t in tokens {
        assert_eq!(
            t["header"]["frame_id"], frame_id,
            "{case}: Token.header {t}"
        );
    }
}

/// The peer's report, the node (`pid`) sent SIGTERM once when the peer prints `FIRST TOKEN`;
/// `false` beside it when that never happened.
pub async fn report_with_sigterm_at_first_token(
    peer: Child,
    pid: u32,
    limit: Duration,
) -> anyhow::Result<(Value, bool)> {
    let mut sent = false;
    let rep = super::peer_report_with(peer, limit, |line| {
        if line == "FIRST TOKEN" && !sent {
            sent = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status()
                .is_ok_and(|s| s.success());
        }
    })
    .await?;
    Ok((rep, sent))
}

//! Helpers shared by the ROS integration tests: the process-wide ROS environment, rclpy
//! peers (tests/peers/) and their JSON reports.
#![allow(dead_code)]

pub mod domains;
pub mod node_proc;
pub mod scripted;

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Once;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{ensure, Context as _};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Sets the process-wide ROS environment once, before any test creates a ROS context or a
/// child process: a random domain and localhost-only discovery.
pub fn ros_env() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        let seed = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0)
            ^ std::process::id();
        let domain = domains::claim(1 + seed % 100);
        // SAFETY of set_var: runs once, before any thread of this binary reads the environment
        // through ROS (guarded by the Once every test calls first).
        std::env::set_var("ROS_DOMAIN_ID", domain.to_string());
        std::env::set_var("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST");
        eprintln!("ROS_DOMAIN_ID={domain}");
    });
}

/// A prefix no other test (in this or another process) uses.
pub fn unique_prefix(test: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    format!(
        "/t{}_{}_{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed),
        test
    )
}

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn peer_python() -> anyhow::Result<PathBuf> {
    let python = std::env::var_os("BPU_VLM_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".ros2/venv/bin/python"));
    ensure!(
        python.exists(),
        "{} is missing: run `bash tools/ros2-bootstrap.sh && source .ros2/setup.bash`",
        python.display()
    );
    Ok(python)
}

pub fn spawn_peer(args: &[&str]) -> anyhow::Result<Child> {
    spawn_python("tests/peers/ros_peer.py", args, &[])
}

/// Starts a peer script (path relative to the repository) with extra environment variables.
pub fn spawn_python(script: &str, args: &[&str], env: &[(&str, String)]) -> anyhow::Result<Child> {
    let mut cmd = Command::new(peer_python()?);
    cmd.arg(repo_root().join(script))
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    cmd.spawn().with_context(|| format!("starting {script}"))
}

/// Waits (bounded) for the peer to exit; returns its JSON report. Fails if the peer failed.
pub async fn peer_report(peer: Child, limit: Duration) -> anyhow::Result<serde_json::Value> {
    peer_report_with(peer, limit, |_| {}).await
}

/// [`peer_report`] that also hands every other output line to `on_line` as it arrives.
pub async fn peer_report_with(
    mut peer: Child,
    limit: Duration,
    mut on_line: impl FnMut(&str),
) -> anyhow::Result<serde_json::Value> {
    let stdout = peer.stdout.take().context("peer stdout")?;
    let read = async {
        let mut lines = BufReader::new(stdout).lines();
        let mut report = None;
        let mut ok = false;
        while let Some(line) = lines.next_line().await? {
            if let Some(json) = line.strip_prefix("REPORT ") {
                report = Some(serde_json::from_str::<serde_json::Value>(json)?);
            } else if line == "PEER OK" {
                ok = true;
            } else {
                eprintln!("peer: {line}");
                on_line(&line);
            }
        }
        let status = peer.wait().await?;
        anyhow::Ok((report, ok, status))
    };
    let (report, ok, status) = tokio::time::timeout(limit, read)
        .await
        .context("the rclpy peer did not finish in time")??;
    ensure!(
        status.success() && ok,
        "the rclpy peer failed ({status}); its checks are printed above"
    );
    report.context("the peer printed no report")
}

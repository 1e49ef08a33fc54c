//! A hung BPU task cannot hang `vlm`: with `--bpu-timeout-s` the command fails with an error
//! naming the graph and the limit, and exits non-zero, whether the task was made slow at
//! submit or the wait itself hangs (simulator fault plan).
#![allow(clippy::unwrap_used)]

use std::process::Command;

use vlm_testkit as common;

#[test]
fn a_hung_task_fails_vlm_chat_with_the_graph_and_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let pkg = dir.path().join("pkg");
    common::sim_package("tiny-4b", &pkg, |o| o.cache_len = 256);
    for fault in ["hbUCPWaitTaskDone:slow=20000", "hbUCPSubmitTask:slow=20000"] {
        let out = Command::new(env!("CARGO_BIN_EXE_vlm"))
            .env(bpu_sim::config::FAULTS_ENV, fault)
            .arg("chat")
            .arg(&pkg)
            .args(["--prompt", "hi", "--no-vision", "--max-new-tokens", "4"])
            .args(["--bpu-timeout-s", "0.2"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{fault}: exit 0\n{stderr}");
        assert!(
            stderr.contains("did not finish within 200 ms"),
            "{fault}: {stderr}"
        );
        assert!(stderr.contains("graph qwen35"), "{fault}: {stderr}");
    }
}

#[test]
fn a_bad_bpu_timeout_is_refused() {
    for bad in ["0", "-1", "nan", "inf", "1e300"] {
        let out = Command::new(env!("CARGO_BIN_EXE_vlm"))
            .args(["chat", "/nonexistent", "--prompt", "hi"])
            .arg(format!("--bpu-timeout-s={bad}"))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{bad}");
        assert!(stderr.contains("--bpu-timeout-s"), "{bad}: {stderr}");
    }
}

//! Issue 23 over a real ROS 2 graph: a panic on the blocking pool (a request's schema
//! compile, a camera message's check) fails that request or rejects that frame, and the node
//! goes on (item 3); a shutdown that interrupts a model reopen still gives every queued ask
//! its response, its last Token and its Answer, all cancelled (item 9). A real `vlm_node`
//! serves an rclpy peer (`tests/peers/contain_peer.py`); panics come from the node's test
//! hook (`VLM_NODE_TEST_PANIC`, debug builds only), a slow reopen from the simulator's fault
//! plan (`BPU_SIM_FAULTS`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use serde_json::Value;

use common::node_proc::{check_messages, check_stream, domain, peer_env, start_node};
use common::{peer_report_with, ros_env, spawn_python};

/// One node at a time: a node and its peer keep the 2 cores busy.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn text_params() -> Vec<(&'static str, &'static str)> {
    vec![
        ("demo_model", "true"),
        ("vision", "false"),
        ("diagnostics_period_s", "0.1"),
    ]
}

fn plan(site: &str) -> [(&'static str, String); 1] {
    [("VLM_NODE_TEST_PANIC", site.to_owned())]
}

fn internal_error(case: &str, r: &Value, site: &str) {
    let resp = &r["response"];
    assert_eq!(resp["success"], false, "{case}: {resp}");
    assert_eq!(resp["error_code"], "backend_error", "{case}: {resp}");
    let message = resp["error_message"].as_str().unwrap();
    assert!(
        message.starts_with("internal error: ")
            && message.contains(&format!("test panic at {site}")),
        "{case}: {message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_a_schema_compile_fails_that_ask_only() -> anyhow::Result<()> {
    ros_env();
    let _serial = SERIAL.lock().await;
    let d = domain();
    let node = start_node(&d, &text_params(), &plan("schema"))?;
    // `serve_peer` fails unless the node then stops cleanly (a panic that reached the hook
    // would have ended it with 70).
    let (rep, _log) = node
        .serve_peer(
            &d,
            "tests/peers/contain_peer.py",
            &["schema"],
            Duration::from_secs(180),
        )
        .await?;
    internal_error("schema ask", &rep["failed"], "schema");
    assert_eq!(
        rep["after"]["response"]["success"], true,
        "{}",
        rep["after"]
    );
    check_stream("after the panic", &rep["after"]);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panic_in_a_camera_frame_check_rejects_that_frame_only() -> anyhow::Result<()> {
    ros_env();
    let _serial = SERIAL.lock().await;
    let d = domain();
    let node = start_node(
        &d,
        &[
            ("demo_model", "true"),
            ("image_topics", "['']"),
            ("compressed_image_topics", "['/cam_compressed']"),
            ("diagnostics_period_s", "0.1"),
        ],
        &plan("camera"),
    )?;
    let (rep, log) = node
        .serve_peer(
            &d,
            "tests/peers/contain_peer.py",
            &["camera"],
            Duration::from_secs(180),
        )
        .await?;
    assert_eq!(
        rep["rejected"]["camera /cam_compressed rejected"], "1",
        "the panicking frame is counted like a bad frame: {}",
        rep["rejected"]
    );
    assert!(log.contains("test panic at camera"), "{log}");
    assert!(!log.contains("panic outside any request"), "{log}");
    let after = &rep["after"];
    assert_eq!(after["response"]["success"], true, "{after}");
    assert_eq!(
        after["response"]["image_source"], "/cam_compressed",
        "{after}"
    );
    check_stream("the camera ask after the panic", after);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_during_a_reopen_answers_every_queued_ask_as_cancelled() -> anyhow::Result<()> {
    ros_env();
    let _serial = SERIAL.lock().await;
    let d = domain();
    // The first ask panics and so does the reset after it: the model is reopened, and each
    // model file load takes 2.5 s longer, so the reopen is still going when the signal comes.
    let env = [
        ("VLM_NODE_TEST_PANIC", "serve,reset".to_owned()),
        (
            "BPU_SIM_FAULTS",
            "hbDNNInitializeFromFiles:slow=2500".to_owned(),
        ),
    ];
    let node = start_node(&d, &text_params(), &env)?;
    let pid = node.child.id().unwrap();
    let peer = spawn_python(
        "tests/peers/contain_peer.py",
        &["reopen", "--count", "2"],
        &peer_env(&d),
    )?;
    let mut signalled = false;
    let rep = peer_report_with(peer, Duration::from_secs(180), |line| {
        if line == "QUEUED" && !signalled {
            signalled = std::process::Command::new("kill")
                .args(["-INT", &pid.to_string()])
                .status()
                .is_ok_and(|s| s.success());
        }
    })
    .await;
    let (exit, log) = node.exited(Duration::from_secs(60)).await?;
    let rep = rep?;
    assert!(signalled, "the asks were never queued");
    assert!(
        log.contains("shutdown while reopening the model"),
        "the signal did not land in the reopen:\n{log}"
    );
    assert_eq!(exit.code(), Some(0), "{exit}\n{log}");
    internal_error("the panicking ask", &rep["failed"], "serve");
    let queued = rep["queued"].as_array().unwrap();
    assert_eq!(queued.len(), 2);
    for (i, r) in queued.iter().enumerate() {
        let case = format!("queued ask {i}");
        let resp = &r["response"];
        assert_eq!(resp["success"], false, "{case}: {resp}");
        assert_eq!(resp["error_code"], "cancelled", "{case}: {resp}");
        assert_eq!(resp["finish_reason"], "cancelled", "{case}: {resp}");
        check_messages(&case, r);
        assert_eq!(r["answer"]["finish_reason"], "cancelled", "{case}");
    }
    Ok(())
}

//! Issue 23, item 4 (decode bombs), over a real ROS 2 graph: request images are checked from
//! their headers before any pixel is decoded — each within `max_image_pixels`, together
//! within `max_request_decoded_mb` of decoded bytes — so a few KB of png that say 8192×8192
//! are `invalid_request` at once; four images at the limits are served (or time out) within
//! the budget, and stop between images when their time is up. A real `vlm_node` on the demo
//! model serves an rclpy peer (`tests/peers/image_peer.py`); the node's memory is read from
//! `/proc/<pid>/status`, its peak reset (`clear_refs`) once the peer's first ask is answered.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use serde_json::Value;

use common::node_proc::{check_stream, domain, peer_env, start_node};
use common::{peer_report_with, ros_env, spawn_python};

/// One node at a time: a node and its peer keep the 2 cores busy.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const MIB: u64 = 1 << 20;

fn status_bytes(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: u64 = status
        .lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// Resets the node's peak resident memory to its current one; that current one, or `None`
/// where the peak cannot be reset.
fn reset_peak(pid: u32) -> Option<u64> {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").ok()?;
    status_bytes(pid, "VmRSS:")
}

/// Runs `image_peer.py <mode>` against a demo node: the report, and how far the node's
/// resident memory rose above what it was after the first (text) ask, when measurable.
async fn run(mode: &str) -> anyhow::Result<(Value, Option<u64>)> {
    let d = domain();
    let node = start_node(&d, &[("demo_model", "true")], &[])?;
    let pid = node.child.id().unwrap();
    let peer = spawn_python("tests/peers/image_peer.py", &[mode], &peer_env(&d))?;
    let mut base = None;
    let rep = peer_report_with(peer, Duration::from_secs(300), |line| {
        if line == "READY" {
            base = reset_peak(pid);
        }
    })
    .await;
    let peak = status_bytes(pid, "VmHWM:");
    let (exit, log) = node.stop().await?;
    let rep = rep?;
    assert!(exit.success(), "vlm_node exit status {exit}\n{log}");
    let grew = base.zip(peak).map(|(b, p)| p.saturating_sub(b));
    if let Some(g) = grew {
        eprintln!("{mode}: the node's peak memory grew {} MiB", g / MIB);
    }
    Ok((rep, grew))
}

fn refused(case: &str, r: &Value, names: &[&str]) {
    let resp = &r["response"];
    assert_eq!(resp["success"], false, "{case}: {resp}");
    assert_eq!(resp["error_code"], "invalid_request", "{case}: {resp}");
    let message = resp["error_message"].as_str().unwrap();
    for n in names {
        assert!(message.contains(n), "{case}: {n} not in {message:?}");
    }
    // Refused while planned: never queued, so no Token and no Answer.
    assert_eq!(r["tokens"], serde_json::json!([]), "{case}");
    assert!(r["answer"].is_null(), "{case}: {}", r["answer"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decode_bombs_are_refused_from_their_headers_at_once() -> anyhow::Result<()> {
    ros_env();
    let _serial = SERIAL.lock().await;
    let (rep, grew) = run("bombs").await?;
    check_stream("the first text ask", &rep["first"]);

    let pixels = &rep["pixels"];
    assert!(
        pixels["png_bytes"].as_u64().unwrap() < 512 * 1024,
        "an 8192² zero png is small: {}",
        pixels["png_bytes"]
    );
    refused(
        "four 8192² pngs",
        pixels,
        &["compressed_images[0]", "8192x8192", "max_image_pixels"],
    );
    // Decoding even one of them (256 MiB of RGBA) takes seconds in a debug build.
    let elapsed = pixels["elapsed_s"].as_f64().unwrap();
    eprintln!("four 8192² pngs refused after {elapsed} s");
    assert!(elapsed < 3.0, "refused after {elapsed} s, not at once");

    // Each within the pixel cap, 128 MiB decoded each: the third is over 256 MiB.
    refused(
        "four 4096² RGBA16 pngs",
        &rep["budget"],
        &["compressed_images[2]", "max_request_decoded_mb"],
    );
    let elapsed = rep["budget"]["elapsed_s"].as_f64().unwrap();
    assert!(elapsed < 3.0, "refused after {elapsed} s, not at once");

    check_stream("the text ask after them", &rep["after"]);
    assert_eq!(rep["after"]["response"]["success"], true);
    if let Some(g) = grew {
        assert!(
            g < 64 * MIB,
            "nothing was decoded, yet the node grew {} MiB",
            g / MIB
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_at_the_limits_are_served_within_the_budget() -> anyhow::Result<()> {
    ros_env();
    let _serial = SERIAL.lock().await;
    let (rep, grew) = run("limit").await?;
    let limit = &rep["limit"];
    let resp = &limit["response"];
    eprintln!(
        "four images at the limits: {:?} after {} s",
        resp["error_code"], limit["elapsed_s"]
    );
    match resp["error_code"].as_str().unwrap() {
        "" => {
            assert_eq!(resp["success"], true, "{resp}");
            assert_eq!(resp["image_source"], "request", "{resp}");
            assert_eq!(resp["image_width"], 4096, "{resp}");
        }
        "timeout" => assert_eq!(resp["finish_reason"], "timeout", "{resp}"),
        other => panic!("four images at the limits: {other}: {resp}"),
    }
    check_stream("four images at the limits", limit);

    // Out of time while its images are decoded: the next image is not started.
    let late = &rep["deadline"];
    let resp = &late["response"];
    eprintln!(
        "with a 0.4 s limit: {:?} after {} s",
        resp["error_message"], late["elapsed_s"]
    );
    assert_eq!(resp["error_code"], "timeout", "{resp}");
    assert_eq!(resp["finish_reason"], "timeout", "{resp}");
    check_stream("four images out of time", late);
    // A debug build decodes one 4096² png in well over 0.4 s (release: where it may finish
    // first, the timeout comes later and names another stage).
    if cfg!(debug_assertions) {
        let message = resp["error_message"].as_str().unwrap();
        assert!(
            message.contains("while decoding the request's images") && !message.contains("4 of 4"),
            "{message}"
        );
    }
    assert_eq!(rep["after"]["response"]["success"], true);
    if let Some(g) = grew {
        // Four 4096² RGBA pngs: 4 × 64 MiB charged, the default budget; the rest is the
        // vision tower's own buffers for four images.
        assert!(
            g <= 256 * MIB + 96 * MIB,
            "the node grew {} MiB for 256 MiB of decoded images",
            g / MIB
        );
    }
    Ok(())
}

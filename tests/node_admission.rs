//! Hostile peers against the real `vlm_node`'s admission over a real ROS 2 graph (peer:
//! `tests/peers/admission_peer.py`): a flood of schema asks compiles only what is admitted
//! (the rest are `busy` at once), a burst of asks gets a response each, and the ids the node
//! assigns are random and can be neither guessed nor taken by a client. The node runs the
//! embedded tiny model on the BPU simulator at `queue_depth` 2, each BPU task slowed so the
//! admitted asks are still running while the rest arrive.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use serde_json::Value;

use common::node_proc::{domain, start_demo_node};
use common::ros_env;

/// One node at a time: a node and its peer keep the 2 cores busy.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const DEPTH: usize = 2;

/// Runs `vlm_node` and the peer in `mode`; the peer's report for it and the node's log.
async fn run(mode: &str, extra: &[&str]) -> anyhow::Result<(Value, String)> {
    ros_env();
    let _serial = SERIAL.lock().await;
    let d = domain();
    let env = vec![
        ("BPU_SIM_FAULTS", "hbUCPSubmitTask:slow=20".to_owned()),
        // The schema compiler logs each compile at debug.
        ("RUST_LOG", "info,vlm::structured=debug".to_owned()),
    ];
    let depth = DEPTH.to_string();
    let node = start_demo_node(
        &d,
        &[("queue_depth", &depth), ("diagnostics_period_s", "0.1")],
        &env,
    )?;
    let args: Vec<&str> = [mode].into_iter().chain(extra.iter().copied()).collect();
    let (rep, log) = node
        .serve_peer(
            &d,
            "tests/peers/admission_peer.py",
            &args,
            Duration::from_secs(300),
        )
        .await?;
    Ok((rep[mode].clone(), log))
}

fn codes(results: &[Value]) -> Vec<String> {
    results
        .iter()
        .map(|r| match r["error_code"].as_str() {
            Some("") => "ok".to_owned(),
            Some(c) => c.to_owned(),
            None => "no response".to_owned(),
        })
        .collect()
}

/// Item 1: more schema asks at once than the queue holds. Only the admitted ones are
/// compiled; every other one is refused `busy` at once, before any compile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_asks_beyond_the_queue_are_busy_before_compiling() -> anyhow::Result<()> {
    let count = 10;
    let (rep, log) = run("schemas", &["--count", &count.to_string()]).await?;
    let results = rep["results"].as_array().unwrap();
    let codes = codes(results);
    eprintln!("codes: {codes:?}");
    assert_eq!(results.len(), count);
    assert!(
        results.iter().all(|r| r["responded"] == true),
        "every ask gets a response: {codes:?}"
    );
    let busy: Vec<&Value> = results
        .iter()
        .filter(|r| r["error_code"] == "busy")
        .collect();
    assert_eq!(busy.len(), count - DEPTH, "all but the admitted: {codes:?}");
    let compiles = log.matches("JSON schema compiled").count();
    assert!(
        compiles <= DEPTH,
        "{compiles} schemas compiled for {DEPTH} places (codes {codes:?})"
    );
    // Busy at once: before any admitted ask has its answer.
    let admitted_first = results
        .iter()
        .filter(|r| r["error_code"] != "busy")
        .filter_map(|r| r["seconds"].as_f64())
        .fold(f64::INFINITY, f64::min);
    for r in &busy {
        let s = r["seconds"].as_f64().unwrap();
        assert!(
            s < admitted_first,
            "{}: busy after {s:.3} s, an admitted ask was answered after {admitted_first:.3} s",
            r["request_id"]
        );
    }
    Ok(())
}

/// Item 11: a burst of asks, many more than r2r's 10-place request channel: each gets a
/// response (most of them `busy`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_asks_gets_a_response_each() -> anyhow::Result<()> {
    let burst = 40;
    let (rep, _log) = run("burst", &["--burst", &burst.to_string()]).await?;
    let results = rep["results"].as_array().unwrap();
    let codes = codes(results);
    let responded = results.iter().filter(|r| r["responded"] == true).count();
    eprintln!("{responded} of {burst} responded: {codes:?}");
    assert_eq!(responded, burst, "codes: {codes:?}");
    let busy = codes.iter().filter(|c| *c == "busy").count();
    assert!(busy >= burst / 2, "most are busy: {codes:?}");
    for (r, c) in results.iter().zip(&codes) {
        assert!(
            c == "ok" || c == "busy",
            "{}: {c} {}",
            r["request_id"],
            r["error_message"]
        );
    }
    Ok(())
}

fn is_node_id(id: &str) -> bool {
    id.strip_prefix("req-").is_some_and(|hex| {
        hex.len() == 32 && hex.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f'))
    })
}

/// Item 6: ids the node assigns are `req-` and 32 random lowercase hex digits, on the
/// response and every Token; a client id in that form is refused naming `request_id`,
/// any other is the client's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_ids_are_random_and_reserved() -> anyhow::Result<()> {
    let (rep, _log) = run("ids", &[]).await?;
    let mut seen = std::collections::HashSet::new();
    for r in rep["node_assigned"].as_array().unwrap() {
        let resp = &r["response"];
        assert_eq!(resp["success"], true, "{resp}");
        let id = resp["request_id"].as_str().unwrap();
        assert!(is_node_id(id), "node-assigned id {id:?}");
        assert!(seen.insert(id.to_owned()), "{id} assigned twice");
        let tokens = r["tokens"].as_array().unwrap();
        assert!(!tokens.is_empty());
        assert!(tokens.iter().all(|t| t["request_id"] == id));
    }
    let refused = &rep["client_req_form"]["response"];
    assert_eq!(refused["success"], false, "{refused}");
    assert_eq!(refused["error_code"], "invalid_request", "{refused}");
    let why = refused["error_message"].as_str().unwrap();
    assert!(why.contains("request_id") && why.contains("req-"), "{why}");
    assert!(rep["client_req_form"]["tokens"]
        .as_array()
        .unwrap()
        .is_empty());
    let other = &rep["client_other"]["response"];
    assert_eq!(other["success"], true, "{other}");
    assert_eq!(other["request_id"], "kitchen-req-7");
    Ok(())
}

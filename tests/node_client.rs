//! The Python client package `bpu_vlm_client` (client/) against the real `vlm_node` over a
//! real ROS 2 graph (peer: `tests/peers/client_peer.py`): `stream` yields only its own
//! request's text, in order, while another client's request streams on the same topic; the
//! action goal streams and cancels; a refused request ends its stream at once; a node in a
//! namespace is reached by naming it; `detect` hands out each object as it is found; `watch`
//! hands out every evaluation (the first, quick one included) and ends by `until` or cancel. The node runs the embedded tiny model on the BPU
//! simulator, each BPU task slowed so two requests overlap.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use serde_json::Value;

use common::node_proc::{domain, start_demo_node_with};
use common::ros_env;

/// One node at a time: a node and its peer keep the 2 cores busy.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Runs `vlm_node` (with `ros_args`) and the client peer in `mode`; the peer's report.
async fn run(mode: &str, ros_args: &[&str], extra: &[&str]) -> anyhow::Result<Value> {
    run_with(mode, ros_args, extra, &[]).await
}

/// [`run`] with more of the node's environment.
async fn run_with(
    mode: &str,
    ros_args: &[&str],
    extra: &[&str],
    node_env: &[(&'static str, String)],
) -> anyhow::Result<Value> {
    ros_env();
    let _serial = SERIAL.lock().await;
    let d = domain();
    let mut env = vec![("BPU_SIM_FAULTS", "hbUCPSubmitTask:slow=20".to_owned())];
    env.extend_from_slice(node_env);
    let node = start_demo_node_with(&d, ros_args, &[("queue_depth", "4")], &env)?;
    let args: Vec<&str> = [mode].into_iter().chain(extra.iter().copied()).collect();
    let (rep, _log) = node
        .serve_peer(
            &d,
            "tests/peers/client_peer.py",
            &args,
            Duration::from_secs(300),
        )
        .await?;
    Ok(rep[mode].clone())
}

fn texts(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stream_yields_only_its_own_text_in_order() -> anyhow::Result<()> {
    let rep = run("streams", &[], &[]).await?;
    let resp = &rep["response"];
    assert_eq!(resp["success"], true, "{rep}");
    assert_eq!(resp["request_id"], rep["request_id"], "{rep}");
    let id = rep["request_id"].as_str().unwrap();
    assert!(
        !id.starts_with("req-"),
        "a client id never takes the node's prefix: {id}"
    );
    let deltas = texts(&rep["deltas"]);
    assert!(!deltas.is_empty(), "{rep}");
    // Its own text, whole and in order: the deltas make the final answer.
    assert_eq!(deltas.concat(), resp["answer"].as_str().unwrap(), "{rep}");
    assert_eq!(rep["finish_reason"], resp["finish_reason"], "{rep}");
    // The other client's request streamed on the same topic meanwhile, and none of its
    // text is in this stream (the two prompts differ, so the answers do).
    let other = &rep["other"];
    assert!(
        rep["other_tokens_while_streaming"].as_u64().unwrap() > 0,
        "{rep}"
    );
    let other_tokens = other["tokens"].as_array().unwrap();
    assert!(other_tokens.iter().all(|t| t["request_id"] == "other-1"));
    assert!(other_tokens.len() > deltas.len(), "{rep}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn action_goal_streams_and_cancels_in_a_namespace() -> anyhow::Result<()> {
    let rep = run("action", &["-r", "__ns:=/r2"], &["--namespace", "/r2"]).await?;
    let result = &rep["result"];
    assert_eq!(result["success"], true, "{rep}");
    assert_eq!(
        texts(&rep["deltas"]).concat(),
        result["answer"].as_str().unwrap(),
        "{rep}"
    );
    assert_eq!(rep["cancel_accepted"], true, "{rep}");
    assert!(
        rep["cancel_first"].is_string(),
        "a first delta before the cancel: {rep}"
    );
    assert_eq!(rep["cancel_result"]["error_code"], "cancelled", "{rep}");
    assert_eq!(rep["cancel_finish"], "cancelled", "{rep}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_request_ends_its_stream_with_the_response() -> anyhow::Result<()> {
    let rep = run("refused", &[], &[]).await?;
    assert!(texts(&rep["deltas"]).is_empty(), "{rep}");
    assert_eq!(rep["response"]["success"], false, "{rep}");
    assert_eq!(rep["response"]["error_code"], "invalid_request", "{rep}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detect_hands_out_each_object_as_found_then_the_result() -> anyhow::Result<()> {
    // The model held to two objects (debug builds' test hook), so there is something to find.
    let held = r#"[{"bbox_2d":[100,200,300,400],"label":"cup"},{"bbox_2d":[500,500,600,700],"label":"mug"}]"#;
    let env = [("VLM_NODE_TEST_DETECT_ANSWER", held.to_owned())];
    let rep = run_with("detect", &[], &[], &env).await?;
    assert_eq!(rep["success"], true, "{rep}");
    assert_eq!(rep["frame_id"], "cam_link", "{rep}");
    assert_eq!(rep["text"], held, "{rep}");
    // 640×480: x·640/1000, y·480/1000; [cx, cy, w, h, label].
    let want = serde_json::json!([
        [128.0, 144.0, 128.0, 96.0, "cup"],
        [352.0, 288.0, 64.0, 96.0, "mug"]
    ]);
    assert_eq!(rep["result"], want, "{rep}");
    // Every object of the result was handed out as it was found, in order, with the same
    // box and label, and the same score: the label's tokens were the only ones the held
    // answer allowed, so probability 1.
    assert_eq!(rep["found"], rep["result"], "{rep}");
    assert_eq!(rep["result_scores"], serde_json::json!([1.0, 1.0]), "{rep}");
    assert_eq!(rep["found_scores"], rep["result_scores"], "{rep}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_hands_out_every_evaluation_and_ends_by_until_or_cancel() -> anyhow::Result<()> {
    let rep = run("watch", &[], &[]).await?;
    let until = &rep["until"];
    assert_eq!(until["success"], true, "{rep}");
    assert_eq!(until["evaluations"], 1, "{rep}");
    assert_eq!(until["answer"], "\"yes\"", "{rep}");
    let fb = rep["until_feedback"].as_array().unwrap();
    let evals: Vec<_> = fb.iter().filter(|f| f["camera_silent"] == false).collect();
    assert_eq!(
        evals.len(),
        1,
        "the first evaluation reached the client: {rep}"
    );
    assert_eq!(
        (&evals[0]["answer"], &evals[0]["changed"]),
        (&until["answer"], &true.into())
    );
    assert_eq!(evals[0]["image_header"], until["image_header"], "{rep}");

    assert_eq!(rep["cancel_accepted"], true, "{rep}");
    let c = &rep["cancelled"];
    assert_eq!(c["error_code"], "cancelled", "{rep}");
    let seen = rep["cancel_feedback"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["camera_silent"] == false)
        .count();
    assert!(seen >= 1, "{rep}");
    assert_eq!(c["evaluations"], seen as u64, "{rep}");
    Ok(())
}

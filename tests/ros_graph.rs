//! End-to-end tests over a real ROS 2 graph: Rust (r2r) on one side, an rclpy peer
//! (`tests/peers/ros_peer.py`, run with `.ros2/venv/bin/python`) on the other.
//!
//! Needs `source .ros2/setup.bash` (tools/test.sh does it). Every test uses its own topic
//! and service names; the test binary picks a random `ROS_DOMAIN_ID` and keeps discovery on
//! localhost. Every wait has a timeout.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _};
use bpu_vlm::interface::{enable_thinking, idl_str, ErrorCode};
use bpu_vlm::msgs::msg::Token;
use bpu_vlm::msgs::srv::{Ask, Cancel};
use bpu_vlm::ros::qos::tokens_qos;
use bpu_vlm::ros::spin::SpinThread;
use futures::StreamExt;
use r2r::builtin_interfaces::msg::Time;
use r2r::std_msgs::msg::Header;
use r2r::QosProfile;
use vlm::stream::FinishReason;

mod common;
use common::{peer_report, ros_env, spawn_peer, unique_prefix};

const PEER_TIMEOUT: Duration = Duration::from_secs(60);

/// The deltas the test node streams for a request: multi-byte UTF-8 of every width, a
/// ZWJ emoji sequence, a combining accent, an empty final delta, a long one.
fn test_texts() -> Vec<String> {
    vec![
        "Let me look… ".to_owned(),
        "思考中 🤔".to_owned(),
        "There is a 🍎".to_owned(),
        " and a 👩‍💻 at the café".to_owned(),
        " (e\u{301}, Ж, 한국어, 𝄞)".to_owned(),
        "长".repeat(3000),
        String::new(),
    ]
}

fn tokens_for(request_id: &str) -> Vec<Token> {
    let texts = test_texts();
    let n = texts.len();
    texts
        .into_iter()
        .enumerate()
        .map(|(i, text)| {
            let last = i + 1 == n;
            let mut token = Token {
                request_id: request_id.to_owned(),
                index: u32::try_from(i).unwrap(),
                text,
                reasoning: i < 2,
                last,
                finish_reason: if last {
                    FinishReason::Stop.as_str().to_owned()
                } else {
                    String::new()
                },
                ..Default::default()
            };
            token.header.stamp = Time {
                sec: 1_700_000_000 + i32::try_from(i).unwrap(),
                nanosec: 123_456_789,
            };
            token.header.frame_id = "camera_optical_frame".to_owned();
            token
        })
        .collect()
}

fn response_for(request: &Ask::Request, tokens: &[Token]) -> anyhow::Result<Ask::Response> {
    Ok(Ask::Response {
        success: true,
        error_code: String::new(),
        error_message: String::new(),
        request_id: request.request_id.clone(),
        // The echo of everything received, so the peer checks each field arrived as sent.
        answer: serde_json::to_string(request)?,
        reasoning: tokens
            .iter()
            .filter(|t| t.reasoning)
            .map(|t| t.text.as_str())
            .collect(),
        tool_calls_json: r#"[{"name":"look","arguments":{"where":"桌子"}}]"#.to_owned(),
        finish_reason: FinishReason::Stop.as_str().to_owned(),
        image_source: "request".to_owned(),
        image_header: Header {
            stamp: Time {
                sec: 7,
                nanosec: 999_999_999,
            },
            frame_id: "cam_link".to_owned(),
        },
        image_stamp: Time {
            sec: 7,
            nanosec: 999_999_999,
        },
        // Zero: the image came with the request, no camera frame was checked.
        scene_checked_stamp: Time::default(),
        image_width: 4_000_000_000,
        image_height: 480,
        prompt_tokens: 100 + u32::try_from(request.prompt.chars().count())?,
        completion_tokens: u32::try_from(tokens.len())?,
        ttft_s: 0.125,
        decode_tokens_per_s: 42.5,
        session_turn: 3_000_000_000,
    })
}

/// The sentinel defaults the interface documents, as the Rust side receives them.
fn assert_sentinels(request: &Ask::Request) {
    assert_eq!(request.camera, "");
    assert_eq!(request.max_image_age_s, -1.0);
    assert!(request.images.is_empty() && request.compressed_images.is_empty());
    assert_eq!(request.temperature, -1.0);
    assert_eq!(request.top_p, -1.0);
    assert_eq!(request.min_p, -1.0);
    assert_eq!(request.top_k, -1);
    assert_eq!(request.repetition_penalty, -1.0);
    assert_eq!(request.presence_penalty, -1.0);
    assert_eq!(request.seed, -1);
    assert_eq!(request.enable_thinking, enable_thinking::DEFAULT);
    assert_eq!(request.max_new_tokens, 0);
    assert!(request.stop.is_empty());
    assert!(request.use_default_stop);
    assert_eq!(request.timeout_s, -1.0);
}

#[test]
fn rust_defaults_and_constants_match_the_interface() {
    ros_env();
    assert_sentinels(&Ask::Request::default());
    let thinking = [
        (
            Ask::Request::ENABLE_THINKING_DEFAULT as i64,
            enable_thinking::DEFAULT,
        ),
        (
            Ask::Request::ENABLE_THINKING_OFF as i64,
            enable_thinking::OFF,
        ),
        (Ask::Request::ENABLE_THINKING_ON as i64, enable_thinking::ON),
    ];
    for (generated, ours) in thinking {
        assert_eq!(generated, i64::from(ours));
    }
    assert_eq!(
        [
            enable_thinking::DEFAULT,
            enable_thinking::OFF,
            enable_thinking::ON
        ],
        [-1, 0, 1]
    );
    let codes = [
        (
            Ask::Response::ERROR_BUSY.as_slice(),
            ErrorCode::Busy.as_str(),
            "busy",
        ),
        (
            Ask::Response::ERROR_NOT_READY,
            ErrorCode::NotReady.as_str(),
            "not_ready",
        ),
        (
            Ask::Response::ERROR_NO_IMAGE,
            ErrorCode::NoImage.as_str(),
            "no_image",
        ),
        (
            Ask::Response::ERROR_STALE_IMAGE,
            ErrorCode::StaleImage.as_str(),
            "stale_image",
        ),
        (
            Ask::Response::ERROR_INVALID_REQUEST,
            ErrorCode::InvalidRequest.as_str(),
            "invalid_request",
        ),
        (
            Ask::Response::ERROR_CONTEXT_OVERFLOW,
            ErrorCode::ContextOverflow.as_str(),
            "context_overflow",
        ),
        (
            Ask::Response::ERROR_CANCELLED,
            ErrorCode::Cancelled.as_str(),
            "cancelled",
        ),
        (
            Ask::Response::ERROR_TIMEOUT,
            ErrorCode::Timeout.as_str(),
            "timeout",
        ),
        (
            Ask::Response::ERROR_BACKEND_ERROR,
            ErrorCode::BackendError.as_str(),
            "backend_error",
        ),
        (
            Ask::Response::ERROR_INCOMPLETE,
            ErrorCode::Incomplete.as_str(),
            "incomplete",
        ),
        (Token::FINISH_STOP, FinishReason::Stop.as_str(), "stop"),
        (
            Token::FINISH_LENGTH,
            FinishReason::Length.as_str(),
            "length",
        ),
        (
            Token::FINISH_CANCELLED,
            FinishReason::Cancelled.as_str(),
            "cancelled",
        ),
        (
            Token::FINISH_TIMEOUT,
            FinishReason::Timeout.as_str(),
            "timeout",
        ),
        (Token::FINISH_ERROR, FinishReason::Error.as_str(), "error"),
    ];
    for (generated, ours, documented) in codes {
        assert_eq!(idl_str(generated), Some(documented));
        assert_eq!(ours, documented);
    }
    // The list above names every error code the node has.
    let listed: Vec<&str> = codes[..ErrorCode::ALL.len()].iter().map(|c| c.1).collect();
    assert_eq!(listed, ErrorCode::ALL.map(ErrorCode::as_str));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_and_services_reach_an_rclpy_peer_intact() -> anyhow::Result<()> {
    ros_env();
    let prefix = unique_prefix("roundtrip");
    let (tokens_topic, ask_name, cancel_name) = (
        format!("{prefix}/vlm/tokens"),
        format!("{prefix}/ask"),
        format!("{prefix}/vlm/cancel"),
    );

    let ctx = r2r::Context::create()?;
    let node_name = format!("test_node{}", prefix.replace('/', "_"));
    let mut node = r2r::Node::create(ctx, &node_name, "")?;
    let tokens = node.create_publisher::<Token>(&tokens_topic, tokens_qos())?;
    let mut asks =
        node.create_service::<Ask::Service>(&ask_name, QosProfile::services_default())?;
    let mut cancels =
        node.create_service::<Cancel::Service>(&cancel_name, QosProfile::services_default())?;
    let (spin, _ops) = SpinThread::start(node)?;

    let peer = spawn_peer(&[
        "roundtrip",
        "--tokens",
        &tokens_topic,
        "--ask",
        &ask_name,
        "--cancel",
        &cancel_name,
        "--timeout",
        "45",
    ])?;
    let mut report = tokio::spawn(peer_report(peer, PEER_TIMEOUT));

    let mut published: Vec<Token> = Vec::new();
    let mut sent_responses: Vec<serde_json::Value> = Vec::new();
    let mut asked: Vec<String> = Vec::new();
    let serve = async {
        // Two asks then two cancels, as the peer sends them.
        while asked.len() < 2 || sent_responses.len() < 4 {
            tokio::select! {
                Some(request) = asks.next() => {
                    let message = request.message.clone();
                    if message.request_id == "req-defaults" {
                        assert_sentinels(&message);
                    }
                    // A reliable, volatile publisher only delivers to readers it has matched.
                    let start = Instant::now();
                    while tokens.get_inter_process_subscription_count()? == 0 {
                        ensure!(start.elapsed() < Duration::from_secs(20), "the peer never subscribed to {tokens_topic}");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    let stream = tokens_for(&message.request_id);
                    for token in &stream {
                        tokens.publish(token)?;
                    }
                    let response = response_for(&message, &stream)?;
                    sent_responses.push(serde_json::to_value(&response)?);
                    published.extend(stream);
                    asked.push(message.request_id.clone());
                    request.respond(response)?;
                }
                Some(request) = cancels.next() => {
                    let known = asked.contains(&request.message.request_id);
                    let response = Cancel::Response {
                        success: known,
                        message: if known { "cancelled while running ✓".to_owned() } else { "unknown request id".to_owned() },
                    };
                    sent_responses.push(serde_json::to_value(&response)?);
                    request.respond(response)?;
                }
                // A peer that stops early has failed a check: report it now, not at the timeout.
                peer = &mut report => {
                    let report = peer??;
                    bail!("the peer finished before all its requests were served: {report}");
                }
                else => bail!("the service streams ended"),
            }
        }
        anyhow::Ok(())
    };
    tokio::time::timeout(PEER_TIMEOUT, serve)
        .await
        .context("the peer's requests did not arrive in time")??;

    let report = report.await??;
    spin.stop()?;

    let received: Vec<Token> = serde_json::from_value(report["tokens"].clone())?;
    assert_eq!(received.len(), published.len(), "Token count");
    for (got, sent) in received.iter().zip(&published) {
        assert_eq!(got, sent, "Token {} of {}", sent.index, sent.request_id);
    }
    assert_eq!(
        received.iter().filter(|t| t.last).count(),
        2,
        "one last Token per request"
    );
    let responses = report["responses"].as_array().context("responses")?;
    assert_eq!(
        responses, &sent_responses,
        "service responses as the peer got them"
    );
    Ok(())
}

//! Structured output (`Ask.json_schema`) over a real ROS 2 graph (peer:
//! `tests/peers/schema_peer.py`): the node runs the embedded tiny random model on the BPU
//! simulator, so nothing but the decoder's constraint makes its answers parse. Answers sampled
//! at temperature 1.0 over several seeds validate against a rich schema — checked in the peer
//! by an independent validator (Python `jsonschema`); what cannot be enforced is refused
//! with `invalid_request` before queueing; an answer cut by `max_new_tokens` is `incomplete`;
//! free text is unaffected; `image_width`/`image_height` report the image used. Goals of
//! the Ask action follow the same rules.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use serde_json::Value;

use common::node_proc::{check_stream, domain, ok, peer_env, start_demo_node};
use common::ros_env;

const SEEDS: usize = 24;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_answers_validate_and_what_cannot_be_enforced_is_refused() -> anyhow::Result<()> {
    ros_env();
    let d = domain();
    let node = start_demo_node(
        &d,
        &[("image_topics", "['/cam']"), ("default_camera", "/cam")],
        &peer_env(&d),
    )?;
    let seeds = SEEDS.to_string();
    let (rep, log) = node
        .serve_peer(
            &d,
            "tests/peers/schema_peer.py",
            &["--seeds", &seeds],
            Duration::from_secs(300),
        )
        .await?;
    let asks = &rep["asks"];
    let r = |id: &str| -> &Value { &asks[id] };
    let resp = |id: &str| -> &Value { &r(id)["response"] };

    // Every structured answer completed and the independent validator accepts it.
    let mut ids: Vec<String> = (0..SEEDS).map(|s| format!("rich-{s}")).collect();
    ids.extend(
        [
            "gate",
            "count",
            "detect",
            "text-gate",
            "t-1",
            "t-3",
            "u-1",
            "u-3",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    let mut answers = Vec::new();
    for id in &ids {
        ok(id, r(id));
        assert_eq!(resp(id)["finish_reason"], "stop", "{id}: {}", resp(id));
        assert_eq!(r(id)["valid"], Value::Null, "{id}: {}", resp(id)["answer"]);
        // Compact JSON, the value alone: no reasoning, no tool calls.
        let answer = resp(id)["answer"].as_str().unwrap();
        assert_eq!(
            serde_json::from_str::<Value>(answer)?.to_string(),
            answer,
            "{id}: not compact"
        );
        assert_eq!(
            (
                resp(id)["reasoning"].as_str(),
                resp(id)["tool_calls_json"].as_str()
            ),
            (Some(""), Some("")),
            "{id}"
        );
        answers.push(answer.to_owned());
    }
    // Different seeds sample different values (the constraint does not force one answer).
    let rich: std::collections::HashSet<&String> = answers[..SEEDS].iter().collect();
    assert!(rich.len() > 1, "every seed gave the same value: {rich:?}");

    // The size of the image used: the camera frame, a compressed and a raw request image;
    // 0 without an image. The Answer says the same.
    let size = |id: &str| {
        let (rs, a) = (resp(id), &r(id)["answer"]);
        assert_eq!(a["image_width"], rs["image_width"], "{id}: Answer");
        assert_eq!(a["image_height"], rs["image_height"], "{id}: Answer");
        [
            rs["image_width"].as_u64().unwrap(),
            rs["image_height"].as_u64().unwrap(),
        ]
    };
    let sent = |k: &str| -> [u64; 2] { serde_json::from_value(rep[k].clone()).unwrap() };
    assert_eq!(resp("gate")["image_source"], "/cam");
    assert_eq!(size("gate"), sent("camera_size"));
    assert_ne!(size("gate"), [0, 0]);
    assert_eq!(resp("count")["image_source"], "request");
    assert_eq!(size("count"), sent("count_size"));
    assert_eq!(size("detect"), sent("detect_size"));
    assert_eq!(size("text-gate"), [0, 0]);
    assert_eq!(size("free-before"), [0, 0]);

    // Cut by max_new_tokens: a failure with the partial text, reported alike by the last
    // Token, the Answer and the response.
    let cut = resp("cut");
    assert_eq!(cut["success"], false, "{cut}");
    assert_eq!(
        (cut["error_code"].as_str(), cut["finish_reason"].as_str()),
        (Some("incomplete"), Some("length")),
        "{cut}"
    );
    assert!(
        cut["error_message"]
            .as_str()
            .unwrap()
            .contains("max_new_tokens"),
        "{cut}"
    );
    let partial = cut["answer"].as_str().unwrap();
    assert!(partial.starts_with('{'), "{cut}");
    assert!(serde_json::from_str::<Value>(partial).is_err(), "{cut}");
    assert_eq!(cut["completion_tokens"], 4, "{cut}");
    check_stream("cut", r("cut"));

    // Refused before queueing, naming the reason: no Token, no Answer, no finish reason.
    for (name, words) in [
        ("malformed", &["json_schema", "not valid JSON"][..]),
        (
            "oversized",
            &["json_schema", "max_json_schema_bytes", "16384"][..],
        ),
        ("unenforceable", &["json_schema", "x-guidance"][..]),
        ("not_a_schema", &["json_schema", "an array"][..]),
        ("with_tools", &["json_schema", "tools_json"][..]),
        ("with_stop", &["json_schema", "stop strings"][..]),
    ] {
        let id = format!("refused-{name}");
        let rs = resp(&id);
        assert_eq!(rs["success"], false, "{id}: {rs}");
        assert_eq!(rs["error_code"], "invalid_request", "{id}: {rs}");
        let m = rs["error_message"].as_str().unwrap();
        for w in words {
            assert!(m.contains(w), "{id}: {w:?} not in {m:?}");
        }
        assert_eq!(rs["finish_reason"], "", "{id}: generation started");
        assert_eq!(r(&id)["tokens"].as_array().map(Vec::len), Some(0), "{id}");
        assert_eq!(
            r(&id)["answer"],
            Value::Null,
            "{id}: an Answer was published"
        );
    }

    // A session's turns each carry their own schema, or none; a turn cut short is not kept,
    // so session t goes on exactly as session u, which never had it.
    for id in ["t-2", "t-4", "u-2", "u-4"] {
        ok(id, r(id));
    }
    // A continued turn does not prefill the system block again.
    assert!(
        resp("t-2")["prompt_tokens"].as_u64() < resp("free-before")["prompt_tokens"].as_u64(),
        "the session did not continue"
    );
    assert_eq!(
        resp("t-cut")["error_code"],
        "incomplete",
        "{}",
        resp("t-cut")
    );
    for n in 1..=4 {
        let (t, u) = (format!("t-{n}"), format!("u-{n}"));
        assert_eq!(resp(&t)["answer"], resp(&u)["answer"], "{t} vs {u}");
        assert_eq!(
            resp(&t)["prompt_tokens"],
            resp(&u)["prompt_tokens"],
            "{t} vs {u}"
        );
    }

    // The Ask action: the same rules, its result from the same outcome.
    let act = &rep["action"];
    assert_eq!(act["act-rich"]["success"], true, "{}", act["act-rich"]);
    assert_eq!(act["act-rich"]["finish_reason"], "stop");
    assert_eq!(act["act-rich"]["valid"], Value::Null, "{}", act["act-rich"]);
    assert_eq!(
        (
            act["act-cut"]["error_code"].as_str(),
            act["act-cut"]["finish_reason"].as_str()
        ),
        (Some("incomplete"), Some("length")),
        "{}",
        act["act-cut"]
    );
    assert_eq!(act["act-cut"]["success"], false);
    assert_eq!(act["act-stop"]["error_code"], "invalid_request");
    assert!(act["act-stop"]["error_message"]
        .as_str()
        .unwrap()
        .contains("stop strings"));

    // Free text is unaffected: the same greedy ask answers the same before and after.
    assert_eq!(
        ok("free-before", r("free-before")),
        ok("free-after", r("free-after"))
    );
    assert!(
        !log.contains("panicked"),
        "the node log holds a panic:\n{log}"
    );
    Ok(())
}

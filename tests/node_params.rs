//! `vlm_node`'s parameter services (issue 13) on a real ROS 2 graph, driven by an rclpy peer
//! (`tests/peers/param_peer.py`) through rcl_interfaces' services as `ros2 param` calls them:
//! list, get, describe, a sampling default set at run time and taking effect on the next ask,
//! refusals with their reasons, and a dump the node accepts back as its params file.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use anyhow::Context as _;
use serde_json::Value;

use bpu_vlm::ros::params::SPECS;
use common::node_proc::{domain, peer_env, start_demo_node, start_node_from_file};
use common::ros_env;

fn reason(rep: &Value, case: &str) -> String {
    let r = &rep["refused"][case];
    assert_eq!(r["successful"], false, "{case}: {r}");
    r["reason"].as_str().unwrap().to_owned()
}

fn close(v: &Value, want: f64) -> bool {
    v.as_f64().is_some_and(|x| (x - want).abs() < 1e-6)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parameters_are_listed_described_set_refused_and_dumped() -> anyhow::Result<()> {
    ros_env();
    let d = domain();
    let dir = tempfile::tempdir()?;
    let dump = dir.path().join("vlm_node_dump.yaml");
    let node = start_demo_node(&d, &[], &peer_env(&d))?;
    let (rep, _log) = node
        .serve_peer(
            &d,
            "tests/peers/param_peer.py",
            &["serve", "--dump", dump.to_str().unwrap()],
            Duration::from_secs(300),
        )
        .await?;

    // list: every parameter of the table, nothing else (no use_sim_time was given).
    let mut names: Vec<String> = serde_json::from_value(rep["names"].clone())?;
    names.sort();
    let mut want: Vec<String> = SPECS.iter().map(|s| s.name.to_owned()).collect();
    want.sort();
    assert_eq!(names, want);

    // get: types and values in force (the launch file's params file plus demo_model).
    let get = &rep["get"];
    assert_eq!(get["temperature"]["type"], "double");
    assert!(close(&get["temperature"]["value"], 0.7), "{get}");
    assert_eq!(get["max_new_tokens"]["type"], "integer");
    assert_eq!(get["max_new_tokens"]["value"], 256);
    assert_eq!(get["image_topics"]["type"], "string_array");
    assert_eq!(
        get["image_topics"]["value"],
        serde_json::json!(["image_raw"])
    );
    assert_eq!(get["demo_model"]["type"], "bool");
    assert_eq!(get["demo_model"]["value"], true);
    assert_eq!(get["system_prompt"]["value"], "");
    assert_eq!(get["max_image_age_s"]["type"], "double");

    // describe: the range and when a new value applies.
    let desc = |n: &str| {
        rep["describe"][n]["description"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    for (name, range) in [
        ("temperature", ">= 0"),
        ("top_p", "(0, 1]"),
        ("max_new_tokens", "1..=32768"),
        ("queue_depth", "1..=1024"),
    ] {
        assert!(desc(name).contains(range), "{name}: {}", desc(name));
    }
    assert!(desc("temperature").contains("applies to the next ask"));
    assert!(desc("model_dir").contains("Read at start only"));
    assert!(desc("queue_depth").contains("Read at start only"));
    assert_eq!(rep["describe"]["temperature"]["type"], "double");

    // A sampling default set at run time applies to the next ask: at the default
    // temperature the seeds give different answers, at temperature 0 the same one.
    let answers = |k: &str| -> Vec<String> { serde_json::from_value(rep[k].clone()).unwrap() };
    let before = answers("before");
    assert!(before.windows(2).any(|w| w[0] != w[1]), "{before:?}");
    assert_eq!(
        rep["set_temperature"]["successful"], true,
        "{}",
        rep["set_temperature"]
    );
    assert_eq!(rep["after_set"]["temperature"]["type"], "double");
    assert!(close(&rep["after_set"]["temperature"]["value"], 0.0));
    let after = answers("after");
    assert!(after.windows(2).all(|w| w[0] == w[1]), "{after:?}");

    // Refusals carry the reason; none of them changed a value.
    for case in ["model_dir", "queue_depth"] {
        let r = reason(&rep, case);
        assert!(
            r.contains("read at start only") && r.contains(case),
            "{case}: {r}"
        );
    }
    assert!(reason(&rep, "wrong_type").contains("expected a number"));
    assert!(reason(&rep, "out_of_range").contains("(0, 1]"));
    assert!(reason(&rep, "max_new_tokens_zero").contains("1..=32768"));
    assert!(reason(&rep, "unknown").contains("no_such_parameter"));
    assert!(reason(&rep, "deleted").contains("cannot be deleted"));
    assert!(reason(&rep, "atomically").contains("vision"));
    assert_eq!(rep["unchanged_restart_only"]["successful"], true);
    let kept = &rep["after_refused"];
    assert!(close(&kept["temperature"]["value"], 0.0), "{kept}");
    assert!(close(&kept["top_p"]["value"], 0.8), "{kept}");
    assert_eq!(
        kept["top_k"]["value"], 20,
        "the atomic set is all or nothing"
    );
    assert_eq!(kept["model_dir"]["value"], "");
    assert_eq!(kept["queue_depth"]["value"], 4);
    assert_eq!(kept["max_new_tokens"]["value"], 256);

    // The dump is a params file the node starts from, with the same values (the run-time
    // temperature included).
    let node = start_node_from_file(&d, &dump, &peer_env(&d))?;
    let (again, _log) = node
        .serve_peer(
            &d,
            "tests/peers/param_peer.py",
            &["values"],
            Duration::from_secs(240),
        )
        .await
        .context("vlm_node from the dump")?;
    assert_eq!(again["values"], rep["dumped"]);
    assert!(close(&again["values"]["temperature"], 0.0));
    Ok(())
}

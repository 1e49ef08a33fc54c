//! `vlm chat --json-schema FILE`: the answer is the JSON value (in `--json`'s `answer`), a cut
//! one fails with `incomplete`, and what cannot go with a schema is refused before the model
//! runs.
#![allow(clippy::unwrap_used)]

use vlm_testkit as common;

use std::process::{Command, Output};

use serde_json::Value;

const SCHEMA: &str = r#"{"type":"object","properties":{"object":{"enum":["cup","person"]},"count":{"type":"integer","minimum":0,"maximum":9}},"required":["object","count"],"additionalProperties":false}"#;

fn chat(extra: &[&str]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let schema = dir.path().join("schema.json");
    std::fs::write(&schema, SCHEMA).unwrap();
    Command::new(env!("CARGO_BIN_EXE_vlm"))
        .arg("chat")
        .arg("--hf")
        .arg(common::model_dir("tiny-sym"))
        .args(["-p", "How many cups?", "--json-schema"])
        .arg(&schema)
        .args(extra)
        .output()
        .unwrap()
}

fn reply(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[test]
fn the_answer_is_the_value() {
    for seed in ["1", "2", "3"] {
        let out = chat(&["--json", "--temperature", "1", "--seed", seed]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let r = reply(&out);
        assert_eq!(r["json_schema"], "complete");
        assert_eq!(r["finish_reason"], "stop");
        assert_eq!(r["reasoning"], "", "thinking is off with a schema");
        let v: Value = serde_json::from_str(r["answer"].as_str().unwrap()).unwrap();
        assert!(
            matches!(v["object"].as_str(), Some("cup" | "person")),
            "{v}"
        );
        assert!(v["count"].as_u64().is_some_and(|n| n <= 9), "{v}");
    }
}

#[test]
fn a_cut_answer_fails_as_incomplete() {
    let out = chat(&["--json", "--max-new-tokens", "3"]);
    assert!(!out.status.success());
    let r = reply(&out);
    assert_eq!(r["json_schema"], "incomplete");
    assert_eq!(r["error"], "incomplete");
    assert_eq!(r["finish_reason"], "length");
    assert!(String::from_utf8_lossy(&out.stderr).contains("incomplete"));
}

#[test]
fn conflicts_and_bad_schemas_are_refused() {
    let out = chat(&["--stop", "}"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--stop"));
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, r#"{"type":"string","if":{}}"#).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_vlm"))
        .arg("chat")
        .arg("--hf")
        .arg(common::model_dir("tiny-sym"))
        .args(["-p", "x", "--json-schema"])
        .arg(&bad)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot be enforced") && err.contains("if"),
        "{err}"
    );
}

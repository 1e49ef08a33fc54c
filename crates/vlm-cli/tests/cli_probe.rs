//! `vlm probe` (the real binary): on a sim package every step passes and the log on disk has
//! each step's start and end; killed by SIGSEGV at a chosen step (the test-only hook
//! `VLM_PROBE_CRASH_AT`), the process dies by that signal and the last line on disk names
//! the step.
#![allow(clippy::unwrap_used)]

use vlm_testkit as common;

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

fn package(dir: &Path) {
    common::sim_package("tiny-4b", dir, |o| o.cache_len = 64);
}

fn probe(pkg: &Path, log: &Path, crash_at: Option<&str>, cwd: &Path) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vlm"));
    cmd.arg("probe").arg(pkg).arg("--log").arg(log);
    cmd.env_remove("VLM_BPU_LOCK")
        .env_remove("BPU_SIM_POOL_MB")
        .env_remove("VLM_PROBE_CRASH_AT");
    if let Some(step) = crash_at {
        cmd.env("VLM_PROBE_CRASH_AT", step);
    }
    // A core file of the crash test, if the system writes one, lands in the temp dir.
    cmd.current_dir(cwd);
    cmd.output().unwrap()
}

fn lines(log: &Path) -> Vec<Value> {
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn every_step_passes_on_a_sim_package_and_is_on_disk() {
    let d = tempfile::tempdir().unwrap();
    let pkg = d.path().join("pkg");
    package(&pkg);
    let log = d.path().join("probe.jsonl");
    let out = probe(&pkg, &log, None, d.path());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = lines(&log);
    assert_eq!(lines[0]["event"], "probe");
    let mut names = Vec::new();
    // Every step: a start line, then its end line right after it.
    for pair in lines[1..].chunks(2) {
        let [start, end] = pair else {
            panic!("a start without an end: {pair:?}")
        };
        assert_eq!(start["event"], "start", "{start}");
        assert_eq!(end["event"], "end", "{end}");
        assert_eq!(start["step"], end["step"]);
        assert_eq!(end["pass"], true, "{end}");
        assert!(end["ms"].as_f64().unwrap() >= 0.0);
        assert!(!end["detail"].as_str().unwrap().is_empty(), "{end}");
        names.push(end["step"].as_str().unwrap().to_owned());
    }
    let want = [
        "manifest",
        "lock",
        "libraries",
        "symbols",
        "load:model.hbm",
        "load:model_prefill.hbm",
        "load:visual.hbm",
        "graphs",
        "flush_whole",
        "flush_range",
        "decode",
        "prefill",
        "tower",
    ];
    assert_eq!(names, want, "{text}");
    // The graphs step carries every graph's tensors as `vlm check --report --json` has them.
    let graphs = lines
        .iter()
        .find(|l| l["step"] == "graphs" && l["event"] == "end")
        .unwrap();
    let data = graphs["data"].as_array().unwrap();
    let names: Vec<&str> = data.iter().map(|g| g["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["qwen35", "qwen35_prefill", "visual"]);
    assert_eq!(data[0]["inputs"][0]["role"], "x");
    assert!(data[0]["inputs"][0]["strides"].as_array().is_some());
    assert_eq!(data[2]["outputs"][0]["role"], "embeddings");
    for step in ["decode", "prefill", "tower", "flush_whole", "flush_range"] {
        assert!(
            text.contains(&format!("{step}: pass")),
            "{step} not on stdout:\n{text}"
        );
    }
}

#[test]
fn steps_that_do_not_apply_are_left_out() {
    let d = tempfile::tempdir().unwrap();
    let pkg = d.path().join("pkg");
    package(&pkg);
    let log = d.path().join("probe.jsonl");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vlm"));
    cmd.arg("probe")
        .arg(&pkg)
        .arg("--log")
        .arg(&log)
        .args(["--no-vision", "--no-prefill-graph"])
        .env_remove("VLM_BPU_LOCK")
        .env_remove("VLM_PROBE_CRASH_AT")
        .current_dir(d.path());
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let steps: Vec<String> = lines(&log)
        .iter()
        .filter(|l| l["event"] == "end")
        .map(|l| l["step"].as_str().unwrap().to_owned())
        .collect();
    assert!(steps.contains(&"decode".to_owned()), "{steps:?}");
    for gone in [
        "prefill",
        "tower",
        "load:visual.hbm",
        "load:model_prefill.hbm",
    ] {
        assert!(!steps.iter().any(|s| s == gone), "{gone} in {steps:?}");
    }
}

#[test]
fn a_sigsegv_at_a_step_leaves_that_step_last_on_disk() {
    let d = tempfile::tempdir().unwrap();
    let pkg = d.path().join("pkg");
    package(&pkg);
    for step in ["load:visual.hbm", "flush_range", "decode", "tower"] {
        let log = d
            .path()
            .join(format!("probe-{}.jsonl", step.replace(':', "-")));
        let out = probe(&pkg, &log, Some(step), d.path());
        assert_eq!(
            out.status.signal(),
            Some(11),
            "{step}: expected death by SIGSEGV, got {:?}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let lines = lines(&log);
        let last = lines.last().unwrap();
        assert_eq!(last["step"], step, "{lines:?}");
        assert_eq!(last["event"], "start", "{lines:?}");
        // Every earlier step finished, and none after it started.
        let ends = lines.iter().filter(|l| l["event"] == "end").count();
        let starts = lines.iter().filter(|l| l["event"] == "start").count();
        assert_eq!(starts, ends + 1, "{lines:?}");
    }
}

#[test]
fn a_missing_package_fails_the_manifest_step() {
    let d = tempfile::tempdir().unwrap();
    let log = d.path().join("probe.jsonl");
    let out = probe(&d.path().join("nothing"), &log, None, d.path());
    assert!(!out.status.success());
    let lines = lines(&log);
    let last = lines.last().unwrap();
    assert_eq!(last["step"], "manifest");
    assert_eq!(last["pass"], false);
    assert!(
        last["detail"].as_str().unwrap().contains("model.json"),
        "{last}"
    );
}

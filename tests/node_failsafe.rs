//! Issue 12 over a real ROS 2 graph: nothing a model emits, no panic and no hung BPU task
//! leaves a zombie. A real `vlm_node` process serves an rclpy peer
//! (`tests/peers/failsafe_peer.py`); panics come from the node's test hook
//! (`VLM_NODE_TEST_PANIC`, debug builds only) and hung tasks from the simulator's fault plan
//! (`BPU_SIM_FAULTS`). The runs that end the process by design (a lost backend, a failed
//! reopen, a panic outside any request) each have their own node, and the test checks its
//! exit code. The nodes run text-only (`vision: false`, no camera topics), so a status
//! level is about what the test does, not a camera nobody publishes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};
use vlm::assistant::{Reply, Turn};
use vlm_bpu::sim::{make_sim_package, PackageOptions};
use vlm_bpu::{open_assistant, ModelSource, OpenOptions};

use bpu_vlm::process::fatal::EXIT_RUNTIME;
use common::node_proc::{cache_dir, check_messages, check_stream, domain, peer_env, start_node};
use common::{peer_report, peer_report_with, repo_root, ros_env, spawn_python};

/// One node at a time: a node and its peer keep the 2 cores busy.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const PROMPT: &str = "What is in the picture?";
const PROMPT2: &str = "And what colour is it?";
const MAX_NEW: usize = 12;
const OK: u64 = 0;
const WARN: u64 = 1;
const ERROR: u64 = 2;

/// The embedded demo model on the simulator, text only, diagnostics every 0.1 s.
fn demo_params() -> Vec<(&'static str, &'static str)> {
    vec![
        ("demo_model", "true"),
        ("vision", "false"),
        ("diagnostics_period_s", "0.1"),
    ]
}

/// Greedy answers of the runtime itself (what `vlm chat` runs) for `prompts`, text only.
fn direct(pkg: &Path, prompts: &[&str]) -> anyhow::Result<Vec<Reply>> {
    let opts = OpenOptions {
        vision: false,
        ..OpenOptions::default()
    };
    let mut a = open_assistant(&ModelSource::Package(pkg.to_owned()), &opts)?;
    prompts
        .iter()
        .map(|p| Ok(a.ask(None, &Turn::new(*p, MAX_NEW), &mut |_| {})?))
        .collect()
}

fn embedded_package() -> anyhow::Result<PathBuf> {
    Ok(bpu_vlm::embedded::ensure_package(&cache_dir())?)
}

/// A sim package of the tiny fixture model whose tokenizer decodes every lowercase ASCII
/// letter as U+0000 (a `Replace` step after the byte-level decoder), so its greedy answers
/// hold NULs, as any sampled model's may.
fn nul_package(root: &Path) -> anyhow::Result<PathBuf> {
    let hf = repo_root().join("tools/fixtures/models/tiny-4b");
    let mut tokenizer: Value =
        serde_json::from_str(&std::fs::read_to_string(hf.join("tokenizer.json"))?)?;
    let byte_level = tokenizer["decoder"].take();
    tokenizer["decoder"] = json!({
        "type": "Sequence",
        "decoders": [
            byte_level,
            {"type": "Replace", "pattern": {"Regex": "[a-z]"}, "content": "\u{0}"},
        ],
    });
    let path = root.join("tokenizer.json");
    std::fs::write(&path, serde_json::to_vec(&tokenizer)?)?;
    let out = root.join("package");
    let mut o = PackageOptions::new(&hf, &out);
    o.tokenizer = Some(path);
    o.cache_len = bpu_vlm::embedded::CONTEXT;
    make_sim_package(&o)?;
    Ok(out)
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or_default()
}

fn count(d: &Value, key: &str) -> u64 {
    str_of(d, key).parse().unwrap_or(u64::MAX)
}

/// A request that failed with `backend_error` but got its last Token and its Answer.
fn backend_error<'a>(case: &str, r: &'a Value) -> &'a str {
    let resp = &r["response"];
    assert_eq!(resp["success"], false, "{case}: {resp}");
    assert_eq!(resp["error_code"], "backend_error", "{case}: {resp}");
    assert_eq!(resp["finish_reason"], "error", "{case}: {resp}");
    check_messages(case, r);
    str_of(resp, "error_message")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_answers_model_output_with_nul_characters() -> anyhow::Result<()> {
    ros_env();
    let _serial = SERIAL.lock().await;
    let tmp = tempfile::tempdir()?;
    let pkg = nul_package(tmp.path())?;
    let want = direct(&pkg, &[PROMPT, PROMPT2])?;
    let nuls: usize = want
        .iter()
        .map(|r| r.completion.text.matches('\0').count())
        .sum();
    assert!(
        want[0].completion.text.contains('\0'),
        "the fixture must emit a NUL: {:?}",
        want[0].completion.text
    );

    let d = domain();
    let pkg_arg = pkg.display().to_string();
    let node = start_node(
        &d,
        &[
            ("model_dir", &pkg_arg),
            ("vision", "false"),
            ("diagnostics_period_s", "0.1"),
        ],
        &[],
    )?;
    let max_new = MAX_NEW.to_string();
    let (rep, log) = node
        .serve_peer(
            &d,
            "tests/peers/failsafe_peer.py",
            &[
                "nul",
                "--max-new-tokens",
                &max_new,
                "--prompt",
                PROMPT,
                "--prompt2",
                PROMPT2,
            ],
            Duration::from_secs(180),
        )
        .await?;
    assert!(!log.contains("panicked"), "{log}");

    for (case, w) in ["first", "second"].iter().zip(&want) {
        let r = &rep[*case];
        assert_eq!(r["response"]["success"], true, "{case}: {}", r["response"]);
        check_stream(case, r);
        assert_eq!(
            str_of(&r["response"], "answer"),
            w.completion.text.replace('\0', "\u{FFFD}"),
            "{case}: the runtime's answer with each NUL as U+FFFD"
        );
    }
    let diag = &rep["diag"];
    assert_eq!(count(diag, "nul_replaced"), nuls as u64, "{diag}");
    assert_eq!(diag["_level"], WARN, "{diag}");
    assert!(str_of(diag, "_message").contains("NUL"), "{diag}");
    assert_eq!(
        str_of(diag, "_hardware_id"),
        "simulator; package tiny-4b",
        "{diag}"
    );
    Ok(())
}

/// Runs the `panic` peer against a demo node with `VLM_NODE_TEST_PANIC=<plan>`: the first
/// ask panics in the node, the second must answer as the runtime does.
async fn contained_panic(plan: &str) -> anyhow::Result<(Value, String)> {
    let d = domain();
    let env = [("VLM_NODE_TEST_PANIC", plan.to_owned())];
    let node = start_node(&d, &demo_params(), &env)?;
    let max_new = MAX_NEW.to_string();
    let (rep, log) = node
        .serve_peer(
            &d,
            "tests/peers/failsafe_peer.py",
            &["panic", "--max-new-tokens", &max_new, "--prompt", PROMPT],
            Duration::from_secs(180),
        )
        .await?;

    let message = backend_error("panicking ask", &rep["failed"]);
    assert!(
        message.starts_with("internal error: ") && message.contains("test panic at serve"),
        "{message}"
    );
    let want = direct(&embedded_package()?, &[PROMPT])?;
    assert_eq!(
        rep["after"]["response"]["success"], true,
        "{}",
        rep["after"]
    );
    check_stream("after the panic", &rep["after"]);
    assert_eq!(
        str_of(&rep["after"]["response"], "answer"),
        want[0].completion.text,
        "the ask after the panic is answered as from a fresh state"
    );
    let diag = &rep["diag"];
    assert_eq!(
        (
            count(diag, "requests_served"),
            count(diag, "requests_failed"),
            count(diag, "internal_errors")
        ),
        (1, 1, 1),
        "{diag}"
    );
    assert_eq!(str_of(diag, "queue_depth"), "0", "the slot is free: {diag}");
    let levels = rep["levels"].as_array().unwrap();
    assert!(
        !levels.is_empty() && levels.iter().all(|l| *l != ERROR),
        "{levels:?}"
    );
    Ok((rep, log))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_contains_a_panic_while_serving_and_resets_the_backend() -> anyhow::Result<()> {
    ros_env();
    let _serial = SERIAL.lock().await;
    let (_, log) = contained_panic("serve").await?;
    assert!(
        log.contains("backend state reset after an internal error"),
        "{log}"
    );
    assert!(!log.contains("reopening the model"), "{log}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_reopens_the_model_when_the_reset_panics_too() -> anyhow::Result<()> {
    ros_env();
    let _serial = SERIAL.lock().await;
    let (_, log) = contained_panic("serve,reset").await?;
    let reopened = log
        .find("model reopened after an internal error")
        .expect("the model was reopened");
    let reset_failed = log
        .find("resetting the backend panicked")
        .expect("the reset panicked first");
    assert!(reset_failed < reopened);
    Ok(())
}

fn copy_dir(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_exits_for_a_restart_when_the_model_cannot_be_reopened() -> anyhow::Result<()> {
    ros_env();
    let _serial = SERIAL.lock().await;
    let tmp = tempfile::tempdir()?;
    let pkg = tmp.path().join("package");
    copy_dir(&embedded_package()?, &pkg)?;
    let pkg_arg = pkg.display().to_string();
    let d = domain();
    let env = [("VLM_NODE_TEST_PANIC", "serve,reset".to_owned())];
    let node = start_node(
        &d,
        &[
            ("model_dir", &pkg_arg),
            ("vision", "false"),
            ("diagnostics_period_s", "0.1"),
        ],
        &env,
    )?;
    let peer = spawn_python(
        "tests/peers/failsafe_peer.py",
        &["reopen_fails", "--prompt", PROMPT, "--gone", &pkg_arg],
        &peer_env(&d),
    )?;
    // Once the node serves, its package goes: the reopen after the panic cannot succeed.
    let mut removed = false;
    let rep = peer_report_with(peer, Duration::from_secs(180), |line| {
        if line == "READY" && !removed {
            removed = std::fs::remove_dir_all(&pkg).is_ok();
        }
    })
    .await;
    let (exit, log) = node.exited(Duration::from_secs(60)).await?;
    let rep = rep?;
    assert!(removed, "the package was not removed");
    assert_eq!(exit.code(), Some(i32::from(EXIT_RUNTIME)), "{exit}\n{log}");
    let message = backend_error("panicking ask", &rep["failed"]);
    assert!(message.starts_with("internal error: "), "{message}");
    let error = &rep["error"];
    assert_eq!(error["_level"], ERROR, "{error}");
    assert!(
        str_of(error, "_message").contains("could not be reopened"),
        "{error}"
    );
    assert_eq!(str_of(error, "state"), "error", "{error}");
    let levels = rep["levels"].as_array().unwrap();
    let first_error = levels.iter().position(|l| *l == ERROR).unwrap();
    assert!(levels[..first_error].iter().all(|l| *l == OK || *l == WARN));
    assert!(log.contains("could not be reopened"), "{log}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_exits_for_a_restart_after_a_panic_in_a_long_lived_task() -> anyhow::Result<()> {
    ros_env();
    let _serial = SERIAL.lock().await;
    let d = domain();
    let env = [("VLM_NODE_TEST_PANIC", "cancel".to_owned())];
    let node = start_node(&d, &demo_params(), &env)?;
    let peer = spawn_python(
        "tests/peers/failsafe_peer.py",
        &["task_panic", "--max-new-tokens", "4", "--prompt", PROMPT],
        &peer_env(&d),
    )?;
    let rep = peer_report(peer, Duration::from_secs(120)).await;
    let (exit, log) = node.exited(Duration::from_secs(60)).await?;
    let rep = rep?;
    assert_eq!(exit.code(), Some(i32::from(EXIT_RUNTIME)), "{exit}\n{log}");
    assert_eq!(rep["ok"]["response"]["success"], true, "{}", rep["ok"]);
    assert_ne!(rep["before"]["_level"], ERROR, "{}", rep["before"]);
    let error = &rep["error"];
    assert_eq!(error["_level"], ERROR, "{error}");
    assert!(
        str_of(error, "_message").contains("test panic at cancel"),
        "{error}"
    );
    assert!(log.contains("panic outside any request"), "{log}");
    Ok(())
}

/// A BPU task that never finishes within `bpu_timeout_s`: the running ask and the one queued
/// behind it fail with `backend_error`, the status goes to ERROR, no graph call is made
/// after the timed-out one, and the process exits for a restart.
async fn hung_task(fault: &str) -> anyhow::Result<()> {
    let d = domain();
    let mut params = demo_params();
    params.push(("bpu_timeout_s", "1.0"));
    // Warm-up makes a few dozen graph calls; the 150th is inside the first ask, whose 400
    // tokens (no eos stop) take more than that.
    let env = [
        ("BPU_SIM_FAULTS", format!("{fault}:slow=5000@150")),
        ("RUST_LOG", "info,bpu_sim=trace".to_owned()),
    ];
    let node = start_node(&d, &params, &env)?;
    let peer = spawn_python(
        "tests/peers/failsafe_peer.py",
        &["hang", "--max-new-tokens", "400", "--prompt", PROMPT],
        &peer_env(&d),
    )?;
    let rep = peer_report(peer, Duration::from_secs(180)).await;
    let (exit, log) = node.exited(Duration::from_secs(60)).await?;
    let rep = rep?;
    assert_eq!(
        exit.code(),
        Some(i32::from(EXIT_RUNTIME)),
        "{fault}: {exit}"
    );

    let hung = backend_error("hung ask", &rep["hung"]);
    assert!(
        hung.contains("graph") && hung.contains("did not finish within 1000 ms"),
        "{fault}: {hung}"
    );
    let queued = backend_error("queued ask", &rep["queued"]);
    assert!(
        queued.contains("the BPU backend is lost"),
        "{fault}: {queued}"
    );
    let error = &rep["error"];
    assert_eq!(error["_level"], ERROR, "{fault}: {error}");
    assert!(
        str_of(error, "_message").contains("did not finish within"),
        "{error}"
    );

    // The boundary: the timed-out wait is the last graph call the process made.
    let timeout = log
        .find("\"HB_UCP_TASK_TIMEOUT\"")
        .unwrap_or_else(|| panic!("{fault}: no timed-out call in the log"));
    assert!(log[..timeout].contains("\"hbUCPSubmitTask\""));
    assert!(
        !log[timeout..].contains("\"hbUCPSubmitTask\""),
        "{fault}: a graph call was submitted after the timeout"
    );
    assert!(log.contains("the BPU backend is lost"), "{fault}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_exits_for_a_restart_when_a_bpu_wait_hangs() -> anyhow::Result<()> {
    ros_env();
    let _serial = SERIAL.lock().await;
    hung_task("hbUCPWaitTaskDone").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_exits_for_a_restart_when_a_bpu_task_is_slow_at_submit() -> anyhow::Result<()> {
    ros_env();
    let _serial = SERIAL.lock().await;
    hung_task("hbUCPSubmitTask").await
}

/// The 200-ask soak with every failure the node survives in-process mixed in: invalid and
/// oversized requests (refused before queueing, no Token), model output full of NULs (the
/// NUL package), a panic while serving and a panic in the reset that follows it (the model
/// is reopened). Every ask gets its response, every admitted one exactly one last Token and
/// its Answer, and the simulator's buffers and tasks, sessions and the queue return to their
/// baseline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_soak_mixes_every_survivable_failure_and_returns_to_baseline() -> anyhow::Result<()> {
    ros_env();
    let _serial = SERIAL.lock().await;
    let tmp = tempfile::tempdir()?;
    let pkg = nul_package(tmp.path())?.display().to_string();
    let d = domain();
    let env = [("VLM_NODE_TEST_PANIC", "serve@37,reset@1".to_owned())];
    let node = start_node(
        &d,
        &[
            ("model_dir", &pkg),
            ("vision", "false"),
            ("diagnostics_period_s", "0.2"),
            ("session_idle_s", "3.0"),
            ("max_prompt_bytes", "1024"),
        ],
        &env,
    )?;
    let (rep, log) = node
        .serve_peer(
            &d,
            "tests/peers/failsafe_peer.py",
            &[
                "soak",
                "--count",
                "200",
                "--max-new-tokens",
                "4",
                "--max-prompt-bytes",
                "1024",
                "--timeout",
                "500",
            ],
            Duration::from_secs(560),
        )
        .await?;
    assert!(log.contains("test panic at serve"), "the serve panic ran");

    let results = rep["results"].as_array().unwrap();
    assert_eq!(results.len(), 200);
    let (mut answered, mut refused, mut internal, mut replacements) = (0, 0, 0, 0);
    for (i, r) in results.iter().enumerate() {
        let case = format!("ask {i} ({})", r["kind"]);
        let resp = &r["response"];
        assert!(
            !resp.to_string().contains("\\u0000"),
            "{case}: a NUL reached a message"
        );
        if r["kind"] != "ask" {
            assert_eq!(resp["error_code"], "invalid_request", "{case}: {resp}");
            assert!(
                r["tokens"].as_array().is_some_and(Vec::is_empty),
                "{case}: a refused ask streams nothing"
            );
            refused += 1;
        } else if resp["success"] == true {
            check_stream(&case, r);
            replacements += str_of(resp, "answer").matches('\u{FFFD}').count();
            answered += 1;
        } else {
            let message = backend_error(&case, r);
            assert!(message.starts_with("internal error: "), "{case}: {message}");
            internal += 1;
        }
    }
    assert_eq!((answered, refused, internal), (159, 40, 1));
    assert!(replacements > 0, "the NUL package's answers hold U+FFFD");

    let (before, settled) = (&rep["before"], &rep["settled"]);
    assert_eq!(str_of(settled, "sessions"), "0", "idle sessions expire");
    assert_eq!(str_of(settled, "queue_depth"), "0");
    for k in ["sim_live_buffers", "sim_live_tasks"] {
        assert!(before[k].is_string(), "diagnostics lack {k}: {before}");
        assert_eq!(settled[k], before[k], "{k} back to baseline");
    }
    assert_eq!(
        (
            count(settled, "requests_served") - count(before, "requests_served"),
            count(settled, "requests_failed") - count(before, "requests_failed"),
            count(settled, "internal_errors") - count(before, "internal_errors"),
        ),
        (159, 1, 1),
        "{settled}"
    );
    // U+FFFD also stands for bytes that are not UTF-8, so the answers hold at least as many
    // as the NULs the node replaced in them; the counter must have seen some.
    assert!(count(settled, "nul_replaced") > 0, "{settled}");
    let levels = rep["levels"].as_array().unwrap();
    assert!(
        levels.iter().all(|l| *l != ERROR),
        "never ERROR: {levels:?}"
    );
    Ok(())
}

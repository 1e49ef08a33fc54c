//! The real `vlm_node` process stopping and the request bookkeeping around it, over a real
//! ROS 2 graph: a signal during model load or warm-up stops at the next load step, cache
//! buffer or graph call and exits 0, a second signal exits at once, a decode-state snapshot
//! is taken only for an ask with a session, and a request id is free the moment its response
//! is out (peer: `tests/peers/session_peer.py`). The node runs the embedded tiny model on the
//! BPU simulator; the simulator's `slow=` faults stretch the load and warm-up so a signal
//! lands inside them, and each faulted call logs a line, so the assertions are on the order
//! and count of log lines and on exit codes. The one bound on elapsed time (a stop during
//! the cache allocation) is a behaviour check with a wide margin, not a speed measurement.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::{ensure, Context as _};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

use common::{peer_report, repo_root, ros_env, spawn_python};

/// One node at a time: a node and a peer keep the 2 cores busy.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The simulator's line for each call a fault plan hits.
const FAULT_LINE: &str = "bpu-sim: injected fault";

/// A line of the node's own log; rcl's console copy of a `/rosout` message (`[WARN] [...]`)
/// repeats a warning and is not counted.
fn own(line: &str) -> bool {
    !line.starts_with('[')
}

fn domain() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let base = std::process::id() % 50;
    (1 + (base + 13 + NEXT.fetch_add(1, Ordering::Relaxed) * 11) % 100).to_string()
}

/// A `vlm_node` whose stderr lines are watched as they come.
struct Node {
    child: Child,
    lines: mpsc::UnboundedReceiver<String>,
    /// Every line seen so far, in order.
    log: Vec<String>,
}

impl Node {
    fn start(domain: &str, params: &[(&str, &str)], env: &[(&str, &str)]) -> anyhow::Result<Self> {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_vlm_node"));
        cmd.arg("--ros-args")
            .arg("--params-file")
            .arg(repo_root().join("launch/vlm_params.yaml"));
        let cache = repo_root().join(".cache/test-embedded-model");
        let cache = cache.display().to_string();
        // The embedded tiny model (no model_dir); `params` may override it.
        let demo = [("demo_model", "true")];
        for (k, v) in demo
            .iter()
            .chain(params)
            .chain(&[("cache_dir", cache.as_str())])
        {
            cmd.arg("-p").arg(format!("{k}:={v}"));
        }
        let mut child = cmd
            .env("ROS_DOMAIN_ID", domain)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("starting vlm_node")?;
        let stderr = child.stderr.take().context("vlm_node stderr")?;
        let (tx, lines) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut r = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = r.next_line().await {
                eprintln!("vlm_node: {line}");
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Self {
            child,
            lines,
            log: Vec::new(),
        })
    }

    /// Waits for the next line of the node's own log containing `text` (bounded: a hung
    /// node fails the test).
    async fn wait_for(&mut self, text: &str) -> anyhow::Result<()> {
        let found = tokio::time::timeout(Duration::from_secs(120), async {
            while let Some(line) = self.lines.recv().await {
                let hit = own(&line) && line.contains(text);
                self.log.push(line);
                if hit {
                    return true;
                }
            }
            false
        })
        .await
        .with_context(|| format!("no line with {text:?} in time"))?;
        ensure!(found, "vlm_node ended before logging {text:?}");
        Ok(())
    }

    fn signal(&self, name: &str) -> anyhow::Result<()> {
        let pid = self.child.id().context("vlm_node has exited")?;
        let ok = std::process::Command::new("kill")
            .args([&format!("-{name}"), &pid.to_string()])
            .status()?
            .success();
        ensure!(ok, "kill -{name} failed");
        Ok(())
    }

    /// The exit status and the whole log (bounded wait).
    async fn exit(mut self) -> anyhow::Result<(ExitStatus, Vec<String>)> {
        let status = tokio::time::timeout(Duration::from_secs(60), self.child.wait())
            .await
            .context("vlm_node did not exit")??;
        while let Some(line) = self.lines.recv().await {
            self.log.push(line);
        }
        Ok((status, self.log))
    }
}

fn index(log: &[String], text: &str) -> Option<usize> {
    log.iter().position(|l| own(l) && l.contains(text))
}

fn count(lines: &[String], text: &str) -> usize {
    lines.iter().filter(|l| own(l) && l.contains(text)).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_during_warm_up_stops_at_the_next_graph_call_and_exits_0() -> anyhow::Result<()> {
    ros_env();
    let _serial = SERIAL.lock().await;
    // Every graph call 300 ms longer: the warm-up is many calls, so the signal lands inside it.
    let mut node = Node::start(
        &domain(),
        &[],
        &[("BPU_SIM_FAULTS", "hbUCPSubmitTask:slow=300")],
    )?;
    node.wait_for("warm-up started").await?;
    node.wait_for(FAULT_LINE).await?;
    node.wait_for(FAULT_LINE).await?;
    node.signal("INT")?;
    let (status, log) = node.exit().await?;
    assert_eq!(status.code(), Some(0), "{status}");

    let started = index(&log, "warm-up started").unwrap();
    let signalled = index(&log, "SIGINT received").expect("the signal is logged");
    let stopped = index(&log, "warm-up interrupted before graph call")
        .expect("the warm-up says where it stopped");
    assert!(started < signalled && signalled < stopped);
    // "... before graph call N of the warm-up": calls 1..N-1 ran, each one faulted line.
    let n: usize = log[stopped]
        .split("before graph call ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .expect("a call number");
    assert!(
        n >= 3,
        "two calls had started before the signal: {}",
        log[stopped]
    );
    assert_eq!(
        count(&log[started..stopped], FAULT_LINE),
        n - 1,
        "exactly the calls before the boundary ran"
    );
    assert_eq!(
        count(&log[stopped..], FAULT_LINE),
        0,
        "no graph call after the boundary"
    );
    assert!(index(&log, "warm-up done").is_none());
    assert!(
        index(&log, "vlm_node ready").is_none(),
        "/ask never came up"
    );
    assert!(index(&log, "vlm_node stopped cleanly").is_some());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_during_model_load_stops_before_the_next_step_and_exits_0() -> anyhow::Result<()> {
    ros_env();
    let _serial = SERIAL.lock().await;
    // Each model file load 1.5 s longer (a board reads GBs there); the signal lands inside one.
    let mut node = Node::start(
        &domain(),
        &[],
        &[("BPU_SIM_FAULTS", "hbDNNInitializeFromFiles:slow=1500")],
    )?;
    node.wait_for("opening BPU package").await?;
    node.wait_for(FAULT_LINE).await?;
    node.signal("TERM")?;
    let (status, log) = node.exit().await?;
    assert_eq!(status.code(), Some(0), "{status}");
    let signalled = index(&log, "SIGTERM received").expect("the signal is logged");
    let stopped = index(&log, "opening the package interrupted before")
        .expect("opening says where it stopped");
    assert!(signalled < stopped);
    // The load in flight completed; the steps after the boundary never ran.
    assert_eq!(count(&log[stopped..], FAULT_LINE), 0);
    assert!(index(&log, "warm-up started").is_none());
    assert!(index(&log, "vlm_node stopped cleanly").is_some());
    Ok(())
}

/// SIGINT once the node has logged `inside` and then two calls slowed by `faults` (1 s
/// each), so the signal lands between slowed calls of one start-up step; the node must stop
/// at the boundary it then logs (`stopped`), after at most the call in flight.
async fn sigint_inside(faults: &str, inside: &str, stopped: &str) -> anyhow::Result<()> {
    ros_env();
    let _serial = SERIAL.lock().await;
    let env = [
        ("BPU_SIM_FAULTS", faults),
        // The open steps' own lines are at debug level.
        ("RUST_LOG", "info,vlm_bpu::open=debug"),
    ];
    let mut node = Node::start(&domain(), &[], &env)?;
    node.wait_for(inside).await?;
    node.wait_for(FAULT_LINE).await?;
    node.wait_for(FAULT_LINE).await?;
    node.signal("INT")?;
    let sent = std::time::Instant::now();
    let (status, log) = node.exit().await?;
    let took = sent.elapsed();
    assert_eq!(status.code(), Some(0), "{status}");
    let signalled = index(&log, "SIGINT received").expect("the signal is logged");
    let at = index(&log, stopped).unwrap_or_else(|| panic!("no {stopped:?} line"));
    assert!(signalled < at);
    // Only the call in flight when the signal came ran to its end.
    assert!(count(&log[signalled..at], FAULT_LINE) <= 1);
    assert_eq!(count(&log[at..], FAULT_LINE), 0, "no slowed call after it");
    assert!(index(&log, "warm-up started").is_none());
    assert!(index(&log, "vlm_node stopped cleanly").is_some());
    // A stop, not a speed: without the boundary the node waited for the ~20 slowed calls
    // left (over 20 s); with it, one call and the release (a few s in a debug build).
    assert!(
        took < Duration::from_secs(12),
        "signal to exit took {took:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_while_the_cache_sets_are_allocated_stops_before_the_next_buffer(
) -> anyhow::Result<()> {
    // The demo model's three cache sets are 24 device buffers, allocated after the 13 other
    // allocations of opening; each of the 24 takes 1 s longer (the 4B's sets at ctx4k took
    // seconds on a busy host).
    sigint_inside(
        "hbUCPMallocCached:slow=1000@13*24",
        "allocating the decode cache sets",
        "interrupted before allocating the rest of the cache buffers",
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_while_the_state_is_cleared_stops_before_the_next_buffer() -> anyhow::Result<()> {
    // Clearing the fresh state flushes each of the 24 cache buffers once, after the 41
    // flushes of the allocations; each of the 24 takes 1 s longer. The step's debug line is
    // the one with the name in quotes.
    sigint_inside(
        "hbUCPMemFlush:slow=1000@41*24",
        "\"clearing the state\"",
        "interrupted before clearing the rest of the state",
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigint_exits_at_once_with_130() -> anyhow::Result<()> {
    ros_env();
    let _serial = SERIAL.lock().await;
    // A graph call takes 3 s more: the orderly stop must wait for it, the second signal not.
    let mut node = Node::start(
        &domain(),
        &[],
        &[("BPU_SIM_FAULTS", "hbUCPSubmitTask:slow=3000")],
    )?;
    node.wait_for("warm-up started").await?;
    node.wait_for(FAULT_LINE).await?;
    node.signal("INT")?;
    node.wait_for("SIGINT received").await?;
    node.signal("INT")?;
    let (status, log) = node.exit().await?;
    assert_eq!(
        status.code(),
        Some(bpu_vlm::process::signals::EXIT_SECOND_SIGINT),
        "{status}"
    );
    let second = index(&log, "second signal (SIGINT)").expect("the second signal is logged");
    assert!(index(&log, "SIGINT received").unwrap() < second);
    // Gone before the graph call in flight returned: no boundary was reached.
    assert!(index(&log, "warm-up interrupted").is_none());
    assert!(index(&log, "vlm_node stopped cleanly").is_none());
    Ok(())
}

fn snapshots_of(ask: &Value) -> u64 {
    ask["state_snapshots"].as_str().unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_only_for_sessions_and_ids_are_free_once_answered() -> anyhow::Result<()> {
    ros_env();
    let _serial = SERIAL.lock().await;
    let d = domain();
    // Counts state snapshots: no background priming (it takes one per frame).
    let params = [
        ("diagnostics_period_s", "0.05"),
        ("prefill_latest_frame", "false"),
    ];
    let node = Node::start(&d, &params, &[])?;
    let peer = spawn_python(
        "tests/peers/session_peer.py",
        &["all", "--count", "30"],
        &[("ROS_DOMAIN_ID", d.clone())],
    )?;
    let rep = peer_report(peer, Duration::from_secs(240)).await;
    node.signal("TERM")?;
    let (status, _log) = node.exit().await?;
    let rep = rep?;
    assert!(status.success(), "{status}");

    let snap = &rep["snapshots"];
    // The warm-up cached the system prefix: the one snapshot before any ask.
    let base: u64 = snap["base"]["state_snapshots"].as_str().unwrap().parse()?;
    assert_eq!(base, 1, "{}", snap["base"]);
    let mut expected = base;
    for ask in snap["asks"].as_array().unwrap() {
        assert_eq!(ask["response"]["success"], true, "{ask}");
        if !ask["session_id"].as_str().unwrap().is_empty() {
            expected += 1;
        }
        assert_eq!(
            snapshots_of(ask),
            expected,
            "{}: one snapshot per session ask, none otherwise",
            ask["id"]
        );
    }
    assert_eq!(
        snap["asks"].as_array().unwrap().last().unwrap()["sessions"],
        "2"
    );

    let reuse = &rep["reuse"];
    let responses = reuse["responses"].as_array().unwrap();
    assert_eq!(responses.len(), 30);
    for (i, r) in responses.iter().enumerate() {
        assert_eq!(r["request_id"], "same-id");
        assert_eq!(
            r["success"],
            true,
            "ask {i}, sent the moment ask {} was answered: {r}",
            i.max(1) - 1
        );
    }
    assert_eq!(reuse["lasts"], 30, "one last Token per ask");
    Ok(())
}

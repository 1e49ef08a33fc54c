//! `vlm_node`: the bpu_vlm ROS 2 node. Reads its parameters, opens the model on a worker
//! thread, serves `/ask` once it is warm, and exits cleanly on SIGINT or SIGTERM. ROS
//! arguments (`--ros-args ...`) are read by rcl from the command line. Logs go to stderr
//! through `tracing`, at the level of `--ros-args --log-level` (else `RUST_LOG`, else `info`;
//! [`bpu_vlm::ros::log_level`]); logs at the parameter `rosout_level` (default INFO) and above
//! also go to `/rosout` under the node's logger, whatever the stderr level says.
//!
//! Exit codes ([`bpu_vlm::process::fatal`]), so a supervisor can tell a restart from a fix:
//! - 0: stopped by SIGINT or SIGTERM;
//! - 78 (sysexits `EX_CONFIG`): a configuration error — a parameter, a ROS argument or
//!   name, or a model that cannot be loaded as given; the same settings fail the same way;
//! - 70 (sysexits `EX_SOFTWARE`): a runtime failure — the BPU backend lost to a graph call
//!   past `bpu_timeout_s`, a model that could not be reopened after an internal error, a
//!   panic outside any request, a thread of the node gone; a restart is the remedy.
//!
//! Debug builds only: `VLM_NODE_TEST_PANIC` injects panics for the node tests
//! (`bpu_vlm::process::test_hooks`); release builds do not read it.

use std::process::ExitCode;

use anyhow::Context as _;
use bpu_vlm::node::NodeError;
use bpu_vlm::process::fatal::{EXIT_CONFIG, EXIT_RUNTIME};
use bpu_vlm::ros::rosout::{self, RosoutTarget};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::Layer as _;

fn main() -> ExitCode {
    let rosout_target = RosoutTarget::default();
    let stderr = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(bpu_vlm::ros::log_level::stderr_filter(std::env::args()));
    tracing_subscriber::registry()
        .with(stderr)
        .with(rosout::layer(rosout_target.clone()))
        .init();
    // Before any thread starts: a panic outside a request stops the node with exit code 70.
    bpu_vlm::process::panics::install_hook();
    match start(rosout_target) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let code = exit_code(&e);
            tracing::error!(exit_code = code, "vlm_node failed: {e:#}");
            ExitCode::from(code)
        }
    }
}

/// The exit code for why the node stopped ([`NodeError::exit_code`]). Before the node
/// exists, rcl refusing its arguments or environment is a configuration error; anything
/// else (the async runtime, the signal handlers) is a runtime failure.
fn exit_code(e: &anyhow::Error) -> u8 {
    if let Some(n) = e.downcast_ref::<NodeError>() {
        n.exit_code()
    } else if e.downcast_ref::<r2r::Error>().is_some() {
        EXIT_CONFIG
    } else {
        EXIT_RUNTIME
    }
}

fn start(rosout_target: RosoutTarget) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("building the tokio runtime")?;
    runtime.block_on(run(rosout_target))
}

async fn run(rosout_target: RosoutTarget) -> anyhow::Result<()> {
    // Installed before any ROS entity exists, so an early signal still drains.
    let signals = bpu_vlm::process::signals::Signals::install()
        .context("installing the SIGINT and SIGTERM handlers")?;

    let ctx = r2r::Context::create().context("initialising ROS 2 (rcl)")?;
    tracing::info!(ros_distro = r2r::ROS_DISTRO, "r2r context created");
    bpu_vlm::node::run(ctx, signals.first(), &rosout_target)
        .await
        .context("running vlm_node")
}

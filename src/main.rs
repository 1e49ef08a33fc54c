//! `vlm_node`: the bpu_vlm ROS 2 node. Reads its parameters, opens the model on a worker
//! thread, serves `/ask` once it is warm, and exits cleanly on SIGINT or SIGTERM. ROS
//! arguments (`--ros-args ...`) are read by rcl from the command line. Logs go to stderr
//! through `tracing`, at the level of `--ros-args --log-level` (else `RUST_LOG`, else `info`;
//! [`bpu_vlm::log_level`]); warnings and errors also go to `/rosout` under the node's name,
//! whatever the level says.

use anyhow::Context as _;
use bpu_vlm::rosout::{self, RosoutTarget};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::Layer as _;

fn main() -> anyhow::Result<()> {
    let rosout_target = RosoutTarget::default();
    let stderr = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_filter(bpu_vlm::log_level::stderr_filter(std::env::args()));
    tracing_subscriber::registry()
        .with(stderr)
        .with(rosout::layer(rosout_target.clone()))
        .init();

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("building the tokio runtime")?;
    runtime.block_on(run(rosout_target))
}

async fn run(rosout_target: RosoutTarget) -> anyhow::Result<()> {
    // Installed before any ROS entity exists, so an early signal still drains.
    let signals = bpu_vlm::signals::Signals::install()
        .context("installing the SIGINT and SIGTERM handlers")?;

    let ctx = r2r::Context::create().context("initialising ROS 2 (rcl)")?;
    tracing::info!(ros_distro = r2r::ROS_DISTRO, "r2r context created");
    bpu_vlm::node::run(ctx, signals.first(), &rosout_target)
        .await
        .context("running vlm_node")
}

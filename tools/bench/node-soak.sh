#!/usr/bin/env bash
# Node soak benchmark (BENCHMARKS.md): release vlm_node on the embedded tiny model through the
# simulator, ASKS sequential asks from an rclpy client, latency and RSS. Not a test.
#   bash tools/bench/node-soak.sh [ASKS]
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
bash tools/ros2-bootstrap.sh >/dev/null
# shellcheck disable=SC1091
source .ros2/setup.bash
export ROS_DOMAIN_ID=${ROS_DOMAIN_ID:-$((RANDOM % 100 + 1))} ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST
cargo build --release -p bpu_vlm --bin vlm_node
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/vlm_node
PROFILE="$ROOT/launch/fastdds_large_frames.xml"
RUST_LOG=warn "$BIN" --ros-args -p demo_model:=true -p cache_dir:="$ROOT/.cache/embedded-model" -p queue_depth:=2 &
PID=$!
trap 'kill -INT $PID 2>/dev/null || true' EXIT
FASTRTPS_DEFAULT_PROFILES_FILE=$PROFILE FASTDDS_DEFAULT_PROFILES_FILE=$PROFILE \
  .ros2/venv/bin/python tools/bench/node_soak.py --pid "$PID" --asks "${1:-200}"
kill -INT "$PID"
trap - EXIT
wait "$PID"

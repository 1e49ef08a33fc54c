#!/usr/bin/env bash
# The run command (README):  bash tools/run.sh
#
# Sets up ROS 2 (tools/ros2-bootstrap.sh, idempotent), builds vlm_node, starts it, shows its
# topics and services and what /ask answers, then stops it with SIGINT.
# The node has no inference engine yet (a later issue adds it), so /ask answers
# success=false, error_code=not_ready: this script shows the plumbing, not an answer.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

bash tools/ros2-bootstrap.sh
# shellcheck disable=SC1091
source .ros2/setup.bash
# A private DDS domain on this host, so the demo does not meet other ROS graphs.
export ROS_DOMAIN_ID=${ROS_DOMAIN_ID:-$((RANDOM % 100 + 1))}

echo "[run] cargo build -p bpu_vlm --bin vlm_node"
cargo build -p bpu_vlm --bin vlm_node
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/debug/vlm_node

echo "[run] starting vlm_node (ROS_DOMAIN_ID=$ROS_DOMAIN_ID)"
"$BIN" &
NODE_PID=$!
trap 'kill -INT $NODE_PID 2>/dev/null || true' EXIT

.ros2/venv/bin/python tools/vlm-inspect.py

echo "[run] stopping vlm_node (SIGINT)"
kill -INT "$NODE_PID"
trap - EXIT
wait "$NODE_PID"
echo "[run] vlm_node exited cleanly. Answering questions comes with the engine (a later issue)."

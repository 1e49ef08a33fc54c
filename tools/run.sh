#!/usr/bin/env bash
# The run command (README):  bash tools/run.sh
#
# Sets up ROS 2 (tools/ros2-bootstrap.sh, idempotent), builds vlm_node, starts it on the
# embedded tiny random model through the BPU simulator (demo_model:=true, no model_dir),
# publishes a test picture on its camera topic, asks about it and prints the answer as it
# streams on /vlm/tokens, then stops the node with SIGINT.
# Real models: see the README (model_dir:=<package> on the board, backend:=cpu for HF weights).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"

bash tools/ros2-bootstrap.sh
# shellcheck disable=SC1091
source .ros2/setup.bash
# A private DDS domain on this host, so the demo does not meet other ROS graphs.
export ROS_DOMAIN_ID=${ROS_DOMAIN_ID:-$((RANDOM % 100 + 1))}
export ROS_AUTOMATIC_DISCOVERY_RANGE=${ROS_AUTOMATIC_DISCOVERY_RANGE:-LOCALHOST}
# The camera stand-in publishes frames above 512 KiB as camera drivers should: with the
# large-frame Fast DDS profile (docs/node.md, "Large frames").
PROFILE="$ROOT/launch/fastdds_large_frames.xml"

if [ -n "${VLM_NODE_BIN:-}" ]; then
  # tools/test.sh runs this script on the binary its test phase built: a `-p bpu_vlm` build
  # after `cargo test --workspace` would rebuild the dependencies whose features the
  # workspace unifies differently, minutes of CI for the same code.
  BIN=$VLM_NODE_BIN
else
  echo "[run] cargo build -p bpu_vlm --bin vlm_node"
  cargo build -p bpu_vlm --bin vlm_node
  BIN=${CARGO_TARGET_DIR:-$ROOT/target}/debug/vlm_node
fi

echo "[run] starting vlm_node (ROS_DOMAIN_ID=$ROS_DOMAIN_ID; demo_model:=true: embedded tiny model)"
"$BIN" --ros-args --params-file launch/vlm_params.yaml -p demo_model:=true \
  -p cache_dir:="$ROOT/.cache/embedded-model" &
NODE_PID=$!
trap 'kill -INT $NODE_PID 2>/dev/null || true' EXIT

status=0
FASTRTPS_DEFAULT_PROFILES_FILE=$PROFILE FASTDDS_DEFAULT_PROFILES_FILE=$PROFILE \
  .ros2/venv/bin/python tools/vlm-ask.py "What is on the table?" \
    --image tools/fixtures/images/scene_a.png --camera-topic /image_raw \
    --temperature 0 --max-new-tokens 32 || status=$?

echo "[run] stopping vlm_node (SIGINT)"
kill -INT "$NODE_PID"
trap - EXIT
wait "$NODE_PID"
echo "[run] vlm_node exited cleanly."
echo "[run] That answer came from a tiny RANDOM model on the BPU simulator: the full path"
echo "[run] camera frame -> /ask -> engine -> /vlm/tokens works; set model_dir for a real model."
exit "$status"

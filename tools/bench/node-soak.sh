#!/usr/bin/env bash
# Node soak benchmark (BENCHMARKS.md): release vlm_node on the embedded tiny model through the
# simulator. Not a test.
#   bash tools/bench/node-soak.sh [ASKS]         ASKS sequential asks from one rclpy client:
#                                                latency and RSS (tools/bench/node_soak.py)
#   bash tools/bench/node-soak.sh [ASKS] mix     ASKS requests from 4 concurrent clients mixing
#                                                every survivable failure kind; checks one
#                                                response each, one last Token per admitted
#                                                request, RSS within 5 % (minima over a window
#                                                of asks at both points), no ERROR status
#                                                (tools/bench/node_soak_mix.py); exit 1 if not
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
# The mix bounds the sessions' memory (2 MiB, 5 s idle) so old conversations are evicted and
# expired as they would be over a long run, and the RSS check compares like with like.
EXTRA=()
if [ "${2:-}" = mix ]; then EXTRA=(-p session_memory_mb:=2 -p session_idle_s:=5.0); fi
RUST_LOG=${RUST_LOG:-warn} "$BIN" --ros-args -p demo_model:=true -p cache_dir:="$ROOT/.cache/embedded-model" \
  -p queue_depth:=2 -p diagnostics_period_s:=0.5 "${EXTRA[@]}" &
PID=$!
trap 'kill -INT $PID 2>/dev/null || true' EXIT
SCRIPT=tools/bench/node_soak.py
if [ "${2:-}" = mix ]; then SCRIPT=tools/bench/node_soak_mix.py; fi
STATUS=0
FASTRTPS_DEFAULT_PROFILES_FILE=$PROFILE FASTDDS_DEFAULT_PROFILES_FILE=$PROFILE \
  .ros2/venv/bin/python "$SCRIPT" --pid "$PID" --asks "${1:-200}" || STATUS=$?
kill -INT "$PID"
trap - EXIT
wait "$PID"
exit "$STATUS"

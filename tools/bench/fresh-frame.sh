#!/usr/bin/env bash
# Fresh-frame benchmark (BENCHMARKS.md, "What do you see?" with frame priming): release
# vlm_node on the 4B-shaped ctx4k package without weights under the simulator's S100P timing
# model (prefill_tail pads_first), a 640x480 camera at 10 Hz, ASKS greedy questions at random
# moments; once with prefill_latest_frame on (the default) and once off. Not a test.
#   bash tools/bench/fresh-frame.sh [ASKS] ["true false"] [SEED] [CAMERAS]
#   (the prefill_latest_frame values to run; SEED picks the ask moments, default 1; CAMERAS the
#   scripted cameras to run each with, of fixed static occasional moving, default fixed: the
#   same pixels every frame, see tools/bench/fresh_frame.py)
#   SCENE_CHECK=true|false sets the node's scene_check (default true, the node's default;
#   false: the timer-driven priming before scene checks). DETECT=N sends N vlm/detect goals
#   instead of the asks (time to the first complete detection and to the result);
#   DETECT_POINTS=true asks them for points (see tools/bench/fresh_frame.py: this package's
#   boxes have no width).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
bash tools/ros2-bootstrap.sh >/dev/null
# shellcheck disable=SC1091
source .ros2/setup.bash
export ROS_DOMAIN_ID=${ROS_DOMAIN_ID:-$((RANDOM % 100 + 1))} ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST
cargo build --release -p bpu_vlm --bin vlm_node -p vlm-cli --bin vlm
BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release
PKG="$ROOT/.cache/bench/q4b-ctx4k-pads-first"
if [ ! -f "$PKG/model.json" ]; then
  "$BIN/vlm" make-sim-package --config tools/bench/configs/qwen35-4b.json --no-weights \
    --tokenizer tools/fixtures/tokenizer.json --cache-len 4096 \
    --prefill-pads --prefill-min-tail 5 --pad-layout first --out "$PKG"
fi
# 640x480 rgb8 frames exceed Fast DDS's default shared-memory segment: both sides use the
# large-frame profile.
export FASTRTPS_DEFAULT_PROFILES_FILE="$ROOT/launch/fastdds_large_frames.xml"
export FASTDDS_DEFAULT_PROFILES_FILE="$FASTRTPS_DEFAULT_PROFILES_FILE"
POINTS=()
if [ "${DETECT_POINTS:-false}" = true ]; then POINTS=(--points); fi
for CAMERA in ${4:-fixed}; do
for PREFILL in ${2:-true false}; do
  BPU_SIM_TIMING=s100p RUST_LOG=${RUST_LOG:-warn} "$BIN/vlm_node" --ros-args \
    --params-file launch/vlm_params.yaml -p model_dir:="$PKG" -p prefill_tail:=pads_first \
    -p prefill_latest_frame:=$PREFILL -p scene_check:="${SCENE_CHECK:-true}" \
    -p bpu_timeout_s:=60.0 &
  PID=$!
  trap 'kill -INT $PID 2>/dev/null || true' EXIT
  .ros2/venv/bin/python tools/bench/fresh_frame.py --asks "${1:-30}" --seed "${3:-1}" \
    --camera "$CAMERA" --detect "${DETECT:-0}" "${POINTS[@]}" \
    --label "prefill_latest_frame=$PREFILL scene_check=${SCENE_CHECK:-true} camera=$CAMERA"
  kill -INT "$PID"
  trap - EXIT
  wait "$PID"
done
done

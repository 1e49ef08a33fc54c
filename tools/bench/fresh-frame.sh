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
# shellcheck source=tools/bench/s100p-node.sh
source tools/bench/s100p-node.sh
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
